/* Every check on a call that needs no device work (see ca_validate). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "dtype.h"
#include "internal.h"

#define BAD(...) ca_fail(CLATTN_ERR_INVALID_ARGUMENT, __VA_ARGS__)

/* a * b into *out; 0 on overflow. */
static int mul_ok(size_t a, size_t b, size_t *out) {
  if (a != 0 && b > SIZE_MAX / a) return 0;
  *out = a * b;
  return 1;
}

static int add_ok(size_t a, size_t b, size_t *out) {
  if (b > SIZE_MAX - a) return 0;
  *out = a + b;
  return 1;
}

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
static const char host_memory = 0; /* the space of buffers over host memory */

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
    *space = &host_memory;
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
    if ((st = mem_info(name, buf, CL_MEM_SIZE, "CL_MEM_SIZE", sizeof f.size, &f.size)) ||
        (st = mem_info(name, buf, CL_MEM_TYPE, "CL_MEM_TYPE", sizeof f.type, &f.type)) ||
        (st = mem_info(name, buf, CL_MEM_CONTEXT, "CL_MEM_CONTEXT", sizeof f.context, &f.context)) ||
        (st = mem_info(name, buf, CL_MEM_FLAGS, "CL_MEM_FLAGS", sizeof f.flags, &f.flags)) ||
        (st = locate(name, buf, f.flags, &f.space, &f.base)))
      return st;
    ca_mem_facts_keep(buf, &f);
  }
  *size = f.size;
  *space = f.space;
  *base = f.base;
  if (f.type != CL_MEM_OBJECT_BUFFER)
    return BAD("%s.buf is not a buffer (CL_MEM_TYPE 0x%x): views must be cl_mem buffers", name, (unsigned)f.type);
  if (f.context != context) return BAD("%s.buf belongs to another cl_context than the clattn context's", name);
  if (is_output && (f.flags & CL_MEM_READ_ONLY))
    return BAD("%s.buf was created CL_MEM_READ_ONLY: the kernels cannot write an output there", name);
  if (!is_output && (f.flags & CL_MEM_WRITE_ONLY))
    return BAD("%s.buf was created CL_MEM_WRITE_ONLY: the kernels cannot read an input there", name);
  return CLATTN_OK;
}

/* A view's role: read, written, or read but shaped like an output (each
 * element its own: no broadcast, no overlap), as clattn_backward reads the
 * forward's out and lse. */
enum { VIEW_IN = 0, VIEW_OUT = 1, VIEW_READ_WHOLE = 2 };

/* Checks that a view of dims[0..rank) fits its cl_mem: the last element it
 * addresses, offset + sum (dim-1)*stride, must lie inside CL_MEM_SIZE. An
 * output view (and a VIEW_READ_WHOLE one) may not broadcast (a zero stride
 * over a dimension longer than one would make several results share an
 * element) nor overlap itself. Records the view in vs, for ca_views_disjoint. */
static clattn_status check_view(ca_views *vs, const char *name, const clattn_tensor *t, const int *dims, int rank,
                                size_t elem_size, int role) {
  size_t last = t->offset;
  for (int d = 0; d < rank; d++) {
    size_t step;
    if (role != VIEW_IN && dims[d] > 1 && t->stride[d] == 0)
      return BAD("%s.stride[%d] is 0: an output view cannot broadcast", name, d);
    if (!mul_ok((size_t)(dims[d] - 1), t->stride[d], &step) || !add_ok(last, step, &last))
      return BAD("%s: offset and strides overflow the address range", name);
  }
  size_t need;
  if (!add_ok(last, 1, &need) || !mul_ok(need, elem_size, &need))
    return BAD("%s: offset and strides overflow the address range", name);
  if (role != VIEW_IN && view_overlaps(t, dims, rank))
    return BAD("%s: the view overlaps itself (strides %zu, %zu, %zu, %zu): two results would share an element", name,
               t->stride[0], t->stride[1], t->stride[2], t->stride[3]);
  size_t have = 0, base = 0;
  const void *space = NULL;
  clattn_status st = check_mem(vs->context, name, t->buf, role == VIEW_OUT, &have, &space, &base);
  if (st != CLATTN_OK) return st;
  if (need > have)
    return ca_fail(CLATTN_ERR_BUFFER_TOO_SMALL, "%s: the view addresses %zu bytes but the buffer holds %zu", name, need,
                   have);
  return ca_views_add(vs, name, t, dims, rank, elem_size, role == VIEW_OUT, space, base, need);
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
  return check_view(vs, name, &bytes, byte_dims, 4, 1, is_output);
}

/* A K or V view (or a cache of clattn_kv_append) in storage dtype:
 * dims[3] elements per row. */
static clattn_status check_kv_view(ca_views *vs, const char *name, const clattn_tensor *t, const int *dims,
                                   clattn_dtype dtype, int is_output) {
  if (ca_block_bytes(dtype)) return check_block_view(vs, name, t, dims, dtype, is_output);
  return check_view(vs, name, t, dims, 4, ca_unit_bytes(dtype), is_output);
}

/* The INT8 scales of the K/V views (k_scale with an INT8 k, v_scale with an
 * INT8 v), shared by forward and append. slots = dimension 0 of the views
 * (batch, or pages), rows = dimension 2 (keys, or rows per page). */
static clattn_status check_kv_scales(ca_views *vs, clattn_dtype k_dtype, clattn_dtype v_dtype,
                                     const clattn_tensor *k_scale, const clattn_tensor *v_scale, int slots,
                                     int kv_heads, int rows, int is_output) {
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
    if (scales[i].t->buf && (st = check_view(vs, scales[i].name, scales[i].t, dims, 3, sizeof(float), is_output)))
      return st;
  }
  return CLATTN_OK;
}

static clattn_status check_block_table(ca_views *vs, cl_mem table, int batch, int stride, int page_size, int num_pages,
                                       long long rows_needed) {
  if (page_size <= 0) return BAD("page_size must be positive with a block table (got %d)", page_size);
  if (num_pages <= 0) return BAD("num_pages must be positive with a block table (got %d)", num_pages);
  const long long need = (rows_needed + page_size - 1) / page_size;
  if (stride <= 0 || stride < need)
    return BAD("block_table_stride %d: each batch row needs at least %lld entries (%lld keys in pages of %d)", stride,
               need, rows_needed, page_size);
  const clattn_tensor t = {table, 0, {(size_t)stride, 1, 0, 0}};
  const int dims[] = {batch, stride};
  return check_view(vs, "block_table", &t, dims, 2, sizeof(int32_t), 0);
}

clattn_status ca_check_storage(const clattn_params *p) {
  if (ca_is_dtype(p->dtype) && p->dtype != CLATTN_F32 && p->dtype != CLATTN_F16 && p->dtype != CLATTN_BF16)
    return BAD("dtype %s: quantised storage is for k and v only (kv_dtype); q and out are F32, F16 or BF16",
               ca_dtype_name(p->dtype));
  if (p->dtype != CLATTN_F32 && p->dtype != CLATTN_F16 && p->dtype != CLATTN_BF16)
    return BAD("dtype %d is not a storage type of q and out", (int)p->dtype);
  if (p->kv_dtype != CLATTN_DTYPE_SAME && !ca_is_dtype(p->kv_dtype))
    return BAD("kv_dtype %d is not a clattn_dtype", (int)p->kv_dtype);
  if (p->v_dtype != CLATTN_DTYPE_SAME && !ca_is_dtype(p->v_dtype))
    return BAD("v_dtype %d is not a clattn_dtype", (int)p->v_dtype);
  if (p->head_dim <= 0) return BAD("head_dim must be positive (got %d)", p->head_dim);
  if (p->value_dim <= 0) return BAD("value_dim must be positive (got %d)", p->value_dim);
  const clattn_dtype k_dtype = ca_k_dtype(p), v_dtype = ca_v_dtype(p);
  if (ca_block_bytes(k_dtype) && p->head_dim % 32)
    return BAD("kv_dtype %s stores rows in blocks of 32 elements: head_dim (%d) must be a multiple of 32",
               ca_dtype_name(k_dtype), p->head_dim);
  if (ca_block_bytes(v_dtype) && p->value_dim % 32)
    return BAD("%s %s stores rows in blocks of 32 elements: value_dim (%d) must be a multiple of 32",
               p->v_dtype == CLATTN_DTYPE_SAME ? "kv_dtype" : "v_dtype", ca_dtype_name(v_dtype), p->value_dim);
  return CLATTN_OK;
}

clattn_dtype ca_k_dtype(const clattn_params *p) { return p->kv_dtype == CLATTN_DTYPE_SAME ? p->dtype : p->kv_dtype; }
clattn_dtype ca_v_dtype(const clattn_params *p) { return p->v_dtype == CLATTN_DTYPE_SAME ? ca_k_dtype(p) : p->v_dtype; }

static clattn_status check_dims(const clattn_params *p) {
  const struct {
    const char *name;
    int value;
  } dims[] = {
      {"batch", p->batch}, {"q_heads", p->q_heads}, {"kv_heads", p->kv_heads},
      {"q_len", p->q_len}, {"kv_len", p->kv_len},
  };
  for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++)
    if (dims[i].value <= 0) return BAD("%s must be positive (got %d)", dims[i].name, dims[i].value);
  if (p->q_heads % p->kv_heads != 0) return BAD("kv_heads (%d) must divide q_heads (%d)", p->kv_heads, p->q_heads);
  /* Flattened (batch, head) and row indices are int in the kernels. */
  if ((long long)p->batch * p->q_heads > INT32_MAX)
    return BAD("batch * q_heads (%lld) exceeds 2^31 - 1", (long long)p->batch * p->q_heads);
  return CLATTN_OK;
}

static clattn_status check_enums(const clattn_params *p) {
  if (p->empty_rows != CLATTN_EMPTY_ZERO && p->empty_rows != CLATTN_EMPTY_ERROR)
    return BAD("empty_rows %d is not a clattn_empty_rows", (int)p->empty_rows);
  if (p->algo < CLATTN_ALGO_AUTO || p->algo > CLATTN_ALGO_GEMM)
    return BAD("algo %d is not a clattn_algo", (int)p->algo);
  if (p->window_left < -1) return BAD("window_left must be -1 (unbounded) or >= 0 (got %d)", p->window_left);
  if (p->window_right < -1) return BAD("window_right must be -1 (unbounded) or >= 0 (got %d)", p->window_right);
  if (isinf(p->scale)) return BAD("scale must be finite or NAN (got %g)", (double)p->scale);
  if (!(p->softcap >= 0.0f) || isinf(p->softcap))
    return BAD("softcap must be 0 (off) or positive and finite (got %g)", (double)p->softcap);
  if (p->score != CLATTN_SCORE_DOT && p->score != CLATTN_SCORE_ADDITIVE)
    return BAD("score %d is not a clattn_score", (int)p->score);
  if (p->score == CLATTN_SCORE_ADDITIVE && !p->additive_w)
    return BAD("additive_w is NULL: CLATTN_SCORE_ADDITIVE needs the weights w (f32 [head_dim])");
  if (p->score == CLATTN_SCORE_DOT && p->additive_w) return BAD("additive_w is set but score is CLATTN_SCORE_DOT");
  if (p->alibi_batch_stride < 0)
    return BAD("alibi_batch_stride must be >= 0 (0: one slope per head; got %d)", p->alibi_batch_stride);
  if (p->bias_dtype != CLATTN_F32 && p->bias_dtype != CLATTN_F16)
    return BAD("bias_dtype %d: a bias is stored as CLATTN_F32 or CLATTN_F16", (int)p->bias_dtype);
  if (p->bias_scale && !p->bias.buf) return BAD("bias_scale is set but bias is absent (it scales the bias)");
  if (p->alibi_batch_stride > 0 && !p->alibi_slopes)
    return BAD("alibi_batch_stride is %d but alibi_slopes is NULL", p->alibi_batch_stride);
  if (!(p->dropout_p >= 0.0f && p->dropout_p < 1.0f))
    return BAD("dropout_p must be in [0, 1) (0: no dropout; got %g)", (double)p->dropout_p);
  return CLATTN_OK;
}

/* Packed variable-length batches: both offset arrays, no kv_lens, the
 * totals given, and q, k, v, out with no batch stride (sequences are rows).
 * Over a paged cache only the queries are packed: cu_seqlens_q, and each
 * sequence's keys through the block table, kv_lens[b] of them. */
static clattn_status check_varlen(const clattn_params *p) {
  if (!p->cu_seqlens_q && !p->cu_seqlens_k) return CLATTN_OK;
  const int paged = p->block_table != NULL;
  if (paged && !p->cu_seqlens_q)
    return BAD(
        "cu_seqlens_k with a block table: paged keys are found through the block table (packed queries take "
        "cu_seqlens_q, each sequence's key count kv_lens)");
  if (paged && p->cu_seqlens_k)
    return BAD(
        "cu_seqlens_k with a block table: each sequence's keys are kv_lens[b] keys through its block-table "
        "row; cu_seqlens_k must be NULL");
  if (!paged && (!p->cu_seqlens_q || !p->cu_seqlens_k))
    return BAD("cu_seqlens_q and cu_seqlens_k come together without a block table (got only %s)",
               p->cu_seqlens_q ? "cu_seqlens_q" : "cu_seqlens_k");
  if (!paged && p->kv_lens) return BAD("kv_lens with cu_seqlens: packed sequences carry their own lengths");
  if (p->batch == INT32_MAX) return BAD("batch %d: cu_seqlens would need batch + 1 entries", p->batch);
  if (p->total_q <= 0) return BAD("total_q must be positive with cu_seqlens_q (got %d)", p->total_q);
  if (!paged && p->total_kv <= 0) return BAD("total_kv must be positive with cu_seqlens_k (got %d)", p->total_kv);
  const struct {
    const char *name;
    const clattn_tensor *t;
  } views[] = {{"q", &p->q}, {"out", &p->out}, {"k", &p->k}, {"v", &p->v}};
  for (size_t i = 0; i < (paged ? 2 : 4); i++) /* paged k and v: stride[0] steps a page */
    if (views[i].t->stride[0] != 0)
      return BAD("%s.stride[0] must be 0 with cu_seqlens: sequence b's rows are found through cu_seqlens (got %zu)",
                 views[i].name, views[i].t->stride[0]);
  return CLATTN_OK;
}

/* out_role: VIEW_OUT, or VIEW_READ_WHOLE for out and lse read by the backward. */
static clattn_status check_views(ca_views *vs, const clattn_params *p, int out_role) {
  clattn_status st;
  /* packed sequences: q, k, v, out are one batch of total_q / total_kv rows */
  const int varlen = p->cu_seqlens_q != NULL, qb = varlen ? 1 : p->batch;
  const int q_rows = varlen ? p->total_q : p->q_len, k_rows = varlen ? p->total_kv : p->kv_len;
  const int q_dims[] = {qb, p->q_heads, q_rows, p->head_dim};
  /* paged K/V: [page, kv head, row in page, column] */
  const int paged = p->block_table != NULL, kv_slots = paged ? p->num_pages : qb,
            kv_rows = paged ? p->page_size : k_rows;
  const int k_dims[] = {kv_slots, p->kv_heads, kv_rows, p->head_dim};
  const int v_dims[] = {kv_slots, p->kv_heads, kv_rows, p->value_dim};
  const int o_dims[] = {qb, p->q_heads, q_rows, p->value_dim};
  const int s_dims[] = {p->batch, p->q_heads, p->q_len, p->kv_len};
  const int lse_dims[] = {p->batch, p->q_heads, p->q_len};
  const struct {
    const char *name;
    const clattn_tensor *t;
  } required[] = {{"q", &p->q}, {"k", &p->k}, {"v", &p->v}, {"out", &p->out}};
  for (size_t i = 0; i < 4; i++)
    if (!required[i].t->buf) return BAD("%s.buf is NULL (q, k, v and out are required)", required[i].name);
  const size_t elem = p->dtype == CLATTN_F32 ? sizeof(float) : 2; /* f16 and bf16: 16 bits */
  if ((st = check_view(vs, "q", &p->q, q_dims, 4, elem, 0))) return st;
  if (paged && (st = check_block_table(vs, p->block_table, p->batch, p->block_table_stride, p->page_size, p->num_pages,
                                       p->kv_len)))
    return st;
  if ((st = check_kv_view(vs, "k", &p->k, k_dims, ca_k_dtype(p), 0))) return st;
  if ((st = check_kv_view(vs, "v", &p->v, v_dims, ca_v_dtype(p), 0))) return st;
  if ((st = check_kv_scales(vs, ca_k_dtype(p), ca_v_dtype(p), &p->k_scale, &p->v_scale, kv_slots, p->kv_heads, kv_rows,
                            0)))
    return st;
  const struct {
    const char *name;
    const clattn_tensor *t;
    const int *dims;
    int rank;
    size_t elem;
  } outs[] = {
      {"lse", &p->lse, lse_dims, 3, sizeof(float)},         {"weights", &p->weights, s_dims, 4, sizeof(float)},
      {"entropy", &p->entropy, lse_dims, 3, sizeof(float)}, {"max_weight", &p->max_weight, lse_dims, 3, sizeof(float)},
      {"argmax", &p->argmax, lse_dims, 3, sizeof(int32_t)},
  };
  if ((st = check_view(vs, "out", &p->out, o_dims, 4, elem, out_role))) return st;
  if (p->mask.buf && (st = check_view(vs, "mask", &p->mask, s_dims, 4, 1, 0))) return st;
  if (p->bias.buf && (st = check_view(vs, "bias", &p->bias, s_dims, 4, ca_unit_bytes(p->bias_dtype), 0))) return st;
  for (size_t i = 0; i < sizeof outs / sizeof outs[0]; i++)
    if (outs[i].t->buf && (st = check_view(vs, outs[i].name, outs[i].t, outs[i].dims, outs[i].rank, outs[i].elem,
                                           i == 0 ? out_role : VIEW_OUT)))
      return st;
  const int b_dims[] = {p->batch};
  const clattn_tensor lens = {p->kv_lens, 0, {1, 0, 0, 0}}, leftpad = {p->cache_leftpad, 0, {1, 0, 0, 0}};
  if (p->kv_lens && (st = check_view(vs, "kv_lens", &lens, b_dims, 1, sizeof(int32_t), 0))) return st;
  if (p->cache_leftpad && (st = check_view(vs, "cache_leftpad", &leftpad, b_dims, 1, sizeof(int32_t), 0))) return st;
  if (varlen) {
    const int cu_dims[] = {p->batch + 1};
    const clattn_tensor cq = {p->cu_seqlens_q, 0, {1, 0, 0, 0}}, ck = {p->cu_seqlens_k, 0, {1, 0, 0, 0}};
    if ((st = check_view(vs, "cu_seqlens_q", &cq, cu_dims, 1, sizeof(int32_t), 0)) ||
        (ck.buf && (st = check_view(vs, "cu_seqlens_k", &ck, cu_dims, 1, sizeof(int32_t), 0))))
      return st;
  }
  const int h_dims[] = {p->q_heads}, bh_dims[] = {p->batch, p->q_heads};
  /* per (batch, head) with a batch stride, else one slope per head */
  const clattn_tensor alibi = {p->alibi_slopes, 0, {(size_t)p->alibi_batch_stride, 1, 0, 0}},
                      sinks = {p->sinks, p->sinks_offset, {1, 0, 0, 0}};
  if (p->alibi_slopes && (st = check_view(vs, "alibi_slopes", &alibi, bh_dims, 2, sizeof(float), 0))) return st;
  if (p->sinks && (st = check_view(vs, "sinks", &sinks, h_dims, 1, sizeof(float), 0))) return st;
  const clattn_tensor bias_scale = {p->bias_scale, 0, {1, 0, 0, 0}};
  if (p->bias_scale && (st = check_view(vs, "bias_scale", &bias_scale, h_dims, 1, sizeof(float), 0))) return st;
  const int d_dims[] = {p->head_dim};
  const clattn_tensor w = {p->additive_w, 0, {1, 0, 0, 0}};
  if (p->additive_w && (st = check_view(vs, "additive_w", &w, d_dims, 1, sizeof(float), 0))) return st;
  return CLATTN_OK;
}

/* The views go to *views (NULL: the call's own); whether any output shares
 * bytes is checked here unless the caller adds views first (the backward). */
static clattn_status validate(const clattn_context *ctx, const clattn_params *p, int out_role, ca_plan *plan,
                              ca_views *views, int check_sharing) {
  clattn_status st;
  if (!ctx) return BAD("clattn_forward: ctx is NULL");
  if (!p) return BAD("clattn_forward: params is NULL");
  if ((st = check_dims(p)) || (st = ca_check_storage(p)) || (st = check_enums(p)) || (st = check_varlen(p))) return st;
  if (p->block_table && !p->kv_lens)
    return BAD("block_table without kv_lens: a paged cache needs each batch row's length");
  if (p->cache_leftpad && !p->kv_lens)
    return BAD("cache_leftpad without kv_lens: a left-padded row's keys end at kv_lens[b]");
  if (p->cache_leftpad && p->cu_seqlens_k)
    return BAD("cache_leftpad with cu_seqlens_k: packed keys start where cu_seqlens_k says");
  ca_views own;
  ca_views *vs = views ? views : &own;
  ca_views_init(vs, ctx->context);
  if ((st = check_views(vs, p, out_role)) || (check_sharing && (st = ca_views_disjoint(vs)))) return st;

  const int want_weights = p->weights.buf != NULL;
  plan->algo = p->algo != CLATTN_ALGO_AUTO ? p->algo : ca_auto_algo(ctx, p->q_len, want_weights);
  plan->k_dtype = ca_k_dtype(p);
  plan->v_dtype = ca_v_dtype(p);
  plan->paged = p->block_table != NULL;
  /* Paged or quantised K/V run on every path: the fused and staged kernels
   * follow the block table and dequantise on load, the GEMM path gathers
   * into its scratch. */
  if (plan->algo == CLATTN_ALGO_FUSED && want_weights)
    return ca_fail(CLATTN_ERR_UNSUPPORTED,
                   "weights: the fused kernel never forms the routing matrix; use CLATTN_ALGO_STAGED or AUTO");
  if (plan->algo != CLATTN_ALGO_FUSED && (cl_ulong)p->kv_len * sizeof(float) > ctx->max_alloc)
    return ca_fail(CLATTN_ERR_OUT_OF_MEMORY, "kv_len %d: one row of scores exceeds the device's largest allocation",
                   p->kv_len);

  plan->scale = isnan(p->scale) ? (float)(1.0 / sqrt((double)p->head_dim)) : p->scale;
  plan->window_left = p->window_left;
  plan->window_right = p->window_right;
  if (p->causal) plan->window_right = 0; /* causal: no key after the aligned position */
  plan->group = p->q_heads / p->kv_heads;
  plan->has_mask = p->mask.buf != NULL;
  plan->has_bias = p->bias.buf != NULL;
  plan->has_kv_lens = p->kv_lens != NULL;
  plan->want_lse = p->lse.buf != NULL;
  plan->diag = (p->entropy.buf ? CA_DIAG_ENTROPY : 0) | (p->max_weight.buf ? CA_DIAG_MAX_WEIGHT : 0) |
               (p->argmax.buf ? CA_DIAG_ARGMAX : 0);
  plan->want_weights = want_weights;
  plan->dropout = NULL; /* the path makes it (ca_dropout_take) */
  return CLATTN_OK;
}

clattn_status ca_validate(const clattn_context *ctx, const clattn_params *p, ca_plan *plan) {
  return validate(ctx, p, VIEW_OUT, plan, NULL, 1);
}

clattn_status ca_validate_views(const clattn_context *ctx, const clattn_params *p, ca_plan *plan, ca_views *views) {
  return validate(ctx, p, VIEW_OUT, plan, views, 1);
}

clattn_status ca_validate_backward_fwd(const clattn_context *ctx, const clattn_params *p, ca_plan *plan,
                                       ca_views *views) {
  return validate(ctx, p, VIEW_READ_WHOLE, plan, views, 0);
}

clattn_status ca_validate_merge(const clattn_context *ctx, const clattn_merge_params *mp) {
  clattn_status st;
  if (!ctx) return BAD("clattn_merge_states: ctx is NULL");
  if (!mp) return BAD("clattn_merge_states: params is NULL");
  const struct {
    const char *name;
    int value;
  } dims[] = {
      {"n_states", mp->n_states}, {"batch", mp->batch},         {"heads", mp->heads},
      {"q_len", mp->q_len},       {"value_dim", mp->value_dim},
  };
  for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++)
    if (dims[i].value <= 0) return BAD("%s must be positive (got %d)", dims[i].name, dims[i].value);
  if (mp->empty_rows != CLATTN_EMPTY_ZERO && mp->empty_rows != CLATTN_EMPTY_ERROR)
    return BAD("empty_rows %d is not a clattn_empty_rows", (int)mp->empty_rows);
  if (mp->out_dtype != CLATTN_F32 && mp->out_dtype != CLATTN_F16 && mp->out_dtype != CLATTN_BF16)
    return BAD("out_dtype %d: merged outputs are stored as CLATTN_F32, CLATTN_F16 or CLATTN_BF16", (int)mp->out_dtype);
  if (!mp->o.buf) return BAD("o.buf is NULL");
  if (!mp->lse.buf) return BAD("lse.buf is NULL");
  if (!mp->out.buf) return BAD("out.buf is NULL");
  const int o_dims[] = {mp->batch, mp->heads, mp->q_len, mp->value_dim};
  /* The last state's views reach furthest: checking them covers every state. */
  clattn_tensor o_last = mp->o, lse_last = mp->lse;
  size_t shift;
  if (!mul_ok((size_t)(mp->n_states - 1), mp->o_state_stride, &shift) || !add_ok(o_last.offset, shift, &o_last.offset))
    return BAD("o: o_state_stride overflows the address range");
  if (!mul_ok((size_t)(mp->n_states - 1), mp->lse_state_stride, &shift) ||
      !add_ok(lse_last.offset, shift, &lse_last.offset))
    return BAD("lse: lse_state_stride overflows the address range");
  ca_views vs;
  ca_views_init(&vs, ctx->context);
  /* each input is recorded as all its states */
  if ((st = check_view(&vs, "o", &o_last, o_dims, 4, sizeof(float), 0))) return st;
  ca_views_repeat_last(&vs, (size_t)mp->n_states, mp->o_state_stride * sizeof(float));
  if ((st = check_view(&vs, "lse", &lse_last, o_dims, 3, sizeof(float), 0))) return st;
  ca_views_repeat_last(&vs, (size_t)mp->n_states, mp->lse_state_stride * sizeof(float));
  const size_t out_elem = mp->out_dtype == CLATTN_F32 ? sizeof(float) : 2;
  if ((st = check_view(&vs, "out", &mp->out, o_dims, 4, out_elem, 1)) ||
      (mp->out_lse.buf && (st = check_view(&vs, "out_lse", &mp->out_lse, o_dims, 3, sizeof(float), 1))))
    return st;
  return ca_views_disjoint(&vs);
}

clattn_status ca_check_view(ca_views *vs, const char *name, const clattn_tensor *t, const int *dims, int rank,
                            size_t elem_size, int is_output) {
  return check_view(vs, name, t, dims, rank, elem_size, is_output);
}

clattn_status ca_validate_append(const clattn_context *ctx, const clattn_append_params *ap) {
  clattn_status st;
  if (!ctx) return BAD("clattn_kv_append: ctx is NULL");
  if (!ap) return BAD("clattn_kv_append: params is NULL");
  const struct {
    const char *name;
    int value;
  } dims[] = {
      {"batch", ap->batch}, {"kv_heads", ap->kv_heads}, {"head_dim", ap->head_dim}, {"value_dim", ap->value_dim}};
  for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++)
    if (dims[i].value <= 0) return BAD("%s must be positive (got %d)", dims[i].name, dims[i].value);
  if (ap->new_len < 0) return BAD("new_len must be >= 0 (got %d)", ap->new_len);
  if ((long long)ap->batch * ap->kv_heads > INT32_MAX)
    return BAD("batch * kv_heads (%lld) exceeds 2^31 - 1", (long long)ap->batch * ap->kv_heads);
  if (ap->src_dtype != CLATTN_F32 && ap->src_dtype != CLATTN_F16 && ap->src_dtype != CLATTN_BF16)
    return BAD("src_dtype %d: new rows are F32, F16 or BF16", (int)ap->src_dtype);
  if (ap->kv_dtype != CLATTN_DTYPE_SAME && !ca_is_dtype(ap->kv_dtype))
    return BAD("kv_dtype %d is not a clattn_dtype", (int)ap->kv_dtype);
  const clattn_dtype kv = ap->kv_dtype == CLATTN_DTYPE_SAME ? ap->src_dtype : ap->kv_dtype;
  if (kv > CLATTN_INT8)
    return ca_fail(CLATTN_ERR_UNSUPPORTED,
                   "kv_dtype %s: clattn_kv_append writes F32, F16, BF16, Q8_0 and INT8 caches (the forward reads "
                   "every storage)",
                   ca_dtype_name(kv));
  const struct {
    const char *name;
    const clattn_tensor *t;
  } required[] = {{"k_new", &ap->k_new}, {"v_new", &ap->v_new}, {"k", &ap->k}, {"v", &ap->v}};
  for (size_t i = 0; i < 4; i++)
    if (!required[i].t->buf) return BAD("%s.buf is NULL (k_new, v_new, k and v are required)", required[i].name);
  if (!ap->positions) return BAD("positions is NULL: each batch row's cache position is required");
  const int paged = ap->block_table != NULL;
  ca_views vs;
  ca_views_init(&vs, ctx->context);
  if (paged) {
    if ((st = check_block_table(&vs, ap->block_table, ap->batch, ap->block_table_stride, ap->page_size, ap->num_pages,
                                ap->new_len)))
      return st;
  } else {
    if (ap->capacity <= 0) return BAD("capacity must be positive for a contiguous cache (got %d)", ap->capacity);
    if (ap->new_len > ap->capacity)
      return BAD("new_len %d exceeds the cache's capacity of %d rows", ap->new_len, ap->capacity);
  }
  const clattn_tensor pos = {ap->positions, 0, {1, 0, 0, 0}};
  const int b_dims[] = {ap->batch};
  if ((st = check_view(&vs, "positions", &pos, b_dims, 1, sizeof(int32_t), 0))) return st;
  const int slots = paged ? ap->num_pages : ap->batch, rows = paged ? ap->page_size : ap->capacity;
  const int k_dims[] = {slots, ap->kv_heads, rows, ap->head_dim};
  const int v_dims[] = {slots, ap->kv_heads, rows, ap->value_dim};
  if ((st = check_kv_view(&vs, "k", &ap->k, k_dims, kv, 1)) || (st = check_kv_view(&vs, "v", &ap->v, v_dims, kv, 1)) ||
      (st = check_kv_scales(&vs, kv, kv, &ap->k_scale, &ap->v_scale, slots, ap->kv_heads, rows, 1)))
    return st;
  if (ap->new_len > 0) {
    const size_t elem = ap->src_dtype == CLATTN_F32 ? sizeof(float) : 2;
    const int kn_dims[] = {ap->batch, ap->kv_heads, ap->new_len, ap->head_dim};
    const int vn_dims[] = {ap->batch, ap->kv_heads, ap->new_len, ap->value_dim};
    if ((st = check_view(&vs, "k_new", &ap->k_new, kn_dims, 4, elem, 0)) ||
        (st = check_view(&vs, "v_new", &ap->v_new, vn_dims, 4, elem, 0)))
      return st;
  }
  return ca_views_disjoint(&vs);
}

/* The step's cache (k, v and their scales) as the call's outputs when it
 * appends: their records in the forward's views, which read them. */
static int is_cache_view(const char *name) {
  return !strcmp(name, "k") || !strcmp(name, "v") || !strcmp(name, "k_scale") || !strcmp(name, "v_scale");
}

clattn_status ca_validate_kvcache(const clattn_context *ctx, const clattn_kvcache_params *kp, clattn_params *fp,
                                  clattn_append_params *ap, ca_plan *plan) {
  clattn_status st;
  if (!ctx) return BAD("clattn_forward_kvcache: ctx is NULL");
  if (!kp) return BAD("clattn_forward_kvcache: params is NULL");
  const clattn_params *a = &kp->attn;
  if ((st = check_dims(a)) || (st = ca_check_storage(a)) || (st = check_enums(a))) return st;
  if (a->kv_lens)
    return BAD(
        "attn.kv_lens must be NULL: clattn_forward_kvcache derives each row's length (cache_seqlens[b] + "
        "new_len)");
  if (a->cu_seqlens_q || a->cu_seqlens_k)
    return BAD("attn.cu_seqlens_q and attn.cu_seqlens_k must be NULL: a step's batch rows are [batch, q_len]");
  if (!kp->cache_seqlens) return BAD("cache_seqlens is NULL: each batch row's rows in use are required");
  if (kp->new_len < 0) return BAD("new_len must be >= 0 (got %d)", kp->new_len);
  if (kp->new_len > 0 && (!kp->k_new.buf || !kp->v_new.buf))
    return BAD("%s.buf is NULL: new_len %d appends rows of k_new and v_new", !kp->k_new.buf ? "k_new" : "v_new",
               kp->new_len);
  if (kp->new_len == 0 && (kp->k_new.buf || kp->v_new.buf))
    return BAD("%s is set but new_len is 0 (no row to append)", kp->k_new.buf ? "k_new" : "v_new");
  const clattn_dtype kv = ca_k_dtype(a);
  if (ca_v_dtype(a) != kv)
    return BAD("attn.v_dtype %s differs from the k cache's %s: the step appends K and V in one storage",
               ca_dtype_name(ca_v_dtype(a)), ca_dtype_name(kv));
  if (kv > CLATTN_INT8)
    return ca_fail(CLATTN_ERR_UNSUPPORTED,
                   "kv_dtype %s: clattn_forward_kvcache appends to F32, F16, BF16, Q8_0 and INT8 caches (as "
                   "clattn_kv_append)",
                   ca_dtype_name(kv));
  if (kp->cache_batch_idx && a->block_table)
    return BAD("cache_batch_idx with attn.block_table: a paged cache's rows are found through its block table");
  if (kp->num_slots < 0) return BAD("num_slots must be >= 0 (0: batch; got %d)", kp->num_slots);
  if (kp->num_slots > 0 && !kp->cache_batch_idx)
    return BAD("num_slots is %d but cache_batch_idx is NULL", kp->num_slots);
  if (!a->block_table && kp->new_len > a->kv_len)
    return BAD("new_len %d exceeds the cache's capacity of attn.kv_len = %d rows", kp->new_len, a->kv_len);
  const int rotary = kp->rotary_cos.buf || kp->rotary_sin.buf;
  if (rotary) {
    if (!kp->rotary_cos.buf || !kp->rotary_sin.buf)
      return BAD("%s is set but %s is NULL: the rotary tables come together",
                 kp->rotary_cos.buf ? "rotary_cos" : "rotary_sin", kp->rotary_cos.buf ? "rotary_sin" : "rotary_cos");
    if (kp->rotary_dim < 2 || kp->rotary_dim > a->head_dim || kp->rotary_dim % 2)
      return BAD("rotary_dim must be even and in [2, head_dim = %d] (got %d)", a->head_dim, kp->rotary_dim);
    if (kp->rotary_len < a->kv_len)
      return BAD("rotary_len %d: the tables must hold a position for every cache row (attn.kv_len = %d)",
                 kp->rotary_len, a->kv_len);
    if (kp->rotary_interleaved != 0 && kp->rotary_interleaved != 1)
      return BAD("rotary_interleaved must be 0 (GPT-NeoX pairs) or 1 (GPT-J pairs; got %d)", kp->rotary_interleaved);
  } else if (kp->rotary_dim || kp->rotary_len) {
    return BAD("rotary_dim %d, rotary_len %d: set without rotary_cos and rotary_sin", kp->rotary_dim, kp->rotary_len);
  }

  /* The step's own views, named as the caller knows them. */
  ca_views vs;
  ca_views_init(&vs, ctx->context);
  const int b_dims[] = {a->batch};
  const clattn_tensor seqlens = {kp->cache_seqlens, 0, {1, 0, 0, 0}}, idx = {kp->cache_batch_idx, 0, {1, 0, 0, 0}};
  if ((st = check_view(&vs, "cache_seqlens", &seqlens, b_dims, 1, sizeof(int32_t), 0)) ||
      (idx.buf && (st = check_view(&vs, "cache_batch_idx", &idx, b_dims, 1, sizeof(int32_t), 0))))
    return st;
  if (kp->new_len > 0) {
    const size_t elem = ca_unit_bytes(a->dtype);
    const int kn_dims[] = {a->batch, a->kv_heads, kp->new_len, a->head_dim};
    const int vn_dims[] = {a->batch, a->kv_heads, kp->new_len, a->value_dim};
    if ((st = check_view(&vs, "k_new", &kp->k_new, kn_dims, 4, elem, 0)) ||
        (st = check_view(&vs, "v_new", &kp->v_new, vn_dims, 4, elem, 0)))
      return st;
  }
  if (rotary) {
    const int t_dims[] = {kp->rotary_len, kp->rotary_dim / 2};
    const clattn_tensor tables[2] = {
        {kp->rotary_cos.buf, kp->rotary_cos.offset, {kp->rotary_cos.stride[2], kp->rotary_cos.stride[3], 0, 0}},
        {kp->rotary_sin.buf, kp->rotary_sin.offset, {kp->rotary_sin.stride[2], kp->rotary_sin.stride[3], 0, 0}}};
    if ((st = check_view(&vs, "rotary_cos", &tables[0], t_dims, 2, sizeof(float), 0)) ||
        (st = check_view(&vs, "rotary_sin", &tables[1], t_dims, 2, sizeof(float), 0)))
      return st;
  }

  /* The forward after the append, as clattn_forward checks it: cache_seqlens
   * stands in for the derived lengths (int32 [batch] as well), and a
   * contiguous cache seen through cache_batch_idx is a paged one of
   * num_slots pages of kv_len rows (each row then aligned on its length). */
  *fp = *a;
  fp->kv_lens = kp->cache_seqlens;
  if (kp->cache_batch_idx) {
    fp->block_table = kp->cache_batch_idx;
    fp->block_table_stride = 1;
    fp->page_size = a->kv_len;
    fp->num_pages = kp->num_slots > 0 ? kp->num_slots : a->batch;
  }
  ca_views fwd;
  if ((st = validate(ctx, fp, VIEW_OUT, plan, &fwd, 0))) return st;
  /* every view once, under its own name: the stand-ins are the step's own */
  for (int i = 0; i < fwd.n; i++) {
    ca_extent e = fwd.v[i];
    if (!strcmp(e.name, "kv_lens") || (kp->cache_batch_idx && !strcmp(e.name, "block_table"))) continue;
    if (kp->new_len > 0 && is_cache_view(e.name)) e.is_output = 1;
    if (vs.n == CA_MAX_VIEWS)
      return ca_fail(CLATTN_ERR_UNSUPPORTED, "%s: more than %d views in one call", e.name, CA_MAX_VIEWS);
    vs.v[vs.n++] = e;
  }
  if ((st = ca_views_disjoint(&vs))) return st;
  if (kp->new_len == 0) return CLATTN_OK;

  /* The append into the cache: its checks of the cache as an output. */
  *ap = clattn_append_params_default();
  ap->batch = a->batch;
  ap->kv_heads = a->kv_heads;
  ap->new_len = kp->new_len;
  ap->head_dim = a->head_dim;
  ap->value_dim = a->value_dim;
  ap->src_dtype = a->dtype;
  ap->k_new = kp->k_new;
  ap->v_new = kp->v_new;
  ap->positions = kp->cache_seqlens;
  ap->kv_dtype = kv;
  ap->k = a->k;
  ap->v = a->v;
  ap->k_scale = a->k_scale;
  ap->v_scale = a->v_scale;
  ap->block_table = fp->block_table;
  ap->block_table_stride = fp->block_table_stride;
  ap->page_size = fp->page_size;
  ap->num_pages = fp->num_pages;
  ap->capacity = fp->block_table ? 0 : a->kv_len;
  return ca_validate_append(ctx, ap);
}
