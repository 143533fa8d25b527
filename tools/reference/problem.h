/*
 * The problem kit: builds an attention problem on the host (random, seeded,
 * or edited by the caller), uploads it to a clattn context, runs
 * clattn_forward, reads the outputs back and compares them with the fp64
 * reference (reference.h). Shared by the tests and the `clattn run` tool.
 *
 * Typical use:
 *
 *   cp_shape s = cp_shape_default();
 *   s.q_len = 37; s.kv_len = 53; s.causal = 1; s.want_lse = 1;
 *   char err[256];
 *   cp_problem *pb = cp_build(&s, err, sizeof err);   // host arrays + params
 *   // optionally edit pb->q, pb->k, pb->mask, pb->kv_lens ... here
 *   cp_result r;
 *   if (cp_run(pb, ctx, &r) != 0) puts(pb->err);      // harness failure
 *   else if (!cp_result_ok(&r, 1e-5)) ...             // library disagreed
 *   cp_free(pb);
 *
 * Nothing here aborts: functions return 0 / -1 (or NULL) and leave a message
 * in pb->err (or the caller's err buffer for cp_build). Every OpenCL call is
 * checked.
 *
 * Host arrays hold the WHOLE buffer that a view indexes (offsets, row gaps and
 * all), exactly what is uploaded, so the reference and the device read the
 * same elements. Device outputs come back twice: raw (the whole buffer, for
 * bitwise comparisons and for "untouched" checks) and gathered into dense
 * row-major arrays (out [B,Hq,M,dv], lse [B,Hq,M], weights [B,Hq,M,N]) that
 * line up with the reference's.
 */
#ifndef CLATTN_PROBLEM_H
#define CLATTN_PROBLEM_H

#include <stddef.h>
#include <stdint.h>

#include "clattn.h"
#include "reference.h"

/* Element order of q, k, v, out, lse and weights: [B,H,S,D] or [B,S,H,D]. */
typedef enum { CP_BHSD, CP_BSHD } cp_layout;

typedef enum {
  CP_MASK_NONE,      /* no mask tensor */
  CP_MASK_ONES,      /* a mask tensor that allows everything (edit it freely) */
  CP_MASK_ZEROS,     /* a mask tensor that allows nothing */
  CP_MASK_RANDOM,    /* each stored entry allowed with probability mask_density */
  CP_MASK_BLOCK_DIAG /* mask_blocks segments: row i in i*blocks/M, key j in j*blocks/N */
} cp_mask_kind;

typedef enum {
  CP_BIAS_NONE,   /* no bias tensor */
  CP_BIAS_RANDOM, /* uniform in [-bias_amp, bias_amp] */
  CP_BIAS_CONST   /* every entry bias_amp */
} cp_bias_kind;

/* Broadcast flags for mask_bcast / bias_bcast: the dimension's stride is 0. */
enum { CP_BCAST_BATCH = 1, CP_BCAST_HEAD = 2, CP_BCAST_ROW = 4 };

typedef struct {
  int batch, q_heads, kv_heads; /* q_heads % kv_heads == 0 */
  int q_len, kv_len;            /* M, N */
  int head_dim, value_dim;      /* dk, dv */
  float scale;                  /* NAN = library default 1/sqrt(dk) */
  int causal;
  int window_left, window_right; /* -1 = unbounded */
  cp_layout layout;
  size_t pad;     /* elements before (the view offset) and after every view */
  size_t row_gap; /* unused elements after each row of q, k, v, out, weights */
  int kv_lens;    /* 0: none; 1: random per batch in [1, N] */
  cp_mask_kind mask;
  double mask_density; /* CP_MASK_RANDOM */
  int mask_blocks;     /* CP_MASK_BLOCK_DIAG */
  unsigned mask_bcast; /* CP_BCAST_* */
  cp_bias_kind bias;
  double bias_amp;
  unsigned bias_bcast;  /* CP_BCAST_* */
  double qk_amp, v_amp; /* q, k uniform in [-qk_amp, qk_amp]; v in [-v_amp, v_amp] */
  int want_lse, want_weights;
  int want_diag;            /* entropy, max_weight and argmax outputs */
  clattn_dtype dtype;       /* storage of q, k, v, out: inputs are rounded to it on the host,
                               so the reference sees exactly what the device reads */
  float softcap;            /* 0 = off */
  int alibi;                /* ALiBi slopes: 1, the standard 2^(-8 (h+1) / Hq) per head; 2, per (batch,
                               head): head h's times (b + 2) / 2 in batch row b, alibi_batch_stride
                               Hq + 1 (the unused slot after each row's slopes holds NaN) */
  int sinks;                /* a random sink logit per head in [-1, 3] */
  int additive;             /* CLATTN_SCORE_ADDITIVE with random weights w in [-1, 1] */
  int varlen;               /* packed variable-length batch: sequence b has random lengths
                               (b = 0: q_len, kv_len; zero lengths possible), rows packed
                               one sequence after another; kv_lens is ignored */
  const int *seq_q, *seq_k; /* varlen: the B lengths to use instead (each <= q_len / kv_len) */
  int leftpad;              /* cache_leftpad: row b's keys start at a random row in [0, kv_lens[b]]
                               (kv_lens is made when not asked for; not with varlen) */
  float dropout_p;          /* clattn_params.dropout_p (0 = off), with the seed and offset below */
  uint64_t dropout_seed, dropout_offset;
  clattn_empty_rows empty_rows;
  clattn_algo algo;
  int poison_gaps;       /* NaN in every input element no view reads */
  int poison_disallowed; /* NaN/Inf wherever nothing allowed reads (cp_poison_disallowed) */
  /* Modifiers (clattn_params.score_mod, mask_mod) and their captures: the
   * reference evaluates them on the device (reference_modifier.h) */
  const char *score_mod, *mask_mod;
  cl_mem captures[4];
  float capture_f[4];
  int capture_i[4];
  uint64_t seed;
} cp_shape;

typedef struct {
  cp_shape shape;
  clattn_params params; /* views; cl_mem fields are set by cp_upload */

  /* Host inputs: whole buffers (what is uploaded). mask, bias, kv_lens NULL when absent. */
  float *q, *k, *v, *bias;
  unsigned char *mask;
  int32_t *kv_lens;
  float *alibi_slopes, *sinks; /* [Hq] each (alibi 2: alibi_elems), NULL when absent */
  float *additive_w;           /* [head_dim], NULL unless additive */
  int32_t *cu_q, *cu_k;        /* [B + 1] each, NULL unless varlen */
  int32_t *leftpad;            /* [B], NULL unless shape.leftpad */
  size_t q_elems, k_elems, v_elems, mask_elems, bias_elems, alibi_elems;
  size_t out_elems, lse_elems, weights_elems; /* whole output buffers */
  size_t diag_elems;                          /* each of entropy, max_weight, argmax (viewed like lse) */

  /* Device outputs after cp_read_outputs / cp_run: raw whole buffers ... */
  float *out_raw, *lse_raw, *weights_raw;
  /* ... and dense gathers: out [B,Hq,M,dv], lse [B,Hq,M], weights [B,Hq,M,N]. */
  float *out, *lse, *weights;
  size_t out_count, lse_count, weights_count; /* dense element counts */
  /* Route diagnostics, raw and dense [B,Hq,M] (diag_count entries). */
  float *entropy_raw, *max_weight_raw, *entropy, *max_weight;
  int32_t *argmax_raw, *argmax;
  size_t diag_count;

  /* The fp64 reference (cp_reference), dense like the gathers. */
  double *ref_out, *ref_lse, *ref_weights;
  double *ref_entropy, *ref_max_weight;
  int32_t *ref_argmax;
  long ref_empty_rows;
  int ref_valid;

  /* The modifiers' tables (reference.h's ref_inputs), made by cp_reference. */
  unsigned char *mod_allowed;
  float *mod_score, *mod_grad;
  /* Device objects (cp_upload); the queue and context belong to the clattn context. */
  clattn_context *ctx;
  cl_context cl_ctx;
  cl_command_queue queue;
  cl_mem q_buf, k_buf, v_buf, out_buf, mask_buf, bias_buf, lse_buf, weights_buf, kv_lens_buf;
  cl_mem entropy_buf, max_weight_buf, argmax_buf;
  cl_mem alibi_buf, sinks_buf, additive_w_buf, cu_q_buf, cu_k_buf, leftpad_buf;

  char err[512]; /* the last harness failure */
} cp_problem;

typedef struct {
  clattn_status status; /* what clattn_forward returned */
  double ms;            /* clattn_forward + clFinish, wall time */
  /* Norm-wise relative error ||x - ref||_2 / max(||ref||_2, tiny) over the
   * entries that are finite in both; 0 for an absent output. */
  double err_out, err_lse, err_weights;
  double err_entropy, err_max_weight; /* likewise, for the route diagnostics */
  /* NaN entries in the device's dense outputs. */
  long nan_out, nan_lse, nan_weights;
  /* Entries whose class differs from the reference: NaN vs not, or a
   * non-finite value (lse = -inf of an empty row) not matched exactly. */
  long mismatch_out, mismatch_lse, mismatch_weights;
  /* Diagnostics: class mismatches of entropy and max_weight, and argmax
   * entries that are not the reference's key (nor one whose fp64 score
   * ties the maximum within 1e-5). */
  long mismatch_diag;
  long empty_rows; /* the reference's count */
} cp_result;

/* Sensible small defaults: B=1, H=1, M=N=16, dk=dv=32, BHSD, scale NAN,
 * unbounded window, no mask/bias/kv_lens, amps 1, density 0.7, 2 blocks, seed 1. */
cp_shape cp_shape_default(void);

/* One line describing a shape (for messages and the tool). Returns buf. */
char *cp_describe(const cp_shape *s, char *buf, size_t n);

/* Builds host arrays and params for a shape. NULL on failure (message in err). */
cp_problem *cp_build(const cp_shape *s, char *err, size_t errlen);

/* Releases the device buffers and host memory. NULL is fine. */
void cp_free(cp_problem *pb);

/* The reference's view of the host inputs. */
ref_inputs cp_ref_inputs(const cp_problem *pb);

/* Writes NaN/Inf wherever no allowed (b, h, i, j) reads (kv_lens, mask,
 * window; ref_allowed over every head of the group and every row): key and
 * value rows no query may read, query rows with no allowed key, and bias
 * elements only disallowed positions use. The reference is unchanged by it.
 * Host side only: call cp_write_inputs afterwards when already uploaded.
 * Returns the number of poisoned (b, kv head, j) key/value rows. */
long cp_poison_disallowed(cp_problem *pb);

/* Creates the device buffers in ctx's cl_context from the host arrays and
 * sets the params' cl_mem fields. When already uploaded, rewrites the inputs. */
int cp_upload(cp_problem *pb, clattn_context *ctx);

/* Writes the host inputs to the existing device buffers (after editing them).
 * Invalidates the reference. */
int cp_write_inputs(cp_problem *pb);

/* Fills every output buffer (out, lse, weights) entirely with value. */
int cp_fill_outputs(cp_problem *pb, float value);

/* Reads the whole output buffers into the raw arrays and gathers the dense ones. */
int cp_read_outputs(cp_problem *pb);

/* The modifiers' tables of the reference (reference_modifier.h), once:
 * evaluated on the device of the context cp_upload was given. */
int cp_modifier_tables(cp_problem *pb);

/* Computes the fp64 reference of the host inputs (cached until inputs change). */
int cp_reference(cp_problem *pb);

/* Compares the dense device outputs with the reference (computing it when needed). */
int cp_compare(cp_problem *pb, cp_result *r);

/* The whole check: upload when needed, NaN-poison the outputs, run
 * pb->params through clattn_forward and clFinish, read back, compare.
 * Returns 0 when the harness worked (r->status says what the library did;
 * the outputs are read and compared whatever it returned), -1 otherwise. */
int cp_run(cp_problem *pb, clattn_context *ctx, cp_result *r);

/* Times reps calls of clattn_forward (after one warm-up call) on the uploaded
 * problem; *ms is the mean wall time per call including the final clFinish. */
int cp_time_forward(cp_problem *pb, clattn_context *ctx, int reps, double *ms, clattn_status *st);

/* Whether r shows a correct run: status OK, no class mismatch (so no
 * unexpected NaN), every error <= tol. */
int cp_result_ok(const cp_result *r, double tol);

/* One line with the result's numbers. Returns buf. */
char *cp_result_format(const cp_result *r, char *buf, size_t n);

/* 16-bit storage formats: bits of a float rounded to nearest even (NaN
 * stays NaN, overflow goes to inf), and the float a pattern holds. */
uint16_t cp_f16_bits(float x);
float cp_f16_value(uint16_t h);
uint16_t cp_bf16_bits(float x);
float cp_bf16_value(uint16_t h);
/* x rounded to dtype's storage. */
float cp_round_to(clattn_dtype dtype, float x);

/* ggml's quantize_row_q8_0_reference: k (a multiple of 32) values into k / 32
 * blocks of 34 bytes at y (per block d = amax / 127 stored as f16, round to
 * nearest even; q = roundf(x * (d ? 1 / d : 0)), 1 / d from the f32 d). */
void cp_quantize_q8_0_row(const float *x, unsigned char *y, int k);
/* The same rule for one INT8 row of k values: the quants at q; returns the
 * f32 scale amax / 127. */
float cp_quantize_int8_row(const float *x, unsigned char *q, int k);

/* Element index of view t at (b, h, row, col), size_t arithmetic. */
size_t cp_index(const clattn_tensor *t, int b, int h, int row, int col);

/* Norm-wise relative error of n floats against n doubles (finite pairs only). */
double cp_rel_err(const float *x, const double *ref, size_t n);

/* Name of an OpenCL error code ("CL_OUT_OF_RESOURCES"), or "CL_ERROR". */
const char *cp_cl_error_name(cl_int code);

/* Monotonic wall clock in milliseconds. */
double cp_now_ms(void);

/* Reference counts of a caller's OpenCL objects (0 when the query fails):
 * what tests of embedded use check is left as it was. */
cl_uint cp_context_refs(cl_context c);
cl_uint cp_queue_refs(cl_command_queue q);
/* The references to c that one object created in it holds (a buffer,
 * program or kernel: 1 on POCL, 0 on Intel's runtime; OpenCL leaves these
 * implicit references to the implementation); 1 when the probe fails. */
cl_uint cp_implicit_context_refs(cl_context c);
/* Whether c's reference count shows leaked objects on this runtime; when
 * not, says so on stdout (a check that reads the counts is then weaker). */
int cp_refs_show_leaks(cl_context c);

#endif
