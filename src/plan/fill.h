/*
 * Filling cl/args.h.cl's argument groups from a call: each macro sets one
 * group's buffers (b, a ca_bufs_F) and fields (a, a ca_args_F) of any
 * family that holds the group, from clattn_params *p.
 */
#ifndef CLATTN_PLAN_FILL_H
#define CLATTN_PLAN_FILL_H

#include "plan/plan.h"

/* A view: its buffer and its offset and strides. */
#define CA_FILL_VIEW(b, a, field, t) ((b).field = ca_mem((t)->buf), (a).field = ca_view_of(t))

/* Where each batch row's keys lie: valid lengths (has_kv_lens: 1, | 2 =
 * common.h.cl's CA_KV_START with left padding), paging. */
#define CA_FILL_ROWS(b, a, p)                                                         \
  ((b).kv_lens = ca_mem((p)->kv_lens), (b).kv_start = ca_mem((p)->cache_leftpad),    \
   (a).has_kv_lens = !(p)->kv_lens ? 0 : (p)->cache_leftpad ? 3 : 1, (a).paged = (p)->block_table != NULL)
/* Packed variable-length sequences. */
#define CA_FILL_PACKED(b, a, p)                                                                     \
  ((b).cu_q = ca_mem((p)->cu_seqlens_q), (b).cu_k = ca_mem((p)->cu_seqlens_k),                     \
   (a).varlen = (p)->cu_seqlens_q != NULL, (a).total_q = (p)->cu_seqlens_q ? (p)->total_q : 0,     \
   (a).total_kv = (p)->cu_seqlens_q && (p)->cu_seqlens_k ? (p)->total_kv : 0)
#define CA_FILL_SEQ(b, a, p) (CA_FILL_ROWS(b, a, p), CA_FILL_PACKED(b, a, p))
/* K/V storage: the block table (every field 0 without: common.h.cl reads
 * them only when paged), INT8 scales. */
#define CA_FILL_KV(b, a, p)                                                                              \
  ((b).block_table = ca_mem((p)->block_table), (a).bt_stride = (p)->block_table ? (p)->block_table_stride : 0, \
   (a).page_size = (p)->block_table ? (p)->page_size : 0, (a).num_pages = (p)->block_table ? (p)->num_pages : 0, \
   CA_FILL_VIEW(b, a, k_scale, &(p)->k_scale), CA_FILL_VIEW(b, a, v_scale, &(p)->v_scale))
#define CA_FILL_MASK(b, a, p) (CA_FILL_VIEW(b, a, mask, &(p)->mask), (a).has_mask = (p)->mask.buf != NULL)
/* has_bias: 1 present, | common.h.cl's CA_BIAS_F16, | CA_BIAS_SCALED */
#define CA_FILL_BIAS(b, a, p)                                                                         \
  (CA_FILL_VIEW(b, a, bias, &(p)->bias), (b).bias_scale = ca_mem((p)->bias_scale),                   \
   (a).has_bias = !(p)->bias.buf ? 0 : 1 | ((p)->bias_dtype == CLATTN_F16 ? 2 : 0) | ((p)->bias_scale ? 4 : 0))
#define CA_FILL_SCORE(b, a, p) \
  ((b).add_w = ca_mem((p)->additive_w), (a).additive = (p)->score == CLATTN_SCORE_ADDITIVE)
#define CA_FILL_ALIBI(b, a, p)                                                            \
  ((b).alibi = ca_mem((p)->alibi_slopes), (a).has_alibi = (p)->alibi_slopes != NULL,     \
   (a).alibi_bstride = (p)->alibi_slopes ? (p)->alibi_batch_stride : 0)
#define CA_FILL_SINKS(b, a, p) ((b).sinks = ca_mem((p)->sinks), (a).sinks_at = (cl_long)(p)->sinks_offset)
#define CA_FILL_DIAG(b, a, p, d)                                                                 \
  (CA_FILL_VIEW(b, a, entropy, &(p)->entropy), CA_FILL_VIEW(b, a, max_weight, &(p)->max_weight), \
   CA_FILL_VIEW(b, a, argmax, &(p)->argmax), (a).diag = (d))
/* The caller's modifiers: captured buffers, the block mask's classes, the
 * scalars (plan.h's ca_mod_of). */
#define CA_FILL_MOD(b, a, p)                                                                           \
  ((b).cap0 = ca_mem((p)->captures[0]), (b).cap1 = ca_mem((p)->captures[1]),                          \
   (b).cap2 = ca_mem((p)->captures[2]), (b).cap3 = ca_mem((p)->captures[3]),                          \
   (b).bm_class = ca_mem((p)->block_mask ? (p)->block_mask->classes : NULL), (a).mod = ca_mod_of(p))
/* What a score kernel needs to say which keys a row sees and how its
 * score is shaped (qk_score, gemm_mask_scores); r: the call's ca_resolved. */
#define CA_FILL_SCORING(b, a, p, r)                                                                             \
  (CA_FILL_MASK(b, a, p), CA_FILL_BIAS(b, a, p), CA_FILL_SEQ(b, a, p), CA_FILL_KV(b, a, p), CA_FILL_ALIBI(b, a, p), \
   (a).q_heads = (p)->q_heads, (a).q_len = (p)->q_len, (a).kv_len = (p)->kv_len, (a).scale = (r)->scale,       \
   (a).softcap = (p)->softcap, (a).window_left = (r)->window_left, (a).window_right = (r)->window_right,     \
   CA_FILL_MOD(b, a, p))
/* A chunk of query rows. */
#define CA_FILL_CHUNK(a, bh0_, i0_, rows_) ((a).bh0 = (bh0_), (a).i0 = (i0_), (a).rows = (rows_))

#endif
