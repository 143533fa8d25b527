/* The MPI layer's position arithmetic (src/mpi/geometry.c), cell by cell and
 * without MPI: for random (query block, key block, window) triples, the box
 * with its shifted windows under clattn_forward's bottom-right rule allows
 * exactly the globally allowed cells, its windows lie in the range the API
 * accepts, and the zig-zag chunks tile the sequence. */
#include <stdint.h>
#include <stdio.h>

#include "geometry.h"

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static int draw(int n) { /* 0 .. n-1 */
  rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
  return (int)(rng % (uint64_t)n);
}

/* clattn_forward's rule for local row i, key j (docs/DESIGN.md, Semantics). */
static int core_allowed(int i, int j, int q_len, int kv_len, int wl, int wr) {
  const long long p = (long long)i + kv_len - q_len;
  return (wl < 0 || j >= p - wl) && (wr < 0 || j <= p + wr);
}

int main(void) {
  long failures = 0, cells = 0, empties = 0, trimmed = 0;
  for (int trial = 0; trial < 20000 && failures < 20; trial++) {
    const int q_len = 1 + draw(24), k_len = 1 + draw(24);
    const long long q0 = draw(80), k0 = draw(80);
    const int kind = draw(4); /* unbounded, causal, causal + left, two-sided */
    const int wl = kind == 0 || kind == 1 ? -1 : draw(30);
    const int wr = kind == 0 ? -1 : kind == 3 ? draw(30) : 0;
    cm_box b;
    cm_block_box(q0, q_len, k0, k_len, wl, wr, &b);
    int any = 0;
    for (int i = 0; i < q_len; i++)
      for (int j = 0; j < k_len; j++) any |= cm_allowed(q0 + i, k0 + j, wl, wr);
    if (b.empty != !any) {
      printf("FAIL: q0=%lld q_len=%d k0=%lld k_len=%d wl=%d wr=%d: empty=%d but any=%d\n", q0, q_len, k0, k_len, wl, wr,
             b.empty, any);
      failures++;
      continue;
    }
    if (b.empty) {
      empties++;
      continue;
    }
    if ((wl < 0) != (b.window_left < 0) || (wr < 0) != (b.window_right < 0) || b.window_left < -1 ||
        b.window_right < -1 || b.q_lo < 0 || b.q_hi > q_len || b.q_lo >= b.q_hi || b.k_lo < 0 || b.k_hi > k_len ||
        b.k_lo >= b.k_hi) {
      printf("FAIL: q0=%lld q_len=%d k0=%lld k_len=%d wl=%d wr=%d: box rows [%d,%d) keys [%d,%d) windows %d,%d\n", q0,
             q_len, k0, k_len, wl, wr, b.q_lo, b.q_hi, b.k_lo, b.k_hi, b.window_left, b.window_right);
      failures++;
      continue;
    }
    trimmed += b.q_hi - b.q_lo < q_len || b.k_hi - b.k_lo < k_len;
    const int bq = b.q_hi - b.q_lo, bk = b.k_hi - b.k_lo;
    for (int i = 0; i < q_len; i++)
      for (int j = 0; j < k_len; j++) {
        const int in_box = i >= b.q_lo && i < b.q_hi && j >= b.k_lo && j < b.k_hi;
        const int local = in_box && core_allowed(i - b.q_lo, j - b.k_lo, bq, bk, b.window_left, b.window_right);
        const int global = cm_allowed(q0 + i, k0 + j, wl, wr);
        cells++;
        if (local != global) {
          printf("FAIL: q0=%lld q_len=%d k0=%lld k_len=%d wl=%d wr=%d cell (%d,%d): core %d, global %d\n", q0, q_len,
                 k0, k_len, wl, wr, i, j, local, global);
          failures++;
          i = q_len;
          break;
        }
      }
  }
  if (cm_local_kv_len(50, 40, 16) != 10 || cm_local_kv_len(50, 60, 16) != 0 || cm_local_kv_len(90, 40, 16) != 16) {
    printf("FAIL: cm_local_kv_len\n");
    failures++;
  }
  for (int ranks = 1; ranks <= 8; ranks++)
    for (int seq = 2 * ranks; seq < 2 * ranks + 40; seq++) {
      int covered[200] = {0}, lo = seq, hi = 0;
      for (int r = 0; r < ranks; r++) {
        int off[2], len[2];
        cm_ring_chunks(seq, ranks, r, off, len);
        for (int c = 0; c < 2; c++) {
          if (len[c] < seq / (2 * ranks) || len[c] > seq / (2 * ranks) + 1) lo = -1;
          for (int x = off[c]; x < off[c] + len[c] && x < 200; x++) covered[x]++;
        }
        if (off[0] > off[1]) hi = -1; /* chunk r comes before chunk 2R-1-r */
      }
      for (int x = 0; x < seq; x++)
        if (covered[x] != 1) lo = -1;
      if (lo < 0 || hi < 0) {
        printf("FAIL: zig-zag chunks of %d tokens over %d ranks\n", seq, ranks);
        failures++;
      }
    }
  printf("%ld cells checked, %ld empty pairs, %ld trimmed boxes: %s\n", cells, empties, trimmed,
         failures ? "FAIL" : "ok");
  return failures ? 1 : 0;
}
