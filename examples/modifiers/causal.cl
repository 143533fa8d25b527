/* Causal: a query sees its own position and the keys before it. */
int clattn_mask_mod(int b, int h, int q_idx, int kv_idx, const clattn_captures *cap) {
  return kv_idx <= q_idx;
}
