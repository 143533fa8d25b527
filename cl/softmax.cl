/*
 * softmax — the staged path's second stage: the masked row softmax.
 *
 * For each row of the score chunk (disallowed keys hold -INFINITY):
 *   m = max_j s_j,  l = sum_j exp(s_j - m),  a_j = exp(s_j - m) / l,
 *   lse = m + log(l) (natural log);
 * a head's sink logit joins m and l as a term without a value.
 * The probabilities (with dropout, the dropped and rescaled ones that mix V:
 * lse and the diagnostics describe the softmax before it) overwrite the
 * scores in place; lse and the routing matrix
 * (weights) are written to their views when asked for, and so are the route
 * diagnostics (entropy, max_weight, argmax: common.h.cl). A row whose maximum is
 * -INFINITY has no allowed key: it gets a = 0, lse = -INFINITY, and sets
 * *empty_flag so the host can apply the EMPTY_ERROR policy.
 *
 * NDRange: (SOFTMAX_WG, rows * heads in the chunk); work-group (SOFTMAX_WG, 1).
 * Each work-item strides over the row, then a fixed tree in local memory
 * combines the partials, so the summation order and the result are fixed.
 *
 * -D SOFTMAX_WG: work-items per row, a power of two (default below).
 * -D SOFTMAX_SG=SOFTMAX_WG (devices with cl_intel_subgroups that let a
 * kernel require its sub-group size, src/device.c): the group is one
 * sub-group of that many lanes, and xor-shuffle butterflies replace the
 * local-memory trees (below), with the same result bit for bit.
 */
#ifndef SOFTMAX_WG
#define SOFTMAX_WG 16
#endif

#ifdef SOFTMAX_SG
#if SOFTMAX_SG != SOFTMAX_WG
#error "SOFTMAX_SG: the work-group is one sub-group, SOFTMAX_SG = SOFTMAX_WG work-items"
#endif
#define SOFTMAX_SG_SIZE __attribute__((intel_reqd_sub_group_size(SOFTMAX_SG)))
/* Butterflies over the lane bits from the highest down: lane l < b takes
 * lane l + b's value as the tree's part[l] takes part[l + b], so lane 0
 * combines the partials in the tree's order, and its value (the others'
 * sums may round otherwise) goes to every lane. */
static inline float softmax_row_max(float x) {
  for (uint lane_bit = SOFTMAX_SG / 2; lane_bit > 0; lane_bit /= 2)
    x = ca_max_nan(x, intel_sub_group_shuffle_xor(x, lane_bit));
  return intel_sub_group_shuffle(x, 0);
}
static inline float softmax_row_sum(float x) {
  for (uint lane_bit = SOFTMAX_SG / 2; lane_bit > 0; lane_bit /= 2) x += intel_sub_group_shuffle_xor(x, lane_bit);
  return intel_sub_group_shuffle(x, 0);
}
/* t's sum and the lowest key index (min is exact in any order) */
static inline void softmax_row_sum_first(float *t, int *first) {
  *t = softmax_row_sum(*t);
  for (uint lane_bit = SOFTMAX_SG / 2; lane_bit > 0; lane_bit /= 2)
    *first = min(*first, intel_sub_group_shuffle_xor(*first, lane_bit));
}
#define SOFTMAX_LOCALS
#define SOFTMAX_ROW_MAX(x) softmax_row_max(x)
#define SOFTMAX_ROW_SUM(x) softmax_row_sum(x)
#define SOFTMAX_ROW_SUM_FIRST(t, first) softmax_row_sum_first(t, first)
#else
#define SOFTMAX_SG_SIZE
/* The fixed trees: part[l] takes part[l + step] for l < step, step halving;
 * every work-item reads the root, and a barrier lets part be written again. */
static inline float softmax_tree_max(__local float *part, int lid, float x) {
  part[lid] = x;
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int step = SOFTMAX_WG / 2; step > 0; step /= 2) {
    if (lid < step) part[lid] = ca_max_nan(part[lid], part[lid + step]);
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  x = part[0];
  barrier(CLK_LOCAL_MEM_FENCE);
  return x;
}
static inline float softmax_tree_sum(__local float *part, int lid, float x) {
  part[lid] = x;
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int step = SOFTMAX_WG / 2; step > 0; step /= 2) {
    if (lid < step) part[lid] += part[lid + step];
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  x = part[0];
  barrier(CLK_LOCAL_MEM_FENCE);
  return x;
}
static inline void softmax_tree_sum_first(__local float *part, __local int *firsts, int lid, float *t, int *first) {
  part[lid] = *t;
  firsts[lid] = *first;
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int step = SOFTMAX_WG / 2; step > 0; step /= 2) {
    if (lid < step) {
      part[lid] += part[lid + step];
      firsts[lid] = min(firsts[lid], firsts[lid + step]);
    }
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  *t = part[0];
  *first = firsts[0];
}
#define SOFTMAX_LOCALS             \
  __local float part[SOFTMAX_WG]; \
  __local int firsts[SOFTMAX_WG]
#define SOFTMAX_ROW_MAX(x) softmax_tree_max(part, lid, x)
#define SOFTMAX_ROW_SUM(x) softmax_tree_sum(part, lid, x)
#define SOFTMAX_ROW_SUM_FIRST(t, first) softmax_tree_sum_first(part, firsts, lid, t, first)
#endif

__kernel __attribute__((reqd_work_group_size(SOFTMAX_WG, 1, 1))) SOFTMAX_SG_SIZE
void softmax_rows(CA_PARAMS(softmax_rows, args)) {
  CA_UNPACK(softmax_rows, args)
  SOFTMAX_LOCALS;
  const int lid = get_local_id(0);
  const int row = get_group_id(1); /* g * rows + r */
  const int g = row / rows, r = row % rows;
  const int bh = bh0 + g;
  const int b = bh / q_heads, h = bh % q_heads;
  const int i = i0 + r;
  __global float *s = scores + (ulong)row * (ulong)kv_len;

  /* keys are counted in 64 bits: j + SOFTMAX_WG passes INT_MAX near kv_len = INT_MAX */
  float m = -INFINITY;
  for (long j = lid; j < kv_len; j += SOFTMAX_WG) m = ca_max_nan(m, s[j]);
  const float m_keys = SOFTMAX_ROW_MAX(m);

  /* A sink is one more logit in the denominator, carrying no value. */
  const float sink = ca_sink(sinks, sinks_at, h);
  const bool empty = (m_keys == -INFINITY);
  m = ca_max_nan(m_keys, sink);
  float l = 0.0f;
  if (!empty)
    for (long j = lid; j < kv_len; j += SOFTMAX_WG) l += exp(s[j] - m);
  const float l_keys = SOFTMAX_ROW_SUM(l);
  l = sinks ? l_keys + exp(sink - m) : l_keys;

  /* rows past a packed sequence's length do not exist: nothing is written */
  const bool in_range = i < ca_sequence(b, q_len, kv_len, CA_SEQ_PASS).rows;
  if (diag) {
    /* t = sum_j exp(s_j - m) (s_j - m), and the first key at the keys' maximum. */
    float t = 0.0f;
    int best = INT_MAX;
    if (!empty)
      for (long j = lid; j < kv_len; j += SOFTMAX_WG) {
        if (s[j] != -INFINITY) t += exp(s[j] - m) * (s[j] - m);
        if (s[j] == m_keys) best = min(best, (int)j);
      }
    SOFTMAX_ROW_SUM_FIRST(&t, &best);
    if (lid == 0 && in_range)
      ca_store_diag(empty, l_keys, l, t, exp(m_keys - m), best == INT_MAX ? -1 : best, b, h, i, CA_DIAG_PASS);
  }
  for (long j = lid; j < kv_len; j += SOFTMAX_WG) {
    /* a disallowed key is 0 even in a NaN row (where -inf - m is NaN);
     * with dropout the weights that mix V (and the weights output) */
    float a = (empty || s[j] == -INFINITY) ? 0.0f : exp(s[j] - m) / l * ca_dropout(dropout, b, h, i, j);
    s[j] = a;
    if (want_weights && in_range) weights[ca_at(weights_off, weights_st, b, h, i, j)] = a;
  }
  if (lid == 0 && in_range) {
    if (want_lse) lse[ca_at(lse_off, lse_st, b, h, i, 0)] = empty ? sink : m + log(l);  /* sink: -inf without */
    if (empty) ca_raise_empty(empty_flag);
  }
}
