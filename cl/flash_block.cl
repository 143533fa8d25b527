/*
 * flash_block — the fused kernel for GPUs in FlashAttention-2's shape. A
 * work-group of 128 work-items (BLOCK_TY x BLOCK_TX = 16 x 8) owns BLOCK_M
 * consecutive rows of one KV head (numbered as in flash.cl, so the query
 * heads of a GQA group share every K/V tile) and walks the keys in tiles of
 * BLOCK_N staged in local memory. Work-item (ty, tx) computes the scores of
 * rows ty*BLOCK_RM.. x keys tx*BLOCK_RN.. in registers and owns columns
 * tx*BLOCK_CV.. of its rows' outputs, so one float4 local load feeds
 * BLOCK_RM or BLOCK_RN FMAs in QK^T, and BLOCK_RM / BLOCK_CV in PV. Per
 * tile:
 *   K tile -> scores (masked, shaped) -> row maxima through local memory
 *   -> weights into the P tile, row sums through local memory; V tile over
 *   the consumed K tile -> rescale, then P V into the accumulators.
 * The online softmax, sinks, split-KV partial states, lse and the empty-row
 * flag are flash.cl's (flash_store_row); tiles inside every row's key range
 * skip the per-key checks when there is no mask and, with paged K/V, every
 * key's page is in the pool. K and V are loaded through common.h.cl's
 * ca_kv_get (paged, quantised: dequantised into the f32 tiles). A V tile
 * with no NaN or Inf skips the zero-weight guard (0 * finite = 0).
 *
 * Same arguments as flash_rows. Route diagnostics and additive scoring stay
 * with flash_tiled (the host chooses).
 * NDRange: (ceil(group * q_len / BLOCK_M) * 128, batch * kv_heads, n_splits);
 * work-group (128, 1, 1).
 * -D BLOCK_RM, BLOCK_RN: rows and keys of a work-item's score tile
 * (BLOCK_M = 16 BLOCK_RM, BLOCK_N = 8 BLOCK_RN), chosen by tl_flash_block
 * (src/tiles.c), which also counts the local memory, and stepped down by
 * src/registry.c when the built kernel cannot run its group or spills;
 * -D BLOCK_HALF: half K/V tiles for f16 K/V, and with -D BLOCK_HALF_MATH
 * half products in P V (below); -D BLOCK_SG: the sub-group variant
 * (below); -D FLASH_NO_BLOCK leaves the kernel out (CPUs, or no tile fits).
 */
#ifndef FLASH_NO_BLOCK
#ifndef BLOCK_RM
#define BLOCK_RM 4
#endif
#ifndef BLOCK_RN
#define BLOCK_RN 4
#endif
#define BLOCK_TY 16
#define BLOCK_TX 8
#define BLOCK_WG (BLOCK_TY * BLOCK_TX)
#define BLOCK_M (BLOCK_TY * BLOCK_RM)
#define BLOCK_N (BLOCK_TX * BLOCK_RN)
#define DK4 (((DK) + 3) / 4 * 4)            /* head dim in whole float4s, zero-padded */
#define DVB (((DV) + 31) / 32 * 32)         /* value dim in whole float4s per lane */
#define BLOCK_CV (DVB / BLOCK_TX)           /* output columns per work-item */
/* Local row strides, 4 floats past a multiple of the bank count */
#define QS (DK4 + 4)
#define KVS ((DK4 > DVB ? DK4 : DVB) + 4)
#define PS (BLOCK_N + 4)
/* -D BLOCK_HALF (devices with cl_khr_fp16) and f16 K/V: the K/V tile holds
 * the half values as stored, half the local memory and its traffic, and
 * vload_half4 widens them on use (core OpenCL: no half arithmetic). */
#if defined(BLOCK_HALF) && CA_K_DTYPE == 1 && CA_V_DTYPE == 1
typedef half kv_tile_t;
#define KV_TILE_LOAD4(p) vload_half4(0, p)
#define KV_TILE_STORE(x, p) vstore_half(x, 0, p)
#define KV_TILE_FLOATS (BLOCK_N * KVS / 2)
/* -D BLOCK_HALF_MATH (devices with cl_khr_fp16): P V multiplies in half,
 * each weight rounded to half times the value as stored, and accumulates
 * in f32; Q K^T stays f32, as the scores feed exp, where their absolute
 * error counts (and half products of two values could overflow). A weight
 * that rounds to 0 in half mixes nothing in. */
#ifdef BLOCK_HALF_MATH
#pragma OPENCL EXTENSION cl_khr_fp16 : enable
#define BLOCK_PV_HALF
/* element by element: libclc has no convert_float4(half4) (a call, and
 * 16 KiB of scratch, on amdgcn) */
static inline float4 block_widen4(half4 x) { return (float4)((float)x.x, (float)x.y, (float)x.z, (float)x.w); }
#endif
#else
typedef float kv_tile_t;
#define KV_TILE_LOAD4(p) vload4(0, p)
#define KV_TILE_STORE(x, p) (*(p) = (x))
#define KV_TILE_FLOATS (BLOCK_N * KVS)
#endif

/* -D BLOCK_SG=8|16|32 (devices with cl_intel_subgroups that let a kernel
 * require its sub-group size, src/device.c): the group runs as sub-groups
 * of BLOCK_SG consecutive work-items, so a row's BLOCK_TX = 8 work-items
 * are lanes 8k .. 8k+7 of one sub-group, and its tile maxima and sums are
 * reduced by xor shuffles among them (every lane gets the same value:
 * fmax and + are commutative) instead of through local memory and a loop
 * over the partials. */
#ifdef BLOCK_SG
#if BLOCK_SG % BLOCK_TX != 0
#error "BLOCK_SG must be a multiple of BLOCK_TX (8)"
#endif
#define BLOCK_SG_SIZE __attribute__((intel_reqd_sub_group_size(BLOCK_SG)))
static inline float block_row_max(float x) {
  for (uint lane_bit = 1; lane_bit < BLOCK_TX; lane_bit *= 2) x = fmax(x, intel_sub_group_shuffle_xor(x, lane_bit));
  return x;
}
static inline float block_row_sum(float x) {
  for (uint lane_bit = 1; lane_bit < BLOCK_TX; lane_bit *= 2) x += intel_sub_group_shuffle_xor(x, lane_bit);
  return x;
}
#else
#define BLOCK_SG_SIZE
#endif

__kernel __attribute__((reqd_work_group_size(BLOCK_WG, 1, 1))) BLOCK_SG_SIZE void flash_block(FLASH_PARAMS) {
  /* Q and the K/V tile in one array: the compiler cannot then prove the Q
   * tile unchanged across key tiles and hoist it into registers (gfx1100
   * spilled a whole Q row at rm = 1). */
  __local float qkv_tiles[BLOCK_M * QS + KV_TILE_FLOATS];
  __local float p_tile[BLOCK_M * PS];
#ifndef BLOCK_SG
  __local float row_max[BLOCK_M * BLOCK_TX], row_sum[BLOCK_M * BLOCK_TX];
#endif
  __local int row_h[BLOCK_M], row_i[BLOCK_M], row_live[BLOCK_M];
  __local int2 row_keys[BLOCK_M];
  __local int range[4];
  __local int v_unsafe;
#ifdef CA_MOD_MASK
  __local int bm_flags;
#endif
  FLASH_UNPACK
  const int lid = get_local_id(0), ty = lid / BLOCK_TX, tx = lid % BLOCK_TX;
  __local float *const q_tile = qkv_tiles;
  __local kv_tile_t *const kv_tile = (__local kv_tile_t *)(qkv_tiles + BLOCK_M * QS);
  /* This work-item's cells, as base pointers plus constant offsets (which
   * the compiler folds into the local loads instead of keeping an address
   * per cell in a register) */
  __local const float *const my_q = q_tile + ty * BLOCK_RM * QS;       /* its rows of Q */
  __local const kv_tile_t *const my_k = kv_tile + tx * BLOCK_RN * KVS; /* its keys of the K tile */
  __local const kv_tile_t *const my_v = kv_tile + tx * BLOCK_CV;       /* its columns of the V tile */
  __local float *const my_p = p_tile + ty * BLOCK_RM * PS;             /* its rows of P */
#ifndef BLOCK_SG
  __local float *const my_max = row_max + ty * BLOCK_RM * BLOCK_TX;    /* its rows' partial maxima */
  __local float *const my_sum = row_sum + ty * BLOCK_RM * BLOCK_TX;    /* and sums */
#endif
  const int rows_per_kv = group * q_len;
  const int t0 = get_group_id(0) * BLOCK_M;
  const int bhk = get_global_id(1);
  const int split = get_global_id(2), n_splits = get_global_size(2);
  const int b = bhk / kv_heads, hk = bhk % kv_heads;
  const ca_seq sq = ca_sequence(b, q_len, kv_len, CA_SEQ_PASS);
  const int n_valid = sq.keys;

  /* The block's queries, once: consecutive work-items read consecutive columns. */
  for (int e = lid; e < BLOCK_M * DK4; e += BLOCK_WG) {
    const int rr = e / DK4, d = e % DK4, t = min(t0 + rr, rows_per_kv - 1);
    const int h = hk * group + t / q_len, i = t % q_len;
    const bool real = t0 + rr < rows_per_kv && i < sq.rows && d < DK;
    q_tile[rr * QS + d] = real ? ca_load(q, ca_at(q_off, q_st, b, h, sq.q0 + i, d)) : 0.0f;
  }

  /* The block's rows, one per work-item, in local memory: read where they
   * are needed (masking, shaping, the stores) rather than kept in registers,
   * where their loop-invariant address arithmetic would be hoisted and
   * spilled (gfx1100). Padding rows and rows past a packed sequence's end
   * repeat a real row's indices and are never written. The block's key
   * range (the union of its rows' ranges) and the keys every row may see
   * (their intersection), for skipping and fast tiles. */
  if (lid == 0) {
    range[0] = INT_MAX; /* lowest first key */
    range[1] = -1;      /* highest last key */
    range[2] = -1;      /* highest first key */
    range[3] = INT_MAX; /* lowest last key */
  }
  barrier(CLK_LOCAL_MEM_FENCE);
  if (lid < BLOCK_M) {
    const int t = min(t0 + lid, rows_per_kv - 1), i = t % q_len;
    const int2 keys = flash_row_keys(i, sq.align_m, sq.align_n, n_valid, window_left, window_right);
    const bool live = t0 + lid < rows_per_kv && i < sq.rows;
    row_h[lid] = hk * group + t / q_len;
    row_i[lid] = i;
    row_keys[lid] = keys;
    row_live[lid] = live;
    if (live) {
      if (keys.x <= keys.y) {
        atomic_min(&range[0], keys.x);
        atomic_max(&range[1], keys.y);
      }
      atomic_max(&range[2], keys.x <= keys.y ? keys.x : INT_MAX); /* an empty row: no fast tile */
      atomic_min(&range[3], keys.y);
    }
  }
  float m[BLOCK_RM], l[BLOCK_RM];
  float4 acc[BLOCK_RM][BLOCK_CV / 4];
  for (int r = 0; r < BLOCK_RM; r++) {
    m[r] = -INFINITY;
    l[r] = 0.0f;
    for (int g = 0; g < BLOCK_CV / 4; g++) acc[r][g] = (float4)(0.0f);
  }
  barrier(CLK_LOCAL_MEM_FENCE);
  /* Key positions in 64 bits: near kv_len = INT_MAX a split's end and the
   * next tile's start pass 2^31 - 1. */
  const long split_begin = (long)split * split_keys;
  const long split_end = min((long)kv_len, split_begin + split_keys);
  const long j_begin = max(split_begin, (long)range[0]) / BLOCK_N * BLOCK_N;

  /* The block's range is read from local memory per tile, not kept in
   * registers across the loop (64-bit values: gfx1100 spilled them). */
  for (long j0 = j_begin; j0 < min(split_end, (long)range[1] + 1); j0 += BLOCK_N) {
#ifdef CA_MOD_MASK /* the block mask: a tile no row may see is skipped */
    const int tile_cls = ca_bm_group_class(&bm_flags, lid < BLOCK_M && row_live[lid], bm_class, mod, b,
                                           row_h[min(lid, BLOCK_M - 1)], row_i[min(lid, BLOCK_M - 1)], j0,
                                           j0 + BLOCK_N - 1, sq);
    if (tile_cls == CA_BM_EMPTY) continue;
#else
    const int tile_cls = CA_BM_FULL;
#endif
    for (int e = lid; e < BLOCK_N * DK4; e += BLOCK_WG) {
      const int jj = e / DK4, d = e % DK4;
      const long j = j0 + jj;
      KV_TILE_STORE(
          j < n_valid && d < DK ? ca_k_get(k, k_off, k_st, k_scale, k_scale_off, k_scale_st, b, hk, sq.k0 + j, d, CA_PAGE_PASS)
                                : 0.0f,
          kv_tile + jj * KVS + d);
    }
    if (lid == 0) v_unsafe = 0;
    barrier(CLK_LOCAL_MEM_FENCE);

    /* Scores: a BLOCK_RM x BLOCK_RN outer product per float4 of the head dim. */
    float s[BLOCK_RM][BLOCK_RN];
    for (int r = 0; r < BLOCK_RM; r++)
      for (int c = 0; c < BLOCK_RN; c++) s[r][c] = 0.0f;
    for (int d = 0; d < DK4; d += 4) {
      float4 qv[BLOCK_RM], kv[BLOCK_RN];
      for (int r = 0; r < BLOCK_RM; r++) qv[r] = vload4(0, my_q + r * QS + d);
      for (int c = 0; c < BLOCK_RN; c++) kv[c] = KV_TILE_LOAD4(my_k + c * KVS + d);
      for (int r = 0; r < BLOCK_RM; r++)
        for (int c = 0; c < BLOCK_RN; c++)
          s[r][c] = fma(qv[r].w, kv[c].w, fma(qv[r].z, kv[c].z, fma(qv[r].y, kv[c].y, fma(qv[r].x, kv[c].x, s[r][c]))));
    }

    /* Allowed keys keep their shaped score, the others -inf. A fast tile
     * without shaping only scales; any other goes one score at a time
     * through this work-item's own cells of the P tile (free until the
     * weights), so masking and shaping are compiled once, not per cell
     * with every row's addresses live (registers: gfx1100 spilled). */
    const long all_lo = max((long)range[2], split_begin), all_hi = min((long)range[3], split_end - 1);
    const bool fast = !has_mask && j0 >= all_lo && j0 + BLOCK_N - 1 <= all_hi &&
                      ca_kv_rows_ok(b, sq.k0 + j0, BLOCK_N, CA_PAGE_PASS); /* every key's page in the pool */
#if CA_MOD_ANY
    const bool unshaped = false;
#else
    const bool unshaped = fast && !has_bias && !has_alibi && !(softcap > 0.0f);
#endif
    if (unshaped) {
      for (int r = 0; r < BLOCK_RM; r++)
        for (int c = 0; c < BLOCK_RN; c++) s[r][c] *= scale;
    } else {
      for (int r = 0; r < BLOCK_RM; r++)
        for (int c = 0; c < BLOCK_RN; c++) my_p[r * PS + tx * BLOCK_RN + c] = s[r][c];
#pragma unroll 1
      for (int e = 0; e < BLOCK_RM * BLOCK_RN; e++) {
        const int row = ty * BLOCK_RM + e / BLOCK_RN, h = row_h[row], i = row_i[row];
        const int2 keys = row_keys[row];
        const long j = j0 + tx * BLOCK_RN + e % BLOCK_RN;
        bool allowed = fast || (j >= keys.x && j <= keys.y && j >= split_begin && j < split_end);
        if (!fast && allowed && paged) allowed = ca_kv_locate(b, sq.k0 + j, CA_PAGE_PASS).ok; /* page in the pool */
        if (!fast && allowed && has_mask) allowed = mask[ca_at(mask_off, mask_st, b, h, i, j)] != 0;
#if CA_MOD_ANY
        allowed = allowed && row_live[row]; /* the modifiers see the sequence's pairs only */
#endif
        if (allowed && tile_cls != CA_BM_FULL) allowed = CA_MOD_ALLOWS(b, h, i, j, sq);
        const float bias_ij = allowed && has_bias ? ca_bias(CA_BIAS_PASS, b, h, i, j) : 0.0f;
        allowed = allowed && bias_ij != -INFINITY;
        __local float *cell = p_tile + row * PS + tx * BLOCK_RN + e % BLOCK_RN;
        *cell = allowed ? ca_shape(scale * *cell, bias_ij, b, h, i, j, sq.align_m, sq.align_n, CA_SHAPE_PASS)
                        : -INFINITY;
      }
      for (int r = 0; r < BLOCK_RM; r++)
        for (int c = 0; c < BLOCK_RN; c++) s[r][c] = my_p[r * PS + tx * BLOCK_RN + c];
    }
    float row_tile_max[BLOCK_RM]; /* the rows' maxima over the tile */
    for (int r = 0; r < BLOCK_RM; r++) {
      float tile_max = -INFINITY;
      for (int c = 0; c < BLOCK_RN; c++) tile_max = fmax(tile_max, s[r][c]);
#ifdef BLOCK_SG
      row_tile_max[r] = block_row_max(tile_max);
#else
      my_max[r * BLOCK_TX + tx] = tile_max;
#endif
    }
    barrier(CLK_LOCAL_MEM_FENCE); /* maxima written; the K tile is consumed */

    for (int e = lid; e < BLOCK_N * DVB; e += BLOCK_WG) {
      const int jj = e / DVB, c = e % DVB;
      const long j = j0 + jj;
      const float x =
          j < n_valid && c < DV ? ca_v_get(v, v_off, v_st, v_scale, v_scale_off, v_scale_st, b, hk, sq.k0 + j, c, CA_PAGE_PASS)
                                : 0.0f;
      KV_TILE_STORE(x, kv_tile + jj * KVS + c);
      if (!isfinite(x)) v_unsafe = 1;
    }
    float alpha[BLOCK_RM];
    float row_part[BLOCK_RM]; /* this work-item's share of the rows' sums */
    for (int r = 0; r < BLOCK_RM; r++) {
#ifdef BLOCK_SG
      const float tile_max = row_tile_max[r];
#else
      float tile_max = -INFINITY;
      for (int x = 0; x < BLOCK_TX; x++) tile_max = fmax(tile_max, my_max[r * BLOCK_TX + x]);
#endif
      const float m_new = fmax(m[r], tile_max);
      const float m_safe = m_new == -INFINITY ? 0.0f : m_new; /* no -inf - -inf */
      alpha[r] = exp(m[r] - m_safe);
      m[r] = m_new;
      float part = 0.0f;
      for (int c = 0; c < BLOCK_RN; c++) {
        const float p = exp(s[r][c] - m_safe);
#ifdef CA_DROPOUT /* the weight that mixes V; the sum takes every weight */
        const int row = ty * BLOCK_RM + r;
        my_p[r * PS + tx * BLOCK_RN + c] = p * ca_dropout(dropout, b, row_h[row], row_i[row], j0 + tx * BLOCK_RN + c);
#else
        my_p[r * PS + tx * BLOCK_RN + c] = p;
#endif
        part += p;
      }
#ifdef BLOCK_SG
      row_part[r] = block_row_sum(part);
#else
      row_part[r] = part;
      my_sum[r * BLOCK_TX + tx] = part;
#endif
    }
    barrier(CLK_LOCAL_MEM_FENCE); /* weights, sums and the V tile are in place */

    for (int r = 0; r < BLOCK_RM; r++) {
#ifdef BLOCK_SG
      const float tile_sum = row_part[r];
#else
      float tile_sum = 0.0f;
      for (int x = 0; x < BLOCK_TX; x++) tile_sum += my_sum[r * BLOCK_TX + x];
#endif
      l[r] = l[r] * alpha[r] + tile_sum;
      for (int g = 0; g < BLOCK_CV / 4; g++) acc[r][g] *= alpha[r];
    }
    /* P V: a zero weight mixes nothing in, even an Inf or NaN value */
    const bool guard = v_unsafe;
#ifdef BLOCK_PV_HALF
    for (int jj = 0; jj < BLOCK_N; jj++) {
      half4 vv[BLOCK_CV / 4];
      for (int g = 0; g < BLOCK_CV / 4; g++) vv[g] = vload4(0, my_v + jj * KVS + 4 * g);
      for (int r = 0; r < BLOCK_RM; r++) {
        const half p = (half)my_p[r * PS + jj]; /* round to nearest even */
        if (guard && p == (half)0.0f) continue;
        for (int g = 0; g < BLOCK_CV / 4; g++) acc[r][g] += block_widen4((half4)(p) * vv[g]);
      }
    }
#else
    for (int jj = 0; jj < BLOCK_N; jj++) {
      float4 vv[BLOCK_CV / 4];
      for (int g = 0; g < BLOCK_CV / 4; g++) vv[g] = KV_TILE_LOAD4(my_v + jj * KVS + 4 * g);
      for (int r = 0; r < BLOCK_RM; r++) {
        const float p = my_p[r * PS + jj];
        if (guard && p == 0.0f) continue;
        for (int g = 0; g < BLOCK_CV / 4; g++) acc[r][g] = fma((float4)(p), vv[g], acc[r][g]);
      }
    }
#endif
    barrier(CLK_LOCAL_MEM_FENCE); /* P and V consumed before the next tile */
  }

  /* unrolled, however large the stores (f16's): a loop would index acc and
   * so keep every accumulator in scratch memory (gfx90a) */
#pragma unroll
  for (int r = 0; r < BLOCK_RM; r++) {
    const int row = ty * BLOCK_RM + r, h = row_h[row], i = row_i[row];
    if (row_live[row])
      flash_store_cols(acc[r], tx * BLOCK_CV, BLOCK_CV, tx == 0, m[r], l[r], ca_sink(sinks, sinks_at, h), b, h,
                       i, sq.q0 + i, q_heads, kv_heads, q_len, split, n_splits, out, out_off, out_st, lse, lse_off,
                       lse_st, want_lse, part_o, part_lse, empty_flag);
  }
}
#endif /* FLASH_NO_BLOCK */
