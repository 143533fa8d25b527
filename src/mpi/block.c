/* One (query block, key block) pair through clattn_forward, with the global
 * causal/window rule turned into the core's bottom-right aligned windows on
 * the pair's box (geometry.h). */
#include <stdlib.h>

#include "mpi_internal.h"

static clattn_tensor rows(clattn_tensor t, int first) {
  t.offset += (size_t)first * t.stride[2];
  return t;
}

int cm_block_covers(const cm_block *b) {
  cm_box box;
  cm_block_box(b->q_pos, b->q_len, b->k_pos, b->k_len, b->wl, b->wr, &box);
  return !box.empty && box.q_lo == 0 && box.q_hi == b->q_len;
}

clattn_status cm_block_forward(clattn_mpi *m, const cm_block *b, cl_mem lens_buf, cl_event *done) {
  *done = NULL;
  cm_box box;
  cm_block_box(b->q_pos, b->q_len, b->k_pos, b->k_len, b->wl, b->wr, &box);
  if (box.empty) return CLATTN_OK;
  const clattn_params *u = b->p;
  clattn_params p = clattn_params_default();
  p.batch = u->batch;
  p.q_heads = u->q_heads;
  p.kv_heads = u->kv_heads;
  p.head_dim = u->head_dim;
  p.value_dim = u->value_dim;
  p.dtype = u->dtype;
  p.scale = u->scale;
  p.softcap = u->softcap;
  p.score = u->score;
  p.additive_w = u->additive_w;
  p.algo = u->algo;
  p.empty_rows = CLATTN_EMPTY_ZERO; /* an empty partial state is normal; the merge applies the caller's policy */
  p.q_len = box.q_hi - box.q_lo;
  p.kv_len = box.k_hi - box.k_lo;
  p.q = rows(b->q, box.q_lo);
  p.out = rows(b->out, box.q_lo);
  p.lse = rows(b->lse, box.q_lo);
  p.k = rows(b->k, box.k_lo);
  p.v = rows(b->v, box.k_lo);
  p.window_left = box.window_left;
  p.window_right = box.window_right;
  if (b->kv_lens) {
    int *lens = malloc((size_t)u->batch * sizeof *lens);
    if (!lens) return cm_fail(m, CLATTN_ERR_OUT_OF_MEMORY, "local kv_lens");
    for (int i = 0; i < u->batch; i++) lens[i] = cm_local_kv_len(b->kv_lens[i], b->k_pos + box.k_lo, p.kv_len);
    /* Blocking: lens_buf may be rewritten for the next block right after. */
    cl_int err = clEnqueueWriteBuffer(clattn_cl_queue(m->ctx), lens_buf, CL_TRUE, 0, (size_t)u->batch * sizeof *lens,
                                      lens, 0, NULL, NULL);
    free(lens);
    if (err != CL_SUCCESS) return cm_cl_fail(m, err, "clEnqueueWriteBuffer (local kv_lens)");
    p.kv_lens = lens_buf;
  }
  clattn_status st = clattn_forward(m->ctx, &p, 0, NULL, done);
  return st == CLATTN_OK ? CLATTN_OK : cm_clattn_fail(m, st, "clattn_forward (local block)");
}
