/* The seeds' worked examples: one query over two or three keys, with the
 * outputs the seeds print (rounded, hence a tolerance per example). The demo,
 * the lab and the reference and device tests all read this one table. */
#ifndef CLATTN_KIT_WORKED_H
#define CLATTN_KIT_WORKED_H

typedef struct {
  const char *name;
  int n, dk, dv; /* keys, key width, value width */
  float q[2];
  float k[6], v[6]; /* n rows of dk (dv) values */
  float scale;      /* NAN: 1/sqrt(dk) */
  unsigned char allowed[3];
  double want_out[2], want_w[3];
  double tol_w, tol_out; /* of the seeds' rounding: weights, outputs */
} cp_worked;

enum { CP_N_WORKED = 6 };
extern const cp_worked cp_worked_examples[CP_N_WORKED];

#endif
