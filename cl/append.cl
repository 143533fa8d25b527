/*
 * kv_append — clattn_kv_append: new K or V rows (storage store_t, -D
 * CA_DTYPE) written into a cache (storage kv_t, -D CA_KV_DTYPE), contiguous
 * or paged, quantised with ggml's reference rules so the cache reads back in
 * llama.cpp and the other way round:
 *   Q8_0: per 32-element block d = amax / 127 (stored f16, round to nearest
 *         even), id = d ? 1 / d : 0 from the f32 d, q = round(x * id)
 *         (round half away from zero, like roundf);
 *   INT8: per row scale = amax / 127 (f32), same rule for q.
 * New row r of batch row b goes to cache position positions[b] + r; a row
 * past the capacity (contiguous; a paged step's attn.kv_len, the most keys
 * a row may have, so no key is stored rotated at a clamped position) or
 * past the block table, or on a page outside the pool (paged), is skipped:
 * positions live on the device, so only the kernel sees them.
 * With lens (clattn_forward_kvcache's K half), work-item (0, b * kv_heads)
 * also writes batch row b's key count and start for the forward after it
 * (kvcache_lengths' rule): one launch fewer per step.
 * NDRange: (new_len, batch * kv_heads), any work-group shape; one work-item
 * per row (a Q8_0 row's blocks, or an INT8 row's amax, in one pass).
 */

/* a / b correctly rounded: the quotient plus one fma residual step, since
 * OpenCL's single-precision division may be off by 2.5 ulp and d must match
 * ggml's bit for bit. */
static inline float append_div(float a, float b) {
  const float q = a / b;
  if (!isfinite(q) || b == 0.0f) return q;
  return fma(fma(-q, b, a), 1.0f / b, q);
}

/* One element into a 16/32-bit cache (round to nearest even). */
static inline void append_store(__global kv_t *p, ulong i, float x) {
#if CA_KV_DTYPE == 0
  p[i] = x;
#elif CA_KV_DTYPE == 1
  vstore_half_rte(x, 0, p + i);
#elif CA_KV_DTYPE == 2
  uint u = as_uint(x);
  u = isnan(x) ? 0x7fc00000u : u + 0x7fffu + ((u >> 16) & 1u);
  p[i] = (ushort)(u >> 16);
#else
  (void)p; (void)i; (void)x;
#endif
}

/* clattn_forward_kvcache's lengths of batch row b: its keys end at
 * positions[b] + new_len (in 64 bits, clamped to int) and start at
 * leftpad[b], or 0 without leftpad. */
static inline void kvcache_row_lengths(int b, __global const int *positions, int new_len,
                                       __global const int *leftpad, __global int *lens, __global int *starts) {
  lens[b] = (int)clamp((long)positions[b] + new_len, (long)INT_MIN, (long)INT_MAX);
  starts[b] = leftpad ? leftpad[b] : 0;
}

/* ggml's q = roundf(x * id), as an int8. */
static inline char append_q(float x, float id) { return (char)(int)round(x * id); }

__kernel void kv_append(CA_PARAMS(kv_append, args)) {
  CA_UNPACK(kv_append, args)
  const int r = get_global_id(0), bh = get_global_id(1);
  if (r >= new_len) return;
  const int b = bh / kv_heads, h = bh % kv_heads;
  if (lens && r == 0 && h == 0) kvcache_row_lengths(b, positions, new_len, leftpad, lens, starts);
  const long pos = (long)positions[b] + r;
  if (pos < 0 || (capacity > 0 && pos >= capacity)) return; /* past the cache (or a step's keys): skipped */
  const ca_kv_pos at = ca_kv_locate(b, pos, CA_PAGE_PASS);
  if (!at.ok) return;                                   /* off the table or the pool: skipped */
  const ulong in = ca_at(src_off, src_st, b, h, r, 0);
  const ulong out = ca_at(dst_off, dst_st, at.slot, h, at.row, 0);
#if CA_KV_DTYPE == 3
  for (int c0 = 0; c0 < cols; c0 += 32) {
    float amax = 0.0f;
    for (int c = 0; c < 32; c++) amax = fmax(amax, fabs(ca_load(src, in + (ulong)(c0 + c) * src_st.s3)));
    const float d = append_div(amax, 127.0f);
    const float id = d != 0.0f ? append_div(1.0f, d) : 0.0f;
    const ulong blk = out + (ulong)(c0 / 32) * dst_st.s3;
    vstore_half_rte(d, 0, (__global half *)(dst + blk));
    __global char *qs = (__global char *)(dst + blk + 2);
    for (int c = 0; c < 32; c++) qs[c] = append_q(ca_load(src, in + (ulong)(c0 + c) * src_st.s3), id);
  }
  (void)scale; (void)scale_off; (void)scale_st;
#elif CA_KV_DTYPE == 4
  float amax = 0.0f;
  for (int c = 0; c < cols; c++) amax = fmax(amax, fabs(ca_load(src, in + (ulong)c * src_st.s3)));
  const float d = append_div(amax, 127.0f);
  const float id = d != 0.0f ? append_div(1.0f, d) : 0.0f;
  for (int c = 0; c < cols; c++) dst[out + (ulong)c * dst_st.s3] = append_q(ca_load(src, in + (ulong)c * src_st.s3), id);
  scale[ca_at(scale_off, scale_st, at.slot, h, at.row, 0)] = d;
#else
  for (int c = 0; c < cols; c++) append_store(dst, out + (ulong)c * dst_st.s3, ca_load(src, in + (ulong)c * src_st.s3));
  (void)scale; (void)scale_off; (void)scale_st;
#endif
}
