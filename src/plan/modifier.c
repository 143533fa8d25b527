/* The caller's modifiers in a launch list (plan.h, "modifiers"). */
#include "plan/plan.h"

ca_mod ca_mod_of(const clattn_params *p) {
  ca_mod m = {{0}, {0}, 0, 0, 0, 0, 0, 0, 0, 0};
  for (int n = 0; n < 4; n++) {
    m.f[n] = p->capture_f[n];
    m.i[n] = p->capture_i[n];
  }
  const clattn_block_mask *bm = p->block_mask;
  if (bm) {
    m.bm_on = 1;
    m.bm_q = bm->block_q;
    m.bm_k = bm->block_k;
    m.bm_q_len = bm->q_len;
    m.bm_kv_len = bm->kv_len;
    m.bm_kb = bm->kv_blocks;
    /* batch or heads 1: one for all */
    m.bm_hs = bm->heads == 1 ? 0 : (cl_ulong)bm->q_blocks * (cl_ulong)bm->kv_blocks;
    m.bm_bs = bm->batch == 1 ? 0 : (cl_ulong)bm->heads * (cl_ulong)bm->q_blocks * (cl_ulong)bm->kv_blocks;
  }
  return m;
}

clattn_status ca_plan_program(clattn_context *ctx, const ca_program_key *key, ca_list *l, ca_program *out) {
  const clattn_status st = ca_program_get(ctx, key, out);
  if (st == CLATTN_OK && key->mod.flags) ca_list_hold(l, out->program);
  return st;
}
