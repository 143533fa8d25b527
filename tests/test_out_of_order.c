/*
 * Calls on an out-of-order queue give bitwise the results of the same calls
 * on an in-order queue.
 *
 * Several chains of calls are enqueued, interleaved, behind one user event
 * on an embedded context whose queue runs out of order; each call waits
 * only on the previous call of its chain (its done event). A chain is an
 * engine's decode or prefill loop over a cache of its own, round after
 * round: clattn_kv_append of the round's new rows, clattn_forward over the
 * grown cache (one algorithm per chain), clattn_backward of that forward
 * (FA2 after FUSED and AUTO, the staged backward after STAGED and GEMM),
 * clattn_merge_states of this round's and the previous round's states. The
 * chains share the context's scratch pool, so a call reuses buffers that
 * another chain's pending call still has to use: only clattn's own ordering
 * keeps them apart. The same calls in the same order on the in-order queue
 * (the shared context) are the reference; every output and the caches must
 * match bit for bit, for chains of several lengths.
 */
#include <stdint.h>

#include "kit_checks.h"

enum { B = 1, HQ = 4, HKV = 2, D = 32, P0 = 520 }; /* P0 keys already cached: decode splits the keys */
enum { N_CHAINS = 5, N_CALLS = 4 };                /* calls per round: append, forward, backward, merge */

typedef struct {
  const char *name;
  clattn_algo algo; /* the forward's; the backward follows it */
  int rows;         /* new rows per round: appended, then queried */
} chain_kind;

static const chain_kind g_kinds[N_CHAINS] = {
    {"fused decode (split keys)", CLATTN_ALGO_FUSED, 1}, {"fused prefill (packed K/V)", CLATTN_ALGO_FUSED, 16},
    {"staged", CLATTN_ALGO_STAGED, 3},                   {"gemm", CLATTN_ALGO_GEMM, 4},
    {"auto", CLATTN_ALGO_AUTO, 1},
};

static uint64_t g_rng = 0x2545f4914f6cdd1dull;
static float urand(void) {
  g_rng ^= g_rng << 13;
  g_rng ^= g_rng >> 7;
  g_rng ^= g_rng << 17;
  return (float)((g_rng >> 11) % 2000001u) / 1000000.0f - 1.0f;
}

/* A chain's host inputs (the same for both queues). */
typedef struct {
  chain_kind kind;
  int rounds, cap; /* cap: cache rows per head */
  size_t q_n, new_n, cache_n, out_n, lse_n, dkv_n;
  float *q, *new_k, *new_v, *cache_k, *cache_v, *d_out;
} chain_host;

/* A chain's device buffers on one context. */
enum { C_CACHE_K, C_CACHE_V, C_OUT, C_LSE, C_DQ, C_DK, C_DV, C_MERGED, N_OUTPUTS };
static const char *const g_output_names[N_OUTPUTS] = {"k cache", "v cache", "out", "lse",
                                                      "d_q",     "d_k",     "d_v", "merged out"};
typedef struct {
  cl_mem q, new_k, new_v, d_out, *pos;
  cl_mem outputs[N_OUTPUTS];
  size_t bytes[N_OUTPUTS];
} chain_dev;

static float *fill(size_t n, int random) {
  float *x = malloc(n * sizeof *x);
  if (x)
    for (size_t i = 0; i < n; i++) x[i] = random ? urand() : NAN;
  return x;
}

static int host_init(chain_host *h, const chain_kind *kind, int rounds) {
  memset(h, 0, sizeof *h);
  h->kind = *kind;
  h->rounds = rounds;
  h->cap = P0 + rounds * kind->rows;
  const size_t m = (size_t)kind->rows;
  h->q_n = (size_t)rounds * B * HQ * m * D;
  h->new_n = (size_t)rounds * B * HKV * m * D;
  h->cache_n = (size_t)B * HKV * h->cap * D;
  h->out_n = h->q_n;
  h->lse_n = (size_t)rounds * B * HQ * m;
  h->dkv_n = (size_t)rounds * B * HKV * h->cap * D;
  h->q = fill(h->q_n, 1);
  h->new_k = fill(h->new_n, 1);
  h->new_v = fill(h->new_n, 1);
  h->d_out = fill((size_t)B * HQ * m * D, 1);
  /* the first P0 rows of each head cached, NaN past them (never read) */
  h->cache_k = fill(h->cache_n, 0);
  h->cache_v = fill(h->cache_n, 0);
  if (!h->q || !h->new_k || !h->new_v || !h->d_out || !h->cache_k || !h->cache_v) return -1;
  for (int hd = 0; hd < HKV; hd++)
    for (size_t i = 0; i < (size_t)P0 * D; i++) {
      h->cache_k[(size_t)hd * h->cap * D + i] = urand();
      h->cache_v[(size_t)hd * h->cap * D + i] = urand();
    }
  return 0;
}

static void host_free(chain_host *h) {
  free(h->q);
  free(h->new_k);
  free(h->new_v);
  free(h->cache_k);
  free(h->cache_v);
  free(h->d_out);
}

static cl_mem buffer(cl_context cc, size_t bytes, const void *host) {
  cl_int e = CL_SUCCESS;
  cl_mem m = clCreateBuffer(cc, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, bytes, (void *)host, &e);
  return e == CL_SUCCESS ? m : NULL;
}

static void dev_free(chain_dev *d, int rounds) {
  const cl_mem ins[] = {d->q, d->new_k, d->new_v, d->d_out};
  for (size_t i = 0; i < 4; i++)
    if (ins[i]) clReleaseMemObject(ins[i]);
  for (int i = 0; i < N_OUTPUTS; i++)
    if (d->outputs[i]) clReleaseMemObject(d->outputs[i]);
  for (int r = 0; d->pos && r < rounds; r++)
    if (d->pos[r]) clReleaseMemObject(d->pos[r]);
  free(d->pos);
  memset(d, 0, sizeof *d);
}

static int dev_init(chain_dev *d, const chain_host *h, cl_context cc) {
  memset(d, 0, sizeof *d);
  float *nan_out = fill(h->dkv_n > h->out_n ? h->dkv_n : h->out_n, 0);
  d->pos = calloc((size_t)h->rounds, sizeof *d->pos);
  if (!nan_out || !d->pos) {
    free(nan_out);
    return -1;
  }
  const size_t f = sizeof(float);
  d->q = buffer(cc, h->q_n * f, h->q);
  d->new_k = buffer(cc, h->new_n * f, h->new_k);
  d->new_v = buffer(cc, h->new_n * f, h->new_v);
  d->d_out = buffer(cc, (size_t)B * HQ * h->kind.rows * D * f, h->d_out);
  const size_t bytes[N_OUTPUTS] = {h->cache_n * f, h->cache_n * f, h->out_n * f, h->lse_n * f,
                                   h->q_n * f,     h->dkv_n * f,   h->dkv_n * f, h->out_n * f};
  const float *init[N_OUTPUTS] = {h->cache_k, h->cache_v, nan_out, nan_out, nan_out, nan_out, nan_out, nan_out};
  int ok = d->q && d->new_k && d->new_v && d->d_out;
  for (int i = 0; i < N_OUTPUTS; i++) {
    d->bytes[i] = bytes[i];
    ok &= (d->outputs[i] = buffer(cc, bytes[i], init[i])) != NULL;
  }
  for (int r = 0; r < h->rounds; r++) {
    const int32_t at = P0 + r * h->kind.rows;
    ok &= (d->pos[r] = buffer(cc, sizeof at, &at)) != NULL;
  }
  free(nan_out);
  return ok ? 0 : -1;
}

/* A [B, H, rows, D] view of round r's slot in a buffer of `rounds` such slots. */
static clattn_tensor slot(cl_mem buf, int heads, int rows, int r) {
  const size_t head = (size_t)rows * D, per = (size_t)B * heads * head;
  return (clattn_tensor){buf, (size_t)r * per, {(size_t)heads * head, head, D, 1}};
}

/* The forward of chain h's round r on its buffers d. */
static clattn_params forward_params(const chain_host *h, const chain_dev *d, int r) {
  const int m = h->kind.rows;
  clattn_params p = clattn_params_default();
  p.batch = B;
  p.q_heads = HQ;
  p.kv_heads = HKV;
  p.q_len = m;
  p.kv_len = P0 + (r + 1) * m;
  p.head_dim = p.value_dim = D;
  p.causal = 1;
  p.q = slot(d->q, HQ, m, r);
  p.k = slot(d->outputs[C_CACHE_K], HKV, h->cap, 0);
  p.v = slot(d->outputs[C_CACHE_V], HKV, h->cap, 0);
  p.out = slot(d->outputs[C_OUT], HQ, m, r);
  const size_t lse_per = (size_t)B * HQ * m;
  p.lse = (clattn_tensor){d->outputs[C_LSE], (size_t)r * lse_per, {(size_t)HQ * m, (size_t)m, 1, 0}};
  p.algo = h->kind.algo;
  return p;
}

/* Enqueues call `call` of chain h's round r after *prev (NULL: after gate);
 * *prev becomes its done event. */
static clattn_status enqueue_call(clattn_context *ctx, const chain_host *h, const chain_dev *d, int r, int call,
                                  cl_event gate, cl_event *prev) {
  const int m = h->kind.rows;
  cl_event wait = *prev ? *prev : gate, done = NULL;
  clattn_status st = CLATTN_OK;
  if (call == 0) {
    clattn_append_params ap = clattn_append_params_default();
    ap.batch = B;
    ap.kv_heads = HKV;
    ap.new_len = m;
    ap.head_dim = ap.value_dim = D;
    ap.k_new = slot(d->new_k, HKV, m, r);
    ap.v_new = slot(d->new_v, HKV, m, r);
    ap.positions = d->pos[r];
    ap.k = slot(d->outputs[C_CACHE_K], HKV, h->cap, 0);
    ap.v = slot(d->outputs[C_CACHE_V], HKV, h->cap, 0);
    ap.capacity = h->cap;
    st = clattn_kv_append(ctx, &ap, 1, &wait, &done);
  } else if (call == 1) {
    const clattn_params p = forward_params(h, d, r);
    st = clattn_forward(ctx, &p, 1, &wait, &done);
  } else if (call == 2) {
    clattn_backward_params bp = clattn_backward_params_default();
    bp.fwd = forward_params(h, d, r);
    bp.d_out = slot(d->d_out, HQ, m, 0);
    bp.d_q = slot(d->outputs[C_DQ], HQ, m, r);
    bp.d_k = slot(d->outputs[C_DK], HKV, h->cap, r);
    bp.d_v = slot(d->outputs[C_DV], HKV, h->cap, r);
    st = clattn_backward(ctx, &bp, 1, &wait, &done);
  } else if (r > 0) { /* this round's state and the last one's */
    const clattn_params p = forward_params(h, d, r - 1);
    clattn_merge_params mp = {0};
    mp.n_states = 2;
    mp.batch = B;
    mp.heads = HQ;
    mp.q_len = m;
    mp.value_dim = D;
    mp.o = p.out;
    mp.lse = p.lse;
    mp.o_state_stride = (size_t)B * HQ * m * D;
    mp.lse_state_stride = (size_t)B * HQ * m;
    mp.out = slot(d->outputs[C_MERGED], HQ, m, r);
    mp.empty_rows = CLATTN_EMPTY_ZERO;
    st = clattn_merge_states(ctx, &mp, 1, &wait, &done);
  } else {
    return CLATTN_OK; /* round 0 has nothing to merge */
  }
  if (st == CLATTN_OK) {
    if (*prev) clReleaseEvent(*prev);
    *prev = done;
  }
  return st;
}

/* Runs every chain on ctx behind one user event, interleaved call by call,
 * and reads every output back into got[chain][output]. 0, or -1 (recorded). */
static int run_chains(clattn_context *ctx, const chain_host *hosts, int rounds, unsigned char *got[][N_OUTPUTS]) {
  chain_dev dev[N_CHAINS];
  cl_event last[N_CHAINS] = {NULL};
  memset(dev, 0, sizeof dev);
  const cl_context cc = clattn_cl_context(ctx);
  int rc = -1;
  cl_int e = CL_SUCCESS;
  cl_event gate = clCreateUserEvent(cc, &e);
  if (!CHECKF(e == CL_SUCCESS, "clCreateUserEvent: %s", cp_cl_error_name(e))) return -1;
  for (int c = 0; c < N_CHAINS; c++)
    if (!CHECKF(dev_init(&dev[c], &hosts[c], cc) == 0, "device buffers of chain %s", hosts[c].kind.name)) goto out;
  for (int r = 0; r < rounds; r++)
    for (int call = 0; call < N_CALLS; call++)
      for (int c = 0; c < N_CHAINS; c++) {
        const clattn_status st = enqueue_call(ctx, &hosts[c], &dev[c], r, call, gate, &last[c]);
        if (!CHECKF(st == CLATTN_OK, "chain %s, round %d, call %d: %s: %s", hosts[c].kind.name, r, call,
                    clattn_status_string(st), clattn_last_error(ctx))) {
          clSetUserEventStatus(gate, CL_COMPLETE);
          goto out;
        }
      }
  clSetUserEventStatus(gate, CL_COMPLETE);
  if (!CHECK(clWaitForEvents(N_CHAINS, last) == CL_SUCCESS) || !CHECK(clFinish(clattn_cl_queue(ctx)) == CL_SUCCESS))
    goto out;
  for (int c = 0; c < N_CHAINS; c++)
    for (int i = 0; i < N_OUTPUTS; i++)
      if (!CHECK(clEnqueueReadBuffer(clattn_cl_queue(ctx), dev[c].outputs[i], CL_TRUE, 0, dev[c].bytes[i], got[c][i],
                                     0, NULL, NULL) == CL_SUCCESS))
        goto out;
  rc = 0;
out:
  clFinish(clattn_cl_queue(ctx));
  for (int c = 0; c < N_CHAINS; c++) {
    if (last[c]) clReleaseEvent(last[c]);
    dev_free(&dev[c], rounds);
  }
  clReleaseEvent(gate);
  return rc;
}

static size_t output_bytes(const chain_host *h, int i) {
  const size_t n[N_OUTPUTS] = {h->cache_n, h->cache_n, h->out_n, h->lse_n, h->q_n, h->dkv_n, h->dkv_n, h->out_n};
  return n[i] * sizeof(float);
}

/* Whether every round wrote finite outputs (the in-order run, so the
 * comparison is not of two untouched buffers). */
static int all_finite(const float *x, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (!isfinite(x[i])) return 0;
  return 1;
}

static void chains_match_in_order(clattn_context *ooo, int rounds) {
  chain_host hosts[N_CHAINS];
  unsigned char *want[N_CHAINS][N_OUTPUTS], *got[N_CHAINS][N_OUTPUTS];
  memset(want, 0, sizeof want);
  memset(got, 0, sizeof got);
  int ok = 1;
  for (int c = 0; c < N_CHAINS; c++) {
    ok &= host_init(&hosts[c], &g_kinds[c], rounds) == 0;
    for (int i = 0; ok && i < N_OUTPUTS; i++) {
      want[c][i] = malloc(output_bytes(&hosts[c], i));
      got[c][i] = malloc(output_bytes(&hosts[c], i));
      ok &= want[c][i] && got[c][i];
    }
  }
  if (CHECKF(ok, "host memory") && run_chains(ct_context(), hosts, rounds, want) == 0 &&
      run_chains(ooo, hosts, rounds, got) == 0) {
    int wrong = 0;
    for (int c = 0; c < N_CHAINS; c++) {
      const chain_host *h = &hosts[c];
      const size_t out_round = h->out_n / (size_t)rounds;
      CHECKF(all_finite((const float *)want[c][C_OUT], h->out_n) &&
                 all_finite((const float *)want[c][C_DQ], h->q_n) &&
                 all_finite((const float *)want[c][C_MERGED] + out_round, h->out_n - out_round),
             "chain %s: the in-order run left outputs unwritten", h->kind.name);
      for (int i = 0; i < N_OUTPUTS; i++) {
        const size_t n = output_bytes(h, i) / sizeof(float);
        const uint32_t *a = (const uint32_t *)want[c][i], *b = (const uint32_t *)got[c][i];
        size_t first = n, count = 0;
        for (size_t j = 0; j < n; j++)
          if (a[j] != b[j]) {
            if (first == n) first = j;
            count++;
          }
        wrong += count > 0;
        CHECKF(count == 0,
               "rounds %d, chain %s: %s differs from the in-order run in %zu of %zu floats (first at %zu: %g, "
               "in order %g)",
               rounds, h->kind.name, g_output_names[i], count, n, first, first < n ? ((const float *)b)[first] : 0.0,
               first < n ? ((const float *)a)[first] : 0.0);
      }
    }
    if (!wrong)
      printf("  %d chains of %d rounds (%d calls): bitwise equal to the in-order queue\n", N_CHAINS, rounds,
             N_CHAINS * (rounds * N_CALLS - 1));
  }
  for (int c = 0; c < N_CHAINS; c++) {
    host_free(&hosts[c]);
    for (int i = 0; i < N_OUTPUTS; i++) {
      free(want[c][i]);
      free(got[c][i]);
    }
  }
}

static void out_of_order_chains_equal_in_order_bitwise(void) {
  clattn_context *ooo = kc_out_of_order_context();
  static const int lengths[] = {1, 3, 8};
  for (size_t i = 0; ooo && i < sizeof lengths / sizeof lengths[0]; i++) chains_match_in_order(ooo, lengths[i]);
  clattn_destroy(ooo);
}

int main(int argc, char **argv) {
  static const ct_test tests[] = {
      CT_TEST(out_of_order_chains_equal_in_order_bitwise),
  };
  return ct_main(argc, argv, tests, sizeof tests / sizeof tests[0]);
}
