/*
 * ggml-opencl's FLASH_ATTN_EXT through clattn (ggml-opencl-clattn.h).
 *
 * One clattn context per device, embedded in the backend's cl_context,
 * device and in-order queue: each node is one clattn_forward enqueued
 * behind the backend's own kernels and ahead of the next ones, over the
 * backend's buffers at the tensors' offsets (fa_map.c maps the node), so
 * nothing waits and nothing crosses to the host.
 *
 * ggml-opencl's set_tensor splits a block-type tensor it is given (the
 * weights; in ggml's tests, K and V too) into arrays of scales, mins, high
 * bits and quants. clattn reads ggml's blocks, so for such a K or V the
 * blocks its view covers are put back together on the device, by this
 * file's own kernel, into a scratch buffer (one for K, one for V) that the
 * forward then reads. A cache that llama.cpp writes (SET_ROWS) keeps ggml's
 * blocks and is read in place. BF16 tensors the backend keeps as F16
 * (set_tensor converts them), and they are read so.
 */
#include "ggml-opencl-clattn.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../fa_map.h"
#include "clattn.h"
#include "ggml.h"

struct ggml_opencl_clattn {
  pthread_mutex_t lock; /* the backends of one device share this state (test-backend-ops -j runs several) */
  clattn_context *ctx;
  cl_program program;
  cl_kernel blocks;  /* ggml_blocks below */
  cl_mem scratch[2]; /* K's and V's blocks, when split */
  size_t scratch_size[2];
  cl_mem slopes; /* ALiBi's slopes for (slope_heads, slope_max_bias) */
  int64_t slope_heads;
  float slope_max_bias;
};

/* ggml's blocks from ggml-opencl's split arrays: block first + i into
 * out + i * its size, fields in ggml's order: d, [m], [qh], qs. */
static const char *blocks_source =
    "kernel void ggml_blocks(global const uchar *d, global const uchar *m, global const uchar *qh,\n"
    "                        global const uchar *qs, uint has_m, uint has_qh, uint qs_bytes, ulong first,\n"
    "                        global uchar *out) {\n"
    "  const ulong b = first + get_global_id(0);\n"
    "  global uchar *o = out + get_global_id(0) * (2 + 2 * has_m + 4 * has_qh + qs_bytes);\n"
    "  o[0] = d[2 * b];\n"
    "  o[1] = d[2 * b + 1];\n"
    "  uint at = 2;\n"
    "  if (has_m) {\n"
    "    o[2] = m[2 * b];\n"
    "    o[3] = m[2 * b + 1];\n"
    "    at = 4;\n"
    "  }\n"
    "  if (has_qh) {\n"
    "    for (uint j = 0; j < 4; j++) o[at + j] = qh[4 * b + j];\n"
    "    at += 4;\n"
    "  }\n"
    "  for (uint j = 0; j < qs_bytes; j++) o[at + j] = qs[(ulong)qs_bytes * b + j];\n"
    "}\n";

static atomic_ullong calls;

/* With CLATTN_GGML_REPORT set, how many nodes clattn computed, at exit: the
 * proof that a test or a model run used it. */
static void report_calls(void) {
  fprintf(stderr, "ggml-opencl: %llu FLASH_ATTN_EXT nodes computed by clattn_forward\n",
          (unsigned long long)atomic_load(&calls));
}

bool ggml_opencl_clattn_enabled(void) {
  const char *v = getenv("GGML_OPENCL_CLATTN");
  return !v || strcmp(v, "0") != 0;
}

bool ggml_opencl_clattn_supports_op(const struct ggml_tensor *op) { return gc_fa_supported(op); }

void ggml_opencl_clattn_free(struct ggml_opencl_clattn *g) {
  if (!g) return;
  for (int i = 0; i < 2; i++)
    if (g->scratch[i]) clReleaseMemObject(g->scratch[i]);
  if (g->slopes) clReleaseMemObject(g->slopes);
  if (g->blocks) clReleaseKernel(g->blocks);
  if (g->program) clReleaseProgram(g->program);
  clattn_destroy(g->ctx);
  pthread_mutex_destroy(&g->lock);
  free(g);
}

struct ggml_opencl_clattn *ggml_opencl_clattn_init(cl_context context, cl_device_id device, cl_command_queue queue) {
  struct ggml_opencl_clattn *g = calloc(1, sizeof *g);
  if (!g) {
    fprintf(stderr, "ggml-opencl: clattn: out of host memory\n");
    return NULL;
  }
  if (pthread_mutex_init(&g->lock, NULL) != 0) {
    fprintf(stderr, "ggml-opencl: clattn: no mutex\n");
    free(g);
    return NULL;
  }
  clattn_options opt = {.struct_size = sizeof opt, .context = context, .device = device, .queue = queue};
  clattn_status st = clattn_create(&opt, &g->ctx);
  if (st != CLATTN_OK) {
    fprintf(stderr, "ggml-opencl: clattn_create: %s (%s)\n", clattn_status_string(st), clattn_last_error(NULL));
    pthread_mutex_destroy(&g->lock);
    free(g);
    return NULL;
  }
  cl_int err;
  g->program = clCreateProgramWithSource(context, 1, &blocks_source, NULL, &err);
  if (err == CL_SUCCESS) err = clBuildProgram(g->program, 1, &device, "", NULL, NULL);
  if (err == CL_SUCCESS) g->blocks = clCreateKernel(g->program, "ggml_blocks", &err);
  if (err != CL_SUCCESS) {
    char log[2048] = "";
    if (g->program) clGetProgramBuildInfo(g->program, device, CL_PROGRAM_BUILD_LOG, sizeof log - 1, log, NULL);
    fprintf(stderr, "ggml-opencl: clattn glue: its block kernel did not build (OpenCL error %d): %s\n", (int)err, log);
    ggml_opencl_clattn_free(g);
    return NULL;
  }
  static atomic_flag reported = ATOMIC_FLAG_INIT;
  const char *report = getenv("CLATTN_GGML_REPORT");
  if (report && *report && strcmp(report, "0") != 0 && !atomic_flag_test_and_set(&reported)) atexit(report_calls);
  return g;
}

/* The bytes past a view's first byte that it reaches, in ggml's layout. */
static size_t view_extent(const struct ggml_tensor *t) {
  size_t end = (size_t)(t->ne[0] / ggml_blck_size(t->type)) * ggml_type_size(t->type);
  for (int i = 1; i < 4; i++) end += (size_t)(t->ne[i] - 1) * t->nb[i];
  return end;
}

/* Where clattn reads tensor t: in place, or (split) the blocks its view
 * covers put back together in scratch[slot]. */
static cl_int place(struct ggml_opencl_clattn *g, const struct ggml_tensor *t, const ggml_opencl_clattn_tensor *in,
                    int slot, gc_fa_mem *out) {
  *out = (gc_fa_mem){in->mem, in->offset, true};
  if (!t || !in->d) return CL_SUCCESS;
  const size_t size = ggml_type_size(t->type);
  if (ggml_blck_size(t->type) == 1 || in->view_offset % size) return CL_INVALID_VALUE;
  const cl_ulong first = in->view_offset / size;
  const size_t n = (view_extent(t) + size - 1) / size, bytes = n * size;
  if (g->scratch_size[slot] < bytes) {
    /* a buffer still in use by enqueued work lives until that work ends */
    if (g->scratch[slot]) clReleaseMemObject(g->scratch[slot]);
    cl_int err;
    g->scratch[slot] = clCreateBuffer(clattn_cl_context(g->ctx), CL_MEM_READ_WRITE, bytes, NULL, &err);
    g->scratch_size[slot] = err == CL_SUCCESS ? bytes : 0;
    if (err != CL_SUCCESS) {
      g->scratch[slot] = NULL;
      return err;
    }
  }
  const cl_uint has_m = in->m != NULL, has_qh = in->qh != NULL;
  const cl_uint qs_bytes = (cl_uint)size - 2 - 2 * has_m - 4 * has_qh;
  const cl_mem m = has_m ? in->m : in->d, qh = has_qh ? in->qh : in->d;
  cl_int err = clSetKernelArg(g->blocks, 0, sizeof(cl_mem), &in->d);
  if (err == CL_SUCCESS) err = clSetKernelArg(g->blocks, 1, sizeof(cl_mem), &m);
  if (err == CL_SUCCESS) err = clSetKernelArg(g->blocks, 2, sizeof(cl_mem), &qh);
  if (err == CL_SUCCESS) err = clSetKernelArg(g->blocks, 3, sizeof(cl_mem), &in->qs);
  if (err == CL_SUCCESS) err = clSetKernelArg(g->blocks, 4, sizeof(cl_uint), &has_m);
  if (err == CL_SUCCESS) err = clSetKernelArg(g->blocks, 5, sizeof(cl_uint), &has_qh);
  if (err == CL_SUCCESS) err = clSetKernelArg(g->blocks, 6, sizeof(cl_uint), &qs_bytes);
  if (err == CL_SUCCESS) err = clSetKernelArg(g->blocks, 7, sizeof(cl_ulong), &first);
  if (err == CL_SUCCESS) err = clSetKernelArg(g->blocks, 8, sizeof(cl_mem), &g->scratch[slot]);
  if (err == CL_SUCCESS)
    err = clEnqueueNDRangeKernel(clattn_cl_queue(g->ctx), g->blocks, 1, NULL, &n, NULL, 0, NULL, NULL);
  *out = (gc_fa_mem){g->scratch[slot], in->view_offset - first * size, true};
  return err;
}

/* The slopes buffer for (heads, max_bias), made when they change. */
static cl_int slopes_for(struct ggml_opencl_clattn *g, int64_t heads, float max_bias) {
  if (g->slopes && g->slope_heads == heads && g->slope_max_bias == max_bias) return CL_SUCCESS;
  if (g->slopes) clReleaseMemObject(g->slopes);
  g->slopes = NULL;
  float *s = malloc(sizeof(float) * (size_t)heads);
  if (!s) return CL_OUT_OF_HOST_MEMORY;
  gc_fa_slopes(heads, max_bias, s);
  cl_int err;
  g->slopes = clCreateBuffer(clattn_cl_context(g->ctx), CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR,
                             sizeof(float) * (size_t)heads, s, &err);
  free(s);
  if (err != CL_SUCCESS) g->slopes = NULL;
  g->slope_heads = heads;
  g->slope_max_bias = max_bias;
  return err;
}

/* The node's work, under the lock (scratch, kernel arguments and slopes are
 * shared by the device's backends). */
static bool compute_locked(struct ggml_opencl_clattn *g, const struct ggml_tensor *node,
                           const ggml_opencl_clattn_tensor tensors[6]) {
  const struct ggml_tensor *k = node->src[1], *v = node->src[2];
  gc_fa_mem mem[GC_FA_TENSORS];
  for (int i = 0; i < GC_FA_TENSORS; i++) mem[i] = (gc_fa_mem){tensors[i].mem, tensors[i].offset, true};
  cl_int err = place(g, k, &tensors[GC_FA_K], 0, &mem[GC_FA_K]);
  if (err == CL_SUCCESS) err = place(g, v, &tensors[GC_FA_V], 1, &mem[GC_FA_V]);
  const float max_bias = gc_fa_max_bias(node);
  if (err == CL_SUCCESS && node->src[3] && max_bias > 0.0f) err = slopes_for(g, node->src[0]->ne[2], max_bias);
  if (err != CL_SUCCESS) {
    fprintf(stderr, "ggml-opencl: %s: OpenCL error %d putting its K/V blocks or ALiBi slopes together\n", node->name,
            (int)err);
    return false;
  }
  clattn_params p;
  if (!gc_fa_params(node, mem, g->slopes, &p)) {
    fprintf(stderr, "ggml-opencl: %s: a tensor's offset is not a whole number of its elements\n", node->name);
    return false;
  }
  clattn_status st = clattn_forward(g->ctx, &p, 0, NULL, NULL);
  if (st != CLATTN_OK) {
    fprintf(stderr, "ggml-opencl: %s: clattn_forward: %s\n", node->name, clattn_last_error(g->ctx));
    return false;
  }
  atomic_fetch_add(&calls, 1);
  return true;
}

bool ggml_opencl_clattn_compute(struct ggml_opencl_clattn *g, const struct ggml_tensor *node,
                                const ggml_opencl_clattn_tensor tensors[6]) {
  pthread_mutex_lock(&g->lock);
  const bool ok = compute_locked(g, node, tensors);
  pthread_mutex_unlock(&g->lock);
  return ok;
}
