/*
 * The GEMM path's plan: per chunk of query rows (ca_plan_chunks),
 *   S = Q K^T             CLBlast strided batched SGEMM, one matrix per (batch, head)
 *   gemm_mask_scores      scale, bias, mask, window, kv_lens -> -inf
 *   softmax_rows          softmax.cl's row softmax (A, lse, weights)
 *   O = A V               CLBlast strided batched SGEMM into scratch
 *   gemm_store_rows       O to the out view, recomputing any row with an
 *                         allowed non-finite value
 * Views with a column stride other than 1 (or rows shorter than a row) are
 * copied dense first (so are 16-bit storage and packed sequences, in f32).
 * V is always copied, padding rows zeroed and non-finite values zeroed and
 * flagged (gemm_finite_values): a GEMM adds in an order of its own, so a
 * row recomputed because a zero weight met a NaN would differ in rounding
 * from the same row without it. Paged or quantised K/V (or K/V stored
 * otherwise than q) are gathered through the block table and dequantised
 * into dense f32 scratch (gemm_k_gather, gemm_v_gather); keys on pages
 * outside the pool are masked out of the scores. Additive scores are no
 * matrix product: qk_score computes them, shaped and masked.
 */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "plan/fill.h"

/* A matrix operand as CLBlast takes it: buffer, element offset of (b, h) =
 * (0, 0), per-(b, h) strides, and the leading dimension of row-major rows. */
typedef struct {
  ca_buf buf;
  size_t offset, stride_b, stride_h, ld;
} operand;

/* Whether a [B, H, S, D] view is an f32 row-major matrix per (b, h) as it
 * is, every element below 2^31 (CLBlast's kernels take element offsets as
 * int: a view further into a large buffer, which POCL's 2 GiB allocations
 * never allow and Intel's runtime's do, read elsewhere); anything else
 * (16-bit storage, packed sequences) is copied dense, in f32, first. */
static int gemm_ready(const clattn_params *p, const clattn_tensor *t, int heads, int len, int width) {
  const size_t last = t->offset + (size_t)(p->batch - 1) * t->stride[0] + (size_t)(heads - 1) * t->stride[1] +
                      (size_t)(len - 1) * t->stride[2] + (size_t)(width - 1);
  return p->dtype == CLATTN_F32 && !p->cu_seqlens_q && t->stride[3] == 1 && t->stride[2] >= (size_t)width &&
         last <= INT_MAX;
}

static operand view_operand(const clattn_tensor *t) {
  return (operand){ca_mem(t->buf), t->offset, t->stride[0], t->stride[1], t->stride[2]};
}

/* A dense f32 copy [batch, heads, len, width] in scratch slot, as an operand. */
static operand dense_operand(ca_buf buf, int heads, int len, int width) {
  operand o = {buf, 0, 0, 0, (size_t)width};
  o.stride_h = (size_t)len * (size_t)width;
  o.stride_b = (size_t)heads * o.stride_h;
  return o;
}

/* gemm_k_gather or gemm_v_gather (name) of K or V stored paged or quantised
 * (or in another storage than q) into dst, a dense f32 [B, Hkv, N, width]. */
static void kv_gather(ca_list *l, cl_program core, const clattn_params *p, const char *name, const clattn_tensor *t,
                      const clattn_tensor *scale, int width, ca_buf dst) {
  ca_args_gemm_gather a;
  ca_bufs_gemm_gather b;
  memset(&a, 0, sizeof a);
  memset(&b, 0, sizeof b);
  CA_FILL_VIEW(b, a, src, t);
  CA_FILL_VIEW(b, a, scale, scale);
  a.heads = p->kv_heads;
  a.width = width;
  CA_FILL_SEQ(b, a, p);
  b.block_table = ca_mem(p->block_table);
  a.bt_stride = p->block_table ? p->block_table_stride : 0;
  a.page_size = p->block_table ? p->page_size : 1;
  a.num_pages = p->block_table ? p->num_pages : 0;
  a.q_len = p->q_len;
  a.kv_len = p->kv_len;
  b.dst = dst;
  const size_t global[3] = {(size_t)width, (size_t)p->kv_len, (size_t)p->batch * (size_t)p->kv_heads};
  ca_list_kernel(l, core, name, 3, global, NULL);
  CA_LIST_ARGS(l, gemm_gather, b, a);
}

/* gemm_dense_copy of view t ([batch, heads, len, width], query or key side)
 * into dst, dense f32, rows past each sequence zeroed. */
static void dense_copy(ca_list *l, cl_program core, const clattn_params *p, const clattn_tensor *t, int key_side,
                       int heads, int width, ca_buf dst) {
  ca_args_gemm_dense_copy a;
  ca_bufs_gemm_dense_copy b;
  memset(&a, 0, sizeof a);
  memset(&b, 0, sizeof b);
  CA_FILL_VIEW(b, a, src, t);
  a.heads = heads;
  a.width = width;
  a.key_side = key_side;
  CA_FILL_SEQ(b, a, p);
  a.q_len = p->q_len;
  a.kv_len = p->kv_len;
  b.dst = dst;
  const size_t global[3] = {(size_t)width, (size_t)(key_side ? p->kv_len : p->q_len),
                            (size_t)p->batch * (size_t)heads};
  ca_list_kernel(l, core, "gemm_dense_copy", 3, global, NULL);
  CA_LIST_ARGS(l, gemm_dense_copy, b, a);
}

/* Element offsets of the chunk's matrices, one per (batch, head) pair
 * g = 0 .. heads-1: in a view (rows from row0; KV heads for K and V), or in
 * a scratch holding the pairs `scratch_stride` elements apart. */
static void view_offsets(const operand *o, const clattn_params *p, int group, int per_kv_head, int bh0, int heads,
                         size_t row0, size_t *out) {
  for (int g = 0; g < heads; g++) {
    const int bh = bh0 + g, b = bh / p->q_heads, h = bh % p->q_heads;
    out[g] = o->offset + (size_t)b * o->stride_b + (size_t)(per_kv_head ? h / group : h) * o->stride_h + row0 * o->ld;
  }
}

static void scratch_offsets(size_t scratch_stride, int heads, size_t *out) {
  for (int g = 0; g < heads; g++) out[g] = (size_t)g * scratch_stride;
}

static void product(ca_list *l, int b_transposed, size_t m, size_t n, size_t k, const operand *a, const operand *b,
                    ca_buf c, size_t c_ld, int heads, const size_t *offsets, const char *what) {
  const ca_gemm g = {b_transposed, m, n, k, a->buf, b->buf, c, a->ld, b->ld, c_ld, heads, 0, what};
  ca_list_gemm(l, &g, offsets);
}

/* gemm_mask_scores over a chunk's scores S = Q K^T: scale, shaping, mask. */
static void mask_scores(ca_list *l, cl_program core, const clattn_params *p, const ca_resolved *r, ca_buf scores,
                        int bh0, int i0, int rows, int heads) {
  ca_args_gemm_mask_scores a;
  ca_bufs_gemm_mask_scores b;
  memset(&a, 0, sizeof a);
  memset(&b, 0, sizeof b);
  b.scores = scores;
  CA_FILL_SCORING(b, a, p, r);
  CA_FILL_CHUNK(a, bh0, i0, rows);
  const size_t global[3] = {(size_t)p->kv_len, (size_t)rows, (size_t)heads};
  ca_list_kernel(l, core, "gemm_mask_scores", 3, global, NULL);
  CA_LIST_ARGS(l, gemm_mask_scores, b, a);
}

clattn_status ca_plan_gemm(clattn_context *ctx, const clattn_params *p, const ca_resolved *r, ca_list *l) {
  l->what = "gemm";
  if (!ca_gemm_available())
    return ca_fail(CLATTN_ERR_UNSUPPORTED,
                   "algo GEMM: this clattn was built without CLBlast (meson -Dclblast); use AUTO, FUSED or STAGED");
  const int pairs = p->batch * p->q_heads;
  const ca_chunk chunk = ca_plan_chunks(p, ctx->scratch_budget);
  operand q = view_operand(&p->q), k = view_operand(&p->k), v;
  ca_program core;
  const ca_program_key key = ca_key_with_mod(ca_core_key(p->dtype, r->k_dtype, r->v_dtype), p);
  clattn_status st = ca_plan_program(ctx, &key, l, &core);
  if (st != CLATTN_OK) return st;
  const int additive = p->score == CLATTN_SCORE_ADDITIVE;
  /* K or V paged or stored otherwise than q: gathered and dequantised into scratch */
  const int k_stored = r->paged || r->k_dtype != p->dtype, v_stored = r->paged || r->v_dtype != p->dtype;
  const int copy_q = !additive && !gemm_ready(p, &p->q, p->q_heads, p->q_len, p->head_dim);
  /* a left-padded row's keys start at its own row (gemm_dense_copy finds them) */
  const int copy_k =
      !additive && (k_stored || p->cache_leftpad || !gemm_ready(p, &p->k, p->kv_heads, p->kv_len, p->head_dim));
  const size_t q_floats = (size_t)pairs * p->q_len * p->head_dim;
  const size_t k_floats = (size_t)p->batch * p->kv_heads * p->kv_len * p->head_dim;
  const size_t v_rows = (size_t)p->batch * p->kv_heads * p->kv_len;
  const size_t v_floats = v_rows * p->value_dim; /* V is always copied: what a GEMM must not see zeroed */
  const size_t score_floats = (size_t)chunk.heads * (size_t)chunk.rows * (size_t)p->kv_len;
  const size_t o_floats = (size_t)chunk.heads * (size_t)chunk.rows * (size_t)p->value_dim;
  const ca_buf flag = ca_flag_of(l, p->empty_rows);
  const ca_buf scores = ca_scratch(ca_list_scratch(l, score_floats * sizeof(float), "GEMM score scratch"));
  const ca_buf o_rows = ca_scratch(ca_list_scratch(l, o_floats * sizeof(float), "GEMM output rows"));
  if (copy_q) {
    const ca_buf q_copy = ca_scratch(ca_list_scratch(l, q_floats * sizeof(float), "GEMM dense copy of q"));
    dense_copy(l, core.program, p, &p->q, 0, p->q_heads, p->head_dim, q_copy);
    q = dense_operand(q_copy, p->q_heads, p->q_len, p->head_dim);
  }
  if (copy_k) {
    const ca_buf k_copy =
        ca_scratch(ca_list_scratch(l, k_floats * sizeof(float), k_stored ? "GEMM K gather" : "GEMM dense copy of k"));
    if (k_stored)
      kv_gather(l, core.program, p, "gemm_k_gather", &p->k, &p->k_scale, p->head_dim, k_copy);
    else
      dense_copy(l, core.program, p, &p->k, 1, p->kv_heads, p->head_dim, k_copy);
    k = dense_operand(k_copy, p->kv_heads, p->kv_len, p->head_dim);
  }
  const ca_buf v_copy =
      ca_scratch(ca_list_scratch(l, v_floats * sizeof(float), v_stored ? "GEMM V gather" : "GEMM dense copy of v"));
  const ca_buf v_bad = ca_scratch(ca_list_scratch(l, v_rows, "GEMM value flags"));
  if (v_stored)
    kv_gather(l, core.program, p, "gemm_v_gather", &p->v, &p->v_scale, p->value_dim, v_copy);
  else
    dense_copy(l, core.program, p, &p->v, 1, p->kv_heads, p->value_dim, v_copy);
  { /* non-finite values zeroed, their rows flagged */
    ca_args_gemm_finite_values a;
    memset(&a, 0, sizeof a); /* the padding too: lists compare, and kernels keep, arguments by their bytes */
    a.width = p->value_dim;
    a.rows = (cl_ulong)v_rows;
    const ca_bufs_gemm_finite_values b = {v_copy, v_bad};
    const size_t global[1] = {v_rows};
    ca_list_kernel(l, core.program, "gemm_finite_values", 1, global, NULL);
    CA_LIST_ARGS(l, gemm_finite_values, b, a);
  }
  v = dense_operand(v_copy, p->kv_heads, p->kv_len, p->value_dim);

  ca_args_gemm_store_rows s;
  ca_bufs_gemm_store_rows sb;
  memset(&s, 0, sizeof s);
  memset(&sb, 0, sizeof sb);
  sb.o_rows = o_rows;
  sb.probs = scores;
  CA_FILL_VIEW(sb, s, v, &p->v);
  sb.v_bad = v_bad;
  CA_FILL_SEQ(sb, s, p);
  CA_FILL_KV(sb, s, p);
  s.q_heads = p->q_heads;
  s.group = r->group;
  s.q_len = p->q_len;
  s.kv_len = p->kv_len;
  s.value_dim = p->value_dim;
  CA_FILL_VIEW(sb, s, out, &p->out);
  size_t *offsets = malloc((size_t)chunk.heads * 3 * sizeof(size_t));
  if (!offsets) return ca_fail(CLATTN_ERR_OUT_OF_MEMORY, "GEMM path: out of host memory");
  /* Step by what was done, not by the chunk: i0 + chunk.rows can pass INT_MAX. */
  for (int bh0 = 0, heads; bh0 < pairs && !l->error; bh0 += heads) {
    heads = chunk.heads < pairs - bh0 ? chunk.heads : pairs - bh0;
    for (int i0 = 0, rows; i0 < p->q_len && !l->error; i0 += rows) {
      rows = chunk.rows < p->q_len - i0 ? chunk.rows : p->q_len - i0;
      const size_t score_stride = (size_t)rows * (size_t)p->kv_len;
      if (additive) {
        ca_plan_qk_score(l, ctx, core.program, p, r, scores, bh0, i0, rows, heads);
      } else {
        view_offsets(&q, p, r->group, 0, bh0, heads, (size_t)i0, offsets);
        view_offsets(&k, p, r->group, 1, bh0, heads, 0, offsets + heads);
        scratch_offsets(score_stride, heads, offsets + 2 * heads);
        product(l, 1, (size_t)rows, (size_t)p->kv_len, (size_t)p->head_dim, &q, &k, scores, (size_t)p->kv_len, heads,
                offsets, "CLBlastSgemmStridedBatched(Q K^T)");
        mask_scores(l, core.program, p, r, scores, bh0, i0, rows, heads);
      }
      ca_plan_softmax(l, ctx, core.program, p, r, scores, bh0, i0, rows, heads, flag);
      const operand a = {scores, 0, 0, 0, (size_t)p->kv_len};
      scratch_offsets(score_stride, heads, offsets);
      view_offsets(&v, p, r->group, 1, bh0, heads, 0, offsets + heads);
      scratch_offsets((size_t)rows * (size_t)p->value_dim, heads, offsets + 2 * heads);
      product(l, 0, (size_t)rows, (size_t)p->value_dim, (size_t)p->kv_len, &a, &v, o_rows, (size_t)p->value_dim,
              heads, offsets, "CLBlastSgemmStridedBatched(A V)");
      CA_FILL_CHUNK(s, bh0, i0, rows);
      const size_t global[2] = {(size_t)rows, (size_t)heads};
      ca_list_kernel(l, core.program, "gemm_store_rows", 2, global, NULL);
      CA_LIST_ARGS(l, gemm_store_rows, sb, s);
    }
  }
  free(offsets);
  return l->error;
}
