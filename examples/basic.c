/* clattn's basic example: causal GQA attention on the default device,
 * checked against a direct computation on the host.
 *
 *   cc basic.c $(pkg-config --cflags --libs clattn) -lm -o basic && ./basic
 */
#include <clattn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

enum { B = 1, HQ = 8, HKV = 2, M = 37, N = 53, D = 64 }; /* 4 query heads per KV head */

int main(void) {
  clattn_context *ctx = NULL;
  if (clattn_create(NULL, &ctx) != CLATTN_OK) { /* or embed: options.context/device/queue */
    fprintf(stderr, "clattn_create: %s\n", clattn_last_error(NULL));
    return 1;
  }
  size_t nq = (size_t)B * HQ * M * D, nk = (size_t)B * HKV * N * D;
  float *q = malloc(nq * sizeof *q), *k = malloc(nk * sizeof *k), *v = malloc(nk * sizeof *v);
  float *o = malloc(nq * sizeof *o);
  for (size_t i = 0; i < nq; i++) q[i] = (float)rand() / RAND_MAX - 0.5f;
  for (size_t i = 0; i < nk; i++) k[i] = (float)rand() / RAND_MAX - 0.5f, v[i] = (float)rand() / RAND_MAX;

  cl_context cl = clattn_cl_context(ctx);
  cl_int err[4];
  cl_mem q_buf = clCreateBuffer(cl, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, nq * sizeof *q, q, &err[0]);
  cl_mem k_buf = clCreateBuffer(cl, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, nk * sizeof *k, k, &err[1]);
  cl_mem v_buf = clCreateBuffer(cl, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, nk * sizeof *v, v, &err[2]);
  cl_mem out_buf = clCreateBuffer(cl, CL_MEM_WRITE_ONLY, nq * sizeof *o, NULL, &err[3]);
  int status = 1;
  if (err[0] || err[1] || err[2] || err[3]) {
    fprintf(stderr, "clCreateBuffer failed\n");
    goto done;
  }

  clattn_params p = clattn_params_default();
  p.batch = B; p.q_heads = HQ; p.kv_heads = HKV;
  p.q_len = M; p.kv_len = N; p.head_dim = D; p.value_dim = D;
  p.causal = 1; /* bottom-right aligned: query i sees keys j <= i + N - M */
  /* [B,H,S,D] row-major views; strides are in elements, 0 broadcasts */
  p.q = (clattn_tensor){q_buf, 0, {HQ * M * D, M * D, D, 1}};
  p.k = (clattn_tensor){k_buf, 0, {HKV * N * D, N * D, D, 1}};
  p.v = (clattn_tensor){v_buf, 0, {HKV * N * D, N * D, D, 1}};
  p.out = (clattn_tensor){out_buf, 0, {HQ * M * D, M * D, D, 1}};

  cl_event done;
  clattn_status st = clattn_forward(ctx, &p, 0, NULL, &done); /* only enqueues */
  if (st != CLATTN_OK) {
    fprintf(stderr, "clattn_forward: %s: %s\n", clattn_status_string(st), clattn_last_error(ctx));
    goto done;
  }
  cl_int rc = clEnqueueReadBuffer(clattn_cl_queue(ctx), out_buf, CL_TRUE, 0, nq * sizeof *o, o, 1, &done, NULL);
  clReleaseEvent(done);
  if (rc != CL_SUCCESS) {
    fprintf(stderr, "clEnqueueReadBuffer failed: %d\n", rc);
    goto done;
  }

  /* The same attention, directly: softmax over the allowed keys, then mix. */
  double worst = 0;
  for (int h = 0; h < HQ; h++)
    for (int i = 0; i < M; i++) {
      const float *qi = q + ((size_t)h * M + i) * D;
      const float *kh = k + (size_t)(h / (HQ / HKV)) * N * D, *vh = v + (size_t)(h / (HQ / HKV)) * N * D;
      double s[N], max = -INFINITY, sum = 0;
      int last = i + N - M; /* the causal limit */
      for (int j = 0; j <= last; j++) {
        s[j] = 0;
        for (int c = 0; c < D; c++) s[j] += (double)qi[c] * kh[(size_t)j * D + c];
        s[j] /= sqrt(D);
        if (s[j] > max) max = s[j];
      }
      for (int j = 0; j <= last; j++) sum += s[j] = exp(s[j] - max);
      for (int c = 0; c < D; c++) {
        double acc = 0;
        for (int j = 0; j <= last; j++) acc += s[j] / sum * vh[(size_t)j * D + c];
        double diff = fabs(acc - o[((size_t)h * M + i) * D + c]);
        if (!(diff <= worst)) worst = isnan(diff) ? INFINITY : diff; /* NaN counts as worst */
      }
    }
  char device[256] = "?";
  clGetDeviceInfo(clattn_cl_device(ctx), CL_DEVICE_NAME, sizeof device, device, NULL);
  printf("clattn on %s: causal GQA, %d query heads over %d KV heads, %d queries, %d keys, d=%d: max |error| %.2e\n",
         device, HQ, HKV, M, N, D, worst);
  status = worst < 1e-5 ? 0 : 1;
done:
  if (q_buf) clReleaseMemObject(q_buf);
  if (k_buf) clReleaseMemObject(k_buf);
  if (v_buf) clReleaseMemObject(v_buf);
  if (out_buf) clReleaseMemObject(out_buf);
  clattn_destroy(ctx);
  free(q), free(k), free(v), free(o);
  return status;
}
