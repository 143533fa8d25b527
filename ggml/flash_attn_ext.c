/*
 * FLASH_ATTN_EXT on the CLATTN device: the node's tensors are in host
 * memory (the CPU backend's buffers), each wrapped as an OpenCL buffer from
 * its first byte, and computed by one clattn_forward with the parameters
 * fa_map.c gives (the mapping both integrations share).
 */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

#include "ggml-clattn.h"
#include "internal.h"

static atomic_ullong calls;

void gc_count_call(void) { atomic_fetch_add(&calls, 1); }

uint64_t ggml_backend_clattn_calls(void) { return atomic_load(&calls); }

bool gc_flash_attn_supported(const struct ggml_tensor *op) { return gc_fa_supported(op); }

/* The backend's slopes buffer for (heads, max_bias), made when they change. */
static cl_mem slopes_for(gc_backend *be, int64_t heads, float max_bias) {
  if (be->slopes && be->slope_heads == heads && be->slope_max_bias == max_bias) return be->slopes;
  if (be->slopes) clReleaseMemObject(be->slopes);
  be->slopes = NULL;
  float *s = malloc(sizeof(float) * (size_t)heads);
  if (!s) return NULL;
  gc_fa_slopes(heads, max_bias, s);
  cl_int err;
  be->slopes = clCreateBuffer(clattn_cl_context(be->dev->ctx), CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR,
                              sizeof(float) * (size_t)heads, s, &err);
  free(s);
  if (err != CL_SUCCESS) be->slopes = NULL;
  be->slope_heads = (int)heads;
  be->slope_max_bias = max_bias;
  return be->slopes;
}

/* A tensor's host memory as an OpenCL buffer (CL_MEM_USE_HOST_PTR over its
 * ggml_nbytes from its first byte; NULL: the error in *err). Made per node:
 * the bytes are those ggml's CPU backend reads and writes, and a device
 * that keeps a copy of its own takes the host's contents at creation.
 * Read-write even for inputs: Intel's CPU runtime copies the whole of a
 * CL_MEM_READ_ONLY one whose pointer is not 128-byte aligned (its
 * CL_DEVICE_MEM_BASE_ADDR_ALIGN) at every node, 4.5 ms for 8 MiB, where it
 * uses a read-write one in place; ggml aligns tensors to 64 bytes. */
static cl_mem wrap(clattn_context *ctx, const struct ggml_tensor *t, cl_int *err) {
  if (!t) return NULL;
  return clCreateBuffer(clattn_cl_context(ctx), CL_MEM_READ_WRITE | CL_MEM_USE_HOST_PTR, ggml_nbytes(t), t->data, err);
}

enum ggml_status gc_flash_attn_compute(gc_backend *be, struct ggml_tensor *node) {
  const struct ggml_tensor *q = node->src[0], *k = node->src[1], *v = node->src[2], *mask = node->src[3],
                           *sinks = node->src[4];
  clattn_context *ctx = be->dev->ctx;
  const float max_bias = gc_fa_max_bias(node);

  const struct ggml_tensor *tensors[GC_FA_TENSORS] = {q, k, v, mask, sinks, node};
  cl_mem mem[GC_FA_TENSORS] = {NULL};
  cl_int err = CL_SUCCESS;
  for (int i = 0; i < GC_FA_TENSORS && err == CL_SUCCESS; i++) mem[i] = wrap(ctx, tensors[i], &err);

  gc_fa_mem at[GC_FA_TENSORS];
  for (int i = 0; i < GC_FA_TENSORS; i++) at[i] = (gc_fa_mem){mem[i], 0, false};
  cl_mem slopes = NULL;
  if (err == CL_SUCCESS && mask && max_bias > 0.0f && !(slopes = slopes_for(be, q->ne[2], max_bias)))
    err = CL_OUT_OF_HOST_MEMORY;
  clattn_params p;
  gc_fa_params(node, at, slopes, &p); /* offsets 0: always whole */

  clattn_status st = CLATTN_OK;
  cl_event done = NULL;
  if (err == CL_SUCCESS) st = clattn_forward(ctx, &p, 0, NULL, &done);
  if (done) {
    err = clWaitForEvents(1, &done);
    clReleaseEvent(done);
  }
  /* the output into host memory, where a device keeps a copy of its own */
  if (err == CL_SUCCESS && st == CLATTN_OK) {
    void *host = clEnqueueMapBuffer(clattn_cl_queue(ctx), mem[GC_FA_OUT], CL_TRUE, CL_MAP_READ, 0, ggml_nbytes(node), 0,
                                    NULL, NULL, &err);
    if (err == CL_SUCCESS) err = clEnqueueUnmapMemObject(clattn_cl_queue(ctx), mem[GC_FA_OUT], host, 0, NULL, NULL);
    if (err == CL_SUCCESS) err = clFinish(clattn_cl_queue(ctx));
  }
  for (int i = 0; i < GC_FA_TENSORS; i++)
    if (mem[i]) clReleaseMemObject(mem[i]);
  if (st != CLATTN_OK || err != CL_SUCCESS) {
    if (st != CLATTN_OK)
      fprintf(stderr, "ggml-clattn: %s: %s\n", node->name, clattn_last_error(ctx));
    else
      fprintf(stderr, "ggml-clattn: %s: OpenCL error %d wrapping or mapping its tensors' memory\n", node->name,
              (int)err);
    return GGML_STATUS_FAILED;
  }
  gc_count_call();
  return GGML_STATUS_SUCCESS;
}
