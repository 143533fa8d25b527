/*
 * The registration, the device and the backend (stream) of ggml-clattn.
 *
 * One device, type GPU (ggml's tests compare GPU-type devices with the CPU
 * backend; llama.cpp offloads to them), over one clattn context created at
 * the first registration (CLATTN_DEVICE picks the OpenCL device). The device
 * accepts FLASH_ATTN_EXT where clattn computes it as ggml defines it, and
 * the view ops, which move no data. Its buffer type is the CPU backend's,
 * as ggml's BLAS backend does: tensors (the K/V cache among them) stay in
 * host memory where the CPU backend runs every other node, and ggml's
 * scheduler moves a FLASH_ATTN_EXT node it first gave to the CPU up to this
 * higher-priority device, which shares its buffer type and supports the
 * node (its pass 3). flash_attn_ext.c wraps the node's host memory as
 * OpenCL buffers. Graphs compute synchronously: when graph_compute returns,
 * the outputs are in host memory.
 */
#define _GNU_SOURCE /* RTLD_DEFAULT */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ggml-clattn.h"
#include "internal.h"

static gc_device device_ctx;
static struct ggml_backend_device device;
static struct ggml_backend_reg reg;
static int device_count; /* 1 once the clattn context exists */

/* ---- the backend (stream) ---- */

static const char *backend_name(ggml_backend_t backend) {
  (void)backend;
  return "CLATTN";
}

static void backend_free(ggml_backend_t backend) {
  gc_backend *be = backend->context;
  if (be->slopes) clReleaseMemObject(be->slopes);
  free(be);
  free(backend);
}

/* Ops whose result is a view of their source: nothing to compute. */
static bool is_view_op(enum ggml_op op) {
  return op == GGML_OP_NONE || op == GGML_OP_VIEW || op == GGML_OP_PERMUTE || op == GGML_OP_RESHAPE ||
         op == GGML_OP_TRANSPOSE;
}

static enum ggml_status backend_graph_compute(ggml_backend_t backend, struct ggml_cgraph *graph) {
  gc_backend *be = backend->context;
  for (int i = 0; i < ggml_graph_n_nodes(graph); i++) {
    struct ggml_tensor *node = ggml_graph_node(graph, i);
    if (is_view_op(node->op) || (node->flags & GGML_TENSOR_FLAG_COMPUTE) == 0) continue;
    if (node->op != GGML_OP_FLASH_ATTN_EXT) {
      fprintf(stderr, "ggml-clattn: %s (%s) is not an op this backend computes\n", node->name, ggml_op_name(node->op));
      return GGML_STATUS_FAILED;
    }
    enum ggml_status st = gc_flash_attn_compute(be, node);
    if (st != GGML_STATUS_SUCCESS) return st;
  }
  return GGML_STATUS_SUCCESS;
}

static ggml_guid_t backend_guid(void) {
  static ggml_guid guid = {0x63, 0x6c, 0x61, 0x74, 0x74, 0x6e, 0x2d, 0x67, 0x67, 0x6d, 0x6c, 0x2d, 0x76, 0x31, 0x00, 0x01};
  return &guid;
}

static const struct ggml_backend_i backend_iface = {
    /* .get_name            = */ backend_name,
    /* .free                = */ backend_free,
    /* .set_tensor_async    = */ NULL,
    /* .get_tensor_async    = */ NULL,
    /* .set_tensor_2d_async = */ NULL,
    /* .get_tensor_2d_async = */ NULL,
    /* .cpy_tensor_async    = */ NULL,
    /* .synchronize         = */ NULL,
    /* .graph_plan_create   = */ NULL,
    /* .graph_plan_free     = */ NULL,
    /* .graph_plan_update   = */ NULL,
    /* .graph_plan_compute  = */ NULL,
    /* .graph_compute       = */ backend_graph_compute,
    /* .event_record        = */ NULL,
    /* .event_wait          = */ NULL,
    /* .graph_optimize      = */ NULL,
};

/* ---- the device ---- */

static const char *device_name(ggml_backend_dev_t dev) {
  (void)dev;
  return "CLATTN";
}

static const char *device_description(ggml_backend_dev_t dev) { return ((gc_device *)dev->context)->description; }

static void device_memory(ggml_backend_dev_t dev, size_t *free_bytes, size_t *total) {
  *free_bytes = *total = ((gc_device *)dev->context)->memory;
}

static enum ggml_backend_dev_type device_type(ggml_backend_dev_t dev) {
  (void)dev;
  return GGML_BACKEND_DEVICE_TYPE_GPU;
}

static void device_props(ggml_backend_dev_t dev, struct ggml_backend_dev_props *props) {
  props->name = device_name(dev);
  props->description = device_description(dev);
  device_memory(dev, &props->memory_free, &props->memory_total);
  props->type = device_type(dev);
  props->device_id = NULL;
  props->caps = (struct ggml_backend_dev_caps){false, false, false, false, false};
}

static ggml_backend_t device_init(ggml_backend_dev_t dev, const char *params) {
  (void)params;
  ggml_backend_t backend = malloc(sizeof *backend);
  gc_backend *be = calloc(1, sizeof *be);
  if (!backend || !be) {
    free(backend);
    free(be);
    return NULL;
  }
  be->dev = dev->context;
  *backend = (struct ggml_backend){backend_guid(), backend_iface, dev, be};
  return backend;
}

static ggml_backend_buffer_type_t device_buffer_type(ggml_backend_dev_t dev) {
  (void)dev;
  return ggml_backend_cpu_buffer_type();
}

static bool device_supports_op(ggml_backend_dev_t dev, const struct ggml_tensor *op) {
  (void)dev;
  if (is_view_op(op->op)) return true;
  return op->op == GGML_OP_FLASH_ATTN_EXT && gc_flash_attn_supported(op);
}

/* Any host memory: it is wrapped as an OpenCL buffer per node. */
static bool device_supports_buft(ggml_backend_dev_t dev, ggml_backend_buffer_type_t buft) {
  (void)dev;
  return ggml_backend_buft_is_host(buft);
}

static const struct ggml_backend_device_i device_iface = {
    /* .get_name             = */ device_name,
    /* .get_description      = */ device_description,
    /* .get_memory           = */ device_memory,
    /* .get_type             = */ device_type,
    /* .get_props            = */ device_props,
    /* .init_backend         = */ device_init,
    /* .get_buffer_type      = */ device_buffer_type,
    /* .get_host_buffer_type = */ NULL,
    /* .buffer_from_host_ptr = */ NULL,
    /* .supports_op          = */ device_supports_op,
    /* .supports_buft        = */ device_supports_buft,
    /* .offload_op           = */ NULL,
    /* .event_new            = */ NULL,
    /* .event_free           = */ NULL,
    /* .event_synchronize    = */ NULL,
};

/* ---- the registration ---- */

static const char *reg_name(ggml_backend_reg_t r) {
  (void)r;
  return "CLATTN";
}

static size_t reg_device_count(ggml_backend_reg_t r) {
  (void)r;
  return (size_t)device_count;
}

static ggml_backend_dev_t reg_device(ggml_backend_reg_t r, size_t index) {
  (void)r;
  return index < (size_t)device_count ? &device : NULL;
}

static void *reg_proc_address(ggml_backend_reg_t r, const char *name) {
  (void)r;
  return strcmp(name, "ggml_backend_clattn_calls") == 0 ? (void *)ggml_backend_clattn_calls : NULL;
}

static const struct ggml_backend_reg_i reg_iface = {
    /* .get_name         = */ reg_name,
    /* .get_device_count = */ reg_device_count,
    /* .get_device       = */ reg_device,
    /* .get_proc_address = */ reg_proc_address,
};

/* The device's facts, read once. */
static void device_open(void) {
  clattn_status st = clattn_create(NULL, &device_ctx.ctx);
  if (st != CLATTN_OK) {
    fprintf(stderr, "ggml-clattn: no device: %s (%s)\n", clattn_status_string(st), clattn_last_error(NULL));
    return;
  }
  cl_device_id id = clattn_cl_device(device_ctx.ctx);
  char name[160] = "?";
  cl_ulong memory = 0;
  clGetDeviceInfo(id, CL_DEVICE_NAME, sizeof name - 1, name, NULL);
  clGetDeviceInfo(id, CL_DEVICE_GLOBAL_MEM_SIZE, sizeof memory, &memory, NULL);
  snprintf(device_ctx.description, sizeof device_ctx.description, "clattn on %s", name);
  device_ctx.memory = (size_t)memory;
  device = (struct ggml_backend_device){device_iface, &reg, &device_ctx};
  device_count = 1;
}

/* With CLATTN_GGML_REPORT set, how many nodes ran through clattn, at exit:
 * the proof a test or a model run really used it. */
static void report_calls(void) {
  fprintf(stderr, "ggml-clattn: %llu FLASH_ATTN_EXT nodes computed by clattn_forward\n",
          (unsigned long long)ggml_backend_clattn_calls());
}

ggml_backend_reg_t ggml_backend_clattn_reg(void) {
  static int opened;
  if (!opened) {
    opened = 1;
    reg = (struct ggml_backend_reg){GGML_BACKEND_API_VERSION, reg_iface, NULL};
    device_open();
    const char *report = getenv("CLATTN_GGML_REPORT");
    if (report && *report && strcmp(report, "0") != 0) atexit(report_calls);
  }
  return &reg;
}

GGML_BACKEND_DL_IMPL(ggml_backend_clattn_reg)

/* ggml's programs find a backend library through ggml_backend_load_all
 * (GGML_BACKEND_PATH), but llama.cpp's call it only where no backend is
 * registered yet (ggml built with GGML_BACKEND_DL), and test-llama-archs
 * looks its -b device up before any backend loads. There, preloaded
 * (LD_PRELOAD) with CLATTN_GGML_REGISTER=1, the library registers itself
 * as it loads, as a program linking it would by calling
 * ggml_backend_register(ggml_backend_clattn_reg()). */
__attribute__((constructor)) static void register_at_load(void) {
  const char *want = getenv("CLATTN_GGML_REGISTER");
  if (!want || strcmp(want, "1") != 0) return;
  void (*register_backend)(ggml_backend_reg_t);
  *(void **)&register_backend = dlsym(RTLD_DEFAULT, "ggml_backend_register");
  if (register_backend) register_backend(ggml_backend_clattn_reg()); /* else not a ggml program (a child process) */
}
