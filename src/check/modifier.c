/* The checks of a call's modifiers, captures and block mask (check.h). */
#include <string.h>

#include "check/check.h"

#define BAD(...) ca_fail(CLATTN_ERR_INVALID_ARGUMENT, __VA_ARGS__)

static int any_capture(const clattn_params *p) {
  for (int n = 0; n < 4; n++)
    if (p->captures[n] || p->capture_f[n] != 0.0f || p->capture_i[n] != 0) return 1;
  return 0;
}

/* Whether the block mask holds for p: made with the same mask modifier
 * and captures, for p's lengths, its batch and heads p's or 1. */
static clattn_status check_block_mask(ca_views *vs, const clattn_params *p) {
  const clattn_block_mask *bm = p->block_mask;
  const ca_mod_key mk = ca_mod_key_of(&(clattn_params){.mask_mod = p->mask_mod});
  if (memcmp(mk.hash, bm->mask_hash, sizeof mk.hash) != 0)
    return BAD("block_mask was made with another mask_mod than this call's");
  if (memcmp(bm->captures, p->captures, sizeof bm->captures) || memcmp(bm->capture_f, p->capture_f, sizeof bm->capture_f) ||
      memcmp(bm->capture_i, p->capture_i, sizeof bm->capture_i))
    return BAD("block_mask was made with other captures than this call's (captures, capture_f, capture_i)");
  if (bm->q_len != p->q_len || bm->kv_len != p->kv_len)
    return BAD("block_mask is for q_len %d, kv_len %d; the call has %d, %d", bm->q_len, bm->kv_len, p->q_len,
               p->kv_len);
  if ((bm->batch != 1 && bm->batch != p->batch) || (bm->heads != 1 && bm->heads != p->q_heads))
    return BAD("block_mask is for batch %d, heads %d; the call has batch %d, q_heads %d (1 stands for all)", bm->batch,
               bm->heads, p->batch, p->q_heads);
  /* its classes: a buffer of this call's context (one made by another context's clattn_block_mask_create is not) */
  const int blocks[] = {bm->batch, bm->heads, bm->q_blocks, bm->kv_blocks};
  const size_t row = (size_t)bm->kv_blocks, head = row * (size_t)bm->q_blocks;
  const clattn_tensor classes = {bm->classes, 0, {head * (size_t)bm->heads, head, row, 1}};
  return ca_check_view(vs, "block_mask (its classes)", &classes, blocks, 4, 1, CA_VIEW_IN);
}

clattn_status ca_check_modifiers(ca_views *vs, const clattn_params *p) {
  clattn_status st;
  if (p->block_mask && !p->mask_mod)
    return BAD("block_mask is set but mask_mod is NULL: a block mask classes a mask modifier's blocks");
  if (!p->score_mod && !p->mask_mod)
    return any_capture(p) ? BAD("captures, capture_f or capture_i are set but there is no modifier to read them")
                          : CLATTN_OK;
  static const char *const names[4] = {"captures[0]", "captures[1]", "captures[2]", "captures[3]"};
  const int one[] = {1};
  for (int n = 0; n < 4; n++) {
    const clattn_tensor t = {p->captures[n], 0, {1, 0, 0, 0}};
    if (p->captures[n] && (st = ca_check_view(vs, names[n], &t, one, 1, 1, CA_VIEW_IN))) return st;
  }
  if (p->block_mask && (st = check_block_mask(vs, p))) return st;
  return CLATTN_OK;
}

clattn_status ca_check_score_mod_grad(const clattn_params *p) {
  if (p->score_mod && !(ca_mod_flags_of(p) & CA_MODF_GRAD))
    return ca_fail(CLATTN_ERR_UNSUPPORTED,
                   "backward through score_mod needs its derivative: define float clattn_score_mod_grad(float score, "
                   "int b, int h, int q_idx, int kv_idx, const clattn_captures *cap) in score_mod's text");
  return CLATTN_OK;
}
