/*
 * Replays every input in tests/fuzz/corpus (the seeds) and
 * tests/fuzz/regressions (inputs that once made the fuzzer fail, named for
 * what they found) through the fuzz harness's decoding and checks
 * (tests/fuzz/fuzz_case.c), so whatever the fuzzer finds stays a test of
 * the normal opencl suite. An argument filters the file names.
 */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "fuzz/fuzz_case.h"

#ifndef FUZZ_DIR
#error "FUZZ_DIR (the tests/fuzz directory) must be defined"
#endif

static const char *filter;

static int by_name(const void *a, const void *b)
{
  return strcmp(*(char *const *)a, *(char *const *)b);
}

static void replay_dir(const char *sub, int must_have)
{
  char dir[4096];
  snprintf(dir, sizeof dir, "%s/%s", FUZZ_DIR, sub);
  DIR *d = opendir(dir);
  if (!d) {
    CHECKF(!must_have, "cannot open %s", dir);
    return;
  }
  char **names = NULL;
  size_t count = 0, cap = 0;
  struct dirent *e;
  while ((e = readdir(d))) {
    if (e->d_name[0] == '.' || !strcmp(e->d_name, "README") || strstr(e->d_name, ".md"))
      continue;
    if (filter && !strstr(e->d_name, filter))
      continue;
    if (count == cap) {
      cap = cap ? 2 * cap : 32;
      names = realloc(names, cap * sizeof *names);
      REQUIRE(names);
    }
    names[count++] = strdup(e->d_name);
  }
  closedir(d);
  if (count)
    qsort(names, count, sizeof *names, by_name);
  CHECKF(!must_have || count > 0 || filter, "%s holds no inputs", dir);

  char why[2048], desc[2048];
  long passed = 0, skipped = 0;
  for (size_t i = 0; i < count; i++) {
    char path[8192];
    snprintf(path, sizeof path, "%s/%s", dir, names[i]);
    FILE *f = fopen(path, "rb");
    if (!CHECKF(f != NULL, "cannot open %s", path)) {
      free(names[i]);
      continue;
    }
    uint8_t *data = NULL;
    size_t size = 0, got;
    uint8_t chunk[4096];
    while ((got = fread(chunk, 1, sizeof chunk, f)) > 0) {
      uint8_t *grown = realloc(data, size + got);
      if (!grown)
        break;
      data = grown;
      memcpy(data + size, chunk, got);
      size += got;
    }
    fclose(f);
    int v = fz_run(data, size, why, sizeof why);
    if (v == FZ_FAIL) {
      fz_describe(data, size, desc, sizeof desc);
      CHECKF(0, "%s/%s: %s\n      case: %s", sub, names[i], why, desc);
    } else if (v == FZ_SKIP) {
      skipped++;
    } else {
      passed++;
    }
    free(data);
    free(names[i]);
  }
  free(names);
  printf("    %s: %zu inputs, %ld passed, %ld skipped (over the work cap)\n", sub, count, passed, skipped);
}

static void test_corpus(void)
{
  replay_dir("corpus", 1);
}

static void test_regressions(void)
{
  replay_dir("regressions", 0);
}

/* The context still works after everything above. */
static void test_known_good_after(void)
{
  char why[2048];
  CHECKF(fz_known_good(why, sizeof why) == FZ_PASS, "%s", why);
}

int main(int argc, char **argv)
{
  filter = argc > 1 ? argv[1] : NULL;
  char why[1024];
  int no_device = 0;
  if (!fz_context(why, sizeof why, &no_device)) {
    printf("%s\n", why);
    if (no_device) {
      printf("skipped: no OpenCL device\n");
      return CT_SKIP;
    }
    printf("0 passed, 1 failed\n");
    return 1;
  }
  ct_cleanup = fz_shutdown;
  static const ct_test tests[] = {
      CT_TEST(test_corpus),
      CT_TEST(test_regressions),
      CT_TEST(test_known_good_after),
  };
  return ct_main(1, argv, tests, sizeof tests / sizeof tests[0]);
}
