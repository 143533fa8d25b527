/* Internal declarations shared by the host runtime's files (prefix ca_). */
#ifndef CLATTN_INTERNAL_H
#define CLATTN_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stddef.h>
#include "clattn.h"
#include "dtype.h"
#include "tiles.h"
#include "tuning.h"

struct clattn_context {
  cl_platform_id platform;
  cl_device_id device;
  cl_context context;
  cl_command_queue queue;
  int retained_device;          /* clRetainDevice was called: embedded mode (OpenCL 1.2) */
  tl_device caps;               /* what the device reports */
  tl_tiles tiles;               /* staged path's work-group shapes */
  int flash_block;              /* 0: CLATTN_FLASH_BLOCK=0, flash_tiled for every work-group fused call */
  cl_ulong block_private_max;   /* private bytes per work-item past which a built flash_block steps down (spills) */
  ca_origin origin[CA_T_COUNT]; /* where each tile value (and the scratch budget) came from */
  clattn_algo auto_algo[CA_CLASS_COUNT]; /* AUTO's choice per shape class; AUTO = built-in rule */
  char *tuning_path;                     /* the tuning file looked for; NULL = none */
  char *tuning_default_path;             /* where `clattn tune` writes this device's file; NULL = no cache directory */
  char tuning_note[1280];                /* what became of it: applied, absent, ignored or rejected (and why) */
  int tuning_applied;                    /* its values are in use */
  char env_note[768];                    /* an environment override that was ignored, and why; "" = none */
  cl_program core;       /* built at creation (f32 storage): qk_score, softmax_rows, mix_values, merge_states, gemm */
  cl_program core_16[2]; /* the same for f16 and bf16 storage, built on first use; under programs_lock */
  pthread_mutex_t programs_lock; /* guards the programs built on first use */
  struct ca_fused_program {
    int head_dim, value_dim;
    clattn_dtype dtype, k_dtype, v_dtype;
    cl_program program;
    tl_block block;  /* fused: flash_block's tile, built and able to run its work-group; rm 0 = none */
    int decode_runs; /* fused: flash_decode built and able to run its CA_DECODE_WG work-items */
    int dropout;     /* built with -D CA_DROPOUT (ca_text_dropout) */
  } * fused;
  cl_program append[3][5];  /* kv_append per (source dtype, cache dtype), built on first use; under programs_lock */
  cl_program core_kv[3][CA_DTYPES][CA_DTYPES]; /* core programs per (dtype, k, v storage: not both dtype), built on
                                                  first use; under programs_lock */
  int n_fused, cap_fused;   /* fused programs, one per (head_dim, value_dim), kept for the context's life */
  struct ca_fused_program *backward; /* backward programs, likewise; under programs_lock */
  int n_backward, cap_backward;
  double build_ms;                  /* time to build the programs at creation */
  char *cache_dir;                  /* the program cache's directory; NULL = no disk cache */
  int cache_binaries;               /* program binaries kept in cache_dir (ca_cache_keeps_binaries) */
  int builds_from_source;           /* programs compiled from source; creation or under programs_lock */
  int builds_from_cache;            /* programs loaded from the disk cache; likewise */
  cl_ulong max_alloc;               /* CL_DEVICE_MAX_MEM_ALLOC_SIZE */
  size_t scratch_budget;            /* bytes of score scratch the staged path may hold */
  size_t peak_scratch;              /* largest scratch of one call; guarded by scratch_lock */
  atomic_int blast_ready;           /* a CLBlast call has succeeded here (gemm.c: its first use is serialised) */
  atomic_ulong kernels_enqueued;    /* kernel launches by ca_enqueue so far (`clattn bench --host`'s floor) */
  int out_of_order;                 /* the queue runs commands out of order (scratch_pool.c orders reuse by events) */
  pthread_mutex_t barrier_lock;     /* out-of-order queues: a barrier and the commands behind it go in together (gemm.c) */
  struct ca_cb_api *cb_api;         /* command buffers: what the device offers, probed on first use; under programs_lock */
  pthread_mutex_t kernels_lock;     /* guards kernels */
  struct ca_pooled_kernel *kernels; /* kernel objects, reused across calls (kernel_pool.c) */
  pthread_mutex_t scratch_lock;     /* guards scratch, flags, sink_flag, scratch_bytes, peak_scratch */
  struct ca_pooled_buffer *scratch, *flags; /* device scratch and EMPTY_ERROR flags, reused (scratch_pool.c) */
  cl_mem sink_flag;                         /* the empty-row flag of calls that never read it */
  size_t scratch_bytes;                     /* bytes the scratch pool holds */
  char description[6144];
};

/* x rounded up to a multiple of m. */
static inline size_t ca_round_up(size_t x, size_t m) { return (x + m - 1) / m * m; }

/* ---- the thread's last route (route.c, clattn_last_route) ---- */

/* Starts this thread's route afresh with what the call is ("fused", "kv_append"). */
void ca_route_begin(const char *what);
/* Adds a kernel (ca_enqueue does for every enqueue) unless already listed. */
void ca_route_kernel(const char *name);
/* Sets this thread's route to a whole one ("fused: flash_rows, merge_states"). */
void ca_route_set(const char *whole);

/* ---- errors (error.c) ---- */

/* Records a message for clattn_last_error() in this thread and returns s. */
clattn_status ca_fail(clattn_status s, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
/* Maps an OpenCL error to a status and records "what: CL_NAME (code)". */
clattn_status ca_cl_fail(cl_int err, const char *what);
/* The status an OpenCL error maps to: memory codes OUT_OF_MEMORY, build
 * failures BUILD, anything else OPENCL. */
clattn_status ca_cl_status(cl_int err);
const char *ca_cl_error_name(cl_int err);

/* Runs an OpenCL call; on failure records it into `status` and jumps to `fail`. */
#define CA_CHECK_CL(status, call, what)       \
  do {                                        \
    cl_int ca_err_ = (call);                  \
    if (ca_err_ != CL_SUCCESS) {              \
      (status) = ca_cl_fail(ca_err_, (what)); \
      goto fail;                              \
    }                                         \
  } while (0)

/* ---- devices (device.c) ---- */

/* Picks a device: match (substring of platform or device name, any case),
 * else the first GPU, else the first device. */
clattn_status ca_pick_device(const char *match, cl_platform_id *platform, cl_device_id *device);
/* Fills what tile choice needs (pref_multiple is left for the caller). */
clattn_status ca_query_device(cl_device_id device, tl_device *caps, cl_ulong *max_alloc);
/* A device info string into buf (never fails: "?" when unknown). */
void ca_device_string(cl_device_id device, cl_device_info what, char *buf, size_t size);
void ca_platform_string(cl_platform_id platform, cl_platform_info what, char *buf, size_t size);
/* Whether the device adds floats atomically itself (cl_ext_float_atomics on
 * an OpenCL 3.0 device); elsewhere the backward's atomic dQ adds by compare-and-swap. */
int ca_device_float_atomics(cl_device_id device);
/* flash_rows' floats per vector (FLASH_VW: 4, 8 or 16), a pure function of
 * the device's float vector widths; its key blocks hold twice that. */
int ca_flash_vw(const tl_device *caps);
/* flash_rows' rows per work-item with vectors of vw floats: its score tile
 * (two vectors per row) stays in registers across the head dim. 8 on CPUs
 * with width 16 (AVX-512: 32 vector registers), else 4 (AVX2 and SSE have
 * 16: 8 rows spill; GPUs run flash_rows only when forced). */
int ca_flash_bm(const tl_device *caps, int vw);

/* ---- programs (program.c) ---- */

/* Builds a program from the embedded sources (concatenated in order) with
 * options; on failure the message carries the head of the build log. */
clattn_status ca_build_program(clattn_context *ctx, const char *name, const char *const *sources, cl_uint n_sources,
                               const char *options, cl_program *out);
/* A fresh kernel object (calls take theirs from the pool: ca_kernel_take). */
clattn_status ca_create_kernel(cl_program program, const char *name, cl_kernel *out);

/* ---- the program registry (registry.c) ---- */

/* Builds the f32 core program at creation; when a kernel cannot run the
 * chosen group size, lowers the work-group limit, chooses again, rebuilds. */
clattn_status ca_build_core(clattn_context *ctx);
/* The core program for a storage type (f32: ctx->core; f16, bf16 built on
 * first use and kept for the context's life). */
clattn_status ca_core_program(clattn_context *ctx, clattn_dtype dtype, cl_program *out);
/* The core program for q/out stored as dtype, k as k_dtype and v as
 * v_dtype (both dtype: ca_core_program's); built on first use. */
clattn_status ca_core_program_kv(clattn_context *ctx, clattn_dtype dtype, clattn_dtype k_dtype, clattn_dtype v_dtype,
                                 cl_program *out);
/* The fused program for (head_dim, value_dim, dtype, k_dtype, v_dtype), with
 * dropout applied or not: built on first use, then kept for the context's
 * life. *info (when
 * non-NULL): its table entry, with the tile its flash_block runs with (rm 0
 * when it cannot) and whether its flash_decode runs, asked once per program. */
clattn_status ca_fused_program(clattn_context *ctx, int head_dim, int value_dim, clattn_dtype dtype,
                               clattn_dtype k_dtype, clattn_dtype v_dtype, int dropout, cl_program *out,
                               struct ca_fused_program *info);
/* The backward program for (head_dim, value_dim, dtype), with dropout
 * applied or not; built on first use. */
clattn_status ca_backward_program(clattn_context *ctx, int head_dim, int value_dim, clattn_dtype dtype, int dropout,
                                  cl_program *out);
/* The kv_append program for (source, cache) storage; built on first use. */
clattn_status ca_append_program(clattn_context *ctx, clattn_dtype src, clattn_dtype kv, cl_program *out);
/* Releases every program the context holds (clattn_destroy). */
void ca_release_programs(clattn_context *ctx);

/* ---- context-owned kernels and scratch (kernel_pool.c, scratch_pool.c) ---- */

/* Sets a kernel's arguments in order (launch.c's ca_arg*); the first failure
 * is kept for ca_args_done, so a call site reads as the kernel's signature.
 * held: the values a pooled kernel object holds from its earlier calls. */
enum { CA_HELD_ARGS = 96, CA_HELD_BYTES = 32 };
typedef struct ca_arg_cache {
  struct ca_held_arg {
    unsigned char size; /* 0: not known */
    unsigned char bytes[CA_HELD_BYTES];
  } arg[CA_HELD_ARGS];
} ca_arg_cache;
typedef struct {
  cl_kernel kernel;
  const char *name;
  cl_uint index, failed_index;
  cl_int err;
  ca_arg_cache *held; /* the values the kernel object holds (a pooled one's), NULL = not known */
} ca_args;

/* An idle kernel object of (program, name) for this call alone, created
 * when none is idle; give it back once its last enqueue has returned. */
clattn_status ca_kernel_take(clattn_context *ctx, cl_program program, const char *name, cl_kernel *out);
/* The same, as a ca_args that knows the argument values the object holds
 * from its earlier calls: an argument equal to its held value is not set
 * again (a decode loop changes a few of a fused kernel's 74). Held: every
 * value but a cl_mem other than NULL, whose handle may name another
 * buffer by now. */
clattn_status ca_kernel_take_args(clattn_context *ctx, cl_program program, const char *name, ca_args *out);
void ca_kernel_give(clattn_context *ctx, cl_kernel kernel); /* NULL: nothing */
int ca_kernel_pool_size(clattn_context *ctx);
/* What a call's first command waits for (deps.c): the caller's wait list
 * and the pending last uses of the scratch and flags it took, which the
 * pools add (out-of-order queues). Every later command of the call chains
 * on the one before, so the call waits for nothing else. */
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

/* A device buffer of at least `bytes` for this call alone; a buffer is
 * created or grown when none idle fits (what names it in the error). Its
 * previous use's pending last event goes to deps (out-of-order queues). */
clattn_status ca_scratch_take(clattn_context *ctx, size_t bytes, const char *what, ca_deps *deps, cl_mem *out);
/* Gives a buffer back; last_use: the event of the call's last command
 * (after every command that used it), NULL when not known (a failed call). */
void ca_scratch_give(clattn_context *ctx, cl_mem mem, cl_event last_use);
/* The empty-row flag of a call: under CLATTN_EMPTY_ERROR a zeroed device int
 * of its own (the zeroing, when it needs one, goes to deps), otherwise the
 * context's sink flag (never read). */
clattn_status ca_flag_take(clattn_context *ctx, clattn_empty_rows policy, ca_deps *deps, cl_mem *flag);
/* Gives a flag back: clean when read as zero after the call's last command,
 * else zeroed after last_use (NULL: not known) when next taken. */
void ca_flag_give(clattn_context *ctx, cl_mem flag, int clean, cl_event last_use);
/* Records that one call holds `bytes` of scratch (for clattn_peak_scratch_bytes). */
void ca_note_scratch(clattn_context *ctx, size_t bytes);
void ca_scratch_stats(clattn_context *ctx, int *buffers, size_t *bytes);
/* Release what the pools hold idle (kernels; scratch and flags); the sink
 * flag too, so only while no call is in progress (context destruction, tests). */
void ca_kernel_pool_trim(clattn_context *ctx);
void ca_scratch_pool_trim(clattn_context *ctx);

/* ---- program cache (cache.c) ---- */

/* 128 bits over library version, platform, device, driver, sources, options. */
typedef struct {
  unsigned char bytes[16];
} ca_cache_key;
void ca_cache_key_of(const clattn_context *ctx, const char *const *sources, cl_uint n_sources, const char *options,
                     ca_cache_key *key);
/* 128 bits over platform, device and driver only: what a tuning file is for
 * (a library upgrade keeps it; the program cache's key changes). */
void ca_device_key_of(const clattn_context *ctx, ca_cache_key *key);
/* The built program from a validated entry of ctx->cache_dir, or NULL (miss;
 * an entry that does not validate or build is deleted). Never fails a call. */
cl_program ca_cache_load(clattn_context *ctx, const ca_cache_key *key, const char *options);
/* An entry's bytes (file, n) checked against key: header, a length field
 * equal to what the file holds, the checksum. 0 with where the payload lies
 * (inside file), or -1. Touches nothing past file[n - 1]. */
int ca_cache_entry_parse(const unsigned char *file, size_t n, const ca_cache_key *key, size_t *payload_at,
                         size_t *payload_len);
/* The checksum an entry's header carries (0 when n is shorter than a header). */
uint64_t ca_cache_entry_checksum(const unsigned char *file, size_t n);
/* Writes program's binary for ctx->device atomically (temp file + rename);
 * best effort, silent on failure. */
void ca_cache_store(clattn_context *ctx, const ca_cache_key *key, cl_program program);
/* The cache directory's size cap: CLATTN_CACHE_MAX_BYTES (a positive
 * integer), else 512 MiB (cache_evict.c). */
uint64_t ca_cache_cap(void);
/* Removes dir's least recently used entries (oldest mtime first) until they
 * total at most cap bytes; never the entry at path keep (may be NULL). */
void ca_cache_evict(const char *dir, const char *keep, uint64_t cap);
/* The cache directory: opt when non-NULL, else env CLATTN_CACHE_DIR, else
 * $XDG_CACHE_HOME/clattn, else $HOME/.cache/clattn, created when missing.
 * NULL (no cache) for "" or when it cannot be created or written. malloc'd. */
char *ca_cache_dir_resolve(const char *opt);
/* Whether program binaries go to the cache directory: always to one the
 * caller named (options.cache_dir or CLATTN_CACHE_DIR); to the default one
 * except on POCL with its own kernel cache on (cache.c says why). */
int ca_cache_keeps_binaries(cl_platform_id platform, int dir_named);
/* Programs built from source and loaded from the cache so far (for tests). */
void ca_cache_counts(const clattn_context *ctx, int *from_source, int *from_cache);

/* ---- which views of a call share bytes (alias.c) ---- */

/* The bytes one view reaches: count[d] elements step[d] bytes apart in each
 * dimension that moves (longer than 1, stride not 0), elem bytes each, from
 * byte `first` of its cl_mem; end: one past its last byte. space and base
 * place its cl_mem's bytes among other cl_mems' (validate.c's locate). */
typedef struct {
  const char *name;
  int is_output;
  cl_mem buf;
  const void *space;
  size_t base, first, end, elem;
  int rank;
  size_t count[5], step[5];
} ca_extent;

enum { CA_MAX_VIEWS = 32 }; /* a backward call checks at most 26 */

/* The views of one call, recorded as validation checks them. */
typedef struct {
  cl_context context; /* the clattn context's: every view's cl_mem must belong to it */
  int n;
  ca_extent v[CA_MAX_VIEWS];
} ca_views;

void ca_views_init(ca_views *vs, cl_context context);
/* Records view t of dims[0..rank) (checked: it fits its buffer, end bytes
 * from the start) whose cl_mem's bytes lie at base in space. */
clattn_status ca_views_add(ca_views *vs, const char *name, const clattn_tensor *t, const int *dims, int rank,
                           size_t elem, int is_output, const void *space, size_t base, size_t end);
/* Makes the last view recorded the last of n copies, step bytes apart
 * (merge's states). */
void ca_views_repeat_last(ca_views *vs, size_t n, size_t step);
/* Moves view `name` (when recorded) to start at byte `first` of its cl_mem
 * (a plan's step moving q, out or lse). */
void ca_views_move(ca_views *vs, const char *name, size_t first);
/* INVALID_ARGUMENT naming both when an output shares a byte with another
 * view of the call (clattn.h, clattn_tensor). */
clattn_status ca_views_disjoint(const ca_views *vs);

/* ---- what validation learns of a caller's cl_mem (mem_facts.c) ---- */

/* CL_MEM_SIZE, CL_MEM_TYPE, CL_MEM_CONTEXT, CL_MEM_FLAGS and where the bytes lie
 * (CL_MEM_ASSOCIATED_MEMOBJECT, CL_MEM_OFFSET, CL_MEM_HOST_PTR): fixed for a
 * cl_mem's life. */
typedef struct {
  size_t size;
  cl_mem_object_type type;
  cl_context context;
  cl_mem_flags flags;
  const void *space; /* and where its bytes lie among other cl_mems' (validate.c's locate) */
  size_t base;
} ca_mem_facts;
/* 1 with m's facts when kept (m alive since), else 0. */
int ca_mem_facts_cached(cl_mem m, ca_mem_facts *out);
/* Keeps m's facts until the runtime deletes m (a destructor callback); not
 * kept when the callback cannot be registered. */
void ca_mem_facts_keep(cl_mem m, const ca_mem_facts *facts);

/* ---- validation (validate.c) ---- */

/* A chunk of query rows: `rows` rows in each of `heads` consecutive
 * (batch, head) pairs. The staged and GEMM paths hold heads x rows x N
 * scores at a time; ca_plan_chunks keeps that under budget bytes. */
typedef struct {
  int heads, rows;
} ca_chunk;

/* A validated call, resolved into what the kernels take. */
typedef struct {
  float scale;                   /* effective scale */
  int window_left, window_right; /* -1 = unbounded; causal folded in */
  int group;                     /* q_heads / kv_heads */
  int has_mask, has_bias, has_kv_lens, want_lse, want_weights;
  int diag;              /* route diagnostics asked for: CA_DIAG_* bits */
  clattn_dtype k_dtype, v_dtype; /* K and V storage, CLATTN_DTYPE_SAME resolved */
  int paged;             /* K/V through a block table */
  clattn_algo algo;      /* AUTO resolved */
  ca_chunk chunk;        /* staged and GEMM: query rows per pass (the plan step's ca_plan_chunks) */
  cl_mem dropout;        /* the kernels' dropout words (ca_dropout_take), NULL = none */
} ca_plan;

enum { CA_DECODE_KERNEL_ROWS = 16, CA_DECODE_WG = 64 /* cl/decode.cl's DEC_WG */ };
enum { CA_BLOCK_WG = 128 }; /* work-items per group of cl/flash_block.cl */

/* The route diagnostics' bits (cl/common.h.cl's CA_DIAG_*). */
enum { CA_DIAG_ENTROPY = 1, CA_DIAG_MAX_WEIGHT = 2, CA_DIAG_ARGMAX = 4 };

/* The fields that decide which programs a call builds: dtype, kv_dtype,
 * v_dtype, head_dim, value_dim (their ranges; the block types' blocks of
 * 32). ca_validate and clattn_prepare both check them here, so they refuse
 * the same shapes. */
clattn_status ca_check_storage(const clattn_params *p);
/* The storage of k (kv_dtype, SAME = dtype) and of v (v_dtype, SAME = k's). */
clattn_dtype ca_k_dtype(const clattn_params *p);
clattn_dtype ca_v_dtype(const clattn_params *p);

/* Every check that needs no device work; fills plan. */
clattn_status ca_validate(const clattn_context *ctx, const clattn_params *p, ca_plan *plan);
/* ca_validate, its views left in *views: what a plan's steps check again
 * with ca_views_move. */
clattn_status ca_validate_views(const clattn_context *ctx, const clattn_params *p, ca_plan *plan, ca_views *views);
/* The same for clattn_backward's fwd: out and lse are the forward's, read
 * (a buffer created CL_MEM_READ_ONLY will do), each element its own. Its
 * views are left in *views (ca_views_init'ed here), every one an input, for
 * the backward to add its own to and check with ca_views_disjoint. */
clattn_status ca_validate_backward_fwd(const clattn_context *ctx, const clattn_params *p, ca_plan *plan,
                                       ca_views *views);

/* Checks that a view of dims[0..rank) fits its buffer (and, for an output,
 * neither broadcasts nor overlaps itself): BAD / BUFFER_TOO_SMALL; records
 * it in vs. */
clattn_status ca_check_view(ca_views *vs, const char *name, const clattn_tensor *t, const int *dims, int rank,
                            size_t elem_size, int is_output);

/* Checks a merge call like ca_validate checks a forward call. */
clattn_status ca_validate_merge(const clattn_context *ctx, const clattn_merge_params *mp);

/* ---- dropout (dropout.c) ---- */

/* A read-only buffer holding p's dropout words for the kernels
 * (cl/common.h.cl's CA_DROP_ARGS), made for one call or plan; NULL without
 * dropout. The caller releases it once the kernels are enqueued. */
clattn_status ca_dropout_take(clattn_context *ctx, const clattn_params *p, cl_mem *out);

/* ---- the plan step (plan.c) ---- */

/* The staged and GEMM paths' chunks for a budget of score bytes. */
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
} ca_splits;
/* A pure function of the device (compute units, type, vendor, max_wg), the
 * kernel's work-items per group, the number of work-groups per split
 * (items), kv_len and the key block the ranges are multiples of: see plan.c. */
ca_splits ca_plan_splits(const tl_device *dev, size_t group_items, size_t items, int kv_len, size_t multiple);
/* The most splits ca_plan_splits gives any kv_len up to this one. */
size_t ca_plan_splits_bound(const tl_device *dev, size_t group_items, int kv_len);

/* How a fused call runs (plan.c's ca_plan_fused): the program and kernel,
 * its grid, the packed copies of K and V (flash_rows: kt_bytes, vp_bytes
 * over n_pad padded keys; 0 when read in place) and the key split, with
 * what the split follows from (group_items, row_blocks, kv_pairs,
 * key_multiple; unsplit: one pass whatever the length). */
typedef struct {
  cl_program program;
  char kernel[32];
  size_t global[3], local[3];
  int packed;
  cl_long n_pad;
  cl_ulong kt_bytes, vp_bytes;
  ca_splits splits;
  size_t group_items, row_blocks, kv_pairs, key_multiple;
  int unsplit;
} ca_fused_launch;
clattn_status ca_plan_fused(clattn_context *ctx, const clattn_params *p, const ca_plan *plan, ca_fused_launch *l);
/* Re-plans what follows kv_len (n_pad, the split, the grid's splits) for
 * a call like l's with kv_len keys: the same as ca_plan_fused would give. */
void ca_fused_lengths(const clattn_context *ctx, ca_fused_launch *l, int kv_len);

/* ---- launching (launch.c) ---- */

/* The argument setters (ca_args above). */
void ca_arg(ca_args *a, size_t size, const void *value);
void ca_arg_mem(ca_args *a, cl_mem m);
void ca_arg_int(ca_args *a, int v);
void ca_arg_float(ca_args *a, float v);
void ca_arg_view(ca_args *a, const clattn_tensor *t); /* buffer, offset, stride */
/* The route diagnostics' arguments: entropy, max_weight and argmax views, then plan->diag. */
void ca_arg_diag(ca_args *a, const clattn_params *p, int diag);
/* The score shaping's arguments (common.h.cl's CA_SHAPE_ARGS): softcap, ALiBi slopes, their batch stride. */
void ca_arg_shape(ca_args *a, const clattn_params *p);
/* Where each sequence lies (common.h.cl's CA_SEQ_ARGS): kv_lens, packed
 * variable-length batches' cu_seqlens and totals, whether K/V are paged,
 * where each row's keys start (cache_leftpad). */
void ca_arg_seq(ca_args *a, const clattn_params *p);
/* K/V storage (common.h.cl's CA_KV_ARGS): block table, its stride, page
 * size, pool size, INT8 scale views. */
void ca_arg_kv(ca_args *a, const clattn_params *p);
/* What decides the allowed keys and adds to scores, as the scoring kernels
 * take it: mask view and flag, bias view, its flags and scale, then ca_arg_seq. */
void ca_arg_allowed(ca_args *a, const clattn_params *p);
/* The score's form (common.h.cl's CA_SCORE_ARGS): additive_w, additive. */
void ca_arg_score(ca_args *a, const clattn_params *p);
/* Sinks: the buffer and where head 0's sink lies in it (-1: none). */
void ca_arg_sinks(ca_args *a, const clattn_params *p);
/* Where the arguments a plan's step patches sit (their indices): the q,
 * out and lse views' offsets, kv_len, n_pad and split_keys (flash_pack:
 * kv_len and n_pad). */
typedef struct {
  cl_uint q_off, out_off, lse_off, kv_len, n_pad, split_keys;
} ca_fused_slots;
/* The fused kernels' arguments (FLASH_KERNEL_ARGS in cl/flash.cl), which
 * flash_decode takes too: kt, vp and n_pad the packed copies (NULL, NULL, 0
 * when K and V are read in place), then the split, diagnostics, partial
 * states and empty-row flag; slots (when non-NULL) gets where they sit. */
void ca_arg_fused(ca_args *r, const clattn_params *p, const ca_plan *plan, cl_mem kt, cl_mem vp, cl_long n_pad,
                  int split_keys, int diag, cl_mem part_o, cl_mem part_lse, cl_mem flag, ca_fused_slots *slots);
/* flash_pack's arguments: K and V into kt and vp over n_pad keys (slots:
 * its kv_len and n_pad). */
void ca_arg_pack(ca_args *a, const clattn_params *p, cl_long n_pad, cl_mem kt, cl_mem vp, ca_fused_slots *slots);
clattn_status ca_args_done(const ca_args *a);

/* Enqueues a kernel after *prev (or, when *prev is NULL, after the caller's
 * wait list) and makes its event the new *prev: the chain orders a call's
 * kernels on in-order and out-of-order queues alike. */
clattn_status ca_enqueue(clattn_context *ctx, cl_kernel kernel, const char *name, cl_uint dims, const size_t *global,
                         const size_t *local, cl_uint n_wait, const cl_event *wait, cl_event *prev);

/* Ends a call's enqueues: under EMPTY_ERROR waits for last and reads the
 * flag (CLATTN_ERR_EMPTY_ROW when raised). Gives *flag back (ca_flag_take's)
 * and sets it NULL. */
clattn_status ca_finish_call(clattn_context *ctx, clattn_empty_rows policy, cl_mem *flag, cl_event last);
/* Hands a call's last event on: to *done on success when asked for, else
 * released. */
void ca_hand_out(clattn_status st, cl_event *last, cl_event *done);

/* ---- paths ---- */
/* Enqueues merge_states for validated params after *prev (see ca_enqueue);
 * out is stored as mp->out_dtype; sinks (f32 [heads], or NULL) join each row
 * as a state with O = 0. */
clattn_status ca_enqueue_merge(clattn_context *ctx, const clattn_merge_params *mp, cl_mem sinks, size_t sinks_offset,
                               cl_mem empty_flag,
                               cl_uint n_wait, const cl_event *wait, cl_event *prev);
/* Where merge_states' arguments a plan's step patches sit: n_states, the
 * out and out_lse views' offsets. */
typedef struct {
  cl_uint n_states, out_off, lse_off;
} ca_merge_slots;
/* merge_states' arguments for mp (slots, when non-NULL, gets where they sit)
 * and its grid. */
void ca_arg_merge(ca_args *a, const clattn_merge_params *mp, cl_mem sinks, size_t sinks_offset, cl_mem empty_flag,
                  ca_merge_slots *slots);
void ca_merge_global(const clattn_merge_params *mp, size_t global[3]);
/* The merge of n_splits partial states ([split][b][h][m] rows of value_dim,
 * and their lse) into p's out and lse. */
clattn_merge_params ca_split_merge_params(const clattn_params *p, size_t n_splits, cl_mem part_o, cl_mem part_lse);
/* merge_states over n_splits partial states (ca_split_merge_params). */
clattn_status ca_enqueue_split_merge(clattn_context *ctx, const clattn_params *p, size_t n_splits, cl_mem part_o,
                                     cl_mem part_lse, cl_mem flag, cl_uint n_wait, const cl_event *wait,
                                     cl_event *prev);
clattn_status ca_fused_forward(clattn_context *ctx, const clattn_params *p, const ca_plan *plan,
                               const ca_fused_launch *l, cl_uint n_wait, const cl_event *wait, cl_event *done);
/* Whether this build has the GEMM path: 1 with CLBlast (gemm.c), else 0
 * (gemm_unsupported.c: ca_gemm_forward returns CLATTN_ERR_UNSUPPORTED). */
int ca_gemm_available(void);
/* At clattn_destroy: when ctx was the last live context to have called
 * CLBlast, empties CLBlast's process-wide program caches (gemm.c says why). */
void ca_gemm_release(clattn_context *ctx);
clattn_status ca_gemm_forward(clattn_context *ctx, const clattn_params *p, const ca_plan *plan, cl_uint n_wait,
                              const cl_event *wait, cl_event *done);
/* Enqueues qk_score for a chunk (heads x rows x N scores: scaled, shaped,
 * masked) (staged, and GEMM for additive scores). */
clattn_status ca_enqueue_qk_score(clattn_context *ctx, cl_kernel score, cl_mem scores, const clattn_params *p,
                                  const ca_plan *plan, int bh0, int i0, int rows, int heads, cl_uint n_wait,
                                  const cl_event *wait, cl_event *prev);
/* Enqueues softmax_rows over a chunk of scores (heads x rows x N, in place)
 * with the call's lse, weights and diagnostics outputs (staged and GEMM). */
clattn_status ca_enqueue_softmax(clattn_context *ctx, cl_kernel softmax, cl_mem scores, const clattn_params *p,
                                 const ca_plan *plan, int bh0, int i0, int rows, int heads, cl_mem empty_flag,
                                 cl_uint n_wait, const cl_event *wait, cl_event *prev);
/* Validates an append call (see clattn_kv_append). */
clattn_status ca_validate_append(const clattn_context *ctx, const clattn_append_params *ap);
/* clattn_forward_kvcache's per-row lengths (int32 [batch]: positions +
 * new_len, and leftpad or 0), which its append writes on the way. */
typedef struct {
  cl_mem leftpad, lens, starts;
} ca_step_lengths;
/* Enqueues a validated append (new_len > 0) after *prev (see ca_enqueue):
 * kv_append for the K half, then the V half; with lengths (NULL: none) the
 * K half writes them too. */
clattn_status ca_enqueue_append(clattn_context *ctx, const clattn_append_params *ap, const ca_step_lengths *lengths,
                                cl_uint n_wait, const cl_event *wait, cl_event *prev);
/* Validates a clattn_forward_kvcache call: every check of clattn_forward
 * on *fp (attn with the derived fields: a block table of cache_batch_idx,
 * kv_lens standing in as cache_seqlens until the call's lengths replace
 * it) and, with new_len > 0, of clattn_kv_append on *ap, then the step's
 * own, and which views share bytes with the cache an output; fills plan. */
clattn_status ca_validate_kvcache(const clattn_context *ctx, const clattn_kvcache_params *kp, clattn_params *fp,
                                  clattn_append_params *ap, ca_plan *plan);
/* Enqueues a validated forward (ca_validate's plan) on its path after the
 * n_wait events: clattn_forward past its checks. */
clattn_status ca_forward_enqueue(clattn_context *ctx, const clattn_params *p, ca_plan *plan, cl_uint n_wait,
                                 const cl_event *wait, cl_event *done);
clattn_status ca_staged_forward(clattn_context *ctx, const clattn_params *p, const ca_plan *plan, cl_uint n_wait,
                                const cl_event *wait, cl_event *done);

/* A kernel launch: its name (for messages), dims, grid and work-group
 * (NULL = the runtime's). */
typedef struct {
  cl_kernel kernel;
  const char *name;
  cl_uint dims;
  size_t global[3];
  const size_t *local;
} ca_launch;

/* Steps of a plan that replayed its command buffer (forward_plan.c; for tests and the bench). */
long ca_plan_replays(clattn_plan *plan);
/* Of those, the steps that first updated the recorded commands' arguments
 * or grids in place (mutable dispatch), rather than replaying them as they
 * were or recording them anew (for tests). */
long ca_plan_updates(clattn_plan *plan);
/* A fused plan's launches as its kernels stand (its own kernel objects,
 * every argument set), at most 3; 0 for a staged or GEMM plan. For
 * `clattn bench --host`'s floor, which enqueues them bare. */
int ca_plan_launches(clattn_plan *plan, ca_launch *out);

#endif
