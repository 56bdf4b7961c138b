/*
 * attn run and attn vit: a random problem on the selected backend, timed
 * (median of --repeat calls, GFLOP/s and GB/s), refused first when its
 * memory is more than there is, then checked against the reference
 * (run_reference.c).
 */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */

#include "run.h"
#include "rules.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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

void run_sort_times(double *t, size_t n) {
  qsort(t, n, sizeof *t, cmp_double);
}

/* ---------------------------------------------------------------------- */
/* Sizes                                                                    */
/* ---------------------------------------------------------------------- */

/* Elements of each tensor, in double so that no product can overflow. */
typedef struct run_sizes {
  double eq, ek, el; /* q-shaped, k-shaped (the cache), lse */
  double tensors;    /* bytes of every tensor the run uses (one copy) */
  double reference;  /* bytes of the reference's double outputs and the cache's read-back */
} run_sizes;

static run_sizes sizes_of(const run_opts *o) {
  run_sizes z;
  double es = (double)attn_dtype_size(o->dtype);
  int64_t pages, cap = run_cache_capacity(o, &pages), bias[4];
  double rows = o->page_size ? (double)o->batch * (double)pages * (double)o->page_size
                             : (double)o->batch * (double)cap;
  z.eq = (double)o->batch * (double)o->nq * (double)o->hq * (double)o->d;
  z.ek = rows * (double)o->hkv * (double)o->d;
  z.el = (double)o->batch * (double)o->hq * (double)o->nq;
  double enew = o->append ? (double)o->batch * (double)o->nq * (double)o->hkv * (double)o->d : 0;
  run_bias_shape(o, cap, bias);
  double eb = o->bias ? (double)bias[0] * (double)bias[1] * (double)bias[2] * (double)bias[3] : 0;
  int copies = o->backward ? 2 : 1; /* q, o (k, v) and do, dq (dk, dv) */
  z.tensors = copies * (2 * z.eq + 2 * z.ek) * es + 4 * z.el + (2 * enew + eb) * es +
              (o->backward ? 4 * eb : 0) + 8.0 * (double)o->hq +
              4.0 * (double)o->batch * (double)(1 + pages);
  z.reference = 8 * (z.eq + z.el) + (o->backward ? 8 * (z.eq + 2 * z.ek + eb + (double)o->hq) : 0) +
                (o->append ? z.ek * es : 0);
  return z;
}

/* Refuses, with the sentence the user needs, a problem whose memory is more
 * than there is; what names the memory ("the tensors", "the tensors and the
 * reference"). */
static int too_big(const run_opts *o, const char *what, double need, double have,
                   const char *where) {
  char a[32], b[32];
  return cli_complain("%s: %s would need %s, more than the %s of %s available",
                      o->sizes[0] ? o->sizes : "the problem", what,
                      cli_human_bytes(need, a, sizeof a), cli_human_bytes(have, b, sizeof b),
                      where);
}

/* ---------------------------------------------------------------------- */
/* Running                                                                  */
/* ---------------------------------------------------------------------- */

/* Sizes were checked against memory before: the products cannot overflow.
 * src, when given, is the contents; else random ones, or for an output
 * all-ones bytes, NaN in every dtype, so that an element a call never
 * writes fails the check. */
static int make_tensor_of(attn_context *ctx, device_tensor *dt, attn_tensor shape, int random,
                          const void *src) {
  size_t count = 1;
  for (int i = 0; i < shape.ndim; i++)
    count *= (size_t)shape.shape[i];
  dt->bytes = count * attn_dtype_size(shape.dtype);
  dt->host = calloc(1, dt->bytes);
  if (!dt->host) return ATTN_ENOMEM;
  if (src) memcpy(dt->host, src, dt->bytes);
  if (random) fill_random(dt->host, shape.dtype, count);
  if (!random && !src) memset(dt->host, 0xff, dt->bytes);
  int rc = attn_buffer_create(ctx, dt->bytes, &dt->buf);
  if (rc) return rc;
  dt->t = attn_tensor_on(shape, dt->buf, 0);
  return attn_buffer_write(ctx, dt->buf, 0, dt->host, dt->bytes);
}

static int make_tensor(attn_context *ctx, device_tensor *dt, attn_tensor shape, int random) {
  return make_tensor_of(ctx, dt, shape, random, NULL);
}

attn_tensor run_host_tensor(const device_tensor *t) {
  attn_tensor h = t->t;
  h.buffer = NULL;
  h.offset = 0;
  h.data = t->host;
  return h;
}

/* Every tensor the options ask for, in the order that keeps the values of
 * the inputs q, k, v (and do) what a seed gave before the inference
 * options. */
static int make_tensors(attn_context *ctx, const run_opts *o, const run_cache *c, run_tensors *t) {
  const attn_dtype dt = o->dtype;
  attn_tensor sq = attn_tensor_bshd(NULL, dt, o->batch, o->nq, o->hq, o->d);
  attn_tensor sk = o->page_size
                       ? attn_tensor_bshd(NULL, dt, c->num_pages, o->page_size, o->hkv, o->d)
                       : attn_tensor_bshd(NULL, dt, o->batch, c->cap, o->hkv, o->d);
  attn_tensor sn = attn_tensor_bshd(NULL, dt, o->batch, o->nq, o->hkv, o->d);
  attn_tensor sl = attn_tensor_lse(NULL, o->batch, o->hq, o->nq);
  int64_t bs[4];
  run_bias_shape(o, c->cap, bs);
  attn_tensor sb = attn_tensor_bias(NULL, dt, bs[0], bs[1], bs[2], bs[3]);
  attn_tensor sbf = attn_tensor_bias(NULL, ATTN_F32, bs[0], bs[1], bs[2], bs[3]);
  attn_tensor sh = attn_tensor_1d(NULL, ATTN_F32, o->hq);
  int rc;
  if ((rc = make_tensor(ctx, &t->q, sq, 1)) || (rc = make_tensor(ctx, &t->k, sk, 1)) ||
      (rc = make_tensor(ctx, &t->v, sk, 1)) || (rc = make_tensor(ctx, &t->o, sq, 0)) ||
      (rc = make_tensor(ctx, &t->lse, sl, 0)))
    return rc;
  if (o->append &&
      ((rc = make_tensor(ctx, &t->k_new, sn, 1)) || (rc = make_tensor(ctx, &t->v_new, sn, 1))))
    return rc;
  if (c->seqused && (rc = make_tensor_of(ctx, &t->seqused, attn_tensor_1d(NULL, ATTN_I32, o->batch),
                                         0, c->seqused)))
    return rc;
  if (c->table &&
      (rc = make_tensor_of(ctx, &t->table, attn_tensor_2d(NULL, ATTN_I32, o->batch, c->max_pages),
                           0, c->table)))
    return rc;
  if (o->bias && (rc = make_tensor(ctx, &t->bias, sb, 1))) return rc;
  if (o->sinks && (rc = make_tensor(ctx, &t->sinks, sh, 1))) return rc;
  if (o->backward &&
      ((rc = make_tensor(ctx, &t->dout, sq, 1)) || (rc = make_tensor(ctx, &t->dq, sq, 0)) ||
       (rc = make_tensor(ctx, &t->dk, sk, 0)) || (rc = make_tensor(ctx, &t->dv, sk, 0)) ||
       (o->bias && (rc = make_tensor(ctx, &t->dbias, sbf, 0))) ||
       (o->sinks && (rc = make_tensor(ctx, &t->dsinks, sh, 0)))))
    return rc;
  return ATTN_OK;
}

static void free_tensors(run_tensors *t) {
  device_tensor *all[] = {&t->q,     &t->k,       &t->v,     &t->o,     &t->lse,   &t->k_new,
                          &t->v_new, &t->seqused, &t->table, &t->bias,  &t->sinks, &t->dout,
                          &t->dq,    &t->dk,      &t->dv,    &t->dbias, &t->dsinks};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
    attn_buffer_free(all[i]->buf);
    free(all[i]->host);
  }
}

/* "bias [2,16,4096,4096]" and the like, for the problem line. */
static void describe_terms(const run_opts *o, const run_cache *c, char *buf, size_t len) {
  size_t n = 0;
  buf[0] = 0;
  if (o->bias) {
    int64_t s[4];
    run_bias_shape(o, c->cap, s);
    static const char *const form[] = {
        [RUN_BIAS_FULL] = "full", [RUN_BIAS_HEADS] = "heads", [RUN_BIAS_KEYS] = "keys"};
    n += (size_t)snprintf(buf + n, len - n, ", bias %s [%lld,%lld,%lld,%lld]", form[o->bias],
                          (long long)s[0], (long long)s[1], (long long)s[2], (long long)s[3]);
  }
  if (o->sinks && n < len) n += (size_t)snprintf(buf + n, len - n, ", sinks");
  if (o->params.num_splits && n < len)
    snprintf(buf + n, len - n, ", %d split%s", o->params.num_splits,
             o->params.num_splits == 1 ? "" : "s");
}

/* The cache line: capacity, pages, the lengths used, the appended rows. */
static void print_cache(const run_opts *o, const run_cache *c) {
  int64_t lo = INT64_MAX, hi = 0;
  for (int64_t b = 0; b < o->batch; b++) {
    if (c->lens[b] < lo) lo = c->lens[b];
    if (c->lens[b] > hi) hi = c->lens[b];
  }
  printf("  cache     %lld rows per sequence", (long long)c->cap);
  if (o->page_size)
    printf(", paged: %lld pages of %lld each, %lld in a shuffled block table",
           (long long)c->max_pages, (long long)o->page_size, (long long)c->num_pages);
  if (lo == hi)
    printf(", %lld keys used", (long long)hi);
  else
    printf(", keys used %lld to %lld", (long long)lo, (long long)hi);
  if (o->append) printf(" (the last %lld appended by the call)", (long long)o->nq);
  printf("\n");
}

static int run_problem(const run_opts *o, const char *title) {
  /* One copy of every tensor lives in host memory whatever the backend. */
  run_sizes z = sizes_of(o);
  double avail = cli_memory_available();
  if (z.tensors > avail) return too_big(o, "the tensors", z.tensors, avail, "memory");

  run_cache c;
  if (run_cache_make(o, &c)) {
    run_cache_free(&c);
    return cli_out_of_host_memory();
  }
  attn_context *ctx = NULL;
  int rc = attn_context_create(o->backend, &ctx);
  if (rc) {
    int r = cli_fail_ctx(ctx, rc, "cannot create a context");
    attn_context_free(ctx);
    run_cache_free(&c);
    return r;
  }
  attn_device_info info;
  attn_context_device_info(ctx, &info);

  /* Error against the double reference when it finishes in seconds. */
  double pairs = run_pairs(o, c.lens);
  double work = (double)o->hq * pairs * (double)o->d;
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
    run_cache_free(&c);
    return status;
  }
  rng_state = 0x9E3779B97F4A7C15ull ^ o->seed;

  attn_params p = o->params;
  float *slopes = NULL;
  run_tensors t;
  memset(&t, 0, sizeof t);
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
  if ((rc = make_tensors(ctx, o, &c, &t))) {
    status = rc == ATTN_ENOMEM && !attn_errmsg(ctx)[0]
                 ? cli_out_of_host_memory()
                 : cli_fail_ctx(ctx, rc, "cannot allocate the tensors");
    goto done;
  }
  p.seqused_k = t.seqused.buf ? &t.seqused.t : NULL;
  p.block_table = t.table.buf ? &t.table.t : NULL;
  p.k_new = t.k_new.buf ? &t.k_new.t : NULL;
  p.v_new = t.v_new.buf ? &t.v_new.t : NULL;
  p.bias = t.bias.buf ? &t.bias.t : NULL;
  p.sinks = t.sinks.buf ? &t.sinks.t : NULL;
  attn_params pb = p;
  pb.dbias = t.dbias.buf ? &t.dbias.t : NULL;
  pb.dsinks = t.dsinks.buf ? &t.dsinks.t : NULL;

  /* One untimed call first: kernel compilation and first-touch stay out.
   * Appending writes the same rows to the same places each time. */
  rc = attn_forward(ctx, &p, &t.q.t, &t.k.t, &t.v.t, &t.o.t, &t.lse.t);
  for (size_t r = 0; r < repeat && !rc; r++) {
    double t0 = run_now_s();
    rc = attn_forward(ctx, &p, &t.q.t, &t.k.t, &t.v.t, &t.o.t, &t.lse.t);
    tf[r] = run_now_s() - t0;
  }
  if (!rc && o->backward) {
    rc = attn_backward(ctx, &pb, &t.q.t, &t.k.t, &t.v.t, &t.o.t, &t.lse.t, &t.dout.t, &t.dq.t,
                       &t.dk.t, &t.dv.t);
    for (size_t r = 0; r < repeat && !rc; r++) {
      double t0 = run_now_s();
      rc = attn_backward(ctx, &pb, &t.q.t, &t.k.t, &t.v.t, &t.o.t, &t.lse.t, &t.dout.t, &t.dq.t,
                         &t.dk.t, &t.dv.t);
      tb[r] = run_now_s() - t0;
    }
  }
  if (rc) {
    status = cli_fail_ctx(ctx, rc, o->backward ? "attention failed" : "forward failed");
    goto done;
  }
  run_sort_times(tf, repeat);
  run_sort_times(tb, repeat);
  double flops = 4.0 * (double)o->hq * pairs * (double)o->d;
  char terms[160];
  describe_terms(o, &c, terms, sizeof terms);
  printf("%s\n", title);
  printf("  backend   %s:%d (%s)\n", attn_backend_name(info.backend), info.index, info.name);
  printf(
      "  problem   batch %lld, seqlen_q %lld, seqlen_k %lld, heads %lld/%lld, head_dim %lld, "
      "%s%s%s%s%s%s\n",
      (long long)o->batch, (long long)o->nq, (long long)o->nk, (long long)o->hq, (long long)o->hkv,
      (long long)o->d, attn_dtype_name(o->dtype),
      (p.flags & ATTN_ALLOW_TF32) ? " (TF32 allowed)" : "",
      (p.flags & ATTN_CAUSAL) ? ", causal" : "", p.softcap > 0 ? ", softcap" : "",
      o->alibi ? ", alibi" : "", terms);
  if (run_has_cache(o)) print_cache(o, &c);
  double mf = tf[repeat / 2];
  printf("  forward   %.3f ms median of %zu, %.1f GFLOP/s, %.1f GB/s\n", mf * 1e3, repeat,
         flops / mf * 1e-9, run_bytes_forward(o, &c) / mf * 1e-9);
  if (o->backward) {
    double mb = tb[repeat / 2];
    printf(
        "  backward  %.3f ms median of %zu, %.1f GFLOP/s (2.5x the forward's FLOPs), %.1f GB/s\n",
        mb * 1e3, repeat, 2.5 * flops / mb * 1e-9, run_bytes_backward(o) / mb * 1e-9);
  }
  if (!check) {
    printf("  error     not checked (problem too large for the reference; --check forces it)\n");
    goto done;
  }
  fflush(stdout); /* the results so far come before the reference's progress */
  status = run_check_reference(ctx, o, &c, &p, &t);
done:
  free(tf);
  free(tb);
  free_tensors(&t);
  free(slopes);
  attn_context_free(ctx);
  run_cache_free(&c);
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
