/*
 * Heat maps as PNG: an RGB canvas, a 5x8 bitmap font for the labels, the
 * viridis colour map, then libpng to write it.
 *
 * Layout (scale-2 text, 12 px per character):
 *
 *   title, wrapped to the image width
 *   query i | ticks | cells ............ | colour bar  max
 *                     ticks                            min
 *                     key j
 *   caption, wrapped to the image width
 *
 * Cells are as large as fits a plot of about 768 x 512 px (1 to 64 px a
 * side, not necessarily square); ticks fall on "nice" steps (1, 2, 5 x 10^k)
 * at least a label's width apart and mark cell centres.
 */
#include "heatmap.h"

#include <errno.h>
#include <math.h>
#include <png.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the font: ASCII 32..126, 5 columns x 8 rows, bit 4 = leftmost column;
 * rows 0-6 above the baseline, row 7 for descenders. Drawn for this tool. ---- */

enum { GLYPH_W = 5, GLYPH_H = 8, TEXT_SCALE = 2, ADVANCE = (GLYPH_W + 1) * TEXT_SCALE, LINE_H = 20 };

static const uint8_t font5x8[95][8] = {
    {0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00}, /* space */
    {0x04, 0x04, 0x04, 0x04, 0x04, 0x00, 0x04, 0x00}, /* ! */
    {0x0a, 0x0a, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00}, /* " */
    {0x0a, 0x0a, 0x1f, 0x0a, 0x1f, 0x0a, 0x0a, 0x00}, /* # */
    {0x04, 0x0f, 0x14, 0x0e, 0x05, 0x1e, 0x04, 0x00}, /* $ */
    {0x18, 0x19, 0x02, 0x04, 0x08, 0x13, 0x03, 0x00}, /* % */
    {0x0c, 0x12, 0x14, 0x08, 0x15, 0x12, 0x0d, 0x00}, /* & */
    {0x04, 0x04, 0x08, 0x00, 0x00, 0x00, 0x00, 0x00}, /* ' */
    {0x02, 0x04, 0x08, 0x08, 0x08, 0x04, 0x02, 0x00}, /* ( */
    {0x08, 0x04, 0x02, 0x02, 0x02, 0x04, 0x08, 0x00}, /* ) */
    {0x00, 0x04, 0x15, 0x0e, 0x15, 0x04, 0x00, 0x00}, /* * */
    {0x00, 0x04, 0x04, 0x1f, 0x04, 0x04, 0x00, 0x00}, /* + */
    {0x00, 0x00, 0x00, 0x00, 0x00, 0x0c, 0x04, 0x08}, /* , */
    {0x00, 0x00, 0x00, 0x1f, 0x00, 0x00, 0x00, 0x00}, /* - */
    {0x00, 0x00, 0x00, 0x00, 0x00, 0x0c, 0x0c, 0x00}, /* . */
    {0x00, 0x01, 0x02, 0x04, 0x08, 0x10, 0x00, 0x00}, /* / */
    {0x0e, 0x11, 0x13, 0x15, 0x19, 0x11, 0x0e, 0x00}, /* 0 */
    {0x04, 0x0c, 0x04, 0x04, 0x04, 0x04, 0x0e, 0x00}, /* 1 */
    {0x0e, 0x11, 0x01, 0x02, 0x04, 0x08, 0x1f, 0x00}, /* 2 */
    {0x1f, 0x02, 0x04, 0x02, 0x01, 0x11, 0x0e, 0x00}, /* 3 */
    {0x02, 0x06, 0x0a, 0x12, 0x1f, 0x02, 0x02, 0x00}, /* 4 */
    {0x1f, 0x10, 0x1e, 0x01, 0x01, 0x11, 0x0e, 0x00}, /* 5 */
    {0x06, 0x08, 0x10, 0x1e, 0x11, 0x11, 0x0e, 0x00}, /* 6 */
    {0x1f, 0x01, 0x02, 0x04, 0x08, 0x08, 0x08, 0x00}, /* 7 */
    {0x0e, 0x11, 0x11, 0x0e, 0x11, 0x11, 0x0e, 0x00}, /* 8 */
    {0x0e, 0x11, 0x11, 0x0f, 0x01, 0x02, 0x0c, 0x00}, /* 9 */
    {0x00, 0x0c, 0x0c, 0x00, 0x0c, 0x0c, 0x00, 0x00}, /* : */
    {0x00, 0x0c, 0x0c, 0x00, 0x0c, 0x04, 0x08, 0x00}, /* ; */
    {0x02, 0x04, 0x08, 0x10, 0x08, 0x04, 0x02, 0x00}, /* < */
    {0x00, 0x00, 0x1f, 0x00, 0x1f, 0x00, 0x00, 0x00}, /* = */
    {0x08, 0x04, 0x02, 0x01, 0x02, 0x04, 0x08, 0x00}, /* > */
    {0x0e, 0x11, 0x01, 0x02, 0x04, 0x00, 0x04, 0x00}, /* ? */
    {0x0e, 0x11, 0x01, 0x0d, 0x15, 0x15, 0x0e, 0x00}, /* @ */
    {0x0e, 0x11, 0x11, 0x1f, 0x11, 0x11, 0x11, 0x00}, /* A */
    {0x1e, 0x11, 0x11, 0x1e, 0x11, 0x11, 0x1e, 0x00}, /* B */
    {0x0e, 0x11, 0x10, 0x10, 0x10, 0x11, 0x0e, 0x00}, /* C */
    {0x1c, 0x12, 0x11, 0x11, 0x11, 0x12, 0x1c, 0x00}, /* D */
    {0x1f, 0x10, 0x10, 0x1e, 0x10, 0x10, 0x1f, 0x00}, /* E */
    {0x1f, 0x10, 0x10, 0x1e, 0x10, 0x10, 0x10, 0x00}, /* F */
    {0x0e, 0x11, 0x10, 0x17, 0x11, 0x11, 0x0f, 0x00}, /* G */
    {0x11, 0x11, 0x11, 0x1f, 0x11, 0x11, 0x11, 0x00}, /* H */
    {0x0e, 0x04, 0x04, 0x04, 0x04, 0x04, 0x0e, 0x00}, /* I */
    {0x07, 0x02, 0x02, 0x02, 0x02, 0x12, 0x0c, 0x00}, /* J */
    {0x11, 0x12, 0x14, 0x18, 0x14, 0x12, 0x11, 0x00}, /* K */
    {0x10, 0x10, 0x10, 0x10, 0x10, 0x10, 0x1f, 0x00}, /* L */
    {0x11, 0x1b, 0x15, 0x15, 0x11, 0x11, 0x11, 0x00}, /* M */
    {0x11, 0x11, 0x19, 0x15, 0x13, 0x11, 0x11, 0x00}, /* N */
    {0x0e, 0x11, 0x11, 0x11, 0x11, 0x11, 0x0e, 0x00}, /* O */
    {0x1e, 0x11, 0x11, 0x1e, 0x10, 0x10, 0x10, 0x00}, /* P */
    {0x0e, 0x11, 0x11, 0x11, 0x15, 0x12, 0x0d, 0x00}, /* Q */
    {0x1e, 0x11, 0x11, 0x1e, 0x14, 0x12, 0x11, 0x00}, /* R */
    {0x0f, 0x10, 0x10, 0x0e, 0x01, 0x01, 0x1e, 0x00}, /* S */
    {0x1f, 0x04, 0x04, 0x04, 0x04, 0x04, 0x04, 0x00}, /* T */
    {0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x0e, 0x00}, /* U */
    {0x11, 0x11, 0x11, 0x11, 0x11, 0x0a, 0x04, 0x00}, /* V */
    {0x11, 0x11, 0x11, 0x15, 0x15, 0x15, 0x0a, 0x00}, /* W */
    {0x11, 0x11, 0x0a, 0x04, 0x0a, 0x11, 0x11, 0x00}, /* X */
    {0x11, 0x11, 0x0a, 0x04, 0x04, 0x04, 0x04, 0x00}, /* Y */
    {0x1f, 0x01, 0x02, 0x04, 0x08, 0x10, 0x1f, 0x00}, /* Z */
    {0x0e, 0x08, 0x08, 0x08, 0x08, 0x08, 0x0e, 0x00}, /* [ */
    {0x00, 0x10, 0x08, 0x04, 0x02, 0x01, 0x00, 0x00}, /* backslash */
    {0x0e, 0x02, 0x02, 0x02, 0x02, 0x02, 0x0e, 0x00}, /* ] */
    {0x04, 0x0a, 0x11, 0x00, 0x00, 0x00, 0x00, 0x00}, /* ^ */
    {0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x1f}, /* _ */
    {0x08, 0x04, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00}, /* ` */
    {0x00, 0x00, 0x0e, 0x01, 0x0f, 0x11, 0x0f, 0x00}, /* a */
    {0x10, 0x10, 0x16, 0x19, 0x11, 0x11, 0x1e, 0x00}, /* b */
    {0x00, 0x00, 0x0e, 0x10, 0x10, 0x11, 0x0e, 0x00}, /* c */
    {0x01, 0x01, 0x0d, 0x13, 0x11, 0x11, 0x0f, 0x00}, /* d */
    {0x00, 0x00, 0x0e, 0x11, 0x1f, 0x10, 0x0e, 0x00}, /* e */
    {0x06, 0x09, 0x08, 0x1c, 0x08, 0x08, 0x08, 0x00}, /* f */
    {0x00, 0x00, 0x0f, 0x11, 0x11, 0x0f, 0x01, 0x0e}, /* g */
    {0x10, 0x10, 0x16, 0x19, 0x11, 0x11, 0x11, 0x00}, /* h */
    {0x04, 0x00, 0x0c, 0x04, 0x04, 0x04, 0x0e, 0x00}, /* i */
    {0x02, 0x00, 0x06, 0x02, 0x02, 0x02, 0x12, 0x0c}, /* j */
    {0x10, 0x10, 0x12, 0x14, 0x18, 0x14, 0x12, 0x00}, /* k */
    {0x0c, 0x04, 0x04, 0x04, 0x04, 0x04, 0x0e, 0x00}, /* l */
    {0x00, 0x00, 0x1a, 0x15, 0x15, 0x11, 0x11, 0x00}, /* m */
    {0x00, 0x00, 0x16, 0x19, 0x11, 0x11, 0x11, 0x00}, /* n */
    {0x00, 0x00, 0x0e, 0x11, 0x11, 0x11, 0x0e, 0x00}, /* o */
    {0x00, 0x00, 0x1e, 0x11, 0x11, 0x1e, 0x10, 0x10}, /* p */
    {0x00, 0x00, 0x0f, 0x11, 0x11, 0x0f, 0x01, 0x01}, /* q */
    {0x00, 0x00, 0x16, 0x19, 0x10, 0x10, 0x10, 0x00}, /* r */
    {0x00, 0x00, 0x0f, 0x10, 0x0e, 0x01, 0x1e, 0x00}, /* s */
    {0x08, 0x08, 0x1c, 0x08, 0x08, 0x09, 0x06, 0x00}, /* t */
    {0x00, 0x00, 0x11, 0x11, 0x11, 0x13, 0x0d, 0x00}, /* u */
    {0x00, 0x00, 0x11, 0x11, 0x11, 0x0a, 0x04, 0x00}, /* v */
    {0x00, 0x00, 0x11, 0x11, 0x15, 0x15, 0x0a, 0x00}, /* w */
    {0x00, 0x00, 0x11, 0x0a, 0x04, 0x0a, 0x11, 0x00}, /* x */
    {0x00, 0x00, 0x11, 0x11, 0x11, 0x0f, 0x01, 0x0e}, /* y */
    {0x00, 0x00, 0x1f, 0x02, 0x04, 0x08, 0x1f, 0x00}, /* z */
    {0x02, 0x04, 0x04, 0x08, 0x04, 0x04, 0x02, 0x00}, /* { */
    {0x04, 0x04, 0x04, 0x04, 0x04, 0x04, 0x04, 0x00}, /* | */
    {0x08, 0x04, 0x04, 0x02, 0x04, 0x04, 0x08, 0x00}, /* } */
    {0x00, 0x00, 0x08, 0x15, 0x02, 0x00, 0x00, 0x00}, /* ~ */
};

/* ---- canvas ---- */

typedef struct {
  int w, h;
  uint8_t *px;   /* RGB, row-major */
} canvas;

typedef struct { uint8_t r, g, b; } rgb;

static const rgb WHITE = {255, 255, 255}, INK = {20, 20, 20}, FRAME = {120, 120, 120}, MISSING = {200, 200, 200};
/* Disallowed cells: grey diagonal hatching on white, which viridis never
 * produces, so a masked key does not read as a weight near the minimum. */
static const rgb HATCH_BG = {250, 250, 250}, HATCH_LINE = {150, 150, 150};

static void put(canvas *c, int x, int y, rgb col) {
  if (x < 0 || y < 0 || x >= c->w || y >= c->h) return;
  uint8_t *p = c->px + ((size_t)y * c->w + x) * 3;
  p[0] = col.r, p[1] = col.g, p[2] = col.b;
}

static void fill(canvas *c, int x, int y, int w, int h, rgb col) {
  for (int j = y; j < y + h; j++)
    for (int i = x; i < x + w; i++) put(c, i, j, col);
}

/* Hatches a rectangle; the lines follow the canvas, so neighbouring cells join up. */
static void hatch(canvas *c, int x, int y, int w, int h) {
  for (int j = y; j < y + h; j++)
    for (int i = x; i < x + w; i++) put(c, i, j, (i + j) % 4 == 0 ? HATCH_LINE : HATCH_BG);
}

static void frame(canvas *c, int x, int y, int w, int h, rgb col) {
  fill(c, x - 1, y - 1, w + 2, 1, col);
  fill(c, x - 1, y + h, w + 2, 1, col);
  fill(c, x - 1, y, 1, h, col);
  fill(c, x + w, y, 1, h, col);
}

static int text_width(const char *s) {
  int n = (int)strlen(s);
  return n ? n * ADVANCE - TEXT_SCALE : 0;
}

/* Draws s with its top-left at (x, y); vertical: rotated a quarter turn
 * anticlockwise (reading upwards), (x, y) then the bottom-left. */
static void text(canvas *c, int x, int y, const char *s, int vertical) {
  for (int k = 0; s[k]; k++) {
    int ch = (unsigned char)s[k];
    const uint8_t *g = font5x8[(ch >= 32 && ch < 127 ? ch : '?') - 32];
    for (int gy = 0; gy < GLYPH_H; gy++)
      for (int gx = 0; gx < GLYPH_W; gx++) {
        if (!(g[gy] >> (GLYPH_W - 1 - gx) & 1)) continue;
        int u = k * ADVANCE + gx * TEXT_SCALE, v = gy * TEXT_SCALE;   /* offsets along and across the line */
        if (vertical) fill(c, x + v, y - u - TEXT_SCALE, TEXT_SCALE, TEXT_SCALE, INK);
        else fill(c, x + u, y + v, TEXT_SCALE, TEXT_SCALE, INK);
      }
  }
}

/* Draws s word-wrapped to width px from (x, y), honouring '\n'; returns the y below it. */
static int paragraph(canvas *c, int x, int y, int width, const char *s) {
  int per_line = width / ADVANCE;
  if (per_line < 8) per_line = 8;
  char line[512];
  while (*s) {
    int n = 0, cut = -1;
    while (s[n] && s[n] != '\n' && n < per_line && n < (int)sizeof line - 1) {
      if (s[n] == ' ') cut = n;
      n++;
    }
    int take = n, skip = 0;
    if (s[n] == '\n') skip = 1;
    else if (s[n] && cut > 0) take = cut, skip = 1;   /* break at the last space */
    memcpy(line, s, (size_t)take);
    line[take] = 0;
    if (c) text(c, x, y, line, 0);
    y += LINE_H;
    s += take + skip;
  }
  return y;
}

/* ---- colour ---- */

/* viridis (matplotlib), 11 stops at 0, 0.1, ..., 1, interpolated linearly */
static const rgb VIRIDIS[11] = {{68, 1, 84},    {72, 36, 117},  {65, 68, 135},  {53, 95, 141},
                                {42, 120, 142}, {33, 145, 140}, {34, 168, 132}, {68, 191, 112},
                                {122, 209, 81}, {189, 223, 38}, {253, 231, 37}};

static rgb colour(double t) {
  if (!(t >= 0)) t = 0;
  if (t > 1) t = 1;
  double f = t * 10;
  int i = (int)f;
  if (i >= 10) return VIRIDIS[10];
  f -= i;
  rgb a = VIRIDIS[i], b = VIRIDIS[i + 1];
  return (rgb){(uint8_t)lround(a.r + f * (b.r - a.r)), (uint8_t)lround(a.g + f * (b.g - a.g)),
               (uint8_t)lround(a.b + f * (b.b - a.b))};
}

/* ---- axes ---- */

/* The smallest step of 1, 2 or 5 x 10^k cells spanning at least min_px. */
static int tick_step(int cell_px, int min_px) {
  for (long p = 1;; p *= 10)
    for (int m = 1; m <= 5; m += m == 1 ? 1 : 3)
      if (m * p * cell_px >= min_px || m * p > 1000000000L) return (int)(m * p);
}

static void format_value(char *buf, size_t n, double v) {
  if (v != 0 && (fabs(v) < 1e-3 || fabs(v) >= 1e5)) snprintf(buf, n, "%.3g", v);
  else snprintf(buf, n, "%.4g", v);
}

/* ---- PNG ---- */

typedef struct {
  jmp_buf jb;
  char *err;
  size_t errlen;
} png_guard;

static void on_png_error(png_structp png, png_const_charp msg) {
  png_guard *g = png_get_error_ptr(png);
  snprintf(g->err, g->errlen, "libpng: %s", msg);
  longjmp(g->jb, 1);
}

static void on_png_warning(png_structp png, png_const_charp msg) {
  (void)png;
  (void)msg;
}

static int write_png(const canvas *c, const char *path, char *err, size_t errlen) {
  FILE *f = fopen(path, "wb");
  if (!f) return snprintf(err, errlen, "cannot write %s: %s", path, strerror(errno)), -1;
  png_guard g = {.err = err, .errlen = errlen};
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, &g, on_png_error, on_png_warning);
  png_infop info = png ? png_create_info_struct(png) : NULL;
  if (!png || !info) {
    png_destroy_write_struct(&png, NULL);
    fclose(f);
    return snprintf(err, errlen, "libpng: out of memory"), -1;
  }
  if (setjmp(g.jb)) {   /* libpng failed: the message is in err */
    png_destroy_write_struct(&png, &info);
    fclose(f);
    remove(path);
    return -1;
  }
  png_init_io(png, f);
  png_set_IHDR(png, info, (png_uint_32)c->w, (png_uint_32)c->h, 8, PNG_COLOR_TYPE_RGB, PNG_INTERLACE_NONE,
               PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
  png_write_info(png, info);
  for (int y = 0; y < c->h; y++) png_write_row(png, c->px + (size_t)y * c->w * 3);
  png_write_end(png, NULL);
  png_destroy_write_struct(&png, &info);
  if (fclose(f) != 0) return snprintf(err, errlen, "cannot write %s: %s", path, strerror(errno)), remove(path), -1;
  return 0;
}

/* ---- the heat map ---- */

#define PLOT_W 768
#define PLOT_H 512
#define MAX_SIDE 4096

static int clampi(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

int heatmap_write_png(const heatmap *h, const char *path, char *err, size_t errlen) {
  if (!h || !h->a || h->rows < 1 || h->cols < 1 || h->ld < (size_t)h->cols)
    return snprintf(err, errlen, "heat map: no matrix to draw"), -1;
  if (h->rows > MAX_SIDE || h->cols > MAX_SIDE)
    return snprintf(err, errlen, "heat map: %d x %d is more than %d cells a side", h->rows, h->cols, MAX_SIDE), -1;

  double lo = INFINITY, hi = -INFINITY;
  int any_disallowed = 0;
  for (int i = 0; i < h->rows; i++)
    for (int j = 0; j < h->cols; j++) {
      double v = h->a[(size_t)i * h->ld + j];
      if (h->allowed && !h->allowed[(size_t)i * h->cols + j]) any_disallowed = 1;
      else if (isfinite(v)) lo = fmin(lo, v), hi = fmax(hi, v);
    }
  if (!isfinite(lo)) lo = 0, hi = 1;   /* nothing finite: every cell grey */
  double span = hi > lo ? hi - lo : 1;

  /* geometry */
  int cw = clampi(PLOT_W / h->cols, 1, 64), ch = clampi(PLOT_H / h->rows, 1, 64);
  int pw = cw * h->cols, ph = ch * h->rows;
  char buf[64];
  snprintf(buf, sizeof buf, "%d", h->rows - 1);
  int ylabel_w = text_width(buf);
  int px0 = 10 + LINE_H + 10 + ylabel_w + 10;
  char smin[32], smax[32];
  format_value(smin, sizeof smin, lo);
  format_value(smax, sizeof smax, hi);
  int bar_x = px0 + pw + 24, bar_w = 20;
  int bar_label_w = text_width(smin) > text_width(smax) ? text_width(smin) : text_width(smax);
  if (text_width("a_ij") > bar_label_w) bar_label_w = text_width("a_ij");
  if (any_disallowed && text_width("disallowed") > bar_label_w) bar_label_w = text_width("disallowed");
  int w = bar_x + bar_w + 8 + bar_label_w + 16;
  if (w < 720) w = 720;   /* the title and the caption wrap to the width */
  int py0 = paragraph(NULL, 10, 10, w - 20, h->title ? h->title : "") + 16;
  int bar_h = ph < 120 ? 120 : ph;                  /* room for its three labels */
  int legend_y = py0 + bar_h + 8, legend_h = any_disallowed ? 16 + 8 : 0;   /* the hatched swatch */
  int axis_y = py0 + ph + 8 + 16 + 8;              /* "key j" */
  int cap_y = (axis_y + LINE_H > legend_y + legend_h ? axis_y + LINE_H : legend_y + legend_h) + 12;
  int height = paragraph(NULL, 10, cap_y, w - 20, h->caption ? h->caption : "") + 8;

  canvas c = {w, height, calloc((size_t)w * height, 3)};
  if (!c.px) return snprintf(err, errlen, "heat map: out of memory"), -1;
  fill(&c, 0, 0, w, height, WHITE);
  if (h->title) paragraph(&c, 10, 10, w - 20, h->title);

  /* cells */
  for (int i = 0; i < h->rows; i++)
    for (int j = 0; j < h->cols; j++) {
      double v = h->a[(size_t)i * h->ld + j];
      if (h->allowed && !h->allowed[(size_t)i * h->cols + j]) hatch(&c, px0 + j * cw, py0 + i * ch, cw, ch);
      else fill(&c, px0 + j * cw, py0 + i * ch, cw, ch, isfinite(v) ? colour((v - lo) / span) : MISSING);
    }
  frame(&c, px0, py0, pw, ph, FRAME);

  /* x axis: ticks at cell centres, numbers below, "key j" centred */
  int step = tick_step(cw, text_width("0000") + 16);
  for (int j = 0; j < h->cols; j += step) {
    int x = px0 + j * cw + cw / 2;
    fill(&c, x, py0 + ph + 1, 1, 5, INK);
    snprintf(buf, sizeof buf, "%d", j);
    int tx = clampi(x - text_width(buf) / 2, 0, w - text_width(buf));
    text(&c, tx, py0 + ph + 8, buf, 0);
  }
  text(&c, px0 + pw / 2 - text_width("key j") / 2, axis_y, "key j", 0);

  /* y axis: numbers right-aligned left of the ticks, "query i" upwards */
  step = tick_step(ch, 2 * LINE_H);
  for (int i = 0; i < h->rows; i += step) {
    int y = py0 + i * ch + ch / 2;
    fill(&c, px0 - 6, y, 5, 1, INK);
    snprintf(buf, sizeof buf, "%d", i);
    text(&c, px0 - 10 - text_width(buf), y - GLYPH_H * TEXT_SCALE / 2 + 1, buf, 0);
  }
  int ylen = text_width("query i");
  text(&c, 10, py0 + ph / 2 + ylen / 2, "query i", 1);

  /* colour bar: max at the top, min at the bottom */
  for (int y = 0; y < bar_h; y++) fill(&c, bar_x, py0 + y, bar_w, 1, colour(1.0 - (double)y / (bar_h - 1)));
  frame(&c, bar_x, py0, bar_w, bar_h, FRAME);
  text(&c, bar_x + bar_w + 8, py0, smax, 0);
  text(&c, bar_x + bar_w + 8, py0 + bar_h - GLYPH_H * TEXT_SCALE, smin, 0);
  text(&c, bar_x + bar_w + 8, py0 + bar_h / 2 - GLYPH_H, "a_ij", 0);
  if (any_disallowed) {
    hatch(&c, bar_x, legend_y, bar_w, 16);
    frame(&c, bar_x, legend_y, bar_w, 16, FRAME);
    text(&c, bar_x + bar_w + 8, legend_y, "disallowed", 0);
  }

  if (h->caption) paragraph(&c, 10, cap_y, w - 20, h->caption);
  int rc = write_png(&c, path, err, errlen);
  free(c.px);
  return rc;
}
