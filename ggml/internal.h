/* Declarations shared by the backend's files (prefix gc_). */
#ifndef GGML_CLATTN_INTERNAL_H
#define GGML_CLATTN_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>

#include "clattn.h"
#include "ggml-backend-impl.h"
#include "ggml.h"

/* The device: one clattn context (its OpenCL context, device and queue). */
typedef struct {
  clattn_context *ctx;
  char description[256];
  size_t alignment;   /* of every buffer and tensor: CL_DEVICE_MEM_BASE_ADDR_ALIGN, so a
                         tensor's offset can start a sub-buffer */
  size_t max_alloc;   /* CL_DEVICE_MAX_MEM_ALLOC_SIZE */
  size_t memory;      /* CL_DEVICE_GLOBAL_MEM_SIZE */
  struct ggml_backend_buffer_type buft;
} gc_device;

/* A backend (stream) on the device: what its FLASH_ATTN_EXT nodes keep
 * between calls. */
typedef struct {
  gc_device *dev;
  cl_mem slopes;       /* ALiBi's per-head slopes for (slope_heads, slope_max_bias) */
  int slope_heads;
  float slope_max_bias;
} gc_backend;

/* ---- buffers (buffer.c): host memory, wrapped as an OpenCL buffer ---- */

/* The device's buffer type (is_host: ggml's CPU backend reads and writes
 * the same memory). */
void gc_buffer_type_init(gc_device *dev, ggml_backend_dev_t owner);
bool gc_is_buffer_type(ggml_backend_buffer_type_t buft);
/* The cl_mem a tensor lies in and its first byte there; false when the
 * tensor is not in one of this backend's buffers. */
bool gc_tensor_mem(const struct ggml_tensor *t, cl_mem *mem, size_t *offset);

/* ---- FLASH_ATTN_EXT (flash_attn_ext.c) ---- */

/* Whether the node is one clattn computes exactly as ggml's CPU backend
 * defines it (ggml_compute_forward_flash_attn_ext). */
bool gc_flash_attn_supported(const struct ggml_tensor *op);
/* Computes the node through clattn_forward (synchronously: its output is in
 * host memory on return). */
enum ggml_status gc_flash_attn_compute(gc_backend *be, struct ggml_tensor *node);

/* The nodes gc_flash_attn_compute has computed (ggml_backend_clattn_calls). */
void gc_count_call(void);

#endif
