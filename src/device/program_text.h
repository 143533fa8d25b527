/*
 * What each program the library builds is made of: its embedded sources (in
 * order: cl/args.h.cl and cl/common.h.cl first) and its build options, as pure functions of the tiles and the
 * device description. The runtime builds from these, and so does the GPU
 * code-generation check (tests/gpu_programs.c), so what clang compiles for
 * amdgcn and nvptx there is exactly what a GPU driver would be given.
 */
#ifndef CLATTN_PROGRAM_TEXT_H
#define CLATTN_PROGRAM_TEXT_H

#include <stddef.h>

#include "clattn.h"
#include "tiles.h"

enum { CA_MAX_SOURCES = 16, CA_OPTIONS_SIZE = 512 };
/* merge_states' output columns per work-item (cl/merge.cl's MERGE_COLS):
 * given to the core program, and the enqueue's NDRange follows it. */
enum { CA_MERGE_COLS = 4 };

typedef struct {
  const char *sources[CA_MAX_SOURCES];
  unsigned n_sources;
  char options[CA_OPTIONS_SIZE];
} ca_program_text;

/* The one-line kernel that asks the device's warp/wavefront width. */
void ca_probe_text(ca_program_text *out);
/* qk_score, softmax_rows, mix_values, merge_states and the GEMM helpers for
 * one storage type. */
void ca_core_text(const tl_tiles *tiles, clattn_dtype dtype, ca_program_text *out);
/* The same with k stored as k_dtype and v as v_dtype (paged or not, Q8_0,
 * INT8, ...; CLATTN_DTYPE_SAME: k like q, v like k). */
void ca_core_kv_text(const tl_tiles *tiles, clattn_dtype dtype, clattn_dtype k_dtype, clattn_dtype v_dtype,
                     ca_program_text *out);
/* The fused kernels for one (head_dim, value_dim, storage type of q/out,
 * storage types of k and v: CLATTN_DTYPE_SAME as above); flash_block is in it
 * when tiles->flash_wg > 0 and a tile fits (tl_flash_block_tuned: the
 * tuned block_rm x block_rn or tl_flash_block's choice). The block tile is
 * in this program's options alone (BLOCK_RM, BLOCK_RN). */
void ca_fused_text(const tl_tiles *tiles, const tl_device *dev, int head_dim, int value_dim, clattn_dtype dtype,
                   clattn_dtype k_dtype, clattn_dtype v_dtype, ca_program_text *out);
/* Bytes of the fused kernels' arguments (cl/args.h.cl's flash_core and
 * flash_extra: their buffers and structs) on a device with
 * address_bits-wide pointers. */
size_t ca_fused_arg_bytes(unsigned address_bits);
/* The same with flash_block's tile given (NULL: no flash_block). */
void ca_fused_text_tile(const tl_tiles *tiles, const tl_device *dev, int head_dim, int value_dim, clattn_dtype dtype,
                        clattn_dtype k_dtype, clattn_dtype v_dtype, const tl_block *block, ca_program_text *out);
/* The backward kernels (cl/backward.cl, cl/backward_staged.cl) for one (head_dim, value_dim, storage type). */
void ca_backward_text(int head_dim, int value_dim, clattn_dtype dtype, ca_program_text *out);
/* A fused or backward program's text made to apply dropout (-D CA_DROPOUT:
 * the same kernels and arguments, the weights that mix V dropped). */
void ca_text_dropout(ca_program_text *text);
/* The backward text's options for a device with cl_ext_float_atomics: OpenCL
 * C 3.0 and -D BWD_FLOAT_ATOMICS, so the atomics variant's dQ adds are native. */
void ca_backward_float_atomics(ca_program_text *text);
/* A program's text made to call the caller's modifiers (clattn_params'
 * score_mod, mask_mod; the CA_MODF_* flags): their text right after
 * cl/args.h.cl (which defines clattn_captures), once when both are the
 * same text, each on lines of its own that compiler messages name
 * "score_mod" or "mask_mod"; and -D CA_MOD_SCORE / CA_MOD_MASK / CA_MOD_GRAD. */
enum { CA_MODF_SCORE = 1, CA_MODF_MASK = 2, CA_MODF_GRAD = 4 };
void ca_text_modifier(ca_program_text *text, int flags, const char *score_text, const char *mask_text);
/* cl/modifier.cl's kernels (block masks, pointwise evaluation), made to
 * call a modifier with ca_text_modifier. */
void ca_modifier_text(ca_program_text *out);
/* clattn_kv_append's kernel for one (source storage, cache storage), with
 * clattn_forward_kvcache's (cl/kvcache.cl: its lengths and rotary copies). */
void ca_append_text(clattn_dtype src_dtype, clattn_dtype kv_dtype, ca_program_text *out);

#endif
