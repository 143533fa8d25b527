/* Dropout: the words the kernels take (cl/common.h.cl's CA_DROP_ARGS), the
 * per-call buffer that carries them, and the same mask on the host
 * (clattn_dropout_mask). */
#include <math.h>
#include <string.h>

#include "internal.h"

/* The six words: the Philox key (seed), the offset, the threshold, the
 * factor of a kept weight. */
static void dropout_words(const clattn_params *p, cl_uint w[6]) {
  const float factor = (float)(1.0 / (1.0 - (double)p->dropout_p));
  w[0] = (cl_uint)p->dropout_seed;
  w[1] = (cl_uint)(p->dropout_seed >> 32);
  w[2] = (cl_uint)p->dropout_offset;
  w[3] = (cl_uint)(p->dropout_offset >> 32);
  w[4] = (cl_uint)floor((double)p->dropout_p * 4294967296.0); /* dropout_p < 1: below 2^32 */
  memcpy(&w[5], &factor, sizeof factor);
}

clattn_status ca_dropout_take(clattn_context *ctx, const clattn_params *p, cl_mem *out) {
  *out = NULL;
  if (!(p->dropout_p > 0.0f)) return CLATTN_OK;
  cl_uint w[6];
  dropout_words(p, w);
  cl_int err = CL_SUCCESS;
  *out = clCreateBuffer(ctx->context, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, sizeof w, w, &err);
  return err == CL_SUCCESS ? CLATTN_OK : ca_cl_fail(err, "clCreateBuffer(dropout words)");
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

clattn_status clattn_dropout_mask(const clattn_params *p, int b, int h, int row0, int rows, int col0, int cols,
                                  unsigned char *mask) {
  if (!p || !mask) return ca_fail(CLATTN_ERR_INVALID_ARGUMENT, "clattn_dropout_mask: params or mask is NULL");
  if (b < 0 || h < 0 || row0 < 0 || rows < 0 || col0 < 0 || cols < 0)
    return ca_fail(CLATTN_ERR_INVALID_ARGUMENT, "clattn_dropout_mask: b, h, row0, rows, col0 and cols must be >= 0");
  if (!(p->dropout_p >= 0.0f && p->dropout_p < 1.0f))
    return ca_fail(CLATTN_ERR_INVALID_ARGUMENT, "clattn_dropout_mask: dropout_p must be in [0, 1) (got %g)",
                   (double)p->dropout_p);
  cl_uint w[6];
  dropout_words(p, w);
  for (long r = 0; r < rows; r++)
    for (long c = 0; c < cols; c++) {
      const long i = row0 + r, j = col0 + c;
      const cl_ulong at = ((cl_ulong)w[3] << 32 | w[2]) + ((cl_ulong)i << 32) + (cl_ulong)(j / 4);
      cl_uint x[4] = {(cl_uint)at, (cl_uint)(at >> 32), (cl_uint)h, (cl_uint)b};
      philox4x32_10(x, w[0], w[1]);
      mask[r * (long)cols + c] = x[j % 4] >= w[4];
    }
  return CLATTN_OK;
}
