/*
 * The staged path's plan: qk_score -> softmax_rows -> mix_values over
 * chunks of query rows (ca_plan_chunks), so the score scratch stays under
 * the context's budget whatever M and N are. The GEMM path shares the
 * first two stages.
 */
#include <string.h>

#include "plan/fill.h"

void ca_plan_qk_score(ca_list *l, const clattn_context *ctx, cl_program core, const clattn_params *p,
                      const ca_resolved *r, ca_buf scores, int bh0, int i0, int rows, int heads) {
  const tl_tiles *t = &ctx->tiles;
  ca_args_qk_score a;
  ca_bufs_qk_score b;
  memset(&a, 0, sizeof a);
  memset(&b, 0, sizeof b);
  CA_FILL_VIEW(b, a, q, &p->q);
  CA_FILL_VIEW(b, a, k, &p->k);
  CA_FILL_SCORE(b, a, p);
  CA_FILL_SCORING(b, a, p, r);
  a.group = r->group;
  a.head_dim = p->head_dim;
  CA_FILL_CHUNK(a, bh0, i0, rows);
  b.scores = scores;
  const size_t local[3] = {(size_t)t->score_tn, (size_t)t->score_tm, 1};
  const size_t global[3] = {ca_round_up((size_t)p->kv_len, t->score_tn), ca_round_up((size_t)rows, t->score_tm),
                            (size_t)heads};
  ca_list_kernel(l, core, "qk_score", 3, global, local);
  CA_LIST_ARGS(l, qk_score, b, a);
}

void ca_plan_softmax(ca_list *l, const clattn_context *ctx, cl_program core, const clattn_params *p,
                     const ca_resolved *r, ca_buf scores, int bh0, int i0, int rows, int heads, ca_buf flag) {
  ca_args_softmax_rows a;
  ca_bufs_softmax_rows b;
  memset(&a, 0, sizeof a);
  memset(&b, 0, sizeof b);
  b.scores = scores;
  a.kv_len = p->kv_len;
  CA_FILL_SEQ(b, a, p);
  a.q_heads = p->q_heads;
  a.q_len = p->q_len;
  CA_FILL_CHUNK(a, bh0, i0, rows);
  CA_FILL_VIEW(b, a, lse, &p->lse);
  a.want_lse = r->want_lse;
  CA_FILL_VIEW(b, a, weights, &p->weights);
  a.want_weights = r->want_weights;
  CA_FILL_SINKS(b, a, p);
  a.dropout = r->dropout;
  CA_FILL_DIAG(b, a, p, r->diag);
  b.empty_flag = flag;
  const size_t local[3] = {(size_t)ctx->tiles.softmax_wg, 1, 1};
  const size_t global[3] = {(size_t)ctx->tiles.softmax_wg, (size_t)heads * (size_t)rows, 1};
  ca_list_kernel(l, core, "softmax_rows", 3, global, local);
  CA_LIST_ARGS(l, softmax_rows, b, a);
}

clattn_status ca_plan_staged(clattn_context *ctx, const clattn_params *p, const ca_resolved *r, ca_list *l) {
  l->what = "staged";
  const tl_tiles *t = &ctx->tiles;
  const int pairs = p->batch * p->q_heads;
  const ca_chunk chunk = ca_plan_chunks(p, ctx->scratch_budget);
  ca_program core;
  const ca_program_key key = ca_key_with_mod(ca_core_key(p->dtype, r->k_dtype, r->v_dtype), p);
  clattn_status st = ca_plan_program(ctx, &key, l, &core);
  if (st != CLATTN_OK) return st;
  const ca_buf scores = ca_scratch(ca_list_scratch(
      l, (size_t)chunk.heads * (size_t)chunk.rows * (size_t)p->kv_len * sizeof(float), "staged score scratch"));
  const ca_buf flag = ca_flag_of(l, p->empty_rows);
  ca_args_mix_values m;
  ca_bufs_mix_values mb;
  memset(&m, 0, sizeof m);
  memset(&mb, 0, sizeof mb);
  mb.probs = scores;
  CA_FILL_VIEW(mb, m, v, &p->v);
  CA_FILL_SEQ(mb, m, p);
  CA_FILL_KV(mb, m, p);
  m.q_heads = p->q_heads;
  m.group = r->group;
  m.q_len = p->q_len;
  m.kv_len = p->kv_len;
  m.value_dim = p->value_dim;
  CA_FILL_VIEW(mb, m, out, &p->out);
  /* Step by what was done, not by the chunk: i0 + chunk.rows can pass INT_MAX. */
  for (int bh0 = 0, heads; bh0 < pairs; bh0 += heads) {
    heads = chunk.heads < pairs - bh0 ? chunk.heads : pairs - bh0;
    for (int i0 = 0, rows; i0 < p->q_len; i0 += rows) {
      rows = chunk.rows < p->q_len - i0 ? chunk.rows : p->q_len - i0;
      ca_plan_qk_score(l, ctx, core.program, p, r, scores, bh0, i0, rows, heads);
      ca_plan_softmax(l, ctx, core.program, p, r, scores, bh0, i0, rows, heads, flag);
      CA_FILL_CHUNK(m, bh0, i0, rows);
      const size_t local[3] = {(size_t)t->mix_tv, (size_t)t->mix_tm, 1};
      const size_t global[3] = {ca_round_up((size_t)p->value_dim, t->mix_tv), ca_round_up((size_t)rows, t->mix_tm),
                                (size_t)heads};
      ca_list_kernel(l, core.program, "mix_values", 3, global, local);
      CA_LIST_ARGS(l, mix_values, mb, m);
      if (l->error) return l->error;
    }
  }
  return l->error;
}
