/* CLBlast's strided batched SGEMM for the GEMM path's launches (its
 * ordering on any queue, its first use, its caches at exit). */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

#include <clblast_c.h>

#include "run/run.h"

static clattn_status blast_fail(CLBlastStatusCode code, const char *what) {
  if (code == CLBlastOpenCLOutOfResources || code == CLBlastTempBufferAllocFailure ||
      code == CLBlastOpenCLOutOfHostMemory)
    return ca_fail(CLATTN_ERR_OUT_OF_MEMORY, "%s failed: CLBlast status %d", what, (int)code);
  return ca_fail(CLATTN_ERR_OPENCL, "%s failed: CLBlast status %d%s%s", what, (int)code, code > -100 ? ", " : "",
                 code > -100 ? ca_cl_error_name((cl_int)code) : "");
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

void ca_blast_release(clattn_context *ctx) {
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
clattn_status ca_blast_gemm(clattn_context *ctx, const ca_gemm *g, const size_t *offsets, cl_mem a, cl_mem b, cl_mem c,
                            cl_uint n_wait, const cl_event *wait, cl_event *prev) {
  const int heads = g->heads;
  const size_t m = g->m, n = g->n, k = g->k, a_ld = g->a_ld, b_ld = g->b_ld, c_ld = g->c_ld;
  const char *what = g->what;
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
        CLBlastLayoutRowMajor, CLBlastTransposeNo, g->b_transposed ? CLBlastTransposeYes : CLBlastTransposeNo, m, n, k,
        1.0f, a, offsets[g0], a_ld, step[0], b, offsets[heads + g0], b_ld, step[1], 0.0f, c, offsets[2 * heads + g0],
        c_ld, step[2], (size_t)len, &ctx->queue, &ev);
    if (cold) {
      if (code == CLBlastSuccess && !atomic_exchange(&ctx->blast_ready, 1)) blast_users++;
      pthread_mutex_unlock(&blast_first_use);
    }
    if (code != CLBlastSuccess)
      st = blast_fail(code, what);
    else
      runs[n_runs++] = ev;
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

