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
 * cu_seqlens_k (a paged cache's form) over kv_lens[b] keys aligned on them. Rows i >= rows do not exist: they
 * have no output row (the reference writes zeros, argmax -1). */
typedef struct {
  long q0, k0;
  int rows, keys, align_m, align_n;
} ref_seq;
ref_seq ref_sequence(const clattn_params *p, const ref_inputs *in, int b);

/* The effective scale: p->scale, or 1/sqrt(head_dim) when it is NaN. */
double ref_scale(const clattn_params *p);

/* Whether key j is allowed for query row i of batch b, head h (kv_lens,
 * mask, window/causal); the bias is not consulted. */
int ref_allowed(const clattn_params *p, const ref_inputs *in, int b, int h, int i, int j);

/* Row (b, h, i)'s score of key j in fp64, shaped in clattn.h's order:
 * scale * <q_i, k_j> (or the additive score), softcap, + bias_ij + ALiBi
 * (whether or not j is allowed). */
double ref_score(const clattn_params *p, const ref_inputs *in, int b, int h, int i, int j);

/* Computes the outputs in fp64. Returns 0, or -1 when the params are not
 * usable by the reference (non-positive dims, kv_heads not dividing q_heads). */
int ref_forward(const clattn_params *p, const ref_inputs *in, ref_outputs *o);

#endif
