/*
 * The command-line tool as a user meets it (runs build/tools/clattn):
 * --help of every command (exit 0), --version, bad values refused with
 * exit 2 naming the option and the accepted form, an unknown command said
 * to be unknown, bad .npy files named with what is wrong; on the device
 * ("on_device" tests): 16-bit runs verified at the default tolerance, the
 * report of what ran, heat-map failures with their reason, and .npy round
 * trips (inputs written here, the output read back and compared with an
 * fp64 reference computed here).
 *
 *   test_cli -on_device    everything that needs no device (suite unit)
 *   test_cli on_device     the rest (suite opencl)
 */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "npy.h"
#include "problem.h"

#ifndef CLATTN_TOOL
#error "CLATTN_TOOL (the clattn executable) must be defined"
#endif
#ifndef CLATTN_TOOL_VERSION
#error "CLATTN_TOOL_VERSION (the meson project version) must be defined"
#endif

static char dir[] = "/tmp/clattn-test-cli-XXXXXX";
static char output[1 << 16];

/* Runs `clattn ARGS 2>&1` (ARGS: a shell fragment made here, paths under
 * dir only); the output goes to `output`. Returns the exit status. */
#if defined(__GNUC__)
__attribute__((format(printf, 1, 2)))
#endif
static int
tool(const char *fmt, ...) {
  char args[4096], cmd[8192];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(args, sizeof args, fmt, ap);
  va_end(ap);
  snprintf(cmd, sizeof cmd, "'%s' %s 2>&1", CLATTN_TOOL, args);
  output[0] = 0;
  FILE *p = popen(cmd, "r");
  if (!p) return -1;
  size_t n = fread(output, 1, sizeof output - 1, p);
  output[n] = 0;
  int st = pclose(p);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static const char *in_dir(const char *name) {
  static char paths[8][512];
  static int next;
  char *p = paths[next++ % 8];
  snprintf(p, sizeof paths[0], "%s/%s", dir, name);
  return p;
}

static void help_for_every_command(void) {
  static const char *const cmds[] = {"run", "tune", "bench", "lab", "info", "demo"};
  for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) {
    char want[64];
    snprintf(want, sizeof want, "clattn %s", cmds[i]);
    int rc = tool("%s --help", cmds[i]);
    CHECKF(rc == 0 && strstr(output, want), "clattn %s --help: exit %d, output:\n%s", cmds[i], rc, output);
  }
  /* run's help shows every option with its form */
  static const char *const opts[] = {"--batch B",
                                     "--heads H",
                                     "--kv-heads HKV",
                                     "--q-len M",
                                     "--kv-len N",
                                     "--head-dim DK",
                                     "--value-dim DV",
                                     "--dtype f32|f16|bf16",
                                     "--layout bhsd|bshd",
                                     "--varlen",
                                     "--seed S",
                                     "--causal",
                                     "--window L,R",
                                     "--kv-lens",
                                     "--mask random|block|none|FILE.npy",
                                     "--empty zero|error",
                                     "--scale S",
                                     "--bias [FILE.npy]",
                                     "--softcap C",
                                     "--alibi",
                                     "--sinks",
                                     "--additive",
                                     "--algo auto|staged|fused|gemm",
                                     "--lse [FILE.npy]",
                                     "--weights",
                                     "--diag",
                                     "--heatmap FILE.png",
                                     "--q FILE.npy",
                                     "--k FILE.npy",
                                     "--v FILE.npy",
                                     "--out FILE.npy",
                                     "--tol T",
                                     "--reps R",
                                     "--poison",
                                     "--help"};
  REQUIRE(tool("run --help") == 0);
  for (size_t i = 0; i < sizeof opts / sizeof opts[0]; i++)
    CHECKF(strstr(output, opts[i]), "run --help lacks %s", opts[i]);
  REQUIRE(tool("tune --help") == 0);
  CHECK(strstr(output, "--quick") && strstr(output, "--output FILE") && strstr(output, "--reps R") &&
        strstr(output, "--tiny") && strstr(output, "--only GROUP") && strstr(output, "flash_block"));
  /* the tool's own help says what each command does */
  CHECKF(tool("--help") == 0 && strstr(output, "info     list") && strstr(output, "run      one") &&
             strstr(output, "demo     ") && strstr(output, "bench    ") && strstr(output, "tune     ") &&
             strstr(output, "lab      "),
         "clattn --help:\n%s", output);
}

static void version_is_the_project_version(void) {
  CHECKF(tool("--version") == 0 && strcmp(output, "clattn " CLATTN_TOOL_VERSION "\n") == 0, "%s", output);
}

static void bad_values_name_the_option_and_its_form(void) {
  static const struct {
    const char *args, *want1, *want2;
  } bad[] = {
      {"run --scale foo", "--scale foo", "a finite number"},
      {"run --scale 1e999", "--scale 1e999", "finite"},
      {"run --q-len abc", "--q-len abc", "a positive integer"},
      {"run --q-len 0", "--q-len 0", "a positive integer"},
      {"run --kv-len 99999999999", "--kv-len 99999999999", "a positive integer"},
      {"run --window 5", "--window 5", "L,R"},
      {"run --window 5,x", "--window", "L,R"},
      {"run --dtype f64", "--dtype f64", "f32|f16|bf16"},
      {"run --algo fast", "--algo fast", "auto|staged|fused|gemm"},
      {"run --mask stripes", "--mask stripes", "FILE.npy"},
      {"run --tol 0", "--tol 0", "> 0"},
      {"run --softcap -1", "--softcap -1", ">= 0"},
      {"run --seed -3", "--seed -3", "non-negative integer"},
      {"run --reps x", "--reps x", "non-negative integer"},
      {"run --heatmap", "--heatmap", "needs a value"},
      {"run --paged 0", "--paged 0", "a positive integer"},
      {"run --kv-dtype q4_0", "--kv-dtype q4_0", "f32|f16|bf16|q8_0|int8"},
      {"run --frobnicate", "--frobnicate", "--help"},
      {"run --causal=1", "--causal=1", "a value given to a flag"},
      {"run stray", "unexpected argument 'stray'", "--help"},
      {"run --out o.npy", "--out", "needs all of --q, --k and --v"},
      {"run --q-len 4 --q q.npy --k k.npy --v v.npy", "--q-len", "the shape comes from the files"},
      {"tune --reps 0", "--reps 0", "integer from 1"},
      {"tune --bogus", "--bogus", "clattn tune --help"},
      {"tune --only bogus", "--only bogus", "fused|flash_block|flash_tiled|staged|gemm|auto"},
      {"info extra", "takes no options", "extra"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    int rc = tool("%s", bad[i].args);
    CHECKF(rc == 2 && strstr(output, bad[i].want1) && strstr(output, bad[i].want2),
           "clattn %s: exit %d (expected 2), output (expected \"%s\" and \"%s\"):\n%s", bad[i].args, rc, bad[i].want1,
           bad[i].want2, output);
  }
}

static void unknown_command_said_unknown(void) {
  int rc = tool("frobnicate");
  CHECKF(rc == 2 && strstr(output, "unknown command 'frobnicate'") && strstr(output, "usage:"), "exit %d:\n%s", rc,
         output);
}

/* ---- .npy files written here ---- */

/* A .npy file: version 1.0, the header dict, data bytes in storage order. */
static int write_npy(const char *path, const char *descr, int fortran, int ndim, const size_t *shape, const void *data,
                     size_t nbytes) {
  char header[256], dims[128] = "";
  for (int d = 0, at = 0; d < ndim; d++) at += snprintf(dims + at, sizeof dims - (size_t)at, "%zu, ", shape[d]);
  if (ndim > 1)
    dims[strlen(dims) - 2] = 0; /* (2, 3) but (3,) */
  else if (ndim == 1)
    dims[strlen(dims) - 1] = 0;
  int n = snprintf(header, sizeof header, "{'descr': '%s', 'fortran_order': %s, 'shape': (%s), }\n", descr,
                   fortran ? "True" : "False", dims);
  unsigned char prefix[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, (unsigned char)n, 0};
  FILE *f = fopen(path, "wb");
  if (!f) return -1;
  int ok = fwrite(prefix, 1, 10, f) == 10 && fwrite(header, 1, (size_t)n, f) == (size_t)n &&
           fwrite(data, 1, nbytes, f) == nbytes;
  return fclose(f) == 0 && ok ? 0 : -1;
}

/* A valid q, k, v trio in dir: q [1,2,3,4], k [1,1,5,4], v [1,1,5,2]. */
static void write_small_trio(void) {
  float q[24], k[20], v[10];
  for (int i = 0; i < 24; i++) q[i] = (float)((i * 7) % 5) * 0.1f;
  for (int i = 0; i < 20; i++) k[i] = (float)((i * 3) % 7) * 0.1f;
  for (int i = 0; i < 10; i++) v[i] = (float)i;
  const size_t sq[4] = {1, 2, 3, 4}, sk[4] = {1, 1, 5, 4}, sv[4] = {1, 1, 5, 2};
  CHECK(write_npy(in_dir("q.npy"), "<f4", 0, 4, sq, q, sizeof q) == 0);
  CHECK(write_npy(in_dir("k.npy"), "<f4", 0, 4, sk, k, sizeof k) == 0);
  CHECK(write_npy(in_dir("v.npy"), "<f4", 0, 4, sv, v, sizeof v) == 0);
}

static void bad_npy_files_named_with_what_is_wrong(void) {
  write_small_trio();
  char buf[512];
  const size_t s3[3] = {2, 3, 4}, s4[4] = {1, 2, 3, 4}, skbad[4] = {1, 1, 5, 3}, smask[2] = {3, 4};
  memset(buf, 0, sizeof buf);
  /* truncated: a 1 x 2 x 3 x 4 header over 10 floats */
  CHECK(write_npy(in_dir("trunc.npy"), "<f4", 0, 4, s4, buf, 40) == 0);
  FILE *f = fopen(in_dir("magic.npy"), "wb");
  REQUIRE(f);
  fputs("PK\x03\x04 this is a zip file", f);
  fclose(f);
  f = fopen(in_dir("dict.npy"), "wb");
  REQUIRE(f);
  fwrite("\x93NUMPY\x01\x00\x20\x00{'descr': '<f4' 'shape': (1,)}\n", 1, 42, f);
  fclose(f);
  CHECK(write_npy(in_dir("f8.npy"), "<f8", 0, 4, s4, buf, 192) == 0);
  CHECK(write_npy(in_dir("u1q.npy"), "|u1", 0, 4, s4, buf, 24) == 0);
  CHECK(write_npy(in_dir("3d.npy"), "<f4", 0, 3, s3, buf, 96) == 0);
  CHECK(write_npy(in_dir("kbad.npy"), "<f4", 0, 4, skbad, buf, 60) == 0);
  CHECK(write_npy(in_dir("maskf.npy"), "<f4", 0, 2, smask, buf, 48) == 0);
  const size_t smask_bad[2] = {3, 2};
  CHECK(write_npy(in_dir("maskshape.npy"), "|b1", 0, 2, smask_bad, buf, 6) == 0);
  CHECK(write_npy(in_dir("f16k.npy"), "<f2", 0, 4, (size_t[4]){1, 1, 5, 4}, buf, 40) == 0);
  /* a q header over 64 GiB of (sparse) data: refused by size, never read */
  CHECK(write_npy(in_dir("huge.npy"), "<f4", 0, 4, s4, buf, 96) == 0 &&
        truncate(in_dir("huge.npy"), (off_t)64 << 30) == 0);
  static const struct {
    const char *opt, *file, *want;
  } bad[] = {
      {"--q", "trunc.npy", "truncated"},
      {"--q", "magic.npy", "not a .npy file"},
      {"--q", "dict.npy", "bad header"},
      {"--q", "f8.npy", "dtype '<f8' is not supported"},
      {"--q", "u1q.npy", "expected dtype '<f4' (float32) or '<f2' (float16)"},
      {"--q", "3d.npy", "expected shape [batch, q_heads, q_len, head_dim]"},
      {"--k", "kbad.npy", "head_dim 4"},
      {"--k", "f16k.npy", "one dtype"},
      {"--mask", "maskf.npy", "'|u1' (uint8) or '|b1' (bool)"},
      {"--mask", "maskshape.npy", "does not broadcast to [batch, q_heads, q_len, kv_len] = (1, 2, 3, 5)"},
      {"--q", "missing.npy", "No such file or directory"},
      {"--q", "huge.npy", "too long: the header's shape (1, 2, 3, 4) of '<f4' (float32) needs 96 bytes of data"},
      {"--q", "/dev/zero", "not a .npy file"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    char file[512];
    snprintf(file, sizeof file, "%s", bad[i].file[0] == '/' ? bad[i].file : in_dir(bad[i].file));
    const char *q = !strcmp(bad[i].opt, "--q") ? file : in_dir("q.npy");
    const char *k = !strcmp(bad[i].opt, "--k") ? file : in_dir("k.npy");
    char extra[600] = "";
    if (!strcmp(bad[i].opt, "--mask")) snprintf(extra, sizeof extra, "--mask %s", file);
    int rc = tool("run --q %s --k %s --v %s %s --out %s", q, k, in_dir("v.npy"), extra, in_dir("o.npy"));
    char named[700];
    snprintf(named, sizeof named, "%s %s", bad[i].opt, file);
    CHECKF(rc == 2 && strstr(output, named) && strstr(output, bad[i].want),
           "%s %s: exit %d (expected 2), output (expected \"%s\" and \"%s\"):\n%s", bad[i].opt, bad[i].file, rc, named,
           bad[i].want, output);
    CHECKF(access(in_dir("o.npy"), F_OK) != 0, "%s %s: an output was written", bad[i].opt, bad[i].file);
  }
}

/* ---- on the device ---- */

static void on_device_16_bit_runs_verified_at_default_tolerance(void) {
  ct_context(); /* exits 77 without a device */
  int rc = tool("run --dtype f16 --q-len 64 --kv-len 80 --reps 0");
  CHECKF(rc == 0 && strstr(output, "(the default for f16 storage): yes"), "f16: exit %d:\n%s", rc, output);
  CHECKF(strstr(output, "dtype=f16") && strstr(output, "ran: f16 storage") && strstr(output, "algorithm auto -> ") &&
             strstr(output, "kernels ") && strstr(output, "device memory: ") && strstr(output, "of clattn scratch"),
         "the report lacks what ran:\n%s", output);
  rc = tool("run --dtype bf16 --q-len 33 --kv-len 65 --causal --algo staged --reps 0");
  CHECKF(rc == 0 && strstr(output, "(the default for bf16 storage): yes") &&
             strstr(output, "algorithm staged, kernels qk_score"),
         "bf16: exit %d:\n%s", rc, output);
  /* an explicit tolerance still applies: f16 storage cannot meet 1e-7 */
  rc = tool("run --dtype f16 --q-len 64 --kv-len 80 --reps 0 --tol 1e-7");
  CHECKF(rc == 1 && strstr(output, "within 1e-07: NO"), "f16 at 1e-7: exit %d:\n%s", rc, output);
}

/* --paged / --kv-dtype: K/V written into the cache by clattn_kv_append and
 * the reference computed from the values read back, so the check is exact. */
static void on_device_paged_quantised_runs_verified(void) {
  ct_context();
  static const char *const runs[] = {
      "run --paged 7 --kv-dtype q8_0 --q-len 37 --kv-len 53 --causal --lse --reps 0",
      "run --paged 5 --kv-dtype int8 --heads 8 --kv-heads 2 --q-len 1 --kv-len 4099 --head-dim 128 --value-dim 128 "
      "--algo fused --reps 0",
      "run --kv-dtype f16 --q-len 20 --kv-len 30 --algo staged --reps 0",
  };
  for (size_t i = 0; i < sizeof runs / sizeof runs[0]; i++) {
    int rc = tool("%s", runs[i]);
    CHECKF(rc == 0 && strstr(output, "K/V cache: ") && strstr(output, "written by clattn_kv_append") &&
               strstr(output, "(the default for f32 storage): yes"),
           "clattn %s: exit %d:\n%s", runs[i], rc, output);
  }
  int rc = tool("run --paged 4 --kv-lens --reps 0");
  CHECKF(rc == 1 && strstr(output, "--paged") && strstr(output, "--kv-lens"), "--paged with --kv-lens: exit %d:\n%s",
         rc, output);
  rc = tool("run --kv-dtype q8_0 --head-dim 40 --reps 0");
  CHECKF(rc == 1 && strstr(output, "multiples of 32"), "q8_0 at d=40: exit %d:\n%s", rc, output);
}

/* Modifiers from files: the example modifiers verified against the fp64
 * reference (which runs them as well), with captures and a block mask. */
static void on_device_modifiers_from_files_verified(void) {
  ct_context();
  FILE *f = fopen(in_dir("docs.bin"), "wb");
  REQUIRE(f != NULL);
  for (int32_t i = 0; i < 300; i++) {
    const int32_t doc = i / 50 + (i % 7 == 0); /* documents of 43 to 50 positions */
    fwrite(&doc, sizeof doc, 1, f);
  }
  fclose(f);
  char runs[3][1024];
  snprintf(runs[0], sizeof runs[0], "run --q-len 300 --kv-len 300 --heads 2 --kv-heads 1 --mask-mod %s/document.cl "
           "--capture %s --block-mask --poison --reps 0", MODIFIERS_DIR, in_dir("docs.bin"));
  f = fopen(in_dir("slopes.bin"), "wb");
  REQUIRE(f != NULL);
  for (int h = 0; h < 8; h++) {
    const float slope = exp2f(-(float)(h + 1));
    fwrite(&slope, sizeof slope, 1, f);
  }
  fclose(f);
  snprintf(runs[1], sizeof runs[1], "run --q-len 1 --kv-len 999 --heads 8 --kv-heads 2 --score-mod %s/alibi.cl "
           "--capture %s --paged 16 --kv-dtype q8_0 --reps 0", MODIFIERS_DIR, in_dir("slopes.bin"));
  snprintf(runs[2], sizeof runs[2], "run --q-len 37 --kv-len 53 --head-dim 48 --value-dim 48 --mask-mod %s/prefix_lm.cl "
           "--ints 9 --score-mod %s/tanh_softcap.cl --floats 4.5 --algo staged --reps 0", MODIFIERS_DIR, MODIFIERS_DIR);
  for (int i = 0; i < 3; i++) {
    if (i == 1) { /* the same sliding window over paged and quantised caches, prefill and decode */
      static const char *const cache[] = {"--q-len 37 --kv-len 300 --paged 7 --kv-dtype int8 --algo fused",
                                          "--q-len 1 --kv-len 300 --paged 7 --kv-dtype f16",
                                          "--q-len 37 --kv-len 300 --paged 7 --kv-dtype f16 --algo staged"};
      for (int c = 0; c < 3; c++) {
        const int rc = tool("run %s --mask-mod %s/sliding_window.cl --ints 40 --reps 0", cache[c], MODIFIERS_DIR);
        CHECKF(rc == 0 && strstr(output, "K/V cache: ") && strstr(output, "(the default for f32 storage): yes"),
               "clattn run %s --mask-mod sliding_window.cl: exit %d:\n%s", cache[c], rc, output);
      }
    }
    const int rc = tool("%s", runs[i]);
    CHECKF(rc == 0 && strstr(output, "(the default for f32 storage): yes"), "clattn %s: exit %d:\n%s", runs[i], rc,
           output);
  }
  CHECKF(strstr(output, "kernels qk_score") != NULL, "the staged run's route:\n%s", output);
  int rc = tool("run --ints 3 --reps 0");
  CHECKF(rc == 2 && strstr(output, "need --score-mod or --mask-mod"), "captures alone: exit %d:\n%s", rc, output);
  rc = tool("run --mask-mod %s --reps 0", in_dir("no-such.cl"));
  CHECKF(rc == 2 && strstr(output, "no-such.cl"), "a missing file: exit %d:\n%s", rc, output);
  f = fopen(in_dir("broken.cl"), "w");
  REQUIRE(f != NULL);
  fputs("int clattn_mask_mod(int b, int h, int q_idx, int kv_idx, const clattn_captures *cap) { return q_idx < ; }\n", f);
  fclose(f);
  rc = tool("run --mask-mod %s --reps 0", in_dir("broken.cl"));
  CHECKF(rc == 1 && strstr(output, "does not compile") && strstr(output, "mask_mod:1"), "a modifier that does not "
         "compile: exit %d:\n%s", rc, output);
}

static void on_device_heatmap_failures_give_the_reason(void) {
  ct_context();
  int rc = tool("run --q-len 8 --kv-len 8 --reps 0 --causal --heatmap %s", in_dir("none/x.png"));
  CHECKF(rc == 1 && strstr(output, "--heatmap") && strstr(output, strerror(ENOENT)), "exit %d:\n%s", rc, output);
  rc = tool("run --q-len 8 --kv-len 8 --reps 0 --heatmap %s", dir);
  CHECKF(rc == 1 && strstr(output, dir) && strstr(output, strerror(EISDIR)), "exit %d:\n%s", rc, output);
  rc = tool("run --q-len 8 --kv-len 8 --reps 0 --causal --heatmap %s", in_dir("h.png"));
  CHECKF(rc == 0 && access(in_dir("h.png"), R_OK) == 0, "exit %d:\n%s", rc, output);
}

/* fp64 attention of row (b, h, i): bottom-right causal, mask [M,N]
 * broadcast over batch and heads, bias [N]. Returns lse (-inf when empty). */
static double reference_row(const float *q, const float *k, const float *v, const uint8_t *mask, const float *bias,
                            int b, int h, int i, int H, int Hkv, int M, int N, int dk, int dv, double *out) {
  const int g = h / (H / Hkv);
  const float *qi = q + (((size_t)b * H + h) * M + i) * dk;
  double s[64], mx = -INFINITY;
  int allowed[64];
  for (int j = 0; j < N; j++) {
    const float *kj = k + (((size_t)b * Hkv + g) * N + j) * dk;
    double dot = 0;
    for (int d = 0; d < dk; d++) dot += (double)qi[d] * kj[d];
    s[j] = dot / sqrt((double)dk) + bias[j];
    allowed[j] = mask[(size_t)i * N + j] && j <= i + (N - M);
    if (allowed[j] && s[j] > mx) mx = s[j];
  }
  double sum = 0;
  for (int d = 0; d < dv; d++) out[d] = 0;
  if (mx == -INFINITY) return -INFINITY;
  for (int j = 0; j < N; j++)
    if (allowed[j]) {
      const double w = exp(s[j] - mx);
      sum += w;
      for (int d = 0; d < dv; d++) out[d] += w * v[(((size_t)b * Hkv + g) * N + j) * dv + d];
    }
  for (int d = 0; d < dv; d++) out[d] /= sum;
  return mx + log(sum);
}

/* Writes q (Fortran order), k, v (in descr: '<f4' or '<f2'), a bool mask
 * [M,N] and a bias [N]; runs clattn; reads --out and --lse back and
 * compares them with reference_row within tol. */
static void npy_round_trip(const char *descr, double tol) {
  enum { B = 2, H = 4, HKV = 2, M = 5, N = 7, DK = 8, DV = 6 };
  static float q[B * H * M * DK], k[B * HKV * N * DK], v[B * HKV * N * DV], bias[N];
  static uint8_t mask[M * N];
  static uint16_t half[B * H * M * DK];
  static float fq[B * H * M * DK];
  const int f16 = !strcmp(descr, "<f2");
  uint64_t x = 88172645463325252ull;
#define RAND() (x ^= x << 13, x ^= x >> 7, x ^= x << 17, (float)((x >> 11) % 2001) / 1000.0f - 1.0f)
  for (size_t i = 0; i < sizeof q / sizeof q[0]; i++) q[i] = f16 ? cp_round_to(CLATTN_F16, RAND()) : RAND();
  for (size_t i = 0; i < sizeof k / sizeof k[0]; i++) k[i] = f16 ? cp_round_to(CLATTN_F16, RAND()) : RAND();
  for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) v[i] = f16 ? cp_round_to(CLATTN_F16, RAND()) : RAND();
  for (int j = 0; j < N; j++) bias[j] = 0.5f * RAND();
  for (int i = 0; i < M * N; i++) mask[i] = RAND() > -0.6f;
  mask[0] = mask[1] = mask[2] = 0; /* row 0 empty: zero output, lse -inf */
#undef RAND
  /* q in Fortran order: element (b, h, i, d) at b + B (h + H (i + M d)) */
  for (int b = 0; b < B; b++)
    for (int h = 0; h < H; h++)
      for (int i = 0; i < M; i++)
        for (int d = 0; d < DK; d++) fq[b + B * (h + H * (i + M * d))] = q[((b * H + h) * M + i) * DK + d];
  const size_t sq[4] = {B, H, M, DK}, sk[4] = {B, HKV, N, DK}, sv[4] = {B, HKV, N, DV}, sm[2] = {M, N}, sb[1] = {N};
  const size_t elem = f16 ? 2 : 4;
#define WRITE(name, arr, shape, fortran)                                            \
  do {                                                                              \
    const void *data = arr;                                                         \
    const size_t n = sizeof arr / sizeof arr[0];                                    \
    if (f16) {                                                                      \
      for (size_t e = 0; e < n; e++) half[e] = cp_f16_bits(arr[e]);                 \
      data = half;                                                                  \
    }                                                                               \
    REQUIRE(write_npy(in_dir(name), descr, fortran, 4, shape, data, n *elem) == 0); \
  } while (0)
  WRITE("rq.npy", fq, sq, 1);
  WRITE("rk.npy", k, sk, 0);
  WRITE("rv.npy", v, sv, 0);
#undef WRITE
  REQUIRE(write_npy(in_dir("rmask.npy"), "|b1", 0, 2, sm, mask, sizeof mask) == 0);
  REQUIRE(write_npy(in_dir("rbias.npy"), "<f4", 0, 1, sb, bias, sizeof bias) == 0);
  unlink(in_dir("ro.npy"));
  int rc = tool("run --q %s --k %s --v %s --mask %s --bias %s --causal --reps 0 --out %s --lse %s", in_dir("rq.npy"),
                in_dir("rk.npy"), in_dir("rv.npy"), in_dir("rmask.npy"), in_dir("rbias.npy"), in_dir("ro.npy"),
                in_dir("rlse.npy"));
  CHECKF(rc == 0 && strstr(output, f16 ? "dtype=f16" : "dtype=f32") &&
             strstr(output, "B=2 Hq=4 Hkv=2 M=5 N=7 dk=8 dv=6") && strstr(output, "read: --q "),
         "%s: exit %d:\n%s", descr, rc, output);
  npy_array o, l;
  char err[512];
  REQUIREF(npy_load(in_dir("ro.npy"), &o, err, sizeof err) == 0, "%s", err);
  REQUIREF(npy_load(in_dir("rlse.npy"), &l, err, sizeof err) == 0, "%s", err);
  CHECK(o.h.dtype == NPY_F32 && o.h.ndim == 4 && o.h.shape[0] == B && o.h.shape[1] == H && o.h.shape[2] == M &&
        o.h.shape[3] == DV);
  CHECK(l.h.dtype == NPY_F32 && l.h.ndim == 3 && l.h.shape[2] == M);
  double num = 0, den = 0, ref[DV];
  int lse_ok = 1;
  for (int b = 0; b < B && o.h.count == B * H * M * DV && l.h.count == B * H * M; b++)
    for (int h = 0; h < H; h++)
      for (int i = 0; i < M; i++) {
        const double lse = reference_row(q, k, v, mask, bias, b, h, i, H, HKV, M, N, DK, DV, ref);
        const float got_lse = l.f[(b * H + h) * M + i];
        lse_ok &= isinf(lse) ? isinf(got_lse) && got_lse < 0 : fabs(got_lse - lse) <= 1e-5 * (1 + fabs(lse));
        for (int d = 0; d < DV; d++) {
          const double e = o.f[((b * H + h) * M + i) * DV + d] - ref[d];
          num += e * e, den += ref[d] * ref[d];
        }
      }
  CHECKF(sqrt(num / den) <= tol, "%s: output error %.3g > %g", descr, sqrt(num / den), tol);
  CHECKF(lse_ok, "%s: lse differs from the reference", descr);
  npy_free(&o);
  npy_free(&l);
}

static void on_device_npy_round_trip(void) {
  ct_context();
  npy_round_trip("<f4", 1e-5);
  npy_round_trip("<f2", 1e-3); /* f16 storage: the output is rounded to it */
}

/* `clattn tune --only flash_block --tiny`: where flash_block does not run
 * (POCL without CLATTN_FLASH_WG) the group is skipped, saying why, before
 * any workload is built; either way the file is written with the tile's
 * keys, and a second run starts from it, keeping the other groups' values
 * and AUTO's choices. (Forced on POCL the tiny run builds a fused program
 * per candidate: minutes, so not here.) */
static void on_device_tune_only_flash_block_tiny(void) {
  unsetenv("CLATTN_FLASH_WG");
  const char *file = in_dir("tuning.txt");
  int rc = tool("tune --only flash_block --tiny --output %s", file);
  REQUIREF(rc == 0 && strstr(output, "only flash_block, tiny") && strstr(output, "flash_block tile:") &&
               strstr(output, "wrote "),
           "exit %d:\n%s", rc, output);
  FILE *f = fopen(file, "a");
  REQUIRE(f);
  fprintf(f, "auto_decode = staged\n");
  REQUIRE(fclose(f) == 0);
  rc = tool("tune --only flash_block --tiny --output %s", file);
  REQUIREF(rc == 0 && strstr(output, "starting from "), "exit %d:\n%s", rc, output);
  char text[4096] = "";
  f = fopen(file, "r");
  REQUIRE(f);
  text[fread(text, 1, sizeof text - 1, f)] = 0;
  fclose(f);
  CHECKF(strstr(text, "\nblock_rm = ") && strstr(text, "\nblock_rn = ") && strstr(text, "\nauto_decode = staged\n"),
         "%s", text);
}

static void cleanup(void) {
  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
}

int main(int argc, char **argv) {
  if (!mkdtemp(dir)) return perror("mkdtemp"), 1;
  ct_cleanup = cleanup;
  static const ct_test tests[] = {
      CT_TEST(help_for_every_command),
      CT_TEST(version_is_the_project_version),
      CT_TEST(bad_values_name_the_option_and_its_form),
      CT_TEST(unknown_command_said_unknown),
      CT_TEST(bad_npy_files_named_with_what_is_wrong),
      CT_TEST(on_device_16_bit_runs_verified_at_default_tolerance),
      CT_TEST(on_device_heatmap_failures_give_the_reason),
      CT_TEST(on_device_npy_round_trip),
      CT_TEST(on_device_paged_quantised_runs_verified),
      CT_TEST(on_device_modifiers_from_files_verified),
      CT_TEST(on_device_tune_only_flash_block_tiny),
  };
  return ct_main(argc, argv, tests, sizeof tests / sizeof tests[0]);
}
