/*
 * `clattn bench --backward`: clattn_forward and clattn_backward on the
 * device, their time ratio, and a host OpenBLAS backward (bench_backward.c).
 */
#ifndef CLATTN_TOOLS_BENCH_BACKWARD_H
#define CLATTN_TOOLS_BENCH_BACKWARD_H

/* argv as bench_main's (argv[1] "bench", "--backward" among the options). */
int bench_backward_main(int argc, char **argv);

extern const char bench_backward_usage[];

#endif
