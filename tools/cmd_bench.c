/*
 * attn bench: a sweep of problems in one call (backends and their devices,
 * dtypes, head dims, masks, sequence lengths, the forward and backward
 * passes, and decoding steps over a KV cache), each made and timed as attn
 * run makes and times one (run_tensors.c, run_timing.c), written as a text
 * table, JSON lines or CSV: one row per problem and pass, in the schema
 * bench/peer.py, bench/plot.py and bench/table.py read.
 */
#define _POSIX_C_SOURCE 200809L /* gmtime_r, fileno, isatty */

#include "run.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* Entries of a list option; a sweep wider than this is several calls. */
#define BENCH_MAX_LIST 32
/* The bound of attn run's --repeat, for the same reason (the times array). */
#define BENCH_MAX_REPEAT 1000000
/* Bumped when a field changes meaning or goes; new fields keep it. */
#define BENCH_SCHEMA 1

typedef struct bench_mask {
  char name[32]; /* "none", "causal", "window:128" */
  int causal;
  int64_t window_left; /* -1: unbounded */
} bench_mask;

typedef enum { FORMAT_TEXT, FORMAT_JSON, FORMAT_CSV } bench_format;

typedef struct bench_opts {
  char backend_list[512]; /* the --backends value; empty: ATTN_BACKEND, else auto */
  attn_dtype dtypes[BENCH_MAX_LIST];
  int ndtypes; /* 0: f32 on a CPU device, bf16 on a GPU */
  int64_t dims[BENCH_MAX_LIST], seqlens[BENCH_MAX_LIST], decode_k[BENCH_MAX_LIST];
  int ndims, nseqlens, ndecode;
  int seqlens_given;
  bench_mask masks[BENCH_MAX_LIST];
  int nmasks;
  int fwd, bwd;
  int64_t batch, heads, heads_kv; /* 0: from tokens, from hidden, = heads */
  int64_t tokens, hidden;
  double budget_s;
  int64_t repeat;
  bench_format format;
  const char *output;
} bench_opts;

/* A backend of the sweep: its context and what it says of its device. */
typedef struct bench_dev {
  char spec[32]; /* "cuda:0", as ATTN_BACKEND names it */
  attn_context *ctx;
  attn_device_info info;
} bench_dev;

/* ---------------------------------------------------------------------- */
/* Options                                                                  */
/* ---------------------------------------------------------------------- */

static const char bench_help[] =
    "usage: attn bench [options]\n"
    "A sweep of attention problems in one call, each timed as attn run times one: one untimed\n"
    "call, then synchronous calls on device buffers, each on the host clock, until --repeat\n"
    "calls or --budget seconds; the median. One row per problem and pass.\n"
    "  --backends LIST     backends and devices as ATTN_BACKEND names them (cpu, opencl:1,\n"
    "                      cuda, ...), comma-separated, or all (every device present);\n"
    "                      default ATTN_BACKEND, else auto. --backend is the same option\n"
    "  --dtypes LIST       f32, f16, bf16 (default: f32 on a CPU device, bf16 on a GPU)\n"
    "  --dims LIST         head dimensions, 1 to 256 (64,128)\n"
    "  --seqlens LIST      sequence lengths, seqlen_q = seqlen_k (512,1024,2048,4096,8192,16384)\n"
    "  --masks LIST        none, causal (bottom-right aligned), window:L (causal with L keys\n"
    "                      before the diagonal) (none,causal)\n"
    "  --passes LIST       fwd, bwd (fwd,bwd)\n"
    "  --seqlen-k LIST     decoding rows too: one query row per sequence over a KV cache of\n"
    "                      each length, forward only, every mask (causal sees every key of\n"
    "                      a bottom-right-aligned row); alone, without --seqlens, only those\n"
    "  --tokens T          batch = max(1, T / seqlen_k) unless --batch is given (16384)\n"
    "  --hidden X          heads = max(1, X / head_dim) unless --heads is given (2048)\n"
    "  --batch B           a fixed batch for every row\n"
    "  --heads H           a fixed number of query heads for every row\n"
    "  --heads-kv H        key/value heads, dividing every row's heads (default: = heads)\n"
    "  --budget S          seconds of timed calls per row, after the untimed one; at least\n"
    "                      one call is timed (0.5)\n"
    "  --repeat R          timed calls per row at most, 1 to 1000000 (100)\n"
    "  --format F          text (the default), json (JSON lines, one object per row) or csv\n"
    "  --output FILE       write the rows there (default: stdout)\n"
    "On a terminal, stderr shows the row being timed (\"row 3/24: cuda:0 bf16 d=128 N=4096\n"
    "causal fwd\"), rewritten in place; elsewhere nothing.\n"
    "A row of json and csv: schema (1), tool (\"attn bench\"), impl (\"attn\"), impl_version,\n"
    "timestamp (UTC, when the row ended), backend (\"cuda:0\"), device (its name), device_kind\n"
    "(cpu, gpu), compute_units, timer (\"host\": synchronous calls on the host clock), dtype,\n"
    "d, mask, causal, window_left, window_right (-1 unbounded), seqlen_q, seqlen_k, batch,\n"
    "heads, heads_kv, pass (fwd, bwd), reps, median_ms, min_ms, flops (4 * heads * visible\n"
    "query-key pairs * d; bwd 2.5x), tflops, gflops, bytes (the least a call must move, as\n"
    "attn run counts them), gbps, error (null, or why the row has no times: its reps are\n"
    "then 0, its times and rates null).\n"
    "Exit status: 0 done, 1 a row failed while running (its error said, the others run),\n"
    "2 a wrong option or value, or a backend that cannot be had.\n";

/* The value of a list option, split at commas into at most BENCH_MAX_LIST
 * entries: copied into buf, pointers into it in item. Returns the count, or
 * -1 (said). */
static int split_list(const char *opt, const char *val, char *buf, size_t len,
                      char *item[BENCH_MAX_LIST]) {
  if (!val || !*val) return cli_complain("%s needs a value (a comma-separated list)", opt), -1;
  if (strlen(val) >= len) return cli_complain("%s: the list is too long", opt), -1;
  strcpy(buf, val);
  int n = 0;
  for (char *p = buf;; n++) {
    if (n == BENCH_MAX_LIST)
      return cli_complain("%s \"%s\" has more than %d entries", opt, val, BENCH_MAX_LIST), -1;
    item[n] = p;
    char *comma = strchr(p, ',');
    if (!comma) break;
    *comma = 0;
    p = comma + 1;
  }
  for (int i = 0; i <= n; i++)
    if (!*item[i]) return cli_complain("%s \"%s\" has an empty entry", opt, val), -1;
  return n + 1;
}

static int parse_int_list(const char *opt, const char *val, int64_t lo, int64_t hi, int64_t *out,
                          int *count) {
  char buf[1024], *item[BENCH_MAX_LIST];
  int n = split_list(opt, val, buf, sizeof buf, item);
  if (n < 0) return -1;
  for (int i = 0; i < n; i++)
    if (cli_parse_int(opt, item[i], lo, hi, &out[i])) return -1;
  *count = n;
  return 0;
}

static int parse_masks(const char *opt, const char *val, bench_opts *o) {
  char buf[1024], *item[BENCH_MAX_LIST];
  int n = split_list(opt, val, buf, sizeof buf, item);
  if (n < 0) return -1;
  for (int i = 0; i < n; i++) {
    bench_mask *m = &o->masks[i];
    m->causal = 0;
    m->window_left = -1;
    if (!strcmp(item[i], "none")) {
    } else if (!strcmp(item[i], "causal")) {
      m->causal = 1;
    } else if (!strncmp(item[i], "window:", 7)) {
      m->causal = 1;
      if (cli_parse_int("--masks window:L", item[i] + 7, 0, INT32_MAX, &m->window_left)) return -1;
    } else {
      return cli_complain("%s \"%s\" is not none, causal or window:L", opt, item[i]), -1;
    }
    snprintf(m->name, sizeof m->name, "%s", item[i]);
  }
  o->nmasks = n;
  return 0;
}

static int parse_passes(const char *opt, const char *val, bench_opts *o) {
  char buf[256], *item[BENCH_MAX_LIST];
  int n = split_list(opt, val, buf, sizeof buf, item);
  if (n < 0) return -1;
  o->fwd = o->bwd = 0;
  for (int i = 0; i < n; i++) {
    if (!strcmp(item[i], "fwd"))
      o->fwd = 1;
    else if (!strcmp(item[i], "bwd"))
      o->bwd = 1;
    else
      return cli_complain("%s \"%s\" is not fwd or bwd", opt, item[i]), -1;
  }
  return 0;
}

/* Seconds: finite, from 0 to an hour. */
static int parse_seconds(const char *opt, const char *s, double *out) {
  if (!s) return cli_complain("%s needs a value (seconds)", opt), -1;
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  if (!*s || *end || s[0] == ' ' || !isfinite(v) || v < 0 || v > 3600)
    return cli_complain("%s \"%s\" is not a number of seconds from 0 to 3600", opt, s), -1;
  *out = v;
  return 0;
}

/* The heads of a row of head dimension d. */
static int64_t heads_of(const bench_opts *o, int64_t d) {
  if (o->heads) return o->heads;
  return o->hidden / d > 1 ? o->hidden / d : 1;
}

static int64_t heads_kv_of(const bench_opts *o, int64_t d) {
  return o->heads_kv ? o->heads_kv : heads_of(o, d);
}

/* The batch of a row whose sequences have nk keys. */
static int64_t batch_of(const bench_opts *o, int64_t nk) {
  if (o->batch) return o->batch;
  return o->tokens / nk > 1 ? o->tokens / nk : 1;
}

/* Returns 1 for --help, -1 on error (said), else 0. */
static int bench_parse(int argc, char **argv, bench_opts *o) {
  /* Every option but --help takes a value. */
  for (int i = 1; i < argc; i += 2) {
    const char *a = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
    int r = 0;
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) return 1;
    if (!strcmp(a, "--backends") || !strcmp(a, "--backend")) {
      if (!val || !*val)
        return cli_complain("%s needs a value (all, or a list of auto, cpu, opencl, cuda[:N])", a),
               -1;
      if (strlen(val) >= sizeof o->backend_list)
        return cli_complain("%s: the list is too long", a), -1;
      char buf[sizeof o->backend_list], *item[BENCH_MAX_LIST];
      if (split_list(a, val, buf, sizeof buf, item) < 0) return -1;
      strcpy(o->backend_list, val);
    } else if (!strcmp(a, "--dtypes")) {
      char buf[256], *item[BENCH_MAX_LIST];
      int n = split_list(a, val, buf, sizeof buf, item);
      if (n < 0) return -1;
      for (int k = 0; k < n; k++)
        if (cli_parse_dtype(a, item[k], &o->dtypes[k])) return -1;
      o->ndtypes = n;
    } else if (!strcmp(a, "--dims")) {
      r = parse_int_list(a, val, 1, ATTN_MAX_HEAD_DIM, o->dims, &o->ndims);
    } else if (!strcmp(a, "--seqlens")) {
      r = parse_int_list(a, val, 1, INT32_MAX, o->seqlens, &o->nseqlens);
      o->seqlens_given = 1;
    } else if (!strcmp(a, "--seqlen-k")) {
      r = parse_int_list(a, val, 1, INT32_MAX, o->decode_k, &o->ndecode);
    } else if (!strcmp(a, "--masks")) {
      r = parse_masks(a, val, o);
    } else if (!strcmp(a, "--passes")) {
      r = parse_passes(a, val, o);
    } else if (!strcmp(a, "--tokens")) {
      r = cli_parse_int(a, val, 1, INT32_MAX, &o->tokens);
    } else if (!strcmp(a, "--hidden")) {
      r = cli_parse_int(a, val, 1, INT32_MAX, &o->hidden);
    } else if (!strcmp(a, "--batch")) {
      r = cli_parse_int(a, val, 1, INT32_MAX, &o->batch);
    } else if (!strcmp(a, "--heads")) {
      r = cli_parse_int(a, val, 1, INT32_MAX, &o->heads);
    } else if (!strcmp(a, "--heads-kv")) {
      r = cli_parse_int(a, val, 1, INT32_MAX, &o->heads_kv);
    } else if (!strcmp(a, "--budget")) {
      r = parse_seconds(a, val, &o->budget_s);
    } else if (!strcmp(a, "--repeat")) {
      r = cli_parse_int(a, val, 1, BENCH_MAX_REPEAT, &o->repeat);
    } else if (!strcmp(a, "--format")) {
      if (!val) return cli_complain("--format needs a value (text, json or csv)"), -1;
      if (!strcmp(val, "text"))
        o->format = FORMAT_TEXT;
      else if (!strcmp(val, "json"))
        o->format = FORMAT_JSON;
      else if (!strcmp(val, "csv"))
        o->format = FORMAT_CSV;
      else
        return cli_complain("--format \"%s\" is not text, json or csv", val), -1;
    } else if (!strcmp(a, "--output")) {
      if (!val || !*val) return cli_complain("--output needs a file name"), -1;
      o->output = val;
    } else {
      return cli_complain("unknown option \"%s\" (see attn bench --help)", a), -1;
    }
    if (r) return -1;
  }
  /* --seqlen-k alone asks for decoding rows alone. */
  if (o->ndecode && !o->seqlens_given) o->nseqlens = 0;
  if (o->ndecode && !o->fwd)
    return cli_complain("--seqlen-k makes forward rows, but --passes has no fwd"), -1;
  for (int i = 0; i < o->ndims; i++) {
    int64_t h = heads_of(o, o->dims[i]), hkv = heads_kv_of(o, o->dims[i]);
    if (hkv > h || h % hkv)
      return cli_complain("--heads-kv %lld does not divide the %lld heads of head dim %lld%s",
                          (long long)hkv, (long long)h, (long long)o->dims[i],
                          o->heads ? "" : " (--hidden / d)"),
             -1;
  }
  return 0;
}

static void bench_defaults(bench_opts *o) {
  memset(o, 0, sizeof *o);
  static const int64_t dims[] = {64, 128}, seqlens[] = {512, 1024, 2048, 4096, 8192, 16384};
  memcpy(o->dims, dims, sizeof dims);
  o->ndims = 2;
  memcpy(o->seqlens, seqlens, sizeof seqlens);
  o->nseqlens = 6;
  parse_masks("--masks", "none,causal", o);
  o->fwd = o->bwd = 1;
  /* bench/'s problems: B * N = 16384 tokens, H * d = 2048, the FlashAttention
   * papers' sweep. */
  o->tokens = 16384;
  o->hidden = 2048;
  o->budget_s = 0.5;
  o->repeat = 100;
}

/* ---------------------------------------------------------------------- */
/* Backends                                                                 */
/* ---------------------------------------------------------------------- */

/* Appends a context for spec (NULL: ATTN_BACKEND, else auto). Returns 0, or
 * the exit status (said). */
static int add_dev(bench_dev *devs, int *n, const char *spec) {
  if (*n == BENCH_MAX_LIST) return cli_complain("--backends: more than %d devices", BENCH_MAX_LIST);
  bench_dev *d = &devs[*n];
  int rc = attn_context_create(spec, &d->ctx);
  if (rc) {
    char what[64];
    snprintf(what, sizeof what, "backend \"%.40s\"", spec ? spec : "(ATTN_BACKEND, else auto)");
    int r = cli_fail_ctx(d->ctx, rc, what);
    attn_context_free(d->ctx);
    d->ctx = NULL;
    return r;
  }
  attn_context_device_info(d->ctx, &d->info);
  snprintf(d->spec, sizeof d->spec, "%s:%d", attn_backend_name(d->info.backend), d->info.index);
  (*n)++;
  return 0;
}

/* The contexts of the sweep, made before any row runs, so that a backend
 * that cannot be had is said before anything is timed. */
static int open_devs(const bench_opts *o, bench_dev *devs, int *n) {
  *n = 0;
  if (!o->backend_list[0]) return add_dev(devs, n, NULL);
  char buf[sizeof o->backend_list], *item[BENCH_MAX_LIST];
  int count = split_list("--backends", o->backend_list, buf, sizeof buf, item);
  for (int i = 0; i < count; i++) {
    if (strcmp(item[i], "all") != 0) {
      int r = add_dev(devs, n, item[i]);
      if (r) return r;
      continue;
    }
    const attn_backend kinds[] = {ATTN_BACKEND_CUDA, ATTN_BACKEND_OPENCL, ATTN_BACKEND_CPU};
    for (int k = 0; k < 3; k++) {
      int ndev = attn_backend_compiled(kinds[k]) ? attn_device_count(kinds[k]) : 0;
      for (int j = 0; j < ndev; j++) {
        char spec[32];
        snprintf(spec, sizeof spec, "%s:%d", attn_backend_name(kinds[k]), j);
        int r = add_dev(devs, n, spec);
        if (r) return r;
      }
    }
  }
  return 0;
}

static int ndtypes_of(const bench_opts *o) {
  return o->ndtypes ? o->ndtypes : 1;
}

static attn_dtype dtype_of(const bench_opts *o, const bench_dev *d, int i) {
  if (o->ndtypes) return o->dtypes[i];
  return d->info.is_gpu ? ATTN_BF16 : ATTN_F32;
}

/* ---------------------------------------------------------------------- */
/* Rows                                                                     */
/* ---------------------------------------------------------------------- */

/* A problem of the sweep. */
typedef struct bench_problem {
  const bench_dev *dev;
  attn_dtype dtype;
  int64_t d;
  const bench_mask *mask;
  int64_t nq, nk, batch, heads, heads_kv;
} bench_problem;

/* One field of a row: its key, and its value as JSON writes it. */
typedef struct bench_field {
  const char *key;
  char val[200];
  int is_str; /* a string (quoted in JSON, and in CSV where it must be) */
  int is_null;
} bench_field;

enum { BENCH_MAX_FIELDS = 40 };

typedef struct bench_row {
  bench_field f[BENCH_MAX_FIELDS];
  int n;
  double median_ms, gflops, gbps; /* for the text table; NaN without times */
} bench_row;

static void put(bench_row *r, const char *key, int is_str, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 4, 5)))
#endif
    ;

static void put(bench_row *r, const char *key, int is_str, const char *fmt, ...) {
  bench_field *f = &r->f[r->n++];
  f->key = key;
  f->is_str = is_str;
  f->is_null = 0;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(f->val, sizeof f->val, fmt, ap);
  va_end(ap);
}

static void put_null(bench_row *r, const char *key) {
  bench_field *f = &r->f[r->n++];
  f->key = key;
  f->val[0] = 0;
  f->is_str = 0;
  f->is_null = 1;
}

/* A number, or null where the row has no times. */
static void put_num(bench_row *r, const char *key, double v) {
  if (isfinite(v))
    put(r, key, 0, "%.6g", v);
  else
    put_null(r, key);
}

static const char *field(const bench_row *r, const char *key) {
  for (int i = 0; i < r->n; i++)
    if (!strcmp(r->f[i].key, key)) return r->f[i].is_null ? "-" : r->f[i].val;
  return "";
}

/* The row of a problem's pass: times t (n of them, sorted), or the error. */
static void make_row(bench_row *r, const bench_problem *p, const char *pass, const double *t,
                     size_t n, double flops, double bytes, const char *error) {
  const attn_device_info *info = &p->dev->info;
  char stamp[32];
  time_t now = time(NULL);
  struct tm tm;
  gmtime_r(&now, &tm);
  strftime(stamp, sizeof stamp, "%Y-%m-%dT%H:%M:%SZ", &tm);
  double med = n && !error ? t[n / 2] : NAN, lo = n && !error ? t[0] : NAN;
  r->n = 0;
  r->median_ms = med * 1e3;
  r->gflops = flops / med * 1e-9;
  r->gbps = bytes / med * 1e-9;
  put(r, "schema", 0, "%d", BENCH_SCHEMA);
  put(r, "tool", 1, "attn bench");
  put(r, "impl", 1, "attn");
  put(r, "impl_version", 1, "%s", ATTN_VERSION_STRING);
  put(r, "timestamp", 1, "%s", stamp);
  put(r, "backend", 1, "%s", p->dev->spec);
  put(r, "device", 1, "%s", info->name);
  put(r, "device_kind", 1, "%s", info->is_gpu ? "gpu" : "cpu");
  put(r, "compute_units", 0, "%d", info->compute_units);
  put(r, "timer", 1, "host");
  put(r, "dtype", 1, "%s", attn_dtype_name(p->dtype));
  put(r, "d", 0, "%lld", (long long)p->d);
  put(r, "mask", 1, "%s", p->mask->name);
  put(r, "causal", 0, "%s", p->mask->causal ? "true" : "false");
  put(r, "window_left", 0, "%lld", (long long)p->mask->window_left);
  put(r, "window_right", 0, "%d", p->mask->causal ? 0 : -1);
  put(r, "seqlen_q", 0, "%lld", (long long)p->nq);
  put(r, "seqlen_k", 0, "%lld", (long long)p->nk);
  put(r, "batch", 0, "%lld", (long long)p->batch);
  put(r, "heads", 0, "%lld", (long long)p->heads);
  put(r, "heads_kv", 0, "%lld", (long long)p->heads_kv);
  put(r, "pass", 1, "%s", pass);
  put(r, "reps", 0, "%zu", error ? (size_t)0 : n);
  put_num(r, "median_ms", med * 1e3);
  put_num(r, "min_ms", lo * 1e3);
  put(r, "flops", 0, "%.15g", flops);
  put_num(r, "tflops", flops / med * 1e-12);
  put_num(r, "gflops", flops / med * 1e-9);
  put(r, "bytes", 0, "%.15g", bytes);
  put_num(r, "gbps", bytes / med * 1e-9);
  if (error)
    put(r, "error", 1, "%s", error);
  else
    put_null(r, "error");
}

/* s as a JSON string's contents: quotes, backslashes and control
 * characters escaped. */
static void json_string(FILE *f, const char *s) {
  for (; *s; s++) {
    unsigned char c = (unsigned char)*s;
    if (c == '"' || c == '\\')
      fprintf(f, "\\%c", c);
    else if (c < 0x20)
      fprintf(f, "\\u%04x", c);
    else
      fputc(c, f);
  }
}

/* s as a CSV field (RFC 4180): quoted where it holds a comma, a quote or a
 * line break, its quotes doubled. */
static void csv_string(FILE *f, const char *s) {
  if (!strpbrk(s, ",\"\r\n")) {
    fputs(s, f);
    return;
  }
  fputc('"', f);
  for (; *s; s++) {
    if (*s == '"') fputc('"', f);
    fputc(*s, f);
  }
  fputc('"', f);
}

static const char text_header[] =
    "backend   dtype    d  mask          seqlen_q  seqlen_k  batch  heads   kv  pass    "
    "median_ms     GFLOP/s      GB/s   reps\n";

/* A number of the text table, "-" without times. */
static const char *text_num(double v, const char *fmt, char *buf, size_t len) {
  if (!isfinite(v)) return "-";
  snprintf(buf, len, fmt, v);
  return buf;
}

static void write_row(FILE *f, bench_format fmt, const bench_row *r, int first) {
  if (fmt == FORMAT_JSON) {
    fputc('{', f);
    for (int i = 0; i < r->n; i++) {
      fprintf(f, "%s\"%s\":", i ? "," : "", r->f[i].key);
      if (r->f[i].is_null) {
        fputs("null", f);
      } else if (r->f[i].is_str) {
        fputc('"', f);
        json_string(f, r->f[i].val);
        fputc('"', f);
      } else {
        fputs(r->f[i].val, f);
      }
    }
    fputs("}\n", f);
  } else if (fmt == FORMAT_CSV) {
    if (first)
      for (int i = 0; i < r->n; i++)
        fprintf(f, "%s%s", r->f[i].key, i + 1 < r->n ? "," : "\n");
    for (int i = 0; i < r->n; i++) {
      csv_string(f, r->f[i].val);
      fputs(i + 1 < r->n ? "," : "\n", f);
    }
  } else {
    char ms[32], gf[32], gb[32];
    fprintf(f, "%-9s %-5s %4s  %-12s %9s %9s %6s %6s %4s  %-4s %12s %11s %9s %6s",
            field(r, "backend"), field(r, "dtype"), field(r, "d"), field(r, "mask"),
            field(r, "seqlen_q"), field(r, "seqlen_k"), field(r, "batch"), field(r, "heads"),
            field(r, "heads_kv"), field(r, "pass"), text_num(r->median_ms, "%.4f", ms, sizeof ms),
            text_num(r->gflops, "%.1f", gf, sizeof gf), text_num(r->gbps, "%.1f", gb, sizeof gb),
            field(r, "reps"));
    const char *err = field(r, "error");
    if (strcmp(err, "-") != 0) fprintf(f, "  error: %s", err);
    fputc('\n', f);
  }
  fflush(f);
}

/* ---------------------------------------------------------------------- */
/* Running                                                                  */
/* ---------------------------------------------------------------------- */

typedef struct bench_state {
  const bench_opts *o;
  FILE *out;
  run_progress pg;
  int row, rows; /* the row being timed (from 1), and their count */
  int written;   /* rows written */
  int failed;    /* rows that failed */
  double *times; /* o->repeat entries */
  int out_tty;   /* the rows go to a terminal */
} bench_state;

static void describe(const bench_problem *p, const char *pass, char *buf, size_t len) {
  if (p->nq == p->nk)
    snprintf(buf, len, "%.31s %s d=%lld N=%lld %.31s %.7s", p->dev->spec, attn_dtype_name(p->dtype),
             (long long)p->d, (long long)p->nq, p->mask->name, pass);
  else
    snprintf(buf, len, "%.31s %s d=%lld Nq=%lld Nk=%lld %.31s %.7s (decoding)", p->dev->spec,
             attn_dtype_name(p->dtype), (long long)p->d, (long long)p->nq, (long long)p->nk,
             p->mask->name, pass);
}

/* Says which row is being timed, on a terminal only: in a log, the rows
 * themselves say how far the sweep has come. */
static void show_row(bench_state *s, const bench_problem *p, const char *pass) {
  s->row++;
  if (!s->pg.tty) return;
  char what[256];
  describe(p, pass, what, sizeof what);
  run_progress_show(&s->pg, "row %d/%d: %s", s->row, s->rows, what);
}

static void emit(bench_state *s, const bench_problem *p, const char *pass, size_t n, double flops,
                 double bytes, const char *error) {
  bench_row r;
  make_row(&r, p, pass, s->times, n, flops, bytes, error);
  /* A progress line on the terminal the rows go to: cleared first. */
  if (s->out_tty) run_progress_clear(&s->pg);
  if (error) {
    char what[256];
    describe(p, pass, what, sizeof what);
    run_progress_clear(&s->pg);
    cli_complain("row %d (%s): %s", s->row, what, error);
    s->failed++;
  }
  if (s->o->format == FORMAT_TEXT && s->written == 0) fputs(text_header, s->out);
  write_row(s->out, s->o->format, &r, s->written == 0);
  s->written++;
}

/* The sentence of a failed call. */
static void call_error(const bench_problem *p, int rc, const char *what, char *buf, size_t len) {
  snprintf(buf, len, "%s: %s (%s)", what, attn_errmsg(p->dev->ctx), attn_status_name(rc));
}

/* One problem: its tensors made once, then each pass timed, one row each. */
static void run_one(bench_state *s, const bench_problem *p, int fwd, int bwd) {
  const bench_opts *bo = s->o;
  run_opts o;
  run_defaults(&o);
  o.dtype = p->dtype;
  o.batch = p->batch;
  o.nq = p->nq;
  o.nk = p->nk;
  o.hq = p->heads;
  o.hkv = p->heads_kv;
  o.d = p->d;
  o.backward = bwd;
  o.check = 0;
  if (p->mask->causal) o.params.flags |= ATTN_CAUSAL;
  /* As attn run's options: a window wider than the keys sees them all. */
  o.params.window_left = p->mask->window_left > p->nk ? p->nk : p->mask->window_left;

  run_cache c;
  run_tensors t;
  memset(&t, 0, sizeof t);
  char error[512] = "";
  double flops_f = 0, bytes_f = 0, bytes_b = 0;
  if (run_cache_make(&o, &c)) {
    snprintf(error, sizeof error, "out of host memory");
  } else {
    flops_f = 4.0 * (double)o.hq * run_pairs(&o, c.lens) * (double)o.d;
    bytes_f = run_bytes_forward(&o, &c);
    bytes_b = run_bytes_backward(&o);
    if (run_fits(&o, &p->dev->info, 0, error, sizeof error) == 0) {
      int rc = run_tensors_make(p->dev->ctx, &o, &c, &t);
      if (rc == ATTN_ENOMEM && !attn_errmsg(p->dev->ctx)[0])
        snprintf(error, sizeof error, "out of host memory");
      else if (rc)
        call_error(p, rc, "cannot allocate the tensors", error, sizeof error);
    }
  }
  run_pass call = {p->dev->ctx, &o.params, &t};
  size_t n = 0;
  if (fwd) {
    show_row(s, p, "fwd");
    if (!error[0]) {
      int rc = run_time_calls(run_forward, &call, (size_t)bo->repeat, bo->budget_s, s->times, &n);
      if (rc) call_error(p, rc, "forward failed", error, sizeof error);
    }
    emit(s, p, "fwd", n, flops_f, bytes_f, error[0] ? error : NULL);
  }
  if (bwd) {
    show_row(s, p, "bwd");
    n = 0;
    /* The backward reads the forward's o and lse. */
    if (!error[0] && !fwd) {
      int rc = run_forward(&call);
      if (rc) call_error(p, rc, "forward failed", error, sizeof error);
    }
    if (!error[0]) {
      int rc = run_time_calls(run_backward, &call, (size_t)bo->repeat, bo->budget_s, s->times, &n);
      if (rc) call_error(p, rc, "backward failed", error, sizeof error);
    }
    emit(s, p, "bwd", n, 2.5 * flops_f, bytes_b, error[0] ? error : NULL);
  }
  run_tensors_free(&t);
  run_cache_free(&c);
}

static int count_rows(const bench_opts *o, int ndevs) {
  int per_mask = o->nseqlens * (o->fwd + o->bwd) + o->ndecode;
  return ndevs * ndtypes_of(o) * o->ndims * o->nmasks * per_mask;
}

static void sweep(bench_state *s, const bench_dev *devs, int ndevs) {
  const bench_opts *o = s->o;
  for (int b = 0; b < ndevs; b++)
    for (int t = 0; t < ndtypes_of(o); t++)
      for (int di = 0; di < o->ndims; di++)
        for (int m = 0; m < o->nmasks; m++) {
          bench_problem p = {&devs[b],
                             dtype_of(o, &devs[b], t),
                             o->dims[di],
                             &o->masks[m],
                             0,
                             0,
                             0,
                             heads_of(o, o->dims[di]),
                             heads_kv_of(o, o->dims[di])};
          for (int i = 0; i < o->nseqlens; i++) {
            p.nq = p.nk = o->seqlens[i];
            p.batch = batch_of(o, p.nk);
            run_one(s, &p, o->fwd, o->bwd);
          }
          for (int i = 0; i < o->ndecode; i++) {
            p.nq = 1;
            p.nk = o->decode_k[i];
            p.batch = batch_of(o, p.nk);
            run_one(s, &p, 1, 0);
          }
        }
}

int cmd_bench(int argc, char **argv) {
  bench_opts o;
  bench_defaults(&o);
  int rc = bench_parse(argc, argv, &o);
  if (rc > 0) return fputs(bench_help, stdout), 0;
  if (rc < 0) return EXIT_USAGE;

  bench_dev devs[BENCH_MAX_LIST];
  int ndevs = 0, status = open_devs(&o, devs, &ndevs);
  bench_state s;
  memset(&s, 0, sizeof s);
  s.o = &o;
  s.out = stdout;
  if (!status && o.output && !(s.out = fopen(o.output, "w"))) {
    status = cli_complain("--output \"%s\": %s", o.output, strerror(errno));
    s.out = stdout;
  }
  if (!status && !(s.times = malloc(sizeof *s.times * (size_t)o.repeat)))
    status = cli_out_of_host_memory();
  if (!status) {
    s.rows = count_rows(&o, ndevs);
    s.out_tty = isatty(fileno(s.out));
    run_progress_start(&s.pg);
    if (o.format == FORMAT_TEXT) {
      fprintf(s.out, "attn bench %s\n", ATTN_VERSION_STRING);
      for (int i = 0; i < ndevs; i++)
        fprintf(s.out, "  %-9s %s (%s, %d units)\n", devs[i].spec, devs[i].info.name,
                devs[i].info.is_gpu ? "gpu" : "cpu", devs[i].info.compute_units);
      fflush(s.out);
    }
    sweep(&s, devs, ndevs);
    run_progress_clear(&s.pg);
    if (s.failed) status = EXIT_FAILED;
  }
  if (s.out != stdout && fclose(s.out) && !status) {
    cli_complain("--output \"%s\": %s", o.output, strerror(errno));
    status = EXIT_FAILED;
  }
  free(s.times);
  for (int i = 0; i < ndevs; i++)
    attn_context_free(devs[i].ctx);
  return status;
}
