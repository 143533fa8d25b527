/*
 * The on-disk program cache: compiled program binaries keyed by a 128-bit
 * hash of everything that shapes them (library version, platform, device,
 * driver, kernel sources, build options).
 *
 * One file per program, named by the hex of the key plus ".bin":
 *
 *   offset  size  field
 *        0     8  magic "CLATTNPB"
 *        8     4  format version (little-endian u32)
 *       12     4  reserved, 0
 *       16    16  key
 *       32     8  payload length (little-endian u64)
 *       40     8  checksum, FNV-1a 64 over bytes 0-39 and the payload
 *       48     -  payload: the device's CL_PROGRAM_BINARIES entry
 *
 * Writes go to a temp file in the same directory (mkstemp) and are renamed
 * into place, so readers see a whole file or none; concurrent writers of one
 * key each rename a complete file and the last one wins. A file that does
 * not validate, or whose binary the driver refuses, is deleted and rebuilt:
 * never trusted. Nothing here fails a caller: every failure is a miss.
 *
 * What reaches the driver: only a payload whose length matches the file and
 * whose checksum covers it together with the header, key included, so a
 * damaged file, a truncated one, or another program's entry renamed or
 * re-keyed is never loaded. The checksum detects accidents, not intent: bytes
 * forged with a recomputed checksum do reach the driver's binary loader,
 * whose own checks are then all there is (the directory is its user's). If
 * the loader crashes on them, the load marker (below) gets the entry deleted
 * by the next process, so a bad file never bricks the cache directory.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/file.h"
#include "device/device.h"

#define CACHE_MAGIC "CLATTNPB"
/* Format 2: the checksum covers the header too (format 1: the payload only). */
enum { CACHE_FORMAT = 2, HEADER_BYTES = 48, SUM_AT = 40 };
#define MAX_PAYLOAD ((uint64_t)1 << 30) /* larger is not a program binary we wrote */

/* ---- hashing ---- */

/* Two 64-bit lanes of different construction (FNV-1a, and a multiply-add
 * lane finished with the splitmix64 mixer) make the 128-bit key. */
typedef struct {
  uint64_t a, b;
} hash128;

static void hash_init(hash128 *h) {
  h->a = 0xcbf29ce484222325ull;
  h->b = 0x6a09e667f3bcc909ull;
}

static void hash_bytes(hash128 *h, const void *data, size_t n) {
  const unsigned char *p = data;
  uint64_t a = h->a, b = h->b;
  for (size_t i = 0; i < n; i++) {
    a = (a ^ p[i]) * 0x100000001b3ull;
    b = (b + p[i] + 1) * 0x9e3779b97f4a7c15ull;
    b ^= b >> 29;
  }
  h->a = a;
  h->b = b;
}

static void put_u64(unsigned char *p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static uint64_t get_u64(const unsigned char *p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
  return v;
}
static void put_u32(unsigned char *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static uint32_t get_u32(const unsigned char *p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; i++) v |= (uint32_t)p[i] << (8 * i);
  return v;
}

/* A field: its length first, so neighbouring fields cannot run together. */
static void hash_field(hash128 *h, const void *data, size_t n) {
  unsigned char len[8];
  put_u64(len, (uint64_t)n);
  hash_bytes(h, len, sizeof len);
  hash_bytes(h, data, n);
}

static uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static uint64_t fnv1a(uint64_t h, const unsigned char *p, size_t n) {
  for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

uint64_t ca_cache_entry_checksum(const unsigned char *file, size_t n) {
  if (n < HEADER_BYTES) return 0;
  return fnv1a(fnv1a(0xcbf29ce484222325ull, file, SUM_AT), file + HEADER_BYTES, n - HEADER_BYTES);
}

/* A device or platform string of any length into the hash ("?" when the
 * driver does not answer). */
static void hash_info(hash128 *h, cl_platform_id platform, cl_device_id device, cl_uint what) {
  size_t len = 0;
  cl_int err =
      platform ? clGetPlatformInfo(platform, what, 0, NULL, &len) : clGetDeviceInfo(device, what, 0, NULL, &len);
  char *buf = (err == CL_SUCCESS && len > 0) ? malloc(len) : NULL;
  if (buf) {
    err = platform ? clGetPlatformInfo(platform, what, len, buf, NULL) : clGetDeviceInfo(device, what, len, buf, NULL);
    if (err == CL_SUCCESS) {
      hash_field(h, buf, strnlen(buf, len));
      free(buf);
      return;
    }
    free(buf);
  }
  hash_field(h, "?", 1);
}

/* What identifies the device and its compiler: platform, device, driver. */
static void hash_device(hash128 *h, const clattn_context *ctx) {
  hash_info(h, ctx->platform, NULL, CL_PLATFORM_NAME);
  hash_info(h, ctx->platform, NULL, CL_PLATFORM_VERSION);
  hash_info(h, NULL, ctx->device, CL_DEVICE_NAME);
  hash_info(h, NULL, ctx->device, CL_DEVICE_VERSION);
  hash_info(h, NULL, ctx->device, CL_DRIVER_VERSION);
}

static void hash_final(const hash128 *h, ca_cache_key *key) {
  put_u64(key->bytes, mix64(h->a));
  put_u64(key->bytes + 8, mix64(h->b ^ 0x243f6a8885a308d3ull));
}

void ca_device_key_of(const clattn_context *ctx, ca_cache_key *key) {
  hash128 h;
  hash_init(&h);
  hash_device(&h, ctx);
  hash_final(&h, key);
}

void ca_cache_key_of(const clattn_context *ctx, const char *const *sources, cl_uint n_sources, const char *options,
                     ca_cache_key *key) {
  hash128 h;
  hash_init(&h);
  hash_field(&h, CLATTN_VERSION_STRING, strlen(CLATTN_VERSION_STRING));
  hash_device(&h, ctx);
  /* The sources as the compiler sees them: concatenated, in order. */
  size_t total = 0;
  for (cl_uint i = 0; i < n_sources; i++) total += strlen(sources[i]);
  unsigned char len[8];
  put_u64(len, (uint64_t)total);
  hash_bytes(&h, len, sizeof len);
  for (cl_uint i = 0; i < n_sources; i++) hash_bytes(&h, sources[i], strlen(sources[i]));
  const char *opt = options ? options : "";
  hash_field(&h, opt, strlen(opt));
  hash_final(&h, key);
}

void ca_text_key_of(const char *const *texts, unsigned n, ca_cache_key *key) {
  hash128 h;
  hash_init(&h);
  for (unsigned i = 0; i < n; i++) hash_field(&h, texts[i], strlen(texts[i]));
  hash_final(&h, key);
}

/* ---- files ---- */

/* "<dir>/<32 hex digits>.bin" into a fresh string, or NULL. */
static char *entry_path(const char *dir, const ca_cache_key *key) {
  size_t n = strlen(dir) + 1 + 32 + 4 + 1;
  char *path = malloc(n);
  if (!path) return NULL;
  int at = snprintf(path, n, "%s/", dir);
  for (int i = 0; i < 16; i++) at += snprintf(path + at, n - (size_t)at, "%02x", key->bytes[i]);
  snprintf(path + at, n - (size_t)at, ".bin");
  return path;
}

static int write_all(int fd, const unsigned char *buf, size_t n) {
  while (n > 0) {
    ssize_t put = write(fd, buf, n);
    if (put < 0 && errno == EINTR) continue;
    if (put <= 0) return -1;
    buf += put;
    n -= (size_t)put;
  }
  return 0;
}

int ca_cache_entry_parse(const unsigned char *file, size_t n, const ca_cache_key *key, size_t *payload_at,
                         size_t *payload_len) {
  *payload_at = *payload_len = 0;
  if (n <= HEADER_BYTES || memcmp(file, CACHE_MAGIC, 8) != 0 || get_u32(file + 8) != CACHE_FORMAT ||
      get_u32(file + 12) != 0 || memcmp(file + 16, key->bytes, 16) != 0)
    return -1;
  /* The length field is only believed when it is exactly what the file holds. */
  if (get_u64(file + 32) != (uint64_t)(n - HEADER_BYTES) || get_u64(file + SUM_AT) != ca_cache_entry_checksum(file, n))
    return -1;
  *payload_at = HEADER_BYTES;
  *payload_len = n - HEADER_BYTES;
  return 0;
}

/* ---- loads in progress ----
 *
 * While the driver has an entry's binary, "<entry>.loading" exists and is
 * read-locked (fcntl; the kernel drops the lock when its process dies). A
 * marker that nobody locks was left by a process that died inside the
 * driver's loader, which a forged binary can crash: its entry is deleted
 * unloaded, so one bad file costs one crash, not every later creation.
 * F_GETLK does not show a process its own locks, so markers are only judged
 * while no load of this process is in progress (loads_here). Races (a
 * marker seen between its creation and its lock; one thread's close
 * dropping another's lock) only cost a rebuild from source, never a wrong
 * load. */
static pthread_mutex_t loads_lock = PTHREAD_MUTEX_INITIALIZER;
static int loads_here; /* this process's loads in progress; under loads_lock */

/* "<path>.loading", malloc'd, or NULL. */
static char *marker_path(const char *path) {
  size_t n = strlen(path) + sizeof ".loading";
  char *m = malloc(n);
  if (m) snprintf(m, n, "%s.loading", path);
  return m;
}

/* 1 when marker was left by a load that never finished (it is removed). */
static int load_died(const char *marker) {
  int fd = open(marker, O_RDWR | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return 0;
  struct stat sb;
  struct flock lk = {.l_type = F_WRLCK, .l_whence = SEEK_SET};
  /* F_GETLK reports another process's lock: a marker with none is stale. A
   * filesystem without locks cannot tell, and gets no verdict. */
  int died = fstat(fd, &sb) == 0 && S_ISREG(sb.st_mode) && fcntl(fd, F_GETLK, &lk) == 0 && lk.l_type == F_UNLCK;
  close(fd);
  if (died) unlink(marker);
  return died;
}

/* The marker, created and read-locked: its fd, or -1 (then the load goes
 * on unmarked: the marker is a safeguard, not a condition). */
static int load_mark(const char *marker) {
  int fd = open(marker, O_RDWR | O_CREAT | O_NONBLOCK | O_CLOEXEC, 0600);
  if (fd < 0) return -1;
  struct flock lk = {.l_type = F_RDLCK, .l_whence = SEEK_SET};
  if (fcntl(fd, F_SETLK, &lk) != 0) {
    /* No lock (a filesystem without them): an unlocked marker left here
     * would read as a load that died. */
    unlink(marker);
    close(fd);
    return -1;
  }
  return fd;
}

cl_program ca_cache_load(clattn_context *ctx, const ca_cache_key *key, const char *options) {
  if (!ctx->cache_binaries) return NULL;
  char *path = entry_path(ctx->cache_dir, key);
  char *marker = path ? marker_path(path) : NULL;
  if (!marker) {
    free(path);
    return NULL;
  }
  unsigned char *file = NULL;
  size_t n = 0, at = 0, len = 0;
  cl_program program = NULL;
  /* 1: no such file, a plain miss; -1: there but unreadable (not a regular
   * file, too large, ...), removed like an invalid one. */
  int rc = ca_read_file(path, HEADER_BYTES + MAX_PAYLOAD, &file, &n, NULL, 0);
  if (rc == 0 && ca_cache_entry_parse(file, n, key, &at, &len) != 0) rc = -1;
  if (rc == 0) {
    pthread_mutex_lock(&loads_lock);
    if (loads_here == 0 && load_died(marker))
      rc = -1;
    else
      loads_here++;
    pthread_mutex_unlock(&loads_lock);
  }
  if (rc == 0) {
    int mark = load_mark(marker);
    cl_int err = CL_SUCCESS, binary_status = CL_INVALID_BINARY;
    const unsigned char *bins[1] = {file + at};
    program = clCreateProgramWithBinary(ctx->context, 1, &ctx->device, &len, bins, &binary_status, &err);
    if (err != CL_SUCCESS || binary_status != CL_SUCCESS) {
      if (program) clReleaseProgram(program);
      program = NULL;
    } else if (clBuildProgram(program, 1, &ctx->device, options, NULL, NULL) != CL_SUCCESS) {
      clReleaseProgram(program);
      program = NULL;
    }
    if (!program) rc = -1;
    if (mark >= 0) {
      unlink(marker);
      close(mark);
    }
    pthread_mutex_lock(&loads_lock);
    loads_here--;
    pthread_mutex_unlock(&loads_lock);
  }
  /* Not to be trusted: remove it (a store after the source build replaces it). */
  if (rc < 0) unlink(path);
  if (program) utimensat(AT_FDCWD, path, NULL, 0); /* its last use, for the size cap */
  free(file);
  free(marker);
  free(path);
  return program;
}

void ca_cache_store(clattn_context *ctx, const ca_cache_key *key, cl_program program) {
  if (!ctx->cache_binaries) return;
  cl_uint n_dev = 0;
  cl_device_id *devices = NULL;
  size_t *sizes = NULL;
  unsigned char *file = NULL;
  char *path = NULL, *tmp = NULL;
  int fd = -1;
  if (clGetProgramInfo(program, CL_PROGRAM_NUM_DEVICES, sizeof n_dev, &n_dev, NULL) != CL_SUCCESS || n_dev == 0)
    goto done;
  devices = calloc(n_dev, sizeof *devices);
  sizes = calloc(n_dev, sizeof *sizes);
  if (!devices || !sizes) goto done;
  if (clGetProgramInfo(program, CL_PROGRAM_DEVICES, n_dev * sizeof *devices, devices, NULL) != CL_SUCCESS) goto done;
  cl_uint mine = n_dev;
  for (cl_uint i = 0; i < n_dev; i++)
    if (devices[i] == ctx->device) mine = i;
  if (mine == n_dev) goto done;
  if (clGetProgramInfo(program, CL_PROGRAM_BINARY_SIZES, n_dev * sizeof *sizes, sizes, NULL) != CL_SUCCESS) goto done;
  size_t len = sizes[mine];
  if (len == 0 || (uint64_t)len > MAX_PAYLOAD) goto done;
  file = malloc(HEADER_BYTES + len);
  unsigned char **bins = calloc(n_dev, sizeof *bins);
  if (!file || !bins) {
    free(bins);
    goto done;
  }
  bins[mine] = file + HEADER_BYTES; /* NULL entries: the driver skips those devices */
  cl_int err = clGetProgramInfo(program, CL_PROGRAM_BINARIES, n_dev * sizeof *bins, bins, NULL);
  free(bins);
  if (err != CL_SUCCESS) goto done;
  memcpy(file, CACHE_MAGIC, 8);
  put_u32(file + 8, CACHE_FORMAT);
  put_u32(file + 12, 0);
  memcpy(file + 16, key->bytes, 16);
  put_u64(file + 32, (uint64_t)len);
  put_u64(file + SUM_AT, ca_cache_entry_checksum(file, HEADER_BYTES + len));

  path = entry_path(ctx->cache_dir, key);
  size_t n = strlen(ctx->cache_dir) + 32;
  tmp = malloc(n);
  if (!path || !tmp) goto done;
  snprintf(tmp, n, "%s/.tmp-XXXXXX", ctx->cache_dir);
  fd = mkstemp(tmp);
  if (fd < 0) goto done;
  int ok = write_all(fd, file, HEADER_BYTES + len) == 0;
  ok = (close(fd) == 0) && ok;
  fd = -1;
  if (!ok || rename(tmp, path) != 0)
    unlink(tmp);
  else
    ca_cache_evict(ctx->cache_dir, path, ca_cache_cap());
done:
  if (fd >= 0) close(fd);
  free(tmp);
  free(path);
  free(file);
  free(sizes);
  free(devices);
}

/* ---- the directory ---- */

/* mkdir -p: 0 when path is (now) a directory. */
static int make_dirs(char *path) {
  for (char *p = path + 1; *p; p++) {
    if (*p != '/') continue;
    *p = '\0';
    int r = mkdir(path, 0755);
    int e = errno;
    *p = '/';
    if (r != 0 && e != EEXIST) return -1;
  }
  if (mkdir(path, 0755) != 0 && errno != EEXIST) return -1;
  struct stat sb;
  return stat(path, &sb) == 0 && S_ISDIR(sb.st_mode) ? 0 : -1;
}

char *ca_cache_dir_resolve(const char *opt) {
  const char *dir = opt ? opt : getenv("CLATTN_CACHE_DIR");
  const char *suffix = "";
  if (!dir) {
    const char *xdg = getenv("XDG_CACHE_HOME");
    const char *home = getenv("HOME");
    if (xdg && xdg[0] == '/') { /* the XDG spec ignores relative values */
      dir = xdg;
      suffix = "/clattn";
    } else if (home && *home) {
      dir = home;
      suffix = "/.cache/clattn";
    } else {
      return NULL;
    }
  }
  if (!*dir) return NULL; /* "" turns the cache off */
  size_t n = strlen(dir) + strlen(suffix) + 1;
  char *path = malloc(n);
  if (!path) return NULL;
  snprintf(path, n, "%s%s", dir, suffix);
  /* Trailing slashes would double up in entry names. */
  for (size_t end = strlen(path); end > 1 && path[end - 1] == '/'; end--) path[end - 1] = '\0';
  if (make_dirs(path) != 0 || access(path, W_OK | X_OK) != 0) {
    free(path);
    return NULL;
  }
  return path;
}

/* POCL keeps what it compiled in a kernel cache of its own (POCL_CACHE_DIR,
 * on unless POCL_KERNEL_CACHE=0), per kernel and work-group size. Asking it
 * for a program's binary makes it first compile every kernel of the program
 * for any work-group size, kernels a call may never run: a first `clattn
 * run` took 12.2 s storing binaries and 2.2 s without, a warm one 0.10 s
 * and 0.19 s (docs/cache.md). So the default directory keeps no
 * binaries there; a directory the caller named is used as asked. */
int ca_cache_keeps_binaries(cl_platform_id platform, int dir_named) {
  if (dir_named) return 1;
  char name[256];
  ca_platform_string(platform, CL_PLATFORM_NAME, name, sizeof name);
  const char *pocl_cache = getenv("POCL_KERNEL_CACHE");
  return !strstr(name, "Portable Computing Language") || (pocl_cache && !strcmp(pocl_cache, "0"));
}

void ca_cache_counts(const clattn_context *ctx, int *from_source, int *from_cache) {
  clattn_context *c = (clattn_context *)ctx; /* the lock, not the counts, is written */
  pthread_mutex_lock(&c->programs_lock);
  if (from_source) *from_source = ctx->builds_from_source;
  if (from_cache) *from_cache = ctx->builds_from_cache;
  pthread_mutex_unlock(&c->programs_lock);
}
