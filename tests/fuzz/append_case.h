/*
 * One fuzz case of clattn_kv_append (append_case.c documents the format):
 * bytes -> clattn_append_params with device buffers, one call, and the
 * contract's checks:
 *
 *   - the status is one the host-side rules predict (validate.c's
 *     ca_validate_append): a call they reject is rejected, one they accept
 *     is not;
 *   - a rejected call leaves the cache (k, v, k_scale, v_scale) bitwise
 *     unchanged and a message of its own;
 *   - an accepted call leaves the cache byte for byte as the host model
 *     says: each new row stored with ggml's rules (test kit:
 *     cp_quantize_q8_0_row, cp_quantize_int8_row, 16-bit rounding) at its
 *     position, rows past the capacity, past the block table or on pages
 *     outside the pool skipped, every other byte untouched. A cache row two
 *     new rows land on (shared pages) may hold either: it is not compared.
 *
 * Shared by the libFuzzer harness (fuzz_append.c) and test_fuzz_regressions
 * (--append: tests/fuzz/corpus-append, written by tools/scripts/fuzz_seeds.py).
 */
#ifndef CLATTN_APPEND_CASE_H
#define CLATTN_APPEND_CASE_H

#include <stddef.h>
#include <stdint.h>

/* Decodes and checks one input: FZ_PASS, FZ_SKIP or FZ_FAIL (why). */
int fz_append_run(const uint8_t *data, size_t size, char *why, size_t n);

/* Builds the append program of every (source, cache) storage pair through a
 * checked call (seconds each the first time): FZ_PASS or FZ_FAIL. */
int fz_append_warm_up(char *why, size_t n);

#endif
