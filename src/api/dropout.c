/* clattn_dropout_mask: the dropout mask of a call, drawn on the host. */
#include "api/api.h"

clattn_status clattn_dropout_mask(const clattn_params *p, int b, int h, int row0, int rows, int col0, int cols,
                                  unsigned char *mask) {
  if (!p || !mask) return ca_fail(CLATTN_ERR_INVALID_ARGUMENT, "clattn_dropout_mask: params or mask is NULL");
  clattn_params own;
  const clattn_status st = ca_params_in(p, &own, "params");
  if (st != CLATTN_OK) return st;
  p = &own;
  if (b < 0 || h < 0 || row0 < 0 || rows < 0 || col0 < 0 || cols < 0)
    return ca_fail(CLATTN_ERR_INVALID_ARGUMENT, "clattn_dropout_mask: b, h, row0, rows, col0 and cols must be >= 0");
  if (!(p->dropout_p >= 0.0f && p->dropout_p < 1.0f))
    return ca_fail(CLATTN_ERR_INVALID_ARGUMENT, "clattn_dropout_mask: dropout_p must be in [0, 1) (got %g)",
                   (double)p->dropout_p);
  const ca_drop d = ca_dropout_words(p);
  for (long r = 0; r < rows; r++)
    for (long c = 0; c < cols; c++) mask[r * (long)cols + c] = (unsigned char)ca_dropout_kept(&d, b, h, row0 + r, col0 + c);
  return CLATTN_OK;
}
