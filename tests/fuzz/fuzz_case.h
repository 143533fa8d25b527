/*
 * One fuzz case: bytes -> clattn_params (every field, hostile values too) +
 * device buffers + host copies, one clattn_forward call, and every check
 * the contract allows (include/clattn.h, docs/semantics.md):
 *
 *   - the status is one of the enum's values, and one of the statuses the
 *     host-side rules predict (a call the rules reject must be rejected, a
 *     call they accept must not be);
 *   - a rejected call leaves every output buffer bitwise unchanged, sets
 *     *done to NULL and leaves a message in clattn_last_error of its own;
 *   - an accepted call (OK, or EMPTY_ROW under EMPTY_ERROR) writes every
 *     element of every output view, no element outside them (canaries),
 *     and matches the fp64 reference (tools/reference/reference.h) within 1e-4
 *     norm-wise with the NaN / +-inf class of every element exact. The
 *     reference reads the stored values (16-bit widened, Q8_0 / INT8
 *     dequantised in f32 as the kernels do, paged keys gathered through the
 *     block table from each row's start (cache_leftpad), keys on pages
 *     outside the pool or under a -inf bias masked out) and draws the
 *     call's dropout with its own Philox; 16-bit out
 *     and quantised K/V widen the tolerance (f16 1e-3, bf16 8e-3, quantised
 *     1e-3). With packed sequences, rows past a sequence's end and out rows
 *     that malformed offsets give to no sequence or to several have no
 *     defined value: they are not compared and may keep their canary.
 *
 * Shared by the libFuzzer harness (fuzz_forward.c) and the opencl-suite
 * test that replays tests/fuzz/corpus and tests/fuzz/regressions
 * (test_fuzz_regressions.c). The input format is documented in
 * fuzz_case.c and written by tools/scripts/fuzz_seeds.py.
 */
#ifndef CLATTN_FUZZ_CASE_H
#define CLATTN_FUZZ_CASE_H

#include <stddef.h>
#include <stdint.h>

#include "clattn.h"

enum { FZ_PASS = 0, FZ_SKIP = 1, FZ_FAIL = -1 };

typedef struct {
  long inputs;        /* fz_run calls */
  long calls;         /* clattn_forward calls made */
  long skipped;       /* accepted by the rules but over the work cap / dims set */
  long accepted;      /* OK or EMPTY_ROW */
  long empty_row;     /* EMPTY_ROW under EMPTY_ERROR */
  long ext_accepted;  /* accepted inputs of the extended format (fuzz_fields.h) */
  long rejected;      /* any other status (all predicted) */
  long known_good;    /* known-good calls run */
  long known_skipped; /* violations of known bugs tolerated (CLATTN_FUZZ_KNOWN) */
} fz_stats;

/* The shared clattn context: created on first use with the default device,
 * no tuning file (AUTO keeps its built-in rule), and kept for the process.
 * NULL when creation fails (message in why); *no_device set when the
 * failure is CLATTN_ERR_NO_DEVICE. */
clattn_context *fz_context(char *why, size_t n, int *no_device);

/* Builds everything a run needs before its first input: the context, the
 * fused programs of every (head_dim, value_dim) pair the decoder yields, the
 * staged and GEMM paths (CLBlast's kernels), each through a checked call.
 * Seconds per program the first time; the disk caches make it quick after. */
int fz_warm_up(char *why, size_t n);

/* A libFuzzer harness's LLVMFuzzerInitialize: the context (exit 77 without
 * a device, 1 on another failure), warm_up outside the per-input timeout,
 * and POCL's LLVM signal handlers back to the defaults. `who` names the
 * harness in messages. */
void fz_initialize(const char *who, int (*warm_up)(char *why, size_t n));

/* Decodes and checks one input. FZ_PASS, FZ_SKIP (nothing to check: the
 * call would be valid but exceed the work cap), or FZ_FAIL with the
 * violation in why. Never aborts. */
int fz_run(const uint8_t *data, size_t size, char *why, size_t n);

/* A small known-good problem through the problem kit, compared with the
 * reference (checks that the context still works). FZ_PASS or FZ_FAIL. */
int fz_known_good(char *why, size_t n);

/* One line describing what the input decodes to (for messages). */
void fz_describe(const uint8_t *data, size_t size, char *buf, size_t n);

/* Counters since the process started. */
const fz_stats *fz_get_stats(void);

/* Frees the known-good problem and destroys the context (for leak checks). */
void fz_shutdown(void);

#endif
