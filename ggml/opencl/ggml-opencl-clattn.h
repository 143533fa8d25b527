/*
 * The glue between ggml's OpenCL backend (ggml-opencl) and clattn: that
 * backend's FLASH_ATTN_EXT nodes computed by clattn_forward on its own
 * cl_context, device and in-order queue, over its tensors' cl_mem, with no
 * host round trip. ggml-opencl.patch (beside this file) calls it from
 * ggml-opencl.cpp; GGML_OPENCL_CLATTN=0 in the environment leaves every
 * node to the backend's own flash attention.
 */
#ifndef GGML_OPENCL_CLATTN_H
#define GGML_OPENCL_CLATTN_H

#include <stdbool.h>
#include <stddef.h>

#ifndef CL_TARGET_OPENCL_VERSION
#define CL_TARGET_OPENCL_VERSION 120 /* clattn's, where no includer chose one */
#endif
#include <CL/cl.h>

#ifdef __cplusplus
extern "C" {
#endif

struct ggml_tensor;

/* A tensor as ggml-opencl keeps it. Either its bytes in ggml's layout at
 * `offset` of `mem`, or (d non-NULL) a block type that the backend's
 * set_tensor split apart: its parent's arrays, block b's fields at index b
 * of each (d and m 2 bytes, qh 4 bytes, qs the rest of the block), m and qh
 * NULL for the types without them, and the tensor's byte offset within its
 * parent as ggml lays the parent out. */
typedef struct {
  cl_mem mem;
  size_t offset;
  cl_mem d, m, qh, qs;
  size_t view_offset;
} ggml_opencl_clattn_tensor;

/* The glue's state for one device (created at its first node). */
struct ggml_opencl_clattn;

/* Whether FLASH_ATTN_EXT goes to clattn: GGML_OPENCL_CLATTN unset or not "0". */
bool ggml_opencl_clattn_enabled(void);

/* Whether clattn computes the node exactly as ggml defines it. */
bool ggml_opencl_clattn_supports_op(const struct ggml_tensor *op);

/* A clattn context embedded in the backend's context, device and queue
 * (NULL, the reason on stderr, when clattn cannot be set up there). */
struct ggml_opencl_clattn *ggml_opencl_clattn_init(cl_context context, cl_device_id device, cl_command_queue queue);
void ggml_opencl_clattn_free(struct ggml_opencl_clattn *g);

/* Enqueues the node on the backend's queue: tensors are src[0..4] (q, k, v,
 * mask, sinks; absent ones zeroed) and the node itself. Waits for nothing.
 * false, the reason on stderr, when it could not be enqueued. */
bool ggml_opencl_clattn_compute(struct ggml_opencl_clattn *g, const struct ggml_tensor *node,
                                const ggml_opencl_clattn_tensor tensors[6]);

#ifdef __cplusplus
}
#endif

#endif
