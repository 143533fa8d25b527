/*
 * Index width: views placed at the far end of the largest buffers the device
 * allows, so element offsets (uchar mask) and byte offsets (f32 views) pass
 * 2^31 where the device permits, and every algorithm still matches the fp64
 * reference. Kernels index with 64-bit arithmetic (common.h.cl's ca_at);
 * this proves it on the largest offsets this device can address.
 *
 * Where CL_DEVICE_MAX_MEM_ALLOC_SIZE is below 2^31 + the mask's size, the
 * mask's offsets stay below 2^31 elements (POCL here allows exactly 2 GiB):
 * the test says which case ran.
 */
#include "check.h"
#include <limits.h>
#include <math.h>

#include "api/api.h"
#include "kit_checks.h"

#define HIGH ((size_t)1 << 31)

static cl_mem big_buffer(size_t bytes) {
  cl_int e;
  cl_mem m = clCreateBuffer(clattn_cl_context(ct_context()), CL_MEM_READ_WRITE, bytes, NULL, &e);
  CHECKF(e == CL_SUCCESS, "clCreateBuffer(%zu bytes): %d", bytes, e);
  return e == CL_SUCCESS ? m : NULL;
}

static int write_at(cl_mem m, size_t byte_offset, const void *data, size_t bytes) {
  cl_int e = clEnqueueWriteBuffer(clattn_cl_queue(ct_context()), m, CL_TRUE, byte_offset, bytes, data, 0, NULL, NULL);
  return CHECKF(e == CL_SUCCESS, "clEnqueueWriteBuffer at %zu: %d", byte_offset, e);
}

/* Moves a view of `elems` elements (the kit's whole host array) to the end
 * of buffer m (capacity elements), returning the shift added to its offset. */
static size_t place_at_end(clattn_tensor *t, cl_mem m, size_t capacity, const void *host, size_t elems,
                           size_t elem_size) {
  const size_t shift = capacity - elems - 3;
  if (!write_at(m, shift * elem_size, host, elems * elem_size)) return 0;
  t->buf = m;
  t->offset += shift;
  return shift;
}

static void views_at_the_end_of_the_largest_buffers(void) {
  cl_ulong max_alloc = 0;
  REQUIRE(clGetDeviceInfo(clattn_cl_device(ct_context()), CL_DEVICE_MAX_MEM_ALLOC_SIZE, sizeof max_alloc, &max_alloc,
                          NULL) == CL_SUCCESS);
  cp_shape s = cp_shape_default();
  s.q_heads = 4;
  s.kv_heads = 2;
  s.q_len = 37;
  s.kv_len = 53;
  s.head_dim = 24;
  s.value_dim = 20;
  s.causal = 1;
  s.mask = CP_MASK_RANDOM;
  s.want_lse = 1;
  s.want_diag = 1;
  s.poison_disallowed = 1;
  cp_problem *pb;
  KC_BUILD(pb, &s);
  REQUIRE(cp_reference(pb) == 0);
  /* the same problem through the kit's buffers, to take its outputs' views */
  REQUIRE(cp_upload(pb, ct_context()) == 0);

  const size_t mask_bytes = (size_t)max_alloc < HIGH + (1 << 20) ? (size_t)max_alloc : HIGH + (1 << 20);
  const size_t float_bytes = (size_t)max_alloc;
  printf("  max allocation %llu bytes: mask offsets %s 2^31 elements, f32 byte offsets %s 2^31\n",
         (unsigned long long)max_alloc, mask_bytes > HIGH + pb->mask_elems ? "above" : "just below",
         float_bytes > HIGH ? "above" : "just below");
  cl_mem mask = big_buffer(mask_bytes), floats = big_buffer(float_bytes);
  if (mask && floats) {
    clattn_params p = pb->params;
    const size_t cap = float_bytes / sizeof(float);
    REQUIRE(place_at_end(&p.mask, mask, mask_bytes, pb->mask, pb->mask_elems, 1));
    /* q, k, v side by side at the end of the f32 buffer; the outputs stay in the kit's */
    REQUIRE(place_at_end(&p.q, floats, cap - pb->k_elems - pb->v_elems, pb->q, pb->q_elems, sizeof(float)));
    REQUIRE(place_at_end(&p.k, floats, cap - pb->v_elems, pb->k, pb->k_elems, sizeof(float)));
    REQUIRE(place_at_end(&p.v, floats, cap, pb->v, pb->v_elems, sizeof(float)));
    printf("  mask offset %zu elements; q offset %zu elements (byte %zu)\n", p.mask.offset, p.q.offset,
           p.q.offset * sizeof(float));
    for (size_t a = 0; a < KC_NALGOS; a++) {
      p.algo = kc_algos[a];
      REQUIRE(cp_fill_outputs(pb, NAN) == 0);
      clattn_status st = clattn_forward(ct_context(), &p, 0, NULL, NULL);
      CHECKF(st == CLATTN_OK, "%s: %s: %s", clattn_algo_name(p.algo), clattn_status_string(st),
             clattn_last_error(ct_context()));
      REQUIRE(clFinish(clattn_cl_queue(ct_context())) == CL_SUCCESS);
      cp_result r;
      memset(&r, 0, sizeof r);
      r.status = st;
      if (CHECK(cp_read_outputs(pb) == 0) && CHECK(cp_compare(pb, &r) == 0)) {
        char line[512];
        CHECKF(cp_result_ok(&r, 1e-5), "%s: %s", clattn_algo_name(p.algo), cp_result_format(&r, line, sizeof line));
      }
    }
  }
  if (mask) clReleaseMemObject(mask);
  if (floats) clReleaseMemObject(floats);
  cp_free(pb);
}

/* ---------- key counts near INT_MAX ---------- */

/* One call with kv_len keys that are all one broadcast row (K and V views
 * with row stride 0, so 2^31 keys need 64 floats of memory), q_len (at most
 * 8) rows per head in two query heads over one KV head, head dims 16, and a causal
 * window of the last `window` + 1 keys, so the kernels only touch the keys
 * at the far end of the range. Every allowed key has the same score, so
 * O = v and lse = s_i + log(window + 1), in closed form. Returns the status;
 * checks the outputs when OK. */
static clattn_status near_int_max_call(clattn_context *ctx, int kv_len, int q_len, clattn_algo algo, int with_diag,
                                       const char *what) {
  enum { H = 2, M_MAX = 8, D = 16, WINDOW = 40 };
  const int M = q_len;
  cl_context cl = clattn_cl_context(ctx);
  cl_command_queue queue = clattn_cl_queue(ctx);
  float q[H * M_MAX * D], k[D], v[D], out[H * M_MAX * D], lse[H * M_MAX], ent[H * M_MAX];
  for (int x = 0; x < H * M * D; x++) q[x] = (float)((x * 7) % 11) * 0.1f - 0.5f;
  for (int d = 0; d < D; d++) {
    k[d] = (float)(d % 5) * 0.2f - 0.3f;
    v[d] = (float)d - 4.5f;
  }
  for (int x = 0; x < H * M * D; x++) out[x] = NAN;
  for (int x = 0; x < H * M; x++) lse[x] = ent[x] = NAN;
  cl_int e[6];
  cl_mem qb = clCreateBuffer(cl, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, sizeof q, q, &e[0]);
  cl_mem kb = clCreateBuffer(cl, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, sizeof k, k, &e[1]);
  cl_mem vb = clCreateBuffer(cl, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, sizeof v, v, &e[2]);
  cl_mem ob = clCreateBuffer(cl, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, sizeof out, out, &e[3]);
  cl_mem lb = clCreateBuffer(cl, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, sizeof lse, lse, &e[4]);
  cl_mem eb = clCreateBuffer(cl, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, sizeof ent, ent, &e[5]);
  clattn_status st = CLATTN_ERR_OPENCL;
  if (!CHECKF(e[0] == CL_SUCCESS && e[1] == CL_SUCCESS && e[2] == CL_SUCCESS && e[3] == CL_SUCCESS &&
                  e[4] == CL_SUCCESS && e[5] == CL_SUCCESS,
              "%s: clCreateBuffer", what))
    goto done;
  clattn_params p = clattn_params_default();
  p.batch = 1;
  p.q_heads = H;
  p.kv_heads = 1;
  p.q_len = M;
  p.kv_len = kv_len;
  p.head_dim = D;
  p.value_dim = D;
  p.q = (clattn_tensor){qb, 0, {H * M * D, M * D, D, 1}};
  p.k = (clattn_tensor){kb, 0, {0, 0, 0, 1}}; /* every key the same row */
  p.v = (clattn_tensor){vb, 0, {0, 0, 0, 1}};
  p.out = (clattn_tensor){ob, 0, {H * M * D, M * D, D, 1}};
  p.lse = (clattn_tensor){lb, 0, {H * M, M, 1, 0}};
  if (with_diag) /* diagnostics: FUSED does not split the keys */
    p.entropy = (clattn_tensor){eb, 0, {H * M, M, 1, 0}};
  p.causal = 1;
  p.window_left = WINDOW;
  p.algo = algo;
  const double t0 = cp_now_ms();
  st = clattn_forward(ctx, &p, 0, NULL, NULL);
  if (st != CLATTN_OK) goto done;
  if (!CHECK(clFinish(queue) == CL_SUCCESS) ||
      !CHECK(clEnqueueReadBuffer(queue, ob, CL_TRUE, 0, sizeof out, out, 0, NULL, NULL) == CL_SUCCESS) ||
      !CHECK(clEnqueueReadBuffer(queue, lb, CL_TRUE, 0, sizeof lse, lse, 0, NULL, NULL) == CL_SUCCESS) ||
      !CHECK(clEnqueueReadBuffer(queue, eb, CL_TRUE, 0, sizeof ent, ent, 0, NULL, NULL) == CL_SUCCESS))
    goto done;
  const double ms = cp_now_ms() - t0;
  long bad = 0;
  for (int r = 0; r < H * M; r++) {
    double s = 0.0;
    for (int d = 0; d < D; d++) s += (double)q[r * D + d] * k[d];
    s /= sqrt((double)D);
    const double want_lse = s + log(WINDOW + 1.0);
    if (!kc_close(lse[r], want_lse, 1e-5) || (with_diag && !kc_close(ent[r], log(WINDOW + 1.0), 1e-4))) {
      if (bad < 2)
        printf("    %s: row %d: lse %.9g (expected %.9g)%s%.9g\n", what, r, lse[r], want_lse,
               with_diag ? ", entropy " : "", with_diag ? ent[r] : 0.0);
      bad++;
    }
    for (int c = 0; c < D; c++) bad += !kc_close(out[r * D + c], v[c], 1e-5);
  }
  if (CHECKF(bad == 0, "%s: %ld wrong outputs (out[0] = %g, expected %g)", what, bad, out[0], v[0]))
    printf("  %s: exact in %.0f ms\n", what, ms);
done:
  for (int x = 0; x < 6; x++) {
    cl_mem m[] = {qb, kb, vb, ob, lb, eb};
    if (m[x]) clReleaseMemObject(m[x]);
  }
  return st;
}

/* kv_len = INT_MAX and values near it (the int sum split_begin + split_keys
 * overflowed from 2147483521 on, dropping the last split: O = 0, lse = -inf;
 * and a key loop j0 += 16 past INT_MAX). Covered here: FUSED's direct kernel
 * split across work-items (no diagnostics) and in one pass (diagnostics),
 * and flash_tiled (a second context with CLATTN_FLASH_WG=64), all at
 * kv_len up to INT_MAX. FUSED's packed kernel needs K^T packed (8 GiB at
 * 2^31 keys): past this device's largest allocation it must refuse with
 * OUT_OF_MEMORY, else be exact; STAGED and GEMM hold a score row of 4
 * kv_len bytes, and past a quarter of that allocation refuse at once,
 * naming the size. Their window arithmetic near INT_MAX is covered by
 * window_bounds_near_int_max and the host's planning by
 * key_ranges_are_planned_in_64_bits. */
static void kv_len_near_int_max_broadcast_kv(void) {
  const int lens[] = {INT_MAX, INT_MAX - 1, 2147483521, 2147483632, 2147483520};
  char what[128];
  for (size_t n = 0; n < sizeof lens / sizeof lens[0]; n++)
    for (int with_diag = 0; with_diag < 2; with_diag++) {
      snprintf(what, sizeof what, "fused kv_len %d%s", lens[n], with_diag ? " (diagnostics, one pass)" : "");
      clattn_status st = near_int_max_call(ct_context(), lens[n], 2, CLATTN_ALGO_FUSED, with_diag, what);
      CHECKF(st == CLATTN_OK, "%s: %s: %s", what, clattn_status_string(st), clattn_last_error(ct_context()));
    }
  /* q_len 8: 16 rows per KV head, FUSED's packed kernel */
  const clattn_algo others[] = {CLATTN_ALGO_STAGED, CLATTN_ALGO_GEMM, CLATTN_ALGO_FUSED};
  cl_ulong max_alloc = 0;
  REQUIRE(clGetDeviceInfo(clattn_cl_device(ct_context()), CL_DEVICE_MAX_MEM_ALLOC_SIZE, sizeof max_alloc, &max_alloc,
                          NULL) == CL_SUCCESS);
  for (size_t a = 0; a < 3; a++) {
    snprintf(what, sizeof what, "%s kv_len %d%s", clattn_algo_name(others[a]), INT_MAX,
             others[a] == CLATTN_ALGO_FUSED ? " (packed)" : "");
    /* STAGED and GEMM hold a score row up to a quarter of the largest
     * allocation: past it they refuse at once, naming the size and FUSED
     * (a row they would hold is computed: minutes over 2^31 keys). */
    const cl_ulong row_bytes = (cl_ulong)INT_MAX * sizeof(float);
    const int holds_row = others[a] != CLATTN_ALGO_FUSED;
    if (holds_row && row_bytes <= max_alloc / 4) {
      printf("  %s: not run: its %.1f GiB score row is within a quarter of this device's largest allocation "
             "(%.2f GiB), so it would be computed, not refused (window_bounds_near_int_max runs the same "
             "arithmetic)\n",
             what, row_bytes / 1073741824.0, max_alloc / 1073741824.0);
      continue;
    }
    const double t0 = cp_now_ms();
    clattn_status st =
        near_int_max_call(ct_context(), INT_MAX, others[a] == CLATTN_ALGO_FUSED ? 8 : 2, others[a], 0, what);
    const char *msg = clattn_last_error(ct_context());
    if (holds_row)
      CHECKF(st == CLATTN_ERR_OUT_OF_MEMORY && strstr(msg, "kv_len 2147483647") && strstr(msg, "CLATTN_ALGO_FUSED"),
             "%s: %s: %s (expected OUT_OF_MEMORY naming kv_len and FUSED)", what, clattn_status_string(st), msg);
    else
      CHECKF(st == CLATTN_OK || st == CLATTN_ERR_OUT_OF_MEMORY, "%s: %s: %s", what, clattn_status_string(st), msg);
    if (st != CLATTN_OK) printf("  %s: %s in %.0f ms (%s)\n", what, clattn_status_string(st), cp_now_ms() - t0, msg);
  }
  /* flash_tiled, forced as CLATTN_FLASH_WG does for the -tiled suites */
  const char *saved = getenv("CLATTN_FLASH_WG");
  char *keep = saved ? strdup(saved) : NULL;
  setenv("CLATTN_FLASH_WG", "64", 1);
  clattn_context *tiled = NULL;
  clattn_status cs = clattn_create(NULL, &tiled);
  if (keep) {
    setenv("CLATTN_FLASH_WG", keep, 1);
    free(keep);
  } else {
    unsetenv("CLATTN_FLASH_WG");
  }
  REQUIREF(cs == CLATTN_OK, "clattn_create with CLATTN_FLASH_WG=64: %s", clattn_last_error(NULL));
  for (size_t n = 0; n < 3; n++)
    for (int with_diag = 0; with_diag < 2; with_diag++) {
      snprintf(what, sizeof what, "flash_tiled kv_len %d%s", lens[n], with_diag ? " (diagnostics, one pass)" : "");
      clattn_status st = near_int_max_call(tiled, lens[n], 2, CLATTN_ALGO_FUSED, with_diag, what);
      CHECKF(st == CLATTN_OK, "%s: %s: %s", what, clattn_status_string(st), clattn_last_error(tiled));
    }
  clattn_destroy(tiled);
}

/* GEMM copies a broadcast K and V densely (CLBlast takes int offsets): at
 * kv_len = max_alloc / 16 keys of 16 floats the copy is four times the
 * largest allocation while a score row still fits the path. Refused before
 * anything is enqueued, naming the buffer and the limit. */
static void gemm_never_copies_past_the_largest_allocation(void) {
  if (!ca_gemm_available()) {
    printf("  not run: this build has no CLBlast (no GEMM path)\n");
    return;
  }
  cl_ulong max_alloc = 0;
  REQUIRE(clGetDeviceInfo(clattn_cl_device(ct_context()), CL_DEVICE_MAX_MEM_ALLOC_SIZE, sizeof max_alloc, &max_alloc,
                          NULL) == CL_SUCCESS);
  if (max_alloc / 16 > INT_MAX) {
    printf("  not run: max_alloc / 16 keys pass INT_MAX on this device\n");
    return;
  }
  const int kv_len = (int)(max_alloc / 16);
  char what[96];
  snprintf(what, sizeof what, "gemm kv_len %d, broadcast K and V", kv_len);
  const clattn_status st = near_int_max_call(ct_context(), kv_len, 2, CLATTN_ALGO_GEMM, 0, what);
  const char *msg = clattn_last_error(ct_context());
  CHECKF(st == CLATTN_ERR_OUT_OF_MEMORY && strstr(msg, "largest allocation") && strstr(msg, "GEMM"),
         "%s: %s: %s (expected OUT_OF_MEMORY naming the buffer and the limit)", what, clattn_status_string(st), msg);
  printf("  %s: %s (%s)\n", what, clattn_status_string(st), msg);
}

/* Window bounds near INT_MAX (window_left and window_right of INT_MAX - 1
 * and INT_MAX: p_i +- window passes 2^31 - 1 unless computed in 64 bits),
 * with causal alignment and ALiBi's |p_i - j| on, on every path against
 * the fp64 reference: the same arithmetic the kv_len-near-INT_MAX calls
 * need, at a size STAGED and GEMM can run here. */
static void window_bounds_near_int_max(void) {
  const struct {
    int left, right, causal;
  } cases[] = {
      {INT_MAX - 1, INT_MAX - 1, 0}, {INT_MAX, INT_MAX, 0}, {INT_MAX, -1, 1}, {3, INT_MAX, 0}, {INT_MAX, 2, 0},
  };
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    cp_shape s = cp_shape_default();
    s.q_heads = 2;
    s.kv_heads = 1;
    s.q_len = 37;
    s.kv_len = 53;
    s.head_dim = 16;
    s.value_dim = 16;
    s.window_left = cases[c].left;
    s.window_right = cases[c].right;
    s.causal = cases[c].causal;
    s.alibi = 1;
    s.want_lse = 1;
    s.poison_disallowed = 1;
    s.seed = 90 + c;
    cp_problem *pb;
    KC_BUILD(pb, &s);
    for (size_t a = 0; a < KC_NALGOS; a++) KC_RUN_OK(pb, kc_algos[a], 1e-5);
    cp_free(pb);
  }
}

/* The host's key-range planning at kv_len up to INT_MAX: FUSED's split-KV
 * ranges cover [0, kv_len) exactly, each non-empty and starting inside int
 * range, split_keys a multiple of 16; the last range's end passes INT_MAX
 * for kv_len from 2147483521 on (what the kernels now take in 64 bits).
 * The staged / GEMM chunk plan keeps at least one row and stays within the
 * budget or one score row. */
static void key_ranges_are_planned_in_64_bits(void) {
  const int lens[] = {INT_MAX, INT_MAX - 1, 2147483632, 2147483521, 2147483520, 1 << 30, 4099, 512, 511, 1};
  const size_t items[] = {1, 2, 3, 7, 8, 1000};
  const cl_uint cus[] = {1, 2, 3, 132};
  int past_int_max = 0;
  for (size_t n = 0; n < sizeof lens / sizeof lens[0]; n++)
    for (size_t i = 0; i < sizeof items / sizeof items[0]; i++)
      for (size_t u = 0; u < sizeof cus / sizeof cus[0]; u++) {
        const tl_device dev = {
            .type = u % 2 ? CL_DEVICE_TYPE_GPU : CL_DEVICE_TYPE_CPU, .compute_units = cus[u], .max_wg = 1024};
        /* key blocks as the library plans them: 16 keys on GPUs, flash_rows' 32 (AVX-512) on CPUs */
        const size_t multiple = dev.type == CL_DEVICE_TYPE_GPU ? 16 : 32;
        const ca_splits sp = ca_plan_splits(&dev, 64, items[i], lens[n], multiple);
        const long long keys = sp.split_keys, last_begin = (long long)(sp.n_splits - 1) * keys;
        const int ok = sp.n_splits >= 1 && keys >= 1 &&
                       (sp.n_splits == 1 ? keys == lens[n] : keys % (long long)multiple == 0) && last_begin < lens[n] &&
                       last_begin + keys >= lens[n];
        if (!CHECKF(ok, "kv_len %d, %zu items, %u CUs: %zu ranges of %d keys", lens[n], items[i], cus[u], sp.n_splits,
                    sp.split_keys))
          return;
        past_int_max += last_begin + keys > INT_MAX;
      }
  printf("  %d plans end their last range past INT_MAX\n", past_int_max);
  CHECK(past_int_max > 0);
  clattn_params p = clattn_params_default();
  p.batch = 3;
  p.q_heads = 4;
  p.q_len = 5;
  p.kv_len = INT_MAX;
  const size_t budget = (size_t)64 << 20;
  const ca_chunk ch = ca_plan_chunks(&p, budget);
  CHECKF(ch.rows == 1 && ch.heads == 1, "kv_len INT_MAX: chunks of %d rows x %d heads", ch.rows, ch.heads);
  p.kv_len = 1 << 20;
  const ca_chunk c2 = ca_plan_chunks(&p, budget);
  CHECKF(c2.rows >= 1 && c2.heads >= 1 && (size_t)c2.rows * c2.heads * ((size_t)p.kv_len * 4) <= budget,
         "kv_len 2^20: chunks of %d rows x %d heads", c2.rows, c2.heads);
}

int main(int argc, char **argv) {
  static const ct_test tests[] = {
      CT_TEST(views_at_the_end_of_the_largest_buffers),
      CT_TEST(kv_len_near_int_max_broadcast_kv),
      CT_TEST(gemm_never_copies_past_the_largest_allocation),
      CT_TEST(window_bounds_near_int_max),
      CT_TEST(key_ranges_are_planned_in_64_bits),
  };
  ct_context();
  return ct_main(argc, argv, tests, sizeof tests / sizeof tests[0]);
}
