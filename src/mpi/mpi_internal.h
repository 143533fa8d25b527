/* Internals of libclattn_mpi: the handle, failures, staging, agreement. */
#ifndef CLATTN_MPI_INTERNAL_H
#define CLATTN_MPI_INTERNAL_H

#include "clattn_mpi.h"
#include "geometry.h"

/* A grow-only staging buffer: host memory or a device buffer. */
typedef struct {
  void *host;
  cl_mem dev;
  size_t bytes;
} cm_buf;

enum { CM_HOST_SEND, CM_HOST_RECV, CM_HOST_LENS, CM_HOST_COUNT };
/* Device staging: states (O, lse), a K/V block, local kv_lens per block in flight. */
enum { CM_DEV_O, CM_DEV_LSE, CM_DEV_KV, CM_DEV_LENS0, CM_DEV_COUNT = CM_DEV_LENS0 + 4 };

/* Ints in the largest problem descriptor a call agrees on. */
enum { CM_DESC_MAX = 24 };

struct clattn_mpi {
  clattn_context *ctx;
  MPI_Comm comm; /* our duplicate, MPI_ERRORS_RETURN */
  int rank, size;
  int *agree; /* size * (CM_DESC_MAX + 1): the descriptor agreement's gather, made at
                 creation so no call fails locally before it can take part */
  char msg[768];
  clattn_mpi_stats stats;
  cm_buf host[CM_HOST_COUNT];
  cm_buf dev[CM_DEV_COUNT];
};

/* Record a failure on m and return st (printf-style message). */
clattn_status cm_fail(clattn_mpi *m, clattn_status st, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
clattn_status cm_cl_fail(clattn_mpi *m, cl_int err, const char *what);
clattn_status cm_mpi_fail(clattn_mpi *m, int rc, const char *what);
/* A clattn call failed: its status with clattn_last_error's text. */
clattn_status cm_clattn_fail(clattn_mpi *m, clattn_status st, const char *what);

double cm_now(void);

/* Buffers of at least bytes (contents are not kept on growth). */
clattn_status cm_host(clattn_mpi *m, int which, size_t bytes, void **out);
clattn_status cm_dev(clattn_mpi *m, int which, size_t bytes, cl_mem *out);

/* Whether a 4-d f32 input view fits its cl_mem (BUFFER_TOO_SMALL when not),
 * for the views this layer reads itself, checked before any data moves. */
clattn_status cm_check_view(clattn_mpi *m, const char *fn, const char *name, const clattn_tensor *t, const int dims[4]);
/* Reads a 4-d f32 view into packed host memory [d0,d1,d2,d3]. */
clattn_status cm_read_view(clattn_mpi *m, const clattn_tensor *t, const int dims[4], float *dst);
/* Reads int32 kv_lens [batch] to host. */
clattn_status cm_read_lens(clattn_mpi *m, cl_mem lens, int batch, int *dst);
/* Fills n floats of buf from element offset with value. */
clattn_status cm_fill(clattn_mpi *m, cl_mem buf, size_t offset, size_t n, float value);
/* The sinks as one more partial state of rows [B, H, rows]: O = 0 at
 * o_off (packed [B,H,rows,dv]), lse = sinks[h] at lse_off (packed [B,H,rows]). */
clattn_status cm_sink_state(clattn_mpi *m, cl_mem sinks, size_t sinks_offset, int batch, int heads, int rows, int dv,
                            cl_mem o, size_t o_off, cl_mem lse, size_t lse_off);
/* Waits for the events while driving the requests (MPI progresses only
 * inside MPI calls); *req_done is set once they completed. */
clattn_status cm_wait_overlapped(clattn_mpi *m, cl_event *ev, int n_ev, MPI_Request *req, int n_req, int *req_done);

/* Features the layer cannot make exact across shards (UNSUPPORTED). */
clattn_status cm_check_support(clattn_mpi *m, const clattn_params *p, const char *fn);

/* First agreement, before any data moves: every rank's status and its
 * descriptor (n ints) gathered into all[size * (n + 1)] (slot 0 of each is
 * the status). When a rank failed, every rank returns its status and
 * message. */
clattn_status cm_agree_descriptors(clattn_mpi *m, clattn_status local, const int *desc, int n, int *all);
/* Last agreement: the first failing rank's status and message, everywhere. */
clattn_status cm_agree(clattn_mpi *m, clattn_status local);

/* One (query block, key block) pair on the device. */
typedef struct {
  const clattn_params *p; /* the caller's call: shapes, scale, score, algo */
  clattn_tensor q, k, v;  /* views of the blocks' first rows */
  int q_len, k_len;
  long long q_pos, k_pos; /* global positions of the first rows */
  int wl, wr;             /* global windows, causal folded into wr */
  const int *kv_lens;     /* global valid keys per batch row (host), or NULL */
  clattn_tensor out, lse; /* the state's views of the block's rows; lse of rows
                             outside the box must already hold -inf */
} cm_block;

/* Enqueues the block's forward (kv_lens written through lens_buf, one per
 * block in flight); *done is NULL when the block has no allowed key. */
clattn_status cm_block_forward(clattn_mpi *m, const cm_block *b, cl_mem lens_buf, cl_event *done);
/* Whether a block reaches every row (else the lse must be filled first). */
int cm_block_covers(const cm_block *b);

#endif
