/* Program sources and build options (see program_text.h). */
#include "program_text.h"

#include <stdio.h>

#include "embedded_cl.h"

void ca_append_text(clattn_dtype src_dtype, clattn_dtype kv_dtype, ca_program_text *out) {
  *out = (ca_program_text){.sources = {clattn_src_common, clattn_src_append}, .n_sources = 2};
  snprintf(out->options, sizeof out->options, "-cl-std=CL1.2 -D CA_DTYPE=%d -D CA_KV_DTYPE=%d", (int)src_dtype,
           (int)(kv_dtype == CLATTN_DTYPE_SAME ? src_dtype : kv_dtype));
}

void ca_probe_text(ca_program_text *out) {
  static const char probe[] = "__kernel void ca_probe(__global float *x) { x[get_global_id(0)] *= 2.0f; }\n";
  *out = (ca_program_text){.sources = {probe}, .n_sources = 1};
}

void ca_core_text(const tl_tiles *tiles, clattn_dtype dtype, ca_program_text *out) {
  ca_core_kv_text(tiles, dtype, CLATTN_DTYPE_SAME, out);
}

void ca_core_kv_text(const tl_tiles *tiles, clattn_dtype dtype, clattn_dtype kv_dtype, ca_program_text *out) {
  *out = (ca_program_text){.sources = {clattn_src_common, clattn_src_qk_score, clattn_src_softmax, clattn_src_mix,
                                       clattn_src_merge, clattn_src_gemm},
                           .n_sources = 6};
  if (kv_dtype == CLATTN_DTYPE_SAME || kv_dtype == dtype)
    snprintf(out->options, sizeof out->options, "-cl-std=CL1.2 -D CA_DTYPE=%d", (int)dtype);
  else
    snprintf(out->options, sizeof out->options, "-cl-std=CL1.2 -D CA_DTYPE=%d -D CA_KV_DTYPE=%d", (int)dtype,
             (int)kv_dtype);
  tl_build_options(tiles, out->options, sizeof out->options);
}

void ca_fused_text(const tl_tiles *tiles, const tl_device *dev, int head_dim, int value_dim, clattn_dtype dtype,
                   clattn_dtype kv_dtype, ca_program_text *out) {
  *out = (ca_program_text){.sources = {clattn_src_common, clattn_src_flash, clattn_src_flash_block, clattn_src_decode},
                           .n_sources = 4};
  int at = snprintf(out->options, sizeof out->options,
                    "-cl-std=CL1.2 -D CA_DTYPE=%d -D CA_KV_DTYPE=%d -D DK=%d -D DV=%d -D FLASH_TILE=%d", (int)dtype,
                    (int)(kv_dtype == CLATTN_DTYPE_SAME ? dtype : kv_dtype), head_dim, value_dim,
                    tl_flash_tile(dev, head_dim, value_dim));
  /* flash_block only where the work-group kernels are used (GPUs, or forced) and its tiles fit */
  tl_block blk;
  if (tiles->flash_wg > 0 && tl_flash_block(dev, head_dim, value_dim, &blk) == 0)
    at += snprintf(out->options + at, sizeof out->options - (size_t)at, " -D BLOCK_RM=%d -D BLOCK_RN=%d", blk.rm,
                   blk.rn);
  else
    at += snprintf(out->options + at, sizeof out->options - (size_t)at, " -D FLASH_NO_BLOCK");
  /* flash_decode likewise: the work-group kernels, and a key tile that fits */
  const int decode_keys = tiles->flash_wg > 0 ? tl_decode_keys(dev, head_dim, value_dim) : 0;
  if (decode_keys > 0)
    snprintf(out->options + at, sizeof out->options - (size_t)at, " -D DEC_N=%d", decode_keys);
  else
    snprintf(out->options + at, sizeof out->options - (size_t)at, " -D FLASH_NO_DECODE");
  tl_build_options(tiles, out->options, sizeof out->options);
}

void ca_backward_text(const tl_tiles *tiles, int head_dim, int value_dim, clattn_dtype dtype, ca_program_text *out) {
  *out = (ca_program_text){.sources = {clattn_src_common, clattn_src_backward}, .n_sources = 2};
  snprintf(out->options, sizeof out->options, "-cl-std=CL1.2 -D CA_DTYPE=%d -D DK=%d -D DV=%d", (int)dtype, head_dim,
           value_dim);
  tl_build_options(tiles, out->options, sizeof out->options);
}
