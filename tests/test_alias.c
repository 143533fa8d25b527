/* Which views of a call share bytes (src/alias.c), from made-up views in
 * made-up cl_mems, no device: the same view, views interleaved row by row
 * or element by element that share nothing, one shared element at the end,
 * elements of different sizes at odd byte offsets, a layout against its
 * transpose, broadcast inputs, spaces kept apart, inputs never compared with
 * each other, merged states; and a pair too intricate to decide within the
 * search's budget, refused as "may share". Each answer checked against
 * marking every byte. */
#include "check.h"
#include "api/api.h"

static const char space_a = 0, space_b = 0; /* two cl_mems' bytes */

typedef struct {
  const char *name;
  int is_output;
  const void *space;
  size_t base, offset, elem;
  int rank;
  int dims[4];
  size_t stride[4];
} view;

static void add(ca_views *vs, const view *v) {
  size_t last = v->offset;
  for (int d = 0; d < v->rank; d++) last += (size_t)(v->dims[d] - 1) * v->stride[d];
  const clattn_tensor t = {NULL, v->offset, {v->stride[0], v->stride[1], v->stride[2], v->stride[3]}};
  CHECK(ca_views_add(vs, v->name, &t, v->dims, v->rank, v->elem, v->is_output, v->space, v->base,
                     (last + 1) * v->elem) == CLATTN_OK);
}

/* Whether the two views share a byte, by marking every byte of one. */
static int brute_force(const view *a, const view *b) {
  if (a->space != b->space) return 0;
  enum { BYTES = 1 << 16 };
  static unsigned char mark[BYTES];
  memset(mark, 0, sizeof mark);
  const view *vs[2] = {a, b};
  for (int s = 0; s < 2; s++) {
    const view *v = vs[s];
    int idx[4] = {0, 0, 0, 0};
    for (;;) {
      size_t e = v->offset;
      for (int d = 0; d < v->rank; d++) e += (size_t)idx[d] * v->stride[d];
      for (size_t x = 0; x < v->elem; x++) {
        const size_t at = v->base + e * v->elem + x;
        if (at >= BYTES) return -1;
        if (s == 0) mark[at] = 1;
        if (s == 1 && mark[at]) return 1;
      }
      int d = v->rank - 1;
      while (d >= 0 && ++idx[d] == v->dims[d]) idx[d--] = 0;
      if (d < 0) break;
    }
  }
  return 0;
}

/* ca_views_disjoint on {a, b}: refused exactly when they share a byte and
 * one of them is an output. */
static void expect(const view *a, const view *b, const char *what) {
  ca_views vs;
  ca_views_init(&vs, NULL);
  add(&vs, a);
  add(&vs, b);
  const int shared = brute_force(a, b), compared = a->is_output || b->is_output;
  const clattn_status st = ca_views_disjoint(&vs);
  const char *msg = clattn_last_error(NULL);
  CHECKF(shared >= 0, "%s: the brute force's bytes are too few", what);
  CHECKF((st == CLATTN_ERR_INVALID_ARGUMENT) == (compared && shared == 1), "%s: %s, but the views %s a byte%s%s", what,
         clattn_status_string(st), shared ? "share" : "do not share", st ? ": " : "", st ? msg : "");
  printf("  %s: %s\n", what,
         !compared ? "two inputs, not compared"
         : shared  ? "share a byte, refused"
                   : "share none, accepted");
  if (st && shared == 1)
    CHECKF(strstr(msg, a->name) && strstr(msg, b->name) && strstr(msg, " share bytes"), "%s: message \"%s\"", what,
           msg);
}

static void answers_match_marking_every_byte(void) {
  /* [B=2, H=3, S=5, D=4] f32 */
  const view q = {"q", 0, &space_a, 0, 0, 4, 4, {2, 3, 5, 4}, {60, 20, 4, 1}};
  view out = q;
  out.name = "out", out.is_output = 1;
  expect(&out, &q, "the same view");
  out.space = &space_b;
  expect(&out, &q, "the same view in another cl_mem");
  out.space = &space_a, out.base = 120 * 4; /* q's 120 floats end there */
  expect(&out, &q, "right after it");
  out.base -= 4;
  expect(&out, &q, "over its last element");
  out.base -= 2;
  expect(&out, &q, "over half of its last element");
  /* row by row: [dk = 4 of q | dv = 3 of out] per row of 7 */
  const view qr = {"q", 0, &space_a, 0, 0, 4, 4, {2, 3, 5, 4}, {105, 35, 7, 1}};
  const view outr = {"out", 1, &space_a, 0, 4, 4, 4, {2, 3, 5, 3}, {105, 35, 7, 1}};
  expect(&outr, &qr, "rows interleaved");
  view outr1 = outr;
  outr1.offset = 3;
  expect(&outr1, &qr, "rows interleaved, one column over");
  /* packed QKV gradients [B, S, 3, H, D]: d_q, d_k, d_v */
  const view dq = {"d_q", 1, &space_a, 0, 0, 2, 4, {2, 3, 5, 4}, {180, 4, 36, 1}};
  view dk = dq, dv = dq;
  dk.name = "d_k", dk.offset = 12;
  dv.name = "d_v", dv.offset = 24;
  expect(&dk, &dq, "packed d_k and d_q");
  expect(&dv, &dk, "packed d_v and d_k");
  dv.offset = 23;
  expect(&dv, &dk, "packed d_v one element early");
  /* element sizes: f32 every 8 bytes against bytes in between */
  const view f = {"lse", 1, &space_a, 0, 0, 4, 1, {64}, {2}};
  view u = {"mask", 0, &space_a, 4, 0, 1, 2, {64, 4}, {8, 1}};
  expect(&f, &u, "uchar runs in the gaps of strided floats");
  u.base = 3;
  expect(&f, &u, "uchar runs one byte early");
  view h = {"entropy", 1, &space_a, 6, 0, 2, 1, {64}, {4}};
  expect(&f, &h, "f16 every 8 bytes from byte 6");
  h.base = 2;
  expect(&f, &h, "f16 every 8 bytes from byte 2");
  /* a layout against its transpose in one buffer */
  view t = q;
  t.name = "out", t.is_output = 1, t.stride[1] = 4, t.stride[2] = 12;
  expect(&t, &q, "BSHD against BHSD");
  /* broadcast input: one row read by every head */
  view bias = {"bias", 0, &space_a, 0, 500, 4, 3, {2, 3, 8}, {8, 0, 1}};
  view q_out = q;
  q_out.is_output = 1, q_out.name = "out";
  expect(&q_out, &bias, "an output before a broadcast bias");
  bias.offset = 0;
  expect(&q, &bias, "two inputs");
  view out0 = q;
  out0.name = "out", out0.is_output = 1, out0.offset = 117;
  bias.offset = 120;
  expect(&out0, &bias, "a broadcast bias under an output");
}

/* merge's states: o of 3 states in one buffer, state s at s * 100 floats */
static void merged_states_count_as_one_view(void) {
  ca_views vs;
  ca_views_init(&vs, NULL);
  const int dims[4] = {1, 2, 3, 4};
  const clattn_tensor o_last = {NULL, 200, {24, 12, 4, 1}};
  CHECK(ca_views_add(&vs, "o", &o_last, dims, 4, 4, 0, &space_a, 0, (200 + 24) * 4) == CLATTN_OK);
  ca_views_repeat_last(&vs, 3, 100 * 4);
  const clattn_tensor between = {NULL, 50, {24, 12, 4, 1}}, inside = {NULL, 104, {24, 12, 4, 1}};
  CHECK(ca_views_add(&vs, "out", &between, dims, 4, 4, 1, &space_a, 0, (50 + 24) * 4) == CLATTN_OK);
  CHECKF(ca_views_disjoint(&vs) == CLATTN_OK, "out between states 0 and 1: %s", clattn_last_error(NULL));
  vs.n = 1;
  CHECK(ca_views_add(&vs, "out", &inside, dims, 4, 4, 1, &space_a, 0, (104 + 24) * 4) == CLATTN_OK);
  CHECKF(ca_views_disjoint(&vs) == CLATTN_ERR_INVALID_ARGUMENT, "out inside state 1");
}

/* Steps of 6 and 4 bytes from an odd start never meet (parity), but the
 * search would walk 10^5 candidates to see it: past its budget, the pair
 * is refused as one that may share. */
static void undecided_pairs_are_refused_as_may_share(void) {
  ca_views vs;
  ca_views_init(&vs, NULL);
  const int n[1] = {100000};
  const clattn_tensor a = {NULL, 0, {6, 0, 0, 0}}, b = {NULL, 1, {4, 0, 0, 0}};
  CHECK(ca_views_add(&vs, "weights", &a, n, 1, 1, 1, &space_a, 0, 6 * 99999 + 1) == CLATTN_OK);
  CHECK(ca_views_add(&vs, "mask", &b, n, 1, 1, 0, &space_a, 0, 4 * 99999 + 2) == CLATTN_OK);
  const clattn_status st = ca_views_disjoint(&vs);
  CHECKF(st == CLATTN_ERR_INVALID_ARGUMENT && strstr(clattn_last_error(NULL), "may share bytes") &&
             strstr(clattn_last_error(NULL), "too intricate"),
         "%s: %s", clattn_status_string(st), clattn_last_error(NULL));
}

int main(int argc, char **argv) {
  static const ct_test tests[] = {
      CT_TEST(answers_match_marking_every_byte),
      CT_TEST(merged_states_count_as_one_view),
      CT_TEST(undecided_pairs_are_refused_as_may_share),
  };
  return ct_main(argc, argv, tests, sizeof tests / sizeof tests[0]);
}
