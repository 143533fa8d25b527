/*
 * `clattn tune`: times candidate tile values on the chosen device and writes
 * a tuning file (format in src/tuning.h) that clattn_create then loads.
 *
 * Each candidate is a whole configuration written to a scratch tuning file
 * (clattn_tuning_write) and loaded by a fresh clattn context embedded in one
 * shared OpenCL context, so the library's own loading path is what gets
 * measured. Only the public API (clattn.h's clattn_tuning_*) is used. Groups of values
 * are tuned one after another, each with the winners so far (coordinate
 * descent):
 *
 *   fused:       flash_wg = 0 with flash_bm 2..16, and flash_wg 32..128,
 *                timed on a prefill and a decode shape (time relative to
 *                the start)
 *   flash_block: flash_block's tile block_rm x block_rn (4x4 .. 1x1; each
 *                stepped down per head dim where it does not fit) on
 *                prefills at d = 64 and d = 128, where flash_block runs
 *                (GPUs with the work-group kernels, or CLATTN_FLASH_WG)
 *   flash_tiled: flash_tiled's keys per K/V tile (flash_tile 8 .. 64; each
 *                halved per head dim where it does not fit) on a prefill
 *                with additive scoring, which flash_tiled computes where
 *                the work-group kernels run
 *   staged:      qk_score tiles, head-dim chunk, softmax width, mix tiles,
 *                key chunk, on a staged prefill shape
 *   gemm:        the scratch budget (query rows per chunk), on a GEMM prefill
 *   auto:        per shape class (prefill, decode, weights), the fastest path
 *
 * --only GROUP tunes that group alone, starting from the values (and AUTO's
 * choices) of the file it will overwrite where that file applies to this
 * device, so the other groups' tuning stays; --tiny shrinks the workloads
 * and timing to a smoke run.
 *
 * Every candidate's output is compared with the starting configuration's,
 * which is first checked against the fp64 reference: a candidate that
 * disagrees is discarded. A candidate the device cannot run (the context
 * rejects the file) is skipped.
 */
#include "tune.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli_args.h"
#include "problem.h"

const char tune_usage[] = "       clattn tune [--quick | --tiny] [--only GROUP] [--output FILE] [--reps R]\n";

static const char tune_help[] =
    "usage: clattn tune [--quick | --tiny] [--only GROUP] [--output FILE] [--reps R]\n"
    "\n"
    "Times candidate tile values and AUTO's choice per shape class on the chosen device\n"
    "(coordinate descent; every candidate's output checked against the defaults', which\n"
    "are checked against fp64) and writes a tuning file that clattn_create loads.\n"
    "\n"
    "  --quick          smaller workloads: a shorter run, a rougher result\n"
    "  --tiny           tiny workloads, one timed call each: a smoke run, not a tuning\n"
    "  --only GROUP     tune one group: fused, flash_block, flash_tiled, staged, gemm or\n"
    "                   auto (the other values and AUTO's choices kept from the file\n"
    "                   it overwrites, when that file is for this device)\n"
    "  --output FILE    where to write it (default: this device's file in the cache\n"
    "                   directory, where clattn_create looks for it)\n"
    "  --reps R         timed calls per candidate, a positive integer (default 3)\n"
    "  -h, --help       this help\n";

/* The groups --only names. */
static const char *const group_ids[] = {"fused", "flash_block", "flash_tiled", "staged", "gemm", "auto"};
enum { G_FUSED, G_BLOCK, G_TILED, G_STAGED, G_GEMM, G_AUTO, G_COUNT };

typedef struct {
  int quick, tiny, reps, only; /* only: a G_ value, -1 = every group */
  const char *output;
} tune_args;

static int on_tune_option(int code, const char *arg, void *ctx) {
  tune_args *a = ctx;
  switch (code) {
    case 'q': a->quick = 1; return 0;
    case 't': a->tiny = 1; return 0;
    case 'g': return cli_choice("tune", "only", arg, group_ids, G_COUNT, &a->only);
    case 'o': a->output = arg; return 0;
    case 'r': return cli_int("tune", "reps", arg, 1, 1000000, &a->reps);
  }
  return -1;
}

enum { W_PREFILL, W_DECODE, W_STAGED, W_GEMM, W_WEIGHTS, W_PREFILL128, W_ADDITIVE, W_COUNT };

/* AUTO's shape classes as a tuning file names them. */
enum { C_PREFILL, C_DECODE, C_WEIGHTS, C_COUNT };
static const char *const class_keys[C_COUNT] = {"auto_prefill", "auto_decode", "auto_weights"};

/* A configuration: a value for each tunable (indexed as clattn_tuning_name
 * names them) and AUTO's path per shape class (AUTO = the built-in rule). */
enum { MAX_TUNABLES = 32 };
typedef struct {
  int n;
  long long value[MAX_TUNABLES];
  clattn_algo auto_algo[C_COUNT];
} config;

/* The index of tunable `name`; -1 when this library has none of that name. */
static int tunable_index(const char *name) {
  for (int i = 0; clattn_tuning_name(i); i++)
    if (!strcmp(clattn_tuning_name(i), name)) return i;
  return -1;
}

/* c as tuning-file lines, for clattn_tuning_write. */
static void config_text(const config *c, char *buf, size_t size) {
  size_t at = 0;
  buf[0] = '\0';
  for (int i = 0; i < c->n && at < size; i++)
    at += (size_t)snprintf(buf + at, size - at, "%s = %lld\n", clattn_tuning_name(i), c->value[i]);
  for (int k = 0; k < C_COUNT && at < size; k++)
    if (c->auto_algo[k] != CLATTN_ALGO_AUTO)
      at += (size_t)snprintf(buf + at, size - at, "%s = %s\n", class_keys[k], clattn_algo_name(c->auto_algo[k]));
}

typedef struct {
  clattn_context *base; /* untuned defaults; its OpenCL objects are shared */
  cp_problem *work[W_COUNT];
  float *expected[W_COUNT]; /* the starting configuration's output */
  config best;              /* the winners so far */
  char scratch_file[4096];
  int reps, trials, size, step, steps, tty; /* size: workload() */
  const char *what;
} tuner;

static void progress(tuner *t, const char *what) {
  t->step++;
  if (!t->tty) return;
  const int width = 30, done = t->steps ? t->step * width / t->steps : width;
  fprintf(stderr, "\r[%.*s%*s] %3d/%d %-44.44s", done, "##############################", width - done, "", t->step,
          t->steps, what);
  fflush(stderr);
}

/* size: 0 full, 1 --quick, 2 --tiny */
static cp_problem *workload(clattn_context *ctx, int which, int size, char *err, size_t n) {
  cp_shape s = cp_shape_default();
  const int big = size == 2 ? 128 : size ? 512 : 1024;
  s.q_heads = s.kv_heads = size == 2 ? 2 : 8;
  s.head_dim = s.value_dim = 64;
  s.q_len = s.kv_len = big;
  switch (which) {
    case W_DECODE:
      s.q_heads = size == 2 ? 8 : 32, s.kv_heads = size == 2 ? 2 : 8, s.q_len = 1;
      s.kv_len = size == 2 ? 512 : size ? 4096 : 8192;
      s.head_dim = s.value_dim = 128;
      break;
    case W_PREFILL128:
      s.q_len = s.kv_len = big / 2;
      s.head_dim = s.value_dim = 128;
      break;
    case W_STAGED: s.q_len = s.kv_len = big / 2; break;
    case W_GEMM: s.q_len = s.kv_len = big * 2; break;
    case W_WEIGHTS: s.q_len = s.kv_len = big / 2, s.want_weights = 1; break;
    case W_ADDITIVE: s.q_len = s.kv_len = big / 2, s.additive = 1; break;
  }
  s.algo = which == W_STAGED || which == W_WEIGHTS ? CLATTN_ALGO_STAGED
           : which == W_GEMM                       ? CLATTN_ALGO_GEMM
                                                   : CLATTN_ALGO_FUSED;
  s.seed = 77 + (uint64_t)which;
  cp_problem *pb = cp_build(&s, err, n);
  if (pb && cp_upload(pb, ctx) != 0) {
    snprintf(err, n, "%s", pb->err);
    cp_free(pb);
    pb = NULL;
  }
  return pb;
}

/* Workload w and the starting configuration's output of it, checked
 * against the fp64 reference, on first use (a group that is skipped builds
 * and runs none). 0, or -1 with the reason on stderr. */
static int prepare(tuner *t, int w) {
  char err[512];
  if (t->work[w]) return 0;
  t->work[w] = workload(t->base, w, t->size, err, sizeof err);
  if (!t->work[w]) return fprintf(stderr, "clattn tune: %s\n", err), -1;
  cp_result r;
  if (cp_run(t->work[w], t->base, &r) != 0) return fprintf(stderr, "clattn tune: %s\n", t->work[w]->err), -1;
  char line[512];
  if (!cp_result_ok(&r, 1e-5))
    return fprintf(stderr, "clattn tune: the defaults disagree with the reference: %s\n",
                   cp_result_format(&r, line, sizeof line)),
           -1;
  size_t bytes = t->work[w]->out_count * sizeof(float);
  t->expected[w] = malloc(bytes);
  if (!t->expected[w]) return fprintf(stderr, "clattn tune: out of memory\n"), -1;
  memcpy(t->expected[w], t->work[w]->out, bytes);
  return 0;
}

/* A context with configuration c, or NULL when the device cannot run it. */
static clattn_context *open_config(tuner *t, const config *c) {
  char text[2048];
  config_text(c, text, sizeof text);
  if (clattn_tuning_write(t->base, text, t->scratch_file) != CLATTN_OK) {
    fprintf(stderr, "\nclattn tune: %s\n", clattn_last_error(NULL));
    return NULL;
  }
  clattn_options o = {0};
  o.context = clattn_cl_context(t->base);
  o.device = clattn_cl_device(t->base);
  o.queue = clattn_cl_queue(t->base);
  o.tuning_file = t->scratch_file;
  clattn_context *ctx = NULL;
  if (clattn_create(&o, &ctx) != CLATTN_OK) return NULL;
  int applied = 0;
  clattn_tuning_note(ctx, &applied);
  if (!applied) { /* does not fit this device */
    clattn_destroy(ctx);
    return NULL;
  }
  return ctx;
}

/* Best of three means of t->reps calls of workload w with algo, in ms;
 * INFINITY when it fails or disagrees with the expected output. */
static double time_workload(tuner *t, clattn_context *ctx, int w, clattn_algo algo) {
  cp_problem *pb = t->work[w];
  pb->params.algo = algo;
  double best = INFINITY;
  for (int trial = 0; trial < t->trials; trial++) {
    double ms = 0;
    clattn_status st;
    if (cp_time_forward(pb, ctx, t->reps, &ms, &st) != 0 || st != CLATTN_OK) return INFINITY;
    if (ms < best) best = ms;
  }
  if (cp_read_outputs(pb) != 0) return INFINITY;
  for (size_t i = 0; i < pb->out_count; i++)
    if (!(fabsf(pb->out[i] - t->expected[w][i]) <= 1e-4f)) return INFINITY;
  return best;
}

/* Time of configuration c on the workloads in ws (relative to ref[] when
 * given, summed); INFINITY when it cannot run. */
static double score(tuner *t, const config *c, const int *ws, int nw, clattn_algo algo, const double *ref,
                    double *abs_ms) {
  clattn_context *ctx = open_config(t, c);
  if (!ctx) return INFINITY;
  double total = 0;
  for (int i = 0; i < nw; i++) {
    double ms = time_workload(t, ctx, ws[i], algo == CLATTN_ALGO_AUTO ? t->work[ws[i]]->shape.algo : algo);
    if (abs_ms) abs_ms[i] = ms;
    total += ref ? ms / ref[i] : ms;
  }
  clattn_destroy(ctx);
  return total;
}

typedef struct {
  int id; /* G_ */
  const char *name;
  const char *keys[2];
  int nkeys;
  int values[8][2];
  int nvalues;
  int workloads[2], nworkloads;
} group;

static const group groups[] = {
    {G_FUSED,
     "fused rows per work-item",
     {"flash_wg", "flash_bm"},
     2,
     {{0, 2}, {0, 4}, {0, 8}, {0, 16}, {32, 4}, {64, 4}, {128, 4}},
     7,
     {W_PREFILL, W_DECODE},
     2},
    /* 0 x 0 (chosen per head dim) is the start; each pair is stepped down
     * per head dim where it does not fit, so 4x4 is 2x4 at d = 128 on most
     * devices */
    {G_BLOCK,
     "flash_block tile",
     {"block_rm", "block_rn"},
     2,
     {{4, 4}, {2, 4}, {1, 4}, {1, 2}, {1, 1}},
     5,
     {W_PREFILL, W_PREFILL128},
     2},
    /* 0 (32 where it fits) is the start */
    {G_TILED, "flash_tiled keys per tile", {"flash_tile"}, 1, {{8}, {16}, {32}, {64}}, 4, {W_ADDITIVE}, 1},
    {G_STAGED, "qk_score tile", {"score_tm", "score_tn"}, 2, {{4, 16}, {8, 16}, {16, 16}, {8, 32}}, 4, {W_STAGED}, 1},
    {G_STAGED, "qk_score head-dim chunk", {"score_tk"}, 1, {{16}, {32}, {64}}, 3, {W_STAGED}, 1},
    {G_STAGED, "softmax width", {"softmax_wg"}, 1, {{16}, {64}, {256}}, 3, {W_STAGED}, 1},
    {G_STAGED, "mix tile", {"mix_tm", "mix_tv"}, 2, {{8, 16}, {16, 16}, {32, 8}, {4, 32}}, 4, {W_STAGED}, 1},
    {G_STAGED, "mix key chunk", {"mix_tj"}, 1, {{16}, {32}, {64}}, 3, {W_STAGED}, 1},
    {G_GEMM, "gemm scratch MiB", {"scratch_bytes"}, 1, {{16}, {64}, {256}}, 3, {W_GEMM}, 1},
};
#define N_GROUPS (sizeof groups / sizeof groups[0])

static long long group_value(const group *g, int v, int k) {
  long long x = g->values[v][k];
  return !strcmp(g->keys[k], "scratch_bytes") ? x << 20 : x;
}

/* Whether group g's kernel runs with the best values so far: flash_block
 * and flash_tiled are work-group kernels (flash_wg > 0, on GPUs or by
 * CLATTN_FLASH_WG), flash_block also not turned off by
 * CLATTN_FLASH_BLOCK=0, as the context describes it. */
static int group_runs(tuner *t, const group *g) {
  if (g->id != G_BLOCK && g->id != G_TILED) return 1;
  clattn_context *ctx = open_config(t, &t->best);
  long long wg = 0;
  const int runs = ctx && clattn_tuning_get(ctx, "flash_wg", &wg, NULL) == CLATTN_OK && wg > 0 &&
                   (g->id == G_TILED || strstr(clattn_describe(ctx), "flash_block tile per head dim") != NULL);
  clattn_destroy(ctx);
  return runs;
}

/* Tunes one group: every candidate with the others at their best so far.
 * 0, or -1 when a workload cannot be prepared. */
static int tune_group(tuner *t, const group *g, FILE *log) {
  if (!group_runs(t, g)) {
    t->step += g->nvalues;
    fprintf(log,
            "%s: skipped (%s does not run here: CPUs run flash_rows unless CLATTN_FLASH_WG forces the "
            "work-group kernels)\n",
            g->name, group_ids[g->id]);
    return 0;
  }
  for (int w = 0; w < g->nworkloads; w++)
    if (prepare(t, g->workloads[w]) != 0) return -1;
  double ref[2] = {1, 1}, ms[2];
  double start = score(t, &t->best, g->workloads, g->nworkloads, CLATTN_ALGO_AUTO, NULL, ref);
  double best_score = start < INFINITY ? (double)g->nworkloads : INFINITY;
  int best_v = -1;
  fprintf(log, "%s:", g->name);
  for (int v = 0; v < g->nvalues; v++) {
    config c = t->best;
    char label[96];
    int at = snprintf(label, sizeof label, "%s", g->name);
    for (int k = 0; k < g->nkeys; k++) {
      c.value[tunable_index(g->keys[k])] = group_value(g, v, k);
      at += snprintf(label + at, sizeof label - (size_t)at, " %d", g->values[v][k]);
    }
    progress(t, label);
    double s = score(t, &c, g->workloads, g->nworkloads, CLATTN_ALGO_AUTO, start < INFINITY ? ref : NULL, ms);
    fprintf(log, " [%s]", label + strlen(g->name) + 1);
    if (s < INFINITY)
      fprintf(log, " %.3f", s / g->nworkloads);
    else
      fprintf(log, " -");
    if (s < best_score * 0.98) best_score = s, best_v = v; /* a 2% margin against noise */
  }
  if (best_v >= 0)
    for (int k = 0; k < g->nkeys; k++) t->best.value[tunable_index(g->keys[k])] = group_value(g, best_v, k);
  fprintf(log, "  (time relative to the start; kept %s)\n", best_v >= 0 ? "the best" : "the start");
  return 0;
}

/* AUTO per shape class: the fastest path on the class's workload. 0, or -1
 * when a workload cannot be prepared. */
static int tune_auto(tuner *t, FILE *log) {
  if (prepare(t, W_PREFILL) || prepare(t, W_DECODE) || prepare(t, W_WEIGHTS)) return -1;
  static const struct {
    int cls;
    int w;
  } classes[] = {{C_PREFILL, W_PREFILL}, {C_DECODE, W_DECODE}, {C_WEIGHTS, W_WEIGHTS}};
  static const clattn_algo algos[] = {CLATTN_ALGO_FUSED, CLATTN_ALGO_STAGED, CLATTN_ALGO_GEMM};
  for (size_t i = 0; i < 3; i++) {
    double best = INFINITY;
    const char *cls = class_keys[classes[i].cls] + 5; /* "prefill", ... */
    fprintf(log, "AUTO for %s:", cls);
    for (size_t a = 0; a < 3; a++) {
      if (classes[i].cls == C_WEIGHTS && algos[a] == CLATTN_ALGO_FUSED) continue;
      char label[64];
      snprintf(label, sizeof label, "AUTO %s: %s", cls, clattn_algo_name(algos[a]));
      progress(t, label);
      int w = classes[i].w;
      double ms = score(t, &t->best, &w, 1, algos[a], NULL, NULL);
      fprintf(log, " %s %.2f ms", clattn_algo_name(algos[a]), ms);
      if (ms < best) best = ms, t->best.auto_algo[classes[i].cls] = algos[a];
    }
    fprintf(log, "  -> %s\n", clattn_algo_name(t->best.auto_algo[classes[i].cls]));
  }
  return 0;
}

/* --only: the values and AUTO's choices of the file at path where it
 * applies to this device (a context that loads it says so), as the start;
 * AUTO's choices are read from its lines (the public API gives values, not
 * choices). Nothing changes when there is no such file. */
static void start_from_file(tuner *t, const char *path) {
  if (access(path, F_OK) != 0) return;
  clattn_options o = {0};
  o.context = clattn_cl_context(t->base);
  o.device = clattn_cl_device(t->base);
  o.queue = clattn_cl_queue(t->base);
  o.tuning_file = path;
  clattn_context *ctx = NULL;
  int applied = 0;
  if (clattn_create(&o, &ctx) != CLATTN_OK) return;
  clattn_tuning_note(ctx, &applied);
  if (applied) {
    for (int k = 0; k < t->best.n; k++) clattn_tuning_get(ctx, clattn_tuning_name(k), &t->best.value[k], NULL);
    FILE *f = fopen(path, "r");
    char line[1100], key[64], value[64];
    while (f && fgets(line, sizeof line, f))
      if (sscanf(line, " %63[a-z_] = %63[a-z]", key, value) == 2)
        for (int c = 0; c < C_COUNT; c++)
          if (!strcmp(key, class_keys[c]))
            for (clattn_algo a = CLATTN_ALGO_STAGED; a <= CLATTN_ALGO_GEMM; a++)
              if (!strcmp(value, clattn_algo_name(a))) t->best.auto_algo[c] = a;
    if (f) fclose(f);
    printf("starting from %s (the groups other than the one tuned keep its values)\n", path);
  }
  clattn_destroy(ctx);
}

int tune_main(int argc, char **argv) {
  static const struct option opts[] = {{"quick", no_argument, NULL, 'q'},
                                       {"tiny", no_argument, NULL, 't'},
                                       {"only", required_argument, NULL, 'g'},
                                       {"output", required_argument, NULL, 'o'},
                                       {"reps", required_argument, NULL, 'r'},
                                       {"help", no_argument, NULL, 'h'},
                                       {NULL, 0, NULL, 0}};
  tune_args args = {0, 0, 0, -1, NULL};
  const int parsed = cli_parse("tune", argc - 1, argv + 1, opts, tune_help, on_tune_option, &args);
  if (parsed != 0) return parsed > 0 ? 0 : 2;
  const char *output = args.output;
  tuner t;
  memset(&t, 0, sizeof t);
  /* --tiny: one timed call per candidate unless --reps says otherwise */
  t.reps = args.reps ? args.reps : args.tiny ? 1 : 3;
  t.trials = args.tiny ? 1 : 3;
  clattn_options none = {0};
  none.tuning_file = ""; /* start from the defaults */
  if (clattn_create(&none, &t.base) != CLATTN_OK) {
    fprintf(stderr, "clattn tune: cannot create a context: %s\n", clattn_last_error(NULL));
    return 1;
  }
  const char *where = output ? output : clattn_tuning_default_path(t.base);
  char *path = where ? strdup(where) : NULL;
  int rc = 1;
  if (!path) {
    fprintf(stderr, "clattn tune: no cache directory; give --output FILE\n");
    goto done;
  }
  snprintf(t.scratch_file, sizeof t.scratch_file, "%s.candidate", path);
  for (int k = 0; clattn_tuning_name(k) && k < MAX_TUNABLES; k++, t.best.n++)
    clattn_tuning_get(t.base, clattn_tuning_name(k), &t.best.value[k], NULL);
  for (size_t g = 0; g < N_GROUPS; g++)
    for (int k = 0; k < groups[g].nkeys; k++)
      if (tunable_index(groups[g].keys[k]) < 0) {
        fprintf(stderr, "clattn tune: this library has no tunable '%s'\n", groups[g].keys[k]);
        goto done;
      }
  char device[256] = "?", platform[256] = "?";
  cl_platform_id pid = NULL;
  clGetDeviceInfo(clattn_cl_device(t.base), CL_DEVICE_NAME, sizeof device, device, NULL);
  clGetDeviceInfo(clattn_cl_device(t.base), CL_DEVICE_PLATFORM, sizeof pid, &pid, NULL);
  if (pid) clGetPlatformInfo(pid, CL_PLATFORM_NAME, sizeof platform, platform, NULL);
  printf("clattn tune on %s (%s)%s%s%s\n", device, platform, args.only >= 0 ? ", only " : "",
         args.only >= 0 ? group_ids[args.only] : "", args.tiny ? ", tiny (a smoke run, not a tuning)" : "");
  if (args.only >= 0) start_from_file(&t, path);
  const int tune_autos = args.only < 0 || args.only == G_AUTO;
  for (size_t g = 0; g < N_GROUPS; g++)
    if (args.only < 0 || groups[g].id == args.only) t.steps += groups[g].nvalues;
  if (tune_autos) t.steps += 3 + 3 + 2;
  t.size = args.tiny ? 2 : args.quick ? 1 : 0;
  t.tty = isatty(2);
  for (size_t g = 0; g < N_GROUPS; g++)
    if ((args.only < 0 || groups[g].id == args.only) && tune_group(&t, &groups[g], stdout) != 0) goto done;
  if (tune_autos && tune_auto(&t, stdout) != 0) goto done;
  if (t.tty) fprintf(stderr, "\n");
  char text[2048];
  config_text(&t.best, text, sizeof text);
  if (clattn_tuning_write(t.base, text, path) != CLATTN_OK) {
    fprintf(stderr, "clattn tune: %s\n", clattn_last_error(NULL));
    goto done;
  }
  printf("wrote %s\n", path);
  rc = 0;
done:
  if (t.scratch_file[0]) unlink(t.scratch_file);
  free(path);
  for (int w = 0; w < W_COUNT; w++) cp_free(t.work[w]), free(t.expected[w]);
  clattn_destroy(t.base);
  return rc;
}
