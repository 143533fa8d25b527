/*
 * Plans (clattn_plan_*): a forward call checked and planned once, then
 * enqueued per step with only what the step changes.
 *
 * Creation runs clattn_forward's checks and its planner (for a plan's
 * steps: scratch for any kv_len up to the planned one), binds the list's
 * resources (run/bound.c: scratch, flag, a kernel object per launch with
 * every argument set) and keeps what a step's changes are checked against
 * without OpenCL queries: the sizes of the q, out and lse buffers and every
 * view's bytes (a step moving q, out or lse is checked against the
 * aliasing rule again). A step takes the planner's list for its values (the
 * planner clattn_forward runs, so the launches and results are the same):
 * the last step's list as it is when nothing moved, with the new kv_len
 * written at the list's step sites when the planner said the list holds
 * for it, else planned again. The executor sets only the arguments that
 * differ from what the bound kernels hold (after a patch: the sites'), or
 * replays a command buffer. The caller's buffers are retained while the
 * plan lives.
 *
 * A kvcache plan (clattn_plan_create_kvcache) is a clattn_forward_kvcache
 * step the same way: its steps change buffer contents only (the lengths
 * are device values), each checked against step.host_seqlens when given.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/api.h"

#define BAD(...) ca_fail(CLATTN_ERR_INVALID_ARGUMENT, __VA_ARGS__)

/* A view a step may move: its buffer's size and the bytes it spans from its
 * first element. */
typedef struct {
  size_t size, span, elem;
} movable;

enum { PLAN_MEMS = 32 };

struct clattn_plan {
  clattn_context *ctx;
  pthread_mutex_t lock; /* one step at a time: the list, the bound resources */
  clattn_params p;      /* as planned (a kvcache plan's: kp.attn) */
  int kvcache;          /* a clattn_forward_kvcache step, as kp says */
  clattn_kvcache_params kp;
  cl_mem mems[PLAN_MEMS]; /* the caller's, retained */
  int n_mems;
  movable q, out, lse;
  ca_views views; /* every view's bytes, as planned */
  ca_list list;   /* the last step's launches */
  int listed;     /* list is the planner's for `at` */
  long patches;   /* steps that took the list without planning */
  struct {
    int kv_len;
    size_t q, out, lse;
  } at; /* the step values list was planned for (a kvcache plan: fixed) */
  ca_bound *bound;
  char description[1024];
};

/* ---------- what a step is checked against ---------- */

/* Bytes from a view's first element to the end of its last (checked at
 * creation: no overflow). */
static size_t view_span(const clattn_tensor *t, const int *dims, int rank, size_t elem) {
  size_t last = 0;
  for (int d = 0; d < rank; d++) last += (size_t)(dims[d] - 1) * t->stride[d];
  return (last + 1) * elem;
}

static clattn_status mem_size(cl_mem m, const char *name, size_t *size) {
  ca_mem_facts f;
  if (ca_mem_facts_cached(m, &f)) { /* as the check just learnt it */
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
  const size_t elem = ca_unit_bytes(p->dtype);
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
  const clattn_kvcache_params *kp = &pl->kp; /* all NULL in a forward plan */
  const cl_mem all[] = {p->q.buf,           p->k.buf,          p->v.buf,          p->out.buf,
                        p->mask.buf,        p->bias.buf,       p->lse.buf,        p->weights.buf,
                        p->entropy.buf,     p->max_weight.buf, p->argmax.buf,     p->kv_lens,
                        p->alibi_slopes,    p->sinks,          p->additive_w,     p->cu_seqlens_q,
                        p->cu_seqlens_k,    p->k_scale.buf,    p->v_scale.buf,    p->block_table,
                        p->bias_scale,      p->cache_leftpad,  kp->cache_seqlens, kp->k_new.buf,
                        kp->v_new.buf,      kp->cache_batch_idx, kp->rotary_cos.buf, kp->rotary_sin.buf};
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
static clattn_status check_moved_views(const clattn_plan *pl, const clattn_params *p, const char *fields) {
  ca_views moved = pl->views;
  ca_views_move(&moved, "q", p->q.offset * pl->q.elem);
  ca_views_move(&moved, "out", p->out.offset * pl->out.elem);
  if (p->lse.buf) ca_views_move(&moved, "lse", p->lse.offset * pl->lse.elem);
  const clattn_status st = ca_views_disjoint(&moved);
  if (st == CLATTN_OK) return st;
  char why[512];
  snprintf(why, sizeof why, "%s", clattn_last_error(pl->ctx));
  return ca_fail(st, "%s: %s", fields, why);
}

/* The call as the step changes it, every change checked (no OpenCL query). */
static clattn_status step_params(const clattn_plan *pl, const clattn_step *s, clattn_params *p) {
  *p = pl->p;
  if (!s) return CLATTN_OK;
  clattn_status st;
  if (s->kv_len < 0)
    return BAD("step.kv_len must be positive, or 0 for the planned %d (got %d)", pl->p.kv_len, s->kv_len);
  if (s->kv_len > pl->p.kv_len)
    return BAD("step.kv_len %d exceeds the plan's kv_len %d (a plan's kv_len is the most keys a step may use)",
               s->kv_len, pl->p.kv_len);
  if (s->kv_len) p->kv_len = s->kv_len;
  const int q_moved = s->q_offset != CLATTN_STEP_PLANNED, out_moved = s->out_offset != CLATTN_STEP_PLANNED,
            lse_moved = s->lse_offset != CLATTN_STEP_PLANNED;
  if (q_moved) {
    if ((st = check_offset("q_offset", "q", &pl->q, s->q_offset))) return st;
    p->q.offset = s->q_offset;
  }
  if (out_moved) {
    if ((st = check_offset("out_offset", "out", &pl->out, s->out_offset))) return st;
    p->out.offset = s->out_offset;
  }
  if (lse_moved) {
    if (!pl->p.lse.buf) return BAD("step.lse_offset is %zu but the plan has no lse view", s->lse_offset);
    if ((st = check_offset("lse_offset", "lse", &pl->lse, s->lse_offset))) return st;
    p->lse.offset = s->lse_offset;
  }
  if (!q_moved && !out_moved && !lse_moved) return CLATTN_OK;
  char fields[64];
  snprintf(fields, sizeof fields, "%s%s%s%s%s", q_moved ? "step.q_offset" : "",
           q_moved && (out_moved || lse_moved) ? " / " : "", out_moved ? "step.out_offset" : "",
           out_moved && lse_moved ? " / " : "", lse_moved ? "step.lse_offset" : "");
  return check_moved_views(pl, p, fields);
}

/* A kvcache plan's step: buffer contents alone change; the lengths the
 * host gives are checked as clattn_forward_kvcache checks them. */
static clattn_status check_kvcache_step(const clattn_plan *pl, const clattn_step *s) {
  if (!s) return CLATTN_OK;
  if (s->kv_len != 0)
    return BAD("step.kv_len %d: a kvcache plan's keys are cache_seqlens' (device values); leave it 0", s->kv_len);
  const struct {
    const char *field;
    size_t value;
  } offsets[] = {{"q_offset", s->q_offset}, {"out_offset", s->out_offset}, {"lse_offset", s->lse_offset}};
  for (int i = 0; i < 3; i++)
    if (offsets[i].value != CLATTN_STEP_PLANNED)
      return BAD("step.%s %zu: a kvcache plan's views stay where planned (CLATTN_STEP_PLANNED)", offsets[i].field,
                 offsets[i].value);
  return s->host_seqlens ? ca_check_kvcache_rows(&pl->kp, s->host_seqlens) : CLATTN_OK;
}

/* ---------- the step's list ---------- */

/* The planner's list for step values p, noted as the list's. */
static clattn_status plan_list(clattn_plan *pl, const clattn_params *p) {
  ca_list_reset(&pl->list, "plan");
  const clattn_status st =
      pl->kvcache ? ca_plan_kvcache(pl->ctx, &pl->kp, &pl->list) : ca_plan_forward(pl->ctx, p, &pl->list);
  pl->listed = st == CLATTN_OK;
  pl->at.kv_len = p->kv_len;
  pl->at.q = p->q.offset;
  pl->at.out = p->out.offset;
  pl->at.lse = p->lse.offset;
  return st;
}

/* Whether the list is the planner's for step s as it stands (a kvcache
 * plan's always is), or once s's kv_len is written at its step sites: the
 * views where the list has them (checked when it was planned) and a kv_len
 * the plan takes. */
static int list_holds(clattn_plan *pl, const clattn_step *s) {
  if (!pl->listed) return 0;
  if (pl->kvcache) return 1;
  const clattn_params *p = &pl->p;
  if (!s)
    return pl->at.kv_len == p->kv_len && pl->at.q == p->q.offset && pl->at.out == p->out.offset &&
           pl->at.lse == p->lse.offset;
  const int kv_len = s->kv_len ? s->kv_len : p->kv_len;
  if (kv_len < 0 || kv_len > p->kv_len || (s->lse_offset != CLATTN_STEP_PLANNED && !p->lse.buf)) return 0;
  if ((s->q_offset == CLATTN_STEP_PLANNED ? p->q.offset : s->q_offset) != pl->at.q ||
      (s->out_offset == CLATTN_STEP_PLANNED ? p->out.offset : s->out_offset) != pl->at.out ||
      (s->lse_offset == CLATTN_STEP_PLANNED ? p->lse.offset : s->lse_offset) != pl->at.lse)
    return 0;
  if (kv_len == pl->at.kv_len) return 1;
  if (!ca_list_step_patch(&pl->list, kv_len)) return 0;
  pl->at.kv_len = kv_len;
  return 1;
}

/* ---------- the public functions ---------- */

/* A new plan of ctx, its list made for steps. */
static clattn_plan *plan_new(clattn_context *ctx) {
  clattn_plan *pl = calloc(1, sizeof *pl);
  if (!pl) return NULL;
  pthread_mutex_init(&pl->lock, NULL);
  pl->ctx = ctx;
  ca_list_init(&pl->list, "plan");
  return pl;
}

/* The list planned once, its resources bound: the plan made, or released. */
static clattn_status plan_finish(clattn_plan *pl, clattn_status st, clattn_plan **out) {
  pl->list.steps_kv_len = pl->p.kv_len > 0 ? pl->p.kv_len : 1;
  if (st == CLATTN_OK) st = plan_list(pl, &pl->p);
  if (st == CLATTN_OK) st = ca_bind(pl->ctx, &pl->list, &pl->bound);
  if (st != CLATTN_OK) {
    clattn_plan_release(pl);
    return st;
  }
  *out = pl;
  return CLATTN_OK;
}

clattn_status clattn_plan_create(clattn_context *ctx, const clattn_params *p, clattn_plan **out) {
  if (!out) return BAD("clattn_plan_create: out is NULL");
  *out = NULL;
  if (!ctx) return BAD("clattn_plan_create: ctx is NULL");
  if (!p) return BAD("clattn_plan_create: params is NULL");
  clattn_params own;
  clattn_status st = ca_params_in(p, &own, "params");
  if (st != CLATTN_OK) return st;
  clattn_plan *pl = plan_new(ctx);
  if (!pl) return ca_fail(CLATTN_ERR_OUT_OF_MEMORY, "clattn_plan_create: out of host memory");
  pl->p = own;
  st = ca_check_forward(ctx, &pl->p, &pl->views);
  if (st == CLATTN_OK) st = retain_mems(pl);
  if (st == CLATTN_OK) st = record_views(pl);
  return plan_finish(pl, st, out);
}

clattn_status clattn_plan_create_kvcache(clattn_context *ctx, const clattn_kvcache_params *kp, clattn_plan **out) {
  if (!out) return BAD("clattn_plan_create_kvcache: out is NULL");
  *out = NULL;
  if (!ctx) return BAD("clattn_plan_create_kvcache: ctx is NULL");
  if (!kp) return BAD("clattn_plan_create_kvcache: params is NULL");
  clattn_kvcache_params own;
  clattn_status st = ca_kvcache_params_in(kp, &own);
  if (st == CLATTN_OK) st = ca_check_kvcache(ctx, &own);
  if (st != CLATTN_OK) return st;
  clattn_plan *pl = plan_new(ctx);
  if (!pl) return ca_fail(CLATTN_ERR_OUT_OF_MEMORY, "clattn_plan_create_kvcache: out of host memory");
  own.host_seqlens = NULL; /* the caller's, read at creation only: each step gives its own */
  pl->kvcache = 1;
  pl->kp = own;
  pl->p = own.attn;
  return plan_finish(pl, retain_mems(pl), out);
}

clattn_status clattn_plan_enqueue(clattn_plan *plan, const clattn_step *step, cl_uint n_wait, const cl_event *wait,
                                  cl_event *done) {
  if (done) *done = NULL;
  if (!plan) return BAD("clattn_plan_enqueue: plan is NULL");
  if (n_wait > 0 && !wait) return BAD("clattn_plan_enqueue: n_wait is %u but wait is NULL", n_wait);
  clattn_step own;
  clattn_status st = step ? ca_step_in(step, &own) : CLATTN_OK;
  const clattn_step *s = step ? &own : NULL;
  if (st == CLATTN_OK && plan->kvcache) st = check_kvcache_step(plan, s);
  if (st != CLATTN_OK) return st;
  pthread_mutex_lock(&plan->lock);
  const int planned = !list_holds(plan, s);
  plan->patches += !planned;
  if (planned) { /* the step checked and planned */
    clattn_params p;
    st = plan->kvcache ? CLATTN_OK : step_params(plan, s, &p);
    if (st == CLATTN_OK) st = plan_list(plan, plan->kvcache ? &plan->p : &p);
  }
  if (st == CLATTN_OK) st = ca_run_bound(plan->bound, &plan->list, planned, n_wait, wait, done);
  pthread_mutex_unlock(&plan->lock);
  return st;
}

int clattn_plan_launches(clattn_plan *plan, clattn_launch *out, int max) {
  if (!plan || (max > 0 && !out)) return -1;
  ca_kernel_launch k[CA_PLAN_LAUNCHES_MAX];
  pthread_mutex_lock(&plan->lock);
  const int n = ca_bound_launches(plan->bound, &plan->list, k, CA_PLAN_LAUNCHES_MAX);
  pthread_mutex_unlock(&plan->lock);
  for (int i = 0; i < n && i < max && i < CA_PLAN_LAUNCHES_MAX; i++) {
    out[i] = (clattn_launch){k[i].kernel, k[i].name, k[i].dims, {k[i].global[0], k[i].global[1], k[i].global[2]},
                             {1, 1, 1}, k[i].local != NULL};
    for (cl_uint d = 0; k[i].local && d < k[i].dims; d++) out[i].local[d] = k[i].local[d];
  }
  return n;
}

const char *clattn_plan_describe(clattn_plan *plan) {
  if (!plan) return "";
  pthread_mutex_lock(&plan->lock);
  ca_describe_list(&plan->list, plan->description, sizeof plan->description);
  pthread_mutex_unlock(&plan->lock);
  return plan->description;
}

long ca_plan_replays(clattn_plan *plan) {
  pthread_mutex_lock(&plan->lock);
  const long n = ca_bound_replays(plan->bound);
  pthread_mutex_unlock(&plan->lock);
  return n;
}

long ca_plan_updates(clattn_plan *plan) {
  pthread_mutex_lock(&plan->lock);
  const long n = ca_bound_updates(plan->bound);
  pthread_mutex_unlock(&plan->lock);
  return n;
}

long ca_plan_patches(clattn_plan *plan) {
  pthread_mutex_lock(&plan->lock);
  const long n = plan->patches;
  pthread_mutex_unlock(&plan->lock);
  return n;
}

int ca_plan_list_is_planners(clattn_plan *plan) {
  pthread_mutex_lock(&plan->lock);
  clattn_params p = plan->p;
  p.kv_len = plan->at.kv_len;
  p.q.offset = plan->at.q;
  p.out.offset = plan->at.out;
  p.lse.offset = plan->at.lse;
  ca_list fresh;
  ca_list_init(&fresh, "plan");
  fresh.steps_kv_len = plan->list.steps_kv_len;
  const clattn_status st =
      plan->kvcache ? ca_plan_kvcache(plan->ctx, &plan->kp, &fresh) : ca_plan_forward(plan->ctx, &p, &fresh);
  const int same = plan->listed && st == CLATTN_OK && ca_list_same(&fresh, &plan->list);
  ca_list_free(&fresh);
  pthread_mutex_unlock(&plan->lock);
  return same;
}

void clattn_plan_release(clattn_plan *plan) {
  if (!plan) return;
  ca_bound_release(plan->bound);
  ca_list_free(&plan->list);
  for (int i = 0; i < plan->n_mems; i++) clReleaseMemObject(plan->mems[i]);
  pthread_mutex_destroy(&plan->lock);
  free(plan);
}
