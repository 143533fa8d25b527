/*
 * What the calling thread's last call enqueued (clattn_last_route): the
 * algorithm, then each kernel once, in the order first enqueued. Kept per
 * thread like the last error, so a report never mixes two threads' calls.
 * A call notes names only (a decode step's host time counts); the text is
 * made when asked for.
 */
#include <stdio.h>
#include <string.h>

#include "base/base.h"

enum { NAMES = 24, NAME = 40 };

static _Thread_local char call[NAME];
static _Thread_local char names[NAMES][NAME];
static _Thread_local int n_names;
static _Thread_local char route[NAMES * (NAME + 2) + NAME + 2];

/* Copies a name, cut to NAME - 1 bytes. */
static void copy_name(char *to, const char *name) {
  size_t n = strlen(name);
  if (n > NAME - 1) n = NAME - 1;
  memcpy(to, name, n);
  to[n] = 0;
}

void ca_trace_begin(const char *what) {
  copy_name(call, what);
  n_names = 0;
}

void ca_trace_kernel(const char *name) {
  for (int i = n_names - 1; i >= 0; i--)
    if (strncmp(names[i], name, NAME - 1) == 0) return; /* already listed */
  if (n_names < NAMES) copy_name(names[n_names++], name);
}

const char *clattn_last_route(void) {
  if (!call[0]) return "";
  size_t used = (size_t)snprintf(route, sizeof route, "%s:", call);
  for (int i = 0; i < n_names && used < sizeof route; i++)
    used += (size_t)snprintf(route + used, sizeof route - used, "%s%s", i ? ", " : " ", names[i]);
  return route;
}
