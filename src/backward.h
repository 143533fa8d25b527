/*
 * What the backward's two paths share: the FA2 passes (backward.c) and the
 * staged path (backward_staged.c) run in the same program on the same
 * per-row scratch (D_i, sinks' terms, d_additive_w's row terms), through
 * the launches of backward_launch.c.
 */
#ifndef CLATTN_BACKWARD_H
#define CLATTN_BACKWARD_H

#include "internal.h"

/* BWD_ARGS (cl/backward.cl), in order. */
void ca_backward_args(ca_args *a, const clattn_params *p, const ca_plan *plan, const clattn_backward_params *bp,
                      cl_mem dsum, cl_mem sinkt);

/* bwd_zero over a packed gradient view [1, heads, rows, cols]. */
clattn_status ca_backward_zero(clattn_context *ctx, cl_kernel zero, const clattn_tensor *t, int heads, int rows,
                               int cols, cl_uint n_wait, const cl_event *wait, cl_event *prev);

/* bwd_fill: x[0 .. n) = 0. */
clattn_status ca_backward_fill(clattn_context *ctx, cl_kernel fill, cl_mem x, cl_ulong n, cl_uint n_wait,
                               const cl_event *wait, cl_event *prev);

/* bwd_store: f32 accumulators [batch * heads][len][acc_cols] (columns col0 ..
 * col0 + cols - 1) to a gradient view; len is q_len (key_side 0) or kv_len. */
clattn_status ca_backward_store(clattn_context *ctx, cl_kernel store, cl_mem acc, int acc_cols, int col0, int cols,
                                int heads, int key_side, const clattn_params *p, const clattn_tensor *view,
                                cl_uint n_wait, const cl_event *wait, cl_event *prev);

/* bwd_dbias: d_bias (bp->d_bias, validated) after bwd_rowdot (dsum): each
 * pair's dS, summed over the dimensions its view broadcasts. */
clattn_status ca_backward_dbias(clattn_context *ctx, cl_kernel dbias, const clattn_params *p, const ca_plan *plan,
                                const clattn_backward_params *bp, cl_mem dsum, cl_mem sinkt, cl_uint n_wait,
                                const cl_event *wait, cl_event *prev);

/* bwd_sum: out[c] = sum over a < n_outer, r < n_inner of x[a so + c sc + r si]. */
clattn_status ca_backward_sum(clattn_context *ctx, cl_kernel sum, cl_mem x, int n_cols, cl_ulong n_outer,
                              cl_ulong n_inner, cl_ulong s_outer, cl_ulong s_col, cl_ulong s_inner, cl_mem out,
                              cl_uint n_wait, const cl_event *wait, cl_event *prev);

/* The staged path's kernels and scratch, made before anything is enqueued. */
typedef struct {
  cl_kernel pairs, dq, dkdv, fill, store;
  cl_mem pw, gw, acc; /* P and G of a chunk; dK | dV accumulators */
  ca_chunk chunk;
} ca_backward_staged;

/* Takes the staged path's kernels and scratch from the pools (P and G chunked to the
 * context's scratch budget; f32 dK, dV accumulators): CLATTN_ERR_OUT_OF_MEMORY
 * with a message when they cannot be had. Adds its bytes to *scratch_bytes and
 * the scratch's pending last uses to deps. */
clattn_status ca_backward_staged_init(clattn_context *ctx, cl_program program, const clattn_params *p,
                                      ca_backward_staged *s, ca_deps *deps, size_t *scratch_bytes);

/* Enqueues the staged passes after bwd_rowdot (dsum, sinkt): dQ (and with
 * dw_rows, d_additive_w's row terms), dK and dV. */
clattn_status ca_backward_staged_run(clattn_context *ctx, const ca_backward_staged *s, const clattn_params *p,
                                     const ca_plan *plan, const clattn_backward_params *bp, cl_mem dsum, cl_mem sinkt,
                                     cl_mem dw_rows, cl_uint n_wait, const cl_event *wait, cl_event *prev);

/* Gives the kernels and scratch back to the context's pools (last_use: the
 * event after which the scratch is free, NULL after a failure). */
void ca_backward_staged_release(clattn_context *ctx, ca_backward_staged *s, cl_event last_use);

#endif
