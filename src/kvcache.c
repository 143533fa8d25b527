/*
 * clattn_forward_kvcache: an engine's decode step in one call, as
 * FlashAttention's flash_attn_with_kvcache. Validated first (the forward's,
 * the append's and the step's own checks), then one chain of commands:
 * kvcache_rotary (rotated copies of q and the new keys, with rotary tables),
 * kv_append (src/append.c; its K half also writes the forward's per-row
 * lengths and starts, which kvcache_lengths writes for a step that appends
 * nothing), then the forward's path on the derived params: the cache
 * with each row's keys up to cache_seqlens[b] + new_len, aligned on their
 * own count (cache_leftpad, or zeros). A contiguous cache seen through
 * cache_batch_idx is a paged one, one page of kv_len rows per slot.
 */
#include <string.h>

#include "internal.h"

clattn_kvcache_params clattn_kvcache_params_default(void) {
  clattn_kvcache_params kp;
  memset(&kp, 0, sizeof kp);
  kp.attn = clattn_params_default();
  kp.rotary_interleaved = 1;
  return kp;
}

/* A dense [batch, heads, rows, cols] view of storage dtype at element offset. */
static clattn_tensor dense_view(cl_mem buf, size_t offset, int heads, int rows, int cols) {
  const size_t row = (size_t)cols, head = (size_t)rows * row;
  return (clattn_tensor){buf, offset, {(size_t)heads * head, head, row, 1}};
}

/* kvcache_rotary over view src (heads x rows rows of every batch row) into
 * dst, rows at their positions (per_row) or all at seqlens[b]. */
static clattn_status enqueue_rotary(clattn_context *ctx, cl_kernel kernel, const clattn_kvcache_params *kp,
                                    const clattn_tensor *src, const clattn_tensor *dst, int heads, int rows,
                                    int per_row, cl_uint n_wait, const cl_event *wait, cl_event *prev) {
  const clattn_params *a = &kp->attn;
  const cl_ulong dst_off = dst->offset;
  ca_args r = {kernel, "kvcache_rotary", 0, 0, CL_SUCCESS, NULL};
  ca_arg_view(&r, src);
  ca_arg_mem(&r, dst->buf);
  ca_arg(&r, sizeof dst_off, &dst_off);
  ca_arg_view(&r, &kp->rotary_cos);
  ca_arg_view(&r, &kp->rotary_sin);
  ca_arg_mem(&r, kp->cache_seqlens);
  ca_arg_int(&r, heads);
  ca_arg_int(&r, rows);
  ca_arg_int(&r, a->head_dim);
  ca_arg_int(&r, kp->rotary_dim / 2);
  ca_arg_int(&r, kp->rotary_len);
  ca_arg_int(&r, kp->rotary_interleaved);
  ca_arg_int(&r, per_row);
  clattn_status st = ca_args_done(&r);
  if (st) return st;
  const size_t global[2] = {(size_t)rows, (size_t)a->batch * (size_t)heads};
  return ca_enqueue(ctx, kernel, "kvcache_rotary", 2, global, NULL, n_wait, wait, prev);
}

clattn_status clattn_forward_kvcache(clattn_context *ctx, const clattn_kvcache_params *kp, cl_uint n_wait,
                                     const cl_event *wait, cl_event *done) {
  if (done) *done = NULL;
  if (n_wait > 0 && !wait)
    return ca_fail(CLATTN_ERR_INVALID_ARGUMENT, "clattn_forward_kvcache: n_wait is %u but wait is NULL", n_wait);
  clattn_params fp;
  clattn_append_params ap;
  ca_plan plan;
  clattn_status st = ca_validate_kvcache(ctx, kp, &fp, &ap, &plan);
  if (st) return st;
  ca_route_begin(clattn_algo_name(plan.algo)); /* each enqueue adds its kernel */

  const clattn_params *a = &kp->attn;
  const int rotary = kp->rotary_cos.buf != NULL, appends = kp->new_len > 0;
  /* the rotated copies, q's then the new keys', in one scratch buffer of attn.dtype */
  const size_t q_elems = (size_t)a->batch * a->q_heads * a->q_len * a->head_dim;
  const size_t k_at = ca_round_up(q_elems, 64),
               k_elems = appends ? (size_t)a->batch * a->kv_heads * kp->new_len * a->head_dim : 0;
  const size_t rot_bytes = rotary ? (k_at + k_elems) * ca_unit_bytes(a->dtype) : 0;
  const size_t int_bytes = (size_t)a->batch * sizeof(cl_int);
  cl_program program = NULL;
  cl_kernel lengths = NULL, rotate = NULL;
  cl_mem lens = NULL, starts = NULL, rot = NULL;
  cl_event prev = NULL, last = NULL;
  ca_deps deps;
  ca_deps_init(&deps, n_wait, wait);
  if ((st = ca_append_program(ctx, a->dtype, plan.k_dtype, &program)) ||
      (!appends && (st = ca_kernel_take(ctx, program, "kvcache_lengths", &lengths))) ||
      (rotary && (st = ca_kernel_take(ctx, program, "kvcache_rotary", &rotate))) ||
      (st = ca_scratch_take(ctx, int_bytes, "kvcache step lengths", &deps, &lens)) ||
      (st = ca_scratch_take(ctx, int_bytes, "kvcache step starts", &deps, &starts)) ||
      (rotary && (st = ca_scratch_take(ctx, rot_bytes, "kvcache step rotated q and keys", &deps, &rot))) ||
      (st = ca_deps_list(&deps, &n_wait, &wait))) /* the first command's wait list */
    goto fail;
  ca_note_scratch(ctx, 2 * int_bytes + rot_bytes);

  if (rotary) {
    /* queries at their own positions where the mask depends on them (FlashAttention's rule) */
    const int per_row = a->causal || a->window_left >= 0 || a->window_right >= 0;
    const clattn_tensor q_rot = dense_view(rot, 0, a->q_heads, a->q_len, a->head_dim);
    if ((st = enqueue_rotary(ctx, rotate, kp, &a->q, &q_rot, a->q_heads, a->q_len, per_row, n_wait, wait, &prev)))
      goto fail;
    fp.q = q_rot;
    if (appends) {
      const clattn_tensor k_rot = dense_view(rot, k_at, a->kv_heads, kp->new_len, a->head_dim);
      if ((st = enqueue_rotary(ctx, rotate, kp, &kp->k_new, &k_rot, a->kv_heads, kp->new_len, 1, n_wait, wait, &prev)))
        goto fail;
      ap.k_new = k_rot;
    }
  }
  /* the forward's lengths: written by the append's K half, or on their own */
  const ca_step_lengths step_lengths = {a->cache_leftpad, lens, starts};
  if (appends && (st = ca_enqueue_append(ctx, &ap, &step_lengths, n_wait, wait, &prev))) goto fail;
  if (!appends) {
    ca_args l = {lengths, "kvcache_lengths", 0, 0, CL_SUCCESS, NULL};
    ca_arg_mem(&l, kp->cache_seqlens);
    ca_arg_mem(&l, a->cache_leftpad);
    ca_arg_int(&l, 0);
    ca_arg_mem(&l, lens);
    ca_arg_mem(&l, starts);
    const size_t batch = (size_t)a->batch;
    if ((st = ca_args_done(&l)) ||
        (st = ca_enqueue(ctx, lengths, "kvcache_lengths", 1, &batch, NULL, n_wait, wait, &prev)))
      goto fail;
  }
  fp.kv_lens = lens;
  fp.cache_leftpad = starts;
  st = ca_forward_enqueue(ctx, &fp, &plan, 1, &prev, &last);
fail:;
  const cl_event used = st == CLATTN_OK ? last : NULL; /* a failed call's last use is not known */
  ca_kernel_give(ctx, lengths);
  ca_kernel_give(ctx, rotate);
  ca_scratch_give(ctx, lens, used);
  ca_scratch_give(ctx, starts, used);
  ca_scratch_give(ctx, rot, used);
  ca_deps_release(&deps);
  if (prev) clReleaseEvent(prev);
  ca_hand_out(st, &last, done);
  return st;
}
