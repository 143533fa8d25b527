/* One fuzz case of the .npy reader (npy_case.h). */
#include "npy_case.h"

#include <stdio.h>
#include <string.h>

#include "npy.h"
#include "problem.h"

#define VIOLATED(...) return snprintf(why, whylen, __VA_ARGS__), -1

/* Whether C-order element i holds the value of the bytes at e. */
static int element_matches(const npy_array *a, size_t i, const uint8_t *e) {
  switch (a->h.dtype) {
    case NPY_F32: {
      uint32_t bits = (uint32_t)e[0] | (uint32_t)e[1] << 8 | (uint32_t)e[2] << 16 | (uint32_t)e[3] << 24, got;
      memcpy(&got, &a->f[i], sizeof got);
      return got == bits;
    }
    case NPY_F16: {
      float want = cp_f16_value((uint16_t)(e[0] | e[1] << 8));
      return memcmp(&want, &a->f[i], sizeof want) == 0;
    }
    case NPY_U8: return a->u8[i] == e[0];
    case NPY_BOOL: return a->u8[i] == (e[0] != 0);
  }
  return 0;
}

int npy_case_check(const uint8_t *data, size_t size, char *why, size_t whylen) {
  char err[1024] = "", herr[1024] = "";
  npy_array a;
  npy_header h;
  const int rc = npy_decode(data, size, &a, err, sizeof err);
  const int hrc = npy_parse_header(data, size, &h, herr, sizeof herr);
  if (rc != 0 && rc != -1) VIOLATED("npy_decode returned %d", rc);
  if (rc == 0 && hrc != 0) VIOLATED("npy_decode accepted what npy_parse_header refused");
  if (rc != 0) {
    if (!err[0] || !memchr(err, 0, sizeof err)) VIOLATED("refused without a message");
    if (a.f || a.u8) VIOLATED("refused but left an allocation");
    return 0;
  }
  const npy_header *ah = &a.h;
  int fail = 0;
  if (ah->ndim < 0 || ah->ndim > NPY_MAX_DIMS) fail = snprintf(why, whylen, "ndim %d", ah->ndim);
  size_t count = 1;
  for (int d = 0; !fail && d < ah->ndim; d++) count *= ah->shape[d];
  const size_t elem = ah->dtype == NPY_F32 ? 4 : ah->dtype == NPY_F16 ? 2 : 1;
  if (!fail && (count != ah->count || elem != ah->elem_size))
    fail = snprintf(why, whylen, "count %zu / element size %zu, the shape says %zu / %zu", ah->count, ah->elem_size,
                    count, elem);
  if (!fail && (ah->data_offset > size || ah->data_offset + count * elem != size))
    fail = snprintf(why, whylen, "data offset %zu + %zu elements of %zu bytes != size %zu", ah->data_offset, count,
                    elem, size);
  if (!fail && ((ah->dtype <= NPY_F16) ? !a.f || a.u8 : !a.u8 || a.f))
    fail = snprintf(why, whylen, "the values are not where the dtype says");
  /* walk the file's elements in storage order with an odometer over the
   * C-order index: the last dimension fastest (C), or the first (Fortran) */
  size_t idx[NPY_MAX_DIMS] = {0};
  for (size_t k = 0; !fail && k < count; k++) {
    size_t c = 0;
    for (int d = 0; d < ah->ndim; d++) c = c * ah->shape[d] + idx[d];
    if (!element_matches(&a, c, data + ah->data_offset + k * elem))
      fail = snprintf(why, whylen, "element %zu (C order) is not byte %zu's value", c, ah->data_offset + k * elem);
    if (ah->fortran_order)
      for (int d = 0; d < ah->ndim && ++idx[d] == ah->shape[d]; d++) idx[d] = 0;
    else
      for (int d = ah->ndim - 1; d >= 0 && ++idx[d] == ah->shape[d]; d--) idx[d] = 0;
  }
  npy_free(&a);
  return fail ? -1 : 0;
}
