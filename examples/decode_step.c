/*
 * An engine's decode step in one call: clattn_forward_kvcache, as
 * FlashAttention's flash_attn_with_kvcache. Each call rotates the new
 * tokens' keys and the queries (RoPE, GPT-NeoX pairs over the first ROT
 * dims), appends the keys and values to an F16 cache at each sequence's
 * length, and attends over the cache, causal: a chunked prefill of the
 * prompt (new_len = q_len = PROMPT), then one token per step.
 *
 * The cache is contiguous, [SLOTS, HKV, CAP, D]: the two sequences sit in
 * slots 2 and 0 (cache_batch_idx), as an engine's slot allocator leaves
 * them. q, the new rows and out are f32. Every step is checked against an
 * fp64 attention on the host over a host copy of the cache (an engine
 * would not do this: it makes the example a test, tests/meson.build runs
 * it).
 */
#include <clattn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "problem.h" /* cp_f16_bits, cp_f16_value: the cache's f16 rounding on the host */

enum { B = 2, SLOTS = 3, HQ = 4, HKV = 2, D = 64, ROT = 32, CAP = 96, PROMPT = 7, STEPS = 16 };

static float frand(void) { return (float)rand() / (float)RAND_MAX * 2.0f - 1.0f; }

#define TRY_CL(call, what)                                              \
  do {                                                                  \
    cl_int e_ = (call);                                                 \
    if (e_ != CL_SUCCESS) {                                             \
      fprintf(stderr, "%s failed: OpenCL error %d\n", (what), (int)e_); \
      goto done;                                                        \
    }                                                                   \
  } while (0)

/* One step's call: m new rows per sequence, q_len m. */
static clattn_kvcache_params step_params(int m, cl_mem q, cl_mem k_new, cl_mem v_new, cl_mem out, cl_mem k_cache,
                                         cl_mem v_cache, cl_mem seqlens, cl_mem slots, cl_mem cos, cl_mem sin) {
  clattn_kvcache_params kp = clattn_kvcache_params_default();
  clattn_params *a = &kp.attn; /* the attention after the append, as clattn_forward takes it */
  a->batch = B;
  a->q_heads = HQ;
  a->kv_heads = HKV;
  a->q_len = m;
  a->kv_len = CAP; /* the cache's capacity: each row's length comes from cache_seqlens + new_len */
  a->head_dim = a->value_dim = D;
  a->q = (clattn_tensor){q, 0, {(size_t)HQ * m * D, (size_t)m * D, D, 1}};
  a->out = (clattn_tensor){out, 0, {(size_t)HQ * m * D, (size_t)m * D, D, 1}};
  a->kv_dtype = CLATTN_F16;
  a->k = (clattn_tensor){k_cache, 0, {(size_t)HKV * CAP * D, (size_t)CAP * D, D, 1}};
  a->v = (clattn_tensor){v_cache, 0, {(size_t)HKV * CAP * D, (size_t)CAP * D, D, 1}};
  a->causal = 1;
  kp.cache_seqlens = seqlens; /* int32 [B]: rows in use before the step */
  kp.new_len = m;
  kp.k_new = (clattn_tensor){k_new, 0, {(size_t)HKV * m * D, (size_t)m * D, D, 1}};
  kp.v_new = (clattn_tensor){v_new, 0, {(size_t)HKV * m * D, (size_t)m * D, D, 1}};
  kp.cache_batch_idx = slots; /* int32 [B]: the slot each sequence uses */
  kp.num_slots = SLOTS;
  kp.rotary_cos = (clattn_tensor){cos, 0, {0, 0, ROT / 2, 1}}; /* [position][t] */
  kp.rotary_sin = (clattn_tensor){sin, 0, {0, 0, ROT / 2, 1}};
  kp.rotary_dim = ROT;
  kp.rotary_len = CAP;
  kp.rotary_interleaved = 0; /* GPT-NeoX: (x[t], x[t + ROT/2]) */
  return kp;
}

/* x rotated at position pos, as clattn does (f32, each product rounded). */
static void rotate(const float *x, int pos, const float *cos, const float *sin, float *y) {
  for (int i = 0; i < D; i++) y[i] = x[i];
  for (int t = 0; t < ROT / 2; t++) {
    const float c = cos[pos * (ROT / 2) + t], s = sin[pos * (ROT / 2) + t], a = x[t], b = x[t + ROT / 2];
    y[t] = a * c - b * s;
    y[t + ROT / 2] = a * s + b * c;
  }
}

int main(void) {
  static float cos_t[CAP * ROT / 2], sin_t[CAP * ROT / 2];
  static float q[B * HQ * PROMPT * D], kn[B * HKV * PROMPT * D], vn[B * HKV * PROMPT * D], out[B * HQ * PROMPT * D];
  static float host_k[B][HKV][CAP][D], host_v[B][HKV][CAP][D]; /* the cache on the host, in f32 */
  static unsigned short zeros[SLOTS * HKV * CAP * D];
  const cl_int slots_h[B] = {2, 0};
  for (int p = 0; p < CAP; p++)
    for (int t = 0; t < ROT / 2; t++) {
      const double angle = p * pow(10000.0, -2.0 * t / ROT);
      cos_t[p * (ROT / 2) + t] = (float)cos(angle);
      sin_t[p * (ROT / 2) + t] = (float)sin(angle);
    }
  int rc = 1;
  clattn_context *ctx = NULL;
  cl_mem bufs[10] = {NULL};
  clattn_status st = clattn_create(NULL, &ctx);
  if (st != CLATTN_OK) {
    fprintf(stderr, "clattn_create: %s: %s\n", clattn_status_string(st), clattn_last_error(NULL));
    return st == CLATTN_ERR_NO_DEVICE ? 77 : 1;
  }
  cl_context cx = clattn_cl_context(ctx);
  cl_command_queue queue = clattn_cl_queue(ctx);
  const cl_mem_flags copy = CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR;
  const size_t sizes[10] = {sizeof q,     sizeof kn,          sizeof vn,      sizeof out,   sizeof zeros,
                            sizeof zeros, B * sizeof(cl_int), sizeof slots_h, sizeof cos_t, sizeof sin_t};
  void *init[10] = {NULL, NULL, NULL, NULL, zeros, zeros, NULL, (void *)slots_h, cos_t, sin_t};
  for (int i = 0; i < 10; i++) {
    cl_int e;
    bufs[i] = clCreateBuffer(cx, init[i] ? copy : CL_MEM_READ_WRITE, sizes[i], init[i], &e);
    TRY_CL(e, "clCreateBuffer");
  }
  double worst = 0.0;
  int len = 0; /* rows in use in each sequence's slot */
  for (int step = 0; step <= STEPS; step++) {
    const int m = step == 0 ? PROMPT : 1; /* the prompt in one chunk, then a token per step */
    for (int i = 0; i < B * HQ * m * D; i++) q[i] = frand();
    for (int i = 0; i < B * HKV * m * D; i++) kn[i] = frand(), vn[i] = frand();
    const cl_int seqlens_h[B] = {len, len};
    TRY_CL(clEnqueueWriteBuffer(queue, bufs[0], CL_FALSE, 0, sizeof q, q, 0, NULL, NULL), "write q");
    TRY_CL(clEnqueueWriteBuffer(queue, bufs[1], CL_FALSE, 0, sizeof kn, kn, 0, NULL, NULL), "write k");
    TRY_CL(clEnqueueWriteBuffer(queue, bufs[2], CL_FALSE, 0, sizeof vn, vn, 0, NULL, NULL), "write v");
    TRY_CL(clEnqueueWriteBuffer(queue, bufs[6], CL_TRUE, 0, sizeof seqlens_h, seqlens_h, 0, NULL, NULL),
           "write cache_seqlens");
    clattn_kvcache_params kp =
        step_params(m, bufs[0], bufs[1], bufs[2], bufs[3], bufs[4], bufs[5], bufs[6], bufs[7], bufs[8], bufs[9]);
    st = clattn_forward_kvcache(ctx, &kp, 0, NULL, NULL);
    if (st != CLATTN_OK) {
      fprintf(stderr, "clattn_forward_kvcache: %s: %s\n", clattn_status_string(st), clattn_last_error(ctx));
      goto done;
    }
    TRY_CL(clEnqueueReadBuffer(queue, bufs[3], CL_TRUE, 0, sizeof out, out, 0, NULL, NULL), "read out");

    /* the check: the host's cache after the append, then fp64 attention */
    float row[D];
    for (int b = 0; b < B; b++)
      for (int h = 0; h < HKV; h++)
        for (int r = 0; r < m; r++) {
          rotate(&kn[((b * HKV + h) * m + r) * D], len + r, cos_t, sin_t, row);
          for (int i = 0; i < D; i++) {
            host_k[b][h][len + r][i] = cp_f16_value(cp_f16_bits(row[i]));
            host_v[b][h][len + r][i] = cp_f16_value(cp_f16_bits(vn[((b * HKV + h) * m + r) * D + i]));
          }
        }
    for (int b = 0; b < B; b++)
      for (int h = 0; h < HQ; h++)
        for (int i = 0; i < m; i++) {
          float qr[D];
          double w[CAP], sum = 0.0, mx = -INFINITY;
          const int n = len + i + 1; /* causal: the keys up to the query's own position */
          rotate(&q[((b * HQ + h) * m + i) * D], len + i, cos_t, sin_t, qr);
          for (int j = 0; j < n; j++) {
            double s = 0.0;
            for (int c = 0; c < D; c++) s += (double)qr[c] * host_k[b][h / (HQ / HKV)][j][c];
            w[j] = s / sqrt((double)D);
            mx = fmax(mx, w[j]);
          }
          for (int j = 0; j < n; j++) sum += w[j] = exp(w[j] - mx);
          for (int c = 0; c < D; c++) {
            double o = 0.0;
            for (int j = 0; j < n; j++) o += w[j] / sum * host_v[b][h / (HQ / HKV)][j][c];
            worst = fmax(worst, fabs(o - out[((b * HQ + h) * m + i) * D + c]));
          }
        }
    len += m;
  }
  printf(
      "%d steps (a prompt of %d, then one token each) over slots %d and %d: largest difference from the fp64 "
      "reference %.2g\n",
      STEPS + 1, PROMPT, (int)slots_h[0], (int)slots_h[1], worst);
  rc = worst <= 1e-4 ? 0 : 1;
done:
  for (int i = 0; i < 10; i++)
    if (bufs[i]) clReleaseMemObject(bufs[i]);
  clattn_destroy(ctx);
  return rc;
}
