/*
 * The base layer: what every other layer uses. Failures (a status and this
 * thread's message), the thread's trace of what its last call enqueued
 * (clattn_last_route), storage types, small arithmetic. Internal names
 * carry the prefix ca_.
 *
 * Layers, each including only itself and those below:
 *   base    errors, trace, storage types, files
 *   device  the context, device queries, tiles and tuning, programs, cache
 *   check   every check on a call that needs no device work (pure)
 *   plan    the planner: a checked call into a launch list
 *   run     the executor: launch lists enqueued, recorded, replayed; pools
 *   api     the public functions
 */
#ifndef CLATTN_BASE_H
#define CLATTN_BASE_H

#include <stddef.h>
#include <stdint.h>

#include "clattn.h"
#include "base/dtype.h"

/* Whether this build has the GEMM path (CLBlast: meson -Dclblast). */
static inline int ca_gemm_available(void) { return CA_HAS_CLBLAST; }

/* x rounded up to a multiple of m. */
static inline size_t ca_round_up(size_t x, size_t m) { return (x + m - 1) / m * m; }

/* ---- failures (error.c) ---- */

/* Records a message for clattn_last_error() in this thread and returns s. */
clattn_status ca_fail(clattn_status s, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
/* Maps an OpenCL error to a status and records "what: CL_NAME (code)". */
clattn_status ca_cl_fail(cl_int err, const char *what);
/* The status an OpenCL error maps to: memory codes OUT_OF_MEMORY, build
 * failures BUILD, anything else OPENCL. */
clattn_status ca_cl_status(cl_int err);
const char *ca_cl_error_name(cl_int err);

/* Runs an OpenCL call; on failure records it into `status` and jumps to `fail`. */
#define CA_CHECK_CL(status, call, what)       \
  do {                                        \
    cl_int ca_err_ = (call);                  \
    if (ca_err_ != CL_SUCCESS) {              \
      (status) = ca_cl_fail(ca_err_, (what)); \
      goto fail;                              \
    }                                         \
  } while (0)

/* ---- the thread's trace (trace.c, clattn_last_route) ---- */

/* Starts this thread's trace afresh with what the call is ("fused", "kv_append"). */
void ca_trace_begin(const char *what);
/* Adds a kernel (the executor does for every launch) unless already listed. */
void ca_trace_kernel(const char *name);

#endif
