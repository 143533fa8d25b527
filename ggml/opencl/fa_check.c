/*
 * ggml-opencl-fa-check: FLASH_ATTN_EXT on a ggml device against ggml's CPU
 * backend, over two things llama.cpp's test-backend-ops cases leave out (its
 * K/V views all start at their cache's first byte, and its masks never
 * disallow every key of a row):
 *
 *   offset  K and V views starting inside a larger cache (rows 96 onwards of
 *           a 704-row cache), as an engine's cache views sit past a
 *           stream's or a layer's rows
 *   empty   mask rows whose every key is -inf (ggml's result for such a
 *           row: 0), beside rows with a few allowed keys
 *
 * each with f16 and q8_0 caches (the backend splits a q8_0 tensor it is
 * given; the glue puts the view's blocks back together).
 *
 *   ggml-opencl-fa-check [DEVICE]     (default GPUOpenCL)
 *
 * One line per case: its NMSE against the CPU backend. Exit 0 when every
 * case is within 5e-4 with NaN and Inf where the CPU has them; 1 otherwise;
 * 77 when there is no such device.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml.h"

enum { D = 64, H = 4, HKV = 2, NQ = 9, NKV = 512, CACHE_ROWS = 704, OFFSET_ROWS = 96 };

typedef struct {
  const char *name;
  enum ggml_type type;
  int offset_rows; /* where the K/V views start in their cache */
  int empty;       /* mask rows 0, 3, 6 disallow every key */
} fa_case;

/* Deterministic values in [-1, 1). */
static float value(unsigned *s) {
  *s = *s * 1664525u + 1013904223u;
  return (float)(*s >> 8) / (float)(1u << 23) - 1.0f;
}

/* The case's graph in ctx: its output, and the tensors to fill. */
static struct ggml_tensor *build(struct ggml_context *ctx, const fa_case *c, struct ggml_tensor **in) {
  struct ggml_tensor *q = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, D, NQ, H, 1);
  struct ggml_tensor *kc = ggml_new_tensor_4d(ctx, c->type, D, CACHE_ROWS, HKV, 1);
  struct ggml_tensor *vc = ggml_new_tensor_4d(ctx, c->type, D, CACHE_ROWS, HKV, 1);
  struct ggml_tensor *m = ggml_new_tensor_4d(ctx, GGML_TYPE_F16, NKV, NQ, 1, 1);
  struct ggml_tensor *k =
      ggml_view_4d(ctx, kc, D, NKV, HKV, 1, kc->nb[1], kc->nb[2], kc->nb[3], (size_t)c->offset_rows * kc->nb[1]);
  struct ggml_tensor *v =
      ggml_view_4d(ctx, vc, D, NKV, HKV, 1, vc->nb[1], vc->nb[2], vc->nb[3], (size_t)c->offset_rows * vc->nb[1]);
  struct ggml_tensor *out = ggml_flash_attn_ext(ctx, q, k, v, m, 1.0f / sqrtf(D), 0.0f, 0.0f);
  ggml_prec_set_acc(out, GGML_PREC_F32);
  in[0] = q, in[1] = kc, in[2] = vc, in[3] = m;
  return out;
}

/* Fills the inputs (the same values on every backend). */
static void fill(struct ggml_tensor **in, const fa_case *c) {
  unsigned s = 12345;
  for (int i = 0; i < 3; i++) {
    struct ggml_tensor *t = in[i];
    const int64_t n = ggml_nelements(t);
    float *f = malloc(sizeof(float) * (size_t)n);
    void *b = malloc(ggml_nbytes(t));
    for (int64_t j = 0; j < n; j++) f[j] = value(&s);
    if (t->type == GGML_TYPE_F32)
      memcpy(b, f, ggml_nbytes(t));
    else
      ggml_quantize_chunk(t->type, f, b, 0, ggml_nrows(t), t->ne[0], NULL);
    ggml_backend_tensor_set(t, b, 0, ggml_nbytes(t));
    free(f);
    free(b);
  }
  ggml_fp16_t *mask = malloc(sizeof(ggml_fp16_t) * NKV * NQ);
  for (int r = 0; r < NQ; r++)
    for (int j = 0; j < NKV; j++) {
      float x = value(&s);
      if (c->empty && r % 3 == 0) x = -INFINITY;           /* every key disallowed */
      if (c->empty && r % 3 == 1 && j % 64) x = -INFINITY; /* a few keys allowed */
      mask[r * NKV + j] = ggml_fp32_to_fp16(x);
    }
  ggml_backend_tensor_set(in[3], mask, 0, sizeof(ggml_fp16_t) * NKV * NQ);
  free(mask);
}

/* The case's output on backend b, into out (NQ * H * D floats); false on failure. */
static int run(ggml_backend_t b, const fa_case *c, float *out) {
  struct ggml_init_params ip = {ggml_tensor_overhead() * 16 + ggml_graph_overhead(), NULL, true};
  struct ggml_context *ctx = ggml_init(ip);
  struct ggml_tensor *in[4];
  struct ggml_tensor *o = build(ctx, c, in);
  struct ggml_cgraph *g = ggml_new_graph(ctx);
  ggml_build_forward_expand(g, o);
  ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors(ctx, b);
  int ok = buf != NULL;
  if (ok) {
    fill(in, c);
    ok = ggml_backend_graph_compute(b, g) == GGML_STATUS_SUCCESS;
  }
  if (ok) ggml_backend_tensor_get(o, out, 0, ggml_nbytes(o));
  if (buf) ggml_backend_buffer_free(buf);
  ggml_free(ctx);
  return ok;
}

int main(int argc, char **argv) {
  const char *name = argc > 1 ? argv[1] : "GPUOpenCL";
  ggml_backend_load_all();
  ggml_backend_dev_t dev = ggml_backend_dev_by_name(name);
  if (!dev) {
    fprintf(stderr, "ggml-opencl-fa-check: no device %s\n", name);
    return 77;
  }
  ggml_backend_t b = ggml_backend_dev_init(dev, NULL);
  ggml_backend_t cpu = ggml_backend_init_by_type(GGML_BACKEND_DEVICE_TYPE_CPU, NULL);
  if (!b || !cpu) {
    fprintf(stderr, "ggml-opencl-fa-check: cannot start %s or the CPU backend\n", name);
    return 1;
  }
  const fa_case cases[] = {
      {"offset f16", GGML_TYPE_F16, OFFSET_ROWS, 0},
      {"offset q8_0", GGML_TYPE_Q8_0, OFFSET_ROWS, 0},
      {"empty f16", GGML_TYPE_F16, 0, 1},
      {"empty q8_0", GGML_TYPE_Q8_0, 0, 1},
  };
  const size_t n = (size_t)NQ * H * D;
  float *x = malloc(sizeof(float) * n), *ref = malloc(sizeof(float) * n);
  int failed = 0;
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    const fa_case *c = &cases[i];
    if (!run(b, c, x) || !run(cpu, c, ref)) {
      printf("%-12s did not compute\n", c->name);
      failed++;
      continue;
    }
    double err = 0.0, norm = 0.0;
    int nan_mismatch = 0;
    for (size_t j = 0; j < n; j++) {
      if (isfinite(x[j]) != isfinite(ref[j])) nan_mismatch++;
      if (!isfinite(x[j]) || !isfinite(ref[j])) continue;
      err += ((double)x[j] - ref[j]) * ((double)x[j] - ref[j]);
      norm += (double)ref[j] * ref[j];
    }
    const double nmse = norm > 0.0 ? err / norm : err;
    const int ok = nmse <= 5e-4 && nan_mismatch == 0;
    printf("%-12s NMSE %.3g%s: %s\n", c->name, nmse, nan_mismatch ? ", NaN/Inf where the CPU has none" : "",
           ok ? "OK" : "FAIL");
    failed += !ok;
  }
  printf("%d/%zu cases passed\n", (int)(sizeof cases / sizeof cases[0]) - failed, sizeof cases / sizeof cases[0]);
  free(x);
  free(ref);
  ggml_backend_free(b);
  ggml_backend_free(cpu);
  return failed ? 1 : 0;
}
