/*
 * The plan layer: the planner turns a checked call into a launch list, as a
 * pure function of the call and what the device reported (so results stay
 * bitwise repeatable): for each kernel its program, grid and argument
 * record (cl/args.h.cl's families), the scratch the list takes, whether it
 * raises the empty-row flag. The executor (run/) enqueues a list, records
 * it into a command buffer, or replays it with a step's values; it decides
 * nothing.
 */
#ifndef CLATTN_PLAN_H
#define CLATTN_PLAN_H

#include "args.h.cl"
#include "check/check.h"

/* ---- the launch list (list.c) ---- */

typedef enum { CA_LAUNCH_KERNEL, CA_LAUNCH_GEMM } ca_launch_kind;

/* C = A op(B) for each (batch, head) pair of a chunk, through CLBlast's
 * strided batched SGEMM (run/blast.c), row-major, op = transposed or not. */
typedef struct {
  int b_transposed;
  size_t m, n, k;
  ca_buf a, b, c;
  size_t a_ld, b_ld, c_ld;
  int heads;         /* matrices: 3 x heads element offsets (A's, B's, C's) */
  size_t offsets_at; /* where they lie in the list's arena */
  const char *what;
} ca_gemm;

/* One argument of a launch: a buffer, or a value of `size` bytes at byte
 * `at` of the list's arena (a family's struct). */
typedef struct {
  int is_buf;
  ca_buf buf;
  size_t at, size;
} ca_arg;

typedef struct {
  ca_launch_kind kind;
  cl_program program;
  char kernel[40];
  cl_uint dims;
  size_t global[3], local[3];
  int local_given;           /* 0: the runtime chooses the work-group */
  int first_arg, n_args;     /* list->arg[first_arg .. first_arg + n_args) */
  ca_gemm gemm;              /* CA_LAUNCH_GEMM */
} ca_launch;

enum { CA_LIST_SCRATCH = 12, CA_STEP_SITES = 4, CA_LIST_HELD = 4 };
/* What a list holds without the heap (most calls' lists: a decode call
 * allocates nothing); a list is never copied, its storage may be its own. */
enum { CA_LIST_OWN_LAUNCHES = 4, CA_LIST_OWN_ARGS = 40, CA_LIST_OWN_ARENA = 2048 };

/* An int of a launch's argument struct that holds kv_len: argument `arg`
 * of launch `launch`, at byte `at` of the list's arena. */
typedef struct {
  int launch, arg;
  size_t at;
} ca_step_site;

typedef struct {
  const char *what; /* what the call is, the trace's head: "fused", "staged", "kv_append", ... */
  ca_launch *launch;
  int n_launch, cap_launch;
  ca_arg *arg;
  int n_arg, cap_arg;
  unsigned char *arena;
  size_t n_arena, cap_arena;
  size_t scratch[CA_LIST_SCRATCH]; /* bytes of each scratch buffer the list takes (CA_BUF_SCRATCH + slot) */
  const char *scratch_what[CA_LIST_SCRATCH];
  int n_scratch;
  int flag;                     /* a launch raises the empty-row flag (CA_BUF_FLAG) */
  clattn_empty_rows empty_rows; /* CLATTN_EMPTY_ERROR: the flag is read after the last launch */
  int steps_kv_len;             /* a plan's list (0: a call's): scratch for any kv_len up to this one */
  /* A call like this one but for a kv_len within [step_lo, step_hi] takes
   * this list with kv_len written at its sites: the planner's list for
   * that kv_len (no sites: another kv_len is planned anew) */
  ca_step_site step_site[CA_STEP_SITES];
  int n_step_sites, step_lo, step_hi;
  clattn_status error;          /* the first failure while building (host memory), reported once built */
  cl_program held[CA_LIST_HELD]; /* programs with modifiers the list's launches use: its references */
  int n_held;
  ca_launch own_launch[CA_LIST_OWN_LAUNCHES];
  ca_arg own_arg[CA_LIST_OWN_ARGS];
  _Alignas(8) unsigned char own_arena[CA_LIST_OWN_ARENA];
} ca_list;

void ca_list_init(ca_list *l, const char *what);
void ca_list_free(ca_list *l);
/* Empties l for another plan, keeping its storage (and steps_kv_len). */
void ca_list_reset(ca_list *l, const char *what);
/* A scratch buffer of `bytes` for the list (what: in messages); its slot. */
int ca_list_scratch(ca_list *l, size_t bytes, const char *what);
/* Takes over a reference to program (ca_program_get's of a program with
 * modifiers, which the table may release while the list lives). */
void ca_list_hold(ca_list *l, cl_program program);
/* Appends a kernel launch (local NULL: the runtime's work-group); its
 * arguments follow with ca_list_args. */
void ca_list_kernel(ca_list *l, cl_program program, const char *kernel, cl_uint dims, const size_t *global,
                    const size_t *local);
/* Appends to the last launch's arguments: n buffers, then a value of size bytes (none when 0). */
void ca_list_args(ca_list *l, int n_bufs, const ca_buf *bufs, size_t size, const void *value);
/* Family F's buffers (a ca_bufs_F) and struct (a ca_args_F), in order. */
#define CA_LIST_ARGS(l, F, bufs, args)                                                               \
  do {                                                                                               \
    _Static_assert(sizeof(bufs) == CA_NBUF(F) * sizeof(ca_buf), "ca_bufs_" #F " holds ca_bufs only"); \
    ca_list_args((l), CA_NBUF(F), (const ca_buf *)&(bufs), sizeof(args), &(args));                  \
  } while (0)
/* Another kv_len (a plan's step, a decode call like the last): the int at
 * byte `offset` of the last launch's last argument (its struct) holds
 * kv_len; the list is the planner's for any kv_len in [lo, hi] (ranges
 * narrow each other) with only the sites changed. */
void ca_list_step_site(ca_list *l, size_t offset);
void ca_list_step_range(ca_list *l, int lo, int hi);
/* Writes kv_len at l's sites when l holds for it: 1, else 0 (plan anew). */
int ca_list_step_patch(ca_list *l, int kv_len);
/* Appends a CLBlast product with its 3 x g->heads offsets. */
void ca_list_gemm(ca_list *l, const ca_gemm *g, const size_t *offsets);
/* A GEMM launch's offsets. */
const size_t *ca_list_gemm_offsets(const ca_list *l, const ca_launch *x);
/* Puts `to` where launches from index `from` on take the cl_mem `tag` (a
 * stand-in the planner gave a params struct for a buffer of the list's own). */
void ca_list_rebind(ca_list *l, int from, cl_mem tag, ca_buf to);
/* Whether two lists make the same launches with the same arguments and scratch. */
int ca_list_same(const ca_list *a, const ca_list *b);
/* The list in words: each launch, its grid and arguments. */
void ca_describe_list(const ca_list *l, char *buf, size_t size);
/* Bytes of scratch the list takes (for clattn_peak_scratch_bytes). */
size_t ca_list_scratch_bytes(const ca_list *l);

/* ---- a buffer argument; a view's offset and strides (fill.h has the groups) ---- */

static inline ca_buf ca_mem(cl_mem m) { return (ca_buf){m, CA_BUF_MEM}; }
static inline ca_buf ca_scratch(int slot) { return (ca_buf){NULL, CA_BUF_SCRATCH + slot}; }
/* The call's empty-row flag: NULL under CLATTN_EMPTY_ZERO (kernels then
 * raise nothing), else the executor's. */
static inline ca_buf ca_flag_of(ca_list *l, clattn_empty_rows policy) {
  l->empty_rows = policy;
  l->flag = policy == CLATTN_EMPTY_ERROR;
  return (ca_buf){NULL, l->flag ? CA_BUF_FLAG : CA_BUF_MEM};
}
static inline ca_view ca_view_of(const clattn_tensor *t) {
  return (ca_view){t->offset, {t->stride[0], t->stride[1], t->stride[2], t->stride[3]}};
}

/* ---- what a forward call resolves to (forward.c) ---- */

/* The route diagnostics' bits (cl/common.h.cl's CA_DIAG_*). */
enum { CA_DIAG_ENTROPY = 1, CA_DIAG_MAX_WEIGHT = 2, CA_DIAG_ARGMAX = 4 };

typedef struct {
  clattn_algo algo;              /* AUTO resolved */
  float scale;                   /* NAN resolved */
  int window_left, window_right; /* -1 = unbounded; causal folded in */
  int group;                     /* q_heads / kv_heads */
  clattn_dtype k_dtype, v_dtype; /* CLATTN_DTYPE_SAME resolved */
  int paged, diag, want_lse, want_weights;
  ca_drop dropout; /* the kernels' dropout words; on 0 = none */
} ca_resolved;

void ca_resolve(const clattn_context *ctx, const clattn_params *p, ca_resolved *r);
/* A checked clattn_forward call's list: its path's (AUTO's choice). */
clattn_status ca_plan_forward(clattn_context *ctx, const clattn_params *p, ca_list *l);
/* The programs a call of p's storage and head dims runs on any path
 * (clattn_prepare builds them ahead of the first call). */
clattn_status ca_plan_programs(clattn_context *ctx, const clattn_params *p);

/* ---- each path ---- */

/* A chunk of query rows: `rows` rows in each of `heads` consecutive
 * (batch, head) pairs. The staged and GEMM paths hold heads x rows x N
 * scores at a time; ca_plan_chunks keeps that under budget bytes. */
typedef struct {
  int heads, rows;
} ca_chunk;
ca_chunk ca_plan_chunks(const clattn_params *p, size_t budget);

/* How the fused path splits kv_len keys across work-items when `items` row
 * blocks alone would leave compute units idle: ranges of split_keys keys (a
 * multiple of the kernel's key block: 16 for the GPU kernels, flash_rows'
 * 2 * FLASH_VW; or kv_len when unsplit), n_splits of them. Range s is
 * [s * split_keys, min(kv_len, (s + 1) * split_keys)); its end can pass
 * INT_MAX, so kernels take ranges in 64 bits. */
typedef struct {
  int split_keys;
  size_t n_splits;
  int same_lo, same_hi; /* the kv_len range with this answer (unsplit: split_keys = kv_len) */
} ca_splits;
/* A pure function of the device (compute units, type, vendor, max_wg), the
 * kernel's work-items per group, the number of work-groups per split
 * (items), kv_len and the key block the ranges are multiples of (splits.c). */
ca_splits ca_plan_splits(const tl_device *dev, size_t group_items, size_t items, int kv_len, size_t multiple);
/* The most splits ca_plan_splits gives any kv_len up to this one. */
size_t ca_plan_splits_bound(const tl_device *dev, size_t group_items, int kv_len);

/* The stages the staged and GEMM paths share (staged.c), over a chunk:
 * qk_score's scaled, shaped, masked scores, softmax_rows over them. */
void ca_plan_qk_score(ca_list *l, const clattn_context *ctx, cl_program core, const clattn_params *p,
                      const ca_resolved *r, ca_buf scores, int bh0, int i0, int rows, int heads);
void ca_plan_softmax(ca_list *l, const clattn_context *ctx, cl_program core, const clattn_params *p,
                     const ca_resolved *r, ca_buf scores, int bh0, int i0, int rows, int heads, ca_buf flag);

clattn_status ca_plan_fused(clattn_context *ctx, const clattn_params *p, const ca_resolved *r, ca_list *l);
clattn_status ca_plan_staged(clattn_context *ctx, const clattn_params *p, const ca_resolved *r, ca_list *l);
clattn_status ca_plan_gemm(clattn_context *ctx, const clattn_params *p, const ca_resolved *r, ca_list *l);
/* merge_states over mp's states (a checked clattn_merge_params, or the
 * split-KV partial states), sinks (f32 [heads] at sinks_offset, or NULL)
 * joining each row as a state with O = 0; the flag as ca_flag_of gave it. */
clattn_status ca_plan_merge_into(clattn_context *ctx, const clattn_merge_params *mp, ca_buf o, ca_buf lse,
                                 cl_mem sinks, size_t sinks_offset, ca_buf flag, ca_list *l);
/* A checked clattn_merge_states call's list. */
clattn_status ca_plan_merge(clattn_context *ctx, const clattn_merge_params *mp, ca_list *l);
/* A checked clattn_backward call's list. */
clattn_status ca_plan_backward(clattn_context *ctx, const clattn_backward_params *bp, ca_list *l);
/* A checked clattn_kv_append call's list; with lengths (NULL: none), the K
 * half also writes clattn_forward_kvcache's per-row lengths and starts. */
typedef struct {
  ca_buf leftpad, lens, starts;
} ca_step_lengths;
clattn_status ca_plan_append(clattn_context *ctx, const clattn_append_params *ap, const ca_step_lengths *lengths,
                             ca_list *l);
/* A checked clattn_forward_kvcache call's list. */
clattn_status ca_plan_kvcache(clattn_context *ctx, const clattn_kvcache_params *kp, ca_list *l);

/* ---- modifiers (modifier.c) ---- */

/* The kernels' modifier words of p: its captured scalars and its block
 * mask's geometry (bm_on 0 without one). */
ca_mod ca_mod_of(const clattn_params *p);
/* The program of key (p's modifiers in it) for the list: a program with
 * modifiers is held by l. */
clattn_status ca_plan_program(clattn_context *ctx, const ca_program_key *key, ca_list *l, ca_program *out);

/* ---- dropout (dropout.c) ---- */

/* p's dropout words for the kernels (on 0 without dropout). */
ca_drop ca_dropout_words(const clattn_params *p);
/* Whether weight (b, h, i, j) is kept under words d: the host's Philox. */
int ca_dropout_kept(const ca_drop *d, long b, long h, long i, long j);

#endif
