/* Dropout's words for the kernels (cl/args.h.cl's ca_drop) and the same
 * draw on the host (clattn_dropout_mask). */
#include <math.h>
#include <string.h>

#include "plan/plan.h"

ca_drop ca_dropout_words(const clattn_params *p) {
  ca_drop d;
  memset(&d, 0, sizeof d);
  if (!(p->dropout_p > 0.0f)) return d;
  const float factor = (float)(1.0 / (1.0 - (double)p->dropout_p));
  d.key_lo = (cl_uint)p->dropout_seed;
  d.key_hi = (cl_uint)(p->dropout_seed >> 32);
  d.offset_lo = (cl_uint)p->dropout_offset;
  d.offset_hi = (cl_uint)(p->dropout_offset >> 32);
  d.threshold = (cl_uint)floor((double)p->dropout_p * 4294967296.0); /* dropout_p < 1: below 2^32 */
  memcpy(&d.factor, &factor, sizeof factor);
  d.on = 1;
  return d;
}

/* Philox4x32-10 (Salmon et al., Random123): ten rounds of two 32x32->64
 * products, the key bumped by the Weyl constants after each. */
static void philox4x32_10(cl_uint c[4], cl_uint k0, cl_uint k1) {
  for (int round = 0; round < 10; round++) {
    const cl_ulong p0 = (cl_ulong)0xD2511F53u * c[0], p1 = (cl_ulong)0xCD9E8D57u * c[2];
    const cl_uint next[4] = {(cl_uint)(p1 >> 32) ^ c[1] ^ k0, (cl_uint)p1, (cl_uint)(p0 >> 32) ^ c[3] ^ k1,
                             (cl_uint)p0};
    memcpy(c, next, sizeof next);
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
}

int ca_dropout_kept(const ca_drop *d, long b, long h, long i, long j) {
  const cl_ulong at = ((cl_ulong)d->offset_hi << 32 | d->offset_lo) + ((cl_ulong)i << 32) + (cl_ulong)(j / 4);
  cl_uint x[4] = {(cl_uint)at, (cl_uint)(at >> 32), (cl_uint)h, (cl_uint)b};
  philox4x32_10(x, d->key_lo, d->key_hi);
  return x[j % 4] >= d->threshold;
}
