/*
 * The run layer: the executor enqueues a launch list (exec.c) on the
 * context's pools of kernel objects and scratch (kernel_pool.c,
 * scratch_pool.c), or on a plan's own resources, bound once (bound.c),
 * which it may record into a command buffer and replay with a step's
 * values (command_buffer.c). It decides nothing the list does not say.
 */
#ifndef CLATTN_RUN_H
#define CLATTN_RUN_H

#include "plan/plan.h"

/* ---- kernel objects (kernel_pool.c) ---- */

/* The argument values a kernel object holds, so a launch sets only those
 * that changed: up to CA_HELD_ARGS arguments, CA_HELD_BYTES bytes in all. */
enum { CA_HELD_ARGS = 48, CA_HELD_BYTES = 2048 };
typedef struct {
  int known[CA_HELD_ARGS]; /* 0: not known */
  size_t at[CA_HELD_ARGS], size[CA_HELD_ARGS];
  unsigned char bytes[CA_HELD_BYTES];
  unsigned long forgets; /* ca_mem_facts_forgets() when the caller's cl_mems were taken as held */
} ca_held;
/* Whether held holds (size, value) as argument i. */
int ca_held_has(const ca_held *held, cl_uint i, size_t size, const void *value);
/* Sets argument i of kernel to (size, value) unless held says it holds
 * that; holdable 0: never taken as held (a cl_mem the runtime may reuse). */
cl_int ca_held_set(cl_kernel kernel, ca_held *held, cl_uint i, size_t size, const void *value, int holdable);
void ca_held_forget(ca_held *held);

/* A pooled kernel object: one call's alone until given back. */
typedef struct ca_pooled_kernel {
  struct ca_pooled_kernel *next;
  cl_program program;
  cl_kernel kernel;
  int busy;
  char name[48];
  ca_held held;
} ca_pooled_kernel;
/* An idle kernel object of (program, name) for this call alone, created
 * when none is idle; give it back once its last enqueue has returned
 * (arguments are captured at enqueue). */
clattn_status ca_kernel_take(clattn_context *ctx, cl_program program, const char *name, ca_pooled_kernel **out);
void ca_kernel_give(clattn_context *ctx, ca_pooled_kernel *k); /* NULL: nothing */
int ca_kernel_pool_size(clattn_context *ctx);
void ca_kernel_pool_trim(clattn_context *ctx);

/* ---- the executor (exec.c) ---- */

/* Enqueues list l after the n_wait events, on the context's pools: each
 * scratch slot and the flag taken, the launches chained by events, under
 * CLATTN_EMPTY_ERROR the flag read after the last (CLATTN_ERR_EMPTY_ROW when
 * raised). *done (when non-NULL) receives the last launch's event; an
 * empty list enqueues a marker for it. l->error, when set, is returned
 * before anything is enqueued. */
clattn_status ca_run(clattn_context *ctx, const ca_list *l, cl_uint n_wait, const cl_event *wait, cl_event *done);

/* The buffers a list's symbolic arguments name in one run: its scratch
 * slots and flag. */
typedef struct {
  cl_mem scratch[CA_LIST_SCRATCH];
  cl_mem flag;
} ca_resources;
cl_mem ca_resolve_buf(const ca_resources *res, ca_buf b);
/* Sets launch x's arguments on kernel where they differ from what held
 * says it holds (mems_held: cl_mems too, where their handles cannot name
 * another buffer by now). */
clattn_status ca_set_launch_args(cl_kernel kernel, ca_held *held, int mems_held, const ca_list *l,
                                 const ca_launch *x, const ca_resources *res);
/* Enqueues launch x (kernel: its object, arguments set) after *prev, or
 * the wait list when *prev is NULL; *prev becomes its event. */
clattn_status ca_enqueue_launch(clattn_context *ctx, cl_kernel kernel, const ca_list *l, const ca_launch *x,
                                const ca_resources *res, cl_uint n_wait, const cl_event *wait, cl_event *prev);
/* OUT_OF_MEMORY, naming the buffer and the limit, when a scratch slot of l
 * is larger than the device allocates (nothing is enqueued then). */
clattn_status ca_check_scratch(const clattn_context *ctx, const ca_list *l);
/* Reads the empty-row flag after last: CLATTN_ERR_EMPTY_ROW when raised (*raised 1). */
clattn_status ca_read_flag(clattn_context *ctx, cl_mem flag, cl_event last, int *raised);
/* Hands a call's last event on: to *done on success when asked for, else released. */
void ca_hand_out(clattn_status st, cl_event *last, cl_event *done);

/* ---- a list's own resources (bound.c): a plan's ---- */

typedef struct ca_bound ca_bound;
/* Binds resources for lists like l (its scratch slots at l's sizes, the
 * flag, a kernel object per launch, every argument set from l); nothing is
 * enqueued. */
clattn_status ca_bind(clattn_context *ctx, const ca_list *l, ca_bound **out);
/* Enqueues l (a list like the bound one: its scratch no larger) on b's
 * resources after the n_wait events and, on an out-of-order queue, after
 * b's previous run; only the arguments that differ from what b's kernels
 * hold are set: with planned 0, l is the last run's list changed at most
 * at its step sites, and only those are looked at. A list of kernels alone
 * may replay from a command buffer (recorded on first use where the device
 * offers one, updated in place with mutable dispatch). One run at a time:
 * the caller serialises. */
clattn_status ca_run_bound(ca_bound *b, const ca_list *l, int planned, cl_uint n_wait, const cl_event *wait,
                           cl_event *done);
void ca_bound_release(ca_bound *b);
/* Runs that replayed the command buffer; of those, runs that first updated
 * its arguments or grids in place (for tests and the bench). */
long ca_bound_replays(const ca_bound *b);
long ca_bound_updates(const ca_bound *b);
/* A launch as the bound kernels stand: the kernel object, every argument set. */
typedef struct {
  cl_kernel kernel;
  const char *name;
  cl_uint dims;
  size_t global[3];
  const size_t *local; /* NULL = the runtime's */
} ca_kernel_launch;
/* The kernel launches of l on b's kernels (at most max); -1 when l holds
 * another kind of launch. */
int ca_bound_launches(ca_bound *b, const ca_list *l, ca_kernel_launch *out, int max);

/* ---- what a call's first command waits for (deps.c) ---- */

/* The caller's wait list and the pending last uses of the scratch and
 * flags it took, which the pools add (out-of-order queues). Every later
 * command of the call chains on the one before, so the call waits for
 * nothing else. */
enum { CA_DEPS_MAX = 16 };
typedef struct {
  cl_uint n_caller, n_own;
  const cl_event *caller;
  cl_event own[CA_DEPS_MAX]; /* held references; past CA_DEPS_MAX one marker stands for them */
  cl_event *merged;          /* the caller's and own events, made by ca_deps_list */
} ca_deps;
void ca_deps_init(ca_deps *d, cl_uint n_wait, const cl_event *wait);
/* Adds ev (its reference passes to d, also on failure). */
clattn_status ca_deps_add(clattn_context *ctx, ca_deps *d, cl_event ev);
/* The wait list of the call's first command (valid until ca_deps_release). */
clattn_status ca_deps_list(ca_deps *d, cl_uint *n, const cl_event **list);
void ca_deps_release(ca_deps *d);

/* ---- scratch and flags (scratch_pool.c) ---- */

/* A device buffer of at least `bytes` for this call alone; a buffer is
 * created or grown when none idle fits (what names it in the error). Its
 * previous use's pending last event goes to deps (out-of-order queues). */
clattn_status ca_scratch_take(clattn_context *ctx, size_t bytes, const char *what, ca_deps *deps, cl_mem *out);
/* Gives a buffer back; last_use: the event of the call's last command
 * (after every command that used it), NULL when not known (a failed call). */
void ca_scratch_give(clattn_context *ctx, cl_mem mem, cl_event last_use);
/* A zeroed empty-row flag (a device int) of the call's own (CLATTN_EMPTY_ERROR);
 * the zeroing, when it needs one, goes to deps. */
clattn_status ca_flag_take(clattn_context *ctx, ca_deps *deps, cl_mem *flag);
/* Gives a flag back: clean when read as zero after the call's last command,
 * else zeroed after last_use (NULL: not known) when next taken. */
void ca_flag_give(clattn_context *ctx, cl_mem flag, int clean, cl_event last_use);
/* Records that one call holds `bytes` of scratch (for clattn_peak_scratch_bytes). */
void ca_note_scratch(clattn_context *ctx, size_t bytes);
void ca_scratch_stats(clattn_context *ctx, int *buffers, size_t *bytes);
/* Releases what the pool holds idle (context destruction, tests). */
void ca_scratch_pool_trim(clattn_context *ctx);

/* ---- CLBlast's products (blast.c; blast_none.c without CLBlast) ---- */

/* C = A op(B) for each of g's matrices after *prev (or the wait list):
 * one strided batched SGEMM per run of evenly spaced offsets; *prev
 * becomes the event after them. a, b, c: the operands' buffers. */
clattn_status ca_blast_gemm(clattn_context *ctx, const ca_gemm *g, const size_t *offsets, cl_mem a, cl_mem b, cl_mem c,
                            cl_uint n_wait, const cl_event *wait, cl_event *prev);
/* At clattn_destroy: when ctx was the last live context to have called
 * CLBlast, empties CLBlast's process-wide program caches (blast.c says why). */
void ca_blast_release(clattn_context *ctx);

/* Frees what the context learnt of the device's command buffers (clattn_destroy). */
void ca_command_buffer_forget(clattn_context *ctx);

#endif
