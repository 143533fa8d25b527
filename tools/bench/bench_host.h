/*
 * `clattn bench --host`: the host cost of one clattn_forward decode call
 * against a floor of empty kernel enqueues (bench_host.c).
 */
#ifndef CLATTN_TOOLS_BENCH_HOST_H
#define CLATTN_TOOLS_BENCH_HOST_H

#include "clattn.h"

typedef struct {
  int heads, kv_heads, q_len, kv_len, dim; /* the call's shape (B 1) */
  int reps;                                /* calls timed one at a time (median) */
  int calls;                               /* back-to-back calls */
} bench_host_cfg;

/* H 32/KV 8, M 1, N 512, d 128; 500 reps, 1,000 calls. */
bench_host_cfg bench_host_defaults(void);

/* Measures and prints the section on ctx; 0, or -1 after a message on stderr. */
int bench_host_run(clattn_context *ctx, const bench_host_cfg *c);

/* argv as bench_main's (argv[1] "bench", "--host" among the options). */
int bench_host_main(int argc, char **argv);

extern const char bench_host_usage[];

#endif
