/* Launch helpers shared by the paths: kernel arguments in order, chained
 * enqueues, and the end of a call (the empty-row flag, the last event). */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "internal.h"

/* Sets argument a->index unless the object holds that value already (held:
 * whether a value may be taken as held; a cl_mem other than NULL may not). */
static void set_arg(ca_args *a, size_t size, const void *value, int holdable) {
  if (a->err == CL_SUCCESS) {
    struct ca_held_arg *h = a->held && a->index < CA_HELD_ARGS && size <= CA_HELD_BYTES ? &a->held->arg[a->index] : NULL;
    if (h && holdable && h->size == size && memcmp(h->bytes, value, size) == 0) {
      a->index++;
      return;
    }
    a->err = clSetKernelArg(a->kernel, a->index, size, value);
    if (a->err != CL_SUCCESS) a->failed_index = a->index;
    if (h) {
      h->size = a->err == CL_SUCCESS && holdable ? (unsigned char)size : 0;
      if (h->size) memcpy(h->bytes, value, size);
    }
  }
  a->index++;
}

void ca_arg(ca_args *a, size_t size, const void *value) { set_arg(a, size, value, 1); }

void ca_arg_mem(ca_args *a, cl_mem m) { set_arg(a, sizeof m, &m, m == NULL); }

void ca_arg_int(ca_args *a, int v) { ca_arg(a, sizeof v, &v); }

void ca_arg_float(ca_args *a, float v) { ca_arg(a, sizeof v, &v); }

void ca_arg_view(ca_args *a, const clattn_tensor *t) {
  cl_ulong offset = t->offset;
  cl_ulong4 stride;
  for (int d = 0; d < 4; d++) stride.s[d] = t->stride[d];
  ca_arg_mem(a, t->buf);
  ca_arg(a, sizeof offset, &offset);
  ca_arg(a, sizeof stride, &stride);
}

void ca_arg_diag(ca_args *a, const clattn_params *p, int diag) {
  ca_arg_view(a, &p->entropy);
  ca_arg_view(a, &p->max_weight);
  ca_arg_view(a, &p->argmax);
  ca_arg_int(a, diag);
}

void ca_arg_shape(ca_args *a, const clattn_params *p) {
  ca_arg_float(a, p->softcap);
  ca_arg_mem(a, p->alibi_slopes);
  ca_arg_int(a, p->alibi_slopes != NULL);
  ca_arg_int(a, p->alibi_slopes ? p->alibi_batch_stride : 0);
}

void ca_arg_seq(ca_args *a, const clattn_params *p) {
  const int varlen = p->cu_seqlens_q != NULL;
  ca_arg_mem(a, p->kv_lens);
  /* cl/common.h.cl's CA_SEQ_ARGS: 1 kv_lens, | CA_KV_START with cache_leftpad */
  ca_arg_int(a, p->kv_lens == NULL ? 0 : p->cache_leftpad ? 3 : 1);
  ca_arg_mem(a, p->cu_seqlens_q);
  ca_arg_mem(a, p->cu_seqlens_k);
  ca_arg_int(a, varlen);
  ca_arg_int(a, varlen ? p->total_q : 0);
  ca_arg_int(a, varlen && p->cu_seqlens_k ? p->total_kv : 0);
  ca_arg_int(a, p->block_table != NULL);
  ca_arg_mem(a, p->cache_leftpad);
}

void ca_arg_kv(ca_args *a, const clattn_params *p) {
  ca_arg_mem(a, p->block_table);
  ca_arg_int(a, p->block_table ? p->block_table_stride : 0);
  ca_arg_int(a, p->block_table ? p->page_size : 1);
  ca_arg_int(a, p->block_table ? p->num_pages : 0);
  ca_arg_view(a, &p->k_scale);
  ca_arg_view(a, &p->v_scale);
}

void ca_arg_allowed(ca_args *a, const clattn_params *p) {
  ca_arg_view(a, &p->mask);
  ca_arg_int(a, p->mask.buf != NULL);
  ca_arg_view(a, &p->bias);
  /* cl/common.h.cl's ca_bias: 1 present, CA_BIAS_F16, CA_BIAS_SCALED */
  ca_arg_int(a, !p->bias.buf ? 0 : 1 | (p->bias_dtype == CLATTN_F16 ? 2 : 0) | (p->bias_scale ? 4 : 0));
  ca_arg_mem(a, p->bias_scale);
  ca_arg_seq(a, p);
}

void ca_arg_score(ca_args *a, const clattn_params *p) {
  ca_arg_mem(a, p->additive_w);
  ca_arg_int(a, p->score == CLATTN_SCORE_ADDITIVE);
}

void ca_arg_sinks(ca_args *a, const clattn_params *p) {
  ca_arg_mem(a, p->sinks);
  const cl_long at = p->sinks ? (cl_long)p->sinks_offset : -1; /* cl/common.h.cl's ca_sink */
  ca_arg(a, sizeof at, &at);
}

void ca_arg_fused(ca_args *r, const clattn_params *p, const ca_plan *plan, cl_mem kt, cl_mem vp, cl_long n_pad,
                  int split_keys, int diag, cl_mem part_o, cl_mem part_lse, cl_mem flag, ca_fused_slots *slots) {
  ca_fused_slots at;
  at.q_off = r->index + 1; /* a view: buffer, offset, strides */
  ca_arg_view(r, &p->q);
  ca_arg_mem(r, kt);
  ca_arg_mem(r, vp);
  at.n_pad = r->index;
  ca_arg(r, sizeof n_pad, &n_pad);
  ca_arg_view(r, &p->k);
  ca_arg_view(r, &p->v);
  ca_arg_score(r, p);
  ca_arg_allowed(r, p);
  ca_arg_kv(r, p);
  ca_arg_int(r, p->q_heads);
  ca_arg_int(r, p->kv_heads);
  ca_arg_int(r, plan->group);
  ca_arg_int(r, p->q_len);
  at.kv_len = r->index;
  ca_arg_int(r, p->kv_len);
  ca_arg_float(r, plan->scale);
  ca_arg_shape(r, p);
  ca_arg_sinks(r, p);
  ca_arg_int(r, plan->window_left);
  ca_arg_int(r, plan->window_right);
  at.split_keys = r->index;
  ca_arg_int(r, split_keys);
  at.out_off = r->index + 1;
  ca_arg_view(r, &p->out);
  at.lse_off = r->index + 1;
  ca_arg_view(r, &p->lse);
  ca_arg_int(r, plan->want_lse);
  ca_arg_mem(r, plan->dropout);
  ca_arg_diag(r, p, diag);
  ca_arg_mem(r, part_o);
  ca_arg_mem(r, part_lse);
  ca_arg_mem(r, flag);
  if (slots) *slots = at;
}

void ca_arg_pack(ca_args *a, const clattn_params *p, cl_long n_pad, cl_mem kt, cl_mem vp, ca_fused_slots *slots) {
  ca_arg_view(a, &p->k);
  ca_arg_view(a, &p->v);
  ca_arg_seq(a, p);
  ca_arg_kv(a, p);
  ca_arg_int(a, p->q_len);
  ca_arg_int(a, p->kv_heads);
  if (slots) slots->kv_len = a->index;
  ca_arg_int(a, p->kv_len);
  if (slots) slots->n_pad = a->index;
  ca_arg(a, sizeof n_pad, &n_pad);
  ca_arg_mem(a, kt);
  ca_arg_mem(a, vp);
}

clattn_status ca_args_done(const ca_args *a) {
  if (a->err == CL_SUCCESS) return CLATTN_OK;
  char what[128];
  snprintf(what, sizeof what, "clSetKernelArg(%s, argument %u)", a->name, a->failed_index);
  return ca_cl_fail(a->err, what);
}

clattn_status ca_enqueue(clattn_context *ctx, cl_kernel kernel, const char *name, cl_uint dims, const size_t *global,
                         const size_t *local, cl_uint n_wait, const cl_event *wait, cl_event *prev) {
  cl_event ev = NULL;
  cl_int err =
      *prev ? clEnqueueNDRangeKernel(ctx->queue, kernel, dims, NULL, global, local, 1, prev, &ev)
            : clEnqueueNDRangeKernel(ctx->queue, kernel, dims, NULL, global, local, n_wait, n_wait ? wait : NULL, &ev);
  if (err != CL_SUCCESS) {
    char what[96];
    snprintf(what, sizeof what, "clEnqueueNDRangeKernel(%s)", name);
    return ca_cl_fail(err, what);
  }
  if (*prev) clReleaseEvent(*prev);
  *prev = ev;
  atomic_fetch_add_explicit(&ctx->kernels_enqueued, 1, memory_order_relaxed);
  ca_route_kernel(name);
  return CLATTN_OK;
}

clattn_status ca_finish_call(clattn_context *ctx, clattn_empty_rows policy, cl_mem *flag, cl_event last) {
  clattn_status st = CLATTN_OK;
  cl_int raised = 0;
  if (policy == CLATTN_EMPTY_ERROR) {
    cl_int err = clEnqueueReadBuffer(ctx->queue, *flag, CL_TRUE, 0, sizeof raised, &raised, last ? 1 : 0,
                                     last ? &last : NULL, NULL);
    if (err != CL_SUCCESS)
      st = ca_cl_fail(err, "clEnqueueReadBuffer(empty-row flag)");
    else if (raised)
      st = ca_fail(CLATTN_ERR_EMPTY_ROW, "a query row had no allowed key (empty_rows = CLATTN_EMPTY_ERROR)");
  }
  ca_flag_give(ctx, *flag, st == CLATTN_OK, st == CLATTN_ERR_EMPTY_ROW ? last : NULL);
  *flag = NULL;
  return st;
}

void ca_hand_out(clattn_status st, cl_event *last, cl_event *done) {
  if (st == CLATTN_OK && done)
    *done = *last;
  else if (*last)
    clReleaseEvent(*last);
  *last = NULL;
}
