/*
 * libFuzzer harness for clattn_kv_append: each input decodes into one
 * clattn_append_params with device buffers (tests/fuzz/append_case.c
 * documents the format) and goes through append_case.h's checks; a violation
 * prints what was violated and traps so that libFuzzer saves the input.
 * Built only with clang (-fsanitize=fuzzer); run it with tools/fuzz.sh append.
 * LLVMFuzzerInitialize builds the append program of every storage pair
 * (fz_append_warm_up), outside libFuzzer's per-input timeout.
 */
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "append_case.h"
#include "fuzz_case.h"

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
  (void)argc;
  (void)argv;
  char why[1024];
  int no_device = 0;
  if (!fz_context(why, sizeof why, &no_device)) {
    fprintf(stderr, "fuzz_append: %s\n", why);
    exit(no_device ? 77 : 1);
  }
  if (fz_append_warm_up(why, sizeof why) != FZ_PASS) {
    fprintf(stderr, "fuzz_append: warm-up: %s\n", why);
    exit(1);
  }
  /* as fuzz_forward.c: POCL's LLVM handlers back to the defaults */
  signal(SIGILL, SIG_DFL);
  signal(SIGABRT, SIG_DFL);
  signal(SIGFPE, SIG_DFL);
  signal(SIGBUS, SIG_DFL);
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
  char why[2048];
  if (fz_append_run(data, size, why, sizeof why) == FZ_FAIL) {
    fprintf(stderr, "\nfuzz_append: VIOLATION: %s\n", why);
    __builtin_trap();
  }
  return 0;
}
