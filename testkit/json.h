/*
 * A small JSON reader for the golden cases' case.json: a whole document into
 * a tree, refusing malformed input with a sentence rather than crashing.
 * Besides standard JSON it reads NaN, Infinity and -Infinity, which Python's
 * json module writes.
 */
#ifndef AT_JSON_H
#define AT_JSON_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
  AT_JSON_NULL,
  AT_JSON_BOOL,
  AT_JSON_NUM,
  AT_JSON_STR,
  AT_JSON_ARR,
  AT_JSON_OBJ
} at_json_type;

typedef struct at_json {
  at_json_type type;
  int boolean;            /* AT_JSON_BOOL */
  double num;             /* AT_JSON_NUM */
  char *str;              /* AT_JSON_STR; escapes beyond ASCII read as '?' */
  struct at_json **items; /* AT_JSON_ARR, AT_JSON_OBJ (the values) */
  char **keys;            /* AT_JSON_OBJ */
  int n, cap;
} at_json;

/* Parses len bytes of s as one JSON value. NULL on malformed input, with a
 * sentence in err ("bad value at byte 12"). at_json_free the result. */
at_json *at_json_parse(const char *s, size_t len, char *err, size_t errlen);
void at_json_free(at_json *v);

/* The value of key in an object; NULL when obj is not an object or lacks it. */
const at_json *at_json_get(const at_json *obj, const char *key);

/* 0 and *out when v is an integer-valued number in [lo, hi], else -1. */
int at_json_int(const at_json *v, int64_t lo, int64_t hi, int64_t *out);

#ifdef __cplusplus
}
#endif
#endif /* AT_JSON_H */
