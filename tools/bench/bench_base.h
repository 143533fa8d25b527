/*
 * The baselines of `clattn bench`: staged attention through CLBlast on the
 * device (QKᵀ by strided-batched SGEMM, a small softmax kernel of our own,
 * A·V by strided-batched SGEMM), the same on the host through OpenBLAS, and
 * the ceilings (SGEMM rates, the device's FMA peak and copy bandwidth).
 *
 * Layout: dense row-major [B,H,S,D] for Q, K, V and O; dk = dv = d; the
 * scale is 1/sqrt(d); causal is bottom-right aligned (query i sees keys
 * j <= i + N - M), like clattn. Query head h reads KV head h / (H / Hkv):
 * the G = H / Hkv query heads of a group are contiguous, so a group's rows
 * form one (G·M) x d matrix and each GEMM runs once per group.
 *
 * Nothing here aborts: functions return 0 or -1 with a message in err.
 */
#ifndef CLATTN_TOOLS_BENCH_BASE_H
#define CLATTN_TOOLS_BENCH_BASE_H

#include <stddef.h>

#include "clattn.h"

typedef struct {
  int batch, heads, kv_heads, q_len, kv_len, dim, causal;
} bb_shape;

/* ---- device: CLBlast staged attention ---- */

typedef struct {
  cl_context context;
  cl_device_id device;
  cl_command_queue queue; /* clattn's queue (in order) */
  cl_program program;
  cl_kernel softmax;
  size_t wg; /* softmax work-group size */
  cl_ulong max_alloc;
  char err[512];
} bb_device;

/* Builds the softmax kernel on clattn's device. -1 with b->err on failure. */
int bb_device_init(bb_device *b, clattn_context *ctx);
void bb_device_release(bb_device *b);

typedef struct {
  bb_shape s;
  cl_mem q, k, v;   /* borrowed */
  cl_mem o, scores; /* owned */
  size_t rows;      /* score rows per chunk (within one group when < G·M) */
  size_t groups;    /* whole groups per chunk (1 when rows < G·M) */
} bb_staged;

/* Allocates the output and a score buffer of at most scratch_limit bytes
 * (and the device's max allocation). */
int bb_staged_prepare(bb_device *b, bb_staged *sp, const bb_shape *s, cl_mem q, cl_mem k, cl_mem v,
                      size_t scratch_limit);
/* Enqueues the whole attention and waits for it (clFinish). */
int bb_staged_run(bb_device *b, bb_staged *sp);
void bb_staged_release(bb_staged *sp);

/* ---- host: OpenBLAS attention ---- */

typedef struct {
  bb_shape s;
  const float *q, *k, *v; /* borrowed, dense [B,H,S,d] */
  float *o, *scores;      /* owned */
  size_t rows;            /* score rows per chunk */
  int threads;            /* softmax threads */
  char err[256];
} bb_host;

int bb_host_prepare(bb_host *h, const bb_shape *s, const float *q, const float *k, const float *v, size_t scratch_limit,
                    int threads);
int bb_host_run(bb_host *h);
void bb_host_release(bb_host *h);

/* ---- ceilings ---- */

/* Median GFLOP/s of an n x n x n CLBlast SGEMM on the device. */
int bb_device_sgemm_rate(bb_device *b, int n, int max_reps, double cap_ms, double *gflops);
/* Median GFLOP/s of an n x n x n cblas_sgemm on the host. */
int bb_host_sgemm_rate(int n, int max_reps, double cap_ms, double *gflops, char *err, size_t errlen);
/* GFLOP/s of independent float multiply-add chains in the device's native
 * vector width, the best of max_reps runs: its arithmetic peak. */
int bb_device_fma_rate(bb_device *b, int max_reps, double cap_ms, double *gflops);
/* Median GB/s (bytes read + written) of clEnqueueCopyBuffer over bytes. */
int bb_device_copy_rate(bb_device *b, size_t bytes, int max_reps, double cap_ms, double *gbps, size_t *used_bytes);

/* ---- timing ---- */

/* One run of the measured thing, including its wait for the device.
 * 0 on success, -1 with a message in err. */
typedef int (*bb_run_fn)(void *arg, char *err, size_t errlen);

/* warmup (0/1) untimed calls, then timed calls until max_reps or until the
 * next call would take the measured time past cap_ms (at least one).
 * *median_ms: the median; *reps: how many were timed. */
int bb_time(bb_run_fn fn, void *arg, int warmup, int max_reps, double cap_ms, double *median_ms, int *reps, char *err,
            size_t errlen);
/* The same for n things measured side by side: one untimed round, then
 * rounds of one call of each, until max_reps rounds or until one more round
 * would take any one's measured time past cap_ms (at least one round).
 * median_ms[i]: the median of args[i]'s calls; *reps: the rounds. */
int bb_time_rounds(bb_run_fn fn, void *const *args, int n, int max_reps, double cap_ms, double *median_ms, int *reps,
                   char *err, size_t errlen);

/* The median of x[0 .. n) (n > 0; x is sorted in place). */
double bb_median(double *x, int n);

double bb_now_ms(void);
const char *bb_openblas_config(void);
int bb_openblas_threads(void);

#endif
