/* Setting kernel arguments in order, remembering the first failure. */
#include <stdio.h>

#include "internal.h"

void ca_arg(ca_args *a, size_t size, const void *value) {
  if (a->err == CL_SUCCESS) {
    a->err = clSetKernelArg(a->kernel, a->index, size, value);
    if (a->err != CL_SUCCESS) a->failed_index = a->index;
  }
  a->index++;
}

void ca_arg_mem(ca_args *a, cl_mem m) { ca_arg(a, sizeof m, &m); }

void ca_arg_int(ca_args *a, int v) { ca_arg(a, sizeof v, &v); }

void ca_arg_float(ca_args *a, float v) { ca_arg(a, sizeof v, &v); }

void ca_arg_view(ca_args *a, const clattn_tensor *t) {
  cl_ulong offset = t->offset;
  cl_ulong4 stride;
  for (int d = 0; d < 4; d++) stride.s[d] = t->stride[d];
  ca_arg_mem(a, t->buf);
  ca_arg(a, sizeof offset, &offset);
  ca_arg(a, sizeof stride, &stride);
}

clattn_status ca_args_done(const ca_args *a) {
  if (a->err == CL_SUCCESS) return CLATTN_OK;
  char what[128];
  snprintf(what, sizeof what, "clSetKernelArg(%s, argument %u)", a->name, a->failed_index);
  return ca_cl_fail(a->err, what);
}
