/* Program sources and build options (see program_text.h). */
#include "device/program_text.h"
#include "device/rules.h"

#include "args.h.cl"

#include <stdio.h>
#include <string.h>

#include "embedded_cl.h"

void ca_append_text(clattn_dtype src_dtype, clattn_dtype kv_dtype, ca_program_text *out) {
  *out = (ca_program_text){.sources = {clattn_src_args, clattn_src_common, clattn_src_append, clattn_src_kvcache},
                           .n_sources = 4};
  snprintf(out->options, sizeof out->options, "-cl-std=CL1.2 -D CA_DTYPE=%d -D CA_KV_DTYPE=%d", (int)src_dtype,
           (int)(kv_dtype == CLATTN_DTYPE_SAME ? src_dtype : kv_dtype));
}

void ca_text_modifier(ca_program_text *text, int flags, const char *score_text, const char *mask_text) {
  static const char score_line[] = "\n#line 1 \"score_mod\"\n", mask_line[] = "\n#line 1 \"mask_mod\"\n";
  const char *add[6];
  unsigned n_add = 0;
  if (score_text) {
    add[n_add++] = score_line;
    add[n_add++] = score_text;
    add[n_add++] = "\n"; /* a text without a last newline ends before the next file's #line */
  }
  if (mask_text && !(score_text && strcmp(score_text, mask_text) == 0)) {
    add[n_add++] = mask_line;
    add[n_add++] = mask_text;
    add[n_add++] = "\n";
  }
  for (unsigned i = text->n_sources; i-- > 1;) text->sources[i + n_add] = text->sources[i];
  for (unsigned i = 0; i < n_add; i++) text->sources[1 + i] = add[i];
  text->n_sources += n_add;
  const size_t at = strlen(text->options);
  snprintf(text->options + at, sizeof text->options - at, "%s%s%s", flags & CA_MODF_SCORE ? " -D CA_MOD_SCORE" : "",
           flags & CA_MODF_MASK ? " -D CA_MOD_MASK" : "", flags & CA_MODF_GRAD ? " -D CA_MOD_GRAD" : "");
}

void ca_modifier_text(ca_program_text *out) {
  *out = (ca_program_text){.sources = {clattn_src_args, clattn_src_common, clattn_src_modifier}, .n_sources = 3};
  snprintf(out->options, sizeof out->options, "-cl-std=CL1.2");
}

void ca_probe_text(ca_program_text *out) {
  static const char probe[] = "__kernel void ca_probe(__global float *x) { x[get_global_id(0)] *= 2.0f; }\n";
  *out = (ca_program_text){.sources = {probe}, .n_sources = 1};
}

void ca_core_text(const tl_tiles *tiles, clattn_dtype dtype, ca_program_text *out) {
  ca_core_kv_text(tiles, dtype, CLATTN_DTYPE_SAME, CLATTN_DTYPE_SAME, out);
}

void ca_core_kv_text(const tl_tiles *tiles, clattn_dtype dtype, clattn_dtype k_dtype, clattn_dtype v_dtype,
                     ca_program_text *out) {
  if (k_dtype == CLATTN_DTYPE_SAME) k_dtype = dtype;
  if (v_dtype == CLATTN_DTYPE_SAME) v_dtype = k_dtype;
  *out = (ca_program_text){.sources = {clattn_src_args, clattn_src_common, clattn_src_qk_score, clattn_src_softmax,
                                       clattn_src_mix, clattn_src_merge, clattn_src_gemm},
                           .n_sources = 7};
  if (k_dtype == dtype && v_dtype == dtype)
    snprintf(out->options, sizeof out->options, "-cl-std=CL1.2 -D CA_DTYPE=%d -D MERGE_COLS=%d", (int)dtype,
             CA_MERGE_COLS);
  else
    snprintf(out->options, sizeof out->options,
             "-cl-std=CL1.2 -D CA_DTYPE=%d -D CA_K_DTYPE=%d -D CA_V_DTYPE=%d -D MERGE_COLS=%d", (int)dtype,
             (int)k_dtype, (int)v_dtype, CA_MERGE_COLS);
  tl_core_options(tiles, out->options, sizeof out->options);
}

/* One kernel argument of `size` bytes after `bytes` of them, at its natural alignment. */
static size_t arg_end(size_t bytes, size_t size) {
  const size_t align = size >= 8 ? 8 : size;
  return (bytes + align - 1) / align * align + size;
}

size_t ca_fused_arg_bytes(unsigned address_bits) {
  const size_t pointer = address_bits / 8;
  size_t bytes = 0;
  for (int i = 0; i < CA_NBUF(flash_core); i++) bytes = arg_end(bytes, pointer);
  bytes = arg_end(bytes, sizeof(ca_args_flash_core));
  for (int i = 0; i < CA_NBUF(flash_extra); i++) bytes = arg_end(bytes, pointer);
  return arg_end(bytes, sizeof(ca_args_flash_extra));
}

void ca_fused_text(const tl_tiles *tiles, const tl_device *dev, int head_dim, int value_dim, clattn_dtype dtype,
                   clattn_dtype k_dtype, clattn_dtype v_dtype, ca_program_text *out) {
  /* flash_block only where the work-group kernels are used (GPUs, or forced) and its tiles fit */
  tl_block blk;
  const tl_block want = {tiles->block_rm, tiles->block_rn};
  const int block = tiles->flash_wg > 0 && tl_flash_block_tuned(dev, head_dim, value_dim, want, &blk) == 0;
  ca_fused_text_tile(tiles, dev, head_dim, value_dim, dtype, k_dtype, v_dtype, block ? &blk : NULL, out);
}

void ca_fused_text_tile(const tl_tiles *tiles, const tl_device *dev, int head_dim, int value_dim, clattn_dtype dtype,
                        clattn_dtype k_dtype, clattn_dtype v_dtype, const tl_block *blk, ca_program_text *out) {
  *out = (ca_program_text){.sources = {clattn_src_args, clattn_src_common, clattn_src_flash, clattn_src_flash_block,
                                       clattn_src_decode},
                           .n_sources = 5};
  if (k_dtype == CLATTN_DTYPE_SAME) k_dtype = dtype;
  if (v_dtype == CLATTN_DTYPE_SAME) v_dtype = k_dtype;
  int at = snprintf(out->options, sizeof out->options,
                    "-cl-std=CL1.2 -D CA_DTYPE=%d -D CA_K_DTYPE=%d -D CA_V_DTYPE=%d -D DK=%d -D DV=%d", (int)dtype,
                    (int)k_dtype, (int)v_dtype, head_dim, value_dim);
  if (tiles->flash_wg > 0) /* flash_tiled's key tile */
    at += snprintf(out->options + at, sizeof out->options - (size_t)at, " -D FLASH_TILE=%d",
                   tl_flash_tile(dev, head_dim, value_dim, tiles->flash_tile));
  if (blk) {
    at += snprintf(out->options + at, sizeof out->options - (size_t)at, " -D BLOCK_RM=%d -D BLOCK_RN=%d%s", blk->rm,
                   blk->rn, tiles->block_half ? " -D BLOCK_HALF" : "");
    if (tiles->block_sg)
      at += snprintf(out->options + at, sizeof out->options - (size_t)at, " -D BLOCK_SG=%d", tiles->block_sg);
    /* f16 throughout: q and out in f32 ask for f32's accuracy */
    if (tiles->block_half && tiles->block_half_math && dtype == CLATTN_F16 && k_dtype == CLATTN_F16 &&
        v_dtype == CLATTN_F16 && dev->fp16)
      at += snprintf(out->options + at, sizeof out->options - (size_t)at, " -D BLOCK_HALF_MATH");
  } else
    at += snprintf(out->options + at, sizeof out->options - (size_t)at, " -D FLASH_NO_BLOCK");
  /* flash_decode likewise: the work-group kernels, and a key tile that fits */
  const int decode_keys = tiles->flash_wg > 0 ? tl_decode_keys(dev, head_dim, value_dim) : 0;
  if (decode_keys > 0)
    snprintf(out->options + at, sizeof out->options - (size_t)at, " -D DEC_N=%d", decode_keys);
  else
    snprintf(out->options + at, sizeof out->options - (size_t)at, " -D FLASH_NO_DECODE");
  tl_fused_options(tiles, out->options, sizeof out->options);
  if (ca_rule(dev, CA_RULE_X86_PREFETCH, NULL)) { /* the CPU kernels' prefetch hints as x86 instructions */
    const size_t len = strlen(out->options);
    snprintf(out->options + len, sizeof out->options - len, " -D CA_X86_ASM");
  }
}

void ca_backward_text(int head_dim, int value_dim, clattn_dtype dtype, ca_program_text *out) {
  *out = (ca_program_text){
      .sources = {clattn_src_args, clattn_src_common, clattn_src_backward, clattn_src_backward_staged},
      .n_sources = 4};
  snprintf(out->options, sizeof out->options, "-cl-std=CL1.2 -D CA_DTYPE=%d -D DK=%d -D DV=%d", (int)dtype, head_dim,
           value_dim); /* cl/backward.cl reads no tile value */
}

void ca_text_dropout(ca_program_text *text) {
  const size_t used = strlen(text->options);
  snprintf(text->options + used, sizeof text->options - used, " -D CA_DROPOUT");
}

void ca_backward_float_atomics(ca_program_text *text) {
  char *std = strstr(text->options, "-cl-std=CL1.2");
  if (std) memcpy(std, "-cl-std=CL3.0", strlen("-cl-std=CL3.0"));
  const size_t used = strlen(text->options);
  snprintf(text->options + used, sizeof text->options - used, " -D BWD_FLOAT_ATOMICS");
}
