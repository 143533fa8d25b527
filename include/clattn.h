/*
 * clattn — vendor-neutral scaled dot-product attention on OpenCL 1.2 devices.
 *
 *   A = softmax(scale · Q Kᵀ + bias, restricted to the allowed keys)    O = A V
 *
 * Queries and keys decide the route (A); values decide what travels along it.
 * The library embeds in a caller's OpenCL context and queue or creates its own.
 * Every function returns a status; nothing aborts or exits the host program.
 */
#ifndef CLATTN_H
#define CLATTN_H

#ifndef CL_TARGET_OPENCL_VERSION
#define CL_TARGET_OPENCL_VERSION 120
#endif
#ifdef __APPLE__
#include <OpenCL/cl.h>
#else
#include <CL/cl.h>
#endif
#include <stddef.h>

#if defined(_WIN32)
#define CLATTN_EXPORT __declspec(dllexport)
#elif defined(__GNUC__)
#define CLATTN_EXPORT __attribute__((visibility("default")))
#else
#define CLATTN_EXPORT
#endif

#ifdef __cplusplus
extern "C" {
#endif

#define CLATTN_VERSION_MAJOR  0
#define CLATTN_VERSION_MINOR  1
#define CLATTN_VERSION_PATCH  0
#define CLATTN_VERSION_STRING "0.1.0"
/* The library's soname (libclattn.so.N). Parameter structs grow without
 * changing it (docs/DESIGN.md, "ABI"): each begins with struct_size, the
 * size the caller's header gave it, which its *_default() function (inline
 * below) sets; the library reads no byte past it and takes every field past
 * it as that field's default. So a program built against an older header
 * runs against a newer library with the same results. struct_size 0 means
 * this ABI's first layout (a struct zeroed field by field: clattn_options,
 * clattn_merge_params). The soname changes only if fields move or an
 * enum's values change. */
#define CLATTN_ABI_VERSION 5

typedef enum {
  CLATTN_OK = 0,
  CLATTN_ERR_INVALID_ARGUMENT, /* bad shape, stride, null, inconsistent fields */
  CLATTN_ERR_UNSUPPORTED,      /* valid request this device/build cannot run */
  CLATTN_ERR_BUFFER_TOO_SMALL, /* a cl_mem is smaller than shape+strides need */
  CLATTN_ERR_EMPTY_ROW,        /* a row had no allowed key, policy ERROR */
  CLATTN_ERR_OUT_OF_MEMORY,
  CLATTN_ERR_BUILD, /* kernel build failed; the log is in the message */
  CLATTN_ERR_NO_DEVICE,
  CLATTN_ERR_OPENCL /* any other OpenCL failure; code in the message */
} clattn_status;

typedef struct clattn_context clattn_context;

typedef struct {
  size_t struct_size; /* sizeof(clattn_options) as the caller's header knew it; 0: this ABI's first */
  cl_context context; /* optional: all three given = embed in the caller's objects */
  cl_device_id device;
  cl_command_queue queue;
  const char *device_match; /* NULL: env CLATTN_DEVICE, else first GPU, else first device */
  const char *cache_dir;    /* NULL: env CLATTN_CACHE_DIR, else XDG cache; "" = no disk cache
                               (on POCL the default one keeps no binaries: POCL's own cache does) */
  const char *tuning_file;  /* NULL: env CLATTN_TUNING_FILE, else the one `clattn tune` wrote for
                               this device in the cache directory, when there; "" = none */
} clattn_options;

/* Creates a context and compiles the kernel programs for its device (load
 * time). In embedded mode clattn retains the caller's context, device and
 * queue and releases only those references on destroy. Destroying the last
 * live context that ran the GEMM path also empties CLBlast's process-wide
 * program caches (CLBlastClearCache: a later context's first GEMM call, and
 * the caller's own CLBlast calls, then rebuild their programs): left to
 * CLBlast's static destructors, they are released at exit after some OpenCL
 * runtimes (Oclgrind's) have gone, and the process aborts. So destroy every
 * context before exit. A context with its own queue waits for the work
 * enqueued on it (clFinish) before releasing anything; an embedded one
 * leaves the caller's queue as it is. */
CLATTN_EXPORT clattn_status clattn_create(const clattn_options *opt /* NULL = defaults */, clattn_context **out);
CLATTN_EXPORT void clattn_destroy(clattn_context *ctx);
CLATTN_EXPORT cl_context clattn_cl_context(const clattn_context *ctx);
CLATTN_EXPORT cl_command_queue clattn_cl_queue(const clattn_context *ctx);
CLATTN_EXPORT cl_device_id clattn_cl_device(const clattn_context *ctx);
CLATTN_EXPORT const char *clattn_status_string(clattn_status s);
/* The name of an OpenCL error code ("CL_OUT_OF_RESOURCES"), as clattn's
 * messages give it; "CL_UNKNOWN_ERROR" for a code it does not know. */
CLATTN_EXPORT const char *clattn_opencl_error_name(cl_int err);
/* Detail of the last failure in this thread: what failed, the OpenCL error's
 * name, the head of the build log. ctx may be NULL (e.g. after a failed create). */
CLATTN_EXPORT const char *clattn_last_error(const clattn_context *ctx);
/* What this thread's last clattn_forward, clattn_forward_kvcache,
 * clattn_backward, clattn_kv_append or clattn_merge_states enqueued, once
 * validated: the call's algorithm, then each kernel in the order first
 * enqueued, e.g. "fused: flash_rows_direct4, merge_states" or "gemm:
 * gemm_mask_scores, CLBlast SGEMM, ..."; "" before any call. Per thread,
 * like clattn_last_error. */
CLATTN_EXPORT const char *clattn_last_route(void);

/* Storage; math is f32. The quantised types are K/V storage only (kv_dtype,
 * v_dtype):
 *   CLATTN_Q8_0: ggml's block_q8_0 along the head dim. Each run of 32
 *     consecutive elements of a row is one 34-byte block: an f16 scale d,
 *     then 32 int8 q; value = d * q. head_dim (k) / value_dim (v) must be
 *     multiples of 32. A Q8_0 view's offset and strides count BYTES; offset
 *     and strides are even and stride[3] is 34 (one block): element
 *     (..., c) lives in block c / 32 at byte 2 + c % 32 of it.
 *   CLATTN_INT8: int8 values, value = scale * q with one f32 scale per
 *     (batch, kv head, key) in k_scale / v_scale.
 *   ggml's other 32-element blocks, laid out and viewed like Q8_0
 *   (bytes; stride[3] = the block's size), element i of a block taking the
 *   low nibble n of byte i of its nibbles (i < 16) or the high nibble of
 *   byte i - 16, and bit i of its 32 high bits (little endian) as h:
 *   CLATTN_Q4_0   18 bytes: f16 d, 16 bytes of nibbles;          value = d (n - 8)
 *   CLATTN_Q4_1   20 bytes: f16 d, f16 m, nibbles;                value = d n + m
 *   CLATTN_Q5_0   22 bytes: f16 d, 4 bytes of high bits, nibbles; value = d (n + 16 h - 16)
 *   CLATTN_Q5_1   24 bytes: f16 d, f16 m, high bits, nibbles;     value = d (n + 16 h) + m
 *   CLATTN_IQ4_NL 18 bytes: f16 d, nibbles;  value = d kvalues[n], ggml's
 *     kvalues_iq4nl {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25,
 *     38, 53, 69, 89, 113}
 *   CLATTN_DTYPE_SAME (kv_dtype, v_dtype only): k and v stored like q
 *     (dtype); v like k (kv_dtype). */
typedef enum {
  CLATTN_DTYPE_SAME = -1,
  CLATTN_F32 = 0,
  CLATTN_F16,
  CLATTN_BF16,
  CLATTN_Q8_0,
  CLATTN_INT8,
  CLATTN_Q4_0,
  CLATTN_Q4_1,
  CLATTN_Q5_0,
  CLATTN_Q5_1,
  CLATTN_IQ4_NL
} clattn_dtype;
typedef enum { CLATTN_ALGO_AUTO, CLATTN_ALGO_STAGED, CLATTN_ALGO_FUSED, CLATTN_ALGO_GEMM } clattn_algo;
typedef enum { CLATTN_EMPTY_ZERO, CLATTN_EMPTY_ERROR } clattn_empty_rows;
typedef enum { CLATTN_SCORE_DOT, CLATTN_SCORE_ADDITIVE } clattn_score;

typedef struct {    /* a strided view of a cl_mem; buf NULL = absent */
  cl_mem buf;       /* a buffer (not an image) of the clattn context's cl_context; not
                       CL_MEM_READ_ONLY for an output, not CL_MEM_WRITE_ONLY for an input */
  size_t offset;    /* in elements */
  size_t stride[4]; /* in elements: batch, head, row, column; 0 broadcasts (inputs only).
                       Outputs must not overlap themselves: ordered by stride, each
                       dimension longer than 1 steps past the span of the smaller ones
                       (so interleaved dimensions are refused too). */
} clattn_tensor;

/* Aliasing, one rule for every call (clattn_forward, clattn_backward,
 * clattn_kv_append, clattn_forward_kvcache, clattn_merge_states): an output
 * may share no byte with any other view or buffer of its call, input or
 * output; inputs may share bytes with each other. A call that breaks the
 * rule is INVALID_ARGUMENT, naming both, before anything is enqueued:
 * nothing is computed in place (out on q, d_q on q or d_out, d_k on k, the
 * k and v caches on the same bytes, new rows inside the cache, merge's out
 * on a state: all refused).
 *   outputs: forward out, lse, weights, entropy, max_weight, argmax;
 *   backward d_q, d_k, d_v, d_bias, d_sinks, d_additive_w (fwd.out and
 *   fwd.lse are its inputs); kv_append k, v, k_scale, v_scale;
 *   forward_kvcache the forward's, and the cache (k, v, k_scale, v_scale)
 *   when new_len > 0; merge out, out_lse (its o and lse count as all
 *   n_states states).
 * Bytes are compared element by element, not by extents, so views that
 * interleave without sharing a byte are fine (packed QKV or dQKV, a cache
 * holding K and V page by page); a pair of layouts too intricate to settle
 * within a small search is refused as one that may share. Views through
 * sub-buffers are compared at their parent's bytes (CL_MEM_ASSOCIATED_MEMOBJECT,
 * CL_MEM_OFFSET), buffers created with CL_MEM_USE_HOST_PTR at their host
 * addresses (CL_MEM_HOST_PTR). */

/* One attention call. Initialise it with clattn_params_default(), which
 * sets struct_size and every field absent (see "Parameter structs" above). */
typedef struct {
  size_t struct_size; /* sizeof(clattn_params) as the caller's header knew it */

  /* ---- the problem ---- */
  int batch, q_heads, kv_heads; /* q_heads % kv_heads == 0 (MHA, GQA, MQA) */
  int q_len, kv_len;            /* M queries, N candidates; M != N allowed */
  int head_dim, value_dim;      /* dk for Q,K; dv for V,O; dk != dv allowed */
  clattn_dtype dtype;           /* storage of q and out (and of k, v unless kv_dtype says) */
  clattn_algo algo;

  /* ---- the views ---- */
  clattn_tensor q, k, v, out; /* [B,Hq,M,dk] [B,Hkv,N,dk] [B,Hkv,N,dv] [B,Hq,M,dv] */

  /* ---- which keys each query may see ---- */
  int causal;                    /* bottom-right aligned, see Semantics */
  int window_left, window_right; /* -1 = unbounded */
  cl_mem kv_lens;                /* int32 [B]: valid keys per batch row (padding); NULL = all */
  clattn_tensor mask;            /* uchar, nonzero = allowed, [B,H,M,N] with broadcast strides */
  clattn_empty_rows empty_rows;  /* what a row with no allowed key gives */

  /* ---- score shaping, in this order (docs/semantics.md):
   *   s = scale * <q_i, k_j>          (or the additive score below)
   *   s = softcap * tanh(s / softcap)  when softcap > 0
   *   s += bias_ij - slope * |p_i - j|   (p_i = i + kv_len - q_len; slope =
   *        alibi_slopes[h], or [b * alibi_batch_stride + h] per batch row)
   *   disallowed keys removed (mask, window, kv_lens)
   *   softmax, with sinks[h] joining the denominator as a logit that carries
   *   no value: lse includes it, a row with no allowed key gets O = 0 and
   *   lse = sinks[h] (still an empty row for EMPTY_ERROR).
   * A bias entry of -inf (before its scale) disallows its key, as a zero
   * mask entry does, on every path: its key and value are never mixed in,
   * whatever they hold. ---- */
  float scale;          /* NAN = 1/sqrt(head_dim); any finite value as given (0 = uniform) */
  float softcap;        /* 0 = off; > 0 and finite */
  clattn_score score;   /* CLATTN_SCORE_DOT (default) or CLATTN_SCORE_ADDITIVE */
  cl_mem additive_w;    /* f32 [head_dim]: s = scale * sum_t w_t tanh(q_it + k_jt) */
  clattn_tensor bias;   /* additive score bias, indexed like mask */
  clattn_dtype bias_dtype; /* the bias view's elements: CLATTN_F32 or CLATTN_F16 (llama.cpp's f16 masks) */
  cl_mem bias_scale;    /* f32 [q_heads]: head h's bias entries times bias_scale[h]; NULL = 1 */
  cl_mem alibi_slopes;  /* f32 [q_heads] (per batch row: alibi_batch_stride); NULL = none */
  int alibi_batch_stride; /* slope (b, h) is alibi_slopes[b * alibi_batch_stride + h], so the
                             buffer holds (batch - 1) * stride + q_heads floats; 0 = one slope
                             per head shared by every batch row */
  cl_mem sinks;         /* f32 [q_heads]; NULL = none */
  size_t sinks_offset;  /* floats before sinks[0] in its cl_mem (a tensor inside an engine's buffer) */

  /* ---- the K/V cache as inference engines keep it (docs/DESIGN.md,
   * "Contract, second wave"). Paged K/V: key j of batch row b is row
   * j % page_size of page block_table[b * block_table_stride + j / page_size];
   * k, v (and k_scale, v_scale) then index [page, kv head, row in page,
   * column], stride[0] stepping one page. kv_lens is required with a block
   * table and each row is aligned on its own length: p_i = i + kv_lens[b] -
   * q_len (kv_len is an upper bound of kv_lens). An entry outside
   * [0, num_pages) is never followed: its keys are disallowed. Packed
   * queries (cu_seqlens_q) combine with a block table, see below;
   * cu_seqlens_k with one is INVALID_ARGUMENT. clattn_backward does not
   * take paged K/V (UNSUPPORTED). ---- */
  clattn_dtype kv_dtype;          /* storage of k and v; CLATTN_DTYPE_SAME = dtype. q and out stay in dtype */
  clattn_dtype v_dtype;           /* storage of v when it differs from k's; CLATTN_DTYPE_SAME = kv_dtype */
  clattn_tensor k_scale, v_scale; /* INT8 k / v: f32 [b, kv head, key] (stride[0..2]); paged: [page, kv head, row] */
  cl_mem block_table;             /* int32 [batch * block_table_stride]; NULL = contiguous K/V */
  int block_table_stride;         /* entries per batch row, >= ceil(kv_len / page_size) */
  int page_size;                  /* keys per page, > 0 with a block table */
  int num_pages;                  /* pages in the pool, > 0 with a block table: views are checked for this many */
  /* int32 [batch]: batch row b's keys are rows cache_leftpad[b] ..
   * kv_lens[b] - 1 of its cache (kv_lens required; the rows before are
   * padding, never read); key j of the sequence is row cache_leftpad[b] + j,
   * and each row is aligned on its own length (p_i = i + kv_lens[b] -
   * cache_leftpad[b] - q_len, as a paged row is): causal, windows, ALiBi,
   * mask and bias columns count from its first key. Contiguous or paged
   * K/V; not with cu_seqlens_k. */
  cl_mem cache_leftpad;

  /* ---- packed variable-length batches: int32 [batch + 1], 0 first,
   * non-decreasing; sequence b's query rows are cu_seqlens_q[b] ..
   * cu_seqlens_q[b+1]-1 of the row dimension (stride[2]) of q and out
   * (likewise k and v with cu_seqlens_k); stride[0] must be 0; q_len and
   * kv_len are the longest lengths; total_q and total_kv are the last
   * entries. Over a paged cache (block_table) only the queries are packed:
   * cu_seqlens_q with total_q, cu_seqlens_k NULL (total_kv not read),
   * sequence b's keys the kv_lens[b] keys of its block-table row, and its
   * queries its last positions (FlashAttention's and vLLM's alignment: p_i
   * = i + kv_lens[b] - its query count). lse and the route diagnostics stay
   * [B, Hq, q_len], indexed by the row within the sequence. ---- */
  cl_mem cu_seqlens_q, cu_seqlens_k;
  int total_q, total_kv;

  /* ---- training's dropout (FlashAttention's dropout_p / seed / offset):
   * each weight a_ij is kept with probability 1 - dropout_p and scaled by
   * 1 / (1 - dropout_p), or dropped (0): O_i = sum_j a_ij z_ij v_j. lse,
   * the route diagnostics and empty rows describe the softmax before
   * dropout; weights (the routing matrix) is the matrix that mixes V,
   * dropout applied. z_ij is a pure function of (seed, offset, b, h, i, j),
   * the same on every path, device and run and in clattn_backward
   * (clattn_dropout_mask gives it on the host): weight (b, h, i, j) (i the
   * row within its sequence, j the key) is kept when lane j % 4 of
   * Philox4x32-10 with key (seed's low, high 32 bits) at counter (low, high
   * 32 bits of offset + i * 2^32 + j / 4, h, b) is >= the threshold
   * floor(dropout_p * 2^32). Calls whose offsets differ by at least q_len *
   * 2^32 draw disjoint counters. ---- */
  float dropout_p; /* 0 = off; else in (0, 1) */
  cl_ulong dropout_seed, dropout_offset;

  /* ---- optional outputs (buf NULL = not written) ---- */
  clattn_tensor lse;     /* f32 [B,Hq,M]: natural-log sum of exp of scores */
  clattn_tensor weights; /* f32 [B,Hq,M,N]: the routing matrix A (STAGED, GEMM) */
  /* Route diagnostics, one value per query row, indexed like lse
   * (stride[0..2]); every path computes them without the M x N matrix
   * where it can (FUSED streams them with the online softmax):
   *   entropy     f32 [B,Hq,M]: -sum_j a_ij log a_ij, in nats (log n for a
   *               uniform row over n keys, 0 for a one-hot row)
   *   max_weight  f32 [B,Hq,M]: max_j a_ij
   *   argmax      int32 [B,Hq,M]: the key index j of the largest weight, the
   *               lowest on ties
   * An empty row gives entropy 0, max_weight 0, argmax -1. A row whose
   * scores hold NaN or +inf gives NaN entropy and max_weight, argmax
   * unspecified. */
  clattn_tensor entropy, max_weight, argmax;

  /* ---- modifiers: attention the caller programs (docs/modifiers.md) ----
   * OpenCL C source text compiled into this call's kernels, on every path
   * (FlexAttention's score_mod and mask_mod):
   *   score_mod defines float clattn_score_mod(float score, int b, int h,
   *             int q_idx, int kv_idx, const clattn_captures *cap), and for
   *             clattn_backward float clattn_score_mod_grad(...) with the
   *             same parameters: its derivative in score;
   *   mask_mod  defines int clattn_mask_mod(int b, int h, int q_idx,
   *             int kv_idx, const clattn_captures *cap), nonzero = allowed.
   * b is the batch row, h the query head, kv_idx the key's index from its
   * sequence's first key, q_idx the query's position among those keys as
   * causal counts it (row i of m queries over n keys: n - m + i, per
   * sequence), so kv_idx <= q_idx is causal. The mask modifier is ANDed
   * with every other mask (a key it disallows never reaches an output);
   * the score modifier applies to scale * <q, k> (after softcap), before
   * bias and ALiBi. cap->buf[n] is captures[n] (a buffer of this context,
   * read only), cap->f[n] capture_f[n], cap->i[n] capture_i[n]. Programs
   * are cached under a hash of the text; text that does not compile is
   * CLATTN_ERR_INVALID_ARGUMENT with the compiler's log. A modifier is
   * code the caller trusts, as a kernel it would build itself. NULL: none. */
  const char *score_mod, *mask_mod;
  cl_mem captures[4];
  float capture_f[4];
  int capture_i[4];
  /* Optional: clattn_block_mask_create's classes of this call's mask_mod
   * (same text and captures): blocks it allows no pair of are skipped, and
   * blocks it allows every pair of skip evaluating it. */
  const struct clattn_block_mask *block_mask;
} clattn_params;

/* Fills the first struct_size bytes of *p (its caller's sizeof) with the
 * defaults: everything absent/unbounded, scale NAN, AUTO, EMPTY_ZERO,
 * kv_dtype and v_dtype CLATTN_DTYPE_SAME, bias_dtype CLATTN_F32, no block
 * table, no dropout; struct_size set. */
CLATTN_EXPORT void clattn_params_init(clattn_params *p, size_t struct_size);
static inline clattn_params clattn_params_default(void) {
  clattn_params p;
  clattn_params_init(&p, sizeof p);
  return p;
}

/* Enqueues one attention call on the context's queue after the n_wait events;
 * *done (when non-NULL) receives an event that completes with it. Every check
 * that needs no device work happens first, so a rejected call enqueues nothing
 * and leaves every buffer as it was.
 *
 * Semantics (docs/DESIGN.md): s_ij = scale·<q_i,k_j> + bias_ij for allowed (i,j):
 * j < kv_lens[b], mask_ij != 0, and with p_i = i + (kv_len - q_len) the
 * bottom-right aligned position, p_i - window_left <= j <= p_i + window_right
 * (causal = window_right 0). Q head h reads KV head h / (q_heads / kv_heads).
 * A row with no allowed key (or whose allowed scores are all -inf) is empty:
 * EMPTY_ZERO writes O = 0, lse = -inf, weights 0. EMPTY_ERROR waits for the
 * device and returns CLATTN_ERR_EMPTY_ROW when any row was empty; the outputs
 * then hold the EMPTY_ZERO result. Disallowed keys and values never reach an
 * output, whatever they hold (NaN, Inf), and neither does an allowed key whose
 * weight underflows to exactly 0 in f32 (0 * Inf is never formed).
 *
 * lse is the natural-log sum of exp of the allowed scores. */
CLATTN_EXPORT clattn_status clattn_forward(clattn_context *ctx, const clattn_params *p, cl_uint n_wait,
                                           const cl_event *wait, cl_event *done);

/* The dropout mask of calls with p's dropout_p, dropout_seed and
 * dropout_offset, computed on the host: mask[r * cols + c] = 1 when weight
 * (b, h, row0 + r, col0 + c) is kept, else 0 (see dropout_p). Rows count
 * within the sequence, columns are keys. Reads no other field and no
 * cl_mem; INVALID_ARGUMENT for a NULL p or mask, a negative index or count,
 * or dropout_p outside [0, 1). */
CLATTN_EXPORT clattn_status clattn_dropout_mask(const clattn_params *p, int b, int h, int row0, int rows, int col0,
                                                int cols, unsigned char *mask);

/* Writes new K/V rows into a cache (contiguous or paged, any kv dtype),
 * quantising on the way: the kernel an inference engine calls once per step.
 * Quantisation follows ggml's reference rules, so caches are interchangeable
 * with llama.cpp's: Q8_0 per 32-block d = amax / 127 stored as f16 (round to
 * nearest even), q = roundf(x * (d ? 1/d : 0)) with 1/d from the f32 d; INT8
 * per (b, head, row) scale = amax / 127 (f32), same rounding. New row r of
 * batch row b goes to cache position positions[b] + r: in a contiguous cache
 * row (b, head, position) of k / v, which hold `capacity` rows per (b, head);
 * in a paged cache row position % page_size of page
 * block_table[b * block_table_stride + position / page_size]. A row past
 * capacity (or past block_table_stride * page_size), or to a page outside
 * [0, num_pages), is skipped by the kernel (only that row; the call returns
 * OK): positions are on the device. new_len > capacity (or > the rows a
 * block-table row addresses) is INVALID_ARGUMENT. new_len 0 is a valid no-op. */
typedef struct {
  size_t struct_size; /* sizeof(clattn_append_params) as the caller's header knew it */
  int batch, kv_heads, new_len, head_dim, value_dim;
  clattn_dtype src_dtype;         /* F32, F16 or BF16: k_new / v_new storage */
  clattn_tensor k_new, v_new;     /* [B, Hkv, new_len, dk | dv], element strides */
  cl_mem positions;               /* int32 [B]: cache position of new row 0 of each batch row */
  clattn_dtype kv_dtype;          /* the cache's storage: F32, F16, BF16, Q8_0, INT8 (the other block
                                     types: UNSUPPORTED); SAME = src_dtype */
  clattn_tensor k, v;             /* the cache, described exactly as in clattn_params */
  clattn_tensor k_scale, v_scale; /* INT8 caches */
  cl_mem block_table;             /* paged caches, as in clattn_params */
  int block_table_stride, page_size, num_pages;
  int capacity; /* contiguous caches: rows per (b, head); positions + new_len must fit */
} clattn_append_params;

/* Fills the first struct_size bytes of *ap: every view and buffer absent,
 * every count 0, src_dtype CLATTN_F32, kv_dtype CLATTN_DTYPE_SAME. */
CLATTN_EXPORT void clattn_append_params_init(clattn_append_params *ap, size_t struct_size);
static inline clattn_append_params clattn_append_params_default(void) {
  clattn_append_params ap;
  clattn_append_params_init(&ap, sizeof ap);
  return ap;
}
/* Enqueues the append (validated first, like forward: a rejected call
 * enqueues nothing and touches nothing). */
CLATTN_EXPORT clattn_status clattn_kv_append(clattn_context *ctx, const clattn_append_params *ap, cl_uint n_wait,
                                             const cl_event *wait, cl_event *done);

/* An engine's decode (or chunked-prefill) step in one call, as
 * FlashAttention's flash_attn_with_kvcache: new keys and values appended to
 * the cache (keys rotated), then attention of q (rotated) over the cache.
 *
 * Batch row b: new row r of k_new (rotated) and v_new goes to cache
 * position cache_seqlens[b] + r, quantised as clattn_kv_append does (the
 * cache's storage F32, F16, BF16, Q8_0 or INT8; the other block types
 * UNSUPPORTED): in a paged cache through attn.block_table, in a contiguous
 * one to slot cache_batch_idx[b] (or b). Then q attends over row b's keys,
 * cache rows cache_leftpad[b] (0 without) .. cache_seqlens[b] + new_len - 1,
 * each row aligned on its own key count (as attn.cache_leftpad gives: the
 * forward's kv_lens are cache_seqlens + new_len, its starts cache_leftpad
 * or zeros, so even without leftpad every row aligns on its own length).
 *
 * Rotary embedding (FlashAttention's rule), with cos / sin at [position][t],
 * t < rotary_dim / 2: x' = x cos - y sin, y' = x sin + y cos over the pairs
 * (x[2t], x[2t+1]) (rotary_interleaved 1, GPT-J) or (x[t], x[t + rotary_dim/2])
 * (0, GPT-NeoX); dims past rotary_dim unchanged. New key r of row b sits at
 * position cache_seqlens[b] + r; query row i at cache_seqlens[b] + i when
 * attn.causal or a window is set, else every query row at cache_seqlens[b].
 * Computed in f32 (each product rounded, no fused multiply-add), stored in
 * attn.dtype (round to nearest even). q and k_new are never written: the
 * rotated copies live in the context's scratch.
 *
 * The lengths are device values, which the call does not wait for. Given
 * on the host as well (host_seqlens), each row is checked before anything
 * is enqueued: a negative length; new rows past the cache (a contiguous
 * slot's attn.kv_len rows, or a paged row's block_table_stride * page_size)
 * or past attn.kv_len, the most keys a row may have; a rotated position
 * (a new key's, or a query's) at or past rotary_len: INVALID_ARGUMENT
 * naming the row, cache_seqlens[b], new_len and the capacity. Without
 * them, a new row past attn.kv_len or its table (or on a slot or page
 * outside [0, num_slots) / [0, num_pages)) is skipped as clattn_kv_append
 * skips it (never stored, so never rotated at a clamped position), a
 * length past attn.kv_len is clamped by the forward, and a query's
 * position outside the tables takes their first or last row. What the host can see is
 * refused before anything is enqueued (a refused call writes nothing): everything
 * clattn_forward and clattn_kv_append refuse, and attn.kv_lens, cu_seqlens_q
 * or cu_seqlens_k set; cache_seqlens NULL; new_len < 0, or > attn.kv_len
 * (contiguous), or k_new / v_new absent with new_len > 0 or present with
 * new_len 0; attn.v_dtype other than the k cache's storage;
 * cache_batch_idx with attn.block_table, or num_slots < 0, or num_slots
 * without cache_batch_idx; one rotary table without the other, rotary_dim
 * odd or outside [2, head_dim], rotary_len < attn.kv_len, rotary_interleaved
 * other than 0 or 1, rotary_dim or rotary_len set without tables. Aliasing
 * (the rule above clattn_params): the cache (k, v, k_scale, v_scale) is an
 * output when new_len > 0, as are out, lse, weights and the diagnostics;
 * none may share a byte with q, k_new, v_new, cache_seqlens,
 * cache_batch_idx, cache_leftpad, the rotary tables or any other view of
 * the call, nor with each other (with new_len 0 the cache is only read). */
typedef struct {
  size_t struct_size; /* sizeof(clattn_kvcache_params) as the caller's header knew it */
  /* The attention after the append: q [B, Hq, q_len, dk], out and every
   * mask, score and output field as in clattn_forward; k and v the cache:
   * contiguous [slot, Hkv, attn.kv_len rows, d] (attn.kv_len its capacity)
   * or paged (attn.block_table, block_table_stride, page_size, num_pages);
   * kv_dtype, v_dtype (= kv_dtype), k_scale, v_scale its storage;
   * attn.kv_lens must be NULL (derived); attn.cache_leftpad as in
   * clattn_params; attn.cu_seqlens_q / cu_seqlens_k NULL. */
  clattn_params attn;
  cl_mem cache_seqlens;                 /* int32 [batch]: rows in use before the call (each row's keys end
                                           there, its leftpad included): required */
  clattn_tensor k_new, v_new;           /* [B, Hkv, new_len, dk | dv] stored as attn.dtype;
                                           buf NULL with new_len 0 */
  int new_len;                          /* rows appended per batch row, at cache_seqlens[b] .. + new_len - 1 */
  cl_mem cache_batch_idx;               /* int32 [batch]: the slot (k / v dimension 0) batch row b uses;
                                           contiguous caches only; NULL = b */
  int num_slots;                        /* slots of a contiguous cache with cache_batch_idx (0 = batch) */
  clattn_tensor rotary_cos, rotary_sin; /* f32 [rotary_len, rotary_dim / 2]: stride[2] per position,
                                           stride[3] per column (stride[0], [1] unused);
                                           buf NULL = no rotary */
  int rotary_dim;                       /* even, 2 .. head_dim: the leading dims rotated */
  int rotary_len;                       /* positions the tables hold (>= attn.kv_len) */
  int rotary_interleaved;               /* 1: pairs (x[2t], x[2t+1]) (GPT-J); 0: (x[t], x[t + rotary_dim/2]) */
  const cl_int *host_seqlens;           /* [batch]: cache_seqlens' values as the host holds them (the same
                                           values), so the rows are checked before anything is enqueued;
                                           NULL: the device values alone, unchecked (see above) */
} clattn_kvcache_params;

/* Fills the first struct_size bytes of *kp: attn as clattn_params_init
 * (with its own struct_size), every other view and buffer absent, every
 * count 0, rotary_interleaved 1. */
CLATTN_EXPORT void clattn_kvcache_params_init(clattn_kvcache_params *kp, size_t struct_size);
static inline clattn_kvcache_params clattn_kvcache_params_default(void) {
  clattn_kvcache_params kp;
  clattn_kvcache_params_init(&kp, sizeof kp);
  return kp;
}
/* Enqueues the step after the n_wait events (validated first: a refused
 * call enqueues nothing and writes nothing); *done, when non-NULL, receives
 * an event that completes with it. Like clattn_forward otherwise
 * (attn.algo picks the path; EMPTY_ERROR waits for the device). */
CLATTN_EXPORT clattn_status clattn_forward_kvcache(clattn_context *ctx, const clattn_kvcache_params *kp, cl_uint n_wait,
                                                   const cl_event *wait, cl_event *done);

/* Partial attention states of the same query rows, to be combined into one:
 * S states computed elsewhere (over different key ranges, on another device,
 * over a shared prefix, by another rank). State s of row (b, h, i) is O_s, the
 * output normalised over its own keys, and lse_s, the NATURAL-log sum of exp
 * of its scores (clattn's lse output; not base 2 as in FlashInfer): -inf when
 * the state saw no allowed key. The states lie in one buffer each for O and
 * lse, state s at s * o_state_stride / s * lse_state_stride elements after
 * state 0's views.
 *   m = max_s lse_s,  lse = m + log(sum_s exp(lse_s - m)),
 *   O = sum_s exp(lse_s - lse) O_s
 * A state with lse_s = -inf adds nothing (whatever its O holds); a row whose
 * states are all -inf is empty (see clattn_forward's empty-row policy). */
typedef struct {
  size_t struct_size; /* sizeof(clattn_merge_params) as the caller's header knew it; 0: this ABI's first */
  int n_states;
  int batch, heads, q_len, value_dim;
  clattn_tensor o;   /* f32 [B,H,M,dv]: state 0 */
  clattn_tensor lse; /* f32 [B,H,M] (stride[0..2]): state 0 */
  size_t o_state_stride, lse_state_stride;
  clattn_tensor out;     /* [B,H,M,dv], stored as out_dtype */
  clattn_tensor out_lse; /* optional f32 [B,H,M] */
  clattn_empty_rows empty_rows;
  /* the storage of out, CLATTN_F32 (0: a zeroed struct's value), CLATTN_F16
   * or CLATTN_BF16 (rounded to nearest even, as clattn_forward stores
   * them); the states and out_lse stay f32 */
  clattn_dtype out_dtype;
} clattn_merge_params;

/* Enqueues the combination of mp's states (validated first, like forward). */
CLATTN_EXPORT clattn_status clattn_merge_states(clattn_context *ctx, const clattn_merge_params *mp, cl_uint n_wait,
                                                const cl_event *wait, cl_event *done);

/* A human-readable account of the context: platform, device, the tiles in use
 * and where each came from, program build time. Valid until the context is
 * destroyed. */
CLATTN_EXPORT const char *clattn_describe(const clattn_context *ctx);

/* Tuning (docs/tuning.md).
 * A context's tunable values are its kernels' tile sizes and the staged and
 * GEMM paths' scratch budget, each named as in a tuning file: score_tm,
 * score_tn, score_tk, softmax_wg, mix_tm, mix_tv, mix_tj, flash_bm, flash_wg,
 * scratch_bytes, block_rm, block_rn (flash_block's tile: a pair of 4x4, 2x4,
 * 1x4, 1x2, 1x1, or 0x0 = chosen per head dim; set together, and stepped
 * down per head dim where it does not fit), flash_tile (flash_tiled's keys
 * per K/V tile: a power of two up to 64, or 0 = chosen per head dim; halved
 * per head dim where it does not fit). Each comes from one of: "default from device query",
 * "built-in table", "tuning file", "environment" (the last over the first). */

/* The name of tunable value i = 0, 1, ...; NULL past the last. */
CLATTN_EXPORT const char *clattn_tuning_name(int i);
/* The value ctx uses for the tunable `name` and (when origin is non-NULL)
 * where it came from, a static string as above. INVALID_ARGUMENT for a name
 * that is not a tunable value. */
CLATTN_EXPORT clattn_status clattn_tuning_get(const clattn_context *ctx, const char *name, long long *value,
                                              const char **origin);
/* What became of the tuning file at creation, in words: "applied: PATH",
 * "none (...)", "ignored: ..." (another device's) or "rejected, defaults
 * used: ..." (why). *applied (when non-NULL): 1 when its values are in use.
 * Valid until the context is destroyed. */
CLATTN_EXPORT const char *clattn_tuning_note(const clattn_context *ctx, int *applied);
/* Where clattn_create looks for this device's tuning file when none is named
 * (in the cache directory); NULL without a cache directory. Valid until the
 * context is destroyed. */
CLATTN_EXPORT const char *clattn_tuning_default_path(const clattn_context *ctx);
/* Writes a tuning file for ctx's device (its platform, device and driver)
 * holding `settings`: text of `key = value` lines, `#` comments, keys among
 * the tunable names and auto_prefill, auto_decode (staged, fused or gemm),
 * auto_weights (staged or gemm), each checked by the tuning file's rules.
 * path NULL = clattn_tuning_default_path(ctx). Written atomically (temp file
 * + rename). A context created with options.tuning_file = path uses the
 * values when the device can run them (clattn_tuning_note says whether):
 * how `clattn tune` tries each candidate. INVALID_ARGUMENT naming the bad
 * line, or the file that could not be written. */
CLATTN_EXPORT clattn_status clattn_tuning_write(const clattn_context *ctx, const char *settings, const char *path);

/* The most device scratch memory (bytes) that one call on this context has
 * allocated since creation or the last reset: what clattn adds to the
 * caller's own buffers. reset != 0 zeroes it after reading. */
CLATTN_EXPORT size_t clattn_peak_scratch_bytes(clattn_context *ctx, int reset);

/* Builds now every kernel program that clattn_forward would build on first
 * use for calls like shapes[0 .. n) (their dtype, kv_dtype, head_dim and
 * value_dim; the other fields are not read), for every algorithm, so an
 * engine's first token pays no compile stall. The programs stay for the
 * context's life (and in the disk cache). Those four fields are checked
 * as clattn_forward checks them: a shape it would refuse is
 * INVALID_ARGUMENT with its message after "clattn_prepare: shapes[i]: ",
 * and nothing is built for it; a build failure is CLATTN_ERR_BUILD with the
 * log. */
CLATTN_EXPORT clattn_status clattn_prepare(clattn_context *ctx, const clattn_params *shapes, int n);

/* Plans: a serving loop's attention call, made once, enqueued per step.
 *
 * clattn_plan_create does once everything clattn_forward does before it
 * enqueues: every check of p (the views for p->kv_len included), the
 * program builds, AUTO's choice, the launch (key splits, grid), the kernel
 * arguments. A FUSED plan (AUTO's choice for decode and prefill) holds
 * kernel objects and device scratch of its own, so clattn_plan_enqueue only
 * patches the arguments the step changes and enqueues, with no OpenCL
 * query; a STAGED or GEMM plan skips the checks and planning and runs the
 * path as clattn_forward does. Each step's outputs are bitwise those of
 * clattn_forward with the plan's params changed as the step says (the same
 * kernels, the same splits).
 *
 * What a step may change: the KV length (kv_len up to the planned one, so
 * plan with the largest length a step may use: the plan's capacity), the
 * offsets of the q, out and lse views, the contents of every buffer (kv_lens
 * too), the wait list and the done event. Any other change (buffers, shapes,
 * masks, dtypes) is another plan. A step the plan cannot take is refused
 * with CLATTN_ERR_INVALID_ARGUMENT or CLATTN_ERR_BUFFER_TOO_SMALL naming
 * the step's field, before anything is enqueued; the plan stays usable.
 *
 * A plan retains the cl_mems of p's views and buffers until released, and
 * must be released before its context is destroyed. Plans are independent
 * of each other; one plan may be enqueued from several threads (its steps
 * go in one at a time). On an out-of-order queue each step also waits for
 * the plan's previous step, whose scratch it reuses.
 *
 * Where the device reports cl_khr_command_buffer, a FUSED plan may record
 * its kernels once and replay them per step (updating the changed
 * arguments in place with cl_khr_command_buffer_mutable_dispatch); by
 * default only on GPUs (CPU runtimes measured slower replaying than
 * enqueuing). CLATTN_COMMAND_BUFFER=0 in the environment forces the plain
 * enqueues everywhere, =1 command buffers wherever reported. Results are
 * the same either way. */
typedef struct clattn_plan clattn_plan;

/* "As planned" for a step's offsets. */
#define CLATTN_STEP_PLANNED ((size_t)-1)

typedef struct {
  size_t struct_size; /* sizeof(clattn_step) as the caller's header knew it */
  int kv_len;        /* this step's keys, 1 .. the planned kv_len; 0 = as planned */
  size_t q_offset;   /* q's view offset (elements) this step; CLATTN_STEP_PLANNED = as planned */
  size_t out_offset; /* out's view offset; CLATTN_STEP_PLANNED = as planned */
  size_t lse_offset; /* lse's view offset (a plan with an lse view); CLATTN_STEP_PLANNED = as planned */
  const cl_int *host_seqlens; /* a kvcache plan's step: as clattn_kvcache_params.host_seqlens, this
                                 step's cache_seqlens on the host; NULL: unchecked */
} clattn_step;

/* Fills the first struct_size bytes of *s: every field "as planned",
 * kv_len 0, offsets CLATTN_STEP_PLANNED. */
CLATTN_EXPORT void clattn_step_init(clattn_step *s, size_t struct_size);
static inline clattn_step clattn_step_default(void) {
  clattn_step s;
  clattn_step_init(&s, sizeof s);
  return s;
}
/* Makes a plan of *p (checked like clattn_forward: a rejected p makes no
 * plan and *out is NULL). */
CLATTN_EXPORT clattn_status clattn_plan_create(clattn_context *ctx, const clattn_params *p, clattn_plan **out);
/* Makes a plan of a clattn_forward_kvcache step (checked like it, rows
 * against kp->host_seqlens when given): an engine's decode loop, each step
 * appending at the cache's end and attending over it. A step changes the
 * contents of the buffers alone (cache_seqlens, q, k_new, v_new, the
 * cache: their values move the step along), and may give its lengths on
 * the host (step.host_seqlens), checked as clattn_forward_kvcache checks
 * them; step.kv_len must be 0 and the offsets as planned (else refused,
 * naming the field). Each step's results are bitwise clattn_forward_kvcache's. */
CLATTN_EXPORT clattn_status clattn_plan_create_kvcache(clattn_context *ctx, const clattn_kvcache_params *kp,
                                                       clattn_plan **out);
/* Enqueues one step (step NULL = as planned) after the n_wait events;
 * *done, when non-NULL, receives an event that completes with it. Like
 * clattn_forward otherwise (EMPTY_ERROR waits for the device). */
CLATTN_EXPORT clattn_status clattn_plan_enqueue(clattn_plan *plan, const clattn_step *step, cl_uint n_wait,
                                                const cl_event *wait, cl_event *done);
/* Releases the plan (NULL: nothing); steps already enqueued still run. */
CLATTN_EXPORT void clattn_plan_release(clattn_plan *plan);

/* A kernel launch of a plan's step, as its kernel object stands (every
 * argument set): for a caller that times or records the step's kernels
 * itself. The kernel object is the plan's: valid until the plan is
 * released or steps again; enqueue it only while no step runs. */
typedef struct {
  cl_kernel kernel;
  const char *name;
  cl_uint work_dim;
  size_t global[3];
  size_t local[3];
  int local_given; /* 0: the runtime chooses the work-group (local unused) */
} clattn_launch;
/* The last step's launches (or, before any step, the planned ones): writes
 * at most max of them to out and returns how many there are; -1 for a
 * plan whose steps also run CLBlast (GEMM), or a NULL plan. */
CLATTN_EXPORT int clattn_plan_launches(clattn_plan *plan, clattn_launch *out, int max);
/* The plan's launch list in words: each kernel, its grid and work-group,
 * its arguments (buffers, and the struct of scalars each family takes),
 * the scratch it holds. Valid until the plan steps again or is released. */
CLATTN_EXPORT const char *clattn_plan_describe(clattn_plan *plan);

/* Name of an algorithm ("auto", "staged", "fused", "gemm"). */
CLATTN_EXPORT const char *clattn_algo_name(clattn_algo a);

/* Backward pass: the gradients of clattn_forward. fwd.algo picks the path:
 * FUSED or AUTO, FlashAttention-2's recomputation (P rebuilt from q, k and
 * the forward's lse, never stored); STAGED or GEMM, the staged backward (P
 * and dS materialised per chunk of query rows within the context's scratch
 * budget, dK/dV summed in f32 scratch), a second path and cross-check.
 * Both: exact derivatives of the forward as defined above: scale, causal/window,
 * kv_lens, mask, bias, softcap (1 - tanh^2), ALiBi, sinks, additive scoring,
 * GQA/MQA, cu_seqlens, f16/bf16 storage (f32 arithmetic). */
typedef struct {
  size_t struct_size;          /* sizeof(clattn_backward_params) as the caller's header knew it */
  clattn_params fwd;           /* the forward call: q, k, v, out (its O), lse (required:
                                  the forward's lse), every mask and score field */
  clattn_tensor d_out;         /* dL/dO, [B, Hq, M, dv], storage fwd.dtype */
  clattn_tensor d_q, d_k, d_v; /* outputs, storage fwd.dtype: [B,Hq,M,dk] [B,Hkv,N,dk]
                                  [B,Hkv,N,dv]; with GQA d_k, d_v sum over the group */
  cl_mem d_sinks;              /* optional out, f32 [q_heads], when fwd.sinks is given */
  cl_mem d_additive_w;         /* optional out, f32 [head_dim], additive scoring */
  int deterministic;           /* default 1: bitwise identical across runs; 0 lets the
                                  FUSED path add dQ atomically in its dK/dV pass */
  /* optional out, f32, dL/dbias: the gradient of an additive score bias, dS_ij = p_ij (<dO_i, v_j> - D_i) (D_i = <dO_i, O_i>; 0 for
   * disallowed pairs and empty rows), indexed [b, q head, row, key] like
   * fwd.bias. A dimension whose stride is 0 is summed over (a bias
   * broadcast over batch and heads takes its gradient with stride[0] =
   * stride[1] = 0), in a fixed order: bitwise repeatable. fwd.bias need not
   * be given (then it is the gradient of a zero bias). Each element is
   * overwritten. */
  clattn_tensor d_bias;
} clattn_backward_params;

/* Fills the first struct_size bytes of *bp: fwd as clattn_params_init (with
 * its own struct_size), every view and buffer absent, deterministic 1. */
CLATTN_EXPORT void clattn_backward_params_init(clattn_backward_params *bp, size_t struct_size);
static inline clattn_backward_params clattn_backward_params_default(void) {
  clattn_backward_params bp;
  clattn_backward_params_init(&bp, sizeof bp);
  return bp;
}

/* Enqueues the backward of bp->fwd after the n_wait events, like
 * clattn_forward: every check that needs no device work first, so a rejected
 * call enqueues nothing and writes nothing. Every gradient output is
 * overwritten, never accumulated into; disallowed keys get zero gradient,
 * an empty row d_q = 0, and NaN/Inf in disallowed keys and values reaches no
 * output. fwd's weights and route diagnostics are ignored (not written) and
 * empty_rows has no effect (never CLATTN_ERR_EMPTY_ROW). With deterministic
 * = 1 every path is bitwise repeatable. deterministic = 0 on the FUSED/AUTO
 * path runs FA2's single pass: dQ added atomically (cl_ext_float_atomics'
 * add where the device has it, else a compare-and-swap loop) into f32
 * scratch [B, Hq, M, dk], so its last bits may vary from run to run; with
 * d_additive_w wanted, and on the staged path, it changes nothing. */
CLATTN_EXPORT clattn_status clattn_backward(clattn_context *ctx, const clattn_backward_params *bp, cl_uint n_wait,
                                            const cl_event *wait, cl_event *done);

/* ---- block masks (FlexAttention's create_block_mask) ----
 * The mask modifier p->mask_mod (with p's captures) evaluated on the device
 * over every (batch row, query head, block of block_q rows, block of
 * block_k keys) of p's batch, q_heads, q_len and kv_len (batch or q_heads
 * 1: one for all), each block classed empty (the modifier allows none of
 * its pairs), full (all) or partial. q_idx is kv_len - q_len + i. Calls
 * of the same mask_mod and captures take it as clattn_params.block_mask
 * (forward, backward, plans); a call whose sequence lengths differ from
 * q_len and kv_len (kv_lens, packed, paged) evaluates the modifier per
 * pair for those sequences. block_q, block_k 0: 128 (multiples of every
 * kernel's key tile). Blocks until the classes are computed. */
typedef struct clattn_block_mask clattn_block_mask;
CLATTN_EXPORT clattn_status clattn_block_mask_create(clattn_context *ctx, const clattn_params *p, int block_q,
                                                     int block_k, clattn_block_mask **out);
/* How many blocks are empty, partial and full (any may be NULL). */
CLATTN_EXPORT void clattn_block_mask_counts(const clattn_block_mask *bm, size_t *empty, size_t *partial,
                                            size_t *full);
CLATTN_EXPORT void clattn_block_mask_release(clattn_block_mask *bm);

/* The modifiers of p (score_mod, mask_mod with p's captures) evaluated on
 * the device at n points, points[4 e .. 4 e + 3] = (b, h, q_idx, kv_idx):
 * allowed[e] = the mask modifier's verdict (1 without one); grads[e] (when
 * not NULL, and score_mod defines it) = clattn_score_mod_grad(scores[e],
 * ...), 1 without; then scores[e] replaced by clattn_score_mod(scores[e],
 * ...) (kept without one). Host arrays; blocks until done. What an fp64
 * reference runs them with. */
CLATTN_EXPORT clattn_status clattn_modifier_eval(clattn_context *ctx, const clattn_params *p, size_t n,
                                                 const cl_int *points, float *scores, unsigned char *allowed,
                                                 float *grads);

#ifdef __cplusplus
}
#endif
#endif /* CLATTN_H */
