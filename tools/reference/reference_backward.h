/*
 * The fp64 host reference of the backward pass (clattn_backward): the
 * analytic gradients of reference.h's forward, and the scalar loss
 * L = sum dO . O whose central finite differences check them.
 *
 * Inputs as for ref_forward (whole host buffers indexed by the params'
 * views). d_out and every gradient are dense and indexed by logical rows:
 * d_out, d_q [B,Hq,M,*], d_k, d_v [B,Hkv,N,*] (key j of batch row b; with
 * packed sequences row i / key j of sequence b), zeros where no row or key
 * exists.
 */
#ifndef CLATTN_REFERENCE_BACKWARD_H
#define CLATTN_REFERENCE_BACKWARD_H

#include "reference.h"

typedef struct {
  double *d_q, *d_k, *d_v; /* required: B*Hq*M*dk, B*Hkv*N*dk, B*Hkv*N*dv */
  double *d_sinks;         /* optional: [Hq] (zeros without sinks) */
  double *d_additive_w;    /* optional: [head_dim] (zeros unless additive) */
  double *d_scores;        /* optional: B*Hq*M*N, dL/d(shaped score) of each pair, the bias's
                              gradient before any broadcast sum (zeros where no pair flows) */
} ref_grads;

/* The gradients of L = sum dO . O in fp64. Returns 0, or -1 for params the
 * reference cannot use (as ref_forward) or out of memory. */
int ref_backward(const clattn_params *p, const ref_inputs *in, const double *d_out, ref_grads *g);

/* L = sum over existing rows of dO . O, with O from ref_forward (fp64).
 * NaN when the reference cannot run. */
double ref_loss(const clattn_params *p, const ref_inputs *in, const double *d_out);

#endif
