/*
 * Reading the small files clattn trusts nothing in (program cache entries,
 * tuning files) whole into memory, so their parsers work on bytes: a FIFO,
 * a device or an endless file at the path must neither block nor spin
 * clattn_create.
 */
#ifndef CLATTN_FILE_H
#define CLATTN_FILE_H

#include <stddef.h>

/* Reads path whole into a malloc'd buffer (*data, *len bytes and a NUL
 * after them). Only a regular file of at most cap bytes is read; the open
 * does not block. 0: read; 1: no such file; -1: anything else. why (when
 * not 0 and not NULL) says what failed, naming path. */
int ca_read_file(const char *path, size_t cap, unsigned char **data, size_t *len, char *why, size_t n);

/* strerror_r's text of e in buf (strerror is not thread-safe; contexts are
 * created from any thread). */
const char *ca_errno_text(int e, char *buf, size_t n);

#endif
