/*
 * libFuzzer harness for clattn_forward: each input decodes into one
 * clattn_params with device buffers (tests/fuzz/fuzz_case.c documents the
 * format) and goes through every check of fuzz_case.h; a violation prints
 * what was violated and the decoded case, then traps so that libFuzzer
 * saves the input. Every 100 inputs a known-good call checks that the
 * context still works.
 *
 * Built only with clang (-fsanitize=fuzzer); run it with tools/scripts/fuzz.sh.
 * The clattn context (seconds of kernel builds on POCL) is created once in
 * LLVMFuzzerInitialize, outside libFuzzer's per-input timeout, together
 * with one call of each path and of every head-dim pair the decoder
 * yields (fz_warm_up), so no kernel build is charged to an input.
 *
 * CLATTN_FUZZ_KNOWN=alias,nan-row-weights,ref-inf-row-diag tolerates known library bugs
 * (fuzz_case.c) so a run can explore past them.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "fuzz_case.h"

static void report_stats(void) {
  const fz_stats *s = fz_get_stats();
  fprintf(stderr,
          "fuzz_forward: %ld inputs, %ld calls, %ld accepted (%ld empty-row, %ld of the extended format), "
          "%ld rejected, %ld skipped over the work cap, %ld known-good calls, %ld known-bug violations tolerated\n",
          s->inputs, s->calls, s->accepted, s->empty_row, s->ext_accepted, s->rejected, s->skipped, s->known_good,
          s->known_skipped);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  fz_initialize("fuzz_forward", fz_warm_up);
  atexit(report_stats);
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char why[2048];
  int v = fz_run(data, size, why, sizeof why);
  if (v == FZ_FAIL) {
    char desc[2048];
    fz_describe(data, size, desc, sizeof desc);
    fprintf(stderr, "\nfuzz_forward: VIOLATION: %s\n  case: %s\n", why, desc);
    report_stats();
    __builtin_trap();
  }
  return 0;
}
