/*
 * Plans (clattn_plan_*): each step's outputs are bitwise those of
 * clattn_forward with the plan's params changed as the step says.
 *
 *  - many steps with changing KV lengths (the key split changing with them,
 *    split and unsplit), moving q, out and lse offsets and kv_lens contents,
 *    over every path (fused decode with and without split keys, fused
 *    prefill with packed K/V, staged, GEMM, AUTO with sinks and ALiBi, f16
 *    storage, EMPTY_ERROR), each step checked against clattn_forward at
 *    once, on an in-order and an out-of-order queue;
 *  - steps enqueued back to back behind one user event, each into its own
 *    output slot, so the plan's reused scratch must order them (out-of-order
 *    queue), then checked against clattn_forward;
 *  - the route a step reports is the forward's;
 *  - a step the plan cannot take (longer than planned, offsets past the
 *    buffer, outputs overlapping, q or out moved onto the other's bytes, lse
 *    without an lse view) is refused naming the field, enqueues nothing, and
 *    the plan keeps working;
 *  - creation refuses what clattn_forward refuses, with its message;
 *  - a plan retains the caller's buffers until released;
 *  - with CLATTN_COMMAND_BUFFER=1 (meson's plan-command-buffer) a device
 *    that offers command buffers replays them (results as above), and one
 *    that reports cl_khr_command_buffer_mutable_dispatch (Intel's runtime)
 *    replays every step of a fused plan, a step that changes kv_len or an
 *    offset with its commands updated in place (not plain enqueues, not a
 *    recording anew unless the kernels themselves changed); with
 *    CLATTN_COMMAND_BUFFER=0 (plan-plain) none replays.
 */
#include <stdint.h>

#include "api/api.h" /* ca_plan_*, ca_last_call_*: what a step or call ran */
#include "kit_checks.h"

enum { SLOTS = 6 }; /* q, out and lse slots a step moves between */

typedef struct {
  const char *name;
  int batch, q_heads, kv_heads, q_len, kv_len, head_dim, value_dim;
  clattn_algo algo;
  clattn_dtype dtype;
  int causal, want_lse, kv_lens, sinks_alibi;
  clattn_empty_rows empty_rows;
  int min_len; /* the shortest step */
} plan_case;

static const plan_case g_cases[] = {
    {"fused decode, split keys", 1, 4, 2, 1, 700, 32, 32, CLATTN_ALGO_FUSED, CLATTN_F32, 1, 1, 0, 0, CLATTN_EMPTY_ZERO,
     1},
    {"fused decode, batch with kv_lens", 2, 8, 2, 1, 300, 64, 64, CLATTN_ALGO_FUSED, CLATTN_F32, 1, 1, 1, 0,
     CLATTN_EMPTY_ZERO, 1},
    {"fused prefill, packed K/V", 1, 2, 2, 16, 120, 40, 24, CLATTN_ALGO_FUSED, CLATTN_F32, 1, 1, 0, 0,
     CLATTN_EMPTY_ZERO, 16},
    {"staged", 1, 2, 1, 5, 90, 24, 24, CLATTN_ALGO_STAGED, CLATTN_F32, 1, 1, 0, 0, CLATTN_EMPTY_ZERO, 5},
    {"gemm", 1, 3, 1, 7, 77, 32, 32, CLATTN_ALGO_GEMM, CLATTN_F32, 0, 1, 0, 0, CLATTN_EMPTY_ZERO, 1},
    {"auto decode, sinks and ALiBi", 1, 4, 4, 1, 530, 32, 32, CLATTN_ALGO_AUTO, CLATTN_F32, 1, 1, 0, 1,
     CLATTN_EMPTY_ZERO, 1},
    {"fused decode f16, split keys", 1, 2, 1, 2, 600, 32, 32, CLATTN_ALGO_FUSED, CLATTN_F16, 1, 0, 0, 0,
     CLATTN_EMPTY_ZERO, 2},
    {"fused EMPTY_ERROR (short steps leave rows empty)", 1, 2, 2, 4, 40, 16, 16, CLATTN_ALGO_FUSED, CLATTN_F32, 1, 1, 0,
     0, CLATTN_EMPTY_ERROR, 1},
};
#define N_CASES (sizeof g_cases / sizeof g_cases[0])

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;
static uint32_t rnd(void) {
  g_rng ^= g_rng << 13;
  g_rng ^= g_rng >> 7;
  g_rng ^= g_rng << 17;
  return (uint32_t)(g_rng >> 11);
}
static float urand(void) { return (float)(rnd() % 2000001u) / 1000000.0f - 1.0f; }

/* A case's buffers: inputs, and two sets of outputs (the plan's, the forward's). */
typedef struct {
  const plan_case *c;
  clattn_context *ctx;
  size_t elem, q_slot, o_slot, lse_slot; /* elements per slot */
  size_t o_bytes, lse_bytes;
  cl_mem q, k, v, kv_lens, sinks, alibi;
  cl_mem out[2], lse[2]; /* [0] the plan's, [1] the forward's */
  clattn_params p;       /* the planned params (the plan's outputs, slot 0) */
} fixture;

static cl_mem buffer(clattn_context *ctx, size_t bytes, const void *init) {
  cl_int e = CL_SUCCESS;
  cl_mem m = clCreateBuffer(clattn_cl_context(ctx), CL_MEM_READ_WRITE | (init ? CL_MEM_COPY_HOST_PTR : 0), bytes,
                            (void *)init, &e);
  return e == CL_SUCCESS ? m : NULL;
}

/* n random values in storage dtype (f16 as its bits). */
static void *random_data(size_t n, clattn_dtype dtype) {
  if (dtype == CLATTN_F32) {
    float *x = malloc(n * sizeof *x);
    for (size_t i = 0; x && i < n; i++) x[i] = urand();
    return x;
  }
  uint16_t *h = malloc(n * sizeof *h);
  for (size_t i = 0; h && i < n; i++) h[i] = cp_f16_bits(urand());
  return h;
}

static void fixture_free(fixture *f) {
  cl_mem all[] = {f->q, f->k, f->v, f->kv_lens, f->sinks, f->alibi, f->out[0], f->out[1], f->lse[0], f->lse[1]};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
    if (all[i]) clReleaseMemObject(all[i]);
  memset(f, 0, sizeof *f);
}

static int fixture_init(fixture *f, const plan_case *c, clattn_context *ctx) {
  memset(f, 0, sizeof *f);
  f->c = c;
  f->ctx = ctx;
  f->elem = c->dtype == CLATTN_F32 ? 4 : 2;
  const size_t B = (size_t)c->batch, Hq = (size_t)c->q_heads, Hk = (size_t)c->kv_heads, M = (size_t)c->q_len,
               N = (size_t)c->kv_len, dk = (size_t)c->head_dim, dv = (size_t)c->value_dim;
  f->q_slot = B * Hq * M * dk;
  f->o_slot = B * Hq * M * dv;
  f->lse_slot = B * Hq * M;
  f->o_bytes = SLOTS * f->o_slot * f->elem;
  f->lse_bytes = SLOTS * f->lse_slot * sizeof(float);
  void *q = random_data(SLOTS * f->q_slot, c->dtype), *k = random_data(B * Hk * N * dk, c->dtype),
       *v = random_data(B * Hk * N * dv, c->dtype);
  int ok = q && k && v;
  if (ok) {
    f->q = buffer(ctx, SLOTS * f->q_slot * f->elem, q);
    f->k = buffer(ctx, B * Hk * N * dk * f->elem, k);
    f->v = buffer(ctx, B * Hk * N * dv * f->elem, v);
    for (int i = 0; i < 2; i++) {
      f->out[i] = buffer(ctx, f->o_bytes, NULL);
      f->lse[i] = c->want_lse ? buffer(ctx, f->lse_bytes, NULL) : NULL;
      ok &= f->out[i] && (!c->want_lse || f->lse[i]);
    }
    ok &= f->q && f->k && f->v;
  }
  free(q);
  free(k);
  free(v);
  if (ok && c->kv_lens) {
    int32_t lens[64];
    for (int b = 0; b < c->batch; b++) lens[b] = c->kv_len - b;
    ok = (f->kv_lens = buffer(ctx, B * sizeof(int32_t), lens)) != NULL;
  }
  if (ok && c->sinks_alibi) {
    float s[64], a[64];
    for (int h = 0; h < c->q_heads; h++) s[h] = urand() * 2, a[h] = 0.05f * (float)(h + 1);
    ok = (f->sinks = buffer(ctx, Hq * sizeof(float), s)) && (f->alibi = buffer(ctx, Hq * sizeof(float), a));
  }
  clattn_params *p = &f->p;
  *p = clattn_params_default();
  p->batch = c->batch;
  p->q_heads = c->q_heads;
  p->kv_heads = c->kv_heads;
  p->q_len = c->q_len;
  p->kv_len = c->kv_len;
  p->head_dim = c->head_dim;
  p->value_dim = c->value_dim;
  p->dtype = c->dtype;
  p->causal = c->causal;
  p->algo = c->algo;
  p->empty_rows = c->empty_rows;
  p->q = (clattn_tensor){f->q, 0, {Hq * M * dk, M * dk, dk, 1}};
  p->k = (clattn_tensor){f->k, 0, {Hk * N * dk, N * dk, dk, 1}};
  p->v = (clattn_tensor){f->v, 0, {Hk * N * dv, N * dv, dv, 1}};
  p->out = (clattn_tensor){f->out[0], 0, {Hq * M * dv, M * dv, dv, 1}};
  if (c->want_lse) p->lse = (clattn_tensor){f->lse[0], 0, {Hq * M, M, 1, 0}};
  p->kv_lens = f->kv_lens;
  p->sinks = f->sinks;
  p->alibi_slopes = f->alibi;
  return ok ? 0 : -1;
}

/* Fills both output sets with NaN. */
static int poison(fixture *f) {
  const float nan = NAN;
  const uint16_t nan16 = 0x7e00;
  cl_command_queue q = clattn_cl_queue(f->ctx);
  int ok = 1;
  for (int i = 0; i < 2; i++) {
    ok &= clEnqueueFillBuffer(q, f->out[i], f->elem == 4 ? (const void *)&nan : (const void *)&nan16, f->elem, 0,
                              f->o_bytes, 0, NULL, NULL) == CL_SUCCESS;
    if (f->lse[i])
      ok &= clEnqueueFillBuffer(q, f->lse[i], &nan, sizeof nan, 0, f->lse_bytes, 0, NULL, NULL) == CL_SUCCESS;
  }
  return ok && clFinish(q) == CL_SUCCESS ? 0 : -1;
}

/* The forward call a step stands for: the planned params with the step's
 * values, writing the forward's output set. */
static clattn_params forward_of(const fixture *f, const clattn_step *s) {
  clattn_params p = f->p;
  if (s->kv_len) p.kv_len = s->kv_len;
  if (s->q_offset != CLATTN_STEP_PLANNED) p.q.offset = s->q_offset;
  if (s->out_offset != CLATTN_STEP_PLANNED) p.out.offset = s->out_offset;
  if (s->lse_offset != CLATTN_STEP_PLANNED) p.lse.offset = s->lse_offset;
  p.out.buf = f->out[1];
  p.lse.buf = f->lse[1];
  return p;
}

/* Whether both output sets hold the same bytes; names the first difference. */
static int outputs_equal(fixture *f, const char *what) {
  cl_command_queue q = clattn_cl_queue(f->ctx);
  unsigned char *a = malloc(f->o_bytes), *b = malloc(f->o_bytes), *la = malloc(f->lse_bytes + 1),
                *lb = malloc(f->lse_bytes + 1);
  int same = a && b && la && lb && clFinish(q) == CL_SUCCESS &&
             clEnqueueReadBuffer(q, f->out[0], CL_TRUE, 0, f->o_bytes, a, 0, NULL, NULL) == CL_SUCCESS &&
             clEnqueueReadBuffer(q, f->out[1], CL_TRUE, 0, f->o_bytes, b, 0, NULL, NULL) == CL_SUCCESS;
  if (same && f->lse[0])
    same = clEnqueueReadBuffer(q, f->lse[0], CL_TRUE, 0, f->lse_bytes, la, 0, NULL, NULL) == CL_SUCCESS &&
           clEnqueueReadBuffer(q, f->lse[1], CL_TRUE, 0, f->lse_bytes, lb, 0, NULL, NULL) == CL_SUCCESS;
  if (!CHECKF(same, "%s, %s: reading the outputs failed", f->c->name, what)) goto out;
  size_t at = 0;
  while (at < f->o_bytes && a[at] == b[at]) at++;
  same = CHECKF(at == f->o_bytes, "%s, %s: out differs from clattn_forward's from byte %zu (slot %zu)", f->c->name,
                what, at, at / (f->o_slot * f->elem));
  if (f->lse[0] && memcmp(la, lb, f->lse_bytes) != 0)
    same = CHECKF(0, "%s, %s: lse differs from clattn_forward's", f->c->name, what);
out:
  free(a);
  free(b);
  free(la);
  free(lb);
  return same;
}

/* The step s of a sequence: lengths up and down (the split changing), q,
 * out and lse in turning slots. */
static clattn_step step_of(const fixture *f, int s) {
  const plan_case *c = f->c;
  clattn_step st = clattn_step_default();
  if (s % 5 == 4) return st; /* every fifth step as planned */
  if (s % 5 != 3) /* and kv_len as planned in another */
    st.kv_len = c->min_len + (int)(rnd() % (unsigned)(c->kv_len - c->min_len + 1));
  if (s % 3) st.q_offset = (size_t)(s % SLOTS) * f->q_slot;
  if (s % 4) st.out_offset = (size_t)((s * 5) % SLOTS) * f->o_slot;
  if (c->want_lse && s % 2) st.lse_offset = (size_t)((s * 5) % SLOTS) * f->lse_slot;
  return st;
}

/* Whether plans on ctx must replay command buffers updated in place: they
 * are wanted (CLATTN_COMMAND_BUFFER set and not 0, or unset on a GPU: the
 * library's rule) on a device that reports mutable dispatch. */
static int expect_in_place(clattn_context *ctx) {
  const char *env = getenv("CLATTN_COMMAND_BUFFER");
  cl_device_type type = 0;
  char ext[8192] = "";
  clGetDeviceInfo(clattn_cl_device(ctx), CL_DEVICE_TYPE, sizeof type, &type, NULL);
  clGetDeviceInfo(clattn_cl_device(ctx), CL_DEVICE_EXTENSIONS, sizeof ext, ext, NULL);
  const int wanted = env && *env ? strcmp(env, "0") != 0 : (type & CL_DEVICE_TYPE_GPU) != 0;
  return wanted && strstr(ext, "cl_khr_command_buffer_mutable_dispatch") != NULL;
}

static long g_in_place_kv; /* steps that changed kv_len through an in-place update */

/* A step's values as the kernels see them. */
typedef struct {
  int kv_len;
  size_t q, out, lse;
} step_at;

static step_at at_of(const fixture *f, const clattn_step *s) {
  return (step_at){s->kv_len ? s->kv_len : f->c->kv_len, s->q_offset == CLATTN_STEP_PLANNED ? 0 : s->q_offset,
                   s->out_offset == CLATTN_STEP_PLANNED ? 0 : s->out_offset,
                   s->lse_offset == CLATTN_STEP_PLANNED ? 0 : s->lse_offset};
}

/* With mutable dispatch expected: a fused plan's step replayed its command
 * buffer, updating it in place exactly when the step changed a value or a
 * grid but not the kernels (their count and objects) that ran before it. */
static void check_in_place(const fixture *f, const char *what, int n0, const clattn_launch *l0, int n1,
                           const clattn_launch *l1,
                           const step_at *prev, const step_at *now, long replays, long updates) {
  int same_kernels = n0 == n1, same_grids = 1;
  for (int i = 0; same_kernels && i < n1; i++) {
    same_kernels = l0[i].kernel == l1[i].kernel;
    same_grids &= memcmp(l0[i].global, l1[i].global, sizeof l1[i].global) == 0;
  }
  const int changed =
      prev->kv_len != now->kv_len || prev->q != now->q || prev->out != now->out || prev->lse != now->lse;
  const long want = same_kernels && (changed || !same_grids);
  CHECKF(replays == 1,
         "%s, %s: the device has mutable dispatch, yet the step enqueued its kernels instead of "
         "replaying the command buffer",
         f->c->name, what);
  CHECKF(updates == want,
         "%s, %s: %ld in-place updates of the command buffer, expected %ld (kernels %s, kv_len %d -> %d)", f->c->name,
         what, updates, want, same_kernels ? "unchanged" : "changed", prev->kv_len, now->kv_len);
  if (updates == 1 && prev->kv_len != now->kv_len) g_in_place_kv++;
}

/* Steps one at a time, each checked against the forward at once. */
static void steps_match_forward(fixture *f, clattn_plan *plan, const char *queue) {
  const plan_case *c = f->c;
  const int in_place = expect_in_place(f->ctx);
  const clattn_step planned = clattn_step_default();
  step_at prev = at_of(f, &planned);
  for (int s = 0; s < 16; s++) {
    clattn_step st = step_of(f, s);
    if (c->kv_lens && s % 2) { /* the kv_lens buffer's contents change between steps */
      int32_t lens[64];
      for (int b = 0; b < c->batch; b++) lens[b] = 1 + (int)(rnd() % (unsigned)c->kv_len);
      REQUIRE(clEnqueueWriteBuffer(clattn_cl_queue(f->ctx), f->kv_lens, CL_TRUE, 0, (size_t)c->batch * sizeof(int32_t),
                                   lens, 0, NULL, NULL) == CL_SUCCESS);
    }
    REQUIRE(poison(f) == 0);
    cl_event done = NULL;
    clattn_launch l0[3], l1[3]; /* a fused step's: at most 3 */
    const int n0 = clattn_plan_launches(plan, l0, 3);
    const long replays0 = ca_plan_replays(plan), updates0 = ca_plan_updates(plan);
    const clattn_status got = clattn_plan_enqueue(plan, &st, 0, NULL, &done);
    const long replays = ca_plan_replays(plan) - replays0, updates = ca_plan_updates(plan) - updates0;
    const int n1 = clattn_plan_launches(plan, l1, 3);
    char route[512];
    snprintf(route, sizeof route, "%s", clattn_last_route());
    if (done) {
      CHECK(clWaitForEvents(1, &done) == CL_SUCCESS);
      clReleaseEvent(done);
    }
    const clattn_params p = forward_of(f, &st);
    const clattn_status want = clattn_forward(f->ctx, &p, 0, NULL, NULL);
    char what[160];
    snprintf(what, sizeof what, "%s queue, step %d (kv_len %d)", queue, s, st.kv_len ? st.kv_len : c->kv_len);
    CHECKF(got == want, "%s, %s: status %s, clattn_forward's %s (%s)", c->name, what, clattn_status_string(got),
           clattn_status_string(want), clattn_last_error(f->ctx));
    CHECKF(strcmp(route, clattn_last_route()) == 0, "%s, %s: route \"%s\", clattn_forward's \"%s\"", c->name, what,
           route, clattn_last_route());
    CHECKF(got != CLATTN_OK || done != NULL, "%s, %s: no done event", c->name, what);
    if (got == CLATTN_OK)
      CHECKF(ca_plan_list_is_planners(plan), "%s, %s: the step's list is not the planner's", c->name, what);
    const step_at now = at_of(f, &st);
    if (in_place && !strncmp(route, "fused:", 6) && (got == CLATTN_OK || got == CLATTN_ERR_EMPTY_ROW))
      check_in_place(f, what, n0, l0, n1, l1, &prev, &now, replays, updates);
    prev = now;
    if (!outputs_equal(f, what)) return;
  }
}

/* Steps back to back behind a user event, each into its own slot (the
 * plan's scratch reused by each: on an out-of-order queue only the plan
 * orders them), then the forward calls into the forward's slots. */
static void queued_steps_match_forward(fixture *f, clattn_plan *plan, const char *queue) {
  const plan_case *c = f->c;
  clattn_step steps[SLOTS];
  cl_int e;
  REQUIRE(poison(f) == 0);
  cl_event gate = clCreateUserEvent(clattn_cl_context(f->ctx), &e), done[SLOTS] = {NULL};
  REQUIRE(e == CL_SUCCESS);
  int ok = 1;
  for (int s = 0; s < SLOTS; s++) {
    steps[s] = clattn_step_default();
    steps[s].kv_len = c->min_len + (int)(rnd() % (unsigned)(c->kv_len - c->min_len + 1));
    steps[s].q_offset = (size_t)((s + 1) % SLOTS) * f->q_slot;
    steps[s].out_offset = (size_t)s * f->o_slot;
    if (c->want_lse) steps[s].lse_offset = (size_t)s * f->lse_slot;
    ok &= CHECKF(clattn_plan_enqueue(plan, &steps[s], 1, &gate, &done[s]) == CLATTN_OK, "%s, %s queue: step %d: %s",
                 c->name, queue, s, clattn_last_error(f->ctx));
  }
  clSetUserEventStatus(gate, CL_COMPLETE);
  if (ok) CHECK(clWaitForEvents(SLOTS, done) == CL_SUCCESS);
  for (int s = 0; s < SLOTS; s++)
    if (done[s]) clReleaseEvent(done[s]);
  clReleaseEvent(gate);
  if (!ok) return;
  for (int s = 0; s < SLOTS; s++) {
    const clattn_params p = forward_of(f, &steps[s]);
    CHECK_STATUS(clattn_forward(f->ctx, &p, 0, NULL, NULL), CLATTN_OK);
  }
  char what[96];
  snprintf(what, sizeof what, "%s queue, %d steps queued behind one event", queue, SLOTS);
  outputs_equal(f, what);
}

static clattn_context *g_ooo; /* an embedded context on an out-of-order queue, or NULL */

static void cleanup(void) {
  clattn_destroy(g_ooo);
  g_ooo = NULL;
}

static clattn_context *ooo_context(void) {
  if (!g_ooo && (g_ooo = kc_out_of_order_context())) ct_cleanup = cleanup;
  return g_ooo;
}

static long g_replays;
static long g_patches; /* steps that took the last step's list without planning */

static void run_case(const plan_case *c, clattn_context *ctx, const char *queue) {
  if (c->algo == CLATTN_ALGO_GEMM && (!ca_gemm_available() || kc_algo_filtered_out(c->algo))) return;
  fixture f;
  if (!CHECKF(fixture_init(&f, c, ctx) == 0, "%s: buffers", c->name)) {
    fixture_free(&f);
    return;
  }
  clattn_plan *plan = NULL;
  if (CHECKF(clattn_plan_create(ctx, &f.p, &plan) == CLATTN_OK, "%s, %s queue: clattn_plan_create: %s", c->name, queue,
             clattn_last_error(ctx))) {
    steps_match_forward(&f, plan, queue);
    if (c->empty_rows != CLATTN_EMPTY_ERROR && c->kv_lens == 0) queued_steps_match_forward(&f, plan, queue);
    g_replays += ca_plan_replays(plan);
    g_patches += ca_plan_patches(plan);
    clattn_plan_release(plan);
  }
  fixture_free(&f);
}

static void plan_steps_equal_forward_bitwise(void) {
  g_replays = g_in_place_kv = g_patches = 0;
  for (size_t i = 0; i < N_CASES; i++) run_case(&g_cases[i], ct_context(), "in-order");
  clattn_context *ooo = ooo_context();
  for (size_t i = 0; ooo && i < N_CASES; i++) run_case(&g_cases[i], ooo, "out-of-order");
  const char *env = getenv("CLATTN_COMMAND_BUFFER");
  const int forced = env && strcmp(env, "1") == 0, off = env && strcmp(env, "0") == 0;
  printf(
      "  %zu plans per queue, 16 + %d steps each: bitwise clattn_forward's; %ld command-buffer replays, %ld steps "
      "changing kv_len in place, %ld steps on the last step's list (each the planner's)\n",
      N_CASES, SLOTS, g_replays, g_in_place_kv, g_patches);
  CHECKF(g_patches > 0, "no step took the last step's list without planning");
  if (expect_in_place(ct_context()))
    CHECKF(g_in_place_kv > 0, "the device has mutable dispatch, yet no step changed kv_len by an in-place update");
  if (off) CHECKF(g_replays == 0, "CLATTN_COMMAND_BUFFER=0, yet %ld steps replayed a command buffer", g_replays);
  if (forced) {
    char ext[8192] = "";
    clGetDeviceInfo(clattn_cl_device(ct_context()), CL_DEVICE_EXTENSIONS, sizeof ext, ext, NULL);
    if (strstr(ext, "cl_khr_command_buffer"))
      CHECKF(g_replays > 0, "CLATTN_COMMAND_BUFFER=1 on a device with cl_khr_command_buffer, yet no step replayed one");
  }
}

/* A decode loop's steps: kv_len one more each step, views as planned
 * (across 511 -> 512 where the case reaches it, where splitting may
 * start). A step whose kv_len the list holds takes it with kv_len written
 * in, without planning: each step's list must be the planner's, and its
 * output clattn_forward's. */
static void decode_steps_take_the_list_without_planning(void) {
  long patches = 0, steps = 0;
  const long forward_patches = ca_last_call_patches(ct_context());
  for (size_t i = 0; i < N_CASES; i++) {
    const plan_case *c = &g_cases[i];
    if (c->algo == CLATTN_ALGO_GEMM || c->empty_rows == CLATTN_EMPTY_ERROR) continue;
    fixture f;
    clattn_plan *plan = NULL;
    if (!CHECKF(fixture_init(&f, c, ct_context()) == 0, "%s: buffers", c->name) ||
        !CHECKF(clattn_plan_create(ct_context(), &f.p, &plan) == CLATTN_OK, "%s: %s", c->name,
                clattn_last_error(ct_context()))) {
      fixture_free(&f);
      continue;
    }
    int first = 512 - 8;
    if (first > c->kv_len - 15) first = c->kv_len - 15;
    if (first < c->min_len) first = c->min_len;
    for (int kv = first; kv < first + 16 && kv <= c->kv_len; kv++, steps++) {
      clattn_step st = clattn_step_default();
      st.kv_len = kv;
      REQUIRE(poison(&f) == 0);
      char what[96];
      snprintf(what, sizeof what, "decode step, kv_len %d", kv);
      const clattn_params p = forward_of(&f, &st);
      if (!CHECKF(clattn_plan_enqueue(plan, &st, 0, NULL, NULL) == CLATTN_OK, "%s, %s: %s", c->name, what,
                  clattn_last_error(ct_context())) ||
          !CHECKF(clattn_forward(ct_context(), &p, 0, NULL, NULL) == CLATTN_OK, "%s, %s: clattn_forward: %s", c->name,
                  what, clattn_last_error(ct_context())))
        break;
      CHECKF(ca_plan_list_is_planners(plan), "%s, %s: the step's list is not the planner's", c->name, what);
      CHECKF(ca_last_call_is_planners(ct_context()), "%s, %s: clattn_forward's list is not the planner's", c->name,
             what);
      outputs_equal(&f, what);
    }
    patches += ca_plan_patches(plan);
    clattn_plan_release(plan);
    fixture_free(&f);
  }
  const long calls = ca_last_call_patches(ct_context()) - forward_patches;
  printf(
      "  %ld decode steps, %ld on the last step's list with kv_len written in; clattn_forward: %ld on the last "
      "call's\n",
      steps, patches, calls);
  CHECKF(patches > 0, "no decode step took the last step's list");
  CHECKF(calls > 0, "no clattn_forward call took the last call's list");
}

/* ---------- refusals ---------- */

static int untouched(fixture *f) {
  cl_command_queue q = clattn_cl_queue(f->ctx);
  float *a = malloc(f->o_bytes);
  int ok = a && clEnqueueReadBuffer(q, f->out[0], CL_TRUE, 0, f->o_bytes, a, 0, NULL, NULL) == CL_SUCCESS;
  for (size_t i = 0; ok && i < f->o_bytes / sizeof *a; i++) ok = isnan(a[i]);
  free(a);
  return ok;
}

static void refuse(fixture *f, clattn_plan *plan, const clattn_step *s, clattn_status want, const char *field) {
  REQUIRE(poison(f) == 0);
  cl_event done = (cl_event)(uintptr_t)1;
  const clattn_status st = clattn_plan_enqueue(plan, s, 0, NULL, &done);
  CHECKF(st == want, "step with %s: %s, expected %s (%s)", field, clattn_status_string(st), clattn_status_string(want),
         clattn_last_error(f->ctx));
  CHECKF(strstr(clattn_last_error(f->ctx), field) != NULL, "the refusal does not name %s: %s", field,
         clattn_last_error(f->ctx));
  CHECKF(done == NULL, "a refused step handed out an event");
  CHECKF(untouched(f), "a refused step (%s) wrote an output", field);
}

static void refused_steps_leave_the_plan_usable(void) {
  fixture f;
  const plan_case c = g_cases[0]; /* fused decode, split keys, lse */
  REQUIRE(fixture_init(&f, &c, ct_context()) == 0);
  /* lse in out's buffer, after the out slots, so a moved out can overlap it */
  clattn_plan *plan = NULL;
  REQUIRE(clattn_plan_create(ct_context(), &f.p, &plan) == CLATTN_OK);
  clattn_step s = clattn_step_default();
  s.kv_len = c.kv_len + 1;
  refuse(&f, plan, &s, CLATTN_ERR_INVALID_ARGUMENT, "step.kv_len");
  s.kv_len = -3;
  refuse(&f, plan, &s, CLATTN_ERR_INVALID_ARGUMENT, "step.kv_len");
  s = clattn_step_default();
  s.q_offset = SLOTS * f.q_slot - f.q_slot + 1;
  refuse(&f, plan, &s, CLATTN_ERR_BUFFER_TOO_SMALL, "step.q_offset");
  s = clattn_step_default();
  s.out_offset = SIZE_MAX / 2;
  refuse(&f, plan, &s, CLATTN_ERR_INVALID_ARGUMENT, "step.out_offset");
  s = clattn_step_default();
  s.lse_offset = SLOTS * f.lse_slot;
  refuse(&f, plan, &s, CLATTN_ERR_BUFFER_TOO_SMALL, "step.lse_offset");
  CHECK_STATUS(clattn_plan_enqueue(plan, NULL, 1, NULL, NULL), CLATTN_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(clattn_plan_enqueue(NULL, NULL, 0, NULL, NULL), CLATTN_ERR_INVALID_ARGUMENT);
  /* the plan works after every refusal */
  REQUIRE(poison(&f) == 0);
  s = clattn_step_default();
  s.kv_len = 600;
  s.out_offset = 2 * f.o_slot;
  CHECK_STATUS(clattn_plan_enqueue(plan, &s, 0, NULL, NULL), CLATTN_OK);
  const clattn_params p = forward_of(&f, &s);
  CHECK_STATUS(clattn_forward(ct_context(), &p, 0, NULL, NULL), CLATTN_OK);
  outputs_equal(&f, "the step after the refusals");
  clattn_plan_release(plan);

  /* outputs that would overlap: out and lse in one buffer */
  fixture_free(&f);
  plan_case no_lse = c;
  no_lse.want_lse = 0;
  REQUIRE(fixture_init(&f, &no_lse, ct_context()) == 0);
  f.p.lse = (clattn_tensor){f.out[0], (SLOTS - 1) * f.o_slot, {(size_t)c.q_heads, 1, 1, 0}};
  REQUIRE(clattn_plan_create(ct_context(), &f.p, &plan) == CLATTN_OK);
  s = clattn_step_default();
  s.out_offset = (SLOTS - 1) * f.o_slot;
  CHECK_STATUS(clattn_plan_enqueue(plan, &s, 0, NULL, NULL), CLATTN_ERR_INVALID_ARGUMENT);
  CHECKF(strstr(clattn_last_error(NULL), "step.out_offset") && strstr(clattn_last_error(NULL), "share bytes"),
         "the overlap is not named: %s", clattn_last_error(NULL));
  s.out_offset = CLATTN_STEP_PLANNED;
  s.lse_offset = 0;
  CHECK_STATUS(clattn_plan_enqueue(plan, &s, 0, NULL, NULL), CLATTN_ERR_INVALID_ARGUMENT);
  s.lse_offset = f.o_slot; /* past out's slot 0: fine */
  CHECK_STATUS(clattn_plan_enqueue(plan, &s, 0, NULL, NULL), CLATTN_OK);
  clattn_plan_release(plan);

  /* a plan without lse refuses lse_offset */
  f.p.lse = (clattn_tensor){0};
  REQUIRE(clattn_plan_create(ct_context(), &f.p, &plan) == CLATTN_OK);
  s = clattn_step_default();
  s.lse_offset = 0;
  CHECK_STATUS(clattn_plan_enqueue(plan, &s, 0, NULL, NULL), CLATTN_ERR_INVALID_ARGUMENT);
  CHECKF(strstr(clattn_last_error(NULL), "step.lse_offset") != NULL, "%s", clattn_last_error(NULL));
  clattn_plan_release(plan);
  clattn_plan_release(NULL);
  fixture_free(&f);
}

/* ---------- creation ---------- */

/* A step keeps the aliasing rule where it moves q, out and lse: with q and
 * out in one buffer (q in slot 0, out in slot 3), a step moving q onto
 * out's bytes, or out onto q's, is refused naming the step's field, and
 * nothing is written; steps that keep them apart run. */
static void steps_moving_views_onto_each_other_are_refused(void) {
  fixture f;
  const plan_case c = g_cases[0]; /* fused decode, head_dim = value_dim: a q slot is an out slot */
  REQUIRE(fixture_init(&f, &c, ct_context()) == 0);
  f.p.out = f.p.q;
  f.p.out.offset = 3 * f.o_slot;
  clattn_plan *plan = NULL;
  REQUIRE(clattn_plan_create(ct_context(), &f.p, &plan) == CLATTN_OK);
  size_t n0 = 0, n1 = 0;
  unsigned char *before = ct_mem_bytes(f.q, &n0);
  clattn_step s = clattn_step_default();
  s.q_offset = 3 * f.q_slot;
  CHECK_STATUS(clattn_plan_enqueue(plan, &s, 0, NULL, NULL), CLATTN_ERR_INVALID_ARGUMENT);
  CHECKF(strstr(clattn_last_error(NULL), "step.q_offset") && strstr(clattn_last_error(NULL), "share bytes"),
         "q moved onto out: %s", clattn_last_error(NULL));
  s = clattn_step_default();
  s.out_offset = f.q_slot / 2; /* over q's second half */
  CHECK_STATUS(clattn_plan_enqueue(plan, &s, 0, NULL, NULL), CLATTN_ERR_INVALID_ARGUMENT);
  CHECKF(strstr(clattn_last_error(NULL), "step.out_offset") && strstr(clattn_last_error(NULL), "share bytes"),
         "out moved onto q: %s", clattn_last_error(NULL));
  CHECK(clFinish(clattn_cl_queue(ct_context())) == CL_SUCCESS);
  unsigned char *after = ct_mem_bytes(f.q, &n1);
  CHECKF(before && after && n0 == n1 && memcmp(before, after, n0) == 0, "a refused step wrote q's buffer");
  s.q_offset = 1 * f.q_slot, s.out_offset = 4 * f.o_slot;
  CHECK_STATUS(clattn_plan_enqueue(plan, &s, 0, NULL, NULL), CLATTN_OK);
  CHECK(clFinish(clattn_cl_queue(ct_context())) == CL_SUCCESS);
  free(before);
  free(after);
  clattn_plan_release(plan);
  fixture_free(&f);
}

static void creation_refuses_what_forward_refuses(void) {
  fixture f;
  REQUIRE(fixture_init(&f, &g_cases[0], ct_context()) == 0);
  clattn_plan *plan = (clattn_plan *)(uintptr_t)1;
  CHECK_STATUS(clattn_plan_create(NULL, &f.p, &plan), CLATTN_ERR_INVALID_ARGUMENT);
  CHECK(plan == NULL);
  CHECK_STATUS(clattn_plan_create(ct_context(), NULL, &plan), CLATTN_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(clattn_plan_create(ct_context(), &f.p, NULL), CLATTN_ERR_INVALID_ARGUMENT);
  static const char *const bad[] = {"kv_heads not dividing q_heads", "a view past its buffer", "weights with FUSED"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    clattn_params p = f.p;
    if (i == 0) p.kv_heads = 3;
    if (i == 1) p.kv_len = g_cases[0].kv_len + 1;
    if (i == 2) p.weights = p.out;
    const clattn_status want = clattn_forward(ct_context(), &p, 0, NULL, NULL);
    char msg[512];
    snprintf(msg, sizeof msg, "%s", clattn_last_error(NULL));
    plan = (clattn_plan *)(uintptr_t)1;
    const clattn_status got = clattn_plan_create(ct_context(), &p, &plan);
    CHECKF(got == want && want != CLATTN_OK, "%s: plan %s, forward %s", bad[i], clattn_status_string(got),
           clattn_status_string(want));
    CHECKF(strcmp(msg, clattn_last_error(NULL)) == 0, "%s: plan says \"%s\", forward \"%s\"", bad[i],
           clattn_last_error(NULL), msg);
    CHECK(plan == NULL);
  }
  fixture_free(&f);
}

static cl_uint refs(cl_mem m) {
  cl_uint n = 0;
  clGetMemObjectInfo(m, CL_MEM_REFERENCE_COUNT, sizeof n, &n, NULL);
  return n;
}

static void plan_retains_the_views_until_released(void) {
  fixture f;
  REQUIRE(fixture_init(&f, &g_cases[0], ct_context()) == 0);
  const cl_uint q0 = refs(f.q), out0 = refs(f.out[0]);
  clattn_plan *plan = NULL;
  if (CHECK(clattn_plan_create(ct_context(), &f.p, &plan) == CLATTN_OK)) {
    /* (a recorded command buffer may hold references of its own) */
    CHECK(refs(f.q) > q0 && refs(f.out[0]) > out0);
    clattn_plan_release(plan);
    CHECK(refs(f.q) == q0 && refs(f.out[0]) == out0);
  }
  fixture_free(&f);
}

int main(int argc, char **argv) {
  static const ct_test tests[] = {
      CT_TEST(plan_steps_equal_forward_bitwise),
      CT_TEST(decode_steps_take_the_list_without_planning),
      CT_TEST(refused_steps_leave_the_plan_usable),
      CT_TEST(steps_moving_views_onto_each_other_are_refused),
      CT_TEST(creation_refuses_what_forward_refuses),
      CT_TEST(plan_retains_the_views_until_released),
  };
  return ct_main(argc, argv, tests, sizeof tests / sizeof tests[0]);
}
