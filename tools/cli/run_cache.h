/*
 * `clattn run --paged PAGE_SIZE --kv-dtype T`: the problem's keys and values
 * moved into a K/V cache as an inference engine keeps it. clattn_kv_append
 * writes them (quantising for q8_0 / int8) into a contiguous or paged cache
 * (pages handed out in reverse order); the values the kernels will read are
 * read back and dequantised into the problem's host arrays, the fp64
 * reference is computed from them, and the forward call is pointed at the
 * cache: so the run checks the paged / quantised path exactly, and the
 * quantisation error itself is not counted as the library's.
 */
#ifndef CLATTN_RUN_CACHE_H
#define CLATTN_RUN_CACHE_H

#include <stddef.h>

#include "problem.h"

typedef struct {
  cl_mem bufs[8]; /* the cache, its scales, positions, block table, kv_lens */
  int n_bufs;
  double bytes_per_token; /* K and V (and INT8 scales) per cached token, all KV heads */
} rc_cache;

/* After cp_upload(pb, ctx). page_size 0 = contiguous; kv_dtype
 * CLATTN_DTYPE_SAME = like q. Returns 0, or -1 with a message in err. */
int rc_use_cache(cp_problem *pb, clattn_context *ctx, int page_size, clattn_dtype kv_dtype, rc_cache *c, char *err,
                 size_t n);
void rc_free(rc_cache *c);

#endif
