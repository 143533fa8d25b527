/*
 * The caller's modifiers on their own: block masks (clattn_block_mask_*)
 * and the modifiers evaluated at given points (clattn_modifier_eval, the
 * fp64 reference's way to run them), each through cl/modifier.cl.
 */
#include <stdlib.h>
#include <string.h>

#include "api/api.h"
#include "plan/fill.h"

#define BAD(...) ca_fail(CLATTN_ERR_INVALID_ARGUMENT, __VA_ARGS__)

enum { DEFAULT_BLOCK = 128 };

/* The caller's params read through its struct_size, with modifiers, checked. */
static clattn_status read_params(clattn_context *ctx, const clattn_params *in, clattn_params *p, const char *call) {
  clattn_status st;
  if (!ctx) return BAD("%s: ctx is NULL", call);
  if (!in) return BAD("%s: params is NULL", call);
  if ((st = ca_params_in(in, p, "params"))) return st;
  if (!p->score_mod && !p->mask_mod) return BAD("%s: params has neither score_mod nor mask_mod", call);
  p->block_mask = NULL;
  ca_views vs;
  ca_views_init(&vs, ctx->context);
  return ca_check_modifiers(&vs, p);
}

/* Runs one kernel of the modifier program of p and waits for it. */
static clattn_status run_one(clattn_context *ctx, const clattn_params *p, const char *kernel, const size_t *global,
                             int n_bufs, const ca_buf *bufs, size_t size, const void *args) {
  ca_list l;
  ca_list_init(&l, kernel);
  ca_program prog;
  const ca_program_key key = ca_modifier_key(p);
  clattn_status st = ca_plan_program(ctx, &key, &l, &prog);
  if (st == CLATTN_OK) {
    ca_list_kernel(&l, prog.program, kernel, 3, global, NULL);
    ca_list_args(&l, n_bufs, bufs, size, args);
    cl_event done = NULL;
    if ((st = ca_run(ctx, &l, 0, NULL, &done)) == CLATTN_OK) {
      const cl_int err = clWaitForEvents(1, &done);
      if (err != CL_SUCCESS) st = ca_cl_fail(err, "clWaitForEvents(modifier)");
    }
    if (done) clReleaseEvent(done);
  }
  ca_list_free(&l);
  return st;
}

static clattn_status device_buffer(clattn_context *ctx, cl_mem_flags flags, size_t bytes, void *host, cl_mem *out,
                                   const char *what) {
  cl_int err = CL_SUCCESS;
  *out = clCreateBuffer(ctx->context, flags, bytes ? bytes : 1, host, &err);
  return err == CL_SUCCESS ? CLATTN_OK : ca_cl_fail(err, what);
}

static clattn_status read_back(clattn_context *ctx, cl_mem m, size_t bytes, void *host, const char *what) {
  const cl_int err = clEnqueueReadBuffer(ctx->queue, m, CL_TRUE, 0, bytes, host, 0, NULL, NULL);
  return err == CL_SUCCESS ? CLATTN_OK : ca_cl_fail(err, what);
}

clattn_status clattn_block_mask_create(clattn_context *ctx, const clattn_params *in, int block_q, int block_k,
                                       clattn_block_mask **out) {
  if (!out) return BAD("clattn_block_mask_create: out is NULL");
  *out = NULL;
  clattn_params p;
  clattn_status st = read_params(ctx, in, &p, "clattn_block_mask_create");
  if (st != CLATTN_OK) return st;
  if (!p.mask_mod) return BAD("clattn_block_mask_create: mask_mod is NULL (a block mask classes its blocks)");
  if (p.batch <= 0 || p.q_heads <= 0 || p.q_len <= 0 || p.kv_len <= 0)
    return BAD("clattn_block_mask_create: batch, q_heads, q_len and kv_len must be positive (got %d, %d, %d, %d)",
               p.batch, p.q_heads, p.q_len, p.kv_len);
  if (block_q < 0 || block_k < 0)
    return BAD("clattn_block_mask_create: block_q and block_k must be >= 0 (0: %d; got %d, %d)", DEFAULT_BLOCK,
               block_q, block_k);
  p.score_mod = NULL; /* the mask alone: one program per mask modifier */
  clattn_block_mask *bm = calloc(1, sizeof *bm);
  if (!bm) return ca_fail(CLATTN_ERR_OUT_OF_MEMORY, "clattn_block_mask_create: out of host memory");
  bm->batch = p.batch;
  bm->heads = p.q_heads;
  bm->q_len = p.q_len;
  bm->kv_len = p.kv_len;
  bm->block_q = block_q ? block_q : DEFAULT_BLOCK;
  bm->block_k = block_k ? block_k : DEFAULT_BLOCK;
  bm->q_blocks = (p.q_len + bm->block_q - 1) / bm->block_q;
  bm->kv_blocks = (p.kv_len + bm->block_k - 1) / bm->block_k;
  memcpy(bm->mask_hash, ca_mod_key_of(&p).hash, sizeof bm->mask_hash);
  memcpy(bm->captures, p.captures, sizeof bm->captures);
  memcpy(bm->capture_f, p.capture_f, sizeof bm->capture_f);
  memcpy(bm->capture_i, p.capture_i, sizeof bm->capture_i);
  const size_t n = (size_t)bm->batch * (size_t)bm->heads * (size_t)bm->q_blocks * (size_t)bm->kv_blocks;
  unsigned char *classes = malloc(n);
  if (!classes) st = ca_fail(CLATTN_ERR_OUT_OF_MEMORY, "clattn_block_mask_create: out of host memory");
  if (st == CLATTN_OK)
    st = device_buffer(ctx, CL_MEM_READ_WRITE, n, NULL, &bm->classes, "clCreateBuffer(block mask classes)");
  if (st == CLATTN_OK) {
    ca_args_mod_blocks a;
    ca_bufs_mod_blocks b;
    memset(&a, 0, sizeof a);
    memset(&b, 0, sizeof b);
    b.classes = ca_mem(bm->classes);
    a.heads = bm->heads;
    a.q_len = bm->q_len;
    a.kv_len = bm->kv_len;
    a.block_q = bm->block_q;
    a.block_k = bm->block_k;
    a.q_blocks = bm->q_blocks;
    a.kv_blocks = bm->kv_blocks;
    CA_FILL_MOD(b, a, &p);
    const size_t global[3] = {(size_t)bm->kv_blocks, (size_t)bm->q_blocks, (size_t)bm->batch * (size_t)bm->heads};
    st = run_one(ctx, &p, "mod_blocks", global, CA_NBUF(mod_blocks), (const ca_buf *)&b, sizeof a, &a);
  }
  if (st == CLATTN_OK) st = read_back(ctx, bm->classes, n, classes, "clEnqueueReadBuffer(block mask classes)");
  if (st == CLATTN_OK)
    for (size_t e = 0; e < n; e++) bm->counts[classes[e] < 3 ? classes[e] : 1]++;
  free(classes);
  if (st != CLATTN_OK) {
    clattn_block_mask_release(bm);
    return st;
  }
  *out = bm;
  return CLATTN_OK;
}

void clattn_block_mask_counts(const clattn_block_mask *bm, size_t *empty, size_t *partial, size_t *full) {
  if (empty) *empty = bm ? bm->counts[0] : 0;
  if (partial) *partial = bm ? bm->counts[1] : 0;
  if (full) *full = bm ? bm->counts[2] : 0;
}

void clattn_block_mask_release(clattn_block_mask *bm) {
  if (!bm) return;
  if (bm->classes) clReleaseMemObject(bm->classes);
  free(bm);
}

clattn_status clattn_modifier_eval(clattn_context *ctx, const clattn_params *in, size_t n, const cl_int *points,
                                   float *scores, unsigned char *allowed, float *grads) {
  clattn_params p;
  clattn_status st = read_params(ctx, in, &p, "clattn_modifier_eval");
  if (st != CLATTN_OK) return st;
  if (n == 0) return CLATTN_OK;
  if (!points || !scores || !allowed) return BAD("clattn_modifier_eval: points, scores and allowed are required");
  if (n > (size_t)INT32_MAX / 4) return BAD("clattn_modifier_eval: n %zu is more than one call evaluates", n);
  cl_mem at = NULL, s = NULL, ok = NULL, g = NULL;
  if ((st = device_buffer(ctx, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, 4 * n * sizeof(cl_int), (void *)points, &at,
                          "clCreateBuffer(modifier points)")) ||
      (st = device_buffer(ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, n * sizeof(float), scores, &s,
                          "clCreateBuffer(modifier scores)")) ||
      (st = device_buffer(ctx, CL_MEM_READ_WRITE, n, NULL, &ok, "clCreateBuffer(modifier verdicts)")) ||
      (grads && (st = device_buffer(ctx, CL_MEM_READ_WRITE, n * sizeof(float), NULL, &g,
                                    "clCreateBuffer(modifier derivatives)"))))
    goto done;
  ca_args_mod_eval a;
  ca_bufs_mod_eval b;
  memset(&a, 0, sizeof a);
  memset(&b, 0, sizeof b);
  b.at = ca_mem(at);
  b.scores = ca_mem(s);
  b.allowed = ca_mem(ok);
  b.grads = ca_mem(g);
  a.n = (int)n;
  CA_FILL_MOD(b, a, &p);
  const size_t global[3] = {n, 1, 1};
  if ((st = run_one(ctx, &p, "mod_eval", global, CA_NBUF(mod_eval), (const ca_buf *)&b, sizeof a, &a))) goto done;
  if ((st = read_back(ctx, s, n * sizeof(float), scores, "clEnqueueReadBuffer(modifier scores)"))) goto done;
  if ((st = read_back(ctx, ok, n, allowed, "clEnqueueReadBuffer(modifier verdicts)"))) goto done;
  if (grads) st = read_back(ctx, g, n * sizeof(float), grads, "clEnqueueReadBuffer(modifier derivatives)");
done:
  if (at) clReleaseMemObject(at);
  if (s) clReleaseMemObject(s);
  if (ok) clReleaseMemObject(ok);
  if (g) clReleaseMemObject(g);
  return st;
}
