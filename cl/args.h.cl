/*
 * Kernel arguments: one description per kernel family, read by the kernels
 * (every program starts with this file) and by the host (src/plan/), so a
 * kernel's parameters, the struct that carries its scalars and the host's
 * record of them come from one list.
 *
 * A family F is a macro CA_ARGS_F(B, V, X, S) listing its arguments:
 *   B(S, T, n)  a buffer: the kernel parameter __global T *n
 *   V(S, T, n)  a strided view: buffer n, and the struct field n (offset and
 *               four strides in elements, common.h.cl's [batch, head, row,
 *               column]); the kernel sees n_off and n_st
 *   X(S, T, n)  a scalar field n of the struct (int, long, ulong, float,
 *               ca_drop)
 * A kernel of family F takes its buffers in order, then one struct, S:
 *   __kernel void k(CA_PARAMS(F, args)) { CA_UNPACK(F, args) ... }
 * CA_UNPACK declares every field (and each view's n_off, n_st) as a local
 * of its own name, so kernel bodies read plain names. Scalars travel as one
 * struct: a launch sets a few arguments, not dozens (the host cost of an
 * enqueue grows with its argument count).
 *
 * The struct's layout is the same on both sides: fields of 4 and 8 bytes,
 * each aligned to its size by host and device compilers alike.
 */
#ifndef CA_ARGS_H
#define CA_ARGS_H

/* OpenCL C: a runtime's compiler defines __OPENCL_VERSION__, an offline
 * one (clang for amdgcn and nvptx) only __OPENCL_C_VERSION__ */
#if defined(__OPENCL_VERSION__) || defined(__OPENCL_C_VERSION__)
#define CA_DEVICE_CODE 1
#endif

#ifdef CA_DEVICE_CODE
typedef struct {
  ulong off, st[4];
} ca_view;
/* Dropout's words (clattn_params.dropout_p; common.h.cl's ca_dropout4):
 * the Philox key (the seed's low, high 32 bits), the offset (low, high),
 * the threshold floor(p 2^32), the factor 1 / (1 - p) as f32 bits; on 0 =
 * no dropout. */
typedef struct {
  uint key_lo, key_hi, offset_lo, offset_hi, threshold, factor, on, pad;
} ca_drop;
/* The caller's modifiers' scalars (clattn_params.capture_f, capture_i)
 * and the block mask's geometry (common.h.cl's ca_bm_row); bm_on 0 = no
 * block mask. */
typedef struct {
  float f[4];
  int i[4];
  int bm_on, bm_q, bm_k, bm_q_len, bm_kv_len, bm_kb;
  ulong bm_bs, bm_hs;
} ca_mod;
/* What a modifier sees (clattn.h's contract): cap->buf[n], f[n], i[n]. */
typedef struct {
  __global const void *buf[4];
  float f[4];
  int i[4];
} clattn_captures;
#define CA_FIELD_T(T) T
#else
#include <CL/cl.h>
typedef struct {
  cl_ulong off, st[4];
} ca_view;
typedef struct {
  cl_uint key_lo, key_hi, offset_lo, offset_hi, threshold, factor, on, pad;
} ca_drop;
/* the host's names of the scalar types */
typedef cl_int ca_field_int;
typedef cl_long ca_field_long;
typedef cl_ulong ca_field_ulong;
typedef cl_float ca_field_float;
typedef ca_drop ca_field_ca_drop;
typedef struct {
  cl_float f[4];
  cl_int i[4];
  cl_int bm_on, bm_q, bm_k, bm_q_len, bm_kv_len, bm_kb;
  cl_ulong bm_bs, bm_hs;
} ca_mod;
typedef ca_mod ca_field_ca_mod;
#define CA_FIELD_T(T) ca_field_##T
#endif

/* ---- groups of arguments several families share ---- */

/* Where each batch row's keys lie (common.h.cl's ca_sequence): valid
 * lengths, left padding, paging; packed variable-length sequences. */
#define CA_ARGS_ROWS(B, V, X, S) \
  B(S, const int, kv_lens) X(S, int, has_kv_lens) B(S, const int, kv_start) X(S, int, paged)
#define CA_ARGS_PACKED(B, V, X, S) \
  B(S, const int, cu_q) B(S, const int, cu_k) X(S, int, varlen) X(S, int, total_q) X(S, int, total_kv)
#define CA_ARGS_SEQ(B, V, X, S) CA_ARGS_ROWS(B, V, X, S) CA_ARGS_PACKED(B, V, X, S)
/* K/V storage: the block table of a paged cache, INT8 scales */
#define CA_ARGS_KV(B, V, X, S)                                                                        \
  B(S, const int, block_table) X(S, int, bt_stride) X(S, int, page_size) X(S, int, num_pages)       \
  V(S, const float, k_scale) V(S, const float, v_scale)
#define CA_ARGS_MASK(B, V, X, S) V(S, const uchar, mask) X(S, int, has_mask)
#define CA_ARGS_BIAS(B, V, X, S) V(S, const float, bias) X(S, int, has_bias) B(S, const float, bias_scale)
/* the score's form: additive (Bahdanau) scoring's weights */
#define CA_ARGS_SCORE(B, V, X, S) B(S, const float, add_w) X(S, int, additive)
#define CA_ARGS_ALIBI(B, V, X, S) B(S, const float, alibi) X(S, int, has_alibi) X(S, int, alibi_bstride)
#define CA_ARGS_SINKS(B, V, X, S) B(S, const float, sinks) X(S, long, sinks_at)
#define CA_ARGS_DIAG(B, V, X, S) V(S, float, entropy) V(S, float, max_weight) V(S, int, argmax) X(S, int, diag)
/* the caller's modifiers: the four captured buffers, the block mask's
 * classes, the scalars (common.h.cl's CA_MOD_CAPTURES) */
#define CA_ARGS_MOD(B, V, X, S)                                                                      \
  B(S, const uchar, cap0) B(S, const uchar, cap1) B(S, const uchar, cap2) B(S, const uchar, cap3)   \
  B(S, const uchar, bm_class) X(S, ca_mod, mod)
/* a chunk of query rows: its first (batch, head) pair, first row, rows */
#define CA_ARGS_CHUNK(B, V, X, S) X(S, int, bh0) X(S, int, i0) X(S, int, rows)

/* ---- the families ---- */

/* The fused kernels (flash.cl, flash_block.cl, decode.cl) take flash_core
 * and flash_extra; a call with none of the extras (no mask, bias, ALiBi,
 * sinks, additive score, packed sequences, diagnostics or dropout) runs the
 * decode kernels' core-only entries, which build with every extra absent.
 * work holds flash_pack's K^T and V copies and the split-KV partial states,
 * at the *_at offsets (floats).
 * flash_step is flash_core's leading part: the arguments of a decode step
 * over dense K/V that wants no lse, packing or split (its *_step entries
 * take those alone: POCL copies every argument at each enqueue). Its
 * struct is the start of flash_core's, field for field. */
#define CA_ARGS_flash_step(B, V, X, S)                                                                \
  V(S, const store_t, q) V(S, const k_t, k) V(S, const v_t, v) V(S, store_t, out) B(S, int, empty_flag) \
  X(S, long, n_pad) X(S, long, kt_at) X(S, long, vp_at) X(S, long, part_o_at) X(S, long, part_lse_at)   \
  X(S, int, q_heads) X(S, int, kv_heads) X(S, int, group) X(S, int, q_len) X(S, int, kv_len)           \
  X(S, float, scale) X(S, float, softcap) X(S, int, window_left) X(S, int, window_right)               \
  X(S, int, split_keys) X(S, int, want_lse)
#define CA_ARGS_flash_rest(B, V, X, S) \
  V(S, float, lse) B(S, float, work) CA_ARGS_ROWS(B, V, X, S) CA_ARGS_KV(B, V, X, S)
#define CA_ARGS_flash_core(B, V, X, S) CA_ARGS_flash_step(B, V, X, S) CA_ARGS_flash_rest(B, V, X, S)
#define CA_ARGS_flash_extra(B, V, X, S)                                                                    \
  CA_ARGS_MASK(B, V, X, S) CA_ARGS_BIAS(B, V, X, S) CA_ARGS_SCORE(B, V, X, S) CA_ARGS_ALIBI(B, V, X, S) \
  CA_ARGS_SINKS(B, V, X, S) CA_ARGS_PACKED(B, V, X, S) CA_ARGS_DIAG(B, V, X, S) X(S, ca_drop, dropout) \
  CA_ARGS_MOD(B, V, X, S)
/* flash_pack: K transposed and V padded into work */
#define CA_ARGS_flash_pack(B, V, X, S)                                                                  \
  V(S, const k_t, k) V(S, const v_t, v) CA_ARGS_SEQ(B, V, X, S) CA_ARGS_KV(B, V, X, S) X(S, int, q_len) \
  X(S, int, kv_heads) X(S, int, kv_len) X(S, long, n_pad) B(S, float, work) X(S, long, kt_at) X(S, long, vp_at)

/* The staged path: qk_score, softmax_rows, mix_values over a chunk. */
#define CA_ARGS_qk_score(B, V, X, S)                                                                    \
  V(S, const store_t, q) V(S, const k_t, k) CA_ARGS_SCORE(B, V, X, S) CA_ARGS_MASK(B, V, X, S)         \
  CA_ARGS_BIAS(B, V, X, S) CA_ARGS_SEQ(B, V, X, S) CA_ARGS_KV(B, V, X, S) X(S, int, q_heads)           \
  X(S, int, group) X(S, int, q_len) X(S, int, kv_len) X(S, int, head_dim) X(S, float, scale)          \
  X(S, float, softcap) CA_ARGS_ALIBI(B, V, X, S) X(S, int, window_left) X(S, int, window_right)       \
  CA_ARGS_CHUNK(B, V, X, S) B(S, float, scores) CA_ARGS_MOD(B, V, X, S)
#define CA_ARGS_softmax_rows(B, V, X, S)                                                                 \
  B(S, float, scores) X(S, int, kv_len) CA_ARGS_SEQ(B, V, X, S) X(S, int, q_heads) X(S, int, q_len)    \
  CA_ARGS_CHUNK(B, V, X, S) V(S, float, lse) X(S, int, want_lse) V(S, float, weights)                  \
  X(S, int, want_weights) CA_ARGS_SINKS(B, V, X, S) X(S, ca_drop, dropout) CA_ARGS_DIAG(B, V, X, S)    \
  B(S, int, empty_flag)
#define CA_ARGS_mix_values(B, V, X, S)                                                                    \
  B(S, const float, probs) V(S, const v_t, v) CA_ARGS_SEQ(B, V, X, S) CA_ARGS_KV(B, V, X, S)            \
  X(S, int, q_heads) X(S, int, group) X(S, int, q_len) X(S, int, kv_len) X(S, int, value_dim)          \
  CA_ARGS_CHUNK(B, V, X, S) V(S, store_t, out)

/* merge_states: S states of O (f32) and lse, state s at s * *_state
 * elements, into out (store_t) and lse_out. */
#define CA_ARGS_merge_states(B, V, X, S)                                                                \
  V(S, const float, o) X(S, ulong, o_state) V(S, const float, lse) X(S, ulong, lse_state)              \
  X(S, int, n_states) X(S, int, value_dim) X(S, int, heads) V(S, store_t, out) V(S, float, lse_out)   \
  X(S, int, want_lse) CA_ARGS_SINKS(B, V, X, S) B(S, int, empty_flag)

/* The GEMM path's kernels around CLBlast's products (gemm.cl). */
#define CA_ARGS_gemm_dense_copy(B, V, X, S)                                                              \
  V(S, const store_t, src) X(S, int, heads) X(S, int, width) X(S, int, key_side) CA_ARGS_SEQ(B, V, X, S) \
  X(S, int, q_len) X(S, int, kv_len) B(S, float, dst)
#define CA_ARGS_gemm_gather(B, V, X, S)                                                                   \
  V(S, const void, src) V(S, const float, scale) X(S, int, heads) X(S, int, width) CA_ARGS_SEQ(B, V, X, S) \
  B(S, const int, block_table) X(S, int, bt_stride) X(S, int, page_size) X(S, int, num_pages)           \
  X(S, int, q_len) X(S, int, kv_len) B(S, float, dst)
#define CA_ARGS_gemm_finite_values(B, V, X, S) B(S, float, v) X(S, int, width) X(S, ulong, rows) B(S, uchar, bad)
#define CA_ARGS_gemm_mask_scores(B, V, X, S)                                                            \
  B(S, float, scores) CA_ARGS_MASK(B, V, X, S) CA_ARGS_BIAS(B, V, X, S) CA_ARGS_SEQ(B, V, X, S)        \
  CA_ARGS_KV(B, V, X, S) X(S, int, q_heads) X(S, int, q_len) X(S, int, kv_len) X(S, float, scale)     \
  X(S, float, softcap) CA_ARGS_ALIBI(B, V, X, S) X(S, int, window_left) X(S, int, window_right)       \
  CA_ARGS_CHUNK(B, V, X, S) CA_ARGS_MOD(B, V, X, S)
#define CA_ARGS_gemm_store_rows(B, V, X, S)                                                              \
  B(S, const float, o_rows) B(S, const float, probs) V(S, const v_t, v) B(S, const uchar, v_bad)       \
  CA_ARGS_SEQ(B, V, X, S) CA_ARGS_KV(B, V, X, S) X(S, int, q_heads) X(S, int, group) X(S, int, q_len) \
  X(S, int, kv_len) X(S, int, value_dim) CA_ARGS_CHUNK(B, V, X, S) V(S, store_t, out)

/* The backward (backward.cl, backward_staged.cl): the forward's call and
 * its O, dO, lse, then each pass's own. */
#define CA_ARGS_bwd(B, V, X, S)                                                                          \
  V(S, const store_t, q) V(S, const store_t, k) V(S, const store_t, v) V(S, const store_t, o)          \
  V(S, const store_t, d_o) V(S, const float, lse) CA_ARGS_SCORE(B, V, X, S) CA_ARGS_MASK(B, V, X, S)  \
  CA_ARGS_BIAS(B, V, X, S) CA_ARGS_SEQ(B, V, X, S) X(S, int, q_heads) X(S, int, kv_heads)             \
  X(S, int, group) X(S, int, q_len) X(S, int, kv_len) X(S, float, scale) X(S, float, softcap)         \
  CA_ARGS_ALIBI(B, V, X, S) CA_ARGS_SINKS(B, V, X, S) X(S, int, window_left) X(S, int, window_right)  \
  B(S, float, dsum) B(S, float, sinkt) X(S, ca_drop, dropout) CA_ARGS_MOD(B, V, X, S)
#define CA_ARGS_bwd_rowdot(B, V, X, S) CA_ARGS_bwd(B, V, X, S)
#define CA_ARGS_bwd_dkdv(B, V, X, S) \
  CA_ARGS_bwd(B, V, X, S) V(S, store_t, d_k) V(S, store_t, d_v) B(S, float, dq_acc) X(S, int, dq_atomic)
#define CA_ARGS_bwd_dq(B, V, X, S) \
  CA_ARGS_bwd(B, V, X, S) V(S, store_t, d_q) B(S, float, dw_rows) X(S, int, want_dw)
#define CA_ARGS_bwd_dbias(B, V, X, S) \
  CA_ARGS_bwd(B, V, X, S) X(S, int, batch) V(S, float, d_bias) X(S, int, summed)
#define CA_ARGS_bwds_pairs(B, V, X, S) \
  CA_ARGS_bwd(B, V, X, S) CA_ARGS_CHUNK(B, V, X, S) B(S, float, pw) B(S, float, gw)
#define CA_ARGS_bwds_dq(B, V, X, S)                                                                  \
  CA_ARGS_bwd(B, V, X, S) CA_ARGS_CHUNK(B, V, X, S) B(S, const float, gw) V(S, store_t, d_q)        \
  B(S, float, dw_rows) X(S, int, want_dw)
#define CA_ARGS_bwds_dkdv(B, V, X, S)                                                                  \
  CA_ARGS_bwd(B, V, X, S) CA_ARGS_CHUNK(B, V, X, S) X(S, int, heads) B(S, const float, pw)            \
  B(S, const float, gw) B(S, float, acc)
#define CA_ARGS_bwd_sum(B, V, X, S)                                                                     \
  B(S, const float, x) X(S, int, n_cols) X(S, ulong, n_outer) X(S, ulong, n_inner) X(S, ulong, s_outer) \
  X(S, ulong, s_col) X(S, ulong, s_inner) B(S, float, out)
#define CA_ARGS_bwd_zero(B, V, X, S) V(S, store_t, x) X(S, int, rows) X(S, int, cols)
#define CA_ARGS_bwd_fill(B, V, X, S) B(S, float, x) X(S, ulong, n)
#define CA_ARGS_bwd_store(B, V, X, S)                                                                     \
  B(S, const float, acc) X(S, int, acc_cols) X(S, int, col0) X(S, int, cols) X(S, int, heads)          \
  X(S, int, key_side) CA_ARGS_SEQ(B, V, X, S) X(S, int, q_len) X(S, int, kv_len) V(S, store_t, x)

/* New K/V rows into a cache (append.cl), and clattn_forward_kvcache's
 * lengths and rotary embedding (kvcache.cl). */
#define CA_ARGS_kv_append(B, V, X, S)                                                                      \
  V(S, const store_t, src) V(S, kv_t, dst) V(S, float, scale) B(S, const int, positions)                 \
  B(S, const int, block_table) X(S, int, bt_stride) X(S, int, page_size) X(S, int, num_pages)            \
  X(S, int, paged) X(S, int, capacity) X(S, int, kv_heads) X(S, int, new_len) X(S, int, cols)           \
  B(S, const int, leftpad) B(S, int, lens) B(S, int, starts)
#define CA_ARGS_kvcache_lengths(B, V, X, S) \
  B(S, const int, seqlens) B(S, const int, leftpad) X(S, int, new_len) B(S, int, lens) B(S, int, starts)
#define CA_ARGS_kvcache_rotary(B, V, X, S)                                                                   \
  V(S, const store_t, src) B(S, store_t, dst) X(S, ulong, dst_at) V(S, const float, cos_t)                 \
  V(S, const float, sin_t) B(S, const int, seqlens) X(S, int, heads) X(S, int, rows) X(S, int, cols)      \
  X(S, int, rot_half) X(S, int, rot_len) X(S, int, interleaved) X(S, int, per_row)

/* The caller's modifiers alone (modifier.cl): a block mask's classes of
 * [batch][heads][q_blocks][kv_blocks] blocks, and the modifiers evaluated
 * at n given (b, h, q_idx, kv_idx), four ints each in `at`. */
#define CA_ARGS_mod_blocks(B, V, X, S)                                                              \
  B(S, uchar, classes) X(S, int, heads) X(S, int, q_len) X(S, int, kv_len) X(S, int, block_q)     \
  X(S, int, block_k) X(S, int, q_blocks) X(S, int, kv_blocks) CA_ARGS_MOD(B, V, X, S)
#define CA_ARGS_mod_eval(B, V, X, S) \
  B(S, const int, at) B(S, float, scores) B(S, uchar, allowed) B(S, float, grads) X(S, int, n) \
  CA_ARGS_MOD(B, V, X, S)

/* ---- what the lists give ---- */

#define CA_NONE(S, T, n)
#define CA_STRUCT_V(S, T, n) ca_view n;
#define CA_STRUCT_X(S, T, n) CA_FIELD_T(T) n;
#define CA_STRUCT(F) typedef struct { CA_ARGS_##F(CA_NONE, CA_STRUCT_V, CA_STRUCT_X, _) } ca_args_##F;

#ifdef CA_DEVICE_CODE
#define CA_PARAM_B(S, T, n) __global T *n,
#define CA_PASS_B(S, T, n) n,
#define CA_NULL_B(S, T, n) (__global T *)0,
#define CA_UNPACK_V(S, T, n)    \
  const ulong n##_off = S.n.off; \
  const ulong4 n##_st = (ulong4)(S.n.st[0], S.n.st[1], S.n.st[2], S.n.st[3]);
#define CA_UNPACK_X(S, T, n) const T n = S.n;
/* The kernel's parameters: the buffers, then the struct S. */
#define CA_PARAMS(F, S) CA_ARGS_##F(CA_PARAM_B, CA_PARAM_B, CA_NONE, S) const ca_args_##F S
/* The same arguments handed on to a function taking CA_PARAMS(F, S). */
#define CA_PASS(F, S) CA_ARGS_##F(CA_PASS_B, CA_PASS_B, CA_NONE, S) S
/* Every argument absent: NULL buffers and a zeroed struct. */
#define CA_ABSENT(F) CA_ARGS_##F(CA_NULL_B, CA_NULL_B, CA_NONE, _)(ca_args_##F) { 0 }
/* For an entry that takes only family F's leading part L (F's list is L's,
 * then R's): CA_WIDEN declares S##_wide, a ca_args_F with L's fields from
 * S and R's zero; CA_PASS_WIDE hands on L's buffers, NULL for R's, and it. */
#define CA_WIDEN_FIELD(S, T, n) S##_wide.n = S.n;
#define CA_WIDEN(F, L, S) \
  ca_args_##F S##_wide = {0}; \
  CA_ARGS_##L(CA_NONE, CA_WIDEN_FIELD, CA_WIDEN_FIELD, S)
#define CA_PASS_WIDE(L, R, S) \
  CA_ARGS_##L(CA_PASS_B, CA_PASS_B, CA_NONE, S) CA_ARGS_##R(CA_NULL_B, CA_NULL_B, CA_NONE, _) S##_wide
/* Each field (and each view's n_off, n_st) as a local of its own name. */
#define CA_UNPACK(F, S) CA_ARGS_##F(CA_NONE, CA_UNPACK_V, CA_UNPACK_X, S)
#else
/* The host's record of a family's buffers: ca_bufs_F, one ca_buf each. */
#define CA_BUFS_B(S, T, n) ca_buf n;
#define CA_BUFS(F) typedef struct { CA_ARGS_##F(CA_BUFS_B, CA_BUFS_B, CA_NONE, _) } ca_bufs_##F;
#define CA_COUNT_B(S, T, n) +1
/* buffers of family F */
#define CA_NBUF(F) (0 CA_ARGS_##F(CA_COUNT_B, CA_COUNT_B, CA_NONE, _))
/* A buffer argument as a launch list holds it: a caller's or the call's
 * own cl_mem, or a scratch buffer or flag the executor fills in. */
typedef struct {
  cl_mem mem;
  int role; /* CA_BUF_MEM, CA_BUF_FLAG, or CA_BUF_SCRATCH + slot */
} ca_buf;
enum { CA_BUF_MEM = 0, CA_BUF_FLAG = 1, CA_BUF_SCRATCH = 2 };
#endif

#define CA_FAMILY(F) CA_STRUCT(F)
#ifndef CA_DEVICE_CODE
#undef CA_FAMILY
#define CA_FAMILY(F) CA_STRUCT(F) CA_BUFS(F)
#endif
CA_FAMILY(flash_step)
CA_FAMILY(flash_core)
CA_FAMILY(flash_extra)
CA_FAMILY(flash_pack)
CA_FAMILY(qk_score)
CA_FAMILY(softmax_rows)
CA_FAMILY(mix_values)
CA_FAMILY(merge_states)
CA_FAMILY(gemm_dense_copy)
CA_FAMILY(gemm_gather)
CA_FAMILY(gemm_finite_values)
CA_FAMILY(gemm_mask_scores)
CA_FAMILY(gemm_store_rows)
CA_FAMILY(bwd_rowdot)
CA_FAMILY(bwd_dkdv)
CA_FAMILY(bwd_dq)
CA_FAMILY(bwd_dbias)
CA_FAMILY(bwds_pairs)
CA_FAMILY(bwds_dq)
CA_FAMILY(bwds_dkdv)
CA_FAMILY(bwd_sum)
CA_FAMILY(bwd_zero)
CA_FAMILY(bwd_fill)
CA_FAMILY(bwd_store)
CA_FAMILY(kv_append)
CA_FAMILY(kvcache_lengths)
CA_FAMILY(kvcache_rotary)
CA_FAMILY(mod_blocks)
CA_FAMILY(mod_eval)
#undef CA_FAMILY

#endif
