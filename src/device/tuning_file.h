/*
 * The tuning file's format: the tunable values, their names and ranges, and
 * parsing, reading and writing a file (tuning.c applies one to a context).
 *
 * A tuning file is text, one `key = value` per line, `#` starts a comment:
 *
 *   format = 1
 *   platform = <CL_PLATFORM_NAME>     the file applies only to the device
 *   device = <CL_DEVICE_NAME>         whose three strings match exactly
 *   driver = <CL_DRIVER_VERSION>
 *   score_tm = 8   (and any other tile value below; absent = not tuned)
 *   scratch_bytes = 67108864          staged / GEMM score scratch per call
 *   block_rm = 2                      flash_block's tile, rows x keys per
 *   block_rn = 4                        work-item: both or neither, a pair
 *                                       of TL_BLOCK_PAIRS or 0 x 0 (chosen
 *                                       per head dim); stepped down per
 *                                       head dim where it does not fit
 *   flash_tile = 16                   flash_tiled's keys per K/V tile: a
 *                                       power of two up to 64, or 0 (32);
 *                                       halved per head dim where it does
 *                                       not fit local memory
 *   auto_prefill = fused              AUTO's choice per shape class:
 *   auto_decode = fused                 staged, fused or gemm (weights
 *   auto_weights = staged               requested: staged or gemm)
 *
 * Decode means q_len <= CA_DECODE_ROWS. A file with an unknown key, a
 * malformed line or a value out of range is rejected as a whole.
 */
#ifndef CLATTN_TUNING_FILE_H
#define CLATTN_TUNING_FILE_H

#include <stddef.h>

#include "clattn.h"
#include "tiles.h"

enum { CA_DECODE_ROWS = 16 };

/* The tunable values: the tile struct's fields, the scratch budget, then
 * flash_block's tile and flash_tiled's (appended: clattn_tuning_name's
 * indices stay). */
typedef enum {
  CA_T_SCORE_TM,
  CA_T_SCORE_TN,
  CA_T_SCORE_TK,
  CA_T_SOFTMAX_WG,
  CA_T_MIX_TM,
  CA_T_MIX_TV,
  CA_T_MIX_TJ,
  CA_T_FLASH_BM,
  CA_T_FLASH_WG,
  CA_T_SCRATCH_BYTES,
  CA_T_BLOCK_RM,
  CA_T_BLOCK_RN,
  CA_T_FLASH_TILE,
  CA_T_COUNT
} ca_tunable;

/* AUTO's choice per shape class; CLATTN_ALGO_AUTO = not tuned. */
typedef enum { CA_CLASS_PREFILL, CA_CLASS_DECODE, CA_CLASS_WEIGHTS, CA_CLASS_COUNT } ca_shape_class;

typedef struct {
  char platform[256], device[256], driver[256];
  int has[CA_T_COUNT];
  long long value[CA_T_COUNT];
  clattn_algo auto_algo[CA_CLASS_COUNT];
} ca_tuning;

const char *ca_tunable_name(ca_tunable t);
/* The tunable named name; CA_T_COUNT when none is. */
ca_tunable ca_tunable_by_name(const char *name);
const char *ca_class_name(ca_shape_class c);

/* The value of t in tiles (scratch: *scratch), and setting it. */
long long ca_tunable_get(const tl_tiles *tiles, size_t scratch, ca_tunable t);
void ca_tunable_set(tl_tiles *tiles, size_t *scratch, ca_tunable t, long long v);

/* Parses and checks one value of t: the rule for tuning files and the
 * environment alike. 0, or -1 with "key = text: must be ..." in why. */
int ca_tunable_parse(ca_tunable t, const char *key, const char *text, long long *v, char *why, size_t n);
/* flash_block's tile as a pair (rm_key, rn_key: the names in the message):
 * 0 when tl_block_allowed, else -1 with "rm_key = rm, rn_key = rn: the pair
 * must be ..." in why. */
int ca_block_pair_check(const char *rm_key, long long rm, const char *rn_key, long long rn, char *why, size_t n);

/* Parses and checks a tuning file's bytes (syntax and each value's absolute
 * range; a line over 1023 bytes or holding a NUL is malformed). name: the
 * file in messages. 0, or -1 with a message naming the line and the value. */
int ca_tuning_parse(const char *text, size_t size, const char *name, ca_tuning *out, char *err, size_t errlen);
/* The same for the values alone (no format, platform, device or driver
 * line: those keys are refused), as clattn_tuning_write takes them. */
int ca_tuning_parse_values(const char *text, size_t size, const char *name, ca_tuning *out, char *err, size_t errlen);
/* Reads (a regular file of at most 64 KiB; never blocks) and parses one. */
int ca_tuning_read(const char *path, ca_tuning *out, char *err, size_t errlen);
/* Writes it atomically (temp file + rename). 0, or -1 with a message. */
int ca_tuning_write(const char *path, const ca_tuning *t, char *err, size_t errlen);

#endif
