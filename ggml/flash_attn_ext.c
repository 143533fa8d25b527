/*
 * FLASH_ATTN_EXT as ggml defines it (ggml.h; ggml-cpu/ops.cpp's
 * ggml_compute_forward_flash_attn_ext is the reference), computed by one
 * clattn_forward:
 *
 *   q    [DK, n_q, H, S] f32            -> clattn q    [S, H, n_q, DK]
 *   k    [DK, n_kv, Hkv, S]             -> clattn k    [S, Hkv, n_kv, DK], kv_dtype
 *   v    [DV, n_kv, Hkv, S]             -> clattn v    [S, Hkv, n_kv, DV], v_dtype
 *   mask [n_kv, n_q, ne32, ne33] f16    -> clattn bias (bias_dtype F16), head and
 *                                          sequence broadcast when ne32 / ne33 is 1;
 *                                          -inf = the key is not allowed
 *   out  [DV, H, n_q, S] f32            -> clattn out  [S, H, n_q, DV] (heads inside rows)
 *   op params scale, max_bias (ALiBi: ggml's per-head slope times the mask
 *   value: bias_scale), logit_softcap (softcap); src[4] sinks f32 [H].
 *
 * Each tensor's host memory is wrapped as an OpenCL buffer from its first
 * byte. ggml's views carry byte strides: element views of f32, f16, bf16
 * become element strides, the block types (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1,
 * IQ4_NL) keep bytes, as clattn's block views do. Query head h reads KV head
 * h / (H / Hkv) in both. The precision request and the sparse-mask hint
 * (n_kv_max) change nothing: clattn computes in f32 over the allowed keys.
 */
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "ggml-clattn.h"
#include "internal.h"

static atomic_ullong calls;

void gc_count_call(void) { atomic_fetch_add(&calls, 1); }

uint64_t ggml_backend_clattn_calls(void) { return atomic_load(&calls); }

/* clattn's storage of a ggml type (-1: none). */
static int kv_storage(enum ggml_type t) {
  switch (t) {
    case GGML_TYPE_F32: return CLATTN_F32;
    case GGML_TYPE_F16: return CLATTN_F16;
    case GGML_TYPE_BF16: return CLATTN_BF16;
    case GGML_TYPE_Q8_0: return CLATTN_Q8_0;
    case GGML_TYPE_Q4_0: return CLATTN_Q4_0;
    case GGML_TYPE_Q4_1: return CLATTN_Q4_1;
    case GGML_TYPE_Q5_0: return CLATTN_Q5_0;
    case GGML_TYPE_Q5_1: return CLATTN_Q5_1;
    case GGML_TYPE_IQ4_NL: return CLATTN_IQ4_NL;
    default: return -1;
  }
}

/* A view's strides in clattn's units: elements, or bytes for the block
 * types. */
static bool unit_strides(const struct ggml_tensor *t, size_t unit) {
  for (int i = 1; i < 4; i++)
    if (t->nb[i] % unit) return false;
  return true;
}

bool gc_flash_attn_supported(const struct ggml_tensor *op) {
  const struct ggml_tensor *q = op->src[0], *k = op->src[1], *v = op->src[2], *mask = op->src[3],
                           *sinks = op->src[4];
  if (!q || !k || !v || op->type != GGML_TYPE_F32 || q->type != GGML_TYPE_F32) return false;
  if (kv_storage(k->type) < 0 || kv_storage(v->type) < 0) return false;
  const int64_t DK = k->ne[0], DV = v->ne[0], n_q = q->ne[1], H = q->ne[2], S = q->ne[3], n_kv = k->ne[1],
                Hkv = k->ne[2];
  if (DK <= 0 || DV <= 0 || n_q <= 0 || n_kv <= 0 || H <= 0 || S <= 0 || Hkv <= 0) return false;
  if (q->ne[0] != DK || op->ne[0] != DV || op->ne[1] != H || op->ne[2] != n_q || op->ne[3] != S) return false;
  /* clattn's heads share one KV head count and one sequence count */
  if (v->ne[1] < n_kv || v->ne[2] != Hkv || k->ne[3] != S || v->ne[3] != S || H % Hkv) return false;
  /* rows: unit column strides (ggml's CPU backend asks the same) */
  if (q->nb[0] != sizeof(float) || k->nb[0] != ggml_type_size(k->type) || v->nb[0] != ggml_type_size(v->type))
    return false;
  if (op->nb[0] != sizeof(float) || !ggml_is_contiguous(op)) return false;
  if (!unit_strides(q, sizeof(float)) || !unit_strides(op, sizeof(float))) return false;
  if (ggml_blck_size(k->type) == 1 && !unit_strides(k, ggml_type_size(k->type))) return false;
  if (ggml_blck_size(v->type) == 1 && !unit_strides(v, ggml_type_size(v->type))) return false;
  if (mask) {
    /* ggml broadcasts the mask modulo ne32 heads and ne33 sequences; clattn's strides express 1 or all */
    if (mask->type != GGML_TYPE_F16 || mask->ne[0] < n_kv || mask->ne[1] < n_q) return false;
    if ((mask->ne[2] != 1 && mask->ne[2] != H) || (mask->ne[3] != 1 && mask->ne[3] != S)) return false;
    if (mask->nb[0] != sizeof(ggml_fp16_t) || !unit_strides(mask, sizeof(ggml_fp16_t))) return false;
  }
  if (sinks && (sinks->type != GGML_TYPE_F32 || sinks->ne[0] < H || !ggml_is_contiguous(sinks))) return false;
  float max_bias, softcap;
  memcpy(&max_bias, (const float *)op->op_params + 1, sizeof max_bias);
  memcpy(&softcap, (const float *)op->op_params + 2, sizeof softcap);
  if (!(softcap >= 0.0f) || isinf(softcap) || (max_bias > 0.0f && !mask)) return false;
  return true;
}

/* ggml's ALiBi slope of head h (ggml_compute_forward_flash_attn_ext's m0, m1). */
static float alibi_slope(int64_t h, int64_t n_head, float max_bias) {
  const uint32_t n_head_log2 = 1u << (uint32_t)floor(log2((double)n_head));
  const float m0 = powf(2.0f, -(max_bias) / (float)n_head_log2);
  const float m1 = powf(2.0f, -(max_bias / 2.0f) / (float)n_head_log2);
  return h < (int64_t)n_head_log2 ? powf(m0, (float)(h + 1)) : powf(m1, (float)(2 * (h - n_head_log2) + 1));
}

/* The backend's slopes buffer for (heads, max_bias), made when they change. */
static cl_mem slopes_for(gc_backend *be, int64_t heads, float max_bias) {
  if (be->slopes && be->slope_heads == heads && be->slope_max_bias == max_bias) return be->slopes;
  if (be->slopes) clReleaseMemObject(be->slopes);
  be->slopes = NULL;
  float *s = malloc(sizeof(float) * (size_t)heads);
  if (!s) return NULL;
  for (int64_t h = 0; h < heads; h++) s[h] = alibi_slope(h, heads, max_bias);
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
 * that keeps a copy of its own takes the host's contents at creation. */
static cl_mem wrap(clattn_context *ctx, const struct ggml_tensor *t, cl_mem_flags access, cl_int *err) {
  if (!t) return NULL;
  return clCreateBuffer(clattn_cl_context(ctx), access | CL_MEM_USE_HOST_PTR, ggml_nbytes(t), t->data, err);
}

/* clattn's view of a wrapped tensor: its [batch, head, row] dimensions are
 * ggml's order[0..2] (0: broadcast, stride 0), each stride the byte stride
 * over unit (an element, or a byte for the block types). */
static clattn_tensor view_of(cl_mem mem, const struct ggml_tensor *t, size_t unit, const int order[3]) {
  clattn_tensor v = {mem, 0, {0, 0, 0, ggml_blck_size(t->type) > 1 ? ggml_type_size(t->type) : 1}};
  for (int i = 0; i < 3; i++) v.stride[i] = order[i] ? t->nb[order[i]] / unit : 0;
  return v;
}

enum ggml_status gc_flash_attn_compute(gc_backend *be, struct ggml_tensor *node) {
  const struct ggml_tensor *q = node->src[0], *k = node->src[1], *v = node->src[2], *mask = node->src[3],
                           *sinks = node->src[4];
  clattn_context *ctx = be->dev->ctx;
  float scale, max_bias, softcap;
  memcpy(&scale, (const float *)node->op_params + 0, sizeof scale);
  memcpy(&max_bias, (const float *)node->op_params + 1, sizeof max_bias);
  memcpy(&softcap, (const float *)node->op_params + 2, sizeof softcap);

  /* q, k, v, mask, sinks, out */
  const struct ggml_tensor *tensors[6] = {q, k, v, mask, sinks, node};
  cl_mem mem[6] = {NULL};
  cl_int err = CL_SUCCESS;
  for (int i = 0; i < 6 && err == CL_SUCCESS; i++)
    mem[i] = wrap(ctx, tensors[i], i < 5 ? CL_MEM_READ_ONLY : CL_MEM_READ_WRITE, &err);

  clattn_params p = clattn_params_default();
  p.batch = (int)q->ne[3];
  p.q_heads = (int)q->ne[2];
  p.kv_heads = (int)k->ne[2];
  p.q_len = (int)q->ne[1];
  p.kv_len = (int)k->ne[1];
  p.head_dim = (int)k->ne[0];
  p.value_dim = (int)v->ne[0];
  p.dtype = CLATTN_F32;
  p.kv_dtype = (clattn_dtype)kv_storage(k->type);
  p.v_dtype = (clattn_dtype)kv_storage(v->type);
  p.scale = scale;
  p.softcap = softcap;
  const int qkv_order[3] = {3, 2, 1}, out_order[3] = {3, 1, 2};
  const size_t k_unit = ggml_blck_size(k->type) > 1 ? 1 : ggml_type_size(k->type);
  const size_t v_unit = ggml_blck_size(v->type) > 1 ? 1 : ggml_type_size(v->type);
  p.q = view_of(mem[0], q, sizeof(float), qkv_order);
  p.k = view_of(mem[1], k, k_unit, qkv_order);
  p.v = view_of(mem[2], v, v_unit, qkv_order);
  p.out = view_of(mem[5], node, sizeof(float), out_order);
  if (mask) {
    const int mask_order[3] = {mask->ne[3] == 1 ? 0 : 3, mask->ne[2] == 1 ? 0 : 2, 1};
    p.bias = view_of(mem[3], mask, sizeof(ggml_fp16_t), mask_order);
    p.bias_dtype = CLATTN_F16;
    if (max_bias > 0.0f && !(p.bias_scale = slopes_for(be, q->ne[2], max_bias))) err = CL_OUT_OF_HOST_MEMORY;
  }
  p.sinks = mem[4];

  clattn_status st = CLATTN_OK;
  cl_event done = NULL;
  if (err == CL_SUCCESS) st = clattn_forward(ctx, &p, 0, NULL, &done);
  if (done) {
    err = clWaitForEvents(1, &done);
    clReleaseEvent(done);
  }
  /* the output into host memory, where a device keeps a copy of its own */
  if (err == CL_SUCCESS && st == CLATTN_OK) {
    void *host = clEnqueueMapBuffer(clattn_cl_queue(ctx), mem[5], CL_TRUE, CL_MAP_READ, 0, ggml_nbytes(node), 0, NULL,
                                    NULL, &err);
    if (err == CL_SUCCESS) err = clEnqueueUnmapMemObject(clattn_cl_queue(ctx), mem[5], host, 0, NULL, NULL);
    if (err == CL_SUCCESS) err = clFinish(clattn_cl_queue(ctx));
  }
  for (int i = 0; i < 6; i++)
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
