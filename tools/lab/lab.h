/*
 * `clattn lab`: the seeds' routing laboratory on the device — their six
 * checks and the memory-interface read with their numbers, then causal
 * interventions (paired permutation, key shuffle, value shuffle, ablation of
 * the top route, near-duplicate keys) on a synthetic retrieval task, each
 * asserted; optionally as JSON and with a heat map of the routing matrix.
 */
#ifndef CLATTN_TOOLS_LAB_H
#define CLATTN_TOOLS_LAB_H

/* argv is the tool's whole command line: argv[0] the program, argv[1] "lab",
 * the options after it. Returns 0 when every assertion holds, 1 otherwise,
 * 2 on bad usage. */
int lab_main(int argc, char **argv);

/* The usage lines of `clattn lab` (for the tool's usage()). */
extern const char lab_usage[];

#endif
