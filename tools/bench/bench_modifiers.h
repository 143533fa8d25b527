/*
 * `clattn bench --modifiers`: modifiers against what they replace, side by
 * side on one context (bench_modifiers.c).
 */
#ifndef CLATTN_TOOLS_BENCH_MODIFIERS_H
#define CLATTN_TOOLS_BENCH_MODIFIERS_H

/* argv as bench_main's (argv[1] "bench", "--modifiers" among the options). */
int bench_modifiers_main(int argc, char **argv);

extern const char bench_modifiers_usage[];

#endif
