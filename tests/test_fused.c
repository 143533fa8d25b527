/*
 * The fused path (CLATTN_ALGO_FUSED) and the merge of partial attention
 * states (clattn_merge_states): decode shapes through the split-KV path,
 * split vs unsplit (STAGED), chunked runs merged back into one, empty and
 * garbage partial states, the natural-log contract, merge validation, the
 * fused path's O((M + N) d) scratch, window/causal edges around the 16-key
 * block, and GQA rows sharing KV heads with per-head masks and biases.
 *
 * The split-KV path is taken when few row blocks would leave compute units
 * idle (ca_plan_splits, FlashAttention-2's rule over 4 slots per compute
 * unit on a CPU). It surely splits when the row blocks, ceil(group * q_len
 * / rows_per_item) * batch * kv_heads, fill at most half the slots and
 * kv_len >= 512: two splits then double the one wave's efficiency. The
 * tests predict that with 4 rows per work-item (a larger block makes fewer
 * row blocks) from the device's compute units, and see it taken through
 * clattn_peak_scratch_bytes: the partial states make a split call allocate
 * at least two (O, lse) states per output row beyond the packed K and V (or
 * nothing, where the fused path reads K and V in place). On a 2-unit CPU,
 * H=32/Hkv=8 decode does not split (8 row blocks); the MQA and H=8/Hkv=2
 * shapes do up to 2 query rows.
 */
#include <ctype.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kit_checks.h"

#define TOL       1e-5
#define MERGE_TOL 2e-6 /* merged chunk runs vs the full run: two fp32 errors */

/* ---------- helpers ---------- */

static cl_uint g_cus;

static cl_uint compute_units(void) {
  if (g_cus == 0) {
    cl_uint cu = 0;
    if (clGetDeviceInfo(clattn_cl_device(ct_context()), CL_DEVICE_MAX_COMPUTE_UNITS, sizeof cu, &cu, NULL) !=
            CL_SUCCESS ||
        cu == 0)
      cu = 1;
    g_cus = cu;
  }
  return g_cus;
}

static size_t round16(size_t x) { return (x + 15) / 16 * 16; }

/* flash_rows' keys per block, which the packed K^T and V are padded to:
 * from the context's description ("..., N keys per block"), 16 where it
 * names none (the work-group kernels, which pack nothing). */
static size_t g_key_block;

static size_t key_block(void) {
  if (g_key_block == 0) {
    const char *d = clattn_describe(ct_context());
    const char *at = d ? strstr(d, " keys per block") : NULL;
    const char *num = at;
    while (num && num > d && isdigit((unsigned char)num[-1])) num--;
    g_key_block = num && num < at ? strtoul(num, NULL, 10) : 16;
    if (g_key_block == 0) g_key_block = 16;
  }
  return g_key_block;
}

/* Whether the fused path surely splits this shape's keys (see the header;
 * rows per work-item 4: a larger register block makes fewer row blocks). */
static int split_expected(const cp_shape *s) {
  long group = s->q_heads / s->kv_heads;
  long items = (group * s->q_len + 3) / 4 * (long)s->batch * s->kv_heads;
  return items * 2 <= 4L * (long)compute_units() && s->kv_len >= 512;
}

/* Whether a fused call's peak scratch shows partial states: at least two
 * states of every output row beyond what the call needs without a split
 * (the packed K^T and V over kv_len padded to the key block, or nothing
 * where K and V are read in place). */
static int split_observed(const cp_shape *s, size_t peak) {
  const size_t n_pad = ((size_t)s->kv_len + key_block() - 1) / key_block() * key_block();
  size_t pack = (size_t)s->batch * s->kv_heads * n_pad *
                ((size_t)s->head_dim + round16((size_t)s->value_dim)) * sizeof(float);
  size_t rows = (size_t)s->batch * s->q_heads * s->q_len;
  size_t partial = peak >= pack ? peak - pack : peak;
  return partial >= 2 * rows * ((size_t)s->value_dim + 1) * sizeof(float);
}

/* Norm-wise relative error of x against ref (both float) over finite pairs;
 * *mismatch counts entries whose class differs (NaN vs not, unequal non-finite). */
static double rel_err_ff(const float *x, const float *ref, size_t n, long *mismatch) {
  double num = 0.0, den = 0.0;
  long mm = 0;
  for (size_t i = 0; i < n; i++) {
    double a = x[i], r = ref[i];
    if (isnan(a) != isnan(r)) {
      mm++;
      continue;
    }
    if (!isfinite(a) || !isfinite(r)) {
      if (!isnan(a) && a != r) mm++;
      continue;
    }
    num += (a - r) * (a - r);
    den += r * r;
  }
  if (mismatch) *mismatch = mm;
  return sqrt(num) / fmax(sqrt(den), 1e-300);
}

static long count_nan(const float *x, size_t n) {
  long c = 0;
  for (size_t i = 0; i < n; i++) c += isnan(x[i]) != 0;
  return c;
}

static float *dup_floats(const float *x, size_t n) {
  float *d = malloc((n ? n : 1) * sizeof(float));
  if (d && n) memcpy(d, x, n * sizeof(float));
  return d;
}

static cl_mem make_buf(size_t bytes, const void *host) {
  cl_int e = CL_SUCCESS;
  cl_mem m = clCreateBuffer(clattn_cl_context(ct_context()), CL_MEM_READ_WRITE | (host ? CL_MEM_COPY_HOST_PTR : 0),
                            bytes, (void *)host, &e);
  return e == CL_SUCCESS ? m : NULL;
}

static int read_floats(cl_mem m, float *host, size_t n) {
  return clEnqueueReadBuffer(clattn_cl_queue(ct_context()), m, CL_TRUE, 0, n * sizeof(float), host, 0, NULL, NULL) ==
         CL_SUCCESS;
}

static int fill_floats(cl_mem m, size_t n, float value) {
  cl_command_queue q = clattn_cl_queue(ct_context());
  return clEnqueueFillBuffer(q, m, &value, sizeof value, 0, n * sizeof(float), 0, NULL, NULL) == CL_SUCCESS &&
         clFinish(q) == CL_SUCCESS;
}

static void release(cl_mem *m) {
  if (*m) clReleaseMemObject(*m);
  *m = NULL;
}

/* A dense [B,H,M,C] view of buf at offset (C = 1 for lse: stride[3] 0). */
static clattn_tensor dense_view(cl_mem buf, size_t offset, int H, int M, int C) {
  clattn_tensor t;
  memset(&t, 0, sizeof t);
  t.buf = buf;
  t.offset = offset;
  t.stride[3] = C > 1 ? 1 : 0;
  t.stride[2] = (size_t)C;
  t.stride[1] = (size_t)M * C;
  t.stride[0] = (size_t)H * M * C;
  return t;
}

/* Runs pb with FUSED (peak scratch reset first), checks it against the
 * reference within TOL with no NaN, reruns and checks the raw outputs are
 * bitwise equal. Returns the peak scratch of the first run (0 on failure). */
static size_t fused_checked(cp_problem *pb, const char *label) {
  clattn_context *ctx = ct_context();
  char d[512], f[512];
  cp_shape shown = pb->shape;
  shown.algo = CLATTN_ALGO_FUSED;
  cp_describe(&shown, d, sizeof d);
  clattn_peak_scratch_bytes(ctx, 1);
  cp_result r;
  if (kc_run(pb, CLATTN_ALGO_FUSED, &r, __FILE__, __LINE__) <= 0) return 0;
  size_t peak = clattn_peak_scratch_bytes(ctx, 1);
  int ok = cp_result_ok(&r, TOL);
  CHECKF(ok, "%s: fused: %s\n      (%s)", label, cp_result_format(&r, f, sizeof f), d);
  if (r.status != CLATTN_OK) printf("      last error: %s\n", clattn_last_error(ctx));
  CHECKF(r.nan_out == 0 && r.nan_lse == 0, "%s: NaN in outputs (out %ld, lse %ld) (%s)", label, r.nan_out, r.nan_lse,
         d);
  float *o1 = dup_floats(pb->out_raw, pb->out_elems);
  float *l1 = dup_floats(pb->lse_raw, pb->lse_elems);
  cp_result r2;
  if (o1 && (pb->lse_elems == 0 || l1) && kc_run(pb, CLATTN_ALGO_FUSED, &r2, __FILE__, __LINE__) > 0) {
    CHECKF(memcmp(o1, pb->out_raw, pb->out_elems * sizeof(float)) == 0, "%s: two fused runs differ in out (%s)", label,
           d);
    CHECKF(pb->lse_elems == 0 || memcmp(l1, pb->lse_raw, pb->lse_elems * sizeof(float)) == 0,
           "%s: two fused runs differ in lse (%s)", label, d);
  }
  free(o1);
  free(l1);
  return peak;
}

/* ---------- 1. decode shapes ---------- */

static void fused_equals_reference_on_decode_shapes(void) {
  struct {
    int b, hq, hkv;
  } heads[] = {{1, 32, 8}, {2, 4, 1}, {1, 8, 2}};
  const int ms[] = {1, 2, 3}, ns[] = {513, 4099, 10000}, dims[] = {128, 40, 111};
  int idx = 0, split_cases = 0;
  double t0 = cp_now_ms();
  for (size_t hc = 0; hc < sizeof heads / sizeof heads[0]; hc++)
    for (size_t mi = 0; mi < 3; mi++)
      for (size_t ni = 0; ni < 3; ni++, idx++) {
        cp_shape s = cp_shape_default();
        const int N = ns[ni];
        s.algo = CLATTN_ALGO_FUSED;
        s.batch = heads[hc].b;
        s.q_heads = heads[hc].hq;
        s.kv_heads = heads[hc].hkv;
        s.q_len = ms[mi];
        s.kv_len = N;
        s.head_dim = s.value_dim = dims[idx % 3];
        s.want_lse = 1;
        s.poison_gaps = 1;
        s.layout = idx % 2 ? CP_BSHD : CP_BHSD;
        s.pad = idx % 2 ? 3 : 0;
        s.seed = 100 + (uint64_t)idx;
        int feature = idx % 4;
        switch (feature) {
          case 0: /* padding: kv_lens under causal */
            s.kv_lens = 1;
            s.causal = 1;
            break;
          case 1: /* sliding window with a random mask */
            s.causal = 1;
            s.window_left = N / 3;
            s.mask = CP_MASK_RANDOM;
            s.mask_bcast = CP_BCAST_ROW;
            break;
          case 2: /* padding, per-head mask and bias */
            s.kv_lens = 1;
            s.mask = CP_MASK_RANDOM;
            s.bias = CP_BIAS_RANDOM;
            s.bias_amp = 2.0;
            break;
          default: /* everything at once */
            s.kv_lens = 1;
            s.causal = 1;
            s.window_left = N / 2;
            s.mask = CP_MASK_RANDOM;
            s.mask_density = 0.8;
            s.bias = CP_BIAS_RANDOM;
            s.bias_bcast = CP_BCAST_HEAD;
            break;
        }
        cp_problem *pb;
        KC_BUILD(pb, &s);
        if (pb->kv_lens) {
          /* deterministic lengths off the 16-key blocks: nearly all, about half
           * (with window_left N/2 under causal, batch 1's rows are empty) */
          for (int b = 0; b < s.batch; b++) pb->kv_lens[b] = b == 0 ? N - 5 : N / 2 - 9;
        }
        cp_poison_disallowed(pb); /* NaN/Inf past kv_lens, outside the window, masked */
        char label[64];
        snprintf(label, sizeof label, "decode case %d", idx);
        size_t peak = fused_checked(pb, label);
        int want = split_expected(&s), seen = peak ? split_observed(&s, peak) : 0;
        char d[512];
        printf("  case %2d split %s/%s peak %zu: %s\n", idx, want ? "expected" : "not expected",
               seen ? "seen" : "not seen", peak, cp_describe(&s, d, sizeof d));
        if (want) {
          split_cases++;
          CHECKF(seen,
                 "%s: split-KV expected (%u compute units) but peak scratch %zu shows no "
                 "partial states",
                 label, compute_units(), peak);
        }
        cp_free(pb);
      }
  printf("  %d of %d cases expected to split (%u compute units), %.1f s\n", split_cases, idx, compute_units(),
         (cp_now_ms() - t0) / 1e3);
  CHECKF(split_cases >= idx / 3, "only %d of %d cases take the split path", split_cases, idx);
}

/* ---------- 2. split vs unsplit ---------- */

static void split_and_unsplit_agree(void) {
  cp_shape shapes[3];
  cp_shape s = cp_shape_default();
  s.q_heads = 4;
  s.kv_heads = 1;
  s.q_len = 1;
  s.kv_len = 4099;
  s.head_dim = s.value_dim = 128;
  s.kv_lens = 1;
  s.causal = 1;
  s.want_lse = 1;
  s.poison_disallowed = 1;
  s.seed = 21;
  shapes[0] = s;
  s = cp_shape_default();
  s.batch = 2;
  s.q_heads = 4;
  s.kv_heads = 1;
  s.q_len = 2;
  s.kv_len = 10000;
  s.head_dim = s.value_dim = 111;
  s.mask = CP_MASK_RANDOM;
  s.bias = CP_BIAS_RANDOM;
  s.want_lse = 1;
  s.layout = CP_BSHD;
  s.pad = 5;
  s.poison_gaps = 1;
  s.poison_disallowed = 1;
  s.seed = 22;
  shapes[1] = s;
  s = cp_shape_default();
  s.q_heads = 8;
  s.kv_heads = 2;
  s.q_len = 2;
  s.kv_len = 513;
  s.head_dim = 40;
  s.value_dim = 40;
  s.causal = 1;
  s.window_left = 300;
  s.want_lse = 1;
  s.seed = 23;
  shapes[2] = s;
  for (int c = 0; c < 3; c++) {
    cp_problem *pb;
    KC_BUILD(pb, &shapes[c]);
    CHECKF(split_expected(&shapes[c]), "case %d: the shape should split on this device", c);
    clattn_peak_scratch_bytes(ct_context(), 1);
    if (KC_RUN_OK(pb, CLATTN_ALGO_FUSED, TOL) > 0) {
      size_t peak = clattn_peak_scratch_bytes(ct_context(), 1);
      CHECKF(split_observed(&shapes[c], peak), "case %d: fused did not split (peak %zu)", c, peak);
      float *fo = dup_floats(pb->out, pb->out_count), *fl = dup_floats(pb->lse, pb->lse_count);
      if (fo && fl && KC_RUN_OK(pb, CLATTN_ALGO_STAGED, TOL) > 0) {
        long mo = 0, ml = 0;
        double eo = rel_err_ff(fo, pb->out, pb->out_count, &mo);
        double el = rel_err_ff(fl, pb->lse, pb->lse_count, &ml);
        printf("  case %d: fused vs staged: out %.3g lse %.3g\n", c, eo, el);
        CHECKF(eo <= TOL && mo == 0, "case %d: fused vs staged out: err %.3g, %ld mismatches", c, eo, mo);
        CHECKF(el <= TOL && ml == 0, "case %d: fused vs staged lse: err %.3g, %ld mismatches", c, el, ml);
      }
      free(fo);
      free(fl);
    }
    cp_free(pb);
  }
}

/* Under EMPTY_ERROR the split path raises CLATTN_ERR_EMPTY_ROW only for a
 * row that is empty in every split, not for a split range that saw no key. */
static void fused_split_reports_only_rows_empty_in_every_split(void) {
  for (int with_empty = 0; with_empty < 2; with_empty++) {
    cp_shape s = cp_shape_default();
    s.batch = 2;
    s.q_heads = 4;
    s.kv_heads = 1;
    s.q_len = 1;
    s.kv_len = 4099;
    s.head_dim = s.value_dim = 64;
    s.causal = 1;
    s.window_left = 100;
    s.kv_lens = 1;
    s.want_lse = 1;
    s.empty_rows = CLATTN_EMPTY_ERROR;
    s.algo = CLATTN_ALGO_FUSED;
    s.seed = 41 + (uint64_t)with_empty;
    cp_problem *pb;
    KC_BUILD(pb, &s);
    /* only the last split range holds allowed keys; batch 1's row is empty
     * when its cache ends before the window */
    pb->kv_lens[0] = 4099;
    pb->kv_lens[1] = with_empty ? 1000 : 4050;
    cp_poison_disallowed(pb);
    clattn_peak_scratch_bytes(ct_context(), 1);
    cp_result r;
    if (kc_run(pb, CLATTN_ALGO_FUSED, &r, __FILE__, __LINE__) > 0) {
      size_t peak = clattn_peak_scratch_bytes(ct_context(), 1);
      char f[512];
      CHECKF(split_observed(&s, peak), "expected a split (peak %zu)", peak);
      CHECK(r.empty_rows == (with_empty ? 4 : 0));
      CHECKF(r.status == (with_empty ? CLATTN_ERR_EMPTY_ROW : CLATTN_OK), "kv_lens[1] = %d: %s (%s)", pb->kv_lens[1],
             clattn_status_string(r.status), cp_result_format(&r, f, sizeof f));
      /* the outputs hold the EMPTY_ZERO result either way */
      CHECKF(r.mismatch_out == 0 && r.mismatch_lse == 0 && r.err_out <= TOL && r.err_lse <= TOL, "kv_lens[1] = %d: %s",
             pb->kv_lens[1], cp_result_format(&r, f, sizeof f));
    }
    cp_free(pb);
  }
}

/* ---------- 3. chunked runs merged ---------- */

/* Runs pb (non-causal, no window) over the key chunks separately, each
 * writing its (O, lse) state into one stacked buffer, merges the states and
 * compares with the single full run of the same algorithm. */
static void chunk_merge_case(cp_problem *pb, const int *chunks, int n_chunks, clattn_algo algo, const char *label) {
  clattn_context *ctx = ct_context();
  const clattn_params *p = &pb->params;
  const int B = p->batch, H = p->q_heads, M = p->q_len, N = p->kv_len, dv = p->value_dim;
  const size_t rows = (size_t)B * H * M, o_state = rows * (size_t)dv;
  int total = 0;
  for (int c = 0; c < n_chunks; c++) total += chunks[c];
  REQUIREF(total == N, "%s: chunks sum to %d, not %d", label, total, N);
  REQUIRE(p->causal == 0 && p->window_left < 0 && p->window_right < 0);

  /* the single full run */
  if (KC_RUN_OK(pb, algo, TOL) <= 0) return;
  float *full_o = dup_floats(pb->out, pb->out_count), *full_l = dup_floats(pb->lse, pb->lse_count);
  cl_mem o_stack = make_buf((size_t)n_chunks * o_state * sizeof(float), NULL);
  cl_mem l_stack = make_buf((size_t)n_chunks * rows * sizeof(float), NULL);
  cl_mem m_out = make_buf(o_state * sizeof(float), NULL);
  cl_mem m_lse = make_buf(rows * sizeof(float), NULL);
  cl_mem lens[8] = {NULL};
  float *got_o = malloc(o_state * sizeof(float)), *got_l = malloc(rows * sizeof(float));
  if (!CHECK(full_o && full_l && o_stack && l_stack && m_out && m_lse && got_o && got_l && n_chunks <= 8)) goto done;
  CHECK(fill_floats(o_stack, (size_t)n_chunks * o_state, NAN));
  CHECK(fill_floats(l_stack, (size_t)n_chunks * rows, NAN));
  CHECK(fill_floats(m_out, o_state, NAN));
  CHECK(fill_floats(m_lse, rows, NAN));

  int j0 = 0, empty_states = 0;
  for (int c = 0; c < n_chunks; j0 += chunks[c], c++) {
    clattn_params cp = *p;
    cp.algo = algo;
    cp.kv_len = chunks[c];
    cp.k.offset += (size_t)j0 * p->k.stride[2];
    cp.v.offset += (size_t)j0 * p->v.stride[2];
    if (cp.mask.buf) cp.mask.offset += (size_t)j0 * p->mask.stride[3];
    if (cp.bias.buf) cp.bias.offset += (size_t)j0 * p->bias.stride[3];
    if (pb->kv_lens) {
      int32_t l[8];
      for (int b = 0; b < B && b < 8; b++) {
        long v = (long)pb->kv_lens[b] - j0;
        l[b] = (int32_t)(v < 0 ? 0 : v > chunks[c] ? chunks[c] : v);
        empty_states += l[b] == 0;
      }
      REQUIRE(B <= 8);
      lens[c] = make_buf((size_t)B * sizeof(int32_t), l);
      REQUIRE(lens[c] != NULL);
      cp.kv_lens = lens[c];
    }
    cp.out = dense_view(o_stack, (size_t)c * o_state, H, M, dv);
    cp.lse = dense_view(l_stack, (size_t)c * rows, H, M, 1);
    clattn_status st = clattn_forward(ctx, &cp, 0, NULL, NULL);
    CHECKF(st == CLATTN_OK, "%s: chunk %d (%d keys at %d): %s: %s", label, c, chunks[c], j0, clattn_status_string(st),
           clattn_last_error(ctx));
  }
  clattn_merge_params mp;
  memset(&mp, 0, sizeof mp);
  mp.n_states = n_chunks;
  mp.batch = B;
  mp.heads = H;
  mp.q_len = M;
  mp.value_dim = dv;
  mp.o = dense_view(o_stack, 0, H, M, dv);
  mp.lse = dense_view(l_stack, 0, H, M, 1);
  mp.o_state_stride = o_state;
  mp.lse_state_stride = rows;
  mp.out = dense_view(m_out, 0, H, M, dv);
  mp.out_lse = dense_view(m_lse, 0, H, M, 1);
  mp.empty_rows = CLATTN_EMPTY_ZERO;
  clattn_status st = clattn_merge_states(ctx, &mp, 0, NULL, NULL);
  CHECK_STATUS(st, CLATTN_OK);
  CHECK(clFinish(clattn_cl_queue(ctx)) == CL_SUCCESS);
  if (!CHECK(read_floats(m_out, got_o, o_state) && read_floats(m_lse, got_l, rows))) goto done;
  /* the dense gathers of pb are [B,H,M,dv] / [B,H,M]: the same order as m_out */
  long mo = 0, ml = 0;
  double eo = rel_err_ff(got_o, full_o, o_state, &mo);
  double el = rel_err_ff(got_l, full_l, rows, &ml);
  double ro = cp_rel_err(got_o, pb->ref_out, o_state), rl = cp_rel_err(got_l, pb->ref_lse, rows);
  double fo = cp_rel_err(full_o, pb->ref_out, o_state), fl = cp_rel_err(full_l, pb->ref_lse, rows);
  printf(
      "  %s, %s, %d chunks (%d empty chunk rows): merged vs full out %.3g lse %.3g; vs "
      "reference: merged out %.3g lse %.3g, full out %.3g lse %.3g\n",
      label, clattn_algo_name(algo), n_chunks, empty_states, eo, el, ro, rl, fo, fl);
  CHECKF(mo == 0 && ml == 0 && count_nan(got_o, o_state) == 0 && count_nan(got_l, rows) == 0,
         "%s, %s: class mismatches out %ld lse %ld", label, clattn_algo_name(algo), mo, ml);
  /* Each fp32 run lies ~1e-6 from the fp64 reference on its own, so the
   * merged and full runs can differ by the sum of two such errors; the
   * merge itself must cost no accuracy against the reference. */
  CHECKF(eo <= MERGE_TOL, "%s, %s: merged out vs full run: %.3g", label, clattn_algo_name(algo), eo);
  CHECKF(el <= MERGE_TOL, "%s, %s: merged lse vs full run: %.3g", label, clattn_algo_name(algo), el);
  CHECKF(ro <= fmax(1e-6, 1.5 * fo) && rl <= fmax(1e-6, 1.5 * fl),
         "%s, %s: merged vs reference: out %.3g lse %.3g; the full run's: out %.3g lse %.3g", label,
         clattn_algo_name(algo), ro, rl, fo, fl);
done:
  for (int c = 0; c < 8; c++) release(&lens[c]);
  release(&o_stack);
  release(&l_stack);
  release(&m_out);
  release(&m_lse);
  free(full_o);
  free(full_l);
  free(got_o);
  free(got_l);
}

static void merge_of_chunk_runs_equals_single_run(void) {
  static const int four[] = {1000, 37, 2000, 1062};
  static const int two[] = {2049, 2050};
  static const int five[] = {16, 1001, 5, 2000, 1077};
  static const int three[] = {700, 1, 3398};
  const clattn_algo algos[] = {CLATTN_ALGO_FUSED, CLATTN_ALGO_STAGED};

  /* decode-like with a random mask, a bias and kv_lens that leave some chunks empty */
  cp_shape s = cp_shape_default();
  s.batch = 2;
  s.q_heads = 4;
  s.kv_heads = 1;
  s.q_len = 2;
  s.kv_len = 4099;
  s.head_dim = s.value_dim = 64;
  s.mask = CP_MASK_RANDOM;
  s.bias = CP_BIAS_RANDOM;
  s.want_lse = 1;
  s.kv_lens = 1;
  s.layout = CP_BSHD;
  s.pad = 2;
  s.poison_gaps = 1;
  s.seed = 31;
  cp_problem *pb;
  KC_BUILD(pb, &s);
  pb->kv_lens[0] = 4099;
  pb->kv_lens[1] = 1020; /* inside chunk 2 of "four": chunks 3 and 4 are empty */
  cp_poison_disallowed(pb);
  for (int a = 0; a < 2; a++) {
    chunk_merge_case(pb, four, 4, algos[a], "decode 1000/37/2000/1062");
    chunk_merge_case(pb, three, 3, algos[a], "decode 700/1/3398");
  }
  cp_free(pb);

  /* plain prefill-like rows, dk != dv */
  s = cp_shape_default();
  s.q_heads = 2;
  s.kv_heads = 2;
  s.q_len = 37;
  s.kv_len = 4099;
  s.head_dim = 40;
  s.value_dim = 40;
  s.want_lse = 1;
  s.seed = 32;
  KC_BUILD(pb, &s);
  for (int a = 0; a < 2; a++) {
    chunk_merge_case(pb, two, 2, algos[a], "prefill 2049/2050");
    chunk_merge_case(pb, five, 5, algos[a], "prefill 16/1001/5/2000/1077");
  }
  cp_free(pb);
}

/* ---------- merge on hand-made states ---------- */

typedef struct {
  int S, B, H, M, dv;
  size_t rows, o_state;
  float *o, *lse; /* host states [S][B,H,M,dv], [S][B,H,M] */
  cl_mem o_buf, lse_buf, out_buf, out_lse_buf;
} states;

static int states_init(states *st, int S, int B, int H, int M, int dv) {
  memset(st, 0, sizeof *st);
  st->S = S;
  st->B = B;
  st->H = H;
  st->M = M;
  st->dv = dv;
  st->rows = (size_t)B * H * M;
  st->o_state = st->rows * (size_t)dv;
  st->o = calloc((size_t)S * st->o_state, sizeof(float));
  st->lse = calloc((size_t)S * st->rows, sizeof(float));
  return st->o && st->lse;
}

static int states_upload(states *st) {
  st->o_buf = make_buf((size_t)st->S * st->o_state * sizeof(float), st->o);
  st->lse_buf = make_buf((size_t)st->S * st->rows * sizeof(float), st->lse);
  st->out_buf = make_buf(st->o_state * sizeof(float), NULL);
  st->out_lse_buf = make_buf(st->rows * sizeof(float), NULL);
  return st->o_buf && st->lse_buf && st->out_buf && st->out_lse_buf;
}

static void states_free(states *st) {
  release(&st->o_buf);
  release(&st->lse_buf);
  release(&st->out_buf);
  release(&st->out_lse_buf);
  free(st->o);
  free(st->lse);
}

static clattn_merge_params states_params(const states *st) {
  clattn_merge_params mp;
  memset(&mp, 0, sizeof mp);
  mp.n_states = st->S;
  mp.batch = st->B;
  mp.heads = st->H;
  mp.q_len = st->M;
  mp.value_dim = st->dv;
  mp.o = dense_view(st->o_buf, 0, st->H, st->M, st->dv);
  mp.lse = dense_view(st->lse_buf, 0, st->H, st->M, 1);
  mp.o_state_stride = st->o_state;
  mp.lse_state_stride = st->rows;
  mp.out = dense_view(st->out_buf, 0, st->H, st->M, st->dv);
  mp.out_lse = dense_view(st->out_lse_buf, 0, st->H, st->M, 1);
  mp.empty_rows = CLATTN_EMPTY_ZERO;
  return mp;
}

/* fp64 merge of row r over the states listed in use[] (NULL = all). */
static void host_merge(const states *st, size_t r, const int *use, double *o, double *lse) {
  double m = -INFINITY;
  for (int s = 0; s < st->S; s++)
    if (!use || use[s]) m = fmax(m, (double)st->lse[(size_t)s * st->rows + r]);
  for (int c = 0; c < st->dv; c++) o[c] = 0.0;
  if (m == -INFINITY) {
    *lse = -INFINITY;
    return;
  }
  double total = 0.0;
  for (int s = 0; s < st->S; s++) {
    if (use && !use[s]) continue;
    double l = st->lse[(size_t)s * st->rows + r];
    if (l == -INFINITY) continue;
    double w = exp(l - m);
    total += w;
    for (int c = 0; c < st->dv; c++) o[c] += w * st->o[(size_t)s * st->o_state + r * st->dv + c];
  }
  for (int c = 0; c < st->dv; c++) o[c] /= total;
  *lse = m + log(total);
}

static uint64_t g_rng = 0xF05EDull;

static double urand(void) {
  g_rng ^= g_rng << 13;
  g_rng ^= g_rng >> 7;
  g_rng ^= g_rng << 17;
  return (double)(g_rng >> 11) * (1.0 / 9007199254740992.0);
}

static void merge_with_empty_partials_has_no_nan(void) {
  clattn_context *ctx = ct_context();
  states st;
  const int S = 4, B = 2, H = 3, M = 5, dv = 24;
  REQUIRE(states_init(&st, S, B, H, M, dv));
  const size_t rows = st.rows;
  /* states 1 and 3 are empty everywhere, their O garbage (NaN, Inf, 1e30);
   * in states 0 and 2 a few rows are empty too; batch 1's rows 0 and 3 of
   * every head are empty in every state */
  unsigned char *all_empty = calloc(rows, 1);
  REQUIRE(all_empty);
  for (int s = 0; s < S; s++)
    for (size_t r = 0; r < rows; r++) {
      int b = (int)(r / ((size_t)H * M)), i = (int)(r % (size_t)M);
      int row_empty = b == 1 && (i == 0 || i == 3);
      int empty = (s % 2 == 1) || row_empty || (s == 0 && r % 7 == 2) || (s == 2 && r % 11 == 5);
      /* empty in every state: batch 1's rows 0 and 3, and rows hit by both patterns */
      all_empty[r] = (unsigned char)(row_empty || (r % 7 == 2 && r % 11 == 5));
      float *o = st.o + (size_t)s * st.o_state + r * dv;
      if (empty) {
        st.lse[(size_t)s * rows + r] = -INFINITY;
        for (int c = 0; c < dv; c++) o[c] = c % 3 == 0 ? NAN : c % 3 == 1 ? INFINITY : 1e30f;
      } else {
        st.lse[(size_t)s * rows + r] = (float)(6.0 * urand() - 3.0);
        for (int c = 0; c < dv; c++) o[c] = (float)(2.0 * urand() - 1.0);
      }
    }
  REQUIRE(states_upload(&st));
  float *o_all = malloc(st.o_state * sizeof(float)), *l_all = malloc(rows * sizeof(float));
  float *o_two = malloc(st.o_state * sizeof(float)), *l_two = malloc(rows * sizeof(float));
  double *ref = malloc((size_t)dv * sizeof(double));
  if (!CHECK(o_all && l_all && o_two && l_two && ref)) goto done;

  /* all four states */
  clattn_merge_params mp = states_params(&st);
  CHECK(fill_floats(st.out_buf, st.o_state, NAN) && fill_floats(st.out_lse_buf, rows, NAN));
  CHECK_STATUS(clattn_merge_states(ctx, &mp, 0, NULL, NULL), CLATTN_OK);
  CHECK(read_floats(st.out_buf, o_all, st.o_state) && read_floats(st.out_lse_buf, l_all, rows));
  CHECKF(count_nan(o_all, st.o_state) == 0 && count_nan(l_all, rows) == 0, "NaN in merged outputs: out %ld lse %ld",
         count_nan(o_all, st.o_state), count_nan(l_all, rows));
  long bad_empty = 0;
  double worst = 0.0;
  for (size_t r = 0; r < rows; r++) {
    double rl;
    host_merge(&st, r, NULL, ref, &rl);
    CHECKF((rl == -INFINITY) == (all_empty[r] != 0), "test setup: row %zu", r);
    if (all_empty[r]) {
      int zero = l_all[r] == -INFINITY;
      for (int c = 0; c < dv; c++) zero &= o_all[r * dv + c] == 0.0f;
      bad_empty += !zero;
      continue;
    }
    CHECKF(kc_close(l_all[r], rl, 1e-6), "row %zu: lse %.9g, expected %.9g", r, l_all[r], rl);
    for (int c = 0; c < dv; c++) worst = fmax(worst, fabs(o_all[r * dv + c] - ref[c]));
  }
  CHECKF(bad_empty == 0, "%ld all-empty rows are not O = 0, lse = -inf", bad_empty);
  CHECKF(worst <= 1e-6, "merged O differs from the fp64 merge of the non-empty states by %.3g", worst);

  /* only states 0 and 2 (state stride doubled): the same result */
  clattn_merge_params two = mp;
  two.n_states = 2;
  two.o_state_stride = 2 * st.o_state;
  two.lse_state_stride = 2 * rows;
  CHECK(fill_floats(st.out_buf, st.o_state, NAN) && fill_floats(st.out_lse_buf, rows, NAN));
  CHECK_STATUS(clattn_merge_states(ctx, &two, 0, NULL, NULL), CLATTN_OK);
  CHECK(read_floats(st.out_buf, o_two, st.o_state) && read_floats(st.out_lse_buf, l_two, rows));
  long mo = 0, ml = 0;
  double eo = rel_err_ff(o_all, o_two, st.o_state, &mo), el = rel_err_ff(l_all, l_two, rows, &ml);
  CHECKF(mo == 0 && ml == 0 && eo <= 1e-7 && el <= 1e-7,
         "merge of all 4 vs of the 2 non-empty states: out %.3g lse %.3g, mismatches %ld/%ld", eo, el, mo, ml);
  printf("  4 states (2 empty) vs the 2 non-empty: bitwise %s\n",
         memcmp(o_all, o_two, st.o_state * sizeof(float)) == 0 && memcmp(l_all, l_two, rows * sizeof(float)) == 0
             ? "equal"
             : "different");

  /* EMPTY_ERROR: the same outputs, CLATTN_ERR_EMPTY_ROW */
  clattn_merge_params err = mp;
  err.empty_rows = CLATTN_EMPTY_ERROR;
  CHECK(fill_floats(st.out_buf, st.o_state, NAN) && fill_floats(st.out_lse_buf, rows, NAN));
  CHECK_STATUS(clattn_merge_states(ctx, &err, 0, NULL, NULL), CLATTN_ERR_EMPTY_ROW);
  CHECK(read_floats(st.out_buf, o_two, st.o_state) && read_floats(st.out_lse_buf, l_two, rows));
  CHECKF(memcmp(o_all, o_two, st.o_state * sizeof(float)) == 0 && memcmp(l_all, l_two, rows * sizeof(float)) == 0,
         "EMPTY_ERROR outputs differ from the EMPTY_ZERO result");

  /* EMPTY_ERROR over batch 0 only (no all-empty row, some empty states): OK */
  err.batch = 1;
  CHECK_STATUS(clattn_merge_states(ctx, &err, 0, NULL, NULL), CLATTN_OK);
  CHECK(clFinish(clattn_cl_queue(ctx)) == CL_SUCCESS);

done:
  free(all_empty);
  free(o_all);
  free(l_all);
  free(o_two);
  free(l_two);
  free(ref);
  states_free(&st);
}

/* ---------- natural log ---------- */

static void merge_uses_natural_log(void) {
  clattn_context *ctx = ct_context();
  states st;
  const int M = 4, dv = 5;
  REQUIRE(states_init(&st, 2, 1, 1, M, dv));
  const double la[] = {0.5, -100.0, 50.0, 3.0}, lb[] = {2.0, -101.0, 50.0, -3.0};
  const double oa[] = {1.0, -2.0, 0.25, 10.0}, ob[] = {3.0, 5.0, -0.75, -10.0};
  for (int i = 0; i < M; i++) {
    st.lse[i] = (float)la[i];
    st.lse[M + i] = (float)lb[i];
    for (int c = 0; c < dv; c++) {
      st.o[i * dv + c] = (float)(oa[i] * (c + 1));
      st.o[st.o_state + i * dv + c] = (float)(ob[i] * (c + 1));
    }
  }
  REQUIRE(states_upload(&st));
  clattn_merge_params mp = states_params(&st);
  CHECK_STATUS(clattn_merge_states(ctx, &mp, 0, NULL, NULL), CLATTN_OK);
  float o[4 * 5], l[4];
  if (CHECK(read_floats(st.out_buf, o, (size_t)M * dv) && read_floats(st.out_lse_buf, l, M))) {
    for (int i = 0; i < M; i++) {
      /* in the row's own scale: e^{lse} overflows nothing relative to the max */
      double m = fmax(la[i], lb[i]);
      double ea = exp(la[i] - m), eb = exp(lb[i] - m);
      double want_lse = m + log(ea + eb);
      double base2 = fmax(la[i], lb[i]) + log2(exp2(la[i] - m) + exp2(lb[i] - m));
      CHECKF(kc_close(l[i], want_lse, 1e-6),
             "row %d: lse %.9g, expected ln(e^%g + e^%g) = %.9g "
             "(base 2 would give %.9g)",
             i, l[i], la[i], lb[i], want_lse, base2);
      for (int c = 0; c < dv; c++) {
        double want = (ea * oa[i] * (c + 1) + eb * ob[i] * (c + 1)) / (ea + eb);
        CHECKF(kc_close(o[i * dv + c], want, 1e-6), "row %d col %d: O %.9g, expected %.9g", i, c, o[i * dv + c], want);
      }
    }
    /* the documented closed forms of rows 0 and 2 */
    CHECK_CLOSE(l[0], log(exp(0.5) + exp(2.0)), 1e-6);
    CHECK_CLOSE(l[2], 50.0 + log(2.0), 1e-6);
    CHECK_CLOSE(o[0], (exp(0.5) * 1.0 + exp(2.0) * 3.0) / (exp(0.5) + exp(2.0)), 1e-6);
  }
  states_free(&st);
}

/* ---------- merge validation ---------- */

static void merge_rejects_bad_params(void) {
  clattn_context *ctx = ct_context();
  states st;
  const int S = 3, B = 2, H = 2, M = 3, dv = 8;
  REQUIRE(states_init(&st, S, B, H, M, dv));
  for (size_t x = 0; x < (size_t)S * st.o_state; x++) st.o[x] = (float)(x % 13) * 0.1f;
  for (size_t x = 0; x < (size_t)S * st.rows; x++) st.lse[x] = (float)(x % 5) * 0.3f;
  REQUIRE(states_upload(&st));
  const float pattern = 1234.5f;
  float *o = malloc(st.o_state * sizeof(float)), *l = malloc(st.rows * sizeof(float));
  REQUIRE(o && l);
  const clattn_merge_params good = states_params(&st);
  struct {
    const char *what;
    clattn_merge_params mp;
    clattn_status want;
  } cases[20];
  int n = 0;
#define BAD_CASE(desc, edit, status) \
  do {                               \
    clattn_merge_params m_ = good;   \
    edit;                            \
    cases[n].what = desc;            \
    cases[n].mp = m_;                \
    cases[n].want = status;          \
    n++;                             \
  } while (0)
  BAD_CASE("n_states 0", m_.n_states = 0, CLATTN_ERR_INVALID_ARGUMENT);
  BAD_CASE("n_states -1", m_.n_states = -1, CLATTN_ERR_INVALID_ARGUMENT);
  BAD_CASE("o.buf NULL", m_.o.buf = NULL, CLATTN_ERR_INVALID_ARGUMENT);
  BAD_CASE("lse.buf NULL", m_.lse.buf = NULL, CLATTN_ERR_INVALID_ARGUMENT);
  BAD_CASE("out.buf NULL", m_.out.buf = NULL, CLATTN_ERR_INVALID_ARGUMENT);
  BAD_CASE("o_state_stride one too many", m_.o_state_stride += 1, CLATTN_ERR_BUFFER_TOO_SMALL);
  BAD_CASE("lse_state_stride one too many", m_.lse_state_stride += 1, CLATTN_ERR_BUFFER_TOO_SMALL);
  BAD_CASE("n_states one past the buffers", m_.n_states = S + 1, CLATTN_ERR_BUFFER_TOO_SMALL);
  BAD_CASE("o offset one too many", m_.o.offset = 1, CLATTN_ERR_BUFFER_TOO_SMALL);
  BAD_CASE("out broadcast over heads", m_.out.stride[1] = 0, CLATTN_ERR_INVALID_ARGUMENT);
  BAD_CASE("out_lse broadcast over rows", m_.out_lse.stride[2] = 0, CLATTN_ERR_INVALID_ARGUMENT);
  BAD_CASE("value_dim 0", m_.value_dim = 0, CLATTN_ERR_INVALID_ARGUMENT);
  /* the two outputs share bytes: the merge would overwrite O with lse or back */
  BAD_CASE("out_lse inside out", (m_.out_lse.buf = m_.out.buf, m_.out_lse.offset = 17), CLATTN_ERR_INVALID_ARGUMENT);
  BAD_CASE("out_lse at out's start", (m_.out_lse.buf = m_.out.buf, m_.out_lse.offset = m_.out.offset),
           CLATTN_ERR_INVALID_ARGUMENT);
  BAD_CASE("empty_rows 7", m_.empty_rows = (clattn_empty_rows)7, CLATTN_ERR_INVALID_ARGUMENT);
  BAD_CASE("out_dtype Q8_0", m_.out_dtype = CLATTN_Q8_0, CLATTN_ERR_INVALID_ARGUMENT);
  BAD_CASE("out_dtype INT8", m_.out_dtype = CLATTN_INT8, CLATTN_ERR_INVALID_ARGUMENT);
  BAD_CASE("out_dtype SAME", m_.out_dtype = CLATTN_DTYPE_SAME, CLATTN_ERR_INVALID_ARGUMENT);
  BAD_CASE("out_dtype 9", m_.out_dtype = (clattn_dtype)9, CLATTN_ERR_INVALID_ARGUMENT);
  /* an overflowing state stride: any rejection will do (checked below) */
  BAD_CASE("o_state_stride overflows", m_.o_state_stride = SIZE_MAX / 2, CLATTN_OK);
#undef BAD_CASE
  for (int c = 0; c < n; c++) {
    REQUIRE(fill_floats(st.out_buf, st.o_state, pattern) && fill_floats(st.out_lse_buf, st.rows, pattern));
    clattn_status got = clattn_merge_states(ctx, &cases[c].mp, 0, NULL, NULL);
    CHECK(clFinish(clattn_cl_queue(ctx)) == CL_SUCCESS);
    if (cases[c].want == CLATTN_OK)
      CHECKF(got != CLATTN_OK, "%s: accepted", cases[c].what);
    else
      CHECKF(got == cases[c].want, "%s: %s, expected %s (%s)", cases[c].what, clattn_status_string(got),
             clattn_status_string(cases[c].want), clattn_last_error(ctx));
    REQUIRE(read_floats(st.out_buf, o, st.o_state) && read_floats(st.out_lse_buf, l, st.rows));
    long touched = 0;
    for (size_t x = 0; x < st.o_state; x++) touched += o[x] != pattern;
    for (size_t x = 0; x < st.rows; x++) touched += l[x] != pattern;
    CHECKF(touched == 0, "%s: %ld output elements changed by a rejected call", cases[c].what, touched);
  }
  CHECK_STATUS(clattn_merge_states(NULL, &good, 0, NULL, NULL), CLATTN_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(clattn_merge_states(ctx, NULL, 0, NULL, NULL), CLATTN_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(clattn_merge_states(ctx, &good, 1, NULL, NULL), CLATTN_ERR_INVALID_ARGUMENT);
  /* and the unedited params are accepted */
  CHECK_STATUS(clattn_merge_states(ctx, &good, 0, NULL, NULL), CLATTN_OK);
  CHECK(clFinish(clattn_cl_queue(ctx)) == CL_SUCCESS);
  free(o);
  free(l);
  states_free(&st);
}

/* ---------- near the largest float ---------- */

/* Two states of equal lse whose O lies near FLT_MAX merge to that O (each
 * weight 1/2, normalised before it meets O), not to inf; in every
 * out_dtype the stored value is the f32 one rounded (f16's inf where the
 * value is past its range). */
static void merge_near_the_largest_float_stays_finite(void) {
  clattn_context *ctx = ct_context();
  states st;
  enum { DV = 5 };
  static const float big[DV] = {3e38f, -3e38f, 3.3e38f, 1.0f, 60000.0f};
  REQUIRE(states_init(&st, 2, 1, 1, 1, DV));
  for (int s = 0; s < 2; s++) {
    st.lse[s] = 0.7f;
    memcpy(st.o + (size_t)s * st.o_state, big, sizeof big);
  }
  REQUIRE(states_upload(&st));
  cl_mem out16 = make_buf(DV * 2, NULL);
  if (!CHECK(out16 != NULL)) goto done;
  const clattn_dtype types[] = {CLATTN_F32, CLATTN_F16, CLATTN_BF16};
  for (int t = 0; t < 3; t++) {
    clattn_merge_params mp = states_params(&st);
    mp.out_dtype = types[t];
    if (types[t] != CLATTN_F32) mp.out = dense_view(out16, 0, 1, 1, DV);
    CHECK_STATUS(clattn_merge_states(ctx, &mp, 0, NULL, NULL), CLATTN_OK);
    float got[DV];
    uint16_t bits[DV];
    if (types[t] == CLATTN_F32) {
      CHECK(read_floats(st.out_buf, got, DV));
    } else {
      CHECK(clEnqueueReadBuffer(clattn_cl_queue(ctx), out16, CL_TRUE, 0, sizeof bits, bits, 0, NULL, NULL) ==
            CL_SUCCESS);
      for (int c = 0; c < DV; c++) got[c] = types[t] == CLATTN_F16 ? cp_f16_value(bits[c]) : cp_bf16_value(bits[c]);
    }
    for (int c = 0; c < DV; c++)
      CHECKF(got[c] == cp_round_to(types[t], big[c]), "%s: column %d merged to %g, expected %g",
             ca_dtype_name(types[t]), c, got[c], cp_round_to(types[t], big[c]));
  }
done:
  release(&out16);
  states_free(&st);
}

/* ---------- merge into 16-bit outputs ---------- */

/* out_dtype F16 / BF16: each merged element is the f32 merge's rounded to
 * nearest even (bitwise), within the storage's rounding of the fp64 merge,
 * lse unchanged; elements outside the view keep their NaN; a view sized
 * for 16-bit elements is too small for f32. */
static void merge_stores_f16_and_bf16(void) {
  clattn_context *ctx = ct_context();
  states st;
  const int S = 3, B = 2, H = 3, M = 7, dv = 37, pad = 3;
  REQUIRE(states_init(&st, S, B, H, M, dv));
  for (int s = 0; s < S; s++)
    for (size_t r = 0; r < st.rows; r++) {
      const int empty = (s == 1 && r % 4 == 0) || (s == 2 && r % 5 == 1);
      st.lse[(size_t)s * st.rows + r] = empty ? -INFINITY : (float)(8.0 * urand() - 4.0);
      for (int c = 0; c < dv; c++)
        st.o[(size_t)s * st.o_state + r * dv + c] = empty ? NAN : (float)(300.0 * urand() - 150.0);
    }
  REQUIRE(states_upload(&st));
  const size_t n = st.o_state;
  float *o32 = malloc(n * sizeof(float)), *l32 = malloc(st.rows * sizeof(float)), *l16 = malloc(st.rows * 4);
  uint16_t *o16 = malloc((n + 2 * pad) * 2), *nan16 = malloc((n + 2 * pad) * 2);
  double *ref = malloc((size_t)dv * sizeof(double));
  cl_mem out16 = NULL;
  if (!CHECK(o32 && l32 && l16 && o16 && nan16 && ref)) goto done;
  clattn_merge_params mp = states_params(&st);
  CHECK_STATUS(clattn_merge_states(ctx, &mp, 0, NULL, NULL), CLATTN_OK);
  CHECK(read_floats(st.out_buf, o32, n) && read_floats(st.out_lse_buf, l32, st.rows));
  const clattn_dtype types[] = {CLATTN_F16, CLATTN_BF16};
  for (int t = 0; t < 2; t++) {
    const clattn_dtype dt = types[t];
    for (size_t e = 0; e < n + 2 * pad; e++) nan16[e] = dt == CLATTN_F16 ? 0x7e00u : 0x7fc0u;
    out16 = make_buf((n + 2 * pad) * 2, nan16);
    if (!CHECK(out16 != NULL)) goto done;
    clattn_merge_params m16 = mp;
    m16.out = dense_view(out16, pad, H, M, dv);
    m16.out_dtype = dt;
    CHECK(fill_floats(st.out_lse_buf, st.rows, NAN));
    CHECK_STATUS(clattn_merge_states(ctx, &m16, 0, NULL, NULL), CLATTN_OK);
    CHECK(clEnqueueReadBuffer(clattn_cl_queue(ctx), out16, CL_TRUE, 0, (n + 2 * pad) * 2, o16, 0, NULL, NULL) ==
          CL_SUCCESS);
    CHECK(read_floats(st.out_lse_buf, l16, st.rows) && memcmp(l16, l32, st.rows * 4) == 0);
    long differ = 0, outside = 0;
    double worst = 0.0, worst_rounding = 0.0;
    for (size_t e = 0; e < n; e++) {
      const uint16_t want = dt == CLATTN_F16 ? cp_f16_bits(o32[e]) : cp_bf16_bits(o32[e]);
      differ += o16[pad + e] != want;
    }
    for (int e = 0; e < pad; e++) outside += o16[e] != nan16[e] || o16[pad + n + e] != nan16[e];
    for (size_t r = 0; r < st.rows; r++) {
      double rl;
      host_merge(&st, r, NULL, ref, &rl);
      for (int c = 0; c < dv; c++) {
        const uint16_t got = o16[pad + r * dv + c];
        const double x = dt == CLATTN_F16 ? cp_f16_value(got) : cp_bf16_value(got);
        worst = fmax(worst, fabs(x - ref[c]));
        worst_rounding = fmax(worst_rounding, fabs((double)cp_round_to(dt, (float)ref[c]) - ref[c]));
      }
    }
    CHECKF(differ == 0 && outside == 0, "%s: %ld elements differ from the rounded f32 merge, %ld outside the view",
           dt == CLATTN_F16 ? "f16" : "bf16", differ, outside);
    /* FlashAttention's rule: at most twice the error of the fp64 merge stored in 16 bits */
    CHECKF(worst <= 2.0 * worst_rounding, "%s: max error %.3g vs the fp64 merge, rounding alone %.3g",
           dt == CLATTN_F16 ? "f16" : "bf16", worst, worst_rounding);
    m16.out_dtype = CLATTN_F32; /* the same view holds too few bytes for f32 */
    CHECK_STATUS(clattn_merge_states(ctx, &m16, 0, NULL, NULL), CLATTN_ERR_BUFFER_TOO_SMALL);
    release(&out16);
  }
done:
  release(&out16);
  free(o32);
  free(l32);
  free(l16);
  free(o16);
  free(nan16);
  free(ref);
  states_free(&st);
}

/* ---------- scratch ---------- */

/* fp64 output row (b, h, i) of a plain problem (no mask, bias, window, kv_lens). */
static void plain_row(const cp_problem *pb, int b, int h, int i, double *o) {
  const clattn_params *p = &pb->params;
  const int N = p->kv_len, dk = p->head_dim, dv = p->value_dim;
  const int hk = h / (p->q_heads / p->kv_heads);
  const double scale = 1.0 / sqrt((double)dk);
  double *s = malloc((size_t)N * sizeof(double));
  if (!s) return;
  double m = -INFINITY, total = 0.0;
  for (int j = 0; j < N; j++) {
    double acc = 0.0;
    for (int d = 0; d < dk; d++)
      acc += (double)pb->q[cp_index(&p->q, b, h, i, d)] * pb->k[cp_index(&p->k, b, hk, j, d)];
    s[j] = acc * scale;
    m = fmax(m, s[j]);
  }
  for (int c = 0; c < dv; c++) o[c] = 0.0;
  for (int j = 0; j < N; j++) {
    double w = exp(s[j] - m);
    total += w;
    for (int c = 0; c < dv; c++) o[c] += w * pb->v[cp_index(&p->v, b, hk, j, c)];
  }
  for (int c = 0; c < dv; c++) o[c] /= total;
  free(s);
}

/* Runs a plain square problem with algo without the full reference; checks
 * a few rows in fp64. Returns the peak scratch (0 on failure). */
/* Whether the last call's kernels hold scratch of their own: packed K/V
 * (flash_pack) or split states (merge_states); flash_block, flash_tiled
 * and the direct kernels read in place and may hold none. */
static int route_holds_scratch(void) {
  const char *route = clattn_last_route();
  return strncmp(route, "fused:", 6) != 0 || strstr(route, "flash_pack") || strstr(route, "merge_states");
}

static size_t square_run(int n, clattn_algo algo, double *ms) {
  clattn_context *ctx = ct_context();
  cp_shape s = cp_shape_default();
  s.q_len = s.kv_len = n;
  s.head_dim = s.value_dim = 64;
  s.algo = algo;
  s.seed = 71;
  char err[256];
  cp_problem *pb = cp_build(&s, err, sizeof err);
  if (!CHECKF(pb != NULL, "cp_build: %s", err)) return 0;
  size_t peak = 0;
  if (!CHECKF(cp_upload(pb, ctx) == 0 && cp_fill_outputs(pb, NAN) == 0, "%s", pb->err)) goto done;
  clattn_peak_scratch_bytes(ctx, 1);
  double t0 = cp_now_ms();
  clattn_status st = clattn_forward(ctx, &pb->params, 0, NULL, NULL);
  CHECK(clFinish(pb->queue) == CL_SUCCESS);
  *ms = cp_now_ms() - t0;
  peak = clattn_peak_scratch_bytes(ctx, 1);
  CHECK_STATUS(st, CLATTN_OK);
  if (!CHECKF(cp_read_outputs(pb) == 0, "%s", pb->err)) goto done;
  CHECKF(count_nan(pb->out, pb->out_count) == 0, "M=N=%d %s: NaN in out", n, clattn_algo_name(algo));
  const int check_rows[] = {0, 1, n / 2, n - 1};
  double ref[64], worst = 0.0, norm = 0.0;
  for (int r = 0; r < 4; r++) {
    plain_row(pb, 0, 0, check_rows[r], ref);
    for (int c = 0; c < 64; c++) {
      worst = fmax(worst, fabs(pb->out[(size_t)check_rows[r] * 64 + c] - ref[c]));
      norm = fmax(norm, fabs(ref[c]));
    }
  }
  CHECKF(worst <= TOL * fmax(norm, 1e-3),
         "M=N=%d %s: spot rows differ from fp64 by %.3g (max "
         "|ref| %.3g)",
         n, clattn_algo_name(algo), worst, norm);
done:
  cp_free(pb);
  return peak;
}

static void fused_scratch_is_linear_in_n(void) {
  clattn_context *ctx = ct_context();
  double ms = 0.0;
  const double mib = 1024.0 * 1024.0;

  /* M = N = 4099: an M x N float buffer is 64 MiB; fused must hold O(N d) */
  size_t peak = square_run(4099, CLATTN_ALGO_FUSED, &ms);
  double mn = 4099.0 * 4099.0 * 4.0;
  printf("  fused M=N=4099 d=64: peak scratch %.2f MiB (M*N*4/8 = %.2f MiB), %.0f ms\n", peak / mib, mn / 8 / mib, ms);
  CHECKF((peak > 0 || !route_holds_scratch()) && (double)peak < mn / 8, "fused M=N=4099: peak scratch %zu bytes",
         peak);

  /* M = N = 16384 (a 1 GiB score matrix): fused runs in well under 64 MiB
   * (its time is printed, not checked: speed is the bench's, not a test's) */
  peak = square_run(16384, CLATTN_ALGO_FUSED, &ms);
  printf("  fused M=N=16384 d=64: peak scratch %.2f MiB, %.0f ms\n", peak / mib, ms);
  CHECKF((peak > 0 || !route_holds_scratch()) && (double)peak < 64 * mib, "fused M=N=16384: peak scratch %zu bytes",
         peak);

  /* a small square where the staged path holds the whole score matrix
   * (under its 64 MiB budget) and fused holds only the packed K and V */
  peak = square_run(2048, CLATTN_ALGO_STAGED, &ms);
  size_t fpeak = square_run(2048, CLATTN_ALGO_FUSED, &ms);
  double scores = 2048.0 * 2048.0 * 4.0;
  printf("  M=N=2048 d=64: staged peak %.2f MiB, fused peak %.2f MiB, scores %.2f MiB\n", peak / mib, fpeak / mib,
         scores / mib);
  CHECKF((double)peak >= scores, "staged M=N=2048: peak %zu below the score matrix", peak);
  CHECKF((fpeak > 0 || !route_holds_scratch()) && (double)fpeak < scores / 8, "fused M=N=2048: peak %zu", fpeak);
  (void)ctx;
}

/* ---------- window and causal edges ---------- */

static void causal_skips_blocks(void) {
  const struct { int m, n; } shapes[] = {{37, 100}, {100, 37}, {64, 64}, {17, 33}, {3, 4099}};
  const int wins[] = {0, 1, 15, 16, 17, -1};
  int runs = 0, idx = 0;
  double t0 = cp_now_ms();
  for (size_t sh = 0; sh < sizeof shapes / sizeof shapes[0]; sh++)
    for (int causal = 1; causal >= 0; causal--)
      for (int wl = 0; wl < 6; wl++)
        for (int wr = 0; wr < (causal ? 1 : 6); wr++, idx++) {
          if (!causal && wins[wl] < 0 && wins[wr] < 0) continue; /* no window at all: covered elsewhere */
          cp_shape s = cp_shape_default();
          s.q_heads = 4;
          s.kv_heads = 1;
          s.q_len = shapes[sh].m;
          s.kv_len = shapes[sh].n;
          s.head_dim = s.value_dim = 64;
          s.causal = causal;
          s.window_left = wins[wl];
          s.window_right = causal ? -1 : wins[wr];
          s.want_lse = 1;
          s.poison_gaps = 1;
          s.poison_disallowed = 1;
          s.bias = idx % 3 == 0 ? CP_BIAS_RANDOM : CP_BIAS_NONE;
          s.seed = 800 + (uint64_t)idx;
          cp_problem *pb;
          KC_BUILD(pb, &s);
          if (KC_RUN_OK(pb, CLATTN_ALGO_FUSED, TOL) > 0) runs++;
          cp_free(pb);
        }
  printf("  %d window/causal runs, %.1f s\n", runs, (cp_now_ms() - t0) / 1e3);
  CHECK(runs > 100);
}

/* ---------- GQA ---------- */

static void fused_gqa_rows_share_kv(void) {
  const int hkvs[] = {4, 1}, ms[] = {1, 5, 33};
  int idx = 0;
  for (int hi = 0; hi < 2; hi++)
    for (int mi = 0; mi < 3; mi++)
      for (int ni = 0; ni < 2; ni++, idx++) {
        cp_shape s = cp_shape_default();
        s.batch = ni == 0 ? 1 : 2;
        s.q_heads = 12;
        s.kv_heads = hkvs[hi];
        s.q_len = ms[mi];
        s.kv_len = ni == 0 ? 777 : 300;
        s.head_dim = 64;
        s.value_dim = 40;
        s.mask = CP_MASK_RANDOM; /* per head: mask stride[1] != 0 */
        s.mask_bcast = idx % 2 ? CP_BCAST_BATCH : 0;
        s.mask_density = 0.6;
        s.bias = CP_BIAS_RANDOM; /* per head */
        s.bias_bcast = idx % 3 == 0 ? CP_BCAST_ROW : 0;
        s.causal = idx % 2;
        s.kv_lens = idx % 3 == 1;
        s.want_lse = 1;
        s.layout = idx % 2 ? CP_BSHD : CP_BHSD;
        s.poison_gaps = 1;
        s.poison_disallowed = 1;
        s.seed = 900 + (uint64_t)idx;
        cp_problem *pb;
        KC_BUILD(pb, &s);
        /* heads of one group see different masks and biases */
        CHECK(pb->params.mask.stride[1] != 0 && pb->params.bias.stride[1] != 0);
        char label[64];
        snprintf(label, sizeof label, "gqa case %d", idx);
        size_t peak = fused_checked(pb, label);
        if (split_expected(&s)) CHECKF(split_observed(&s, peak), "%s: split expected, peak %zu", label, peak);
        cp_free(pb);
      }
}

int main(int argc, char **argv) {
  static const ct_test tests[] = {
      CT_TEST(fused_equals_reference_on_decode_shapes),
      CT_TEST(split_and_unsplit_agree),
      CT_TEST(fused_split_reports_only_rows_empty_in_every_split),
      CT_TEST(merge_of_chunk_runs_equals_single_run),
      CT_TEST(merge_with_empty_partials_has_no_nan),
      CT_TEST(merge_uses_natural_log),
      CT_TEST(merge_rejects_bad_params),
      CT_TEST(merge_stores_f16_and_bf16),
      CT_TEST(merge_near_the_largest_float_stays_finite),
      CT_TEST(fused_scratch_is_linear_in_n),
      CT_TEST(causal_skips_blocks),
      CT_TEST(fused_gqa_rows_share_kv),
  };
  ct_context();
  return ct_main(argc, argv, tests, sizeof tests / sizeof tests[0]);
}
