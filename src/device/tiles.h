/*
 * Tile sizes: a pure function from what a device reports to the work-group
 * shapes of each kernel, so it can be tested with made-up devices.
 */
#ifndef CLATTN_TILES_H
#define CLATTN_TILES_H

#include <stddef.h>
#include "clattn.h"

/* What a device reports that tile choice depends on. */
typedef struct {
  cl_device_type type;
  cl_ulong local_mem;       /* CL_DEVICE_LOCAL_MEM_SIZE */
  size_t max_wg;            /* CL_DEVICE_MAX_WORK_GROUP_SIZE */
  size_t max_item[3];       /* CL_DEVICE_MAX_WORK_ITEM_SIZES */
  size_t pref_multiple;     /* CL_KERNEL_PREFERRED_WORK_GROUP_SIZE_MULTIPLE */
  cl_uint compute_units;    /* CL_DEVICE_MAX_COMPUTE_UNITS */
  int head_dim, value_dim;  /* 0 = not known yet */
  cl_uint vendor_id;        /* CL_DEVICE_VENDOR_ID: 0x1002 AMD, 0x10de NVIDIA, 0x8086 Intel; 0 = not known */
  int fp16;                 /* cl_khr_fp16 among CL_DEVICE_EXTENSIONS: half arithmetic and half local memory */
  size_t max_param;         /* CL_DEVICE_MAX_PARAMETER_SIZE: bytes of a kernel's arguments; 0 = not known */
  cl_uint address_bits;     /* CL_DEVICE_ADDRESS_BITS: 32 or 64; 0 = not known */
  cl_uint vec_float_pref;   /* CL_DEVICE_PREFERRED_VECTOR_WIDTH_FLOAT; 0 = not known */
  cl_uint vec_float_native; /* CL_DEVICE_NATIVE_VECTOR_WIDTH_FLOAT; 0 = not known */
  cl_uint sg_sizes;         /* sub-group sizes a kernel may require (cl_intel_subgroups with
                               cl_intel_required_subgroup_size): bit k = 2^k lanes; 0 = none */
  char name[128];           /* CL_DEVICE_NAME ("" = not known): the rules' device matches */
  long long rules[8];       /* the rules' values as looked up once (device/rules.c) */
  int rules_known;          /* rules[] holds them: 0 for a description not yet resolved */
} tl_device;

enum { TL_VENDOR_AMD = 0x1002, TL_VENDOR_INTEL = 0x8086 };

/* The staged path's work-group shapes; every value is a power of two. */
typedef struct {
  int score_tm, score_tn, score_tk; /* qk_score: rows x keys per group, head-dim chunk in local memory */
  int softmax_wg;                   /* softmax: work-items per row */
  int mix_tm, mix_tv, mix_tj;       /* mix: rows x value columns per group, key chunk in local memory */
  int flash_bm;                     /* fused, flash_rows: query rows per work-item */
  int flash_wg;                     /* fused, flash_tiled: rows (work-items) per group; 0 = use flash_rows */
  int block_half;                   /* flash_block: f16 K/V tiles kept as half in local memory (cl_khr_fp16) */
  int block_rm, block_rn;           /* flash_block's tuned tile (tuning file, CLATTN_BLOCK_RM/RN): one of
                                       TL_BLOCK_PAIRS, or 0 x 0 = tl_flash_block's choice per head dim */
  int flash_vw;                     /* fused, flash_rows: floats per vector, 4, 8 or 16 (keys per block: twice
                                       that); 0 = not chosen yet (ca_flash_vw in device.c chooses it) */
  int flash_tile;                   /* fused, flash_tiled: keys per K/V tile as tuned (tuning file,
                                       CLATTN_FLASH_TILE), a power of two up to 64; 0 = tl_flash_tile's choice */
  int block_sg;                     /* flash_block's sub-group variant: lanes per sub-group (8, 16 or 32)
                                       reducing a row's maxima and sums by shuffles; 0 = through local memory */
  int block_half_math;              /* flash_block with f16 storage throughout and half tiles: P V
                                       multiplied in half, accumulated in f32 (cl_khr_fp16) */
  int softmax_sg;                   /* softmax_rows' sub-group variant: its group of softmax_wg work-items
                                       is one sub-group, its row maxima and sums shuffles; 0 = local
                                       memory, else softmax_wg (tl_clamp keeps it so) */
} tl_tiles;

/* Defaults from the device description, clamped to its limits. */
tl_tiles tl_choose(const tl_device *dev);

/* flash_block's sub-group size: the smallest of 8, 16, 32 lanes the device
 * lets a kernel require (a row's 8 work-items then share a sub-group), 0
 * when it offers none of them. */
int tl_block_sg(const tl_device *dev);

/* softmax_rows' sub-group size for a group of `wg` work-items: wg when it
 * is 8, 16 or 32 lanes the device lets a kernel require (the group is then
 * one sub-group), else 0. */
int tl_softmax_sg(const tl_device *dev, int wg);

/* Shrinks each value until it fits the device's work-group and local memory
 * limits (a softmax group shrunk off its sub-group size takes
 * tl_softmax_sg's answer for the new size); returns 0, or -1 when even the
 * smallest tiles do not fit. */
int tl_clamp(tl_tiles *t, const tl_device *dev);

/* Local memory (bytes) each kernel needs with these tiles. */
size_t tl_score_local_bytes(const tl_tiles *t);
size_t tl_mix_local_bytes(const tl_tiles *t);
size_t tl_softmax_local_bytes(const tl_tiles *t);

/* Keys per local-memory tile of flash_tiled for these head dims: the tuned
 * tile `want` (0: 32, the choice), halved until its K and V tiles fit the
 * device's local memory (stepped down per head dim, never refused). */
int tl_flash_tile(const tl_device *dev, int head_dim, int value_dim, int want);

/* flash_block's score tile per work-item (cl/flash_block.cl): rows rm and
 * keys rn, so a group of 16 x 8 work-items owns 16 rm rows and 8 rn keys.
 * The largest whose scores and accumulator (rm rn + rm dv / 8 floats, held
 * across the key loop) fit the work-item's registers (tl_block_budget) and
 * whose local memory fits the device's and 48 KiB (room for a second group
 * on most GPUs). Returns 0, or -1 when nothing fits (no flash_block). */
typedef struct {
  int rm, rn;
} tl_block;
int tl_flash_block(const tl_device *dev, int head_dim, int value_dim, tl_block *out);
/* The next smaller tile that fits after *blk (the step down when the built
 * kernel cannot run its group or spills): 0, or -1 when there is none. */
int tl_flash_block_below(const tl_device *dev, int head_dim, int value_dim, tl_block *blk);
/* Floats of scores and accumulator a flash_block work-item may hold: 48
 * where it has 256 registers (CDNA, NVIDIA); 18 on RDNA (AMD with 32-wide
 * waves), whose work-items clang-15 gives 128 registers; 20 on Intel's
 * GPUs (IGC's 8 lanes of 128 registers per thread, as ocloc compiles it). */
int tl_block_budget(const tl_device *dev);
/* Local memory (bytes) of flash_block with that tile. */
size_t tl_block_local_bytes(tl_block blk, int head_dim, int value_dim);

/* The tiles flash_block is built with (cl/flash_block.cl reads any BLOCK_RM
 * x BLOCK_RN; these are the ones chosen, tuned and stepped through), largest
 * first, as a tuning file's message names them. */
#define TL_BLOCK_PAIRS "4x4, 2x4, 1x4, 1x2, 1x1"
/* Whether rm x rn is a tile a tuning may ask for: one of TL_BLOCK_PAIRS, or
 * 0 x 0 (tl_flash_block's choice per head dim). */
int tl_block_allowed(int rm, int rn);
/* flash_block's tile for these head dims with the tuned tile `want`: 0 x 0
 * is tl_flash_block's choice; else want itself, or the next smaller pair
 * whose local memory fits (as tl_flash_block counts it; the register
 * budget, an estimate, is the tuning's to override: a built kernel that
 * spills steps down after building). 0, or -1 when nothing fits. */
int tl_flash_block_tuned(const tl_device *dev, int head_dim, int value_dim, tl_block want, tl_block *out);
/* The step down after *blk for a tuned tile (tuned != 0: local memory
 * only) or a chosen one (tl_flash_block_below): 0, or -1 when none. */
int tl_flash_block_step(const tl_device *dev, int head_dim, int value_dim, int tuned, tl_block *blk);

/* flash_decode's keys per tile (cl/decode.cl): 32, or 16 when a 32-key
 * tile with its Q and score tiles would pass the device's local memory or
 * 48 KiB; 0 when nothing fits or the device cannot run 64 work-items per
 * group (no flash_decode). */
int tl_decode_keys(const tl_device *dev, int head_dim, int value_dim);
/* Local memory (bytes) of flash_decode with `keys` keys per tile. */
size_t tl_decode_local_bytes(int keys, int head_dim, int value_dim);

/* The -D options that carry the tiles, appended to buf: each program gets
 * only those its kernels read, so retuning one kernel's tile changes one
 * program's options (and cache key) and leaves the others' binaries valid.
 * The core program: qk_score's SCORE_*, softmax_rows' SOFTMAX_WG (and
 * SOFTMAX_SG with the sub-group variant), mix_values' MIX_*. */
void tl_core_options(const tl_tiles *t, char *buf, size_t size);
/* The fused program, one device's kernels: flash_rows' FLASH_BM and
 * FLASH_VW without the work-group kernels (FLASH_NO_TILED), flash_tiled's
 * FLASH_WG with them (FLASH_NO_ROWS). */
void tl_fused_options(const tl_tiles *t, char *buf, size_t size);

#endif
