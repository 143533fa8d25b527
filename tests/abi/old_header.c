/*
 * A program built against this soname's first header (tests/abi/clattn.h,
 * kept as it was released: a fixture) and against the current one
 * (include/clattn.h); test abi-old-header runs both against the library of
 * this tree and compares what they print: the same calls, the same bits.
 * Each call's outputs are printed as an FNV-1a hash of their bytes.
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <clattn.h>

enum { B = 2, HQ = 4, HKV = 2, M = 5, N = 37, D = 32, CAP = 48 };

static uint64_t fnv(const void *bytes, size_t n, uint64_t h) {
  const unsigned char *p = bytes;
  for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

static float value(unsigned i, unsigned salt) { /* deterministic inputs in [-1, 1) */
  uint32_t x = i * 2654435761u ^ salt * 40503u;
  x ^= x >> 15;
  x *= 2246822519u;
  x ^= x >> 13;
  return (float)(x % 2048u) / 1024.0f - 1.0f;
}

typedef struct {
  clattn_context *ctx;
  cl_command_queue queue;
  int failed;
} run;

static cl_mem buffer(run *r, size_t floats, unsigned salt) {
  float host[B * HQ * CAP * D];
  for (size_t i = 0; i < floats && i < sizeof host / sizeof host[0]; i++) host[i] = salt ? value((unsigned)i, salt) : 0.0f;
  cl_int err;
  cl_mem m = clCreateBuffer(clattn_cl_context(r->ctx), CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, floats * sizeof(float),
                            host, &err);
  if (err != CL_SUCCESS) r->failed = 1;
  return m;
}

static void print_hash(run *r, const char *what, clattn_status st, cl_mem *outs, const size_t *floats, int n) {
  uint64_t h = 1469598103934665603ull;
  clFinish(r->queue);
  for (int i = 0; i < n && st == CLATTN_OK; i++) {
    float host[B * HQ * CAP * D];
    if (clEnqueueReadBuffer(r->queue, outs[i], CL_TRUE, 0, floats[i] * sizeof(float), host, 0, NULL, NULL) != CL_SUCCESS)
      r->failed = 1;
    h = fnv(host, floats[i] * sizeof(float), h);
  }
  printf("%-16s %-18s %016llx\n", what, clattn_status_string(st), (unsigned long long)h);
  if (st != CLATTN_OK) r->failed = 1;
}

static clattn_tensor dense(cl_mem m, int heads, int rows, int cols) {
  return (clattn_tensor){m, 0, {(size_t)heads * rows * cols, (size_t)rows * cols, (size_t)cols, 1}};
}

int main(void) {
  run r = {NULL, NULL, 0};
  clattn_options opt;
  memset(&opt, 0, sizeof opt); /* struct_size 0: this soname's first layout */
  if (clattn_create(&opt, &r.ctx) != CLATTN_OK) {
    fprintf(stderr, "no context: %s\n", clattn_last_error(NULL));
    return 77;
  }
  r.queue = clattn_cl_queue(r.ctx);
  const size_t q_n = B * HQ * M * D, kv_n = B * HKV * N * D, lse_n = B * HQ * M, cache_n = B * HKV * CAP * D;
  cl_mem q = buffer(&r, q_n, 1), k = buffer(&r, kv_n, 2), v = buffer(&r, kv_n, 3), out = buffer(&r, q_n, 0),
         lse = buffer(&r, lse_n, 0);

  clattn_params p = clattn_params_default();
  p.batch = B, p.q_heads = HQ, p.kv_heads = HKV, p.q_len = M, p.kv_len = N, p.head_dim = p.value_dim = D;
  p.q = dense(q, HQ, M, D), p.k = dense(k, HKV, N, D), p.v = dense(v, HKV, N, D), p.out = dense(out, HQ, M, D);
  p.lse = (clattn_tensor){lse, 0, {HQ * M, M, 1, 0}};
  p.causal = 1;
  cl_mem outs[] = {out, lse};
  const size_t sizes[] = {q_n, lse_n};
  for (int algo = CLATTN_ALGO_STAGED; algo <= CLATTN_ALGO_FUSED; algo++) {
    p.algo = (clattn_algo)algo;
    print_hash(&r, clattn_algo_name(p.algo), clattn_forward(r.ctx, &p, 0, NULL, NULL), outs, sizes, 2);
  }
  p.algo = CLATTN_ALGO_AUTO;

  clattn_plan *plan = NULL;
  clattn_status st = clattn_plan_create(r.ctx, &p, &plan);
  clattn_step s = clattn_step_default();
  s.kv_len = N - 4;
  if (st == CLATTN_OK) st = clattn_plan_enqueue(plan, &s, 0, NULL, NULL);
  print_hash(&r, "plan step", st, outs, sizes, 2);
  clattn_plan_release(plan);

  cl_mem d_out = buffer(&r, q_n, 4), d_q = buffer(&r, q_n, 0), d_k = buffer(&r, kv_n, 0), d_v = buffer(&r, kv_n, 0);
  clattn_backward_params bp = clattn_backward_params_default();
  bp.fwd = p;
  bp.d_out = dense(d_out, HQ, M, D), bp.d_q = dense(d_q, HQ, M, D), bp.d_k = dense(d_k, HKV, N, D),
  bp.d_v = dense(d_v, HKV, N, D);
  cl_mem grads[] = {d_q, d_k, d_v};
  const size_t grad_n[] = {q_n, kv_n, kv_n};
  print_hash(&r, "backward", clattn_backward(r.ctx, &bp, 0, NULL, NULL), grads, grad_n, 3);

  cl_mem kc = buffer(&r, cache_n, 5), vc = buffer(&r, cache_n, 6);
  const int32_t seqlens[B] = {30, 11};
  cl_int err;
  cl_mem lens = clCreateBuffer(clattn_cl_context(r.ctx), CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, sizeof seqlens,
                               (void *)seqlens, &err);
  cl_mem k_new = buffer(&r, B * HKV * 3 * D, 7), v_new = buffer(&r, B * HKV * 3 * D, 8);
  clattn_kvcache_params kp = clattn_kvcache_params_default();
  kp.attn = p;
  kp.attn.kv_len = CAP;
  kp.attn.k = dense(kc, HKV, CAP, D), kp.attn.v = dense(vc, HKV, CAP, D);
  kp.attn.lse.buf = NULL;
  kp.cache_seqlens = lens;
  kp.new_len = 3;
  kp.k_new = dense(k_new, HKV, 3, D), kp.v_new = dense(v_new, HKV, 3, D);
  cl_mem caches[] = {out, kc, vc};
  const size_t cache_sizes[] = {q_n, cache_n, cache_n};
  print_hash(&r, "forward_kvcache", clattn_forward_kvcache(r.ctx, &kp, 0, NULL, NULL), caches, cache_sizes, 3);

  clattn_append_params ap = clattn_append_params_default();
  ap.batch = B, ap.kv_heads = HKV, ap.new_len = 3, ap.head_dim = ap.value_dim = D, ap.capacity = CAP;
  ap.k_new = kp.k_new, ap.v_new = kp.v_new, ap.positions = lens, ap.k = kp.attn.k, ap.v = kp.attn.v;
  print_hash(&r, "kv_append", clattn_kv_append(r.ctx, &ap, 0, NULL, NULL), caches + 1, cache_sizes + 1, 2);

  clattn_merge_params mp;
  memset(&mp, 0, sizeof mp); /* struct_size 0, as callers zero it */
  mp.n_states = 2, mp.batch = B, mp.heads = HQ, mp.q_len = M, mp.value_dim = D;
  mp.o = dense(q, HQ, M, D), mp.lse = (clattn_tensor){d_out, 0, {HQ * M, M, 1, 0}};
  mp.o_state_stride = 0, mp.lse_state_stride = lse_n;
  mp.out = dense(out, HQ, M, D);
  print_hash(&r, "merge_states", clattn_merge_states(r.ctx, &mp, 0, NULL, NULL), outs, sizes, 1);

  cl_mem all[] = {q, k, v, out, lse, d_out, d_q, d_k, d_v, kc, vc, lens, k_new, v_new};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) clReleaseMemObject(all[i]);
  clattn_destroy(r.ctx);
  return r.failed;
}
