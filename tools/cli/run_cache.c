/* `clattn run --paged / --kv-dtype`: the problem's keys and values moved
 * into a K/V cache as an inference engine keeps it (see run_cache.h). */
#include "run_cache.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int fail(char *err, size_t n, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, n, fmt, ap);
  va_end(ap);
  return -1;
}

/* Bytes of one element (Q8_0: of one 32-element block, 34). */
static size_t elem_bytes(clattn_dtype t) {
  return t == CLATTN_F32 ? 4 : t == CLATTN_F16 || t == CLATTN_BF16 ? 2 : t == CLATTN_INT8 ? 1 : 34;
}

/* Bytes of a row of `cols` elements in storage t. */
static size_t row_bytes(clattn_dtype t, int cols) {
  return t == CLATTN_Q8_0 ? (size_t)cols / 32 * 34 : (size_t)cols * elem_bytes(t);
}

/* A dense [slots, heads, rows, cols] cache view; strides count elements,
 * or bytes for Q8_0 and INT8 (one-byte elements). */
static clattn_tensor cache_view(cl_mem buf, clattn_dtype t, int heads, int rows, int cols) {
  const size_t unit = t == CLATTN_Q8_0 ? 1 : elem_bytes(t);
  const size_t row = row_bytes(t, cols) / unit;
  return (clattn_tensor){buf, 0, {(size_t)heads * rows * row, (size_t)rows * row, row, t == CLATTN_Q8_0 ? 34 : 1}};
}

/* Element c of a cache row read back from the device, as the kernels
 * dequantise it (f32 arithmetic: the f16 scale times the int8). */
static float dequant(clattn_dtype t, const unsigned char *row, int c, float scale) {
  float f;
  uint16_t h;
  switch (t) {
    case CLATTN_F32: memcpy(&f, row + 4 * (size_t)c, 4); return f;
    case CLATTN_F16: memcpy(&h, row + 2 * (size_t)c, 2); return cp_f16_value(h);
    case CLATTN_BF16: memcpy(&h, row + 2 * (size_t)c, 2); return cp_bf16_value(h);
    case CLATTN_INT8: return scale * (float)(int8_t)row[c];
    default: {
      const unsigned char *blk = row + (size_t)(c / 32) * 34;
      memcpy(&h, blk, 2);
      return cp_f16_value(h) * (float)(int8_t)blk[2 + c % 32];
    }
  }
}

static cl_mem new_buffer(cl_context cl, size_t bytes, void *host, rc_cache *c, char *err, size_t n) {
  cl_int e = CL_SUCCESS;
  cl_mem m = clCreateBuffer(cl, CL_MEM_READ_WRITE | (host ? CL_MEM_COPY_HOST_PTR : 0), bytes ? bytes : 1, host, &e);
  if (e != CL_SUCCESS) {
    fail(err, n, "clCreateBuffer(%zu bytes): %s (%d)", bytes, cp_cl_error_name(e), e);
    return NULL;
  }
  c->bufs[c->n_bufs++] = m;
  return m;
}

static int read_back(cl_command_queue q, cl_mem m, size_t bytes, unsigned char **out, char *err, size_t n) {
  *out = malloc(bytes ? bytes : 1);
  if (!*out) return fail(err, n, "out of host memory (%zu bytes)", bytes);
  cl_int e = clEnqueueReadBuffer(q, m, CL_TRUE, 0, bytes, *out, 0, NULL, NULL);
  return e == CL_SUCCESS ? 0 : fail(err, n, "clEnqueueReadBuffer(cache): %s (%d)", cp_cl_error_name(e), e);
}

int rc_use_cache(cp_problem *pb, clattn_context *ctx, int page_size, clattn_dtype kv_dtype, rc_cache *c, char *err,
                 size_t n) {
  memset(c, 0, sizeof *c);
  clattn_params *p = &pb->params;
  const cp_shape *s = &pb->shape;
  const clattn_dtype kv = kv_dtype == CLATTN_DTYPE_SAME ? p->dtype : kv_dtype;
  const int paged = page_size > 0, B = p->batch, H = p->kv_heads, N = p->kv_len;
  if (paged && (s->varlen || s->kv_lens))
    return fail(err, n,
                "--paged: a paged cache aligns each row on its own length; use it without --varlen and "
                "--kv-lens (every sequence here holds kv_len keys)");
  const int per_seq = paged ? (N + page_size - 1) / page_size : 1;
  const int slots = paged ? B * per_seq : B, rows = paged ? page_size : N;
  const size_t k_bytes = (size_t)slots * H * rows * row_bytes(kv, p->head_dim);
  const size_t v_bytes = (size_t)slots * H * rows * row_bytes(kv, p->value_dim);
  const size_t scale_bytes = (size_t)slots * H * rows * sizeof(float);
  cl_context cl = clattn_cl_context(ctx);
  cl_command_queue q = clattn_cl_queue(ctx);
  if (kv == CLATTN_Q8_0 && (p->head_dim % 32 || p->value_dim % 32))
    return fail(err, n,
                "--kv-dtype q8_0 stores rows in blocks of 32: head and value dims must be multiples of 32 "
                "(got %d, %d)",
                p->head_dim, p->value_dim);

  /* Pages handed out in reverse order, so no sequence's pages are in order. */
  int32_t *table = NULL, *positions = calloc((size_t)B, sizeof *positions);
  if (!positions) return fail(err, n, "out of host memory");
  if (paged) {
    table = malloc((size_t)B * per_seq * sizeof *table);
    if (!table) return free(positions), fail(err, n, "out of host memory");
    for (int i = 0; i < B * per_seq; i++) table[i] = B * per_seq - 1 - i;
  }
  clattn_append_params ap = clattn_append_params_default();
  ap.batch = B, ap.kv_heads = H, ap.new_len = N, ap.head_dim = p->head_dim, ap.value_dim = p->value_dim;
  ap.src_dtype = p->dtype, ap.k_new = p->k, ap.v_new = p->v, ap.kv_dtype = kv;
  int rc = -1;
  cl_mem kc, vc, ks = NULL, vs = NULL, tb = NULL, pos;
  if (!(kc = new_buffer(cl, k_bytes, NULL, c, err, n)) || !(vc = new_buffer(cl, v_bytes, NULL, c, err, n)) ||
      !(pos = new_buffer(cl, (size_t)B * sizeof *positions, positions, c, err, n)))
    goto done;
  if (kv == CLATTN_INT8 &&
      (!(ks = new_buffer(cl, scale_bytes, NULL, c, err, n)) || !(vs = new_buffer(cl, scale_bytes, NULL, c, err, n))))
    goto done;
  if (paged && !(tb = new_buffer(cl, (size_t)B * per_seq * sizeof *table, table, c, err, n))) goto done;
  ap.positions = pos;
  ap.k = cache_view(kc, kv, H, rows, p->head_dim);
  ap.v = cache_view(vc, kv, H, rows, p->value_dim);
  if (ks) {
    ap.k_scale = (clattn_tensor){ks, 0, {(size_t)H * rows, (size_t)rows, 1, 0}};
    ap.v_scale = (clattn_tensor){vs, 0, {(size_t)H * rows, (size_t)rows, 1, 0}};
  }
  if (paged)
    ap.block_table = tb, ap.block_table_stride = per_seq, ap.page_size = page_size, ap.num_pages = slots;
  else
    ap.capacity = N;
  clattn_status st = clattn_kv_append(ctx, &ap, 0, NULL, NULL);
  if (st != CLATTN_OK) {
    fail(err, n, "clattn_kv_append: %s: %s", clattn_status_string(st), clattn_last_error(ctx));
    goto done;
  }

  /* The values the kernels will read, into the host arrays the reference reads. */
  unsigned char *kh = NULL, *vh = NULL, *ksh = NULL, *vsh = NULL;
  if (read_back(q, kc, k_bytes, &kh, err, n) == 0 && read_back(q, vc, v_bytes, &vh, err, n) == 0 &&
      (!ks || (read_back(q, ks, scale_bytes, &ksh, err, n) == 0 && read_back(q, vs, scale_bytes, &vsh, err, n) == 0))) {
    for (int b = 0; b < B; b++)
      for (int h = 0; h < H; h++)
        for (int j = 0; j < N; j++) {
          const int slot = paged ? table[b * per_seq + j / page_size] : b, row = paged ? j % page_size : j;
          const size_t at = ((size_t)slot * H + h) * rows + row;
          float ksc = 1.0f, vsc = 1.0f;
          if (ksh) memcpy(&ksc, ksh + at * 4, 4), memcpy(&vsc, vsh + at * 4, 4);
          for (int d = 0; d < p->head_dim; d++)
            pb->k[cp_index(&p->k, b, h, j, d)] = dequant(kv, kh + at * row_bytes(kv, p->head_dim), d, ksc);
          for (int d = 0; d < p->value_dim; d++)
            pb->v[cp_index(&p->v, b, h, j, d)] = dequant(kv, vh + at * row_bytes(kv, p->value_dim), d, vsc);
        }
    rc = 0;
  }
  free(kh), free(vh), free(ksh), free(vsh);
  /* The reference of the cached values, over the problem's own views (the
   * kit keeps it: ref_valid), before the call is pointed at the cache. */
  pb->ref_valid = 0;
  if (rc == 0 && cp_reference(pb) != 0) rc = fail(err, n, "%s", pb->err);
  if (rc) goto done;

  /* The forward call reads the cache; a paged one needs every row's length. */
  p->k = ap.k, p->v = ap.v, p->k_scale = ap.k_scale, p->v_scale = ap.v_scale, p->kv_dtype = kv;
  if (paged) {
    for (int b = 0; b < B; b++) positions[b] = N;
    if (!(p->kv_lens = new_buffer(cl, (size_t)B * sizeof *positions, positions, c, err, n))) {
      rc = -1;
      goto done;
    }
    p->block_table = tb, p->block_table_stride = per_seq, p->page_size = page_size, p->num_pages = slots;
  }
  c->bytes_per_token = (double)(k_bytes + v_bytes + (ks ? 2 * scale_bytes : 0)) / ((double)slots * rows);
done:
  free(table);
  free(positions);
  return rc;
}

void rc_free(rc_cache *c) {
  for (int i = 0; i < c->n_bufs; i++) clReleaseMemObject(c->bufs[i]);
  c->n_bufs = 0;
}
