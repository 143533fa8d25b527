/*
 * The models of `clattn lab --train` (lab_models.c), all with one readout: a
 * linear classifier (DV -> TASK_CLASSES, plus bias) under softmax
 * cross-entropy, trained by Adam on the host.
 *
 *   attention  the query token reads its sequence: Q = X Wq, K = X Wk,
 *              V = X Wv (one CLBlast GEMM projects all three), the read by
 *              clattn_forward (scale 1/sqrt(DK)), the query position's
 *              output to the readout; dQ, dK, dV by clattn_backward, dWq =
 *              Xᵀ dQ, dWk = Xᵀ dK, dWv = Xᵀ dV by CLBlast GEMMs.
 *   uniform    the same with scale 0: every token weighs 1/TASK_T, so Wq and
 *              Wk have no effect (counted in n_params, not trained).
 *   fixed      the same with Wq and Wk frozen at their random start: a fixed
 *              random routing geometry; Wv and the readout learn.
 *   mlp        a matched-parameter MLP over the mean-pooled tokens:
 *              relu(x̄ W1 + b1) W2 + b2, hidden width MLP_HIDDEN (host).
 */
#ifndef CLATTN_TOOLS_LAB_MODELS_H
#define CLATTN_TOOLS_LAB_MODELS_H

#include <stddef.h>
#include <stdint.h>

#include "lab_task.h"

enum {
  DK = 16,
  DV = 16,         /* the attention head's widths */
  MLP_HIDDEN = 37, /* the MLP's parameter count nearest the attention model's */
  CHUNK = 128      /* sequences per device call: the training batch */
};

typedef enum { MODEL_ATTENTION, MODEL_UNIFORM, MODEL_FIXED, MODEL_MLP, MODEL_KINDS } model_kind;
extern const char *const model_name[MODEL_KINDS];

/* Interventions on the attention model's read, applied after the projection
 * (lab.c's, on the trained model): the pair tokens' K rows, V rows or both
 * rotated among the pair positions by a random nonzero shift per sequence
 * (every key, value or pair moves), or the matching key disallowed by a mask. */
typedef enum { INTV_NONE, INTV_PAIRED, INTV_KEY_SHUFFLE, INTV_VALUE_SHUFFLE, INTV_ABLATE, INTV_KINDS } intervention;
extern const char *const intervention_name[INTV_KINDS];

typedef struct lab_device lab_device; /* a clattn context and the buffers of one CHUNK */

typedef struct {
  model_kind kind;
  int n_params, n_trained; /* all parameters; those trained (the rest frozen or without effect) */
  float *w, *g;            /* parameters and gradient, one flat vector (lab_models.c lays it out) */
  double *m, *v;           /* Adam's moments */
  unsigned char *trained;  /* per parameter: 1 = Adam moves it */
  long t;                  /* Adam steps taken */
} model;

/* The first step's gradients against fp64: dQ, dK, dV from clattn_backward
 * against tools/reference/reference_backward.c, and the projections' gradients from
 * CLBlast against Xᵀ times those fp64 gradients (relative Frobenius errors). */
typedef struct {
  double attention, projection;
} grad_check;

/* Returns 0, or -1 with a message in err. */
int lab_device_open(lab_device **out, char *err, size_t errlen);
void lab_device_close(lab_device *d);
const char *lab_device_name(const lab_device *d);

/* A model with random starting parameters from seed. Returns 0, or -1 out of memory. */
int model_init(model *m, model_kind kind, uint64_t seed);
void model_free(model *m);

/* One Adam step (learning rate lr) on the batch (at most CHUNK sequences);
 * *loss: its mean cross-entropy before the step. check non-NULL (attention
 * models only): also the gradient check. Returns 0, or -1 with a message in err. */
int model_step(model *m, lab_device *d, const task_set *batch, double lr, double *loss, grad_check *check, char *err,
               size_t errlen);

/* The route of the attention models' read over a set (clattn's route
 * diagnostics argmax and max_weight). */
typedef struct {
  double to_key;     /* the fraction of sequences whose top-weighted key is the query's
                        matching key, wherever the intervention moved it (0 when removed) */
  double max_weight; /* the top key's weight, mean over sequences */
} route_summary;

/* Accuracy on s under the intervention (INTV_NONE for any model; the
 * others for the attention models), shuffles drawn from seed; route
 * (non-NULL, attention models): the route. Returns 0, or -1 with a message
 * in err. */
int model_accuracy(const model *m, lab_device *d, const task_set *s, intervention intv, uint64_t seed, double *acc,
                   route_summary *route, char *err, size_t errlen);

#endif
