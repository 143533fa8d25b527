/* clattn_kv_append's checks. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "check/check.h"

#define BAD(...) ca_fail(CLATTN_ERR_INVALID_ARGUMENT, __VA_ARGS__)

clattn_status ca_check_append(const clattn_context *ctx, const clattn_append_params *ap) {
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
    const long long addressed = (long long)ap->block_table_stride * ap->page_size;
    if (ap->block_table_stride > 0 && ap->page_size > 0 && ap->new_len > addressed)
      return BAD("new_len %d exceeds the block table's capacity of %lld rows (block_table_stride %d pages of %d)",
                 ap->new_len, addressed, ap->block_table_stride, ap->page_size);
    if ((st = ca_check_block_table(&vs, ap->block_table, ap->batch, ap->block_table_stride, ap->page_size, ap->num_pages,
                                ap->new_len)))
      return st;
  } else {
    if (ap->capacity <= 0) return BAD("capacity must be positive for a contiguous cache (got %d)", ap->capacity);
    if (ap->new_len > ap->capacity)
      return BAD("new_len %d exceeds the cache's capacity of %d rows", ap->new_len, ap->capacity);
  }
  const clattn_tensor pos = {ap->positions, 0, {1, 0, 0, 0}};
  const int b_dims[] = {ap->batch};
  if ((st = ca_check_view(&vs, "positions", &pos, b_dims, 1, sizeof(int32_t), 0))) return st;
  const int slots = paged ? ap->num_pages : ap->batch, rows = paged ? ap->page_size : ap->capacity;
  const int k_dims[] = {slots, ap->kv_heads, rows, ap->head_dim};
  const int v_dims[] = {slots, ap->kv_heads, rows, ap->value_dim};
  if ((st = ca_check_kv_view(&vs, "k", &ap->k, k_dims, kv, 1)) || (st = ca_check_kv_view(&vs, "v", &ap->v, v_dims, kv, 1)) ||
      (st = ca_check_kv_scales(&vs, kv, kv, &ap->k_scale, &ap->v_scale, slots, ap->kv_heads, rows, 1)))
    return st;
  if (ap->new_len > 0) {
    const size_t elem = ap->src_dtype == CLATTN_F32 ? sizeof(float) : 2;
    const int kn_dims[] = {ap->batch, ap->kv_heads, ap->new_len, ap->head_dim};
    const int vn_dims[] = {ap->batch, ap->kv_heads, ap->new_len, ap->value_dim};
    if ((st = ca_check_view(&vs, "k_new", &ap->k_new, kn_dims, 4, elem, 0)) ||
        (st = ca_check_view(&vs, "v_new", &ap->v_new, vn_dims, 4, elem, 0)))
      return st;
  }
  return ca_views_disjoint(&vs);
}

