/*
 * The GEMM path: per chunk of query rows (ca_plan_chunks),
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
 * outside the pool are masked out of the scores.
 */
#include <limits.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

#include <clblast_c.h>

#include "internal.h"

int ca_gemm_available(void) { return 1; }

static clattn_status blast_fail(CLBlastStatusCode code, const char *what) {
  if (code == CLBlastOpenCLOutOfResources || code == CLBlastTempBufferAllocFailure ||
      code == CLBlastOpenCLOutOfHostMemory)
    return ca_fail(CLATTN_ERR_OUT_OF_MEMORY, "%s failed: CLBlast status %d", what, (int)code);
  return ca_fail(CLATTN_ERR_OPENCL, "%s failed: CLBlast status %d%s%s", what, (int)code, code > -100 ? ", " : "",
                 code > -100 ? ca_cl_error_name((cl_int)code) : "");
}

/* A matrix operand as CLBlast takes it: buffer, element offset of (b, h) =
 * (0, 0), per-(b, h) strides, and the leading dimension of row-major rows. */
typedef struct {
  cl_mem buf;
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

/* A dense f32 copy [batch, heads, len, width] in scratch buf, as an operand. */
static operand dense_operand(cl_mem buf, int heads, int len, int width) {
  operand o = {buf, 0, 0, 0, (size_t)width};
  o.stride_h = (size_t)len * (size_t)width;
  o.stride_b = (size_t)heads * o.stride_h;
  return o;
}

/* Enqueues gemm_k_gather or gemm_v_gather (name) of K or V stored paged or
 * quantised (or in another storage than q) into out, a dense f32 [B, Hkv,
 * N, width] scratch buffer. */
static clattn_status kv_gather(clattn_context *ctx, const clattn_params *p, const ca_plan *plan, const char *name,
                               const clattn_tensor *t, const clattn_tensor *scale, int width, cl_uint n_wait,
                               const cl_event *wait, cl_event *prev, cl_mem out) {
  const int heads = p->kv_heads, len = p->kv_len, paged = plan->paged;
  clattn_status st = CLATTN_OK;
  cl_kernel kernel = NULL;
  cl_program core = NULL;
  if ((st = ca_core_program_kv(ctx, p->dtype, plan->k_dtype, plan->v_dtype, &core)) ||
      (st = ca_kernel_take(ctx, core, name, &kernel)))
    return st;
  ca_args a = {kernel, name, 0, 0, CL_SUCCESS, NULL};
  ca_arg_view(&a, t);
  ca_arg_view(&a, scale);
  ca_arg_int(&a, heads);
  ca_arg_int(&a, width);
  ca_arg_seq(&a, p);
  ca_arg_mem(&a, p->block_table);
  ca_arg_int(&a, paged ? p->block_table_stride : 0);
  ca_arg_int(&a, paged ? p->page_size : 1);
  ca_arg_int(&a, paged ? p->num_pages : 0);
  ca_arg_int(&a, p->q_len);
  ca_arg_int(&a, p->kv_len);
  ca_arg_mem(&a, out);
  const size_t global[3] = {(size_t)width, (size_t)len, (size_t)p->batch * (size_t)heads};
  if ((st = ca_args_done(&a)) == CLATTN_OK) st = ca_enqueue(ctx, kernel, name, 3, global, NULL, n_wait, wait, prev);
  ca_kernel_give(ctx, kernel);
  return st;
}

/* Enqueues gemm_dense_copy of view t ([batch, heads, len, width], query or
 * key side) into out, a dense f32 scratch buffer, rows past each sequence
 * zeroed. */
static clattn_status dense_copy(clattn_context *ctx, const clattn_params *p, const clattn_tensor *t, int key_side,
                                int heads, int width, cl_uint n_wait, const cl_event *wait, cl_event *prev,
                                cl_mem out) {
  const int len = key_side ? p->kv_len : p->q_len;
  clattn_status st = CLATTN_OK;
  cl_kernel kernel = NULL;
  cl_program core = NULL;
  if ((st = ca_core_program(ctx, p->dtype, &core)) || (st = ca_kernel_take(ctx, core, "gemm_dense_copy", &kernel)))
    return st;
  ca_args a = {kernel, "gemm_dense_copy", 0, 0, CL_SUCCESS, NULL};
  ca_arg_view(&a, t);
  ca_arg_int(&a, heads);
  ca_arg_int(&a, width);
  ca_arg_int(&a, key_side);
  ca_arg_seq(&a, p);
  ca_arg_int(&a, p->q_len);
  ca_arg_int(&a, p->kv_len);
  ca_arg_mem(&a, out);
  const size_t global[3] = {(size_t)width, (size_t)len, (size_t)p->batch * (size_t)heads};
  if ((st = ca_args_done(&a)) == CLATTN_OK)
    st = ca_enqueue(ctx, kernel, "gemm_dense_copy", 3, global, NULL, n_wait, wait, prev);
  ca_kernel_give(ctx, kernel);
  return st;
}

/* Enqueues gemm_finite_values over the dense V copy (rows of value_dim):
 * non-finite values zeroed, their rows flagged in the byte buffer bad. */
static clattn_status finite_values(clattn_context *ctx, cl_program core, const clattn_params *p, size_t rows,
                                   cl_mem v, cl_uint n_wait, const cl_event *wait, cl_event *prev, cl_mem bad) {
  cl_kernel kernel = NULL;
  clattn_status st;
  if ((st = ca_kernel_take(ctx, core, "gemm_finite_values", &kernel))) goto fail;
  ca_args a = {kernel, "gemm_finite_values", 0, 0, CL_SUCCESS, NULL};
  ca_arg_mem(&a, v);
  ca_arg_int(&a, p->value_dim);
  const cl_ulong n = rows;
  ca_arg(&a, sizeof n, &n);
  ca_arg_mem(&a, bad);
  if ((st = ca_args_done(&a))) goto fail;
  st = ca_enqueue(ctx, kernel, "gemm_finite_values", 1, &rows, NULL, n_wait, wait, prev);
fail:
  ca_kernel_give(ctx, kernel);
  return st;
}

static operand view_operand(const clattn_tensor *t) {
  operand o = {t->buf, t->offset, t->stride[0], t->stride[1], t->stride[2]};
  return o;
}

/* CLBlast takes no wait list: a barrier after *prev orders it on any queue
 * (and every later command, other calls' too, after *prev). */
static clattn_status order_after(clattn_context *ctx, cl_uint n_wait, const cl_event *wait, const cl_event *prev) {
  cl_uint n = *prev ? 1 : n_wait;
  const cl_event *list = *prev ? prev : (n_wait ? wait : NULL);
  if (n == 0) return CLATTN_OK;
  cl_int err = clEnqueueBarrierWithWaitList(ctx->queue, n, list, NULL);
  return err == CL_SUCCESS ? CLATTN_OK : ca_cl_fail(err, "clEnqueueBarrierWithWaitList(before CLBlast)");
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

/* CLBlast 1.5.3's first use is not thread-safe: it fills its kernel
 * database (a static vector) and its program caches unguarded, and threads
 * making their first GEMM calls at once read freed memory. Calls on a
 * context go one at a time, process-wide, until one has succeeded there. */
static pthread_mutex_t blast_first_use = PTHREAD_MUTEX_INITIALIZER;

/* Contexts with a successful CLBlast call, not yet destroyed; guarded by
 * blast_first_use. CLBlast caches its programs process-wide (each holds its
 * cl_context) and would release them from a static destructor at exit, when
 * the OpenCL runtime may already be gone: Oclgrind's is, and the process
 * aborts ("corrupted double-linked list"). The last such context's
 * clattn_destroy empties the caches while the runtime is still there. */
static int blast_users;

void ca_gemm_release(clattn_context *ctx) {
  if (!atomic_load(&ctx->blast_ready)) return;
  pthread_mutex_lock(&blast_first_use);
  if (--blast_users == 0) (void)CLBlastClearCache(); /* nothing to report to: the context is going */
  pthread_mutex_unlock(&blast_first_use);
}

/* How many pairs from g0 on have A, B and C offsets that each step evenly
 * (one strided batched GEMM), and the steps. */
static int even_run(const size_t *offsets, int heads, int g0, size_t step[3]) {
  int len = 1;
  for (; g0 + len < heads; len++) {
    int even = 1;
    for (int m = 0; m < 3 && even; m++) {
      const size_t *o = offsets + (size_t)m * (size_t)heads, at = o[g0 + len - 1], next = o[g0 + len];
      if (next < at)
        even = 0;
      else if (len == 1)
        step[m] = next - at;
      else
        even = next - at == step[m];
    }
    if (!even) break;
  }
  if (len == 1) step[0] = step[1] = 0, step[2] = 1; /* CLBlast wants a C stride; one matrix never uses it */
  return len;
}

/* C[g] = A[g] op(B[g]) for g = 0 .. heads-1 (offsets: A's, B's, C's in a
 * row), one strided batched GEMM per even run. CLBlast's batched GEMM with
 * offset arrays is not used: it writes them with a blocking write (clFinish
 * on this queue), so a call would wait for its wait list to complete. */
static clattn_status batched_gemm(clattn_context *ctx, int b_transposed, size_t m, size_t n, size_t k, cl_mem a,
                                  size_t a_ld, cl_mem b, size_t b_ld, cl_mem c, size_t c_ld, const size_t *offsets,
                                  int heads, const char *what, cl_uint n_wait, const cl_event *wait, cl_event *prev) {
  cl_event *runs = malloc((size_t)heads * sizeof *runs);
  if (!runs) return ca_fail(CLATTN_ERR_OUT_OF_MEMORY, "%s: out of host memory", what);
  /* POCL 3.1 orders a command after the last barrier enqueued alone: on an
   * out-of-order queue another thread's barrier must not come between this
   * one and the GEMMs it orders. */
  if (ctx->out_of_order) pthread_mutex_lock(&ctx->barrier_lock);
  clattn_status st = order_after(ctx, n_wait, wait, prev);
  cl_uint n_runs = 0;
  for (int g0 = 0, len; g0 < heads && st == CLATTN_OK; g0 += len) {
    size_t step[3];
    len = even_run(offsets, heads, g0, step);
    const int cold = !atomic_load(&ctx->blast_ready);
    if (cold) pthread_mutex_lock(&blast_first_use);
    cl_event ev = NULL;
    CLBlastStatusCode code = CLBlastSgemmStridedBatched(
        CLBlastLayoutRowMajor, CLBlastTransposeNo, b_transposed ? CLBlastTransposeYes : CLBlastTransposeNo, m, n, k,
        1.0f, a, offsets[g0], a_ld, step[0], b, offsets[heads + g0], b_ld, step[1], 0.0f, c, offsets[2 * heads + g0],
        c_ld, step[2], (size_t)len, &ctx->queue, &ev);
    if (cold) {
      if (code == CLBlastSuccess && !atomic_exchange(&ctx->blast_ready, 1)) blast_users++;
      pthread_mutex_unlock(&blast_first_use);
    }
    if (code != CLBlastSuccess)
      st = blast_fail(code, what);
    else
      runs[n_runs++] = ev, ca_route_kernel("CLBlast SGEMM");
  }
  if (ctx->out_of_order) pthread_mutex_unlock(&ctx->barrier_lock);
  /* The next step waits for *prev alone: on an out-of-order queue the runs
   * may finish in any order, so one marker stands for them all. */
  cl_event last = n_runs == 1 ? runs[0] : NULL;
  if (st == CLATTN_OK && n_runs > 1) {
    cl_int err = clEnqueueMarkerWithWaitList(ctx->queue, n_runs, runs, &last);
    if (err != CL_SUCCESS) st = ca_cl_fail(err, "clEnqueueMarkerWithWaitList(after CLBlast)");
  }
  for (cl_uint i = 0; i < n_runs; i++)
    if (runs[i] != last) clReleaseEvent(runs[i]);
  free(runs);
  if (st != CLATTN_OK) return st;
  if (*prev) clReleaseEvent(*prev);
  *prev = last;
  return CLATTN_OK;
}

/* S = Q K^T for a chunk by CLBlast, then gemm_mask_scores (scale, shaping,
 * mask) in place. offsets: room for 3 x heads. */
static clattn_status product_scores(clattn_context *ctx, cl_kernel mask, cl_mem scores, const clattn_params *p,
                                    const ca_plan *plan, operand *q, operand *k, int bh0, int i0, int rows, int heads,
                                    size_t *offsets, cl_uint n_wait, const cl_event *wait, cl_event *prev) {
  clattn_status st;
  const size_t score_stride = (size_t)rows * (size_t)p->kv_len;
  view_offsets(q, p, plan->group, 0, bh0, heads, (size_t)i0, offsets);
  view_offsets(k, p, plan->group, 1, bh0, heads, 0, offsets + heads);
  scratch_offsets(score_stride, heads, offsets + 2 * heads);
  if ((st = batched_gemm(ctx, 1, (size_t)rows, (size_t)p->kv_len, (size_t)p->head_dim, q->buf, q->ld, k->buf, k->ld,
                         scores, (size_t)p->kv_len, offsets, heads, "CLBlastSgemmStridedBatched(Q K^T)", n_wait, wait,
                         prev)))
    return st;

  ca_args a = {mask, "gemm_mask_scores", 0, 0, CL_SUCCESS, NULL};
  ca_arg_mem(&a, scores);
  ca_arg_allowed(&a, p);
  ca_arg_kv(&a, p);
  ca_arg_int(&a, p->q_heads);
  ca_arg_int(&a, p->q_len);
  ca_arg_int(&a, p->kv_len);
  ca_arg_float(&a, plan->scale);
  ca_arg_shape(&a, p);
  ca_arg_int(&a, plan->window_left);
  ca_arg_int(&a, plan->window_right);
  ca_arg_int(&a, bh0);
  ca_arg_int(&a, i0);
  ca_arg_int(&a, rows);
  if ((st = ca_args_done(&a))) return st;
  const size_t mask_global[3] = {(size_t)p->kv_len, (size_t)rows, (size_t)heads};
  return ca_enqueue(ctx, mask, "gemm_mask_scores", 3, mask_global, NULL, n_wait, wait, prev);
}

clattn_status ca_gemm_forward(clattn_context *ctx, const clattn_params *p, const ca_plan *plan, cl_uint n_wait,
                              const cl_event *wait, cl_event *done) {
  clattn_status st = CLATTN_OK;
  cl_kernel mask = NULL, softmax = NULL, store = NULL;
  cl_mem scores = NULL, o_rows = NULL, empty_flag = NULL, q_copy = NULL, k_copy = NULL, v_copy = NULL, v_bad = NULL;
  cl_event prev = NULL;
  size_t *offsets = NULL;
  const int pairs = p->batch * p->q_heads;
  const ca_chunk chunk = plan->chunk;
  operand q = view_operand(&p->q), k = view_operand(&p->k), v = view_operand(&p->v);

  if (done) *done = NULL;
  ca_deps deps;
  ca_deps_init(&deps, n_wait, wait);
  cl_program core = NULL;
  /* Additive scores are no matrix product: qk_score computes them, shaped and masked. */
  const int additive = p->score == CLATTN_SCORE_ADDITIVE;
  /* K or V paged or stored otherwise than q: gathered and dequantised into scratch */
  const int k_stored = plan->paged || plan->k_dtype != p->dtype, v_stored = plan->paged || plan->v_dtype != p->dtype;
  const int copy_q = !additive && !gemm_ready(p, &p->q, p->q_heads, p->q_len, p->head_dim);
  /* a left-padded row's keys start at its own row (gemm_dense_copy finds them) */
  const int copy_k =
      !additive && (k_stored || p->cache_leftpad || !gemm_ready(p, &p->k, p->kv_heads, p->kv_len, p->head_dim));
  const size_t q_floats = (size_t)pairs * p->q_len * p->head_dim;
  const size_t k_floats = (size_t)p->batch * p->kv_heads * p->kv_len * p->head_dim;
  const size_t v_rows = (size_t)p->batch * p->kv_heads * p->kv_len;
  const size_t v_floats = v_rows * p->value_dim; /* V is always copied: what a GEMM must not see zeroed */
  size_t score_floats = (size_t)chunk.heads * (size_t)chunk.rows * (size_t)p->kv_len;
  size_t o_floats = (size_t)chunk.heads * (size_t)chunk.rows * (size_t)p->value_dim;
  /* every buffer before the first command, which waits for their last uses */
  if ((st = ca_core_program_kv(ctx, p->dtype, plan->k_dtype, plan->v_dtype, &core)) ||
      (st = ca_kernel_take(ctx, core, additive ? "qk_score" : "gemm_mask_scores", &mask)) ||
      (st = ca_kernel_take(ctx, core, "softmax_rows", &softmax)) ||
      (st = ca_kernel_take(ctx, core, "gemm_store_rows", &store)) ||
      (st = ca_flag_take(ctx, p->empty_rows, &deps, &empty_flag)) ||
      (st = ca_scratch_take(ctx, score_floats * sizeof(float), "GEMM score scratch", &deps, &scores)) ||
      (st = ca_scratch_take(ctx, o_floats * sizeof(float), "GEMM output rows", &deps, &o_rows)) ||
      (copy_q && (st = ca_scratch_take(ctx, q_floats * sizeof(float), "GEMM dense copy of q", &deps, &q_copy))) ||
      (copy_k && (st = ca_scratch_take(ctx, k_floats * sizeof(float),
                                       k_stored ? "GEMM K gather" : "GEMM dense copy of k", &deps, &k_copy))) ||
      (st = ca_scratch_take(ctx, v_floats * sizeof(float), v_stored ? "GEMM V gather" : "GEMM dense copy of v", &deps,
                            &v_copy)) ||
      (st = ca_scratch_take(ctx, v_rows, "GEMM value flags", &deps, &v_bad)) ||
      (st = ca_deps_list(&deps, &n_wait, &wait)))
    goto fail;
  offsets = malloc((size_t)chunk.heads * 3 * sizeof(size_t));
  if (!offsets) {
    st = ca_fail(CLATTN_ERR_OUT_OF_MEMORY, "GEMM path: out of host memory");
    goto fail;
  }
  if (copy_q) {
    if ((st = dense_copy(ctx, p, &p->q, 0, p->q_heads, p->head_dim, n_wait, wait, &prev, q_copy))) goto fail;
    q = dense_operand(q_copy, p->q_heads, p->q_len, p->head_dim);
  }
  if (copy_k) {
    if ((st = k_stored ? kv_gather(ctx, p, plan, "gemm_k_gather", &p->k, &p->k_scale, p->head_dim, n_wait, wait, &prev,
                                   k_copy)
                       : dense_copy(ctx, p, &p->k, 1, p->kv_heads, p->head_dim, n_wait, wait, &prev, k_copy)))
      goto fail;
    k = dense_operand(k_copy, p->kv_heads, p->kv_len, p->head_dim);
  }
  if ((st = v_stored ? kv_gather(ctx, p, plan, "gemm_v_gather", &p->v, &p->v_scale, p->value_dim, n_wait, wait, &prev,
                                 v_copy)
                     : dense_copy(ctx, p, &p->v, 1, p->kv_heads, p->value_dim, n_wait, wait, &prev, v_copy)) ||
      (st = finite_values(ctx, core, p, v_rows, v_copy, n_wait, wait, &prev, v_bad)))
    goto fail;
  v = dense_operand(v_copy, p->kv_heads, p->kv_len, p->value_dim);
  ca_note_scratch(ctx, (score_floats + o_floats + (copy_q ? q_floats : 0) + (copy_k ? k_floats : 0) + v_floats) *
                               sizeof(float) +
                           v_rows + sizeof(cl_int));

  /* Step by what was done, not by the chunk: i0 + chunk.rows can pass INT_MAX. */
  for (int bh0 = 0, heads; bh0 < pairs; bh0 += heads) {
    heads = chunk.heads < pairs - bh0 ? chunk.heads : pairs - bh0;
    for (int i0 = 0, rows; i0 < p->q_len; i0 += rows) {
      rows = chunk.rows < p->q_len - i0 ? chunk.rows : p->q_len - i0;
      const size_t score_stride = (size_t)rows * (size_t)p->kv_len;
      if (additive)
        st = ca_enqueue_qk_score(ctx, mask, scores, p, plan, bh0, i0, rows, heads, n_wait, wait, &prev);
      else
        st = product_scores(ctx, mask, scores, p, plan, &q, &k, bh0, i0, rows, heads, offsets, n_wait, wait, &prev);
      if (st) goto fail;

      if ((st = ca_enqueue_softmax(ctx, softmax, scores, p, plan, bh0, i0, rows, heads, empty_flag, n_wait, wait,
                                   &prev)))
        goto fail;

      scratch_offsets(score_stride, heads, offsets);
      view_offsets(&v, p, plan->group, 1, bh0, heads, 0, offsets + heads);
      scratch_offsets((size_t)rows * (size_t)p->value_dim, heads, offsets + 2 * heads);
      if ((st = batched_gemm(ctx, 0, (size_t)rows, (size_t)p->value_dim, (size_t)p->kv_len, scores, (size_t)p->kv_len,
                             v.buf, v.ld, o_rows, (size_t)p->value_dim, offsets, heads,
                             "CLBlastSgemmStridedBatched(A V)", n_wait, wait, &prev)))
        goto fail;

      ca_args o = {store, "gemm_store_rows", 0, 0, CL_SUCCESS, NULL};
      ca_arg_mem(&o, o_rows);
      ca_arg_mem(&o, scores);
      ca_arg_view(&o, &p->v);
      ca_arg_mem(&o, v_bad);
      ca_arg_seq(&o, p);
      ca_arg_kv(&o, p);
      ca_arg_int(&o, p->q_heads);
      ca_arg_int(&o, plan->group);
      ca_arg_int(&o, p->q_len);
      ca_arg_int(&o, p->kv_len);
      ca_arg_int(&o, p->value_dim);
      ca_arg_int(&o, bh0);
      ca_arg_int(&o, i0);
      ca_arg_int(&o, rows);
      ca_arg_view(&o, &p->out);
      if ((st = ca_args_done(&o))) goto fail;
      const size_t store_global[2] = {(size_t)rows, (size_t)heads};
      if ((st = ca_enqueue(ctx, store, "gemm_store_rows", 2, store_global, NULL, n_wait, wait, &prev))) goto fail;
    }
  }
  st = ca_finish_call(ctx, p->empty_rows, &empty_flag, prev);
fail:;
  const cl_event used = st == CLATTN_OK ? prev : NULL; /* a failed call's last event may not follow all it enqueued */
  ca_kernel_give(ctx, mask);
  ca_kernel_give(ctx, softmax);
  ca_kernel_give(ctx, store);
  free(offsets);
  const cl_mem held[] = {scores, o_rows, q_copy, k_copy, v_copy, v_bad};
  for (size_t i = 0; i < sizeof held / sizeof held[0]; i++) ca_scratch_give(ctx, held[i], used);
  ca_flag_give(ctx, empty_flag, 0, used);
  ca_deps_release(&deps);
  ca_hand_out(st, &prev, done);
  return st;
}
