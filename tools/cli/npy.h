/*
 * NumPy's .npy format (numpy.lib.format): read and write the arrays of
 * `clattn run --q FILE.npy ...`.
 *
 *   "\x93NUMPY", major, minor (1.0, 2.0 or 3.0), the header's length
 *   (2 bytes little-endian in 1.0, 4 in 2.0 and 3.0), then the header: a
 *   Python dict literal such as
 *     {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }
 *   padded with spaces and a newline, then the data.
 *
 * Read: dtypes '<f4' (float32), '<f2' (float16), '|u1' (uint8), '|b1'
 * (bool); C or Fortran order (Fortran arrays are transposed into C order).
 * Written: '<f4' in C order, version 1.0. Nothing here aborts: a malformed,
 * truncated or unsupported file is an error saying what is wrong.
 */
#ifndef CLATTN_TOOLS_NPY_H
#define CLATTN_TOOLS_NPY_H

#include <stddef.h>

typedef enum { NPY_F32, NPY_F16, NPY_U8, NPY_BOOL } npy_dtype;

/* Dimensions accepted in a header (NumPy's own limit is 64). */
#define NPY_MAX_DIMS 32

typedef struct {
  npy_dtype dtype;
  int fortran_order;
  int ndim;
  size_t shape[NPY_MAX_DIMS];
  size_t count;       /* elements: the product of shape (1 for shape ()) */
  size_t elem_size;   /* bytes per element */
  size_t data_offset; /* bytes before the data */
} npy_header;

/* Parses the magic, version and header dict at the start of buf (len
 * bytes). Returns 0, or -1 with what is wrong in err. */
int npy_parse_header(const unsigned char *buf, size_t len, npy_header *h, char *err, size_t errlen);

typedef struct {
  npy_header h;
  float *f;          /* '<f4' and '<f2': the values, C order */
  unsigned char *u8; /* '|u1' and '|b1': the values, C order */
} npy_array;

/* Decodes a whole .npy image (header and data; the data must be exactly
 * what the header describes). Returns 0, or -1 with what is wrong in err;
 * *a holds nothing to free then. */
int npy_decode(const unsigned char *buf, size_t len, npy_array *a, char *err, size_t errlen);

/* Reads and decodes a file; err names it. The header is read first, then
 * only the data it implies: a regular file of another size is refused
 * before its data is read, and a pipe or device is read no further than the
 * header's size and one byte. */
int npy_load(const char *path, npy_array *a, char *err, size_t errlen);

void npy_free(npy_array *a);

/* Writes count = prod(shape) floats in C order as '<f4'; err names the file. */
int npy_save_f32(const char *path, const float *data, int ndim, const size_t *shape, char *err, size_t errlen);

/* "(2, 3, 4)": a shape as NumPy prints it, into buf. Returns buf. */
char *npy_shape_string(const npy_header *h, char *buf, size_t n);

/* "'<f4' (float32)": the dtype as in a header, with its NumPy name. */
const char *npy_dtype_string(npy_dtype d);

#endif
