/*
 * `clattn run` (run.h): options, the verified run and its report, the heat
 * map of one head, and .npy inputs and outputs.
 *
 * With --q, --k and --v the problem is read from .npy files instead of
 * drawn at random: the shape comes from them, a mask or bias file may
 * broadcast (NumPy's rule), and the result is written with --out (and
 * --lse), verified against the fp64 reference like a random problem.
 */
#include "run.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_args.h"
#include "heatmap.h"
#include "npy.h"
#include "reference.h"
#include "run_cache.h"
#include "run_modifier.h"

const char run_usage[] =
    "       clattn run [--q-len M] [--kv-len N] [--heads H] ... | [--q Q.npy --k K.npy --v V.npy --out O.npy]\n";

static const char run_help[] =
    "usage: clattn run [options]\n"
    "\n"
    "Runs one attention problem on the device, checks it against the fp64 host\n"
    "reference and prints what ran (storage type, the algorithm AUTO resolved to,\n"
    "its kernels), the device memory it used, the error and the time. The inputs\n"
    "are random (seeded) unless --q, --k and --v give .npy files.\n"
    "\n"
    "shape (random inputs; with --q the files give it):\n"
    "  --batch B            batch size, a positive integer (default 1)\n"
    "  --heads H            query heads, a positive integer (default 4)\n"
    "  --kv-heads HKV       key/value heads, a positive integer dividing H (default 4)\n"
    "  --q-len M            queries per head, a positive integer (default 256)\n"
    "  --kv-len N           keys per head, a positive integer (default 256)\n"
    "  --head-dim DK        query/key width, a positive integer (default 64)\n"
    "  --value-dim DV       value width, a positive integer (default 64)\n"
    "  --dtype f32|f16|bf16 storage of q, k, v and out; arithmetic is f32\n"
    "                       (default f32, or f16 for '<f2' files)\n"
    "  --layout bhsd|bshd   element order of q, k, v and out (default bhsd)\n"
    "  --varlen             packed variable-length sequences of random lengths\n"
    "  --seed S             random seed, a non-negative integer (default 1)\n"
    "\n"
    "which keys each query may read:\n"
    "  --causal             no key after the query's (bottom-right aligned) position\n"
    "  --window L,R         keys at most L before and R after that position; two\n"
    "                       integers >= -1, -1 unbounded (e.g. --window 128,0)\n"
    "  --kv-lens            random valid key counts per batch row (padding)\n"
    "  --mask random|block|none|FILE.npy\n"
    "                       a random or block-diagonal mask, none, or one read from\n"
    "                       a '|u1'/'|b1' file broadcastable to [B,H,M,N]\n"
    "  --empty zero|error   a query with no allowed key: zero output, or an error\n"
    "\n"
    "scores:\n"
    "  --scale S            score scale, a finite number (default 1/sqrt(DK); 0 = uniform)\n"
    "  --bias [FILE.npy]    an additive score bias: random, or read from a '<f4'/'<f2'\n"
    "                       file broadcastable to [B,H,M,N]\n"
    "  --softcap C          C * tanh(s / C) on the scores; a finite number >= 0, 0 = off\n"
    "  --alibi              ALiBi slopes         --sinks      a random sink logit per head\n"
    "  --additive           additive (tanh) scores instead of dot products\n"
    "\n"
    "outputs and algorithm:\n"
    "  --algo auto|staged|fused|gemm   the path (default auto: the library decides)\n"
    "  --lse [FILE.npy]     also the log-sum-exp of each row; with a .npy name, written\n"
    "                       there as '<f4' [B,H,M]\n"
    "  --weights            also the routing matrix (needs staged or gemm)\n"
    "  --diag               also the route diagnostics (entropy, max weight, argmax)\n"
    "  --heatmap FILE.png   draw batch 0, head 0's routing matrix (implies --weights);\n"
    "                       disallowed cells are hatched\n"
    "\n"
    "K/V cache (as an inference engine keeps it; written by clattn_kv_append, and the\n"
    "reference computed from the values read back, so the check stays exact):\n"
    "  --paged PAGE_SIZE    keys in pages of PAGE_SIZE (a positive integer) addressed by a\n"
    "                       block table, pages in reverse order; not with --varlen, --kv-lens\n"
    "  --kv-dtype f32|f16|bf16|q8_0|int8\n"
    "                       storage of k and v (default: like q); q8_0 needs head and value\n"
    "                       dims that are multiples of 32\n"
    "\n"
    ".npy files (NumPy's format, versions 1.0-3.0, C or Fortran order):\n"
    "  --q FILE.npy         queries, '<f4' or '<f2', shape [B, H, M, DK]\n"
    "  --k FILE.npy         keys, the same dtype, shape [B, HKV, N, DK]\n"
    "  --v FILE.npy         values, the same dtype, shape [B, HKV, N, DV]\n"
    "  --out FILE.npy       writes the output, '<f4' [B, H, M, DV]\n"
    "\n"
    "modifiers (attention you program: OpenCL C compiled into the kernels; the\n"
    "reference runs them too; examples/modifiers/ has examples):\n"
    "  --score-mod FILE.cl  defines float clattn_score_mod(float score, int b, int h,\n"
    "                       int q_idx, int kv_idx, const clattn_captures *cap)\n"
    "  --mask-mod FILE.cl   defines int clattn_mask_mod(int b, int h, int q_idx,\n"
    "                       int kv_idx, const clattn_captures *cap), nonzero = allowed\n"
    "  --capture FILE       FILE's bytes as a buffer, cap->buf[n] in order (at most 4)\n"
    "  --ints N[,N...]      cap->i[0..3]      --floats X[,X...]  cap->f[0..3]\n"
    "  --block-mask         class the mask modifier's 128 x 128 blocks first and skip\n"
    "                       the empty ones\n"
    "\n"
    "checking and timing:\n"
    "  --tol T              largest norm-wise relative error accepted, a number > 0\n"
    "                       (default 1e-5 for f32, 1e-3 for f16, 8e-3 for bf16 storage)\n"
    "  --reps R             timed calls after a warm-up, a non-negative integer (default 3)\n"
    "  --poison             NaN in every input element no allowed key reads\n"
    "  -h, --help           this help\n"
    "\n"
    "Exit status: 0 verified, 1 not verified or a failure, 2 bad options or input files.\n"
    "Example: clattn run --q q.npy --k k.npy --v v.npy --causal --out o.npy --lse lse.npy\n";

static const char *const DTYPE_NAMES[] = {"f32", "f16", "bf16"};             /* clattn_dtype order */
static const char *const ALGO_NAMES[] = {"auto", "staged", "fused", "gemm"}; /* clattn_algo order */
static const double DEFAULT_TOL[] = {1e-5, 1e-3, 8e-3}; /* per dtype: tests/test_precision.c's bounds */

enum {
  O_BATCH = 256,
  O_HEADS,
  O_KV_HEADS,
  O_Q_LEN,
  O_KV_LEN,
  O_HEAD_DIM,
  O_VALUE_DIM,
  O_DTYPE,
  O_LAYOUT,
  O_VARLEN,
  O_SEED,
  O_CAUSAL,
  O_WINDOW,
  O_KV_LENS,
  O_MASK,
  O_EMPTY,
  O_SCALE,
  O_BIAS,
  O_SOFTCAP,
  O_ALIBI,
  O_SINKS,
  O_ADDITIVE,
  O_ALGO,
  O_LSE,
  O_WEIGHTS,
  O_DIAG,
  O_HEATMAP,
  O_Q,
  O_K,
  O_V,
  O_OUT,
  O_TOL,
  O_REPS,
  O_POISON,
  O_PAGED,
  O_KV_DTYPE,
  O_SCORE_MOD,
  O_MASK_MOD,
  O_CAPTURE,
  O_INTS,
  O_FLOATS,
  O_BLOCK_MASK
};

static const struct option RUN_OPTS[] = {
    {"batch", required_argument, NULL, O_BATCH},
    {"heads", required_argument, NULL, O_HEADS},
    {"kv-heads", required_argument, NULL, O_KV_HEADS},
    {"q-len", required_argument, NULL, O_Q_LEN},
    {"kv-len", required_argument, NULL, O_KV_LEN},
    {"head-dim", required_argument, NULL, O_HEAD_DIM},
    {"value-dim", required_argument, NULL, O_VALUE_DIM},
    {"dtype", required_argument, NULL, O_DTYPE},
    {"layout", required_argument, NULL, O_LAYOUT},
    {"varlen", no_argument, NULL, O_VARLEN},
    {"seed", required_argument, NULL, O_SEED},
    {"causal", no_argument, NULL, O_CAUSAL},
    {"window", required_argument, NULL, O_WINDOW},
    {"kv-lens", no_argument, NULL, O_KV_LENS},
    {"mask", required_argument, NULL, O_MASK},
    {"empty", required_argument, NULL, O_EMPTY},
    {"scale", required_argument, NULL, O_SCALE},
    {"bias", optional_argument, NULL, O_BIAS},
    {"softcap", required_argument, NULL, O_SOFTCAP},
    {"alibi", no_argument, NULL, O_ALIBI},
    {"sinks", no_argument, NULL, O_SINKS},
    {"additive", no_argument, NULL, O_ADDITIVE},
    {"algo", required_argument, NULL, O_ALGO},
    {"lse", optional_argument, NULL, O_LSE},
    {"weights", no_argument, NULL, O_WEIGHTS},
    {"diag", no_argument, NULL, O_DIAG},
    {"heatmap", required_argument, NULL, O_HEATMAP},
    {"q", required_argument, NULL, O_Q},
    {"k", required_argument, NULL, O_K},
    {"v", required_argument, NULL, O_V},
    {"paged", required_argument, NULL, O_PAGED},
    {"kv-dtype", required_argument, NULL, O_KV_DTYPE},
    {"out", required_argument, NULL, O_OUT},
    {"tol", required_argument, NULL, O_TOL},
    {"reps", required_argument, NULL, O_REPS},
    {"poison", no_argument, NULL, O_POISON},
    {"score-mod", required_argument, NULL, O_SCORE_MOD},
    {"mask-mod", required_argument, NULL, O_MASK_MOD},
    {"capture", required_argument, NULL, O_CAPTURE},
    {"ints", required_argument, NULL, O_INTS},
    {"floats", required_argument, NULL, O_FLOATS},
    {"block-mask", no_argument, NULL, O_BLOCK_MASK},
    {"help", no_argument, NULL, 'h'},
    {NULL, 0, NULL, 0},
};

/* The .npy files of a run (NULL = not given). */
typedef struct {
  const char *q, *k, *v, *mask, *bias, *out, *lse;
} run_files;

typedef struct {
  cp_shape s;
  int reps;
  double tol; /* 0 = the dtype's default */
  int dtype_given;
  const char *heatmap;
  run_files f;
  const char *shape_opt; /* a shape option given (refused with --q), without "--" */
  int page_size;         /* --paged: keys per page; 0 = contiguous K/V */
  clattn_dtype kv_dtype; /* --kv-dtype; CLATTN_DTYPE_SAME = like q */
  rm_cfg mods;           /* --score-mod, --mask-mod and their captures */
} run_cfg;

static const char *opt_name(int code) {
  for (const struct option *o = RUN_OPTS; o->name; o++)
    if (o->val == code) return o->name;
  return "?";
}

/* One bound of --window: an integer >= -1 ending at *end. */
static int window_bound(const char *s, char **end, int *out) {
  errno = 0;
  long v = strtol(s, end, 10);
  if (*end == s || errno || v < -1 || v > INT_MAX) return -1;
  *out = (int)v;
  return 0;
}

/* "L,R": two integers >= -1. */
static int parse_window(const char *val, int *l, int *r) {
  char *end = NULL;
  if (window_bound(val, &end, l) == 0 && *end == ',' && window_bound(end + 1, &end, r) == 0 && !*end) return 0;
  fprintf(stderr,
          "clattn run: --window %s: expected L,R: the keys allowed before and after each query's position, each an "
          "integer >= -1 (-1 = unbounded), e.g. --window 128,0\n",
          val);
  return -1;
}

static int on_run_option(int code, const char *arg, void *ctxp) {
  run_cfg *c = ctxp;
  cp_shape *s = &c->s;
  const char *name = opt_name(code);
  int k = 0;
  double x = 0;
  switch (code) {
    case O_BATCH: c->shape_opt = name; return cli_int("run", name, arg, 1, INT_MAX, &s->batch);
    case O_HEADS: c->shape_opt = name; return cli_int("run", name, arg, 1, INT_MAX, &s->q_heads);
    case O_KV_HEADS: c->shape_opt = name; return cli_int("run", name, arg, 1, INT_MAX, &s->kv_heads);
    case O_Q_LEN: c->shape_opt = name; return cli_int("run", name, arg, 1, INT_MAX, &s->q_len);
    case O_KV_LEN: c->shape_opt = name; return cli_int("run", name, arg, 1, INT_MAX, &s->kv_len);
    case O_HEAD_DIM: c->shape_opt = name; return cli_int("run", name, arg, 1, INT_MAX, &s->head_dim);
    case O_VALUE_DIM: c->shape_opt = name; return cli_int("run", name, arg, 1, INT_MAX, &s->value_dim);
    case O_VARLEN:
      c->shape_opt = name;
      s->varlen = 1;
      return 0;
    case O_REPS: return cli_int("run", name, arg, 0, INT_MAX, &c->reps);
    case O_SEED: return cli_u64("run", name, arg, &s->seed);
    case O_DTYPE:
      if (cli_choice("run", name, arg, DTYPE_NAMES, 3, &k)) return -1;
      s->dtype = (clattn_dtype)k, c->dtype_given = 1;
      return 0;
    case O_LAYOUT: {
      static const char *const names[] = {"bhsd", "bshd"};
      if (cli_choice("run", name, arg, names, 2, &k)) return -1;
      s->layout = k ? CP_BSHD : CP_BHSD;
      return 0;
    }
    case O_CAUSAL: s->causal = 1; return 0;
    case O_WINDOW: return parse_window(arg, &s->window_left, &s->window_right);
    case O_KV_LENS: s->kv_lens = 1; return 0;
    case O_MASK: {
      static const char *const names[] = {"random", "block", "none"};
      static const cp_mask_kind kinds[] = {CP_MASK_RANDOM, CP_MASK_BLOCK_DIAG, CP_MASK_NONE};
      if (cli_ends_with(arg, ".npy")) return c->f.mask = arg, s->mask = CP_MASK_ONES, 0;
      for (k = 0; k < 3 && strcmp(arg, names[k]) != 0; k++) continue;
      if (k == 3) return fprintf(stderr, "clattn run: --mask %s: expected random, block, none or FILE.npy\n", arg), -1;
      s->mask = kinds[k], c->f.mask = NULL;
      return 0;
    }
    case O_PAGED: return cli_int("run", name, arg, 1, INT_MAX, &c->page_size);
    case O_KV_DTYPE: {
      static const char *const names[] = {"f32", "f16", "bf16", "q8_0", "int8"}; /* clattn_dtype order */
      if (cli_choice("run", name, arg, names, 5, &k)) return -1;
      c->kv_dtype = (clattn_dtype)k;
      return 0;
    }
    case O_EMPTY: {
      static const char *const names[] = {"zero", "error"};
      if (cli_choice("run", name, arg, names, 2, &k)) return -1;
      s->empty_rows = k ? CLATTN_EMPTY_ERROR : CLATTN_EMPTY_ZERO;
      return 0;
    }
    case O_SCALE:
      if (cli_double("run", name, arg, -HUGE_VAL, 0, &x)) return -1;
      s->scale = (float)x;
      if (!isfinite(s->scale))
        return fprintf(stderr, "clattn run: --scale %s: expected a finite number (this overflows a float)\n", arg), -1;
      return 0;
    case O_BIAS:
      c->f.bias = cli_optional_value(arg, ".npy");
      if (c->f.bias && !cli_ends_with(c->f.bias, ".npy"))
        return fprintf(stderr, "clattn run: --bias=%s: expected a file name ending in .npy\n", c->f.bias), -1;
      s->bias = CP_BIAS_RANDOM;
      return 0;
    case O_SOFTCAP:
      if (cli_double("run", name, arg, 0, 1, &x)) return -1;
      s->softcap = (float)x;
      if (!isfinite(s->softcap))
        return fprintf(stderr, "clattn run: --softcap %s: expected a finite number >= 0 (this overflows a float)\n",
                       arg),
               -1;
      return 0;
    case O_ALIBI: s->alibi = 1; return 0;
    case O_SINKS: s->sinks = 1; return 0;
    case O_ADDITIVE: s->additive = 1; return 0;
    case O_ALGO:
      if (cli_choice("run", name, arg, ALGO_NAMES, 4, &k)) return -1;
      s->algo = (clattn_algo)k;
      return 0;
    case O_LSE:
      c->f.lse = cli_optional_value(arg, ".npy");
      if (c->f.lse && !cli_ends_with(c->f.lse, ".npy"))
        return fprintf(stderr, "clattn run: --lse=%s: expected a file name ending in .npy\n", c->f.lse), -1;
      s->want_lse = 1;
      return 0;
    case O_WEIGHTS: s->want_weights = 1; return 0;
    case O_DIAG: s->want_diag = 1; return 0;
    case O_HEATMAP: c->heatmap = arg, s->want_weights = 1; return 0;
    case O_Q: c->f.q = arg; return 0;
    case O_K: c->f.k = arg; return 0;
    case O_V: c->f.v = arg; return 0;
    case O_OUT: c->f.out = arg; return 0;
    case O_TOL: return cli_double("run", name, arg, 0, 0, &c->tol);
    case O_POISON: s->poison_disallowed = 1, s->poison_gaps = 1; return 0;
    case O_SCORE_MOD: return rm_read_text(name, arg, &c->mods.score_mod);
    case O_MASK_MOD: return rm_read_text(name, arg, &c->mods.mask_mod);
    case O_CAPTURE: return rm_add_capture(&c->mods, arg);
    case O_INTS: return rm_parse_ints(&c->mods, arg);
    case O_FLOATS: return rm_parse_floats(&c->mods, arg);
    case O_BLOCK_MASK: c->mods.block_mask = 1; return 0;
  }
  return -1;
}

/* ---- .npy inputs ---- */

typedef struct {
  npy_array q, k, v, mask, bias;
} run_arrays;

static void arrays_free(run_arrays *a) {
  npy_free(&a->q), npy_free(&a->k), npy_free(&a->v), npy_free(&a->mask), npy_free(&a->bias);
}

static int bad_file(const char *opt, const char *path, const npy_header *h, const char *what) {
  char sh[256];
  fprintf(stderr, "clattn run: --%s %s: shape %s, %s: %s\n", opt, path, npy_shape_string(h, sh, sizeof sh),
          npy_dtype_string(h->dtype), what);
  return -1;
}

/* A float array (q, k, v, bias): '<f4' or '<f2'. */
static int float_dtype(const char *opt, const char *path, const npy_header *h) {
  if (h->dtype == NPY_F32 || h->dtype == NPY_F16) return 0;
  return bad_file(opt, path, h, "expected dtype '<f4' (float32) or '<f2' (float16)");
}

/* q, k or v: four dimensions, each 1 to INT_MAX, matching want where set. */
static int check_4d(const char *opt, const char *path, const npy_header *h, const size_t want[4], const char *form) {
  char what[512];
  if (float_dtype(opt, path, h)) return -1;
  int ok = h->ndim == 4;
  for (int d = 0; ok && d < 4; d++)
    ok = h->shape[d] >= 1 && h->shape[d] <= INT_MAX && (!want[d] || h->shape[d] == want[d]);
  if (ok) return 0;
  snprintf(what, sizeof what, "expected shape %s%s", form,
           h->ndim == 4 && !(want[0] || want[3]) ? ", each dimension 1 to 2147483647" : "");
  return bad_file(opt, path, h, what);
}

/* A mask or bias: NumPy-broadcastable to [B,Hq,M,N] (aligned on the right,
 * each dimension 1 or equal). Sets the kit's broadcast flags for the
 * dimensions of size 1 (stride 0 on the device); a key dimension of size 1
 * is repeated on the host instead, as the kit has no flag for it. */
static int check_bcast(const char *opt, const char *path, const npy_header *h, const size_t full[4], unsigned *flags) {
  static const unsigned bit[3] = {CP_BCAST_BATCH, CP_BCAST_HEAD, CP_BCAST_ROW};
  int ok = h->ndim <= 4;
  *flags = 0;
  for (int t = 0; ok && t < 4; t++) {
    const int d = t - (4 - h->ndim);
    const size_t n = d >= 0 ? h->shape[d] : 1;
    ok = n == 1 || n == full[t];
    if (n == 1 && t < 3) *flags |= bit[t];
  }
  if (ok) return 0;
  char what[256];
  snprintf(what, sizeof what,
           "does not broadcast to [batch, q_heads, q_len, kv_len] = (%zu, %zu, %zu, %zu): each dimension must be 1 or "
           "equal, aligned on the right (NumPy's rule)",
           full[0], full[1], full[2], full[3]);
  return bad_file(opt, path, h, what);
}

/* The mask file (already read): its dtype and shape. */
static int load_mask(run_cfg *c, run_arrays *a, const size_t full[4]) {
  if (a->mask.h.dtype != NPY_U8 && a->mask.h.dtype != NPY_BOOL)
    return bad_file("mask", c->f.mask, &a->mask.h, "expected dtype '|u1' (uint8) or '|b1' (bool), nonzero = allowed");
  return check_bcast("mask", c->f.mask, &a->mask.h, full, &c->s.mask_bcast);
}

static int load(const char *opt, const char *path, npy_array *a) {
  char err[1024];
  if (npy_load(path, a, err, sizeof err) == 0) return 0;
  fprintf(stderr, "clattn run: --%s %s\n", opt, err);
  return -1;
}

/* Reads the files and sets the shape from them. */
static int load_inputs(run_cfg *c, run_arrays *a) {
  const run_files *f = &c->f;
  cp_shape *s = &c->s;
  if (!f->q || !f->k || !f->v) {
    const char *given = f->q ? "--q" : f->k ? "--k" : f->v ? "--v" : f->out ? "--out" : f->bias ? "--bias" : "--lse";
    return fprintf(stderr, "clattn run: %s FILE.npy needs all of --q, --k and --v FILE.npy\n", given), -1;
  }
  if (c->shape_opt)
    return fprintf(stderr, "clattn run: --%s: with --q, --k and --v the shape comes from the files\n", c->shape_opt),
           -1;
  if (load("q", f->q, &a->q) || load("k", f->k, &a->k) || load("v", f->v, &a->v)) return -1;
  if (f->mask && load("mask", f->mask, &a->mask)) return -1;
  if (f->bias && load("bias", f->bias, &a->bias)) return -1;

  const size_t none[4] = {0, 0, 0, 0};
  const npy_header *q = &a->q.h, *k = &a->k.h, *v = &a->v.h;
  if (check_4d("q", f->q, q, none, "[batch, q_heads, q_len, head_dim]")) return -1;
  char form[256];
  const size_t kw[4] = {q->shape[0], 0, 0, q->shape[3]};
  snprintf(form, sizeof form, "[batch %zu, kv_heads, kv_len, head_dim %zu] to go with --q's", q->shape[0], q->shape[3]);
  if (check_4d("k", f->k, k, kw, form)) return -1;
  if (q->shape[1] % k->shape[1] != 0) return bad_file("k", f->k, k, "kv_heads must divide --q's q_heads");
  const size_t vw[4] = {k->shape[0], k->shape[1], k->shape[2], 0};
  snprintf(form, sizeof form, "[batch %zu, kv_heads %zu, kv_len %zu, value_dim] to go with --k's", k->shape[0],
           k->shape[1], k->shape[2]);
  if (check_4d("v", f->v, v, vw, form)) return -1;
  if (k->dtype != q->dtype || v->dtype != q->dtype)
    return bad_file(k->dtype != q->dtype ? "k" : "v", k->dtype != q->dtype ? f->k : f->v, k->dtype != q->dtype ? k : v,
                    "q, k and v must have one dtype");

  s->batch = (int)q->shape[0], s->q_heads = (int)q->shape[1], s->q_len = (int)q->shape[2];
  s->head_dim = (int)q->shape[3], s->kv_heads = (int)k->shape[1], s->kv_len = (int)k->shape[2];
  s->value_dim = (int)v->shape[3];
  if (!c->dtype_given) s->dtype = q->dtype == NPY_F16 ? CLATTN_F16 : CLATTN_F32;
  const size_t full[4] = {q->shape[0], q->shape[1], q->shape[2], k->shape[2]};
  if (f->mask && load_mask(c, a, full)) return -1;
  if (f->bias &&
      (float_dtype("bias", f->bias, &a->bias.h) || check_bcast("bias", f->bias, &a->bias.h, full, &s->bias_bcast)))
    return -1;
  return 0;
}

/* Element (b, h, i, j) of an array that broadcasts to four dimensions. */
static size_t bcast_at(const npy_header *h, const int idx[4]) {
  size_t at = 0;
  for (int d = 0; d < h->ndim; d++) {
    const int t = d + 4 - h->ndim;
    at = at * h->shape[d] + (h->shape[d] == 1 ? 0 : (size_t)idx[t]);
  }
  return at;
}

/* Copies the files' values into the problem's host arrays (through its
 * views: layout, broadcast strides), rounded to the storage type. */
static void fill_inputs(cp_problem *pb, const run_arrays *a) {
  const clattn_params *p = &pb->params;
  const struct {
    const clattn_tensor *view;
    float *dst;
    const npy_array *src;
    int heads, rows, cols;
  } qkv[3] = {{&p->q, pb->q, &a->q, p->q_heads, p->q_len, p->head_dim},
              {&p->k, pb->k, &a->k, p->kv_heads, p->kv_len, p->head_dim},
              {&p->v, pb->v, &a->v, p->kv_heads, p->kv_len, p->value_dim}};
  for (int t = 0; t < 3 && a->q.f; t++)
    for (int b = 0; b < p->batch; b++)
      for (int h = 0; h < qkv[t].heads; h++)
        for (int i = 0; i < qkv[t].rows; i++)
          for (int d = 0; d < qkv[t].cols; d++) {
            const int idx[4] = {b, h, i, d};
            qkv[t].dst[cp_index(qkv[t].view, b, h, i, d)] =
                cp_round_to(p->dtype, qkv[t].src->f[bcast_at(&qkv[t].src->h, idx)]);
          }
  if (!a->mask.u8 && !a->bias.f) return;
  for (int b = 0; b < p->batch; b++)
    for (int h = 0; h < p->q_heads; h++)
      for (int i = 0; i < p->q_len; i++)
        for (int j = 0; j < p->kv_len; j++) {
          const int idx[4] = {b, h, i, j};
          if (a->mask.u8) pb->mask[cp_index(&p->mask, b, h, i, j)] = a->mask.u8[bcast_at(&a->mask.h, idx)];
          if (a->bias.f) pb->bias[cp_index(&p->bias, b, h, i, j)] = a->bias.f[bcast_at(&a->bias.h, idx)];
        }
}

static int write_outputs(const cp_problem *pb, const run_files *f) {
  const clattn_params *p = &pb->params;
  const size_t shape[4] = {(size_t)p->batch, (size_t)p->q_heads, (size_t)p->q_len, (size_t)p->value_dim};
  char err[1024];
  if (f->out && npy_save_f32(f->out, pb->out, 4, shape, err, sizeof err) != 0)
    return fprintf(stderr, "clattn run: --out %s\n", err), -1;
  if (f->out) printf("  wrote --out %s: '<f4' (%zu, %zu, %zu, %zu)\n", f->out, shape[0], shape[1], shape[2], shape[3]);
  if (f->lse && npy_save_f32(f->lse, pb->lse, 3, shape, err, sizeof err) != 0)
    return fprintf(stderr, "clattn run: --lse %s\n", err), -1;
  if (f->lse) printf("  wrote --lse %s: '<f4' (%zu, %zu, %zu)\n", f->lse, shape[0], shape[1], shape[2]);
  return 0;
}

/* ---- the report ---- */

/* The algorithm that ran (AUTO resolved) and its kernels, as the library
 * reports them (clattn_last_route, read right after the call). */
static void print_route(const cp_problem *pb, const char *route) {
  const clattn_params *p = &pb->params;
  const char *colon = strchr(route, ':');
  printf("  ran: %s storage (f32 arithmetic), algorithm %s%.*s, kernels%s\n", DTYPE_NAMES[p->dtype],
         p->algo == CLATTN_ALGO_AUTO ? "auto -> " : "", colon ? (int)(colon - route) : 0, route,
         colon ? colon + 1 : " unknown");
}

static size_t mem_bytes(cl_mem m) {
  size_t n = 0;
  if (m && clGetMemObjectInfo(m, CL_MEM_SIZE, sizeof n, &n, NULL) != CL_SUCCESS) n = 0;
  return n;
}

/* The problem's own device buffers and the scratch clattn added. */
static void print_memory(clattn_context *ctx, const cp_problem *pb) {
  const cl_mem bufs[] = {pb->q_buf,          pb->k_buf,      pb->v_buf,       pb->out_buf,     pb->mask_buf,
                         pb->bias_buf,       pb->lse_buf,    pb->weights_buf, pb->kv_lens_buf, pb->entropy_buf,
                         pb->max_weight_buf, pb->argmax_buf, pb->alibi_buf,   pb->sinks_buf,   pb->additive_w_buf,
                         pb->cu_q_buf,       pb->cu_k_buf};
  size_t io = 0;
  for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) io += mem_bytes(bufs[i]);
  const size_t scratch = clattn_peak_scratch_bytes(ctx, 0);
  printf(
      "  device memory: %zu bytes (%.2f MiB) of inputs and outputs, %zu bytes (%.2f MiB) of clattn scratch "
      "(peak of one call)\n",
      io, io / 1048576.0, scratch, scratch / 1048576.0);
}

/* Renders the routing matrix of batch 0, head 0 (dense weights start with
 * it), at most HEAT_MAX x HEAT_MAX cells from the top-left corner;
 * disallowed cells (from the problem's mask, window, lengths) hatched. */
#define HEAT_MAX 512
static int write_run_heatmap(const cp_problem *pb, const char *desc, const char *path) {
  const cp_shape *s = &pb->shape;
  int rows = s->q_len < HEAT_MAX ? s->q_len : HEAT_MAX, cols = s->kv_len < HEAT_MAX ? s->kv_len : HEAT_MAX;
  char title[160], caption[1200], crop[160] = "", err[1024];
  unsigned char *allowed = malloc((size_t)rows * cols);
  if (!allowed) return fprintf(stderr, "clattn run: --heatmap: out of memory\n"), 1;
  const ref_inputs in = cp_ref_inputs(pb);
  for (int i = 0; i < rows; i++)
    for (int j = 0; j < cols; j++)
      allowed[(size_t)i * cols + j] = (unsigned char)ref_allowed(&pb->params, &in, 0, 0, i, j);
  if (rows < s->q_len || cols < s->kv_len)
    snprintf(crop, sizeof crop, " Shown: the top-left %d x %d of the %d x %d matrix.", rows, cols, s->q_len, s->kv_len);
  snprintf(title, sizeof title, "clattn run: routing matrix of batch 0, head 0 (%d queries x %d keys)", s->q_len,
           s->kv_len);
  snprintf(caption, sizeof caption,
           "Routing coefficients a_ij (the weights output) of one head for one input.%s Hatched cells are keys the "
           "query may not read (weight 0 by construction), unlike allowed keys of near-zero weight.\n"
           "This is a routing diagnostic, not an explanation of any output.\nProblem: %s",
           crop, desc);
  heatmap h = {.a = pb->weights,
               .rows = rows,
               .cols = cols,
               .ld = (size_t)s->kv_len,
               .allowed = allowed,
               .title = title,
               .caption = caption};
  int rc = heatmap_write_png(&h, path, err, sizeof err);
  free(allowed);
  if (rc != 0) return fprintf(stderr, "clattn run: --heatmap: %s\n", err), 1;
  printf("  heat map: %s\n", path);
  return 0;
}

/* Runs pb, prints what ran and how well; returns 0 when verified within
 * tol. heatmap, files: may be NULL. */
static int run_checked(clattn_context *ctx, cp_problem *pb, int reps, double tol, const char *tol_note,
                       const char *heatmap, const run_files *files) {
  const cp_shape *s = &pb->shape;
  char line[512], desc[512];
  cp_result r;
  clattn_peak_scratch_bytes(ctx, 1);
  if (cp_run(pb, ctx, &r) != 0) return fprintf(stderr, "clattn run: %s\n", pb->err), 1;
  char route[512];
  snprintf(route, sizeof route, "%s", clattn_last_route());
  printf("%s\n", cp_describe(s, desc, sizeof desc));
  if (files) { /* the description shows the kit's kinds (mask=ones): say where the values came from */
    const char *const opt[] = {"q", "k", "v", "mask", "bias"};
    const char *const path[] = {files->q, files->k, files->v, files->mask, files->bias};
    printf("  read:");
    for (int i = 0; i < 5; i++)
      if (path[i]) printf(" --%s %s", opt[i], path[i]);
    printf("\n");
  }
  if (r.status != CLATTN_OK) {
    printf("  status: %s: %s\n", clattn_status_string(r.status), clattn_last_error(ctx));
    return 1;
  }
  double ms = r.ms;
  clattn_status st = CLATTN_OK;
  if (reps > 0 && cp_time_forward(pb, ctx, reps, &ms, &st) != 0) return fprintf(stderr, "clattn run: %s\n", pb->err), 1;
  print_route(pb, route);
  print_memory(ctx, pb);
  double flops = 4.0 * s->batch * s->q_heads * (double)s->q_len * s->kv_len * 0.5 * (s->head_dim + s->value_dim);
  if (s->causal) flops *= 0.5;
  const int ok = cp_result_ok(&r, tol);
  printf("  %s\n  time: %.3f ms per call (%s), %.2f GFLOP/s\n  verified against fp64 within %g%s: %s\n",
         cp_result_format(&r, line, sizeof line), ms, reps > 0 ? "mean of timed calls" : "first call",
         flops / (ms * 1e6), tol, tol_note, ok ? "yes" : "NO");
  int rc = ok ? 0 : 1;
  if (files && write_outputs(pb, files) != 0) rc = 1;
  if (heatmap && pb->weights && write_run_heatmap(pb, desc, heatmap) != 0) rc = 1;
  return rc;
}

/* run_checked, with K and V first moved into a paged and/or differently
 * stored cache when page_size > 0 or kv_dtype is not CLATTN_DTYPE_SAME. */
static int run_problem(clattn_context *ctx, cp_problem *pb, int reps, double tol, const char *tol_note,
                       const char *heatmap, const run_files *files, int page_size, clattn_dtype kv_dtype) {
  static const char *const kv_names[] = {"f32", "f16", "bf16", "q8_0", "int8"};
  if (!page_size && kv_dtype == CLATTN_DTYPE_SAME) return run_checked(ctx, pb, reps, tol, tol_note, heatmap, files);
  rc_cache cache;
  char err[512];
  if (cp_upload(pb, ctx) != 0) return fprintf(stderr, "clattn run: %s\n", pb->err), 1;
  if (rc_use_cache(pb, ctx, page_size, kv_dtype, &cache, err, sizeof err) != 0) {
    rc_free(&cache);
    return fprintf(stderr, "clattn run: %s\n", err), 1;
  }
  printf("  K/V cache: %s%s, %.0f bytes per token (all KV heads), written by clattn_kv_append\n",
         page_size ? "paged, pages in reverse order, " : "contiguous, ", kv_names[pb->params.kv_dtype],
         cache.bytes_per_token);
  if (page_size) printf("  pages: %d keys each, %d in the pool\n", page_size, pb->params.num_pages);
  const int rc = run_checked(ctx, pb, reps, tol, tol_note, heatmap, files);
  rc_free(&cache);
  return rc;
}

int run_verified(clattn_context *ctx, const cp_shape *s, int reps, double tol) {
  char err[512];
  cp_problem *pb = cp_build(s, err, sizeof err);
  if (!pb) return fprintf(stderr, "clattn run: %s\n", err), 1;
  int rc = run_problem(ctx, pb, reps, tol, "", NULL, NULL, 0, CLATTN_DTYPE_SAME);
  cp_free(pb);
  return rc;
}

int run_main(int argc, char **argv) {
  run_cfg c;
  memset(&c, 0, sizeof c);
  c.s = cp_shape_default();
  c.kv_dtype = CLATTN_DTYPE_SAME;
  c.s.q_len = c.s.kv_len = 256;
  c.s.head_dim = c.s.value_dim = 64;
  c.s.q_heads = c.s.kv_heads = 4;
  c.reps = 3;
  const int parsed = cli_parse("run", argc, argv, RUN_OPTS, run_help, on_run_option, &c);
  if (parsed != 0) return rm_free(&c.mods), parsed > 0 ? 0 : 2;

  run_arrays a;
  memset(&a, 0, sizeof a);
  const run_files *f = &c.f;
  const int from_files = f->q || f->k || f->v || f->out || f->bias || f->lse;
  if (from_files && load_inputs(&c, &a) != 0) return arrays_free(&a), rm_free(&c.mods), 2;
  if (f->mask && !from_files) { /* a mask file over random inputs of the options' shape */
    const size_t full[4] = {(size_t)c.s.batch, (size_t)c.s.q_heads, (size_t)c.s.q_len, (size_t)c.s.kv_len};
    if (load("mask", f->mask, &a.mask) || load_mask(&c, &a, full) != 0) return arrays_free(&a), rm_free(&c.mods), 2;
  }

  char note[64] = "";
  if (!c.tol) {
    c.tol = DEFAULT_TOL[c.s.dtype];
    snprintf(note, sizeof note, " (the default for %s storage)", DTYPE_NAMES[c.s.dtype]);
  }
  char err[512];
  cp_problem *pb = cp_build(&c.s, err, sizeof err);
  if (!pb) return arrays_free(&a), rm_free(&c.mods), fprintf(stderr, "clattn run: %s\n", err), 2;
  fill_inputs(pb, &a);
  arrays_free(&a);

  clattn_context *ctx = NULL;
  clattn_status st = clattn_create(NULL, &ctx);
  int rc = 1;
  if (st != CLATTN_OK)
    fprintf(stderr, "clattn run: cannot create a context: %s: %s\n", clattn_status_string(st), clattn_last_error(NULL));
  else if (rm_apply(&c.mods, ctx, pb) != 0)
    rc = 2;
  else
    rc =
        run_problem(ctx, pb, c.reps, c.tol, note, c.heatmap, from_files || f->mask ? f : NULL, c.page_size, c.kv_dtype);
  cp_free(pb);
  rm_free(&c.mods);
  clattn_destroy(ctx);
  return rc;
}
