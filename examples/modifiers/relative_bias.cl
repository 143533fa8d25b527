/* Relative position bias (T5-style, unbucketed): cap->buf[0] holds
 * 2 R - 1 floats, the bias of distances q_idx - kv_idx from -(R - 1) to
 * R - 1 (R = cap->i[0]); farther distances take the last entry. */
float clattn_score_mod(float score, int b, int h, int q_idx, int kv_idx, const clattn_captures *cap) {
  __global const float *table = (__global const float *)cap->buf[0];
  const int r = cap->i[0];
  return score + table[clamp(q_idx - kv_idx, 1 - r, r - 1) + r - 1];
}
float clattn_score_mod_grad(float score, int b, int h, int q_idx, int kv_idx, const clattn_captures *cap) {
  return 1.0f;
}
