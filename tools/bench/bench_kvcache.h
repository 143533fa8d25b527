/*
 * `clattn bench --kvcache`: an engine's decode step as one call
 * (clattn_forward_kvcache) against the same step as two (clattn_kv_append,
 * then clattn_forward), bench_kvcache.c.
 */
#ifndef CLATTN_TOOLS_BENCH_KVCACHE_H
#define CLATTN_TOOLS_BENCH_KVCACHE_H

/* argv as bench_main's (argv[1] "bench", "--kvcache" among the options). */
int bench_kvcache_main(int argc, char **argv);

extern const char bench_kvcache_usage[];

#endif
