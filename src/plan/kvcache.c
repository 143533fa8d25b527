/*
 * clattn_forward_kvcache's plan: an engine's decode step in one list, as
 * FlashAttention's flash_attn_with_kvcache:
 *   kvcache_rotary   rotated copies of q and the new keys (with rotary tables)
 *   kv_append        the new rows into the cache (append.c); its K half also
 *                    writes the forward's per-row lengths and starts, which
 *                    kvcache_lengths writes for a step that appends nothing
 *   the forward's path on what the call means (check/kvcache.c): the cache
 *   with each row's keys up to cache_seqlens[b] + new_len, aligned on their
 *   own count (cache_leftpad, or zeros). A contiguous cache seen through
 *   cache_batch_idx is a paged one, one page of kv_len rows per slot.
 */
#include <stdint.h>
#include <string.h>

#include "plan/fill.h"

/* A dense [batch, heads, rows, cols] view at element offset. */
static clattn_tensor dense_view(size_t offset, int heads, int rows, int cols) {
  const size_t row = (size_t)cols, head = (size_t)rows * row;
  return (clattn_tensor){NULL, offset, {(size_t)heads * head, head, row, 1}};
}

/* kvcache_rotary over view src (heads x rows rows of every batch row) into
 * dst (a scratch slot at element dst_at, dense), rows at their positions
 * (per_row) or all at seqlens[b]. */
static void rotate(ca_list *l, cl_program program, const clattn_kvcache_params *kp, const clattn_tensor *src,
                   ca_buf dst, size_t dst_at, int heads, int rows, int per_row) {
  const clattn_params *a = &kp->attn;
  ca_args_kvcache_rotary r;
  ca_bufs_kvcache_rotary b;
  memset(&r, 0, sizeof r);
  memset(&b, 0, sizeof b);
  CA_FILL_VIEW(b, r, src, src);
  b.dst = dst;
  r.dst_at = dst_at;
  CA_FILL_VIEW(b, r, cos_t, &kp->rotary_cos);
  CA_FILL_VIEW(b, r, sin_t, &kp->rotary_sin);
  b.seqlens = ca_mem(kp->cache_seqlens);
  r.heads = heads;
  r.rows = rows;
  r.cols = a->head_dim;
  r.rot_half = kp->rotary_dim / 2;
  r.rot_len = kp->rotary_len;
  r.interleaved = kp->rotary_interleaved;
  r.per_row = per_row;
  const size_t global[2] = {(size_t)rows, (size_t)a->batch * (size_t)heads};
  ca_list_kernel(l, program, "kvcache_rotary", 2, global, NULL);
  CA_LIST_ARGS(l, kvcache_rotary, b, r);
}

/* Stand-ins for the step's own buffers while the append's and the
 * forward's plans are made from clattn params (ca_list_rebind then puts
 * the scratch slots in their place): tags, never OpenCL objects. */
static const char q_tag, k_tag, lens_tag, starts_tag;
#define TAG(t) ((cl_mem)(uintptr_t)&(t))

clattn_status ca_plan_kvcache(clattn_context *ctx, const clattn_kvcache_params *kp, ca_list *l) {
  const clattn_params *a = &kp->attn;
  clattn_params fp;
  clattn_append_params ap;
  ca_kvcache_derive(kp, &fp, &ap);
  const int rotary = kp->rotary_cos.buf != NULL, appends = kp->new_len > 0;
  ca_program program;
  const ca_program_key key = ca_append_key(a->dtype, ca_k_dtype(a));
  clattn_status st = ca_program_get(ctx, &key, &program);
  if (st != CLATTN_OK) return st;
  /* the rotated copies, q's then the new keys', in one scratch buffer of attn.dtype */
  const size_t q_elems = (size_t)a->batch * a->q_heads * a->q_len * a->head_dim;
  const size_t k_at = ca_round_up(q_elems, 64),
               k_elems = appends ? (size_t)a->batch * a->kv_heads * kp->new_len * a->head_dim : 0;
  const size_t int_bytes = (size_t)a->batch * sizeof(cl_int);
  const ca_buf lens = ca_scratch(ca_list_scratch(l, int_bytes, "kvcache step lengths"));
  const ca_buf starts = ca_scratch(ca_list_scratch(l, int_bytes, "kvcache step starts"));
  ca_buf rot = ca_mem(NULL);
  if (rotary) {
    rot = ca_scratch(
        ca_list_scratch(l, (k_at + k_elems) * ca_unit_bytes(a->dtype), "kvcache step rotated q and keys"));
    /* queries at their own positions where the mask depends on them (FlashAttention's rule) */
    const int per_row = a->causal || a->window_left >= 0 || a->window_right >= 0;
    rotate(l, program.program, kp, &a->q, rot, 0, a->q_heads, a->q_len, per_row);
    fp.q = dense_view(0, a->q_heads, a->q_len, a->head_dim);
    fp.q.buf = TAG(q_tag);
    if (appends) {
      rotate(l, program.program, kp, &kp->k_new, rot, k_at, a->kv_heads, kp->new_len, 1);
      ap.k_new = dense_view(k_at, a->kv_heads, kp->new_len, a->head_dim);
      ap.k_new.buf = TAG(k_tag);
    }
  }
  /* the forward's lengths: written by the append's K half, or on their own */
  const int appended_at = l->n_launch;
  if (appends) {
    const ca_step_lengths step = {ca_mem(a->cache_leftpad), lens, starts};
    if ((st = ca_plan_append(ctx, &ap, &step, l))) return st;
  } else {
    const ca_args_kvcache_lengths la = {0};
    const ca_bufs_kvcache_lengths lb = {ca_mem(kp->cache_seqlens), ca_mem(a->cache_leftpad), lens, starts};
    const size_t batch = (size_t)a->batch;
    ca_list_kernel(l, program.program, "kvcache_lengths", 1, &batch, NULL);
    CA_LIST_ARGS(l, kvcache_lengths, lb, la);
  }
  /* the forward over the cache, each row's keys as the step's lengths say */
  fp.kv_lens = TAG(lens_tag);
  fp.cache_leftpad = TAG(starts_tag);
  if ((st = ca_plan_forward(ctx, &fp, l))) return st;
  ca_list_rebind(l, appended_at, TAG(k_tag), rot);
  ca_list_rebind(l, appended_at, TAG(q_tag), rot);
  ca_list_rebind(l, appended_at, TAG(lens_tag), lens);
  ca_list_rebind(l, appended_at, TAG(starts_tag), starts);
  return l->error;
}
