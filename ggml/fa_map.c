/*
 * FLASH_ATTN_EXT as ggml defines it (ggml.h; ggml-cpu/ops.cpp's
 * ggml_compute_forward_flash_attn_ext is the reference), as one
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
 * ggml's views carry byte strides: element views of f32, f16, bf16 become
 * element strides, the block types (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL)
 * keep bytes, as clattn's block views do. Query head h reads KV head
 * h / (H / Hkv) in both. The precision request and the sparse-mask hint
 * (n_kv_max) change nothing: clattn computes in f32 over the allowed keys.
 */
#include "fa_map.h"

#include <math.h>
#include <string.h>

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

static float op_param(const struct ggml_tensor *op, int i) {
  float f;
  memcpy(&f, (const float *)op->op_params + i, sizeof f);
  return f;
}

float gc_fa_max_bias(const struct ggml_tensor *op) { return op_param(op, 1); }

/* A view's strides in clattn's units: elements, or bytes for the block
 * types. */
static bool unit_strides(const struct ggml_tensor *t, size_t unit) {
  for (int i = 1; i < 4; i++)
    if (t->nb[i] % unit) return false;
  return true;
}

bool gc_fa_supported(const struct ggml_tensor *op) {
  const struct ggml_tensor *q = op->src[0], *k = op->src[1], *v = op->src[2], *mask = op->src[3], *sinks = op->src[4];
  if (op->op != GGML_OP_FLASH_ATTN_EXT || !q || !k || !v) return false;
  if (op->type != GGML_TYPE_F32 || q->type != GGML_TYPE_F32) return false;
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
  /* a scale past the floats (NaN: clattn's "default", ggml's NaN result) is ggml's alone */
  const float scale = op_param(op, 0), max_bias = op_param(op, 1), softcap = op_param(op, 2);
  if (!isfinite(scale) || !(softcap >= 0.0f) || isinf(softcap) || (max_bias > 0.0f && !mask)) return false;
  return true;
}

void gc_fa_slopes(int64_t heads, float max_bias, float *out) {
  const uint32_t n_head_log2 = 1u << (uint32_t)floor(log2((double)heads));
  const float m0 = powf(2.0f, -(max_bias) / (float)n_head_log2);
  const float m1 = powf(2.0f, -(max_bias / 2.0f) / (float)n_head_log2);
  for (int64_t h = 0; h < heads; h++)
    out[h] = h < (int64_t)n_head_log2 ? powf(m0, (float)(h + 1)) : powf(m1, (float)(2 * (h - n_head_log2) + 1));
}

/* clattn's view of a tensor at m: its [batch, head, row] dimensions are
 * ggml's order[0..2] (0: broadcast, stride 0), offset and strides in unit
 * (an element, or a byte for the block types). false: the offset is not a
 * whole number of units. */
static bool view_of(gc_fa_mem m, const struct ggml_tensor *t, size_t unit, const int order[3], clattn_tensor *v) {
  if (m.offset % unit) return false;
  *v = (clattn_tensor){m.mem, m.offset / unit, {0, 0, 0, ggml_blck_size(t->type) > 1 ? ggml_type_size(t->type) : 1}};
  for (int i = 0; i < 3; i++) v->stride[i] = order[i] ? t->nb[order[i]] / unit : 0;
  return true;
}

bool gc_fa_params(const struct ggml_tensor *node, const gc_fa_mem mem[GC_FA_TENSORS], cl_mem slopes, clattn_params *p) {
  const struct ggml_tensor *q = node->src[0], *k = node->src[1], *v = node->src[2], *mask = node->src[3],
                           *sinks = node->src[4];
  *p = clattn_params_default();
  p->batch = (int)q->ne[3];
  p->q_heads = (int)q->ne[2];
  p->kv_heads = (int)k->ne[2];
  p->q_len = (int)q->ne[1];
  p->kv_len = (int)k->ne[1];
  p->head_dim = (int)k->ne[0];
  p->value_dim = (int)v->ne[0];
  p->dtype = CLATTN_F32;
  p->kv_dtype = k->type == GGML_TYPE_BF16 && mem[GC_FA_K].bf16_as_f16 ? CLATTN_F16 : (clattn_dtype)kv_storage(k->type);
  p->v_dtype = v->type == GGML_TYPE_BF16 && mem[GC_FA_V].bf16_as_f16 ? CLATTN_F16 : (clattn_dtype)kv_storage(v->type);
  p->scale = op_param(node, 0);
  p->softcap = op_param(node, 2);
  const int qkv_order[3] = {3, 2, 1}, out_order[3] = {3, 1, 2};
  const size_t k_unit = ggml_blck_size(k->type) > 1 ? 1 : ggml_type_size(k->type);
  const size_t v_unit = ggml_blck_size(v->type) > 1 ? 1 : ggml_type_size(v->type);
  bool ok = view_of(mem[GC_FA_Q], q, sizeof(float), qkv_order, &p->q) &&
            view_of(mem[GC_FA_K], k, k_unit, qkv_order, &p->k) && view_of(mem[GC_FA_V], v, v_unit, qkv_order, &p->v) &&
            view_of(mem[GC_FA_OUT], node, sizeof(float), out_order, &p->out);
  if (mask) {
    const int mask_order[3] = {mask->ne[3] == 1 ? 0 : 3, mask->ne[2] == 1 ? 0 : 2, 1};
    ok = ok && view_of(mem[GC_FA_MASK], mask, sizeof(ggml_fp16_t), mask_order, &p->bias);
    p->bias_dtype = CLATTN_F16;
    if (op_param(node, 1) > 0.0f) p->bias_scale = slopes;
  }
  if (sinks) {
    ok = ok && mem[GC_FA_SINKS].offset % sizeof(float) == 0;
    p->sinks = mem[GC_FA_SINKS].mem;
    p->sinks_offset = mem[GC_FA_SINKS].offset / sizeof(float);
  }
  return ok;
}
