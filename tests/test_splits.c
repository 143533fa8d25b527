/* The split-KV rule (ca_plan_splits, FlashAttention-2's num_splits_heuristic)
 * and flash_decode's key tile (tl_decode_keys) from made-up devices: worked
 * examples, the rule's own statement checked over a grid of shapes, and
 * the ranges covering [0, kv_len). */
#include <math.h>

#include "check.h"
#include "api/api.h"
#include "device/tiles.h"

enum { MIN_KEYS = 256 }; /* plan.c's MIN_SPLIT_KEYS */

static tl_device gpu(cl_uint cus, size_t max_wg, cl_ulong local, cl_uint vendor) {
  tl_device d = {CL_DEVICE_TYPE_GPU, local, max_wg, {max_wg, max_wg, 64}, 32, cus, 0, 0, vendor, 0, 1024, 64, 1, 1, 0, "", {0}, 0};
  return d;
}

static tl_device cpu(cl_uint cus) {
  tl_device d = {CL_DEVICE_TYPE_CPU, 1 << 20, 4096, {4096, 4096, 4096}, 8, cus, 0, 0, 0, 0, 1024, 64, 16, 16, 0, "", {0}, 0};
  return d;
}

static const cl_uint NVIDIA = 0x10de, AMD = 0x1002, INTEL = 0x8086;

/* Worked by hand from the rule. */
static void worked_examples(void) {
  /* H100-like: 132 SMs, 1024-item groups: 16 groups of 64 per SM, 2112 slots */
  const tl_device h100 = gpu(132, 1024, 48 * 1024, NVIDIA);
  ca_splits sp = ca_plan_splits(&h100, 64, 2000, 1 << 20, 16);
  CHECKF(sp.n_splits == 1 && sp.split_keys == 1 << 20, "2000 groups fill 2112 slots: %zu splits", sp.n_splits);
  /* 8 groups, 4096 keys: 16 blocks of 256; efficiency grows with the count,
   * and 14, 15 leave ceil(16 / s) = 2 like 13: 16 splits of 256 keys */
  sp = ca_plan_splits(&h100, 64, 8, 4096, 16);
  CHECKF(sp.n_splits == 16 && sp.split_keys == 256, "8 groups, 4096 keys: %zu x %d", sp.n_splits, sp.split_keys);
  /* the kernel's work-group size counts: 1000 groups of 128 fill 1056 slots, of 64 they do not */
  CHECK(ca_plan_splits(&h100, 128, 1000, 65536, 16).n_splits == 1);
  CHECK(ca_plan_splits(&h100, 64, 1000, 65536, 16).n_splits > 1);
  /* MI200-like reporting 256-item groups: 4 per CU, 384 slots; 100 groups:
   * efficiencies .26 .52 .78 .52 .65 .78 .91: 7 splits of 9376 keys */
  const tl_device mi = gpu(96, 256, 64 * 1024, AMD);
  sp = ca_plan_splits(&mi, 64, 100, 65536, 16);
  CHECKF(sp.n_splits == 7 && sp.split_keys == 9376, "100 groups on 384 slots: %zu x %d", sp.n_splits, sp.split_keys);
  /* Intel: 96 EUs are 12 subslices, 8 groups of 64 each: 96 slots, which
   * 80 groups fill; the same numbers from another vendor are 768 slots */
  const tl_device intel = gpu(96, 512, 64 * 1024, INTEL), other = gpu(96, 512, 64 * 1024, AMD);
  CHECK(ca_plan_splits(&intel, 64, 80, 65536, 16).n_splits == 1);
  CHECK(ca_plan_splits(&other, 64, 80, 65536, 16).n_splits > 1);
  /* CPUs: four groups per compute unit; 1 group on 2 units: 8 slots, 8 splits */
  const tl_device two = cpu(2);
  sp = ca_plan_splits(&two, 1, 1, 4099, 16);
  CHECKF(sp.n_splits == 8, "1 group on a 2-unit CPU: %zu splits", sp.n_splits);
  /* flash_rows' 32-key blocks (AVX-512): ceil(4099 / 8) = 513 -> 544 keys, still 8 ranges */
  sp = ca_plan_splits(&two, 1, 1, 4099, 32);
  CHECKF(sp.n_splits == 8 && sp.split_keys == 544, "32-key blocks: %zu x %d", sp.n_splits, sp.split_keys);
  CHECK(ca_plan_splits(&two, 1, 7, 4099, 16).n_splits == 1);
  /* too few keys to split: under two blocks of MIN_KEYS */
  CHECK(ca_plan_splits(&h100, 64, 1, 2 * MIN_KEYS - 1, 16).n_splits == 1);
}

static double efficiency(size_t items, size_t s, size_t slots) {
  const double waves = (double)items * (double)s / (double)slots;
  return waves / ceil(waves);
}

/* The rule as stated, over a grid: no split when 80% of the slots are full;
 * else the count is eligible (changes ceil(blocks / s)), within 85% of the
 * best eligible efficiency, and no smaller eligible count is. The ranges
 * cover [0, kv_len), each at least MIN_KEYS keys and a multiple of 16. */
static void the_rule_holds_over_a_grid(void) {
  const tl_device devs[] = {gpu(132, 1024, 48 * 1024, NVIDIA),
                            gpu(110, 1024, 64 * 1024, AMD),
                            gpu(48, 256, 64 * 1024, AMD),
                            gpu(512, 1024, 64 * 1024, INTEL),
                            gpu(24, 256, 64 * 1024, INTEL),
                            cpu(2),
                            cpu(64)};
  const size_t wgs[] = {64, 128, 256};
  const size_t items[] = {1, 2, 3, 5, 8, 13, 32, 100, 400, 5000};
  const int lens[] = {1, 511, 512, 1000, 4099, 65536, 1 << 24};
  int checked = 0, split = 0;
  for (size_t d = 0; d < sizeof devs / sizeof devs[0]; d++)
    for (size_t w = 0; w < 3; w++)
      for (size_t i = 0; i < sizeof items / sizeof items[0]; i++)
        for (size_t n = 0; n < sizeof lens / sizeof lens[0]; n++) {
          const tl_device *dev = &devs[d];
          const int gpu_dev = dev->type == CL_DEVICE_TYPE_GPU;
          const size_t units = gpu_dev && dev->vendor_id == INTEL ? dev->compute_units / 8 : dev->compute_units;
          const size_t slots = units * (gpu_dev ? dev->max_wg / wgs[w] : 4);
          const size_t blocks = (size_t)lens[n] / MIN_KEYS;
          const ca_splits sp = ca_plan_splits(dev, wgs[w], items[i], lens[n], 16);
          checked++;
          if (items[i] >= 0.8 * slots || blocks < 2) {
            if (!CHECKF(sp.n_splits == 1 && sp.split_keys == lens[n], "dev %zu wg %zu items %zu kv %d: %zu splits", d,
                        wgs[w], items[i], lens[n], sp.n_splits))
              return;
            continue;
          }
          size_t max_s = blocks < slots ? blocks : slots;
          if (max_s > 128) max_s = 128;
          double best = 0;
          for (size_t s = 1; s <= max_s; s++)
            if (s == 1 || (blocks + s - 1) / s != (blocks + s - 2) / (s - 1))
              best = fmax(best, efficiency(items[i], s, slots));
          size_t want = 1;
          for (size_t s = 1; s <= max_s; s++)
            if ((s == 1 || (blocks + s - 1) / s != (blocks + s - 2) / (s - 1)) &&
                efficiency(items[i], s, slots) >= 0.85 * best) {
              want = s;
              break;
            }
          /* the count, then ranges of a multiple of 16 that cover kv_len: rounding may drop the last */
          const long long keys = sp.split_keys, total = (long long)sp.n_splits * keys;
          const int ok = want == 1 ? sp.n_splits == 1
                                   : sp.n_splits <= want && sp.n_splits + 1 >= want && keys % 16 == 0 &&
                                         keys >= MIN_KEYS && total >= lens[n] && total - keys < lens[n];
          if (!CHECKF(ok, "dev %zu wg %zu items %zu kv %d: %zu x %d, the rule says %zu", d, wgs[w], items[i], lens[n],
                      sp.n_splits, sp.split_keys, want))
            return;
          split += sp.n_splits > 1;
        }
  printf("  %d plans, %d split\n", checked, split);
  CHECK(split > checked / 10);
}

/* flash_decode's tile: 32 keys where Q, K/V and score tiles fit 48 KiB, 16
 * for head dim 256, none for 512 or a device without 64-item groups. */
/* The kv_len range an answer states holds it: every kv_len in the range
 * gets the same number of splits, unsplit with split_keys = kv_len (a
 * plan's step patches kv_len into a list planned for another). */
static void answers_hold_over_their_range(void) {
  const tl_device devs[] = {gpu(132, 1024, 48 * 1024, NVIDIA), gpu(8, 256, 64 * 1024, AMD), cpu(2), cpu(16)};
  const size_t items[] = {0, 1, 3, 8, 40, 2000};
  const int lens[] = {1, 300, 511, 512, 700, 1023, 4096, 70000};
  long ranges = 0;
  for (size_t d = 0; d < sizeof devs / sizeof devs[0]; d++)
    for (size_t i = 0; i < sizeof items / sizeof items[0]; i++)
      for (size_t n = 0; n < sizeof lens / sizeof lens[0]; n++) {
        const ca_splits sp = ca_plan_splits(&devs[d], 64, items[i], lens[n], 16);
        CHECKF(sp.same_lo <= lens[n] && lens[n] <= sp.same_hi, "kv_len %d outside its range [%d, %d]", lens[n],
               sp.same_lo, sp.same_hi);
        CHECKF(sp.n_splits == 1 || sp.same_lo == sp.same_hi, "%zu splits of kv_len %d hold over [%d, %d]",
               sp.n_splits, lens[n], sp.same_lo, sp.same_hi);
        const int lo = sp.same_lo > lens[n] - 600 ? sp.same_lo : lens[n] - 600;
        const int hi = sp.same_hi < lens[n] + 600 ? sp.same_hi : lens[n] + 600;
        for (int kv = lo; kv <= hi; kv++) {
          const ca_splits at = ca_plan_splits(&devs[d], 64, items[i], kv, 16);
          if (!CHECKF(at.n_splits == sp.n_splits && (sp.n_splits > 1 || at.split_keys == kv),
                      "device %zu, %zu items: kv_len %d in [%d, %d] (from %d) gives %zu splits of %d keys", d,
                      items[i], kv, sp.same_lo, sp.same_hi, lens[n], at.n_splits, at.split_keys))
            return;
        }
        ranges++;
      }
  printf("  %ld answers, each the same over its kv_len range\n", ranges);
}

static void decode_tile_fits_local_memory(void) {
  const tl_device nv = gpu(132, 1024, 48 * 1024, NVIDIA);
  CHECK(tl_decode_keys(&nv, 128, 128) == 32);
  CHECK(tl_decode_keys(&nv, 111, 80) == 32);
  CHECK(tl_decode_keys(&nv, 256, 256) == 16);
  CHECK(tl_decode_keys(&nv, 512, 512) == 0);
  CHECK(tl_decode_local_bytes(32, 128, 128) == 4 * (16 * 128 + 32 * 129 + 16 * 32 + 48));
  const tl_device small = gpu(4, 32, 48 * 1024, NVIDIA);
  CHECK(tl_decode_keys(&small, 64, 64) == 0);
  const tl_device little_local = gpu(4, 256, 20 * 1024, AMD);
  CHECK(tl_decode_keys(&little_local, 128, 128) == 16);
  for (int d = 1; d <= 300; d += 7) {
    const int keys = tl_decode_keys(&nv, d, 301 - d);
    CHECKF(keys == 0 || tl_decode_local_bytes(keys, d, 301 - d) <= 48 * 1024, "dk %d: %d keys", d, keys);
  }
}

int main(int argc, char **argv) {
  static const ct_test tests[] = {
      CT_TEST(worked_examples),
      CT_TEST(the_rule_holds_over_a_grid),
      CT_TEST(answers_hold_over_their_range),
      CT_TEST(decode_tile_fits_local_memory),
  };
  return ct_main(argc, argv, tests, sizeof tests / sizeof tests[0]);
}
