/* Bounded whole-file reads (see file.h). */
#include "base/file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

const char *ca_errno_text(int e, char *buf, size_t n) {
  if (strerror_r(e, buf, n) != 0) snprintf(buf, n, "error %d", e);
  return buf;
}

int ca_read_file(const char *path, size_t cap, unsigned char **data, size_t *len, char *why, size_t n) {
  char text[128];
  *data = NULL;
  *len = 0;
  /* O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer. */
  int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    int e = errno;
    if (why) snprintf(why, n, "cannot open %s: %s", path, ca_errno_text(e, text, sizeof text));
    return e == ENOENT ? 1 : -1;
  }
  int rc = -1;
  struct stat sb;
  unsigned char *buf = NULL;
  if (fstat(fd, &sb) != 0) {
    if (why) snprintf(why, n, "cannot stat %s: %s", path, ca_errno_text(errno, text, sizeof text));
    goto done;
  }
  if (!S_ISREG(sb.st_mode)) {
    if (why) snprintf(why, n, "%s is not a regular file", path);
    goto done;
  }
  if (sb.st_size < 0 || (unsigned long long)sb.st_size > cap) {
    if (why) snprintf(why, n, "%s is larger than %zu bytes", path, cap);
    goto done;
  }
  size_t size = (size_t)sb.st_size, got = 0;
  buf = malloc(size + 1);
  if (!buf) {
    if (why) snprintf(why, n, "%s: out of host memory for %zu bytes", path, size);
    goto done;
  }
  /* Exactly the size fstat saw: a file that grows meanwhile is read only
   * that far, one that shrinks is an error. */
  while (got < size) {
    ssize_t r = read(fd, buf + got, size - got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      if (why)
        snprintf(why, n, "cannot read %s: %s", path, r < 0 ? ca_errno_text(errno, text, sizeof text) : "file shrank");
      goto done;
    }
    got += (size_t)r;
  }
  buf[size] = '\0';
  *data = buf;
  *len = size;
  buf = NULL;
  rc = 0;
done:
  free(buf);
  close(fd);
  return rc;
}
