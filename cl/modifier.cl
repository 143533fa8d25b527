/*
 * The caller's modifiers on their own (common.h.cl's CA_MOD_*): the
 * classes of a block mask, and a pointwise evaluation the host's fp64
 * reference uses (the modifiers are OpenCL C: the device is what runs them).
 */

/*
 * mod_blocks — one work-item per block (kv block, q block, batch * heads):
 * the mask modifier over the block's pairs (rows i < q_len, keys j <
 * kv_len; q_idx = kv_len - q_len + i), then CA_BM_EMPTY (it allows none),
 * CA_BM_FULL (all) or CA_BM_PARTIAL. Without CA_MOD_MASK every block is
 * full. NDRange: (kv_blocks, q_blocks, batch * heads).
 */
__kernel void mod_blocks(CA_PARAMS(mod_blocks, args)) {
  CA_UNPACK(mod_blocks, args)
  CA_MOD_CAPTURES
  const int kb = get_global_id(0), qb = get_global_id(1), bh = get_global_id(2);
  if (kb >= kv_blocks || qb >= q_blocks) return;
  const int b = bh / heads, h = bh % heads;
  const ca_seq sq = {0, 0, q_len, kv_len, q_len, kv_len};
  bool any = false, all = true;
  const int i_end = min(q_len, (qb + 1) * block_q), j_end = min(kv_len, (kb + 1) * block_k);
  for (int i = qb * block_q; i < i_end; i++)
    for (int j = kb * block_k; j < j_end; j++) {
      const bool allowed = CA_MOD_ALLOWS(b, h, i, j, sq);
      any = any || allowed;
      all = all && allowed;
    }
  (void)sq;
  classes[((ulong)bh * (ulong)q_blocks + (ulong)qb) * (ulong)kv_blocks + (ulong)kb] =
      !any ? CA_BM_EMPTY : all ? CA_BM_FULL : CA_BM_PARTIAL;
}

/*
 * mod_eval — the modifiers at n points (b, h, q_idx, kv_idx) = at[4 e ..
 * 4 e + 3]: allowed[e] the mask modifier's verdict (1 without one),
 * grads[e] (where given) the score modifier's derivative at scores[e] (1
 * without one), then scores[e] replaced by the score modifier of it.
 * NDRange: (n).
 */
__kernel void mod_eval(CA_PARAMS(mod_eval, args)) {
  CA_UNPACK(mod_eval, args)
  CA_MOD_CAPTURES
  const int e = get_global_id(0);
  if (e >= n) return;
  const int b = at[4 * e], h = at[4 * e + 1], q_idx = at[4 * e + 2], kv_idx = at[4 * e + 3];
#ifdef CA_MOD_MASK
  allowed[e] = clattn_mask_mod(b, h, q_idx, kv_idx, ca_cap) != 0;
#else
  allowed[e] = 1;
#endif
#ifdef CA_MOD_GRAD
  if (grads) grads[e] = clattn_score_mod_grad(scores[e], b, h, q_idx, kv_idx, ca_cap);
#else
  if (grads) grads[e] = 1.0f;
#endif
  scores[e] = CA_MOD_SCORE_AT(scores[e], b, h, q_idx, kv_idx, 0, 0);
}
