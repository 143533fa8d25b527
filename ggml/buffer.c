/*
 * The backend's buffers: host memory (aligned to the device's base address
 * alignment) wrapped with CL_MEM_USE_HOST_PTR, so ggml's CPU backend runs
 * every other op over the same bytes (the buffer type is host), and clattn
 * reads and writes them through the cl_mem. Where the device keeps a copy
 * of its own (a discrete GPU), flash_attn_ext.c maps and unmaps the regions
 * a node uses around its kernels, as OpenCL requires of host-pointer
 * buffers the host also writes.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

typedef struct {
  void *host;
  cl_mem mem;
} gc_buffer;

static void buffer_free(ggml_backend_buffer_t buffer) {
  gc_buffer *b = buffer->context;
  clReleaseMemObject(b->mem);
  free(b->host);
  free(b);
}

static void *buffer_base(ggml_backend_buffer_t buffer) { return ((gc_buffer *)buffer->context)->host; }

static void buffer_memset(ggml_backend_buffer_t buffer, struct ggml_tensor *t, uint8_t value, size_t offset,
                          size_t size) {
  (void)buffer;
  memset((char *)t->data + offset, value, size);
}

static void buffer_set(ggml_backend_buffer_t buffer, struct ggml_tensor *t, const void *data, size_t offset,
                       size_t size) {
  (void)buffer;
  memcpy((char *)t->data + offset, data, size);
}

static void buffer_get(ggml_backend_buffer_t buffer, const struct ggml_tensor *t, void *data, size_t offset,
                       size_t size) {
  (void)buffer;
  memcpy(data, (const char *)t->data + offset, size);
}

/* From any host buffer (this backend's or the CPU's): a copy of bytes. */
static bool buffer_cpy(ggml_backend_buffer_t buffer, const struct ggml_tensor *src, struct ggml_tensor *dst) {
  (void)buffer;
  if (!ggml_backend_buffer_is_host(src->buffer)) return false;
  memcpy(dst->data, src->data, ggml_nbytes(src));
  return true;
}

static void buffer_clear(ggml_backend_buffer_t buffer, uint8_t value) {
  memset(((gc_buffer *)buffer->context)->host, value, buffer->size);
}

static const struct ggml_backend_buffer_i buffer_iface = {
    /* .free_buffer   = */ buffer_free,
    /* .get_base      = */ buffer_base,
    /* .init_tensor   = */ NULL,
    /* .memset_tensor = */ buffer_memset,
    /* .set_tensor    = */ buffer_set,
    /* .get_tensor    = */ buffer_get,
    /* .set_tensor_2d = */ NULL,
    /* .get_tensor_2d = */ NULL,
    /* .cpy_tensor    = */ buffer_cpy,
    /* .clear         = */ buffer_clear,
    /* .reset         = */ NULL,
};

static const char *buft_name(ggml_backend_buffer_type_t buft) {
  (void)buft;
  return "CLATTN";
}

static ggml_backend_buffer_t buft_alloc(ggml_backend_buffer_type_t buft, size_t size) {
  gc_device *dev = buft->context;
  const size_t align = dev->alignment;
  const size_t bytes = (size ? size : 1) + align - 1 - ((size ? size : 1) + align - 1) % align;
  gc_buffer *b = calloc(1, sizeof *b);
  if (b) b->host = aligned_alloc(align, bytes);
  cl_int err = CL_OUT_OF_HOST_MEMORY;
  if (b && b->host)
    b->mem = clCreateBuffer(clattn_cl_context(dev->ctx), CL_MEM_READ_WRITE | CL_MEM_USE_HOST_PTR, bytes, b->host,
                            &err);
  if (!b || !b->host || err != CL_SUCCESS) {
    fprintf(stderr, "ggml-clattn: a buffer of %zu bytes: %s (OpenCL error %d)\n", size,
            b && b->host ? "clCreateBuffer(CL_MEM_USE_HOST_PTR) failed" : "out of host memory", (int)err);
    if (b) free(b->host);
    free(b);
    return NULL;
  }
  return ggml_backend_buffer_init(buft, buffer_iface, b, size);
}

static size_t buft_alignment(ggml_backend_buffer_type_t buft) { return ((gc_device *)buft->context)->alignment; }

static size_t buft_max_size(ggml_backend_buffer_type_t buft) { return ((gc_device *)buft->context)->max_alloc; }

static bool buft_is_host(ggml_backend_buffer_type_t buft) {
  (void)buft;
  return true;
}

static const struct ggml_backend_buffer_type_i buft_iface = {
    /* .get_name       = */ buft_name,
    /* .alloc_buffer   = */ buft_alloc,
    /* .get_alignment  = */ buft_alignment,
    /* .get_max_size   = */ buft_max_size,
    /* .get_alloc_size = */ NULL,
    /* .is_host        = */ buft_is_host,
};

void gc_buffer_type_init(gc_device *dev, ggml_backend_dev_t owner) {
  dev->buft = (struct ggml_backend_buffer_type){buft_iface, owner, dev};
}

bool gc_is_buffer_type(ggml_backend_buffer_type_t buft) { return buft && buft->iface.alloc_buffer == buft_alloc; }

bool gc_tensor_mem(const struct ggml_tensor *t, cl_mem *mem, size_t *offset) {
  if (!t->buffer || !gc_is_buffer_type(t->buffer->buft) || !t->data) return false;
  const gc_buffer *b = t->buffer->context;
  *mem = b->mem;
  *offset = (size_t)((const char *)t->data - (const char *)b->host);
  return true;
}
