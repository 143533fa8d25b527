/* Global positions over local blocks: pure arithmetic, no MPI, no OpenCL
 * (tests/test_mpi_geometry.c checks it cell by cell). */
#ifndef CLATTN_MPI_GEOMETRY_H
#define CLATTN_MPI_GEOMETRY_H

/* The part of a (query block, key block) pair that clattn_forward computes.
 * Query rows sit at global positions q0 .. q0+q_len-1, keys at k0 ..
 * k0+k_len-1; the global rule is x - wl <= y <= x + wr (-1 = unbounded; causal
 * is wr = 0). The box is the bounding box of the allowed cells: its
 * bottom-right cell is allowed, so the local windows after the shift
 * D = (box's last query) - (box's last key) are both >= 0 (or -1), the range
 * clattn_forward accepts, and inside the box they allow exactly the global
 * cells. Rows outside [q_lo, q_hi) see no key of this block. */
typedef struct {
  int empty;                     /* no allowed cell: the pair adds nothing */
  int q_lo, q_hi;                /* query rows, relative to the block's first */
  int k_lo, k_hi;                /* keys, relative to the block's first */
  int window_left, window_right; /* for clattn_forward on the box */
} cm_box;

void cm_block_box(long long q0, int q_len, long long k0, int k_len, int wl, int wr, cm_box *out);

/* The whole-problem rule, for the tests. */
int cm_allowed(long long x, long long y, int wl, int wr);

/* Valid keys of a block whose first key is global k0 and that holds k_len
 * keys, when the global row has kv_len_global valid keys (padding). */
int cm_local_kv_len(long long kv_len_global, long long k0, int k_len);

/* Zig-zag chunks: seq_len cut into 2*ranks chunks whose sizes differ by at
 * most one (the first seq_len % (2*ranks) one longer); rank r holds chunks r
 * and 2*ranks-1-r. */
void cm_chunk(int seq_len, int chunks, int c, int *offset, int *len);
void cm_ring_chunks(int seq_len, int ranks, int rank, int offset[2], int len[2]);

#endif
