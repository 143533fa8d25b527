/*
 * Command-buffer replay (cl_khr_command_buffer): a plan's kernels recorded
 * once and enqueued per step as one command, their arguments and grids
 * updated in place where the device has cl_khr_command_buffer_mutable_dispatch
 * (0.9.3 or later: clUpdateMutableCommandsKHR with a list of configs).
 *
 * What the device offers is probed on the context's first recording: the
 * extensions and their versions, the command buffers' capabilities and the
 * queue properties they require. A base extension older than 1.0 lets a
 * command buffer be enqueued while an earlier enqueue of it is pending only
 * when created CL_COMMAND_BUFFER_SIMULTANEOUS_USE_KHR (a decode loop does
 * that every step), so there the device must offer that. Where to replay:
 * CLATTN_COMMAND_BUFFER=0 nowhere, =1 wherever offered, otherwise on GPUs
 * (Intel's CPU runtime and POCL enqueue a recorded kernel slower than a
 * plain one: see the plan's docs). A device that refuses to record gets
 * the plain path, which gives the same results.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device/rules.h"
#include "run/command_buffer.h"

typedef ca_cl_command_buffer(CL_API_CALL *create_fn)(cl_uint, const cl_command_queue *, const cl_ulong *, cl_int *);
typedef cl_int(CL_API_CALL *one_fn)(ca_cl_command_buffer);
typedef cl_int(CL_API_CALL *enqueue_fn)(cl_uint, cl_command_queue *, ca_cl_command_buffer, cl_uint, const cl_event *,
                                         cl_event *);
typedef cl_int(CL_API_CALL *ndrange_fn)(ca_cl_command_buffer, cl_command_queue, const cl_ulong *, cl_kernel, cl_uint,
                                         const size_t *, const size_t *, const size_t *, cl_uint,
                                         const ca_cl_sync_point *, ca_cl_sync_point *, ca_cl_mutable_command *);
typedef cl_int(CL_API_CALL *update_fn)(ca_cl_command_buffer, cl_uint, const cl_uint *, const void **);

/* What the context's device offers, probed once. */
struct ca_cb_api {
  int usable, mutable_dispatch;
  cl_ulong flags; /* the command buffers' CL_COMMAND_BUFFER_FLAGS_KHR */
  create_fn create;
  one_fn finalize, release;
  enqueue_fn enqueue;
  ndrange_fn ndrange;
  update_fn update;
};

struct ca_command_buffer {
  const struct ca_cb_api *api;
  ca_cl_command_buffer cb;
  int n;
  ca_kernel_launch launches[CA_CB_LAUNCHES];
  size_t local[CA_CB_LAUNCHES][3];
  ca_cl_mutable_command commands[CA_CB_LAUNCHES];
};

#define VERSION(major, minor, patch) (((cl_uint)(major) << 22) | ((cl_uint)(minor) << 12) | (cl_uint)(patch))

/* An extension's version from CL_DEVICE_EXTENSIONS_WITH_VERSION (OpenCL
 * 3.0), 0 when not listed or not known. */
static cl_uint extension_version(cl_device_id device, const char *name) {
  typedef struct {
    cl_uint version;
    char name[64];
  } name_version;
  size_t bytes = 0;
  if (clGetDeviceInfo(device, CA_CL_DEVICE_EXTENSIONS_WITH_VERSION, 0, NULL, &bytes) != CL_SUCCESS || !bytes) return 0;
  name_version *all = malloc(bytes);
  cl_uint version = 0;
  if (all && clGetDeviceInfo(device, CA_CL_DEVICE_EXTENSIONS_WITH_VERSION, bytes, all, NULL) == CL_SUCCESS)
    for (size_t i = 0; i < bytes / sizeof *all; i++)
      if (strncmp(all[i].name, name, sizeof all[i].name) == 0) version = all[i].version;
  free(all);
  return version;
}

/* Whether the space-separated list holds the extension (a whole word). */
static int has_extension(const char *list, const char *name) {
  const size_t n = strlen(name);
  for (const char *at = strstr(list, name); at; at = strstr(at + 1, name))
    if ((at == list || at[-1] == ' ') && (at[n] == ' ' || at[n] == 0)) return 1;
  return 0;
}

static void probe(clattn_context *ctx, struct ca_cb_api *api) {
  const char *env = getenv("CLATTN_COMMAND_BUFFER");
  const int wanted = env && *env ? strcmp(env, "0") != 0 : ca_rule(&ctx->caps, CA_RULE_COMMAND_BUFFERS, NULL) != 0;
  char list[8192];
  ca_device_string(ctx->device, CL_DEVICE_EXTENSIONS, list, sizeof list);
  if (!wanted || !has_extension(list, "cl_khr_command_buffer")) return;
  cl_ulong caps = 0, required = 0;
  cl_command_queue_properties props = 0;
  if (clGetDeviceInfo(ctx->device, CA_CL_DEVICE_COMMAND_BUFFER_CAPABILITIES, sizeof caps, &caps, NULL) != CL_SUCCESS ||
      clGetCommandQueueInfo(ctx->queue, CL_QUEUE_PROPERTIES, sizeof props, &props, NULL) != CL_SUCCESS)
    return;
  if (clGetDeviceInfo(ctx->device, CA_CL_DEVICE_COMMAND_BUFFER_REQUIRED_QUEUE_PROPERTIES, sizeof required, &required,
                      NULL) == CL_SUCCESS &&
      (required & ~(cl_ulong)props))
    return;
  if (extension_version(ctx->device, "cl_khr_command_buffer") < VERSION(1, 0, 0)) {
    if (!(caps & CA_CL_COMMAND_BUFFER_CAPABILITY_SIMULTANEOUS_USE)) return;
    api->flags = CA_CL_COMMAND_BUFFER_SIMULTANEOUS_USE;
  }
  const cl_platform_id pf = ctx->platform;
  api->create = (create_fn)clGetExtensionFunctionAddressForPlatform(pf, "clCreateCommandBufferKHR");
  api->finalize = (one_fn)clGetExtensionFunctionAddressForPlatform(pf, "clFinalizeCommandBufferKHR");
  api->release = (one_fn)clGetExtensionFunctionAddressForPlatform(pf, "clReleaseCommandBufferKHR");
  api->enqueue = (enqueue_fn)clGetExtensionFunctionAddressForPlatform(pf, "clEnqueueCommandBufferKHR");
  api->ndrange = (ndrange_fn)clGetExtensionFunctionAddressForPlatform(pf, "clCommandNDRangeKernelKHR");
  if (!api->create || !api->finalize || !api->release || !api->enqueue || !api->ndrange) return;
  api->usable = 1;
  cl_ulong fields = 0;
  const cl_ulong need = CA_CL_MUTABLE_DISPATCH_ARGUMENTS | CA_CL_MUTABLE_DISPATCH_GLOBAL_SIZE;
  if (has_extension(list, "cl_khr_command_buffer_mutable_dispatch") &&
      extension_version(ctx->device, "cl_khr_command_buffer_mutable_dispatch") >= VERSION(0, 9, 3) &&
      clGetDeviceInfo(ctx->device, CA_CL_DEVICE_MUTABLE_DISPATCH_CAPABILITIES, sizeof fields, &fields, NULL) ==
          CL_SUCCESS &&
      (fields & need) == need &&
      (api->update = (update_fn)clGetExtensionFunctionAddressForPlatform(pf, "clUpdateMutableCommandsKHR"))) {
    api->mutable_dispatch = 1;
    api->flags |= CA_CL_COMMAND_BUFFER_MUTABLE;
  }
}

/* The context's probe, made on first use. */
static const struct ca_cb_api *api_of(clattn_context *ctx) {
  pthread_mutex_lock(&ctx->programs_lock);
  if (!ctx->cb_api && (ctx->cb_api = calloc(1, sizeof *ctx->cb_api))) probe(ctx, ctx->cb_api);
  const struct ca_cb_api *api = ctx->cb_api;
  pthread_mutex_unlock(&ctx->programs_lock);
  return api;
}

void ca_command_buffer_forget(clattn_context *ctx) {
  free(ctx->cb_api);
  ctx->cb_api = NULL;
}

clattn_status ca_command_buffer_record(clattn_context *ctx, const ca_kernel_launch *launches, int n,
                                       ca_command_buffer **out) {
  *out = NULL;
  const struct ca_cb_api *api = api_of(ctx);
  if (!api) return ca_fail(CLATTN_ERR_OUT_OF_MEMORY, "command buffers: out of host memory");
  if (!api->usable || n > CA_CB_LAUNCHES) return CLATTN_OK;
  ca_command_buffer *c = calloc(1, sizeof *c);
  if (!c) return ca_fail(CLATTN_ERR_OUT_OF_MEMORY, "command buffers: out of host memory");
  c->api = api;
  c->n = n;
  const cl_ulong props[] = {CA_CL_COMMAND_BUFFER_FLAGS, api->flags, 0};
  const cl_ulong updatable[] = {CA_CL_MUTABLE_DISPATCH_UPDATABLE_FIELDS,
                                CA_CL_MUTABLE_DISPATCH_ARGUMENTS | CA_CL_MUTABLE_DISPATCH_GLOBAL_SIZE, 0};
  cl_int err = CL_SUCCESS;
  c->cb = api->create(1, &ctx->queue, props, &err);
  ca_cl_sync_point sync[CA_CB_LAUNCHES];
  for (int i = 0; i < n && err == CL_SUCCESS; i++) {
    c->launches[i] = launches[i];
    if (launches[i].local) {
      memcpy(c->local[i], launches[i].local, launches[i].dims * sizeof(size_t));
      c->launches[i].local = c->local[i];
    }
    err = api->ndrange(c->cb, NULL, api->mutable_dispatch ? updatable : NULL, launches[i].kernel, launches[i].dims, NULL,
                       launches[i].global, launches[i].local, i ? 1 : 0, i ? &sync[i - 1] : NULL, &sync[i],
                       api->mutable_dispatch ? &c->commands[i] : NULL);
  }
  if (err == CL_SUCCESS) err = api->finalize(c->cb);
  if (err != CL_SUCCESS) { /* not recorded here: the plain path */
    ca_command_buffer_release(c);
    return CLATTN_OK;
  }
  *out = c;
  return CLATTN_OK;
}

int ca_command_buffer_mutable(const ca_command_buffer *cb) { return cb->api->mutable_dispatch; }

int ca_command_buffer_launches(const ca_command_buffer *cb, const ca_kernel_launch **launches) {
  *launches = cb->launches;
  return cb->n;
}

clattn_status ca_command_buffer_update(ca_command_buffer *cb, const ca_arg_update *args, int n_args,
                                       const ca_kernel_launch *grids) {
  ca_cl_mutable_dispatch_config configs[CA_CB_LAUNCHES];
  ca_cl_mutable_dispatch_arg list[CA_CB_LAUNCHES][CA_CB_ARGS];
  const void *config_ptrs[CA_CB_LAUNCHES];
  cl_uint types[CA_CB_LAUNCHES], n_configs = 0;
  for (int i = 0; i < cb->n; i++) {
    ca_cl_mutable_dispatch_config *c = &configs[n_configs];
    *c = (ca_cl_mutable_dispatch_config){cb->commands[i], 0, 0, 0, cb->launches[i].dims, list[n_configs], NULL,
                                         NULL, NULL, NULL, NULL};
    for (int a = 0; a < n_args; a++)
      if (args[a].launch == i && c->num_args < CA_CB_ARGS)
        list[n_configs][c->num_args++] = (ca_cl_mutable_dispatch_arg){args[a].index, args[a].size, args[a].value};
    if (memcmp(grids[i].global, cb->launches[i].global, sizeof grids[i].global) != 0)
      c->global_work_size = grids[i].global;
    if (!c->num_args && !c->global_work_size) continue;
    types[n_configs] = CA_CL_STRUCTURE_TYPE_MUTABLE_DISPATCH_CONFIG;
    config_ptrs[n_configs] = c;
    n_configs++;
  }
  if (!n_configs) return CLATTN_OK;
  cl_int err = cb->api->update(cb->cb, n_configs, types, config_ptrs);
  if (err != CL_SUCCESS) return ca_cl_fail(err, "clUpdateMutableCommandsKHR");
  for (int i = 0; i < cb->n; i++) memcpy(cb->launches[i].global, grids[i].global, sizeof grids[i].global);
  return CLATTN_OK;
}

clattn_status ca_command_buffer_enqueue(ca_command_buffer *cb, cl_uint n_wait, const cl_event *wait, cl_event *done) {
  cl_int err = cb->api->enqueue(0, NULL, cb->cb, n_wait, n_wait ? wait : NULL, done);
  return err == CL_SUCCESS ? CLATTN_OK : ca_cl_fail(err, "clEnqueueCommandBufferKHR");
}

void ca_command_buffer_release(ca_command_buffer *cb) {
  if (!cb) return;
  if (cb->cb) cb->api->release(cb->cb);
  free(cb);
}
