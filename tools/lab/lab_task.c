/* The synthetic key-value lookup task of `clattn lab --train` (lab_task.h). */
#include "lab_task.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

uint64_t task_rng(uint64_t *s) {
  uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

double task_unit(uint64_t *s) { return (double)(task_rng(s) >> 11) * (1.0 / 9007199254740992.0); }

double task_gauss(uint64_t *s) {
  const double u = task_unit(s), v = task_unit(s);
  return sqrt(-2.0 * log(1.0 - u)) * cos(6.283185307179586 * v);
}

void task_embedding_init(task_embedding *e, uint64_t seed) {
  const double sd = 1.0 / sqrt((double)TASK_D);
  for (int r = 0; r < TASK_KEYS; r++)
    for (int c = 0; c < TASK_D; c++) e->key[r][c] = (float)(sd * task_gauss(&seed));
  for (int r = 0; r < TASK_CLASSES; r++)
    for (int c = 0; c < TASK_D; c++) e->value[r][c] = (float)(sd * task_gauss(&seed));
  for (int c = 0; c < TASK_D; c++) e->query_mark[c] = (float)(sd * task_gauss(&seed));
}

int task_set_alloc(task_set *s, int n) {
  memset(s, 0, sizeof *s);
  s->n = n;
  s->x = malloc((size_t)n * TASK_T * TASK_D * sizeof *s->x);
  s->label = malloc((size_t)n * sizeof *s->label);
  s->match = malloc((size_t)n * sizeof *s->match);
  if (!s->x || !s->label || !s->match) return task_set_free(s), -1;
  return 0;
}

void task_set_draw(task_set *s, const task_embedding *e, uint64_t *rng) {
  s->bag_ceiling = 0.0;
  for (int b = 0; b < s->n; b++) {
    int keys[TASK_KEYS];
    for (int k = 0; k < TASK_KEYS; k++) keys[k] = k;
    for (int k = 0; k < TASK_PAIRS; k++) { /* the first TASK_PAIRS of a random permutation: distinct keys */
      const int r = k + (int)(task_unit(rng) * (TASK_KEYS - k)), t = keys[k];
      keys[k] = keys[r], keys[r] = t;
    }
    int classes[TASK_PAIRS];
    float *x = s->x + (size_t)b * TASK_T * TASK_D;
    for (int j = 0; j < TASK_PAIRS; j++) {
      classes[j] = (int)(task_unit(rng) * TASK_CLASSES);
      for (int c = 0; c < TASK_D; c++) x[j * TASK_D + c] = e->key[keys[j]][c] + e->value[classes[j]][c];
    }
    int count[TASK_CLASSES] = {0}, commonest = 0;
    for (int j = 0; j < TASK_PAIRS; j++)
      if (++count[classes[j]] > commonest) commonest = count[classes[j]];
    s->bag_ceiling += (double)commonest / TASK_PAIRS / s->n;
    const int m = (int)(task_unit(rng) * TASK_PAIRS);
    for (int c = 0; c < TASK_D; c++) x[TASK_PAIRS * TASK_D + c] = e->key[keys[m]][c] + e->query_mark[c];
    s->match[b] = m;
    s->label[b] = classes[m];
  }
}

void task_set_free(task_set *s) {
  free(s->x);
  free(s->label);
  free(s->match);
  memset(s, 0, sizeof *s);
}
