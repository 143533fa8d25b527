/*
 * `clattn run`: one verified problem, random or read from .npy files:
 * what ran (storage type, the algorithm AUTO resolved to, its kernels),
 * device memory, error against the fp64 reference and time.
 */
#ifndef CLATTN_TOOLS_RUN_H
#define CLATTN_TOOLS_RUN_H

#include "clattn.h"
#include "problem.h"

/* argv[0] is "run". Exit status: 0 verified, 1 not verified or failed,
 * 2 bad usage. */
int run_main(int argc, char **argv);

/* The usage lines of `clattn run` (for the tool's usage()). */
extern const char run_usage[];

/* Runs a random problem of shape s on ctx and prints what ran and how well;
 * returns 0 when verified within tol (`clattn demo` uses it too). */
int run_verified(clattn_context *ctx, const cp_shape *s, int reps, double tol);

#endif
