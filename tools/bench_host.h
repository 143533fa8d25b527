/*
 * `clattn bench --host`: the host cost of one clattn_forward decode call
 * against a floor of empty kernel enqueues (bench_host.c).
 */
#ifndef CLATTN_TOOLS_BENCH_HOST_H
#define CLATTN_TOOLS_BENCH_HOST_H

/* argv as bench_main's (argv[1] "bench", "--host" among the options). */
int bench_host_main(int argc, char **argv);

extern const char bench_host_usage[];

#endif
