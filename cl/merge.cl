/*
 * merge_states — combines S partial attention states of the same rows into
 * one. State s of row (b, h, i) holds O_s (normalised over its own keys) and
 * lse_s (natural-log sum of exp of its scores; -INFINITY when it saw no
 * allowed key). With m = max_s lse_s:
 *   w_s = exp(lse_s - m),  lse = m + log(sum_s w_s),  O = sum_s (w_s / sum_s w_s) O_s.
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
__kernel void merge_states(CA_PARAMS(merge_states, args)) {
  CA_UNPACK(merge_states, args)
  const int c0 = get_global_id(0) * MERGE_COLS, i = get_global_id(1);
  const int h = get_global_id(2) % heads, b = get_global_id(2) / heads;
  const int n_cols = min(MERGE_COLS, value_dim - c0);
  const ulong lse_at = ca_at(lse_off, lse_st, b, h, i, 0);
  float m = -INFINITY;
  for (int s = 0; s < n_states; s++) m = ca_max_nan(m, lse[lse_at + (ulong)s * lse_state]);
  const bool empty = m == -INFINITY;
  const float sink = ca_sink(sinks, sinks_at, h);
  m = ca_max_nan(m, sink);
  /* The weights are normalised before they meet O: two states near the
   * largest float then still merge to it, not to inf. */
  float total = 0.0f, acc[MERGE_COLS] = {0.0f};
  for (int s = 0; s < n_states && !empty; s++) total += exp(lse[lse_at + (ulong)s * lse_state] - m);
  if (!empty && sinks) total += exp(sink - m);
  const float inv = empty ? 0.0f : 1.0f / total;
  const ulong o_at = ca_at(o_off, o_st, b, h, i, c0);
  for (int s = 0; s < n_states && !empty; s++) {
    const float w = exp(lse[lse_at + (ulong)s * lse_state] - m) * inv;
    /* a state with weight 0 (lse -inf) adds nothing, whatever its O holds */
    if (w != 0.0f)
      for (int c = 0; c < n_cols; c++) acc[c] += w * o[o_at + (ulong)s * o_state + (ulong)c * o_st.s3];
  }
  for (int c = 0; c < n_cols; c++) ca_store(out, ca_at(out_off, out_st, b, h, i, c0 + c), acc[c]);
  if (c0 == 0) {
    if (want_lse) lse_out[ca_at(lse_out_off, lse_out_st, b, h, i, 0)] = empty ? sink : m + log(total);
    if (empty) ca_raise_empty(empty_flag);
  }
}
