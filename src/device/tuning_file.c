/* The tuning file's format: names, ranges, parsing, writing (see tuning_file.h). */
#include "device/tuning_file.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/file.h"

/* LINE_MAX_BYTES: longer is not a line `clattn tune` wrote (and a split line
 * must not be read as two); FILE_MAX_BYTES: likewise for the whole file. */
enum { TUNING_FORMAT = 1, LINE_MAX_BYTES = 1023, FILE_MAX_BYTES = 1 << 16 };

static const char *const tunable_names[CA_T_COUNT] = {
    "score_tm", "score_tn", "score_tk",      "softmax_wg", "mix_tm",   "mix_tv",     "mix_tj",
    "flash_bm", "flash_wg", "scratch_bytes", "block_rm",   "block_rn", "flash_tile",
};
static const char *const class_keys[CA_CLASS_COUNT] = {"auto_prefill", "auto_decode", "auto_weights"};

const char *ca_tunable_name(ca_tunable t) { return t < CA_T_COUNT ? tunable_names[t] : "?"; }

ca_tunable ca_tunable_by_name(const char *name) {
  int t = 0;
  while (t < CA_T_COUNT && strcmp(name, tunable_names[t]) != 0) t++;
  return (ca_tunable)t;
}

const char *ca_class_name(ca_shape_class c) { return c < CA_CLASS_COUNT ? class_keys[c] + 5 : "?"; }

const char *clattn_algo_name(clattn_algo a) {
  switch (a) {
    case CLATTN_ALGO_AUTO: return "auto";
    case CLATTN_ALGO_STAGED: return "staged";
    case CLATTN_ALGO_FUSED: return "fused";
    case CLATTN_ALGO_GEMM: return "gemm";
  }
  return "unknown";
}

static int *tile_field(tl_tiles *t, ca_tunable k) {
  switch (k) {
    case CA_T_SCORE_TM: return &t->score_tm;
    case CA_T_SCORE_TN: return &t->score_tn;
    case CA_T_SCORE_TK: return &t->score_tk;
    case CA_T_SOFTMAX_WG: return &t->softmax_wg;
    case CA_T_MIX_TM: return &t->mix_tm;
    case CA_T_MIX_TV: return &t->mix_tv;
    case CA_T_MIX_TJ: return &t->mix_tj;
    case CA_T_FLASH_BM: return &t->flash_bm;
    case CA_T_FLASH_WG: return &t->flash_wg;
    case CA_T_BLOCK_RM: return &t->block_rm;
    case CA_T_BLOCK_RN: return &t->block_rn;
    case CA_T_FLASH_TILE: return &t->flash_tile;
    default: return NULL;
  }
}

long long ca_tunable_get(const tl_tiles *tiles, size_t scratch, ca_tunable t) {
  int *f = tile_field((tl_tiles *)tiles, t);
  return f ? *f : t == CA_T_SCRATCH_BYTES ? (long long)scratch : 0;
}

void ca_tunable_set(tl_tiles *tiles, size_t *scratch, ca_tunable t, long long v) {
  int *f = tile_field(tiles, t);
  if (f)
    *f = (int)v;
  else if (t == CA_T_SCRATCH_BYTES)
    *scratch = (size_t)v;
}

static int is_pow2(long long v) { return v > 0 && (v & (v - 1)) == 0; }

/* The absolute range of each value (the device's limits are checked when a
 * context applies the file). NULL when v is fine, else what it must be. */
static const char *out_of_range(ca_tunable t, long long v) {
  switch (t) {
    case CA_T_FLASH_BM: return is_pow2(v) && v <= 16 ? NULL : "a power of two from 1 to 16";
    case CA_T_FLASH_WG: return v == 0 || (is_pow2(v) && v <= 1024) ? NULL : "0 or a power of two up to 1024";
    /* flash_tiled holds a tile's scores in private memory: 64 floats at most */
    case CA_T_FLASH_TILE:
      return v == 0 || (is_pow2(v) && v <= 64) ? NULL : "0 (chosen per head dim) or a power of two up to 64";
    /* Any budget runs: below one score row the staged path goes a row at a time. */
    case CA_T_SCRATCH_BYTES: return v >= 1 && v <= (1LL << 40) ? NULL : "from 1 to 2^40 bytes";
    case CA_T_BLOCK_RM:
    case CA_T_BLOCK_RN:
      return v == 0 || v == 1 || v == 2 || v == 4 ? NULL
                                                  : "0, 1, 2 or 4 (with block_rm x block_rn one of " TL_BLOCK_PAIRS
                                                    ", or 0 x 0: chosen per head dim)";
    default: return is_pow2(v) && v <= 1024 ? NULL : "a power of two from 1 to 1024";
  }
}

static clattn_algo algo_from_name(const char *s) {
  if (!strcmp(s, "staged")) return CLATTN_ALGO_STAGED;
  if (!strcmp(s, "fused")) return CLATTN_ALGO_FUSED;
  if (!strcmp(s, "gemm")) return CLATTN_ALGO_GEMM;
  return CLATTN_ALGO_AUTO;
}

static char *trim(char *s) {
  while (isspace((unsigned char)*s)) s++;
  size_t n = strlen(s);
  while (n && isspace((unsigned char)s[n - 1])) s[--n] = '\0';
  return s;
}

int ca_tunable_parse(ca_tunable t, const char *key, const char *text, long long *v, char *why, size_t n) {
  char *end = NULL;
  errno = 0;
  long long x = strtoll(text, &end, 10);
  const char *range = (errno || !end || end == text || *end) ? "an integer" : out_of_range(t, x);
  if (range) {
    snprintf(why, n, "%s = %s: must be %s", key, text, range);
    return -1;
  }
  *v = x;
  return 0;
}

int ca_block_pair_check(const char *rm_key, long long rm, const char *rn_key, long long rn, char *why, size_t n) {
  if (rm >= 0 && rm <= 4 && rn >= 0 && rn <= 4 && tl_block_allowed((int)rm, (int)rn)) return 0;
  snprintf(why, n,
           "%s = %lld, %s = %lld: flash_block's tile must be one of " TL_BLOCK_PAIRS
           " (rows x keys per work-item), or 0 x 0 (chosen per head dim)",
           rm_key, rm, rn_key, rn);
  return -1;
}

/* flash_block's tile in out: both keys or neither, an allowed pair. 0, or
 * -1 with a message naming the file. */
static int check_block_pair(const ca_tuning *out, const char *name, char *err, size_t errlen) {
  const int rm = out->has[CA_T_BLOCK_RM], rn = out->has[CA_T_BLOCK_RN];
  if (!rm && !rn) return 0;
  if (rm != rn)
    return snprintf(
               err, errlen,
               "%s: %s without %s: flash_block's tile is given as a pair, block_rm x block_rn one of " TL_BLOCK_PAIRS
               ", or 0 x 0 (chosen per head dim)",
               name, rm ? "block_rm" : "block_rn", rm ? "block_rn" : "block_rm"),
           -1;
  char why[320];
  if (ca_block_pair_check("block_rm", out->value[CA_T_BLOCK_RM], "block_rn", out->value[CA_T_BLOCK_RN], why,
                          sizeof why) != 0)
    return snprintf(err, errlen, "%s: %s", name, why), -1;
  return 0;
}

/* One `key = value` line into out; NULL, or what is wrong with it.
 * values_only: the format and identity keys are refused. */
static const char *parse_line(char *key, char *value, ca_tuning *out, int *format, int values_only, char *why,
                              size_t n) {
  if (values_only &&
      (!strcmp(key, "format") || !strcmp(key, "platform") || !strcmp(key, "device") || !strcmp(key, "driver"))) {
    snprintf(why, n, "'%s': the device's identity is the context's, not a value to set", key);
    return why;
  }
  if (!strcmp(key, "format")) {
    *format = atoi(value);
    return *format == TUNING_FORMAT ? NULL : "format: this library reads format 1";
  }
  char *strings[] = {out->platform, out->device, out->driver};
  const char *string_keys[] = {"platform", "device", "driver"};
  for (int i = 0; i < 3; i++)
    if (!strcmp(key, string_keys[i])) {
      snprintf(strings[i], sizeof out->platform, "%s", value);
      return NULL;
    }
  for (int c = 0; c < CA_CLASS_COUNT; c++)
    if (!strcmp(key, class_keys[c])) {
      clattn_algo a = algo_from_name(value);
      if (a == CLATTN_ALGO_AUTO || (c == CA_CLASS_WEIGHTS && a == CLATTN_ALGO_FUSED)) {
        snprintf(why, n, "%s = %s: must be %s", key, value,
                 c == CA_CLASS_WEIGHTS ? "staged or gemm" : "staged, fused or gemm");
        return why;
      }
      out->auto_algo[c] = a;
      return NULL;
    }
  for (int t = 0; t < CA_T_COUNT; t++)
    if (!strcmp(key, tunable_names[t])) {
      if (ca_tunable_parse((ca_tunable)t, key, value, &out->value[t], why, n) != 0) return why;
      out->has[t] = 1;
      return NULL;
    }
  snprintf(why, n, "unknown key '%s'", key);
  return why;
}

/* The lines of text into out; 0, or -1 with a message. */
static int parse_lines(const char *text, size_t size, const char *name, ca_tuning *out, int *format, int values_only,
                       char *err, size_t errlen) {
  memset(out, 0, sizeof *out);
  char line[LINE_MAX_BYTES + 1], why[320];
  int lineno = 0;
  for (size_t at = 0; at < size;) {
    const char *p = text + at, *nl = memchr(p, '\n', size - at);
    size_t len = nl ? (size_t)(nl - p) : size - at;
    lineno++;
    /* C strings would end the line at a NUL and apply what precedes it. */
    if (memchr(p, '\0', len)) return snprintf(err, errlen, "%s:%d: a NUL byte in the line", name, lineno), -1;
    if (len > LINE_MAX_BYTES)
      return snprintf(err, errlen, "%s:%d: line longer than %d bytes", name, lineno, LINE_MAX_BYTES), -1;
    memcpy(line, p, len);
    line[len] = '\0';
    at += len + (nl != NULL);
    char *hash = strchr(line, '#');
    if (hash) *hash = '\0';
    char *s = trim(line);
    if (!*s) continue;
    char *eq = strchr(s, '=');
    const char *bad = "expected 'key = value'";
    if (eq) {
      *eq = '\0';
      bad = parse_line(trim(s), trim(eq + 1), out, format, values_only, why, sizeof why);
    }
    if (bad) return snprintf(err, errlen, "%s:%d: %s", name, lineno, bad), -1;
  }
  return 0;
}

int ca_tuning_parse_values(const char *text, size_t size, const char *name, ca_tuning *out, char *err, size_t errlen) {
  int format = 0;
  if (parse_lines(text, size, name, out, &format, 1, err, errlen) != 0) return -1;
  return check_block_pair(out, name, err, errlen);
}

int ca_tuning_parse(const char *text, size_t size, const char *name, ca_tuning *out, char *err, size_t errlen) {
  int format = 0;
  if (parse_lines(text, size, name, out, &format, 0, err, errlen) != 0) return -1;
  if (format != TUNING_FORMAT) return snprintf(err, errlen, "%s: no 'format = 1' line", name), -1;
  if (!out->platform[0] || !out->device[0] || !out->driver[0])
    return snprintf(err, errlen, "%s: needs platform, device and driver lines", name), -1;
  return check_block_pair(out, name, err, errlen);
}

int ca_tuning_read(const char *path, ca_tuning *out, char *err, size_t errlen) {
  memset(out, 0, sizeof *out);
  unsigned char *text = NULL;
  size_t size = 0;
  if (ca_read_file(path, FILE_MAX_BYTES, &text, &size, err, errlen) != 0) return -1;
  int rc = ca_tuning_parse((const char *)text, size, path, out, err, errlen);
  free(text);
  return rc;
}

int ca_tuning_write(const char *path, const ca_tuning *t, char *err, size_t errlen) {
  size_t n = strlen(path) + 16;
  char *tmp = malloc(n);
  if (!tmp) return snprintf(err, errlen, "out of memory"), -1;
  snprintf(tmp, n, "%s.XXXXXX", path);
  int fd = mkstemp(tmp);
  FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
  if (!f) {
    char why[128];
    snprintf(err, errlen, "cannot create a file beside %s: %s", path, ca_errno_text(errno, why, sizeof why));
    if (fd >= 0) close(fd), unlink(tmp);
    free(tmp);
    return -1;
  }
  fprintf(f, "# clattn tuning file, written by `clattn tune`; read by clattn_create for this device only\n");
  fprintf(f, "format = %d\nplatform = %s\ndevice = %s\ndriver = %s\n", TUNING_FORMAT, t->platform, t->device,
          t->driver);
  for (int i = 0; i < CA_T_COUNT; i++)
    if (t->has[i]) fprintf(f, "%s = %lld\n", tunable_names[i], t->value[i]);
  for (int c = 0; c < CA_CLASS_COUNT; c++)
    if (t->auto_algo[c] != CLATTN_ALGO_AUTO) fprintf(f, "%s = %s\n", class_keys[c], clattn_algo_name(t->auto_algo[c]));
  int bad = ferror(f);
  bad = (fclose(f) != 0) || bad;
  if (bad || rename(tmp, path) != 0) {
    char why[128];
    snprintf(err, errlen, "cannot write %s: %s", path, ca_errno_text(errno, why, sizeof why));
    unlink(tmp);
    free(tmp);
    return -1;
  }
  free(tmp);
  return 0;
}
