/*
 * merge_states — combines S partial attention states of the same rows into
 * one. State s of row (b, h, i) holds O_s (normalised over its own keys) and
 * lse_s (natural-log sum of exp of its scores; -INFINITY when it saw no
 * allowed key). With m = max_s lse_s:
 *   w_s = exp(lse_s - m),  lse = m + log(sum_s w_s),  O = sum_s w_s O_s / sum_s w_s.
 * A row whose states are all -INFINITY is empty: O = 0, lse = -INFINITY,
 * *empty_flag set. States are combined in index order, so the result is fixed.
 * With sinks, head h's sink logit joins as one more state whose O is 0 (the
 * split-KV path folds the sink here): an empty row then gets lse = sink.
 *
 * Views: o and lse address state 0; state s is s * o_state / s * lse_state
 * elements further. NDRange: (ceil(value_dim / MERGE_COLS), q_len, heads *
 * batch), any work-group shape: each work-item combines MERGE_COLS columns of
 * one row, computing each state's weight once for all of them (a decode
 * step's merge has few rows: parallel columns keep the device busy).
 */
#ifndef MERGE_COLS
#error "MERGE_COLS: the host gives it (src/program_text.h, CA_MERGE_COLS)"
#endif
__kernel void merge_states(__global const float *o, ulong o_off, ulong4 o_st, ulong o_state,
                           __global const float *lse, ulong lse_off, ulong4 lse_st, ulong lse_state,
                           int n_states, int value_dim, int heads,
                           __global store_t *out, ulong out_off, ulong4 out_st,
                           __global float *lse_out, ulong lse_out_off, ulong4 lse_out_st, int want_lse,
                           __global const float *sinks, long sinks_at, __global int *empty_flag) {
  const int c0 = get_global_id(0) * MERGE_COLS, i = get_global_id(1);
  const int h = get_global_id(2) % heads, b = get_global_id(2) / heads;
  const int n_cols = min(MERGE_COLS, value_dim - c0);
  const ulong lse_at = ca_at(lse_off, lse_st, b, h, i, 0);
  float m = -INFINITY;
  for (int s = 0; s < n_states; s++) m = ca_max_nan(m, lse[lse_at + (ulong)s * lse_state]);
  const bool empty = m == -INFINITY;
  const float sink = ca_sink(sinks, sinks_at, h);
  m = ca_max_nan(m, sink);
  float total = 0.0f, acc[MERGE_COLS] = {0.0f};
  const ulong o_at = ca_at(o_off, o_st, b, h, i, c0);
  for (int s = 0; s < n_states && !empty; s++) {
    const float w = exp(lse[lse_at + (ulong)s * lse_state] - m);
    total += w;
    /* a state with weight 0 (lse -inf) adds nothing, whatever its O holds */
    if (w != 0.0f)
      for (int c = 0; c < n_cols; c++) acc[c] += w * o[o_at + (ulong)s * o_state + (ulong)c * o_st.s3];
  }
  if (!empty && sinks_at >= 0) total += exp(sink - m);
  const float inv = empty ? 0.0f : 1.0f / total;
  for (int c = 0; c < n_cols; c++) ca_store(out, ca_at(out_off, out_st, b, h, i, c0 + c), acc[c] * inv);
  if (c0 == 0) {
    if (want_lse) lse_out[ca_at(lse_out_off, lse_out_st, b, h, i, 0)] = empty ? sink : m + log(total);
    if (empty) atomic_or(empty_flag, 1);
  }
}
