/* Host staging of device buffers. Most OpenCL stacks cannot hand MPI a
 * device pointer, so every state and K/V block goes device -> host -> MPI
 * -> host -> device. (A GPU-aware MPI given the cl_mem's device address,
 * e.g. through cl_ext_buffer_device_address or a CUDA/HIP interop buffer,
 * could send from the device buffers directly; these functions are where
 * that would go.) */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "mpi_internal.h"

clattn_status cm_host(clattn_mpi *m, int which, size_t bytes, void **out) {
  cm_buf *b = &m->host[which];
  if (bytes > b->bytes || !b->host) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) return cm_fail(m, CLATTN_ERR_OUT_OF_MEMORY, "host staging buffer of %zu bytes", bytes);
    free(b->host);
    b->host = p;
    b->bytes = bytes;
  }
  *out = b->host;
  return CLATTN_OK;
}

clattn_status cm_dev(clattn_mpi *m, int which, size_t bytes, cl_mem *out) {
  cm_buf *b = &m->dev[which];
  if (bytes > b->bytes || !b->dev) {
    cl_int err = CL_SUCCESS;
    cl_mem d = clCreateBuffer(clattn_cl_context(m->ctx), CL_MEM_READ_WRITE, bytes ? bytes : 4, NULL, &err);
    if (err != CL_SUCCESS || !d) return cm_cl_fail(m, err, "clCreateBuffer (device staging)");
    if (b->dev) clReleaseMemObject(b->dev);
    b->dev = d;
    b->bytes = bytes;
  }
  *out = b->dev;
  return CLATTN_OK;
}

clattn_status cm_check_view(clattn_mpi *m, const char *fn, const char *name, const clattn_tensor *t,
                            const int dims[4]) {
  if (!t->buf) return cm_fail(m, CLATTN_ERR_INVALID_ARGUMENT, "%s: %s.buf is NULL", fn, name);
  double last = (double)t->offset; /* double: no overflow to wrap, exact far beyond any buffer */
  for (int d = 0; d < 4; d++) last += (double)(dims[d] - 1) * (double)t->stride[d];
  size_t have = 0;
  cl_int err = clGetMemObjectInfo(t->buf, CL_MEM_SIZE, sizeof have, &have, NULL);
  if (err != CL_SUCCESS)
    return cm_fail(m, CLATTN_ERR_INVALID_ARGUMENT, "%s: %s.buf is not a valid cl_mem (%d)", fn, name, (int)err);
  if ((last + 1) * sizeof(float) > (double)have)
    return cm_fail(m, CLATTN_ERR_BUFFER_TOO_SMALL, "%s: %s: the view addresses %.0f bytes but the buffer holds %zu", fn,
                   name, (last + 1) * sizeof(float), have);
  return CLATTN_OK;
}

clattn_status cm_read_view(clattn_mpi *m, const clattn_tensor *t, const int dims[4], float *dst) {
  const size_t n = (size_t)dims[0] * dims[1] * dims[2] * dims[3];
  if (n == 0) return CLATTN_OK;
  if (!t->buf) return cm_fail(m, CLATTN_ERR_INVALID_ARGUMENT, "a K/V view's buf is NULL");
  cl_command_queue q = clattn_cl_queue(m->ctx);
  const size_t packed[4] = {(size_t)dims[1] * dims[2] * dims[3], (size_t)dims[2] * dims[3], (size_t)dims[3], 1};
  int is_packed = 1;
  size_t last = t->offset;
  for (int d = 0; d < 4; d++) {
    if (dims[d] > 1 && t->stride[d] != packed[d]) is_packed = 0;
    last += (size_t)(dims[d] - 1) * t->stride[d];
  }
  cl_int err;
  if (is_packed) {
    err = clEnqueueReadBuffer(q, t->buf, CL_TRUE, t->offset * sizeof(float), n * sizeof(float), dst, 0, NULL, NULL);
    return err == CL_SUCCESS ? CLATTN_OK : cm_cl_fail(m, err, "clEnqueueReadBuffer (K/V view)");
  }
  /* Strided: read the span once, gather on the host. */
  const size_t span = last - t->offset + 1;
  float *tmp = malloc(span * sizeof *tmp);
  if (!tmp) return cm_fail(m, CLATTN_ERR_OUT_OF_MEMORY, "host copy of a strided view (%zu floats)", span);
  err = clEnqueueReadBuffer(q, t->buf, CL_TRUE, t->offset * sizeof(float), span * sizeof(float), tmp, 0, NULL, NULL);
  if (err != CL_SUCCESS) {
    free(tmp);
    return cm_cl_fail(m, err, "clEnqueueReadBuffer (strided K/V view)");
  }
  size_t o = 0;
  for (int a = 0; a < dims[0]; a++)
    for (int b = 0; b < dims[1]; b++)
      for (int c = 0; c < dims[2]; c++)
        for (int d = 0; d < dims[3]; d++)
          dst[o++] = tmp[a * t->stride[0] + b * t->stride[1] + c * t->stride[2] + d * t->stride[3]];
  free(tmp);
  return CLATTN_OK;
}

clattn_status cm_read_lens(clattn_mpi *m, cl_mem lens, int batch, int *dst) {
  cl_int err = clEnqueueReadBuffer(clattn_cl_queue(m->ctx), lens, CL_TRUE, 0, (size_t)batch * sizeof(cl_int), dst, 0,
                                   NULL, NULL);
  return err == CL_SUCCESS ? CLATTN_OK : cm_cl_fail(m, err, "clEnqueueReadBuffer (kv_lens)");
}

clattn_status cm_fill(clattn_mpi *m, cl_mem buf, size_t offset, size_t n, float value) {
  if (n == 0) return CLATTN_OK;
  cl_int err = clEnqueueFillBuffer(clattn_cl_queue(m->ctx), buf, &value, sizeof value, offset * sizeof(float),
                                   n * sizeof(float), 0, NULL, NULL);
  return err == CL_SUCCESS ? CLATTN_OK : cm_cl_fail(m, err, "clEnqueueFillBuffer (states)");
}

clattn_status cm_wait_overlapped(clattn_mpi *m, cl_event *ev, int n_ev, MPI_Request *req, int n_req, int *req_done) {
  cl_int err = clFlush(clattn_cl_queue(m->ctx));
  if (err != CL_SUCCESS) return cm_cl_fail(m, err, "clFlush");
  for (;;) {
    if (n_req > 0 && !*req_done) {
      int rc = MPI_Testall(n_req, req, req_done, MPI_STATUSES_IGNORE);
      if (rc != MPI_SUCCESS) return cm_mpi_fail(m, rc, "MPI_Testall (ring step)");
    }
    int pending = 0;
    for (int i = 0; i < n_ev; i++) {
      if (!ev[i]) continue;
      cl_int s = CL_COMPLETE;
      err = clGetEventInfo(ev[i], CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof s, &s, NULL);
      if (err != CL_SUCCESS) return cm_cl_fail(m, err, "clGetEventInfo");
      if (s < 0) return cm_cl_fail(m, s, "a block's forward");
      pending |= s != CL_COMPLETE;
    }
    if (!pending) return CLATTN_OK;
    /* Sleep briefly: a spinning host thread would take a core from the device (POCL). */
    struct timespec nap = {0, 100000};
    nanosleep(&nap, NULL);
  }
}

clattn_status cm_sink_state(clattn_mpi *m, cl_mem sinks, size_t sinks_offset, int batch, int heads, int rows, int dv,
                            cl_mem o, size_t o_off, cl_mem lse, size_t lse_off) {
  const size_t n = (size_t)batch * heads * rows;
  float *host = malloc(n * sizeof *host + (size_t)heads * sizeof *host);
  if (!host) return cm_fail(m, CLATTN_ERR_OUT_OF_MEMORY, "the sinks' state");
  float *per_head = host + n;
  cl_command_queue q = clattn_cl_queue(m->ctx);
  cl_int err = clEnqueueReadBuffer(q, sinks, CL_TRUE, sinks_offset * sizeof *host, (size_t)heads * sizeof *host, per_head, 0,
                                   NULL, NULL);
  if (err == CL_SUCCESS) {
    for (size_t i = 0; i < n; i++) host[i] = per_head[(i / (size_t)rows) % (size_t)heads];
    err = clEnqueueWriteBuffer(q, lse, CL_TRUE, lse_off * sizeof *host, n * sizeof *host, host, 0, NULL, NULL);
  }
  free(host);
  if (err != CL_SUCCESS) return cm_cl_fail(m, err, "the sinks' state (read sinks, write lse)");
  return cm_fill(m, o, o_off, n * (size_t)dv, 0.0f);
}
