/* Ring attention for prefill. Rank r holds zig-zag chunks r and 2R-1-r of Q,
 * K and V, so under a causal mask every rank has the same work. In R steps
 * each rank's K/V block visits every rank: at step t a rank computes its two
 * query chunks against the block it holds (from rank r - t) while the block
 * moves on to rank r + 1 (MPI_Isend/Irecv, progressed while the device
 * works). Each (query chunk, key chunk) pair leaves a partial state; one
 * clattn_merge_states per query chunk combines the 2R states at the end.
 * Every rank takes part in every transfer whatever happened locally, so a
 * failure cannot leave a neighbour waiting. */
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "mpi_internal.h"

enum {
  D_BATCH,
  D_QH,
  D_KVH,
  D_DK,
  D_DV,
  D_CAUSAL,
  D_WL,
  D_WR,
  D_SEQ,
  D_SCALE,
  D_SOFTCAP,
  D_SCORE,
  D_EMPTY,
  D_LENS,
  D_SINKS,
  D_COUNT
};

_Static_assert((int)D_COUNT <= (int)CM_DESC_MAX, "the handle's agreement array holds CM_DESC_MAX ints per rank");
static const char *const field_names[D_COUNT] = {"batch",
                                                 "q_heads",
                                                 "kv_heads",
                                                 "head_dim",
                                                 "value_dim",
                                                 "causal",
                                                 "window_left",
                                                 "window_right",
                                                 "seq_len",
                                                 "scale",
                                                 "softcap",
                                                 "score",
                                                 "empty_rows",
                                                 "kv_lens (given or not)",
                                                 "sinks (given or not)"};

clattn_status clattn_mpi_ring_layout_of(int seq_len, int ranks, int rank, clattn_mpi_ring_layout *out) {
  if (!out || ranks <= 0 || rank < 0 || rank >= ranks || seq_len < 2 * ranks) return CLATTN_ERR_INVALID_ARGUMENT;
  cm_ring_chunks(seq_len, ranks, rank, out->offset, out->len);
  out->rows = out->len[0] + out->len[1];
  return CLATTN_OK;
}

static clattn_mpi_ring_layout layout(int seq_len, int ranks, int rank) {
  clattn_mpi_ring_layout l;
  cm_ring_chunks(seq_len, ranks, rank, l.offset, l.len);
  l.rows = l.len[0] + l.len[1];
  return l;
}

static clattn_status check_local(clattn_mpi *m, const clattn_params *p, int seq_len) {
  const char *fn = "clattn_mpi_ring_forward";
  if (!p) return cm_fail(m, CLATTN_ERR_INVALID_ARGUMENT, "%s: params is NULL", fn);
  clattn_status st = cm_check_support(m, p, fn);
  if (st) return st;
  if (seq_len < 2 * m->size)
    return cm_fail(m, CLATTN_ERR_INVALID_ARGUMENT, "%s: seq_len (%d) must be at least 2 * ranks (%d)", fn, seq_len,
                   2 * m->size);
  const clattn_mpi_ring_layout l = layout(seq_len, m->size, m->rank);
  if (p->q_len != l.rows || p->kv_len != l.rows)
    return cm_fail(m, CLATTN_ERR_INVALID_ARGUMENT,
                   "%s: this rank holds %d rows (chunks %d+%d): q_len and kv_len must be %d (got %d, %d)", fn, l.rows,
                   l.len[0], l.len[1], l.rows, p->q_len, p->kv_len);
  const int k_dims[4] = {p->batch, p->kv_heads, l.rows, p->head_dim};
  const int v_dims[4] = {p->batch, p->kv_heads, l.rows, p->value_dim};
  if ((st = cm_check_view(m, fn, "k", &p->k, k_dims)) || (st = cm_check_view(m, fn, "v", &p->v, v_dims))) return st;
  if ((double)p->batch * p->kv_heads * (l.rows + 2) * (p->head_dim + p->value_dim) > INT_MAX) /* any rank's block */
    return cm_fail(m, CLATTN_ERR_UNSUPPORTED, "%s: a K/V block exceeds one MPI message", fn);
  return CLATTN_OK;
}

static clattn_status check_consistent(clattn_mpi *m, const int *all) {
  const int w = D_COUNT + 1;
  for (int r = 1; r < m->size; r++)
    for (int f = 0; f < D_COUNT; f++)
      if (all[r * w + 1 + f] != all[1 + f])
        return cm_fail(m, CLATTN_ERR_INVALID_ARGUMENT,
                       "clattn_mpi_ring_forward: rank %d's %s (%d) differs from rank 0's (%d)", r, field_names[f],
                       all[r * w + 1 + f], all[1 + f]);
  return CLATTN_OK;
}

typedef struct {
  const clattn_params *p;
  clattn_mpi_ring_layout mine;
  int seq_len, *lens;
  size_t o_state, lse_state; /* elements between partial states */
  cl_mem o, lse, kv, lens_dev[4];
} ring;

static size_t block_floats(const clattn_params *p, int rows) {
  return (size_t)p->batch * p->kv_heads * rows * (p->head_dim + p->value_dim);
}

/* Step t: our two query chunks against the block of rank src, on the device. */
static clattn_status step_compute(clattn_mpi *m, const ring *g, int t, int src, const float *block, MPI_Request *req,
                                  int n_req, int *req_done) {
  const clattn_params *p = g->p;
  const clattn_mpi_ring_layout kl = layout(g->seq_len, m->size, src);
  const size_t kn = block_floats(p, kl.rows);
  cl_int err =
      clEnqueueWriteBuffer(clattn_cl_queue(m->ctx), g->kv, CL_TRUE, 0, kn * sizeof(float), block, 0, NULL, NULL);
  if (err != CL_SUCCESS) return cm_cl_fail(m, err, "clEnqueueWriteBuffer (K/V block)");
  const size_t L = (size_t)g->mine.rows, KL = (size_t)kl.rows, H = (size_t)p->q_heads, Hk = (size_t)p->kv_heads;
  const size_t dk = (size_t)p->head_dim, dv = (size_t)p->value_dim;
  const size_t v_at = (size_t)p->batch * Hk * KL * dk;
  cl_event ev[4] = {NULL, NULL, NULL, NULL};
  clattn_status st = CLATTN_OK;
  for (int qa = 0; qa < 2 && st == CLATTN_OK; qa++)
    for (int kb = 0; kb < 2 && st == CLATTN_OK; kb++) {
      const size_t q_row = qa ? (size_t)g->mine.len[0] : 0, k_row = kb ? (size_t)kl.len[0] : 0;
      const size_t s = (size_t)t * 2 + kb;
      cm_block b = {p,
                    p->q,
                    {g->kv, k_row * dk, {Hk * KL * dk, KL * dk, dk, 1}},
                    {g->kv, v_at + k_row * dv, {Hk * KL * dv, KL * dv, dv, 1}},
                    g->mine.len[qa],
                    kl.len[kb],
                    g->mine.offset[qa],
                    kl.offset[kb],
                    p->window_left,
                    p->causal ? 0 : p->window_right,
                    g->lens,
                    {g->o, s * g->o_state + q_row * dv, {H * L * dv, L * dv, dv, 1}},
                    {g->lse, s * g->lse_state + q_row, {H * L, L, 1, 0}}};
      b.q.offset += q_row * p->q.stride[2];
      st = cm_block_forward(m, &b, g->lens_dev[qa * 2 + kb], &ev[qa * 2 + kb]);
    }
  if (st == CLATTN_OK)
    st = cm_wait_overlapped(m, ev, 4, req, n_req, req_done);
  else
    clFinish(clattn_cl_queue(m->ctx)); /* best effort: the blocks already enqueued use our buffers;
                                          the failure being reported is the first one */
  for (int i = 0; i < 4; i++)
    if (ev[i]) clReleaseEvent(ev[i]);
  return st;
}

static clattn_status merge_chunks(clattn_mpi *m, const ring *g) {
  const clattn_params *p = g->p;
  const size_t L = (size_t)g->mine.rows, H = (size_t)p->q_heads, dv = (size_t)p->value_dim;
  clattn_status first = CLATTN_OK;
  for (int qa = 0; qa < 2; qa++) { /* both, so EMPTY_ERROR still leaves the EMPTY_ZERO result everywhere */
    const size_t row = qa ? (size_t)g->mine.len[0] : 0;
    clattn_merge_params mp = {sizeof(clattn_merge_params),
                              2 * m->size + (p->sinks != NULL),
                              p->batch,
                              p->q_heads,
                              g->mine.len[qa],
                              p->value_dim,
                              {g->o, row * dv, {H * L * dv, L * dv, dv, 1}},
                              {g->lse, row, {H * L, L, 1, 0}},
                              g->o_state,
                              g->lse_state,
                              p->out,
                              p->lse,
                              p->empty_rows,
                              p->dtype};
    mp.out.offset += row * p->out.stride[2];
    if (mp.out_lse.buf) mp.out_lse.offset += row * p->lse.stride[2];
    cl_event done = NULL;
    clattn_status st = clattn_merge_states(m->ctx, &mp, 0, NULL, &done);
    if (done) {
      cl_int err = clWaitForEvents(1, &done);
      clReleaseEvent(done);
      if (st == CLATTN_OK && err != CL_SUCCESS) st = cm_cl_fail(m, err, "clWaitForEvents (merge)");
    } else if (st != CLATTN_OK) {
      st = cm_clattn_fail(m, st, "clattn_merge_states");
    }
    if (first == CLATTN_OK) first = st;
  }
  return first;
}

/* Staging for the whole call, before the first agreement. */
static clattn_status prepare(clattn_mpi *m, ring *g, float **bufs) {
  const clattn_params *p = g->p;
  clattn_status st;
  size_t max_block = 0;
  for (int r = 0; r < m->size; r++) {
    const size_t n = block_floats(p, layout(g->seq_len, m->size, r).rows);
    if (n > max_block) max_block = n;
  }
  if ((st = cm_host(m, CM_HOST_SEND, max_block * sizeof(float), (void **)&bufs[0])) ||
      (st = cm_host(m, CM_HOST_RECV, max_block * sizeof(float), (void **)&bufs[1])) ||
      (st = cm_dev(m, CM_DEV_KV, max_block * sizeof(float), &g->kv)))
    return st;
  const size_t L = (size_t)g->mine.rows;
  g->lse_state = (size_t)p->batch * p->q_heads * L;
  g->o_state = g->lse_state * p->value_dim;
  const size_t states = 2 * (size_t)m->size + (p->sinks != NULL); /* the sinks: one more state */
  if ((st = cm_dev(m, CM_DEV_O, states * g->o_state * sizeof(float), &g->o)) ||
      (st = cm_dev(m, CM_DEV_LSE, states * g->lse_state * sizeof(float), &g->lse)))
    return st;
  if (p->kv_lens) {
    if ((st = cm_host(m, CM_HOST_LENS, (size_t)p->batch * sizeof(int), (void **)&g->lens))) return st;
    for (int i = 0; i < 4; i++)
      if ((st = cm_dev(m, CM_DEV_LENS0 + i, (size_t)p->batch * sizeof(cl_int), &g->lens_dev[i]))) return st;
  }
  return CLATTN_OK;
}

clattn_status clattn_mpi_ring_forward(clattn_mpi *m, const clattn_params *p, int seq_len) {
  if (!m) return CLATTN_ERR_INVALID_ARGUMENT;
  const double t0 = cm_now();
  int desc[D_COUNT] = {0};
  int *all = m->agree;
  ring g = {p, {{0, 0}, {0, 0}, 0}, seq_len, NULL, 0, 0, NULL, NULL, NULL, {NULL, NULL, NULL, NULL}};
  float *bufs[2] = {NULL, NULL};
  clattn_status st = check_local(m, p, seq_len);
  if (st == CLATTN_OK) {
    g.mine = layout(seq_len, m->size, m->rank);
    int d[D_COUNT] = {
        p->batch,        p->q_heads, p->kv_heads, p->head_dim, p->value_dim,  !!p->causal,        p->window_left,
        p->window_right, seq_len,    0,           0,           (int)p->score, (int)p->empty_rows, p->kv_lens != NULL,
        p->sinks != NULL};
    memcpy(&d[D_SCALE], &p->scale, sizeof(int));
    memcpy(&d[D_SOFTCAP], &p->softcap, sizeof(int));
    memcpy(desc, d, sizeof d);
    st = prepare(m, &g, bufs);
  }
  st = cm_agree_descriptors(m, st, desc, D_COUNT, all);
  if (st == CLATTN_OK) st = check_consistent(m, all);
  if (st != CLATTN_OK) return st;
  const double t_agreed = cm_now();

  /* Our own block, packed [K | V], and the states all empty until computed. */
  const int dk_dims[4] = {p->batch, p->kv_heads, g.mine.rows, p->head_dim};
  const int dv_dims[4] = {p->batch, p->kv_heads, g.mine.rows, p->value_dim};
  st = cm_read_view(m, &p->k, dk_dims, bufs[0]);
  if (st == CLATTN_OK)
    st = cm_read_view(m, &p->v, dv_dims, bufs[0] + (size_t)p->batch * p->kv_heads * g.mine.rows * p->head_dim);
  if (st == CLATTN_OK && p->kv_lens) st = cm_read_lens(m, p->kv_lens, p->batch, g.lens);
  if (st == CLATTN_OK) st = cm_fill(m, g.lse, 0, 2 * (size_t)m->size * g.lse_state, -INFINITY);
  const size_t sink = 2 * (size_t)m->size;
  if (st == CLATTN_OK && p->sinks)
    st = cm_sink_state(m, p->sinks, p->sinks_offset, p->batch, p->q_heads, g.mine.rows, p->value_dim, g.o, sink * g.o_state, g.lse,
                       sink * g.lse_state);

  const int R = m->size, next = (m->rank + 1) % R, prev = (m->rank + R - 1) % R;
  const double loop0 = cm_now();
  double compute = 0, wait = 0;
  for (int t = 0; t < R; t++) {
    const int src = (m->rank - t + R) % R;
    float *cur = bufs[t % 2], *nxt = bufs[(t + 1) % 2];
    MPI_Request req[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
    int n_req = 0, req_done = 0, rc = MPI_SUCCESS;
    if (t < R - 1) { /* the block we hold moves on while we compute on it */
      const int send_n = (int)block_floats(p, layout(seq_len, R, src).rows);
      const int recv_n = (int)block_floats(p, layout(seq_len, R, (src + R - 1) % R).rows);
      rc = MPI_Irecv(nxt, recv_n, MPI_FLOAT, prev, t, m->comm, &req[0]);
      if (rc == MPI_SUCCESS) rc = MPI_Isend(cur, send_n, MPI_FLOAT, next, t, m->comm, &req[1]);
      n_req = 2;
      m->stats.bytes_sent += (double)send_n * sizeof(float);
      if (rc != MPI_SUCCESS && st == CLATTN_OK) st = cm_mpi_fail(m, rc, "MPI_Isend/MPI_Irecv (ring)");
    }
    const double c0 = cm_now();
    if (st == CLATTN_OK) st = step_compute(m, &g, t, src, cur, req, n_req, &req_done);
    const double c1 = cm_now();
    if (n_req) {
      m->stats.ring_transfers++;
      m->stats.ring_hidden += req_done;
    }
    if (n_req && !req_done) {
      rc = MPI_Waitall(n_req, req, MPI_STATUSES_IGNORE);
      if (rc != MPI_SUCCESS && st == CLATTN_OK) st = cm_mpi_fail(m, rc, "MPI_Waitall (ring)");
    }
    compute += c1 - c0;
    wait += cm_now() - c1;
  }
  const double m0 = cm_now();
  if (st == CLATTN_OK) st = merge_chunks(m, &g);
  const double m1 = cm_now();
  st = cm_agree(m, st);
  const double t_end = cm_now();
  m->stats.calls++;
  m->stats.seconds += t_end - t0;
  m->stats.seconds_compute += compute + (m1 - m0) + (loop0 - t_agreed); /* staging included */
  m->stats.seconds_wait += wait;
  m->stats.seconds_agree += (t_agreed - t0) + (t_end - m1);
  return st;
}
