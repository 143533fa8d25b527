/*
 * `clattn bench`: clattn's fused and AUTO paths side by side with CLBlast
 * staged attention on the same device and a host OpenBLAS attention, against
 * the device's and the host's SGEMM rates and the device's copy bandwidth.
 */
#ifndef CLATTN_TOOLS_BENCH_H
#define CLATTN_TOOLS_BENCH_H

/* argv is the tool's whole command line: argv[0] the program, argv[1]
 * "bench", the options after it. Returns the process exit status. */
int bench_main(int argc, char **argv);

/* The usage lines of `clattn bench` (for the tool's usage()). */
extern const char bench_usage[];

#endif
