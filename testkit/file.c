/*
 * Reading the kit's input files. They are produced by attn's own tooling, but
 * a hand-edited, truncated or misplaced file must give a sentence, not a hang
 * or undefined behaviour.
 */
#define _POSIX_C_SOURCE 200809L /* O_CLOEXEC, fdopen */

#include "file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

void at_seterr(char *err, size_t errlen, const char *fmt, ...) {
  if (!err || errlen == 0) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, errlen, fmt, ap);
  va_end(ap);
}

const char *at_file_error(int e) {
  if (e == EFBIG) return "file much larger than its expected shape";
  if (e == EINVAL) return "not a regular file";
  return strerror(e);
}

unsigned char *at_file_read(const char *path, size_t max, size_t *len) {
  /* Opened without blocking and checked before reading: a FIFO under a case
   * file's name would otherwise hang the open, and a directory fail late. */
  int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return NULL;
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    errno = EINVAL; /* told apart by at_file_error() */
    return NULL;
  }
  FILE *f = fdopen(fd, "rb");
  if (!f) {
    close(fd);
    return NULL;
  }
  unsigned char *buf = NULL;
  size_t n = 0, cap = 0;
  for (;;) {
    if (n == cap) {
      if (cap >= max) {
        free(buf);
        fclose(f);
        errno = EFBIG;
        return NULL;
      }
      cap = cap ? cap * 2 : 65536;
      if (cap > max) cap = max;
      unsigned char *b2 = realloc(buf, cap + 1);
      if (!b2) {
        free(buf);
        fclose(f);
        errno = ENOMEM;
        return NULL;
      }
      buf = b2;
    }
    size_t got = fread(buf + n, 1, cap - n, f);
    n += got;
    if (got == 0) break;
  }
  int bad = ferror(f);
  fclose(f);
  if (bad) {
    free(buf);
    errno = EIO;
    return NULL;
  }
  buf[n] = 0;
  *len = n;
  return buf;
}
