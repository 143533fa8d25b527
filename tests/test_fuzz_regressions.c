/*
 * Replays every input in tests/fuzz/corpus (the seeds) and
 * tests/fuzz/regressions (inputs that once made the fuzzer fail, named for
 * what they found) through the fuzz harness's decoding and checks
 * (tests/fuzz/fuzz_case.c), so whatever the fuzzer finds stays a test of
 * the normal opencl suite; likewise tests/fuzz/corpus-append through
 * clattn_kv_append's harness (tests/fuzz/append_case.c). An argument filters
 * the file names.
 *
 * "--parsers [FILTER]" replays the parser targets' corpora instead
 * (tests/fuzz/corpus-cache-entry, corpus-tuning-file: seeds, and inputs that
 * once failed, named for what they found) through fuzz_parsers.c's checks:
 * no device needed (the unit suite), under an alarm() watchdog so a parser
 * that loops fails the test instead of hanging it.
 */
#include <dirent.h>
#include <stdint.h>
#include <unistd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "fuzz/append_case.h"
#include "fuzz/fuzz_case.h"
#include "fuzz/fuzz_parsers.h"

#ifndef FUZZ_DIR
#error "FUZZ_DIR (the tests/fuzz directory) must be defined"
#endif

static const char *filter;

static int by_name(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

typedef int (*fz_case_fn)(const uint8_t *data, size_t size, const char *name, char *why, size_t n);

static int replay_forward(const uint8_t *data, size_t size, const char *name, char *why, size_t n) {
  (void)name;
  return fz_run(data, size, why, n);
}

static int replay_append(const uint8_t *data, size_t size, const char *name, char *why, size_t n) {
  (void)name;
  return fz_append_run(data, size, why, n);
}

/* A parser's verdict must also be what the input's name says: accepted
 * exactly when it starts with "valid" (tools/scripts/fuzz_parser_seeds.py). */
static int replay_parser(int (*parse)(const uint8_t *, size_t, int *, char *, size_t), const uint8_t *data, size_t size,
                         const char *name, char *why, size_t n) {
  int accepted = -1;
  int v = parse(data, size, &accepted, why, n);
  if (v == FZ_PASS && accepted != !strncmp(name, "valid", 5)) {
    snprintf(why, n, "%s, but the name says %s", accepted ? "accepted" : "refused",
             accepted ? "it is to be refused" : "it is valid");
    return FZ_FAIL;
  }
  return v;
}

static int replay_cache_entry(const uint8_t *data, size_t size, const char *name, char *why, size_t n) {
  return replay_parser(fz_cache_entry, data, size, name, why, n);
}

static int replay_tuning_file(const uint8_t *data, size_t size, const char *name, char *why, size_t n) {
  return replay_parser(fz_tuning_file, data, size, name, why, n);
}

/* Runs every input of FUZZ_DIR/sub through run (a failed forward case is described too). */
static void replay_dir(const char *sub, int must_have, fz_case_fn run) {
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
    if (e->d_name[0] == '.' || !strcmp(e->d_name, "README") || strstr(e->d_name, ".md")) continue;
    if (filter && !strstr(e->d_name, filter)) continue;
    if (count == cap) {
      cap = cap ? 2 * cap : 32;
      names = realloc(names, cap * sizeof *names);
      REQUIRE(names);
    }
    names[count++] = strdup(e->d_name);
  }
  closedir(d);
  if (count) qsort(names, count, sizeof *names, by_name);
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
      if (!grown) break;
      data = grown;
      memcpy(data + size, chunk, got);
      size += got;
    }
    fclose(f);
    int v = run(data, size, names[i], why, sizeof why);
    if (v == FZ_FAIL) {
      desc[0] = '\0';
      if (run == replay_forward) fz_describe(data, size, desc, sizeof desc);
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

static void test_corpus(void) { replay_dir("corpus", 1, replay_forward); }

static void test_regressions(void) { replay_dir("regressions", 0, replay_forward); }

/* clattn_kv_append's seeds and the inputs its fuzzer once failed on */
static void test_append_corpus(void) { replay_dir("corpus-append", 1, replay_append); }

static void test_cache_entry_corpus(void) { replay_dir("corpus-cache-entry", 1, replay_cache_entry); }

static void test_tuning_file_corpus(void) { replay_dir("corpus-tuning-file", 1, replay_tuning_file); }

/* The context still works after everything above. */
static void test_known_good_after(void) {
  char why[2048];
  CHECKF(fz_known_good(why, sizeof why) == FZ_PASS, "%s", why);
}

int main(int argc, char **argv) {
  const int parsers = argc > 1 && !strcmp(argv[1], "--parsers");
  filter = argc > 1 + parsers ? argv[1 + parsers] : NULL;
  if (parsers) {
    alarm(120); /* the watchdog: each input takes microseconds */
    static const ct_test parser_tests[] = {
        CT_TEST(test_cache_entry_corpus),
        CT_TEST(test_tuning_file_corpus),
    };
    return ct_main(1, argv, parser_tests, sizeof parser_tests / sizeof parser_tests[0]);
  }
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
      CT_TEST(test_append_corpus),
      CT_TEST(test_known_good_after),
  };
  return ct_main(1, argv, tests, sizeof tests / sizeof tests[0]);
}
