/* Tile choice from made-up device descriptions: every result fits the
 * device's limits, and each class of device gets a sensible shape. */
#include <string.h>

#include "check.h"
#include "api/api.h"
#include "device/program_text.h"
#include "device/rules.h"
#include "device/tiles.h"

static tl_device nvidia_like(void) {
  tl_device d = {CL_DEVICE_TYPE_GPU, 48 * 1024, 1024, {1024, 1024, 64}, 32, 132, 128, 128, 0x10de, 0, 4352, 64, 1, 1, 0, "NVIDIA H100", {0}, 0};
  return d;
}
static tl_device amd_like(void) {
  tl_device d = {CL_DEVICE_TYPE_GPU, 64 * 1024, 256, {1024, 1024, 1024}, 64, 96, 64, 64, 0x1002, 1, 1024, 64, 1, 1, 0, "AMD Instinct MI250X", {0}, 0};
  return d;
}
static tl_device intel_like(void) {
  tl_device d = {CL_DEVICE_TYPE_GPU, 64 * 1024, 512, {512, 512, 512}, 16, 96, 128, 128, 0x8086, 1, 1024, 64, 1, 1, 8 | 16 | 32, "Intel Arc A770", {0}, 0};
  return d;
}
static tl_device cpu_like(void) {
  tl_device d = {CL_DEVICE_TYPE_CPU, 1024 * 1024, 4096, {4096, 4096, 4096}, 8, 2, 0, 0, 0x8086, 0, 1024, 64, 8, 8, 0, "a CPU", {0}, 0};
  return d;
}

static int is_pow2(int x) { return x > 0 && (x & (x - 1)) == 0; }

/* Checks that t fits dev: group sizes, per-dimension sizes, local memory. */
static void check_fits(const tl_tiles *t, const tl_device *dev, const char *name) {
  CHECKF((size_t)t->score_tm * t->score_tn <= dev->max_wg, "%s: qk_score group %dx%d > max_wg %zu", name, t->score_tm,
         t->score_tn, dev->max_wg);
  CHECKF((size_t)t->mix_tm * t->mix_tv <= dev->max_wg, "%s: mix group too large", name);
  CHECKF((size_t)t->softmax_wg <= dev->max_wg, "%s: softmax group too large", name);
  CHECKF((size_t)t->score_tn <= dev->max_item[0] && (size_t)t->score_tm <= dev->max_item[1],
         "%s: qk_score exceeds max work-item sizes", name);
  CHECKF((size_t)t->mix_tv <= dev->max_item[0] && (size_t)t->mix_tm <= dev->max_item[1],
         "%s: mix exceeds max work-item sizes", name);
  CHECKF(tl_score_local_bytes(t) <= dev->local_mem, "%s: qk_score local memory %zu > %llu", name,
         tl_score_local_bytes(t), (unsigned long long)dev->local_mem);
  CHECKF(tl_mix_local_bytes(t) <= dev->local_mem, "%s: mix local memory too large", name);
  const int all[] = {t->score_tm, t->score_tn, t->score_tk, t->softmax_wg, t->mix_tm, t->mix_tv, t->mix_tj};
  for (int i = 0; i < 7; i++) CHECKF(is_pow2(all[i]), "%s: tile value %d is not a power of two", name, all[i]);
}

static void gpu_tiles_fit_and_fill_a_warp(void) {
  tl_device rdna = amd_like();
  rdna.pref_multiple = 32;
  const tl_device devs[] = {nvidia_like(), amd_like(), intel_like(), rdna};
  const char *names[] = {"nvidia-like", "amd-like", "intel-like", "rdna-like"};
  for (int i = 0; i < 4; i++) {
    tl_tiles t = tl_choose(&devs[i]);
    check_fits(&t, &devs[i], names[i]);
    size_t group = (size_t)t.score_tm * t.score_tn;
    CHECKF(group % devs[i].pref_multiple == 0, "%s: qk_score group %zu is not a multiple of the SIMD width %zu",
           names[i], group, devs[i].pref_multiple);
    CHECKF(group >= 128, "%s: qk_score group %zu is too small to hide latency", names[i], group);
    CHECK(tl_clamp(&t, &devs[i]) == 0);
    CHECKF(t.flash_wg > 0 && t.flash_wg % (int)devs[i].pref_multiple == 0 && (size_t)t.flash_wg <= devs[i].max_wg,
           "%s: fused group %d does not fill whole SIMD groups", names[i], t.flash_wg);
    for (int dk = 1; dk <= 256; dk = dk * 2 + 1) {
      int tile = tl_flash_tile(&devs[i], dk, dk, 0);
      CHECKF(tile >= 1 && (size_t)tile * 2 * dk * sizeof(float) <= devs[i].local_mem,
             "%s: fused tile of %d keys at d=%d overflows local memory", names[i], tile, dk);
    }
  }
}

static void cpu_tiles_are_wide_and_short(void) {
  tl_device d = cpu_like();
  tl_tiles t = tl_choose(&d);
  check_fits(&t, &d, "cpu");
  CHECK(t.score_tn >= t.score_tm);
  CHECK(t.mix_tv >= t.mix_tm);
  CHECK(t.flash_wg == 0 && t.flash_bm >= 4); /* register-blocked rows, not work-groups */
}

static void small_device_is_clamped_to_its_limits(void) {
  tl_device d = {CL_DEVICE_TYPE_GPU, 2048, 64, {64, 8, 1}, 32, 4, 256, 256, 0, 0, 0, 0, 1, 1, 0, "", {0}, 0};
  tl_tiles t = tl_choose(&d);
  check_fits(&t, &d, "small");
  CHECK(tl_clamp(&t, &d) == 0);
}

static void oversized_tiles_shrink_to_fit(void) {
  tl_device d = amd_like();
  tl_tiles t = {64, 64, 256, 4096, 64, 64, 256, 64, 4096, 0, 0, 0, 0, 0, 0, 0, 0};
  CHECK(tl_clamp(&t, &d) == 0);
  check_fits(&t, &d, "clamped");
  CHECK(t.flash_bm <= 16 && (size_t)t.flash_wg <= d.max_wg);
}

static void device_that_fits_nothing_is_refused(void) {
  tl_device d = {CL_DEVICE_TYPE_GPU, 0, 64, {64, 64, 64}, 32, 4, 64, 64, 0, 0, 0, 0, 1, 1, 0, "", {0}, 0};
  tl_tiles t = tl_choose(&d);
  CHECK(tl_clamp(&t, &d) == -1);
}

/* softmax_rows' sub-group variant: chosen where the device offers its
 * group's size (a CPU like Intel's runtime, 16 lanes), not where the group
 * is wider than any sub-group (Intel's GPUs, 256) or none is offered; the
 * core program alone carries it, and a clamp that shrinks the group moves
 * it to the new size or drops it. */
static void softmax_sub_group_where_the_group_is_one(void) {
  tl_device cpu = cpu_like();
  cpu.sg_sizes = 8 | 16 | 32;
  tl_tiles t = tl_choose(&cpu);
  CHECKF(t.softmax_wg == 16 && t.softmax_sg == 16, "softmax %d work-items, sub-group %d", t.softmax_wg, t.softmax_sg);
  ca_program_text core, fused;
  ca_core_text(&t, CLATTN_F32, &core);
  ca_fused_text(&t, &cpu, 64, 64, CLATTN_F32, CLATTN_DTYPE_SAME, CLATTN_DTYPE_SAME, &fused);
  CHECKF(strstr(core.options, "-D SOFTMAX_WG=16 ") && strstr(core.options, "-D SOFTMAX_SG=16"), "core options: %s",
         core.options);
  CHECKF(!strstr(fused.options, "SOFTMAX_SG"), "fused options: %s", fused.options);
  const tl_device gpu = intel_like(), none = cpu_like();
  t = tl_choose(&gpu);
  CHECKF(t.softmax_wg == 256 && t.softmax_sg == 0, "intel-like: softmax %d, sub-group %d", t.softmax_wg, t.softmax_sg);
  t = tl_choose(&none);
  ca_core_text(&t, CLATTN_F32, &core);
  CHECKF(t.softmax_sg == 0 && !strstr(core.options, "SOFTMAX_SG"), "no sub-groups: %s", core.options);
  CHECK(tl_softmax_sg(&cpu, 8) == 8 && tl_softmax_sg(&cpu, 64) == 0 && tl_softmax_sg(&none, 16) == 0);
  /* a kernel that runs 8 work-items at most: 8 lanes where offered, else local memory */
  t = tl_choose(&cpu);
  cpu.max_wg = 8;
  CHECK(tl_clamp(&t, &cpu) == 0 && t.softmax_wg == 8 && t.softmax_sg == 8);
  t = tl_choose(&cpu);
  cpu.sg_sizes = 16;
  t.softmax_sg = t.softmax_wg = 16;
  CHECK(tl_clamp(&t, &cpu) == 0 && t.softmax_wg == 8 && t.softmax_sg == 0);
}

/* Each program's options carry the tiles its kernels read and no others;
 * the fused program holds one device's kernels: the work-group ones on a
 * GPU (flash_tiled's FLASH_WG and FLASH_TILE), flash_rows* on a CPU (its
 * FLASH_BM and FLASH_VW). */
static void each_program_gets_only_its_tiles(void) {
  const tl_device devs[] = {nvidia_like(), cpu_like()};
  const char *core_names[] = {"SCORE_TM=", "SCORE_TN=", "SCORE_TK=", "SOFTMAX_WG=", "MIX_TM=", "MIX_TV=", "MIX_TJ="};
  const char *family[2][3] = {{"FLASH_WG=", "FLASH_TILE=", "FLASH_NO_ROWS"},
                              {"FLASH_BM=", "FLASH_VW=", "FLASH_NO_TILED"}};
  for (int g = 0; g < 2; g++) {
    tl_tiles t = tl_choose(&devs[g]);
    ca_program_text core, fused, backward;
    ca_core_text(&t, CLATTN_F32, &core);
    ca_fused_text(&t, &devs[g], 64, 64, CLATTN_F32, CLATTN_DTYPE_SAME, CLATTN_DTYPE_SAME, &fused);
    ca_backward_text(64, 64, CLATTN_F32, &backward);
    for (int i = 0; i < 7; i++) {
      CHECKF(strstr(core.options, core_names[i]) != NULL, "core options lack %s: %s", core_names[i], core.options);
      CHECKF(strstr(fused.options, core_names[i]) == NULL, "fused options carry %s: %s", core_names[i], fused.options);
      CHECKF(strstr(backward.options, core_names[i]) == NULL, "backward options carry %s", core_names[i]);
    }
    for (int i = 0; i < 3; i++) {
      CHECKF(strstr(fused.options, family[g][i]) != NULL, "fused options lack %s: %s", family[g][i], fused.options);
      CHECKF(strstr(fused.options, family[1 - g][i]) == NULL, "fused options carry %s: %s", family[1 - g][i],
             fused.options);
      CHECKF(strstr(core.options, family[g][i]) == NULL, "core options carry %s: %s", family[g][i], core.options);
      CHECKF(strstr(backward.options, family[g][i]) == NULL, "backward options carry %s", family[g][i]);
    }
    CHECK(strncmp(core.options, "-cl-std=CL1.2 ", 14) == 0 && strncmp(fused.options, "-cl-std=CL1.2 ", 14) == 0);
  }
}

/* Retuning one kernel's tile changes only its program's options, hence only
 * its cache key: the other programs' cached binaries stay valid. */
static void retuning_one_tile_leaves_other_programs_alone(void) {
  tl_device d = nvidia_like();
  const tl_tiles base = tl_choose(&d);
  ca_program_text core0, fused0, core1, fused1;
  ca_core_text(&base, CLATTN_F32, &core0);
  ca_fused_text(&base, &d, 40, 24, CLATTN_F32, CLATTN_DTYPE_SAME, CLATTN_DTYPE_SAME, &fused0);
  /* the staged score tile: the core program changes, the fused one does not */
  tl_tiles t = base;
  t.score_tn *= 2;
  ca_core_text(&t, CLATTN_F32, &core1);
  ca_fused_text(&t, &d, 40, 24, CLATTN_F32, CLATTN_DTYPE_SAME, CLATTN_DTYPE_SAME, &fused1);
  CHECKF(strcmp(core0.options, core1.options) != 0, "core options unchanged: %s", core1.options);
  CHECKF(strcmp(fused0.options, fused1.options) == 0, "fused options changed: %s -> %s", fused0.options,
         fused1.options);
  /* each other staged value likewise */
  for (int i = 0; i < 6; i++) {
    t = base;
    int *staged[] = {&t.score_tm, &t.score_tk, &t.softmax_wg, &t.mix_tm, &t.mix_tv, &t.mix_tj};
    *staged[i] *= 2;
    ca_fused_text(&t, &d, 40, 24, CLATTN_F32, CLATTN_DTYPE_SAME, CLATTN_DTYPE_SAME, &fused1);
    CHECKF(strcmp(fused0.options, fused1.options) == 0, "staged value %d changed the fused options", i);
  }
  /* flash_rows' rows per work-item: a CPU's fused program changes, a GPU's
   * (no flash_rows in it) and the core program do not */
  t = base;
  t.flash_bm = t.flash_bm == 16 ? 8 : t.flash_bm * 2;
  ca_core_text(&t, CLATTN_F32, &core1);
  ca_fused_text(&t, &d, 40, 24, CLATTN_F32, CLATTN_DTYPE_SAME, CLATTN_DTYPE_SAME, &fused1);
  CHECKF(strcmp(core0.options, core1.options) == 0, "core options changed: %s -> %s", core0.options, core1.options);
  CHECKF(strcmp(fused0.options, fused1.options) == 0, "GPU fused options changed: %s", fused1.options);
  const tl_device cpu = cpu_like();
  tl_tiles c = tl_choose(&cpu);
  ca_program_text cpu0, cpu1;
  ca_fused_text(&c, &cpu, 40, 24, CLATTN_F32, CLATTN_DTYPE_SAME, CLATTN_DTYPE_SAME, &cpu0);
  c.flash_bm = c.flash_bm == 16 ? 8 : c.flash_bm * 2;
  ca_fused_text(&c, &cpu, 40, 24, CLATTN_F32, CLATTN_DTYPE_SAME, CLATTN_DTYPE_SAME, &cpu1);
  CHECKF(strcmp(cpu0.options, cpu1.options) != 0, "CPU fused options unchanged: %s", cpu1.options);
  /* flash_block's tuned tile: the fused program's BLOCK_RM / BLOCK_RN
   * change (4x4 is its choice at d = 64 here; 2x4 is not), the core
   * program's options do not */
  t = base;
  t.block_rm = 2, t.block_rn = 4;
  ca_program_text fused64, block64;
  ca_fused_text(&base, &d, 64, 64, CLATTN_F32, CLATTN_DTYPE_SAME, CLATTN_DTYPE_SAME, &fused64);
  ca_core_text(&t, CLATTN_F32, &core1);
  ca_fused_text(&t, &d, 64, 64, CLATTN_F32, CLATTN_DTYPE_SAME, CLATTN_DTYPE_SAME, &block64);
  CHECKF(strcmp(core0.options, core1.options) == 0, "core options changed: %s -> %s", core0.options, core1.options);
  CHECKF(
      strstr(fused64.options, "-D BLOCK_RM=4 -D BLOCK_RN=4") && strstr(block64.options, "-D BLOCK_RM=2 -D BLOCK_RN=4"),
      "fused options: %s -> %s", fused64.options, block64.options);
  /* 0 x 0, the default, is the per-head-dim choice itself */
  t = base;
  t.block_rm = t.block_rn = 0;
  ca_fused_text(&t, &d, 64, 64, CLATTN_F32, CLATTN_DTYPE_SAME, CLATTN_DTYPE_SAME, &block64);
  CHECK(strcmp(fused64.options, block64.options) == 0);
}

static void block_tiles_fit_local_memory_and_registers(void) {
  tl_device rdna = amd_like();
  rdna.pref_multiple = 32;
  const tl_device devs[] = {nvidia_like(), amd_like(), intel_like(), rdna};
  const char *names[] = {"nvidia-like", "amd-like", "intel-like", "rdna-like"};
  for (int i = 0; i < 4; i++)
    for (int d = 1; d <= 256; d += d < 64 ? 7 : 16) {
      tl_block blk;
      if (tl_flash_block(&devs[i], d, d, &blk) != 0) {
        CHECKF(devs[i].max_wg < 128 || ((i == 2 || i == 3) && d > 128), "%s: no flash_block tile at d=%d", names[i],
               d);
        continue;
      }
      const int dvb = (d + 31) / 32 * 32;
      CHECKF(tl_block_local_bytes(blk, d, d) <= devs[i].local_mem && tl_block_local_bytes(blk, d, d) <= 48 * 1024,
             "%s: flash_block tile %dx%d at d=%d needs %zu bytes of local memory", names[i], blk.rm, blk.rn, d,
             tl_block_local_bytes(blk, d, d));
      CHECKF(blk.rm * blk.rn + blk.rm * dvb / 8 <= tl_block_budget(&devs[i]),
             "%s: flash_block scores and accumulator of %d floats at d=%d", names[i],
             blk.rm * blk.rn + blk.rm * dvb / 8, d);
    }
  /* the largest tile wherever it fits: 4 x 4 at d = 64 */
  tl_device nv = nvidia_like();
  tl_block blk;
  CHECK(tl_flash_block(&nv, 64, 64, &blk) == 0 && blk.rm == 4 && blk.rn == 4);
  /* RDNA's wave32 work-items have half the registers (tools/scripts/gpu-codegen.sh:
   * 4 x 4 and 2 x 4 spill on gfx1100): one row each up to d = 128 */
  CHECK(tl_flash_block(&rdna, 64, 64, &blk) == 0 && blk.rm == 1 && blk.rn == 4);
  CHECK(tl_flash_block(&rdna, 128, 128, &blk) == 0 && blk.rm == 1 && blk.rn == 2);
  CHECK(tl_flash_block(&rdna, 256, 256, &blk) != 0);
  tl_device cdna = amd_like();
  CHECK(tl_flash_block(&cdna, 64, 64, &blk) == 0 && blk.rm == 4 && blk.rn == 4);
  /* Intel's Xe GPUs spilled 4 x 4 and 2 x 4 (tools/scripts/gpu-codegen.sh,
   * tgllp and dg2): one row of 4 keys each up to d = 128; Intel's CPU
   * runtime (the work-group kernels forced) keeps the largest */
  tl_device xe = intel_like();
  CHECK(tl_flash_block(&xe, 64, 64, &blk) == 0 && blk.rm == 1 && blk.rn == 4);
  CHECK(tl_flash_block(&xe, 128, 128, &blk) == 0 && blk.rm == 1 && blk.rn == 4);
  xe.type = CL_DEVICE_TYPE_CPU;
  CHECK(tl_flash_block(&xe, 64, 64, &blk) == 0 && blk.rm == 4 && blk.rn == 4);
  /* a device that cannot run 128 work-items per group gets none */
  nv.max_wg = 64;
  CHECK(tl_flash_block(&nv, 64, 64, &blk) != 0);
}

/* The tuned tile (block_rm x block_rn): only the pairs the kernel is built
 * with are allowed; 0 x 0 is tl_flash_block's choice; a tuned pair is kept
 * where its local memory fits (the register budget is the tuning's to
 * override) and otherwise stepped down per head dim to the next smaller
 * pair that fits, never to nothing while 1x1 fits. */
static void tuned_block_tile_steps_down_per_head_dim(void) {
  static const int allowed[][2] = {{0, 0}, {4, 4}, {2, 4}, {1, 4}, {1, 2}, {1, 1}};
  static const int refused[][2] = {{3, 4}, {4, 2}, {2, 2}, {0, 4}, {4, 0}, {8, 8}, {2, 1}, {-1, -1}};
  for (size_t i = 0; i < sizeof allowed / sizeof allowed[0]; i++)
    CHECKF(tl_block_allowed(allowed[i][0], allowed[i][1]), "%dx%d refused", allowed[i][0], allowed[i][1]);
  for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++)
    CHECKF(!tl_block_allowed(refused[i][0], refused[i][1]), "%dx%d allowed", refused[i][0], refused[i][1]);

  tl_device rdna = amd_like();
  rdna.pref_multiple = 32;
  const tl_device devs[] = {nvidia_like(), amd_like(), intel_like(), rdna, cpu_like()};
  const char *names[] = {"nvidia-like", "amd-like", "intel-like", "rdna-like", "cpu-like"};
  static const tl_block pairs[] = {{4, 4}, {2, 4}, {1, 4}, {1, 2}, {1, 1}};
  for (int i = 0; i < 5; i++)
    for (int d = 1; d <= 256; d += d < 64 ? 7 : 16) {
      tl_block chosen, tuned;
      const int has = tl_flash_block(&devs[i], d, d, &chosen) == 0;
      CHECKF(tl_flash_block_tuned(&devs[i], d, d, (tl_block){0, 0}, &tuned) == (has ? 0 : -1) &&
                 (!has || (tuned.rm == chosen.rm && tuned.rn == chosen.rn)),
             "%s: 0x0 at d=%d is not tl_flash_block's choice", names[i], d);
      for (size_t p = 0; p < sizeof pairs / sizeof pairs[0]; p++) {
        if (tl_flash_block_tuned(&devs[i], d, d, pairs[p], &tuned) != 0) {
          /* nothing fits: not even 1x1's local memory */
          CHECKF(tl_block_local_bytes((tl_block){1, 1}, d, d) > 48 * 1024, "%s: tuned %dx%d at d=%d: none", names[i],
                 pairs[p].rm, pairs[p].rn, d);
          continue;
        }
        size_t at = 0, want = p;
        while (pairs[at].rm != tuned.rm || pairs[at].rn != tuned.rn) at++;
        CHECKF(at >= want, "%s: tuned %dx%d at d=%d grew to %dx%d", names[i], pairs[p].rm, pairs[p].rn, d, tuned.rm,
               tuned.rn);
        CHECKF(tl_block_local_bytes(tuned, d, d) <= 48 * 1024 && tl_block_local_bytes(tuned, d, d) <= devs[i].local_mem,
               "%s: tuned %dx%d at d=%d: %dx%d does not fit local memory", names[i], pairs[p].rm, pairs[p].rn, d,
               tuned.rm, tuned.rn);
        /* each pair skipped on the way down did not fit */
        for (size_t k = want; k < at; k++)
          CHECKF(tl_block_local_bytes(pairs[k], d, d) > 48 * 1024, "%s: tuned %dx%d at d=%d skipped %dx%d", names[i],
                 pairs[p].rm, pairs[p].rn, d, pairs[k].rm, pairs[k].rn);
      }
    }
  /* nvidia-like (48 KiB): a tuned 4x4 is 4x4 at d = 64, 2x4 at d = 128, 1x2 at d = 256 */
  tl_device nv = nvidia_like();
  tl_block blk;
  CHECK(tl_flash_block_tuned(&nv, 64, 64, (tl_block){4, 4}, &blk) == 0 && blk.rm == 4 && blk.rn == 4);
  CHECK(tl_flash_block_tuned(&nv, 128, 128, (tl_block){4, 4}, &blk) == 0 && blk.rm == 2 && blk.rn == 4);
  CHECK(tl_flash_block_tuned(&nv, 256, 256, (tl_block){4, 4}, &blk) == 0 && blk.rm == 1 && blk.rn == 2);
  /* smaller than the choice: kept */
  CHECK(tl_flash_block_tuned(&nv, 64, 64, (tl_block){1, 2}, &blk) == 0 && blk.rm == 1 && blk.rn == 2);
  /* RDNA: the register budget gives 1x4 at d = 64; a tuned 4x4 overrides it */
  CHECK(tl_flash_block_tuned(&rdna, 64, 64, (tl_block){4, 4}, &blk) == 0 && blk.rm == 4 && blk.rn == 4);
  /* the step down after building: a tuned tile by local memory alone, a
   * chosen one by the register budget too */
  blk = (tl_block){4, 4};
  CHECK(tl_flash_block_step(&rdna, 64, 64, 1, &blk) == 0 && blk.rm == 2 && blk.rn == 4);
  blk = (tl_block){4, 4};
  CHECK(tl_flash_block_step(&rdna, 64, 64, 0, &blk) == 0 && blk.rm == 1 && blk.rn == 4);
  blk = (tl_block){1, 1};
  CHECK(tl_flash_block_step(&nv, 64, 64, 1, &blk) == -1);
  /* a device that cannot run 128 work-items per group gets none, tuned or not */
  nv.max_wg = 64;
  CHECK(tl_flash_block_tuned(&nv, 64, 64, (tl_block){1, 1}, &blk) != 0);
}

/* flash_tiled's tuned key tile (flash_tile, CLATTN_FLASH_TILE): taken where
 * its K and V tiles fit local memory, halved per head dim where they do not;
 * 0 is the choice (32 where it fits). Only the fused program's FLASH_TILE
 * changes. */
static void tuned_flash_tile_steps_down_per_head_dim(void) {
  const tl_device d = nvidia_like(); /* 48 KiB of local memory */
  CHECK(tl_flash_tile(&d, 64, 64, 0) == 32 && tl_flash_tile(&d, 64, 64, 64) == 64);
  CHECK(tl_flash_tile(&d, 128, 128, 8) == 8);
  /* 64 keys of K and V at d = 256 are 128 KiB: 16 keys (32 KiB) fit */
  CHECKF(tl_flash_tile(&d, 256, 256, 64) == 16, "got %d", tl_flash_tile(&d, 256, 256, 64));
  CHECK(tl_flash_tile(&d, 256, 256, 0) == 16);
  for (int want = 0; want <= 64; want = want ? want * 2 : 1)
    for (int dk = 1; dk <= 1024; dk = dk * 2 + 3) {
      const int tile = tl_flash_tile(&d, dk, dk, want);
      CHECKF(tile >= 1 && (want == 0 || tile <= want) && (size_t)tile * 2 * dk * sizeof(float) + 64 <= d.local_mem,
             "tuned %d at d=%d: %d keys", want, dk, tile);
    }
  tl_tiles t = tl_choose(&d);
  ca_program_text core0, fused0, core1, fused1;
  ca_core_text(&t, CLATTN_F32, &core0);
  ca_fused_text(&t, &d, 64, 64, CLATTN_F32, CLATTN_DTYPE_SAME, CLATTN_DTYPE_SAME, &fused0);
  t.flash_tile = 8;
  ca_core_text(&t, CLATTN_F32, &core1);
  ca_fused_text(&t, &d, 64, 64, CLATTN_F32, CLATTN_DTYPE_SAME, CLATTN_DTYPE_SAME, &fused1);
  CHECKF(strstr(fused0.options, "-D FLASH_TILE=32 ") && strstr(fused1.options, "-D FLASH_TILE=8 "),
         "fused options: %s -> %s", fused0.options, fused1.options);
  CHECK(strcmp(core0.options, core1.options) == 0);
}

/* flash_rows' vector width from the device's float vector widths: the
 * wider, as a power of two in 4..16; 16 when neither is reported. The key
 * block (2 VW) then divides the fused options' FLASH_VW. */
static void flash_vector_width_follows_the_device(void) {
  const struct {
    cl_uint pref, native;
    int vw;
  } cases[] = {{16, 16, 16}, {8, 8, 8},    {4, 8, 8},  {8, 16, 16}, {1, 1, 4}, {0, 1, 4},
               {0, 0, 16},   {32, 32, 16}, {12, 0, 8}, {3, 3, 4},   {4, 4, 4}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    tl_device d = cpu_like();
    d.vec_float_pref = cases[i].pref;
    d.vec_float_native = cases[i].native;
    CHECKF(ca_flash_vw(&d) == cases[i].vw, "preferred %u, native %u: %d, want %d", cases[i].pref, cases[i].native,
           ca_flash_vw(&d), cases[i].vw);
  }
  /* rows per work-item: 8 with AVX-512's width (32 registers), 4 with
   * AVX2's or SSE's (16 registers), 4 on GPUs */
  tl_device d = cpu_like();
  CHECK(ca_flash_bm(&d, 16) == 8 && ca_flash_bm(&d, 8) == 4 && ca_flash_bm(&d, 4) == 4);
  const tl_device gpu = nvidia_like();
  CHECK(ca_flash_bm(&gpu, ca_flash_vw(&gpu)) == 4 && ca_flash_bm(&gpu, 16) == 4);
  tl_tiles t = tl_choose(&d);
  t.flash_vw = ca_flash_vw(&d);
  CHECK(tl_clamp(&t, &d) == 0 && t.flash_vw == 8);
  ca_program_text fused;
  ca_fused_text(&t, &d, 64, 64, CLATTN_F32, CLATTN_DTYPE_SAME, CLATTN_DTYPE_SAME, &fused);
  CHECKF(strstr(fused.options, "-D FLASH_VW=8") != NULL, "fused options: %s", fused.options);
}

/* Vendor knowledge comes from the rules table, each value saying where in
 * it it was found: device, architecture, vendor, device type, default. */
static void device_rules_come_from_the_table(void) {
  const char *from = "";
  tl_device rdna = amd_like();
  rdna.pref_multiple = 32;
  CHECKF(ca_rule(&rdna, CA_RULE_BLOCK_BUDGET, &from) == 18 && !strcmp(from, "architecture amd-rdna"),
         "RDNA's budget from %s", from);
  const tl_device gcn = amd_like(), intel = intel_like(), nvidia = nvidia_like(), cpu = cpu_like();
  CHECKF(ca_rule(&gcn, CA_RULE_BLOCK_BUDGET, &from) == 48 && !strcmp(from, "default"), "CDNA's budget from %s", from);
  CHECKF(ca_rule(&intel, CA_RULE_BLOCK_BUDGET, &from) == 20 && !strcmp(from, "vendor intel-gpu"),
         "Intel's budget from %s", from);
  CHECK(ca_rule(&intel, CA_RULE_SLOT_UNITS, NULL) == 8 && ca_rule(&nvidia, CA_RULE_SLOT_UNITS, NULL) == 1);
  /* Intel's CPU runtime is Intel's, but no GPU: the CPU rules */
  CHECKF(ca_rule(&cpu, CA_RULE_SLOT_UNITS, &from) == 1 && ca_rule(&cpu, CA_RULE_GROUPS_PER_UNIT, &from) == 4 &&
             !strcmp(from, "device type cpu"),
         "a CPU's groups per unit from %s", from);
  CHECK(ca_rule(&nvidia, CA_RULE_GROUPS_PER_UNIT, NULL) == 0 && ca_rule(&nvidia, CA_RULE_COMMAND_BUFFERS, NULL) == 1 &&
        ca_rule(&cpu, CA_RULE_COMMAND_BUFFERS, NULL) == 0);
  CHECK(ca_rule(&nvidia, CA_RULE_BLOCK_PRIVATE, NULL) == 64 && ca_rule(&cpu, CA_RULE_BLOCK_PRIVATE, NULL) == -1);
  /* x86's prefetch instruction for an Intel CPU (the runtime's kernels do not say x86-64), not for others */
  tl_device amd_cpu = cpu_like();
  amd_cpu.vendor_id = TL_VENDOR_AMD;
  CHECKF(ca_rule(&cpu, CA_RULE_X86_PREFETCH, &from) == 1 && !strcmp(from, "vendor intel-cpu"),
         "an Intel CPU's prefetches from %s", from);
  CHECK(ca_rule(&amd_cpu, CA_RULE_X86_PREFETCH, NULL) == 0 && ca_rule(&intel, CA_RULE_X86_PREFETCH, NULL) == 0);
  CHECK(!strcmp(ca_architecture(&cpu), "cpu-avx2") && !strcmp(ca_architecture(&nvidia), "nvidia") &&
        !strcmp(ca_architecture(&intel), "intel-xe"));
}

int main(int argc, char **argv) {
  static const ct_test tests[] = {
      CT_TEST(device_rules_come_from_the_table),
      CT_TEST(gpu_tiles_fit_and_fill_a_warp),
      CT_TEST(cpu_tiles_are_wide_and_short),
      CT_TEST(small_device_is_clamped_to_its_limits),
      CT_TEST(oversized_tiles_shrink_to_fit),
      CT_TEST(device_that_fits_nothing_is_refused),
      CT_TEST(softmax_sub_group_where_the_group_is_one),
      CT_TEST(each_program_gets_only_its_tiles),
      CT_TEST(retuning_one_tile_leaves_other_programs_alone),
      CT_TEST(block_tiles_fit_local_memory_and_registers),
      CT_TEST(tuned_block_tile_steps_down_per_head_dim),
      CT_TEST(tuned_flash_tile_steps_down_per_head_dim),
      CT_TEST(flash_vector_width_follows_the_device),
  };
  return ct_main(argc, argv, tests, sizeof tests / sizeof tests[0]);
}
