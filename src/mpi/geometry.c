/* Global positions over local blocks (see geometry.h). */
#include "geometry.h"

int cm_allowed(long long x, long long y, int wl, int wr) { return (wl < 0 || y >= x - wl) && (wr < 0 || y <= x + wr); }

void cm_block_box(long long q0, int q_len, long long k0, int k_len, int wl, int wr, cm_box *out) {
  *out = (cm_box){1, 0, 0, 0, 0, -1, -1};
  if (q_len <= 0 || k_len <= 0) return;
  const long long q_last = q0 + q_len - 1, k_last = k0 + k_len - 1;
  /* Rows with an allowed key form one run: row x sees keys from x - wl to
   * x + wr, both bounds rising with x. */
  long long xa = q0, xb = q_last;
  if (wr >= 0 && k0 - wr > xa) xa = k0 - wr;
  if (wl >= 0 && k_last + wl < xb) xb = k_last + wl;
  if (xa > xb) return;
  /* The lowest allowed key belongs to the first such row, the highest to the last. */
  long long ya = k0, yb = k_last;
  if (wl >= 0 && xa - wl > ya) ya = xa - wl;
  if (wr >= 0 && xb + wr < yb) yb = xb + wr;
  const long long shift = xb - yb; /* box's q_len - kv_len minus its global offset */
  out->empty = 0;
  out->q_lo = (int)(xa - q0);
  out->q_hi = (int)(xb - q0 + 1);
  out->k_lo = (int)(ya - k0);
  out->k_hi = (int)(yb - k0 + 1);
  out->window_left = wl < 0 ? -1 : (int)(wl - shift);
  out->window_right = wr < 0 ? -1 : (int)(wr + shift);
}

int cm_local_kv_len(long long kv_len_global, long long k0, int k_len) {
  const long long n = kv_len_global - k0;
  return n < 0 ? 0 : n > k_len ? k_len : (int)n;
}

void cm_chunk(int seq_len, int chunks, int c, int *offset, int *len) {
  const int base = seq_len / chunks, extra = seq_len % chunks;
  *offset = c * base + (c < extra ? c : extra);
  *len = base + (c < extra);
}

void cm_ring_chunks(int seq_len, int ranks, int rank, int offset[2], int len[2]) {
  cm_chunk(seq_len, 2 * ranks, rank, &offset[0], &len[0]);
  cm_chunk(seq_len, 2 * ranks, 2 * ranks - 1 - rank, &offset[1], &len[1]);
}
