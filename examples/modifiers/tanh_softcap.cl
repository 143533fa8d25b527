/* Tanh soft-capping (Gemma 2, Grok): cap->f[0] tanh(score / cap->f[0]). */
float clattn_score_mod(float score, int b, int h, int q_idx, int kv_idx, const clattn_captures *cap) {
  return cap->f[0] * tanh(score / cap->f[0]);
}
float clattn_score_mod_grad(float score, int b, int h, int q_idx, int kv_idx, const clattn_captures *cap) {
  const float t = tanh(score / cap->f[0]);
  return 1.0f - t * t;
}
