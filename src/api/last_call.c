/*
 * A context's last clattn_forward call and its launch list: a decode loop
 * calls again and again with one more key each time, and a call that
 * differs from the last only in a kv_len the list holds (plan.h's step
 * sites) takes the list with kv_len written in instead of planning anew,
 * as a plan's step does. The planner is a pure function of the call and
 * the context, so the list is the one it would make. One call at a time
 * uses it; a call on another thread meanwhile plans its own.
 */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "api/api.h"

struct ca_last_call {
  pthread_mutex_t lock;
  int listed;   /* list is the planner's for p */
  long patches; /* calls that took the list without planning */
  clattn_params p;
  ca_list list;
};

ca_last_call *ca_last_call_new(void) {
  ca_last_call *m = calloc(1, sizeof *m);
  if (!m) return NULL;
  pthread_mutex_init(&m->lock, NULL);
  ca_list_init(&m->list, "forward");
  return m;
}

void ca_last_call_free(ca_last_call *m) {
  if (!m) return;
  ca_list_free(&m->list);
  pthread_mutex_destroy(&m->lock);
  free(m);
}

/* Whether a and b are the same call but for kv_len (by their bytes: a
 * difference the planner would not see only costs a plan). */
static int same_but_kv_len(const clattn_params *a, const clattn_params *b) {
  const size_t at = offsetof(clattn_params, kv_len), after = at + sizeof a->kv_len;
  return memcmp(a, b, at) == 0 && memcmp((const char *)a + after, (const char *)b + after, sizeof *a - after) == 0;
}

clattn_status ca_last_call_run(clattn_context *ctx, ca_last_call *m, const clattn_params *p, cl_uint n_wait,
                               const cl_event *wait, cl_event *done, int *ran) {
  *ran = 0;
  /* a modifier's text may change behind the same pointer: such calls plan anew */
  if (!m || p->score_mod || p->mask_mod || pthread_mutex_trylock(&m->lock) != 0) return CLATTN_OK;
  *ran = 1;
  clattn_status st = CLATTN_OK;
  const int holds =
      m->listed && same_but_kv_len(&m->p, p) && (m->p.kv_len == p->kv_len || ca_list_step_patch(&m->list, p->kv_len));
  if (holds) {
    m->p.kv_len = p->kv_len;
    m->patches++;
  } else {
    ca_list_reset(&m->list, "forward");
    st = ca_plan_forward(ctx, p, &m->list);
    m->listed = st == CLATTN_OK;
    m->p = *p;
  }
  if (st == CLATTN_OK) st = ca_run(ctx, &m->list, n_wait, wait, done);
  pthread_mutex_unlock(&m->lock);
  return st;
}

long ca_last_call_patches(clattn_context *ctx) {
  ca_last_call *m = ctx->last_call;
  if (!m) return 0;
  pthread_mutex_lock(&m->lock);
  const long n = m->patches;
  pthread_mutex_unlock(&m->lock);
  return n;
}

int ca_last_call_is_planners(clattn_context *ctx) {
  ca_last_call *m = ctx->last_call;
  if (!m) return 0;
  pthread_mutex_lock(&m->lock);
  ca_list fresh;
  ca_list_init(&fresh, "forward");
  const int same = m->listed && ca_plan_forward(ctx, &m->p, &fresh) == CLATTN_OK && ca_list_same(&fresh, &m->list);
  ca_list_free(&fresh);
  pthread_mutex_unlock(&m->lock);
  return same;
}
