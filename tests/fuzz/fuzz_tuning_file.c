/*
 * libFuzzer target: fz_tuning_file (fuzz_parsers.c) on every input; a violation
 * prints what was violated and traps so that libFuzzer saves the input.
 * Built only with clang (-fsanitize=fuzzer); run it with
 * tools/scripts/fuzz.sh tuning-file [SECONDS]. No device is needed.
 */
#include <stdio.h>

#include "fuzz_parsers.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char why[512];
  if (fz_tuning_file(data, size, NULL, why, sizeof why) != FZ_PASS) {
    fprintf(stderr, "\nfuzz_tuning_file: VIOLATION: %s\n", why);
    __builtin_trap();
  }
  return 0;
}
