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
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check/check.h"

enum { BUCKETS = 251 };

typedef struct fact {
  struct fact *next;
  cl_mem mem;
  ca_mem_facts facts;
} fact;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static fact *table[BUCKETS];
static atomic_ulong forgets;

static fact **bucket(cl_mem m) { return &table[((uintptr_t)m >> 4) % BUCKETS]; }

/* Each thread's last facts found, valid while no fact has been forgotten
 * since (a call checks the same few cl_mems again and again: no lock). */
enum { RECENT = 8 };
static _Thread_local struct {
  unsigned long forgets;
  int next;
  cl_mem mem[RECENT];
  ca_mem_facts facts[RECENT];
} recent;

int ca_mem_facts_cached(cl_mem m, ca_mem_facts *out) {
  __typeof__(recent) *r = &recent; /* one thread-local lookup */
  const unsigned long now = ca_mem_facts_forgets();
  if (r->forgets != now) {
    memset(r, 0, sizeof *r);
    r->forgets = now;
  }
  for (int i = 0; m && i < RECENT; i++)
    if (r->mem[i] == m) {
      *out = r->facts[i];
      return 1;
    }
  int found = 0;
  pthread_mutex_lock(&lock);
  for (fact *f = *bucket(m); f; f = f->next)
    if (f->mem == m) {
      *out = f->facts;
      found = 1;
      break;
    }
  pthread_mutex_unlock(&lock);
  if (found) {
    r->mem[r->next] = m;
    r->facts[r->next] = *out;
    r->next = (r->next + 1) % RECENT;
  }
  return found;
}

int ca_mem_facts_tracked(cl_mem m) {
  ca_mem_facts unused;
  return ca_mem_facts_cached(m, &unused);
}

unsigned long ca_mem_facts_forgets(void) { return atomic_load_explicit(&forgets, memory_order_acquire); }

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
  atomic_fetch_add_explicit(&forgets, 1, memory_order_release);
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
