/* clattn_forward's checks (and the forward part of the backward's). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "check/check.h"

#define BAD(...) ca_fail(CLATTN_ERR_INVALID_ARGUMENT, __VA_ARGS__)

clattn_status ca_check_storage(const clattn_params *p) {
  if (ca_is_dtype(p->dtype) && p->dtype != CLATTN_F32 && p->dtype != CLATTN_F16 && p->dtype != CLATTN_BF16)
    return BAD("dtype %s: quantised storage is for k and v only (kv_dtype); q and out are F32, F16 or BF16",
               ca_dtype_name(p->dtype));
  if (p->dtype != CLATTN_F32 && p->dtype != CLATTN_F16 && p->dtype != CLATTN_BF16)
    return BAD("dtype %d is not a storage type of q and out", (int)p->dtype);
  if (p->kv_dtype != CLATTN_DTYPE_SAME && !ca_is_dtype(p->kv_dtype))
    return BAD("kv_dtype %d is not a clattn_dtype", (int)p->kv_dtype);
  if (p->v_dtype != CLATTN_DTYPE_SAME && !ca_is_dtype(p->v_dtype))
    return BAD("v_dtype %d is not a clattn_dtype", (int)p->v_dtype);
  if (p->head_dim <= 0) return BAD("head_dim must be positive (got %d)", p->head_dim);
  if (p->value_dim <= 0) return BAD("value_dim must be positive (got %d)", p->value_dim);
  const clattn_dtype k_dtype = ca_k_dtype(p), v_dtype = ca_v_dtype(p);
  if (ca_block_bytes(k_dtype) && p->head_dim % 32)
    return BAD("kv_dtype %s stores rows in blocks of 32 elements: head_dim (%d) must be a multiple of 32",
               ca_dtype_name(k_dtype), p->head_dim);
  if (ca_block_bytes(v_dtype) && p->value_dim % 32)
    return BAD("%s %s stores rows in blocks of 32 elements: value_dim (%d) must be a multiple of 32",
               p->v_dtype == CLATTN_DTYPE_SAME ? "kv_dtype" : "v_dtype", ca_dtype_name(v_dtype), p->value_dim);
  return CLATTN_OK;
}

clattn_dtype ca_k_dtype(const clattn_params *p) { return p->kv_dtype == CLATTN_DTYPE_SAME ? p->dtype : p->kv_dtype; }
clattn_dtype ca_v_dtype(const clattn_params *p) { return p->v_dtype == CLATTN_DTYPE_SAME ? ca_k_dtype(p) : p->v_dtype; }

static clattn_status check_dims(const clattn_params *p) {
  const struct {
    const char *name;
    int value;
  } dims[] = {
      {"batch", p->batch}, {"q_heads", p->q_heads}, {"kv_heads", p->kv_heads},
      {"q_len", p->q_len}, {"kv_len", p->kv_len},
  };
  for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++)
    if (dims[i].value <= 0) return BAD("%s must be positive (got %d)", dims[i].name, dims[i].value);
  if (p->q_heads % p->kv_heads != 0) return BAD("kv_heads (%d) must divide q_heads (%d)", p->kv_heads, p->q_heads);
  /* Flattened (batch, head) and row indices are int in the kernels. */
  if ((long long)p->batch * p->q_heads > INT32_MAX)
    return BAD("batch * q_heads (%lld) exceeds 2^31 - 1", (long long)p->batch * p->q_heads);
  return CLATTN_OK;
}

static clattn_status check_enums(const clattn_params *p) {
  if (p->empty_rows != CLATTN_EMPTY_ZERO && p->empty_rows != CLATTN_EMPTY_ERROR)
    return BAD("empty_rows %d is not a clattn_empty_rows", (int)p->empty_rows);
  if (p->algo < CLATTN_ALGO_AUTO || p->algo > CLATTN_ALGO_GEMM)
    return BAD("algo %d is not a clattn_algo", (int)p->algo);
  if (p->window_left < -1) return BAD("window_left must be -1 (unbounded) or >= 0 (got %d)", p->window_left);
  if (p->window_right < -1) return BAD("window_right must be -1 (unbounded) or >= 0 (got %d)", p->window_right);
  if (isinf(p->scale)) return BAD("scale must be finite or NAN (got %g)", (double)p->scale);
  if (!(p->softcap >= 0.0f) || isinf(p->softcap))
    return BAD("softcap must be 0 (off) or positive and finite (got %g)", (double)p->softcap);
  if (p->score != CLATTN_SCORE_DOT && p->score != CLATTN_SCORE_ADDITIVE)
    return BAD("score %d is not a clattn_score", (int)p->score);
  if (p->score == CLATTN_SCORE_ADDITIVE && !p->additive_w)
    return BAD("additive_w is NULL: CLATTN_SCORE_ADDITIVE needs the weights w (f32 [head_dim])");
  if (p->score == CLATTN_SCORE_DOT && p->additive_w) return BAD("additive_w is set but score is CLATTN_SCORE_DOT");
  if (p->alibi_batch_stride < 0)
    return BAD("alibi_batch_stride must be >= 0 (0: one slope per head; got %d)", p->alibi_batch_stride);
  if (p->bias_dtype != CLATTN_F32 && p->bias_dtype != CLATTN_F16)
    return BAD("bias_dtype %d: a bias is stored as CLATTN_F32 or CLATTN_F16", (int)p->bias_dtype);
  if (p->bias_scale && !p->bias.buf) return BAD("bias_scale is set but bias is absent (it scales the bias)");
  if (p->alibi_batch_stride > 0 && !p->alibi_slopes)
    return BAD("alibi_batch_stride is %d but alibi_slopes is NULL", p->alibi_batch_stride);
  if (!(p->dropout_p >= 0.0f && p->dropout_p < 1.0f))
    return BAD("dropout_p must be in [0, 1) (0: no dropout; got %g)", (double)p->dropout_p);
  return CLATTN_OK;
}

/* Packed variable-length batches: both offset arrays, no kv_lens, the
 * totals given, and q, k, v, out with no batch stride (sequences are rows).
 * Over a paged cache only the queries are packed: cu_seqlens_q, and each
 * sequence's keys through the block table, kv_lens[b] of them. */
static clattn_status check_varlen(const clattn_params *p) {
  if (!p->cu_seqlens_q && !p->cu_seqlens_k) return CLATTN_OK;
  const int paged = p->block_table != NULL;
  if (paged && !p->cu_seqlens_q)
    return BAD(
        "cu_seqlens_k with a block table: paged keys are found through the block table (packed queries take "
        "cu_seqlens_q, each sequence's key count kv_lens)");
  if (paged && p->cu_seqlens_k)
    return BAD(
        "cu_seqlens_k with a block table: each sequence's keys are kv_lens[b] keys through its block-table "
        "row; cu_seqlens_k must be NULL");
  if (!paged && (!p->cu_seqlens_q || !p->cu_seqlens_k))
    return BAD("cu_seqlens_q and cu_seqlens_k come together without a block table (got only %s)",
               p->cu_seqlens_q ? "cu_seqlens_q" : "cu_seqlens_k");
  if (!paged && p->kv_lens) return BAD("kv_lens with cu_seqlens: packed sequences carry their own lengths");
  if (p->batch == INT32_MAX) return BAD("batch %d: cu_seqlens would need batch + 1 entries", p->batch);
  if (p->total_q <= 0) return BAD("total_q must be positive with cu_seqlens_q (got %d)", p->total_q);
  if (!paged && p->total_kv <= 0) return BAD("total_kv must be positive with cu_seqlens_k (got %d)", p->total_kv);
  const struct {
    const char *name;
    const clattn_tensor *t;
  } views[] = {{"q", &p->q}, {"out", &p->out}, {"k", &p->k}, {"v", &p->v}};
  for (size_t i = 0; i < (paged ? 2 : 4); i++) /* paged k and v: stride[0] steps a page */
    if (views[i].t->stride[0] != 0)
      return BAD("%s.stride[0] must be 0 with cu_seqlens: sequence b's rows are found through cu_seqlens (got %zu)",
                 views[i].name, views[i].t->stride[0]);
  return CLATTN_OK;
}

/* out_role: CA_VIEW_OUT, or CA_VIEW_READ_WHOLE for out and lse read by the backward. */
static clattn_status check_views(ca_views *vs, const clattn_params *p, int out_role) {
  clattn_status st;
  /* packed sequences: q, k, v, out are one batch of total_q / total_kv rows */
  const int varlen = p->cu_seqlens_q != NULL, qb = varlen ? 1 : p->batch;
  const int q_rows = varlen ? p->total_q : p->q_len, k_rows = varlen ? p->total_kv : p->kv_len;
  const int q_dims[] = {qb, p->q_heads, q_rows, p->head_dim};
  /* paged K/V: [page, kv head, row in page, column] */
  const int paged = p->block_table != NULL, kv_slots = paged ? p->num_pages : qb,
            kv_rows = paged ? p->page_size : k_rows;
  const int k_dims[] = {kv_slots, p->kv_heads, kv_rows, p->head_dim};
  const int v_dims[] = {kv_slots, p->kv_heads, kv_rows, p->value_dim};
  const int o_dims[] = {qb, p->q_heads, q_rows, p->value_dim};
  const int s_dims[] = {p->batch, p->q_heads, p->q_len, p->kv_len};
  const int lse_dims[] = {p->batch, p->q_heads, p->q_len};
  const struct {
    const char *name;
    const clattn_tensor *t;
  } required[] = {{"q", &p->q}, {"k", &p->k}, {"v", &p->v}, {"out", &p->out}};
  for (size_t i = 0; i < 4; i++)
    if (!required[i].t->buf) return BAD("%s.buf is NULL (q, k, v and out are required)", required[i].name);
  const size_t elem = p->dtype == CLATTN_F32 ? sizeof(float) : 2; /* f16 and bf16: 16 bits */
  if ((st = ca_check_view(vs, "q", &p->q, q_dims, 4, elem, 0))) return st;
  if (paged && (st = ca_check_block_table(vs, p->block_table, p->batch, p->block_table_stride, p->page_size, p->num_pages,
                                       p->kv_len)))
    return st;
  if ((st = ca_check_kv_view(vs, "k", &p->k, k_dims, ca_k_dtype(p), 0))) return st;
  if ((st = ca_check_kv_view(vs, "v", &p->v, v_dims, ca_v_dtype(p), 0))) return st;
  if ((st = ca_check_kv_scales(vs, ca_k_dtype(p), ca_v_dtype(p), &p->k_scale, &p->v_scale, kv_slots, p->kv_heads, kv_rows,
                            0)))
    return st;
  const struct {
    const char *name;
    const clattn_tensor *t;
    const int *dims;
    int rank;
    size_t elem;
  } outs[] = {
      {"lse", &p->lse, lse_dims, 3, sizeof(float)},         {"weights", &p->weights, s_dims, 4, sizeof(float)},
      {"entropy", &p->entropy, lse_dims, 3, sizeof(float)}, {"max_weight", &p->max_weight, lse_dims, 3, sizeof(float)},
      {"argmax", &p->argmax, lse_dims, 3, sizeof(int32_t)},
  };
  if ((st = ca_check_view(vs, "out", &p->out, o_dims, 4, elem, out_role))) return st;
  if (p->mask.buf && (st = ca_check_view(vs, "mask", &p->mask, s_dims, 4, 1, 0))) return st;
  if (p->bias.buf && (st = ca_check_view(vs, "bias", &p->bias, s_dims, 4, ca_unit_bytes(p->bias_dtype), 0))) return st;
  for (size_t i = 0; i < sizeof outs / sizeof outs[0]; i++)
    if (outs[i].t->buf && (st = ca_check_view(vs, outs[i].name, outs[i].t, outs[i].dims, outs[i].rank, outs[i].elem,
                                           i == 0 ? out_role : CA_VIEW_OUT)))
      return st;
  const int b_dims[] = {p->batch};
  const clattn_tensor lens = {p->kv_lens, 0, {1, 0, 0, 0}}, leftpad = {p->cache_leftpad, 0, {1, 0, 0, 0}};
  if (p->kv_lens && (st = ca_check_view(vs, "kv_lens", &lens, b_dims, 1, sizeof(int32_t), 0))) return st;
  if (p->cache_leftpad && (st = ca_check_view(vs, "cache_leftpad", &leftpad, b_dims, 1, sizeof(int32_t), 0))) return st;
  if (varlen) {
    const int cu_dims[] = {p->batch + 1};
    const clattn_tensor cq = {p->cu_seqlens_q, 0, {1, 0, 0, 0}}, ck = {p->cu_seqlens_k, 0, {1, 0, 0, 0}};
    if ((st = ca_check_view(vs, "cu_seqlens_q", &cq, cu_dims, 1, sizeof(int32_t), 0)) ||
        (ck.buf && (st = ca_check_view(vs, "cu_seqlens_k", &ck, cu_dims, 1, sizeof(int32_t), 0))))
      return st;
  }
  const int h_dims[] = {p->q_heads}, bh_dims[] = {p->batch, p->q_heads};
  /* per (batch, head) with a batch stride, else one slope per head */
  const clattn_tensor alibi = {p->alibi_slopes, 0, {(size_t)p->alibi_batch_stride, 1, 0, 0}},
                      sinks = {p->sinks, p->sinks_offset, {1, 0, 0, 0}};
  if (p->alibi_slopes && (st = ca_check_view(vs, "alibi_slopes", &alibi, bh_dims, 2, sizeof(float), 0))) return st;
  if (p->sinks && (st = ca_check_view(vs, "sinks", &sinks, h_dims, 1, sizeof(float), 0))) return st;
  const clattn_tensor bias_scale = {p->bias_scale, 0, {1, 0, 0, 0}};
  if (p->bias_scale && (st = ca_check_view(vs, "bias_scale", &bias_scale, h_dims, 1, sizeof(float), 0))) return st;
  const int d_dims[] = {p->head_dim};
  const clattn_tensor w = {p->additive_w, 0, {1, 0, 0, 0}};
  if (p->additive_w && (st = ca_check_view(vs, "additive_w", &w, d_dims, 1, sizeof(float), 0))) return st;
  return CLATTN_OK;
}

/* Every check of a forward call; its views go to *vs, the aliasing rule
 * checked unless the caller adds views first (the backward). */
static clattn_status check(const clattn_context *ctx, const clattn_params *p, int out_role, ca_views *vs,
                           int check_sharing) {
  clattn_status st;
  if (!ctx) return BAD("clattn_forward: ctx is NULL");
  if (!p) return BAD("clattn_forward: params is NULL");
  if ((st = ca_check_fields(p)) || (st = check_varlen(p))) return st;
  if (p->block_table && !p->kv_lens)
    return BAD("block_table without kv_lens: a paged cache needs each batch row's length");
  if (p->cache_leftpad && !p->kv_lens)
    return BAD("cache_leftpad without kv_lens: a left-padded row's keys end at kv_lens[b]");
  if (p->cache_leftpad && p->cu_seqlens_k)
    return BAD("cache_leftpad with cu_seqlens_k: packed keys start where cu_seqlens_k says");
  ca_views_init(vs, ctx->context);
  if ((st = check_views(vs, p, out_role)) || (st = ca_check_modifiers(vs, p)) ||
      (check_sharing && (st = ca_views_disjoint(vs))))
    return st;
  if (p->algo == CLATTN_ALGO_FUSED && p->weights.buf)
    return ca_fail(CLATTN_ERR_UNSUPPORTED,
                   "weights: the fused kernel never forms the routing matrix; use CLATTN_ALGO_STAGED or AUTO");
  return CLATTN_OK;
}

clattn_status ca_check_fields(const clattn_params *p) {
  clattn_status st;
  if ((st = check_dims(p)) || (st = ca_check_storage(p)) || (st = check_enums(p))) return st;
  return CLATTN_OK;
}

clattn_status ca_check_forward_views(const clattn_context *ctx, const clattn_params *p, ca_views *views) {
  return check(ctx, p, CA_VIEW_OUT, views, 0);
}

clattn_status ca_check_forward(const clattn_context *ctx, const clattn_params *p, ca_views *views) {
  ca_views own;
  return check(ctx, p, CA_VIEW_OUT, views ? views : &own, 1);
}

clattn_status ca_check_forward_read(const clattn_context *ctx, const clattn_params *p, ca_views *views) {
  return check(ctx, p, CA_VIEW_READ_WHOLE, views, 0);
}
