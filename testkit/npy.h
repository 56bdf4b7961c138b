/*
 * Reading NumPy .npy files (format versions 1 to 3, little-endian, C order)
 * as the golden cases store them, refusing with a sentence what is not the
 * expected array.
 */
#ifndef AT_NPY_H
#define AT_NPY_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* What the caller wants the data as, and which file dtypes give it:
 * AT_NPY_F32 from <f4 or <f8 (rounded), AT_NPY_U16 from <u2 or <f2 (the raw
 * 16-bit patterns of f16 and bf16), AT_NPY_I32 from <i4 or <i8 (in range). */
typedef enum { AT_NPY_F32, AT_NPY_U16, AT_NPY_I32 } at_npy_want;

/* Loads path, which must hold an array of exactly the given shape (the
 * caller bounds the product), into a malloc'd array of `want`. Returns 0;
 * with optional set, also 0 and *out NULL when the file does not exist. Else
 * -1 with a sentence in err that starts with the path. */
int at_npy_load(const char *path, int optional, at_npy_want want, int ndim, const int64_t *shape,
                void **out, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif
#endif /* AT_NPY_H */
