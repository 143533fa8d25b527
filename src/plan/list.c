/* Launch lists: the planner's output, the executor's input (plan.h). */
#include <limits.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plan/plan.h"

void ca_list_init(ca_list *l, const char *what) {
  memset(l, 0, offsetof(ca_list, own_launch)); /* the own storage is written before it is read */
  l->what = what;
  l->empty_rows = CLATTN_EMPTY_ZERO;
  l->step_hi = INT_MAX;
  l->launch = l->own_launch;
  l->cap_launch = CA_LIST_OWN_LAUNCHES;
  l->arg = l->own_arg;
  l->cap_arg = CA_LIST_OWN_ARGS;
  l->arena = l->own_arena;
  l->cap_arena = CA_LIST_OWN_ARENA;
}

static void release_held(ca_list *l) {
  for (int i = 0; i < l->n_held; i++) clReleaseProgram(l->held[i]);
  l->n_held = 0;
}

void ca_list_hold(ca_list *l, cl_program program) {
  if (l->n_held == CA_LIST_HELD) { /* never: no list runs more programs with modifiers */
    clReleaseProgram(program);
    l->error = ca_fail(CLATTN_ERR_INVALID_ARGUMENT, "a launch list holds at most %d programs with modifiers",
                       CA_LIST_HELD);
    return;
  }
  l->held[l->n_held++] = program;
}

void ca_list_reset(ca_list *l, const char *what) {
  release_held(l);
  l->what = what;
  l->n_launch = l->n_arg = l->n_scratch = 0;
  l->n_arena = 0;
  l->flag = 0;
  l->empty_rows = CLATTN_EMPTY_ZERO;
  l->error = CLATTN_OK;
  l->n_step_sites = l->step_lo = 0;
  l->step_hi = INT_MAX;
}

void ca_list_free(ca_list *l) {
  release_held(l);
  if (l->launch != l->own_launch) free(l->launch);
  if (l->arg != l->own_arg) free(l->arg);
  if (l->arena != l->own_arena) free(l->arena);
  ca_list_init(l, NULL);
}

/* *items (n of `size` bytes used of *cap, in `own` storage or the heap's)
 * grown to `want` or more: 0 when the host has no memory (l->error then
 * says so). */
static int grow(ca_list *l, void **items, const void *own, size_t n, size_t *cap, size_t want, size_t size) {
  size_t grown = 2 * *cap;
  while (grown < want) grown *= 2;
  void *p = *items == own ? malloc(grown * size) : realloc(*items, grown * size);
  if (!p) {
    if (!l->error) l->error = ca_fail(CLATTN_ERR_OUT_OF_MEMORY, "%s: a launch list: out of host memory", l->what);
    return 0;
  }
  if (*items == own) memcpy(p, own, n * size);
  *items = p;
  *cap = grown;
  return 1;
}

/* Room for `more` items of `size` bytes in *items (n used of *cap). */
static int room(ca_list *l, void **items, const void *own, int n, int *cap, int more, size_t size) {
  if (n + more <= *cap) return 1;
  size_t c = (size_t)*cap;
  if (!grow(l, items, own, (size_t)n, &c, (size_t)(n + more), size)) return 0;
  *cap = (int)c;
  return 1;
}

/* `size` bytes of the arena, 8-aligned; its offset, or (size_t)-1. */
static size_t arena_put(ca_list *l, const void *bytes, size_t size) {
  const size_t at = ca_round_up(l->n_arena, 8);
  if (at + size > l->cap_arena && !grow(l, (void **)&l->arena, l->own_arena, l->n_arena, &l->cap_arena, at + size, 1))
    return (size_t)-1;
  memcpy(l->arena + at, bytes, size);
  l->n_arena = at + size;
  return at;
}

int ca_list_scratch(ca_list *l, size_t bytes, const char *what) {
  if (l->n_scratch == CA_LIST_SCRATCH) {
    if (!l->error) l->error = ca_fail(CLATTN_ERR_UNSUPPORTED, "%s: more than %d scratch buffers", what, CA_LIST_SCRATCH);
    return 0;
  }
  l->scratch[l->n_scratch] = bytes;
  l->scratch_what[l->n_scratch] = what;
  return l->n_scratch++;
}

static ca_launch *add_launch(ca_list *l, ca_launch_kind kind) {
  if (!room(l, (void **)&l->launch, l->own_launch, l->n_launch, &l->cap_launch, 1, sizeof *l->launch)) return NULL;
  ca_launch *x = &l->launch[l->n_launch++];
  memset(x, 0, sizeof *x);
  x->kind = kind;
  x->first_arg = l->n_arg;
  return x;
}

void ca_list_kernel(ca_list *l, cl_program program, const char *kernel, cl_uint dims, const size_t *global,
                    const size_t *local) {
  ca_launch *x = add_launch(l, CA_LAUNCH_KERNEL);
  if (!x) return;
  x->program = program;
  strncpy(x->kernel, kernel, sizeof x->kernel - 1);
  x->dims = dims;
  for (cl_uint d = 0; d < 3; d++) {
    x->global[d] = d < dims ? global[d] : 1;
    x->local[d] = local && d < dims ? local[d] : 1;
  }
  x->local_given = local != NULL;
}

void ca_list_args(ca_list *l, int n_bufs, const ca_buf *bufs, size_t size, const void *value) {
  if (!l->n_launch || !room(l, (void **)&l->arg, l->own_arg, l->n_arg, &l->cap_arg, n_bufs + 1, sizeof *l->arg)) return;
  ca_launch *x = &l->launch[l->n_launch - 1];
  for (int i = 0; i < n_bufs; i++) l->arg[l->n_arg++] = (ca_arg){1, bufs[i], 0, 0};
  x->n_args += n_bufs;
  if (!size) return;
  const size_t at = arena_put(l, value, size);
  if (at == (size_t)-1) return;
  l->arg[l->n_arg++] = (ca_arg){0, {NULL, CA_BUF_MEM}, at, size};
  x->n_args++;
}

void ca_list_step_site(ca_list *l, size_t offset) {
  const ca_launch *x = l->n_launch ? &l->launch[l->n_launch - 1] : NULL;
  const ca_arg *a = x && x->n_args ? &l->arg[x->first_arg + x->n_args - 1] : NULL;
  if (!a || a->is_buf || offset + sizeof(int) > a->size || l->n_step_sites == CA_STEP_SITES) {
    ca_list_step_range(l, 1, 0); /* a site this list cannot hold: plan every step */
    return;
  }
  l->step_site[l->n_step_sites++] = (ca_step_site){l->n_launch - 1, x->n_args - 1, a->at + offset};
}

void ca_list_step_range(ca_list *l, int lo, int hi) {
  if (lo > l->step_lo) l->step_lo = lo;
  if (hi < l->step_hi) l->step_hi = hi;
}

int ca_list_step_patch(ca_list *l, int kv_len) {
  if (l->error || !l->n_step_sites || kv_len < l->step_lo || kv_len > l->step_hi) return 0;
  for (int i = 0; i < l->n_step_sites; i++) memcpy(l->arena + l->step_site[i].at, &kv_len, sizeof kv_len);
  return 1;
}

void ca_list_gemm(ca_list *l, const ca_gemm *g, const size_t *offsets) {
  const size_t at = arena_put(l, offsets, 3 * (size_t)g->heads * sizeof *offsets);
  ca_launch *x = at == (size_t)-1 ? NULL : add_launch(l, CA_LAUNCH_GEMM);
  if (!x) return;
  x->gemm = *g;
  x->gemm.offsets_at = at;
  strncpy(x->kernel, "CLBlast SGEMM", sizeof x->kernel - 1);
}

const size_t *ca_list_gemm_offsets(const ca_list *l, const ca_launch *x) {
  return (const size_t *)(const void *)(l->arena + x->gemm.offsets_at);
}

size_t ca_list_scratch_bytes(const ca_list *l) {
  size_t bytes = l->flag ? sizeof(cl_int) : 0;
  for (int i = 0; i < l->n_scratch; i++) bytes += l->scratch[i];
  return bytes;
}

void ca_list_rebind(ca_list *l, int from, cl_mem tag, ca_buf to) {
  for (int i = from; i < l->n_launch; i++) {
    ca_launch *x = &l->launch[i];
    for (int j = x->first_arg; j < x->first_arg + x->n_args; j++)
      if (l->arg[j].is_buf && l->arg[j].buf.role == CA_BUF_MEM && l->arg[j].buf.mem == tag) l->arg[j].buf = to;
    ca_buf *ops[3] = {&x->gemm.a, &x->gemm.b, &x->gemm.c};
    for (int k = 0; x->kind == CA_LAUNCH_GEMM && k < 3; k++)
      if (ops[k]->role == CA_BUF_MEM && ops[k]->mem == tag) *ops[k] = to;
  }
}

static int same_buf(ca_buf a, ca_buf b) { return a.role == b.role && a.mem == b.mem; }

int ca_list_same(const ca_list *a, const ca_list *b) {
  if (a->n_launch != b->n_launch || a->n_scratch != b->n_scratch || a->flag != b->flag ||
      a->empty_rows != b->empty_rows || memcmp(a->scratch, b->scratch, (size_t)a->n_scratch * sizeof *a->scratch) != 0)
    return 0;
  for (int i = 0; i < a->n_launch; i++) {
    const ca_launch *x = &a->launch[i], *y = &b->launch[i];
    if (x->kind != y->kind || x->program != y->program || strcmp(x->kernel, y->kernel) != 0 || x->dims != y->dims ||
        memcmp(x->global, y->global, sizeof x->global) != 0 || x->local_given != y->local_given ||
        memcmp(x->local, y->local, sizeof x->local) != 0 || x->n_args != y->n_args)
      return 0;
    if (x->kind == CA_LAUNCH_GEMM) {
      const ca_gemm *g = &x->gemm, *h = &y->gemm;
      if (g->b_transposed != h->b_transposed || g->m != h->m || g->n != h->n || g->k != h->k || g->heads != h->heads ||
          !same_buf(g->a, h->a) || !same_buf(g->b, h->b) || !same_buf(g->c, h->c) || g->a_ld != h->a_ld ||
          g->b_ld != h->b_ld || g->c_ld != h->c_ld ||
          memcmp(ca_list_gemm_offsets(a, x), ca_list_gemm_offsets(b, y), 3 * (size_t)g->heads * sizeof(size_t)) != 0)
        return 0;
    }
    for (int j = 0; j < x->n_args; j++) {
      const ca_arg *u = &a->arg[x->first_arg + j], *v = &b->arg[y->first_arg + j];
      if (u->is_buf != v->is_buf || (u->is_buf && !same_buf(u->buf, v->buf)) ||
          (!u->is_buf && (u->size != v->size || memcmp(a->arena + u->at, b->arena + v->at, u->size) != 0)))
        return 0;
    }
  }
  return 1;
}

void ca_describe_list(const ca_list *l, char *buf, size_t size) {
  size_t at = 0;
#define PUT(...) (at += (size_t)snprintf(buf + at, size > at ? size - at : 0, __VA_ARGS__))
  PUT("%s: %d launch%s, %zu bytes of scratch in %d buffer%s%s\n", l->what, l->n_launch, l->n_launch == 1 ? "" : "es",
      ca_list_scratch_bytes(l), l->n_scratch, l->n_scratch == 1 ? "" : "s", l->flag ? ", an empty-row flag" : "");
  for (int i = 0; i < l->n_launch; i++) {
    const ca_launch *x = &l->launch[i];
    if (x->kind == CA_LAUNCH_GEMM) {
      PUT("  %s: %zu x %zu x %zu, %d matrices\n", x->gemm.what, x->gemm.m, x->gemm.n, x->gemm.k, x->gemm.heads);
      continue;
    }
    int bufs = 0, given = 0;
    size_t value_bytes = 0;
    for (int j = x->first_arg; j < x->first_arg + x->n_args; j++) {
      bufs += l->arg[j].is_buf;
      given += l->arg[j].is_buf && (l->arg[j].buf.role != CA_BUF_MEM || l->arg[j].buf.mem);
      value_bytes += l->arg[j].is_buf ? 0 : l->arg[j].size;
    }
    PUT("  %s: global (%zu, %zu, %zu)", x->kernel, x->global[0], x->global[1], x->global[2]);
    if (x->local_given) PUT(" local (%zu, %zu, %zu)", x->local[0], x->local[1], x->local[2]);
    PUT(", %d arguments: %d buffers (%d given), %d struct%s of %zu bytes\n", x->n_args, bufs, given, x->n_args - bufs,
        x->n_args - bufs == 1 ? "" : "s", value_bytes);
  }
#undef PUT
}
