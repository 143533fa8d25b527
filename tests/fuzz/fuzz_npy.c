/*
 * libFuzzer harness for the .npy reader of `clattn run` (tools/cli/npy.c): each
 * input is a whole file; npy_case_check's properties must hold, else it
 * prints what was violated and traps so that libFuzzer saves the input.
 * No device is involved. Built only with clang (-fsanitize=fuzzer); run it
 * with tools/scripts/fuzz.sh npy.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "npy_case.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char why[1024];
  if (npy_case_check(data, size, why, sizeof why) != 0) {
    fprintf(stderr, "fuzz_npy: violated: %s\n", why);
    abort();
  }
  return 0;
}
