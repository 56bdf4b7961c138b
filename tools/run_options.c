/*
 * The options of attn run and attn vit: every value parsed whole, range
 * checked, and refused with a sentence naming the option.
 */
#include "run.h"

#include <ctype.h>
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Whether s is an integer as written by a person: an optional sign (when
 * sign is set), then decimal digits and nothing else. strtoll and strtoull
 * alone would skip leading blanks, stop quietly at "12abc", and strtoull
 * would turn "-1" into 2^64 - 1. */
static int integer_syntax(const char *s, int sign) {
  if (sign && (*s == '-' || *s == '+')) s++;
  if (!*s) return 0;
  for (; *s; s++)
    if (!isdigit((unsigned char)*s)) return 0;
  return 1;
}

int cli_parse_int(const char *opt, const char *s, int64_t lo, int64_t hi, int64_t *out) {
  if (!s) return cli_complain("%s needs a value", opt), -1;
  if (!integer_syntax(s, 1)) return cli_complain("%s \"%s\" is not an integer", opt, s), -1;
  errno = 0;
  long long v = strtoll(s, NULL, 10);
  if (errno == ERANGE || v < lo || v > hi) {
    if (hi == INT64_MAX)
      cli_complain("%s %s is out of range: it must be at least %lld%s", opt, s, (long long)lo,
                   errno == ERANGE && v > 0 ? " and fit in 64 bits" : "");
    else
      cli_complain("%s %s is out of range: it must be %lld to %lld", opt, s, (long long)lo,
                   (long long)hi);
    return -1;
  }
  *out = v;
  return 0;
}

int cli_parse_dtype(const char *opt, const char *s, attn_dtype *out) {
  if (!s) return cli_complain("%s needs a value (f32, f16 or bf16)", opt), -1;
  if (!strcmp(s, "f32"))
    *out = ATTN_F32;
  else if (!strcmp(s, "f16"))
    *out = ATTN_F16;
  else if (!strcmp(s, "bf16"))
    *out = ATTN_BF16;
  else
    return cli_complain("%s \"%s\" is not f32, f16 or bf16", opt, s), -1;
  return 0;
}

/* --seed: any 64-bit value, all of which give different inputs. */
static int parse_u64(const char *opt, const char *s, uint64_t *out) {
  if (!s) return cli_complain("%s needs a value", opt), -1;
  if (!integer_syntax(s, 0))
    return cli_complain("%s \"%s\" is not an integer from 0 to %llu", opt, s,
                        (unsigned long long)UINT64_MAX),
           -1;
  errno = 0;
  unsigned long long v = strtoull(s, NULL, 10);
  if (errno == ERANGE)
    return cli_complain("%s %s is out of range: it must be 0 to %llu", opt, s,
                        (unsigned long long)UINT64_MAX),
           -1;
  *out = v;
  return 0;
}

/* A scale or softcap: finite, not negative, and a float32 once given to the
 * kernels, so neither above FLT_MAX nor so small that it rounds to 0. */
static int parse_scalar(const char *opt, const char *s, double *out) {
  if (!s) return cli_complain("%s needs a value", opt), -1;
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  if (!*s || isspace((unsigned char)*s) || *end || !isfinite(v))
    return cli_complain("%s \"%s\" is not a finite number", opt, s), -1;
  if (v < 0 || v > FLT_MAX || (v > 0 && (float)v == 0.0f))
    return cli_complain("%s %s is out of range: it must be 0 or from %g to %g (a float32)", opt, s,
                        (double)FLT_TRUE_MIN, (double)FLT_MAX),
           -1;
  *out = v;
  return 0;
}

/* "--window L,R": two integers, each -1 (unbounded) or more. */
static int parse_window(const char *opt, const char *s, int64_t *l, int64_t *r) {
  if (!s) return cli_complain("%s needs a value L,R (e.g. 128,0; -1 = unbounded)", opt), -1;
  const char *comma = strchr(s, ',');
  char left[64];
  if (!comma || (size_t)(comma - s) >= sizeof left)
    return cli_complain("%s \"%s\" is not L,R (e.g. 128,0; -1 = unbounded)", opt, s), -1;
  memcpy(left, s, (size_t)(comma - s));
  left[comma - s] = 0;
  if (cli_parse_int("--window L", left, -1, INT64_MAX, l)) return -1;
  return cli_parse_int("--window R", comma + 1, -1, INT64_MAX, r);
}

const char run_help[] =
    "usage: attn run [options]\n"
    "A random problem on the selected backend: median time of --repeat calls, GFLOP/s\n"
    "(4 * heads * visible query-key pairs * head_dim; backward 2.5x that), GB/s (the bytes\n"
    "a call must move at the least: the K and V rows some query row sees, each once, q, o,\n"
    "lse, the bias entries of visible pairs, appended rows read and written; backward: every\n"
    "input read and every gradient written once), and the error against the double-precision\n"
    "reference when the problem is small enough (its progress goes to stderr when it takes\n"
    "more than a second), held to the golden README's tolerance rule without a peer figure:\n"
    "max|err| <= 1e-5 (f32), 1e-2 (f16), 2e-2 (bf16) times max(1, max|ref|); lse 1e-5;\n"
    "with --tf32, f32 bounds add F (2 for o and lse, 3 for gradients) times the error\n"
    "rounding to TF32 alone makes (the reference computed as TF32, a second pass).\n"
    "  --backend SPEC      auto, cpu, opencl, cuda[:N] (default: ATTN_BACKEND, else auto)\n"
    "  --batch B           sequences (1)\n"
    "  --seqlen N          query and key length (1024)\n"
    "  --seqlen-q N, --seqlen-k N   separate lengths\n"
    "  --heads H           query heads (12)\n"
    "  --heads-kv H        key/value heads, dividing H (= heads; fewer for GQA/MQA)\n"
    "  --dim D             head dimension, 1 to 256 (64)\n"
    "  --dtype T           f32, f16 or bf16 (f32)\n"
    "  --tf32              allow TF32 tensor cores for f32 (ATTN_ALLOW_TF32)\n"
    "  --causal            bottom-right-aligned causal mask\n"
    "  --window L,R        sliding window (-1 = unbounded)\n"
    "  --softcap C         soft-capping of the scores\n"
    "  --alibi             ALiBi with the standard geometric slopes\n"
    "  --scale S           score scale (default 1/sqrt(D))\n"
    "  --bias [FORM]       an additive bias in q's dtype over the cache's capacity: full\n"
    "                      [B,H,Nq,Nk] (the default), heads [1,H,Nq,Nk], keys [B,1,1,Nk]\n"
    "  --sinks             an attention sink per query head (random logits)\n"
    "  --backward          also time the backward pass (with dbias, dsinks for --bias, --sinks)\n"
    "  --splits N|auto     forward key splits: N parts, 1 = none, auto = the backend's (auto)\n"
    "  --repeat R          timed calls, 1 to 1000000 (10)\n"
    "  --async             time calls queued (ATTN_ASYNC): each of the --repeat samples a\n"
    "                      batch of calls back to back and one synchronize, over the batch\n"
    "                      (a call's device time, its launch overlapped; else synchronous)\n"
    "  --check / --no-check   force or skip the reference comparison\n"
    "  --seed S            random seed, 0 to 2^64-1 (1)\n"
    "A KV cache (forward only); seqlen_k is then the keys the longest sequence attends to,\n"
    "appended rows included:\n"
    "  --cache-extra E     a cache of seqlen_k + E rows per sequence, used in part: the first\n"
    "                      sequence attends to seqlen_k keys, each other one to a length\n"
    "                      drawn from the seed between seqlen_k/2 and seqlen_k (seqused_k)\n"
    "  --page-size P       paged K/V: pages of P rows, enough per sequence for the capacity,\n"
    "                      handed out in a shuffled block table\n"
    "  --append            seqlen_q new rows per sequence appended through k_new/v_new (the\n"
    "                      check then also reads back the cache)\n"
    "Exit status: 0 done, 1 a failure while running or a result outside the tolerance,\n"
    "2 a wrong option or value.\n";

/* A million timed calls is already hours at the smallest problem worth timing;
 * the bound keeps the per-call timing arrays small. */
#define RUN_MAX_REPEAT 1000000

/* Notes a size option for the messages about memory. */
static void note_size(run_opts *o, const char *opt, const char *val) {
  size_t len = strlen(o->sizes);
  snprintf(o->sizes + len, sizeof o->sizes - len, "%s%s %.40s", len ? " " : "", opt, val);
}

/* Parses the options shared by run and vit; returns 1 for --help, -1 on error
 * (said on stderr). */
int run_parse(int argc, char **argv, run_opts *o, int vit) {
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
    int64_t *size = NULL;
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) return 1;
    if (!strcmp(a, "--backend")) {
      if (!val || !*val)
        return cli_complain("--backend needs a value (auto, cpu, opencl, cuda[:N])"), -1;
      o->backend = val;
      i++;
    } else if (!strcmp(a, "--batch")) {
      size = &o->batch;
    } else if (!strcmp(a, "--repeat")) {
      if (cli_parse_int(a, val, 1, RUN_MAX_REPEAT, &o->repeat)) return -1;
      i++;
    } else if (!strcmp(a, "--dtype")) {
      if (cli_parse_dtype(a, val, &o->dtype)) return -1;
      i++;
    } else if (!strcmp(a, "--backward")) {
      o->backward = 1;
    } else if (!strcmp(a, "--check")) {
      o->check = 1;
    } else if (!strcmp(a, "--no-check")) {
      o->check = 0;
    } else if (!strcmp(a, "--seed")) {
      if (parse_u64(a, val, &o->seed)) return -1;
      i++;
    } else if (vit) {
      return cli_complain("unknown option \"%s\" (see attn vit --help)", a), -1;
    } else if (!strcmp(a, "--seqlen")) {
      if (cli_parse_int(a, val, 1, INT64_MAX, &o->nq)) return -1;
      o->nk = o->nq;
      note_size(o, a, val);
      i++;
    } else if (!strcmp(a, "--seqlen-q")) {
      size = &o->nq;
    } else if (!strcmp(a, "--seqlen-k")) {
      size = &o->nk;
    } else if (!strcmp(a, "--heads")) {
      size = &o->hq;
    } else if (!strcmp(a, "--heads-kv")) {
      size = &o->hkv;
    } else if (!strcmp(a, "--dim")) {
      if (cli_parse_int(a, val, 1, ATTN_MAX_HEAD_DIM, &o->d)) return -1;
      note_size(o, a, val);
      i++;
    } else if (!strcmp(a, "--causal")) {
      o->params.flags |= ATTN_CAUSAL;
    } else if (!strcmp(a, "--async")) {
      o->params.flags |= ATTN_ASYNC; /* timed by run_time_queued */
    } else if (!strcmp(a, "--tf32")) {
      o->params.flags |= ATTN_ALLOW_TF32;
    } else if (!strcmp(a, "--alibi")) {
      o->alibi = 1;
    } else if (!strcmp(a, "--window")) {
      if (parse_window(a, val, &o->params.window_left, &o->params.window_right)) return -1;
      i++;
    } else if (!strcmp(a, "--softcap")) {
      if (parse_scalar(a, val, &o->params.softcap)) return -1;
      i++;
    } else if (!strcmp(a, "--scale")) {
      if (parse_scalar(a, val, &o->params.scale)) return -1;
      i++;
    } else if (!strcmp(a, "--bias")) {
      /* The form is optional: a value that is not an option is one. */
      o->bias = RUN_BIAS_FULL;
      if (val && strncmp(val, "--", 2) != 0) {
        if (!strcmp(val, "full")) {
          o->bias = RUN_BIAS_FULL;
        } else if (!strcmp(val, "heads")) {
          o->bias = RUN_BIAS_HEADS;
        } else if (!strcmp(val, "keys")) {
          o->bias = RUN_BIAS_KEYS;
        } else {
          return cli_complain("--bias \"%s\" is not full, heads or keys", val), -1;
        }
        i++;
      }
    } else if (!strcmp(a, "--sinks")) {
      o->sinks = 1;
    } else if (!strcmp(a, "--page-size")) {
      if (cli_parse_int(a, val, 1, INT32_MAX, &o->page_size)) return -1;
      note_size(o, a, val);
      i++;
    } else if (!strcmp(a, "--cache-extra")) {
      if (cli_parse_int(a, val, 0, INT32_MAX, &o->cache_extra)) return -1;
      note_size(o, a, val);
      i++;
    } else if (!strcmp(a, "--append")) {
      o->append = 1;
    } else if (!strcmp(a, "--splits")) {
      int64_t n = 0;
      if (val && !strcmp(val, "auto")) {
        n = 0;
      } else if (!val) {
        return cli_complain("--splits needs a value (a count of parts from 1, or auto)"), -1;
      } else if (!integer_syntax(val, 1)) {
        return cli_complain("--splits \"%s\" is not a count of parts from 1, or auto", val), -1;
      } else if (cli_parse_int(a, val, 1, INT32_MAX, &n)) {
        return -1;
      }
      o->params.num_splits = (int)n;
      i++;
    } else {
      return cli_complain("unknown option \"%s\" (see attn run --help)", a), -1;
    }
    if (size) {
      if (cli_parse_int(a, val, 1, INT64_MAX, size)) return -1;
      note_size(o, a, val);
      i++;
    }
  }
  if (!o->hkv) o->hkv = o->hq;
  if (o->hkv > o->hq || o->hq % o->hkv)
    return cli_complain("--heads %lld is not a multiple of --heads-kv %lld", (long long)o->hq,
                        (long long)o->hkv),
           -1;
  if (run_has_cache(o)) {
    if (o->backward)
      return cli_complain(
                 "--backward takes no KV-cache option (--page-size, --cache-extra, --append): "
                 "the cache is the forward pass's"),
             -1;
    if (o->append && o->nq > o->nk)
      return cli_complain(
                 "--append appends seqlen_q (%lld) rows, more than the %lld keys "
                 "(seqlen_k) that hold them",
                 (long long)o->nq, (long long)o->nk),
             -1;
    int64_t pages;
    if (run_cache_capacity(o, &pages) < 0)
      return cli_complain(
                 "%s: the cache would hold more rows or pages than int32 lengths and "
                 "block table entries can count (2^31-1)",
                 o->sizes[0] ? o->sizes : "the problem"),
             -1;
  }
  /* A window wider than both sequences sees every key: the same problem
   * with bounds that cannot overflow the key-range arithmetic. */
  int64_t span = o->nq > o->nk ? o->nq : o->nk;
  if (o->params.window_left > span) o->params.window_left = span;
  if (o->params.window_right > span) o->params.window_right = span;
  return 0;
}

void run_defaults(run_opts *o) {
  memset(o, 0, sizeof *o);
  attn_params_init(&o->params);
  o->dtype = ATTN_F32;
  o->batch = 1;
  o->nq = o->nk = 1024;
  o->hq = 12;
  o->d = 64;
  o->repeat = 10;
  o->check = -1;
  o->seed = 1;
  o->cache_extra = -1;
}
