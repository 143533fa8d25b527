/*
 * A test-only OpenCL shim for fault injection and object accounting.
 *
 * cl_shim.c defines the OpenCL entry points that clattn (and CLBlast) call.
 * Linked into a test executable, its definitions win over libOpenCL's for
 * every call made from the executable, which includes the objects of the
 * static libclattn.a, and for CLBlast's calls (the executable exports them
 * because libclblast.so references them). Each wrapper forwards to the real
 * function, found with dlsym(RTLD_NEXT, name), unless an armed fault picks
 * that call: then it returns an error code (or NULL with *errcode_ret set)
 * without calling the real function.
 *
 * Every wrapped call except the clRelease* ones is "fallible" and counted;
 * shim_arm(n, code) makes the n-th fallible call after it fail once. The
 * command-buffer extension's entry points are wrapped too: the shim's
 * clGetExtensionFunctionAddressForPlatform hands out its wrappers.
 *
 * Live objects: each handle created or retained through the shim counts
 * +1, each release -1 (handles the shim never saw created are ignored), so
 * shim_live() after clFinish tells whether a call left objects behind.
 */
#ifndef CLATTN_TESTS_CL_SHIM_H
#define CLATTN_TESTS_CL_SHIM_H

#include "clattn.h"

typedef enum {
  SHIM_MEM,
  SHIM_KERNEL,
  SHIM_PROGRAM,
  SHIM_EVENT,
  SHIM_QUEUE,
  SHIM_CONTEXT,
  SHIM_DEVICE,
  SHIM_KINDS
} shim_kind;

typedef struct {
  const char *fn; /* the OpenCL function the fault hit */
  void *caller;   /* its return address */
  int in_main;    /* called from the main executable (clattn's objects, the test) */
  cl_int code;    /* the error returned */
  long index;     /* 1-based among the fallible calls since shim_reset */
} shim_fault;

/* Whether the wrappers are in use (the real functions were found). */
int shim_active(void);
/* Zeroes the fallible-call counter and disarms. */
void shim_reset(void);
/* Fallible calls since shim_reset. */
long shim_calls(void);
/* Fails the n-th fallible call after the last shim_reset (1-based) with
 * code; code 0 picks one per function (CL_MEM_OBJECT_ALLOCATION_FAILURE for
 * clCreateBuffer, CL_OUT_OF_RESOURCES otherwise). fn non-NULL: counts only
 * calls of that function. */
void shim_arm(long n, cl_int code, const char *fn);
void shim_disarm(void);
/* Restricts the armed fault's counting to calls from outside the main
 * executable (a library such as CLBlast) when on; reset by shim_reset. */
void shim_arm_library_only(int on);
/* Never injects into fn when called from outside the main executable (a
 * library that cannot survive the failure: CLBlast 1.5 aborts the process
 * when one of its temporary clCreateBuffer calls fails); the armed call
 * then runs normally and shim_spared() says so. NULL: spare nothing. */
void shim_spare_library_fn(const char *fn);
int shim_spared(void);
/* 1 when the armed fault fired since shim_arm (details in *f when non-NULL). */
int shim_fired(shim_fault *f);
/* The name of the function of fallible call i (1-based) since shim_reset,
 * when tracing (recorded for the first 4096 calls); NULL otherwise. */
const char *shim_trace_fn(long i);
/* Whether fallible call i was made from the main executable (clattn's
 * objects, the test), not a library such as CLBlast; 0 when not traced. */
int shim_trace_in_main(long i);
/* Live objects created or retained through the shim, in all or by kind. */
long shim_live(void);
long shim_live_kind(shim_kind k);
const char *shim_kind_name(shim_kind k);
/* Makes clGetKernelWorkGroupInfo answer param with value (a size_t or a
 * cl_ulong, as param is) instead of the device's, for the next n queries of
 * that param on kernels named kernel; n 0 stops. Returns nothing; queries
 * of the kernel seen since (any param, faked or not) are counted by
 * shim_kernel_queries. Not reset by shim_reset. */
void shim_fake_kernel_info(const char *kernel, cl_kernel_work_group_info param, cl_ulong value, long n);
long shim_kernel_queries(void);
/* Calls of any wrapped function (fallible or not) since the process began. */
long shim_total_calls(void);

#endif
