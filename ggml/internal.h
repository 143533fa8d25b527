/* Declarations shared by the backend's files (prefix gc_). */
#ifndef GGML_CLATTN_INTERNAL_H
#define GGML_CLATTN_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>

#include "clattn.h"
#include "fa_map.h"
#include "ggml-backend-impl.h"
#include "ggml.h"

/* The device: one clattn context (its OpenCL context, device and queue). */
typedef struct {
  clattn_context *ctx;
  char description[256];
  size_t memory; /* CL_DEVICE_GLOBAL_MEM_SIZE */
} gc_device;

/* A backend (stream) on the device: what its FLASH_ATTN_EXT nodes keep
 * between calls. */
typedef struct {
  gc_device *dev;
  cl_mem slopes;       /* ALiBi's per-head slopes for (slope_heads, slope_max_bias) */
  int slope_heads;
  float slope_max_bias;
} gc_backend;

/* ---- FLASH_ATTN_EXT (flash_attn_ext.c) ---- */

/* Whether the node is one clattn computes exactly as ggml's CPU backend
 * defines it (gc_fa_supported). */
bool gc_flash_attn_supported(const struct ggml_tensor *op);
/* Computes the node through clattn_forward over its tensors' host memory
 * (synchronously: its output is in host memory on return). */
enum ggml_status gc_flash_attn_compute(gc_backend *be, struct ggml_tensor *node);

/* The nodes gc_flash_attn_compute has computed (ggml_backend_clattn_calls). */
void gc_count_call(void);

#endif
