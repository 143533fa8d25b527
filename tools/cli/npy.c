/* NumPy's .npy format (npy.h). */
#include "npy.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "problem.h" /* cp_f16_value: the kit's float16 conversion */

static const unsigned char MAGIC[6] = {0x93, 'N', 'U', 'M', 'P', 'Y'};

static const struct {
  const char *descr, *name;
  npy_dtype dtype;
  size_t size;
} DTYPES[] = {
    {"<f4", "'<f4' (float32)", NPY_F32, 4},
    {"<f2", "'<f2' (float16)", NPY_F16, 2},
    {"|u1", "'|u1' (uint8)", NPY_U8, 1},
    {"|b1", "'|b1' (bool)", NPY_BOOL, 1},
};
#define N_DTYPES (sizeof DTYPES / sizeof DTYPES[0])

const char *npy_dtype_string(npy_dtype d) {
  for (size_t i = 0; i < N_DTYPES; i++)
    if (DTYPES[i].dtype == d) return DTYPES[i].name;
  return "?";
}

char *npy_shape_string(const npy_header *h, char *buf, size_t n) {
  size_t at = 0;
  at += (size_t)snprintf(buf, n, "(");
  for (int d = 0; d < h->ndim && at < n; d++)
    at += (size_t)snprintf(buf + at, n - at, "%s%zu", d ? ", " : "", h->shape[d]);
  if (at < n) snprintf(buf + at, n - at, h->ndim == 1 ? ",)" : ")");
  return buf;
}

/* ---- the header dict: a cursor over the Python literal ---- */

typedef struct {
  const char *s, *end;
  char *err;
  size_t errlen;
} cursor;

static void skip_space(cursor *c) {
  while (c->s < c->end && (*c->s == ' ' || *c->s == '\t' || *c->s == '\n' || *c->s == '\r')) c->s++;
}

/* Consumes ch after optional spaces; 0 when it was there. */
static int eat(cursor *c, char ch) {
  skip_space(c);
  if (c->s < c->end && *c->s == ch) return c->s++, 0;
  return -1;
}

static int fail(cursor *c, const char *what) {
  snprintf(c->err, c->errlen, "bad header: %s", what);
  return -1;
}

/* A quoted string ('...' or "...", no escapes: NumPy's keys and dtypes
 * have none) into buf. */
static int string(cursor *c, char *buf, size_t n) {
  skip_space(c);
  if (c->s >= c->end || (*c->s != '\'' && *c->s != '"')) return -1;
  const char q = *c->s++;
  size_t k = 0;
  while (c->s < c->end && *c->s != q) {
    if (*c->s == '\\' || k + 1 >= n) return -1;
    buf[k++] = *c->s++;
  }
  if (c->s >= c->end) return -1;
  c->s++;
  buf[k] = 0;
  return 0;
}

static int word(cursor *c, const char *w) {
  skip_space(c);
  size_t n = strlen(w);
  if ((size_t)(c->end - c->s) >= n && memcmp(c->s, w, n) == 0) return c->s += n, 0;
  return -1;
}

/* A non-negative decimal integer that fits size_t. */
static int integer(cursor *c, size_t *v) {
  skip_space(c);
  if (c->s >= c->end || *c->s < '0' || *c->s > '9') return -1;
  size_t x = 0;
  while (c->s < c->end && *c->s >= '0' && *c->s <= '9') {
    size_t d = (size_t)(*c->s++ - '0');
    if (x > (SIZE_MAX - d) / 10) return -1;
    x = x * 10 + d;
  }
  if (c->s < c->end && *c->s == 'L') c->s++; /* Python 2 wrote long integers so */
  *v = x;
  return 0;
}

/* "()", "(n,)", "(n, m)" or "(n, m,)". */
static int shape(cursor *c, npy_header *h) {
  if (eat(c, '(')) return fail(c, "'shape' is not a tuple of integers");
  h->ndim = 0;
  if (eat(c, ')') == 0) return 0;
  for (;;) {
    if (h->ndim == NPY_MAX_DIMS) return snprintf(c->err, c->errlen, "more than %d dimensions", NPY_MAX_DIMS), -1;
    if (integer(c, &h->shape[h->ndim]))
      return fail(c, "'shape' holds something other than a non-negative integer (or one too large)");
    h->ndim++;
    int comma = eat(c, ',') == 0;
    if (eat(c, ')') == 0) {
      if (h->ndim == 1 && !comma) return fail(c, "'shape' (n) is not a tuple; NumPy writes (n,)");
      return 0;
    }
    if (!comma) return fail(c, "'shape' is not a tuple of integers");
  }
}

static int parse_dict(cursor *c, npy_header *h) {
  int have_descr = 0, have_order = 0, have_shape = 0;
  if (eat(c, '{')) return fail(c, "it does not start with '{'");
  for (;;) {
    if (eat(c, '}') == 0) break;
    char key[32], val[32];
    if (string(c, key, sizeof key)) return fail(c, "expected a quoted key or '}'");
    if (eat(c, ':')) return fail(c, "expected ':' after a key");
    if (strcmp(key, "descr") == 0) {
      if (have_descr++) return fail(c, "'descr' given twice");
      if (string(c, val, sizeof val)) return fail(c, "'descr' is not a quoted dtype such as '<f4'");
      size_t i = 0;
      while (i < N_DTYPES && strcmp(val, DTYPES[i].descr) != 0) i++;
      if (i == N_DTYPES)
        return snprintf(c->err, c->errlen,
                        "dtype '%s' is not supported; expected '<f4' (float32), '<f2' (float16), '|u1' (uint8) "
                        "or '|b1' (bool)%s",
                        val, val[0] == '>' ? " (this is big-endian)" : ""),
               -1;
      h->dtype = DTYPES[i].dtype;
      h->elem_size = DTYPES[i].size;
    } else if (strcmp(key, "fortran_order") == 0) {
      if (have_order++) return fail(c, "'fortran_order' given twice");
      if (word(c, "True") == 0)
        h->fortran_order = 1;
      else if (word(c, "False") == 0)
        h->fortran_order = 0;
      else
        return fail(c, "'fortran_order' is neither True nor False");
    } else if (strcmp(key, "shape") == 0) {
      if (have_shape++) return fail(c, "'shape' given twice");
      if (shape(c, h)) return -1;
    } else {
      return snprintf(c->err, c->errlen, "bad header: unknown key '%s' (expected 'descr', 'fortran_order', 'shape')",
                      key),
             -1;
    }
    if (eat(c, ',') == 0) continue;
    if (eat(c, '}') == 0) break;
    return fail(c, "expected ',' or '}' after a value");
  }
  skip_space(c);
  if (c->s != c->end) return fail(c, "something follows the closing '}'");
  if (!have_descr || !have_order || !have_shape)
    return fail(c, !have_descr ? "no 'descr'" : !have_order ? "no 'fortran_order'" : "no 'shape'");
  return 0;
}

/* The magic, the version and the header's length at the start of buf (len
 * bytes, NPY_PREFIX_MAX are enough): the bytes before the header (*prefix)
 * and the header's (*hlen). */
static int parse_prefix(const unsigned char *buf, size_t len, size_t *prefix, size_t *hlen, char *err, size_t errlen) {
  if (len < 8 || memcmp(buf, MAGIC, sizeof MAGIC) != 0)
    return snprintf(err, errlen, "not a .npy file (it does not start with \\x93NUMPY)"), -1;
  const int major = buf[6], minor = buf[7];
  if ((major < 1 || major > 3) || minor != 0)
    return snprintf(err, errlen, "format version %d.%d is not 1.0, 2.0 or 3.0", major, minor), -1;
  *prefix = major == 1 ? 10 : 12;
  if (len < *prefix) return snprintf(err, errlen, "truncated: the file ends inside the header's length"), -1;
  *hlen = (size_t)buf[8] | (size_t)buf[9] << 8;
  if (major > 1) *hlen |= (size_t)buf[10] << 16 | (size_t)buf[11] << 24;
  return 0;
}

int npy_parse_header(const unsigned char *buf, size_t len, npy_header *h, char *err, size_t errlen) {
  memset(h, 0, sizeof *h);
  size_t prefix, hlen;
  if (parse_prefix(buf, len, &prefix, &hlen, err, errlen)) return -1;
  const int major = buf[6];
  if (hlen > len - prefix)
    return snprintf(err, errlen, "truncated: the header's length is %zu bytes, the file holds %zu after it", hlen,
                    len - prefix),
           -1;
  /* 1.0 and 2.0 headers are ASCII; 3.0's are UTF-8, whose bytes past ASCII
   * can only sit inside strings, where no accepted key or dtype has them */
  for (size_t i = 0; i < hlen; i++)
    if (buf[prefix + i] == 0 || (major < 3 && buf[prefix + i] > 127))
      return snprintf(err, errlen, "bad header: byte %zu is not %s text", i, major < 3 ? "ASCII" : "UTF-8"), -1;
  cursor c = {(const char *)buf + prefix, (const char *)buf + prefix + hlen, err, errlen};
  if (parse_dict(&c, h)) return -1;
  h->data_offset = prefix + hlen;
  h->count = 1;
  for (int d = 0; d < h->ndim; d++) {
    if (h->shape[d] && h->count > SIZE_MAX / h->elem_size / h->shape[d])
      return snprintf(err, errlen, "bad header: the shape's element count overflows"), -1;
    h->count *= h->shape[d];
  }
  return 0;
}

/* ---- data ---- */

/* Element (C-order index i)'s position in a Fortran-order array: the
 * first dimension varies fastest there. */
static size_t fortran_index(const npy_header *h, size_t i) {
  size_t f = 0, step = 1;
  for (int d = 0; d < h->ndim; d++) step *= h->shape[d];
  for (int d = 0; d < h->ndim; d++) {
    step /= h->shape[d]; /* C-order stride of dimension d */
    size_t idx = i / step;
    i %= step;
    size_t fstride = 1;
    for (int e = 0; e < d; e++) fstride *= h->shape[e];
    f += idx * fstride;
  }
  return f;
}

/* The data's size against the header's: 0, or -1 saying which is longer
 * ("more" when the file's size is not known, only that it holds more). */
static int check_size(const npy_header *h, size_t have, int more, char *err, size_t errlen) {
  const size_t need = h->count * h->elem_size;
  if (have == need && !more) return 0;
  char sh[256], held[64];
  snprintf(held, sizeof held, more ? "more" : "%zu", have);
  return snprintf(err, errlen, "%s: the header's shape %s of %s needs %zu bytes of data, the file holds %s",
                  have < need ? "truncated" : "too long", npy_shape_string(h, sh, sizeof sh),
                  npy_dtype_string(h->dtype), need, held),
         -1;
}

/* The values of data (exactly the header's count) into a. */
static int decode_data(const unsigned char *data, npy_array *a, char *err, size_t errlen) {
  const npy_header *h = &a->h;
  const int fortran = h->fortran_order && h->ndim > 1 && h->count > 0;
  const size_t n = h->count ? h->count : 1; /* malloc(0) may return NULL */
  if (h->dtype == NPY_F32 || h->dtype == NPY_F16)
    a->f = malloc(n * sizeof(float));
  else
    a->u8 = malloc(n);
  if (!a->f && !a->u8) return snprintf(err, errlen, "out of memory for %zu elements", h->count), -1;
  for (size_t i = 0; i < h->count; i++) {
    const unsigned char *e = data + (fortran ? fortran_index(h, i) : i) * h->elem_size;
    switch (h->dtype) {
      case NPY_F32: {
        uint32_t bits = (uint32_t)e[0] | (uint32_t)e[1] << 8 | (uint32_t)e[2] << 16 | (uint32_t)e[3] << 24;
        memcpy(&a->f[i], &bits, sizeof bits);
        break;
      }
      case NPY_F16: a->f[i] = cp_f16_value((uint16_t)(e[0] | e[1] << 8)); break;
      case NPY_U8: a->u8[i] = e[0]; break;
      case NPY_BOOL: a->u8[i] = e[0] != 0; break;
    }
  }
  return 0;
}

int npy_decode(const unsigned char *buf, size_t len, npy_array *a, char *err, size_t errlen) {
  memset(a, 0, sizeof *a);
  if (npy_parse_header(buf, len, &a->h, err, errlen) || check_size(&a->h, len - a->h.data_offset, 0, err, errlen))
    return -1;
  return decode_data(buf + a->h.data_offset, a, err, errlen);
}

void npy_free(npy_array *a) {
  if (!a) return;
  free(a->f);
  free(a->u8);
  a->f = NULL;
  a->u8 = NULL;
}

/* Up to n bytes from f into buf: fewer only at the end of the file or on a
 * read error (ferror tells). */
static size_t read_upto(FILE *f, unsigned char *buf, size_t n) { return n ? fread(buf, 1, n, f) : 0; }

/* At most n bytes of f into a malloc'd buffer (NULL when out of memory),
 * grown as they arrive: a stream that ends early costs what it held, not
 * what its header claimed. *got: the bytes read. */
static unsigned char *read_data(FILE *f, size_t n, size_t *got) {
  size_t cap = n < ((size_t)1 << 20) ? n : (size_t)1 << 20, at = 0;
  unsigned char *buf = malloc(cap ? cap : 1);
  while (buf) {
    at += read_upto(f, buf + at, cap - at);
    if (at < cap || cap == n) break; /* the end of the file, an error, or all n */
    const size_t grown = cap > n / 2 ? n : cap * 2;
    unsigned char *more = realloc(buf, grown);
    if (!more) free(buf);
    buf = more, cap = grown;
  }
  *got = at;
  return buf;
}

static int read_error(char *why, size_t whylen) {
  snprintf(why, whylen, "cannot read: %s", strerror(errno));
  return -1;
}

/* Headers past this are refused unread (NumPy's own reader refuses past
 * 10000 bytes by default). */
enum { HEADER_MAX = 1 << 20 };

/* The header first, then only the data it implies: a regular file whose
 * size disagrees is refused before its data is read, and any other file (a
 * pipe, a device) is read no further than the header's size and one byte. */
static int load(FILE *f, npy_array *a, char *why, size_t whylen) {
  struct stat st;
  if (fstat(fileno(f), &st) != 0) return read_error(why, whylen);
  if (S_ISDIR(st.st_mode)) return snprintf(why, whylen, "cannot read: %s", strerror(EISDIR)), -1;
  unsigned char start[12]; /* the prefix alone: 10 bytes in 1.0, 12 after */
  size_t n = read_upto(f, start, 10), prefix = 0, hlen = 0;
  if (n == 10 && start[6] > 1) n += read_upto(f, start + 10, 2);
  if (ferror(f)) return read_error(why, whylen);
  if (parse_prefix(start, n, &prefix, &hlen, why, whylen)) return -1;
  if (hlen > HEADER_MAX)
    return snprintf(why, whylen, "bad header: its length is %zu bytes, past this reader's limit of %d", hlen,
                    HEADER_MAX),
           -1;
  unsigned char *head = malloc(prefix + hlen);
  if (!head) return snprintf(why, whylen, "out of memory for a header of %zu bytes", hlen), -1;
  memcpy(head, start, n);
  n += read_upto(f, head + n, prefix + hlen - n);
  int rc = ferror(f) ? read_error(why, whylen) : npy_parse_header(head, n, &a->h, why, whylen);
  free(head);
  if (rc) return -1;
  const size_t need = a->h.count * a->h.elem_size, offset = a->h.data_offset;
  if (S_ISREG(st.st_mode) &&
      check_size(&a->h, (uintmax_t)st.st_size > offset ? (size_t)st.st_size - offset : 0, 0, why, whylen))
    return -1;
  size_t got = 0;
  unsigned char *data = read_data(f, need, &got);
  if (!data) return snprintf(why, whylen, "out of memory for %zu bytes of data", need), -1;
  rc = ferror(f)
           ? read_error(why, whylen)
           : check_size(&a->h, got, got == need && fgetc(f) != EOF, why, whylen) || decode_data(data, a, why, whylen);
  free(data);
  return rc ? -1 : 0;
}

int npy_load(const char *path, npy_array *a, char *err, size_t errlen) {
  memset(a, 0, sizeof *a);
  FILE *f = fopen(path, "rb");
  if (!f) return snprintf(err, errlen, "%s: cannot read: %s", path, strerror(errno)), -1;
  char why[512];
  const int rc = load(f, a, why, sizeof why);
  fclose(f);
  if (rc) {
    npy_free(a);
    snprintf(err, errlen, "%s: %s", path, why);
  }
  return rc;
}

int npy_save_f32(const char *path, const float *data, int ndim, const size_t *shape, char *err, size_t errlen) {
  char header[512];
  int n = snprintf(header, sizeof header, "{'descr': '<f4', 'fortran_order': False, 'shape': (");
  size_t count = 1;
  for (int d = 0; d < ndim; d++) {
    n += snprintf(header + n, sizeof header - (size_t)n, "%s%zu", d ? ", " : "", shape[d]);
    count *= shape[d];
  }
  n += snprintf(header + n, sizeof header - (size_t)n, "%s), }", ndim == 1 ? "," : "");
  /* spaces and a newline up to a multiple of 64 bytes with the 10-byte prefix, as NumPy aligns its data */
  while ((10 + n + 1) % 64) header[n++] = ' ';
  header[n++] = '\n';
  unsigned char prefix[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, (unsigned char)(n & 0xff), (unsigned char)(n >> 8)};
  FILE *f = fopen(path, "wb");
  if (!f) return snprintf(err, errlen, "%s: cannot write: %s", path, strerror(errno)), -1;
  int ok = fwrite(prefix, 1, sizeof prefix, f) == sizeof prefix && fwrite(header, 1, (size_t)n, f) == (size_t)n;
  for (size_t i = 0; ok && i < count; i++) {
    uint32_t bits;
    memcpy(&bits, &data[i], sizeof bits);
    unsigned char e[4] = {(unsigned char)bits, (unsigned char)(bits >> 8), (unsigned char)(bits >> 16),
                          (unsigned char)(bits >> 24)};
    ok = fwrite(e, 1, 4, f) == 4;
  }
  const int saved = errno;
  if (fclose(f) != 0 || !ok) {
    snprintf(err, errlen, "%s: cannot write: %s", path, strerror(ok ? errno : saved));
    remove(path);
    return -1;
  }
  return 0;
}
