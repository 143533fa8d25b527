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

clattn_status clattn_mpi_create(clattn_context *ctx, MPI_Comm comm, clattn_mpi **out) {
  if (!out) return CLATTN_ERR_INVALID_ARGUMENT;
  *out = NULL;
  if (!ctx) return CLATTN_ERR_INVALID_ARGUMENT;
  int initialized = 0;
  if (MPI_Initialized(&initialized) != MPI_SUCCESS || !initialized) return CLATTN_ERR_INVALID_ARGUMENT;
  clattn_mpi *m = calloc(1, sizeof *m);
  if (!m) return CLATTN_ERR_OUT_OF_MEMORY;
  m->ctx = ctx;
  /* Errors must come back to us on the duplicate; the caller's handler on
   * comm is theirs, so it is set on comm only for the duplication itself. */
  MPI_Errhandler old;
  int rc = MPI_Comm_get_errhandler(comm, &old);
  if (rc != MPI_SUCCESS) {
    free(m);
    return CLATTN_MPI_ERR_COMM;
  }
  rc = MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
  int dup = 0;
  if (rc == MPI_SUCCESS) dup = (rc = MPI_Comm_dup(comm, &m->comm)) == MPI_SUCCESS;
  /* Restoring the caller's handler: a failure here changes nothing of ours. */
  (void)MPI_Comm_set_errhandler(comm, old);
  (void)MPI_Errhandler_free(&old);
  if (rc == MPI_SUCCESS) rc = MPI_Comm_set_errhandler(m->comm, MPI_ERRORS_RETURN);
  if (rc == MPI_SUCCESS) rc = MPI_Comm_rank(m->comm, &m->rank);
  if (rc == MPI_SUCCESS) rc = MPI_Comm_size(m->comm, &m->size);
  if (rc != MPI_SUCCESS) {
    if (dup) MPI_Comm_free(&m->comm);
    free(m);
    return CLATTN_MPI_ERR_COMM;
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
  free(m);
}

void clattn_mpi_get_stats(clattn_mpi *m, clattn_mpi_stats *out, int reset) {
  if (!m) return;
  if (out) *out = m->stats;
  if (reset) memset(&m->stats, 0, sizeof m->stats);
}
