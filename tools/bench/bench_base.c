/*
 * The baselines and ceilings of `clattn bench` (see bench_base.h).
 */
#include "bench_base.h"

#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cblas.h>
#include <clblast_c.h>

#include "problem.h"

static void fmt(char *err, size_t n, const char *f, ...) {
  if (!err || n == 0) return;
  va_list ap;
  va_start(ap, f);
  vsnprintf(err, n, f, ap);
  va_end(ap);
}

double bb_now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e3 + t.tv_nsec * 1e-6;
}

const char *bb_openblas_config(void) {
  const char *c = openblas_get_config();
  return c ? c : "?";
}

int bb_openblas_threads(void) { return openblas_get_num_threads(); }

static const char *clblast_name(CLBlastStatusCode c) {
  if (c < 0 && c > -100) return cp_cl_error_name((cl_int)c);
  switch (c) {
    case CLBlastNotImplemented: return "CLBlastNotImplemented";
    case CLBlastInvalidMatrixA: return "CLBlastInvalidMatrixA";
    case CLBlastInvalidMatrixB: return "CLBlastInvalidMatrixB";
    case CLBlastInvalidMatrixC: return "CLBlastInvalidMatrixC";
    case CLBlastInsufficientMemoryA: return "CLBlastInsufficientMemoryA";
    case CLBlastInsufficientMemoryB: return "CLBlastInsufficientMemoryB";
    case CLBlastInsufficientMemoryC: return "CLBlastInsufficientMemoryC";
    case CLBlastInvalidLocalMemUsage: return "CLBlastInvalidLocalMemUsage";
    case CLBlastNoHalfPrecision: return "CLBlastNoHalfPrecision";
    case CLBlastInvalidBatchCount: return "CLBlastInvalidBatchCount";
    case CLBlastInvalidOverrideKernel: return "CLBlastInvalidOverrideKernel";
    case CLBlastMissingOverrideParameter: return "CLBlastMissingOverrideParameter";
    case CLBlastInvalidLocalThreadsTotal: return "CLBlastInvalidLocalThreadsTotal";
    case CLBlastInvalidLocalThreadsDim: return "CLBlastInvalidLocalThreadsDim";
    case CLBlastUnexpectedError: return "CLBlastUnexpectedError";
    default: return "CLBlast error";
  }
}

/* ---- timing ---- */

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

double bb_median(double *x, int n) {
  qsort(x, (size_t)n, sizeof *x, cmp_double);
  return n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
}

#define BB_MAX_REPS 64

int bb_time(bb_run_fn fn, void *arg, int warmup, int max_reps, double cap_ms, double *median_ms, int *reps, char *err,
            size_t errlen) {
  *median_ms = NAN;
  *reps = 0;
  if (max_reps < 1) max_reps = 1;
  if (max_reps > BB_MAX_REPS) max_reps = BB_MAX_REPS;
  for (int w = 0; w < warmup; w++)
    if (fn(arg, err, errlen) != 0) return -1;
  double t[BB_MAX_REPS], total = 0.0;
  int k = 0;
  while (k < max_reps) {
    double t0 = bb_now_ms();
    if (fn(arg, err, errlen) != 0) return -1;
    t[k] = bb_now_ms() - t0;
    total += t[k];
    k++;
    if (total + t[k - 1] > cap_ms) break;
  }
  qsort(t, (size_t)k, sizeof t[0], cmp_double);
  *median_ms = k % 2 ? t[k / 2] : 0.5 * (t[k / 2 - 1] + t[k / 2]);
  *reps = k;
  return 0;
}

int bb_time_rounds(bb_run_fn fn, void *const *args, int n, int max_reps, double cap_ms, double *median_ms, int *reps,
                   char *err, size_t errlen) {
  *reps = 0;
  if (max_reps < 1) max_reps = 1;
  if (max_reps > BB_MAX_REPS) max_reps = BB_MAX_REPS;
  double *t = malloc(sizeof(double) * (size_t)n * BB_MAX_REPS), *total = calloc((size_t)n, sizeof(double));
  int rc = -1, k = 0;
  if (!t || !total) {
    snprintf(err, errlen, "out of host memory");
    goto done;
  }
  for (int i = 0; i < n; i++)
    if (fn(args[i], err, errlen) != 0) goto done;
  for (int stop = 0; k < max_reps && !stop; k++)
    for (int i = 0; i < n; i++) {
      const double t0 = bb_now_ms();
      if (fn(args[i], err, errlen) != 0) goto done;
      t[i * BB_MAX_REPS + k] = bb_now_ms() - t0;
      total[i] += t[i * BB_MAX_REPS + k];
      if (total[i] + t[i * BB_MAX_REPS + k] > cap_ms) stop = 1;
    }
  for (int i = 0; i < n; i++) {
    double *ti = t + i * BB_MAX_REPS;
    qsort(ti, (size_t)k, sizeof ti[0], cmp_double);
    median_ms[i] = k % 2 ? ti[k / 2] : 0.5 * (ti[k / 2 - 1] + ti[k / 2]);
  }
  *reps = k;
  rc = 0;
done:
  free(t);
  free(total);
  return rc;
}

/* ---- device ---- */

static const char softmax_src[] =
    "#ifndef WG\n"
    "#define WG 64\n"
    "#endif\n"
    "/* One work-group per score row, in place: row max, exp, sum, normalise.\n"
    "   Causal (bottom-right): query i of its head sees keys j <= i + n - m;\n"
    "   the others count as -inf, so their weight is 0. */\n"
    "__kernel __attribute__((reqd_work_group_size(WG, 1, 1)))\n"
    "void bench_softmax(__global float *s, const int n, const int m, const int rows_per_group,\n"
    "                   const int row0, const int causal) {\n"
    "  __local float red[WG];\n"
    "  const int lid = (int)get_local_id(0);\n"
    "  const int row = (int)get_group_id(0);\n"
    "  __global float *x = s + (size_t)row * (size_t)n;\n"
    "  const int i = ((row0 + row) % rows_per_group) % m;\n"
    "  const int lim = causal ? min(n, i + n - m + 1) : n;\n"
    "  float mx = -INFINITY;\n"
    "  for (int j = lid; j < lim; j += WG) mx = fmax(mx, x[j]);\n"
    "  red[lid] = mx;\n"
    "  barrier(CLK_LOCAL_MEM_FENCE);\n"
    "  for (int w = WG / 2; w > 0; w >>= 1) {\n"
    "    if (lid < w) red[lid] = fmax(red[lid], red[lid + w]);\n"
    "    barrier(CLK_LOCAL_MEM_FENCE);\n"
    "  }\n"
    "  mx = red[0];\n"
    "  barrier(CLK_LOCAL_MEM_FENCE);\n"
    "  float sum = 0.0f;\n"
    "  for (int j = lid; j < lim; j += WG) {\n"
    "    const float e = exp(x[j] - mx);\n"
    "    x[j] = e;\n"
    "    sum += e;\n"
    "  }\n"
    "  red[lid] = sum;\n"
    "  barrier(CLK_LOCAL_MEM_FENCE);\n"
    "  for (int w = WG / 2; w > 0; w >>= 1) {\n"
    "    if (lid < w) red[lid] += red[lid + w];\n"
    "    barrier(CLK_LOCAL_MEM_FENCE);\n"
    "  }\n"
    "  const float inv = lim > 0 ? 1.0f / red[0] : 0.0f;\n"
    "  for (int j = lid; j < n; j += WG) x[j] = j < lim ? x[j] * inv : 0.0f;\n"
    "}\n";

/* Builds src with opts on the device into *prog and creates its kernel
 * `name` in *k (the caller releases both, also on failure). -1 with
 * b->err, the build log included, on failure. */
static int build_kernel(bb_device *b, const char *src, const char *opts, const char *name, cl_program *prog,
                        cl_kernel *k) {
  cl_int e;
  *prog = clCreateProgramWithSource(b->context, 1, &src, NULL, &e);
  if (e != CL_SUCCESS) {
    fmt(b->err, sizeof b->err, "clCreateProgramWithSource(%s): %s (%d)", name, cp_cl_error_name(e), e);
    return -1;
  }
  e = clBuildProgram(*prog, 1, &b->device, opts, NULL, NULL);
  if (e != CL_SUCCESS) {
    char log[300] = "";
    clGetProgramBuildInfo(*prog, b->device, CL_PROGRAM_BUILD_LOG, sizeof log - 1, log, NULL);
    log[sizeof log - 1] = 0;
    fmt(b->err, sizeof b->err, "%s build: %s (%d): %s", name, cp_cl_error_name(e), e, log);
    return -1;
  }
  *k = clCreateKernel(*prog, name, &e);
  if (e != CL_SUCCESS) {
    fmt(b->err, sizeof b->err, "clCreateKernel(%s): %s (%d)", name, cp_cl_error_name(e), e);
    return -1;
  }
  return 0;
}

static int build_softmax(bb_device *b, size_t wg) {
  if (b->softmax) clReleaseKernel(b->softmax);
  if (b->program) clReleaseProgram(b->program);
  b->softmax = NULL;
  b->program = NULL;
  char opts[64];
  snprintf(opts, sizeof opts, "-DWG=%zu", wg);
  if (build_kernel(b, softmax_src, opts, "bench_softmax", &b->program, &b->softmax) != 0) return -1;
  b->wg = wg;
  return 0;
}

int bb_device_init(bb_device *b, clattn_context *ctx) {
  memset(b, 0, sizeof *b);
  b->context = clattn_cl_context(ctx);
  b->device = clattn_cl_device(ctx);
  b->queue = clattn_cl_queue(ctx);
  if (!b->context || !b->device || !b->queue) {
    fmt(b->err, sizeof b->err, "the clattn context has no OpenCL context/device/queue");
    return -1;
  }
  size_t dev_wg = 0;
  cl_int e = clGetDeviceInfo(b->device, CL_DEVICE_MAX_WORK_GROUP_SIZE, sizeof dev_wg, &dev_wg, NULL);
  if (e == CL_SUCCESS)
    e = clGetDeviceInfo(b->device, CL_DEVICE_MAX_MEM_ALLOC_SIZE, sizeof b->max_alloc, &b->max_alloc, NULL);
  if (e != CL_SUCCESS) {
    fmt(b->err, sizeof b->err, "clGetDeviceInfo: %s (%d)", cp_cl_error_name(e), e);
    return -1;
  }
  size_t wg = 64;
  while (wg > dev_wg && wg > 1) wg >>= 1;
  for (;;) {
    if (build_softmax(b, wg) != 0) return -1;
    size_t kwg = 0;
    e = clGetKernelWorkGroupInfo(b->softmax, b->device, CL_KERNEL_WORK_GROUP_SIZE, sizeof kwg, &kwg, NULL);
    if (e != CL_SUCCESS) {
      fmt(b->err, sizeof b->err, "clGetKernelWorkGroupInfo: %s (%d)", cp_cl_error_name(e), e);
      return -1;
    }
    if (kwg >= wg || wg == 1) break;
    while (wg > kwg && wg > 1) wg >>= 1;
  }
  return 0;
}

void bb_device_release(bb_device *b) {
  if (b->softmax) clReleaseKernel(b->softmax);
  if (b->program) clReleaseProgram(b->program);
  b->softmax = NULL;
  b->program = NULL;
}

static cl_mem make_buf(bb_device *b, size_t bytes, const char *what) {
  cl_int e;
  cl_mem m = clCreateBuffer(b->context, CL_MEM_READ_WRITE, bytes, NULL, &e);
  if (e != CL_SUCCESS) {
    fmt(b->err, sizeof b->err, "clCreateBuffer(%s, %zu bytes): %s (%d)", what, bytes, cp_cl_error_name(e), e);
    return NULL;
  }
  return m;
}

void bb_staged_release(bb_staged *sp) {
  if (sp->o) clReleaseMemObject(sp->o);
  if (sp->scores) clReleaseMemObject(sp->scores);
  sp->o = sp->scores = NULL;
}

int bb_staged_prepare(bb_device *b, bb_staged *sp, const bb_shape *s, cl_mem q, cl_mem k, cl_mem v,
                      size_t scratch_limit) {
  memset(sp, 0, sizeof *sp);
  sp->s = *s;
  sp->q = q;
  sp->k = k;
  sp->v = v;
  const size_t G = (size_t)(s->heads / s->kv_heads), GM = G * (size_t)s->q_len, N = (size_t)s->kv_len;
  const size_t groups = (size_t)s->batch * (size_t)s->kv_heads;
  size_t limit = scratch_limit;
  if (b->max_alloc && limit > b->max_alloc) limit = (size_t)b->max_alloc;
  const size_t row_bytes = N * sizeof(float);
  if (row_bytes > limit) {
    fmt(b->err, sizeof b->err, "one score row (%zu bytes) exceeds the scratch limit", row_bytes);
    return -1;
  }
  sp->rows = GM;
  sp->groups = limit / (GM * row_bytes);
  if (sp->groups == 0) {
    sp->groups = 1;
    sp->rows = limit / row_bytes;
  }
  if (sp->groups > groups) sp->groups = groups;
  sp->o = make_buf(b, groups * GM * (size_t)s->dim * sizeof(float), "staged out");
  sp->scores = sp->o ? make_buf(b, sp->groups * sp->rows * row_bytes, "staged scores") : NULL;
  if (!sp->scores) {
    bb_staged_release(sp);
    return -1;
  }
  return 0;
}

int bb_staged_run(bb_device *b, bb_staged *sp) {
  const bb_shape *s = &sp->s;
  const size_t d = (size_t)s->dim, N = (size_t)s->kv_len;
  const size_t GM = (size_t)(s->heads / s->kv_heads) * (size_t)s->q_len;
  const size_t groups = (size_t)s->batch * (size_t)s->kv_heads;
  const float scale = 1.0f / sqrtf((float)s->dim);
  cl_command_queue queue = b->queue;
  const int n = s->kv_len, m = s->q_len, rpg = (int)GM, causal = s->causal;
  for (size_t g0 = 0; g0 < groups; g0 += sp->groups) {
    const size_t ng = groups - g0 < sp->groups ? groups - g0 : sp->groups;
    for (size_t r0 = 0; r0 < GM; r0 += sp->rows) {
      const size_t nr = GM - r0 < sp->rows ? GM - r0 : sp->rows;
      /* S[g] (nr x N) = scale * Q[g][r0:] (nr x d) * K[g]^T */
      CLBlastStatusCode c = CLBlastSgemmStridedBatched(
          CLBlastLayoutRowMajor, CLBlastTransposeNo, CLBlastTransposeYes, nr, N, d, scale, sp->q, (g0 * GM + r0) * d, d,
          GM * d, sp->k, g0 * N * d, d, N * d, 0.0f, sp->scores, 0, N, nr * N, ng, &queue, NULL);
      if (c != CLBlastSuccess) {
        fmt(b->err, sizeof b->err, "CLBlastSgemmStridedBatched (QK^T): %s (%d)", clblast_name(c), (int)c);
        return -1;
      }
      const int row0 = (int)r0;
      cl_int e = clSetKernelArg(b->softmax, 0, sizeof(cl_mem), &sp->scores);
      e |= clSetKernelArg(b->softmax, 1, sizeof(int), &n);
      e |= clSetKernelArg(b->softmax, 2, sizeof(int), &m);
      e |= clSetKernelArg(b->softmax, 3, sizeof(int), &rpg);
      e |= clSetKernelArg(b->softmax, 4, sizeof(int), &row0);
      e |= clSetKernelArg(b->softmax, 5, sizeof(int), &causal);
      if (e != CL_SUCCESS) {
        fmt(b->err, sizeof b->err, "clSetKernelArg(bench_softmax) failed");
        return -1;
      }
      size_t local = b->wg, global = ng * nr * b->wg;
      e = clEnqueueNDRangeKernel(queue, b->softmax, 1, NULL, &global, &local, 0, NULL, NULL);
      if (e != CL_SUCCESS) {
        fmt(b->err, sizeof b->err, "clEnqueueNDRangeKernel(bench_softmax): %s (%d)", cp_cl_error_name(e), e);
        return -1;
      }
      /* O[g][r0:] (nr x d) = A[g] (nr x N) * V[g] (N x d) */
      c = CLBlastSgemmStridedBatched(CLBlastLayoutRowMajor, CLBlastTransposeNo, CLBlastTransposeNo, nr, d, N, 1.0f,
                                     sp->scores, 0, N, nr * N, sp->v, g0 * N * d, d, N * d, 0.0f, sp->o,
                                     (g0 * GM + r0) * d, d, GM * d, ng, &queue, NULL);
      if (c != CLBlastSuccess) {
        fmt(b->err, sizeof b->err, "CLBlastSgemmStridedBatched (AV): %s (%d)", clblast_name(c), (int)c);
        return -1;
      }
    }
  }
  cl_int e = clFinish(queue);
  if (e != CL_SUCCESS) {
    fmt(b->err, sizeof b->err, "clFinish: %s (%d)", cp_cl_error_name(e), e);
    return -1;
  }
  return 0;
}

/* ---- host ---- */

typedef struct {
  float *s;
  size_t row_begin, row_end, n, m, rows_per_group, row0;
  int causal;
} softmax_job;

static void *host_softmax(void *arg) {
  const softmax_job *jb = arg;
  const size_t n = jb->n, m = jb->m;
  for (size_t r = jb->row_begin; r < jb->row_end; r++) {
    float *x = jb->s + r * n;
    const size_t i = ((jb->row0 + r) % jb->rows_per_group) % m;
    size_t lim = n;
    if (jb->causal) {
      lim = i + n + 1 > m ? i + n + 1 - m : 0; /* keys j <= i + n - m */
      if (lim > n) lim = n;
    }
    float mx = -INFINITY;
    for (size_t j = 0; j < lim; j++) mx = x[j] > mx ? x[j] : mx;
    float sum = 0.0f;
    for (size_t j = 0; j < lim; j++) {
      const float e = expf(x[j] - mx);
      x[j] = e;
      sum += e;
    }
    const float inv = lim > 0 ? 1.0f / sum : 0.0f;
    for (size_t j = 0; j < lim; j++) x[j] *= inv;
    for (size_t j = lim; j < n; j++) x[j] = 0.0f;
  }
  return NULL;
}

#define BB_MAX_THREADS 64

/* Softmax of rows [0, rows) of s, split across h->threads threads (the
 * calling thread takes the first share; a thread that cannot start has its
 * share done on the calling thread). */
static void host_softmax_rows(bb_host *h, float *s, size_t rows, size_t row0, size_t rows_per_group) {
  int t = h->threads;
  if (t < 1) t = 1;
  if (t > BB_MAX_THREADS) t = BB_MAX_THREADS;
  if ((size_t)t > rows) t = (int)rows;
  if (rows * (size_t)h->s.kv_len < 65536) t = 1;
  softmax_job jobs[BB_MAX_THREADS];
  pthread_t tid[BB_MAX_THREADS];
  int started[BB_MAX_THREADS] = {0};
  for (int i = 0; i < t; i++)
    jobs[i] = (softmax_job){s,
                            rows * (size_t)i / (size_t)t,
                            rows * (size_t)(i + 1) / (size_t)t,
                            (size_t)h->s.kv_len,
                            (size_t)h->s.q_len,
                            rows_per_group,
                            row0,
                            h->s.causal};
  for (int i = 1; i < t; i++) started[i] = pthread_create(&tid[i], NULL, host_softmax, &jobs[i]) == 0;
  host_softmax(&jobs[0]);
  for (int i = 1; i < t; i++) {
    if (started[i])
      pthread_join(tid[i], NULL);
    else
      host_softmax(&jobs[i]);
  }
}

int bb_host_prepare(bb_host *h, const bb_shape *s, const float *q, const float *k, const float *v, size_t scratch_limit,
                    int threads) {
  memset(h, 0, sizeof *h);
  h->s = *s;
  h->q = q;
  h->k = k;
  h->v = v;
  h->threads = threads;
  const size_t GM = (size_t)(s->heads / s->kv_heads) * (size_t)s->q_len, N = (size_t)s->kv_len;
  const size_t groups = (size_t)s->batch * (size_t)s->kv_heads;
  h->rows = scratch_limit / (N * sizeof(float));
  if (h->rows == 0) h->rows = 1;
  if (h->rows > GM) h->rows = GM;
  h->o = malloc(groups * GM * (size_t)s->dim * sizeof(float));
  h->scores = malloc(h->rows * N * sizeof(float));
  if (!h->o || !h->scores) {
    bb_host_release(h);
    fmt(h->err, sizeof h->err, "host baseline: out of memory");
    return -1;
  }
  return 0;
}

void bb_host_release(bb_host *h) {
  free(h->o);
  free(h->scores);
  h->o = h->scores = NULL;
}

int bb_host_run(bb_host *h) {
  const bb_shape *s = &h->s;
  const size_t d = (size_t)s->dim, N = (size_t)s->kv_len;
  const size_t GM = (size_t)(s->heads / s->kv_heads) * (size_t)s->q_len;
  const size_t groups = (size_t)s->batch * (size_t)s->kv_heads;
  const float scale = 1.0f / sqrtf((float)s->dim);
  for (size_t g = 0; g < groups; g++) {
    for (size_t r0 = 0; r0 < GM; r0 += h->rows) {
      const size_t nr = GM - r0 < h->rows ? GM - r0 : h->rows;
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (blasint)nr, (blasint)N, (blasint)d, scale,
                  h->q + (g * GM + r0) * d, (blasint)d, h->k + g * N * d, (blasint)d, 0.0f, h->scores, (blasint)N);
      host_softmax_rows(h, h->scores, nr, r0, GM);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (blasint)nr, (blasint)d, (blasint)N, 1.0f, h->scores,
                  (blasint)N, h->v + g * N * d, (blasint)d, 0.0f, h->o + (g * GM + r0) * d, (blasint)d);
    }
  }
  return 0;
}

/* ---- ceilings ---- */

typedef struct {
  bb_device *b;
  cl_mem a, bm, c;
  int n;
} dev_gemm_arg;

static int dev_gemm_once(void *arg, char *err, size_t errlen) {
  dev_gemm_arg *g = arg;
  cl_command_queue queue = g->b->queue;
  const size_t n = (size_t)g->n;
  CLBlastStatusCode c = CLBlastSgemm(CLBlastLayoutRowMajor, CLBlastTransposeNo, CLBlastTransposeNo, n, n, n, 1.0f, g->a,
                                     0, n, g->bm, 0, n, 0.0f, g->c, 0, n, &queue, NULL);
  if (c != CLBlastSuccess) {
    fmt(err, errlen, "CLBlastSgemm: %s (%d)", clblast_name(c), (int)c);
    return -1;
  }
  cl_int e = clFinish(queue);
  if (e != CL_SUCCESS) {
    fmt(err, errlen, "clFinish: %s (%d)", cp_cl_error_name(e), e);
    return -1;
  }
  return 0;
}

static int fill_buf(bb_device *b, cl_mem m, size_t bytes, float value) {
  cl_int e = clEnqueueFillBuffer(b->queue, m, &value, sizeof value, 0, bytes, 0, NULL, NULL);
  if (e == CL_SUCCESS) e = clFinish(b->queue);
  if (e != CL_SUCCESS) {
    fmt(b->err, sizeof b->err, "clEnqueueFillBuffer: %s (%d)", cp_cl_error_name(e), e);
    return -1;
  }
  return 0;
}

int bb_device_sgemm_rate(bb_device *b, int n, int max_reps, double cap_ms, double *gflops) {
  *gflops = NAN;
  const size_t bytes = (size_t)n * (size_t)n * sizeof(float);
  dev_gemm_arg g = {b, NULL, NULL, NULL, n};
  int rc = -1;
  g.a = make_buf(b, bytes, "sgemm A");
  g.bm = g.a ? make_buf(b, bytes, "sgemm B") : NULL;
  g.c = g.bm ? make_buf(b, bytes, "sgemm C") : NULL;
  if (!g.c || fill_buf(b, g.a, bytes, 0.01f) || fill_buf(b, g.bm, bytes, 0.02f)) goto done;
  double ms;
  int reps;
  if (bb_time(dev_gemm_once, &g, 1, max_reps, cap_ms, &ms, &reps, b->err, sizeof b->err) != 0) goto done;
  *gflops = 2.0 * n * (double)n * n / (ms * 1e6);
  rc = 0;
done:
  if (g.a) clReleaseMemObject(g.a);
  if (g.bm) clReleaseMemObject(g.bm);
  if (g.c) clReleaseMemObject(g.c);
  return rc;
}

typedef struct {
  float *a, *b, *c;
  int n;
} host_gemm_arg;

static int host_gemm_once(void *arg, char *err, size_t errlen) {
  (void)err;
  (void)errlen;
  host_gemm_arg *g = arg;
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, g->n, g->n, g->n, 1.0f, g->a, g->n, g->b, g->n, 0.0f, g->c,
              g->n);
  return 0;
}

int bb_host_sgemm_rate(int n, int max_reps, double cap_ms, double *gflops, char *err, size_t errlen) {
  *gflops = NAN;
  const size_t count = (size_t)n * (size_t)n;
  host_gemm_arg g = {malloc(count * sizeof(float)), malloc(count * sizeof(float)), malloc(count * sizeof(float)), n};
  int rc = -1;
  if (!g.a || !g.b || !g.c) {
    fmt(err, errlen, "host sgemm: out of memory");
    goto done;
  }
  for (size_t i = 0; i < count; i++) {
    g.a[i] = 0.01f * (float)(i % 97);
    g.b[i] = 0.02f * (float)(i % 89);
    g.c[i] = 0.0f;
  }
  double ms;
  int reps;
  if (bb_time(host_gemm_once, &g, 1, max_reps, cap_ms, &ms, &reps, err, errlen) != 0) goto done;
  *gflops = 2.0 * n * (double)n * n / (ms * 1e6);
  rc = 0;
done:
  free(g.a);
  free(g.b);
  free(g.c);
  return rc;
}

/* The arithmetic ceiling: FMA_CHAINS independent multiply-add chains of
 * the device's native float vectors per work-item, enough to cover an
 * FMA's latency on every pipe (a CPU core runs one work-item at a time, a
 * GPU many). The chains converge to 1, never to a denormal, and their
 * sum is written, so no compiler drops them. */
#define FMA_CHAINS 8
static const char fma_src[] =
    "#if VW == 1\n"
    "typedef float vec;\n"
    "#else\n"
    "#define VEC_(n) float##n\n"
    "#define VEC(n) VEC_(n)\n"
    "#define VSTORE_(n) vstore##n\n"
    "#define VSTORE(n) VSTORE_(n)\n"
    "typedef VEC(VW) vec;\n"
    "#endif\n"
    "__kernel void bench_fma(__global float *out, const int iters, const float m, const float c) {\n"
    "  vec a[CHAINS];\n"
    "  for (int k = 0; k < CHAINS; k++) a[k] = (vec)(get_global_id(0) * 1e-9f + k * 1e-3f);\n"
    "  for (int i = 0; i < iters; i++)\n"
    "#pragma unroll\n"
    "    for (int k = 0; k < CHAINS; k++) a[k] = fma(a[k], (vec)(m), (vec)(c));\n"
    "  vec s = a[0];\n"
    "  for (int k = 1; k < CHAINS; k++) s += a[k];\n"
    "#if VW == 1\n"
    "  const float t = s;\n"
    "#else\n"
    "  float lanes[VW], t = 0.0f;\n"
    "  VSTORE(VW)(s, 0, lanes);\n"
    "  for (int k = 0; k < VW; k++) t += lanes[k];\n"
    "#endif\n"
    "  out[get_global_id(0)] = t;\n"
    "}\n";

typedef struct {
  bb_device *b;
  cl_kernel k;
  size_t global, local; /* local 0: the runtime's choice */
} fma_arg;

static int fma_once(void *arg, char *err, size_t errlen) {
  fma_arg *f = arg;
  cl_int e = clEnqueueNDRangeKernel(f->b->queue, f->k, 1, NULL, &f->global, f->local ? &f->local : NULL, 0, NULL,
                                    NULL);
  if (e == CL_SUCCESS) e = clFinish(f->b->queue);
  if (e != CL_SUCCESS) {
    fmt(err, errlen, "bench_fma: %s (%d)", cp_cl_error_name(e), e);
    return -1;
  }
  return 0;
}

int bb_device_fma_rate(bb_device *b, int max_reps, double cap_ms, double *gflops) {
  *gflops = NAN;
  cl_uint vw = 1, units = 1;
  cl_device_type type = 0;
  cl_int e = clGetDeviceInfo(b->device, CL_DEVICE_NATIVE_VECTOR_WIDTH_FLOAT, sizeof vw, &vw, NULL);
  if (e == CL_SUCCESS) e = clGetDeviceInfo(b->device, CL_DEVICE_MAX_COMPUTE_UNITS, sizeof units, &units, NULL);
  if (e == CL_SUCCESS) e = clGetDeviceInfo(b->device, CL_DEVICE_TYPE, sizeof type, &type, NULL);
  if (e != CL_SUCCESS) {
    fmt(b->err, sizeof b->err, "clGetDeviceInfo: %s (%d)", cp_cl_error_name(e), e);
    return -1;
  }
  if (vw != 1 && vw != 2 && vw != 4 && vw != 8 && vw != 16) vw = 1;
  /* CPUs: work-groups of one work-item, a few per core; GPUs: enough
   * work-groups of the runtime's size to fill every unit many times */
  const int cpu = (type & CL_DEVICE_TYPE_CPU) != 0;
  fma_arg f = {b, NULL, (size_t)units * (cpu ? 8 : 8192), cpu ? 1 : 0};
  cl_program prog = NULL;
  cl_mem out = NULL;
  int rc = -1;
  char opts[64];
  snprintf(opts, sizeof opts, "-DVW=%u -DCHAINS=%d", vw, FMA_CHAINS);
  if (build_kernel(b, fma_src, opts, "bench_fma", &prog, &f.k) != 0) goto done;
  out = make_buf(b, f.global * sizeof(float), "fma out");
  if (!out) goto done;
  const float m = 0.999f, c = 0.001f;
  e = clSetKernelArg(f.k, 0, sizeof out, &out);
  if (e == CL_SUCCESS) e = clSetKernelArg(f.k, 2, sizeof m, &m);
  if (e == CL_SUCCESS) e = clSetKernelArg(f.k, 3, sizeof c, &c);
  /* a short run sets the iterations for about 50 ms; the best of max_reps
   * runs is the peak (a shared machine's other work only slows a run down) */
  cl_int iters = 1 << 10;
  double best_ms = 0.0;
  for (int run = 0; run <= max_reps; run++) {
    if (e == CL_SUCCESS && run <= 1) /* the first guess, then the calibrated count */
      e = clSetKernelArg(f.k, 1, sizeof iters, &iters);
    if (e != CL_SUCCESS) break;
    double ms;
    int reps;
    if (bb_time(fma_once, &f, run == 0 || run == 1, 1, cap_ms, &ms, &reps, b->err, sizeof b->err) != 0) goto done;
    if (run == 0) {
      const double want = (double)iters * 50.0 / (ms > 1e-3 ? ms : 1e-3);
      iters = (cl_int)(want < 1 ? 1 : want > (1 << 30) ? (1 << 30) : want);
      continue;
    }
    if (run == 1 || ms < best_ms) best_ms = ms;
  }
  if (e != CL_SUCCESS) {
    fmt(b->err, sizeof b->err, "clSetKernelArg(bench_fma): %s (%d)", cp_cl_error_name(e), e);
    goto done;
  }
  *gflops = 2.0 * (double)f.global * iters * FMA_CHAINS * vw / (best_ms * 1e6);
  rc = 0;
done:
  if (out) clReleaseMemObject(out);
  if (f.k) clReleaseKernel(f.k);
  if (prog) clReleaseProgram(prog);
  return rc;
}

typedef struct {
  bb_device *b;
  cl_mem src, dst;
  size_t bytes;
} copy_arg;

static int copy_once(void *arg, char *err, size_t errlen) {
  copy_arg *c = arg;
  cl_int e = clEnqueueCopyBuffer(c->b->queue, c->src, c->dst, 0, 0, c->bytes, 0, NULL, NULL);
  if (e == CL_SUCCESS) e = clFinish(c->b->queue);
  if (e != CL_SUCCESS) {
    fmt(err, errlen, "clEnqueueCopyBuffer: %s (%d)", cp_cl_error_name(e), e);
    return -1;
  }
  return 0;
}

int bb_device_copy_rate(bb_device *b, size_t bytes, int max_reps, double cap_ms, double *gbps, size_t *used_bytes) {
  *gbps = NAN;
  if (b->max_alloc && bytes > b->max_alloc) bytes = (size_t)b->max_alloc;
  bytes &= ~(size_t)63;
  *used_bytes = bytes;
  copy_arg c = {b, NULL, NULL, bytes};
  int rc = -1;
  c.src = make_buf(b, bytes, "copy src");
  c.dst = c.src ? make_buf(b, bytes, "copy dst") : NULL;
  if (!c.dst || fill_buf(b, c.src, bytes, 1.0f) || fill_buf(b, c.dst, bytes, 0.0f)) goto done;
  double ms;
  int reps;
  if (bb_time(copy_once, &c, 1, max_reps, cap_ms, &ms, &reps, b->err, sizeof b->err) != 0) goto done;
  *gbps = 2.0 * (double)bytes / (ms * 1e6);
  rc = 0;
done:
  if (c.src) clReleaseMemObject(c.src);
  if (c.dst) clReleaseMemObject(c.dst);
  return rc;
}
