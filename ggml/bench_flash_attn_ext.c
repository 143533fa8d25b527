/*
 * ggml-bench-fa: one FLASH_ATTN_EXT node timed on ggml's CPU backend and on
 * CLATTN over the same tensors (both in host memory), rounds interleaved,
 * medians; the outputs compared (NMSE) as test-backend-ops does. Each
 * sample is one graph of N copies of the node (as test-backend-ops perf
 * times an op): the node's steady-state cost on a backend whose threads
 * are running, not the wake-up of a thread pool the other backend's run
 * left idle, nor the other pool still spinning beside it.
 *
 *   ggml-bench-fa [--threads T] [--poll P] [--rounds R] [--nodes N] [--kv f16|q8_0|q4_0] [--cache-rows]
 *                 SHAPE...
 *     SHAPE  H,Hkv,n_q,n_kv,D: H query heads over Hkv KV heads, n_q queries
 *            (1: a decode step; more: a prefill chunk under a causal mask,
 *            its queries the last n_q positions), n_kv keys, head size D
 *     --threads  the CPU backend's threads (default: every core, as llama.cpp runs it)
 *     --poll     the CPU thread pool's polling level, 0 .. 100 (default 0: its threads sleep when
 *                idle; ggml's default, 50, keeps them spinning for tens of milliseconds after
 *                each graph, on the cores the OpenCL device's threads need when it is the CPU)
 *     --rounds   samples per backend (default 7); --nodes  copies of the node per sample (default 8)
 *     --cache-rows  K and V as llama.cpp keeps its cache: a row per key holding every KV head's
 *                vector (the view's head stride inside its key stride); default: head-major
 *
 * One line per shape: the CPU's and CLATTN's median milliseconds per node,
 * their ratio (CPU / CLATTN: above 1, clattn is faster), the NMSE.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-clattn.h"
#include "ggml-cpu.h"
#include "ggml.h"

static uint64_t rng = 0x2545f4914f6cdd1dull;
static float urand(void) { /* [-1, 1) */
  rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
  return (float)((rng >> 11) * (2.0 / 9007199254740992.0) - 1.0);
}

static int cmp_double(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double median(double *x, int n) {
  qsort(x, (size_t)n, sizeof *x, cmp_double);
  return n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
}

/* One shape: returns 0 when both backends computed it. */
static int bench(ggml_backend_t cpu, ggml_backend_t cl, const int s[5], enum ggml_type kv_type, int rounds,
                 int nodes, int cache_rows) {
  const int H = s[0], Hkv = s[1], n_q = s[2], n_kv = s[3], D = s[4];
  struct ggml_init_params ip = {ggml_tensor_overhead() * 8 + ggml_graph_overhead(), NULL, true};
  struct ggml_context *ctx = ggml_init(ip);
  struct ggml_tensor *q = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, D, n_q, H, 1);
  struct ggml_tensor *k, *v;
  if (cache_rows) { /* llama.cpp's cache: one row per key holds every KV head's vector */
    struct ggml_tensor *kc = ggml_new_tensor_2d(ctx, kv_type, (int64_t)D * Hkv, n_kv);
    struct ggml_tensor *vc = ggml_new_tensor_2d(ctx, kv_type, (int64_t)D * Hkv, n_kv);
    k = ggml_view_4d(ctx, kc, D, n_kv, Hkv, 1, ggml_row_size(kv_type, (int64_t)D * Hkv), ggml_row_size(kv_type, D), 0, 0);
    v = ggml_view_4d(ctx, vc, D, n_kv, Hkv, 1, ggml_row_size(kv_type, (int64_t)D * Hkv), ggml_row_size(kv_type, D), 0, 0);
  } else {
    k = ggml_new_tensor_4d(ctx, kv_type, D, n_kv, Hkv, 1);
    v = ggml_new_tensor_4d(ctx, kv_type, D, n_kv, Hkv, 1);
  }
  struct ggml_tensor *mask = ggml_new_tensor_4d(ctx, GGML_TYPE_F16, n_kv, n_q, 1, 1);
  struct ggml_tensor *out = ggml_flash_attn_ext(ctx, q, k, v, mask, 1.0f / sqrtf((float)D), 0.0f, 0.0f);
  ggml_prec_set_acc(out, GGML_PREC_F32);
  struct ggml_cgraph *gf = ggml_new_graph(ctx);
  ggml_build_forward_expand(gf, out);
  for (int i = 1; i < nodes; i++) ggml_graph_add_node(gf, out);
  ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors_from_buft(ctx, ggml_backend_cpu_buffer_type());
  if (!buf) {
    fprintf(stderr, "ggml-bench-fa: cannot allocate the tensors\n");
    ggml_free(ctx);
    return -1;
  }
  /* inputs: uniform in [-1, 1); K and V quantised by ggml; a causal mask */
  const size_t nq = (size_t)D * n_q * H, nkv = (size_t)D * n_kv * Hkv;
  float *x = malloc(sizeof(float) * (nq > nkv ? nq : nkv));
  ggml_fp16_t *m = malloc(sizeof(ggml_fp16_t) * (size_t)n_kv * n_q);
  void *kv_bytes = malloc(ggml_nbytes(k));
  for (size_t i = 0; i < nq; i++) x[i] = urand();
  ggml_backend_tensor_set(q, x, 0, ggml_nbytes(q));
  struct ggml_tensor *kvs[2] = {k, v};
  for (int t = 0; t < 2; t++) {
    for (size_t i = 0; i < nkv; i++) x[i] = urand();
    ggml_quantize_chunk(kv_type, x, kv_bytes, 0, (int64_t)n_kv * Hkv, D, NULL);
    ggml_backend_tensor_set(kvs[t], kv_bytes, 0, ggml_nbytes(k));
  }
  float *mf = malloc(sizeof(float) * (size_t)n_kv * n_q);
  for (int i = 0; i < n_q; i++)
    for (int j = 0; j < n_kv; j++) mf[(size_t)i * n_kv + j] = j <= i + n_kv - n_q ? 0.0f : -INFINITY;
  ggml_fp32_to_fp16_row(mf, m, (int64_t)n_kv * n_q);
  ggml_backend_tensor_set(mask, m, 0, ggml_nbytes(mask));

  /* rounds interleaved, the order swapped each round; each backend's first run is a warm-up */
  const size_t n_out = ggml_nelements(out);
  float *o[2] = {malloc(sizeof(float) * n_out), malloc(sizeof(float) * n_out)};
  double *ms[2] = {malloc(sizeof(double) * (size_t)rounds), malloc(sizeof(double) * (size_t)rounds)};
  ggml_backend_t backends[2] = {cpu, cl};
  int rc = 0;
  for (int r = -1; r < rounds && rc == 0; r++)
    for (int turn = 0; turn < 2 && rc == 0; turn++) {
      const int b = r < 0 ? turn : (r + turn) % 2;
      const int64_t t0 = ggml_time_us();
      if (ggml_backend_graph_compute(backends[b], gf) != GGML_STATUS_SUCCESS) rc = -1;
      const int64_t t1 = ggml_time_us();
      if (r >= 0) ms[b][r] = (double)(t1 - t0) / 1000.0 / nodes;
      if (r == 0) ggml_backend_tensor_get(out, o[b], 0, ggml_nbytes(out));
    }
  if (rc == 0) {
    double err = 0.0, ref = 0.0;
    for (size_t i = 0; i < n_out; i++) {
      err += (o[1][i] - o[0][i]) * (double)(o[1][i] - o[0][i]);
      ref += (double)o[0][i] * o[0][i];
    }
    const double cpu_ms = median(ms[0], rounds), cl_ms = median(ms[1], rounds);
    printf("%-5s %s H=%-3d Hkv=%-2d n_q=%-4d n_kv=%-6d D=%-3d  CPU %9.3f ms  CLATTN %9.3f ms  CPU/CLATTN %5.2f  "
           "NMSE %.1e\n",
           ggml_type_name(kv_type), cache_rows ? "rows" : "heads", H, Hkv, n_q, n_kv, D, cpu_ms, cl_ms, cpu_ms / cl_ms,
           err / (ref > 0 ? ref : 1));
  } else {
    fprintf(stderr, "ggml-bench-fa: a backend failed to compute the node\n");
  }
  free(x), free(m), free(mf), free(kv_bytes), free(o[0]), free(o[1]), free(ms[0]), free(ms[1]);
  ggml_backend_buffer_free(buf);
  ggml_free(ctx);
  return rc;
}

int main(int argc, char **argv) {
  int threads = (int)sysconf(_SC_NPROCESSORS_ONLN), poll = 0, rounds = 7, nodes = 8, cache_rows = 0, first = 1;
  enum ggml_type kv_type = GGML_TYPE_F16;
  for (; first < argc && argv[first][0] == '-'; first += 2) {
    if (strcmp(argv[first], "--cache-rows") == 0) {
      cache_rows = 1;
      first--;
      continue;
    }
    if (first + 1 >= argc) break;
    if (strcmp(argv[first], "--threads") == 0) threads = atoi(argv[first + 1]);
    else if (strcmp(argv[first], "--rounds") == 0) rounds = atoi(argv[first + 1]);
    else if (strcmp(argv[first], "--nodes") == 0) nodes = atoi(argv[first + 1]);
    else if (strcmp(argv[first], "--poll") == 0) poll = atoi(argv[first + 1]);
    else if (strcmp(argv[first], "--kv") == 0)
      kv_type = strcmp(argv[first + 1], "q8_0") == 0   ? GGML_TYPE_Q8_0
                : strcmp(argv[first + 1], "q4_0") == 0 ? GGML_TYPE_Q4_0
                                                        : GGML_TYPE_F16;
    else
      break;
  }
  if (first >= argc || threads < 1 || rounds < 1 || nodes < 1 || nodes > 1000 || poll < 0 || poll > 100) {
    fprintf(stderr, "usage: ggml-bench-fa [--threads T] [--poll P] [--rounds R] [--nodes N] [--kv f16|q8_0|q4_0] "
                    "[--cache-rows] H,Hkv,n_q,n_kv,D...\n");
    return 2;
  }
  ggml_backend_reg_t reg = ggml_backend_clattn_reg();
  if (ggml_backend_reg_dev_count(reg) == 0) {
    fprintf(stderr, "ggml-bench-fa: clattn found no OpenCL device\n");
    return 1;
  }
  ggml_backend_t cpu = ggml_backend_cpu_init();
  struct ggml_threadpool_params tpp = ggml_threadpool_params_default(threads);
  tpp.poll = (uint32_t)poll;
  struct ggml_threadpool *pool = ggml_threadpool_new(&tpp);
  ggml_backend_cpu_set_n_threads(cpu, threads);
  ggml_backend_cpu_set_threadpool(cpu, pool);
  ggml_backend_t cl = ggml_backend_dev_init(ggml_backend_reg_dev_get(reg, 0), NULL);
  printf("CPU backend: %d threads, polling %d; CLATTN: %s; per node, median of %d interleaved rounds of %d nodes\n",
         threads, poll, ggml_backend_dev_description(ggml_backend_reg_dev_get(reg, 0)), rounds, nodes);
  int rc = 0;
  for (int i = first; i < argc; i++) {
    int s[5];
    if (sscanf(argv[i], "%d,%d,%d,%d,%d", &s[0], &s[1], &s[2], &s[3], &s[4]) != 5 || s[0] <= 0 || s[1] <= 0 ||
        s[0] % s[1] || s[2] <= 0 || s[3] < s[2] || s[4] <= 0) {
      fprintf(stderr, "ggml-bench-fa: bad shape %s (H,Hkv,n_q,n_kv,D; Hkv divides H, n_kv >= n_q)\n", argv[i]);
      rc = 2;
      continue;
    }
    if (bench(cpu, cl, s, kv_type, rounds, nodes, cache_rows)) rc = 1;
  }
  ggml_backend_free(cl);
  ggml_backend_free(cpu);
  ggml_threadpool_free(pool);
  return rc;
}
