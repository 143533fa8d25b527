/*
 * clattn_forward_kvcache's own kernels, built into the kv_append program
 * (storage store_t, -D CA_DTYPE: the call's q and new rows), which then
 * appends and hands over to the forward:
 *
 * kvcache_lengths — the forward's per-row key counts and starts
 *   (append.cl's kvcache_row_lengths: lens[b] = seqlens[b] + new_len,
 *   starts[b] = leftpad[b] or 0), for a step that appends nothing (kv_append
 *   writes them otherwise). NDRange (batch), any work-group shape.
 *
 * kvcache_rotary — a dense rotated copy [B, heads, rows, cols] (store_t,
 *   from dst_at) of a view of q or of the new keys: row r of batch row b
 *   sits at position seqlens[b] + (per_row ? r : 0), clamped to the tables'
 *   rows [0, rot_len); for t < rot_half its pair (x, y) = (x[2t], x[2t+1])
 *   (interleaved, GPT-J) or (x[t], x[t + rot_half]) (GPT-NeoX) becomes
 *   (x c - y s, x s + y c) with c, s = cos, sin [position][t], each product
 *   rounded (FP_CONTRACT OFF: the same bits as the host's f32 arithmetic),
 *   then stored rounded to nearest even; columns past 2 rot_half are copied.
 *   NDRange (rows, batch * heads), any work-group shape; one work-item per
 *   row.
 */

__kernel void kvcache_lengths(CA_PARAMS(kvcache_lengths, args)) {
  CA_UNPACK(kvcache_lengths, args)
  kvcache_row_lengths(get_global_id(0), seqlens, new_len, leftpad, lens, starts);
}

__kernel void kvcache_rotary(CA_PARAMS(kvcache_rotary, args)) {
#pragma OPENCL FP_CONTRACT OFF
  CA_UNPACK(kvcache_rotary, args)
  const int r = get_global_id(0), bh = get_global_id(1);
  if (r >= rows) return;
  const int b = bh / heads, h = bh % heads;
  const long pos = clamp((long)seqlens[b] + (per_row ? r : 0), 0L, (long)rot_len - 1);
  const ulong in = ca_at(src_off, src_st, b, h, r, 0);
  const ulong out = dst_at + ((ulong)bh * rows + r) * cols;
  const ulong cs = cos_t_off + (ulong)pos * cos_t_st.s2, sn = sin_t_off + (ulong)pos * sin_t_st.s2;
  for (int t = 0; t < rot_half; t++) {
    const int ix = interleaved ? 2 * t : t, iy = interleaved ? 2 * t + 1 : t + rot_half;
    const float x = ca_load(src, in + (ulong)ix * src_st.s3), y = ca_load(src, in + (ulong)iy * src_st.s3);
    const float c = cos_t[cs + (ulong)t * cos_t_st.s3], s = sin_t[sn + (ulong)t * sin_t_st.s3];
    const float xc = x * c, ys = y * s, xs = x * s, yc = y * c;
    ca_store(dst, out + ix, xc - ys);
    ca_store(dst, out + iy, xs + yc);
  }
  for (int c = 2 * rot_half; c < cols; c++) ca_store(dst, out + c, ca_load(src, in + (ulong)c * src_st.s3));
}
