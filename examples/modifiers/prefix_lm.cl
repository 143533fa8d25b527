/* Prefix-LM: the first cap->i[0] keys (the prefix) are seen by every
 * query, the rest causally. */
int clattn_mask_mod(int b, int h, int q_idx, int kv_idx, const clattn_captures *cap) {
  return kv_idx < cap->i[0] || kv_idx <= q_idx;
}
