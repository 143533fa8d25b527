/*
 * The fuzz case's shared state and the field groups of the format's
 * extension (fuzz_fields.c): storage types (16-bit q/out, F16/BF16/Q8_0/INT8
 * K/V with INT8 scales), score shaping (softcap, ALiBi, sinks, additive
 * scoring), packed sequences (cu_seqlens), paged K/V (block tables),
 * dropout and left-padded caches (cache_leftpad).
 * Internal to the fuzz harness (fuzz_case.c documents the format).
 */
#ifndef CLATTN_FUZZ_FIELDS_H
#define CLATTN_FUZZ_FIELDS_H

#include <stddef.h>
#include <stdint.h>

#include "clattn.h"
#include "reference.h"

#define FZ_BUF_CAP   ((size_t)1 << 20) /* the largest buffer the harness allocates */
#define FZ_HEADER    60                /* the first format's header */
#define FZ_MAGIC_LEN 4                 /* an input that starts with FZ_MAGIC carries the extension */
#define FZ_MAGIC     "\xC1\xA7\x7E\x02"
#define FZ_EXT       32 /* extension header bytes after the magic */

/* Views: the first format's eleven, then the INT8 scales (extension). */
enum { T_Q, T_K, T_V, T_OUT, T_MASK, T_BIAS, T_LSE, T_W, T_ENT, T_MAXW, T_ARGMAX, T_KS, T_VS, T_COUNT };

/* Small int32 / f32 buffers of the extension, one cl_mem each. */
enum { A_CU_Q, A_CU_K, A_TABLE, A_ALIBI, A_SINKS, A_ADDW, A_LEFTPAD, A_COUNT };

typedef struct {
  clattn_params p;
  int ext;                 /* the input carries the extension (magic) */
  uint8_t ext_hdr[FZ_EXT]; /* its header bytes */
  int present[T_COUNT];
  size_t esize[T_COUNT];   /* bytes per unit of the view (1 for Q8_0: offsets and strides in bytes) */
  size_t dims[T_COUNT][4]; /* logical dims as size_t (hostile ints wrap) */
  int q8[T_COUNT];         /* k / v stored Q8_0 */
  int need_ok[T_COUNT];    /* the view's extent did not overflow */
  size_t need[T_COUNT];    /* bytes the view addresses */
  size_t bytes[T_COUNT];   /* bytes of the buffer allocated */
  unsigned char *host[T_COUNT];
  cl_mem mem[T_COUNT];
  int kv_lens;
  size_t kv_lens_bytes;
  int32_t *kv_lens_host;
  cl_mem kv_lens_mem;
  /* extension buffers */
  int aux[A_COUNT];
  size_t aux_bytes[A_COUNT];
  unsigned char *aux_host[A_COUNT];
  cl_mem aux_mem[A_COUNT];
  clattn_dtype kv; /* the storage of k and v (kv_dtype, SAME resolved; may be hostile) */
  int want_done, call_null_ctx, call_null_params;
} fz_case;

/* The small tables of the first format, shared with the extension's decoding. */
float fz_dec_float(uint8_t b);
extern const int fz_hostile_int[16];

typedef struct {
  const uint8_t *p;
  size_t n, i;
  uint64_t prng;
} fz_reader;

/* The next data byte; past the end a PRNG byte < 0xF0 (finite values). */
uint8_t fz_rd(fz_reader *r);

/* Decodes the extension header e[0 .. FZ_EXT) into c->p and c (after the
 * first format's header is decoded, before the views). */
void fz_ext_header(fz_case *c, const uint8_t *e);

/* The logical dims of view t (batch or page, head, row, column; columns in
 * elements), from c->p and the extension's fields. */
void fz_view_dims(const fz_case *c, int t, size_t D[4]);

/* After decode_view: a Q8_0 view decoded in block units becomes a byte view
 * (offset, strides x 34; stride[3] 34), with the hostile tweaks of tweak. */
void fz_q8_view(fz_case *c, int t, uint8_t tweak);

/* The INT8 scale view t (T_KS, T_VS): its 4 view bytes, and whether it is present. */
int fz_ext_view(const fz_case *c, int t, uint8_t vb[4]);

/* After view t is decoded: packed sequences have no batch stride (unless the
 * input asks for one), a Q8_0 view becomes a byte view (fz_q8_view). */
void fz_ext_adjust_view(fz_case *c, int t);

/* Bytes per unit of view t while it is decoded (34 for a Q8_0 block). */
size_t fz_view_esize(const fz_case *c, int t);

/* Reads the extension's small buffers from the data (before the views). -1: out of memory. */
int fz_ext_data(fz_case *c, fz_reader *r);

/* Fills input view t's buffer from the data in its storage. */
void fz_fill_input(fz_case *c, int t, fz_reader *r);

/* Adds the rules of the extension's fields to a prediction: calls
 * reason(status, text) for each violation. */
typedef void (*fz_reason_fn)(void *ctx, int status, const char *text);
void fz_ext_rules(const fz_case *c, int dims_ok, fz_reason_fn reason, void *rctx);

/* What the reference needs: f32 copies of the stored q and K/V (dequantised;
 * paged K/V gathered into packed sequences), its params and inputs. */
typedef struct {
  clattn_params rp; /* the reference's params (dtype F32, no block table; the call's dropout) */
  ref_inputs in;
  float *q, *k, *v;     /* owned copies (NULL when the host buffer is used as is) */
  unsigned char *mask;  /* the user's mask with the bias's -inf entries and the block table's validity */
  int32_t *cu_q, *cu_k; /* paged: the packed sequences */
} fz_ref;

/* Builds r for c (valid params); -1 out of host memory. */
int fz_ref_build(const fz_case *c, fz_ref *r);
void fz_ref_free(fz_ref *r);

/* The out row of (b, h, i) on the device (packed sequences: q0 + i), and
 * whether row i of batch b exists (i < its sequence's length). */
int fz_row_exists(const fz_case *c, int b, int i, long *out_row);

/* Bytes per element of q / out in c's dtype (4 for a hostile dtype). */
size_t fz_q_esize(const clattn_params *p);

#endif
