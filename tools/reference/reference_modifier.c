/* The modifiers' tables of the fp64 reference (reference_modifier.h). */
#include "reference_modifier.h"

#include <stdio.h>
#include <stdlib.h>

int ref_modifier_tables(clattn_context *ctx, const clattn_params *p, const ref_inputs *in, unsigned char **allowed,
                        float **scores, float **grads, char *err, size_t errlen) {
  *allowed = NULL;
  *scores = *grads = NULL;
  const size_t n = (size_t)p->batch * (size_t)p->q_heads * (size_t)p->q_len * (size_t)p->kv_len;
  cl_int *points = malloc(4 * n * sizeof *points);
  float *s = malloc(n * sizeof *s);
  unsigned char *ok = malloc(n);
  float *g = malloc(n * sizeof *g);
  if (!points || !s || !ok || !g) {
    snprintf(err, errlen, "ref_modifier_tables: out of host memory for %zu pairs", n);
    goto fail;
  }
  for (int b = 0; b < p->batch; b++) {
    const ref_seq sq = ref_sequence(p, in, b);
    for (int h = 0; h < p->q_heads; h++)
      for (int i = 0; i < p->q_len; i++)
        for (int j = 0; j < p->kv_len; j++) {
          const size_t e = ref_pair_index(p, b, h, i, j);
          const int inside = i < sq.rows && j < sq.keys;
          points[4 * e] = b;
          points[4 * e + 1] = h;
          points[4 * e + 2] = i + sq.align_n - sq.align_m;
          points[4 * e + 3] = j;
          s[e] = inside && p->score_mod ? (float)ref_shaped_score(p, in, b, h, i, j) : 0.0f;
        }
  }
  const clattn_status st = clattn_modifier_eval(ctx, p, n, points, s, ok, g);
  if (st != CLATTN_OK) {
    snprintf(err, errlen, "clattn_modifier_eval: %s: %s", clattn_status_string(st), clattn_last_error(ctx));
    goto fail;
  }
  for (int b = 0; b < p->batch; b++) { /* pairs outside a sequence: none */
    const ref_seq sq = ref_sequence(p, in, b);
    for (int h = 0; h < p->q_heads; h++)
      for (int i = 0; i < p->q_len; i++)
        for (int j = 0; j < p->kv_len; j++)
          if (i >= sq.rows || j >= sq.keys) ok[ref_pair_index(p, b, h, i, j)] = 0;
  }
  free(points);
  if (p->mask_mod) *allowed = ok; else free(ok);
  if (p->score_mod) *scores = s; else free(s);
  if (p->score_mod) *grads = g; else free(g);
  return 0;
fail:
  free(g);
  free(points);
  free(s);
  free(ok);
  return -1;
}
