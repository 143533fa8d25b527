/*
 * Which views of one call share bytes (see clattn_tensor in clattn.h): an
 * output may share no byte with any other view of its call, input or
 * output. Views are compared exactly, element by element, not by their
 * extents, so interleaved layouts that share nothing (packed QKV, a K/V
 * cache holding K and V page by page) pass.
 *
 * Two views share a byte when some element address of one minus some of the
 * other lies within an element's size: a bounded integer combination
 *   sum_d x_d step_d in [lo, hi],  x_d in [lo_d, hi_d],
 * solved by a depth-first search from the largest step down, each level
 * bounded by what the smaller steps can still add. Steps shared by both
 * views merge into one term first, so translates of one layout (the common
 * case) take a few nodes; a search that runs past its budget counts as
 * sharing (refused, saying so).
 */
#include <stdint.h>
#include <string.h>

#include "check/check.h"

#define BAD(...) ca_fail(CLATTN_ERR_INVALID_ARGUMENT, __VA_ARGS__)

enum { SEARCH_BUDGET = 1 << 15 }; /* nodes per pair of views */

void ca_views_init(ca_views *vs, cl_context context) {
  vs->context = context;
  vs->n = 0;
}

clattn_status ca_views_add(ca_views *vs, const char *name, const clattn_tensor *t, const int *dims, int rank,
                           size_t elem, int is_output, const void *space, size_t base, size_t end) {
  if (vs->n == CA_MAX_VIEWS) /* a bound of the library, not of the call */
    return ca_fail(CLATTN_ERR_UNSUPPORTED, "%s: more than %d views in one call", name, CA_MAX_VIEWS);
  ca_extent *e = &vs->v[vs->n++]; /* field by field: count and step are filled up to rank */
  e->name = name, e->is_output = is_output, e->buf = t->buf, e->space = space, e->base = base;
  e->first = t->offset * elem, e->end = end, e->elem = elem, e->rank = 0;
  for (int d = 0; d < rank; d++)
    if (dims[d] > 1 && t->stride[d] > 0) {
      e->count[e->rank] = (size_t)dims[d];
      e->step[e->rank++] = t->stride[d] * elem; /* within the extent: no overflow */
    }
  return CLATTN_OK;
}

void ca_views_repeat_last(ca_views *vs, size_t n, size_t step) {
  ca_extent *e = &vs->v[vs->n - 1];
  if (n < 2 || step == 0) return;
  e->first -= (n - 1) * step;
  e->count[e->rank] = n;
  e->step[e->rank++] = step;
}

void ca_views_move(ca_views *vs, const char *name, size_t first) {
  for (int i = 0; i < vs->n; i++) {
    ca_extent *e = &vs->v[i];
    if (strcmp(e->name, name) != 0) continue;
    e->end = e->end - e->first + first; /* the span stays */
    e->first = first;
  }
}

/* x * w + (the rest) in [lo, hi], x in [x_lo, x_hi]: one term of the search. */
typedef struct {
  long long w, x_lo, x_hi;
} term;

static long long floor_div(long long a, long long b) { return a / b - (a % b != 0 && a < 0); }
static long long ceil_div(long long a, long long b) { return a / b + (a % b != 0 && a > 0); }

/* 1 when x_i in [x_lo, x_hi] exist with sum x_i w_i in [lo, hi], 0 when
 * none do, -1 when the budget ran out first. t by decreasing w; rest_lo[i],
 * rest_hi[i]: the least and most that terms i.. add (rest_*[n] = 0). */
static int reachable(const term *t, int n, const long long *rest_lo, const long long *rest_hi, long long lo,
                     long long hi, int *budget) {
  if (n == 0) return lo <= 0 && 0 <= hi;
  const long long x0 = ceil_div(lo - rest_hi[1], t->w), x1 = floor_div(hi - rest_lo[1], t->w);
  for (long long x = x0 > t->x_lo ? x0 : t->x_lo; x <= x1 && x <= t->x_hi; x++) {
    if (--*budget < 0) return -1;
    const int r = reachable(t + 1, n - 1, rest_lo + 1, rest_hi + 1, lo - x * t->w, hi - x * t->w, budget);
    if (r) return r;
  }
  return 0;
}

/* Whether views a and b (in one space) share a byte: 1, 0, or -1 when the
 * search could not tell. Byte positions are taken to be below 2^62. */
static int share(const ca_extent *a, const ca_extent *b) {
  const size_t a0 = a->base + a->first, b0 = b->base + b->first;
  if (a0 >= b->base + b->end || b0 >= a->base + a->end) return 0; /* extents apart */
  /* addr_a - addr_b = (a0 - b0) + sum x_a step_a - sum x_b step_b must lie in (-a.elem, b.elem) */
  const long long diff = a0 >= b0 ? (long long)(a0 - b0) : -(long long)(b0 - a0);
  term t[10];
  int n = 0;
  for (int side = 0; side < 2; side++) {
    const ca_extent *e = side ? b : a;
    for (int d = 0; d < e->rank; d++) {
      const long long w = (long long)e->step[d], span = (long long)e->count[d] - 1;
      int i = 0;
      while (i < n && t[i].w != w) i++;
      if (i == n) t[n++] = (term){w, 0, 0};
      if (side)
        t[i].x_lo -= span;
      else
        t[i].x_hi += span;
    }
  }
  for (int i = 1; i < n; i++) /* decreasing w */
    for (int j = i; j > 0 && t[j - 1].w < t[j].w; j--) {
      const term s = t[j];
      t[j] = t[j - 1], t[j - 1] = s;
    }
  long long rest_lo[11], rest_hi[11];
  rest_lo[n] = rest_hi[n] = 0;
  for (int i = n - 1; i >= 0; i--) {
    rest_lo[i] = rest_lo[i + 1] + t[i].x_lo * t[i].w;
    rest_hi[i] = rest_hi[i + 1] + t[i].x_hi * t[i].w;
  }
  int budget = SEARCH_BUDGET;
  return reachable(t, n, rest_lo, rest_hi, -(long long)a->elem + 1 - diff, (long long)b->elem - 1 - diff, &budget);
}

clattn_status ca_views_disjoint(const ca_views *vs) {
  for (int i = 0; i < vs->n; i++)
    for (int j = 0; j < vs->n; j++) {
      const ca_extent *a = &vs->v[i], *b = &vs->v[j];
      /* each pair once, the output first */
      if (!a->is_output || (b->is_output && j <= i) || a->space != b->space) continue;
      const int r = share(a, b);
      if (!r) continue;
      /* the bytes where they meet: of their cl_mem, of the parent both
       * are sub-buffers of, or host addresses */
      const int one = a->buf == b->buf, host = a->space == &ca_host_memory;
      const size_t a_at = one ? 0 : a->base, b_at = one ? 0 : b->base;
      return BAD(
          "%s and %s %s bytes of one %s (%s: bytes [%zu, %zu)%s, %s: [%zu, %zu)%s): an output may share no byte "
          "with another view of the call, input or output",
          a->name, b->name, r > 0 ? "share" : "may share",
          one ? "buffer" : host ? "host memory (buffers over the same host memory)" : "buffer (through sub-buffers)",
          a->name, a_at + a->first, a_at + a->end,
          one ? " of its cl_mem" : host ? " of the host's addresses" : " of the parent buffer", b->name,
          b_at + b->first, b_at + b->end, r > 0 ? "" : "; their layouts are too intricate to rule it out quickly");
    }
  return CLATTN_OK;
}
