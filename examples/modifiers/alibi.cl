/* ALiBi: cap->buf[0] holds a float slope per query head; the score falls
 * by the slope times the distance between query and key. */
float clattn_score_mod(float score, int b, int h, int q_idx, int kv_idx, const clattn_captures *cap) {
  __global const float *slope = (__global const float *)cap->buf[0];
  return score - slope[h] * (float)abs(q_idx - kv_idx);
}
float clattn_score_mod_grad(float score, int b, int h, int q_idx, int kv_idx, const clattn_captures *cap) {
  return 1.0f;
}
