/* clattn_forward_kvcache's checks, and what its call means. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "check/check.h"

#define BAD(...) ca_fail(CLATTN_ERR_INVALID_ARGUMENT, __VA_ARGS__)

/* The step's cache (k, v and their scales) as the call's outputs when it
 * appends: their records in the forward's views, which read them. */
static int is_cache_view(const char *name) {
  return !strcmp(name, "k") || !strcmp(name, "v") || !strcmp(name, "k_scale") || !strcmp(name, "v_scale");
}

void ca_kvcache_derive(const clattn_kvcache_params *kp, clattn_params *fp, clattn_append_params *ap) {
  const clattn_params *a = &kp->attn;
  /* the forward after the append: cache_seqlens stands in for the derived
   * lengths (int32 [batch] as well) until the step's own replace them, and
   * a contiguous cache seen through cache_batch_idx is a paged one of
   * num_slots pages of kv_len rows (each row then aligned on its length) */
  *fp = *a;
  fp->kv_lens = kp->cache_seqlens;
  if (kp->cache_batch_idx) {
    fp->block_table = kp->cache_batch_idx;
    fp->block_table_stride = 1;
    fp->page_size = a->kv_len;
    fp->num_pages = kp->num_slots > 0 ? kp->num_slots : a->batch;
  }
  /* the append into the cache, at each row's cache_seqlens */
  memset(ap, 0, sizeof *ap);
  ap->batch = a->batch;
  ap->kv_heads = a->kv_heads;
  ap->new_len = kp->new_len;
  ap->head_dim = a->head_dim;
  ap->value_dim = a->value_dim;
  ap->src_dtype = a->dtype;
  ap->k_new = kp->k_new;
  ap->v_new = kp->v_new;
  ap->positions = kp->cache_seqlens;
  ap->kv_dtype = ca_k_dtype(a);
  ap->k = a->k;
  ap->v = a->v;
  ap->k_scale = a->k_scale;
  ap->v_scale = a->v_scale;
  ap->block_table = fp->block_table;
  ap->block_table_stride = fp->block_table_stride;
  ap->page_size = fp->page_size;
  ap->num_pages = fp->num_pages;
  ap->capacity = a->kv_len; /* paged too: the kernel skips a step's rows past it */
}

clattn_status ca_check_kvcache(const clattn_context *ctx, const clattn_kvcache_params *kp) {
  clattn_status st;
  if (!ctx) return BAD("clattn_forward_kvcache: ctx is NULL");
  if (!kp) return BAD("clattn_forward_kvcache: params is NULL");
  const clattn_params *a = &kp->attn;
  if ((st = ca_check_fields(a))) return st;
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
  if (kp->new_len > a->kv_len && !a->block_table)
    return BAD("new_len %d exceeds the cache's capacity of attn.kv_len = %d rows", kp->new_len, a->kv_len);
  if (kp->new_len > a->kv_len)
    return BAD("new_len %d exceeds attn.kv_len = %d, the most keys a row may have (the block table addresses %lld "
               "rows: block_table_stride %d pages of %d)",
               kp->new_len, a->kv_len, (long long)a->block_table_stride * a->page_size, a->block_table_stride,
               a->page_size);
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
  if ((st = ca_check_view(&vs, "cache_seqlens", &seqlens, b_dims, 1, sizeof(int32_t), 0)) ||
      (idx.buf && (st = ca_check_view(&vs, "cache_batch_idx", &idx, b_dims, 1, sizeof(int32_t), 0))))
    return st;
  if (kp->new_len > 0) {
    const size_t elem = ca_unit_bytes(a->dtype);
    const int kn_dims[] = {a->batch, a->kv_heads, kp->new_len, a->head_dim};
    const int vn_dims[] = {a->batch, a->kv_heads, kp->new_len, a->value_dim};
    if ((st = ca_check_view(&vs, "k_new", &kp->k_new, kn_dims, 4, elem, 0)) ||
        (st = ca_check_view(&vs, "v_new", &kp->v_new, vn_dims, 4, elem, 0)))
      return st;
  }
  if (rotary) {
    const int t_dims[] = {kp->rotary_len, kp->rotary_dim / 2};
    const clattn_tensor tables[2] = {
        {kp->rotary_cos.buf, kp->rotary_cos.offset, {kp->rotary_cos.stride[2], kp->rotary_cos.stride[3], 0, 0}},
        {kp->rotary_sin.buf, kp->rotary_sin.offset, {kp->rotary_sin.stride[2], kp->rotary_sin.stride[3], 0, 0}}};
    if ((st = ca_check_view(&vs, "rotary_cos", &tables[0], t_dims, 2, sizeof(float), 0)) ||
        (st = ca_check_view(&vs, "rotary_sin", &tables[1], t_dims, 2, sizeof(float), 0)))
      return st;
  }

  /* The forward after the append, as clattn_forward checks it. */
  clattn_params fp;
  clattn_append_params ap;
  ca_kvcache_derive(kp, &fp, &ap);
  ca_views fwd;
  if ((st = ca_check_forward_views(ctx, &fp, &fwd))) return st;
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
  /* The append into the cache: its checks of the cache as an output. */
  if (kp->new_len > 0 && (st = ca_check_append(ctx, &ap))) return st;
  /* The rows, where the host knows the lengths. */
  return kp->host_seqlens ? ca_check_kvcache_rows(kp, kp->host_seqlens) : CLATTN_OK;
}

clattn_status ca_check_kvcache_rows(const clattn_kvcache_params *kp, const cl_int *seqlens) {
  const clattn_params *a = &kp->attn;
  const long long capacity =
      a->block_table ? (long long)a->block_table_stride * a->page_size : (long long)a->kv_len;
  /* the positions a row rotates: its new keys', and its queries' (one
   * position, or one per query row under causal or a window) */
  const int q_span = a->causal || a->window_left >= 0 || a->window_right >= 0 ? a->q_len : 1;
  const int span = kp->new_len > q_span ? kp->new_len : q_span;
  for (int b = 0; b < a->batch; b++) {
    const long long at = seqlens[b], end = at + kp->new_len;
    if (at < 0) return BAD("cache_seqlens[%d] = %lld: a row's length is never negative", b, at);
    if (kp->new_len > 0 && end > capacity) {
      if (a->block_table)
        return BAD("cache_seqlens[%d] = %lld plus new_len = %d rows ends at row %lld, past the block table's "
                   "capacity of %lld rows (block_table_stride %d pages of %d rows per sequence)",
                   b, at, kp->new_len, end, capacity, a->block_table_stride, a->page_size);
      return BAD("cache_seqlens[%d] = %lld plus new_len = %d rows ends at row %lld, past the cache's capacity of "
                 "%lld rows (attn.kv_len%s)",
                 b, at, kp->new_len, end, capacity, kp->cache_batch_idx ? " per slot" : "");
    }
    if (end > a->kv_len)
      return BAD("cache_seqlens[%d] = %lld plus new_len = %d: the row's %lld keys pass attn.kv_len = %d, the most "
                 "keys a row may have",
                 b, at, kp->new_len, end, a->kv_len);
    const long long last = at + span - 1;
    if (kp->rotary_cos.buf && last >= kp->rotary_len)
      return BAD("rotary_len %d: cache_seqlens[%d] = %lld puts a row at position %lld, past the rotary tables",
                 kp->rotary_len, b, at, last);
  }
  return CLATTN_OK;
}
