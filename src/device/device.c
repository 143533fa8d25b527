/* Device discovery and the device queries that tile choice depends on. */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <CL/cl_ext.h>

#include "device/device.h"
#include "device/rules.h"

#ifndef CL_PLATFORM_NOT_FOUND_KHR
#define CL_PLATFORM_NOT_FOUND_KHR -1001 /* cl_khr_icd: the loader found no platform */
#endif

void ca_device_string(cl_device_id device, cl_device_info what, char *buf, size_t size) {
  if (clGetDeviceInfo(device, what, size, buf, NULL) != CL_SUCCESS) snprintf(buf, size, "?");
  buf[size - 1] = '\0';
}

void ca_platform_string(cl_platform_id platform, cl_platform_info what, char *buf, size_t size) {
  if (clGetPlatformInfo(platform, what, size, buf, NULL) != CL_SUCCESS) snprintf(buf, size, "?");
  buf[size - 1] = '\0';
}

static int contains_nocase(const char *hay, const char *needle) {
  size_t n = strlen(needle);
  for (; *hay; hay++) {
    size_t i = 0;
    while (i < n && hay[i] && tolower((unsigned char)hay[i]) == tolower((unsigned char)needle[i])) i++;
    if (i == n) return 1;
  }
  return n == 0;
}

/* Whether the space-separated list holds word exactly. */
static int has_word(const char *list, const char *word) {
  const size_t n = strlen(word);
  for (const char *at = strstr(list, word); at; at = strstr(at + 1, word))
    if ((at == list || at[-1] == ' ') && (at[n] == ' ' || at[n] == '\0')) return 1;
  return 0;
}

typedef struct {
  cl_int err;
  const char *what;
} query_failure;

/* Whether a query succeeded; the first failure is kept in *first. */
static int query_ok(cl_int err, const char *what, query_failure *first) {
  if (err == CL_SUCCESS) return 1;
  if (first->err == CL_SUCCESS) *first = (query_failure){err, what};
  return 0;
}

static clattn_status pick_device(const char *match, cl_platform_id *platform, cl_device_id *device) {
  cl_platform_id platforms[16];
  cl_uint n_platforms = 0;
  cl_int err = clGetPlatformIDs(16, platforms, &n_platforms);
  if (err == CL_PLATFORM_NOT_FOUND_KHR || (err == CL_SUCCESS && n_platforms == 0))
    return ca_fail(CLATTN_ERR_NO_DEVICE, "no OpenCL platform found (is an ICD such as pocl-opencl-icd installed?)");
  if (err != CL_SUCCESS) return ca_cl_fail(err, "clGetPlatformIDs");
  if (n_platforms > 16) n_platforms = 16;

  int found = 0;
  /* the first query that failed for another reason than having no device,
   * reported when nothing is found (a name that cannot be read matches nothing) */
  query_failure failed = {CL_SUCCESS, ""};
  for (int want_gpu = 1; want_gpu >= 0 && !found; want_gpu--) {
    for (cl_uint p = 0; p < n_platforms && !found; p++) {
      cl_device_id devices[16];
      cl_uint n = 0;
      err = clGetDeviceIDs(platforms[p], CL_DEVICE_TYPE_ALL, 16, devices, &n);
      if (err == CL_DEVICE_NOT_FOUND || !query_ok(err, "clGetDeviceIDs", &failed)) continue;
      if (n > 16) n = 16;
      char pname[256] = "";
      if (match && !query_ok(clGetPlatformInfo(platforms[p], CL_PLATFORM_NAME, sizeof pname, pname, NULL),
                             "clGetPlatformInfo(CL_PLATFORM_NAME)", &failed))
        continue;
      for (cl_uint d = 0; d < n && !found; d++) {
        char dname[256] = "";
        cl_device_type type = 0;
        if (match && !query_ok(clGetDeviceInfo(devices[d], CL_DEVICE_NAME, sizeof dname, dname, NULL),
                               "clGetDeviceInfo(CL_DEVICE_NAME)", &failed))
          continue;
        if (!query_ok(clGetDeviceInfo(devices[d], CL_DEVICE_TYPE, sizeof type, &type, NULL),
                      "clGetDeviceInfo(CL_DEVICE_TYPE)", &failed))
          continue;
        int ok = match ? (contains_nocase(pname, match) || contains_nocase(dname, match))
                       : (!want_gpu || (type & CL_DEVICE_TYPE_GPU));
        if (ok) {
          *platform = platforms[p];
          *device = devices[d];
          found = 1;
        }
      }
    }
    if (match) break; /* a match is searched once, over every device */
  }
  if (!found && failed.err != CL_SUCCESS) return ca_cl_fail(failed.err, failed.what);
  if (!found)
    return match
               ? ca_fail(CLATTN_ERR_NO_DEVICE, "no OpenCL device matches \"%s\" (CLATTN_DEVICE or device_match)", match)
               : ca_fail(CLATTN_ERR_NO_DEVICE, "no OpenCL device found");
  return CLATTN_OK;
}

/* The ICD loader and POCL initialise themselves on the first enumeration and
 * are not safe against concurrent first calls (threads creating contexts at
 * once crashed, or saw no platform): one discovery at a time per process. */
static pthread_mutex_t discovery_lock = PTHREAD_MUTEX_INITIALIZER;

clattn_status ca_pick_device(const char *match, cl_platform_id *platform, cl_device_id *device) {
  pthread_mutex_lock(&discovery_lock);
  clattn_status st = pick_device(match, platform, device);
  pthread_mutex_unlock(&discovery_lock);
  return st;
}

clattn_status ca_query_device(cl_device_id device, tl_device *caps, cl_ulong *max_alloc) {
  clattn_status st = CLATTN_OK;
  memset(caps, 0, sizeof *caps);
  ca_device_string(device, CL_DEVICE_NAME, caps->name, sizeof caps->name);
  CA_CHECK_CL(st, clGetDeviceInfo(device, CL_DEVICE_TYPE, sizeof caps->type, &caps->type, NULL),
              "clGetDeviceInfo(CL_DEVICE_TYPE)");
  CA_CHECK_CL(st, clGetDeviceInfo(device, CL_DEVICE_LOCAL_MEM_SIZE, sizeof caps->local_mem, &caps->local_mem, NULL),
              "clGetDeviceInfo(CL_DEVICE_LOCAL_MEM_SIZE)");
  CA_CHECK_CL(st, clGetDeviceInfo(device, CL_DEVICE_MAX_WORK_GROUP_SIZE, sizeof caps->max_wg, &caps->max_wg, NULL),
              "clGetDeviceInfo(CL_DEVICE_MAX_WORK_GROUP_SIZE)");
  CA_CHECK_CL(st, clGetDeviceInfo(device, CL_DEVICE_MAX_WORK_ITEM_SIZES, sizeof caps->max_item, caps->max_item, NULL),
              "clGetDeviceInfo(CL_DEVICE_MAX_WORK_ITEM_SIZES)");
  CA_CHECK_CL(
      st, clGetDeviceInfo(device, CL_DEVICE_MAX_COMPUTE_UNITS, sizeof caps->compute_units, &caps->compute_units, NULL),
      "clGetDeviceInfo(CL_DEVICE_MAX_COMPUTE_UNITS)");
  CA_CHECK_CL(st, clGetDeviceInfo(device, CL_DEVICE_VENDOR_ID, sizeof caps->vendor_id, &caps->vendor_id, NULL),
              "clGetDeviceInfo(CL_DEVICE_VENDOR_ID)");
  CA_CHECK_CL(st, clGetDeviceInfo(device, CL_DEVICE_MAX_MEM_ALLOC_SIZE, sizeof *max_alloc, max_alloc, NULL),
              "clGetDeviceInfo(CL_DEVICE_MAX_MEM_ALLOC_SIZE)");
  CA_CHECK_CL(st, clGetDeviceInfo(device, CL_DEVICE_VENDOR_ID, sizeof caps->vendor_id, &caps->vendor_id, NULL),
              "clGetDeviceInfo(CL_DEVICE_VENDOR_ID)");
  CA_CHECK_CL(st, clGetDeviceInfo(device, CL_DEVICE_MAX_PARAMETER_SIZE, sizeof caps->max_param, &caps->max_param, NULL),
              "clGetDeviceInfo(CL_DEVICE_MAX_PARAMETER_SIZE)");
  CA_CHECK_CL(st, clGetDeviceInfo(device, CL_DEVICE_ADDRESS_BITS, sizeof caps->address_bits, &caps->address_bits, NULL),
              "clGetDeviceInfo(CL_DEVICE_ADDRESS_BITS)");
  CA_CHECK_CL(st,
              clGetDeviceInfo(device, CL_DEVICE_PREFERRED_VECTOR_WIDTH_FLOAT, sizeof caps->vec_float_pref,
                              &caps->vec_float_pref, NULL),
              "clGetDeviceInfo(CL_DEVICE_PREFERRED_VECTOR_WIDTH_FLOAT)");
  CA_CHECK_CL(st,
              clGetDeviceInfo(device, CL_DEVICE_NATIVE_VECTOR_WIDTH_FLOAT, sizeof caps->vec_float_native,
                              &caps->vec_float_native, NULL),
              "clGetDeviceInfo(CL_DEVICE_NATIVE_VECTOR_WIDTH_FLOAT)");
  size_t ext_size = 0;
  CA_CHECK_CL(st, clGetDeviceInfo(device, CL_DEVICE_EXTENSIONS, 0, NULL, &ext_size),
              "clGetDeviceInfo(CL_DEVICE_EXTENSIONS)");
  char *ext = malloc(ext_size + 1);
  if (!ext) return ca_fail(CLATTN_ERR_OUT_OF_MEMORY, "device extensions: out of host memory");
  cl_int err = clGetDeviceInfo(device, CL_DEVICE_EXTENSIONS, ext_size, ext, NULL);
  ext[err == CL_SUCCESS ? ext_size : 0] = '\0';
  caps->fp16 = has_word(ext, "cl_khr_fp16");
  const int sub_groups = has_word(ext, "cl_intel_subgroups") && has_word(ext, "cl_intel_required_subgroup_size");
  free(ext);
  if (sub_groups) { /* a failed query leaves none: the kernels then reduce through local memory */
    size_t sizes[16], bytes = 0;
    if (clGetDeviceInfo(device, CL_DEVICE_SUB_GROUP_SIZES_INTEL, sizeof sizes, sizes, &bytes) == CL_SUCCESS)
      for (size_t i = 0; i < bytes / sizeof sizes[0]; i++)
        if (sizes[i] >= 1 && sizes[i] <= 64 && (sizes[i] & (sizes[i] - 1)) == 0) caps->sg_sizes |= (cl_uint)sizes[i];
  }
  CA_CHECK_CL(st, err, "clGetDeviceInfo(CL_DEVICE_EXTENSIONS)");
  ca_rules_resolve(caps);
fail:
  return st;
}

/* flash_rows' floats per vector: the wider of the device's preferred and
 * native float vector widths (POCL: the SIMD registers, 16 with AVX-512, 8
 * with AVX2), as a power of two clamped to 4 .. 16; 16 when the device
 * reports neither. Its key blocks are twice that (two vectors per step). */
int ca_flash_vw(const tl_device *caps) {
  const cl_uint w = caps->vec_float_pref > caps->vec_float_native ? caps->vec_float_pref : caps->vec_float_native;
  return w == 0 ? 16 : w >= 16 ? 16 : w >= 8 ? 8 : 4;
}

int ca_flash_bm(const tl_device *caps, int vw) { return vw >= 16 ? (int)ca_rule(caps, CA_RULE_FLASH_BM_WIDE, NULL) : 4; }

int ca_device_float_atomics(cl_device_id device) {
  char version[64] = "", ext[8192] = "";
  ca_device_string(device, CL_DEVICE_VERSION, version, sizeof version);
  ca_device_string(device, CL_DEVICE_EXTENSIONS, ext, sizeof ext);
  return strncmp(version, "OpenCL 3.", 9) == 0 && strstr(ext, "cl_ext_float_atomics") != NULL;
}
