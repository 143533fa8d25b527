/*
 * The check layer: every check on a call that needs no device work. Each
 * reads the call and says yes, or no with a message naming the field
 * (INVALID_ARGUMENT, BUFFER_TOO_SMALL, UNSUPPORTED); none decides how the
 * call runs (that is the planner's). Views are checked against their
 * buffers (views.c, mem_facts.c) and against each other (alias.c).
 */
#ifndef CLATTN_CHECK_H
#define CLATTN_CHECK_H

#include "device/device.h"

/* a * b and a + b into *out; 0 on overflow. */
static inline int ca_mul_ok(size_t a, size_t b, size_t *out) {
  if (a != 0 && b > SIZE_MAX / a) return 0;
  *out = a * b;
  return 1;
}
static inline int ca_add_ok(size_t a, size_t b, size_t *out) {
  if (b > SIZE_MAX - a) return 0;
  *out = a + b;
  return 1;
}

/* ---- which views of a call share bytes (alias.c) ---- */

/* The bytes one view reaches: count[d] elements step[d] bytes apart in each
 * dimension that moves (longer than 1, stride not 0), elem bytes each, from
 * byte `first` of its cl_mem; end: one past its last byte. space and base
 * place its cl_mem's bytes among other cl_mems' (views.c's locate). */
typedef struct {
  const char *name;
  int is_output;
  cl_mem buf;
  const void *space;
  size_t base, first, end, elem;
  int rank;
  size_t count[5], step[5];
} ca_extent;

enum { CA_MAX_VIEWS = 32 }; /* a backward call checks at most 26 */

/* The views of one call, recorded as they are checked. */
typedef struct {
  cl_context context; /* the clattn context's: every view's cl_mem must belong to it */
  int n;
  ca_extent v[CA_MAX_VIEWS];
} ca_views;

/* The space of buffers over host memory (CL_MEM_USE_HOST_PTR): their
 * bytes lie among the host's, at their host addresses. */
extern const char ca_host_memory;
void ca_views_init(ca_views *vs, cl_context context);
/* Records view t of dims[0..rank) (checked: it fits its buffer, end bytes
 * from the start) whose cl_mem's bytes lie at base in space. */
clattn_status ca_views_add(ca_views *vs, const char *name, const clattn_tensor *t, const int *dims, int rank,
                           size_t elem, int is_output, const void *space, size_t base, size_t end);
/* Makes the last view recorded the last of n copies, step bytes apart
 * (merge's states). */
void ca_views_repeat_last(ca_views *vs, size_t n, size_t step);
/* Moves view `name` (when recorded) to start at byte `first` of its cl_mem
 * (a plan's step moving q, out or lse). */
void ca_views_move(ca_views *vs, const char *name, size_t first);
/* INVALID_ARGUMENT naming both when an output shares a byte with another
 * view of the call (clattn.h, clattn_tensor). */
clattn_status ca_views_disjoint(const ca_views *vs);

/* ---- what validation learns of a caller's cl_mem (mem_facts.c) ---- */

/* CL_MEM_SIZE, CL_MEM_TYPE, CL_MEM_CONTEXT, CL_MEM_FLAGS and where the bytes lie
 * (CL_MEM_ASSOCIATED_MEMOBJECT, CL_MEM_OFFSET, CL_MEM_HOST_PTR): fixed for a
 * cl_mem's life. */
typedef struct {
  size_t size;
  cl_mem_object_type type;
  cl_context context;
  cl_mem_flags flags;
  const void *space; /* and where its bytes lie among other cl_mems' (views.c's locate) */
  size_t base;
} ca_mem_facts;
/* 1 with m's facts when kept (m alive since), else 0. */
int ca_mem_facts_cached(cl_mem m, ca_mem_facts *out);
/* Keeps m's facts until the runtime deletes m (a destructor callback); not
 * kept when the callback cannot be registered. */
void ca_mem_facts_keep(cl_mem m, const ca_mem_facts *facts);
/* Whether m's facts are kept: m cannot be deleted, and its handle name
 * another cl_mem, without ca_mem_facts_forgets() counting it. */
int ca_mem_facts_tracked(cl_mem m);
/* How many kept facts were forgotten so far (cl_mems deleted). */
unsigned long ca_mem_facts_forgets(void);

/* ---- views (views.c) ---- */

/* A view's role: read, written, or read but shaped like an output (each
 * element its own: no broadcast, no overlap), as clattn_backward reads the
 * forward's out and lse. */
enum { CA_VIEW_IN = 0, CA_VIEW_OUT = 1, CA_VIEW_READ_WHOLE = 2 };
/* The bytes a view of dims[0..rank) addresses from its buffer's start
 * (offset + sum (dim-1)*stride + 1 elements): 0 when that overflows. */
int ca_view_bytes(const clattn_tensor *t, const int *dims, int rank, size_t elem_size, size_t *bytes);
/* Checks that a view of dims[0..rank) fits its buffer (and, unless an
 * input, neither broadcasts nor overlaps itself): BAD / BUFFER_TOO_SMALL;
 * records it in vs. */
clattn_status ca_check_view(ca_views *vs, const char *name, const clattn_tensor *t, const int *dims, int rank,
                            size_t elem_size, int role);
/* A K or V view (or a cache clattn_kv_append writes) in storage dtype,
 * dims[3] elements per row; a block type's view as the bytes it addresses. */
clattn_status ca_check_kv_view(ca_views *vs, const char *name, const clattn_tensor *t, const int *dims,
                               clattn_dtype dtype, int is_output);
/* The INT8 scales of the K/V views (k_scale with an INT8 k, v_scale with an
 * INT8 v). slots = dimension 0 of the views (batch, or pages), rows =
 * dimension 2 (keys, or rows per page). */
clattn_status ca_check_kv_scales(ca_views *vs, clattn_dtype k_dtype, clattn_dtype v_dtype,
                                 const clattn_tensor *k_scale, const clattn_tensor *v_scale, int slots, int kv_heads,
                                 int rows, int is_output);
/* A block table of batch rows of `stride` entries, enough for rows_needed
 * keys in pages of page_size. */
clattn_status ca_check_block_table(ca_views *vs, cl_mem table, int batch, int stride, int page_size, int num_pages,
                                   long long rows_needed);

/* ---- the calls' checks ---- */

/* The fields that decide which programs a call builds: dtype, kv_dtype,
 * v_dtype, head_dim, value_dim (their ranges; the block types' blocks of
 * 32). clattn_forward and clattn_prepare both check them here. */
clattn_status ca_check_storage(const clattn_params *p);
/* The storage of k (kv_dtype, SAME = dtype) and of v (v_dtype, SAME = k's). */
clattn_dtype ca_k_dtype(const clattn_params *p);
clattn_dtype ca_v_dtype(const clattn_params *p);

/* A forward call's scalar fields: dimensions, storage, enums and ranges
 * (forward.c). */
clattn_status ca_check_fields(const clattn_params *p);
/* clattn_forward's checks but the aliasing rule, whose caller checks it
 * with views of its own added (forward_kvcache). */
clattn_status ca_check_forward_views(const clattn_context *ctx, const clattn_params *p, ca_views *views);
/* clattn_forward's checks (forward.c): fields, every view against its
 * buffer, the aliasing rule. views (NULL: not kept) gets the call's views,
 * which a plan's steps check again when they move q, out or lse. */
clattn_status ca_check_forward(const clattn_context *ctx, const clattn_params *p, ca_views *views);
/* The forward's checks on a call clattn_backward reads: out and lse read
 * whole (a buffer created CL_MEM_READ_ONLY will do, each element its own),
 * the views left in *views for the gradients' to join, whose caller checks
 * the aliasing rule. */
clattn_status ca_check_forward_read(const clattn_context *ctx, const clattn_params *p, ca_views *views);
/* clattn_backward's (backward.c): the forward's call, and the gradients'. */
clattn_status ca_check_backward(const clattn_context *ctx, const clattn_backward_params *bp);

/* A block mask (clattn.h's clattn_block_mask_create): its classes (device
 * uchar [batch][heads][q_blocks][kv_blocks], common.h.cl's CA_BM_*), the
 * geometry it was made for, and the mask modifier and captures it holds
 * for (a call must give the same). */
struct clattn_block_mask {
  cl_mem classes;
  int batch, heads, q_len, kv_len, block_q, block_k, q_blocks, kv_blocks;
  unsigned char mask_hash[16];
  cl_mem captures[4];
  float capture_f[4];
  int capture_i[4];
  size_t counts[3]; /* empty, partial, full */
};
/* A call's modifiers, captures and block mask (modifier.c). */
clattn_status ca_check_modifiers(ca_views *vs, const clattn_params *p);
/* The backward's: a score modifier has its derivative (UNSUPPORTED). */
clattn_status ca_check_score_mod_grad(const clattn_params *p);
/* clattn_kv_append's (append.c). */
clattn_status ca_check_append(const clattn_context *ctx, const clattn_append_params *ap);
/* clattn_merge_states' (merge.c). */
clattn_status ca_check_merge(const clattn_context *ctx, const clattn_merge_params *mp);
/* What a clattn_forward_kvcache call means (kvcache.c): the forward over
 * the cache after the append (attn with a block table standing for
 * cache_batch_idx, kv_lens standing for the lengths the step computes) and
 * the append (*ap; new_len 0: none). A pure function of kp. */
void ca_kvcache_derive(const clattn_kvcache_params *kp, clattn_params *fp, clattn_append_params *ap);
/* clattn_forward_kvcache's: the forward's and the append's checks on what
 * it means, the step's own, the aliasing rule with the cache an output
 * when it appends, and with kp->host_seqlens the rows (below). */
clattn_status ca_check_kvcache(const clattn_context *ctx, const clattn_kvcache_params *kp);
/* The step's rows as seqlens (cache_seqlens' values on the host) place
 * them: every new row inside its cache (a paged row's table, a slot's or a
 * contiguous cache's attn.kv_len rows), every row's keys at most
 * attn.kv_len, every rotated position inside the rotary tables. */
clattn_status ca_check_kvcache_rows(const clattn_kvcache_params *kp, const cl_int *seqlens);

#endif
