/*
 * `clattn bench --host`: what one decode step costs the host through a plan
 * (plain enqueues and command-buffer replay), through clattn_forward, and
 * at the floor of the plan's kernels enqueued bare; and decode calls per
 * second end to end, against another build of the library (bench_host.c).
 */
#ifndef CLATTN_TOOLS_BENCH_HOST_H
#define CLATTN_TOOLS_BENCH_HOST_H

#include "clattn.h"

typedef struct {
  int heads, kv_heads, q_len, kv_len, dim; /* the step's shape (B 1) */
  int reps;                                /* interleaved rounds (medians over them) */
  int steps;                               /* steps per variant per round, enqueued behind a gate */
  int calls;                               /* back-to-back calls per variant per round, end to end */
  const char *before;                      /* another build's libclattn.so for "before", or NULL */
} bench_host_cfg;

/* H 32/KV 8, M 1, N 512, d 128; 200 rounds of 16 steps; 7 rounds of 200 calls end to end. */
bench_host_cfg bench_host_defaults(void);

/* Measures and prints the section on ctx; 0, or -1 after a message on stderr. */
int bench_host_run(clattn_context *ctx, const bench_host_cfg *c);

/* argv as bench_main's (argv[1] "bench", "--host" among the options). */
int bench_host_main(int argc, char **argv);

extern const char bench_host_usage[];

#endif
