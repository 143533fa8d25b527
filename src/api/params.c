/*
 * The public parameter structs as callers hold them (clattn.h, "ABI"): the
 * initialisers, which write no byte past the caller's struct_size, and the
 * readers every public function takes a caller's struct through, which
 * read no byte past it and give every field past it its default.
 */
#include <math.h>
#include <stddef.h>
#include <string.h>

#include "api/api.h"

/* The sizes of this ABI's first layouts: what struct_size 0 means, and the
 * least a caller's header gives. A field added later leaves these as they
 * are (offsetof that field, where it is the first added). A struct holding
 * a clattn_params grew by what clattn_params grew (its own fields follow
 * the params). */
#define FIRST_SIZE_OPTIONS sizeof(clattn_options)
#define FIRST_SIZE_PARAMS offsetof(clattn_params, score_mod)
#define PARAMS_GROWN (sizeof(clattn_params) - FIRST_SIZE_PARAMS)
#define FIRST_SIZE_APPEND sizeof(clattn_append_params)
#define FIRST_SIZE_KVCACHE (offsetof(clattn_kvcache_params, host_seqlens) - PARAMS_GROWN)
#define FIRST_SIZE_MERGE sizeof(clattn_merge_params)
#define FIRST_SIZE_STEP offsetof(clattn_step, host_seqlens)
#define FIRST_SIZE_BACKWARD (sizeof(clattn_backward_params) - PARAMS_GROWN)
/* Every size of clattn_params a header of this ABI gave, oldest first. */
static const size_t params_sizes[] = {FIRST_SIZE_PARAMS, sizeof(clattn_params)};

/* ---- defaults ---- */

static clattn_params params_defaults(void) {
  clattn_params p;
  memset(&p, 0, sizeof p);
  p.struct_size = sizeof p;
  p.dtype = CLATTN_F32;
  p.scale = NAN;
  p.window_left = -1;
  p.window_right = -1;
  p.empty_rows = CLATTN_EMPTY_ZERO;
  p.algo = CLATTN_ALGO_AUTO;
  p.kv_dtype = CLATTN_DTYPE_SAME;
  p.v_dtype = CLATTN_DTYPE_SAME;
  p.bias_dtype = CLATTN_F32;
  return p;
}

static clattn_append_params append_defaults(void) {
  clattn_append_params ap;
  memset(&ap, 0, sizeof ap);
  ap.struct_size = sizeof ap;
  ap.src_dtype = CLATTN_F32;
  ap.kv_dtype = CLATTN_DTYPE_SAME;
  return ap;
}

static clattn_kvcache_params kvcache_defaults(void) {
  clattn_kvcache_params kp;
  memset(&kp, 0, sizeof kp);
  kp.struct_size = sizeof kp;
  kp.attn = params_defaults();
  kp.rotary_interleaved = 1;
  return kp;
}

static clattn_backward_params backward_defaults(void) {
  clattn_backward_params bp;
  memset(&bp, 0, sizeof bp);
  bp.struct_size = sizeof bp;
  bp.fwd = params_defaults();
  bp.deterministic = 1;
  return bp;
}

static clattn_step step_defaults(void) {
  clattn_step s;
  memset(&s, 0, sizeof s);
  s.struct_size = sizeof s;
  s.q_offset = s.out_offset = s.lse_offset = CLATTN_STEP_PLANNED;
  return s;
}

/* The first `size` bytes of a full struct (the caller's, sized by its
 * header), struct_size then set to it. */
#define INIT_INTO(out, full, size)                                   \
  do {                                                               \
    const size_t n_ = (size) < sizeof(full) ? (size) : sizeof(full); \
    memcpy((out), &(full), n_);                                      \
    if (n_ >= sizeof(size_t)) (out)->struct_size = (size);           \
  } while (0)

void clattn_params_init(clattn_params *p, size_t struct_size) {
  if (!p) return;
  const clattn_params d = params_defaults();
  INIT_INTO(p, d, struct_size);
}

void clattn_append_params_init(clattn_append_params *ap, size_t struct_size) {
  if (!ap) return;
  const clattn_append_params d = append_defaults();
  INIT_INTO(ap, d, struct_size);
}

/* The clattn_params size of the header that gave a struct holding one (at
 * inner_at) `size` bytes: the largest whose layout fits, its own fields
 * after the params as they first were (first_tail bytes). */
static size_t inner_size_of(size_t size, size_t inner_at, size_t first_tail) {
  size_t inner = params_sizes[0];
  for (size_t g = 1; g < sizeof params_sizes / sizeof params_sizes[0]; g++)
    if (inner_at + params_sizes[g] + first_tail <= size) inner = params_sizes[g];
  return inner;
}

/* The defaults of a struct holding a clattn_params, written through both
 * sizes of the caller's header: its fields before the params, the params
 * at their size, its fields after them where that header put them. */
static void nested_init(void *out, size_t size, const void *full, size_t full_size, size_t inner_at,
                        size_t first_tail) {
  const size_t inner = inner_size_of(size, inner_at, first_tail);
  const size_t tail_at = inner_at + sizeof(clattn_params), tail = full_size - tail_at;
  const size_t tail_n = size > inner_at + inner ? size - inner_at - inner : 0;
  memcpy(out, full, inner_at < size ? inner_at : size);
  if (size > inner_at)
    clattn_params_init((clattn_params *)((char *)out + inner_at), size - inner_at < inner ? size - inner_at : inner);
  memcpy((char *)out + inner_at + inner, (const char *)full + tail_at, tail_n < tail ? tail_n : tail);
  if (size >= sizeof(size_t)) *(size_t *)out = size;
}

void clattn_kvcache_params_init(clattn_kvcache_params *kp, size_t struct_size) {
  if (!kp) return;
  const clattn_kvcache_params d = kvcache_defaults();
  const size_t at = offsetof(clattn_kvcache_params, attn);
  nested_init(kp, struct_size, &d, sizeof d, at, FIRST_SIZE_KVCACHE - at - FIRST_SIZE_PARAMS);
}

void clattn_backward_params_init(clattn_backward_params *bp, size_t struct_size) {
  if (!bp) return;
  const clattn_backward_params d = backward_defaults();
  const size_t at = offsetof(clattn_backward_params, fwd);
  nested_init(bp, struct_size, &d, sizeof d, at, FIRST_SIZE_BACKWARD - at - FIRST_SIZE_PARAMS);
}

void clattn_step_init(clattn_step *s, size_t struct_size) {
  if (!s) return;
  const clattn_step d = step_defaults();
  INIT_INTO(s, d, struct_size);
}

/* ---- readers ---- */

/* The bytes of a caller's struct: its struct_size (0: this ABI's first
 * layout), one a header can give: a multiple of 8 (every struct's
 * alignment) past struct_size itself, at most the library's. */
static clattn_status caller_size(size_t given, size_t first, size_t ours, const char *what, size_t *out) {
  *out = given ? given : first;
  if (*out < 2 * sizeof(size_t) || *out % sizeof(size_t))
    return ca_fail(CLATTN_ERR_INVALID_ARGUMENT,
                   "%s.struct_size %zu: no clattn header gives that size (initialise it with its *_default() "
                   "function)",
                   what, given);
  if (*out > ours)
    return ca_fail(CLATTN_ERR_UNSUPPORTED,
                   "%s.struct_size %zu: the caller's header is newer than this library (%zu bytes); link a newer "
                   "libclattn",
                   what, given, ours);
  return CLATTN_OK;
}

clattn_status ca_params_in(const clattn_params *in, clattn_params *out, const char *what) {
  size_t n;
  const clattn_status st = caller_size(in->struct_size, FIRST_SIZE_PARAMS, sizeof *out, what, &n);
  if (st != CLATTN_OK) return st;
  if (n < sizeof *out) *out = params_defaults(); /* the fields the caller's header did not have */
  memcpy(out, in, n);
  out->struct_size = sizeof *out;
  return CLATTN_OK;
}

/* A struct holding a clattn_params (member `inner` at inner_at) read
 * through both sizes: the outer fields before it, the params, and the
 * outer fields after it, which follow the caller's params at its size. */
static clattn_status nested_in(const void *in, size_t in_size, void *out, size_t out_size, size_t inner_at,
                               const char *what, const char *inner_what) {
  const clattn_params *inner_in = (const clattn_params *)((const char *)in + inner_at);
  clattn_params *inner_out = (clattn_params *)((char *)out + inner_at);
  size_t inner_n;
  clattn_status st = caller_size(inner_in->struct_size, FIRST_SIZE_PARAMS, sizeof *inner_out, inner_what, &inner_n);
  if (st != CLATTN_OK) return st;
  if (inner_at + inner_n > in_size)
    return ca_fail(CLATTN_ERR_INVALID_ARGUMENT, "%s.struct_size %zu cannot hold its %s of %zu bytes", what, in_size,
                   inner_what, inner_n);
  memcpy(out, in, inner_at);
  if ((st = ca_params_in(inner_in, inner_out, inner_what))) return st;
  const size_t tail_in = in_size - inner_at - inner_n, tail_room = out_size - inner_at - sizeof *inner_out;
  memcpy((char *)inner_out + sizeof *inner_out, (const char *)inner_in + inner_n,
         tail_in < tail_room ? tail_in : tail_room);
  return CLATTN_OK;
}

clattn_status ca_backward_params_in(const clattn_backward_params *in, clattn_backward_params *out) {
  size_t n;
  const clattn_status st = caller_size(in->struct_size, FIRST_SIZE_BACKWARD, sizeof *out, "clattn_backward_params", &n);
  if (st != CLATTN_OK) return st;
  *out = backward_defaults();
  return nested_in(in, n, out, sizeof *out, offsetof(clattn_backward_params, fwd), "clattn_backward_params", "fwd");
}

clattn_status ca_kvcache_params_in(const clattn_kvcache_params *in, clattn_kvcache_params *out) {
  size_t n;
  clattn_status st = caller_size(in->struct_size, FIRST_SIZE_KVCACHE, sizeof *out, "clattn_kvcache_params", &n);
  if (st != CLATTN_OK) return st;
  *out = kvcache_defaults();
  st = nested_in(in, n, out, sizeof *out, offsetof(clattn_kvcache_params, attn), "clattn_kvcache_params", "attn");
  out->struct_size = sizeof *out;
  return st;
}

/* A flat struct: its first n bytes over the defaults. */
#define FLAT_IN(type, first, defaults, what)                              \
  clattn_status st;                                                       \
  size_t n;                                                               \
  if ((st = caller_size(in->struct_size, first, sizeof *out, what, &n))) \
    return st;                                                            \
  *out = defaults;                                                        \
  memcpy(out, in, n);                                                     \
  out->struct_size = sizeof *out;                                         \
  return CLATTN_OK

clattn_status ca_append_params_in(const clattn_append_params *in, clattn_append_params *out) {
  FLAT_IN(clattn_append_params, FIRST_SIZE_APPEND, append_defaults(), "clattn_append_params");
}

clattn_status ca_merge_params_in(const clattn_merge_params *in, clattn_merge_params *out) {
  clattn_merge_params d;
  memset(&d, 0, sizeof d);
  FLAT_IN(clattn_merge_params, FIRST_SIZE_MERGE, d, "clattn_merge_params");
}

clattn_status ca_step_in(const clattn_step *in, clattn_step *out) {
  FLAT_IN(clattn_step, FIRST_SIZE_STEP, step_defaults(), "clattn_step");
}

clattn_status ca_options_in(const clattn_options *in, clattn_options *out) {
  clattn_options d;
  memset(&d, 0, sizeof d);
  FLAT_IN(clattn_options, FIRST_SIZE_OPTIONS, d, "clattn_options");
}
