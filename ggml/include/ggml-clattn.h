/*
 * ggml-clattn — a ggml backend (ggml 0.25, backend API 2) whose one device
 * computes FLASH_ATTN_EXT through clattn_forward on any OpenCL device, and
 * leaves every other op to ggml's CPU backend over the same host memory.
 *
 * An engine loads it at run time: GGML_BACKEND_PATH=/path/libggml-clattn.so
 * before ggml_backend_load_all() (llama.cpp's tools and tests call it), or
 * ggml_backend_load(path). The device is named "CLATTN"; CLATTN_DEVICE picks
 * the OpenCL device (a substring of its platform or device name, as for
 * clattn_create). docs/ggml.md says what it computes and what it refuses.
 */
#ifndef GGML_CLATTN_H
#define GGML_CLATTN_H

#include <stdint.h>

#include "ggml-backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The backend's registration (what ggml_backend_init returns when loaded). */
GGML_BACKEND_API ggml_backend_reg_t ggml_backend_clattn_reg(void);

/* FLASH_ATTN_EXT nodes computed through clattn_forward in this process so
 * far (also by name: ggml_backend_reg_get_proc_address(reg,
 * "ggml_backend_clattn_calls")). */
GGML_BACKEND_API uint64_t ggml_backend_clattn_calls(void);

#ifdef __cplusplus
}
#endif

#endif
