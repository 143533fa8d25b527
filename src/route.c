/*
 * What the calling thread's last call enqueued (clattn_last_route): the
 * algorithm, then each kernel once, in the order first enqueued. Kept per
 * thread like the last error, so a report never mixes two threads' calls.
 */
#include <stdio.h>
#include <string.h>

#include "internal.h"

static _Thread_local char route[512];

void ca_route_begin(const char *what) { snprintf(route, sizeof route, "%s:", what); }

void ca_route_kernel(const char *name) {
  const size_t n = strlen(name), used = strlen(route);
  const char *list = strchr(route, ':') + 1; /* ca_route_begin wrote the ':' */
  for (const char *at = strstr(list, name); at; at = strstr(at + 1, name))
    if (at[-1] == ' ' && (at[n] == ',' || at[n] == 0)) return; /* already listed */
  snprintf(route + used, sizeof route - used, "%s %s", list[0] ? "," : "", name);
}

void ca_route_set(const char *whole) {
  const size_t n = strlen(whole);
  memcpy(route, whole, n < sizeof route ? n + 1 : sizeof route - 1);
  route[sizeof route - 1] = 0;
}

const char *clattn_last_route(void) { return route; }
