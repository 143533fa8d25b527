/* Tile choice: device description -> work-group shapes (see tiles.h). */
#include "device/tiles.h"

#include "device/rules.h"

#include <stdio.h>
#include <string.h>

static int floor_pow2(size_t x) {
  int p = 1;
  while ((size_t)p * 2 <= x && p < (1 << 20)) p *= 2;
  return p;
}

static int is_cpu(const tl_device *dev) { return (dev->type & CL_DEVICE_TYPE_CPU) != 0; }

int tl_block_sg(const tl_device *dev) {
  for (int lanes = 8; lanes <= 32; lanes *= 2)
    if (dev->sg_sizes & (cl_uint)lanes) return lanes;
  return 0;
}

int tl_softmax_sg(const tl_device *dev, int wg) {
  return (wg == 8 || wg == 16 || wg == 32) && (dev->sg_sizes & (cl_uint)wg) ? wg : 0;
}

tl_tiles tl_choose(const tl_device *dev) {
  tl_tiles t;
  if (is_cpu(dev)) {
    /* POCL runs a work-group as loops vectorised along dimension 0: wide,
     * short groups keep the vector lanes busy and local memory is ordinary
     * cache, so the chunks only need to stay cache-resident. */
    t.score_tm = 8;
    t.score_tn = 16;
    t.score_tk = 32;
    t.softmax_wg = 16;
    t.mix_tm = 8;
    t.mix_tv = 16;
    t.mix_tj = 32;
    t.flash_bm = 8;
    t.flash_vw = 0; /* the device's vector width: ca_flash_vw (device.c) */
    t.flash_wg = 0; /* register-blocked rows with 16-wide vectors: see cl/flash.cl */
    t.block_half = 0;
    t.block_rm = t.block_rn = 0; /* flash_block's tile per head dim (tl_flash_block) */
    t.flash_tile = 0;            /* flash_tiled's tile per head dim (tl_flash_tile) */
    t.block_sg = tl_block_sg(dev); /* when the work-group kernels are forced */
    t.block_half_math = 0;
  } else {
    /* GPUs: 256 work-items per group in 16-wide rows (a half warp, a quarter
     * wavefront), so global reads of a row coalesce and local reads broadcast. */
    int simd = dev->pref_multiple ? floor_pow2(dev->pref_multiple) : 32;
    t.score_tn = 16;
    t.score_tm = 16;
    t.score_tk = 16;
    t.softmax_wg = simd * 4 > 256 ? simd * 4 : 256;
    t.mix_tv = 16;
    t.mix_tm = 16;
    t.mix_tj = 16;
    if (dev->value_dim > 0 && dev->value_dim <= 8) t.mix_tv = 8, t.mix_tm = 32;
    t.flash_bm = 4;
    t.flash_vw = 0;
    t.flash_wg = simd >= 64 ? simd : 64; /* one row per work-item, K/V tiles in local memory */
    t.block_half = dev->fp16;            /* a device with half arithmetic converts half loads natively */
    t.block_rm = t.block_rn = 0;         /* flash_block's tile per head dim (tl_flash_block) */
    t.flash_tile = 0;                    /* flash_tiled's tile per head dim (tl_flash_tile) */
    t.block_sg = tl_block_sg(dev);       /* IGC's own choice for flash_block, 8 lanes, on Intel's GPUs */
    t.block_half_math = dev->fp16;       /* half products where the device has half arithmetic */
  }
  t.softmax_sg = 0;
  tl_clamp(&t, dev);
  /* the softmax group as one sub-group where the device offers its size
   * (Intel's CPU runtime: 16; its GPUs' groups of 256 are wider) */
  t.softmax_sg = tl_softmax_sg(dev, t.softmax_wg);
  return t;
}

size_t tl_score_local_bytes(const tl_tiles *t) {
  return (size_t)(t->score_tm + t->score_tn) * (size_t)t->score_tk * sizeof(float);
}

size_t tl_mix_local_bytes(const tl_tiles *t) {
  return (size_t)(t->mix_tm + t->mix_tv) * (size_t)t->mix_tj * sizeof(float);
}

size_t tl_softmax_local_bytes(const tl_tiles *t) { return (size_t)t->softmax_wg * sizeof(float); }

/* Halve the larger of a 2-D tile until it fits the group-size limits. */
static void fit_2d(int *x, int *y, const tl_device *dev) {
  size_t max_wg = dev->max_wg ? dev->max_wg : 1;
  while ((size_t)*x > (dev->max_item[0] ? dev->max_item[0] : 1) && *x > 1) *x /= 2;
  while ((size_t)*y > (dev->max_item[1] ? dev->max_item[1] : 1) && *y > 1) *y /= 2;
  while ((size_t)*x * (size_t)*y > max_wg && (*x > 1 || *y > 1)) {
    if (*y >= *x && *y > 1)
      *y /= 2;
    else
      *x /= 2;
  }
}

int tl_clamp(tl_tiles *t, const tl_device *dev) {
  cl_ulong local = dev->local_mem;
  fit_2d(&t->score_tn, &t->score_tm, dev);
  fit_2d(&t->mix_tv, &t->mix_tm, dev);
  t->softmax_wg = floor_pow2((size_t)(t->softmax_wg > 0 ? t->softmax_wg : 1));
  t->flash_bm = t->flash_bm < 1 ? 1 : t->flash_bm > 16 ? 16 : t->flash_bm;
  if (t->flash_vw) t->flash_vw = t->flash_vw >= 16 ? 16 : t->flash_vw >= 8 ? 8 : 4;
  if (t->flash_wg > 0) {
    t->flash_wg = floor_pow2((size_t)t->flash_wg);
    while ((size_t)t->flash_wg > dev->max_wg || (size_t)t->flash_wg > dev->max_item[0]) t->flash_wg /= 2;
  }
  while ((size_t)t->softmax_wg > dev->max_wg || (size_t)t->softmax_wg > dev->max_item[0]) {
    if (t->softmax_wg == 1) break;
    t->softmax_wg /= 2;
  }
  if (t->softmax_sg && t->softmax_sg != t->softmax_wg) t->softmax_sg = tl_softmax_sg(dev, t->softmax_wg);
  while (tl_score_local_bytes(t) > local && t->score_tk > 1) t->score_tk /= 2;
  while (tl_mix_local_bytes(t) > local && t->mix_tj > 1) t->mix_tj /= 2;
  if ((size_t)t->score_tm * t->score_tn > dev->max_wg || (size_t)t->mix_tm * t->mix_tv > dev->max_wg ||
      (size_t)t->softmax_wg > dev->max_wg || tl_score_local_bytes(t) > local || tl_mix_local_bytes(t) > local ||
      tl_softmax_local_bytes(t) > local)
    return -1;
  return 0;
}

int tl_flash_tile(const tl_device *dev, int head_dim, int value_dim, int want) {
  int tile = want > 0 ? want : 32;
  size_t row_bytes = ((size_t)head_dim + (size_t)value_dim) * sizeof(float);
  while (tile > 1 && (size_t)tile * row_bytes + 64 > dev->local_mem) tile /= 2;
  return tile;
}

static size_t round_to(size_t x, size_t m) { return (x + m - 1) / m * m; }

size_t tl_block_local_bytes(tl_block blk, int head_dim, int value_dim) {
  const size_t dk4 = round_to((size_t)head_dim, 4), dvb = round_to((size_t)value_dim, 32);
  const size_t rows = 16 * (size_t)blk.rm, keys = 8 * (size_t)blk.rn;
  const size_t floats = rows * (dk4 + 4)                       /* Q tile */
                        + keys * ((dk4 > dvb ? dk4 : dvb) + 4) /* K, then V tile */
                        + rows * (keys + 4)                    /* P tile */
                        + 2 * rows * 8;                        /* row maxima and sums */
  return floats * sizeof(float) + rows * 5 * sizeof(int)       /* each row's head, index, keys, liveness */
         + 5 * sizeof(int);
}

int tl_block_budget(const tl_device *dev) { return (int)ca_rule(dev, CA_RULE_BLOCK_BUDGET, NULL); }

static const tl_block choices[] = {{4, 4}, {2, 4}, {1, 4}, {1, 2}, {1, 1}}; /* largest first */
enum { N_CHOICES = sizeof choices / sizeof choices[0] };

/* The first tile from choices[first] on that fits (budget: also the
 * register budget, else local memory alone). */
static int block_from(const tl_device *dev, int head_dim, int value_dim, size_t first, int budget, tl_block *out) {
  const size_t local = dev->local_mem < 48 * 1024 ? (size_t)dev->local_mem : 48 * 1024;
  const size_t dvb = round_to((size_t)value_dim, 32), floats = (size_t)tl_block_budget(dev);
  if (dev->max_wg < 128 || dev->max_item[0] < 128) return -1;
  for (size_t c = first; c < N_CHOICES; c++) {
    const size_t rm = (size_t)choices[c].rm, rn = (size_t)choices[c].rn;
    if ((!budget || rm * rn + rm * dvb / 8 <= floats) &&
        tl_block_local_bytes(choices[c], head_dim, value_dim) <= local) {
      *out = choices[c];
      return 0;
    }
  }
  return -1;
}

/* The index of blk among choices; N_CHOICES when it is none of them. */
static size_t choice_index(tl_block blk) {
  size_t c = 0;
  while (c < N_CHOICES && (choices[c].rm != blk.rm || choices[c].rn != blk.rn)) c++;
  return c;
}

int tl_flash_block(const tl_device *dev, int head_dim, int value_dim, tl_block *out) {
  return block_from(dev, head_dim, value_dim, 0, 1, out);
}

int tl_flash_block_below(const tl_device *dev, int head_dim, int value_dim, tl_block *blk) {
  return tl_flash_block_step(dev, head_dim, value_dim, 0, blk);
}

int tl_block_allowed(int rm, int rn) { return (rm == 0 && rn == 0) || choice_index((tl_block){rm, rn}) < N_CHOICES; }

int tl_flash_block_tuned(const tl_device *dev, int head_dim, int value_dim, tl_block want, tl_block *out) {
  const size_t c = choice_index(want);
  if (c == N_CHOICES) return tl_flash_block(dev, head_dim, value_dim, out); /* 0 x 0 */
  return block_from(dev, head_dim, value_dim, c, 0, out);
}

int tl_flash_block_step(const tl_device *dev, int head_dim, int value_dim, int tuned, tl_block *blk) {
  const size_t c = choice_index(*blk);
  return c < N_CHOICES ? block_from(dev, head_dim, value_dim, c + 1, !tuned, blk) : -1;
}

size_t tl_decode_local_bytes(int keys, int head_dim, int value_dim) {
  /* cl/decode.cl's DEC_PVC, DEC_CV4 and DEC_VS: value columns in float4 groups over 16, 32 or 64 work-items */
  const size_t dv4 = ((size_t)value_dim + 3) / 4, pvc = dv4 <= 16 ? 16 : dv4 <= 32 ? 32 : 64;
  const size_t vs = 4 * pvc * ((dv4 + pvc - 1) / pvc), ks = (size_t)head_dim + 1;
  const size_t floats = 16 * (size_t)head_dim                /* Q tile */
                        + (size_t)keys * (ks > vs ? ks : vs) /* K, then V tile */
                        + 16 * (size_t)keys                  /* scores and weights */
                        + 3 * 16;                            /* row maxima, factors, sums */
  return floats * sizeof(float);
}

int tl_decode_keys(const tl_device *dev, int head_dim, int value_dim) {
  const size_t local = dev->local_mem < 48 * 1024 ? (size_t)dev->local_mem : 48 * 1024;
  if (dev->max_wg < 64 || dev->max_item[0] < 64) return 0;
  for (int keys = 32; keys >= 16; keys /= 2)
    if (tl_decode_local_bytes(keys, head_dim, value_dim) <= local) return keys;
  return 0;
}

void tl_core_options(const tl_tiles *t, char *buf, size_t size) {
  size_t len = strlen(buf);
  snprintf(buf + len, size > len ? size - len : 0,
           " -D SCORE_TM=%d -D SCORE_TN=%d -D SCORE_TK=%d -D SOFTMAX_WG=%d -D MIX_TM=%d -D MIX_TV=%d -D MIX_TJ=%d",
           t->score_tm, t->score_tn, t->score_tk, t->softmax_wg, t->mix_tm, t->mix_tv, t->mix_tj);
  len = strlen(buf);
  if (t->softmax_sg) snprintf(buf + len, size > len ? size - len : 0, " -D SOFTMAX_SG=%d", t->softmax_sg);
}

void tl_fused_options(const tl_tiles *t, char *buf, size_t size) {
  size_t len = strlen(buf);
  if (t->flash_wg > 0)
    snprintf(buf + len, size > len ? size - len : 0, " -D FLASH_NO_ROWS -D FLASH_WG=%d", t->flash_wg);
  else
    snprintf(buf + len, size > len ? size - len : 0, " -D FLASH_NO_TILED -D FLASH_BM=%d -D FLASH_VW=%d", t->flash_bm,
             t->flash_vw > 0 ? t->flash_vw : 16);
}
