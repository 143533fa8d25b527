/*
 * An inference engine's decode loop with clattn: a two-layer toy decoder
 * (random weights, no MLP: embedding -> per layer x += Attn(x Wq, x Wk, x Wv) Wo
 * -> logits = x Wout, greedy) over a PAGED Q8_0 K/V cache, the layout
 * vLLM / llama.cpp engines keep:
 *
 *   prefill:  project the prompt, clattn_kv_append its K/V rows into the
 *             pages, clattn_forward causal over them;
 *   decode:   per step and layer, project the new token, clattn_kv_append
 *             one row per sequence at its position, then the layer's plan:
 *             clattn_plan_enqueue of an attention call with q_len 1 over
 *             kv_lens[b] keys through the block table, checked and prepared
 *             once (clattn_plan_create before the loop). The plan's kv_len
 *             is the cache's capacity and the kv_lens buffer carries each
 *             sequence's length, so every step enqueues the plan as made.
 *
 * Projections are CLBlast GEMMs on the same queue; nothing but the logits
 * (and, for the check, the cache) comes back to the host. Every attention
 * call is checked against clattn's fp64 reference over the dequantised
 * cache (tools/reference/reference.c), which is what an engine would not do: it is here
 * so the example is also a test (tests/meson.build runs it).
 *
 * Two sequences share the pool: pages are handed out in a shuffled order,
 * and the block table maps each sequence's logical pages to them.
 */
#include <clattn.h>
#include <clblast_c.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "problem.h"   /* cp_f16_value: the f16 scale of a Q8_0 block */
#include "reference.h" /* the fp64 reference */

enum {
  B = 2, /* sequences decoded together */
  LAYERS = 2,
  DM = 128, /* model width */
  HQ = 4,
  HKV = 2, /* GQA: two query heads per KV head */
  DH = 32, /* head dim: a multiple of 32 for Q8_0 */
  VOCAB = 257,
  PROMPT = 23,
  STEPS = 64,
  PAGE = 16, /* keys per page */
  PAGES_PER_SEQ = (PROMPT + STEPS + PAGE - 1) / PAGE,
  POOL = B * PAGES_PER_SEQ + 1, /* one page never handed out */
  ROW_BYTES = DH / 32 * 34,     /* one key row: DH / 32 Q8_0 blocks */
};

static float frand(void) { return (float)rand() / (float)RAND_MAX * 2.0f - 1.0f; }

#define TRY_CL(call, what)                                              \
  do {                                                                  \
    cl_int e_ = (call);                                                 \
    if (e_ != CL_SUCCESS) {                                             \
      fprintf(stderr, "%s failed: OpenCL error %d\n", (what), (int)e_); \
      goto done;                                                        \
    }                                                                   \
  } while (0)
#define TRY_ATTN(call, what)                                                                     \
  do {                                                                                           \
    clattn_status s_ = (call);                                                                   \
    if (s_ != CLATTN_OK) {                                                                       \
      fprintf(stderr, "%s: %s: %s\n", (what), clattn_status_string(s_), clattn_last_error(ctx)); \
      goto done;                                                                                 \
    }                                                                                            \
  } while (0)
#define TRY_BLAST(call, what)                                             \
  do {                                                                    \
    CLBlastStatusCode c_ = (call);                                        \
    if (c_ != CLBlastSuccess) {                                           \
      fprintf(stderr, "%s failed: CLBlast status %d\n", (what), (int)c_); \
      goto done;                                                          \
    }                                                                     \
  } while (0)

/* C[m x n] = A[m x k] W[k x n] + beta C, row-major, on the queue. */
static CLBlastStatusCode matmul(cl_command_queue *queue, size_t m, size_t n, size_t k, cl_mem a, cl_mem w, size_t w_off,
                                float beta, cl_mem c) {
  return CLBlastSgemm(CLBlastLayoutRowMajor, CLBlastTransposeNo, CLBlastTransposeNo, m, n, k, 1.0f, a, 0, k, w, w_off,
                      n, beta, c, 0, n, queue, NULL);
}

/* Dequantised element c of key row (page, head, row) of a Q8_0 cache copy. */
static float q8_0_value(const unsigned char *cache, int page, int head, int row, int c) {
  const unsigned char *blk = cache + (((size_t)page * HKV + head) * PAGE + row) * ROW_BYTES + (size_t)(c / 32) * 34;
  uint16_t d;
  memcpy(&d, blk, 2);
  return cp_f16_value(d) * (float)(int8_t)blk[2 + c % 32];
}

/* The attention just computed (q_len rows per sequence, lens[b] keys)
 * against the fp64 reference over the dequantised cache; returns the
 * largest norm-wise relative error over the sequences. */
static double check_attention(cl_command_queue queue, cl_mem q_buf, cl_mem attn_buf, cl_mem k_cache, cl_mem v_cache,
                              const int32_t *table, const int32_t *lens, int q_len, int *failed) {
  const size_t nq = (size_t)B * q_len * HQ * DH, cache_bytes = (size_t)POOL * HKV * PAGE * ROW_BYTES;
  float *q = malloc(nq * sizeof *q), *attn = malloc(nq * sizeof *attn);
  unsigned char *kc = malloc(cache_bytes), *vc = malloc(cache_bytes);
  float *k = malloc((size_t)HKV * PAGES_PER_SEQ * PAGE * DH * sizeof *k);
  float *v = malloc((size_t)HKV * PAGES_PER_SEQ * PAGE * DH * sizeof *v);
  double *ref = malloc((size_t)HQ * q_len * DH * sizeof *ref), worst = 0.0;
  *failed = 1;
  if (!q || !attn || !kc || !vc || !k || !v || !ref ||
      clEnqueueReadBuffer(queue, q_buf, CL_TRUE, 0, nq * sizeof *q, q, 0, NULL, NULL) != CL_SUCCESS ||
      clEnqueueReadBuffer(queue, attn_buf, CL_TRUE, 0, nq * sizeof *attn, attn, 0, NULL, NULL) != CL_SUCCESS ||
      clEnqueueReadBuffer(queue, k_cache, CL_TRUE, 0, cache_bytes, kc, 0, NULL, NULL) != CL_SUCCESS ||
      clEnqueueReadBuffer(queue, v_cache, CL_TRUE, 0, cache_bytes, vc, 0, NULL, NULL) != CL_SUCCESS)
    goto out;
  for (int b = 0; b < B; b++) {
    const int n = lens[b];
    for (int h = 0; h < HKV; h++)
      for (int j = 0; j < n; j++)
        for (int c = 0; c < DH; c++) {
          const int page = table[b * PAGES_PER_SEQ + j / PAGE];
          k[((size_t)h * n + j) * DH + c] = q8_0_value(kc, page, h, j % PAGE, c);
          v[((size_t)h * n + j) * DH + c] = q8_0_value(vc, page, h, j % PAGE, c);
        }
    clattn_params rp = clattn_params_default(); /* the reference's view of sequence b */
    rp.batch = 1;
    rp.q_heads = HQ;
    rp.kv_heads = HKV;
    rp.q_len = q_len;
    rp.kv_len = n;
    rp.head_dim = rp.value_dim = DH;
    rp.causal = 1;
    const size_t act = (size_t)HQ * DH; /* activations: row (b, i) holds every head */
    rp.q = (clattn_tensor){NULL, (size_t)b * q_len * act, {0, DH, act, 1}};
    rp.k = (clattn_tensor){NULL, 0, {0, (size_t)n * DH, DH, 1}};
    rp.v = rp.k;
    ref_inputs in = {.q = q, .k = k, .v = v};
    ref_outputs o = {.out = ref};
    if (ref_forward(&rp, &in, &o) != 0) goto out;
    double num = 0.0, den = 0.0;
    for (int h = 0; h < HQ; h++)
      for (int i = 0; i < q_len; i++)
        for (int c = 0; c < DH; c++) {
          const double r = ref[((size_t)h * q_len + i) * DH + c];
          const double x = attn[((size_t)b * q_len + i) * act + (size_t)h * DH + c];
          num += (x - r) * (x - r);
          den += r * r;
        }
    const double err = sqrt(num) / fmax(sqrt(den), 1e-30);
    worst = isnan(err) ? INFINITY : fmax(worst, err);
  }
  *failed = 0;
out:
  free(q);
  free(attn);
  free(kc);
  free(vc);
  free(k);
  free(v);
  free(ref);
  return worst;
}

/* One layer's attention call over m new rows per sequence: q and out are
 * the projections' rows (b, i) holding every head, k and v the layer's
 * paged Q8_0 cache ([page, kv head, row, block], in bytes), kv_lens each
 * sequence's length (causal aligns the new rows at its end), kv_len the
 * cache's capacity (an upper bound of kv_lens). */
static clattn_params layer_attention(int m, cl_mem q, cl_mem out, cl_mem k_cache, cl_mem v_cache, cl_mem table,
                                     cl_mem kv_lens) {
  const size_t act_q = (size_t)HQ * DH;
  const clattn_tensor cache_view = {NULL, 0, {(size_t)HKV * PAGE * ROW_BYTES, (size_t)PAGE * ROW_BYTES, ROW_BYTES, 34}};
  clattn_params p = clattn_params_default();
  p.batch = B;
  p.q_heads = HQ;
  p.kv_heads = HKV;
  p.q_len = m;
  p.kv_len = PAGES_PER_SEQ * PAGE;
  p.head_dim = p.value_dim = DH;
  p.q = (clattn_tensor){q, 0, {(size_t)m * act_q, DH, act_q, 1}};
  p.out = (clattn_tensor){out, 0, {(size_t)m * act_q, DH, act_q, 1}};
  p.kv_dtype = CLATTN_Q8_0;
  p.k = cache_view;
  p.k.buf = k_cache;
  p.v = cache_view;
  p.v.buf = v_cache;
  p.block_table = table;
  p.block_table_stride = PAGES_PER_SEQ;
  p.page_size = PAGE;
  p.num_pages = POOL;
  p.kv_lens = kv_lens;
  p.causal = 1;
  return p;
}

int main(void) {
  clattn_context *ctx = NULL;
  if (clattn_create(NULL, &ctx) != CLATTN_OK) {
    fprintf(stderr, "clattn_create: %s\n", clattn_last_error(NULL));
    return 77; /* no device: skipped */
  }
  cl_context cl = clattn_cl_context(ctx);
  cl_command_queue queue = clattn_cl_queue(ctx);
  int status = 1, generated = 0, failed = 0;
  double worst = 0.0;
  srand(13);

  /* weights: embedding, per layer Wq, Wk, Wv, Wo, then Wout */
  const size_t n_embed = (size_t)VOCAB * DM, n_q = (size_t)DM * HQ * DH, n_kv = (size_t)DM * HKV * DH;
  const size_t n_layer = 2 * n_q + 2 * n_kv, n_out = (size_t)DM * VOCAB;
  const size_t n_weights = n_embed + LAYERS * n_layer + n_out;
  float *w = malloc(n_weights * sizeof *w), *logits = malloc((size_t)B * VOCAB * sizeof *logits);
  cl_mem weights = NULL, x = NULL, qp = NULL, kp = NULL, vp = NULL, attn = NULL, positions = NULL, kv_lens = NULL;
  cl_mem table_buf = NULL, k_cache[LAYERS] = {NULL}, v_cache[LAYERS] = {NULL};
  clattn_plan *plans[LAYERS] = {NULL};
  if (!w || !logits) goto done;
  for (size_t i = 0; i < n_weights; i++) w[i] = frand() / sqrtf((float)DM) * (i < n_embed ? 8.0f : 1.0f);
  const size_t rows_max = (size_t)B * PROMPT; /* activation rows: (sequence, token) */
  cl_int err = CL_SUCCESS;
#define BUFFER(var, bytes, host)                                                                                \
  var = clCreateBuffer(cl, CL_MEM_READ_WRITE | (host != NULL ? CL_MEM_COPY_HOST_PTR : 0), (bytes), host, &err); \
  TRY_CL(err, "clCreateBuffer(" #var ")")
  const float *weights_host = w;
  BUFFER(weights, n_weights * sizeof *w, (void *)weights_host);
  BUFFER(x, rows_max * DM * sizeof(float), NULL);
  BUFFER(qp, rows_max * HQ * DH * sizeof(float), NULL);
  BUFFER(kp, rows_max * HKV * DH * sizeof(float), NULL);
  BUFFER(vp, rows_max * HKV * DH * sizeof(float), NULL);
  BUFFER(attn, rows_max * HQ * DH * sizeof(float), NULL);
  BUFFER(positions, B * sizeof(int32_t), NULL);
  BUFFER(kv_lens, B * sizeof(int32_t), NULL);
  /* the page pool (per layer) and one block table for both layers: pages
   * handed out in a shuffled order, page POOL - 1 never used */
  int32_t table[B * PAGES_PER_SEQ];
  for (int i = 0; i < B * PAGES_PER_SEQ; i++) table[i] = (i * 5 + 3) % (POOL - 1);
  const int32_t *table_host = table;
  BUFFER(table_buf, sizeof table, (void *)table_host);
  for (int l = 0; l < LAYERS; l++) {
    BUFFER(k_cache[l], (size_t)POOL * HKV * PAGE * ROW_BYTES, NULL);
    BUFFER(v_cache[l], (size_t)POOL * HKV * PAGE * ROW_BYTES, NULL);
  }

  /* prompts: random tokens; x = their embeddings */
  int tokens[B][PROMPT + STEPS];
  for (int b = 0; b < B; b++)
    for (int i = 0; i < PROMPT; i++) tokens[b][i] = rand() % VOCAB;
  for (int b = 0; b < B; b++)
    for (int i = 0; i < PROMPT; i++)
      TRY_CL(clEnqueueCopyBuffer(queue, weights, x, (size_t)tokens[b][i] * DM * sizeof(float),
                                 ((size_t)b * PROMPT + i) * DM * sizeof(float), DM * sizeof(float), 0, NULL, NULL),
             "clEnqueueCopyBuffer(embedding)");

  /* the attention call of each layer: prefill (the prompt's rows, once)
   * through clattn_forward, decode (one row per sequence) through a plan */
  clattn_params prefill[LAYERS], decode[LAYERS];
  for (int l = 0; l < LAYERS; l++) {
    prefill[l] = layer_attention(PROMPT, qp, attn, k_cache[l], v_cache[l], table_buf, kv_lens);
    decode[l] = layer_attention(1, qp, attn, k_cache[l], v_cache[l], table_buf, kv_lens);
    TRY_ATTN(clattn_plan_create(ctx, &decode[l], &plans[l]), "clattn_plan_create");
  }

  int32_t pos[B] = {0, 0}, lens[B];
  for (int step = 0; step <= STEPS; step++) {
    const int m = step == 0 ? PROMPT : 1; /* new tokens per sequence */
    for (int b = 0; b < B; b++) lens[b] = pos[b] + m;
    TRY_CL(clEnqueueWriteBuffer(queue, positions, CL_FALSE, 0, sizeof pos, pos, 0, NULL, NULL), "write positions");
    TRY_CL(clEnqueueWriteBuffer(queue, kv_lens, CL_FALSE, 0, sizeof lens, lens, 0, NULL, NULL), "write kv_lens");
    const size_t rows = (size_t)B * m, act_q = (size_t)HQ * DH, act_kv = (size_t)HKV * DH;
    for (int l = 0; l < LAYERS; l++) {
      const size_t wl = n_embed + (size_t)l * n_layer;
      TRY_BLAST(matmul(&queue, rows, act_q, DM, x, weights, wl, 0.0f, qp), "x Wq");
      TRY_BLAST(matmul(&queue, rows, act_kv, DM, x, weights, wl + n_q, 0.0f, kp), "x Wk");
      TRY_BLAST(matmul(&queue, rows, act_kv, DM, x, weights, wl + n_q + n_kv, 0.0f, vp), "x Wv");

      const clattn_params *p = step == 0 ? &prefill[l] : &decode[l];
      clattn_append_params ap = clattn_append_params_default();
      ap.batch = B;
      ap.kv_heads = HKV;
      ap.new_len = m;
      ap.head_dim = ap.value_dim = DH;
      ap.src_dtype = CLATTN_F32;
      ap.k_new = (clattn_tensor){kp, 0, {(size_t)m * act_kv, DH, act_kv, 1}}; /* row (b, i) holds every head */
      ap.v_new = (clattn_tensor){vp, 0, {(size_t)m * act_kv, DH, act_kv, 1}};
      ap.positions = positions;
      ap.kv_dtype = CLATTN_Q8_0; /* the cache as the attention call describes it */
      ap.k = p->k;
      ap.v = p->v;
      ap.block_table = table_buf;
      ap.block_table_stride = PAGES_PER_SEQ;
      ap.page_size = PAGE;
      ap.num_pages = POOL;
      TRY_ATTN(clattn_kv_append(ctx, &ap, 0, NULL, NULL), "clattn_kv_append");
      if (step == 0)
        TRY_ATTN(clattn_forward(ctx, p, 0, NULL, NULL), "clattn_forward");
      else
        TRY_ATTN(clattn_plan_enqueue(plans[l], NULL, 0, NULL, NULL), "clattn_plan_enqueue");

      int bad = 0;
      const double e = check_attention(queue, qp, attn, k_cache[l], v_cache[l], table, lens, m, &bad);
      if (bad) {
        fprintf(stderr, "step %d layer %d: the reference check could not run\n", step, l);
        goto done;
      }
      worst = fmax(worst, e);
      if (!(e <= 1e-4)) {
        fprintf(stderr, "step %d layer %d: attention differs from the fp64 reference (rel err %.3g)\n", step, l, e);
        failed = 1;
      }
      /* x += attn Wo */
      TRY_BLAST(matmul(&queue, rows, DM, act_q, attn, weights, wl + n_q + 2 * n_kv, 1.0f, x), "attn Wo");
    }
    for (int b = 0; b < B; b++) pos[b] = lens[b];
    if (step == STEPS) break;
    /* logits of each sequence's last row; greedy next token into x's first rows */
    for (int b = 0; b < B; b++)
      TRY_BLAST(CLBlastSgemm(CLBlastLayoutRowMajor, CLBlastTransposeNo, CLBlastTransposeNo, 1, VOCAB, DM, 1.0f, x,
                             ((size_t)b * m + m - 1) * DM, DM, weights, n_embed + LAYERS * n_layer, VOCAB, 0.0f, attn,
                             (size_t)b * VOCAB, VOCAB, &queue, NULL),
                "x Wout");
    TRY_CL(clEnqueueReadBuffer(queue, attn, CL_TRUE, 0, (size_t)B * VOCAB * sizeof(float), logits, 0, NULL, NULL),
           "read logits");
    for (int b = 0; b < B; b++) {
      int best = 0;
      for (int t = 1; t < VOCAB; t++)
        if (logits[(size_t)b * VOCAB + t] > logits[(size_t)b * VOCAB + best]) best = t;
      tokens[b][PROMPT + step] = best;
      TRY_CL(clEnqueueCopyBuffer(queue, weights, x, (size_t)best * DM * sizeof(float), (size_t)b * DM * sizeof(float),
                                 DM * sizeof(float), 0, NULL, NULL),
             "clEnqueueCopyBuffer(next token)");
    }
    generated++;
  }
  printf("decode_loop: %d sequences, prompt %d, generated %d tokens each over a paged Q8_0 cache (%d pages of %d)\n", B,
         PROMPT, generated, POOL, PAGE);
  for (int b = 0; b < B; b++) {
    printf("  sequence %d:", b);
    for (int i = PROMPT; i < PROMPT + generated && i < PROMPT + 12; i++) printf(" %d", tokens[b][i]);
    printf(" ...\n");
  }
  printf("  worst attention error against the fp64 reference: %.3g (%d checks)\n", worst, (generated + 1) * LAYERS);
  status = failed || generated != STEPS ? 1 : 0;
done:
  for (int l = 0; l < LAYERS; l++) clattn_plan_release(plans[l]); /* before the context */
  if (weights) clReleaseMemObject(weights);
  cl_mem all[] = {x, qp, kp, vp, attn, positions, kv_lens, table_buf};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
    if (all[i]) clReleaseMemObject(all[i]);
  for (int l = 0; l < LAYERS; l++) {
    if (k_cache[l]) clReleaseMemObject(k_cache[l]);
    if (v_cache[l]) clReleaseMemObject(v_cache[l]);
  }
  free(w);
  free(logits);
  clattn_destroy(ctx);
  printf("%s\n", status ? "FAILED" : "ok");
  return status;
}
