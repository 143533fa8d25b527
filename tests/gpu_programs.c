/*
 * Writes every program the library would build on a GPU-like device, as
 * clang would be given it by a driver: one NAME.cl (the sources
 * concatenated in order) and one NAME.opts (the build options) per program,
 * for tools/scripts/gpu-codegen.sh to compile for amdgcn and nvptx targets
 * (clang) and Intel's Xe GPUs (ocloc).
 *
 *   gpu_programs PROFILE OUT_DIR      PROFILE: amd-wave64, amd-wave32, nvidia,
 *                                              intel-xe-lp, intel-xe-hpg
 *
 * The device descriptions are what such devices report through OpenCL
 * (tile choice is a pure function of them: src/tiles.c; flash_rows' vector
 * width from their float vector widths, given as 1 here: ca_flash_vw).
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "api/api.h"
#include "device/program_text.h"

static int find_profile(const char *name, tl_device *dev) {
  static const struct {
    const char *name;
    tl_device dev;
  } profiles[] = {
      /* CDNA (MI200/MI300): 64-wide wavefronts, 64 KiB LDS, 1024-item groups */
      {"amd-wave64",
       {CL_DEVICE_TYPE_GPU, 64 * 1024, 1024, {1024, 1024, 1024}, 64, 110, 0, 0, 0x1002, 1, 1024, 64, 1, 1, 0, "", {0}, 0}},
      /* RDNA 3 (gfx1100): 32-wide waves */
      {"amd-wave32",
       {CL_DEVICE_TYPE_GPU, 64 * 1024, 1024, {1024, 1024, 1024}, 32, 48, 0, 0, 0x1002, 1, 1024, 64, 1, 1, 0, "", {0}, 0}},
      /* NVIDIA's OpenCL: 32-wide warps, 48 KiB local memory, no cl_khr_fp16 (the widening path) */
      {"nvidia", {CL_DEVICE_TYPE_GPU, 48 * 1024, 1024, {1024, 1024, 64}, 32, 132, 0, 0, 0x10de, 0, 4352, 64, 1, 1, 0, "", {0}, 0}},
      /* Intel Xe-LP (Tiger Lake, tgllp) as its OpenCL driver reports it: 96
       * EUs as compute units, 64 KiB SLM, 512-item groups, cl_khr_fp16 */
      {"intel-xe-lp",
       {CL_DEVICE_TYPE_GPU, 64 * 1024, 512, {512, 512, 512}, 32, 96, 0, 0, 0x8086, 1, 2048, 64, 1, 1, 8 | 16 | 32, "", {0}, 0}},
      /* Intel Xe-HPG (Arc A770, dg2 / acm-g10): 512 EUs, 1024-item groups */
      {"intel-xe-hpg",
       {CL_DEVICE_TYPE_GPU, 64 * 1024, 1024, {1024, 1024, 1024}, 32, 512, 0, 0, 0x8086, 1, 2048, 64, 1, 1, 8 | 16 | 32, "", {0}, 0}},
  };
  for (size_t i = 0; i < sizeof profiles / sizeof profiles[0]; i++)
    if (strcmp(name, profiles[i].name) == 0) {
      *dev = profiles[i].dev;
      return 0;
    }
  return -1;
}

static int write_program(const char *dir, const char *name, const ca_program_text *text) {
  char path[4096];
  snprintf(path, sizeof path, "%s/%s.cl", dir, name);
  FILE *f = fopen(path, "w");
  if (!f) goto fail;
  for (unsigned i = 0; i < text->n_sources; i++) fputs(text->sources[i], f);
  if (fclose(f) != 0) goto fail;
  snprintf(path, sizeof path, "%s/%s.opts", dir, name);
  if (!(f = fopen(path, "w"))) goto fail;
  fprintf(f, "%s\n", text->options);
  if (fclose(f) != 0) goto fail;
  return 0;
fail:
  fprintf(stderr, "gpu_programs: cannot write %s: %s\n", path, strerror(errno));
  return -1;
}

int main(int argc, char **argv) {
  tl_device dev;
  if (argc != 3 || find_profile(argv[1], &dev) != 0) {
    fprintf(stderr, "usage: gpu_programs amd-wave64|amd-wave32|nvidia|intel-xe-lp|intel-xe-hpg OUT_DIR\n");
    return 2;
  }
  static const struct {
    clattn_dtype dtype;
    const char *name;
  } dtypes[] = {{CLATTN_F32, "f32"}, {CLATTN_F16, "f16"}, {CLATTN_BF16, "bf16"}};
  /* Head dims: the common ones, one that is not a multiple of 16 (no direct
   * decode kernels) and one with dk != dv. */
  static const int dims[][2] = {{64, 64}, {128, 128}, {256, 256}, {80, 80}, {40, 24}};
  ca_program_text text;
  ca_probe_text(&text);
  if (write_program(argv[2], "probe", &text)) return 1;
  for (size_t t = 0; t < 3; t++) {
    char name[64];
    dev.head_dim = dev.value_dim = 0;
    tl_tiles tiles = tl_choose(&dev);
    tiles.flash_vw = ca_flash_vw(&dev); /* as ca_tuning_choose sets it */
    ca_core_text(&tiles, dtypes[t].dtype, &text);
    snprintf(name, sizeof name, "core-%s", dtypes[t].name);
    if (write_program(argv[2], name, &text)) return 1;
    for (size_t d = 0; d < sizeof dims / sizeof dims[0]; d++) {
      if (t > 0 && d > 1) continue; /* 16-bit storage changes loads and stores only: two dims suffice */
      ca_fused_text(&tiles, &dev, dims[d][0], dims[d][1], dtypes[t].dtype, CLATTN_DTYPE_SAME, CLATTN_DTYPE_SAME, &text);
      snprintf(name, sizeof name, "flash-%s-d%d-%d", dtypes[t].name, dims[d][0], dims[d][1]);
      if (write_program(argv[2], name, &text)) return 1;
      ca_backward_text(dims[d][0], dims[d][1], dtypes[t].dtype, &text);
      snprintf(name, sizeof name, "backward-%s-d%d-%d", dtypes[t].name, dims[d][0], dims[d][1]);
      if (write_program(argv[2], name, &text)) return 1;
    }
  }
  /* Dropout's programs (-D CA_DROPOUT): compiled and linked for every
   * target, not gated (the names do not start with flash-) */
  for (size_t t = 0; t < 2; t++) {
    char name[64];
    dev.head_dim = dev.value_dim = 0;
    tl_tiles tiles = tl_choose(&dev);
    tiles.flash_vw = ca_flash_vw(&dev);
    ca_fused_text(&tiles, &dev, 64, 64, dtypes[t].dtype, CLATTN_DTYPE_SAME, CLATTN_DTYPE_SAME, &text);
    ca_text_dropout(&text);
    snprintf(name, sizeof name, "dropout-flash-%s-d64-64", dtypes[t].name);
    if (write_program(argv[2], name, &text)) return 1;
    ca_backward_text(64, 64, dtypes[t].dtype, &text);
    ca_text_dropout(&text);
    snprintf(name, sizeof name, "dropout-backward-%s-d64-64", dtypes[t].name);
    if (write_program(argv[2], name, &text)) return 1;
  }
  /* softmax_rows' sub-group variant where the profile offers sub-groups
   * (Intel's): tl_choose's group of 256 is wider than any, so the core
   * program as CLATTN_SOFTMAX_SG=16 and =32 build it (the group that many
   * work-items, one sub-group). */
  for (int lanes = 16; dev.sg_sizes && lanes <= 32; lanes *= 2) {
    char name[64];
    dev.head_dim = dev.value_dim = 0;
    tl_tiles tiles = tl_choose(&dev);
    tiles.softmax_wg = tiles.softmax_sg = lanes;
    ca_core_text(&tiles, CLATTN_F32, &text);
    snprintf(name, sizeof name, "core-f32-softmax-sg%d", lanes);
    if (write_program(argv[2], name, &text)) return 1;
  }
  /* Paged/quantised K/V: the fused kernels over every quantised cache
   * storage (and K and V stored apart: Q8_0 keys, Q4_0 values), and
   * clattn_kv_append for every cache storage it writes (the first five). */
  static const struct {
    clattn_dtype dtype, v_dtype;
    const char *name;
  } kv[] = {{CLATTN_F32, CLATTN_F32, "f32"},        {CLATTN_F16, CLATTN_F16, "f16"},
            {CLATTN_BF16, CLATTN_BF16, "bf16"},     {CLATTN_Q8_0, CLATTN_Q8_0, "q8_0"},
            {CLATTN_INT8, CLATTN_INT8, "int8"},     {CLATTN_Q4_0, CLATTN_Q4_0, "q4_0"},
            {CLATTN_Q4_1, CLATTN_Q4_1, "q4_1"},     {CLATTN_Q5_0, CLATTN_Q5_0, "q5_0"},
            {CLATTN_Q5_1, CLATTN_Q5_1, "q5_1"},     {CLATTN_IQ4_NL, CLATTN_IQ4_NL, "iq4_nl"},
            {CLATTN_Q8_0, CLATTN_Q4_0, "q8_0-q4_0"}};
  for (size_t c = 3; c < sizeof kv / sizeof kv[0]; c++) {
    char name[64];
    dev.head_dim = dev.value_dim = 0;
    tl_tiles tiles = tl_choose(&dev);
    tiles.flash_vw = ca_flash_vw(&dev); /* as ca_tuning_choose sets it */
    ca_core_kv_text(&tiles, CLATTN_F16, kv[c].dtype, kv[c].v_dtype, &text);
    snprintf(name, sizeof name, "core-f16-kv%s", kv[c].name);
    if (write_program(argv[2], name, &text)) return 1;
    ca_fused_text(&tiles, &dev, 128, 128, CLATTN_F16, kv[c].dtype, kv[c].v_dtype, &text);
    snprintf(name, sizeof name, "flash-f16-kv%s-d128-128", kv[c].name);
    if (write_program(argv[2], name, &text)) return 1;
  }
  /* The example modifiers (examples/modifiers/), a mask modifier and a
   * score modifier to a program (the seven in four), in the fused program
   * at d=128 (gated: the names start with flash-) and the backward at d=64;
   * the core program with the first pair. */
  static const char *const mods[][2] = {
      {"causal", "alibi"}, {"sliding_window", "tanh_softcap"}, {"prefix_lm", "relative_bias"}, {"document", NULL}};
  static char texts[2][1 << 14];
  for (size_t m = 0; m < sizeof mods / sizeof mods[0]; m++) {
    for (int side = 0; side < 2; side++) {
      texts[side][0] = '\0';
      if (!mods[m][side]) continue;
      char path[4096];
      snprintf(path, sizeof path, "%s/%s.cl", MODIFIERS_DIR, mods[m][side]);
      FILE *f = fopen(path, "r");
      const size_t n = f ? fread(texts[side], 1, sizeof texts[side] - 1, f) : 0;
      if (!f || ferror(f)) return fprintf(stderr, "gpu_programs: cannot read %s\n", path), 1;
      fclose(f);
      texts[side][n] = '\0';
    }
    const char *mask_text = texts[0], *score_text = mods[m][1] ? texts[1] : NULL;
    const int flags = CA_MODF_MASK | (score_text ? CA_MODF_SCORE | CA_MODF_GRAD : 0);
    char name[96];
    dev.head_dim = dev.value_dim = 0;
    tl_tiles tiles = tl_choose(&dev);
    tiles.flash_vw = ca_flash_vw(&dev);
    ca_fused_text(&tiles, &dev, 128, 128, CLATTN_F32, CLATTN_DTYPE_SAME, CLATTN_DTYPE_SAME, &text);
    ca_text_modifier(&text, flags, score_text, mask_text);
    snprintf(name, sizeof name, "flash-f32-mod%s-d128-128", mods[m][0]);
    if (write_program(argv[2], name, &text)) return 1;
    ca_backward_text(64, 64, CLATTN_F32, &text);
    ca_text_modifier(&text, flags, score_text, mask_text);
    snprintf(name, sizeof name, "backward-f32-mod%s-d64-64", mods[m][0]);
    if (write_program(argv[2], name, &text)) return 1;
    if (m == 0) {
      ca_core_text(&tiles, CLATTN_F32, &text);
      ca_text_modifier(&text, flags, score_text, mask_text);
      snprintf(name, sizeof name, "core-f32-mod%s", mods[m][0]);
      if (write_program(argv[2], name, &text)) return 1;
    }
  }
  for (size_t c = 0; c < 5; c++) {
    char name[64];
    ca_append_text(CLATTN_F16, kv[c].dtype, &text);
    snprintf(name, sizeof name, "append-f16-%s", kv[c].name);
    if (write_program(argv[2], name, &text)) return 1;
  }
  return 0;
}
