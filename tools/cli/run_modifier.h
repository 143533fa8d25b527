/*
 * `clattn run`'s modifiers: the score and mask modifiers read from OpenCL C
 * files, the captures (files' bytes as buffers, ints, floats) and the
 * block mask, put into a problem's params once the context exists.
 */
#ifndef CLATTN_CLI_RUN_MODIFIER_H
#define CLATTN_CLI_RUN_MODIFIER_H

#include "problem.h"

typedef struct {
  char *score_mod, *mask_mod;   /* the files' text, NULL = none */
  const char *capture_files[4]; /* --capture FILE, in order */
  int n_captures;
  int ints[4], n_ints;
  float floats[4];
  int n_floats;
  int block_mask; /* --block-mask: make one and use it */
  cl_mem captures[4];
  clattn_block_mask *bm;
} rm_cfg;

/* --score-mod / --mask-mod FILE: reads its text into *text. 0, or -1 said. */
int rm_read_text(const char *opt, const char *path, char **text);
/* --capture FILE (at most 4). */
int rm_add_capture(rm_cfg *m, const char *path);
/* --ints N[,N...] / --floats X[,X...]: at most 4 numbers. */
int rm_parse_ints(rm_cfg *m, const char *arg);
int rm_parse_floats(rm_cfg *m, const char *arg);
/* Whether any modifier option was given (the captures need a modifier). */
int rm_given(const rm_cfg *m);
/* Sets pb's modifiers and captures (files uploaded to the context), and its
 * block mask with --block-mask; prints what it made. 0, or -1 said. */
int rm_apply(rm_cfg *m, clattn_context *ctx, cp_problem *pb);
void rm_free(rm_cfg *m);

#endif
