/*
 * `clattn lab --train`: the seeds' training experiment (lab_train.c): a
 * key-value lookup learned by attention with learned projections and by
 * three baselines, from several seeds, with the lab's interventions.
 */
#ifndef CLATTN_TOOLS_LAB_TRAIN_H
#define CLATTN_TOOLS_LAB_TRAIN_H

/* argv as lab_main's ("--train" among the options). 0 when the assertions
 * hold, 1 otherwise, 2 on bad usage. */
int lab_train_main(int argc, char **argv);

extern const char lab_train_usage[]; /* the synopsis line */
extern const char lab_train_help[];  /* the options */

#endif
