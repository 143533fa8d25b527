/* Agreement on a status before and after the data collectives, so a failure
 * on one rank is the same failure on all ranks and never a hang (a rank that
 * failed still takes part in every collective of the call). */
#include <stdio.h>
#include <string.h>

#include "mpi_internal.h"

/* The first failing rank's status and message, sent from it to all. */
static clattn_status spread(clattn_mpi *m, int first, clattn_status st) {
  struct {
    int status;
    char msg[sizeof m->msg];
  } w;
  memset(&w, 0, sizeof w);
  if (m->rank == first) {
    w.status = (int)st;
    /* keep a message already naming its rank (from an earlier agreement) as it is */
    const int named = strncmp(m->msg, "rank ", 5) == 0;
    int n = named ? 0 : snprintf(w.msg, sizeof w.msg, "rank %d: ", first);
    if (n < 0) n = 0;
    memcpy(w.msg + n, m->msg, sizeof w.msg - (size_t)n - 1);
  }
  int rc = MPI_Bcast(&w, (int)sizeof w, MPI_BYTE, first, m->comm);
  if (rc != MPI_SUCCESS) return cm_mpi_fail(m, rc, "MPI_Bcast (failure agreement)");
  w.msg[sizeof w.msg - 1] = 0;
  memcpy(m->msg, w.msg, sizeof m->msg);
  return (clattn_status)w.status;
}

clattn_status cm_agree(clattn_mpi *m, clattn_status local) {
  int mine = local != CLATTN_OK ? m->rank : m->size, first = m->size;
  int rc = MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, m->comm);
  if (rc != MPI_SUCCESS) return cm_mpi_fail(m, rc, "MPI_Allreduce (status agreement)");
  return first == m->size ? CLATTN_OK : spread(m, first, local);
}

clattn_status cm_agree_descriptors(clattn_mpi *m, clattn_status local, const int *desc, int n, int *all) {
  int *mine = all + (size_t)m->rank * (n + 1);
  memset(mine, 0, (size_t)(n + 1) * sizeof *mine);
  mine[0] = (int)local;
  if (local == CLATTN_OK) memcpy(mine + 1, desc, (size_t)n * sizeof *mine);
  int rc = MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, all, n + 1, MPI_INT, m->comm);
  if (rc != MPI_SUCCESS) return cm_mpi_fail(m, rc, "MPI_Allgather (descriptor agreement)");
  for (int r = 0; r < m->size; r++)
    if (all[(size_t)r * (n + 1)] != CLATTN_OK) return spread(m, r, local);
  return CLATTN_OK;
}
