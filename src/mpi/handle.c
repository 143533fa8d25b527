/* The handle: a private communicator, failures, statistics. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "mpi_internal.h"

clattn_status cm_fail(clattn_mpi *m, clattn_status st, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(m->msg, sizeof m->msg, fmt, ap);
  va_end(ap);
  return st;
}

static const char *cl_name(cl_int err) {
  switch (err) {
    case CL_MEM_OBJECT_ALLOCATION_FAILURE: return "CL_MEM_OBJECT_ALLOCATION_FAILURE";
    case CL_OUT_OF_RESOURCES: return "CL_OUT_OF_RESOURCES";
    case CL_OUT_OF_HOST_MEMORY: return "CL_OUT_OF_HOST_MEMORY";
    case CL_INVALID_VALUE: return "CL_INVALID_VALUE";
    case CL_INVALID_MEM_OBJECT: return "CL_INVALID_MEM_OBJECT";
    case CL_INVALID_COMMAND_QUEUE: return "CL_INVALID_COMMAND_QUEUE";
    case CL_INVALID_CONTEXT: return "CL_INVALID_CONTEXT";
    case CL_INVALID_EVENT: return "CL_INVALID_EVENT";
    case CL_INVALID_BUFFER_SIZE: return "CL_INVALID_BUFFER_SIZE";
    case CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST: return "CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST";
    default: return "OpenCL error";
  }
}

clattn_status cm_cl_fail(clattn_mpi *m, cl_int err, const char *what) {
  const clattn_status st =
      err == CL_MEM_OBJECT_ALLOCATION_FAILURE || err == CL_OUT_OF_RESOURCES || err == CL_OUT_OF_HOST_MEMORY
          ? CLATTN_ERR_OUT_OF_MEMORY
          : CLATTN_ERR_OPENCL;
  return cm_fail(m, st, "%s: %s (%d)", what, cl_name(err), (int)err);
}

clattn_status cm_mpi_fail(clattn_mpi *m, int rc, const char *what) {
  char text[MPI_MAX_ERROR_STRING] = "";
  int n = 0;
  if (MPI_Error_string(rc, text, &n) != MPI_SUCCESS) snprintf(text, sizeof text, "MPI error %d", rc);
  return cm_fail(m, CLATTN_MPI_ERR_COMM, "%s: %s", what, text);
}

clattn_status cm_clattn_fail(clattn_mpi *m, clattn_status st, const char *what) {
  return cm_fail(m, st, "%s: %s: %s", what, clattn_status_string(st), clattn_last_error(m->ctx));
}

double cm_now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

const char *clattn_mpi_status_string(clattn_status s) {
  return s == CLATTN_MPI_ERR_COMM ? "CLATTN_MPI_ERR_COMM" : clattn_status_string(s);
}

const char *clattn_mpi_last_error(const clattn_mpi *m) { return m ? m->msg : "clattn_mpi: handle is NULL"; }

/* The first failing rank's status on every rank of comm: MPI_MINLOC over
 * (the rank where it failed, or size; its status). *rc: the MPI error. */
static clattn_status agree(MPI_Comm comm, clattn_status local, int *rc) {
  int rank = 0, size = 0;
  if ((*rc = MPI_Comm_rank(comm, &rank)) != MPI_SUCCESS || (*rc = MPI_Comm_size(comm, &size)) != MPI_SUCCESS)
    return CLATTN_MPI_ERR_COMM;
  int mine[2] = {local != CLATTN_OK ? rank : size, (int)local}, first[2] = {size, CLATTN_OK};
  if ((*rc = MPI_Allreduce(mine, first, 1, MPI_2INT, MPI_MINLOC, comm)) != MPI_SUCCESS) return CLATTN_MPI_ERR_COMM;
  return (clattn_status)first[1];
}

clattn_status clattn_mpi_create(clattn_context *ctx, MPI_Comm comm, clattn_mpi **out) {
  if (out) *out = NULL;
  /* without MPI or a communicator no rank can be told: a local answer */
  int initialized = 0, finalized = 1;
  if (MPI_Initialized(&initialized) != MPI_SUCCESS || !initialized || MPI_Finalized(&finalized) != MPI_SUCCESS ||
      finalized || comm == MPI_COMM_NULL)
    return CLATTN_ERR_INVALID_ARGUMENT;
  /* Errors must come back to us; the caller's handler on comm is theirs, so
   * it is set on comm only for the agreements and the duplication. */
  MPI_Errhandler old;
  if (MPI_Comm_get_errhandler(comm, &old) != MPI_SUCCESS) return CLATTN_MPI_ERR_COMM;
  int rc = MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
  clattn_mpi *m = NULL;
  clattn_status st = rc != MPI_SUCCESS ? CLATTN_MPI_ERR_COMM : !out || !ctx ? CLATTN_ERR_INVALID_ARGUMENT : CLATTN_OK;
  if (st == CLATTN_OK && !(m = calloc(1, sizeof *m))) st = CLATTN_ERR_OUT_OF_MEMORY;
  /* Every rank agrees before the collective duplication: a rank that failed
   * here would otherwise leave the others waiting in MPI_Comm_dup. */
  if (rc == MPI_SUCCESS) st = agree(comm, st, &rc);
  int dup = 0;
  if (st == CLATTN_OK) {
    m->ctx = ctx;
    m->comm = MPI_COMM_NULL;
    dup = (rc = MPI_Comm_dup(comm, &m->comm)) == MPI_SUCCESS;
    if (rc == MPI_SUCCESS) rc = MPI_Comm_set_errhandler(m->comm, MPI_ERRORS_RETURN);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_rank(m->comm, &m->rank);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_size(m->comm, &m->size);
    if (rc == MPI_SUCCESS && !(m->agree = malloc((size_t)m->size * (CM_DESC_MAX + 1) * sizeof *m->agree)))
      st = CLATTN_ERR_OUT_OF_MEMORY;
    if (rc != MPI_SUCCESS) st = CLATTN_MPI_ERR_COMM;
    st = agree(comm, st, &rc); /* the same verdict on every rank */
  }
  /* Restoring the caller's handler: a failure here changes nothing of ours. */
  (void)MPI_Comm_set_errhandler(comm, old);
  (void)MPI_Errhandler_free(&old);
  if (st != CLATTN_OK) {
    if (dup) MPI_Comm_free(&m->comm);
    if (m) free(m->agree);
    free(m);
    return st;
  }
  *out = m;
  return CLATTN_OK;
}

void clattn_mpi_destroy(clattn_mpi *m) {
  if (!m) return;
  for (int i = 0; i < CM_HOST_COUNT; i++) free(m->host[i].host);
  for (int i = 0; i < CM_DEV_COUNT; i++)
    if (m->dev[i].dev) clReleaseMemObject(m->dev[i].dev);
  (void)MPI_Comm_free(&m->comm); /* nothing to report to: the handle is gone */
  free(m->agree);
  free(m);
}

void clattn_mpi_get_stats(clattn_mpi *m, clattn_mpi_stats *out, int reset) {
  if (!m) return;
  if (out) *out = m->stats;
  if (reset) memset(&m->stats, 0, sizeof m->stats);
}
