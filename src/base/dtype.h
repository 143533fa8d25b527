/* What each clattn_dtype is as storage: its name, the bytes a view of it
 * counts, ggml's 32-element blocks (cl/common.h.cl decodes them). */
#ifndef CLATTN_DTYPE_H
#define CLATTN_DTYPE_H

#include <stddef.h>

#include "clattn.h"

/* The dtypes there are, CLATTN_F32 .. CLATTN_IQ4_NL (array sizes). */
enum { CA_DTYPES = CLATTN_IQ4_NL + 1 };

/* Bytes of one 32-element block of a block type (Q8_0, Q4_0, Q4_1, Q5_0,
 * Q5_1, IQ4_NL); 0 for the others. */
static inline size_t ca_block_bytes(clattn_dtype t) {
  switch (t) {
    case CLATTN_Q8_0: return 34;
    case CLATTN_Q4_0: return 18;
    case CLATTN_Q4_1: return 20;
    case CLATTN_Q5_0: return 22;
    case CLATTN_Q5_1: return 24;
    case CLATTN_IQ4_NL: return 18;
    default: return 0;
  }
}

/* Bytes of the unit a view's offset and strides count: an element (f32 4,
 * f16 and bf16 2, INT8 1), or a byte for the block types. */
static inline size_t ca_unit_bytes(clattn_dtype t) {
  return t == CLATTN_F32 ? 4 : (t == CLATTN_F16 || t == CLATTN_BF16) ? 2 : 1;
}

/* A K/V storage type: any dtype from CLATTN_F32 to CLATTN_IQ4_NL. */
static inline int ca_is_dtype(clattn_dtype t) { return t >= CLATTN_F32 && t <= CLATTN_IQ4_NL; }

/* "CLATTN_Q4_0" ...; "?" outside the enum. */
static inline const char *ca_dtype_name(clattn_dtype t) {
  static const char *const names[CA_DTYPES] = {"CLATTN_F32",  "CLATTN_F16",   "CLATTN_BF16", "CLATTN_Q8_0",
                                               "CLATTN_INT8", "CLATTN_Q4_0",  "CLATTN_Q4_1", "CLATTN_Q5_0",
                                               "CLATTN_Q5_1", "CLATTN_IQ4_NL"};
  return ca_is_dtype(t) ? names[t] : "?";
}

#endif
