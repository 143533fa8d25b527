/*
 * Views as validation checks them: each cl_mem asked once what it is
 * (mem_facts.c keeps the answers), each view checked against its buffer
 * and recorded for the aliasing rule (alias.c); the K/V storages' views,
 * their INT8 scales and block tables.
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "check/check.h"

#define BAD(...) ca_fail(CLATTN_ERR_INVALID_ARGUMENT, __VA_ARGS__)

/* Whether two elements of a view share an address: with the dimensions
 * longer than 1 ordered by stride, each stride must pass the span of all the
 * smaller ones. (The spans are known not to overflow.) */
static int view_overlaps(const clattn_tensor *t, const int *dims, int rank) {
  int order[4], n = 0;
  for (int d = 0; d < rank; d++) {
    if (dims[d] <= 1) continue;
    int at = n++;
    while (at > 0 && t->stride[order[at - 1]] > t->stride[d]) {
      order[at] = order[at - 1];
      at--;
    }
    order[at] = d;
  }
  size_t span = 0;
  for (int k = 0; k < n; k++) {
    if (t->stride[order[k]] <= span) return 1;
    span += (size_t)(dims[order[k]] - 1) * t->stride[order[k]];
  }
  return 0;
}

/* One clGetMemObjectInfo query of view `name`'s cl_mem; an error that says
 * the handle is bad is the caller's INVALID_ARGUMENT. */
static clattn_status mem_info(const char *name, cl_mem buf, cl_mem_info param, const char *param_name, size_t size,
                              void *value) {
  cl_int err = clGetMemObjectInfo(buf, param, size, value, NULL);
  if (err == CL_SUCCESS) return CLATTN_OK;
  char what[96];
  snprintf(what, sizeof what, "%s.buf: clGetMemObjectInfo(%s)", name, param_name);
  clattn_status s = ca_cl_fail(err, what);
  return s == CLATTN_ERR_OPENCL ? ca_fail(CLATTN_ERR_INVALID_ARGUMENT, "%s.buf is not a valid cl_mem: %s (%d)", name,
                                          ca_cl_error_name(err), (int)err)
                                : s;
}

/* Where buf's bytes lie among other cl_mems' (alias.c): a sub-buffer's in
 * its parent's, from CL_MEM_OFFSET; a buffer over host memory
 * (CL_MEM_USE_HOST_PTR, or a sub-buffer of one) among the host's, from
 * CL_MEM_HOST_PTR (OpenCL leaves two buffers over one host range undefined);
 * any other in its own. */
const char ca_host_memory = 0;

static clattn_status locate(const char *name, cl_mem buf, cl_mem_flags flags, const void **space, size_t *base) {
  cl_mem parent = NULL;
  size_t origin = 0;
  void *host = NULL;
  clattn_status st;
  if ((st = mem_info(name, buf, CL_MEM_ASSOCIATED_MEMOBJECT, "CL_MEM_ASSOCIATED_MEMOBJECT", sizeof parent, &parent)))
    return st;
  if (parent && ((st = mem_info(name, buf, CL_MEM_OFFSET, "CL_MEM_OFFSET", sizeof origin, &origin)) ||
                 (st = mem_info(name, parent, CL_MEM_FLAGS, "CL_MEM_FLAGS", sizeof flags, &flags))))
    return st;
  const cl_mem root = parent ? parent : buf;
  if (flags & CL_MEM_USE_HOST_PTR) {
    if ((st = mem_info(name, root, CL_MEM_HOST_PTR, "CL_MEM_HOST_PTR", sizeof host, &host))) return st;
    *space = &ca_host_memory;
    *base = (size_t)(uintptr_t)host + origin;
  } else {
    *space = root;
    *base = origin;
  }
  return CLATTN_OK;
}

/* The kernels take every view as a __global buffer of the context's
 * cl_context, read inputs and write outputs: an image, a buffer of another
 * context or one created without the access the call needs is refused here
 * (a driver may accept it and then fail or corrupt memory). *size: CL_MEM_SIZE;
 * *space, *base: where its bytes lie (locate). */
static clattn_status check_mem(cl_context context, const char *name, cl_mem buf, int is_output, size_t *size,
                               const void **space, size_t *base) {
  ca_mem_facts f = {0, 0, NULL, 0, NULL, 0};
  clattn_status st;
  if (!ca_mem_facts_cached(buf, &f)) { /* asked once while buf lives (mem_facts.c) */
    /* the type first: a handle of another kind (a queue, an image) is
     * refused before any query that takes it for a buffer */
    if ((st = mem_info(name, buf, CL_MEM_TYPE, "CL_MEM_TYPE", sizeof f.type, &f.type))) return st;
    if (f.type != CL_MEM_OBJECT_BUFFER)
      return BAD("%s.buf is not a buffer (CL_MEM_TYPE 0x%x): views must be cl_mem buffers", name, (unsigned)f.type);
    if ((st = mem_info(name, buf, CL_MEM_SIZE, "CL_MEM_SIZE", sizeof f.size, &f.size)) ||
        (st = mem_info(name, buf, CL_MEM_CONTEXT, "CL_MEM_CONTEXT", sizeof f.context, &f.context)) ||
        (st = mem_info(name, buf, CL_MEM_FLAGS, "CL_MEM_FLAGS", sizeof f.flags, &f.flags)) ||
        (st = locate(name, buf, f.flags, &f.space, &f.base)))
      return st;
    ca_mem_facts_keep(buf, &f);
  }
  *size = f.size;
  *space = f.space;
  *base = f.base;
  if (f.context != context) return BAD("%s.buf belongs to another cl_context than the clattn context's", name);
  if (is_output && (f.flags & CL_MEM_READ_ONLY))
    return BAD("%s.buf was created CL_MEM_READ_ONLY: the kernels cannot write an output there", name);
  if (!is_output && (f.flags & CL_MEM_WRITE_ONLY))
    return BAD("%s.buf was created CL_MEM_WRITE_ONLY: the kernels cannot read an input there", name);
  return CLATTN_OK;
}

/* Checks that a view of dims[0..rank) fits its cl_mem: the last element it
 * addresses, offset + sum (dim-1)*stride, must lie inside CL_MEM_SIZE. An
 * output view (and a VIEW_READ_WHOLE one) may not broadcast (a zero stride
 * over a dimension longer than one would make several results share an
 * element) nor overlap itself. Records the view in vs, for ca_views_disjoint. */
int ca_view_bytes(const clattn_tensor *t, const int *dims, int rank, size_t elem_size, size_t *bytes) {
  size_t last = t->offset;
  for (int d = 0; d < rank; d++) {
    size_t step;
    if (!ca_mul_ok((size_t)(dims[d] - 1), t->stride[d], &step) || !ca_add_ok(last, step, &last)) return 0;
  }
  return ca_add_ok(last, 1, bytes) && ca_mul_ok(*bytes, elem_size, bytes);
}

clattn_status ca_check_view(ca_views *vs, const char *name, const clattn_tensor *t, const int *dims, int rank,
                            size_t elem_size, int role) {
  for (int d = 0; d < rank; d++)
    if (role != CA_VIEW_IN && dims[d] > 1 && t->stride[d] == 0)
      return BAD("%s.stride[%d] is 0: an output view cannot broadcast", name, d);
  size_t need;
  if (!ca_view_bytes(t, dims, rank, elem_size, &need))
    return BAD("%s: offset and strides overflow the address range", name);
  if (role != CA_VIEW_IN && view_overlaps(t, dims, rank))
    return BAD("%s: the view overlaps itself (strides %zu, %zu, %zu, %zu): two results would share an element", name,
               t->stride[0], t->stride[1], t->stride[2], t->stride[3]);
  size_t have = 0, base = 0;
  const void *space = NULL;
  clattn_status st = check_mem(vs->context, name, t->buf, role == CA_VIEW_OUT, &have, &space, &base);
  if (st != CLATTN_OK) return st;
  if (need > have)
    return ca_fail(CLATTN_ERR_BUFFER_TOO_SMALL, "%s: the view addresses %zu bytes but the buffer holds %zu", name, need,
                   have);
  return ca_views_add(vs, name, t, dims, rank, elem_size, role == CA_VIEW_OUT, space, base, need);
}

/* A view of a block type (offset and strides in bytes, stride[3] one
 * block) of rows of `cols` elements, checked as the bytes it addresses:
 * each row's blocks as one run of cols / 32 blocks. */
static clattn_status check_block_view(ca_views *vs, const char *name, const clattn_tensor *t, const int *dims,
                                      clattn_dtype dtype, int is_output) {
  const int cols = dims[3];
  const size_t block = ca_block_bytes(dtype);
  const char *type = ca_dtype_name(dtype) + strlen("CLATTN_");
  if (cols % 32 != 0)
    return BAD("%s: %s stores rows in blocks of 32 elements, but the row has %d (not a multiple of 32)", name, type,
               cols);
  if (t->stride[3] != block)
    return BAD("%s.stride[3] must be %zu for %s (one %zu-byte block of 32 elements; got %zu)", name, block, type, block,
               t->stride[3]);
  if (t->offset % 2 || t->stride[0] % 2 || t->stride[1] % 2 || t->stride[2] % 2)
    return BAD("%s: a %s view's offset and strides must be even (its f16 scales are 2-byte aligned)", name, type);
  const clattn_tensor bytes = {t->buf, t->offset, {t->stride[0], t->stride[1], t->stride[2], 1}};
  const int byte_dims[] = {dims[0], dims[1], dims[2], (int)((size_t)cols / 32 * block)};
  return ca_check_view(vs, name, &bytes, byte_dims, 4, 1, is_output);
}

/* A K or V view (or a cache of clattn_kv_append) in storage dtype:
 * dims[3] elements per row. */
clattn_status ca_check_kv_view(ca_views *vs, const char *name, const clattn_tensor *t, const int *dims,
                               clattn_dtype dtype, int is_output) {
  if (ca_block_bytes(dtype)) return check_block_view(vs, name, t, dims, dtype, is_output);
  return ca_check_view(vs, name, t, dims, 4, ca_unit_bytes(dtype), is_output);
}

/* The INT8 scales of the K/V views (k_scale with an INT8 k, v_scale with an
 * INT8 v), shared by forward and append. slots = dimension 0 of the views
 * (batch, or pages), rows = dimension 2 (keys, or rows per page). */
clattn_status ca_check_kv_scales(ca_views *vs, clattn_dtype k_dtype, clattn_dtype v_dtype,
                                 const clattn_tensor *k_scale, const clattn_tensor *v_scale, int slots, int kv_heads,
                                 int rows, int is_output) {
  const struct {
    const char *name, *of;
    const clattn_tensor *t;
    int int8;
  } scales[] = {{"k_scale", "k", k_scale, k_dtype == CLATTN_INT8}, {"v_scale", "v", v_scale, v_dtype == CLATTN_INT8}};
  const int dims[] = {slots, kv_heads, rows};
  for (int i = 0; i < 2; i++) {
    clattn_status st;
    if (scales[i].int8 && !scales[i].t->buf)
      return BAD("%s stored as CLATTN_INT8 needs %s (f32, one per key row); it is absent", scales[i].of,
                 scales[i].name);
    if (!scales[i].int8 && scales[i].t->buf)
      return BAD("%s is set but %s is not stored as CLATTN_INT8", scales[i].name, scales[i].of);
    if (scales[i].t->buf && (st = ca_check_view(vs, scales[i].name, scales[i].t, dims, 3, sizeof(float), is_output)))
      return st;
  }
  return CLATTN_OK;
}

clattn_status ca_check_block_table(ca_views *vs, cl_mem table, int batch, int stride, int page_size, int num_pages,
                                   long long rows_needed) {
  if (page_size <= 0) return BAD("page_size must be positive with a block table (got %d)", page_size);
  if (num_pages <= 0) return BAD("num_pages must be positive with a block table (got %d)", num_pages);
  const long long need = (rows_needed + page_size - 1) / page_size;
  if (stride <= 0 || stride < need)
    return BAD("block_table_stride %d: each batch row needs at least %lld entries (%lld keys in pages of %d)", stride,
               need, rows_needed, page_size);
  const clattn_tensor t = {table, 0, {(size_t)stride, 1, 0, 0}};
  const int dims[] = {batch, stride};
  return ca_check_view(vs, "block_table", &t, dims, 2, sizeof(int32_t), 0);
}

