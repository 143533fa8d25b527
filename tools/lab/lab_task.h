/*
 * The synthetic task of `clattn lab --train` (lab_task.c): key-value lookup
 * among distractors, where only content routing can tell which value to read.
 *
 * A sequence holds TASK_PAIRS pair tokens and a query token. Pair j carries
 * key symbol k_j (distinct within the sequence) and value class c_j; its
 * token is key_emb[k_j] + val_emb[c_j]. The query token is key_emb[k_q] +
 * query_mark with k_q one of the sequence's keys; the answer is the class
 * of the pair whose key is k_q. The other pairs are distractors: a model
 * that does not bind keys to values sees the same bag of tokens whatever the
 * answer is. Embeddings are fixed random vectors (not learned).
 */
#ifndef CLATTN_TOOLS_LAB_TASK_H
#define CLATTN_TOOLS_LAB_TASK_H

#include <stdint.h>

enum {
  TASK_PAIRS = 8,          /* key-value pairs per sequence */
  TASK_T = TASK_PAIRS + 1, /* tokens per sequence: the pairs, then the query */
  TASK_KEYS = 16,          /* key symbols */
  TASK_CLASSES = 16,       /* value classes = the answer classes */
  TASK_D = 32              /* embedding width */
};

typedef struct {
  float key[TASK_KEYS][TASK_D], value[TASK_CLASSES][TASK_D], query_mark[TASK_D];
} task_embedding;

typedef struct {
  int n;              /* sequences */
  float *x;           /* [n, TASK_T, TASK_D] tokens, row-major */
  int *label;         /* [n] the answer class */
  int *match;         /* [n] the position of the pair whose key matches the query */
  double bag_ceiling; /* the best accuracy without binding keys to values: the mean over
                         sequences of (count of the commonest value class) / TASK_PAIRS,
                         since every pair is then equally likely to be the match */
} task_set;

/* splitmix64 and what the lab draws from it. */
uint64_t task_rng(uint64_t *s);
double task_unit(uint64_t *s);  /* uniform [0, 1) */
double task_gauss(uint64_t *s); /* standard normal */

/* Random embeddings, each entry N(0, 1/TASK_D) (rows of norm about 1). */
void task_embedding_init(task_embedding *e, uint64_t seed);

/* n fresh sequences drawn from *rng. Returns 0, or -1 out of memory. */
int task_set_alloc(task_set *s, int n);
void task_set_draw(task_set *s, const task_embedding *e, uint64_t *rng);
void task_set_free(task_set *s);

#endif
