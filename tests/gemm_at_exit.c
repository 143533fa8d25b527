/* One GEMM-path call from a program that links libclattn alone (as a user's
 * would: CLBlast comes in as libclattn's dependency), then clattn_destroy
 * and a normal exit. Run by tools/scripts/oclgrind.sh: CLBlast's program
 * caches, left to its static destructors, are released after Oclgrind's
 * runtime has gone and abort the process at exit; clattn_destroy empties
 * them first. The call is uniform attention (scale 0), so every output row
 * is the mean of the value rows. Exit 0 when right, 1 otherwise. */
#include <clattn.h>
#include <math.h>
#include <stdio.h>

enum { H = 2, M = 3, N = 5, D = 4 };

int main(void) {
  clattn_context *ctx = NULL;
  if (clattn_create(NULL, &ctx) != CLATTN_OK) {
    fprintf(stderr, "clattn_create: %s\n", clattn_last_error(NULL));
    return 1;
  }
  float q[H * M * D], kv[H * N * D], o[H * M * D];
  for (int i = 0; i < H * M * D; i++) q[i] = (float)(i % 5) - 2.0f;
  for (int i = 0; i < H * N * D; i++) kv[i] = (float)(i % 7);
  const cl_context cl = clattn_cl_context(ctx);
  cl_int err[3];
  cl_mem qb = clCreateBuffer(cl, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, sizeof q, q, &err[0]);
  cl_mem kvb = clCreateBuffer(cl, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, sizeof kv, kv, &err[1]);
  cl_mem ob = clCreateBuffer(cl, CL_MEM_WRITE_ONLY, sizeof o, NULL, &err[2]);
  int status = 1;
  if (err[0] || err[1] || err[2]) {
    fprintf(stderr, "clCreateBuffer failed\n");
  } else {
    clattn_params p = clattn_params_default();
    p.batch = 1, p.q_heads = p.kv_heads = H, p.q_len = M, p.kv_len = N, p.head_dim = p.value_dim = D;
    p.scale = 0.0f;
    p.algo = CLATTN_ALGO_GEMM;
    p.q = (clattn_tensor){qb, 0, {H * M * D, M * D, D, 1}};
    p.k = p.v = (clattn_tensor){kvb, 0, {H * N * D, N * D, D, 1}};
    p.out = (clattn_tensor){ob, 0, {H * M * D, M * D, D, 1}};
    clattn_status st = clattn_forward(ctx, &p, 0, NULL, NULL);
    if (st != CLATTN_OK)
      fprintf(stderr, "clattn_forward: %s: %s\n", clattn_status_string(st), clattn_last_error(ctx));
    else if (clEnqueueReadBuffer(clattn_cl_queue(ctx), ob, CL_TRUE, 0, sizeof o, o, 0, NULL, NULL) != CL_SUCCESS)
      fprintf(stderr, "clEnqueueReadBuffer failed\n");
    else {
      double worst = 0;
      for (int h = 0; h < H; h++)
        for (int i = 0; i < M; i++)
          for (int c = 0; c < D; c++) {
            double mean = 0;
            for (int j = 0; j < N; j++) mean += kv[(h * N + j) * D + c] / (double)N;
            const double diff = fabs(mean - o[(h * M + i) * D + c]);
            if (!(diff <= worst)) worst = isnan(diff) ? INFINITY : diff;
          }
      printf("gemm_at_exit: route \"%s\", max error %.2g\n", clattn_last_route(), worst);
      status = worst <= 1e-5 ? 0 : 1;
    }
  }
  if (qb) clReleaseMemObject(qb);
  if (kvb) clReleaseMemObject(kvb);
  if (ob) clReleaseMemObject(ob);
  clattn_destroy(ctx);
  fflush(stdout);
  return status;
}
