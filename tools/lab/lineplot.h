/*
 * Line plots as PNG (lineplot.c), drawn on heatmap.c's canvas: shared x
 * values, one coloured line per series with a legend, a labelled frame with
 * ticks, a title and a caption. Used for `clattn lab --train --plot`.
 */
#ifndef CLATTN_TOOLS_LINEPLOT_H
#define CLATTN_TOOLS_LINEPLOT_H

#include <stddef.h>

typedef struct {
  const char *label; /* in the legend */
  const double *y;   /* n_points values; non-finite ones break the line */
} lineplot_series;

typedef struct {
  const char *title, *x_label, *y_label;
  const char *caption; /* below the plot; '\n' separates lines, long lines wrap */
  int n_points;
  const double *x; /* n_points increasing values */
  int n_series;    /* 1 to 8 */
  const lineplot_series *series;
  double y_min, y_max; /* the y axis' range (y_min < y_max); values outside are clipped */
} lineplot;

/* Returns 0, or -1 with a message in err (naming the file and why). */
int lineplot_write_png(const lineplot *p, const char *path, char *err, size_t errlen);

#endif
