/*
 * What the calling thread's last call enqueued (clattn_last_route): the
 * algorithm, then each kernel once, in the order first enqueued. Kept per
 * thread like the last error, so a report never mixes two threads' calls.
 */
#include <string.h>

#include "base/base.h"

static _Thread_local char route[512];
static _Thread_local size_t used; /* bytes of route before its NUL */

/* Appends n bytes of text (cut at the end of route). */
static void put(const char *text, size_t n) {
  if (n > sizeof route - 1 - used) n = sizeof route - 1 - used;
  memcpy(route + used, text, n);
  used += n;
  route[used] = 0;
}

void ca_trace_begin(const char *what) {
  used = 0;
  put(what, strlen(what));
  put(":", 1);
}

void ca_trace_kernel(const char *name) {
  const size_t n = strlen(name);
  const char *list = strchr(route, ':') + 1; /* ca_trace_begin wrote the ':' */
  for (const char *at = strstr(list, name); at; at = strstr(at + 1, name))
    if (at[-1] == ' ' && (at[n] == ',' || at[n] == 0)) return; /* already listed */
  put(list[0] ? ", " : " ", list[0] ? 2 : 1);
  put(name, n);
}

const char *clattn_last_route(void) { return route; }
