/*
 * Golden cases: a folder of .npy files and a case.json computed in float64
 * (see the golden README). This file reads them with two small parsers of its
 * own, a JSON reader and a .npy v1/v2 reader, both written to refuse malformed
 * input with a sentence rather than crash, and checks the library against the
 * README's tolerance rule.
 */
#define _POSIX_C_SOURCE 200809L /* opendir, strdup */

#include "golden.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* The inputs are produced by attn's own tooling, but a hand-edited or
 * truncated file must give a message, not undefined behaviour: every size is
 * bounded before it is multiplied. */
#define GOLDEN_MAX_JSON_BYTES (1 << 20)
#define GOLDEN_MAX_JSON_DEPTH 32
#define GOLDEN_MAX_DIM ((int64_t)1 << 31)
#define GOLDEN_MAX_ELEMS ((int64_t)1 << 34)

static void seterr(char *err, size_t errlen, const char *fmt, ...) {
  if (!err || errlen == 0) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, errlen, fmt, ap);
  va_end(ap);
}

/* ---------------------------------------------------------------------- */
/* JSON                                                                     */
/* ---------------------------------------------------------------------- */

typedef enum { J_NULL, J_BOOL, J_NUM, J_STR, J_ARR, J_OBJ } jtype;

typedef struct jval {
  jtype type;
  int boolean;
  double num;
  char *str;           /* J_STR */
  struct jval **items; /* J_ARR, J_OBJ (values) */
  char **keys;         /* J_OBJ */
  int n, cap;
} jval;

typedef struct jparser {
  const char *s, *end, *p;
  char *err;
  size_t errlen;
  int failed;
} jparser;

static void jfree(jval *v) {
  if (!v) return;
  for (int i = 0; i < v->n; i++) {
    jfree(v->items[i]);
    if (v->keys) free(v->keys[i]);
  }
  free(v->items);
  free(v->keys);
  free(v->str);
  free(v);
}

static jval *jfail(jparser *jp, const char *what) {
  if (!jp->failed)
    seterr(jp->err, jp->errlen, "case.json: %s at byte %ld", what, (long)(jp->p - jp->s));
  jp->failed = 1;
  return NULL;
}

static void jskip(jparser *jp) {
  while (jp->p < jp->end && (*jp->p == ' ' || *jp->p == '\t' || *jp->p == '\n' || *jp->p == '\r'))
    jp->p++;
}

static int jappend(jval *v, jval *item, char *key) {
  if (v->n == v->cap) {
    int cap = v->cap ? v->cap * 2 : 8;
    jval **items = realloc(v->items, (size_t)cap * sizeof *items);
    if (!items) return -1;
    v->items = items;
    if (v->type == J_OBJ) {
      char **keys = realloc(v->keys, (size_t)cap * sizeof *keys);
      if (!keys) return -1;
      v->keys = keys;
    }
    v->cap = cap;
  }
  v->items[v->n] = item;
  if (v->type == J_OBJ) v->keys[v->n] = key;
  v->n++;
  return 0;
}

/* A string body after the opening quote; escapes beyond ASCII become '?',
 * which is enough for names and layouts. */
static char *jstring(jparser *jp) {
  size_t cap = 16, n = 0;
  char *out = malloc(cap);
  if (!out) return (char *)jfail(jp, "out of memory");
  for (;;) {
    if (jp->p >= jp->end) {
      free(out);
      return (char *)jfail(jp, "unterminated string");
    }
    char c = *jp->p++;
    if (c == '"') break;
    if ((unsigned char)c < 0x20) {
      free(out);
      return (char *)jfail(jp, "control character in string");
    }
    if (c == '\\') {
      if (jp->p >= jp->end) {
        free(out);
        return (char *)jfail(jp, "unterminated escape");
      }
      char e = *jp->p++;
      switch (e) {
        case '"':
          c = '"';
          break;
        case '\\':
          c = '\\';
          break;
        case '/':
          c = '/';
          break;
        case 'b':
          c = '\b';
          break;
        case 'f':
          c = '\f';
          break;
        case 'n':
          c = '\n';
          break;
        case 'r':
          c = '\r';
          break;
        case 't':
          c = '\t';
          break;
        case 'u':
          if (jp->end - jp->p < 4 || !isxdigit((unsigned char)jp->p[0]) ||
              !isxdigit((unsigned char)jp->p[1]) || !isxdigit((unsigned char)jp->p[2]) ||
              !isxdigit((unsigned char)jp->p[3])) {
            free(out);
            return (char *)jfail(jp, "bad \\u escape");
          }
          {
            unsigned u =
                (unsigned)strtoul((char[5]){jp->p[0], jp->p[1], jp->p[2], jp->p[3], 0}, NULL, 16);
            c = u < 0x80 && u > 0 ? (char)u : '?';
          }
          jp->p += 4;
          break;
        default:
          free(out);
          return (char *)jfail(jp, "bad escape");
      }
    }
    if (n + 2 > cap) {
      cap *= 2;
      char *o2 = realloc(out, cap);
      if (!o2) {
        free(out);
        return (char *)jfail(jp, "out of memory");
      }
      out = o2;
    }
    out[n++] = c;
  }
  out[n] = 0;
  return out;
}

static jval *jvalue(jparser *jp, int depth) {
  jskip(jp);
  if (depth > GOLDEN_MAX_JSON_DEPTH) return jfail(jp, "nesting too deep");
  if (jp->p >= jp->end) return jfail(jp, "unexpected end of file");
  jval *v = calloc(1, sizeof *v);
  if (!v) return jfail(jp, "out of memory");
  char c = *jp->p;
  if (c == '{' || c == '[') {
    char close = c == '{' ? '}' : ']';
    v->type = c == '{' ? J_OBJ : J_ARR;
    jp->p++;
    jskip(jp);
    if (jp->p < jp->end && *jp->p == close) {
      jp->p++;
      return v;
    }
    for (;;) {
      char *key = NULL;
      jskip(jp);
      if (v->type == J_OBJ) {
        if (jp->p >= jp->end || *jp->p != '"') {
          jfree(v);
          return jfail(jp, "expected a key string");
        }
        jp->p++;
        key = jstring(jp);
        if (!key) {
          jfree(v);
          return NULL;
        }
        jskip(jp);
        if (jp->p >= jp->end || *jp->p != ':') {
          free(key);
          jfree(v);
          return jfail(jp, "expected ':'");
        }
        jp->p++;
      }
      jval *item = jvalue(jp, depth + 1);
      if (!item || jappend(v, item, key) != 0) {
        jfree(item);
        free(key);
        jfree(v);
        return jfail(jp, "out of memory");
      }
      jskip(jp);
      if (jp->p < jp->end && *jp->p == ',') {
        jp->p++;
        continue;
      }
      if (jp->p < jp->end && *jp->p == close) {
        jp->p++;
        return v;
      }
      const char *what = v->type == J_OBJ ? "expected ',' or '}'" : "expected ',' or ']'";
      jfree(v);
      return jfail(jp, what);
    }
  }
  if (c == '"') {
    jp->p++;
    v->type = J_STR;
    v->str = jstring(jp);
    if (!v->str) {
      jfree(v);
      return NULL;
    }
    return v;
  }
  static const struct {
    const char *word;
    jtype type;
    int b;
  } words[] = {{"true", J_BOOL, 1}, {"false", J_BOOL, 0}, {"null", J_NULL, 0}};
  for (size_t i = 0; i < sizeof words / sizeof words[0]; i++) {
    size_t len = strlen(words[i].word);
    if ((size_t)(jp->end - jp->p) >= len && memcmp(jp->p, words[i].word, len) == 0) {
      jp->p += len;
      v->type = words[i].type;
      v->boolean = words[i].b;
      return v;
    }
  }
  /* Numbers, plus NaN/Infinity, which Python's json module writes. */
  char buf[64];
  size_t n = 0;
  while (
      jp->p + n < jp->end && n + 1 < sizeof buf &&
      (isalnum((unsigned char)jp->p[n]) || jp->p[n] == '-' || jp->p[n] == '+' || jp->p[n] == '.')) {
    buf[n] = jp->p[n];
    n++;
  }
  buf[n] = 0;
  char *endp = NULL;
  if (n > 0) {
    if (strcmp(buf, "NaN") == 0) {
      v->num = NAN;
      endp = buf + n;
    } else if (strcmp(buf, "Infinity") == 0) {
      v->num = INFINITY;
      endp = buf + n;
    } else if (strcmp(buf, "-Infinity") == 0) {
      v->num = -INFINITY;
      endp = buf + n;
    } else if (isdigit((unsigned char)buf[0]) || buf[0] == '-') {
      v->num = strtod(buf, &endp);
    }
  }
  if (!endp || endp != buf + n) {
    jfree(v);
    return jfail(jp, "bad value");
  }
  jp->p += n;
  v->type = J_NUM;
  return v;
}

static jval *jparse(const char *s, size_t len, char *err, size_t errlen) {
  jparser jp = {s, s + len, s, err, errlen, 0};
  jval *v = jvalue(&jp, 0);
  if (!v) return NULL;
  jskip(&jp);
  if (jp.p != jp.end) {
    jfree(v);
    jfail(&jp, "trailing characters");
    return NULL;
  }
  if (v->type != J_OBJ) {
    jfree(v);
    seterr(err, errlen, "case.json: the top level is not an object");
    return NULL;
  }
  return v;
}

static const jval *jget(const jval *obj, const char *key) {
  if (!obj || obj->type != J_OBJ) return NULL;
  for (int i = 0; i < obj->n; i++)
    if (strcmp(obj->keys[i], key) == 0) return obj->items[i];
  return NULL;
}

/* An integer-valued number in [lo, hi]. */
static int jint(const jval *v, int64_t lo, int64_t hi, int64_t *out) {
  if (!v || v->type != J_NUM || !isfinite(v->num) || v->num != floor(v->num) ||
      v->num < (double)lo || v->num > (double)hi)
    return -1;
  *out = (int64_t)v->num;
  return 0;
}

/* ---------------------------------------------------------------------- */
/* Files                                                                    */
/* ---------------------------------------------------------------------- */

/* Why read_file failed, from its errno. */
static const char *unreadable(int e) {
  if (e == EFBIG) return "file much larger than its expected shape";
  if (e == EINVAL) return "not a regular file";
  return strerror(e);
}

/* Reads a whole file; NULL with errno set on failure. A missing file leaves
 * errno == ENOENT so optional files can be told apart from broken ones. */
static unsigned char *read_file(const char *path, size_t max, size_t *len) {
  /* Opened without blocking and checked before reading: a FIFO under a case
   * file's name would otherwise hang the open, and a directory fail late. */
  int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return NULL;
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    errno = EINVAL; /* told apart by unreadable() */
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

/* ---------------------------------------------------------------------- */
/* .npy                                                                     */
/* ---------------------------------------------------------------------- */

typedef enum { NPY_F4, NPY_F8, NPY_U2, NPY_F2, NPY_I4, NPY_I8 } npy_kind;

static const struct {
  const char *descr;
  npy_kind kind;
  size_t size;
} npy_types[] = {{"<f4", NPY_F4, 4}, {"<f8", NPY_F8, 8}, {"<u2", NPY_U2, 2},
                 {"<f2", NPY_F2, 2}, {"<i4", NPY_I4, 4}, {"<i8", NPY_I8, 8}};

/* What the caller wants the data as. */
typedef enum { WANT_F32, WANT_U16, WANT_I32 } npy_want;

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

/* Loads dir/name.npy with the expected shape, converting to `want`. *out is
 * NULL and 0 returned when the file does not exist and optional is set. */
static int npy_load(const char *dir, const char *name, int optional, npy_want want, int ndim,
                    const int64_t *shape, void **out, char *err, size_t errlen) {
  char path[1200];
  *out = NULL;
  snprintf(path, sizeof path, "%s/%s.npy", dir, name);
  int64_t count = 1;
  for (int i = 0; i < ndim; i++)
    count *= shape[i]; /* bounded by the caller */
  size_t len = 0;
  unsigned char *buf = read_file(path, (size_t)count * 8 + 65536 + 16, &len);
  if (!buf) {
    if (errno == ENOENT && optional) return 0;
    seterr(err, errlen, "%s: %s", path, unreadable(errno));
    return -1;
  }
  int rc = -1;
  char *header = NULL;
  if (len < 10 || memcmp(buf, "\x93NUMPY", 6) != 0) {
    seterr(err, errlen, "%s: not a .npy file (bad magic)", path);
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
    seterr(err, errlen, "%s: unsupported .npy version %d.%d", path, buf[6], buf[7]);
    goto done;
  }
  if (hlen > len - hstart || hlen > 65536) {
    seterr(err, errlen, "%s: truncated header", path);
    goto done;
  }
  header = malloc(hlen + 1);
  if (!header) {
    seterr(err, errlen, "%s: out of memory", path);
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
    seterr(err, errlen, "%s: unsupported dtype %.12s (want <f4, <f8, <u2, <f2, <i4 or <i8)", path,
           d ? d : "(missing)");
    goto done;
  }
  npy_kind kind = npy_types[t].kind;
  size_t esize = npy_types[t].size;
  const char *fo = npy_field(header, "fortran_order");
  if (!fo || strncmp(fo, "False", 5) != 0) {
    seterr(err, errlen, "%s: only C order is supported (fortran_order must be False)", path);
    goto done;
  }
  const char *sp = npy_field(header, "shape");
  if (!sp || *sp != '(') {
    seterr(err, errlen, "%s: no shape in the header", path);
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
      seterr(err, errlen, "%s: malformed shape in the header", path);
      goto done;
    }
    char *e;
    errno = 0;
    long long x = strtoll(sp, &e, 10);
    if (errno || x > GOLDEN_MAX_DIM) {
      seterr(err, errlen, "%s: shape entry too large", path);
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
    seterr(err, errlen, "%s: shape (%s) disagrees with case.json, which implies (%s)", path, a, b);
    goto done;
  }
  size_t dstart = hstart + hlen;
  if (len - dstart != (size_t)count * esize) {
    seterr(err, errlen, "%s: %zu data bytes, expected %lld (shape times %zu)", path, len - dstart,
           (long long)count * (long long)esize, esize);
    goto done;
  }
  int ok = (want == WANT_F32 && (kind == NPY_F4 || kind == NPY_F8)) ||
           (want == WANT_U16 && (kind == NPY_U2 || kind == NPY_F2)) ||
           (want == WANT_I32 && (kind == NPY_I4 || kind == NPY_I8));
  if (!ok) {
    seterr(err, errlen, "%s: dtype %s does not fit here (expected %s)", path, npy_types[t].descr,
           want == WANT_F32   ? "<f4"
           : want == WANT_U16 ? "<u2"
                              : "<i4");
    goto done;
  }
  size_t osize = want == WANT_U16 ? 2 : 4;
  void *data = malloc(count ? (size_t)count * osize : 1);
  if (!data) {
    seterr(err, errlen, "%s: out of memory", path);
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
          seterr(err, errlen, "%s: value %lld does not fit int32", path, (long long)x);
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

/* ---------------------------------------------------------------------- */
/* Loading a case                                                           */
/* ---------------------------------------------------------------------- */

static int load_cu(const jval *root, const char *key, int64_t batch, int32_t **out, char *err,
                   size_t errlen) {
  const jval *a = jget(root, key);
  if (!a || a->type != J_ARR || a->n != batch + 1) {
    seterr(err, errlen, "case.json: %s must be an array of batch + 1 = %lld integers", key,
           (long long)(batch + 1));
    return -1;
  }
  int32_t *cu = malloc((size_t)a->n * sizeof *cu);
  if (!cu) {
    seterr(err, errlen, "case.json: out of memory");
    return -1;
  }
  for (int i = 0; i < a->n; i++) {
    int64_t x;
    if (jint(a->items[i], 0, INT32_MAX, &x) != 0 || (i == 0 && x != 0) ||
        (i > 0 && x < cu[i - 1])) {
      seterr(err, errlen,
             "case.json: %s[%d] must be a non-negative integer, 0 first, never decreasing", key, i);
      free(cu);
      return -1;
    }
    cu[i] = (int32_t)x;
  }
  *out = cu;
  return 0;
}

static double peer_of(const jval *peer, const char *key) {
  const jval *v = jget(peer, key);
  return v && v->type == J_NUM && isfinite(v->num) && v->num >= 0 ? v->num : NAN;
}

int attn_golden_load(const char *dir, attn_golden *g, char *err, size_t errlen) {
  memset(g, 0, sizeof *g);
  g->peer_o = g->peer_lse = g->peer_dq = g->peer_dk = g->peer_dv = NAN;
  if (!dir || !*dir) {
    seterr(err, errlen, "no case folder given");
    return -1;
  }
  if (strlen(dir) >= sizeof g->dir) {
    seterr(err, errlen, "%s: path too long", dir);
    return -1;
  }
  snprintf(g->dir, sizeof g->dir, "%s", dir);
  size_t dl = strlen(g->dir);
  while (dl > 1 && g->dir[dl - 1] == '/')
    g->dir[--dl] = 0;
  const char *base = strrchr(g->dir, '/');
  base = base ? base + 1 : g->dir;
  size_t bl = strlen(base) < sizeof g->name - 1 ? strlen(base) : sizeof g->name - 1;
  memcpy(g->name, base, bl);
  g->name[bl] = 0;

  char path[1200];
  snprintf(path, sizeof path, "%s/case.json", g->dir);
  size_t len = 0;
  char *text = (char *)read_file(path, GOLDEN_MAX_JSON_BYTES, &len);
  if (!text) {
    seterr(err, errlen, "%s: %s", path, unreadable(errno));
    return -1;
  }
  char jerr[256] = "";
  jval *root = jparse(text, len, jerr, sizeof jerr);
  free(text);
  if (!root) {
    seterr(err, errlen, "%s: %s", g->dir, jerr);
    return -1;
  }

  int rc = -1;
  const jval *v;
#define FAIL(...)                     \
  do {                                \
    seterr(err, errlen, __VA_ARGS__); \
    goto fail;                        \
  } while (0)

  v = jget(root, "layout");
  if (!v || v->type != J_STR || (strcmp(v->str, "bshd") != 0 && strcmp(v->str, "varlen") != 0))
    FAIL("%s/case.json: layout must be \"bshd\" or \"varlen\"", g->dir);
  g->varlen = strcmp(v->str, "varlen") == 0;

  v = jget(root, "dtype");
  if (!v || v->type != J_STR) FAIL("%s/case.json: dtype must be a string", g->dir);
  if (strcmp(v->str, "f32") == 0)
    g->dtype = ATTN_F32;
  else if (strcmp(v->str, "f16") == 0)
    g->dtype = ATTN_F16;
  else if (strcmp(v->str, "bf16") == 0)
    g->dtype = ATTN_BF16;
  else
    FAIL("%s/case.json: dtype \"%s\" is not f32, f16 or bf16", g->dir, v->str);

  if (jint(jget(root, "batch"), 1, GOLDEN_MAX_DIM, &g->batch) != 0)
    FAIL("%s/case.json: batch must be a positive integer", g->dir);
  if (jint(jget(root, "heads_q"), 1, 65536, &g->heads_q) != 0)
    FAIL("%s/case.json: heads_q must be a positive integer", g->dir);
  if (jint(jget(root, "heads_kv"), 1, 65536, &g->heads_kv) != 0)
    FAIL("%s/case.json: heads_kv must be a positive integer", g->dir);
  if (g->heads_q % g->heads_kv != 0)
    FAIL("%s/case.json: heads_q %lld is not a multiple of heads_kv %lld", g->dir,
         (long long)g->heads_q, (long long)g->heads_kv);
  if (jint(jget(root, "head_dim"), 1, 65536, &g->head_dim) != 0)
    FAIL("%s/case.json: head_dim must be a positive integer", g->dir);

  attn_params_init(&g->params);
  if (g->varlen) {
    if (load_cu(root, "cu_seqlens_q", g->batch, &g->cu_q_, err, errlen) != 0 ||
        load_cu(root, "cu_seqlens_k", g->batch, &g->cu_k_, err, errlen) != 0)
      goto fail;
    g->total_q = g->cu_q_[g->batch];
    g->total_k = g->cu_k_[g->batch];
    g->params.cu_seqlens_q = g->cu_q_;
    g->params.cu_seqlens_k = g->cu_k_;
    g->params.batch = g->batch;
  } else {
    if (jint(jget(root, "seqlen_q"), 1, GOLDEN_MAX_DIM, &g->seqlen_q) != 0 ||
        jint(jget(root, "seqlen_k"), 1, GOLDEN_MAX_DIM, &g->seqlen_k) != 0)
      FAIL("%s/case.json: seqlen_q and seqlen_k must be positive integers for layout bshd", g->dir);
    g->total_q = g->batch * g->seqlen_q;
    g->total_k = g->batch * g->seqlen_k;
  }
  if ((double)g->total_q * (double)g->heads_q * (double)g->head_dim > (double)GOLDEN_MAX_ELEMS ||
      (double)g->total_k * (double)g->heads_kv * (double)g->head_dim > (double)GOLDEN_MAX_ELEMS)
    FAIL("%s/case.json: the tensors would be too large", g->dir);

  v = jget(root, "scale");
  if (!v || v->type != J_NUM || !isfinite(v->num) || v->num < 0)
    FAIL("%s/case.json: scale must be a finite non-negative number", g->dir);
  g->params.scale = v->num;

  v = jget(root, "causal");
  if (!v || v->type != J_BOOL) FAIL("%s/case.json: causal must be true or false", g->dir);
  if (v->boolean) g->params.flags |= ATTN_CAUSAL;

  v = jget(root, "window");
  if (v && v->type != J_NULL) {
    if (v->type != J_ARR || v->n != 2 ||
        jint(v->items[0], -1, INT64_MAX / 2, &g->params.window_left) != 0 ||
        jint(v->items[1], -1, INT64_MAX / 2, &g->params.window_right) != 0)
      FAIL("%s/case.json: window must be [left, right], integers >= -1", g->dir);
  }

  v = jget(root, "softcap");
  if (v && v->type != J_NULL) {
    if (v->type != J_NUM || !isfinite(v->num) || v->num < 0)
      FAIL("%s/case.json: softcap must be a finite non-negative number", g->dir);
    g->params.softcap = v->num;
  }

  v = jget(root, "alibi_slopes");
  if (v && v->type != J_NULL) {
    if (v->type != J_ARR || v->n != g->heads_q)
      FAIL("%s/case.json: alibi_slopes must be null or an array of heads_q = %lld numbers", g->dir,
           (long long)g->heads_q);
    g->alibi_ = malloc((size_t)v->n * sizeof *g->alibi_);
    if (!g->alibi_) FAIL("%s: out of memory", g->dir);
    for (int i = 0; i < v->n; i++) {
      if (v->items[i]->type != J_NUM || !isfinite(v->items[i]->num))
        FAIL("%s/case.json: alibi_slopes[%d] is not a finite number", g->dir, i);
      g->alibi_[i] = (float)v->items[i]->num;
    }
    g->params.alibi_slopes = g->alibi_;
    g->params.alibi_count = v->n;
  }

  const jval *peer = jget(root, "peer_max_err");
  if (peer && peer->type == J_OBJ) {
    g->peer_o = peer_of(peer, "o");
    g->peer_lse = peer_of(peer, "lse");
    g->peer_dq = peer_of(peer, "dq");
    g->peer_dk = peer_of(peer, "dk");
    g->peer_dv = peer_of(peer, "dv");
  }

  {
    int64_t B = g->batch, Hq = g->heads_q, Hkv = g->heads_kv, d = g->head_dim;
    int64_t qs[4], ks[4], ls[3];
    int nd = g->varlen ? 3 : 4;
    if (g->varlen) {
      int64_t a[3] = {g->total_q, Hq, d}, b[3] = {g->total_k, Hkv, d}, c[2] = {Hq, g->total_q};
      memcpy(qs, a, sizeof a);
      memcpy(ks, b, sizeof b);
      memcpy(ls, c, sizeof c);
    } else {
      int64_t a[4] = {B, g->seqlen_q, Hq, d}, b[4] = {B, g->seqlen_k, Hkv, d},
              c[3] = {B, Hq, g->seqlen_q};
      memcpy(qs, a, sizeof a);
      memcpy(ks, b, sizeof b);
      memcpy(ls, c, sizeof c);
    }
    npy_want in = g->dtype == ATTN_F32 ? WANT_F32 : WANT_U16;
    if (npy_load(g->dir, "q", 0, in, nd, qs, &g->q, err, errlen) != 0 ||
        npy_load(g->dir, "k", 0, in, nd, ks, &g->k, err, errlen) != 0 ||
        npy_load(g->dir, "v", 0, in, nd, ks, &g->v, err, errlen) != 0 ||
        npy_load(g->dir, "o", 0, WANT_F32, nd, qs, (void **)&g->o, err, errlen) != 0 ||
        npy_load(g->dir, "lse", 0, WANT_F32, nd - 1, ls, (void **)&g->lse, err, errlen) != 0 ||
        npy_load(g->dir, "do", 1, in, nd, qs, &g->dout, err, errlen) != 0 ||
        npy_load(g->dir, "dq", 1, WANT_F32, nd, qs, (void **)&g->dq, err, errlen) != 0 ||
        npy_load(g->dir, "dk", 1, WANT_F32, nd, ks, (void **)&g->dk, err, errlen) != 0 ||
        npy_load(g->dir, "dv", 1, WANT_F32, nd, ks, (void **)&g->dv, err, errlen) != 0)
      goto fail;
    /* A backward check needs the upstream gradient and all three answers. */
    if (!g->dout || !g->dq || !g->dk || !g->dv) {
      free(g->dout);
      free(g->dq);
      free(g->dk);
      free(g->dv);
      g->dout = NULL;
      g->dq = g->dk = g->dv = NULL;
    }
  }
  rc = 0;
#undef FAIL
fail:
  jfree(root);
  if (rc != 0) {
    char keep[1024];
    snprintf(keep, sizeof keep, "%s", g->dir);
    attn_golden_free(g);
    snprintf(g->dir, sizeof g->dir, "%s", keep);
  }
  return rc;
}

void attn_golden_free(attn_golden *g) {
  if (!g) return;
  free(g->q);
  free(g->k);
  free(g->v);
  free(g->dout);
  free(g->o);
  free(g->lse);
  free(g->dq);
  free(g->dk);
  free(g->dv);
  free(g->alibi_);
  free(g->cu_q_);
  free(g->cu_k_);
  memset(g, 0, sizeof *g);
  g->peer_o = g->peer_lse = g->peer_dq = g->peer_dk = g->peer_dv = NAN;
}

/* ---------------------------------------------------------------------- */
/* Listing                                                                  */
/* ---------------------------------------------------------------------- */

static int has_case(const char *dir) {
  char path[4200];
  struct stat st;
  int n = snprintf(path, sizeof path, "%s/case.json", dir);
  if (n < 0 || (size_t)n >= sizeof path) return 0;
  return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

static int cmp_str(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

int attn_golden_list(const char *root, char ***dirs, char *err, size_t errlen) {
  *dirs = NULL;
  if (!root || !*root) {
    seterr(err, errlen, "no golden folder given");
    return -1;
  }
  if (strlen(root) > 2048) {
    seterr(err, errlen, "%s: path too long", root);
    return -1;
  }
  if (has_case(root)) {
    char **one = malloc(sizeof *one);
    if (!one || !(one[0] = strdup(root))) {
      free(one);
      seterr(err, errlen, "out of memory");
      return -1;
    }
    *dirs = one;
    return 1;
  }
  DIR *dp = opendir(root);
  if (!dp) {
    seterr(err, errlen, "%s: %s", root, strerror(errno));
    return -1;
  }
  char **list = NULL;
  int n = 0, cap = 0;
  struct dirent *de;
  while ((de = readdir(dp)) != NULL) {
    if (de->d_name[0] == '.') continue;
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", root, de->d_name);
    if (!has_case(path)) continue;
    if (n == cap) {
      cap = cap ? cap * 2 : 32;
      char **l2 = realloc(list, (size_t)cap * sizeof *l2);
      if (!l2) goto oom;
      list = l2;
    }
    if (!(list[n] = strdup(path))) goto oom;
    n++;
  }
  closedir(dp);
  /* Every path shares the root prefix, so sorting paths sorts names. */
  if (n > 1) qsort(list, (size_t)n, sizeof *list, cmp_str);
  *dirs = list;
  return n;
oom:
  closedir(dp);
  attn_golden_list_free(list, n);
  seterr(err, errlen, "out of memory");
  return -1;
}

void attn_golden_list_free(char **dirs, int n) {
  if (!dirs) return;
  for (int i = 0; i < n; i++)
    free(dirs[i]);
  free(dirs);
}

/* ---------------------------------------------------------------------- */
/* Running and checking                                                     */
/* ---------------------------------------------------------------------- */

/* IEEE half to float, exactly (every half is a float). */
static float f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h >> 15) << 31, e = (h >> 10) & 0x1f, m = h & 0x3ff, u;
  if (e == 0x1f) {
    u = sign | 0x7f800000u | (m << 13);
  } else if (e != 0) {
    u = sign | ((e + 112) << 23) | (m << 13);
  } else if (m == 0) {
    u = sign;
  } else {
    float f = ldexpf((float)m, -24);
    return sign ? -f : f;
  }
  float f;
  memcpy(&f, &u, 4);
  return f;
}

static float to_f32(const void *data, attn_dtype dt, int64_t i) {
  uint16_t h;
  switch (dt) {
    case ATTN_F16:
      memcpy(&h, (const char *)data + 2 * i, 2);
      return f16_to_f32(h);
    case ATTN_BF16: {
      memcpy(&h, (const char *)data + 2 * i, 2);
      uint32_t u = (uint32_t)h << 16;
      float f;
      memcpy(&f, &u, 4);
      return f;
    }
    default:
      return ((const float *)data)[i];
  }
}

/* What the README allows for one output. Without a peer figure, lse is held
 * to float32 arithmetic on exact inputs (the README's rule for f16/bf16);
 * any other output falls back to a per-dtype relative bound. */
static double bound_for(const char *out, attn_dtype dt, double peer, double maxref) {
  double F = out[0] == 'd' ? 3.0 : 2.0, scale = maxref > 1 ? maxref : 1;
  if (!isnan(peer)) return F * peer + 1e-6 * scale;
  if (strcmp(out, "lse") == 0) return 1e-5 * scale;
  return (dt == ATTN_F32 ? 1e-5 : dt == ATTN_F16 ? 1e-2 : 2e-2) * scale;
}

/* Compares x (n elements of dtype dt) with ref. empty, when given, marks the
 * elements that belong to a row with no visible key: those must be exactly
 * zero (o, dq) and a -inf reference must be matched exactly (lse). */
static void compare(attn_golden_result *r, const char *out, const void *x, attn_dtype dt,
                    const float *ref, int64_t n, const unsigned char *empty, attn_dtype case_dt,
                    double peer) {
  double err = 0, maxref = 0;
  for (int64_t i = 0; i < n; i++) {
    double want = ref[i], got = to_f32(x, dt, i);
    if (isnan(got)) {
      err = INFINITY;
      continue;
    }
    if (empty && empty[i] && got != 0.0) {
      err = INFINITY;
      continue;
    }
    if (isinf(want)) {
      if (got != want) err = INFINITY;
      continue;
    }
    if (isnan(want)) continue;
    if (fabs(want) > maxref) maxref = fabs(want);
    double e = fabs(got - want);
    if (!(e <= err)) err = e;
  }
  r->output = out;
  r->max_err = err;
  r->bound = bound_for(out, case_dt, peer, maxref);
  r->ratio = isnan(peer) ? NAN : peer > 0 ? err / ((out[0] == 'd' ? 3.0 : 2.0) * peer) : NAN;
  r->pass = err <= r->bound;
}

static void fail_report(attn_golden_report *rep, int status, const char *prefix, const char *msg) {
  rep->status = status;
  snprintf(rep->message, sizeof rep->message, "%s%s", prefix, msg ? msg : "");
  rep->pass = 0;
}

int attn_golden_run(attn_context *ctx, const attn_golden *g, int forward_only,
                    attn_golden_report *rep) {
  memset(rep, 0, sizeof *rep);
  rep->status = ATTN_OK;
  const attn_dtype dt = g->dtype;
  const int64_t Hq = g->heads_q, Hkv = g->heads_kv, d = g->head_dim;
  const int64_t nq = g->total_q * Hq * d, nk = g->total_k * Hkv * d, nl = g->total_q * Hq;
  const size_t es = attn_dtype_size(dt);

  attn_tensor q, k, v, o, lse, dout, dq, dk, dv;
  void *obuf = malloc((size_t)nq * es + 1), *dqb = NULL, *dkb = NULL, *dvb = NULL;
  /* lse in the (hi, lo) form, which keeps f32 gradients exact at large
   * logits; hi is compared as the lse. */
  float *lbuf = malloc((size_t)nl * 2 * sizeof(float) + 1);
  float *lhi = malloc((size_t)nl * sizeof(float) + 1);
  unsigned char *empty_o = malloc((size_t)nq + 1), *empty_l = malloc((size_t)nl + 1);
  if (!obuf || !lbuf || !lhi || !empty_o || !empty_l) {
    fail_report(rep, ATTN_ENOMEM, "", "out of memory allocating the outputs");
    goto done;
  }
  /* All-ones bytes are NaN in every dtype: an element the library never
   * writes cannot pass. */
  memset(obuf, 0xff, (size_t)nq * es);
  memset(lbuf, 0xff, (size_t)nl * 2 * sizeof(float));

  if (g->varlen) {
    q = attn_tensor_varlen(g->q, dt, g->total_q, Hq, d);
    k = attn_tensor_varlen(g->k, dt, g->total_k, Hkv, d);
    v = attn_tensor_varlen(g->v, dt, g->total_k, Hkv, d);
    o = attn_tensor_varlen(obuf, dt, g->total_q, Hq, d);
    lse = attn_tensor_lse_hilo(lbuf, 0, Hq, g->total_q);
  } else {
    q = attn_tensor_bshd(g->q, dt, g->batch, g->seqlen_q, Hq, d);
    k = attn_tensor_bshd(g->k, dt, g->batch, g->seqlen_k, Hkv, d);
    v = attn_tensor_bshd(g->v, dt, g->batch, g->seqlen_k, Hkv, d);
    o = attn_tensor_bshd(obuf, dt, g->batch, g->seqlen_q, Hq, d);
    lse = attn_tensor_lse_hilo(lbuf, g->batch, Hq, g->seqlen_q);
  }

  /* Which (row, head) pairs see no key, from the reference lse; the o and dq
   * masks are the same per element of the row. */
  for (int64_t r = 0; r < g->total_q; r++)
    for (int64_t h = 0; h < Hq; h++) {
      int64_t li = g->varlen ? h * g->total_q + r
                             : ((r / g->seqlen_q) * Hq + h) * g->seqlen_q + r % g->seqlen_q;
      unsigned char e = isinf(g->lse[li]) && g->lse[li] < 0;
      empty_l[li] = e;
      memset(empty_o + (r * Hq + h) * d, e, (size_t)d);
    }

  int st = attn_forward(ctx, &g->params, &q, &k, &v, &o, &lse);
  if (st != ATTN_OK) {
    fail_report(rep, st, "forward: ", attn_errmsg(ctx));
    goto done;
  }
  compare(&rep->r[0], "o", obuf, dt, g->o, nq, empty_o, dt, g->peer_o);
  for (int64_t i = 0; i < nl; i++)
    lhi[i] = lbuf[2 * i];
  compare(&rep->r[1], "lse", lhi, ATTN_F32, g->lse, nl, NULL, dt, g->peer_lse);
  rep->n = 2;

  if (!forward_only && g->dout) {
    dqb = malloc((size_t)nq * es + 1);
    dkb = malloc((size_t)nk * es + 1);
    dvb = malloc((size_t)nk * es + 1);
    if (!dqb || !dkb || !dvb) {
      fail_report(rep, ATTN_ENOMEM, "", "out of memory allocating the gradients");
      goto done;
    }
    memset(dqb, 0xff, (size_t)nq * es);
    memset(dkb, 0xff, (size_t)nk * es);
    memset(dvb, 0xff, (size_t)nk * es);
    if (g->varlen) {
      dout = attn_tensor_varlen(g->dout, dt, g->total_q, Hq, d);
      dq = attn_tensor_varlen(dqb, dt, g->total_q, Hq, d);
      dk = attn_tensor_varlen(dkb, dt, g->total_k, Hkv, d);
      dv = attn_tensor_varlen(dvb, dt, g->total_k, Hkv, d);
    } else {
      dout = attn_tensor_bshd(g->dout, dt, g->batch, g->seqlen_q, Hq, d);
      dq = attn_tensor_bshd(dqb, dt, g->batch, g->seqlen_q, Hq, d);
      dk = attn_tensor_bshd(dkb, dt, g->batch, g->seqlen_k, Hkv, d);
      dv = attn_tensor_bshd(dvb, dt, g->batch, g->seqlen_k, Hkv, d);
    }
    /* The backward pass takes the library's own forward outputs, as training
     * does. */
    st = attn_backward(ctx, &g->params, &q, &k, &v, &o, &lse, &dout, &dq, &dk, &dv);
    if (st != ATTN_OK) {
      fail_report(rep, st, "backward: ", attn_errmsg(ctx));
      goto done;
    }
    compare(&rep->r[2], "dq", dqb, dt, g->dq, nq, empty_o, dt, g->peer_dq);
    compare(&rep->r[3], "dk", dkb, dt, g->dk, nk, NULL, dt, g->peer_dk);
    compare(&rep->r[4], "dv", dvb, dt, g->dv, nk, NULL, dt, g->peer_dv);
    rep->n = 5;
  }
  rep->pass = 1;
  for (int i = 0; i < rep->n; i++)
    rep->pass &= rep->r[i].pass;

done:
  free(obuf);
  free(lbuf);
  free(lhi);
  free(empty_o);
  free(empty_l);
  free(dqb);
  free(dkb);
  free(dvb);
  return rep->status;
}
