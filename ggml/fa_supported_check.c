/*
 * ggml-fa-supported-check: which FLASH_ATTN_EXT nodes the backends take
 * (gc_fa_supported, shared by libggml-clattn and the ggml-opencl glue),
 * over the op parameters test-backend-ops never varies: a scale of NaN or
 * Inf (ggml's CPU backend computes NaN scores with it, while clattn reads a
 * NaN scale as 1/sqrt(d)) and a negative or infinite softcap must be
 * refused, so ggml computes them itself; the ordinary node taken.
 *
 * One line per case; exit 0 when every answer is the expected one.
 */
#include <math.h>
#include <stdio.h>

#include "fa_map.h"
#include "ggml.h"

int main(void) {
  struct ggml_init_params ip = {16 * 1024 * 1024, NULL, true};
  struct ggml_context *ctx = ggml_init(ip);
  if (!ctx) return 1;
  struct ggml_tensor *q = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, 64, 7, 4, 1);
  struct ggml_tensor *k = ggml_new_tensor_4d(ctx, GGML_TYPE_F16, 64, 37, 2, 1);
  struct ggml_tensor *v = ggml_new_tensor_4d(ctx, GGML_TYPE_F16, 64, 37, 2, 1);
  const struct {
    const char *name;
    float scale, softcap;
    bool taken;
  } cases[] = {
      {"scale 0.125", 0.125f, 0.0f, true},      {"scale 0", 0.0f, 0.0f, true},
      {"scale NaN", NAN, 0.0f, false},          {"scale Inf", INFINITY, 0.0f, false},
      {"scale -Inf", -INFINITY, 0.0f, false},   {"softcap 30", 0.125f, 30.0f, true},
      {"softcap NaN", 0.125f, NAN, false},      {"softcap -1", 0.125f, -1.0f, false},
      {"softcap Inf", 0.125f, INFINITY, false},
  };
  int failed = 0;
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    struct ggml_tensor *node = ggml_flash_attn_ext(ctx, q, k, v, NULL, cases[i].scale, 0.0f, cases[i].softcap);
    const bool taken = gc_fa_supported(node);
    printf("%-12s %s%s\n", cases[i].name, taken ? "taken" : "left to ggml",
           taken == cases[i].taken ? "" : "   <- WRONG");
    failed += taken != cases[i].taken;
  }
  ggml_free(ctx);
  return failed ? 1 : 0;
}
