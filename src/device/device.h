/*
 * The device layer: the context (the OpenCL objects and what clattn learnt
 * and chose for its device), device queries, tiles and tuning (tiles.h,
 * tuning.h), the programs a call runs (one table, built on first use and
 * cached on disk).
 */
#ifndef CLATTN_DEVICE_H
#define CLATTN_DEVICE_H

#include <pthread.h>
#include <stdatomic.h>

#include "base/base.h"
#include "device/program_text.h"
#include "device/tiles.h"
#include "device/tuning.h"

/* What the host plans with of the kernels: flash_decode's group (cl/decode.cl's
 * DEC_WG) and most rows per KV head (DEC_ROWS), flash_block's group. */
enum { CA_DECODE_WG = 64, CA_DECODE_KERNEL_ROWS = 16, CA_BLOCK_WG = 128 };

/* Which program: its kind and what specialises it. Fields a kind does not
 * read are 0 (program_text.c says which each reads). */
typedef enum {
  CA_PROGRAM_CORE,     /* qk_score, softmax_rows, mix_values, merge_states, gemm_*: per (dtype, k, v storage) */
  CA_PROGRAM_FUSED,    /* flash_*, flash_decode: per head dims, storages, dropout */
  CA_PROGRAM_BACKWARD, /* backward.cl, backward_staged.cl: per head dims, dtype, dropout */
  CA_PROGRAM_APPEND,   /* kv_append, kvcache_*: per (new rows' storage = dtype, cache storage = k_dtype) */
  CA_PROGRAM_MODIFIER  /* modifier.cl: block masks, pointwise evaluation; per modifier */
} ca_program_kind;

/* A program's modifiers (clattn_params.score_mod, mask_mod): which
 * functions it is built to call and a hash of their text; the text itself
 * is read only while the program is built (NULL in the table). flags
 * (program_text.h's CA_MODF_*) 0: none. */
typedef struct {
  int flags;
  unsigned char hash[16];
  const char *score_text, *mask_text;
} ca_mod_key;

typedef struct {
  ca_program_kind kind;
  clattn_dtype dtype, k_dtype, v_dtype; /* CLATTN_DTYPE_SAME resolved */
  int head_dim, value_dim, dropout;
  ca_mod_key mod;
} ca_program_key;

/* A built program and what was learnt of it once, when it was built. */
typedef struct {
  ca_program_key key;
  cl_program program;
  tl_block block;  /* fused: flash_block's tile, built and able to run its work-group; rm 0 = none */
  int decode_runs; /* fused: flash_decode built and able to run its CA_DECODE_WG work-items */
  unsigned long last_use; /* programs with modifiers: the table's clock at their last lookup */
} ca_program;

struct clattn_context {
  /* the OpenCL objects */
  cl_platform_id platform;
  cl_device_id device;
  cl_context context;
  cl_command_queue queue;
  int retained_device; /* clRetainDevice was called: embedded mode (OpenCL 1.2) */
  int out_of_order;    /* the queue runs commands out of order (the pools order reuse by events) */
  /* what the device reports, and what clattn chose from it */
  tl_device caps;
  cl_ulong max_alloc;                    /* CL_DEVICE_MAX_MEM_ALLOC_SIZE */
  tl_tiles tiles;                        /* every kernel's tile */
  int flash_block;                       /* 0: CLATTN_FLASH_BLOCK=0, flash_tiled for every work-group fused call */
  cl_ulong block_private_max;            /* private bytes per work-item past which a built flash_block steps down */
  size_t scratch_budget;                 /* bytes of score scratch the staged and GEMM paths may hold */
  ca_origin origin[CA_T_COUNT];          /* where each tile value (and the scratch budget) came from */
  clattn_algo auto_algo[CA_CLASS_COUNT]; /* AUTO's choice per shape class; AUTO = built-in rule */
  char *tuning_path;                     /* the tuning file looked for; NULL = none */
  char *tuning_default_path;             /* where `clattn tune` writes this device's file; NULL = no cache directory */
  char tuning_note[1280];                /* what became of it: applied, absent, ignored or rejected (and why) */
  int tuning_applied;                    /* its values are in use */
  char env_note[768];                    /* an environment override that was ignored, and why; "" = none */
  /* programs: one table, under programs_lock after creation */
  pthread_mutex_t programs_lock;
  ca_program *programs;
  int n_programs, cap_programs;
  unsigned long program_clock;     /* lookups of programs with modifiers (their last_use) */
  unsigned long programs_released; /* programs with modifiers the table released past its bound */
  double build_ms;        /* time to build the programs at creation */
  char *cache_dir;        /* the program cache's directory; NULL = no disk cache */
  int cache_binaries;     /* program binaries kept in cache_dir (ca_cache_keeps_binaries) */
  int builds_from_source; /* programs compiled from source; creation or under programs_lock */
  int builds_from_cache;  /* programs loaded from the disk cache; likewise */
  /* the executor's pools and counters (run/) */
  atomic_int blast_ready;         /* a CLBlast call has succeeded here (run/blast.c: its first use is serialised) */
  atomic_ulong kernels_enqueued;  /* kernel launches so far */
  pthread_mutex_t barrier_lock;   /* out-of-order queues: a barrier and the commands behind it go in together */
  struct ca_cb_api *cb_api;       /* command buffers: what the device offers, probed on first use; programs_lock */
  pthread_mutex_t kernels_lock;   /* guards kernels */
  struct ca_pooled_kernel *kernels;         /* kernel objects, reused across calls (run/kernel_pool.c) */
  unsigned long kernels_pruned;             /* programs_released when the pool last dropped their kernels */
  pthread_mutex_t scratch_lock;             /* guards scratch, flags, scratch_bytes, peak_scratch */
  struct ca_pooled_buffer *scratch, *flags; /* device scratch and EMPTY_ERROR flags, reused (run/scratch_pool.c) */
  size_t scratch_bytes;                     /* bytes the scratch pool holds */
  size_t peak_scratch;                      /* largest scratch of one call */
  struct ca_last_call *last_call;           /* the last clattn_forward's list (api/last_call.c); NULL: none kept */
  char description[6144];
};

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

/* ---- programs (program.c, programs.c) ---- */

/* Builds a program from the embedded sources (concatenated in order) with
 * options; on failure the message carries the head of the build log. */
clattn_status ca_build_program(clattn_context *ctx, const char *name, const char *const *sources, cl_uint n_sources,
                               const char *options, cl_program *out);
/* A fresh kernel object (calls take theirs from the pool). */
clattn_status ca_create_kernel(cl_program program, const char *name, cl_kernel *out);
/* Builds the f32 core program at creation; when a kernel cannot run the
 * chosen group size, lowers the work-group limit, chooses again, rebuilds. */
clattn_status ca_build_core(clattn_context *ctx);
/* The program of *key: built on first use (fused programs with flash_block's
 * tile stepped down until it runs without spilling), then kept for the
 * context's life. *out is a copy of its table entry. */
clattn_status ca_program_get(clattn_context *ctx, const ca_program_key *key, ca_program *out);
/* The keys of the four kinds, with CLATTN_DTYPE_SAME resolved. */
ca_program_key ca_core_key(clattn_dtype dtype, clattn_dtype k_dtype, clattn_dtype v_dtype);
ca_program_key ca_fused_key(int head_dim, int value_dim, clattn_dtype dtype, clattn_dtype k_dtype,
                            clattn_dtype v_dtype, int dropout);
ca_program_key ca_backward_key(int head_dim, int value_dim, clattn_dtype dtype, int dropout);
ca_program_key ca_append_key(clattn_dtype src, clattn_dtype kv);
/* The modifiers of p (none: flags 0) and key k with them. */
ca_mod_key ca_mod_key_of(const clattn_params *p);
/* Its flags alone (program_text.h's CA_MODF_*), without hashing the text. */
int ca_mod_flags_of(const clattn_params *p);
ca_program_key ca_key_with_mod(ca_program_key k, const clattn_params *p);
/* The modifier program of p's modifiers (block masks, pointwise evaluation). */
ca_program_key ca_modifier_key(const clattn_params *p);
/* Programs with modifiers the table keeps at most (the least recently used
 * is released past it: a process trying many modifiers stays bounded). A
 * program with modifiers comes from ca_program_get retained: its caller
 * releases it (a launch list holds it: plan.h's ca_list_hold). */
enum { CA_MOD_PROGRAMS_MAX = 16 };
/* Whether program is in the table (the kernel pool drops kernels of
 * programs released from it). */
int ca_program_live(clattn_context *ctx, cl_program program);
/* How many programs with modifiers the table has released so far. */
unsigned long ca_programs_released(clattn_context *ctx);
/* Releases every program the context holds (clattn_destroy). */
void ca_release_programs(clattn_context *ctx);

/* ---- the program cache (cache.c, cache_evict.c) ---- */

/* 128 bits over library version, platform, device, driver, sources, options. */
typedef struct {
  unsigned char bytes[16];
} ca_cache_key;
void ca_cache_key_of(const clattn_context *ctx, const char *const *sources, cl_uint n_sources, const char *options,
                     ca_cache_key *key);
/* 128 bits over n texts (each as a field: its length, then its bytes). */
void ca_text_key_of(const char *const *texts, unsigned n, ca_cache_key *key);
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

#endif
