/*
 * attn_tune: times each configuration a backend offers for (dtype,
 * head_dim) on one problem in the context's device memory, and has the
 * backend keep the fastest. The backend says what its configurations are
 * and where a kept one lives (attn__backend.tune_*); this file only
 * measures: a forward and a backward of 8 heads over one sequence, each run
 * once to build and warm up, then timed TUNE_REPEAT times to the device's
 * completion, the medians summed.
 */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */

#include "attn_internal.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#define TUNE_HEADS 8
#define TUNE_REPEAT 3
#define TUNE_SEQLEN 1024
#define TUNE_MAX_SEQLEN (1 << 16)

enum { Q, K, V, O, DO, DQ, DK, DV, LSE, NBUF };

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Values in [-1, 1) of the dtype, from a fixed xorshift: every
 * configuration computes on the same data. */
static void fill(void *dst, attn_dtype dtype, size_t n, uint32_t seed) {
  uint32_t x = seed | 1u;
  for (size_t i = 0; i < n; ++i) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    const float f = (float)(x >> 8) * (2.0f / 16777216.0f) - 1.0f;
    if (dtype == ATTN_F32)
      ((float *)dst)[i] = f;
    else if (dtype == ATTN_F16)
      ((uint16_t *)dst)[i] = attn__f32_to_f16(f);
    else
      ((uint16_t *)dst)[i] = attn__f32_to_bf16(f);
  }
}

/* The median of TUNE_REPEAT runs of one pass, after one untimed run. */
static int time_pass(attn_context *ctx, int backward, const attn_params *p, const attn_tensor *t,
                     double *median) {
  double s[TUNE_REPEAT];
  for (int r = -1; r < TUNE_REPEAT; ++r) {
    const double t0 = now_s();
    int rc = backward ? attn__backward(ctx, p, &t[Q], &t[K], &t[V], &t[O], &t[LSE], &t[DO], &t[DQ],
                                       &t[DK], &t[DV])
                      : attn__forward(ctx, p, &t[Q], &t[K], &t[V], &t[O], &t[LSE]);
    if (!rc) rc = ctx->backend->synchronize(ctx);
    if (rc) return rc;
    if (r >= 0) s[r] = now_s() - t0;
  }
  for (int i = 1; i < TUNE_REPEAT; ++i)
    for (int j = i; j > 0 && s[j] < s[j - 1]; --j) {
      const double x = s[j];
      s[j] = s[j - 1];
      s[j - 1] = x;
    }
  *median = s[TUNE_REPEAT / 2];
  return ATTN_OK;
}

/* Configuration i measured: ATTN_OK with *seconds, ATTN_EUNSUPPORTED or
 * ATTN_EBUILD where it cannot run here (skipped), or the error. */
static int measure(attn_context *ctx, attn_dtype dtype, int64_t hd, int i, const attn_tensor *t,
                   double *seconds) {
  attn_params p;
  attn_params_init(&p);
  double f = 0, b = 0;
  int rc = ctx->backend->tune_use(ctx, dtype, hd, i);
  if (!rc) rc = time_pass(ctx, 0, &p, t, &f);
  if (!rc) rc = time_pass(ctx, 1, &p, t, &b);
  if (!rc) {
    attn__debug("tune: configuration %d: forward %.3f ms, backward %.3f ms", i, 1e3 * f, 1e3 * b);
    *seconds = f + b;
  } else if (rc == ATTN_EUNSUPPORTED || rc == ATTN_EBUILD) {
    attn__debug("tune: configuration %d does not run here: %s", i, ctx->errmsg);
    ctx->errmsg[0] = '\0';
  }
  return rc;
}

int attn__tune(attn_context *ctx, attn_dtype dtype, int64_t head_dim, int64_t seqlen) {
  const attn__backend *be = ctx->backend;
  if (dtype != ATTN_F32 && dtype != ATTN_F16 && dtype != ATTN_BF16)
    return attn__error(ctx, ATTN_EDTYPE, "dtype must be ATTN_F32, ATTN_F16 or ATTN_BF16");
  if (head_dim <= 0)
    return attn__error(ctx, ATTN_ESIZE, "head_dim %lld is not positive", (long long)head_dim);
  if (head_dim > ATTN_MAX_HEAD_DIM)
    return attn__error(ctx, ATTN_EHEADDIM, "head_dim %lld is above ATTN_MAX_HEAD_DIM (%d)",
                       (long long)head_dim, ATTN_MAX_HEAD_DIM);
  if (seqlen < 0 || seqlen > TUNE_MAX_SEQLEN)
    return attn__error(ctx, ATTN_ESIZE, "seqlen %lld is outside 0 (the default) to %d",
                       (long long)seqlen, TUNE_MAX_SEQLEN);
  const int n = be->tune_count ? be->tune_count(ctx, dtype, head_dim) : 0;
  if (n <= 0) {
    if (ctx->errmsg[0]) return ATTN_EUNSUPPORTED;
    return attn__error(ctx, ATTN_EUNSUPPORTED,
                       "the %s backend has no configurations to tune: its table is fixed when "
                       "the library is built",
                       be->name);
  }
  const int64_t N = seqlen ? seqlen : TUNE_SEQLEN;
  const size_t rows = (size_t)N * TUNE_HEADS, es = attn_dtype_size(dtype);
  const size_t elems = rows * (size_t)head_dim;

  attn_buffer buf[NBUF];
  attn_tensor t[NBUF];
  void *host = malloc(elems * es);
  int rc = host ? ATTN_OK : attn__error(ctx, ATTN_ENOMEM, "out of host memory for attn_tune");
  int made = 0;
  for (; !rc && made < NBUF; ++made) {
    const size_t bytes = made == LSE ? rows * sizeof(float) : elems * es;
    buf[made].ctx = ctx;
    buf[made].bytes = bytes;
    buf[made].owned = 1;
    rc = be->buffer_alloc(ctx, bytes, &buf[made].native);
    if (rc) break;
    t[made] = made == LSE ? attn_tensor_lse(NULL, 1, TUNE_HEADS, N)
                          : attn_tensor_bshd(NULL, dtype, 1, N, TUNE_HEADS, head_dim);
    t[made] = attn_tensor_on(t[made], &buf[made], 0);
    if (made == Q || made == K || made == V || made == DO) {
      fill(host, dtype, elems, 0x9e3779b9u * (uint32_t)(made + 1));
      rc = be->buffer_write(ctx, buf[made].native, 0, host, bytes);
    }
  }
  free(host);

  int best = -1;
  double best_s = 0;
  for (int i = 0; !rc && i < n; ++i) {
    double s = 0;
    const int r = measure(ctx, dtype, head_dim, i, t, &s);
    if (r == ATTN_EUNSUPPORTED || r == ATTN_EBUILD) continue;
    rc = r;
    if (!rc && (best < 0 || s < best_s)) {
      best = i;
      best_s = s;
    }
  }
  if (!rc && best < 0)
    rc = attn__error(ctx, ATTN_EUNSUPPORTED, "no configuration of the %s backend ran here",
                     be->name);
  if (!rc) {
    attn__debug("tune: configuration %d kept (%.3f ms forward and backward)", best, 1e3 * best_s);
    rc = be->tune_keep(ctx, dtype, head_dim, best);
  }
  if (made) be->synchronize(ctx);
  for (int i = 0; i < made && i < NBUF; ++i)
    if (buf[i].native) be->buffer_release(ctx, buf[i].native);
  return rc;
}
