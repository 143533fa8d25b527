/*
 * Plans (clattn_plan_*): a forward call checked and planned once, then
 * enqueued per step with only what the step changes.
 *
 * Creation runs clattn_forward's checks and planning (ca_validate,
 * ca_plan_fused) and records what a step's changes are checked against
 * without OpenCL queries: the sizes of the q, out and lse buffers and every
 * view's bytes (ca_views: a step moving q, out or lse is checked against
 * the aliasing rule again). A FUSED plan then owns its kernel objects
 * (flash_pack, the planned kernel, merge_states), its scratch (packed K/V
 * for the planned kv_len, partial states for the most splits any shorter
 * length can take) and its empty-row flag, with every argument set. A
 * step patches the arguments that differ from the kernels' (kv_len, n_pad,
 * split_keys, the merge's state count, the q, out and lse offsets),
 * re-planning the key split only when kv_len changed (ca_fused_lengths,
 * the same pure function clattn_forward uses, so the splits and the
 * results are the same), and enqueues the kernels chained by events, or
 * replays them from a command buffer (command_buffer.c). A STAGED or GEMM
 * plan keeps the checked params and runs the path per step, its chunks
 * re-planned for the step's kv_len.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "command_buffer.h"
#include "internal.h"

#define BAD(...) ca_fail(CLATTN_ERR_INVALID_ARGUMENT, __VA_ARGS__)

/* A view a step may move: its buffer's size and the bytes it spans from its
 * first element. */
typedef struct {
  size_t size, span, elem;
} movable;

/* What a step sets: kv_len and the offsets of q, out and lse. */
typedef struct {
  int kv_len;
  size_t q_off, out_off, lse_off;
} step_values;

enum { PLAN_MEMS = 24 };

struct clattn_plan {
  clattn_context *ctx;
  pthread_mutex_t lock; /* a fused plan's kernels, geometry and last event */
  clattn_params p;      /* as planned */
  ca_plan plan;
  cl_mem mems[PLAN_MEMS]; /* the caller's, retained */
  int n_mems;
  movable q, out, lse;
  ca_views views; /* every view's bytes, as planned */
  int fused;
  /* a fused plan's own objects, and the values its kernels hold */
  ca_fused_launch launch;
  cl_kernel pack, rows, merge;
  cl_mem kt, vp, part_o, part_lse, flag;
  ca_fused_slots rows_at, pack_at;
  ca_merge_slots merge_at;
  size_t merge_global[3];
  int kv_len, stale; /* stale: an argument may differ from these values (a failed patch) */
  size_t q_off, out_off, lse_off;
  cl_event last;        /* out-of-order queues: the previous step's last command */
  char route[2][96];     /* unsplit, split */
  ca_command_buffer *cb; /* command-buffer replay, or NULL */
  step_values cb_at;     /* the values its commands hold */
  long replays;          /* steps the command buffer ran (ca_plan_replays) */
  long updates;          /* of those, steps that updated its commands in place (ca_plan_updates) */
};

clattn_step clattn_step_default(void) {
  return (clattn_step){0, CLATTN_STEP_PLANNED, CLATTN_STEP_PLANNED, CLATTN_STEP_PLANNED};
}

/* ---------- what a step is checked against ---------- */

/* Bytes from a view's first element to the end of its last (validated at
 * creation: no overflow). */
static size_t view_span(const clattn_tensor *t, const int *dims, int rank, size_t elem) {
  size_t last = 0;
  for (int d = 0; d < rank; d++) last += (size_t)(dims[d] - 1) * t->stride[d];
  return (last + 1) * elem;
}

static clattn_status mem_size(cl_mem m, const char *name, size_t *size) {
  ca_mem_facts f;
  if (ca_mem_facts_cached(m, &f)) { /* as validation just learnt it */
    *size = f.size;
    return CLATTN_OK;
  }
  cl_int err = clGetMemObjectInfo(m, CL_MEM_SIZE, sizeof *size, size, NULL);
  if (err == CL_SUCCESS) return CLATTN_OK;
  char what[64];
  snprintf(what, sizeof what, "clGetMemObjectInfo(%s.buf, CL_MEM_SIZE)", name);
  return ca_cl_fail(err, what);
}

/* Records the movable views' buffer sizes and spans. */
static clattn_status record_views(clattn_plan *pl) {
  const clattn_params *p = &pl->p;
  const int varlen = p->cu_seqlens_q != NULL, qb = varlen ? 1 : p->batch, rows = varlen ? p->total_q : p->q_len;
  const size_t elem = p->dtype == CLATTN_F32 ? sizeof(float) : 2;
  const int q_dims[] = {qb, p->q_heads, rows, p->head_dim}, o_dims[] = {qb, p->q_heads, rows, p->value_dim};
  const int row_dims[] = {p->batch, p->q_heads, p->q_len};
  clattn_status st;
  pl->q = (movable){0, view_span(&p->q, q_dims, 4, elem), elem};
  pl->out = (movable){0, view_span(&p->out, o_dims, 4, elem), elem};
  if ((st = mem_size(p->q.buf, "q", &pl->q.size)) || (st = mem_size(p->out.buf, "out", &pl->out.size))) return st;
  if (p->lse.buf) {
    pl->lse = (movable){0, view_span(&p->lse, row_dims, 3, sizeof(float)), sizeof(float)};
    if ((st = mem_size(p->lse.buf, "lse", &pl->lse.size))) return st;
  }
  return CLATTN_OK;
}

/* The caller's buffers stay alive with the plan: its kernels hold them. */
static clattn_status retain_mems(clattn_plan *pl) {
  const clattn_params *p = &pl->p;
  const cl_mem all[] = {p->q.buf,        p->k.buf,          p->v.buf,          p->out.buf,        p->mask.buf,
                        p->bias.buf,     p->lse.buf,        p->weights.buf,    p->entropy.buf,    p->max_weight.buf,
                        p->argmax.buf,   p->kv_lens,        p->alibi_slopes,   p->sinks,          p->additive_w,
                        p->cu_seqlens_q, p->cu_seqlens_k,   p->k_scale.buf,    p->v_scale.buf,    p->block_table,
                        p->bias_scale,   p->cache_leftpad};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
    if (!all[i]) continue;
    cl_int err = clRetainMemObject(all[i]);
    if (err != CL_SUCCESS) return ca_cl_fail(err, "clRetainMemObject(a view of the plan)");
    pl->mems[pl->n_mems++] = all[i];
  }
  return CLATTN_OK;
}

/* ---------- a step ---------- */

static clattn_status check_offset(const char *field, const char *view, const movable *m, size_t offset) {
  if (offset > SIZE_MAX / m->elem || offset * m->elem > SIZE_MAX - m->span)
    return BAD("step.%s %zu: the %s view's offset overflows the address range", field, offset, view);
  const size_t need = offset * m->elem + m->span;
  if (need > m->size)
    return ca_fail(CLATTN_ERR_BUFFER_TOO_SMALL, "step.%s %zu: the %s view addresses %zu bytes but %s.buf holds %zu",
                   field, offset, view, need, view, m->size);
  return CLATTN_OK;
}

/* The views, with q, out and lse where the step puts them, must still
 * keep the aliasing rule; the refusal names the step's fields. */
static clattn_status check_moved_views(const clattn_plan *pl, const step_values *v, const char *fields) {
  ca_views moved = pl->views;
  ca_views_move(&moved, "q", v->q_off * pl->q.elem);
  ca_views_move(&moved, "out", v->out_off * pl->out.elem);
  if (pl->p.lse.buf) ca_views_move(&moved, "lse", v->lse_off * pl->lse.elem);
  const clattn_status st = ca_views_disjoint(&moved);
  if (st == CLATTN_OK) return st;
  char why[512];
  snprintf(why, sizeof why, "%s", clattn_last_error(pl->ctx));
  return ca_fail(st, "%s: %s", fields, why);
}

/* The step's values, every change checked (no OpenCL query). */
static clattn_status resolve_step(const clattn_plan *pl, const clattn_step *s, step_values *v) {
  const clattn_params *p = &pl->p;
  *v = (step_values){p->kv_len, p->q.offset, p->out.offset, p->lse.offset};
  if (!s) return CLATTN_OK;
  clattn_status st;
  if (s->kv_len < 0) return BAD("step.kv_len must be positive, or 0 for the planned %d (got %d)", p->kv_len, s->kv_len);
  if (s->kv_len > p->kv_len)
    return BAD("step.kv_len %d exceeds the plan's kv_len %d (a plan's kv_len is the most keys a step may use)",
               s->kv_len, p->kv_len);
  if (s->kv_len) v->kv_len = s->kv_len;
  const int q_moved = s->q_offset != CLATTN_STEP_PLANNED, out_moved = s->out_offset != CLATTN_STEP_PLANNED,
            lse_moved = s->lse_offset != CLATTN_STEP_PLANNED;
  if (q_moved) {
    if ((st = check_offset("q_offset", "q", &pl->q, s->q_offset))) return st;
    v->q_off = s->q_offset;
  }
  if (out_moved) {
    if ((st = check_offset("out_offset", "out", &pl->out, s->out_offset))) return st;
    v->out_off = s->out_offset;
  }
  if (lse_moved) {
    if (!p->lse.buf) return BAD("step.lse_offset is %zu but the plan has no lse view", s->lse_offset);
    if ((st = check_offset("lse_offset", "lse", &pl->lse, s->lse_offset))) return st;
    v->lse_off = s->lse_offset;
  }
  if (!q_moved && !out_moved && !lse_moved) return CLATTN_OK;
  char fields[64];
  snprintf(fields, sizeof fields, "%s%s%s%s%s", q_moved ? "step.q_offset" : "",
           q_moved && (out_moved || lse_moved) ? " / " : "", out_moved ? "step.out_offset" : "",
           out_moved && lse_moved ? " / " : "", lse_moved ? "step.lse_offset" : "");
  return check_moved_views(pl, v, fields);
}

/* ---------- a fused plan ---------- */

static clattn_status own_buffer(clattn_context *ctx, size_t bytes, const void *init, const char *what, cl_mem *out) {
  cl_int err = CL_SUCCESS;
  *out = clCreateBuffer(ctx->context, CL_MEM_READ_WRITE | (init ? CL_MEM_COPY_HOST_PTR : 0), bytes ? bytes : 1,
                        (void *)init, &err);
  if (err == CL_SUCCESS) return CLATTN_OK;
  *out = NULL;
  char msg[96];
  snprintf(msg, sizeof msg, "clCreateBuffer(plan: %s)", what);
  return ca_cl_fail(err, msg);
}

static clattn_status set_int(cl_kernel k, cl_uint at, int v, const char *name) {
  cl_int err = clSetKernelArg(k, at, sizeof v, &v);
  return err == CL_SUCCESS ? CLATTN_OK : ca_args_done(&(ca_args){k, name, at + 1, at, err, NULL});
}

static clattn_status set_ulong(cl_kernel k, cl_uint at, cl_ulong v, const char *name) {
  cl_int err = clSetKernelArg(k, at, sizeof v, &v);
  return err == CL_SUCCESS ? CLATTN_OK : ca_args_done(&(ca_args){k, name, at + 1, at, err, NULL});
}

/* Sets the arguments that follow the step's values where they differ from
 * what the kernels hold. */
static clattn_status patch(clattn_plan *pl, const step_values *v) {
  ca_fused_launch *l = &pl->launch;
  clattn_status st = CLATTN_OK;
  const int all = pl->stale;
  pl->stale = 1; /* until every patch went in */
  if (all || v->kv_len != pl->kv_len) {
    ca_fused_lengths(pl->ctx, l, v->kv_len);
    if ((st = set_int(pl->rows, pl->rows_at.kv_len, v->kv_len, l->kernel)) ||
        (st = set_int(pl->rows, pl->rows_at.split_keys, l->splits.split_keys, l->kernel)) ||
        (l->packed && ((st = set_ulong(pl->rows, pl->rows_at.n_pad, (cl_ulong)l->n_pad, l->kernel)) ||
                       (st = set_int(pl->pack, pl->pack_at.kv_len, v->kv_len, "flash_pack")) ||
                       (st = set_ulong(pl->pack, pl->pack_at.n_pad, (cl_ulong)l->n_pad, "flash_pack")))) ||
        (pl->merge && (st = set_int(pl->merge, pl->merge_at.n_states, (int)l->splits.n_splits, "merge_states"))))
      return st;
    pl->kv_len = v->kv_len;
  }
  if (all || v->q_off != pl->q_off) {
    if ((st = set_ulong(pl->rows, pl->rows_at.q_off, v->q_off, l->kernel))) return st;
    pl->q_off = v->q_off;
  }
  if (all || v->out_off != pl->out_off) { /* the kernel writes out unsplit, the merge split */
    if ((st = set_ulong(pl->rows, pl->rows_at.out_off, v->out_off, l->kernel)) ||
        (pl->merge && (st = set_ulong(pl->merge, pl->merge_at.out_off, v->out_off, "merge_states"))))
      return st;
    pl->out_off = v->out_off;
  }
  if (pl->p.lse.buf && (all || v->lse_off != pl->lse_off)) {
    if ((st = set_ulong(pl->rows, pl->rows_at.lse_off, v->lse_off, l->kernel)) ||
        (pl->merge && (st = set_ulong(pl->merge, pl->merge_at.lse_off, v->lse_off, "merge_states"))))
      return st;
    pl->lse_off = v->lse_off;
  }
  pl->stale = 0;
  return CLATTN_OK;
}

/* The step's launches as the kernels stand: flash_pack when packing, the
 * planned kernel, merge_states when the keys are split. */
static int launches_now(const clattn_plan *pl, ca_launch *out) {
  const ca_fused_launch *l = &pl->launch;
  int n = 0;
  if (pl->pack) out[n++] = (ca_launch){pl->pack, "flash_pack", 2, {(size_t)l->n_pad, l->kv_pairs, 1}, NULL};
  out[n++] = (ca_launch){pl->rows, l->kernel, 3, {l->global[0], l->global[1], l->global[2]}, l->local};
  if (l->splits.n_splits > 1)
    out[n++] = (ca_launch){
        pl->merge, "merge_states", 3, {pl->merge_global[0], pl->merge_global[1], pl->merge_global[2]}, NULL};
  return n;
}

static int same_values(const step_values *a, const step_values *b) {
  return a->kv_len == b->kv_len && a->q_off == b->q_off && a->out_off == b->out_off && a->lse_off == b->lse_off;
}

/* The command buffer's arguments that differ from the kernels' (it holds
 * pl->cb_at; now: its launches as the kernels stand). */
static int cb_updates(const clattn_plan *pl, int n, ca_arg_update *u) {
  const ca_fused_launch *l = &pl->launch;
  const step_values *at = &pl->cb_at;
  const int pack = pl->pack ? 0 : -1, rows = pack + 1, merge = n > rows + 1 ? rows + 1 : -1;
  int k = 0;
#define INT_ARG(launch, index, v)                   \
  u[k++] = (ca_arg_update) {                        \
    (launch), (index), sizeof(cl_int), { .i = (v) } \
  }
#define LONG_ARG(launch, index, v)                    \
  u[k++] = (ca_arg_update) {                          \
    (launch), (index), sizeof(cl_ulong), { .u = (v) } \
  }
  if (pl->kv_len != at->kv_len) {
    INT_ARG(rows, pl->rows_at.kv_len, pl->kv_len);
    INT_ARG(rows, pl->rows_at.split_keys, l->splits.split_keys);
    if (pack >= 0) {
      LONG_ARG(rows, pl->rows_at.n_pad, (cl_ulong)l->n_pad);
      INT_ARG(pack, pl->pack_at.kv_len, pl->kv_len);
      LONG_ARG(pack, pl->pack_at.n_pad, (cl_ulong)l->n_pad);
    }
    if (merge >= 0) INT_ARG(merge, pl->merge_at.n_states, (int)l->splits.n_splits);
  }
  if (pl->q_off != at->q_off) LONG_ARG(rows, pl->rows_at.q_off, pl->q_off);
  if (pl->out_off != at->out_off) {
    LONG_ARG(rows, pl->rows_at.out_off, pl->out_off);
    if (merge >= 0) LONG_ARG(merge, pl->merge_at.out_off, pl->out_off);
  }
  if (pl->lse_off != at->lse_off) {
    LONG_ARG(rows, pl->rows_at.lse_off, pl->lse_off);
    if (merge >= 0) LONG_ARG(merge, pl->merge_at.lse_off, pl->lse_off);
  }
#undef INT_ARG
#undef LONG_ARG
  return k;
}

/* Replays the command buffer for the step when it can hold the kernels as
 * they stand: as recorded, or updated in place (mutable dispatch; recorded
 * anew when the launches themselves changed: keys split or not). *used 0:
 * the plain path's turn. */
static clattn_status replay(clattn_plan *pl, const ca_launch *now, int n, cl_uint n_wait, const cl_event *wait,
                            cl_event *last, int *used) {
  const step_values cur = {pl->kv_len, pl->q_off, pl->out_off, pl->lse_off};
  const ca_launch *rec;
  const int n_rec = ca_command_buffer_launches(pl->cb, &rec);
  int same_kernels = n_rec == n, same_grids = 1;
  for (int i = 0; same_kernels && i < n; i++) {
    same_kernels = rec[i].kernel == now[i].kernel;
    same_grids &= memcmp(rec[i].global, now[i].global, sizeof now[i].global) == 0;
  }
  clattn_status st = CLATTN_OK;
  int updated = 0;
  *used = 0;
  if (!same_kernels || !same_grids || !same_values(&cur, &pl->cb_at)) {
    if (!ca_command_buffer_mutable(pl->cb)) return CLATTN_OK;
    if (!same_kernels) {
      ca_command_buffer_release(pl->cb);
      pl->cb = NULL;
      if ((st = ca_command_buffer_record(pl->ctx, now, n, &pl->cb)) || !pl->cb) return st;
    } else {
      ca_arg_update u[CA_CB_LAUNCHES * CA_CB_ARGS];
      if ((st = ca_command_buffer_update(pl->cb, u, cb_updates(pl, n, u), now))) return st;
      updated = 1;
    }
    pl->cb_at = cur;
  }
  *used = 1;
  pl->replays++;
  pl->updates += updated;
  return ca_command_buffer_enqueue(pl->cb, n_wait, wait, last);
}

static clattn_status fused_init(clattn_plan *pl) {
  clattn_context *ctx = pl->ctx;
  const clattn_params *p = &pl->p;
  ca_fused_launch *l = &pl->launch;
  clattn_status st;
  if ((st = ca_plan_fused(ctx, p, &pl->plan, l)) || (st = ca_create_kernel(l->program, l->kernel, &pl->rows)))
    return st;
  size_t scratch = sizeof(cl_int);
  if (l->packed) {
    if ((st = ca_create_kernel(l->program, "flash_pack", &pl->pack)) ||
        (st = own_buffer(ctx, (size_t)l->kt_bytes, NULL, "fused packed keys", &pl->kt)) ||
        (st = own_buffer(ctx, (size_t)l->vp_bytes, NULL, "fused packed values", &pl->vp)))
      return st;
    scratch += (size_t)(l->kt_bytes + l->vp_bytes);
  }
  /* partial states for the most splits a step's kv_len can take */
  const size_t splits = l->unsplit ? 1 : ca_plan_splits_bound(&ctx->caps, l->group_items, p->kv_len);
  const size_t rows_total = (size_t)p->batch * (size_t)p->q_heads * (size_t)p->q_len;
  if (splits > 1) {
    const cl_ulong o_bytes = (cl_ulong)splits * rows_total * (cl_ulong)p->value_dim * sizeof(float);
    if (o_bytes > ctx->max_alloc)
      return ca_fail(CLATTN_ERR_OUT_OF_MEMORY,
                     "plan: partial states of %zu key splits (%llu bytes) exceed the device's largest allocation",
                     splits, (unsigned long long)o_bytes);
    cl_program core = NULL;
    if ((st = ca_core_program(ctx, p->dtype, &core)) || (st = ca_create_kernel(core, "merge_states", &pl->merge)) ||
        (st = own_buffer(ctx, (size_t)o_bytes, NULL, "split-KV partial outputs", &pl->part_o)) ||
        (st = own_buffer(ctx, splits * rows_total * sizeof(float), NULL, "split-KV partial lse", &pl->part_lse)))
      return st;
    scratch += splits * rows_total * ((size_t)p->value_dim + 1) * sizeof(float);
  }
  static const cl_int zero = 0;
  if ((st = own_buffer(ctx, sizeof zero, &zero, "empty-row flag", &pl->flag))) return st;
  ca_note_scratch(ctx, scratch);

  ca_args r = {pl->rows, l->kernel, 0, 0, CL_SUCCESS, NULL};
  ca_arg_fused(&r, p, &pl->plan, pl->kt, pl->vp, l->n_pad, l->splits.split_keys, pl->plan.diag, pl->part_o,
               pl->part_lse, pl->flag, &pl->rows_at);
  if ((st = ca_args_done(&r))) return st;
  if (pl->pack) {
    ca_args a = {pl->pack, "flash_pack", 0, 0, CL_SUCCESS, NULL};
    ca_arg_pack(&a, p, l->n_pad, pl->kt, pl->vp, &pl->pack_at);
    if ((st = ca_args_done(&a))) return st;
  }
  if (pl->merge) {
    const clattn_merge_params mp = ca_split_merge_params(p, l->splits.n_splits, pl->part_o, pl->part_lse);
    ca_args m = {pl->merge, "merge_states", 0, 0, CL_SUCCESS, NULL};
    ca_arg_merge(&m, &mp, p->sinks, p->sinks_offset, pl->flag, &pl->merge_at);
    if ((st = ca_args_done(&m))) return st;
    ca_merge_global(&mp, pl->merge_global);
  }
  pl->kv_len = p->kv_len;
  pl->q_off = p->q.offset;
  pl->out_off = p->out.offset;
  pl->lse_off = p->lse.offset;
  for (int split = 0; split < 2; split++)
    snprintf(pl->route[split], sizeof pl->route[split], "fused: %s%s%s", l->packed ? "flash_pack, " : "", l->kernel,
             split ? ", merge_states" : "");
  ca_launch now[CA_CB_LAUNCHES];
  pl->cb_at = (step_values){pl->kv_len, pl->q_off, pl->out_off, pl->lse_off};
  return ca_command_buffer_record(ctx, now, launches_now(pl, now), &pl->cb);
}

/* Enqueues the step's kernels after the n_wait events (and, on an
 * out-of-order queue, the plan's last step); *last: the step's last event. */
static clattn_status fused_enqueue(clattn_plan *pl, cl_uint n_wait, const cl_event *wait, cl_event *last) {
  const ca_fused_launch *l = &pl->launch;
  clattn_context *ctx = pl->ctx;
  cl_event local[8], *list = local, prev = NULL;
  cl_uint n = n_wait;
  if (ctx->out_of_order && pl->last) { /* its scratch is this step's */
    if (n_wait + 1 > sizeof local / sizeof local[0] && !(list = malloc((n_wait + 1) * sizeof *list)))
      return ca_fail(CLATTN_ERR_OUT_OF_MEMORY, "clattn_plan_enqueue: out of host memory");
    if (n_wait) memcpy(list, wait, n_wait * sizeof *list);
    list[n++] = pl->last;
    wait = list;
  }
  clattn_status st = CLATTN_OK;
  ca_launch now[CA_CB_LAUNCHES];
  const int n_now = launches_now(pl, now);
  int replayed = 0;
  if (pl->cb) st = replay(pl, now, n_now, n, n ? wait : NULL, &prev, &replayed);
  for (int i = 0; i < n_now && st == CLATTN_OK && !replayed; i++) {
    cl_event ev = NULL;
    cl_int err =
        clEnqueueNDRangeKernel(ctx->queue, now[i].kernel, now[i].dims, NULL, now[i].global, now[i].local, prev ? 1 : n,
                               prev ? &prev
                               : n  ? wait
                                    : NULL,
                               &ev);
    if (err != CL_SUCCESS) {
      char what[96];
      snprintf(what, sizeof what, "clEnqueueNDRangeKernel(%s)", now[i].name);
      st = ca_cl_fail(err, what);
    } else {
      if (prev) clReleaseEvent(prev);
      prev = ev;
    }
  }
  if (list != local) free(list);
  ca_route_set(pl->route[l->splits.n_splits > 1]);
  *last = prev;
  return st;
}

/* EMPTY_ERROR: the flag after the step; raised, it is zeroed after last
 * (*last becomes the zeroing) and the step returns CLATTN_ERR_EMPTY_ROW. */
static clattn_status read_flag(clattn_plan *pl, cl_event *last) {
  static const cl_int zero = 0; /* static: the non-blocking write may read it after this returns */
  cl_int raised = 0;
  cl_int err = clEnqueueReadBuffer(pl->ctx->queue, pl->flag, CL_TRUE, 0, sizeof raised, &raised, *last ? 1 : 0,
                                   *last ? last : NULL, NULL);
  if (err != CL_SUCCESS) return ca_cl_fail(err, "clEnqueueReadBuffer(empty-row flag)");
  if (!raised) return CLATTN_OK;
  cl_event zeroed = NULL;
  err = clEnqueueWriteBuffer(pl->ctx->queue, pl->flag, CL_FALSE, 0, sizeof zero, &zero, 1, last, &zeroed);
  if (err != CL_SUCCESS) return ca_cl_fail(err, "clEnqueueWriteBuffer(zeroing an empty-row flag)");
  clReleaseEvent(*last);
  *last = zeroed;
  return ca_fail(CLATTN_ERR_EMPTY_ROW, "a query row had no allowed key (empty_rows = CLATTN_EMPTY_ERROR)");
}

static clattn_status fused_step(clattn_plan *pl, const step_values *v, cl_uint n_wait, const cl_event *wait,
                                cl_event *done) {
  cl_event last = NULL;
  pthread_mutex_lock(&pl->lock);
  clattn_status st = patch(pl, v);
  if (st == CLATTN_OK) st = fused_enqueue(pl, n_wait, wait, &last);
  if (st == CLATTN_OK && pl->p.empty_rows == CLATTN_EMPTY_ERROR) st = read_flag(pl, &last);
  if (last && pl->ctx->out_of_order) {      /* whatever went in, the next step waits for it */
    const cl_int err = clRetainEvent(last); /* one reference for the plan, one for *done */
    if (pl->last) clReleaseEvent(pl->last);
    pl->last = last;
    if (err != CL_SUCCESS) {
      if (st == CLATTN_OK) st = ca_cl_fail(err, "clRetainEvent(a plan step's last event)");
      last = NULL;
    }
  }
  pthread_mutex_unlock(&pl->lock);
  ca_hand_out(st, &last, done);
  return st;
}

/* ---------- a staged or GEMM plan: the path, without the checks ---------- */

static clattn_status path_step(clattn_plan *pl, const step_values *v, cl_uint n_wait, const cl_event *wait,
                               cl_event *done) {
  clattn_params p = pl->p;
  p.kv_len = v->kv_len;
  p.q.offset = v->q_off;
  p.out.offset = v->out_off;
  p.lse.offset = v->lse_off;
  ca_plan plan = pl->plan;
  plan.chunk = ca_plan_chunks(&p, pl->ctx->scratch_budget);
  ca_route_begin(clattn_algo_name(plan.algo));
  return plan.algo == CLATTN_ALGO_GEMM ? ca_gemm_forward(pl->ctx, &p, &plan, n_wait, wait, done)
                                       : ca_staged_forward(pl->ctx, &p, &plan, n_wait, wait, done);
}

/* ---------- the public functions ---------- */

clattn_status clattn_plan_create(clattn_context *ctx, const clattn_params *p, clattn_plan **out) {
  if (!out) return BAD("clattn_plan_create: out is NULL");
  *out = NULL;
  if (!ctx) return BAD("clattn_plan_create: ctx is NULL");
  if (!p) return BAD("clattn_plan_create: params is NULL");
  clattn_plan *pl = calloc(1, sizeof *pl);
  if (!pl) return ca_fail(CLATTN_ERR_OUT_OF_MEMORY, "clattn_plan_create: out of host memory");
  pthread_mutex_init(&pl->lock, NULL);
  pl->ctx = ctx;
  pl->p = *p;
  cl_program core = NULL;
  clattn_status st = ca_validate_views(ctx, p, &pl->plan, &pl->views);
  if (st == CLATTN_OK) st = retain_mems(pl);
  if (st == CLATTN_OK) st = ca_dropout_take(ctx, p, &pl->plan.dropout);
  if (st == CLATTN_OK) st = record_views(pl);
  if (st == CLATTN_OK && (pl->fused = pl->plan.algo == CLATTN_ALGO_FUSED))
    st = fused_init(pl);
  else if (st == CLATTN_OK && pl->plan.algo == CLATTN_ALGO_GEMM && !ca_gemm_available())
    st = ca_fail(CLATTN_ERR_UNSUPPORTED, "algo GEMM: this build has no CLBlast (-Dclblast)");
  else if (st == CLATTN_OK) /* built now, not at the first step */
    st = ca_core_program_kv(ctx, p->dtype, pl->plan.k_dtype, pl->plan.v_dtype, &core);
  if (st != CLATTN_OK) {
    clattn_plan_release(pl);
    return st;
  }
  *out = pl;
  return CLATTN_OK;
}

clattn_status clattn_plan_enqueue(clattn_plan *plan, const clattn_step *step, cl_uint n_wait, const cl_event *wait,
                                  cl_event *done) {
  if (done) *done = NULL;
  if (!plan) return BAD("clattn_plan_enqueue: plan is NULL");
  if (n_wait > 0 && !wait) return BAD("clattn_plan_enqueue: n_wait is %u but wait is NULL", n_wait);
  step_values v;
  clattn_status st = resolve_step(plan, step, &v);
  if (st != CLATTN_OK) return st;
  return plan->fused ? fused_step(plan, &v, n_wait, wait, done) : path_step(plan, &v, n_wait, wait, done);
}

int ca_plan_launches(clattn_plan *plan, ca_launch *out) {
  pthread_mutex_lock(&plan->lock);
  const int n = plan->fused ? launches_now(plan, out) : 0;
  pthread_mutex_unlock(&plan->lock);
  return n;
}

long ca_plan_replays(clattn_plan *plan) {
  pthread_mutex_lock(&plan->lock);
  const long n = plan->replays;
  pthread_mutex_unlock(&plan->lock);
  return n;
}

long ca_plan_updates(clattn_plan *plan) {
  pthread_mutex_lock(&plan->lock);
  const long n = plan->updates;
  pthread_mutex_unlock(&plan->lock);
  return n;
}

void clattn_plan_release(clattn_plan *plan) {
  if (!plan) return;
  ca_command_buffer_release(plan->cb);
  const cl_kernel kernels[] = {plan->pack, plan->rows, plan->merge};
  for (size_t i = 0; i < sizeof kernels / sizeof kernels[0]; i++)
    if (kernels[i]) clReleaseKernel(kernels[i]);
  const cl_mem own[] = {plan->kt, plan->vp, plan->part_o, plan->part_lse, plan->flag, plan->plan.dropout};
  for (size_t i = 0; i < sizeof own / sizeof own[0]; i++)
    if (own[i]) clReleaseMemObject(own[i]);
  for (int i = 0; i < plan->n_mems; i++) clReleaseMemObject(plan->mems[i]);
  if (plan->last) clReleaseEvent(plan->last);
  pthread_mutex_destroy(&plan->lock);
  free(plan);
}
