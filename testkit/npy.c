/*
 * The .npy reader of the test kit (npy.h). The header is a Python dict in
 * text; only the three keys numpy writes are read, and every number in it is
 * bounded before it is used.
 */
#include "npy.h"

#include "file.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A shape entry beyond any the golden cases could hold: strtoll's result is
 * refused before it is compared or multiplied. */
#define NPY_MAX_DIM ((int64_t)1 << 31)

typedef enum { NPY_F4, NPY_F8, NPY_U2, NPY_F2, NPY_I4, NPY_I8 } npy_kind;

static const struct {
  const char *descr;
  npy_kind kind;
  size_t size;
} npy_types[] = {{"<f4", NPY_F4, 4}, {"<f8", NPY_F8, 8}, {"<u2", NPY_U2, 2},
                 {"<f2", NPY_F2, 2}, {"<i4", NPY_I4, 4}, {"<i8", NPY_I8, 8}};

static uint64_t le(const unsigned char *p, size_t n) {
  uint64_t v = 0;
  for (size_t i = n; i-- > 0;)
    v = v << 8 | p[i];
  return v;
}

/* The value of 'key' in the header dict: a pointer just past "'key':". */
static const char *npy_field(const char *h, const char *key) {
  char pat[32];
  snprintf(pat, sizeof pat, "'%s'", key);
  const char *p = strstr(h, pat);
  if (!p) return NULL;
  p += strlen(pat);
  while (*p == ' ')
    p++;
  if (*p != ':') return NULL;
  p++;
  while (*p == ' ')
    p++;
  return p;
}

int at_npy_load(const char *path, int optional, at_npy_want want, int ndim, const int64_t *shape,
                void **out, char *err, size_t errlen) {
  *out = NULL;
  int64_t count = 1;
  for (int i = 0; i < ndim; i++)
    count *= shape[i]; /* bounded by the caller */
  size_t len = 0;
  unsigned char *buf = at_file_read(path, (size_t)count * 8 + 65536 + 16, &len);
  if (!buf) {
    if (errno == ENOENT && optional) return 0;
    at_seterr(err, errlen, "%s: %s", path, at_file_error(errno));
    return -1;
  }
  int rc = -1;
  char *header = NULL;
  if (len < 10 || memcmp(buf, "\x93NUMPY", 6) != 0) {
    at_seterr(err, errlen, "%s: not a .npy file (bad magic)", path);
    goto done;
  }
  size_t hlen, hstart;
  if (buf[6] == 1) {
    hlen = (size_t)le(buf + 8, 2);
    hstart = 10;
  } else if ((buf[6] == 2 || buf[6] == 3) && len >= 12) {
    hlen = (size_t)le(buf + 8, 4);
    hstart = 12;
  } else {
    at_seterr(err, errlen, "%s: unsupported .npy version %d.%d", path, buf[6], buf[7]);
    goto done;
  }
  if (hlen > len - hstart || hlen > 65536) {
    at_seterr(err, errlen, "%s: truncated header", path);
    goto done;
  }
  header = malloc(hlen + 1);
  if (!header) {
    at_seterr(err, errlen, "%s: out of memory", path);
    goto done;
  }
  memcpy(header, buf + hstart, hlen);
  header[hlen] = 0;

  const char *d = npy_field(header, "descr");
  int t = -1;
  if (d && *d == '\'') {
    for (size_t i = 0; i < sizeof npy_types / sizeof npy_types[0]; i++) {
      size_t l = strlen(npy_types[i].descr);
      if (strncmp(d + 1, npy_types[i].descr, l) == 0 && d[1 + l] == '\'') t = (int)i;
    }
    /* '|u1'-style byte order marks do not apply to these sizes; '=' is
     * native order, which is little-endian wherever this runs. */
    if (t < 0 && d[1] == '=')
      for (size_t i = 0; i < sizeof npy_types / sizeof npy_types[0]; i++) {
        size_t l = strlen(npy_types[i].descr);
        if (strncmp(d + 2, npy_types[i].descr + 1, l - 1) == 0 && d[1 + l] == '\'') t = (int)i;
      }
  }
  if (t < 0) {
    at_seterr(err, errlen, "%s: unsupported dtype %.12s (want <f4, <f8, <u2, <f2, <i4 or <i8)",
              path, d ? d : "(missing)");
    goto done;
  }
  npy_kind kind = npy_types[t].kind;
  size_t esize = npy_types[t].size;
  const char *fo = npy_field(header, "fortran_order");
  if (!fo || strncmp(fo, "False", 5) != 0) {
    at_seterr(err, errlen, "%s: only C order is supported (fortran_order must be False)", path);
    goto done;
  }
  const char *sp = npy_field(header, "shape");
  if (!sp || *sp != '(') {
    at_seterr(err, errlen, "%s: no shape in the header", path);
    goto done;
  }
  sp++;
  int64_t got[8];
  int gn = 0;
  for (;;) {
    while (*sp == ' ')
      sp++;
    if (*sp == ')') break;
    if (!isdigit((unsigned char)*sp) || gn == 8) {
      at_seterr(err, errlen, "%s: malformed shape in the header", path);
      goto done;
    }
    char *e;
    errno = 0;
    long long x = strtoll(sp, &e, 10);
    if (errno || x > NPY_MAX_DIM) {
      at_seterr(err, errlen, "%s: shape entry too large", path);
      goto done;
    }
    got[gn++] = x;
    sp = e;
    while (*sp == ' ')
      sp++;
    if (*sp == ',') sp++;
  }
  int same = gn == ndim;
  for (int i = 0; same && i < ndim; i++)
    same = got[i] == shape[i];
  if (!same) {
    char a[160] = "", b[160] = "";
    for (int i = 0; i < gn; i++)
      snprintf(a + strlen(a), sizeof a - strlen(a), "%s%lld", i ? ", " : "", (long long)got[i]);
    for (int i = 0; i < ndim; i++)
      snprintf(b + strlen(b), sizeof b - strlen(b), "%s%lld", i ? ", " : "", (long long)shape[i]);
    at_seterr(err, errlen, "%s: shape (%s) disagrees with case.json, which implies (%s)", path, a,
              b);
    goto done;
  }
  size_t dstart = hstart + hlen;
  if (len - dstart != (size_t)count * esize) {
    at_seterr(err, errlen, "%s: %zu data bytes, expected %lld (shape times %zu)", path,
              len - dstart, (long long)count * (long long)esize, esize);
    goto done;
  }
  int ok = (want == AT_NPY_F32 && (kind == NPY_F4 || kind == NPY_F8)) ||
           (want == AT_NPY_U16 && (kind == NPY_U2 || kind == NPY_F2)) ||
           (want == AT_NPY_I32 && (kind == NPY_I4 || kind == NPY_I8));
  if (!ok) {
    at_seterr(err, errlen, "%s: dtype %s does not fit here (expected %s)", path, npy_types[t].descr,
              want == AT_NPY_F32   ? "<f4"
              : want == AT_NPY_U16 ? "<u2"
                                   : "<i4");
    goto done;
  }
  size_t osize = want == AT_NPY_U16 ? 2 : 4;
  void *data = malloc(count ? (size_t)count * osize : 1);
  if (!data) {
    at_seterr(err, errlen, "%s: out of memory", path);
    goto done;
  }
  const unsigned char *src = buf + dstart;
  for (int64_t i = 0; i < count; i++) {
    uint64_t bits = le(src + (size_t)i * esize, esize);
    switch (kind) {
      case NPY_F4: {
        uint32_t u = (uint32_t)bits;
        float f;
        memcpy(&f, &u, 4);
        ((float *)data)[i] = f;
        break;
      }
      case NPY_F8: {
        double x;
        memcpy(&x, &bits, 8);
        ((float *)data)[i] = (float)x;
        break;
      }
      case NPY_U2:
      case NPY_F2:
        ((uint16_t *)data)[i] = (uint16_t)bits;
        break;
      case NPY_I4:
        ((int32_t *)data)[i] = (int32_t)(uint32_t)bits;
        break;
      case NPY_I8: {
        int64_t x = (int64_t)bits;
        if (x < INT32_MIN || x > INT32_MAX) {
          free(data);
          at_seterr(err, errlen, "%s: value %lld does not fit int32", path, (long long)x);
          goto done;
        }
        ((int32_t *)data)[i] = (int32_t)x;
        break;
      }
    }
  }
  *out = data;
  rc = 0;
done:
  free(header);
  free(buf);
  return rc;
}
