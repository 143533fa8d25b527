/*
 * Heat maps of a routing matrix as PNG (libpng): one cell per (query i, key
 * j) in a perceptual colour map (viridis), labelled axes with tick numbers, a
 * colour scale bar with its minimum and maximum, a title and a caption;
 * cells of disallowed keys hatched, apart from allowed ones of weight ~0. The
 * text is drawn with a small bitmap font embedded in heatmap.c, so nothing
 * but libpng is needed.
 */
#ifndef CLATTN_TOOLS_HEATMAP_H
#define CLATTN_TOOLS_HEATMAP_H

#include <stddef.h>

typedef struct {
  const float *a; /* rows x cols values, row-major */
  int rows, cols;
  size_t ld;                    /* elements between consecutive rows (>= cols) */
  const char *title;            /* one line */
  const char *caption;          /* below the map; '\n' separates lines, long lines wrap */
  const unsigned char *allowed; /* rows x cols, row-major (ld = cols): 0 = the key is disallowed,
                                   drawn hatched rather than in the colour of its value; NULL = all allowed */
} heatmap;

/* Writes the heat map to path. Non-finite values are drawn grey and left out
 * of the scale, as are disallowed cells. Returns 0, or -1 with a message in
 * err (naming the file and why it could not be written). */
int heatmap_write_png(const heatmap *h, const char *path, char *err, size_t errlen);

#endif
