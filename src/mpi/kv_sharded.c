/* KV-sharded attention: each rank attends the replicated queries over its
 * own shard of the keys, the partial states (O, lse) of all ranks meet in one
 * collective, and clattn_merge_states combines them exactly.
 *
 *   agreement (descriptors)  ->  local forward  ->  Allgather / Gather of
 *   [O | lse]  ->  merge  ->  agreement (status)
 *
 * Every rank takes part in every collective whatever happened locally. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "mpi_internal.h"

enum {
  D_BATCH,
  D_QH,
  D_KVH,
  D_M,
  D_DK,
  D_DV,
  D_CAUSAL,
  D_WL,
  D_WR,
  D_TOTAL,
  D_ROOT,
  D_SCALE,
  D_SOFTCAP,
  D_SCORE,
  D_EMPTY,
  D_LENS,
  D_SINKS,
  D_OFFSET,
  D_LEN,
  D_COUNT
};

static void describe(const clattn_params *p, const clattn_mpi_kv_shard *s, int *d) {
  d[D_BATCH] = p->batch, d[D_QH] = p->q_heads, d[D_KVH] = p->kv_heads, d[D_M] = p->q_len;
  d[D_DK] = p->head_dim, d[D_DV] = p->value_dim, d[D_CAUSAL] = !!p->causal;
  d[D_WL] = p->window_left, d[D_WR] = p->window_right, d[D_TOTAL] = s->kv_total, d[D_ROOT] = s->root;
  memcpy(&d[D_SCALE], &p->scale, sizeof(int));
  memcpy(&d[D_SOFTCAP], &p->softcap, sizeof(int));
  d[D_SCORE] = (int)p->score, d[D_EMPTY] = (int)p->empty_rows, d[D_LENS] = p->kv_lens != NULL;
  d[D_SINKS] = p->sinks != NULL;
  d[D_OFFSET] = s->kv_offset, d[D_LEN] = p->kv_len;
}

_Static_assert((int)D_COUNT <= (int)CM_DESC_MAX, "the handle's agreement array holds CM_DESC_MAX ints per rank");
static const char *const field_names[D_COUNT] = {"batch",
                                                 "q_heads",
                                                 "kv_heads",
                                                 "q_len",
                                                 "head_dim",
                                                 "value_dim",
                                                 "causal",
                                                 "window_left",
                                                 "window_right",
                                                 "kv_total",
                                                 "root",
                                                 "scale",
                                                 "softcap",
                                                 "score",
                                                 "empty_rows",
                                                 "kv_lens (given or not)",
                                                 "sinks (given or not)",
                                                 "",
                                                 ""};

/* Same on every rank: the descriptors are the same gathered array. */
static clattn_status check_consistent(clattn_mpi *m, const int *all) {
  const int w = D_COUNT + 1;
  for (int r = 1; r < m->size; r++)
    for (int f = 0; f < D_OFFSET; f++)
      if (all[r * w + 1 + f] != all[1 + f])
        return cm_fail(m, CLATTN_ERR_INVALID_ARGUMENT,
                       "clattn_mpi_kv_sharded_forward: rank %d's %s (%d) differs from rank 0's (%d)", r, field_names[f],
                       all[r * w + 1 + f], all[1 + f]);
  /* The non-empty shards must tile [0, kv_total): walk them in offset order. */
  long long covered = 0;
  for (int n = 0; n < m->size; n++) {
    int next = -1;
    for (int r = 0; r < m->size; r++)
      if (all[r * w + 1 + D_LEN] > 0 && all[r * w + 1 + D_OFFSET] == covered) next = r;
    if (next < 0) break;
    covered += all[next * w + 1 + D_LEN];
  }
  long long sum = 0;
  for (int r = 0; r < m->size; r++) sum += all[r * w + 1 + D_LEN];
  if (covered != all[1 + D_TOTAL] || sum != covered)
    return cm_fail(m, CLATTN_ERR_INVALID_ARGUMENT,
                   "clattn_mpi_kv_sharded_forward: the shards (kv_offset, kv_len per rank) do not tile [0, %d) "
                   "without overlap",
                   all[1 + D_TOTAL]);
  return CLATTN_OK;
}

static clattn_status check_local(clattn_mpi *m, const clattn_params *p, const clattn_mpi_kv_shard *s) {
  const char *fn = "clattn_mpi_kv_sharded_forward";
  if (!p || !s) return cm_fail(m, CLATTN_ERR_INVALID_ARGUMENT, "%s: params or shard is NULL", fn);
  clattn_status st = cm_check_support(m, p, fn);
  if (st) return st;
  if (p->kv_len < 0 || s->kv_offset < 0 || s->kv_total <= 0 || (long long)s->kv_offset + p->kv_len > s->kv_total)
    return cm_fail(m, CLATTN_ERR_INVALID_ARGUMENT,
                   "%s: the shard [%d, %d + %d) must lie inside [0, kv_total = %d) with kv_len >= 0", fn, s->kv_offset,
                   s->kv_offset, p->kv_len, s->kv_total);
  if (s->root < -1 || s->root >= m->size)
    return cm_fail(m, CLATTN_ERR_INVALID_ARGUMENT, "%s: root %d is not -1 or a rank of the communicator", fn, s->root);
  if (p->kv_len > 0 && (!p->k.buf || !p->v.buf))
    return cm_fail(m, CLATTN_ERR_INVALID_ARGUMENT, "%s: k.buf and v.buf are required for a non-empty shard", fn);
  const double payload = (double)p->batch * p->q_heads * p->q_len * (p->value_dim + 1);
  if (payload * m->size > 2147483647.0)
    return cm_fail(m, CLATTN_ERR_UNSUPPORTED, "%s: the gathered states (%.0f floats) exceed one MPI message", fn,
                   payload * m->size);
  return CLATTN_OK;
}

/* This rank's state [O | lse] into host memory. */
static clattn_status local_state(clattn_mpi *m, const clattn_params *p, const clattn_mpi_kv_shard *s, float *host,
                                 size_t o_n, size_t lse_n) {
  const int wr = p->causal ? 0 : p->window_right;
  int *lens = NULL;
  clattn_status st = CLATTN_OK;
  if (p->kv_lens) {
    if ((st = cm_host(m, CM_HOST_LENS, (size_t)p->batch * sizeof(int), (void **)&lens))) return st;
    if ((st = cm_read_lens(m, p->kv_lens, p->batch, lens))) return st;
  }
  cm_block b = {
      p,  p->q, p->k, p->v, p->q_len, p->kv_len, (long long)s->kv_total - p->q_len, s->kv_offset, p->window_left,
      wr, lens, {0},  {0}};
  cm_box box;
  cm_block_box(b.q_pos, b.q_len, b.k_pos, b.k_len, b.wl, b.wr, &box);
  if (box.empty) { /* no allowed key here: the empty state */
    memset(host, 0, o_n * sizeof *host);
    for (size_t i = 0; i < lse_n; i++) host[o_n + i] = -INFINITY;
    return CLATTN_OK;
  }
  cl_mem dev, lens_dev = NULL;
  if ((st = cm_dev(m, CM_DEV_O, (o_n + lse_n) * sizeof(float), &dev))) return st;
  if (lens && (st = cm_dev(m, CM_DEV_LENS0, (size_t)p->batch * sizeof(cl_int), &lens_dev))) return st;
  const int M = p->q_len, H = p->q_heads, dv = p->value_dim;
  b.out = (clattn_tensor){dev, 0, {(size_t)H * M * dv, (size_t)M * dv, (size_t)dv, 1}};
  b.lse = (clattn_tensor){dev, o_n, {(size_t)H * M, (size_t)M, 1, 0}};
  if (!cm_block_covers(&b) && (st = cm_fill(m, dev, o_n, lse_n, -INFINITY))) return st;
  cl_event done = NULL;
  if ((st = cm_block_forward(m, &b, lens_dev, &done))) return st;
  cl_int err = clEnqueueReadBuffer(clattn_cl_queue(m->ctx), dev, CL_TRUE, 0, (o_n + lse_n) * sizeof(float), host,
                                   done ? 1 : 0, done ? &done : NULL, NULL);
  if (done) clReleaseEvent(done);
  return err == CL_SUCCESS ? CLATTN_OK : cm_cl_fail(m, err, "clEnqueueReadBuffer (local state)");
}

static clattn_status merge(clattn_mpi *m, const clattn_params *p, const float *states, size_t o_n, size_t lse_n) {
  const size_t per = o_n + lse_n, bytes = per * (size_t)m->size * sizeof(float);
  const int n_states = m->size + (p->sinks != NULL); /* the sinks join once, as one more state */
  cl_mem dev;
  clattn_status st = cm_dev(m, CM_DEV_LSE, per * (size_t)n_states * sizeof(float), &dev);
  if (st) return st;
  cl_int err = clEnqueueWriteBuffer(clattn_cl_queue(m->ctx), dev, CL_TRUE, 0, bytes, states, 0, NULL, NULL);
  if (err != CL_SUCCESS) return cm_cl_fail(m, err, "clEnqueueWriteBuffer (gathered states)");
  const int M = p->q_len, H = p->q_heads, dv = p->value_dim;
  const size_t sink_at = per * (size_t)m->size;
  if (p->sinks && (st = cm_sink_state(m, p->sinks, p->sinks_offset, p->batch, H, M, dv, dev, sink_at, dev, sink_at + o_n))) return st;
  clattn_merge_params mp = {sizeof(clattn_merge_params),
                            n_states,
                            p->batch,
                            H,
                            M,
                            dv,
                            {dev, 0, {(size_t)H * M * dv, (size_t)M * dv, (size_t)dv, 1}},
                            {dev, o_n, {(size_t)H * M, (size_t)M, 1, 0}},
                            per,
                            per,
                            p->out,
                            p->lse,
                            p->empty_rows,
                            p->dtype};
  cl_event done = NULL;
  st = clattn_merge_states(m->ctx, &mp, 0, NULL, &done);
  if (done) {
    err = clWaitForEvents(1, &done);
    clReleaseEvent(done);
    if (st == CLATTN_OK && err != CL_SUCCESS) return cm_cl_fail(m, err, "clWaitForEvents (merge)");
  }
  return st == CLATTN_OK ? CLATTN_OK : cm_clattn_fail(m, st, "clattn_merge_states");
}

clattn_status clattn_mpi_kv_sharded_forward(clattn_mpi *m, const clattn_params *p, const clattn_mpi_kv_shard *s) {
  if (!m) return CLATTN_ERR_INVALID_ARGUMENT;
  const double t0 = cm_now();
  int desc[D_COUNT] = {0};
  int *all = m->agree;
  clattn_status st = check_local(m, p, s);
  size_t o_n = 0, lse_n = 0;
  int gather_all = 1, receives = 1;
  float *send = NULL, *recv = NULL;
  if (st == CLATTN_OK) { /* staging first, so running out of memory is agreed on before data moves */
    describe(p, s, desc);
    lse_n = (size_t)p->batch * p->q_heads * p->q_len, o_n = lse_n * p->value_dim;
    gather_all = s->root < 0, receives = gather_all || m->rank == s->root;
    st = cm_host(m, CM_HOST_SEND, (o_n + lse_n) * sizeof(float), (void **)&send);
    if (st == CLATTN_OK && receives)
      st = cm_host(m, CM_HOST_RECV, (o_n + lse_n) * (size_t)m->size * sizeof(float), (void **)&recv);
  }
  st = cm_agree_descriptors(m, st, desc, D_COUNT, all);
  if (st == CLATTN_OK) st = check_consistent(m, all); /* same verdict on every rank */
  if (st != CLATTN_OK) return st;

  const size_t per = o_n + lse_n;
  const double t_agreed = cm_now();
  st = local_state(m, p, s, send, o_n, lse_n);
  if (st != CLATTN_OK) { /* still send a well-formed empty state */
    memset(send, 0, o_n * sizeof *send);
    for (size_t i = 0; i < lse_n; i++) send[o_n + i] = -INFINITY;
  }
  const double t1 = cm_now();
  const int rc = gather_all ? MPI_Allgather(send, (int)per, MPI_FLOAT, recv, (int)per, MPI_FLOAT, m->comm)
                            : MPI_Gather(send, (int)per, MPI_FLOAT, recv, (int)per, MPI_FLOAT, s->root, m->comm);
  m->stats.bytes_sent += (double)per * sizeof(float) * (gather_all ? m->size - 1 : m->rank != s->root);
  const double t2 = cm_now();
  if (st == CLATTN_OK && rc != MPI_SUCCESS)
    st = cm_mpi_fail(m, rc, gather_all ? "MPI_Allgather (states)" : "MPI_Gather (states)");
  if (st == CLATTN_OK && receives) st = merge(m, p, recv, o_n, lse_n);
  const double t3 = cm_now();
  st = cm_agree(m, st);
  const double t4 = cm_now();
  m->stats.calls++;
  m->stats.seconds += t4 - t0;
  m->stats.seconds_compute += (t1 - t_agreed) + (t3 - t2);
  m->stats.seconds_wait += t2 - t1;
  m->stats.seconds_agree += (t_agreed - t0) + (t4 - t3);
  return st;
}
