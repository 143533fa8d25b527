/*
 * clattn_kv_append: new K/V rows into a contiguous or paged cache of any kv
 * storage, quantised on the way (cl/append.cl). Validated first like
 * clattn_forward, so a rejected call enqueues nothing and touches nothing.
 */
#include <stdio.h>

#include "program_text.h"
#include "internal.h"

clattn_append_params clattn_append_params_default(void) {
  clattn_append_params ap = {0};
  ap.src_dtype = CLATTN_F32;
  ap.kv_dtype = CLATTN_DTYPE_SAME;
  return ap;
}

/* One kv_append launch: the K or the V half of the call. */
static clattn_status enqueue_half(clattn_context *ctx, cl_kernel kernel, const clattn_append_params *ap,
                                  const clattn_tensor *src, const clattn_tensor *dst, const clattn_tensor *scale,
                                  int cols, const ca_step_lengths *lengths, cl_uint n_wait, const cl_event *wait,
                                  cl_event *prev) {
  const int paged = ap->block_table != NULL;
  ca_args a = {kernel, "kv_append", 0, 0, CL_SUCCESS, NULL};
  ca_arg_view(&a, src);
  ca_arg_view(&a, dst);
  ca_arg_view(&a, scale);
  ca_arg_mem(&a, ap->positions);
  ca_arg_mem(&a, ap->block_table);
  ca_arg_int(&a, paged ? ap->block_table_stride : 0);
  ca_arg_int(&a, paged ? ap->page_size : 1);
  ca_arg_int(&a, paged ? ap->num_pages : 0);
  ca_arg_int(&a, paged);
  ca_arg_int(&a, paged ? 0 : ap->capacity);
  ca_arg_int(&a, ap->kv_heads);
  ca_arg_int(&a, ap->new_len);
  ca_arg_int(&a, cols);
  ca_arg_mem(&a, lengths ? lengths->leftpad : NULL);
  ca_arg_mem(&a, lengths ? lengths->lens : NULL);
  ca_arg_mem(&a, lengths ? lengths->starts : NULL);
  clattn_status st = ca_args_done(&a);
  if (st) return st;
  const size_t global[2] = {(size_t)ap->new_len, (size_t)ap->batch * (size_t)ap->kv_heads};
  return ca_enqueue(ctx, kernel, "kv_append", 2, global, NULL, n_wait, wait, prev);
}

clattn_status ca_enqueue_append(clattn_context *ctx, const clattn_append_params *ap, const ca_step_lengths *lengths,
                                cl_uint n_wait, const cl_event *wait, cl_event *prev) {
  const clattn_dtype kv = ap->kv_dtype == CLATTN_DTYPE_SAME ? ap->src_dtype : ap->kv_dtype;
  cl_program program = NULL;
  cl_kernel kernel = NULL;
  clattn_status st;
  if ((st = ca_append_program(ctx, ap->src_dtype, kv, &program)) ||
      (st = ca_kernel_take(ctx, program, "kv_append", &kernel)))
    return st;
  /* kernel arguments are copied at enqueue, so one kernel serves both halves */
  if (!(st =
            enqueue_half(ctx, kernel, ap, &ap->k_new, &ap->k, &ap->k_scale, ap->head_dim, lengths, n_wait, wait, prev)))
    st = enqueue_half(ctx, kernel, ap, &ap->v_new, &ap->v, &ap->v_scale, ap->value_dim, NULL, n_wait, wait, prev);
  ca_kernel_give(ctx, kernel);
  return st;
}

clattn_status clattn_kv_append(clattn_context *ctx, const clattn_append_params *ap, cl_uint n_wait,
                               const cl_event *wait, cl_event *done) {
  if (done) *done = NULL;
  if (n_wait > 0 && !wait)
    return ca_fail(CLATTN_ERR_INVALID_ARGUMENT, "clattn_kv_append: n_wait is %u but wait is NULL", n_wait);
  clattn_status st = ca_validate_append(ctx, ap);
  if (st) return st;
  ca_route_begin("kv_append");
  if (ap->new_len == 0) { /* a no-op that still orders after the caller's events */
    if (!done) return CLATTN_OK;
    cl_int err = clEnqueueMarkerWithWaitList(ctx->queue, n_wait, n_wait ? wait : NULL, done);
    if (err != CL_SUCCESS) {
      *done = NULL;
      return ca_cl_fail(err, "clEnqueueMarkerWithWaitList(kv_append, new_len 0)");
    }
    return CLATTN_OK;
  }
  cl_event prev = NULL;
  st = ca_enqueue_append(ctx, ap, NULL, n_wait, wait, &prev);
  ca_hand_out(st, &prev, done);
  return st;
}
