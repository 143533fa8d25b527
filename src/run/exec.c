/*
 * The executor: a launch list enqueued on the context's pools. Every launch
 * is enqueued after the one before (an event chain: in-order and
 * out-of-order queues alike), the first after the caller's wait list and
 * the pending last uses of the scratch the list takes (deps.c).
 */
#include <stdio.h>
#include <string.h>

#include "run/run.h"

cl_mem ca_resolve_buf(const ca_resources *res, ca_buf b) {
  if (b.role == CA_BUF_MEM) return b.mem;
  if (b.role == CA_BUF_FLAG) return res->flag;
  return res->scratch[b.role - CA_BUF_SCRATCH];
}

clattn_status ca_set_launch_args(cl_kernel kernel, ca_held *held, int mems_held, const ca_list *l,
                                 const ca_launch *x, const ca_resources *res) {
  /* A cl_mem is taken as held where its handle cannot name another buffer
   * by now: a plan retains its own; validation tracks the caller's until
   * they are deleted, and a deletion since they were taken forgets them. */
  const unsigned long forgets = mems_held ? 0 : ca_mem_facts_forgets();
  if (!mems_held && held->forgets != forgets) {
    ca_held_forget(held);
    held->forgets = forgets;
  }
  for (int i = 0; i < x->n_args; i++) {
    const ca_arg *a = &l->arg[x->first_arg + i];
    cl_int err;
    if (a->is_buf) {
      const cl_mem m = ca_resolve_buf(res, a->buf);
      if (ca_held_has(held, (cl_uint)i, sizeof m, &m)) continue;
      err = ca_held_set(kernel, held, (cl_uint)i, sizeof m, &m, mems_held || m == NULL || ca_mem_facts_tracked(m));
    } else {
      err = ca_held_set(kernel, held, (cl_uint)i, a->size, l->arena + a->at, 1);
    }
    if (err != CL_SUCCESS) {
      char what[96];
      snprintf(what, sizeof what, "clSetKernelArg(%s, argument %d)", x->kernel, i);
      return ca_cl_fail(err, what);
    }
  }
  return CLATTN_OK;
}

clattn_status ca_enqueue_launch(clattn_context *ctx, cl_kernel kernel, const ca_list *l, const ca_launch *x,
                                const ca_resources *res, cl_uint n_wait, const cl_event *wait, cl_event *prev) {
  if (x->kind == CA_LAUNCH_GEMM) {
    const clattn_status st =
        ca_blast_gemm(ctx, &x->gemm, ca_list_gemm_offsets(l, x), ca_resolve_buf(res, x->gemm.a),
                      ca_resolve_buf(res, x->gemm.b), ca_resolve_buf(res, x->gemm.c), n_wait, wait, prev);
    if (st == CLATTN_OK) ca_trace_kernel(x->kernel);
    return st;
  }
  cl_event ev = NULL;
  const size_t *local = x->local_given ? x->local : NULL;
  const cl_int err = *prev ? clEnqueueNDRangeKernel(ctx->queue, kernel, x->dims, NULL, x->global, local, 1, prev, &ev)
                           : clEnqueueNDRangeKernel(ctx->queue, kernel, x->dims, NULL, x->global, local, n_wait,
                                                    n_wait ? wait : NULL, &ev);
  if (err != CL_SUCCESS) {
    char what[96];
    snprintf(what, sizeof what, "clEnqueueNDRangeKernel(%s)", x->kernel);
    return ca_cl_fail(err, what);
  }
  if (*prev) clReleaseEvent(*prev);
  *prev = ev;
  atomic_fetch_add_explicit(&ctx->kernels_enqueued, 1, memory_order_relaxed);
  ca_trace_kernel(x->kernel);
  return CLATTN_OK;
}

clattn_status ca_check_scratch(const clattn_context *ctx, const ca_list *l) {
  for (int i = 0; i < l->n_scratch; i++)
    if (l->scratch[i] > ctx->max_alloc)
      return ca_fail(CLATTN_ERR_OUT_OF_MEMORY,
                     "%s: %s needs %zu bytes, past the device's largest allocation (%llu bytes, "
                     "CL_DEVICE_MAX_MEM_ALLOC_SIZE)",
                     l->what, l->scratch_what[i], l->scratch[i], (unsigned long long)ctx->max_alloc);
  return CLATTN_OK;
}

clattn_status ca_read_flag(clattn_context *ctx, cl_mem flag, cl_event last, int *raised) {
  cl_int value = 0;
  const cl_int err =
      clEnqueueReadBuffer(ctx->queue, flag, CL_TRUE, 0, sizeof value, &value, last ? 1 : 0, last ? &last : NULL, NULL);
  if (err != CL_SUCCESS) return ca_cl_fail(err, "clEnqueueReadBuffer(empty-row flag)");
  *raised = value != 0;
  return *raised ? ca_fail(CLATTN_ERR_EMPTY_ROW, "a query row had no allowed key (empty_rows = CLATTN_EMPTY_ERROR)")
                 : CLATTN_OK;
}

void ca_hand_out(clattn_status st, cl_event *last, cl_event *done) {
  if (st == CLATTN_OK && done)
    *done = *last;
  else if (*last)
    clReleaseEvent(*last);
  *last = NULL;
}

/* The run's kernel objects, one per (program, name), taken on first use. */
enum { RUN_KERNELS = 16 };
typedef struct {
  int n;
  ca_pooled_kernel *k[RUN_KERNELS];
} run_kernels;

static clattn_status kernel_for(clattn_context *ctx, run_kernels *rk, const ca_launch *x, ca_pooled_kernel **out) {
  for (int i = 0; i < rk->n; i++)
    if (rk->k[i]->program == x->program && strcmp(rk->k[i]->name, x->kernel) == 0) {
      *out = rk->k[i];
      return CLATTN_OK;
    }
  if (rk->n == RUN_KERNELS) return ca_fail(CLATTN_ERR_UNSUPPORTED, "%s: more than %d kernels in one list", x->kernel, RUN_KERNELS);
  clattn_status st = ca_kernel_take(ctx, x->program, x->kernel, out);
  if (st == CLATTN_OK) rk->k[rk->n++] = *out;
  return st;
}

clattn_status ca_run(clattn_context *ctx, const ca_list *l, cl_uint n_wait, const cl_event *wait, cl_event *done) {
  if (done) *done = NULL;
  if (l->error) return l->error;
  ca_trace_begin(l->what);
  if (l->n_launch == 0) { /* a no-op that still orders after the caller's events */
    if (!done) return CLATTN_OK;
    const cl_int err = clEnqueueMarkerWithWaitList(ctx->queue, n_wait, n_wait ? wait : NULL, done);
    if (err == CL_SUCCESS) return CLATTN_OK;
    *done = NULL;
    return ca_cl_fail(err, "clEnqueueMarkerWithWaitList(an empty call)");
  }
  clattn_status st = ca_check_scratch(ctx, l);
  if (st != CLATTN_OK) return st;
  ca_resources res;
  memset(&res, 0, sizeof res);
  run_kernels rk = {0, {NULL}};
  cl_event prev = NULL;
  int raised = 0;
  ca_deps deps;
  ca_deps_init(&deps, n_wait, wait);
  /* every buffer before the first command, which waits for their last uses */
  for (int i = 0; i < l->n_scratch && st == CLATTN_OK; i++)
    st = ca_scratch_take(ctx, l->scratch[i], l->scratch_what[i], &deps, &res.scratch[i]);
  if (st == CLATTN_OK && l->flag) st = ca_flag_take(ctx, &deps, &res.flag);
  if (st == CLATTN_OK) st = ca_deps_list(&deps, &n_wait, &wait);
  if (st != CLATTN_OK) goto done;
  ca_note_scratch(ctx, ca_list_scratch_bytes(l));
  for (int i = 0; i < l->n_launch && st == CLATTN_OK; i++) {
    const ca_launch *x = &l->launch[i];
    ca_pooled_kernel *k = NULL;
    if (x->kind == CA_LAUNCH_KERNEL &&
        ((st = kernel_for(ctx, &rk, x, &k)) || (st = ca_set_launch_args(k->kernel, &k->held, 0, l, x, &res))))
      break;
    st = ca_enqueue_launch(ctx, k ? k->kernel : NULL, l, x, &res, n_wait, wait, &prev);
  }
  if (st == CLATTN_OK && l->flag && l->empty_rows == CLATTN_EMPTY_ERROR) st = ca_read_flag(ctx, res.flag, prev, &raised);
done:;
  /* a failed call's last event may not follow all it enqueued */
  const cl_event used = st == CLATTN_OK || raised ? prev : NULL;
  for (int i = 0; i < rk.n; i++) ca_kernel_give(ctx, rk.k[i]);
  for (int i = 0; i < l->n_scratch; i++) ca_scratch_give(ctx, res.scratch[i], used);
  ca_flag_give(ctx, res.flag, st == CLATTN_OK, raised ? prev : NULL);
  ca_deps_release(&deps);
  ca_hand_out(st, &prev, done);
  return st;
}
