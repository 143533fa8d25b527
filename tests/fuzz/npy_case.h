/*
 * One fuzz case of the .npy reader (tools/cli/npy.c): bytes as a whole .npy
 * file through npy_decode, then what must hold whatever the bytes:
 *
 *   - it returns 0 or -1, and the header parser alone agrees on the header;
 *   - on -1: a non-empty message, nothing allocated;
 *   - on 0: a supported dtype, the shape's product is the element count,
 *     the header and data are exactly the input's size, and every element
 *     is the one the bytes hold at its C- or Fortran-order position
 *     (walked here with an odometer, independently of npy.c's indexing).
 *
 * Shared by the libFuzzer harness (fuzz_npy.c) and the unit-suite test that
 * replays tests/fuzz/npy/corpus and tests/fuzz/npy/regressions (test_npy.c).
 */
#ifndef CLATTN_FUZZ_NPY_CASE_H
#define CLATTN_FUZZ_NPY_CASE_H

#include <stddef.h>
#include <stdint.h>

/* 0 when every property held, -1 with what was violated in why. */
int npy_case_check(const uint8_t *data, size_t size, char *why, size_t whylen);

#endif
