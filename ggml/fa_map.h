/*
 * ggml's FLASH_ATTN_EXT as one clattn_forward call, wherever the node's
 * tensors live: which nodes clattn computes exactly as ggml defines them,
 * and the call's parameters over each tensor's cl_mem and byte offset.
 * Shared by both integrations: libggml-clattn.so (host memory wrapped per
 * node) and the glue in ggml-opencl (that backend's device buffers).
 */
#ifndef GGML_CLATTN_FA_MAP_H
#define GGML_CLATTN_FA_MAP_H

#include <stdbool.h>
#include <stdint.h>

#include "clattn.h"
#include "ggml.h"

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#pragma GCC visibility push(hidden) /* two libraries of one process may each hold a copy */
#endif

/* Where a tensor's bytes are, laid out as ggml lays them (ggml's blocks for
 * the block types): mem NULL = the tensor is absent. */
typedef struct {
  cl_mem mem;
  size_t offset;    /* bytes from the start of mem to the tensor's first byte */
  bool bf16_as_f16; /* a BF16 tensor whose holder keeps it as F16 (ggml-opencl does) */
} gc_fa_mem;

/* The node's tensors in gc_fa_params' order. */
enum { GC_FA_Q, GC_FA_K, GC_FA_V, GC_FA_MASK, GC_FA_SINKS, GC_FA_OUT, GC_FA_TENSORS };

/* Whether the node is one clattn computes exactly as ggml's CPU backend
 * defines it (ggml_compute_forward_flash_attn_ext). Reads shapes, types and
 * op parameters only. */
bool gc_fa_supported(const struct ggml_tensor *op);

/* The op parameter max_bias (ALiBi when > 0). */
float gc_fa_max_bias(const struct ggml_tensor *op);

/* ggml's ALiBi slopes of heads 0 .. heads - 1 (ggml's m0, m1), into out. */
void gc_fa_slopes(int64_t heads, float max_bias, float *out);

/* The clattn_forward parameters of a supported node over mem (indexed by
 * GC_FA_*); slopes: an f32 [heads] buffer of gc_fa_slopes when max_bias > 0.
 * false when a tensor's offset is not a whole number of its elements (of
 * bytes, for the block types). */
bool gc_fa_params(const struct ggml_tensor *node, const gc_fa_mem mem[GC_FA_TENSORS], cl_mem slopes, clattn_params *p);

#if defined(__GNUC__)
#pragma GCC visibility pop
#endif

#ifdef __cplusplus
}
#endif

#endif
