/* clattn's modifier example: document masking for a packed sequence. The
 * mask is a few lines of OpenCL C that clattn compiles into its kernels,
 * reading the document ids it captures; a block mask made from it lets the
 * kernels skip the blocks no document spans. Checked against a direct
 * computation on the host.
 *
 *   cc documents.c $(pkg-config --cflags --libs clattn) -lm -o documents && ./documents
 */
#include <clattn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

enum { H = 4, S = 512, D = 64, DOCS = 5 }; /* one packed sequence of 5 documents */

static const char document_mask[] =
    "int clattn_mask_mod(int b, int h, int q_idx, int kv_idx, const clattn_captures *cap) {\n"
    "  __global const int *doc = (__global const int *)cap->buf[0];\n"
    "  return doc[q_idx] == doc[kv_idx] && kv_idx <= q_idx; /* causal within its document */\n"
    "}\n";

int main(void) {
  clattn_context *ctx = NULL;
  if (clattn_create(NULL, &ctx) != CLATTN_OK) {
    fprintf(stderr, "clattn_create: %s\n", clattn_last_error(NULL));
    return 1;
  }
  const size_t n = (size_t)H * S * D;
  float *q = malloc(n * sizeof *q), *k = malloc(n * sizeof *k), *v = malloc(n * sizeof *v), *o = malloc(n * sizeof *o);
  int doc[S];
  for (size_t i = 0; i < n; i++)
    q[i] = (float)rand() / RAND_MAX - 0.5f, k[i] = (float)rand() / RAND_MAX - 0.5f, v[i] = (float)rand() / RAND_MAX;
  for (int i = 0; i < S; i++) doc[i] = i * DOCS / S; /* positions 0..102 document 0, and so on */

  cl_context cl = clattn_cl_context(ctx);
  cl_int err[5];
  cl_mem q_buf = clCreateBuffer(cl, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, n * sizeof *q, q, &err[0]);
  cl_mem k_buf = clCreateBuffer(cl, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, n * sizeof *k, k, &err[1]);
  cl_mem v_buf = clCreateBuffer(cl, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, n * sizeof *v, v, &err[2]);
  cl_mem out_buf = clCreateBuffer(cl, CL_MEM_WRITE_ONLY, n * sizeof *o, NULL, &err[3]);
  cl_mem doc_buf = clCreateBuffer(cl, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, sizeof doc, doc, &err[4]);
  clattn_block_mask *bm = NULL;
  int status = 1;
  if (err[0] || err[1] || err[2] || err[3] || err[4]) {
    fprintf(stderr, "clCreateBuffer failed\n");
    goto done;
  }

  clattn_params p = clattn_params_default();
  p.batch = 1; p.q_heads = H; p.kv_heads = H;
  p.q_len = S; p.kv_len = S; p.head_dim = D; p.value_dim = D;
  p.q = (clattn_tensor){q_buf, 0, {H * S * D, S * D, D, 1}};
  p.k = (clattn_tensor){k_buf, 0, {H * S * D, S * D, D, 1}};
  p.v = (clattn_tensor){v_buf, 0, {H * S * D, S * D, D, 1}};
  p.out = (clattn_tensor){out_buf, 0, {H * S * D, S * D, D, 1}};
  p.mask_mod = document_mask; /* compiled into the kernels (cached by its text) */
  p.captures[0] = doc_buf;    /* the modifier's cap->buf[0] */

  /* Which 128 x 128 blocks the mask empties, fills or cuts (heads 1: one for all). */
  clattn_params shape = p;
  shape.q_heads = 1;
  clattn_status st = clattn_block_mask_create(ctx, &shape, 0, 0, &bm);
  if (st != CLATTN_OK) {
    fprintf(stderr, "clattn_block_mask_create: %s: %s\n", clattn_status_string(st), clattn_last_error(ctx));
    goto done;
  }
  size_t empty, partial, full;
  clattn_block_mask_counts(bm, &empty, &partial, &full);
  p.block_mask = bm; /* the kernels skip the empty blocks */

  cl_event done;
  st = clattn_forward(ctx, &p, 0, NULL, &done);
  if (st != CLATTN_OK) {
    fprintf(stderr, "clattn_forward: %s: %s\n", clattn_status_string(st), clattn_last_error(ctx));
    goto done;
  }
  cl_int rc = clEnqueueReadBuffer(clattn_cl_queue(ctx), out_buf, CL_TRUE, 0, n * sizeof *o, o, 1, &done, NULL);
  clReleaseEvent(done);
  if (rc != CL_SUCCESS) {
    fprintf(stderr, "clEnqueueReadBuffer failed: %d\n", rc);
    goto done;
  }

  /* The same attention, directly: each query over its document's keys up to itself. */
  double worst = 0;
  for (int h = 0; h < H; h++)
    for (int i = 0; i < S; i++) {
      const float *qi = q + ((size_t)h * S + i) * D, *kh = k + (size_t)h * S * D, *vh = v + (size_t)h * S * D;
      double s[S], max = -INFINITY, sum = 0;
      for (int j = 0; j <= i; j++) {
        if (doc[j] != doc[i]) continue;
        s[j] = 0;
        for (int c = 0; c < D; c++) s[j] += (double)qi[c] * kh[(size_t)j * D + c];
        s[j] /= sqrt(D);
        if (s[j] > max) max = s[j];
      }
      for (int j = 0; j <= i; j++)
        if (doc[j] == doc[i]) sum += s[j] = exp(s[j] - max);
      for (int c = 0; c < D; c++) {
        double acc = 0;
        for (int j = 0; j <= i; j++)
          if (doc[j] == doc[i]) acc += s[j] / sum * vh[(size_t)j * D + c];
        double diff = fabs(acc - o[((size_t)h * S + i) * D + c]);
        if (!(diff <= worst)) worst = isnan(diff) ? INFINITY : diff;
      }
    }
  printf("clattn document masking: %d documents in %d positions, %d heads: blocks %zu empty, %zu partial, %zu full; "
         "max |error| %.2e\n",
         DOCS, S, H, empty, partial, full, worst);
  status = worst < 1e-5 ? 0 : 1;
done:
  clattn_block_mask_release(bm);
  if (q_buf) clReleaseMemObject(q_buf);
  if (k_buf) clReleaseMemObject(k_buf);
  if (v_buf) clReleaseMemObject(v_buf);
  if (out_buf) clReleaseMemObject(out_buf);
  if (doc_buf) clReleaseMemObject(doc_buf);
  clattn_destroy(ctx);
  free(q), free(k), free(v), free(o);
  return status;
}
