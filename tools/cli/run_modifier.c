/* `clattn run`'s modifiers (run_modifier.h). */
#include "run_modifier.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A whole file's bytes, NUL-terminated (*n without the NUL); NULL said. */
static char *read_file(const char *opt, const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    fprintf(stderr, "clattn run: --%s %s: %s\n", opt, path, strerror(errno));
    return NULL;
  }
  size_t cap = 4096, len = 0;
  char *buf = malloc(cap + 1);
  size_t got;
  while (buf && (got = fread(buf + len, 1, cap - len, f)) > 0) {
    len += got;
    if (len == cap) {
      char *grown = realloc(buf, 2 * cap + 1);
      if (!grown) free(buf);
      buf = grown;
      cap *= 2;
    }
  }
  const int failed = ferror(f);
  fclose(f);
  if (!buf || failed) {
    free(buf);
    fprintf(stderr, "clattn run: --%s %s: cannot read it\n", opt, path);
    return NULL;
  }
  buf[len] = '\0';
  *n = len;
  return buf;
}

int rm_read_text(const char *opt, const char *path, char **text) {
  size_t n;
  free(*text);
  *text = read_file(opt, path, &n);
  return *text ? 0 : -1;
}

int rm_add_capture(rm_cfg *m, const char *path) {
  if (m->n_captures == 4) return fprintf(stderr, "clattn run: --capture: at most 4 (cap->buf[0..3])\n"), -1;
  m->capture_files[m->n_captures++] = path;
  return 0;
}

/* Up to 4 comma-separated numbers of arg into out (as doubles). */
static int numbers(const char *opt, const char *arg, double *out, int *n) {
  const char *at = arg;
  for (*n = 0; *n < 4; (*n)++) {
    char *end = NULL;
    errno = 0;
    out[*n] = strtod(at, &end);
    if (end == at || errno) break;
    if (*end == '\0') return (*n)++, 0;
    if (*end != ',') break;
    at = end + 1;
  }
  fprintf(stderr, "clattn run: --%s %s: expected 1 to 4 comma-separated numbers\n", opt, arg);
  return -1;
}

int rm_parse_ints(rm_cfg *m, const char *arg) {
  double x[4];
  if (numbers("ints", arg, x, &m->n_ints)) return -1;
  for (int i = 0; i < m->n_ints; i++) {
    if (x[i] != (double)(int)x[i])
      return fprintf(stderr, "clattn run: --ints %s: %g is not an int\n", arg, x[i]), -1;
    m->ints[i] = (int)x[i];
  }
  return 0;
}

int rm_parse_floats(rm_cfg *m, const char *arg) {
  double x[4];
  if (numbers("floats", arg, x, &m->n_floats)) return -1;
  for (int i = 0; i < m->n_floats; i++) m->floats[i] = (float)x[i];
  return 0;
}

int rm_given(const rm_cfg *m) {
  return m->score_mod || m->mask_mod || m->n_captures || m->n_ints || m->n_floats || m->block_mask;
}

int rm_apply(rm_cfg *m, clattn_context *ctx, cp_problem *pb) {
  clattn_params *p = &pb->params;
  if (!m->score_mod && !m->mask_mod && rm_given(m))
    return fprintf(stderr, "clattn run: --capture, --ints, --floats and --block-mask need --score-mod or --mask-mod\n"),
           -1;
  p->score_mod = m->score_mod;
  p->mask_mod = m->mask_mod;
  for (int i = 0; i < m->n_captures; i++) {
    size_t n;
    char *bytes = read_file("capture", m->capture_files[i], &n);
    if (!bytes) return -1;
    cl_int err;
    m->captures[i] = clCreateBuffer(clattn_cl_context(ctx), CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, n ? n : 1,
                                    bytes, &err);
    free(bytes);
    if (err != CL_SUCCESS)
      return fprintf(stderr, "clattn run: --capture %s: clCreateBuffer: %s\n", m->capture_files[i],
                     clattn_opencl_error_name(err)),
             -1;
    p->captures[i] = m->captures[i];
  }
  for (int i = 0; i < m->n_ints; i++) p->capture_i[i] = m->ints[i];
  for (int i = 0; i < m->n_floats; i++) p->capture_f[i] = m->floats[i];
  if (m->block_mask) {
    if (!m->mask_mod) return fprintf(stderr, "clattn run: --block-mask needs --mask-mod\n"), -1;
    const clattn_status st = clattn_block_mask_create(ctx, p, 0, 0, &m->bm);
    if (st != CLATTN_OK)
      return fprintf(stderr, "clattn run: block mask: %s: %s\n", clattn_status_string(st), clattn_last_error(ctx)), -1;
    size_t empty, partial, full;
    clattn_block_mask_counts(m->bm, &empty, &partial, &full);
    printf("  block mask: %zu empty, %zu partial, %zu full blocks of 128 x 128\n", empty, partial, full);
    p->block_mask = m->bm;
  }
  return 0;
}

void rm_free(rm_cfg *m) {
  free(m->score_mod);
  free(m->mask_mod);
  for (int i = 0; i < 4; i++)
    if (m->captures[i]) clReleaseMemObject(m->captures[i]);
  clattn_block_mask_release(m->bm);
  memset(m, 0, sizeof *m);
}
