/* clattn_kv_append's plan: kv_append for the K half, then the V half
 * (cl/append.cl), quantising into the cache's storage on the way. */
#include <string.h>

#include "plan/fill.h"

/* One kv_append launch: the K or the V half of the call. */
static void half(ca_list *l, cl_program program, const clattn_append_params *ap, const clattn_tensor *src,
                 const clattn_tensor *dst, const clattn_tensor *scale, int cols, int capacity,
                 const ca_step_lengths *lengths) {
  const int paged = ap->block_table != NULL;
  ca_args_kv_append a;
  ca_bufs_kv_append b;
  memset(&a, 0, sizeof a);
  memset(&b, 0, sizeof b);
  CA_FILL_VIEW(b, a, src, src);
  CA_FILL_VIEW(b, a, dst, dst);
  CA_FILL_VIEW(b, a, scale, scale);
  b.positions = ca_mem(ap->positions);
  b.block_table = ca_mem(ap->block_table);
  a.bt_stride = paged ? ap->block_table_stride : 0;
  a.page_size = paged ? ap->page_size : 1;
  a.num_pages = paged ? ap->num_pages : 0;
  a.paged = paged;
  a.capacity = capacity;
  a.kv_heads = ap->kv_heads;
  a.new_len = ap->new_len;
  a.cols = cols;
  if (lengths) {
    b.leftpad = lengths->leftpad;
    b.lens = lengths->lens;
    b.starts = lengths->starts;
  }
  const size_t global[2] = {(size_t)ap->new_len, (size_t)ap->batch * (size_t)ap->kv_heads};
  ca_list_kernel(l, program, "kv_append", 2, global, NULL);
  CA_LIST_ARGS(l, kv_append, b, a);
}

clattn_status ca_plan_append(clattn_context *ctx, const clattn_append_params *ap, const ca_step_lengths *lengths,
                             ca_list *l) {
  if (ap->new_len == 0) return CLATTN_OK; /* a no-op: the executor still orders it after the caller's events */
  ca_program program;
  const ca_program_key key = ca_append_key(ap->src_dtype, ap->kv_dtype);
  clattn_status st = ca_program_get(ctx, &key, &program);
  if (st != CLATTN_OK) return st;
  /* rows past it skipped: a contiguous cache's, and a step's (attn.kv_len, paged too) */
  const int capacity = ap->block_table && !lengths ? 0 : ap->capacity;
  half(l, program.program, ap, &ap->k_new, &ap->k, &ap->k_scale, ap->head_dim, capacity, lengths);
  half(l, program.program, ap, &ap->v_new, &ap->v, &ap->v_scale, ap->value_dim, capacity, NULL);
  return l->error;
}
