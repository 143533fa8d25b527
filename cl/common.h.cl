/*
 * Helpers shared by every clattn kernel. The host prepends this file to each
 * program's sources.
 *
 * Views: a tensor is (offset, stride.s0..s3) in elements over a buffer,
 * indexed [batch, head, row, column]. All index arithmetic is 64-bit.
 */

/* Element index of [b, h, r, c] in a view. */
inline ulong ca_at(ulong offset, ulong4 stride, long b, long h, long r, long c) {
  return offset + (ulong)b * stride.s0 + (ulong)h * stride.s1 + (ulong)r * stride.s2 + (ulong)c * stride.s3;
}

/* Whether key j lies inside query i's window (bottom-right aligned: query i
 * sits at key position i + kv_len - q_len); a bound of -1 is unbounded. */
inline bool ca_in_window(long i, long j, int q_len, int kv_len, int window_left, int window_right) {
  long p = i + (long)kv_len - (long)q_len;
  return (window_left < 0 || j >= p - window_left) && (window_right < 0 || j <= p + window_right);
}

/* The number of valid keys of batch row b: kv_lens[b] clamped to [0, kv_len]. */
inline int ca_valid_keys(__global const int *kv_lens, int has_kv_lens, long b, int kv_len) {
  if (!has_kv_lens) return kv_len;
  int n = kv_lens[b];
  return clamp(n, 0, kv_len);
}

/* A maximum that keeps NaN, so a NaN score reaches its row's outputs. */
inline float ca_max_nan(float a, float b) { return (a > b || isnan(a)) ? a : b; }
