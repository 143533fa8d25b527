/*
 * How work is cut, as pure functions of the call and the device:
 *   ca_plan_chunks   the staged and GEMM paths' chunks of query rows
 *   ca_plan_splits   split-KV: how many key ranges, FlashAttention-2's rule
 */
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>

#include "device/rules.h"
#include "plan/plan.h"

enum { MIN_SPLIT_KEYS = 256 }; /* a split smaller than this costs more than it hides */

ca_chunk ca_plan_chunks(const clattn_params *p, size_t budget) {
  size_t row_bytes = (size_t)p->kv_len * sizeof(float);
  size_t fit = budget / row_bytes;
  size_t pairs = (size_t)p->batch * (size_t)p->q_heads;
  ca_chunk c;
  if (fit < 1) fit = 1;
  if (fit >= (size_t)p->q_len) {
    c.rows = p->q_len;
    size_t heads = fit / (size_t)p->q_len;
    c.heads = (int)(heads < pairs ? heads : pairs);
  } else {
    c.rows = (int)fit;
    c.heads = 1;
  }
  /* Keep the softmax's rows x heads grid dimension inside int range. */
  while ((long long)c.heads * c.rows > INT32_MAX / 2 && c.heads > 1) c.heads /= 2;
  return c;
}

/* Splits the keys when the work-groups alone would leave the device partly
 * idle (decode: few query rows, many keys), by FlashAttention-2's rule
 * (num_splits_heuristic): no split when the groups fill 80% of the device's
 * slots; else, of the split counts that change the keys per split, the
 * smallest whose wave efficiency (groups / slots over the whole waves they
 * take) is within 85% of the best. Slots: the device's compute units, in
 * spans of the rules' slot_units (device/rules.c: Intel's GPUs count EUs,
 * a group runs in a subslice), times groups_per_unit (CPUs: 4), or on GPUs
 * max_wg / group_items groups of this kernel. At least MIN_SPLIT_KEYS keys
 * per split, at most 128
 * splits, each a multiple of `multiple` keys (the kernel's key block). A
 * fixed function of the shape and the device, so results stay bitwise
 * repeatable. */
/* The groups of a kernel of group_items work-items the device runs at once. */
static size_t split_slots(const tl_device *dev, size_t group_items) {
  const size_t span = (size_t)ca_rule(dev, CA_RULE_SLOT_UNITS, NULL);
  const size_t per = (size_t)ca_rule(dev, CA_RULE_GROUPS_PER_UNIT, NULL);
  size_t units = dev->compute_units ? dev->compute_units : 1;
  units = units >= span ? units / span : 1;
  const size_t per_unit = per ? per : group_items && dev->max_wg > group_items ? dev->max_wg / group_items : 1;
  return units * per_unit;
}

size_t ca_plan_splits_bound(const tl_device *dev, size_t group_items, int kv_len) {
  size_t bound = split_slots(dev, group_items), blocks = (size_t)kv_len / MIN_SPLIT_KEYS;
  if (bound > 128) bound = 128;
  if (bound > blocks) bound = blocks;
  return bound > 1 ? bound : 1;
}

ca_splits ca_plan_splits(const tl_device *dev, size_t group_items, size_t items, int kv_len, size_t multiple) {
  ca_splits sp = {kv_len, 1, 1, INT_MAX}; /* unsplit whatever the keys */
  const size_t slots = split_slots(dev, group_items);
  const size_t blocks = (size_t)kv_len / MIN_SPLIT_KEYS;
  if (items == 0 || (double)items >= 0.8 * (double)slots) return sp;
  if (blocks < 2) {
    sp.same_hi = 2 * MIN_SPLIT_KEYS - 1;
    return sp;
  }
  size_t max_splits = 128;
  if (max_splits > slots) max_splits = slots;
  if (max_splits > blocks) max_splits = blocks;
  double eff[129] = {0}, best = 0;
  for (size_t s = 1; s <= max_splits; s++) {
    /* only counts that change the blocks per split */
    if (s > 1 && (blocks + s - 1) / s == (blocks + s - 2) / (s - 1)) continue;
    const double waves = (double)items * (double)s / (double)slots;
    eff[s] = waves / ceil(waves);
    if (eff[s] > best) best = eff[s];
  }
  size_t splits = 1;
  while (splits < max_splits && eff[splits] < 0.85 * best) splits++;
  if (splits == 1) { /* a function of the blocks: the same for their every kv_len */
    const size_t last = (blocks + 1) * MIN_SPLIT_KEYS - 1;
    sp.same_lo = (int)(blocks * MIN_SPLIT_KEYS); /* at most kv_len */
    sp.same_hi = last < (size_t)INT_MAX ? (int)last : INT_MAX;
    return sp;
  }
  /* at most kv_len / 2 rounded up to a key block (kv_len >= 512, blocks of
   * at most 32 keys): fits an int, and leaves at least two ranges */
  sp.split_keys = (int)ca_round_up(((size_t)kv_len + splits - 1) / splits, multiple);
  sp.n_splits = ((size_t)kv_len + (size_t)sp.split_keys - 1) / (size_t)sp.split_keys;
  sp.same_lo = sp.same_hi = kv_len; /* split_keys follows kv_len */
  return sp;
}
