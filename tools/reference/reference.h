/*
 * The fp64 host reference: DESIGN.md's semantics, written once, used by the
 * tests and the `clattn` tool to check every device path.
 *
 * Inputs are host copies of the whole cl_mem buffers that the params' views
 * index (the same offsets and strides as on the device, in elements); the
 * cl_mem handles in the params are ignored. Outputs are dense, row-major:
 * out [B,Hq,M,dv], lse [B,Hq,M], weights [B,Hq,M,N].
 */
#ifndef CLATTN_REFERENCE_H
#define CLATTN_REFERENCE_H

#include <stdint.h>
#include "clattn.h"

typedef struct {
  const float *q, *k, *v;                     /* required */
  const unsigned char *mask;                  /* NULL unless p->mask.buf is set */
  const float *bias;                          /* NULL unless p->bias.buf is set */
  const int32_t *kv_lens;                     /* NULL unless p->kv_lens is set: [B] */
  const float *alibi_slopes;                  /* NULL unless p->alibi_slopes is set: slope (b, h) at
                                                 b * p->alibi_batch_stride + h */
  const float *sinks;                         /* NULL unless p->sinks is set: [Hq] */
  const float *additive_w;                    /* set exactly when p->score is CLATTN_SCORE_ADDITIVE: [head_dim] */
  const int32_t *cu_seqlens_q, *cu_seqlens_k; /* set exactly when p->cu_seqlens_q is: [B + 1] each */
  const int32_t *cache_leftpad;               /* NULL unless p->cache_leftpad is set: [B] */
  /* The modifiers (p->mask_mod, p->score_mod) evaluated at every pair:
   * dense [B, Hq, M, N] by row i within its sequence and key j
   * (reference_modifier.h makes them); NULL without. */
  const unsigned char *mod_allowed; /* the mask modifier's verdicts */
  const float *mod_score;           /* the score modifier of ref_shaped_score, rounded to f32 */
  const float *mod_grad;            /* its derivative there (clattn_score_mod_grad), for ref_backward */
} ref_inputs;

typedef struct {
  double *out;                  /* required: B*Hq*M*dv */
  double *lse;                  /* optional: B*Hq*M */
  double *weights;              /* optional: B*Hq*M*N */
  double *entropy, *max_weight; /* optional: B*Hq*M route diagnostics (clattn.h) */
  int32_t *argmax;              /* optional: B*Hq*M; REF_ARGMAX_UNSPECIFIED for a NaN row */
  long empty_rows;              /* set: rows with no allowed key (or all scores -inf) */
} ref_outputs;

#define REF_ARGMAX_UNSPECIFIED INT32_MIN

/* Where batch row b's sequence lies (the device's ca_sequence): padded
 * batches start at row 0 with q_len rows and kv_lens[b] (or kv_len) keys,
 * aligned on q_len / kv_len; packed sequences (cu_seqlens) at their offsets,
 * clamped to total_q / total_kv, with their own lengths (at most q_len /
 * kv_len) for rows, keys and alignment; packed queries without
 * cu_seqlens_k (a paged cache's form) over kv_lens[b] keys aligned on them;
 * a left-padded row (cache_leftpad) from row cache_leftpad[b] to kv_lens[b],
 * aligned on that count. Rows i >= rows do not exist: they
 * have no output row (the reference writes zeros, argmax -1). */
typedef struct {
  long q0, k0;
  int rows, keys, align_m, align_n;
} ref_seq;
ref_seq ref_sequence(const clattn_params *p, const ref_inputs *in, int b);

/* The effective scale: p->scale, or 1/sqrt(head_dim) when it is NaN. */
double ref_scale(const clattn_params *p);

/* scale * <q_i, k_j> (or the additive score), then softcap: the score a
 * score modifier takes. */
double ref_shaped_score(const clattn_params *p, const ref_inputs *in, int b, int h, int i, int j);
/* The dense index of pair (b, h, i, j) in ref_inputs' modifier tables. */
size_t ref_pair_index(const clattn_params *p, int b, int h, int i, int j);

/* Whether key j is allowed for query row i of batch b, head h (kv_lens,
 * mask, window/causal); the bias is not consulted (ref_forward and
 * ref_backward also drop a key whose bias entry is -inf). */
int ref_allowed(const clattn_params *p, const ref_inputs *in, int b, int h, int i, int j);

/* Whether the bias disallows key j (an entry of -inf), as a zero mask
 * entry does: its key and value never reach an output, whatever the
 * dot product (an infinite one included). */
int ref_bias_disallows(const clattn_params *p, const ref_inputs *in, int b, int h, int i, int j);

/* Row (b, h, i)'s score of key j in fp64, shaped in clattn.h's order:
 * scale * <q_i, k_j> (or the additive score), softcap, + bias_ij + ALiBi
 * (whether or not j is allowed). */
double ref_score(const clattn_params *p, const ref_inputs *in, int b, int h, int i, int j);

/* Dropout (clattn.h, dropout_p): whether weight (b, h, i, j) is kept, from
 * Philox4x32-10 written here anew (not the library's), and the factor a
 * kept weight is scaled by. */
void ref_philox4x32_10(const uint32_t counter[4], const uint32_t key[2], uint32_t out[4]);
int ref_dropout_kept(const clattn_params *p, int b, int h, long i, long j);
double ref_dropout_scale(const clattn_params *p);

/* Computes the outputs in fp64 (with dropout: O = sum_j a_ij z_ij v_j, the
 * weights output a_ij z_ij; lse and the diagnostics of a). Returns 0, or -1 when the params are not
 * usable by the reference (non-positive dims, kv_heads not dividing q_heads). */
int ref_forward(const clattn_params *p, const ref_inputs *in, ref_outputs *o);

#endif
