/*
 * Tuning policy: where each tunable value of a context comes from, in layers
 * each over the one before,
 *
 *   1. the device-query defaults (tiles.c's tl_choose; a 64 MiB scratch budget)
 *   2. the built-in table: values measured on known devices where they differ
 *      from those defaults
 *   3. a tuning file (format in tuning_file.h) for exactly this device:
 *      options.tuning_file, else CLATTN_TUNING_FILE, else the one `clattn
 *      tune` wrote into the cache directory
 *   4. the environment: CLATTN_FLASH_WG, CLATTN_SCRATCH_BYTES (checked by the
 *      tuning file's rules), CLATTN_FLASH_BLOCK=0
 *
 * with each value's origin and a note on what became of the file and the
 * environment; AUTO's rule, which takes the file's choice per shape class;
 * and the public tuning API (clattn.h, clattn_tuning_*).
 */
#ifndef CLATTN_TUNING_H
#define CLATTN_TUNING_H

#include "tuning_file.h"

typedef enum { CA_FROM_QUERY, CA_FROM_TABLE, CA_FROM_FILE, CA_FROM_ENV } ca_origin;

const char *ca_origin_name(ca_origin o);

/* Fills the context's tiles, scratch budget, flash_block switch, origins,
 * AUTO choices and tuning notes from the layers above. tuning_file: the
 * caller's option (NULL: the environment's, else the cache directory's; ""
 * none). Needs the device's description (ctx->caps, max_alloc) and
 * cache_dir; never fails (a file or variable that cannot be used is noted
 * and left out). */
void ca_tuning_choose(clattn_context *ctx, const char *tuning_file);

/* AUTO's rule, the only one: the tuning file's choice for the call's shape
 * class (weights asked for; decode: q_len <= CA_DECODE_ROWS; else prefill),
 * else FUSED, or STAGED when the routing matrix is asked for. */
clattn_algo ca_auto_algo(const clattn_context *ctx, int q_len, int want_weights);

/* Appends clattn_describe's tuning lines (each value with its origin, the
 * file's and the environment's notes, AUTO's picks) to buf. */
void ca_tuning_describe(const clattn_context *ctx, char *buf, size_t size);

#endif
