/*
 * A small RGB canvas for the tools' PNG figures (canvas.c): heatmap.c and
 * lineplot.c draw on it and write it through libpng.
 */
#ifndef CLATTN_TOOLS_CANVAS_H
#define CLATTN_TOOLS_CANVAS_H

#include <stddef.h>
#include <stdint.h>

/* Text: the 5x8 font drawn at TEXT_SCALE, ADVANCE px per character, LINE_H px per line. */
enum { GLYPH_W = 5, GLYPH_H = 8, TEXT_SCALE = 2, ADVANCE = (GLYPH_W + 1) * TEXT_SCALE, LINE_H = 20 };

typedef struct {
  int w, h;
  uint8_t *px; /* RGB, row-major */
} canvas;

typedef struct {
  uint8_t r, g, b;
} rgb;

void canvas_put(canvas *c, int x, int y, rgb col); /* pixels outside the canvas are skipped */
void canvas_fill(canvas *c, int x, int y, int w, int h, rgb col);
/* Hatches a rectangle; the lines follow the canvas, so neighbouring cells join up. */
void canvas_hatch(canvas *c, int x, int y, int w, int h);
/* A one-pixel frame just outside the rectangle. */
void canvas_frame(canvas *c, int x, int y, int w, int h, rgb col);
int canvas_text_width(const char *s);
/* Draws s with its top-left at (x, y); vertical: rotated a quarter turn
 * anticlockwise (reading upwards), (x, y) then the bottom-left. */
void canvas_text(canvas *c, int x, int y, const char *s, int vertical);
/* Draws s word-wrapped to width px from (x, y), honouring '\n'; returns the y
 * below it. c NULL: only measures. */
int canvas_paragraph(canvas *c, int x, int y, int width, const char *s);
/* Writes the canvas as an RGB PNG. Returns 0, or -1 with a message in err
 * (naming the file and why); a partly written file is removed. */
int canvas_write_png(const canvas *c, const char *path, char *err, size_t errlen);

#endif
