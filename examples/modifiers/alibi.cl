/* ALiBi: head h's slope 2^(-8 (h + 1) / H), H = cap->i[0] query heads,
 * times the distance between query and key. */
float clattn_score_mod(float score, int b, int h, int q_idx, int kv_idx, const clattn_captures *cap) {
  const float slope = exp2(-8.0f * (float)(h + 1) / (float)cap->i[0]);
  return score - slope * (float)abs(q_idx - kv_idx);
}
float clattn_score_mod_grad(float score, int b, int h, int q_idx, int kv_idx, const clattn_captures *cap) {
  return 1.0f;
}
