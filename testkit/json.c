/*
 * The JSON reader of the test kit (json.h). Recursive descent over the whole
 * document in memory; every step checks the end of the input first, so a
 * truncated or hand-edited file gives a sentence naming the byte.
 */
#include "json.h"

#include "file.h"

#include <ctype.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* case.json needs two levels; the bound keeps hostile input from exhausting the
 * stack. */
#define JSON_MAX_DEPTH 32

typedef struct jparser {
  const char *s, *end, *p;
  char *err;
  size_t errlen;
  int failed;
} jparser;

void at_json_free(at_json *v) {
  if (!v) return;
  for (int i = 0; i < v->n; i++) {
    at_json_free(v->items[i]);
    if (v->keys) free(v->keys[i]);
  }
  free(v->items);
  free(v->keys);
  free(v->str);
  free(v);
}

static at_json *jfail(jparser *jp, const char *what) {
  if (!jp->failed) at_seterr(jp->err, jp->errlen, "%s at byte %ld", what, (long)(jp->p - jp->s));
  jp->failed = 1;
  return NULL;
}

static void jskip(jparser *jp) {
  while (jp->p < jp->end && (*jp->p == ' ' || *jp->p == '\t' || *jp->p == '\n' || *jp->p == '\r'))
    jp->p++;
}

static int jappend(at_json *v, at_json *item, char *key) {
  if (v->n == v->cap) {
    int cap = v->cap ? v->cap * 2 : 8;
    at_json **items = realloc(v->items, (size_t)cap * sizeof *items);
    if (!items) return -1;
    v->items = items;
    if (v->type == AT_JSON_OBJ) {
      char **keys = realloc(v->keys, (size_t)cap * sizeof *keys);
      if (!keys) return -1;
      v->keys = keys;
    }
    v->cap = cap;
  }
  v->items[v->n] = item;
  if (v->type == AT_JSON_OBJ) v->keys[v->n] = key;
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

static at_json *jvalue(jparser *jp, int depth) {
  jskip(jp);
  if (depth > JSON_MAX_DEPTH) return jfail(jp, "nesting too deep");
  if (jp->p >= jp->end) return jfail(jp, "unexpected end of file");
  at_json *v = calloc(1, sizeof *v);
  if (!v) return jfail(jp, "out of memory");
  char c = *jp->p;
  if (c == '{' || c == '[') {
    char close = c == '{' ? '}' : ']';
    v->type = c == '{' ? AT_JSON_OBJ : AT_JSON_ARR;
    jp->p++;
    jskip(jp);
    if (jp->p < jp->end && *jp->p == close) {
      jp->p++;
      return v;
    }
    for (;;) {
      char *key = NULL;
      jskip(jp);
      if (v->type == AT_JSON_OBJ) {
        if (jp->p >= jp->end || *jp->p != '"') {
          at_json_free(v);
          return jfail(jp, "expected a key string");
        }
        jp->p++;
        key = jstring(jp);
        if (!key) {
          at_json_free(v);
          return NULL;
        }
        jskip(jp);
        if (jp->p >= jp->end || *jp->p != ':') {
          free(key);
          at_json_free(v);
          return jfail(jp, "expected ':'");
        }
        jp->p++;
      }
      at_json *item = jvalue(jp, depth + 1);
      if (!item || jappend(v, item, key) != 0) {
        at_json_free(item);
        free(key);
        at_json_free(v);
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
      const char *what = v->type == AT_JSON_OBJ ? "expected ',' or '}'" : "expected ',' or ']'";
      at_json_free(v);
      return jfail(jp, what);
    }
  }
  if (c == '"') {
    jp->p++;
    v->type = AT_JSON_STR;
    v->str = jstring(jp);
    if (!v->str) {
      at_json_free(v);
      return NULL;
    }
    return v;
  }
  static const struct {
    const char *word;
    at_json_type type;
    int b;
  } words[] = {{"true", AT_JSON_BOOL, 1}, {"false", AT_JSON_BOOL, 0}, {"null", AT_JSON_NULL, 0}};
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
    at_json_free(v);
    return jfail(jp, "bad value");
  }
  jp->p += n;
  v->type = AT_JSON_NUM;
  return v;
}

at_json *at_json_parse(const char *s, size_t len, char *err, size_t errlen) {
  jparser jp = {s, s + len, s, err, errlen, 0};
  at_json *v = jvalue(&jp, 0);
  if (!v) return NULL;
  jskip(&jp);
  if (jp.p != jp.end) {
    at_json_free(v);
    jfail(&jp, "trailing characters");
    return NULL;
  }
  return v;
}

const at_json *at_json_get(const at_json *obj, const char *key) {
  if (!obj || obj->type != AT_JSON_OBJ) return NULL;
  for (int i = 0; i < obj->n; i++)
    if (strcmp(obj->keys[i], key) == 0) return obj->items[i];
  return NULL;
}

int at_json_int(const at_json *v, int64_t lo, int64_t hi, int64_t *out) {
  if (!v || v->type != AT_JSON_NUM || !isfinite(v->num) || v->num != floor(v->num) ||
      v->num < (double)lo || v->num > (double)hi)
    return -1;
  *out = (int64_t)v->num;
  return 0;
}
