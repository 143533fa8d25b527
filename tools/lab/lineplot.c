/*
 * Line plots as PNG (lineplot.h) on canvas.c's canvas.
 *
 * Layout (scale-2 text):
 *
 *   title, wrapped to the image width
 *   y label | tick values | frame with grid lines and the series | legend
 *                           tick values
 *                           x label
 *   caption, wrapped to the image width
 *
 * Ticks fall on "nice" steps (1, 2, 5 x 10^k) of the data's units; the lines
 * are 2 px wide in the Okabe-Ito colour-blind-safe palette, points marked.
 */
#include "lineplot.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "canvas.h"

enum { AREA_W = 640, AREA_H = 384, MAX_SERIES = 8 };

static const rgb WHITE = {255, 255, 255}, INK = {20, 20, 20}, FRAME = {120, 120, 120}, GRID = {225, 225, 225};
static const rgb PALETTE[MAX_SERIES] = {{0, 114, 178},   {230, 159, 0},  {0, 158, 115},   {213, 94, 0},
                                        {204, 121, 167}, {86, 180, 233}, {120, 120, 120}, {20, 20, 20}};

/* The smallest step of 1, 2 or 5 x 10^k giving at most max_ticks intervals over span. */
static double nice_step(double span, int max_ticks) {
  const double raw = span / max_ticks, p = pow(10.0, floor(log10(raw)));
  for (int m = 1; m <= 10; m += m == 1 ? 1 : 3)
    if (m * p >= raw) return m * p;
  return 10 * p;
}

static void format_tick(char *buf, size_t n, double v, double step) {
  const int decimals = step >= 1 ? 0 : (int)ceil(-log10(step) - 1e-9);
  snprintf(buf, n, "%.*f", decimals, fabs(v) < step * 1e-9 ? 0.0 : v);
}

/* A 2 px line from (x0, y0) to (x1, y1) (DDA). */
static void line(canvas *c, double x0, double y0, double x1, double y1, rgb col) {
  const int n = (int)ceil(fmax(fabs(x1 - x0), fabs(y1 - y0))) + 1;
  for (int k = 0; k <= n; k++) {
    const double t = (double)k / n;
    canvas_fill(c, (int)lround(x0 + t * (x1 - x0)) - 1, (int)lround(y0 + t * (y1 - y0)) - 1, 2, 2, col);
  }
}

int lineplot_write_png(const lineplot *p, const char *path, char *err, size_t errlen) {
  if (!p || p->n_points < 1 || !p->x || p->n_series < 1 || p->n_series > MAX_SERIES || !p->series ||
      !(p->y_min < p->y_max))
    return snprintf(err, errlen, "line plot: nothing to draw (points, 1 to %d series, y_min < y_max)", MAX_SERIES), -1;
  for (int k = 0; k < p->n_series; k++)
    if (!p->series[k].y) return snprintf(err, errlen, "line plot: series %d has no values", k), -1;
  const double x_lo = p->x[0], x_last = p->x[p->n_points - 1], x_hi = x_last > x_lo ? x_last : x_lo + 1;
  const double x_step = nice_step(x_hi - x_lo, 8), y_step = nice_step(p->y_max - p->y_min, 8);
  char buf[64];

  /* geometry */
  int tick_w = 0;
  for (double v = ceil(p->y_min / y_step) * y_step; v <= p->y_max + y_step * 1e-9; v += y_step) {
    format_tick(buf, sizeof buf, v, y_step);
    if (canvas_text_width(buf) > tick_w) tick_w = canvas_text_width(buf);
  }
  int legend_w = 0;
  for (int k = 0; k < p->n_series; k++)
    if (canvas_text_width(p->series[k].label ? p->series[k].label : "") > legend_w)
      legend_w = canvas_text_width(p->series[k].label ? p->series[k].label : "");
  const int ax = 10 + LINE_H + 10 + tick_w + 10, legend_x = ax + AREA_W + 24;
  int w = legend_x + 28 + legend_w + 16;
  if (w < 720) w = 720;
  const int ay = canvas_paragraph(NULL, 10, 10, w - 20, p->title ? p->title : "") + 16;
  const int x_label_y = ay + AREA_H + 8 + 16 + 8, cap_y = x_label_y + LINE_H + 12;
  const int h = canvas_paragraph(NULL, 10, cap_y, w - 20, p->caption ? p->caption : "") + 8;
  canvas c = {w, h, calloc((size_t)w * h, 3)};
  if (!c.px) return snprintf(err, errlen, "line plot: out of memory"), -1;
  canvas_fill(&c, 0, 0, w, h, WHITE);
  if (p->title) canvas_paragraph(&c, 10, 10, w - 20, p->title);
#define PX(x) (ax + ((x)-x_lo) / (x_hi - x_lo) * (AREA_W - 1))
#define PY(y) (ay + (p->y_max - fmin(fmax((y), p->y_min), p->y_max)) / (p->y_max - p->y_min) * (AREA_H - 1))

  /* y: grid lines, ticks, values, label upwards */
  for (double v = ceil(p->y_min / y_step) * y_step; v <= p->y_max + y_step * 1e-9; v += y_step) {
    const int y = (int)lround(PY(v));
    canvas_fill(&c, ax, y, AREA_W, 1, GRID);
    canvas_fill(&c, ax - 6, y, 5, 1, INK);
    format_tick(buf, sizeof buf, v, y_step);
    canvas_text(&c, ax - 10 - canvas_text_width(buf), y - GLYPH_H * TEXT_SCALE / 2 + 1, buf, 0);
  }
  if (p->y_label) canvas_text(&c, 10, ay + AREA_H / 2 + canvas_text_width(p->y_label) / 2, p->y_label, 1);
  /* x: ticks, values, label */
  for (double v = ceil(x_lo / x_step) * x_step; v <= x_hi + x_step * 1e-9; v += x_step) {
    const int x = (int)lround(PX(v));
    canvas_fill(&c, x, ay + AREA_H + 1, 1, 5, INK);
    format_tick(buf, sizeof buf, v, x_step);
    canvas_text(&c, x - canvas_text_width(buf) / 2, ay + AREA_H + 8, buf, 0);
  }
  if (p->x_label) canvas_text(&c, ax + AREA_W / 2 - canvas_text_width(p->x_label) / 2, x_label_y, p->x_label, 0);
  canvas_frame(&c, ax, ay, AREA_W, AREA_H, FRAME);

  /* the series, and the legend beside the frame */
  for (int k = 0; k < p->n_series; k++) {
    const double *y = p->series[k].y;
    for (int i = 0; i < p->n_points; i++) {
      if (!isfinite(y[i])) continue;
      if (i + 1 < p->n_points && isfinite(y[i + 1]))
        line(&c, PX(p->x[i]), PY(y[i]), PX(p->x[i + 1]), PY(y[i + 1]), PALETTE[k]);
      canvas_fill(&c, (int)lround(PX(p->x[i])) - 3, (int)lround(PY(y[i])) - 3, 6, 6, PALETTE[k]);
    }
    const int ly = ay + 8 + k * LINE_H;
    canvas_fill(&c, legend_x, ly + 6, 20, 4, PALETTE[k]);
    canvas_text(&c, legend_x + 28, ly, p->series[k].label ? p->series[k].label : "", 0);
  }
#undef PX
#undef PY
  if (p->caption) canvas_paragraph(&c, 10, cap_y, w - 20, p->caption);
  const int rc = canvas_write_png(&c, path, err, errlen);
  free(c.px);
  return rc;
}
