/* The attn program: what backends are here, run a problem and time it, the
 * ViT-B/16 attention, and the golden-case check. */
#define _POSIX_C_SOURCE 200809L
#include "attn.h"
#include "attn_internal.h"
#include "golden.h"
#include "ref.h"
#include "rules.h"

#include <ctype.h>
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/resource.h>
#include <unistd.h>

static const char *prog = "attn";

/* Exit statuses: 1 when something failed while running (a device, memory, a
 * case outside its tolerance), 2 when what was asked for is wrong (usage, a
 * value, a damaged input file) and running again unchanged cannot help. */
enum { EXIT_FAILED = 1, EXIT_USAGE = 2 };

/* Prints "attn: <message>" on one line of stderr, whatever the message holds
 * (a path or a driver's log may carry newlines or escapes), and returns
 * EXIT_USAGE. */
static int complain(const char *fmt, ...) {
  char msg[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  for (char *c = msg; *c; c++)
    if ((unsigned char)*c < 0x20 || *c == 0x7f) *c = '?';
  fprintf(stderr, "%s: %s\n", prog, msg);
  return EXIT_USAGE;
}

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
          "(auto, cpu, opencl, cuda, optionally :N for a device index).\n"
          "Exit status: 0 done, 1 a failure while running (device, memory, a case out of\n"
          "tolerance), 2 a wrong command, option, value or input file.\n");
  return f == stdout ? 0 : EXIT_USAGE;
}

/* A library failure: statuses about what was asked for (a shape, a value, a
 * backend name or one that is absent, an unsupported combination) are usage
 * errors; the rest happened while running. */
static int fail_ctx(attn_context *ctx, int rc, const char *what) {
  complain("%s: %s (%s)", what, attn_errmsg(ctx), attn_status_name(rc));
  switch (rc) {
    case ATTN_ENOMEM:
    case ATTN_EDEVICE:
    case ATTN_EBUILD:
    case ATTN_EBUFFER:
    case ATTN_EINTERNAL:
      return EXIT_FAILED;
    default:
      return EXIT_USAGE;
  }
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
      return complain("unknown option \"%s\" (see attn info --help)", argv[i]);
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
    status = fail_ctx(ctx, rc, "no backend selected");
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
  int64_t repeat;
  int check; /* -1 auto, 0 no, 1 yes */
  uint64_t seed;
  char sizes[256]; /* the size options given, for messages: "--seqlen 99999999999" */
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
    attn__problem_key_range(&pb, i, o->nq, o->nk, &lo, &hi);
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

/* ---------------------------------------------------------------------- */
/* Sizes                                                                    */
/* ---------------------------------------------------------------------- */

/* Bytes this process may still allocate: the kernel's estimate of available
 * memory (MemAvailable), else the physical memory, capped by an address-space
 * limit. Only a bound for refusing absurd problems before allocating. */
static double memory_available(void) {
  double avail = INFINITY;
  FILE *f = fopen("/proc/meminfo", "r");
  if (f) {
    char line[256];
    unsigned long long kb;
    while (fgets(line, sizeof line, f))
      if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) avail = (double)kb * 1024.0;
    fclose(f);
  }
  if (isinf(avail)) {
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    if (pages > 0 && page > 0) avail = (double)pages * (double)page;
  }
  struct rlimit rl;
  if (getrlimit(RLIMIT_AS, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY && (double)rl.rlim_cur < avail)
    avail = (double)rl.rlim_cur;
  return avail;
}

static const char *human_bytes(double bytes, char *buf, size_t len) {
  static const char *const unit[] = {"bytes", "kB", "MB", "GB", "TB", "PB", "EB", "ZB", "YB"};
  int u = 0;
  while (bytes >= 1000 && u < 8) {
    bytes /= 1000;
    u++;
  }
  snprintf(buf, len, u ? "%.1f %s" : "%.0f %s", bytes, unit[u]);
  return buf;
}

/* Elements of each tensor, in double so that no product can overflow. */
typedef struct run_sizes {
  double eq, ek, el; /* q-shaped, k-shaped, lse */
  double tensors;    /* bytes of every tensor the run uses (one copy) */
  double reference;  /* bytes of the reference's double outputs */
} run_sizes;

static run_sizes sizes_of(const run_opts *o) {
  run_sizes z;
  double es = (double)attn_dtype_size(o->dtype);
  z.eq = (double)o->batch * (double)o->nq * (double)o->hq * (double)o->d;
  z.ek = (double)o->batch * (double)o->nk * (double)o->hkv * (double)o->d;
  z.el = (double)o->batch * (double)o->hq * (double)o->nq;
  int copies = o->backward ? 2 : 1; /* q, o (k, v) and do, dq (dk, dv) */
  z.tensors = copies * (2 * z.eq + 2 * z.ek) * es + 4 * z.el;
  z.reference = 8 * (z.eq + z.el) + (o->backward ? 8 * (z.eq + 2 * z.ek) : 0);
  return z;
}

/* Refuses, with the sentence the user needs, a problem whose memory is more
 * than there is; what names the memory ("the tensors", "the tensors and the
 * reference"). */
static int too_big(const run_opts *o, const char *what, double need, double have,
                   const char *where) {
  char a[32], b[32];
  return complain("%s: %s would need %s, more than the %s of %s available",
                  o->sizes[0] ? o->sizes : "the problem", what, human_bytes(need, a, sizeof a),
                  human_bytes(have, b, sizeof b), where);
}

/* ---------------------------------------------------------------------- */
/* Progress of the reference                                                */
/* ---------------------------------------------------------------------- */

/* The reference is plain double-precision loops and can take minutes on a
 * large problem: after a second, say how far it has come. On a terminal one
 * line is rewritten in place; in a log a line every few seconds. */
typedef struct progress {
  double t0, next;
  int tty, shown;
  const char *pass; /* "forward", "backward" */
} progress;

static void progress_start(progress *pg) {
  pg->t0 = now_s();
  pg->next = pg->t0 + 1.0;
  pg->tty = isatty(STDERR_FILENO);
  pg->shown = 0;
  pg->pass = "forward";
}

static void progress_show(void *user, int64_t done, int64_t total) {
  progress *pg = user;
  double t = now_s();
  if (t < pg->next) return;
  int pct = (int)(100.0 * (double)done / (double)(total > 0 ? total : 1));
  if (pg->tty) {
    fprintf(stderr, "\r%s: reference %s: %3d%% (%lld/%lld rows)", prog, pg->pass, pct,
            (long long)done, (long long)total);
    pg->next = t + 0.2;
  } else {
    fprintf(stderr, "%s: reference %s: %d%% (%lld/%lld rows, %.0f s)\n", prog, pg->pass, pct,
            (long long)done, (long long)total, t - pg->t0);
    pg->next = t + 5.0;
  }
  fflush(stderr);
  pg->shown = 1;
}

static void progress_end(progress *pg) {
  if (!pg->shown) return;
  if (pg->tty)
    fputs("\r\033[K", stderr); /* the results follow on stdout; leave no stale line */
  else
    fprintf(stderr, "%s: reference done in %.1f s\n", prog, now_s() - pg->t0);
}

/* ---------------------------------------------------------------------- */
/* Running                                                                  */
/* ---------------------------------------------------------------------- */

typedef struct device_tensor {
  attn_buffer *buf;
  attn_tensor t;
  void *host;
  size_t bytes;
} device_tensor;

/* Sizes were checked against memory before: the products cannot overflow. */
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

static int out_of_host_memory(void) {
  fprintf(stderr, "%s: out of host memory\n", prog);
  return EXIT_FAILED;
}

/* The error against the double reference, printed; returns the exit status. */
static int check_against_reference(attn_context *ctx, const run_opts *o, const attn_params *p,
                                   device_tensor *q, device_tensor *k, device_tensor *v,
                                   device_tensor *out, device_tensor *lse, device_tensor *dout,
                                   device_tensor *dq, device_tensor *dk, device_tensor *dv) {
  attn_tensor hq_ = attn_tensor_bshd(q->host, o->dtype, o->batch, o->nq, o->hq, o->d);
  attn_tensor hk_ = attn_tensor_bshd(k->host, o->dtype, o->batch, o->nk, o->hkv, o->d);
  attn_tensor hv_ = attn_tensor_bshd(v->host, o->dtype, o->batch, o->nk, o->hkv, o->d);
  size_t nqe = (size_t)(o->batch * o->nq * o->hq * o->d),
         nke = (size_t)(o->batch * o->nk * o->hkv * o->d);
  size_t nl = (size_t)(o->batch * o->hq * o->nq);
  int status = 0;
  double *ro = malloc(sizeof(double) * nqe), *rl = malloc(sizeof(double) * nl);
  double *rdq = NULL, *rdk = NULL, *rdv = NULL;
  if (o->backward) {
    rdq = malloc(sizeof(double) * nqe);
    rdk = malloc(sizeof(double) * nke);
    rdv = malloc(sizeof(double) * nke);
  }
  if (!ro || !rl || (o->backward && (!rdq || !rdk || !rdv))) {
    status = out_of_host_memory();
    goto done;
  }
  progress pg;
  progress_start(&pg);
  int rc = attn__reference_forward_progress(ctx, p, &hq_, &hk_, &hv_, ro, rl, progress_show, &pg);
  attn_tensor hdo = attn_tensor_bshd(dout->host, o->dtype, o->batch, o->nq, o->hq, o->d);
  pg.pass = "backward";
  if (!rc && o->backward)
    rc = attn__reference_backward_progress(ctx, p, &hq_, &hk_, &hv_, &hdo, rdq, rdk, rdv,
                                           progress_show, &pg);
  progress_end(&pg);
  if (rc) {
    status = fail_ctx(ctx, rc, "reference");
    goto done;
  }
  rc = attn_buffer_read(ctx, out->buf, 0, out->host, out->bytes);
  if (!rc) rc = attn_buffer_read(ctx, lse->buf, 0, lse->host, lse->bytes);
  if (!rc && o->backward) {
    rc = attn_buffer_read(ctx, dq->buf, 0, dq->host, dq->bytes);
    if (!rc) rc = attn_buffer_read(ctx, dk->buf, 0, dk->host, dk->bytes);
    if (!rc) rc = attn_buffer_read(ctx, dv->buf, 0, dv->host, dv->bytes);
  }
  if (rc) {
    status = fail_ctx(ctx, rc, "reading the results");
    goto done;
  }
  double e, m, el = 0;
  compare(out->host, o->dtype, ro, nqe, &e, &m);
  for (size_t i = 0; i < nl; i++) {
    double a = ((float *)lse->host)[i];
    double diff = isinf(rl[i]) ? (a == rl[i] ? 0 : INFINITY) : fabs(a - rl[i]);
    if (isnan(a)) diff = INFINITY;
    if (diff > el) el = diff;
  }
  printf("  error     o max|err| %.3g (max|ref| %.3g), lse max|err| %.3g\n", e, m, el);
  if (o->backward) {
    double eg[3], mg[3];
    compare(dq->host, o->dtype, rdq, nqe, &eg[0], &mg[0]);
    compare(dk->host, o->dtype, rdk, nke, &eg[1], &mg[1]);
    compare(dv->host, o->dtype, rdv, nke, &eg[2], &mg[2]);
    printf("  error     dq %.3g (max|ref| %.3g), dk %.3g (%.3g), dv %.3g (%.3g)\n", eg[0], mg[0],
           eg[1], mg[1], eg[2], mg[2]);
  }
done:
  free(ro);
  free(rl);
  free(rdq);
  free(rdk);
  free(rdv);
  return status;
}

static int run_problem(const run_opts *o, const char *title) {
  /* One copy of every tensor lives in host memory whatever the backend. */
  run_sizes z = sizes_of(o);
  double avail = memory_available();
  if (z.tensors > avail) return too_big(o, "the tensors", z.tensors, avail, "memory");

  attn_context *ctx = NULL;
  int rc = attn_context_create(o->backend, &ctx);
  if (rc) {
    int r = fail_ctx(ctx, rc, "cannot create a context");
    attn_context_free(ctx);
    return r;
  }
  attn_device_info info;
  attn_context_device_info(ctx, &info);

  /* Error against the double reference when it finishes in seconds. */
  double work = (double)o->batch * (double)o->hq * visible_pairs(o) * (double)o->d;
  int check = o->check < 0 ? work <= 3e8 : o->check;
  /* On a CPU device the buffers are host memory too. */
  double host = z.tensors * (info.is_gpu ? 1 : 2) + (check ? z.reference : 0);
  int status = 0;
  if (host > avail) {
    status =
        too_big(o, check ? "the tensors and the reference" : "the tensors", host, avail, "memory");
  } else if (info.is_gpu && info.memory_bytes && z.tensors > (double)info.memory_bytes) {
    status = too_big(o, "the tensors", z.tensors, (double)info.memory_bytes, "device memory");
  }
  if (status) {
    attn_context_free(ctx);
    return status;
  }
  rng_state = 0x9E3779B97F4A7C15ull ^ o->seed;

  attn_params p = o->params;
  float *slopes = NULL;
  device_tensor q = {0}, k = {0}, v = {0}, out = {0}, lse = {0}, dout = {0}, dq = {0}, dk = {0},
                dv = {0};
  size_t repeat = (size_t)o->repeat;
  double *tf = calloc(repeat, sizeof(double)), *tb = calloc(repeat, sizeof(double));
  if (!tf || !tb) {
    status = out_of_host_memory();
    goto done;
  }
  if (o->alibi) {
    slopes = malloc(sizeof(float) * (size_t)o->hq);
    if (!slopes) {
      status = out_of_host_memory();
      goto done;
    }
    for (int64_t h = 0; h < o->hq; h++)
      slopes[h] = powf(2.0f, -8.0f * (float)(h + 1) / (float)o->hq);
    p.alibi_slopes = slopes;
    p.alibi_count = o->hq;
  }
  attn_tensor sq = attn_tensor_bshd(NULL, o->dtype, o->batch, o->nq, o->hq, o->d);
  attn_tensor sk = attn_tensor_bshd(NULL, o->dtype, o->batch, o->nk, o->hkv, o->d);
  attn_tensor sl = attn_tensor_lse(NULL, o->batch, o->hq, o->nq);
  if ((rc = make_tensor(ctx, &q, sq, 1)) || (rc = make_tensor(ctx, &k, sk, 1)) ||
      (rc = make_tensor(ctx, &v, sk, 1)) || (rc = make_tensor(ctx, &out, sq, 0)) ||
      (rc = make_tensor(ctx, &lse, sl, 0)) ||
      (o->backward &&
       ((rc = make_tensor(ctx, &dout, sq, 1)) || (rc = make_tensor(ctx, &dq, sq, 0)) ||
        (rc = make_tensor(ctx, &dk, sk, 0)) || (rc = make_tensor(ctx, &dv, sk, 0))))) {
    status = rc == ATTN_ENOMEM && !attn_errmsg(ctx)[0]
                 ? out_of_host_memory()
                 : fail_ctx(ctx, rc, "cannot allocate the tensors");
    goto done;
  }

  /* One untimed call first: kernel compilation and first-touch stay out. */
  rc = attn_forward(ctx, &p, &q.t, &k.t, &v.t, &out.t, &lse.t);
  for (size_t r = 0; r < repeat && !rc; r++) {
    double t0 = now_s();
    rc = attn_forward(ctx, &p, &q.t, &k.t, &v.t, &out.t, &lse.t);
    tf[r] = now_s() - t0;
  }
  if (!rc && o->backward) {
    rc = attn_backward(ctx, &p, &q.t, &k.t, &v.t, &out.t, &lse.t, &dout.t, &dq.t, &dk.t, &dv.t);
    for (size_t r = 0; r < repeat && !rc; r++) {
      double t0 = now_s();
      rc = attn_backward(ctx, &p, &q.t, &k.t, &v.t, &out.t, &lse.t, &dout.t, &dq.t, &dk.t, &dv.t);
      tb[r] = now_s() - t0;
    }
  }
  if (rc) {
    status = fail_ctx(ctx, rc, o->backward ? "attention failed" : "forward failed");
    goto done;
  }
  qsort(tf, repeat, sizeof(double), cmp_double);
  qsort(tb, repeat, sizeof(double), cmp_double);
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
  printf("  forward   %.3f ms median of %zu, %.1f GFLOP/s\n", mf * 1e3, repeat, flops / mf * 1e-9);
  if (o->backward) {
    double mb = tb[repeat / 2];
    printf("  backward  %.3f ms median of %zu, %.1f GFLOP/s (2.5x the forward's FLOPs)\n", mb * 1e3,
           repeat, 2.5 * flops / mb * 1e-9);
  }
  if (!check) {
    printf("  error     not checked (problem too large for the reference; --check forces it)\n");
    goto done;
  }
  fflush(stdout); /* the results so far come before the reference's progress */
  status = check_against_reference(ctx, o, &p, &q, &k, &v, &out, &lse, &dout, &dq, &dk, &dv);
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

/* ---------------------------------------------------------------------- */
/* Options                                                                  */
/* ---------------------------------------------------------------------- */

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

/* The number parser of every integer option: the whole of s, base 10, within
 * [lo, hi]; otherwise a sentence naming the option and the value. */
static int parse_int(const char *opt, const char *s, int64_t lo, int64_t hi, int64_t *out) {
  if (!s) return complain("%s needs a value", opt), -1;
  if (!integer_syntax(s, 1)) return complain("%s \"%s\" is not an integer", opt, s), -1;
  errno = 0;
  long long v = strtoll(s, NULL, 10);
  if (errno == ERANGE || v < lo || v > hi) {
    if (hi == INT64_MAX)
      complain("%s %s is out of range: it must be at least %lld%s", opt, s, (long long)lo,
               errno == ERANGE && v > 0 ? " and fit in 64 bits" : "");
    else
      complain("%s %s is out of range: it must be %lld to %lld", opt, s, (long long)lo,
               (long long)hi);
    return -1;
  }
  *out = v;
  return 0;
}

/* --seed: any 64-bit value, all of which give different inputs. */
static int parse_u64(const char *opt, const char *s, uint64_t *out) {
  if (!s) return complain("%s needs a value", opt), -1;
  if (!integer_syntax(s, 0))
    return complain("%s \"%s\" is not an integer from 0 to %llu", opt, s,
                    (unsigned long long)UINT64_MAX),
           -1;
  errno = 0;
  unsigned long long v = strtoull(s, NULL, 10);
  if (errno == ERANGE)
    return complain("%s %s is out of range: it must be 0 to %llu", opt, s,
                    (unsigned long long)UINT64_MAX),
           -1;
  *out = v;
  return 0;
}

/* A scale or softcap: finite, not negative, and a float32 once given to the
 * kernels, so neither above FLT_MAX nor so small that it rounds to 0. */
static int parse_scalar(const char *opt, const char *s, double *out) {
  if (!s) return complain("%s needs a value", opt), -1;
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  if (!*s || isspace((unsigned char)*s) || *end || !isfinite(v))
    return complain("%s \"%s\" is not a finite number", opt, s), -1;
  if (v < 0 || v > FLT_MAX || (v > 0 && (float)v == 0.0f))
    return complain("%s %s is out of range: it must be 0 or from %g to %g (a float32)", opt, s,
                    (double)FLT_TRUE_MIN, (double)FLT_MAX),
           -1;
  *out = v;
  return 0;
}

/* "--window L,R": two integers, each -1 (unbounded) or more. */
static int parse_window(const char *opt, const char *s, int64_t *l, int64_t *r) {
  if (!s) return complain("%s needs a value L,R (e.g. 128,0; -1 = unbounded)", opt), -1;
  const char *comma = strchr(s, ',');
  char left[64];
  if (!comma || (size_t)(comma - s) >= sizeof left)
    return complain("%s \"%s\" is not L,R (e.g. 128,0; -1 = unbounded)", opt, s), -1;
  memcpy(left, s, (size_t)(comma - s));
  left[comma - s] = 0;
  if (parse_int("--window L", left, -1, INT64_MAX, l)) return -1;
  return parse_int("--window R", comma + 1, -1, INT64_MAX, r);
}

static const char run_help[] =
    "usage: attn run [options]\n"
    "A random problem on the selected backend: median time of --repeat calls, GFLOP/s\n"
    "(4 * batch * heads * visible query-key pairs * head_dim; backward 2.5x that), and the\n"
    "error against the double-precision reference when the problem is small enough (its\n"
    "progress goes to stderr when it takes more than a second).\n"
    "  --backend SPEC      auto, cpu, opencl, cuda[:N] (default: ATTN_BACKEND, else auto)\n"
    "  --batch B           sequences (1)\n"
    "  --seqlen N          query and key length (1024)\n"
    "  --seqlen-q N, --seqlen-k N   separate lengths\n"
    "  --heads H           query heads (12)\n"
    "  --heads-kv H        key/value heads, dividing H (= heads; fewer for GQA/MQA)\n"
    "  --dim D             head dimension, 1 to 256 (64)\n"
    "  --dtype T           f32, f16 or bf16 (f32)\n"
    "  --causal            bottom-right-aligned causal mask\n"
    "  --window L,R        sliding window (-1 = unbounded)\n"
    "  --softcap C         soft-capping of the scores\n"
    "  --alibi             ALiBi with the standard geometric slopes\n"
    "  --scale S           score scale (default 1/sqrt(D))\n"
    "  --backward          also time the backward pass\n"
    "  --repeat R          timed calls, 1 to 1000000 (10)\n"
    "  --check / --no-check   force or skip the reference comparison\n"
    "  --seed S            random seed, 0 to 2^64-1 (1)\n"
    "Exit status: 0 done, 1 a failure while running, 2 a wrong option or value.\n";

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
static int parse_run(int argc, char **argv, run_opts *o, int vit) {
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
    int64_t *size = NULL;
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) return 1;
    if (!strcmp(a, "--backend")) {
      if (!val || !*val)
        return complain("--backend needs a value (auto, cpu, opencl, cuda[:N])"), -1;
      o->backend = val;
      i++;
    } else if (!strcmp(a, "--batch")) {
      size = &o->batch;
    } else if (!strcmp(a, "--repeat")) {
      if (parse_int(a, val, 1, RUN_MAX_REPEAT, &o->repeat)) return -1;
      i++;
    } else if (!strcmp(a, "--dtype")) {
      if (val && !strcmp(val, "f32")) {
        o->dtype = ATTN_F32;
      } else if (val && !strcmp(val, "f16")) {
        o->dtype = ATTN_F16;
      } else if (val && !strcmp(val, "bf16")) {
        o->dtype = ATTN_BF16;
      } else if (!val) {
        return complain("--dtype needs a value (f32, f16 or bf16)"), -1;
      } else {
        return complain("--dtype \"%s\" is not f32, f16 or bf16", val), -1;
      }
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
      return complain("unknown option \"%s\" (see attn vit --help)", a), -1;
    } else if (!strcmp(a, "--seqlen")) {
      if (parse_int(a, val, 1, INT64_MAX, &o->nq)) return -1;
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
      if (parse_int(a, val, 1, ATTN_MAX_HEAD_DIM, &o->d)) return -1;
      note_size(o, a, val);
      i++;
    } else if (!strcmp(a, "--causal")) {
      o->params.flags |= ATTN_CAUSAL;
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
    } else {
      return complain("unknown option \"%s\" (see attn run --help)", a), -1;
    }
    if (size) {
      if (parse_int(a, val, 1, INT64_MAX, size)) return -1;
      note_size(o, a, val);
      i++;
    }
  }
  if (!o->hkv) o->hkv = o->hq;
  if (o->hkv > o->hq || o->hq % o->hkv)
    return complain("--heads %lld is not a multiple of --heads-kv %lld", (long long)o->hq,
                    (long long)o->hkv),
           -1;
  /* A window wider than both sequences sees every key: the same problem
   * with bounds that cannot overflow the key-range arithmetic. */
  int64_t span = o->nq > o->nk ? o->nq : o->nk;
  if (o->params.window_left > span) o->params.window_left = span;
  if (o->params.window_right > span) o->params.window_right = span;
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
  if (rc < 0) return EXIT_USAGE;
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
  if (rc < 0) return EXIT_USAGE;
  return run_problem(&o, "attn vit: ViT-B/16 self-attention, 224x224 images");
}

/* ---------------------------------------------------------------------- */
/* check                                                                    */
/* ---------------------------------------------------------------------- */

/* The case folders of every argument, listed before anything runs so that a
 * missing folder is said at once. */
typedef struct case_list {
  char **dirs;
  int n;
} case_list;

/* Prints a case that cannot be loaded on one line of stderr: which case and why. */
static void cannot_load(const char *dir, const char *why) {
  if (!strncmp(why, dir, strlen(dir)))
    complain("%s", why); /* the reader's sentence starts with the path already */
  else
    complain("%s: %s", dir, why);
}

static int cmd_check(int argc, char **argv) {
  int forward_only = 0, nargs = 0;
  const char *backend = NULL;
  const char **roots = calloc((size_t)argc + 1, sizeof *roots);
  if (!roots) return out_of_host_memory();
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      printf(
          "usage: attn check [--forward-only] [--backend SPEC] [DIR...]\n"
          "Runs each golden case (a folder with case.json and .npy files, or a folder of such\n"
          "folders) on the selected backend and prints each output's error beside the bound of\n"
          "the golden README's tolerance rule. A case that cannot be read is named on stderr and\n"
          "the others still run. Without DIR, the repository's cases:\n"
          "  %s\n"
          "Exit status: 0 every case passed, 1 a case failed or could not run, 2 a wrong option,\n"
          "a missing folder or a case that cannot be read.\n",
          ATTN_DEFAULT_GOLDEN_DIR);
      free(roots);
      return 0;
    } else if (!strcmp(argv[i], "--forward-only")) {
      forward_only = 1;
    } else if (!strcmp(argv[i], "--backend")) {
      if (i + 1 >= argc || !*argv[i + 1]) {
        free(roots);
        return complain("--backend needs a value (auto, cpu, opencl, cuda[:N])");
      }
      backend = argv[++i];
    } else if (argv[i][0] == '-') {
      free(roots);
      return complain("unknown option \"%s\" (see attn check --help)", argv[i]);
    } else {
      roots[nargs++] = argv[i];
    }
  }
  if (!nargs) roots[nargs++] = ATTN_DEFAULT_GOLDEN_DIR;

  int bad = 0, ncases = 0;
  case_list *lists = calloc((size_t)nargs, sizeof *lists);
  if (!lists) {
    free(roots);
    return out_of_host_memory();
  }
  for (int i = 0; i < nargs; i++) {
    char err[512];
    lists[i].n = attn_golden_list(roots[i], &lists[i].dirs, err, sizeof err);
    if (lists[i].n < 0) {
      complain("%s", err);
      lists[i].n = 0;
      bad++;
    } else if (lists[i].n == 0) {
      complain("%s holds no case folder (a folder with case.json, or a folder of them)", roots[i]);
      bad++;
    }
    ncases += lists[i].n;
  }

  attn_context *ctx = NULL;
  int status = 0, cases = 0, failed = 0, header = 0;
  if (ncases) {
    int rc = attn_context_create(backend, &ctx);
    if (rc) status = fail_ctx(ctx, rc, "cannot create a context");
  }
  for (int i = 0; i < nargs && ncases && !status; i++)
    for (int c = 0; c < lists[i].n; c++) {
      const char *dir = lists[i].dirs[c];
      char err[512];
      attn_golden g;
      if (attn_golden_load(dir, &g, err, sizeof err) != 0) {
        cannot_load(dir, err);
        bad++;
        continue;
      }
      /* The table starts with the first case that loads: a run where none
       * does prints nothing that looks like a result. */
      if (!header) {
        attn_device_info info;
        attn_context_device_info(ctx, &info);
        printf("backend %s:%d (%s)\n", attn_backend_name(info.backend), info.index, info.name);
        printf("%-16s %-4s %-5s %12s %12s %8s  %s\n", "case", "type", "out", "max|err|", "bound",
               "err/peer", "result");
        header = 1;
      }
      cases++;
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
  if (header) {
    printf("%d case%s, %d failed", cases, cases == 1 ? "" : "s", failed);
    if (bad) printf(", %d could not be read", bad);
    printf(" (%s)\n", forward_only ? "forward" : "forward and backward");
  }
  for (int i = 0; i < nargs; i++)
    attn_golden_list_free(lists[i].dirs, lists[i].n);
  free(lists);
  free(roots);
  attn_context_free(ctx);
  if (status) return status;
  return bad ? EXIT_USAGE : failed ? EXIT_FAILED : 0;
}

int main(int argc, char **argv) {
  if (argc < 2) return complain("give a command: info, run, vit or check (see attn --help)");
  const char *cmd = argv[1];
  if (!strcmp(cmd, "--help") || !strcmp(cmd, "-h") || !strcmp(cmd, "help"))
    return usage_main(stdout);
  if (!strcmp(cmd, "--version")) return printf("attn %s\n", ATTN_VERSION_STRING), 0;
  static const struct {
    const char *name, *prog;
    int (*fn)(int, char **);
  } cmds[] = {{"info", "attn info", cmd_info},
              {"run", "attn run", cmd_run},
              {"vit", "attn vit", cmd_vit},
              {"check", "attn check", cmd_check}};
  for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++)
    if (!strcmp(cmd, cmds[i].name)) {
      prog = cmds[i].prog;
      return cmds[i].fn(argc - 1, argv + 1);
    }
  return complain("unknown command \"%s\" (commands: info, run, vit, check; see attn --help)", cmd);
}
