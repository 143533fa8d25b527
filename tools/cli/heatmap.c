/*
 * Heat maps as PNG, drawn on canvas.c's canvas (its bitmap font for the
 * labels, libpng to write it) in the viridis colour map; disallowed cells
 * hatched (canvas_hatch).
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

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "canvas.h"

static const rgb WHITE = {255, 255, 255}, INK = {20, 20, 20}, FRAME = {120, 120, 120}, MISSING = {200, 200, 200};

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
  if (v != 0 && (fabs(v) < 1e-3 || fabs(v) >= 1e5))
    snprintf(buf, n, "%.3g", v);
  else
    snprintf(buf, n, "%.4g", v);
}

/* ---- the heat map ---- */

#define PLOT_W   768
#define PLOT_H   512
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
      if (h->allowed && !h->allowed[(size_t)i * h->cols + j])
        any_disallowed = 1;
      else if (isfinite(v))
        lo = fmin(lo, v), hi = fmax(hi, v);
    }
  if (!isfinite(lo)) lo = 0, hi = 1; /* nothing finite: every cell grey */
  double span = hi > lo ? hi - lo : 1;

  /* geometry */
  int cw = clampi(PLOT_W / h->cols, 1, 64), ch = clampi(PLOT_H / h->rows, 1, 64);
  int pw = cw * h->cols, ph = ch * h->rows;
  char buf[64];
  snprintf(buf, sizeof buf, "%d", h->rows - 1);
  int ylabel_w = canvas_text_width(buf);
  int px0 = 10 + LINE_H + 10 + ylabel_w + 10;
  char smin[32], smax[32];
  format_value(smin, sizeof smin, lo);
  format_value(smax, sizeof smax, hi);
  int bar_x = px0 + pw + 24, bar_w = 20;
  int bar_label_w =
      canvas_text_width(smin) > canvas_text_width(smax) ? canvas_text_width(smin) : canvas_text_width(smax);
  if (canvas_text_width("a_ij") > bar_label_w) bar_label_w = canvas_text_width("a_ij");
  if (any_disallowed && canvas_text_width("disallowed") > bar_label_w) bar_label_w = canvas_text_width("disallowed");
  int w = bar_x + bar_w + 8 + bar_label_w + 16;
  if (w < 720) w = 720; /* the title and the caption wrap to the width */
  int py0 = canvas_paragraph(NULL, 10, 10, w - 20, h->title ? h->title : "") + 16;
  int bar_h = ph < 120 ? 120 : ph;                                        /* room for its three labels */
  int legend_y = py0 + bar_h + 8, legend_h = any_disallowed ? 16 + 8 : 0; /* the hatched swatch */
  int axis_y = py0 + ph + 8 + 16 + 8;                                     /* "key j" */
  int cap_y = (axis_y + LINE_H > legend_y + legend_h ? axis_y + LINE_H : legend_y + legend_h) + 12;
  int height = canvas_paragraph(NULL, 10, cap_y, w - 20, h->caption ? h->caption : "") + 8;

  canvas c = {w, height, calloc((size_t)w * height, 3)};
  if (!c.px) return snprintf(err, errlen, "heat map: out of memory"), -1;
  canvas_fill(&c, 0, 0, w, height, WHITE);
  if (h->title) canvas_paragraph(&c, 10, 10, w - 20, h->title);

  /* cells */
  for (int i = 0; i < h->rows; i++)
    for (int j = 0; j < h->cols; j++) {
      double v = h->a[(size_t)i * h->ld + j];
      if (h->allowed && !h->allowed[(size_t)i * h->cols + j])
        canvas_hatch(&c, px0 + j * cw, py0 + i * ch, cw, ch);
      else
        canvas_fill(&c, px0 + j * cw, py0 + i * ch, cw, ch, isfinite(v) ? colour((v - lo) / span) : MISSING);
    }
  canvas_frame(&c, px0, py0, pw, ph, FRAME);

  /* x axis: ticks at cell centres, numbers below, "key j" centred */
  int step = tick_step(cw, canvas_text_width("0000") + 16);
  for (int j = 0; j < h->cols; j += step) {
    int x = px0 + j * cw + cw / 2;
    canvas_fill(&c, x, py0 + ph + 1, 1, 5, INK);
    snprintf(buf, sizeof buf, "%d", j);
    int tx = clampi(x - canvas_text_width(buf) / 2, 0, w - canvas_text_width(buf));
    canvas_text(&c, tx, py0 + ph + 8, buf, 0);
  }
  canvas_text(&c, px0 + pw / 2 - canvas_text_width("key j") / 2, axis_y, "key j", 0);

  /* y axis: numbers right-aligned left of the ticks, "query i" upwards */
  step = tick_step(ch, 2 * LINE_H);
  for (int i = 0; i < h->rows; i += step) {
    int y = py0 + i * ch + ch / 2;
    canvas_fill(&c, px0 - 6, y, 5, 1, INK);
    snprintf(buf, sizeof buf, "%d", i);
    canvas_text(&c, px0 - 10 - canvas_text_width(buf), y - GLYPH_H * TEXT_SCALE / 2 + 1, buf, 0);
  }
  int ylen = canvas_text_width("query i");
  canvas_text(&c, 10, py0 + ph / 2 + ylen / 2, "query i", 1);

  /* colour bar: max at the top, min at the bottom */
  for (int y = 0; y < bar_h; y++) canvas_fill(&c, bar_x, py0 + y, bar_w, 1, colour(1.0 - (double)y / (bar_h - 1)));
  canvas_frame(&c, bar_x, py0, bar_w, bar_h, FRAME);
  canvas_text(&c, bar_x + bar_w + 8, py0, smax, 0);
  canvas_text(&c, bar_x + bar_w + 8, py0 + bar_h - GLYPH_H * TEXT_SCALE, smin, 0);
  canvas_text(&c, bar_x + bar_w + 8, py0 + bar_h / 2 - GLYPH_H, "a_ij", 0);
  if (any_disallowed) {
    canvas_hatch(&c, bar_x, legend_y, bar_w, 16);
    canvas_frame(&c, bar_x, legend_y, bar_w, 16, FRAME);
    canvas_text(&c, bar_x + bar_w + 8, legend_y, "disallowed", 0);
  }

  if (h->caption) canvas_paragraph(&c, 10, cap_y, w - 20, h->caption);
  int rc = canvas_write_png(&c, path, err, errlen);
  free(c.px);
  return rc;
}
