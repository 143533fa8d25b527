/*
 * The .npy reader and writer of `clattn run` (tools/cli/npy.c), no device:
 * versions 1.0-3.0, the four dtypes, C and Fortran order, NumPy's header
 * spellings; every kind of malformed file refused with a message saying
 * what is wrong; a written file read back. Then the fuzz seeds and every
 * input the fuzzer once failed on (tests/fuzz/npy/) through the harness's
 * checks (tests/fuzz/npy_case.c).
 */
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "fuzz/npy_case.h"
#include "npy.h"
#include "problem.h"

#ifndef FUZZ_DIR
#error "FUZZ_DIR (the tests/fuzz directory) must be defined"
#endif

/* A .npy image: magic, version major.0, the header as given (no padding
 * needed), then data. Returns its length. */
static size_t image(uint8_t *buf, int major, const char *header, const void *data, size_t n) {
  const size_t hl = strlen(header), prefix = major == 1 ? 10 : 12;
  memcpy(buf, "\x93NUMPY", 6);
  buf[6] = (uint8_t)major, buf[7] = 0;
  buf[8] = (uint8_t)hl, buf[9] = (uint8_t)(hl >> 8);
  if (major > 1) buf[10] = (uint8_t)(hl >> 16), buf[11] = (uint8_t)(hl >> 24);
  memcpy(buf + prefix, header, hl);
  if (n) memcpy(buf + prefix + hl, data, n);
  return prefix + hl + n;
}

static uint8_t buf[1 << 16];

static void reads_float32_c_order(void) {
  const float v[6] = {1, 2, 3, -4, 5.5f, 1e-30f};
  size_t n = image(buf, 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }          \n", v, sizeof v);
  npy_array a;
  char err[512];
  REQUIREF(npy_decode(buf, n, &a, err, sizeof err) == 0, "%s", err);
  CHECK(a.h.dtype == NPY_F32 && a.h.ndim == 2 && a.h.shape[0] == 2 && a.h.shape[1] == 3 && a.h.count == 6);
  CHECK(a.f && memcmp(a.f, v, sizeof v) == 0);
  npy_free(&a);
}

static void reads_float16_bool_uint8_and_versions(void) {
  const uint16_t h[3] = {0x3c00, 0xc000, 0x3800}; /* 1, -2, 0.5 */
  size_t n = image(buf, 2, "{\"descr\": \"<f2\", \"fortran_order\": False, \"shape\": (3,)}\n", h, sizeof h);
  npy_array a;
  char err[512];
  REQUIREF(npy_decode(buf, n, &a, err, sizeof err) == 0, "%s", err);
  CHECK(a.h.dtype == NPY_F16 && a.h.ndim == 1 && a.f[0] == 1.0f && a.f[1] == -2.0f && a.f[2] == 0.5f);
  npy_free(&a);
  const uint8_t b[4] = {0, 1, 7, 0}; /* any nonzero byte is True */
  n = image(buf, 3, "{'descr': '|b1', 'fortran_order': False, 'shape': (4L,), }\n", b, sizeof b);
  REQUIREF(npy_decode(buf, n, &a, err, sizeof err) == 0, "%s", err);
  CHECK(a.h.dtype == NPY_BOOL && a.u8[0] == 0 && a.u8[1] == 1 && a.u8[2] == 1 && a.u8[3] == 0);
  npy_free(&a);
  n = image(buf, 1, "{'shape': (), 'fortran_order': False, 'descr': '|u1'}", b + 2, 1); /* any key order, a scalar */
  REQUIREF(npy_decode(buf, n, &a, err, sizeof err) == 0, "%s", err);
  CHECK(a.h.dtype == NPY_U8 && a.h.ndim == 0 && a.h.count == 1 && a.u8[0] == 7);
  npy_free(&a);
  n = image(buf, 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (0, 5), }", NULL, 0); /* empty */
  REQUIREF(npy_decode(buf, n, &a, err, sizeof err) == 0, "%s", err);
  CHECK(a.h.count == 0);
  npy_free(&a);
}

static void reads_fortran_order_into_c_order(void) {
  /* a 2 x 3 x 2 array a[i][j][k] = 100 i + 10 j + k, stored first index fastest */
  float v[12];
  for (int i = 0; i < 2; i++)
    for (int j = 0; j < 3; j++)
      for (int k = 0; k < 2; k++) v[i + 2 * (j + 3 * k)] = (float)(100 * i + 10 * j + k);
  size_t n = image(buf, 1, "{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3, 2), }", v, sizeof v);
  npy_array a;
  char err[512];
  REQUIREF(npy_decode(buf, n, &a, err, sizeof err) == 0, "%s", err);
  for (int i = 0; i < 2; i++)
    for (int j = 0; j < 3; j++)
      for (int k = 0; k < 2; k++)
        CHECKF(a.f[(i * 3 + j) * 2 + k] == (float)(100 * i + 10 * j + k), "a[%d][%d][%d] = %g", i, j, k,
               (double)a.f[(i * 3 + j) * 2 + k]);
  npy_free(&a);
}

/* Each malformed image is refused with a message holding `want`. */
static void refuses(const uint8_t *img, size_t n, const char *want, const char *what) {
  npy_array a;
  char err[512] = "";
  const int rc = npy_decode(img, n, &a, err, sizeof err);
  CHECKF(rc == -1 && strstr(err, want) && !a.f && !a.u8, "%s: rc %d, message \"%s\", expected one with \"%s\"", what,
         rc, err, want);
  if (rc == 0) npy_free(&a);
}

static void refuses_malformed_files(void) {
  const float v[6] = {0};
  static const struct {
    const char *header, *want, *what;
  } bad[] = {
      {"{'descr': '<f8', 'fortran_order': False, 'shape': (2, 3), }", "dtype '<f8' is not supported", "float64"},
      {"{'descr': '>f4', 'fortran_order': False, 'shape': (2, 3), }", "big-endian", "big-endian"},
      {"{'descr': '<f4', 'fortran_order': False, }", "no 'shape'", "no shape"},
      {"{'descr': '<f4', 'shape': (6,), }", "no 'fortran_order'", "no fortran_order"},
      {"{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (6,)}", "'descr' given twice", "twice"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (6,), 'x': 1}", "unknown key 'x'", "unknown key"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (6)}", "(n) is not a tuple", "shape (6)"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (-6,)}", "non-negative integer", "negative"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': [6]}", "not a tuple", "a list"},
      {"{'descr': '<f4', 'fortran_order': maybe, 'shape': (6,)}", "neither True nor False", "fortran_order"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (6,)} x", "follows the closing", "junk"},
      {"'descr': '<f4', 'fortran_order': False, 'shape': (6,)}", "start with '{'", "no brace"},
      {"{'descr': '<f4' 'fortran_order': False, 'shape': (6,)}", "expected ',' or '}'", "no comma"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (6,)", "expected ',' or '}'", "unclosed"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999999,)}", "too large", "huge dim"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, 4294967296)}", "overflows", "overflow"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", "truncated", "short data"}, /* 3 floats */
      {"{'descr': '<f2', 'fortran_order': False, 'shape': (2,), }", "too long", "extra data"},    /* 12 bytes */
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    const size_t data = !strcmp(bad[i].what, "short data") ? 12 : sizeof v;
    refuses(buf, image(buf, 1, bad[i].header, v, data), bad[i].want, bad[i].what);
  }
  const char *good = "{'descr': '<f4', 'fortran_order': False, 'shape': (6,), }\n";
  size_t n = image(buf, 1, good, v, sizeof v);
  for (size_t cut = 0; cut < n; cut++) refuses(buf, cut, cut < 8 ? "not a .npy" : "truncated", "cut short");
  buf[0] = 'x';
  refuses(buf, n, "does not start with \\x93NUMPY", "bad magic");
  image(buf, 1, good, v, sizeof v);
  buf[6] = 4;
  refuses(buf, n, "version 4.0", "version 4");
  buf[6] = 1, buf[7] = 1;
  refuses(buf, n, "version 1.1", "version 1.1");
  buf[7] = 0, buf[20] = 0xe9; /* a byte past ASCII in a 1.0 header */
  refuses(buf, n, "not ASCII", "latin-1 byte");
  buf[20] = 0;
  refuses(buf, n, "not ASCII", "NUL");
}

static void writes_what_it_reads(void) {
  char dir[] = "/tmp/clattn-test-npy-XXXXXX", path[256], err[512];
  REQUIRE(mkdtemp(dir));
  snprintf(path, sizeof path, "%s/x.npy", dir);
  float v[2 * 3 * 4 * 5];
  for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) v[i] = (float)i * 0.25f - 7;
  const size_t shape[4] = {2, 3, 4, 5};
  REQUIREF(npy_save_f32(path, v, 4, shape, err, sizeof err) == 0, "%s", err);
  npy_array a;
  REQUIREF(npy_load(path, &a, err, sizeof err) == 0, "%s", err);
  CHECK(a.h.ndim == 4 && a.h.shape[3] == 5 && a.h.data_offset % 64 == 0 && memcmp(a.f, v, sizeof v) == 0);
  npy_free(&a);
  const size_t one[1] = {3};
  REQUIREF(npy_save_f32(path, v, 1, one, err, sizeof err) == 0, "%s", err);
  REQUIREF(npy_load(path, &a, err, sizeof err) == 0, "%s", err);
  CHECK(a.h.ndim == 1 && a.h.count == 3 && a.f[2] == v[2]);
  npy_free(&a);
  unlink(path);
  /* the file and the reason in every message */
  snprintf(path, sizeof path, "%s/missing/x.npy", dir);
  CHECK(npy_save_f32(path, v, 1, one, err, sizeof err) == -1 && strstr(err, path) && strstr(err, strerror(ENOENT)));
  CHECK(npy_load(path, &a, err, sizeof err) == -1 && strstr(err, path) && strstr(err, strerror(ENOENT)));
  CHECKF(npy_load(dir, &a, err, sizeof err) == -1 && strstr(err, dir), "%s", err); /* a directory */
  rmdir(dir);
}

static double seconds(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* npy_load(path) refuses with a message holding want, within a second. */
static void load_refuses(const char *path, const char *want, const char *what) {
  npy_array a;
  char err[512] = "";
  const double t0 = seconds();
  const int rc = npy_load(path, &a, err, sizeof err);
  const double took = seconds() - t0;
  CHECKF(rc == -1 && strstr(err, want) && strstr(err, path) && !a.f && !a.u8,
         "%s: rc %d, message \"%s\", expected one with \"%s\"", what, rc, err, want);
  CHECKF(took < 1.0, "%s: refused after %.1f s: it read what the header did not ask for", what, took);
  if (rc == 0) npy_free(&a);
}

/* A pipe carrying header, then `extra` bytes past the 24 of data it describes. */
static pid_t feed_fifo(const char *fifo, const uint8_t *img, size_t n, size_t extra) {
  const pid_t pid = fork();
  if (pid != 0) return pid;
  signal(SIGPIPE, SIG_DFL); /* the reader stops early: the writer just ends */
  FILE *f = fopen(fifo, "wb");
  int ok = f && fwrite(img, 1, n, f) == n;
  static const uint8_t zeros[4096];
  for (size_t left = extra; ok && left; left -= left < sizeof zeros ? left : sizeof zeros)
    ok = fwrite(zeros, 1, left < sizeof zeros ? left : sizeof zeros, f) > 0;
  if (f) fclose(f);
  _exit(0);
}

/* npy_load reads the header, then checks the size it implies against the
 * file's before reading any data: a 64 GiB sparse file behind a 24-byte
 * header is refused at once, and so is /dev/zero (no magic). A pipe, whose
 * size is unknown, is read no further than the header's data and one byte:
 * exact data loads, more or less is refused. */
static void load_reads_the_header_before_the_data(void) {
  char dir[] = "/tmp/clattn-test-npy-XXXXXX", path[256], fifo[256], err[512];
  REQUIRE(mkdtemp(dir));
  snprintf(path, sizeof path, "%s/sparse.npy", dir);
  const float v[6] = {1, 2, 3, 4, 5, 6};
  const size_t n = image(buf, 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }\n", v, sizeof v);
  FILE *f = fopen(path, "wb");
  REQUIRE(f && fwrite(buf, 1, n, f) == n && fclose(f) == 0);
  char want[256];
  snprintf(want, sizeof want,
           "too long: the header's shape (2, 3) of '<f4' (float32) needs 24 bytes of data, the "
           "file holds %zu",
           ((size_t)64 << 30) - (n - sizeof v));
  if (CHECKF(truncate(path, (off_t)64 << 30) == 0, "truncate to 64 GiB: %s", strerror(errno)))
    load_refuses(path, want, "64 GiB sparse file");
  /* a header claiming 2^40 floats over 24 bytes: refused, nothing allocated */
  const size_t big =
      image(buf, 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (1099511627776,), }\n", v, sizeof v);
  f = fopen(path, "wb");
  REQUIRE(f && fwrite(buf, 1, big, f) == big && fclose(f) == 0);
  load_refuses(path, "truncated: the header's shape (1099511627776,) of '<f4' (float32) needs 4398046511104 bytes",
               "2^40 floats claimed");
  unlink(path);
  if (access("/dev/zero", R_OK) == 0) load_refuses("/dev/zero", "not a .npy file", "/dev/zero");

  image(buf, 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }\n", v, sizeof v); /* n bytes again */
  snprintf(fifo, sizeof fifo, "%s/pipe.npy", dir);
  REQUIREF(mkfifo(fifo, 0600) == 0, "mkfifo: %s", strerror(errno));
  static const struct {
    size_t extra;
    const char *want;
  } pipes[] = {{0, NULL},
               {1,
                "too long: the header's shape (2, 3) of '<f4' (float32) needs 24 bytes of data, the "
                "file holds more"},
               {(size_t)64 << 20, "the file holds more"}};
  for (size_t i = 0; i < sizeof pipes / sizeof pipes[0]; i++) {
    const pid_t pid = feed_fifo(fifo, buf, n, pipes[i].extra);
    REQUIRE(pid > 0);
    if (pipes[i].want) {
      load_refuses(fifo, pipes[i].want, pipes[i].extra == 1 ? "a pipe with one byte too many" : "a 64 MiB pipe");
    } else {
      npy_array a;
      if (CHECKF(npy_load(fifo, &a, err, sizeof err) == 0, "a pipe holding the array: %s", err))
        CHECK(a.h.count == 6 && memcmp(a.f, v, sizeof v) == 0);
      npy_free(&a);
    }
    waitpid(pid, NULL, 0);
  }
  /* a pipe cut short inside the data */
  const pid_t pid = feed_fifo(fifo, buf, n - 5, 0);
  REQUIRE(pid > 0);
  load_refuses(fifo,
               "truncated: the header's shape (2, 3) of '<f4' (float32) needs 24 bytes of data, the file holds 19",
               "a pipe cut short");
  waitpid(pid, NULL, 0);
  unlink(fifo);
  rmdir(dir);
}

/* The fuzzer's seeds and regressions through its checks. */
static void replay(const char *sub, int must_have) {
  char dir[4096];
  snprintf(dir, sizeof dir, "%s/npy/%s", FUZZ_DIR, sub);
  DIR *d = opendir(dir);
  REQUIREF(d, "cannot open %s", dir);
  struct dirent *e;
  int count = 0;
  while ((e = readdir(d))) {
    if (e->d_name[0] == '.' || strstr(e->d_name, ".md")) continue;
    char path[8192], why[1024];
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    FILE *f = fopen(path, "rb");
    if (!CHECKF(f, "cannot read %s", path)) continue;
    size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    CHECKF(npy_case_check(buf, n, why, sizeof why) == 0, "%s: %s", e->d_name, why);
    count++;
  }
  closedir(d);
  CHECKF(!must_have || count > 0, "%s holds no inputs", dir);
}

static void fuzz_corpus_and_regressions(void) {
  replay("corpus", 1);
  replay("regressions", 0);
}

int main(int argc, char **argv) {
  static const ct_test tests[] = {
      CT_TEST(reads_float32_c_order),
      CT_TEST(reads_float16_bool_uint8_and_versions),
      CT_TEST(reads_fortran_order_into_c_order),
      CT_TEST(refuses_malformed_files),
      CT_TEST(writes_what_it_reads),
      CT_TEST(load_reads_the_header_before_the_data),
      CT_TEST(fuzz_corpus_and_regressions),
  };
  return ct_main(argc, argv, tests, sizeof tests / sizeof tests[0]);
}
