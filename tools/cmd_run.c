/*
 * attn run and attn vit: a random problem on the selected backend, timed
 * (median of --repeat calls, GFLOP/s), refused first when its memory is
 * more than there is, then checked against the reference (run_reference.c).
 */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */

#include "run.h"
#include "rules.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

/* ---------------------------------------------------------------------- */
/* Inputs, timing, FLOPs                                                    */
/* ---------------------------------------------------------------------- */

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

double run_now_s(void) {
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
  return cli_complain("%s: %s would need %s, more than the %s of %s available",
                      o->sizes[0] ? o->sizes : "the problem", what, human_bytes(need, a, sizeof a),
                      human_bytes(have, b, sizeof b), where);
}

/* ---------------------------------------------------------------------- */
/* Running                                                                  */
/* ---------------------------------------------------------------------- */

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

static int run_problem(const run_opts *o, const char *title) {
  /* One copy of every tensor lives in host memory whatever the backend. */
  run_sizes z = sizes_of(o);
  double avail = memory_available();
  if (z.tensors > avail) return too_big(o, "the tensors", z.tensors, avail, "memory");

  attn_context *ctx = NULL;
  int rc = attn_context_create(o->backend, &ctx);
  if (rc) {
    int r = cli_fail_ctx(ctx, rc, "cannot create a context");
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
    status = cli_out_of_host_memory();
    goto done;
  }
  if (o->alibi) {
    slopes = malloc(sizeof(float) * (size_t)o->hq);
    if (!slopes) {
      status = cli_out_of_host_memory();
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
                 ? cli_out_of_host_memory()
                 : cli_fail_ctx(ctx, rc, "cannot allocate the tensors");
    goto done;
  }

  /* One untimed call first: kernel compilation and first-touch stay out. */
  rc = attn_forward(ctx, &p, &q.t, &k.t, &v.t, &out.t, &lse.t);
  for (size_t r = 0; r < repeat && !rc; r++) {
    double t0 = run_now_s();
    rc = attn_forward(ctx, &p, &q.t, &k.t, &v.t, &out.t, &lse.t);
    tf[r] = run_now_s() - t0;
  }
  if (!rc && o->backward) {
    rc = attn_backward(ctx, &p, &q.t, &k.t, &v.t, &out.t, &lse.t, &dout.t, &dq.t, &dk.t, &dv.t);
    for (size_t r = 0; r < repeat && !rc; r++) {
      double t0 = run_now_s();
      rc = attn_backward(ctx, &p, &q.t, &k.t, &v.t, &out.t, &lse.t, &dout.t, &dq.t, &dk.t, &dv.t);
      tb[r] = run_now_s() - t0;
    }
  }
  if (rc) {
    status = cli_fail_ctx(ctx, rc, o->backward ? "attention failed" : "forward failed");
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
  status = run_check_reference(ctx, o, &p, &q, &k, &v, &out, &lse, &dout, &dq, &dk, &dv);
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
/* Commands                                                                 */
/* ---------------------------------------------------------------------- */

int cmd_run(int argc, char **argv) {
  run_opts o;
  run_defaults(&o);
  int rc = run_parse(argc, argv, &o, 0);
  if (rc > 0) return fputs(run_help, stdout), 0;
  if (rc < 0) return EXIT_USAGE;
  return run_problem(&o, "attn run");
}

int cmd_vit(int argc, char **argv) {
  run_opts o;
  run_defaults(&o);
  /* ViT-B/16 at 224x224: (224/16)^2 = 196 patches plus the class token,
   * 12 heads of 64 (hidden size 768). */
  o.nq = o.nk = 197;
  o.hq = o.hkv = 12;
  o.d = 64;
  o.repeat = 20;
  int rc = run_parse(argc, argv, &o, 1);
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
