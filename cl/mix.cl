/*
 * mix — the staged path's third stage: value mixing, O = A V.
 *
 *   out[b, h, i, c] = sum_j a[g][r][j] * v[b, h / group, j, c]
 * A zero weight contributes nothing, even when its value holds NaN or Inf:
 * disallowed candidates (a = 0) are never mixed in. Keys past kv_lens[b]
 * are not read at all; V is located (paged) and dequantised on load.
 *
 * NDRange: (value columns rounded up to MIX_TV, rows rounded up to MIX_TM,
 * heads in the chunk); work-group (MIX_TV, MIX_TM, 1). The group stages a
 * MIX_TM x MIX_TJ block of A and a MIX_TJ x MIX_TV block of V in local memory
 * per step over the keys.
 *
 * -D MIX_TM, MIX_TV, MIX_TJ: tile sizes (defaults below).
 */
#ifndef MIX_TM
#define MIX_TM 8
#endif
#ifndef MIX_TV
#define MIX_TV 16
#endif
#ifndef MIX_TJ
#define MIX_TJ 16
#endif

__kernel __attribute__((reqd_work_group_size(MIX_TV, MIX_TM, 1)))
void mix_values(CA_PARAMS(mix_values, args)) {
  CA_UNPACK(mix_values, args)
  __local float a_tile[MIX_TM][MIX_TJ];
  __local float v_tile[MIX_TJ][MIX_TV];

  const int lx = get_local_id(0), ly = get_local_id(1);
  const int c = get_global_id(0);
  const int r = get_global_id(1);
  const int g = get_global_id(2);
  const int bh = bh0 + g;
  const int b = bh / q_heads, h = bh % q_heads, hk = h / group;
  const int r0 = get_group_id(1) * MIX_TM; /* first chunk row of this tile */
  const int c0 = get_group_id(0) * MIX_TV; /* first value column of this tile */
  const int lid = ly * MIX_TV + lx;
  const ca_seq sq = ca_sequence(b, q_len, kv_len, CA_SEQ_PASS);
  const int n_keys = sq.keys;
  __global const float *a_rows = probs + (ulong)g * (ulong)rows * (ulong)kv_len;

  float acc = 0.0f;
  for (long j0 = 0; j0 < n_keys; j0 += MIX_TJ) {   /* 64 bits: j0 + MIX_TJ may pass INT_MAX */
    for (int t = lid; t < MIX_TM * MIX_TJ; t += MIX_TM * MIX_TV) {
      int rr = t / MIX_TJ, jj = t % MIX_TJ;
      const int ar = r0 + rr;
      const long j = j0 + jj;
      a_tile[rr][jj] = (ar < rows && j < n_keys) ? a_rows[(ulong)ar * (ulong)kv_len + (ulong)j] : 0.0f;
    }
    for (int t = lid; t < MIX_TJ * MIX_TV; t += MIX_TM * MIX_TV) {
      int cc = t % MIX_TV, jj = t / MIX_TV;
      const int vc = c0 + cc;
      const long j = j0 + jj;
      v_tile[jj][cc] = (vc < value_dim && j < n_keys)
                           ? ca_v_get(v, v_off, v_st, v_scale, v_scale_off, v_scale_st, b, hk, sq.k0 + j, vc, CA_PAGE_PASS)
                           : 0.0f;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int jj = 0; jj < MIX_TJ; jj++) {
      float a = a_tile[ly][jj];
      acc += (a != 0.0f) ? a * v_tile[jj][lx] : 0.0f;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
  }

  const int i = i0 + r;
  if (r < rows && i < sq.rows && c < value_dim) ca_store(out, ca_at(out_off, out_st, b, h, sq.q0 + i, c), acc);
}
