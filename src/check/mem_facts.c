/*
 * What validation learns of a caller's cl_mem and that cannot change while
 * it lives (its size, type, context and flags), kept process-wide until
 * the runtime destroys it, so a call over buffers seen before asks the
 * runtime nothing (Intel's CPU runtime takes half a microsecond for one
 * CL_MEM_FLAGS query, and a decode call checks six views).
 *
 * A fact is kept only with a destructor callback registered on its cl_mem
 * (clSetMemObjectDestructorCallback), which forgets it when the runtime
 * deletes the object, before the handle can name a new one; a cl_mem whose
 * callback cannot be registered is asked about every time. The table is
 * process-wide, not per context, so a callback never outlives it.
 */
#include <stdint.h>
#include <stdlib.h>

#include "check/check.h"

enum { BUCKETS = 251 };

typedef struct fact {
  struct fact *next;
  cl_mem mem;
  ca_mem_facts facts;
} fact;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static fact *table[BUCKETS];

static fact **bucket(cl_mem m) { return &table[((uintptr_t)m >> 4) % BUCKETS]; }

int ca_mem_facts_cached(cl_mem m, ca_mem_facts *out) {
  int found = 0;
  pthread_mutex_lock(&lock);
  for (fact *f = *bucket(m); f; f = f->next)
    if (f->mem == m) {
      *out = f->facts;
      found = 1;
      break;
    }
  pthread_mutex_unlock(&lock);
  return found;
}

/* Unlinks m's fact; returns it (to free) or NULL. */
static fact *unlink_fact(cl_mem m) {
  for (fact **at = bucket(m); *at; at = &(*at)->next)
    if ((*at)->mem == m) {
      fact *f = *at;
      *at = f->next;
      return f;
    }
  return NULL;
}

static void CL_CALLBACK forget(cl_mem m, void *user) {
  (void)user;
  pthread_mutex_lock(&lock);
  fact *f = unlink_fact(m);
  pthread_mutex_unlock(&lock);
  free(f);
}

void ca_mem_facts_keep(cl_mem m, const ca_mem_facts *facts) {
  fact *f = malloc(sizeof *f);
  if (!f) return;
  *f = (fact){NULL, m, *facts};
  pthread_mutex_lock(&lock);
  for (fact *g = *bucket(m); g; g = g->next)
    if (g->mem == m) { /* another thread kept it first */
      pthread_mutex_unlock(&lock);
      free(f);
      return;
    }
  f->next = *bucket(m);
  *bucket(m) = f;
  pthread_mutex_unlock(&lock);
  /* The caller's call holds m alive, so the callback comes after this. */
  if (clSetMemObjectDestructorCallback(m, forget, NULL) != CL_SUCCESS) forget(m, NULL);
}
