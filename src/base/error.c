/* Status strings, OpenCL error names and the per-thread last-error message. */
#include <stdarg.h>
#include <stdio.h>

#include "base/base.h"

static _Thread_local char last_error[4096];

clattn_status ca_fail(clattn_status s, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(last_error, sizeof last_error, fmt, ap);
  va_end(ap);
  return s;
}

const char *clattn_opencl_error_name(cl_int err) { return ca_cl_error_name(err); }

const char *ca_cl_error_name(cl_int err) {
  switch (err) {
#define NAME(e) \
  case e: return #e;
    // clang-format off
    NAME(CL_SUCCESS)
    NAME(CL_DEVICE_NOT_FOUND)
    NAME(CL_DEVICE_NOT_AVAILABLE)
    NAME(CL_COMPILER_NOT_AVAILABLE)
    NAME(CL_MEM_OBJECT_ALLOCATION_FAILURE)
    NAME(CL_OUT_OF_RESOURCES)
    NAME(CL_OUT_OF_HOST_MEMORY)
    NAME(CL_PROFILING_INFO_NOT_AVAILABLE)
    NAME(CL_MEM_COPY_OVERLAP)
    NAME(CL_IMAGE_FORMAT_MISMATCH)
    NAME(CL_IMAGE_FORMAT_NOT_SUPPORTED)
    NAME(CL_BUILD_PROGRAM_FAILURE)
    NAME(CL_MAP_FAILURE)
    NAME(CL_MISALIGNED_SUB_BUFFER_OFFSET)
    NAME(CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST)
    NAME(CL_COMPILE_PROGRAM_FAILURE)
    NAME(CL_LINKER_NOT_AVAILABLE)
    NAME(CL_LINK_PROGRAM_FAILURE)
    NAME(CL_DEVICE_PARTITION_FAILED)
    NAME(CL_KERNEL_ARG_INFO_NOT_AVAILABLE)
    NAME(CL_INVALID_VALUE)
    NAME(CL_INVALID_DEVICE_TYPE)
    NAME(CL_INVALID_PLATFORM)
    NAME(CL_INVALID_DEVICE)
    NAME(CL_INVALID_CONTEXT)
    NAME(CL_INVALID_QUEUE_PROPERTIES)
    NAME(CL_INVALID_COMMAND_QUEUE)
    NAME(CL_INVALID_HOST_PTR)
    NAME(CL_INVALID_MEM_OBJECT)
    NAME(CL_INVALID_IMAGE_FORMAT_DESCRIPTOR)
    NAME(CL_INVALID_IMAGE_SIZE)
    NAME(CL_INVALID_SAMPLER)
    NAME(CL_INVALID_BINARY)
    NAME(CL_INVALID_BUILD_OPTIONS)
    NAME(CL_INVALID_PROGRAM)
    NAME(CL_INVALID_PROGRAM_EXECUTABLE)
    NAME(CL_INVALID_KERNEL_NAME)
    NAME(CL_INVALID_KERNEL_DEFINITION)
    NAME(CL_INVALID_KERNEL)
    NAME(CL_INVALID_ARG_INDEX)
    NAME(CL_INVALID_ARG_VALUE)
    NAME(CL_INVALID_ARG_SIZE)
    NAME(CL_INVALID_KERNEL_ARGS)
    NAME(CL_INVALID_WORK_DIMENSION)
    NAME(CL_INVALID_WORK_GROUP_SIZE)
    NAME(CL_INVALID_WORK_ITEM_SIZE)
    NAME(CL_INVALID_GLOBAL_OFFSET)
    NAME(CL_INVALID_EVENT_WAIT_LIST)
    NAME(CL_INVALID_EVENT)
    NAME(CL_INVALID_OPERATION)
    NAME(CL_INVALID_GL_OBJECT)
    NAME(CL_INVALID_BUFFER_SIZE)
    NAME(CL_INVALID_MIP_LEVEL)
    NAME(CL_INVALID_GLOBAL_WORK_SIZE)
    NAME(CL_INVALID_PROPERTY)
    NAME(CL_INVALID_IMAGE_DESCRIPTOR)
    NAME(CL_INVALID_COMPILER_OPTIONS)
    NAME(CL_INVALID_LINKER_OPTIONS)
    NAME(CL_INVALID_DEVICE_PARTITION_COUNT)
    // clang-format on
#undef NAME
    default: return "CL_UNKNOWN_ERROR";
  }
}

clattn_status ca_cl_status(cl_int err) {
  if (err == CL_MEM_OBJECT_ALLOCATION_FAILURE || err == CL_OUT_OF_HOST_MEMORY || err == CL_OUT_OF_RESOURCES)
    return CLATTN_ERR_OUT_OF_MEMORY;
  if (err == CL_BUILD_PROGRAM_FAILURE || err == CL_COMPILER_NOT_AVAILABLE) return CLATTN_ERR_BUILD;
  return CLATTN_ERR_OPENCL;
}

clattn_status ca_cl_fail(cl_int err, const char *what) {
  return ca_fail(ca_cl_status(err), "%s failed: %s (%d)", what, ca_cl_error_name(err), (int)err);
}

const char *clattn_status_string(clattn_status s) {
  switch (s) {
    case CLATTN_OK: return "ok";
    case CLATTN_ERR_INVALID_ARGUMENT: return "invalid argument";
    case CLATTN_ERR_UNSUPPORTED: return "unsupported";
    case CLATTN_ERR_BUFFER_TOO_SMALL: return "buffer too small";
    case CLATTN_ERR_EMPTY_ROW: return "empty row";
    case CLATTN_ERR_OUT_OF_MEMORY: return "out of memory";
    case CLATTN_ERR_BUILD: return "kernel build failed";
    case CLATTN_ERR_NO_DEVICE: return "no OpenCL device";
    case CLATTN_ERR_OPENCL: return "OpenCL error";
  }
  return "unknown status";
}

const char *clattn_last_error(const clattn_context *ctx) {
  (void)ctx; /* the message is per thread, so it also serves a failed create */
  return last_error;
}
