/* Building kernel programs from the embedded sources, with the build log in
 * the error message when the compiler refuses; through the on-disk binary
 * cache (cache.c) when the context has one. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device/device.h"

enum { LOG_HEAD = 2000 };

clattn_status ca_build_program(clattn_context *ctx, const char *name, const char *const *sources, cl_uint n_sources,
                               const char *options, cl_program *out) {
  clattn_status st = CLATTN_OK;
  cl_int err = CL_SUCCESS;
  *out = NULL;
  ca_cache_key key = {{0}};
  if (ctx->cache_binaries) {
    ca_cache_key_of(ctx, sources, n_sources, options, &key);
    cl_program cached = ca_cache_load(ctx, &key, options);
    if (cached) {
      ctx->builds_from_cache++;
      *out = cached;
      return CLATTN_OK;
    }
  }
  cl_program program = clCreateProgramWithSource(ctx->context, n_sources, (const char **)sources, NULL, &err);
  CA_CHECK_CL(st, err, "clCreateProgramWithSource");
  err = clBuildProgram(program, 1, &ctx->device, options, NULL, NULL);
  if (err != CL_SUCCESS) {
    char log[LOG_HEAD + 1] = "";
    size_t len = 0;
    clGetProgramBuildInfo(program, ctx->device, CL_PROGRAM_BUILD_LOG, 0, NULL, &len);
    if (len > 0) {
      char *full = malloc(len + 1);
      if (full && clGetProgramBuildInfo(program, ctx->device, CL_PROGRAM_BUILD_LOG, len, full, NULL) == CL_SUCCESS) {
        full[len] = '\0';
        strncpy(log, full, LOG_HEAD);
        log[LOG_HEAD] = '\0';
      }
      free(full);
    }
    st = ca_fail(ca_cl_status(err), "clBuildProgram(%s) failed: %s (%d); options: %s; build log:\n%s", name,
                 ca_cl_error_name(err), (int)err, options, log);
    goto fail;
  }
  ctx->builds_from_source++;
  if (ctx->cache_binaries) ca_cache_store(ctx, &key, program);
  *out = program;
  return CLATTN_OK;
fail:
  if (program) clReleaseProgram(program);
  return st;
}

clattn_status ca_create_kernel(cl_program program, const char *name, cl_kernel *out) {
  cl_int err = CL_SUCCESS;
  *out = clCreateKernel(program, name, &err);
  if (err != CL_SUCCESS) {
    *out = NULL;
    char what[128];
    snprintf(what, sizeof what, "clCreateKernel(%s)", name);
    return ca_cl_fail(err, what);
  }
  return CLATTN_OK;
}
