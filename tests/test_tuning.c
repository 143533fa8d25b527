/*
 * Tuning (src/tuning_file.c: the format; src/tuning.c: the layers): the
 * format's checks, a matching file's values and AUTO choices applied with
 * their origin shown, results still exact; a file for another device
 * ignored; a file with a bad or device-unfit value rejected whole, with a
 * message, and the defaults used; the public tuning API (clattn_tuning_*)
 * as `clattn tune` uses it. Contexts are embedded in ct_context()'s OpenCL
 * objects.
 */
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "api/api.h"
#include "kit_checks.h"

static char g_dir[] = "/tmp/clattn-tuning-XXXXXX";
static char g_path[300];

/* A file for ct_context()'s device with extra lines appended. */
static int write_for_device(const char *extra) {
  clattn_context *c = ct_context();
  char platform[256], device[256], driver[256];
  ca_platform_string(c->platform, CL_PLATFORM_NAME, platform, sizeof platform);
  ca_device_string(c->device, CL_DEVICE_NAME, device, sizeof device);
  ca_device_string(c->device, CL_DRIVER_VERSION, driver, sizeof driver);
  FILE *f = fopen(g_path, "w");
  if (!CHECKF(f != NULL, "cannot write %s", g_path)) return -1;
  fprintf(f, "# test\nformat = 1\nplatform = %s\ndevice = %s\ndriver = %s\n%s", platform, device, driver, extra);
  return CHECK(fclose(f) == 0) ? 0 : -1;
}

static clattn_context *open_with(const char *tuning_file) {
  clattn_options o = {0};
  o.context = clattn_cl_context(ct_context());
  o.device = clattn_cl_device(ct_context());
  o.queue = clattn_cl_queue(ct_context());
  o.tuning_file = tuning_file;
  clattn_context *ctx = NULL;
  clattn_status st = clattn_create(&o, &ctx);
  CHECKF(st == CLATTN_OK, "clattn_create: %s", clattn_last_error(NULL));
  return ctx;
}

/* Reads size bytes as a tuning file: 0 accepted, -1 rejected (message in err). */
static int read_bytes(const char *text, size_t size, char *err, size_t n) {
  FILE *f = fopen(g_path, "w");
  if (!f) return -2;
  int ok = fwrite(text, 1, size, f) == size;
  if ((fclose(f) != 0) || !ok) return -2;
  ca_tuning t;
  return ca_tuning_read(g_path, &t, err, n);
}

static int read_text(const char *text, char *err, size_t n) { return read_bytes(text, strlen(text), err, n); }

static void format_errors_name_the_line_and_value(void) {
  static const char head[] = "format = 1\nplatform = P\ndevice = D\ndriver = 1\n";
  static const struct {
    const char *line, *says;
  } bad[] = {
      {"flash_bm = 3\n", "flash_bm = 3: must be a power of two from 1 to 16"},
      {"score_tm = 2048\n", "score_tm = 2048: must be a power of two from 1 to 1024"},
      {"mix_tj = 12x\n", "mix_tj = 12x: must be an integer"},
      {"scratch_bytes = 0\n", "scratch_bytes = 0: must be from 1 to 2^40 bytes"},
      {"scratch_bytes = -5\n", "scratch_bytes = -5: must be from 1 to 2^40 bytes"},
      {"flash_wg = -5\n", "flash_wg = -5: must be 0 or a power of two up to 1024"},
      {"auto_weights = fused\n", "auto_weights = fused: must be staged or gemm"},
      {"auto_prefill = fast\n", "auto_prefill = fast: must be staged, fused or gemm"},
      {"block_rm = 3\n", "block_rm = 3: must be 0, 1, 2 or 4 (with block_rm x block_rn one of 4x4, 2x4, 1x4, 1x2, 1x1"},
      {"block_rn = 8\n", "block_rn = 8: must be 0, 1, 2 or 4"},
      {"flash_tile = 128\n", "flash_tile = 128: must be 0 (chosen per head dim) or a power of two up to 64"},
      {"flash_tile = 24\n", "flash_tile = 24: must be 0 (chosen per head dim) or a power of two up to 64"},
      {"tile = 4\n", "unknown key 'tile'"},
      {"flash_bm 4\n", "expected 'key = value'"},
  };
  char text[512], err[512];
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    snprintf(text, sizeof text, "%s%s", head, bad[i].line);
    int rc = read_text(text, err, sizeof err);
    CHECKF(rc == -1 && strstr(err, bad[i].says) && strstr(err, ":5:"), "%s: rc %d, '%s'", bad[i].line, rc, err);
  }
  CHECK(read_text("platform = P\ndevice = D\ndriver = 1\n", err, sizeof err) == -1 && strstr(err, "format"));
  CHECK(read_text("format = 1\nplatform = P\n", err, sizeof err) == -1 && strstr(err, "platform, device and driver"));
  snprintf(text, sizeof text, "%s  # comment\nflash_bm = 16  # trailing\n\nauto_decode = gemm\n", head);
  CHECKF(read_text(text, err, sizeof err) == 0, "good file rejected: %s", err);

  /* flash_block's tile: a pair the kernel is built with, or 0 x 0; both keys or neither */
  static const struct {
    const char *lines, *says;
  } pairs[] = {
      {"block_rm = 2\nblock_rn = 2\n",
       "block_rm = 2, block_rn = 2: flash_block's tile must be one of 4x4, 2x4, 1x4, 1x2, 1x1 (rows x keys per "
       "work-item), or 0 x 0 (chosen per head dim)"},
      {"block_rm = 4\nblock_rn = 0\n", "block_rm = 4, block_rn = 0: flash_block's tile must be one of"},
      {"block_rm = 2\n", "block_rm without block_rn: flash_block's tile is given as a pair"},
      {"block_rn = 4\n", "block_rn without block_rm"},
  };
  for (size_t i = 0; i < sizeof pairs / sizeof pairs[0]; i++) {
    snprintf(text, sizeof text, "%s%s", head, pairs[i].lines);
    int rc = read_text(text, err, sizeof err);
    CHECKF(rc == -1 && strstr(err, pairs[i].says), "%s: rc %d, '%s'", pairs[i].lines, rc, err);
  }
  static const char *const good_pairs[] = {"0\nblock_rn = 0", "4\nblock_rn = 4", "2\nblock_rn = 4",
                                           "1\nblock_rn = 4", "1\nblock_rn = 2", "1\nblock_rn = 1"};
  for (size_t i = 0; i < sizeof good_pairs / sizeof good_pairs[0]; i++) {
    snprintf(text, sizeof text, "%sblock_rm = %s\n", head, good_pairs[i]);
    CHECKF(read_text(text, err, sizeof err) == 0, "block_rm = %s rejected: %s", good_pairs[i], err);
  }
}

/* Issue 18, item 7: fgets split a line over 1023 bytes, so the tail of a
 * long comment was read as a line of its own and applied; C strings ended a
 * line at a NUL byte. Both are malformed lines now, named by number. */
static void long_lines_and_nul_bytes_are_rejected(void) {
  static const char head[] = "format = 1\nplatform = P\ndevice = D\ndriver = 1\n";
  char text[2048], err[512];
  /* 1023 bytes of comment, then the text fgets read as the next line. */
  int at = snprintf(text, sizeof text, "%s#", head);
  memset(text + at, 'x', 1022);
  snprintf(text + at + 1022, sizeof text - (size_t)at - 1022, "flash_bm = 2\n");
  int rc = read_text(text, err, sizeof err);
  CHECKF(rc == -1 && strstr(err, ":5: line longer than 1023 bytes"), "long comment: rc %d, '%s'", rc, err);

  /* A 1023-byte line is still a line. */
  at = snprintf(text, sizeof text, "%s#", head);
  memset(text + at, 'x', 1022);
  snprintf(text + at + 1022, sizeof text - (size_t)at - 1022, "\nflash_bm = 2\n");
  rc = read_text(text, err, sizeof err);
  CHECKF(rc == 0, "1023-byte comment: rc %d, '%s'", rc, err);

  static const char nul_line[] = "format = 1\nplatform = P\ndevice = D\ndriver = 1\nflash_bm = 4\0flash_bm = 2\n";
  rc = read_bytes(nul_line, sizeof nul_line - 1, err, sizeof err);
  CHECKF(rc == -1 && strstr(err, ":5: a NUL byte in the line"), "NUL byte: rc %d, '%s'", rc, err);
  static const char nul_comment[] = "format = 1\nplatform = P\ndevice = D\ndriver = 1\n#\0\nflash_bm = 2\n";
  rc = read_bytes(nul_comment, sizeof nul_comment - 1, err, sizeof err);
  CHECKF(rc == -1 && strstr(err, ":5: a NUL byte in the line"), "NUL in a comment: rc %d, '%s'", rc, err);
}

/* ---- issue 18, item 6: a FIFO or a device as the tuning file ----
 * Each creation runs in a child process (this executable, "--create":
 * a forked one must not reuse the parent's OpenCL) under an alarm()
 * watchdog, so a blocked open or an endless read is reported as a failure
 * instead of hanging the suite. */

enum { CHILD_WATCHDOG_S = 120 };

/* The child: a context with the tuning file CLATTN_TUNING_FILE names; its
 * note on stdout. 0 when the file was rejected as not a regular file. */
static int create_main(void) {
  alarm(CHILD_WATCHDOG_S);
  clattn_context *ctx = NULL;
  clattn_status st = clattn_create(NULL, &ctx);
  if (st != CLATTN_OK) {
    printf("clattn_create: %s\n", clattn_last_error(NULL));
    return 2;
  }
  printf("    child: %s\n", ctx->tuning_note);
  int ok = !strncmp(ctx->tuning_note, "rejected, defaults used:", 24) && strstr(ctx->tuning_note, "not a regular file");
  clattn_destroy(ctx);
  return ok ? 0 : 1;
}

/* Runs "--create" with CLATTN_TUNING_FILE=path: its exit status, or 128 +
 * the signal that ended it (SIGALRM: the watchdog). */
static int create_in_child(const char *path) {
  pid_t pid = fork();
  if (pid == 0) {
    setenv("CLATTN_TUNING_FILE", path, 1);
    execl("/proc/self/exe", "test_tuning", "--create", (char *)NULL);
    _exit(4);
  }
  int status = 0;
  if (pid < 0 || waitpid(pid, &status, 0) != pid) return -1;
  return WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status);
}

static void fifo_and_devices_do_not_block_creation(void) {
  char fifo[320];
  snprintf(fifo, sizeof fifo, "%s/fifo", g_dir);
  REQUIRE(mkfifo(fifo, 0600) == 0 || errno == EEXIST);
  const char *paths[] = {fifo, "/dev/zero", "/dev/null"};
  for (size_t i = 0; i < sizeof paths / sizeof paths[0]; i++) {
    int rc = create_in_child(paths[i]);
    CHECKF(rc == 0, "CLATTN_TUNING_FILE=%s: the creating process %s %d%s", paths[i],
           rc > 128 ? "died of signal" : "exited", rc > 128 ? rc - 128 : rc,
           rc == 128 + SIGALRM ? " (watchdog: it hung)" : "");
  }
  unlink(fifo);
  /* A file over the size cap is refused before it is read. */
  FILE *f = fopen(g_path, "w");
  REQUIRE(f);
  for (int i = 0; i < 70000; i++) fputc('\n', f);
  REQUIRE(fclose(f) == 0);
  ca_tuning t;
  char err[512];
  CHECKF(ca_tuning_read(g_path, &t, err, sizeof err) == -1 && strstr(err, "larger than 65536 bytes"), "%s", err);
}

/* Issue 18, item 8: CLATTN_FLASH_WG and CLATTN_SCRATCH_BYTES follow the
 * tuning file's rule, with its message; a value that breaks it is ignored
 * and named in clattn_describe. */
static void environment_overrides_follow_the_file_rule(void) {
  clattn_context *plain = open_with("");
  REQUIRE(plain);
  static const struct {
    const char *var, *value, *says;
  } bad[] = {
      {"CLATTN_FLASH_WG", "-5", "ignored CLATTN_FLASH_WG = -5: must be 0 or a power of two up to 1024"},
      {"CLATTN_FLASH_WG", "48", "ignored CLATTN_FLASH_WG = 48: must be 0 or a power of two up to 1024"},
      {"CLATTN_SCRATCH_BYTES", "-5", "ignored CLATTN_SCRATCH_BYTES = -5: must be from 1 to 2^40 bytes"},
      {"CLATTN_SCRATCH_BYTES", "4k", "ignored CLATTN_SCRATCH_BYTES = 4k: must be an integer"},
      {"CLATTN_BLOCK_RM", "3",
       "ignored CLATTN_BLOCK_RM = 3: must be 0, 1, 2 or 4 (with block_rm x block_rn one of "
       "4x4, 2x4, 1x4, 1x2, 1x1, or 0 x 0: chosen per head dim)"},
      {"CLATTN_BLOCK_RN", "x", "ignored CLATTN_BLOCK_RN = x: must be an integer"},
      /* alone, with the default's block_rn = 0 */
      {"CLATTN_BLOCK_RM", "2",
       "ignored CLATTN_BLOCK_RM = 2, block_rn = 0: flash_block's tile must be one of 4x4, "
       "2x4, 1x4, 1x2, 1x1"},
      {"CLATTN_FLASH_VW", "12", "ignored CLATTN_FLASH_VW = 12: must be 4, 8 or 16"},
      {"CLATTN_FLASH_TILE", "48",
       "ignored CLATTN_FLASH_TILE = 48: must be 0 (chosen per head dim) or a power of two up to 64"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    REQUIRE(setenv(bad[i].var, bad[i].value, 1) == 0);
    clattn_context *ctx = open_with("");
    unsetenv(bad[i].var);
    if (!ctx) continue;
    CHECKF(strstr(clattn_describe(ctx), bad[i].says) != NULL, "%s=%s: describe lacks '%s':\n%s", bad[i].var,
           bad[i].value, bad[i].says, clattn_describe(ctx));
    CHECK(!memcmp(&ctx->tiles, &plain->tiles, sizeof ctx->tiles));
    CHECK(ctx->scratch_budget == plain->scratch_budget);
    CHECK(ctx->origin[CA_T_FLASH_WG] != CA_FROM_ENV && ctx->origin[CA_T_SCRATCH_BYTES] != CA_FROM_ENV);
    CHECK(ctx->origin[CA_T_BLOCK_RM] != CA_FROM_ENV && ctx->origin[CA_T_BLOCK_RN] != CA_FROM_ENV);
    CHECK(ctx->origin[CA_T_FLASH_TILE] != CA_FROM_ENV);
    clattn_destroy(ctx);
  }
  /* a pair the two variables make together, refused */
  REQUIRE(setenv("CLATTN_BLOCK_RM", "2", 1) == 0 && setenv("CLATTN_BLOCK_RN", "2", 1) == 0);
  clattn_context *pair = open_with("");
  unsetenv("CLATTN_BLOCK_RM");
  unsetenv("CLATTN_BLOCK_RN");
  if (pair) {
    CHECKF(strstr(clattn_describe(pair),
                  "ignored CLATTN_BLOCK_RM = 2, CLATTN_BLOCK_RN = 2: flash_block's tile must "
                  "be one of 4x4, 2x4, 1x4, 1x2, 1x1") != NULL,
           "%s", clattn_describe(pair));
    CHECK(pair->tiles.block_rm == 0 && pair->tiles.block_rn == 0);
    clattn_destroy(pair);
  }
  /* Valid values still apply (the tests' small scratch budgets among them). */
  REQUIRE(setenv("CLATTN_SCRATCH_BYTES", "256", 1) == 0);
  REQUIRE(setenv("CLATTN_FLASH_WG", "16", 1) == 0);
  clattn_context *ctx = open_with("");
  unsetenv("CLATTN_SCRATCH_BYTES");
  unsetenv("CLATTN_FLASH_WG");
  if (ctx) {
    CHECK(ctx->scratch_budget == 256 && ctx->origin[CA_T_SCRATCH_BYTES] == CA_FROM_ENV);
    CHECK(ctx->tiles.flash_wg == 16 && ctx->origin[CA_T_FLASH_WG] == CA_FROM_ENV);
    CHECKF(strstr(clattn_describe(ctx), "environment: no values ignored") != NULL, "%s", clattn_describe(ctx));
    clattn_destroy(ctx);
  }
  clattn_destroy(plain);
}

/* flash_block's tile from the tuning file and CLATTN_BLOCK_RM / RN over it
 * (either alone, making a pair with the file's other value), with their
 * origins, and clattn_describe's line of the tile per head dim. */
static void block_tile_from_file_and_environment(void) {
  REQUIRE(write_for_device("block_rm = 1\nblock_rn = 4\n") == 0);
  REQUIRE(setenv("CLATTN_FLASH_WG", "64", 1) == 0); /* flash_block on POCL */
  clattn_context *ctx = open_with(g_path);
  if (ctx) {
    CHECKF(!strncmp(ctx->tuning_note, "applied", 7), "note: %s", ctx->tuning_note);
    CHECK(ctx->tiles.block_rm == 1 && ctx->tiles.block_rn == 4);
    CHECK(ctx->origin[CA_T_BLOCK_RM] == CA_FROM_FILE && ctx->origin[CA_T_BLOCK_RN] == CA_FROM_FILE);
    const char *d = clattn_describe(ctx);
    CHECKF(strstr(d, "block_rm       1          (tuning file)") &&
               strstr(d,
                      "flash_block tile per head dim (rm x rn; tuned 1x4, smaller where it does not fit): 32: 1x4, "
                      "64: 1x4") &&
               strstr(d, "256: 1x2"),
           "describe:\n%s", d);
    clattn_destroy(ctx);
  }
  REQUIRE(setenv("CLATTN_BLOCK_RN", "2", 1) == 0);
  ctx = open_with(g_path);
  unsetenv("CLATTN_BLOCK_RN");
  if (ctx) {
    CHECK(ctx->tiles.block_rm == 1 && ctx->tiles.block_rn == 2);
    CHECK(ctx->origin[CA_T_BLOCK_RM] == CA_FROM_FILE && ctx->origin[CA_T_BLOCK_RN] == CA_FROM_ENV);
    long long v = 0;
    const char *origin = NULL;
    CHECK(clattn_tuning_get(ctx, "block_rn", &v, &origin) == CLATTN_OK && v == 2 && !strcmp(origin, "environment"));
    clattn_destroy(ctx);
  }
  /* both, over no file; 0 x 0 back to the choice per head dim */
  REQUIRE(setenv("CLATTN_BLOCK_RM", "4", 1) == 0 && setenv("CLATTN_BLOCK_RN", "4", 1) == 0);
  ctx = open_with("");
  if (ctx) {
    CHECK(ctx->tiles.block_rm == 4 && ctx->tiles.block_rn == 4 && ctx->origin[CA_T_BLOCK_RM] == CA_FROM_ENV);
    CHECKF(strstr(clattn_describe(ctx), "tuned 4x4, smaller where it does not fit): 32: 4x4, 64: 4x4") &&
               strstr(clattn_describe(ctx), "128: 2x4"),
           "%s", clattn_describe(ctx));
    clattn_destroy(ctx);
  }
  REQUIRE(setenv("CLATTN_BLOCK_RM", "0", 1) == 0 && setenv("CLATTN_BLOCK_RN", "0", 1) == 0);
  ctx = open_with(g_path);
  unsetenv("CLATTN_BLOCK_RM");
  unsetenv("CLATTN_BLOCK_RN");
  unsetenv("CLATTN_FLASH_WG");
  if (ctx) {
    CHECK(ctx->tiles.block_rm == 0 && ctx->tiles.block_rn == 0 && ctx->origin[CA_T_BLOCK_RN] == CA_FROM_ENV);
    CHECKF(strstr(clattn_describe(ctx), "flash_block tile per head dim (rm x rn): 32: "), "%s", clattn_describe(ctx));
    clattn_destroy(ctx);
  }
  /* without the work-group kernels (a CPU's default) the line says so */
  ctx = open_with("");
  if (ctx && ctx->tiles.flash_wg <= 0)
    CHECKF(strstr(clattn_describe(ctx), "flash_block tile: not used (flash_rows on this device"), "%s",
           clattn_describe(ctx));
  clattn_destroy(ctx);
}

/* flash_tiled's key tile from the tuning file and CLATTN_FLASH_TILE over
 * it, with origins, and clattn_describe's line of the tile per head dim
 * (POCL's 1 MiB of local memory takes any tuned tile). */
static void flash_tile_from_file_and_environment(void) {
  REQUIRE(write_for_device("flash_tile = 8\n") == 0);
  REQUIRE(setenv("CLATTN_FLASH_WG", "64", 1) == 0); /* the work-group kernels on POCL */
  clattn_context *ctx = open_with(g_path);
  if (ctx) {
    CHECKF(!strncmp(ctx->tuning_note, "applied", 7), "note: %s", ctx->tuning_note);
    CHECK(ctx->tiles.flash_tile == 8 && ctx->origin[CA_T_FLASH_TILE] == CA_FROM_FILE);
    CHECKF(strstr(clattn_describe(ctx),
                  "flash_tiled keys per tile per head dim (tuned 8, smaller where it does not fit): 32: 8, 64: 8"),
           "%s", clattn_describe(ctx));
    clattn_destroy(ctx);
  }
  REQUIRE(setenv("CLATTN_FLASH_TILE", "64", 1) == 0);
  ctx = open_with(g_path);
  unsetenv("CLATTN_FLASH_TILE");
  unsetenv("CLATTN_FLASH_WG");
  if (ctx) {
    long long v = 0;
    const char *origin = NULL;
    CHECK(clattn_tuning_get(ctx, "flash_tile", &v, &origin) == CLATTN_OK && v == 64 && !strcmp(origin, "environment"));
    CHECKF(strstr(clattn_describe(ctx), "(tuned 64, smaller where it does not fit): 32: 64,"), "%s",
           clattn_describe(ctx));
    clattn_destroy(ctx);
  }
  /* without the work-group kernels there is no flash_tiled line */
  ctx = open_with("");
  if (ctx && ctx->tiles.flash_wg <= 0)
    CHECKF(!strstr(clattn_describe(ctx), "flash_tiled keys per tile"), "%s", clattn_describe(ctx));
  clattn_destroy(ctx);
}

/* flash_rows' rows per work-item follow the vector width, CLATTN_FLASH_VW's
 * included (AVX2's 8: 4 rows), unless the tuning file gives them. */
static void rows_per_work_item_follow_the_vector_width(void) {
  REQUIRE(setenv("CLATTN_FLASH_VW", "8", 1) == 0);
  clattn_context *ctx = open_with("");
  if (ctx) {
    CHECK(ctx->tiles.flash_vw == 8 && ctx->tiles.flash_bm == 4 && ctx->origin[CA_T_FLASH_BM] == CA_FROM_QUERY);
    clattn_destroy(ctx);
  }
  REQUIRE(write_for_device("flash_bm = 8\n") == 0);
  ctx = open_with(g_path);
  unsetenv("CLATTN_FLASH_VW");
  if (ctx) {
    CHECK(ctx->tiles.flash_vw == 8 && ctx->tiles.flash_bm == 8 && ctx->origin[CA_T_FLASH_BM] == CA_FROM_FILE);
    clattn_destroy(ctx);
  }
  ctx = open_with("");
  if (ctx) {
    CHECK(ctx->tiles.flash_bm == ca_flash_bm(&ctx->caps, ctx->tiles.flash_vw));
    clattn_destroy(ctx);
  }
}

static void write_then_read_round_trips(void) {
  ca_tuning t, back;
  memset(&t, 0, sizeof t);
  snprintf(t.platform, sizeof t.platform, "Some Platform");
  snprintf(t.device, sizeof t.device, "Some Device");
  snprintf(t.driver, sizeof t.driver, "1.2.3");
  t.has[CA_T_MIX_TM] = 1, t.value[CA_T_MIX_TM] = 32;
  t.has[CA_T_SCRATCH_BYTES] = 1, t.value[CA_T_SCRATCH_BYTES] = 16 << 20;
  t.auto_algo[CA_CLASS_WEIGHTS] = CLATTN_ALGO_GEMM;
  t.has[CA_T_BLOCK_RM] = t.has[CA_T_BLOCK_RN] = 1, t.value[CA_T_BLOCK_RM] = 2, t.value[CA_T_BLOCK_RN] = 4;
  char err[512];
  REQUIREF(ca_tuning_write(g_path, &t, err, sizeof err) == 0, "%s", err);
  REQUIREF(ca_tuning_read(g_path, &back, err, sizeof err) == 0, "%s", err);
  CHECK(!strcmp(back.device, t.device) && !strcmp(back.driver, t.driver));
  CHECK(back.has[CA_T_MIX_TM] && back.value[CA_T_MIX_TM] == 32 && !back.has[CA_T_MIX_TV]);
  CHECK(back.value[CA_T_SCRATCH_BYTES] == 16 << 20);
  CHECK(back.has[CA_T_BLOCK_RM] && back.value[CA_T_BLOCK_RM] == 2 && back.value[CA_T_BLOCK_RN] == 4);
  CHECK(back.auto_algo[CA_CLASS_WEIGHTS] == CLATTN_ALGO_GEMM && back.auto_algo[CA_CLASS_PREFILL] == CLATTN_ALGO_AUTO);
}

static cp_problem *small_problem(int want_weights) {
  cp_shape s = cp_shape_default();
  s.q_heads = 4;
  s.kv_heads = 2;
  s.q_len = 37;
  s.kv_len = 53;
  s.head_dim = 40;
  s.value_dim = 24;
  s.causal = 1;
  s.want_lse = 1;
  s.want_weights = want_weights;
  s.poison_disallowed = 1;
  char err[256];
  cp_problem *pb = cp_build(&s, err, sizeof err);
  CHECKF(pb != NULL, "cp_build: %s", err);
  return pb;
}

/* What AUTO resolves to for pb in ctx. */
static clattn_algo auto_choice(clattn_context *ctx, cp_problem *pb) {
  pb->params.algo = CLATTN_ALGO_AUTO;
  ca_resolved r;
  if (cp_upload(pb, ct_context()) != 0 || ca_check_forward(ctx, &pb->params, NULL) != CLATTN_OK) return (clattn_algo)-1;
  ca_resolve(ctx, &pb->params, &r);
  return r.algo;
}

/* Runs pb with every algorithm in ctx against the reference. */
static void exact_in(clattn_context *ctx, cp_problem *pb) {
  for (size_t a = 0; a < KC_NALGOS; a++) {
    pb->params.algo = kc_algos[a];
    cp_result r;
    if (!CHECKF(cp_run(pb, ctx, &r) == 0, "%s", pb->err)) continue;
    char line[512];
    if (r.status == CLATTN_ERR_UNSUPPORTED && kc_algo_optional(kc_algos[a], &pb->params)) continue;
    CHECKF(cp_result_ok(&r, 1e-5), "%s: %s", clattn_algo_name(kc_algos[a]), cp_result_format(&r, line, sizeof line));
  }
}

static void matching_file_is_applied_with_origins(void) {
  REQUIRE(write_for_device("score_tm = 4\nmix_tj = 8\nflash_bm = 2\nscratch_bytes = 2097152\n"
                           "auto_prefill = gemm\nauto_decode = staged\nauto_weights = gemm\n") == 0);
  clattn_context *ctx = open_with(g_path);
  REQUIRE(ctx);
  CHECKF(!strncmp(ctx->tuning_note, "applied", 7), "note: %s", ctx->tuning_note);
  CHECK(ctx->tiles.score_tm == 4 && ctx->tiles.mix_tj == 8 && ctx->tiles.flash_bm == 2);
  CHECK(ctx->scratch_budget == 2097152);
  CHECK(ctx->origin[CA_T_SCORE_TM] == CA_FROM_FILE && ctx->origin[CA_T_SCRATCH_BYTES] == CA_FROM_FILE);
  CHECK(ctx->origin[CA_T_SCORE_TN] != CA_FROM_FILE && ctx->origin[CA_T_SOFTMAX_WG] == CA_FROM_QUERY);
  /* A build without CLBlast leaves the GEMM choices out (and says so). */
  const int gemm = ca_gemm_available();
  const char *d = clattn_describe(ctx);
  CHECKF(strstr(d, "score_tm       4          (tuning file)") && strstr(d, "(default from device query)") &&
             strstr(d, gemm ? "prefill: gemm, decode: staged, weights: gemm"
                            : "prefill: fused, decode: staged, weights: staged"),
         "describe:\n%s", d);
  CHECKF(gemm || strstr(ctx->tuning_note, "auto_weights = gemm left out"), "note: %s", ctx->tuning_note);

  cp_problem *pb = small_problem(0);
  if (pb) {
    CHECK(auto_choice(ctx, pb) == (gemm ? CLATTN_ALGO_GEMM : CLATTN_ALGO_FUSED)); /* 37 rows: prefill */
    exact_in(ctx, pb);
    cp_free(pb);
  }
  pb = small_problem(1);
  if (pb) {
    CHECK(auto_choice(ctx, pb) == (gemm ? CLATTN_ALGO_GEMM : CLATTN_ALGO_STAGED)); /* weights */
    exact_in(ctx, pb);
    cp_free(pb);
  }
  clattn_destroy(ctx);
}

static void decode_class_uses_its_choice(void) {
  REQUIRE(write_for_device("auto_decode = staged\n") == 0);
  clattn_context *ctx = open_with(g_path);
  REQUIRE(ctx);
  cp_shape s = cp_shape_default();
  s.q_len = 1;
  s.kv_len = 300;
  char err[256];
  cp_problem *pb = cp_build(&s, err, sizeof err);
  if (CHECKF(pb != NULL, "%s", err)) {
    CHECK(auto_choice(ctx, pb) == CLATTN_ALGO_STAGED);
    CHECK(auto_choice(ct_context(), pb) == ct_context()->auto_algo[CA_CLASS_DECODE] ||
          ct_context()->auto_algo[CA_CLASS_DECODE] == CLATTN_ALGO_AUTO);
    cp_free(pb);
  }
  clattn_destroy(ctx);
}

/* The defaults a context without any tuning file gets. */
static void expect_defaults(clattn_context *ctx, clattn_context *plain, const char *note_start) {
  CHECKF(!strncmp(ctx->tuning_note, note_start, strlen(note_start)), "note: %s", ctx->tuning_note);
  CHECK(!memcmp(&ctx->tiles, &plain->tiles, sizeof ctx->tiles));
  CHECK(ctx->scratch_budget == plain->scratch_budget);
  for (int c = 0; c < CA_CLASS_COUNT; c++) CHECK(ctx->auto_algo[c] == CLATTN_ALGO_AUTO);
  for (int t = 0; t < CA_T_COUNT; t++) CHECK(ctx->origin[t] != CA_FROM_FILE);
}

static void other_device_bad_value_or_misfit_use_defaults(void) {
  clattn_context *plain = open_with("");
  REQUIRE(plain);
  CHECK(!strncmp(plain->tuning_note, "none", 4));

  FILE *f = fopen(g_path, "w");
  REQUIRE(f);
  fprintf(f, "format = 1\nplatform = Other\ndevice = Other GPU\ndriver = 9\nscore_tm = 4\n");
  fclose(f);
  clattn_context *ctx = open_with(g_path);
  if (ctx) expect_defaults(ctx, plain, "ignored:"), clattn_destroy(ctx);

  REQUIRE(write_for_device("score_tm = 4\nflash_bm = 5\n") == 0);
  ctx = open_with(g_path);
  if (ctx) {
    expect_defaults(ctx, plain, "rejected, defaults used:");
    CHECKF(strstr(ctx->tuning_note, "flash_bm = 5") != NULL, "note: %s", ctx->tuning_note);
    CHECK(strstr(clattn_describe(ctx), "rejected, defaults used") != NULL);
    clattn_destroy(ctx);
  }

  /* 1024 x 1024 work-items in one group: no device runs that */
  REQUIRE(write_for_device("score_tm = 1024\nscore_tn = 1024\n") == 0);
  ctx = open_with(g_path);
  if (ctx) {
    expect_defaults(ctx, plain, "rejected, defaults used:");
    CHECKF(strstr(ctx->tuning_note, "does not fit this device") != NULL, "note: %s", ctx->tuning_note);
    cp_problem *pb = small_problem(0);
    if (pb) exact_in(ctx, pb), cp_free(pb);
    clattn_destroy(ctx);
  }

  ctx = open_with("/nonexistent/clattn-tuning.txt");
  if (ctx) expect_defaults(ctx, plain, "rejected, defaults used: cannot open"), clattn_destroy(ctx);
  clattn_destroy(plain);
}

/* The public API: every value with its origin, candidates written for this
 * device and applied (or refused) by a context that names the file. */
static void public_api_reads_values_and_writes_candidates(void) {
  clattn_context *plain = open_with("");
  REQUIRE(plain);
  int n = 0;
  while (clattn_tuning_name(n)) n++;
  CHECK(n == CA_T_COUNT && clattn_tuning_name(-1) == NULL);
  long long v = -1;
  const char *origin = NULL;
  for (int i = 0; i < n; i++) {
    CHECK(clattn_tuning_get(plain, clattn_tuning_name(i), &v, &origin) == CLATTN_OK);
    CHECKF(v == ca_tunable_get(&plain->tiles, plain->scratch_budget, (ca_tunable)i), "%s = %lld", clattn_tuning_name(i),
           v);
    CHECK(origin && !strcmp(origin, ca_origin_name(plain->origin[i])));
  }
  CHECK(clattn_tuning_get(plain, "score_tx", &v, NULL) == CLATTN_ERR_INVALID_ARGUMENT &&
        strstr(clattn_last_error(NULL), "'score_tx'"));
  CHECK(clattn_tuning_get(NULL, "score_tm", &v, NULL) == CLATTN_ERR_INVALID_ARGUMENT);
  int applied = 1;
  CHECK(!strncmp(clattn_tuning_note(plain, &applied), "none", 4) && applied == 0);
  const char *def = clattn_tuning_default_path(plain);
  CHECK(def ? plain->cache_dir && strstr(def, "/tuning-") != NULL : plain->cache_dir == NULL);

  /* bad settings: refused with the line named, nothing written */
  unlink(g_path);
  CHECK(clattn_tuning_write(plain, "mix_tj = 32\nflash_bm = 5\n", g_path) == CLATTN_ERR_INVALID_ARGUMENT);
  CHECKF(strstr(clattn_last_error(NULL), "settings:2: flash_bm = 5"), "%s", clattn_last_error(NULL));
  CHECK(clattn_tuning_write(plain, "device = Other GPU\n", g_path) == CLATTN_ERR_INVALID_ARGUMENT);
  CHECK(clattn_tuning_write(plain, "block_rm = 4\n", g_path) == CLATTN_ERR_INVALID_ARGUMENT);
  CHECKF(strstr(clattn_last_error(NULL), "settings: block_rm without block_rn"), "%s", clattn_last_error(NULL));
  CHECK(clattn_tuning_write(plain, "block_rm = 4\nblock_rn = 2\n", g_path) == CLATTN_ERR_INVALID_ARGUMENT);
  CHECK(clattn_tuning_write(NULL, "", g_path) == CLATTN_ERR_INVALID_ARGUMENT);
  CHECK(access(g_path, F_OK) != 0);
  CHECK(clattn_tuning_write(plain, "mix_tj = 8\n", "/nonexistent/dir/tuning.txt") == CLATTN_ERR_INVALID_ARGUMENT);

  /* a candidate: written for this device, applied by a context naming it */
  REQUIRE(clattn_tuning_write(plain, "mix_tj = 8  # a candidate\nscratch_bytes = 1048576\nauto_decode = staged\n",
                              g_path) == CLATTN_OK);
  clattn_context *ctx = open_with(g_path);
  if (ctx) {
    const char *note = clattn_tuning_note(ctx, &applied);
    CHECKF(!strncmp(note, "applied", 7) && applied == 1, "note: %s", note);
    CHECK(clattn_tuning_get(ctx, "mix_tj", &v, &origin) == CLATTN_OK && v == 8 && !strcmp(origin, "tuning file"));
    CHECK(clattn_tuning_get(ctx, "scratch_bytes", &v, &origin) == CLATTN_OK && v == 1048576);
    CHECK(clattn_tuning_get(ctx, "score_tm", &v, &origin) == CLATTN_OK && strcmp(origin, "tuning file") != 0);
    CHECK(ctx->auto_algo[CA_CLASS_DECODE] == CLATTN_ALGO_STAGED);
    clattn_destroy(ctx);
  }
  /* a candidate the device cannot run: the context says so and keeps the defaults */
  REQUIRE(clattn_tuning_write(plain, "score_tm = 1024\nscore_tn = 1024\n", g_path) == CLATTN_OK);
  ctx = open_with(g_path);
  if (ctx) {
    const char *note = clattn_tuning_note(ctx, &applied);
    CHECKF(applied == 0 && strstr(note, "does not fit this device"), "note: %s", note);
    CHECK(clattn_tuning_get(ctx, "score_tm", &v, &origin) == CLATTN_OK && strcmp(origin, "tuning file") != 0);
    clattn_destroy(ctx);
  }
  clattn_destroy(plain);
}

/* Removes dir and the files in it. */
static void remove_dir(const char *dir) {
  DIR *d = opendir(dir);
  if (!d) return;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) unlink(path);
  }
  closedir(d);
  rmdir(dir);
}

/* Each program's options carry only its kernels' tiles: retuning a staged
 * tile rebuilds the core program, and the fused program built under the old
 * tuning still loads from the disk cache. */
static void retuned_staged_tile_keeps_the_fused_binary(void) {
  char dir[] = "/tmp/clattn-tuning-cache-XXXXXX";
  REQUIRE(mkdtemp(dir));
  clattn_options o = {0};
  o.context = clattn_cl_context(ct_context());
  o.device = clattn_cl_device(ct_context());
  o.queue = clattn_cl_queue(ct_context());
  o.cache_dir = dir;
  o.tuning_file = "";
  clattn_context *before = NULL, *after = NULL;
  cp_problem *pb = small_problem(0);
  cp_result r;
  if (!CHECKF(clattn_create(&o, &before) == CLATTN_OK, "%s", clattn_last_error(NULL)) || !pb) goto done;
  pb->params.algo = CLATTN_ALGO_FUSED;
  CHECKF(cp_run(pb, before, &r) == 0 && r.status == CLATTN_OK, "%s", pb->err);
  char text[64];
  snprintf(text, sizeof text, "score_tn = %d\n", before->tiles.score_tn > 1 ? before->tiles.score_tn / 2 : 2);
  REQUIRE(clattn_tuning_write(before, text, g_path) == CLATTN_OK);
  o.tuning_file = g_path;
  if (!CHECKF(clattn_create(&o, &after) == CLATTN_OK, "%s", clattn_last_error(NULL))) goto done;
  int applied = 0, source0, cache0, source1, cache1;
  CHECKF(clattn_tuning_note(after, &applied) && applied, "note: %s", clattn_tuning_note(after, NULL));
  ca_cache_counts(after, &source0, &cache0);
  CHECKF(source0 >= 1, "the core program with the new tile came from the cache (%d from source)", source0);
  CHECKF(cp_run(pb, after, &r) == 0 && r.status == CLATTN_OK && cp_result_ok(&r, 1e-5), "%s", pb->err);
  ca_cache_counts(after, &source1, &cache1);
  CHECKF(source1 == source0 && cache1 == cache0 + 1, "fused program: %d built from source, %d loaded from cache",
         source1 - source0, cache1 - cache0);
done:
  cp_free(pb);
  clattn_destroy(after);
  clattn_destroy(before);
  remove_dir(dir);
}

static void cleanup(void) {
  unlink(g_path);
  rmdir(g_dir);
}

int main(int argc, char **argv) {
  if (argc == 2 && !strcmp(argv[1], "--create")) return create_main();
  static const ct_test tests[] = {
      CT_TEST(format_errors_name_the_line_and_value),         CT_TEST(long_lines_and_nul_bytes_are_rejected),
      CT_TEST(fifo_and_devices_do_not_block_creation),        CT_TEST(environment_overrides_follow_the_file_rule),
      CT_TEST(block_tile_from_file_and_environment),          CT_TEST(flash_tile_from_file_and_environment),
      CT_TEST(rows_per_work_item_follow_the_vector_width),    CT_TEST(write_then_read_round_trips),
      CT_TEST(matching_file_is_applied_with_origins),         CT_TEST(decode_class_uses_its_choice),
      CT_TEST(other_device_bad_value_or_misfit_use_defaults), CT_TEST(public_api_reads_values_and_writes_candidates),
      CT_TEST(retuned_staged_tile_keeps_the_fused_binary),
  };
  if (!mkdtemp(g_dir)) return fprintf(stderr, "mkdtemp failed\n"), 1;
  snprintf(g_path, sizeof g_path, "%s/tuning.txt", g_dir);
  ct_context();
  ct_cleanup = cleanup;
  return ct_main(argc, argv, tests, sizeof tests / sizeof tests[0]);
}
