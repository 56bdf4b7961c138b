/*
 * What the kit's readers share: a whole file read with a bound on its size,
 * the sentence saying why a read failed, and the sentence written into a
 * caller's error buffer.
 */
#ifndef AT_FILE_H
#define AT_FILE_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Reads the whole regular file at path, with a NUL after its bytes (*len
 * excludes it); malloc'd. NULL with errno set on failure: ENOENT for a
 * missing file (so optional files can be told apart from broken ones),
 * EINVAL for something that is not a regular file, EFBIG beyond max bytes.
 * A FIFO under the name does not block. */
unsigned char *at_file_read(const char *path, size_t max, size_t *len);

/* Why at_file_read failed, from the errno it left. */
const char *at_file_error(int e);

/* Formats a sentence into err; nothing when err is NULL or errlen 0. */
void at_seterr(char *err, size_t errlen, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

#ifdef __cplusplus
}
#endif
#endif /* AT_FILE_H */
