/* Sliding window: causal, and at most cap->i[0] positions back. */
int clattn_mask_mod(int b, int h, int q_idx, int kv_idx, const clattn_captures *cap) {
  return kv_idx <= q_idx && q_idx - kv_idx <= cap->i[0];
}
