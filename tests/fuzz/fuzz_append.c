/*
 * libFuzzer harness for clattn_kv_append: each input decodes into one
 * clattn_append_params with device buffers (tests/fuzz/append_case.c
 * documents the format) and goes through append_case.h's checks; a violation
 * prints what was violated and traps so that libFuzzer saves the input.
 * Built only with clang (-fsanitize=fuzzer); run it with tools/scripts/fuzz.sh append.
 * LLVMFuzzerInitialize builds the append program of every storage pair
 * (fz_append_warm_up), outside libFuzzer's per-input timeout.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "append_case.h"
#include "fuzz_case.h"

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  fz_initialize("fuzz_append", fz_append_warm_up);
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char why[2048];
  if (fz_append_run(data, size, why, sizeof why) == FZ_FAIL) {
    fprintf(stderr, "\nfuzz_append: VIOLATION: %s\n", why);
    __builtin_trap();
  }
  return 0;
}
