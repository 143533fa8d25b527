/*
 * `clattn lab --train`: the seeds' training experiment on the device (seed
 * 000, "how to extend the experiment"). The task (lab_task.h): find the value
 * whose key matches the query token among distractor pairs. Four models with
 * one readout (lab_models.h) — learned Q/K/V projections with attention, the
 * same with uniform pooling (scale 0), with a fixed random routing (Wq, Wk
 * frozen), and a matched-parameter MLP over mean-pooled tokens — each trained
 * by Adam from the same seeds on the same batches, and tested on held-out
 * sequences. Then the lab's interventions on the trained attention model:
 * paired permutation (no change expected), key shuffle, value shuffle and
 * ablation of the matching key (each should break the answer).
 *
 * Asserted: the first step's gradients agree with fp64 (clattn_backward's
 * dQ, dK, dV and the CLBlast projections' gradients); attention's mean test
 * accuracy at least MIN_ACC and MARGIN above the uniform and MLP baselines';
 * the paired permutation changes accuracy by at most PAIRED_TOL, the other
 * interventions drop it by at least MARGIN; and, but for the ablation, the
 * top-weighted key is the query's matching key wherever the intervention
 * moved it (in at least MIN_ACC of the test sequences, every seed): the
 * route follows the key's content, not its position.
 */
#include "lab_train.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "lab_models.h"
#include "lab_task.h"
#include "lineplot.h"

#define GRAD_TOL   1e-4 /* relative error of the first step's gradients against fp64 */
#define MIN_ACC    0.8  /* attention's mean test accuracy, at least; also how often its route finds the key */
#define MARGIN     0.3  /* attention over uniform pooling and the MLP; the breaking interventions' drop */
#define PAIRED_TOL 0.01 /* the paired permutation's change of accuracy, at most */

enum { TEST_N = 512, MAX_SEEDS = 20, MAX_STEPS = 5000, MAX_POINTS = 64, TASK_SEED = 2026 };

typedef struct {
  int seeds, steps, every;
  double lr;
  uint64_t seed;
  const char *plot;
} train_opts;

typedef struct {
  double acc[MAX_SEEDS];                      /* final test accuracy per seed */
  double curve[MAX_POINTS];                   /* test accuracy at each evaluation, mean over seeds */
  double intv[INTV_KINDS][MAX_SEEDS];         /* attention only: accuracy under each intervention */
  route_summary route[INTV_KINDS][MAX_SEEDS]; /* attention only: the route under each intervention */
  int n_params, n_trained;
} model_result;

static double mean_of(const double *x, int n) {
  double s = 0.0;
  for (int i = 0; i < n; i++) s += x[i];
  return s / n;
}

static double sd_of(const double *x, int n) { /* sample standard deviation; 0 for one value */
  if (n < 2) return 0.0;
  const double mu = mean_of(x, n);
  double s = 0.0;
  for (int i = 0; i < n; i++) s += (x[i] - mu) * (x[i] - mu);
  return sqrt(s / (n - 1));
}

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Trains one model kind from every seed, filling r. Returns 0, or -1 with a message in err. */
static int train_kind(model_kind kind, const train_opts *o, lab_device *d, const task_embedding *emb,
                      const task_set *test, task_set *batch, model_result *r, grad_check *check, char *err,
                      size_t errlen) {
  for (int s = 0; s < o->seeds; s++) {
    model m;
    if (model_init(&m, kind, o->seed + (uint64_t)s)) return snprintf(err, errlen, "out of host memory"), -1;
    r->n_params = m.n_params, r->n_trained = m.n_trained;
    uint64_t data = (o->seed + (uint64_t)s) * 0xD1B54A32D192ED03ull + 1; /* the same batches for every kind */
    int rc = 0;
    for (int step = 0, pt = 0; step <= o->steps && !rc; step++) {
      if (step % o->every == 0 || step == o->steps) {
        double acc = 0.0;
        rc = model_accuracy(&m, d, test, INTV_NONE, 0, &acc, NULL, err, errlen);
        r->curve[pt++] += acc / o->seeds;
        if (step == o->steps) r->acc[s] = acc;
      }
      if (step == o->steps || rc) break;
      double loss = 0.0;
      task_set_draw(batch, emb, &data);
      rc = model_step(&m, d, batch, o->lr, &loss, kind == MODEL_ATTENTION && s == 0 && step == 0 ? check : NULL, err,
                      errlen);
    }
    for (int v = 0; v < INTV_KINDS && !rc && kind == MODEL_ATTENTION; v++)
      rc = model_accuracy(&m, d, test, (intervention)v, 99 + (uint64_t)s, &r->intv[v][s], &r->route[v][s], err, errlen);
    model_free(&m);
    if (rc) return -1;
  }
  return 0;
}

static int write_plot(const train_opts *o, const model_result *res, char *err, size_t errlen) {
  double x[MAX_POINTS];
  int n = 0;
  for (int step = 0; step <= o->steps; step++)
    if (step % o->every == 0 || step == o->steps) x[n++] = step;
  lineplot_series series[MODEL_KINDS];
  for (int k = 0; k < MODEL_KINDS; k++) series[k] = (lineplot_series){model_name[k], res[k].curve};
  char caption[256];
  snprintf(caption, sizeof caption,
           "Test accuracy on %d held-out sequences (%d pairs + query, %d classes), mean over %d seed%s. "
           "Chance: 1/%d.",
           TEST_N, TASK_PAIRS, TASK_CLASSES, o->seeds, o->seeds == 1 ? "" : "s", TASK_CLASSES);
  const lineplot p = {.title = "clattn lab --train: key-value lookup among distractors",
                      .x_label = "training step",
                      .y_label = "test accuracy",
                      .caption = caption,
                      .n_points = n,
                      .x = x,
                      .n_series = MODEL_KINDS,
                      .series = series,
                      .y_min = 0.0,
                      .y_max = 1.0};
  return lineplot_write_png(&p, o->plot, err, errlen);
}

static int parse(int argc, char **argv, train_opts *o) {
  *o = (train_opts){.seeds = 5, .steps = 200, .every = 20, .lr = 0.01, .seed = 1};
  int quick = 0, seeds_set = 0, steps_set = 0;
  for (int i = 2; i < argc; i++) {
    const char *a = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
    char *end = NULL;
    if (!strcmp(a, "--train")) continue;
    if (!strcmp(a, "--quick"))
      quick = 1;
    else if (!strcmp(a, "--seeds") && val && (o->seeds = (int)strtol(val, &end, 10), !*end) && o->seeds >= 1 &&
             o->seeds <= MAX_SEEDS)
      seeds_set = 1, i++;
    else if (!strcmp(a, "--steps") && val && (o->steps = (int)strtol(val, &end, 10), !*end) && o->steps >= 1 &&
             o->steps <= MAX_STEPS)
      steps_set = 1, i++;
    else if (!strcmp(a, "--lr") && val && (o->lr = strtod(val, &end), !*end) && o->lr > 0 && o->lr < 1)
      i++;
    else if (!strcmp(a, "--seed") && val && val[0] != '-' && (o->seed = strtoull(val, &end, 10), !*end))
      i++;
    else if (!strcmp(a, "--plot") && val)
      o->plot = val, i++;
    else if (!strcmp(a, "-h") || !strcmp(a, "--help"))
      return printf("usage:\n%s%s", lab_train_usage, lab_train_help), 0;
    else {
      fprintf(stderr, "clattn lab --train: bad option or value: %s\nusage:\n%s", a, lab_train_usage);
      return 2;
    }
  }
  if (quick) {
    if (!seeds_set) o->seeds = 2;
    if (!steps_set) o->steps = 120;
  }
  o->every = o->steps / 15 > 1 ? o->steps / 15 : 1; /* about 16 points on the curve */
  return -1;
}

int lab_train_main(int argc, char **argv) {
  train_opts o;
  const int usage = parse(argc, argv, &o);
  if (usage >= 0) return usage;
  char err[512] = "";
  lab_device *d = NULL;
  if (lab_device_open(&d, err, sizeof err)) return fprintf(stderr, "clattn lab --train: %s\n", err), 1;
  const double t0 = now();
  task_embedding emb;
  task_embedding_init(&emb, TASK_SEED);
  task_set test = {0}, batch = {0};
  model_result *res = calloc(MODEL_KINDS, sizeof *res);
  int rc = 0;
  if (!res || task_set_alloc(&test, TEST_N) || task_set_alloc(&batch, CHUNK)) {
    fprintf(stderr, "clattn lab --train: out of host memory\n");
    rc = 1;
    goto done;
  }
  uint64_t test_rng = TASK_SEED + 1;
  task_set_draw(&test, &emb, &test_rng);
  printf("clattn lab --train on %s: key-value lookup among distractors\n", lab_device_name(d));
  printf(
      "task: %d key-value pairs + 1 query token (d %d), %d key symbols, %d classes (chance %.3f); "
      "%d held-out test sequences\n",
      TASK_PAIRS, TASK_D, TASK_KEYS, TASK_CLASSES, 1.0 / TASK_CLASSES, TEST_N);
  printf("training: Adam lr %g, batch %d, %d steps, seeds %llu..%llu\n\n", o.lr, CHUNK, o.steps,
         (unsigned long long)o.seed, (unsigned long long)(o.seed + (uint64_t)o.seeds - 1));
  grad_check check = {NAN, NAN};
  for (int k = 0; k < MODEL_KINDS && !rc; k++)
    rc = train_kind((model_kind)k, &o, d, &emb, &test, &batch, &res[k], &check, err, sizeof err);
  if (rc) {
    fprintf(stderr, "clattn lab --train: %s\n", err);
    goto done;
  }
  printf("%-22s %8s %8s   %s\n", "model", "params", "trained", "test accuracy, mean ± sd over seeds");
  for (int k = 0; k < MODEL_KINDS; k++)
    printf("%-22s %8d %8d   %.3f ± %.3f\n", model_name[k], res[k].n_params, res[k].n_trained,
           mean_of(res[k].acc, o.seeds), sd_of(res[k].acc, o.seeds));
  const model_result *a = &res[MODEL_ATTENTION];
  const double acc = mean_of(a->acc, o.seeds);
  printf("without binding keys to values (uniform pooling, the MLP) at most %.3f: each sequence's commonest value\n",
         test.bag_ceiling);
  printf("\ninterventions on the trained attention model (means over seeds; route: clattn's argmax and max_weight)\n");
  printf("  %-30s %15s   %s   %s\n", "", "test accuracy", "top key = the matching key", "top weight");
  for (int v = 0; v < INTV_KINDS; v++) {
    double to_key[MAX_SEEDS], weight[MAX_SEEDS];
    for (int s = 0; s < o.seeds; s++) to_key[s] = a->route[v][s].to_key, weight[s] = a->route[v][s].max_weight;
    printf("  %-30s %.3f ± %.3f   %26.3f   %10.3f\n", v == INTV_NONE ? "none (as trained)" : intervention_name[v],
           mean_of(a->intv[v], o.seeds), sd_of(a->intv[v], o.seeds), mean_of(to_key, o.seeds),
           mean_of(weight, o.seeds));
  }

  const int grad_ok = check.attention <= GRAD_TOL && check.projection <= GRAD_TOL;
  const double uni = mean_of(res[MODEL_UNIFORM].acc, o.seeds), mlp = mean_of(res[MODEL_MLP].acc, o.seeds);
  const int beats = acc >= MIN_ACC && acc - uni >= MARGIN && acc - mlp >= MARGIN;
  int intv_ok = fabs(mean_of(a->intv[INTV_PAIRED], o.seeds) - mean_of(a->intv[INTV_NONE], o.seeds)) <= PAIRED_TOL;
  for (int v = INTV_KEY_SHUFFLE; v < INTV_KINDS; v++) intv_ok &= acc - mean_of(a->intv[v], o.seeds) >= MARGIN;
  for (int v = INTV_NONE; v < INTV_ABLATE; v++) /* the route follows the matching key wherever it is */
    for (int s = 0; s < o.seeds; s++) intv_ok &= a->route[v][s].to_key >= MIN_ACC;
  printf("\nfirst step's gradients vs fp64: dQ dK dV (clattn_backward) %.2e, dWq dWk dWv (CLBlast) %.2e (%s: <= %g)\n",
         check.attention, check.projection, grad_ok ? "ok" : "FAIL", GRAD_TOL);
  printf("attention %.3f vs uniform %.3f and MLP %.3f (%s: at least %.1f, and %.1f above both)\n", acc, uni, mlp,
         beats ? "ok" : "FAIL", MIN_ACC, MARGIN);
  printf(
      "interventions (%s: paired permutation within %.2f, key shuffle, value shuffle, ablation %.1f below; "
      "the top key the matching one, wherever moved, in at least %.1f)\n",
      intv_ok ? "ok" : "FAIL", PAIRED_TOL, MARGIN, MIN_ACC);
  rc = grad_ok && beats && intv_ok ? 0 : 1;
  if (o.plot) {
    if (write_plot(&o, res, err, sizeof err))
      fprintf(stderr, "clattn lab --train: %s\n", err), rc = 1;
    else
      printf("learning curves: %s\n", o.plot);
  }
  printf("time: %.1f s\n", now() - t0);
done:
  task_set_free(&test);
  task_set_free(&batch);
  free(res);
  lab_device_close(d);
  return rc;
}

const char lab_train_usage[] =
    "       clattn lab --train [--quick] [--seeds N] [--steps S] [--lr LR] [--seed S]\n"
    "                          [--plot FILE.png]\n";

const char lab_train_help[] =
    "  The seeds' training experiment: a key-value lookup among distractors learned by attention with\n"
    "  learned Q/K/V projections (CLBlast GEMMs, clattn_forward/backward) and by three baselines trained\n"
    "  the same way (uniform pooling, fixed random routing, a matched-parameter MLP over mean-pooled\n"
    "  tokens); test accuracy mean +- sd over seeds, then key shuffle, value shuffle and ablation on the\n"
    "  trained attention model. Exit 1 unless the assertions hold.\n"
    "  --seeds N     seeds S .. S+N-1 (default 5)        --seed S   the first seed (default 1)\n"
    "  --steps S     training steps (default 200)        --lr LR    Adam's learning rate (default 0.01)\n"
    "  --quick       2 seeds, 120 steps (the test suite's form; --seeds, --steps still override)\n"
    "  --plot FILE   learning curves (test accuracy vs step, mean over seeds, one line per model) as PNG\n";
