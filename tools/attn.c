/* The attn program: what backends are here, run a problem and time it, the
 * ViT-B/16 attention, and the golden-case check. */
#define _POSIX_C_SOURCE 200809L
#include "attn.h"
#include "attn_internal.h"
#include "golden.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char *prog = "attn";

static int usage_main(FILE *f) {
  fprintf(f,
          "usage: attn <command> [options]\n"
          "\n"
          "commands:\n"
          "  info     backends and devices present, and what ATTN_BACKEND selects\n"
          "  run      a random attention problem on the selected backend: time, GFLOP/s, error\n"
          "  vit      the ViT-B/16 self-attention of a 224x224 image (197 tokens, 12 heads of 64)\n"
          "  check    run golden case folders and compare with the tolerance rule\n"
          "\n"
          "Each command takes --help. The backend comes from --backend SPEC or ATTN_BACKEND\n"
          "(auto, cpu, opencl, cuda, optionally :N for a device index).\n");
  return f == stdout ? 0 : 2;
}

static int fail_ctx(attn_context *ctx, int rc, const char *what) {
  fprintf(stderr, "%s: %s: %s (%s)\n", prog, what, attn_errmsg(ctx), attn_status_name(rc));
  return 1;
}

/* ---------------------------------------------------------------------- */
/* info                                                                     */
/* ---------------------------------------------------------------------- */

static void print_device(const attn_device_info *d) {
  printf("    %s:%d  %s  [%s]", attn_backend_name(d->backend), d->index, d->name,
         d->is_gpu ? "gpu" : "cpu");
  if (d->compute_major) printf("  sm_%d%d", d->compute_major, d->compute_minor);
  if (d->version[0]) printf("  %s", d->version);
  if (d->memory_bytes) printf("  %.1f GiB", (double)d->memory_bytes / (1024.0 * 1024 * 1024));
  if (d->compute_units) printf("  %d units", d->compute_units);
  printf("\n");
}

static int cmd_info(int argc, char **argv) {
  int selftest = 0;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      printf(
          "usage: attn info [--selftest]\n"
          "Lists every backend attn was built with, its devices (or why it has none), and the\n"
          "backend that ATTN_BACKEND selects. --selftest runs a tiny C = A + B kernel on every\n"
          "device and checks it. Exits non-zero if ATTN_BACKEND cannot be met or a self-test "
          "fails.\n");
      return 0;
    } else if (!strcmp(argv[i], "--selftest")) {
      selftest = 1;
    } else {
      fprintf(stderr, "%s info: unknown option %s (see --help)\n", prog, argv[i]);
      return 2;
    }
  }
  int status = 0;
  printf("attn %s\nbackends:\n", ATTN_VERSION_STRING);
  const attn_backend kinds[] = {ATTN_BACKEND_CUDA, ATTN_BACKEND_OPENCL, ATTN_BACKEND_CPU};
  for (int k = 0; k < 3; k++) {
    attn_backend b = kinds[k];
    if (!attn_backend_compiled(b)) {
      printf("  %-7s not built\n", attn_backend_name(b));
      continue;
    }
    int n = attn_device_count(b);
    if (n == 0) {
      printf("  %-7s unavailable: %s\n", attn_backend_name(b), attn_backend_unavailable_reason(b));
      continue;
    }
    printf("  %-7s %d device%s\n", attn_backend_name(b), n, n == 1 ? "" : "s");
    for (int i = 0; i < n; i++) {
      attn_device_info d;
      if (attn_device_info_get(b, i, &d) != ATTN_OK) continue;
      print_device(&d);
      if (selftest) {
        char spec[32];
        snprintf(spec, sizeof spec, "%s:%d", attn_backend_name(b), i);
        attn_context *ctx = NULL;
        int rc = attn_context_create(spec, &ctx);
        if (rc == ATTN_OK) rc = attn_selftest(ctx);
        if (rc == ATTN_OK) {
          printf("      selftest: ok\n");
        } else {
          printf("      selftest: FAILED: %s (%s)\n", attn_errmsg(ctx), attn_status_name(rc));
          status = 1;
        }
        attn_context_free(ctx);
      }
    }
  }
  const char *env = getenv("ATTN_BACKEND");
  attn_context *ctx = NULL;
  int rc = attn_context_create(NULL, &ctx);
  printf("ATTN_BACKEND=%s selects: ", env ? env : "(unset)");
  if (rc == ATTN_OK) {
    attn_device_info d;
    attn_context_device_info(ctx, &d);
    printf("%s:%d (%s)\n", attn_backend_name(d.backend), d.index, d.name);
  } else {
    printf("nothing\n");
    fprintf(stderr, "%s: %s (%s)\n", prog, attn_errmsg(ctx), attn_status_name(rc));
    status = 1;
  }
  attn_context_free(ctx);
  return status;
}

/* ---------------------------------------------------------------------- */
/* run / vit                                                                */
/* ---------------------------------------------------------------------- */

typedef struct run_opts {
  const char *backend;
  attn_dtype dtype;
  int64_t batch, nq, nk, hq, hkv, d;
  attn_params params;
  int alibi;
  int backward;
  int repeat;
  int check; /* -1 auto, 0 no, 1 yes */
  unsigned seed;
} run_opts;

static uint64_t rng_state;
static double rnd(void) {
  /* xorshift64*: reproducible inputs for a given --seed. */
  rng_state ^= rng_state >> 12;
  rng_state ^= rng_state << 25;
  rng_state ^= rng_state >> 27;
  return (double)((rng_state * 2685821657736338717ull) >> 11) / 9007199254740992.0 * 2.0 - 1.0;
}

static void fill_random(void *data, attn_dtype dt, size_t n) {
  for (size_t i = 0; i < n; i++)
    attn__store(data, dt, (int64_t)i, (float)rnd());
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* Query-key pairs the mask leaves visible: the FLOP count follows them (for
 * causal square problems this is the usual "half"). */
static double visible_pairs(const run_opts *o) {
  attn__problem pb;
  memset(&pb, 0, sizeof pb);
  pb.seqlen_q = o->nq;
  pb.seqlen_k = o->nk;
  pb.window_left = o->params.window_left;
  pb.window_right = o->params.window_right;
  if ((o->params.flags & ATTN_CAUSAL) && pb.window_right != 0) pb.window_right = 0;
  double pairs = 0;
  for (int64_t i = 0; i < o->nq; i++) {
    int64_t lo, hi;
    attn__key_range(&pb, i, o->nq, o->nk, &lo, &hi);
    if (hi > lo) pairs += (double)(hi - lo);
  }
  return pairs;
}

/* Max |x - ref| over n elements, and max |ref|. */
static void compare(const void *x, attn_dtype dt, const double *ref, size_t n, double *err,
                    double *refmax) {
  *err = 0;
  *refmax = 0;
  for (size_t i = 0; i < n; i++) {
    double a = attn__load(x, dt, (int64_t)i), e = fabs(a - ref[i]);
    if (isnan(a)) e = INFINITY;
    if (e > *err) *err = e;
    if (fabs(ref[i]) > *refmax) *refmax = fabs(ref[i]);
  }
}

typedef struct device_tensor {
  attn_buffer *buf;
  attn_tensor t;
  void *host;
  size_t bytes;
} device_tensor;

static int make_tensor(attn_context *ctx, device_tensor *dt, attn_tensor shape, int random) {
  size_t count = 1;
  for (int i = 0; i < shape.ndim; i++)
    count *= (size_t)shape.shape[i];
  dt->bytes = count * attn_dtype_size(shape.dtype);
  dt->host = calloc(1, dt->bytes);
  if (!dt->host) return ATTN_ENOMEM;
  if (random) fill_random(dt->host, shape.dtype, count);
  int rc = attn_buffer_create(ctx, dt->bytes, &dt->buf);
  if (rc) return rc;
  dt->t = attn_tensor_on(shape, dt->buf, 0);
  return attn_buffer_write(ctx, dt->buf, 0, dt->host, dt->bytes);
}

static int run_problem(const run_opts *o, const char *title) {
  attn_context *ctx = NULL;
  int rc = attn_context_create(o->backend, &ctx);
  if (rc) {
    int r = fail_ctx(ctx, rc, "cannot create a context");
    attn_context_free(ctx);
    return r;
  }
  attn_device_info info;
  attn_context_device_info(ctx, &info);
  rng_state = 0x9E3779B97F4A7C15ull ^ o->seed;

  attn_params p = o->params;
  float *slopes = NULL;
  if (o->alibi) {
    slopes = malloc(sizeof(float) * (size_t)o->hq);
    if (!slopes) return 1;
    for (int64_t h = 0; h < o->hq; h++)
      slopes[h] = powf(2.0f, -8.0f * (float)(h + 1) / (float)o->hq);
    p.alibi_slopes = slopes;
    p.alibi_count = o->hq;
  }
  device_tensor q = {0}, k = {0}, v = {0}, out = {0}, lse = {0}, dout = {0}, dq = {0}, dk = {0},
                dv = {0};
  attn_tensor sq = attn_tensor_bshd(NULL, o->dtype, o->batch, o->nq, o->hq, o->d);
  attn_tensor sk = attn_tensor_bshd(NULL, o->dtype, o->batch, o->nk, o->hkv, o->d);
  attn_tensor sl = attn_tensor_lse(NULL, o->batch, o->hq, o->nq);
  if ((rc = make_tensor(ctx, &q, sq, 1)) || (rc = make_tensor(ctx, &k, sk, 1)) ||
      (rc = make_tensor(ctx, &v, sk, 1)) || (rc = make_tensor(ctx, &out, sq, 0)) ||
      (rc = make_tensor(ctx, &lse, sl, 0)) ||
      (o->backward &&
       ((rc = make_tensor(ctx, &dout, sq, 1)) || (rc = make_tensor(ctx, &dq, sq, 0)) ||
        (rc = make_tensor(ctx, &dk, sk, 0)) || (rc = make_tensor(ctx, &dv, sk, 0))))) {
    int r = rc == ATTN_ENOMEM && !attn_errmsg(ctx)[0]
                ? (fprintf(stderr, "%s: out of host memory\n", prog), 1)
                : fail_ctx(ctx, rc, "cannot allocate the tensors");
    attn_context_free(ctx);
    return r;
  }

  int repeat = o->repeat > 0 ? o->repeat : 1;
  double *tf = calloc((size_t)repeat, sizeof(double)), *tb = calloc((size_t)repeat, sizeof(double));
  int status = 0;
  /* One untimed call first: kernel compilation and first-touch stay out. */
  rc = attn_forward(ctx, &p, &q.t, &k.t, &v.t, &out.t, &lse.t);
  for (int r = 0; r < repeat && !rc; r++) {
    double t0 = now_s();
    rc = attn_forward(ctx, &p, &q.t, &k.t, &v.t, &out.t, &lse.t);
    tf[r] = now_s() - t0;
  }
  if (!rc && o->backward) {
    rc = attn_backward(ctx, &p, &q.t, &k.t, &v.t, &out.t, &lse.t, &dout.t, &dq.t, &dk.t, &dv.t);
    for (int r = 0; r < repeat && !rc; r++) {
      double t0 = now_s();
      rc = attn_backward(ctx, &p, &q.t, &k.t, &v.t, &out.t, &lse.t, &dout.t, &dq.t, &dk.t, &dv.t);
      tb[r] = now_s() - t0;
    }
  }
  if (rc) {
    status = fail_ctx(ctx, rc, o->backward ? "attention failed" : "forward failed");
    goto done;
  }
  qsort(tf, (size_t)repeat, sizeof(double), cmp_double);
  qsort(tb, (size_t)repeat, sizeof(double), cmp_double);
  double flops = 4.0 * (double)o->batch * (double)o->hq * visible_pairs(o) * (double)o->d;
  printf("%s\n", title);
  printf("  backend   %s:%d (%s)\n", attn_backend_name(info.backend), info.index, info.name);
  printf(
      "  problem   batch %lld, seqlen_q %lld, seqlen_k %lld, heads %lld/%lld, head_dim %lld, "
      "%s%s%s%s\n",
      (long long)o->batch, (long long)o->nq, (long long)o->nk, (long long)o->hq, (long long)o->hkv,
      (long long)o->d, attn_dtype_name(o->dtype), (p.flags & ATTN_CAUSAL) ? ", causal" : "",
      p.softcap > 0 ? ", softcap" : "", o->alibi ? ", alibi" : "");
  double mf = tf[repeat / 2];
  printf("  forward   %.3f ms median of %d, %.1f GFLOP/s\n", mf * 1e3, repeat, flops / mf * 1e-9);
  if (o->backward) {
    double mb = tb[repeat / 2];
    printf("  backward  %.3f ms median of %d, %.1f GFLOP/s (2.5x the forward's FLOPs)\n", mb * 1e3,
           repeat, 2.5 * flops / mb * 1e-9);
  }

  /* Error against the double reference, when it finishes in seconds. */
  double work = (double)o->batch * (double)o->hq * visible_pairs(o) * (double)o->d;
  int check = o->check < 0 ? work <= 3e8 : o->check;
  if (!check) {
    printf("  error     not checked (problem too large for the reference; --check forces it)\n");
    goto done;
  }
  attn_tensor hq_ = attn_tensor_bshd(q.host, o->dtype, o->batch, o->nq, o->hq, o->d);
  attn_tensor hk_ = attn_tensor_bshd(k.host, o->dtype, o->batch, o->nk, o->hkv, o->d);
  attn_tensor hv_ = attn_tensor_bshd(v.host, o->dtype, o->batch, o->nk, o->hkv, o->d);
  size_t nqe = (size_t)(o->batch * o->nq * o->hq * o->d),
         nke = (size_t)(o->batch * o->nk * o->hkv * o->d);
  size_t nl = (size_t)(o->batch * o->hq * o->nq);
  double *ro = malloc(sizeof(double) * nqe), *rl = malloc(sizeof(double) * nl);
  rc = attn__reference_forward(ctx, &p, &hq_, &hk_, &hv_, ro, rl);
  if (!rc) rc = attn_buffer_read(ctx, out.buf, 0, out.host, out.bytes);
  if (!rc) rc = attn_buffer_read(ctx, lse.buf, 0, lse.host, lse.bytes);
  if (rc) {
    status = fail_ctx(ctx, rc, "reference");
  } else {
    double e, m, el = 0;
    compare(out.host, o->dtype, ro, nqe, &e, &m);
    for (size_t i = 0; i < nl; i++) {
      double a = ((float *)lse.host)[i];
      double diff = isinf(rl[i]) ? (a == rl[i] ? 0 : INFINITY) : fabs(a - rl[i]);
      if (isnan(a)) diff = INFINITY;
      if (diff > el) el = diff;
    }
    printf("  error     o max|err| %.3g (max|ref| %.3g), lse max|err| %.3g\n", e, m, el);
  }
  if (!rc && o->backward) {
    attn_tensor hdo = attn_tensor_bshd(dout.host, o->dtype, o->batch, o->nq, o->hq, o->d);
    double *rdq = malloc(sizeof(double) * nqe), *rdk = malloc(sizeof(double) * nke),
           *rdv = malloc(sizeof(double) * nke);
    rc = attn__reference_backward(ctx, &p, &hq_, &hk_, &hv_, &hdo, rdq, rdk, rdv);
    if (!rc) rc = attn_buffer_read(ctx, dq.buf, 0, dq.host, dq.bytes);
    if (!rc) rc = attn_buffer_read(ctx, dk.buf, 0, dk.host, dk.bytes);
    if (!rc) rc = attn_buffer_read(ctx, dv.buf, 0, dv.host, dv.bytes);
    if (rc) {
      status = fail_ctx(ctx, rc, "reference backward");
    } else {
      double e[3], m[3];
      compare(dq.host, o->dtype, rdq, nqe, &e[0], &m[0]);
      compare(dk.host, o->dtype, rdk, nke, &e[1], &m[1]);
      compare(dv.host, o->dtype, rdv, nke, &e[2], &m[2]);
      printf("  error     dq %.3g (max|ref| %.3g), dk %.3g (%.3g), dv %.3g (%.3g)\n", e[0], m[0],
             e[1], m[1], e[2], m[2]);
    }
    free(rdq);
    free(rdk);
    free(rdv);
  }
  free(ro);
  free(rl);
done:
  free(tf);
  free(tb);
  device_tensor *all[] = {&q, &k, &v, &out, &lse, &dout, &dq, &dk, &dv};
  for (int i = 0; i < 9; i++) {
    attn_buffer_free(all[i]->buf);
    free(all[i]->host);
  }
  free(slopes);
  attn_context_free(ctx);
  return status;
}

static int parse_int(const char *opt, const char *s, int64_t lo, int64_t *out) {
  char *end;
  errno = 0;
  long long v = strtoll(s ? s : "", &end, 10);
  if (!s || !*s || *end || errno || v < lo) {
    fprintf(stderr, "%s: %s needs an integer >= %lld, got \"%s\"\n", prog, opt, (long long)lo,
            s ? s : "");
    return -1;
  }
  *out = v;
  return 0;
}

static int parse_double(const char *opt, const char *s, double *out) {
  char *end;
  errno = 0;
  double v = strtod(s ? s : "", &end);
  if (!s || !*s || *end || errno || !isfinite(v)) {
    fprintf(stderr, "%s: %s needs a number, got \"%s\"\n", prog, opt, s ? s : "");
    return -1;
  }
  *out = v;
  return 0;
}

static const char run_help[] =
    "usage: attn run [options]\n"
    "A random problem on the selected backend: median time of --repeat calls, GFLOP/s\n"
    "(4 * batch * heads * visible query-key pairs * head_dim; backward 2.5x that), and the\n"
    "error against the double-precision reference when the problem is small enough.\n"
    "  --backend SPEC      auto, cpu, opencl, cuda[:N] (default: ATTN_BACKEND, else auto)\n"
    "  --batch B           sequences (1)\n"
    "  --seqlen N          query and key length (1024)\n"
    "  --seqlen-q N, --seqlen-k N   separate lengths\n"
    "  --heads H           query heads (12)\n"
    "  --heads-kv H        key/value heads (= heads; fewer for GQA/MQA)\n"
    "  --dim D             head dimension (64)\n"
    "  --dtype T           f32, f16 or bf16 (f32)\n"
    "  --causal            bottom-right-aligned causal mask\n"
    "  --window L,R        sliding window (-1 = unbounded)\n"
    "  --softcap C         soft-capping of the scores\n"
    "  --alibi             ALiBi with the standard geometric slopes\n"
    "  --scale S           score scale (default 1/sqrt(D))\n"
    "  --backward          also time the backward pass\n"
    "  --repeat R          timed calls (10)\n"
    "  --check / --no-check   force or skip the reference comparison\n"
    "  --seed S            random seed (1)\n";

/* Parses the options shared by run and vit; returns 1 for --help, -1 on error. */
static int parse_run(int argc, char **argv, run_opts *o, int vit) {
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
    int64_t n;
    double x;
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) return 1;
    if (!strcmp(a, "--backend")) {
      if (!val) return fprintf(stderr, "%s: --backend needs a value\n", prog), -1;
      o->backend = val;
      i++;
    } else if (!strcmp(a, "--batch")) {
      if (parse_int(a, val, 1, &o->batch)) return -1;
      i++;
    } else if (!strcmp(a, "--repeat")) {
      if (parse_int(a, val, 1, &n)) return -1;
      o->repeat = (int)n;
      i++;
    } else if (!strcmp(a, "--dtype")) {
      if (val && !strcmp(val, "f32")) {
        o->dtype = ATTN_F32;
      } else if (val && !strcmp(val, "f16")) {
        o->dtype = ATTN_F16;
      } else if (val && !strcmp(val, "bf16")) {
        o->dtype = ATTN_BF16;
      } else {
        return fprintf(stderr, "%s: --dtype takes f32, f16 or bf16\n", prog), -1;
      }
      i++;
    } else if (!strcmp(a, "--backward")) {
      o->backward = 1;
    } else if (!strcmp(a, "--check")) {
      o->check = 1;
    } else if (!strcmp(a, "--no-check")) {
      o->check = 0;
    } else if (!strcmp(a, "--seed")) {
      if (parse_int(a, val, 0, &n)) return -1;
      o->seed = (unsigned)n;
      i++;
    } else if (vit) {
      fprintf(stderr, "%s vit: unknown option %s (see --help)\n", prog, a);
      return -1;
    } else if (!strcmp(a, "--seqlen")) {
      if (parse_int(a, val, 1, &o->nq)) return -1;
      o->nk = o->nq;
      i++;
    } else if (!strcmp(a, "--seqlen-q")) {
      if (parse_int(a, val, 1, &o->nq)) return -1;
      i++;
    } else if (!strcmp(a, "--seqlen-k")) {
      if (parse_int(a, val, 1, &o->nk)) return -1;
      i++;
    } else if (!strcmp(a, "--heads")) {
      if (parse_int(a, val, 1, &o->hq)) return -1;
      i++;
    } else if (!strcmp(a, "--heads-kv")) {
      if (parse_int(a, val, 1, &o->hkv)) return -1;
      i++;
    } else if (!strcmp(a, "--dim")) {
      if (parse_int(a, val, 1, &o->d)) return -1;
      i++;
    } else if (!strcmp(a, "--causal")) {
      o->params.flags |= ATTN_CAUSAL;
    } else if (!strcmp(a, "--alibi")) {
      o->alibi = 1;
    } else if (!strcmp(a, "--window")) {
      long long l, r;
      char extra;
      if (!val || sscanf(val, "%lld,%lld%c", &l, &r, &extra) != 2)
        return fprintf(stderr, "%s: --window takes L,R (e.g. 128,0; -1 = unbounded)\n", prog), -1;
      o->params.window_left = l;
      o->params.window_right = r;
      i++;
    } else if (!strcmp(a, "--softcap")) {
      if (parse_double(a, val, &x)) return -1;
      o->params.softcap = x;
      i++;
    } else if (!strcmp(a, "--scale")) {
      if (parse_double(a, val, &x)) return -1;
      o->params.scale = x;
      i++;
    } else {
      fprintf(stderr, "%s run: unknown option %s (see --help)\n", prog, a);
      return -1;
    }
  }
  return 0;
}

static void run_defaults(run_opts *o) {
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
}

static int cmd_run(int argc, char **argv) {
  run_opts o;
  run_defaults(&o);
  int rc = parse_run(argc, argv, &o, 0);
  if (rc > 0) return fputs(run_help, stdout), 0;
  if (rc < 0) return 2;
  if (!o.hkv) o.hkv = o.hq;
  return run_problem(&o, "attn run");
}

static int cmd_vit(int argc, char **argv) {
  run_opts o;
  run_defaults(&o);
  /* ViT-B/16 at 224x224: (224/16)^2 = 196 patches plus the class token,
   * 12 heads of 64 (hidden size 768). */
  o.nq = o.nk = 197;
  o.hq = o.hkv = 12;
  o.d = 64;
  o.repeat = 20;
  int rc = parse_run(argc, argv, &o, 1);
  if (rc > 0) {
    printf(
        "usage: attn vit [--batch B] [--dtype T] [--backward] [--repeat R] [--backend SPEC] "
        "[--check|--no-check] [--seed S]\n"
        "The self-attention of ViT-B/16 on 224x224 images: 197 tokens (196 patches and the class\n"
        "token), 12 heads of 64, for a batch of B images (1). Prints the backend, the median "
        "time,\n"
        "GFLOP/s and the error against the reference.\n");
    return 0;
  }
  if (rc < 0) return 2;
  return run_problem(&o, "attn vit: ViT-B/16 self-attention, 224x224 images");
}

/* ---------------------------------------------------------------------- */
/* check                                                                    */
/* ---------------------------------------------------------------------- */

static int cmd_check(int argc, char **argv) {
  int forward_only = 0, ndirs = 0;
  const char *backend = NULL;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      printf(
          "usage: attn check [--forward-only] [--backend SPEC] [DIR...]\n"
          "Runs each golden case (a folder with case.json and .npy files, or a folder of such\n"
          "folders) on the selected backend and prints each output's error beside the bound of\n"
          "the golden README's tolerance rule. Exits non-zero if any case fails or cannot run.\n"
          "Without DIR, the cases of the source tree: %s\n",
          ATTN_DEFAULT_GOLDEN_DIR);
      return 0;
    } else if (!strcmp(argv[i], "--forward-only")) {
      forward_only = 1;
    } else if (!strcmp(argv[i], "--backend")) {
      if (i + 1 >= argc) return fprintf(stderr, "%s: --backend needs a value\n", prog), 2;
      backend = argv[++i];
    } else if (argv[i][0] == '-') {
      fprintf(stderr, "%s check: unknown option %s (see --help)\n", prog, argv[i]);
      return 2;
    } else {
      ndirs++;
    }
  }
  char *fallback[] = {argv[0], ATTN_DEFAULT_GOLDEN_DIR};
  if (!ndirs) {
    /* Options are already read: the loop below needs only the folder. */
    argc = 2;
    argv = fallback;
  }
  attn_context *ctx = NULL;
  int rc = attn_context_create(backend, &ctx);
  if (rc) {
    int r = fail_ctx(ctx, rc, "cannot create a context");
    attn_context_free(ctx);
    return r;
  }
  attn_device_info info;
  attn_context_device_info(ctx, &info);
  printf("backend %s:%d (%s)\n", attn_backend_name(info.backend), info.index, info.name);
  printf("%-16s %-4s %-5s %12s %12s %8s  %s\n", "case", "type", "out", "max|err|", "bound",
         "err/peer", "result");
  int cases = 0, failed = 0;
  for (int i = 1; i < argc; i++) {
    if (argv[i][0] == '-') {
      if (!strcmp(argv[i], "--backend")) i++;
      continue;
    }
    char err[512];
    char **dirs = NULL;
    int n = attn_golden_list(argv[i], &dirs, err, sizeof err);
    if (n < 0) {
      fprintf(stderr, "%s check: %s\n", prog, err);
      failed++;
      continue;
    }
    if (n == 0) {
      fprintf(stderr, "%s check: %s holds no case folder\n", prog, argv[i]);
      failed++;
    }
    for (int c = 0; c < n; c++) {
      attn_golden g;
      cases++;
      if (attn_golden_load(dirs[c], &g, err, sizeof err) != 0) {
        printf("%-16s cannot load: %s\n", dirs[c], err);
        failed++;
        continue;
      }
      attn_golden_report rep;
      attn_golden_run(ctx, &g, forward_only, &rep);
      if (rep.status != ATTN_OK) {
        printf("%-16s %-4s cannot run: %s (%s)  FAIL\n", g.name, attn_dtype_name(g.dtype),
               rep.message, attn_status_name(rep.status));
      }
      for (int r = 0; r < rep.n; r++) {
        const attn_golden_result *x = &rep.r[r];
        double peer = !strcmp(x->output, "o")     ? g.peer_o
                      : !strcmp(x->output, "lse") ? g.peer_lse
                      : !strcmp(x->output, "dq")  ? g.peer_dq
                      : !strcmp(x->output, "dk")  ? g.peer_dk
                                                  : g.peer_dv;
        char ratio[32] = "-";
        if (isfinite(peer) && peer > 0) snprintf(ratio, sizeof ratio, "%.2f", x->max_err / peer);
        printf("%-16s %-4s %-5s %12.4g %12.4g %8s  %s\n", r == 0 ? g.name : "",
               r == 0 ? attn_dtype_name(g.dtype) : "", x->output, x->max_err, x->bound, ratio,
               x->pass ? "ok" : "FAIL");
      }
      if (!rep.pass) failed++;
      attn_golden_free(&g);
    }
    attn_golden_list_free(dirs, n);
  }
  printf("%d case%s, %d failed (%s)\n", cases, cases == 1 ? "" : "s", failed,
         forward_only ? "forward" : "forward and backward");
  attn_context_free(ctx);
  return failed ? 1 : 0;
}

int main(int argc, char **argv) {
  if (argc < 2) return usage_main(stderr);
  const char *cmd = argv[1];
  if (!strcmp(cmd, "--help") || !strcmp(cmd, "-h") || !strcmp(cmd, "help"))
    return usage_main(stdout);
  if (!strcmp(cmd, "--version")) return printf("attn %s\n", ATTN_VERSION_STRING), 0;
  if (!strcmp(cmd, "info")) return cmd_info(argc - 1, argv + 1);
  if (!strcmp(cmd, "run")) return cmd_run(argc - 1, argv + 1);
  if (!strcmp(cmd, "vit")) return cmd_vit(argc - 1, argv + 1);
  if (!strcmp(cmd, "check")) return cmd_check(argc - 1, argv + 1);
  fprintf(stderr, "%s: unknown command \"%s\"\n", prog, cmd);
  return usage_main(stderr);
}
