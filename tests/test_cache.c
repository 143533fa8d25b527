/*
 * The on-disk program cache (src/cache.c): a miss compiles and stores, a hit
 * loads and computes bitwise the same; corrupted, truncated, foreign and
 * driver-refused entries are rebuilt and overwritten, and so are crafted
 * ones and a FIFO at an entry's path (in child processes under a watchdog:
 * they once crashed or hung the creating process); an unusable or empty
 * cache_dir only turns the cache off; concurrent processes filling one
 * directory leave only valid entries and no temp files.
 *
 * Every test makes its own contexts (not ct_context): the cache is read at
 * program build time. The counts of programs built from source and loaded
 * from our cache say what clattn's cache did, so POCL's own kernel cache
 * stays on, in a directory of this run's (the first build of each program
 * is cold, the rest quick; its children share it); the default directory's
 * test runs again in a child with POCL_KERNEL_CACHE=0, where our default
 * directory keeps binaries. One seed directory is filled once (cold builds
 * take seconds on POCL) and copied where a test needs a warm cache.
 * The concurrency test runs this executable again as child processes
 * ("--child DIR"): a forked process must not reuse its parent's OpenCL.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "api/api.h"
#include "problem.h"

#define TOL       1e-5
#define HEADER    48 /* cache.c's header: magic, version, reserved, key, length, checksum */
#define MAX_FILES 16

static char g_root[256]; /* this run's temp directory */
static char g_seed[300]; /* a filled cache: probe, core and one fused program */
static int g_seeded;
/* The seed's entries by role (file names) and the seeded outputs. */
static char g_probe[256], g_core[256], g_fused[256];
static float *g_out_fused, *g_out_staged;
static size_t g_out_n;

/* ---------- files ---------- */

typedef struct {
  int n;
  char name[MAX_FILES][256];
  long size[MAX_FILES];
} listing;

/* Every entry of dir but . and .. (n = -1 when dir cannot be opened). */
static listing list_dir(const char *dir) {
  listing l;
  memset(&l, 0, sizeof l);
  DIR *d = opendir(dir);
  if (!d) {
    l.n = -1;
    return l;
  }
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..") || l.n == MAX_FILES) continue;
    snprintf(l.name[l.n], sizeof l.name[l.n], "%s", e->d_name);
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    struct stat sb;
    l.size[l.n] = stat(path, &sb) == 0 ? (long)sb.st_size : -1;
    l.n++;
  }
  closedir(d);
  return l;
}

static int is_entry_name(const char *name) {
  size_t n = strlen(name);
  if (n != 36 || strcmp(name + 32, ".bin") != 0) return 0;
  for (size_t i = 0; i < 32; i++)
    if (!strchr("0123456789abcdef", name[i])) return 0;
  return 1;
}

static int has_name(const listing *l, const char *name) {
  for (int i = 0; i < l->n; i++)
    if (!strcmp(l->name[i], name)) return 1;
  return 0;
}

static unsigned char *read_file(const char *path, size_t *n) {
  *n = 0;
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  unsigned char *buf = NULL;
  if (fseek(f, 0, SEEK_END) == 0) {
    long len = ftell(f);
    if (len >= 0 && fseek(f, 0, SEEK_SET) == 0 && (buf = malloc((size_t)len + 1)) != NULL) {
      if (fread(buf, 1, (size_t)len, f) == (size_t)len) {
        *n = (size_t)len;
      } else {
        free(buf);
        buf = NULL;
      }
    }
  }
  fclose(f);
  return buf;
}

static int write_file(const char *path, const void *data, size_t n) {
  FILE *f = fopen(path, "wb");
  if (!f) return -1;
  int ok = fwrite(data, 1, n, f) == n;
  ok = (fclose(f) == 0) && ok;
  return ok ? 0 : -1;
}

static int copy_dir(const char *from, const char *to) {
  if (mkdir(to, 0755) != 0 && errno != EEXIST) return -1;
  listing l = list_dir(from);
  for (int i = 0; i < l.n; i++) {
    char src[1024], dst[1024];
    snprintf(src, sizeof src, "%s/%s", from, l.name[i]);
    snprintf(dst, sizeof dst, "%s/%s", to, l.name[i]);
    size_t n = 0;
    unsigned char *data = read_file(src, &n);
    int rc = data ? write_file(dst, data, n) : -1;
    free(data);
    if (rc != 0) return -1;
  }
  return 0;
}

static uint64_t le64(const unsigned char *p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
  return v;
}

/* Whether a file is a whole entry: header with the magic, its name's key
 * and a length that matches the file (the checksum is the library's job:
 * the next context's from_cache count shows it). */
static int entry_looks_whole(const char *dir, const char *name) {
  char path[1024];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  struct stat sb;
  if (stat(path, &sb) != 0 || !S_ISREG(sb.st_mode)) /* a FIFO left there would block the read */
    return 0;
  size_t n = 0;
  unsigned char *data = read_file(path, &n);
  int ok = data && n > HEADER && !memcmp(data, "CLATTNPB", 8) && le64(data + 32) == n - HEADER;
  for (int i = 0; ok && i < 16; i++) {
    char hex[3];
    snprintf(hex, sizeof hex, "%02x", data[16 + i]);
    ok = !memcmp(hex, name + 2 * i, 2);
  }
  free(data);
  return ok;
}

static void make_dir(char *out, size_t n, const char *leaf) { snprintf(out, n, "%s/%s", g_root, leaf); }

/* ---------- contexts and problems ---------- */

/* A context on cache_dir (NULL: the environment decides). */
static clattn_context *create_on(const char *cache_dir) {
  clattn_options opt;
  memset(&opt, 0, sizeof opt);
  opt.cache_dir = cache_dir;
  clattn_context *ctx = NULL;
  clattn_status st = clattn_create(&opt, &ctx);
  if (st == CLATTN_ERR_NO_DEVICE) {
    printf("skipped: no OpenCL device (%s)\n", clattn_last_error(NULL));
    exit(CT_SKIP);
  }
  CHECKF(st == CLATTN_OK, "clattn_create: %s: %s", clattn_status_string(st), clattn_last_error(NULL));
  return st == CLATTN_OK ? ctx : NULL;
}

static cp_shape small_shape(void) {
  cp_shape s = cp_shape_default();
  s.q_len = 19;
  s.kv_len = 37;
  /* a small fused program: cold builds are the cost here, and a head dim
   * no multiple of 16 leaves the decode kernels (a dozen entries) out */
  s.head_dim = 8;
  s.value_dim = 8;
  s.causal = 1;
  s.seed = 7;
  return s;
}

/* Runs the small problem with algo; checks it against the reference and
 * returns a copy of the raw output (NULL on failure, recorded). */
static float *run_small(clattn_context *ctx, clattn_algo algo, size_t *n) {
  cp_shape s = small_shape();
  char err[256] = "";
  cp_problem *pb = cp_build(&s, err, sizeof err);
  if (!CHECKF(pb != NULL, "cp_build: %s", err)) return NULL;
  pb->params.algo = algo;
  cp_result r;
  float *copy = NULL;
  if (CHECKF(cp_run(pb, ctx, &r) == 0, "harness: %s", pb->err)) {
    char f[512];
    if (CHECKF(cp_result_ok(&r, TOL), "%s: %s (%s)", clattn_algo_name(algo), cp_result_format(&r, f, sizeof f),
               clattn_last_error(ctx))) {
      copy = malloc(pb->out_elems * sizeof(float));
      if (copy) {
        memcpy(copy, pb->out_raw, pb->out_elems * sizeof(float));
        *n = pb->out_elems;
      }
    }
  }
  cp_free(pb);
  return copy;
}

/* Runs FUSED and STAGED on ctx and checks both bitwise against the seed's. */
static void run_and_compare(clattn_context *ctx, const char *what) {
  size_t n1 = 0, n2 = 0;
  float *f = run_small(ctx, CLATTN_ALGO_FUSED, &n1);
  float *s = run_small(ctx, CLATTN_ALGO_STAGED, &n2);
  if (f && g_out_fused)
    CHECKF(n1 == g_out_n && !memcmp(f, g_out_fused, n1 * sizeof(float)), "%s: FUSED output differs bitwise", what);
  if (s && g_out_staged)
    CHECKF(n2 == g_out_n && !memcmp(s, g_out_staged, n2 * sizeof(float)), "%s: STAGED output differs bitwise", what);
  free(f);
  free(s);
}

static void counts(clattn_context *ctx, int *src, int *cache) { ca_cache_counts(ctx, src, cache); }

/* Fills g_seed once: a cold context (every program from source, stored),
 * FUSED and STAGED outputs kept for bitwise comparisons, entries named by
 * role. Returns 0 when the seed is usable. */
static int seed(void) {
  if (g_seeded) return g_seeded > 0 ? 0 : -1;
  g_seeded = -1;
  make_dir(g_seed, sizeof g_seed, "seed");
  clattn_context *ctx = create_on(g_seed);
  if (!ctx) return -1;
  int src = 0, cache = 0;
  counts(ctx, &src, &cache);
  CHECKF(src == 2 && cache == 0, "cold creation: %d from source (want 2: probe, core), %d from cache", src, cache);
  listing before = list_dir(g_seed);
  int ok = CHECKF(before.n == 2, "after a cold creation the cache holds %d files, want 2", before.n);
  if (ok) {
    int small = before.size[0] <= before.size[1] ? 0 : 1;
    snprintf(g_probe, sizeof g_probe, "%s", before.name[small]);
    snprintf(g_core, sizeof g_core, "%s", before.name[1 - small]);
  }
  g_out_fused = run_small(ctx, CLATTN_ALGO_FUSED, &g_out_n);
  g_out_staged = run_small(ctx, CLATTN_ALGO_STAGED, &g_out_n);
  counts(ctx, &src, &cache);
  CHECKF(src == 3 && cache == 0, "after a FUSED call: %d from source (want 3), %d from cache", src, cache);
  listing after = list_dir(g_seed);
  ok = CHECKF(after.n == 3, "after a FUSED call the cache holds %d files, want 3", after.n) && ok;
  for (int i = 0; ok && i < after.n; i++) {
    CHECKF(is_entry_name(after.name[i]), "unexpected file in the cache: %s", after.name[i]);
    if (!has_name(&before, after.name[i])) snprintf(g_fused, sizeof g_fused, "%s", after.name[i]);
  }
  clattn_destroy(ctx);
  if (ok && g_out_fused && g_out_staged && g_fused[0]) g_seeded = 1;
  return g_seeded > 0 ? 0 : -1;
}

/* A context on dir that must load every program from the cache. */
static void check_all_from_cache(const char *dir, const char *what) {
  clattn_context *ctx = create_on(dir);
  if (!ctx) return;
  int src = -1, cache = -1;
  counts(ctx, &src, &cache);
  CHECKF(src == 0 && cache == 2, "%s: creation built %d from source, loaded %d from cache (want 0, 2)", what, src,
         cache);
  run_and_compare(ctx, what);
  counts(ctx, &src, &cache);
  CHECKF(src == 0 && cache == 3, "%s: after the calls %d from source, %d from cache (want 0, 3)", what, src, cache);
  clattn_destroy(ctx);
}

/* ---------- tests ---------- */

static void miss_then_store_then_hit(void) {
  REQUIRE(seed() == 0);
  /* The seed was the miss (checked in seed()); now the hit on the same
   * directory, through the environment. */
  const char *dir = g_seed;
  REQUIRE(setenv("CLATTN_CACHE_DIR", dir, 1) == 0);
  clattn_context *ctx = create_on(NULL);
  unsetenv("CLATTN_CACHE_DIR");
  REQUIRE(ctx != NULL);
  int src = -1, cache = -1;
  counts(ctx, &src, &cache);
  CHECKF(src == 0 && cache == 2, "warm creation: %d from source, %d from cache (want 0, 2)", src, cache);
  char want[400];
  snprintf(want, sizeof want, "program cache: %s (at creation: 0 built from source, 2 loaded from cache)", dir);
  CHECKF(strstr(clattn_describe(ctx), want) != NULL, "describe lacks \"%s\":\n%s", want, clattn_describe(ctx));
  run_and_compare(ctx, "warm context");
  counts(ctx, &src, &cache);
  CHECKF(src == 0 && cache == 3, "warm calls: %d from source, %d from cache (want 0, 3)", src, cache);
  clattn_destroy(ctx);
  listing l = list_dir(dir);
  CHECKF(l.n == 3, "a warm run changed the number of entries: %d", l.n);
}

/* Rewrites dir/name with a corruption applied: 0 flips a payload byte,
 * 1 truncates, 2 garbles the header, 3 replaces it with another entry
 * (valid file, foreign key), 4 keeps the header (checksum fixed up) over a
 * payload the driver cannot load. */
static int corrupt(const char *dir, const char *name, int how, const char *other) {
  char path[1024];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  size_t n = 0;
  unsigned char *data = read_file(path, &n);
  if (!data || n <= HEADER + 16) {
    free(data);
    return -1;
  }
  int rc = 0;
  switch (how) {
    case 0:
      data[HEADER + (n - HEADER) / 2] ^= 0x5a;
      rc = write_file(path, data, n);
      break;
    case 1: rc = write_file(path, data, HEADER + (n - HEADER) / 3); break;
    case 2:
      memcpy(data, "GARBAGE!", 8);
      for (int i = 16; i < 32; i++) data[i] ^= 0xff;
      rc = write_file(path, data, n);
      break;
    case 3: {
      char opath[1024];
      snprintf(opath, sizeof opath, "%s/%s", dir, other);
      size_t on = 0;
      unsigned char *odata = read_file(opath, &on);
      rc = odata ? write_file(path, odata, on) : -1;
      free(odata);
      break;
    }
    case 4: {
      for (size_t i = HEADER; i < n; i++) data[i] = (unsigned char)(i * 131u + 7u);
      uint64_t h = ca_cache_entry_checksum(data, n);
      for (int i = 0; i < 8; i++) data[40 + i] = (unsigned char)(h >> (8 * i));
      rc = write_file(path, data, n);
      break;
    }
    default: rc = -1;
  }
  free(data);
  return rc;
}

static void corrupted_entry_is_rebuilt(void) {
  REQUIRE(seed() == 0);
  char dir[300];
  make_dir(dir, sizeof dir, "corrupt");
  REQUIRE(copy_dir(g_seed, dir) == 0);

  /* Round 1: every entry broken a different way: all three rebuilt. */
  REQUIRE(corrupt(dir, g_probe, 0, NULL) == 0); /* a payload byte flipped */
  REQUIRE(corrupt(dir, g_core, 1, NULL) == 0);  /* truncated */
  REQUIRE(corrupt(dir, g_fused, 2, NULL) == 0); /* garbage header */
  clattn_context *ctx = create_on(dir);
  REQUIRE(ctx != NULL);
  int src = -1, cache = -1;
  counts(ctx, &src, &cache);
  CHECKF(src == 2 && cache == 0, "broken probe and core: %d from source, %d from cache (want 2, 0)", src, cache);
  run_and_compare(ctx, "rebuilt context");
  counts(ctx, &src, &cache);
  CHECKF(src == 3 && cache == 0, "broken fused entry: %d from source, %d from cache (want 3, 0)", src, cache);
  clattn_destroy(ctx);
  listing l = list_dir(dir);
  CHECKF(l.n == 3, "after the rebuild the cache holds %d files, want 3", l.n);
  CHECK(entry_looks_whole(dir, g_probe));
  CHECK(entry_looks_whole(dir, g_core));
  CHECK(entry_looks_whole(dir, g_fused));
  check_all_from_cache(dir, "after the rebuild");

  /* Round 2 (on the cheap probe): a valid entry under a foreign key, then a
   * checksummed payload the driver refuses. */
  for (int how = 3; how <= 4; how++) {
    REQUIRE(corrupt(dir, g_probe, how, g_core) == 0);
    ctx = create_on(dir);
    REQUIRE(ctx != NULL);
    counts(ctx, &src, &cache);
    CHECKF(src == 1 && cache == 1, "%s probe entry: %d from source, %d from cache (want 1, 1)",
           how == 3 ? "foreign" : "unloadable", src, cache);
    clattn_destroy(ctx);
    CHECK(entry_looks_whole(dir, g_probe));
  }
  check_all_from_cache(dir, "after round 2");
}

/* ---------- crafted entries and non-regular files (issue 18, items 5 and 6) ----------
 *
 * What the cache defends: clattn hands the driver only a payload whose
 * length field is exactly what the file holds and whose checksum (format 2)
 * covers the header, key included, and the payload; anything else, and any
 * path that is not a regular file, is deleted and rebuilt from source. The
 * adversarial probe's files recomputed format 1's checksum, which covered the
 * payload only: a payload cut to 100 bytes or filled with random bytes that
 * way made POCL's binary loader abort or segfault, and another entry's file
 * re-keyed in its header loaded a program without the kernels clattn asks
 * for, failing every creation. Not defended: bytes forged with format 2's
 * checksum recomputed still reach POCL, which crashes on some of them (a
 * cache directory is its user's own; this is robustness, not a boundary);
 * defended: such a crash happens once, the next creation deletes the entry
 * its load marker shows died in the loader.
 *
 * Every creation runs in a child process (a crash is contained) under an
 * alarm() watchdog (a hang is reported, not waited for). */

enum { CHILD_WATCHDOG_S = 120 };

/* Runs this executable as "--create DIR": a fresh process creating a
 * context on DIR. Returns its exit status (0: created, *src and *cache set),
 * or 128 + the signal that ended it (SIGALRM: the watchdog, it hung).
 * quiet: its stderr to /dev/null, for a crash inside POCL that is expected
 * (a sanitizer's report of it would count against tools/scripts/sanitize.sh). */
static int create_in_child(const char *dir, int *src, int *cache, int quiet) {
  *src = *cache = -1;
  int out[2];
  if (pipe(out) != 0) return -1;
  pid_t pid = fork();
  if (pid == 0) {
    dup2(out[1], 1);
    close(out[0]);
    close(out[1]);
    int null = quiet ? open("/dev/null", O_WRONLY) : -1;
    if (null >= 0) dup2(null, 2);
    execl("/proc/self/exe", "test_cache", "--create", dir, (char *)NULL);
    _exit(4);
  }
  close(out[1]);
  char buf[128] = "";
  size_t got = 0;
  ssize_t r;
  while (pid > 0 && got + 1 < sizeof buf && (r = read(out[0], buf + got, sizeof buf - 1 - got)) != 0) {
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) break;
    got += (size_t)r;
  }
  buf[got] = '\0';
  close(out[0]);
  int status = 0;
  if (pid <= 0 || waitpid(pid, &status, 0) != pid) return -1;
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  if (WEXITSTATUS(status) == 0 && sscanf(buf, "%d %d", src, cache) != 2) return 5;
  return WEXITSTATUS(status);
}

static int create_main(const char *dir) {
  alarm(CHILD_WATCHDOG_S); /* the watchdog: a blocked open or read ends here */
  clattn_options opt;
  memset(&opt, 0, sizeof opt);
  opt.cache_dir = dir;
  clattn_context *ctx = NULL;
  clattn_status st = clattn_create(&opt, &ctx);
  if (st != CLATTN_OK) {
    fprintf(stderr, "child: clattn_create: %s\n", clattn_last_error(NULL));
    return 2;
  }
  int src = -1, cache = -1;
  ca_cache_counts(ctx, &src, &cache);
  printf("%d %d\n", src, cache);
  clattn_destroy(ctx);
  return 0;
}

static void put_le64(unsigned char *p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}

/* Format 1's checksum: FNV-1a 64 over the payload alone. */
static uint64_t payload_only_checksum(const unsigned char *data, size_t n) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = HEADER; i < n; i++) h = (h ^ data[i]) * 0x100000001b3ull;
  return h;
}

typedef enum { HUGE_LENGTH, CUT_TO_100, RANDOM_PAYLOAD, REKEYED_OTHER, FIFO_AT_PATH, FORGED } craft;
static const char *const craft_names[] = {"length field 0x7fffffff (checksum recomputed)",
                                          "payload cut to 100 bytes (format 1 checksum)",
                                          "random payload behind its first 64 bytes (format 1 checksum)",
                                          "another entry re-keyed in its header",
                                          "a FIFO at the path",
                                          "payload cut to 100 bytes, format 2 checksum recomputed"};

/* Replaces dir/name by a crafted file (other: another entry's name). */
static int craft_entry(const char *dir, const char *name, craft how, const char *other) {
  char path[1024];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  if (how == FIFO_AT_PATH) return unlink(path) == 0 && mkfifo(path, 0600) == 0 ? 0 : -1;
  size_t n = 0;
  unsigned char *data = NULL;
  if (how == REKEYED_OTHER) {
    char opath[1024];
    snprintf(opath, sizeof opath, "%s/%s", dir, other);
    unsigned char *mine = read_file(path, &n);
    data = read_file(opath, &n);
    if (mine && data) memcpy(data + 16, mine + 16, 16); /* this name's key; the checksum left as it was */
    free(mine);
  } else {
    data = read_file(path, &n);
  }
  if (!data || n <= HEADER + 100) {
    free(data);
    return -1;
  }
  if (how == HUGE_LENGTH) {
    put_le64(data + 32, 0x7fffffff);
    put_le64(data + 40, ca_cache_entry_checksum(data, n));
  } else if (how == CUT_TO_100 || how == RANDOM_PAYLOAD || how == FORGED) {
    if (how != RANDOM_PAYLOAD) n = HEADER + 100;
    uint64_t x = 0x9e3779b97f4a7c15ull;
    /* Random behind the binary's first 64 bytes (POCL's own header): the
     * probe's segfault. */
    for (size_t i = HEADER + 64; how == RANDOM_PAYLOAD && i < n; i++) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      data[i] = (unsigned char)x;
    }
    put_le64(data + 32, n - HEADER);
    put_le64(data + 40, how == FORGED ? ca_cache_entry_checksum(data, n) : payload_only_checksum(data, n));
  }
  int rc = write_file(path, data, n);
  free(data);
  return rc;
}

static void crafted_entries_are_rebuilt_not_loaded(void) {
  REQUIRE(seed() == 0);
  char dir[300];
  make_dir(dir, sizeof dir, "crafted");
  REQUIRE(copy_dir(g_seed, dir) == 0);
  /* The cheap probe program takes each craft; core stays a valid entry. */
  for (int how = HUGE_LENGTH; how <= FIFO_AT_PATH; how++) {
    if (!CHECKF(craft_entry(dir, g_probe, (craft)how, g_core) == 0, "%s: cannot craft the file", craft_names[how]))
      continue;
    int src = -1, cache = -1;
    int rc = create_in_child(dir, &src, &cache, 0);
    CHECKF(rc == 0, "%s: the creating process %s %d%s", craft_names[how], rc > 128 ? "died of signal" : "exited",
           rc > 128 ? rc - 128 : rc, rc == 128 + SIGALRM ? " (watchdog: it hung)" : "");
    CHECKF(rc != 0 || (src == 1 && cache == 1), "%s: %d from source, %d from cache (want 1, 1)", craft_names[how], src,
           cache);
    CHECKF(entry_looks_whole(dir, g_probe), "%s: not replaced by a rebuilt entry", craft_names[how]);
  }
  int src = -1, cache = -1;
  CHECK(create_in_child(dir, &src, &cache, 0) == 0);
  CHECKF(src == 0 && cache == 2, "after the crafted files: %d from source, %d from cache (want 0, 2)", src, cache);

  /* A forgery with format 2's checksum reaches POCL, whose loader may crash
   * the first creation (not defended); the entry must not outlive that:
   * its load marker is left unlocked, so the next creation deletes the
   * entry unloaded and rebuilds it. */
  REQUIRE(craft_entry(dir, g_probe, FORGED, NULL) == 0);
  int first = create_in_child(dir, &src, &cache, 1);
  printf("    %s: the first creation %s %d\n", craft_names[FORGED], first > 128 ? "died of signal" : "exited",
         first > 128 ? first - 128 : first);
  CHECKF(first != 128 + SIGALRM, "%s: the first creation hung", craft_names[FORGED]);
  int rc = create_in_child(dir, &src, &cache, 0);
  CHECKF(rc == 0, "%s: the next creation %s %d", craft_names[FORGED], rc > 128 ? "died of signal" : "exited",
         rc > 128 ? rc - 128 : rc);
  CHECKF(rc != 0 || cache >= 1, "%s: %d from source, %d from cache", craft_names[FORGED], src, cache);
  CHECKF(entry_looks_whole(dir, g_probe), "%s: not replaced by a rebuilt entry", craft_names[FORGED]);
  listing l = list_dir(dir);
  for (int i = 0; i < l.n; i++) CHECKF(is_entry_name(l.name[i]), "left behind: %s", l.name[i]);
}

static void unwritable_cache_dir_still_works(void) {
  /* A path through a regular file: no directory can be made there (root included). */
  char file[300], dir[400];
  make_dir(file, sizeof file, "a-file");
  REQUIRE(write_file(file, "not a directory\n", 16) == 0);
  snprintf(dir, sizeof dir, "%s/cache", file);
  const char *dirs[3] = {dir, file, NULL};
  /* A read-only directory (not read-only to root: then a path under /proc). */
  char ro[300], under_ro[400];
  make_dir(ro, sizeof ro, "read-only");
  REQUIRE(mkdir(ro, 0555) == 0 || errno == EEXIST);
  REQUIRE(chmod(ro, 0555) == 0);
  snprintf(under_ro, sizeof under_ro, "%s/cache", ro);
  dirs[2] = geteuid() != 0 ? under_ro : "/proc/self/clattn-cache";
  for (int i = 0; i < 3; i++) {
    clattn_context *ctx = create_on(dirs[i]);
    if (!CHECKF(ctx != NULL, "cache_dir %s: creation failed", dirs[i])) continue;
    CHECKF(strstr(clattn_describe(ctx), "program cache: off") != NULL, "cache_dir %s: describe says\n%s", dirs[i],
           clattn_describe(ctx));
    size_t n = 0;
    free(run_small(ctx, i == 0 ? CLATTN_ALGO_STAGED : CLATTN_ALGO_FUSED, &n));
    int src = -1, cache = -1;
    counts(ctx, &src, &cache);
    int want = i == 0 ? 2 : 3; /* STAGED needs no fused program */
    CHECKF(src == want && cache == 0, "cache_dir %s: %d from source, %d from cache (want %d, 0)", dirs[i], src, cache,
           want);
    clattn_destroy(ctx);
  }
  struct stat sb;
  CHECK(stat(file, &sb) == 0 && S_ISREG(sb.st_mode) && sb.st_size == 16);
  listing l = list_dir(ro);
  CHECKF(l.n == 0, "the read-only directory holds %d entries", l.n);
  chmod(ro, 0755);
}

/* A context with options.cache_dir NULL, XDG_CACHE_HOME a new directory
 * `leaf` and CLATTN_CACHE_DIR = clattn_env (NULL: unset), both restored
 * after; xdg_clattn gets the default directory under it. */
static clattn_context *create_under_xdg(const char *leaf, const char *clattn_env, char *xdg_clattn, size_t n) {
  char xdg[300];
  make_dir(xdg, sizeof xdg, leaf);
  if (!CHECK(mkdir(xdg, 0755) == 0 || errno == EEXIST)) return NULL;
  snprintf(xdg_clattn, n, "%s/clattn", xdg);
  const char *old_xdg = getenv("XDG_CACHE_HOME");
  char *saved = old_xdg ? strdup(old_xdg) : NULL;
  setenv("XDG_CACHE_HOME", xdg, 1);
  if (clattn_env) setenv("CLATTN_CACHE_DIR", clattn_env, 1);
  clattn_context *ctx = create_on(NULL);
  if (clattn_env) unsetenv("CLATTN_CACHE_DIR");
  if (saved)
    setenv("XDG_CACHE_HOME", saved, 1);
  else
    unsetenv("XDG_CACHE_HOME");
  free(saved);
  return ctx;
}

static void empty_cache_dir_disables(void) {
  /* options.cache_dir = "" wins over the environment. */
  char env_dir[300];
  make_dir(env_dir, sizeof env_dir, "env-but-off");
  REQUIRE(setenv("CLATTN_CACHE_DIR", env_dir, 1) == 0);
  clattn_context *ctx = create_on("");
  unsetenv("CLATTN_CACHE_DIR");
  REQUIRE(ctx != NULL);
  CHECKF(strstr(clattn_describe(ctx), "program cache: off") != NULL, "describe says\n%s", clattn_describe(ctx));
  size_t n = 0;
  free(run_small(ctx, CLATTN_ALGO_FUSED, &n));
  clattn_destroy(ctx);
  listing l = list_dir(env_dir);
  CHECKF(l.n <= 0, "options.cache_dir = \"\": %d files in CLATTN_CACHE_DIR", l.n);

  /* CLATTN_CACHE_DIR = "" wins over XDG_CACHE_HOME (options.cache_dir NULL). */
  char xdg_clattn[400];
  REQUIRE((ctx = create_under_xdg("xdg-but-off", "", xdg_clattn, sizeof xdg_clattn)) != NULL);
  CHECKF(strstr(clattn_describe(ctx), "program cache: off") != NULL, "describe says\n%s", clattn_describe(ctx));
  clattn_destroy(ctx);
  l = list_dir(xdg_clattn);
  CHECKF(l.n <= 0, "CLATTN_CACHE_DIR = \"\": %d files under XDG_CACHE_HOME/clattn", l.n);
}

/* The default directory (options.cache_dir and CLATTN_CACHE_DIR unset)
 * keeps no binaries on POCL with its kernel cache on (POCL's cache does,
 * without compiling every kernel of a program first): programs are built
 * (POCL finds them in its own cache), the directory stays the tuning file's,
 * and describe says where binaries are. POCL_KERNEL_CACHE=0 brings ours
 * back; elsewhere the default keeps binaries, as a named directory does. */
static void default_dir_leaves_binaries_to_pocl(void) {
  char xdg_clattn[400];
  clattn_context *ctx = create_under_xdg("xdg-default", NULL, xdg_clattn, sizeof xdg_clattn);
  REQUIRE(ctx != NULL);
  const cl_platform_id platform_id = ctx->platform; /* platforms outlive contexts */
  char platform[256];
  ca_platform_string(platform_id, CL_PLATFORM_NAME, platform, sizeof platform);
  const int pocl = strstr(platform, "Portable Computing Language") != NULL;
  const char *pocl_cache = getenv("POCL_KERNEL_CACHE");
  const int pocl_keeps = pocl && !(pocl_cache && !strcmp(pocl_cache, "0"));
  size_t n = 0;
  free(run_small(ctx, CLATTN_ALGO_FUSED, &n));
  int src = 0, cache = 0;
  counts(ctx, &src, &cache);
  const char *path = clattn_tuning_default_path(ctx);
  CHECKF(path && !strncmp(path, xdg_clattn, strlen(xdg_clattn)), "tuning file at %s, not in %s", path ? path : "(none)",
         xdg_clattn);
  CHECKF(!!strstr(clattn_describe(ctx), "binaries: POCL's own kernel cache") == pocl_keeps, "describe says\n%s",
         clattn_describe(ctx));
  clattn_destroy(ctx);
  listing l = list_dir(xdg_clattn);
  if (pocl_keeps)
    CHECKF(l.n <= 0 && cache == 0, "POCL: %d files in the default directory, %d programs loaded from it", l.n, cache);
  else
    CHECKF(l.n > 0, "%s: no binaries in the default directory", platform);
  CHECK(ca_cache_keeps_binaries(platform_id, 1) == 1); /* a named directory: always */
  if (pocl) {
    char *saved_pocl = pocl_cache ? strdup(pocl_cache) : NULL;
    setenv("POCL_KERNEL_CACHE", "0", 1);
    CHECK(ca_cache_keeps_binaries(platform_id, 0) == 1);
    setenv("POCL_KERNEL_CACHE", "1", 1);
    CHECK(ca_cache_keeps_binaries(platform_id, 0) == 0);
    if (saved_pocl)
      setenv("POCL_KERNEL_CACHE", saved_pocl, 1);
    else
      unsetenv("POCL_KERNEL_CACHE");
    free(saved_pocl);
  }
  if (pocl_keeps) {
    /* The other side, where our default directory keeps binaries: this test
     * again in a process whose POCL reads POCL_KERNEL_CACHE=0 at its start. */
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
      setenv("POCL_KERNEL_CACHE", "0", 1);
      execl("/proc/self/exe", "test_cache", "default_dir_leaves_binaries_to_pocl", (char *)NULL);
      _exit(4);
    }
    int status = -1;
    const int waited = pid > 0 && waitpid(pid, &status, 0) == pid;
    CHECKF(waited && WIFEXITED(status) && WEXITSTATUS(status) == 0,
           "the test with POCL_KERNEL_CACHE=0 failed (above): %s %d", !waited ? "no wait status" :
           WIFEXITED(status) ? "exit status" : "signal", WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
  }
}

/* Writes a file of n bytes at dir/name whose last use (mtime) is `when`. */
static void fake_file(const char *dir, const char *name, size_t n, time_t when) {
  char path[400];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, "wb");
  if (!CHECKF(f != NULL, "cannot write %s", path)) return;
  for (size_t i = 0; i < n; i++) fputc('x', f);
  fclose(f);
  const struct timespec t[2] = {{when, 0}, {when, 0}};
  CHECK(utimensat(AT_FDCWD, path, t, 0) == 0);
}

/* The size cap removes the least recently used entries first, never the
 * one just written, and counts nothing but entries. */
static void size_cap_removes_least_recently_used_first(void) {
  char dir[300], keep[400];
  make_dir(dir, sizeof dir, "cap");
  REQUIRE(mkdir(dir, 0755) == 0 || errno == EEXIST);
  static const char *const names[] = {"00000000000000000000000000000000.bin", "11111111111111111111111111111111.bin",
                                      "22222222222222222222222222222222.bin", "33333333333333333333333333333333.bin"};
  for (int i = 0; i < 4; i++)
    fake_file(dir, names[i], 1000, 1000000000 + 1000 * i); /* names[0] the least recently used */
  fake_file(dir, "tuning-0123456789abcdef.txt", 5000, 1);  /* not an entry: neither counted nor removed */
  fake_file(dir, ".tmp-abcdef", 5000, 1);
  snprintf(keep, sizeof keep, "%s/%s", dir, names[0]); /* as if just written */
  ca_cache_evict(dir, keep, 2500);
  listing l = list_dir(dir);
  CHECKF(l.n == 4 && has_name(&l, names[0]) && has_name(&l, names[3]) && has_name(&l, "tuning-0123456789abcdef.txt") &&
             has_name(&l, ".tmp-abcdef"),
         "after the cap: %d files; want the kept entry, the most recent one and the two other files", l.n);
  ca_cache_evict(dir, NULL, 1000000); /* under the cap: nothing goes */
  CHECK(list_dir(dir).n == 4);
}

/* With a 1-byte cap only the newest entry stays, and contexts keep working;
 * a load marks its entry used. */
static void size_cap_keeps_the_cache_working(void) {
  char dir[300];
  make_dir(dir, sizeof dir, "cap-1");
  REQUIRE(setenv("CLATTN_CACHE_MAX_BYTES", "1", 1) == 0);
  clattn_context *ctx = create_on(dir);
  size_t n = 0;
  if (ctx) free(run_small(ctx, CLATTN_ALGO_FUSED, &n));
  clattn_destroy(ctx);
  listing l = list_dir(dir);
  CHECKF(l.n == 1 && is_entry_name(l.name[0]), "with a 1-byte cap: %d files, want the newest entry alone", l.n);
  unsetenv("CLATTN_CACHE_MAX_BYTES");
  ctx = create_on(dir);
  if (ctx) run_and_compare(ctx, "after the cap emptied the cache");
  clattn_destroy(ctx);
  /* a load marks its entry used: age every entry, load them again */
  l = list_dir(dir);
  for (int i = 0; i < l.n; i++) {
    char path[600];
    snprintf(path, sizeof path, "%s/%s", dir, l.name[i]);
    const struct timespec old[2] = {{1000000000, 0}, {1000000000, 0}};
    utimensat(AT_FDCWD, path, old, 0);
  }
  ctx = create_on(dir);
  clattn_destroy(ctx);
  int touched = 0;
  for (int i = 0; i < l.n; i++) {
    char path[600];
    struct stat sb;
    snprintf(path, sizeof path, "%s/%s", dir, l.name[i]);
    if (stat(path, &sb) == 0 && sb.st_mtime > 1000000000) touched++;
  }
  CHECKF(touched >= 2, "loading the probe and core programs marked %d entries used (want 2)", touched);
}

/* clattn_prepare builds, ahead of the first call, every program that call
 * would build: the first FUSED, STAGED and GEMM calls and a 16-bit one then
 * build nothing. Bad shapes are refused naming them. */
static void prepare_builds_what_the_first_calls_need(void) {
  clattn_context *ctx = create_on(""); /* builds counted, not stored: a stored binary costs POCL every kernel */
  REQUIRE(ctx != NULL);
  const cp_shape small = small_shape();
  clattn_params shapes[2] = {clattn_params_default(), clattn_params_default()};
  shapes[0].head_dim = shapes[1].head_dim = small.head_dim;
  shapes[0].value_dim = shapes[1].value_dim = small.value_dim;
  shapes[1].dtype = CLATTN_F16;
  int src0 = 0, cache0 = 0, src = 0, cache = 0;
  counts(ctx, &src0, &cache0);
  CHECK_STATUS(clattn_prepare(ctx, shapes, 2), CLATTN_OK);
  counts(ctx, &src, &cache);
  CHECKF(src + cache > src0 + cache0, "clattn_prepare built nothing (%d, %d programs before and after)", src0 + cache0,
         src + cache);
  src0 = src, cache0 = cache;
  size_t n = 0;
  static const clattn_algo algos[] = {CLATTN_ALGO_FUSED, CLATTN_ALGO_STAGED, CLATTN_ALGO_GEMM};
  for (int a = 0; a < 3; a++) free(run_small(ctx, algos[a], &n));
  cp_shape s16 = small;
  s16.dtype = CLATTN_F16;
  char err[256] = "";
  cp_problem *pb = cp_build(&s16, err, sizeof err);
  cp_result r;
  if (CHECKF(pb != NULL, "cp_build: %s", err))
    CHECKF(cp_run(pb, ctx, &r) == 0 && r.status == CLATTN_OK, "f16 call: %s", pb->err);
  cp_free(pb);
  counts(ctx, &src, &cache);
  CHECKF(src == src0 && cache == cache0, "the first calls after clattn_prepare built %d programs",
         (src + cache) - (src0 + cache0));
  shapes[1].dtype = (clattn_dtype)7;
  CHECK_STATUS(clattn_prepare(ctx, shapes, 2), CLATTN_ERR_INVALID_ARGUMENT);
  CHECKF(strstr(clattn_last_error(ctx), "shapes[1]: dtype") != NULL, "message: %s", clattn_last_error(ctx));
  shapes[1] = shapes[0];
  shapes[1].value_dim = 0;
  CHECK_STATUS(clattn_prepare(ctx, shapes, 2), CLATTN_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(clattn_prepare(ctx, NULL, 1), CLATTN_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(clattn_prepare(NULL, shapes, 1), CLATTN_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(clattn_prepare(ctx, NULL, 0), CLATTN_OK);
  clattn_destroy(ctx);
}

/* The directory each source of the setting leads to (no device needed). */
static void dir_resolution_order(void) {
  char a[300], x[300], h[300], want[400];
  make_dir(a, sizeof a, "res-option/deep/er");
  make_dir(x, sizeof x, "res-xdg");
  make_dir(h, sizeof h, "res-home");
  const char *names[] = {"CLATTN_CACHE_DIR", "XDG_CACHE_HOME", "HOME"};
  char *saved[3];
  for (int i = 0; i < 3; i++) {
    const char *v = getenv(names[i]);
    saved[i] = v ? strdup(v) : NULL;
  }
  setenv("CLATTN_CACHE_DIR", a, 1);
  setenv("XDG_CACHE_HOME", x, 1);
  setenv("HOME", h, 1);

  char *d = ca_cache_dir_resolve(NULL); /* the environment's, created mkdir -p style */
  CHECKF(d && !strcmp(d, a), "env: got %s, want %s", d ? d : "(off)", a);
  free(d);
  d = ca_cache_dir_resolve(x); /* the option wins */
  CHECKF(d && !strcmp(d, x), "option: got %s, want %s", d ? d : "(off)", x);
  free(d);
  unsetenv("CLATTN_CACHE_DIR");
  d = ca_cache_dir_resolve(NULL);
  snprintf(want, sizeof want, "%s/clattn", x);
  CHECKF(d && !strcmp(d, want), "XDG: got %s, want %s", d ? d : "(off)", want);
  free(d);
  setenv("XDG_CACHE_HOME", "relative/ignored", 1);
  d = ca_cache_dir_resolve(NULL);
  snprintf(want, sizeof want, "%s/.cache/clattn", h);
  CHECKF(d && !strcmp(d, want), "HOME: got %s, want %s", d ? d : "(off)", want);
  free(d);
  d = ca_cache_dir_resolve("");
  CHECKF(d == NULL, "\"\": got %s, want off", d ? d : "(off)");
  free(d);
  setenv("CLATTN_CACHE_DIR", "", 1);
  d = ca_cache_dir_resolve(NULL);
  CHECKF(d == NULL, "CLATTN_CACHE_DIR=\"\": got %s, want off", d ? d : "(off)");
  free(d);

  for (int i = 0; i < 3; i++) {
    if (saved[i])
      setenv(names[i], saved[i], 1);
    else
      unsetenv(names[i]);
    free(saved[i]);
  }
}

/* The child process of concurrent_processes_fill_cache: waits for the
 * parent's go (a byte on stdin), then creates a context on dir and runs
 * the small problem with FUSED and STAGED. Exit 0 when all was right. */
static int child_main(const char *dir) {
  char go;
  if (read(0, &go, 1) != 1) return 3;
  clattn_options opt;
  memset(&opt, 0, sizeof opt);
  opt.cache_dir = dir;
  clattn_context *ctx = NULL;
  if (clattn_create(&opt, &ctx) != CLATTN_OK) {
    printf("child: clattn_create: %s\n", clattn_last_error(NULL));
    return 2;
  }
  size_t n = 0;
  float *f = run_small(ctx, CLATTN_ALGO_FUSED, &n);
  float *s = run_small(ctx, CLATTN_ALGO_STAGED, &n);
  clattn_destroy(ctx);
  int ok = f && s && ct_current_failures == 0;
  free(f);
  free(s);
  return ok ? 0 : 1;
}

static void concurrent_processes_fill_cache(void) {
  enum { CHILDREN = 3 };
  char dir[300];
  make_dir(dir, sizeof dir, "concurrent");
  REQUIRE(mkdir(dir, 0755) == 0);
  pid_t pids[CHILDREN];
  int go[2];
  REQUIRE(pipe(go) == 0);
  int started = 0;
  for (int i = 0; i < CHILDREN; i++) {
    pid_t pid = fork();
    if (pid == 0) {
      dup2(go[0], 0);
      close(go[0]);
      close(go[1]);
      execl("/proc/self/exe", "test_cache", "--child", dir, (char *)NULL);
      _exit(4);
    }
    if (!CHECKF(pid > 0, "fork failed")) break;
    pids[started++] = pid;
  }
  close(go[0]);
  /* Every child starts at once: each misses our cache, builds (POCL's
   * cache of this run makes that quick) and stores the same entries. */
  for (int i = 0; i < started; i++) CHECK(write(go[1], "g", 1) == 1);
  close(go[1]);
  for (int i = 0; i < started; i++) {
    int status = 0;
    CHECK(waitpid(pids[i], &status, 0) == pids[i]);
    CHECKF(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child %d: %s %d", i,
           WIFEXITED(status) ? "exit status" : "signal", WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
  }
  REQUIRE(started == CHILDREN);
  listing l = list_dir(dir);
  CHECKF(l.n == 3, "the shared cache holds %d files, want 3 (probe, core, fused)", l.n);
  for (int i = 0; i < l.n; i++) {
    CHECKF(is_entry_name(l.name[i]), "left behind: %s", l.name[i]);
    if (is_entry_name(l.name[i])) CHECKF(entry_looks_whole(dir, l.name[i]), "not a whole entry: %s", l.name[i]);
  }
  /* The seed's outputs, when there is one, must match bitwise too. */
  check_all_from_cache(dir, "after concurrent fills");
}

static void cleanup_root(void) {
  free(g_out_fused);
  free(g_out_staged);
  if (g_root[0] && getenv("CLATTN_TEST_KEEP") == NULL) {
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_root);
    if (system(cmd) != 0) printf("could not remove %s\n", g_root);
  }
}

int main(int argc, char **argv) {
  if (argc == 3 && !strcmp(argv[1], "--child")) return child_main(argv[2]);
  if (argc == 3 && !strcmp(argv[1], "--create")) return create_main(argv[2]);
  const char *tmp = getenv("TMPDIR");
  snprintf(g_root, sizeof g_root, "%s/clattn-cache-test-XXXXXX", tmp && *tmp ? tmp : "/tmp");
  if (!mkdtemp(g_root)) {
    printf("mkdtemp(%s) failed\n0 passed, 1 failed\n", g_root);
    return 1;
  }
  char pocl_dir[300]; /* POCL's kernel cache, as the head comment says */
  snprintf(pocl_dir, sizeof pocl_dir, "%s/pocl", g_root);
  setenv("POCL_CACHE_DIR", pocl_dir, 1);
  atexit(cleanup_root);     /* also on exit(77): no device */
  signal(SIGPIPE, SIG_IGN); /* a child that died early must not kill the test */
  static const ct_test tests[] = {
      CT_TEST(dir_resolution_order),
      CT_TEST(miss_then_store_then_hit),
      CT_TEST(corrupted_entry_is_rebuilt),
      CT_TEST(crafted_entries_are_rebuilt_not_loaded),
      CT_TEST(unwritable_cache_dir_still_works),
      CT_TEST(empty_cache_dir_disables),
      CT_TEST(default_dir_leaves_binaries_to_pocl),
      CT_TEST(concurrent_processes_fill_cache),
      CT_TEST(prepare_builds_what_the_first_calls_need),
      CT_TEST(size_cap_removes_least_recently_used_first),
      CT_TEST(size_cap_keeps_the_cache_working),
  };
  return ct_main(argc, argv, tests, sizeof tests / sizeof tests[0]);
}
