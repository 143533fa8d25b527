/* clattn_merge_states' checks. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "check/check.h"

#define BAD(...) ca_fail(CLATTN_ERR_INVALID_ARGUMENT, __VA_ARGS__)

clattn_status ca_check_merge(const clattn_context *ctx, const clattn_merge_params *mp) {
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
  /* The last state's views reach furthest: checking them covers every
   * state (and where only the last overflows, the stride is to blame). */
  struct {
    const char *name;
    const clattn_tensor *first;
    size_t state_stride;
    int rank;
    clattn_tensor last;
  } states[] = {{"o", &mp->o, mp->o_state_stride, 4, mp->o}, {"lse", &mp->lse, mp->lse_state_stride, 3, mp->lse}};
  for (int i = 0; i < 2; i++) {
    size_t shift, bytes;
    if (!ca_view_bytes(states[i].first, o_dims, states[i].rank, sizeof(float), &bytes)) continue; /* named below */
    if (!ca_mul_ok((size_t)(mp->n_states - 1), states[i].state_stride, &shift) ||
        !ca_add_ok(states[i].last.offset, shift, &states[i].last.offset) ||
        !ca_view_bytes(&states[i].last, o_dims, states[i].rank, sizeof(float), &bytes))
      return BAD("%s_state_stride %zu: state %d of %s lies past the address range", states[i].name,
                 states[i].state_stride, mp->n_states - 1, states[i].name);
  }
  const clattn_tensor o_last = states[0].last, lse_last = states[1].last;
  ca_views vs;
  ca_views_init(&vs, ctx->context);
  /* each input is recorded as all its states */
  if ((st = ca_check_view(&vs, "o", &o_last, o_dims, 4, sizeof(float), 0))) return st;
  ca_views_repeat_last(&vs, (size_t)mp->n_states, mp->o_state_stride * sizeof(float));
  if ((st = ca_check_view(&vs, "lse", &lse_last, o_dims, 3, sizeof(float), 0))) return st;
  ca_views_repeat_last(&vs, (size_t)mp->n_states, mp->lse_state_stride * sizeof(float));
  const size_t out_elem = mp->out_dtype == CLATTN_F32 ? sizeof(float) : 2;
  if ((st = ca_check_view(&vs, "out", &mp->out, o_dims, 4, out_elem, 1)) ||
      (mp->out_lse.buf && (st = ca_check_view(&vs, "out_lse", &mp->out_lse, o_dims, 3, sizeof(float), 1))))
    return st;
  return ca_views_disjoint(&vs);
}

