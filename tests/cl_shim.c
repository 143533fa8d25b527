/*
 * The OpenCL fault-injection and accounting shim (see cl_shim.h).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* RTLD_NEXT, dladdr */
#endif
#include "cl_shim.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------- state ---------- */

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static long calls; /* fallible calls since shim_reset */
static long total_calls;
static long armed_n;    /* 0 = disarmed */
static long armed_seen; /* calls of armed_fn (or all) seen since arming */
static const char *armed_fn;
static cl_int armed_code;
static int fired, spared, library_only;
static const char *spare_fn;
static shim_fault last_fault;
enum { TRACE_MAX = 4096 };
static const char *trace[TRACE_MAX];
static void *trace_caller[TRACE_MAX];
static void *main_base;

typedef struct {
  void *h;
  int kind;
  long count;
} entry;
enum { TABLE_SIZE = 1 << 16 };
static entry table[TABLE_SIZE];
static long table_used;
static long live_total, live_by_kind[SHIM_KINDS];

static void *lookup(const char *name) {
  void *f = dlsym(RTLD_NEXT, name);
  if (!f) {
    fprintf(stderr, "cl_shim: the real %s was not found (%s)\n", name, dlerror());
    abort(); /* test-only: a shim without its target cannot forward anything */
  }
  return f;
}

#define REAL(name)                      \
  static __typeof__(&name) real_##name; \
  if (!real_##name) real_##name = (__typeof__(&name))lookup(#name)

static int is_main(void *addr) {
  Dl_info info;
  if (!main_base) {
    if (dladdr((void *)&shim_reset, &info) && info.dli_fbase) main_base = info.dli_fbase;
  }
  return dladdr(addr, &info) && info.dli_fbase == main_base;
}

/* Counts a fallible call; returns the error to inject, or CL_SUCCESS. */
static cl_int fault(const char *fn, void *caller, cl_int dflt) {
  cl_int code = CL_SUCCESS;
  pthread_mutex_lock(&lock);
  total_calls++;
  calls++;
  if (calls <= TRACE_MAX) {
    trace[calls - 1] = fn;
    trace_caller[calls - 1] = caller;
  }
  if (armed_n > 0 && !fired && (!armed_fn || strcmp(armed_fn, fn) == 0) && (!library_only || !is_main(caller))) {
    armed_seen++;
    if (armed_seen == armed_n && spare_fn && strcmp(spare_fn, fn) == 0 && !is_main(caller)) {
      spared = 1;
      armed_n = 0;
    } else if (armed_seen == armed_n) {
      code = armed_code ? armed_code : dflt;
      fired = 1;
      last_fault.fn = fn;
      last_fault.caller = caller;
      last_fault.code = code;
      last_fault.index = calls;
    }
  }
  pthread_mutex_unlock(&lock);
  if (code != CL_SUCCESS) last_fault.in_main = is_main(caller);
  return code;
}

static void count_plain(void) {
  pthread_mutex_lock(&lock);
  total_calls++;
  pthread_mutex_unlock(&lock);
}

static size_t slot_of(void *h) {
  uintptr_t x = (uintptr_t)h;
  x ^= x >> 17;
  x *= 0x9E3779B97F4A7C15ull;
  return (size_t)(x >> 40) & (TABLE_SIZE - 1);
}

/* Drops the entries of dead handles when the table fills. */
static void compact(void) {
  static entry copy[TABLE_SIZE];
  memcpy(copy, table, sizeof table);
  memset(table, 0, sizeof table);
  table_used = 0;
  for (size_t i = 0; i < TABLE_SIZE; i++)
    if (copy[i].h && copy[i].count > 0) {
      size_t s = slot_of(copy[i].h);
      while (table[s].h) s = (s + 1) & (TABLE_SIZE - 1);
      table[s] = copy[i];
      table_used++;
    }
}

static entry *find(void *h, int create) {
  size_t s = slot_of(h);
  while (table[s].h) {
    if (table[s].h == h) return &table[s];
    s = (s + 1) & (TABLE_SIZE - 1);
  }
  if (!create) return NULL;
  if (table_used > TABLE_SIZE * 3 / 4) {
    compact();
    return find(h, create);
  }
  table[s].h = h;
  table[s].count = 0;
  table_used++;
  return &table[s];
}

/* +1 on create or retain (an unknown handle retained starts at 1). */
static void track_add(void *h, shim_kind kind) {
  if (!h) return;
  pthread_mutex_lock(&lock);
  entry *e = find(h, 1);
  e->kind = (int)kind;
  e->count++;
  live_total++;
  live_by_kind[kind]++;
  pthread_mutex_unlock(&lock);
}

/* -1 on a successful release of a known handle. */
static void track_release(void *h) {
  if (!h) return;
  pthread_mutex_lock(&lock);
  entry *e = find(h, 0);
  if (e && e->count > 0) {
    e->count--;
    live_total--;
    live_by_kind[e->kind]--;
  }
  pthread_mutex_unlock(&lock);
}

/* ---------- control ---------- */

int shim_active(void) {
  REAL(clGetPlatformIDs);
  return real_clGetPlatformIDs != NULL;
}

void shim_reset(void) {
  pthread_mutex_lock(&lock);
  calls = 0;
  armed_n = 0;
  armed_seen = 0;
  armed_fn = NULL;
  fired = 0;
  spared = 0;
  library_only = 0;
  memset(trace, 0, sizeof trace);
  pthread_mutex_unlock(&lock);
}

long shim_calls(void) {
  pthread_mutex_lock(&lock);
  long n = calls;
  pthread_mutex_unlock(&lock);
  return n;
}

long shim_total_calls(void) {
  pthread_mutex_lock(&lock);
  long n = total_calls;
  pthread_mutex_unlock(&lock);
  return n;
}

void shim_arm(long n, cl_int code, const char *fn) {
  pthread_mutex_lock(&lock);
  armed_n = n;
  armed_seen = 0;
  armed_fn = fn;
  armed_code = code;
  fired = 0;
  spared = 0;
  memset(&last_fault, 0, sizeof last_fault);
  pthread_mutex_unlock(&lock);
}

void shim_arm_library_only(int on) {
  pthread_mutex_lock(&lock);
  library_only = on;
  pthread_mutex_unlock(&lock);
}

void shim_spare_library_fn(const char *fn) {
  pthread_mutex_lock(&lock);
  spare_fn = fn;
  pthread_mutex_unlock(&lock);
}

int shim_spared(void) {
  pthread_mutex_lock(&lock);
  int r = spared;
  pthread_mutex_unlock(&lock);
  return r;
}

void shim_disarm(void) {
  pthread_mutex_lock(&lock);
  armed_n = 0;
  pthread_mutex_unlock(&lock);
}

int shim_fired(shim_fault *f) {
  pthread_mutex_lock(&lock);
  int r = fired;
  if (f) *f = last_fault;
  pthread_mutex_unlock(&lock);
  return r;
}

const char *shim_trace_fn(long i) {
  if (i < 1 || i > TRACE_MAX) return NULL;
  pthread_mutex_lock(&lock);
  const char *s = trace[i - 1];
  pthread_mutex_unlock(&lock);
  return s;
}

int shim_trace_in_main(long i) {
  if (i < 1 || i > TRACE_MAX) return 0;
  pthread_mutex_lock(&lock);
  void *caller = trace_caller[i - 1];
  pthread_mutex_unlock(&lock);
  return caller && is_main(caller);
}

long shim_live(void) {
  pthread_mutex_lock(&lock);
  long n = live_total;
  pthread_mutex_unlock(&lock);
  return n;
}

long shim_live_kind(shim_kind k) {
  pthread_mutex_lock(&lock);
  long n = live_by_kind[k];
  pthread_mutex_unlock(&lock);
  return n;
}

const char *shim_kind_name(shim_kind k) {
  static const char *names[] = {"mem", "kernel", "program", "event", "queue", "context", "device"};
  return (unsigned)k < SHIM_KINDS ? names[k] : "?";
}

/* ---------- wrappers ---------- */

#define CALLER __builtin_return_address(0)

/* An entry point returning cl_int: fail or forward. */
#define FALLIBLE(name, dflt, ...)             \
  do {                                        \
    REAL(name);                               \
    cl_int f_ = fault(#name, CALLER, (dflt)); \
    if (f_ != CL_SUCCESS) return f_;          \
    return real_##name(__VA_ARGS__);          \
  } while (0)

/* An entry point returning an object with errcode_ret. */
#define CREATING(type, name, kind, dflt, ...) \
  do {                                        \
    REAL(name);                               \
    cl_int f_ = fault(#name, CALLER, (dflt)); \
    if (f_ != CL_SUCCESS) {                   \
      if (errcode_ret) *errcode_ret = f_;     \
      return (type)NULL;                      \
    }                                         \
    type obj_ = real_##name(__VA_ARGS__);     \
    track_add((void *)obj_, (kind));          \
    return obj_;                              \
  } while (0)

/* An enqueue: fail, or forward and track the event it hands out. */
#define ENQUEUE(name, ...)                                                \
  do {                                                                    \
    REAL(name);                                                           \
    cl_int f_ = fault(#name, CALLER, CL_OUT_OF_RESOURCES);                \
    if (f_ != CL_SUCCESS) return f_;                                      \
    cl_int e_ = real_##name(__VA_ARGS__);                                 \
    if (e_ == CL_SUCCESS && event) track_add((void *)*event, SHIM_EVENT); \
    return e_;                                                            \
  } while (0)

#define RETAIN(name, kind, obj)                             \
  do {                                                      \
    REAL(name);                                             \
    cl_int f_ = fault(#name, CALLER, CL_OUT_OF_RESOURCES);  \
    if (f_ != CL_SUCCESS) return f_;                        \
    cl_int e_ = real_##name(obj);                           \
    if (e_ == CL_SUCCESS) track_add((void *)(obj), (kind)); \
    return e_;                                              \
  } while (0)

/* Releases are never failed: a failed release is a leak the caller cannot fix. */
#define RELEASE(name, obj)                              \
  do {                                                  \
    REAL(name);                                         \
    count_plain();                                      \
    cl_int e_ = real_##name(obj);                       \
    if (e_ == CL_SUCCESS) track_release((void *)(obj)); \
    return e_;                                          \
  } while (0)

/* platforms and devices */

CL_API_ENTRY cl_int CL_API_CALL clGetPlatformIDs(cl_uint num_entries, cl_platform_id *platforms,
                                                 cl_uint *num_platforms) {
  FALLIBLE(clGetPlatformIDs, CL_OUT_OF_HOST_MEMORY, num_entries, platforms, num_platforms);
}

CL_API_ENTRY cl_int CL_API_CALL clGetPlatformInfo(cl_platform_id platform, cl_platform_info param_name,
                                                  size_t param_value_size, void *param_value,
                                                  size_t *param_value_size_ret) {
  FALLIBLE(clGetPlatformInfo, CL_OUT_OF_HOST_MEMORY, platform, param_name, param_value_size, param_value,
           param_value_size_ret);
}

CL_API_ENTRY cl_int CL_API_CALL clGetDeviceIDs(cl_platform_id platform, cl_device_type device_type, cl_uint num_entries,
                                               cl_device_id *devices, cl_uint *num_devices) {
  FALLIBLE(clGetDeviceIDs, CL_OUT_OF_HOST_MEMORY, platform, device_type, num_entries, devices, num_devices);
}

CL_API_ENTRY cl_int CL_API_CALL clGetDeviceInfo(cl_device_id device, cl_device_info param_name, size_t param_value_size,
                                                void *param_value, size_t *param_value_size_ret) {
  FALLIBLE(clGetDeviceInfo, CL_OUT_OF_RESOURCES, device, param_name, param_value_size, param_value,
           param_value_size_ret);
}

CL_API_ENTRY cl_int CL_API_CALL clRetainDevice(cl_device_id device) { RETAIN(clRetainDevice, SHIM_DEVICE, device); }

CL_API_ENTRY cl_int CL_API_CALL clReleaseDevice(cl_device_id device) { RELEASE(clReleaseDevice, device); }

/* contexts and queues */

CL_API_ENTRY cl_context CL_API_CALL clCreateContext(
    const cl_context_properties *properties, cl_uint num_devices, const cl_device_id *devices,
    void(CL_CALLBACK *pfn_notify)(const char *, const void *, size_t, void *), void *user_data, cl_int *errcode_ret) {
  CREATING(cl_context, clCreateContext, SHIM_CONTEXT, CL_OUT_OF_HOST_MEMORY, properties, num_devices, devices,
           pfn_notify, user_data, errcode_ret);
}

CL_API_ENTRY cl_int CL_API_CALL clRetainContext(cl_context context) { RETAIN(clRetainContext, SHIM_CONTEXT, context); }

CL_API_ENTRY cl_int CL_API_CALL clReleaseContext(cl_context context) { RELEASE(clReleaseContext, context); }

CL_API_ENTRY cl_int CL_API_CALL clGetContextInfo(cl_context context, cl_context_info param_name,
                                                 size_t param_value_size, void *param_value,
                                                 size_t *param_value_size_ret) {
  FALLIBLE(clGetContextInfo, CL_OUT_OF_RESOURCES, context, param_name, param_value_size, param_value,
           param_value_size_ret);
}

CL_API_ENTRY cl_command_queue CL_API_CALL clCreateCommandQueue(cl_context context, cl_device_id device,
                                                               cl_command_queue_properties properties,
                                                               cl_int *errcode_ret) {
  CREATING(cl_command_queue, clCreateCommandQueue, SHIM_QUEUE, CL_OUT_OF_RESOURCES, context, device, properties,
           errcode_ret);
}

CL_API_ENTRY cl_int CL_API_CALL clRetainCommandQueue(cl_command_queue command_queue) {
  RETAIN(clRetainCommandQueue, SHIM_QUEUE, command_queue);
}

CL_API_ENTRY cl_int CL_API_CALL clReleaseCommandQueue(cl_command_queue command_queue) {
  RELEASE(clReleaseCommandQueue, command_queue);
}

CL_API_ENTRY cl_int CL_API_CALL clGetCommandQueueInfo(cl_command_queue command_queue, cl_command_queue_info param_name,
                                                      size_t param_value_size, void *param_value,
                                                      size_t *param_value_size_ret) {
  FALLIBLE(clGetCommandQueueInfo, CL_OUT_OF_RESOURCES, command_queue, param_name, param_value_size, param_value,
           param_value_size_ret);
}

CL_API_ENTRY cl_int CL_API_CALL clFlush(cl_command_queue command_queue) {
  FALLIBLE(clFlush, CL_OUT_OF_RESOURCES, command_queue);
}

CL_API_ENTRY cl_int CL_API_CALL clFinish(cl_command_queue command_queue) {
  FALLIBLE(clFinish, CL_OUT_OF_RESOURCES, command_queue);
}

/* memory */

CL_API_ENTRY cl_mem CL_API_CALL clCreateBuffer(cl_context context, cl_mem_flags flags, size_t size, void *host_ptr,
                                               cl_int *errcode_ret) {
  CREATING(cl_mem, clCreateBuffer, SHIM_MEM, CL_MEM_OBJECT_ALLOCATION_FAILURE, context, flags, size, host_ptr,
           errcode_ret);
}

CL_API_ENTRY cl_mem CL_API_CALL clCreateSubBuffer(cl_mem buffer, cl_mem_flags flags,
                                                  cl_buffer_create_type buffer_create_type,
                                                  const void *buffer_create_info, cl_int *errcode_ret) {
  CREATING(cl_mem, clCreateSubBuffer, SHIM_MEM, CL_MEM_OBJECT_ALLOCATION_FAILURE, buffer, flags, buffer_create_type,
           buffer_create_info, errcode_ret);
}

CL_API_ENTRY cl_int CL_API_CALL clRetainMemObject(cl_mem memobj) { RETAIN(clRetainMemObject, SHIM_MEM, memobj); }

CL_API_ENTRY cl_int CL_API_CALL clReleaseMemObject(cl_mem memobj) { RELEASE(clReleaseMemObject, memobj); }

CL_API_ENTRY cl_int CL_API_CALL clGetMemObjectInfo(cl_mem memobj, cl_mem_info param_name, size_t param_value_size,
                                                   void *param_value, size_t *param_value_size_ret) {
  FALLIBLE(clGetMemObjectInfo, CL_OUT_OF_RESOURCES, memobj, param_name, param_value_size, param_value,
           param_value_size_ret);
}

CL_API_ENTRY cl_int CL_API_CALL clSetMemObjectDestructorCallback(cl_mem memobj,
                                                                 void(CL_CALLBACK *pfn_notify)(cl_mem, void *),
                                                                 void *user_data) {
  FALLIBLE(clSetMemObjectDestructorCallback, CL_OUT_OF_RESOURCES, memobj, pfn_notify, user_data);
}

/* programs and kernels */

CL_API_ENTRY cl_program CL_API_CALL clCreateProgramWithSource(cl_context context, cl_uint count, const char **strings,
                                                              const size_t *lengths, cl_int *errcode_ret) {
  CREATING(cl_program, clCreateProgramWithSource, SHIM_PROGRAM, CL_OUT_OF_HOST_MEMORY, context, count, strings, lengths,
           errcode_ret);
}

CL_API_ENTRY cl_program CL_API_CALL clCreateProgramWithBinary(cl_context context, cl_uint num_devices,
                                                              const cl_device_id *device_list, const size_t *lengths,
                                                              const unsigned char **binaries, cl_int *binary_status,
                                                              cl_int *errcode_ret) {
  CREATING(cl_program, clCreateProgramWithBinary, SHIM_PROGRAM, CL_OUT_OF_HOST_MEMORY, context, num_devices,
           device_list, lengths, binaries, binary_status, errcode_ret);
}

CL_API_ENTRY cl_int CL_API_CALL clRetainProgram(cl_program program) { RETAIN(clRetainProgram, SHIM_PROGRAM, program); }

CL_API_ENTRY cl_int CL_API_CALL clReleaseProgram(cl_program program) { RELEASE(clReleaseProgram, program); }

CL_API_ENTRY cl_int CL_API_CALL clBuildProgram(cl_program program, cl_uint num_devices, const cl_device_id *device_list,
                                               const char *options, void(CL_CALLBACK *pfn_notify)(cl_program, void *),
                                               void *user_data) {
  FALLIBLE(clBuildProgram, CL_OUT_OF_HOST_MEMORY, program, num_devices, device_list, options, pfn_notify, user_data);
}

CL_API_ENTRY cl_int CL_API_CALL clGetProgramInfo(cl_program program, cl_program_info param_name,
                                                 size_t param_value_size, void *param_value,
                                                 size_t *param_value_size_ret) {
  FALLIBLE(clGetProgramInfo, CL_OUT_OF_HOST_MEMORY, program, param_name, param_value_size, param_value,
           param_value_size_ret);
}

CL_API_ENTRY cl_int CL_API_CALL clGetProgramBuildInfo(cl_program program, cl_device_id device,
                                                      cl_program_build_info param_name, size_t param_value_size,
                                                      void *param_value, size_t *param_value_size_ret) {
  FALLIBLE(clGetProgramBuildInfo, CL_OUT_OF_HOST_MEMORY, program, device, param_name, param_value_size, param_value,
           param_value_size_ret);
}

CL_API_ENTRY cl_kernel CL_API_CALL clCreateKernel(cl_program program, const char *kernel_name, cl_int *errcode_ret) {
  CREATING(cl_kernel, clCreateKernel, SHIM_KERNEL, CL_OUT_OF_RESOURCES, program, kernel_name, errcode_ret);
}

CL_API_ENTRY cl_int CL_API_CALL clRetainKernel(cl_kernel kernel) { RETAIN(clRetainKernel, SHIM_KERNEL, kernel); }

CL_API_ENTRY cl_int CL_API_CALL clReleaseKernel(cl_kernel kernel) { RELEASE(clReleaseKernel, kernel); }

CL_API_ENTRY cl_int CL_API_CALL clSetKernelArg(cl_kernel kernel, cl_uint arg_index, size_t arg_size,
                                               const void *arg_value) {
  FALLIBLE(clSetKernelArg, CL_OUT_OF_RESOURCES, kernel, arg_index, arg_size, arg_value);
}

CL_API_ENTRY cl_int CL_API_CALL clGetKernelInfo(cl_kernel kernel, cl_kernel_info param_name, size_t param_value_size,
                                                void *param_value, size_t *param_value_size_ret) {
  FALLIBLE(clGetKernelInfo, CL_OUT_OF_RESOURCES, kernel, param_name, param_value_size, param_value,
           param_value_size_ret);
}

/* Faked kernel answers (shim_fake_kernel_info). */
static char fake_kernel[64];
static cl_kernel_work_group_info fake_param;
static cl_ulong fake_value;
static long fake_left, fake_queries;

void shim_fake_kernel_info(const char *kernel, cl_kernel_work_group_info param, cl_ulong value, long n) {
  pthread_mutex_lock(&lock);
  snprintf(fake_kernel, sizeof fake_kernel, "%s", kernel ? kernel : "");
  fake_param = param;
  fake_value = value;
  fake_left = n;
  fake_queries = 0;
  pthread_mutex_unlock(&lock);
}

long shim_kernel_queries(void) {
  pthread_mutex_lock(&lock);
  long n = fake_queries;
  pthread_mutex_unlock(&lock);
  return n;
}

/* Whether this query is to be faked: the kernel's name and the param match
 * and answers are left (one is used). Queries of the two portable params
 * are counted; a vendor's (Intel's spill size) is not, so a count is the
 * same on every runtime. */
static int take_fake(cl_kernel kernel, cl_kernel_work_group_info param) {
  REAL(clGetKernelInfo);
  char name[64] = "";
  if (!fake_kernel[0] || real_clGetKernelInfo(kernel, CL_KERNEL_FUNCTION_NAME, sizeof name, name, NULL) != CL_SUCCESS ||
      strcmp(name, fake_kernel) != 0)
    return 0;
  pthread_mutex_lock(&lock);
  if (param == CL_KERNEL_WORK_GROUP_SIZE || param == CL_KERNEL_PRIVATE_MEM_SIZE) fake_queries++;
  const int take = param == fake_param && fake_left > 0;
  if (take) fake_left--;
  pthread_mutex_unlock(&lock);
  return take;
}

CL_API_ENTRY cl_int CL_API_CALL clGetKernelWorkGroupInfo(cl_kernel kernel, cl_device_id device,
                                                         cl_kernel_work_group_info param_name, size_t param_value_size,
                                                         void *param_value, size_t *param_value_size_ret) {
  if (take_fake(kernel, param_name)) {
    const size_t as_size = (size_t)fake_value;
    const int wide = param_name == CL_KERNEL_LOCAL_MEM_SIZE || param_name == CL_KERNEL_PRIVATE_MEM_SIZE;
    const size_t need = wide ? sizeof fake_value : sizeof as_size;
    if (param_value && param_value_size < need) return CL_INVALID_VALUE;
    if (param_value) memcpy(param_value, wide ? (const void *)&fake_value : (const void *)&as_size, need);
    if (param_value_size_ret) *param_value_size_ret = need;
    return CL_SUCCESS;
  }
  FALLIBLE(clGetKernelWorkGroupInfo, CL_OUT_OF_RESOURCES, kernel, device, param_name, param_value_size, param_value,
           param_value_size_ret);
}

/* events */

CL_API_ENTRY cl_int CL_API_CALL clWaitForEvents(cl_uint num_events, const cl_event *event_list) {
  FALLIBLE(clWaitForEvents, CL_OUT_OF_RESOURCES, num_events, event_list);
}

CL_API_ENTRY cl_int CL_API_CALL clGetEventInfo(cl_event event, cl_event_info param_name, size_t param_value_size,
                                               void *param_value, size_t *param_value_size_ret) {
  FALLIBLE(clGetEventInfo, CL_OUT_OF_RESOURCES, event, param_name, param_value_size, param_value, param_value_size_ret);
}

CL_API_ENTRY cl_int CL_API_CALL clGetEventProfilingInfo(cl_event event, cl_profiling_info param_name,
                                                        size_t param_value_size, void *param_value,
                                                        size_t *param_value_size_ret) {
  FALLIBLE(clGetEventProfilingInfo, CL_OUT_OF_RESOURCES, event, param_name, param_value_size, param_value,
           param_value_size_ret);
}

CL_API_ENTRY cl_event CL_API_CALL clCreateUserEvent(cl_context context, cl_int *errcode_ret) {
  CREATING(cl_event, clCreateUserEvent, SHIM_EVENT, CL_OUT_OF_RESOURCES, context, errcode_ret);
}

CL_API_ENTRY cl_int CL_API_CALL clRetainEvent(cl_event event) { RETAIN(clRetainEvent, SHIM_EVENT, event); }

CL_API_ENTRY cl_int CL_API_CALL clReleaseEvent(cl_event event) { RELEASE(clReleaseEvent, event); }

/* enqueues */

CL_API_ENTRY cl_int CL_API_CALL clEnqueueNDRangeKernel(cl_command_queue command_queue, cl_kernel kernel,
                                                       cl_uint work_dim, const size_t *global_work_offset,
                                                       const size_t *global_work_size, const size_t *local_work_size,
                                                       cl_uint num_events_in_wait_list, const cl_event *event_wait_list,
                                                       cl_event *event) {
  ENQUEUE(clEnqueueNDRangeKernel, command_queue, kernel, work_dim, global_work_offset, global_work_size,
          local_work_size, num_events_in_wait_list, event_wait_list, event);
}

CL_API_ENTRY cl_int CL_API_CALL clEnqueueReadBuffer(cl_command_queue command_queue, cl_mem buffer,
                                                    cl_bool blocking_read, size_t offset, size_t size, void *ptr,
                                                    cl_uint num_events_in_wait_list, const cl_event *event_wait_list,
                                                    cl_event *event) {
  ENQUEUE(clEnqueueReadBuffer, command_queue, buffer, blocking_read, offset, size, ptr, num_events_in_wait_list,
          event_wait_list, event);
}

CL_API_ENTRY cl_int CL_API_CALL clEnqueueWriteBuffer(cl_command_queue command_queue, cl_mem buffer,
                                                     cl_bool blocking_write, size_t offset, size_t size,
                                                     const void *ptr, cl_uint num_events_in_wait_list,
                                                     const cl_event *event_wait_list, cl_event *event) {
  ENQUEUE(clEnqueueWriteBuffer, command_queue, buffer, blocking_write, offset, size, ptr, num_events_in_wait_list,
          event_wait_list, event);
}

CL_API_ENTRY cl_int CL_API_CALL clEnqueueFillBuffer(cl_command_queue command_queue, cl_mem buffer, const void *pattern,
                                                    size_t pattern_size, size_t offset, size_t size,
                                                    cl_uint num_events_in_wait_list, const cl_event *event_wait_list,
                                                    cl_event *event) {
  ENQUEUE(clEnqueueFillBuffer, command_queue, buffer, pattern, pattern_size, offset, size, num_events_in_wait_list,
          event_wait_list, event);
}

CL_API_ENTRY cl_int CL_API_CALL clEnqueueCopyBuffer(cl_command_queue command_queue, cl_mem src_buffer,
                                                    cl_mem dst_buffer, size_t src_offset, size_t dst_offset,
                                                    size_t size, cl_uint num_events_in_wait_list,
                                                    const cl_event *event_wait_list, cl_event *event) {
  ENQUEUE(clEnqueueCopyBuffer, command_queue, src_buffer, dst_buffer, src_offset, dst_offset, size,
          num_events_in_wait_list, event_wait_list, event);
}

CL_API_ENTRY cl_int CL_API_CALL clEnqueueBarrierWithWaitList(cl_command_queue command_queue,
                                                             cl_uint num_events_in_wait_list,
                                                             const cl_event *event_wait_list, cl_event *event) {
  ENQUEUE(clEnqueueBarrierWithWaitList, command_queue, num_events_in_wait_list, event_wait_list, event);
}

CL_API_ENTRY cl_int CL_API_CALL clEnqueueMarkerWithWaitList(cl_command_queue command_queue,
                                                            cl_uint num_events_in_wait_list,
                                                            const cl_event *event_wait_list, cl_event *event) {
  ENQUEUE(clEnqueueMarkerWithWaitList, command_queue, num_events_in_wait_list, event_wait_list, event);
}

/* command buffers (cl_khr_command_buffer, mutable dispatch): extension
 * functions come from clGetExtensionFunctionAddressForPlatform, which hands
 * out these wrappers (fallible and counted like the core functions) in
 * front of the runtime's entry points. */

typedef void *shim_cb; /* cl_command_buffer_khr */
static void *real_create_cb, *real_finalize_cb, *real_release_cb, *real_enqueue_cb, *real_ndrange_cb, *real_update_cb;

static shim_cb CL_API_CALL shim_clCreateCommandBufferKHR(cl_uint n, const cl_command_queue *queues,
                                                        const cl_ulong *properties, cl_int *errcode_ret) {
  cl_int f = fault("clCreateCommandBufferKHR", CALLER, CL_OUT_OF_RESOURCES);
  if (f != CL_SUCCESS) {
    if (errcode_ret) *errcode_ret = f;
    return NULL;
  }
  return ((shim_cb(CL_API_CALL *)(cl_uint, const cl_command_queue *, const cl_ulong *, cl_int *))real_create_cb)(
      n, queues, properties, errcode_ret);
}

static cl_int CL_API_CALL shim_clFinalizeCommandBufferKHR(shim_cb cb) {
  cl_int f = fault("clFinalizeCommandBufferKHR", CALLER, CL_OUT_OF_RESOURCES);
  return f != CL_SUCCESS ? f : ((cl_int(CL_API_CALL *)(shim_cb))real_finalize_cb)(cb);
}

static cl_int CL_API_CALL shim_clReleaseCommandBufferKHR(shim_cb cb) {
  count_plain();
  return ((cl_int(CL_API_CALL *)(shim_cb))real_release_cb)(cb);
}

static cl_int CL_API_CALL shim_clEnqueueCommandBufferKHR(cl_uint n, cl_command_queue *queues, shim_cb cb,
                                                         cl_uint num_events_in_wait_list,
                                                         const cl_event *event_wait_list, cl_event *event) {
  cl_int f = fault("clEnqueueCommandBufferKHR", CALLER, CL_OUT_OF_RESOURCES);
  if (f != CL_SUCCESS) return f;
  cl_int e = ((cl_int(CL_API_CALL *)(cl_uint, cl_command_queue *, shim_cb, cl_uint, const cl_event *,
                                     cl_event *))real_enqueue_cb)(n, queues, cb, num_events_in_wait_list,
                                                                  event_wait_list, event);
  if (e == CL_SUCCESS && event) track_add((void *)*event, SHIM_EVENT);
  return e;
}

static cl_int CL_API_CALL shim_clCommandNDRangeKernelKHR(shim_cb cb, cl_command_queue queue, const cl_ulong *properties,
                                                         cl_kernel kernel, cl_uint work_dim, const size_t *offset,
                                                         const size_t *global, const size_t *local, cl_uint n_sync,
                                                         const cl_uint *sync_list, cl_uint *sync_point,
                                                         void **mutable_handle) {
  cl_int f = fault("clCommandNDRangeKernelKHR", CALLER, CL_OUT_OF_RESOURCES);
  if (f != CL_SUCCESS) return f;
  return ((cl_int(CL_API_CALL *)(shim_cb, cl_command_queue, const cl_ulong *, cl_kernel, cl_uint, const size_t *,
                                 const size_t *, const size_t *, cl_uint, const cl_uint *, cl_uint *,
                                 void **))real_ndrange_cb)(cb, queue, properties, kernel, work_dim, offset, global,
                                                           local, n_sync, sync_list, sync_point, mutable_handle);
}

static cl_int CL_API_CALL shim_clUpdateMutableCommandsKHR(shim_cb cb, cl_uint n, const cl_uint *types,
                                                          const void **configs) {
  cl_int f = fault("clUpdateMutableCommandsKHR", CALLER, CL_OUT_OF_RESOURCES);
  if (f != CL_SUCCESS) return f;
  return ((cl_int(CL_API_CALL *)(shim_cb, cl_uint, const cl_uint *, const void **))real_update_cb)(cb, n, types,
                                                                                                    configs);
}

CL_API_ENTRY void *CL_API_CALL clGetExtensionFunctionAddressForPlatform(cl_platform_id platform,
                                                                       const char *func_name) {
  REAL(clGetExtensionFunctionAddressForPlatform);
  count_plain();
  void *real = real_clGetExtensionFunctionAddressForPlatform(platform, func_name);
  const struct {
    const char *name;
    void **real;
    void *shim;
  } wrapped[] = {
      {"clCreateCommandBufferKHR", &real_create_cb, (void *)shim_clCreateCommandBufferKHR},
      {"clFinalizeCommandBufferKHR", &real_finalize_cb, (void *)shim_clFinalizeCommandBufferKHR},
      {"clReleaseCommandBufferKHR", &real_release_cb, (void *)shim_clReleaseCommandBufferKHR},
      {"clEnqueueCommandBufferKHR", &real_enqueue_cb, (void *)shim_clEnqueueCommandBufferKHR},
      {"clCommandNDRangeKernelKHR", &real_ndrange_cb, (void *)shim_clCommandNDRangeKernelKHR},
      {"clUpdateMutableCommandsKHR", &real_update_cb, (void *)shim_clUpdateMutableCommandsKHR},
  };
  for (size_t i = 0; real && i < sizeof wrapped / sizeof wrapped[0]; i++)
    if (strcmp(func_name, wrapped[i].name) == 0) {
      *wrapped[i].real = real; /* one platform per test process */
      return wrapped[i].shim;
    }
  return real;
}
