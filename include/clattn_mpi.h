/*
 * clattn_mpi — attention across devices and machines over MPI (optional;
 * libclattn_mpi, built when MPI is found). The core library never depends on
 * MPI: this layer only calls clattn's public API.
 *
 *   KV-sharded attention   each rank holds a contiguous shard of the keys,
 *                          queries are replicated; every rank (or a root)
 *                          gets the exact (O, lse) of the whole problem.
 *   Ring attention         Q, K, V sharded by sequence, zig-zag chunks for
 *                          causal balance; K/V blocks travel round the ring
 *                          while each rank computes on the block it holds.
 *
 * Causal and window rules apply to GLOBAL positions (docs/mpi.md).
 * Device data is staged through host memory. Every call is
 * collective over the handle's communicator and blocking: it returns when
 * the outputs are written. A failure on one rank (bad input, OpenCL or MPI
 * error) returns the same status and message on every rank; nothing aborts.
 * The ranks agree over the handle's communicator, so a rank passing a NULL
 * handle cannot take part: it returns INVALID_ARGUMENT at once and the
 * others wait for it; every rank must pass its handle.
 */
#ifndef CLATTN_MPI_H
#define CLATTN_MPI_H

#include <mpi.h>

#include "clattn.h"

#ifdef __cplusplus
extern "C" {
#endif

/* An MPI call failed (the message names it). Outside clattn_status's named
 * values; clattn_mpi_status_string knows it. */
#define CLATTN_MPI_ERR_COMM ((clattn_status)64)

typedef struct clattn_mpi clattn_mpi;

/* Collective over comm: duplicates it (errors return, never abort) and keeps
 * host and device staging buffers between calls. ctx is this rank's device.
 * The ranks agree on success before the duplication (an MPI_Allreduce over
 * comm): a failure on one rank (NULL ctx or out, OUT_OF_MEMORY) returns the
 * first failing rank's status on every rank at once, and so does one after
 * it (CLATTN_MPI_ERR_COMM); *out is NULL then. Without MPI initialised, or
 * with comm MPI_COMM_NULL, there is no one to agree with: INVALID_ARGUMENT
 * on that rank alone. comm's error handler is the caller's again on return. */
CLATTN_EXPORT clattn_status clattn_mpi_create(clattn_context *ctx, MPI_Comm comm, clattn_mpi **out);
/* Collective: frees the duplicate communicator and the buffers. A NULL
 * handle does nothing and holds no other rank up. */
CLATTN_EXPORT void clattn_mpi_destroy(clattn_mpi *m);
/* The last failure's message on this handle ("rank R: ..." names the rank
 * where it happened); thread-agnostic, like the handle. */
CLATTN_EXPORT const char *clattn_mpi_last_error(const clattn_mpi *m);
CLATTN_EXPORT const char *clattn_mpi_status_string(clattn_status s);

/* KV-sharded attention. p describes this rank's part:
 *   q, out, lse   the whole query rows (replicated), [B,Hq,M,*]; out and lse
 *                 receive the merged result (lse optional);
 *   k, v          this rank's shard, p->kv_len keys (0 = empty shard; the
 *                 views are then ignored);
 *   kv_lens       GLOBAL valid keys per batch row, or NULL;
 *   causal, windows: over global positions, queries aligned to kv_total
 *                 (query i sits at i + kv_total - q_len).
 * The shards must be disjoint and cover [0, kv_total). Supported: f32,
 * scale, softcap, additive score, causal, windows, kv_lens, empty_rows,
 * sinks (joined once, at the merge; not with EMPTY_ERROR). Refused
 * (UNSUPPORTED): f16/bf16, mask, bias, ALiBi, packed sequences, weights and
 * route diagnostics. */
typedef struct {
  int kv_offset; /* global index of this rank's first key */
  int kv_total;  /* N, the global number of keys */
  int root;      /* -1: every rank receives out/lse (allgather); else only root (gather) */
} clattn_mpi_kv_shard;

CLATTN_EXPORT clattn_status clattn_mpi_kv_sharded_forward(clattn_mpi *m, const clattn_params *p,
                                                          const clattn_mpi_kv_shard *s);

/* Ring attention for prefill over one sequence of seq_len tokens (queries
 * and keys the same positions). The sequence is cut into 2R chunks (sizes
 * differ by at most one); rank r holds chunks r and 2R-1-r, in that order,
 * as its local rows. */
typedef struct {
  int offset[2], len[2]; /* global first position and length of each chunk */
  int rows;              /* len[0] + len[1]: the local q_len and kv_len */
} clattn_mpi_ring_layout;

CLATTN_EXPORT clattn_status clattn_mpi_ring_layout_of(int seq_len, int ranks, int rank, clattn_mpi_ring_layout *out);

/* p: this rank's rows in layout order: q, k, v, out, lse (optional) with
 * q_len = kv_len = layout.rows; kv_lens GLOBAL (padding past the valid
 * length), or NULL; causal and windows over global positions. Same support
 * as clattn_mpi_kv_sharded_forward. */
CLATTN_EXPORT clattn_status clattn_mpi_ring_forward(clattn_mpi *m, const clattn_params *p, int seq_len);

/* What the calls on this handle did, summed since creation or the last reset. */
typedef struct {
  int calls;
  double bytes_sent;      /* payload this rank sent (O and lse states, K/V blocks) */
  double seconds;         /* wall time inside the calls */
  double seconds_compute; /* local forwards, staging and merges, incl. device waits */
  double seconds_wait;    /* waiting on data transfers that the compute did not hide */
  double seconds_agree;   /* in the status agreements, incl. waiting for the last rank to arrive */
  int ring_transfers;     /* ring steps that moved a K/V block */
  int ring_hidden;        /* of those, the ones complete before the step's compute ended */
} clattn_mpi_stats;

CLATTN_EXPORT void clattn_mpi_get_stats(clattn_mpi *m, clattn_mpi_stats *out, int reset);

#ifdef __cplusplus
}
#endif
#endif /* CLATTN_MPI_H */
