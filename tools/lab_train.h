/*
 * `clattn lab --train`: the routing lab's retrieval task learned by
 * gradient descent through clattn_forward and clattn_backward (lab_train.c).
 */
#ifndef CLATTN_TOOLS_LAB_TRAIN_H
#define CLATTN_TOOLS_LAB_TRAIN_H

/* argv as lab_main's ("--train" among the options). 0 when the assertions
 * hold, 1 otherwise, 2 on bad usage. */
int lab_train_main(int argc, char **argv);

extern const char lab_train_usage[];

#endif
