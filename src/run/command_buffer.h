/*
 * Command-buffer replay of a plan's kernels (command_buffer.c), through
 * cl_khr_command_buffer and, to change arguments and grids in place,
 * cl_khr_command_buffer_mutable_dispatch 0.9.3 or later. The system's
 * CL/cl_ext.h may predate the extensions' final forms, so what clattn
 * uses of them is declared here and the entry points are asked of the
 * platform (clGetExtensionFunctionAddressForPlatform).
 */
#ifndef CLATTN_COMMAND_BUFFER_H
#define CLATTN_COMMAND_BUFFER_H

#include "run/run.h"

typedef struct _cl_command_buffer_khr *ca_cl_command_buffer;
typedef struct _cl_mutable_command_khr *ca_cl_mutable_command;
typedef cl_uint ca_cl_sync_point;

enum {
  CA_CL_DEVICE_COMMAND_BUFFER_CAPABILITIES = 0x12A9,
  CA_CL_DEVICE_COMMAND_BUFFER_REQUIRED_QUEUE_PROPERTIES = 0x12AA,
  CA_CL_DEVICE_MUTABLE_DISPATCH_CAPABILITIES = 0x12B0,
  CA_CL_DEVICE_EXTENSIONS_WITH_VERSION = 0x1060,
  CA_CL_COMMAND_BUFFER_FLAGS = 0x1293,
  CA_CL_MUTABLE_DISPATCH_UPDATABLE_FIELDS = 0x12B1,
  CA_CL_STRUCTURE_TYPE_MUTABLE_DISPATCH_CONFIG = 0,
};
/* cl_command_buffer_flags_khr, capabilities and mutable fields (bits) */
#define CA_CL_COMMAND_BUFFER_SIMULTANEOUS_USE (1u << 0)
#define CA_CL_COMMAND_BUFFER_MUTABLE (1u << 1)
#define CA_CL_COMMAND_BUFFER_CAPABILITY_SIMULTANEOUS_USE (1u << 2)
#define CA_CL_MUTABLE_DISPATCH_GLOBAL_SIZE (1u << 1)
#define CA_CL_MUTABLE_DISPATCH_ARGUMENTS (1u << 3)

typedef struct {
  cl_uint arg_index;
  size_t arg_size;
  const void *arg_value;
} ca_cl_mutable_dispatch_arg;

/* cl_mutable_dispatch_config_khr as of mutable dispatch 0.9.3 */
typedef struct {
  ca_cl_mutable_command command;
  cl_uint num_args, num_svm_args, num_exec_infos, work_dim;
  const ca_cl_mutable_dispatch_arg *arg_list, *arg_svm_list;
  const void *exec_info_list;
  const size_t *global_work_offset, *global_work_size, *local_work_size;
} ca_cl_mutable_dispatch_config;

enum { CA_CB_LAUNCHES = 3, CA_CB_ARGS = 8 };

/* An argument change for launch `launch` of a recorded command buffer. */
typedef struct {
  int launch;
  cl_uint index;
  size_t size;
  const void *value;
} ca_arg_update;

typedef struct ca_command_buffer ca_command_buffer;

/* Records launches[0 .. n) (each after the one before) into a command
 * buffer on ctx's queue, where the device offers one and CLATTN_COMMAND_BUFFER
 * (or the default: GPUs) allows; *out is NULL otherwise, and when the
 * device refuses the recording (both not errors: the plain path runs). An
 * OpenCL failure of a call that succeeded before is an error. */
clattn_status ca_command_buffer_record(clattn_context *ctx, const ca_kernel_launch *launches, int n,
                                       ca_command_buffer **out);
/* Whether recorded commands can change arguments and grids in place. */
int ca_command_buffer_mutable(const ca_command_buffer *cb);
/* The launches it replays (their count and grids as last recorded or updated). */
int ca_command_buffer_launches(const ca_command_buffer *cb, const ca_kernel_launch **launches);
/* Changes arguments and, where grids differs, the grids (mutable only). */
clattn_status ca_command_buffer_update(ca_command_buffer *cb, const ca_arg_update *args, int n_args,
                                       const ca_kernel_launch *grids);
/* Enqueues the recorded commands after the n_wait events; *done: their end. */
clattn_status ca_command_buffer_enqueue(ca_command_buffer *cb, cl_uint n_wait, const cl_event *wait, cl_event *done);
void ca_command_buffer_release(ca_command_buffer *cb);

#endif
