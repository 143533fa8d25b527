/* Document masking for packed sequences: cap->buf[0] holds an int document
 * id per position; a query sees the keys of its own document. */
int clattn_mask_mod(int b, int h, int q_idx, int kv_idx, const clattn_captures *cap) {
  __global const int *doc = (__global const int *)cap->buf[0];
  return doc[q_idx] == doc[kv_idx];
}
