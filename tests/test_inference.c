/*
 * The inference path on every backend: a KV cache with used lengths, rows
 * appended in place, paged K/V, key splitting, an additive bias and its
 * gradient, attention sinks and theirs, attn_merge, and metadata in device
 * buffers. Each result is held to the float64 reference (testkit/ref.c);
 * a backend that declines a feature (attn_supports) is skipped, saying so.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

/* ---------------------------------------------------------------------- */
/* Problems                                                                 */
/* ---------------------------------------------------------------------- */

enum { BIAS_BATCH = 1, BIAS_HEADS = 2, BIAS_ROWS = 4 }; /* dimensions that broadcast */

typedef struct icase {
  attn_dtype dt;
  int64_t B, Nq, cap, Hq, Hkv, d; /* cap: rows of k and v a sequence can hold */
  int32_t used[4];                /* used rows per sequence; has_used */
  int has_used;
  int64_t nnew;   /* rows appended */
  int64_t page;   /* page size; 0 = contiguous cache */
  unsigned flags; /* ATTN_CAUSAL */
  int64_t wl, wr; /* window, when win */
  int win;
  double softcap;
  int alibi;
  int bias; /* 0 none, else 1 + BIAS_* bits */
  attn_dtype bias_dt;
  int hide_row; /* bias -inf over every key of query row 0 of sequence 0, head 0 */
  int bias_odd; /* 1: scattered -inf and a row of the dtype's lowest value; 2: and a NaN;
                 * 3: the -inf and the NaN, no such row */
  int sinks;
  int splits;      /* params.num_splits */
  int device_meta; /* seqused_k, block_table, bias, sinks in device buffers */
} icase;

/* Everything one case allocates. */
typedef struct ibuf {
  icase c;
  attn_params p;
  int64_t pages, max_pages;
  void *q, *k, *v, *kn, *vn, *o, *bias, *k0, *v0;
  float *lse, *sinks;
  int32_t *used, *table;
  size_t kbytes, obytes;
  attn_tensor tq, tk, tv, tkn, tvn, to, tlse, tbias, tsinks, tused, ttable;
  attn_buffer *bufs[4];
  attn_tensor dbias_t, dused, dtable, dsinks_t; /* device copies of metadata */
} ibuf;

static uint64_t rng_state;
static double urand(void) {
  rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
  return (double)(rng_state >> 11) / 9007199254740992.0;
}

static void fill(void *p, attn_dtype dt, int64_t n, double amp) {
  for (int64_t i = 0; i < n; i++)
    attn__store(p, dt, i, (float)((2 * urand() - 1) * amp));
}

static void fill_nan(void *p, attn_dtype dt, int64_t n) {
  for (int64_t i = 0; i < n; i++)
    attn__store(p, dt, i, NAN);
}

/* A metadata tensor moved into a device buffer of the context. */
static attn_tensor on_device(at_backend *b, ibuf *x, int slot, const attn_tensor *t) {
  size_t bytes = (size_t)at_count(t) * attn_dtype_size(t->dtype);
  assert_int_equal(attn_buffer_create(b->ctx, bytes, &x->bufs[slot]), ATTN_OK);
  assert_int_equal(attn_buffer_write(b->ctx, x->bufs[slot], 0, t->data, bytes), ATTN_OK);
  return attn_tensor_on(*t, x->bufs[slot], 0);
}

static void ibuf_init(at_backend *b, ibuf *x, const icase *c) {
  memset(x, 0, sizeof *x);
  x->c = *c;
  rng_state = 0x9e3779b97f4a7c15ull ^ (uint64_t)(c->B * 131 + c->cap * 7 + c->page);
  const size_t es = attn_dtype_size(c->dt);
  const int64_t B = c->B, Nq = c->Nq, d = c->d, Hq = c->Hq, Hkv = c->Hkv;
  attn_params_init(&x->p);
  x->p.flags = c->flags;
  x->p.softcap = c->softcap;
  x->p.num_splits = c->splits;
  if (c->win) {
    x->p.window_left = c->wl;
    x->p.window_right = c->wr;
  }
  if (c->alibi) {
    static float slopes[64];
    for (int64_t h = 0; h < Hq; h++)
      slopes[h] = powf(2.0f, -8.0f * (float)(h + 1) / (float)Hq);
    x->p.alibi_slopes = slopes;
    x->p.alibi_count = Hq;
  }
  x->q = at_malloc((size_t)(B * Nq * Hq * d) * es);
  fill(x->q, c->dt, B * Nq * Hq * d, 1.5);
  x->tq = attn_tensor_bshd(x->q, c->dt, B, Nq, Hq, d);
  x->obytes = (size_t)(B * Nq * Hq * d) * es;
  x->o = at_malloc(x->obytes);
  fill_nan(x->o, c->dt, B * Nq * Hq * d);
  x->to = attn_tensor_bshd(x->o, c->dt, B, Nq, Hq, d);
  x->lse = at_malloc(sizeof(float) * (size_t)(B * Hq * Nq));
  fill_nan(x->lse, ATTN_F32, B * Hq * Nq);
  x->tlse = attn_tensor_lse(x->lse, B, Hq, Nq);

  /* The cache: every row nobody may read (past the used rows) is NaN, so a
   * backend that reads one shows it in o. */
  int64_t rows;
  if (c->page) {
    x->max_pages = (c->cap + c->page - 1) / c->page;
    x->pages = B * x->max_pages + 3;
    rows = x->pages * c->page;
  } else {
    rows = B * c->cap;
  }
  const int64_t n = rows * Hkv * d;
  x->kbytes = (size_t)n * es;
  x->k = at_malloc(x->kbytes);
  x->v = at_malloc(x->kbytes);
  fill_nan(x->k, c->dt, n);
  fill_nan(x->v, c->dt, n);
  if (c->page) {
    /* A shuffled table: sequence b's page p is some page of the pool. */
    x->table = at_malloc(sizeof(int32_t) * (size_t)(B * x->max_pages));
    int32_t *perm = at_malloc(sizeof(int32_t) * (size_t)x->pages);
    for (int64_t i = 0; i < x->pages; i++)
      perm[i] = (int32_t)i;
    for (int64_t i = x->pages - 1; i > 0; i--) {
      int64_t j = (int64_t)(urand() * (double)(i + 1));
      int32_t t = perm[i];
      perm[i] = perm[j];
      perm[j] = t;
    }
    for (int64_t i = 0; i < B * x->max_pages; i++)
      x->table[i] = perm[i];
    x->ttable = attn_tensor_2d(x->table, ATTN_I32, B, x->max_pages);
    x->p.block_table = &x->ttable;
    x->tk = attn_tensor_bshd(x->k, c->dt, x->pages, c->page, Hkv, d);
    x->tv = attn_tensor_bshd(x->v, c->dt, x->pages, c->page, Hkv, d);
  } else {
    x->tk = attn_tensor_bshd(x->k, c->dt, B, c->cap, Hkv, d);
    x->tv = attn_tensor_bshd(x->v, c->dt, B, c->cap, Hkv, d);
  }
  /* Used rows get values: row j of sequence b, through the table when paged. */
  for (int64_t bb = 0; bb < B; bb++) {
    const int64_t u = c->has_used ? c->used[bb] : c->cap;
    for (int64_t j = 0; j < u; j++) {
      int64_t row = c->page
                        ? (int64_t)x->table[bb * x->max_pages + j / c->page] * c->page + j % c->page
                        : bb * c->cap + j;
      fill((char *)x->k + (size_t)(row * Hkv * d) * es, c->dt, Hkv * d, 1.5);
      fill((char *)x->v + (size_t)(row * Hkv * d) * es, c->dt, Hkv * d, 1.0);
    }
  }
  x->k0 = at_malloc(x->kbytes);
  x->v0 = at_malloc(x->kbytes);
  memcpy(x->k0, x->k, x->kbytes);
  memcpy(x->v0, x->v, x->kbytes);
  if (c->has_used) {
    x->used = at_malloc(sizeof(int32_t) * (size_t)B);
    memcpy(x->used, c->used, sizeof(int32_t) * (size_t)B);
    x->tused = attn_tensor_1d(x->used, ATTN_I32, B);
    x->p.seqused_k = &x->tused;
  }
  if (c->nnew) {
    x->kn = at_malloc((size_t)(B * c->nnew * Hkv * d) * es);
    x->vn = at_malloc((size_t)(B * c->nnew * Hkv * d) * es);
    fill(x->kn, c->dt, B * c->nnew * Hkv * d, 1.5);
    fill(x->vn, c->dt, B * c->nnew * Hkv * d, 1.0);
    x->tkn = attn_tensor_bshd(x->kn, c->dt, B, c->nnew, Hkv, d);
    x->tvn = attn_tensor_bshd(x->vn, c->dt, B, c->nnew, Hkv, d);
    x->p.k_new = &x->tkn;
    x->p.v_new = &x->tvn;
  }
  if (c->bias) {
    const int m = c->bias - 1;
    const int64_t bb = m & BIAS_BATCH ? 1 : B, bh = m & BIAS_HEADS ? 1 : Hq,
                  bq = m & BIAS_ROWS ? 1 : Nq, bk = c->page ? x->max_pages * c->page : c->cap;
    const int64_t nb = bb * bh * bq * bk;
    x->bias = at_malloc((size_t)nb * attn_dtype_size(c->bias_dt));
    fill(x->bias, c->bias_dt, nb, 2.0);
    if (c->hide_row)
      for (int64_t j = 0; j < bk; j++)
        attn__store(x->bias, c->bias_dt, j, -INFINITY);
    if (c->bias_odd) {
      /* Sequence 0, head 0: -inf in row 5 every 37 keys, the lowest finite
       * value (a mask written as the dtype's minimum) over row 1, and a NaN
       * in row 2 (bias_odd 2), which must make row 2 NaN and no other. */
      const double lowest = c->bias_dt == ATTN_F16    ? -65504.0
                            : c->bias_dt == ATTN_BF16 ? -3.38953139e38
                                                      : -3.40282347e38;
      for (int64_t j = 0; j < bk; j++) {
        if (c->bias_odd != 3) attn__store(x->bias, c->bias_dt, bk + j, lowest);
        if (j % 37 == 3) attn__store(x->bias, c->bias_dt, 5 * bk + j, -INFINITY);
      }
      if (c->bias_odd > 1) attn__store(x->bias, c->bias_dt, 2 * bk + 5, NAN);
    }
    x->tbias = attn_tensor_bias(x->bias, c->bias_dt, bb, bh, bq, bk);
    x->p.bias = &x->tbias;
  }
  if (c->sinks) {
    x->sinks = at_malloc(sizeof(float) * (size_t)Hq);
    for (int64_t h = 0; h < Hq; h++)
      x->sinks[h] = (float)(3 * urand() - 1);
    x->tsinks = attn_tensor_1d(x->sinks, ATTN_F32, Hq);
    x->p.sinks = &x->tsinks;
  }
  if (c->device_meta) {
    if (c->has_used) x->dused = on_device(b, x, 0, &x->tused), x->p.seqused_k = &x->dused;
    if (c->page) x->dtable = on_device(b, x, 1, &x->ttable), x->p.block_table = &x->dtable;
    if (c->bias) x->dbias_t = on_device(b, x, 2, &x->tbias), x->p.bias = &x->dbias_t;
    if (c->sinks) x->dsinks_t = on_device(b, x, 3, &x->tsinks), x->p.sinks = &x->dsinks_t;
  }
}

static void ibuf_free(ibuf *x) {
  for (int i = 0; i < 4; i++)
    attn_buffer_free(x->bufs[i]);
}

/* The reference reads host memory: the case's params with host metadata. */
static attn_params host_params(const ibuf *x) {
  attn_params p = x->p;
  if (x->c.has_used) p.seqused_k = &x->tused;
  if (x->c.page) p.block_table = &x->ttable;
  if (x->c.bias) p.bias = &x->tbias;
  if (x->c.sinks) p.sinks = &x->tsinks;
  return p;
}

/* Skips when the backend declines the case, with its reason. */
static int declined(at_backend *b, const attn_params *p, const attn_tensor *q, const attn_tensor *k,
                    const attn_tensor *v, int backward) {
  int rc = attn_supports(b->ctx, p, q, k, v, backward);
  if (rc == ATTN_EUNSUPPORTED) return 1;
  assert_int_equal(rc, ATTN_OK);
  return 0;
}
#define SKIP_IF_DECLINED(b, p, q, k, v, bwd)                                                    \
  do {                                                                                          \
    if (declined(b, p, q, k, v, bwd)) at_skip("%s declines: %s", b->name, attn_errmsg(b->ctx)); \
  } while (0)

/* max |got - ref| over n elements against tol * max(1, max|ref|); -inf in
 * ref must be -inf in got, NaN in ref NaN in got, and NaN nowhere else. */
static void expect_near(const char *what, const void *got, attn_dtype dt, const double *ref,
                        int64_t n, double tol) {
  double mx = 1, err = 0;
  int64_t worst = 0;
  for (int64_t i = 0; i < n; i++)
    if (isfinite(ref[i]) && fabs(ref[i]) > mx) mx = fabs(ref[i]);
  for (int64_t i = 0; i < n; i++) {
    const double g = attn__load(got, dt, i);
    if (isnan(ref[i])) {
      if (!isnan(g)) fail_msg("%s[%lld] is %g; want NaN", what, (long long)i, g);
      continue;
    }
    if (isnan(g)) fail_msg("%s[%lld] is NaN; the reference is %g", what, (long long)i, ref[i]);
    if (isinf(ref[i])) {
      if (g != ref[i]) fail_msg("%s[%lld] is %g; want %g", what, (long long)i, g, ref[i]);
      continue;
    }
    if (fabs(g - ref[i]) > err) err = fabs(g - ref[i]), worst = i;
  }
  if (err > tol * mx)
    fail_msg(
        "%s: max error %.3g > %.3g (tol %.2g * max(1, max|ref|) %.3g) at [%lld]: got %.9g, "
        "want %.9g",
        what, err, tol * mx, tol, mx, (long long)worst, attn__load(got, dt, worst), ref[worst]);
}

/* Runs the case's forward and holds o and lse to the reference; with an
 * append, the cache must then hold the new rows where they belong and be
 * unchanged elsewhere. */
static void run_forward(at_backend *b, const icase *c) {
  ibuf x;
  ibuf_init(b, &x, c);
  SKIP_IF_DECLINED(b, &x.p, &x.tq, &x.tk, &x.tv, 0);
  const int64_t no = c->B * c->Nq * c->Hq * c->d, nl = c->B * c->Hq * c->Nq;
  double *ro = at_malloc(sizeof(double) * (size_t)no), *rl = at_malloc(sizeof(double) * (size_t)nl);
  attn_params hp = host_params(&x);
  assert_int_equal(at_ref_forward(b->ctx, &hp, &x.tq, &x.tk, &x.tv, ro, rl), ATTN_OK);
  int rc = attn_forward(b->ctx, &x.p, &x.tq, &x.tk, &x.tv, &x.to, &x.tlse);
  if (rc) fail_msg("attn_forward: %s: %s", attn_status_name(rc), attn_errmsg(b->ctx));
  /* The planted NaN reaches the reference's row 2 (b 0, head 0). */
  if (c->bias_odd > 1) assert_true(isnan(ro[2 * c->Hq * c->d]));
  expect_near("o", x.o, c->dt, ro, no, at_tol_o(c->dt));
  double *rlse = rl;
  float *lse = x.lse;
  for (int64_t i = 0; i < nl; i++)
    if (isinf(rlse[i]) != isinf((double)lse[i]) || isnan(rlse[i]) != isnan((double)lse[i]) ||
        (isfinite(rlse[i]) && fabs(lse[i] - rlse[i]) > 1e-4 * fmax(1, fabs(rlse[i]))))
      fail_msg("lse[%lld] is %.9g; want %.9g", (long long)i, lse[i], rlse[i]);
  /* A row the reference says saw no key is exactly 0. */
  for (int64_t bb = 0; bb < c->B; bb++)
    for (int64_t h = 0; h < c->Hq; h++)
      for (int64_t i = 0; i < c->Nq; i++)
        if (rlse[(bb * c->Hq + h) * c->Nq + i] == -INFINITY)
          for (int64_t col = 0; col < c->d; col++) {
            double g = attn__load(x.o, c->dt, ((bb * c->Nq + i) * c->Hq + h) * c->d + col);
            if (g != 0)
              fail_msg("o is %g in a row that sees no key (b %lld h %lld i %lld)", g, (long long)bb,
                       (long long)h, (long long)i);
          }
  if (c->nnew) {
    /* Where each new row must now be, the rest unchanged. */
    const size_t es = attn_dtype_size(c->dt), rowb = (size_t)(c->Hkv * c->d) * es;
    for (int64_t bb = 0; bb < c->B; bb++)
      for (int64_t r = 0; r < c->nnew; r++) {
        const int64_t j = c->used[bb] + r;
        const int64_t row =
            c->page ? (int64_t)x.table[bb * x.max_pages + j / c->page] * c->page + j % c->page
                    : bb * c->cap + j;
        memcpy((char *)x.k0 + (size_t)row * rowb, (char *)x.kn + (size_t)(bb * c->nnew + r) * rowb,
               rowb);
        memcpy((char *)x.v0 + (size_t)row * rowb, (char *)x.vn + (size_t)(bb * c->nnew + r) * rowb,
               rowb);
      }
  }
  /* NaN-filled rows compare equal as bytes. */
  if (memcmp(x.k0, x.k, x.kbytes) != 0)
    fail_msg("k: the cache differs from what it should hold after the call");
  if (memcmp(x.v0, x.v, x.kbytes) != 0)
    fail_msg("v: the cache differs from what it should hold after the call");
  ibuf_free(&x);
}

/* ---------------------------------------------------------------------- */
/* KV cache                                                                 */
/* ---------------------------------------------------------------------- */

static void decode_reads_only_the_used_rows(at_backend *b) {
  icase c = {.dt = ATTN_F32,
             .B = 3,
             .Nq = 1,
             .cap = 100,
             .Hq = 8,
             .Hkv = 2,
             .d = 64,
             .used = {37, 100, 1},
             .has_used = 1};
  run_forward(b, &c);
  c.dt = ATTN_BF16;
  c.d = 128;
  run_forward(b, &c);
}

static void causal_rows_align_to_the_used_length(at_backend *b) {
  icase c = {.dt = ATTN_F16,
             .B = 2,
             .Nq = 4,
             .cap = 70,
             .Hq = 4,
             .Hkv = 4,
             .d = 32,
             .used = {9, 66},
             .has_used = 1,
             .flags = ATTN_CAUSAL};
  run_forward(b, &c);
  c.win = 1, c.wl = 5, c.wr = 0;
  run_forward(b, &c);
}

static void appended_rows_land_in_the_cache_and_are_seen(at_backend *b) {
  icase c = {.dt = ATTN_F32,
             .B = 2,
             .Nq = 3,
             .cap = 40,
             .Hq = 6,
             .Hkv = 2,
             .d = 64,
             .used = {0, 30},
             .has_used = 1,
             .nnew = 3,
             .flags = ATTN_CAUSAL};
  run_forward(b, &c);
  c.dt = ATTN_BF16;
  c.nnew = 3;
  c.used[1] = 37; /* the last rows of the capacity */
  run_forward(b, &c);
}

static void paged_cache_any_page_size(at_backend *b) {
  const int64_t sizes[] = {1, 3, 16, 64};
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    icase c = {.dt = ATTN_BF16,
               .B = 3,
               .Nq = 1,
               .cap = 90,
               .Hq = 8,
               .Hkv = 2,
               .d = 64,
               .used = {90, 17, 1},
               .has_used = 1,
               .page = sizes[i]};
    run_forward(b, &c);
    if (b->small) break;
  }
}

static void paged_cache_without_used_lengths(at_backend *b) {
  icase c = {.dt = ATTN_F32,
             .B = 2,
             .Nq = 5,
             .cap = 48,
             .Hq = 2,
             .Hkv = 1,
             .d = 32,
             .page = 16,
             .flags = ATTN_CAUSAL};
  run_forward(b, &c);
}

static void paged_append_with_causal_rows(at_backend *b) {
  icase c = {.dt = ATTN_F16,
             .B = 2,
             .Nq = 2,
             .cap = 50,
             .Hq = 4,
             .Hkv = 2,
             .d = 64,
             .used = {15, 31},
             .has_used = 1,
             .nnew = 2,
             .page = 16,
             .flags = ATTN_CAUSAL};
  run_forward(b, &c);
}

static void metadata_in_device_buffers(at_backend *b) {
  icase c = {.dt = ATTN_F32,
             .B = 2,
             .Nq = 1,
             .cap = 64,
             .Hq = 4,
             .Hkv = 2,
             .d = 32,
             .used = {20, 64},
             .has_used = 1,
             .page = 8,
             .bias = 1,
             .bias_dt = ATTN_F32,
             .sinks = 1,
             .device_meta = 1};
  run_forward(b, &c);
}

/* cu_seqlens and the ALiBi slopes as tensors in device buffers: the
 * answers of the host pointers (checked against the reference), forward
 * and backward. Malformed offsets there are clamped on a GPU, where nothing
 * checks them (no element outside o and lse is written), and refused where
 * the buffers are host memory, which is checked as the pointers are. */
static void offsets_and_slopes_in_device_buffers(at_backend *b) {
  static const int32_t cu_q[4] = {0, 7, 7, 40}, cu_k[4] = {0, 30, 45, 75};
  const at_shape s = {.dtype = ATTN_BF16,
                      .B = 3,
                      .Hq = 4,
                      .Hkv = 2,
                      .d = 64,
                      .cu_q = cu_q,
                      .cu_k = cu_k,
                      .flags = ATTN_CAUSAL | ATTN_DETERMINISTIC,
                      .alibi = 1};
  if (!at_check_backward(b, &s)) at_skip("%s declines: %s", b->name, attn_errmsg(b->ctx));
  at_prob P;
  at_prob_init(&P, &s);
  attn_params hp = P.p;
  int rc = attn_forward(b->ctx, &hp, &P.q, &P.k, &P.v, &P.o, &P.lse);
  assert_int_equal(rc, ATTN_OK);
  rc = attn_backward(b->ctx, &hp, &P.q, &P.k, &P.v, &P.o, &P.lse, &P.dout, &P.dq, &P.dk, &P.dv);
  assert_int_equal(rc, ATTN_OK);
  /* The host run's results, contiguous. */
  const attn_tensor *outs[5] = {&P.o, &P.lse, &P.dq, &P.dk, &P.dv};
  const char *names[5] = {"o", "lse", "dq", "dk", "dv"};
  double *host[5];
  for (int i = 0; i < 5; i++) {
    const int64_t n = at_count(outs[i]);
    host[i] = at_malloc(sizeof(double) * (size_t)n);
    for (int64_t j = 0; j < n; j++)
      host[i][j] = at_get(outs[i], j);
  }
  attn_buffer *bufs[3];
  const void *src[3] = {cu_q, cu_k, P.alibi};
  const size_t bytes[3] = {sizeof cu_q, sizeof cu_k, sizeof(float) * (size_t)s.Hq};
  for (int i = 0; i < 3; i++) {
    assert_int_equal(attn_buffer_create(b->ctx, bytes[i], &bufs[i]), ATTN_OK);
    assert_int_equal(attn_buffer_write(b->ctx, bufs[i], 0, src[i], bytes[i]), ATTN_OK);
  }
  attn_tensor tcq = attn_tensor_on(attn_tensor_1d(NULL, ATTN_I32, 4), bufs[0], 0);
  attn_tensor tck = attn_tensor_on(attn_tensor_1d(NULL, ATTN_I32, 4), bufs[1], 0);
  attn_tensor tal = attn_tensor_on(attn_tensor_1d(NULL, ATTN_F32, s.Hq), bufs[2], 0);
  attn_params dp = P.p;
  dp.cu_seqlens_q = dp.cu_seqlens_k = NULL;
  dp.alibi_slopes = NULL;
  dp.alibi_count = 0;
  dp.cu_seqlens_q_tensor = &tcq;
  dp.cu_seqlens_k_tensor = &tck;
  dp.alibi_slopes_tensor = &tal;
  at_prob_reset_outputs(&P);
  rc = attn_forward(b->ctx, &dp, &P.q, &P.k, &P.v, &P.o, &P.lse);
  if (rc) fail_msg("attn_forward: %s: %s", attn_status_name(rc), attn_errmsg(b->ctx));
  rc = attn_backward(b->ctx, &dp, &P.q, &P.k, &P.v, &P.o, &P.lse, &P.dout, &P.dq, &P.dk, &P.dv);
  if (rc) fail_msg("attn_backward: %s: %s", attn_status_name(rc), attn_errmsg(b->ctx));
  for (int i = 0; i < 5; i++) {
    /* A plan may differ (the host no longer knows the longest sequence):
     * within the tolerance, not bit for bit. */
    const int64_t n = at_count(outs[i]);
    double mx = 1, err = 0;
    for (int64_t j = 0; j < n; j++) {
      const double x = host[i][j], y = at_get(outs[i], j);
      if (isinf(x) ? x != y : !isfinite(y))
        fail_msg("%s[%lld] is %g; with host offsets %g", names[i], (long long)j, y, x);
      if (isfinite(x) && fabs(x) > mx) mx = fabs(x);
      if (isfinite(x) && fabs(x - y) > err) err = fabs(x - y);
    }
    const double tol = i < 2 ? at_tol_o(s.dtype) : at_tol_grad(s.dtype);
    if (err > tol * mx)
      fail_msg("%s differs from the host offsets' by %g (tolerance %g)", names[i], err / mx, tol);
  }

  /* Each form once; int32, contiguous. */
  attn_params both = dp;
  both.cu_seqlens_q = cu_q;
  int32_t spaced[8] = {0, 0, 7, 0, 7, 0, 40, 0};
  attn_tensor strided = attn_tensor_1d(spaced, ATTN_I32, 4);
  strided.stride[0] = 2;
  attn_params str = dp;
  str.cu_seqlens_q_tensor = &strided;
  attn_tensor f32 = tal;
  attn_params typ = dp;
  typ.cu_seqlens_k_tensor = &f32;
  const attn_params *wrong[3] = {&both, &str, &typ};
  const int want[3] = {ATTN_EINVAL, ATTN_ESTRIDE, ATTN_EDTYPE};
  const char *named[3] = {"cu_seqlens_q_tensor", "cu_seqlens_q_tensor", "cu_seqlens_k_tensor"};
  for (int i = 0; i < 3; i++) {
    at_prob_reset_outputs(&P);
    rc = attn_forward(b->ctx, wrong[i], &P.q, &P.k, &P.v, &P.o, &P.lse);
    assert_int_equal(rc, want[i]);
    assert_true(at_mentions(attn_errmsg(b->ctx), named[i]));
    assert_true(isnan(at_get(&P.o, 0)));
  }

  /* Malformed: decreasing, negative, past the rows. */
  static const int32_t bad[4] = {5, -3, 1000, 2};
  assert_int_equal(attn_buffer_write(b->ctx, bufs[0], 0, bad, sizeof bad), ATTN_OK);
  assert_int_equal(attn_buffer_write(b->ctx, bufs[1], 0, bad, sizeof bad), ATTN_OK);
  at_prob_reset_outputs(&P);
  rc = attn_forward(b->ctx, &dp, &P.q, &P.k, &P.v, &P.o, &P.lse);
  if (b->kind == ATTN_BACKEND_CPU) {
    assert_int_equal(rc, ATTN_ESEQLENS);
    assert_true(at_mentions(attn_errmsg(b->ctx), "cu_seqlens_q_tensor"));
  } else {
    if (rc)
      fail_msg("attn_forward, malformed offsets: %s: %s", attn_status_name(rc),
               attn_errmsg(b->ctx));
    assert_true(at_padding_intact(&P.mo));
    assert_true(at_padding_intact(&P.mlse));
  }
  for (int i = 0; i < 3; i++)
    attn_buffer_free(bufs[i]);
  for (int i = 0; i < 5; i++)
    at_free(host[i]);
  at_prob_free(&P);
}

static void splits_give_the_same_answer(at_backend *b) {
  const int splits[] = {1, 2, 3, 0, 64};
  for (size_t i = 0; i < sizeof splits / sizeof splits[0]; i++) {
    icase c = {.dt = ATTN_F32,
               .B = 1,
               .Nq = 1,
               .cap = 300,
               .Hq = 8,
               .Hkv = 2,
               .d = 64,
               .used = {300},
               .has_used = 1,
               .splits = splits[i],
               .sinks = 1};
    run_forward(b, &c);
    c.flags = ATTN_CAUSAL, c.Nq = 3, c.bias = 1, c.bias_dt = ATTN_F32;
    run_forward(b, &c);
    /* A part's weight must survive a row whose scores are all near bf16's
     * lowest value, where m + log(l) in float32 is m: the merge weighs
     * the parts by their sums, not by a rounded lse (CUDA's tensor cores
     * leave such a row undefined: the -inf and the NaN alone there). */
    c.dt = c.bias_dt = ATTN_BF16, c.sinks = 0;
    c.bias_odd = b->kind == ATTN_BACKEND_CUDA ? 3 : 2;
    run_forward(b, &c);
  }
}

/* ---------------------------------------------------------------------- */
/* Score terms                                                              */
/* ---------------------------------------------------------------------- */

/* A bias full and broadcast, of f32 and of a 16-bit dtype, over f32 and bf16
 * data: plain, then causal under softcap and ALiBi, then (bf16) at a head
 * dim of the widest tensor-core tiles, where an f32 bias no longer fits
 * beside K and V in NVIDIA OpenCL's local memory. Keys and rows are not
 * whole tiles, so every tile has ragged edges. */
static void bias_full_and_broadcast(at_backend *b) {
  const int forms[] = {1, 1 + BIAS_BATCH, 1 + BIAS_HEADS, 1 + BIAS_BATCH + BIAS_HEADS + BIAS_ROWS};
  for (size_t i = 0; i < sizeof forms / sizeof forms[0]; i++) {
    icase c = {.dt = ATTN_F32,
               .B = 2,
               .Nq = 33,
               .cap = 47,
               .Hq = 4,
               .Hkv = 2,
               .d = 32,
               .bias = forms[i],
               .bias_dt = i % 2 ? ATTN_BF16 : ATTN_F32};
    run_forward(b, &c);
    c.dt = ATTN_BF16, c.flags = ATTN_CAUSAL, c.softcap = 20, c.alibi = 1;
    run_forward(b, &c);
    c.d = 100;
    run_forward(b, &c);
  }
}

static void bias_minus_inf_hides_a_whole_row(at_backend *b) {
  icase c = {.dt = ATTN_F16,
             .B = 1,
             .Nq = 20,
             .cap = 20,
             .Hq = 2,
             .Hkv = 1,
             .d = 64,
             .bias = 1,
             .bias_dt = ATTN_F32,
             .hide_row = 1,
             .flags = ATTN_CAUSAL};
  run_forward(b, &c);
  c.sinks = 1; /* the hidden row then has lse = sink */
  run_forward(b, &c);
}

/* A bias of the data's dtype over whole key blocks, at the tensor-core
 * kernels' head dims, holding every kind of value: finite ones, -inf, the
 * dtype's lowest value over a whole row (a mask written as the minimum,
 * under which the row is still a softmax of its scores) and a NaN that must
 * make its own row NaN and no other. A row of bf16's lowest value is beyond
 * float32's softmax on CUDA's tensor cores (attn.h), which take rows of any
 * length (150 keys): there bf16 plants the -inf and the NaN alone. */
static void bias_of_every_kind_of_value(at_backend *b) {
  const attn_dtype dts[] = {ATTN_BF16, ATTN_F16};
  const int64_t dims[] = {64, 128};
  for (int i = 0; i < 2; i++)
    for (int j = 0; j < 2; j++)
      for (int kind = 0; kind <= 2; kind++) {
        const int odd = kind && dts[i] == ATTN_BF16 && b->kind == ATTN_BACKEND_CUDA ? 3 : kind;
        icase c = {.dt = dts[i],
                   .B = 2,
                   .Nq = 150,
                   .cap = 150,
                   .Hq = 2,
                   .Hkv = 1,
                   .d = dims[j],
                   .bias = 1,
                   .bias_dt = dts[i],
                   .bias_odd = odd};
        run_forward(b, &c);
      }
}

/* A bias of the data's dtype whose rows are 16-byte aligned (keys a
 * multiple of 8), full and broadcast over each dimension, at the
 * tensor-core head dims, plain, causal and under the score transforms,
 * with -inf, f16's lowest value and a NaN among its entries: the layout
 * the Hopper forward brings in by TMA (a row of one where the rows
 * broadcast) and reads back through ldmatrix. A row of bf16's lowest value
 * is beyond float32's softmax on CUDA's tensor cores (attn.h), so bf16
 * cases plant the -inf and the NaN alone. */
static void bias_in_aligned_rows(at_backend *b) {
  const int forms[] = {1, 1 + BIAS_BATCH + BIAS_HEADS, 1 + BIAS_ROWS, 1 + BIAS_HEADS};
  const int64_t dims[] = {64, 96, 128, 256};
  for (int i = 0; i < 4; i++)
    for (int j = 0; j < 4; j++) {
      const attn_dtype dt = (i + j) % 2 ? ATTN_F16 : ATTN_BF16;
      icase c = {.dt = dt,
                 .B = 2,
                 .Nq = 137,
                 .cap = 200,
                 .Hq = 4,
                 .Hkv = 2,
                 .d = dims[j],
                 .bias = forms[i],
                 .bias_dt = dt,
                 .bias_odd = (forms[i] - 1) & BIAS_ROWS ? 0
                             : dt == ATTN_BF16          ? 3
                                                        : (i + j) % 3};
      run_forward(b, &c);
      c.flags = ATTN_CAUSAL;
      c.softcap = i % 2 ? 30 : 0;
      c.alibi = i == 2;
      c.sinks = i == 3;
      run_forward(b, &c);
    }
}

/* A chunk of prefill over a KV cache at the tensor-core head dims: query
 * rows enough to leave the decoding kernels, used lengths that differ per
 * sequence (one empty), the chunk's rows appended, causal rows aligned to
 * the used length, then sinks and a bias as well; the cache past the used
 * rows holds NaN (ibuf_init), which no output may see. */
static void cache_prefill_at_the_tensor_core_dims(at_backend *b) {
  const int64_t dims[] = {64, 96, 128, 256};
  for (int j = 0; j < 4; j++) {
    icase c = {.dt = j % 2 ? ATTN_F16 : ATTN_BF16,
               .B = 2,
               .Nq = 70,
               .cap = 256,
               .Hq = 4,
               .Hkv = 2,
               .d = dims[j],
               .used = {0, 150},
               .has_used = 1,
               .nnew = 70,
               .flags = ATTN_CAUSAL};
    run_forward(b, &c);
    c.used[0] = 45;
    c.sinks = 1;
    c.bias = 1;
    c.bias_dt = c.dt;
    run_forward(b, &c);
  }
}

/* More tiles than a GPU runs at once (the H200 holds 132 blocks of the
 * Hopper forward, which then walks several tiles a block): the pipelines
 * must carry over from one tile to the next, through tiles of different
 * lengths (causal among them), tiles with no key (sequence 0's used length
 * of 0) and a bias and sinks; at d = 256 the consumers do not take turns.
 * 2 query blocks x 72 heads x 2 sequences = 288 tiles. */
static void more_tiles_than_blocks_at_once(at_backend *b) {
  icase c = {.dt = ATTN_BF16, .B = 2, .Nq = 130, .cap = 300, .Hq = 72, .Hkv = 8, .d = 64};
  run_forward(b, &c);
  c.flags = ATTN_CAUSAL; /* tiles of different lengths, heaviest first */
  run_forward(b, &c);
  c.flags = 0;
  c.has_used = 1;
  c.used[0] = 0;
  c.used[1] = 290;
  run_forward(b, &c);
  c.used[0] = 140;
  c.bias = 1;
  c.bias_dt = c.dt;
  c.sinks = 1;
  run_forward(b, &c);
  icase w = {.dt = ATTN_F16,
             .B = 2,
             .Nq = 130,
             .cap = 300,
             .Hq = 72,
             .Hkv = 8,
             .d = 256,
             .has_used = 1,
             .used = {0, 200}};
  run_forward(b, &w);
}

static void run_backward(at_backend *b, const icase *c);

/* The cases of the OpenCL tensor-core test, on one context. */
static void tensor_core_cases(at_backend *b) {
  const int64_t dims[] = {32, 64, 96, 128};
  for (int j = 0; j < 4; j++) {
    icase c = {.dt = j % 2 ? ATTN_F16 : ATTN_BF16,
               .B = 2,
               .Nq = 130,
               .cap = 200,
               .Hq = 8,
               .Hkv = 2,
               .d = dims[j]};
    run_forward(b, &c);
    c.flags = ATTN_CAUSAL;
    run_forward(b, &c);
    /* f32, each product as three TF32 ones: every bucket, causal. */
    c.dt = ATTN_F32;
    run_forward(b, &c);
    c.flags = 0;
    run_forward(b, &c);
  }
  /* f32 with a bias of each staging (an f32 one at d = 64, which its lanes
   * load; a bf16 one, staged), softcap, sinks, ALiBi, the keys split; over
   * pages with used lengths; and its gradients on the tensor cores too, a
   * bias's gradient per element and summed over broadcast rows. */
  icase f = {.dt = ATTN_F32,
             .B = 2,
             .Nq = 77,
             .cap = 300,
             .Hq = 8,
             .Hkv = 2,
             .d = 64,
             .bias = 1,
             .bias_dt = ATTN_F32,
             .sinks = 1,
             .softcap = 30,
             .alibi = 1,
             .splits = 3};
  run_forward(b, &f);
  f.d = 32;
  f.bias_dt = ATTN_BF16;
  f.page = 16;
  f.has_used = 1;
  f.used[0] = 0;
  f.used[1] = 290;
  f.splits = 0;
  run_forward(b, &f);
  icase fg = {.dt = ATTN_F32,
              .B = 2,
              .Nq = 100,
              .cap = 90,
              .Hq = 4,
              .Hkv = 2,
              .d = 64,
              .bias = 1,
              .bias_dt = ATTN_F32,
              .flags = ATTN_CAUSAL};
  run_backward(b, &fg);
  fg.d = 32;
  fg.bias = 1 + BIAS_ROWS;
  fg.bias_dt = ATTN_BF16;
  fg.softcap = 15;
  fg.sinks = 1;
  run_backward(b, &fg);
  /* Above d = 64, where Q's, dO's and K's last halves stay in local
   * memory and dQ keeps three tiles of K and V, its bias loaded by the
   * lanes: a bf16 bias summed over rows, an f32 one per element. */
  fg.d = 128;
  run_backward(b, &fg);
  fg.d = 96;
  fg.bias = 1;
  fg.bias_dt = ATTN_F32;
  fg.sinks = 0;
  fg.Nq = 130;
  run_backward(b, &fg);
  icase c = {.dt = ATTN_BF16,
             .B = 2,
             .Nq = 77,
             .cap = 300,
             .Hq = 8,
             .Hkv = 2,
             .d = 128,
             .has_used = 1,
             .used = {0, 290},
             .page = 16,
             .bias = 1,
             .bias_dt = ATTN_BF16,
             .sinks = 1,
             .softcap = 30,
             .alibi = 1};
  run_forward(b, &c);
  icase s = {.dt = ATTN_F16, .B = 1, .Nq = 3, .cap = 2000, .Hq = 8, .Hkv = 8, .d = 64, .splits = 3};
  run_forward(b, &s);
  s.win = 1;
  s.wl = 700;
  s.wr = 0;
  run_forward(b, &s);
  /* Decoding, whose configs on the tensor cores take 16 rows a work-group
   * (decode_mma.cl): 8 query heads of 5 rows per key/value head make three
   * blocks, the last of 8, over pages with used lengths, a bias and sinks,
   * the keys split. */
  icase dq = {.dt = ATTN_BF16,
              .B = 2,
              .Nq = 5,
              .cap = 3000,
              .Hq = 16,
              .Hkv = 2,
              .d = 128,
              .has_used = 1,
              .used = {2900, 1500},
              .page = 16,
              .bias = 1,
              .bias_dt = ATTN_F32,
              .sinks = 1,
              .splits = 4};
  run_forward(b, &dq);
  /* The backward, dK/dV and dQ on the tensor cores, at each head dim's
   * block of query rows (64, 32, 16): a bias's gradient added per element
   * and summed over broadcast rows, softcap, sinks, a causal mask over more
   * rows than keys; a sliding window with ALiBi. */
  for (int i = 0; i < 2; i++) {
    icase g = {.dt = i ? ATTN_F16 : ATTN_BF16,
               .B = 2,
               .Nq = 100,
               .cap = 90,
               .Hq = 4,
               .Hkv = 2,
               .d = i ? 128 : 64,
               .bias = i ? 1 + BIAS_ROWS : 1,
               .bias_dt = i ? ATTN_F16 : ATTN_BF16,
               .softcap = i ? 0 : 15,
               .sinks = i,
               .flags = ATTN_CAUSAL};
    run_backward(b, &g);
    icase wd = {.dt = i ? ATTN_BF16 : ATTN_F16,
                .B = 2,
                .Nq = 150,
                .cap = 170,
                .Hq = 6,
                .Hkv = 2,
                .d = i ? 96 : 32,
                .win = 1,
                .wl = 40,
                .wr = 9,
                .alibi = 1};
    run_backward(b, &wd);
  }
}

/* NVIDIA GPUs of compute capability 8.0 and later run f16 and bf16
 * forwards and backwards up to d = 128 on their tensor cores through
 * OpenCL (fwd_mma.cl, bwd_mma.cl: inline PTX), f32 up to d = 64 there too
 * (three TF32 products a product, above d = 64 with half of some
 * operands in local memory), d = 256 on the portable kernels; the portable path stays beside it (a
 * driver that cannot build the tensor-core program gets it): both agree with the reference over
 * every head dim bucket, causal, a cache with pages, a bias with sinks, softcap and ALiBi, splits,
 * and gradients with dbias. */
static void opencl_tensor_cores_where_nvidia_has_them(at_backend *b) {
  if (b->kind != ATTN_BACKEND_OPENCL) {
    at_skip("the OpenCL backend's vendor path");
    return;
  }
  const int cc = at_cl_nv_cc(b->ctx);
  if (cc < 80) {
    at_skip("the OpenCL device is not an NVIDIA GPU of compute capability 8.0 or later");
    return;
  }
  assert_int_equal(at_cl_fwd_mma(b->ctx, ATTN_F16, 128), 1);
  assert_int_equal(at_cl_fwd_mma(b->ctx, ATTN_BF16, 32), 1);
  assert_int_equal(at_cl_fwd_mma(b->ctx, ATTN_F32, 64), 1);
  assert_int_equal(at_cl_fwd_mma(b->ctx, ATTN_F32, 128), 1);
  assert_int_equal(at_cl_fwd_mma(b->ctx, ATTN_F16, 256), 0);
  tensor_core_cases(b);
  assert_int_equal(at_cl_fwd_mma(b->ctx, ATTN_BF16, 128), 1); /* it built: no fallback */

  char spec[32];
  snprintf(spec, sizeof spec, "opencl:%d", attn_context_device(b->ctx));
  at_backend p = *b;
  assert_int_equal(attn_context_create(spec, &p.ctx), ATTN_OK);
  assert_true(at_cl_portable(p.ctx) > 0);
  assert_int_equal(at_cl_fwd_mma(p.ctx, ATTN_F16, 128), 0);
  assert_int_equal(at_cl_fwd_mma(p.ctx, ATTN_F32, 64), 0);
  tensor_core_cases(&p);
  attn_context_free(p.ctx);
}

/* Sequences long enough for the larger tiles some rows keep for them (the
 * Hopper forward's 192 query rows at d = 64 from 2048 rows on, its 176-key
 * blocks at d = 128 under a causal mask from 8192 keys on), with a last
 * tile of a few rows: plain, causal, and with a bias over the keys and
 * sinks. */
static void long_sequences_take_the_larger_tiles(at_backend *b) {
  icase c = {.dt = ATTN_BF16, .B = 1, .Nq = 2118, .cap = 2118, .Hq = 2, .Hkv = 1, .d = 64};
  run_forward(b, &c);
  c.flags = ATTN_CAUSAL;
  c.dt = ATTN_F16;
  run_forward(b, &c);
  c.flags = 0;
  c.bias = 1 + BIAS_HEADS + BIAS_ROWS; /* [B, 1, 1, keys] */
  c.bias_dt = c.dt;
  c.sinks = 1;
  run_forward(b, &c);
  /* 130 queries at the end of 8300 keys: the diagonal inside a key block,
   * the last block 28 keys past 47 whole ones of 176. */
  icase w = {.dt = ATTN_BF16, .B = 1, .Nq = 130, .cap = 8300, .Hq = 2, .Hkv = 1, .d = 128};
  w.flags = ATTN_CAUSAL;
  run_forward(b, &w);
}

static void sinks_join_the_denominator(at_backend *b) {
  icase c = {.dt = ATTN_F32,
             .B = 2,
             .Nq = 30,
             .cap = 25,
             .Hq = 4,
             .Hkv = 2,
             .d = 64,
             .sinks = 1,
             .win = 1,
             .wl = 2,
             .wr = 0}; /* rows 0..4 see no key: lse = sink */
  run_forward(b, &c);
  c.dt = ATTN_BF16, c.win = 0, c.flags = ATTN_CAUSAL;
  run_forward(b, &c);
}

/* The backward's dO (all 1) and the buffers of its gradients, as bshd
 * tensors. */
typedef struct igrads {
  void *dout, *dq, *dk, *dv;
  attn_tensor tdo, tdq, tdk, tdv;
  int64_t nq, nk; /* elements of dq, and of dk and dv */
} igrads;

static void igrads_init(igrads *g, const icase *c) {
  g->nq = c->B * c->Nq * c->Hq * c->d, g->nk = c->B * c->cap * c->Hkv * c->d;
  const size_t es = attn_dtype_size(c->dt);
  g->dout = at_malloc((size_t)g->nq * es), g->dq = at_malloc((size_t)g->nq * es);
  g->dk = at_malloc((size_t)g->nk * es), g->dv = at_malloc((size_t)g->nk * es);
  fill(g->dout, c->dt, g->nq, 1.0);
  g->tdo = attn_tensor_bshd(g->dout, c->dt, c->B, c->Nq, c->Hq, c->d);
  g->tdq = attn_tensor_bshd(g->dq, c->dt, c->B, c->Nq, c->Hq, c->d);
  g->tdk = attn_tensor_bshd(g->dk, c->dt, c->B, c->cap, c->Hkv, c->d);
  g->tdv = attn_tensor_bshd(g->dv, c->dt, c->B, c->cap, c->Hkv, c->d);
}

static void igrads_free(igrads *g) {
  at_free(g->dout);
  at_free(g->dq);
  at_free(g->dk);
  at_free(g->dv);
}

/* attn_backward of x's tensors with params p, the test failing on an error. */
static void backward_or_fail(at_backend *b, ibuf *x, const attn_params *p, igrads *g) {
  const int rc = attn_backward(b->ctx, p, &x->tq, &x->tk, &x->tv, &x->to, &x->tlse, &g->tdo,
                               &g->tdq, &g->tdk, &g->tdv);
  if (rc) fail_msg("attn_backward: %s: %s", attn_status_name(rc), attn_errmsg(b->ctx));
}

/* Forward then backward with the bias and sink gradients, against the
 * reference. */
static void run_backward(at_backend *b, const icase *c) {
  ibuf x;
  ibuf_init(b, &x, c);
  igrads g;
  igrads_init(&g, c);
  const int64_t nq = g.nq, nk = g.nk;
  int64_t nb = c->bias ? at_count(&x.tbias) : 0;
  float *dbias = c->bias ? at_malloc(sizeof(float) * (size_t)nb) : NULL;
  float *dsinks = c->sinks ? at_malloc(sizeof(float) * (size_t)c->Hq) : NULL;
  attn_tensor tdb, tds;
  if (dbias) {
    fill_nan(dbias, ATTN_F32, nb);
    tdb = x.tbias;
    tdb.data = dbias;
    tdb.dtype = ATTN_F32;
    x.p.dbias = &tdb;
  }
  if (dsinks) {
    fill_nan(dsinks, ATTN_F32, c->Hq);
    tds = attn_tensor_1d(dsinks, ATTN_F32, c->Hq);
    x.p.dsinks = &tds;
  }
  SKIP_IF_DECLINED(b, &x.p, &x.tq, &x.tk, &x.tv, 1);
  attn_params fp = x.p;
  fp.dbias = NULL, fp.dsinks = NULL;
  int rc = attn_forward(b->ctx, &fp, &x.tq, &x.tk, &x.tv, &x.to, &x.tlse);
  if (rc) fail_msg("attn_forward: %s: %s", attn_status_name(rc), attn_errmsg(b->ctx));
  backward_or_fail(b, &x, &x.p, &g);
  double *rq = at_malloc(sizeof(double) * (size_t)nq), *rk = at_malloc(sizeof(double) * (size_t)nk),
         *rv = at_malloc(sizeof(double) * (size_t)nk);
  double *rb = nb ? at_malloc(sizeof(double) * (size_t)nb) : NULL;
  double *rs = c->sinks ? at_malloc(sizeof(double) * (size_t)c->Hq) : NULL;
  attn_params hp = host_params(&x);
  hp.dbias = hp.dsinks = NULL; /* the reference returns them as arrays */
  assert_int_equal(at_ref_backward_terms(b->ctx, &hp, &x.tq, &x.tk, &x.tv, &g.tdo, rq, rk, rv, rb,
                                         rs, NULL, NULL),
                   ATTN_OK);
  const double tol = at_tol_grad(c->dt);
  expect_near("dq", g.dq, c->dt, rq, nq, tol);
  expect_near("dk", g.dk, c->dt, rk, nk, tol);
  expect_near("dv", g.dv, c->dt, rv, nk, tol);
  if (rb) expect_near("dbias", dbias, ATTN_F32, rb, nb, tol);
  if (rs) expect_near("dsinks", dsinks, ATTN_F32, rs, c->Hq, tol);
  ibuf_free(&x);
}

static void bias_gradient_sums_over_broadcast(at_backend *b) {
  const int forms[] = {1, 1 + BIAS_BATCH + BIAS_HEADS, 1 + BIAS_ROWS};
  for (size_t i = 0; i < sizeof forms / sizeof forms[0]; i++) {
    icase c = {.dt = ATTN_F32,
               .B = 2,
               .Nq = 40,
               .cap = 40,
               .Hq = 4,
               .Hkv = 2,
               .d = 32,
               .bias = forms[i],
               .bias_dt = ATTN_F32,
               .flags = ATTN_CAUSAL};
    run_backward(b, &c);
    /* Every row sees every key: a full dbias is then stored element by
     * element by the passes, with no zeroing first, so the NaN run_backward
     * fills it with shows any element they miss. */
    c.flags = 0;
    run_backward(b, &c);
    c.dt = ATTN_BF16, c.d = 64, c.softcap = 15;
    run_backward(b, &c);
    /* An f32 bias of 16-bit data past HD 96: NVIDIA OpenCL's tensor-core
     * dQ then loads it lane by lane instead of staging it. */
    c.d = 128;
    run_backward(b, &c);
  }
}

/* dbias as a strided view, keys 2 apart and a gap after every row, head
 * and sequence: the values a contiguous dbias gets in the same call
 * sequence, and the gaps (a sentinel) untouched, the zeroing included.
 * Full, and broadcast over the batch (where a GPU launches per sequence and
 * the later launches add). */
static void bias_gradient_through_strides(at_backend *b) {
  const int forms[] = {1, 1 + BIAS_BATCH};
  for (size_t f = 0; f < sizeof forms / sizeof forms[0]; f++) {
    icase c = {.dt = ATTN_BF16,
               .B = 2,
               .Nq = 37,
               .cap = 45,
               .Hq = 4,
               .Hkv = 2,
               .d = 64,
               .bias = forms[f],
               .bias_dt = ATTN_BF16,
               .flags = ATTN_CAUSAL};
    ibuf x;
    ibuf_init(b, &x, &c);
    SKIP_IF_DECLINED(b, &x.p, &x.tq, &x.tk, &x.tv, 1);
    igrads g;
    igrads_init(&g, &c);

    const int64_t *n = x.tbias.shape;
    float *dense = at_malloc(sizeof(float) * (size_t)(n[0] * n[1] * n[2] * n[3]));
    attn_tensor td = x.tbias, ts = x.tbias;
    td.data = dense, td.dtype = ATTN_F32;
    ts.dtype = ATTN_F32;
    ts.stride[3] = 2;
    ts.stride[2] = 2 * n[3] + 3;
    ts.stride[1] = ts.stride[2] * n[2] + 5;
    ts.stride[0] = ts.stride[1] * n[1] + 7;
    const int64_t span = ts.stride[0] * n[0];
    float *sp = at_malloc(sizeof(float) * (size_t)span);
    for (int64_t i = 0; i < span; i++)
      sp[i] = 7.0f;
    ts.data = sp;

    attn_params fp = x.p;
    int rc = attn_forward(b->ctx, &fp, &x.tq, &x.tk, &x.tv, &x.to, &x.tlse);
    if (rc) fail_msg("attn_forward: %s: %s", attn_status_name(rc), attn_errmsg(b->ctx));
    x.p.dbias = &td;
    backward_or_fail(b, &x, &x.p, &g);
    x.p.dbias = &ts;
    backward_or_fail(b, &x, &x.p, &g);

    /* Each element as the contiguous call gave it, then the gaps as set. */
    int64_t e = 0, seen = 0;
    for (int64_t i0 = 0; i0 < n[0]; i0++)
      for (int64_t i1 = 0; i1 < n[1]; i1++)
        for (int64_t i2 = 0; i2 < n[2]; i2++)
          for (int64_t i3 = 0; i3 < n[3]; i3++, e++) {
            const int64_t at =
                i0 * ts.stride[0] + i1 * ts.stride[1] + i2 * ts.stride[2] + i3 * ts.stride[3];
            if (memcmp(&sp[at], &dense[e], sizeof(float)) != 0)
              fail_msg("form %zu: dbias[%lld][%lld][%lld][%lld] is %g through strides, %g dense", f,
                       (long long)i0, (long long)i1, (long long)i2, (long long)i3, sp[at],
                       dense[e]);
            sp[at] = 7.0f;
            seen += dense[e] != 0.0f;
          }
    assert_true(seen > 0); /* the gradient is not all zero */
    for (int64_t i = 0; i < span; i++)
      if (sp[i] != 7.0f)
        fail_msg("form %zu: the gap at %lld was written (%g)", f, (long long)i, sp[i]);
    at_free(sp);
    at_free(dense);
    igrads_free(&g);
    ibuf_free(&x);
  }
}

static void sink_gradient(at_backend *b) {
  icase c = {.dt = ATTN_F32,
             .B = 2,
             .Nq = 37,
             .cap = 37,
             .Hq = 4,
             .Hkv = 1,
             .d = 64,
             .sinks = 1,
             .flags = ATTN_CAUSAL};
  run_backward(b, &c);
  c.dt = ATTN_F16, c.bias = 1 + BIAS_BATCH, c.bias_dt = ATTN_F16;
  run_backward(b, &c);
}

static void deterministic_bias_gradient_repeats_exactly(at_backend *b) {
  icase c = {.dt = ATTN_F32,
             .B = 2,
             .Nq = 64,
             .cap = 64,
             .Hq = 4,
             .Hkv = 4,
             .d = 32,
             .bias = 1 + BIAS_BATCH + BIAS_HEADS,
             .bias_dt = ATTN_F32,
             .flags = ATTN_DETERMINISTIC,
             .sinks = 1};
  ibuf x;
  ibuf_init(b, &x, &c);
  const int64_t nq = c.B * c.Nq * c.Hq * c.d;
  float *dout = at_malloc(sizeof(float) * (size_t)nq), *dq = at_malloc(sizeof(float) * (size_t)nq),
        *dk = at_malloc(sizeof(float) * (size_t)nq), *dv = at_malloc(sizeof(float) * (size_t)nq);
  fill(dout, ATTN_F32, nq, 1.0);
  attn_tensor tdo = attn_tensor_bshd(dout, ATTN_F32, c.B, c.Nq, c.Hq, c.d),
              tdq = attn_tensor_bshd(dq, ATTN_F32, c.B, c.Nq, c.Hq, c.d),
              tdk = attn_tensor_bshd(dk, ATTN_F32, c.B, c.cap, c.Hkv, c.d),
              tdv = attn_tensor_bshd(dv, ATTN_F32, c.B, c.cap, c.Hkv, c.d);
  const int64_t nb = at_count(&x.tbias);
  float *db[2] = {at_malloc(sizeof(float) * (size_t)nb), at_malloc(sizeof(float) * (size_t)nb)};
  float *ds[2] = {at_malloc(sizeof(float) * 4), at_malloc(sizeof(float) * 4)};
  attn_tensor tdb = x.tbias, tds;
  tdb.dtype = ATTN_F32;
  SKIP_IF_DECLINED(b, &x.p, &x.tq, &x.tk, &x.tv, 1);
  assert_int_equal(attn_forward(b->ctx, &x.p, &x.tq, &x.tk, &x.tv, &x.to, &x.tlse), ATTN_OK);
  for (int r = 0; r < 2; r++) {
    tdb.data = db[r];
    tds = attn_tensor_1d(ds[r], ATTN_F32, 4);
    attn_params p = x.p;
    p.dbias = &tdb;
    p.dsinks = &tds;
    assert_int_equal(
        attn_backward(b->ctx, &p, &x.tq, &x.tk, &x.tv, &x.to, &x.tlse, &tdo, &tdq, &tdk, &tdv),
        ATTN_OK);
  }
  assert_memory_equal(db[0], db[1], sizeof(float) * (size_t)nb);
  assert_memory_equal(ds[0], ds[1], sizeof(float) * 4);
  ibuf_free(&x);
}

/* ---------------------------------------------------------------------- */
/* attn_merge                                                               */
/* ---------------------------------------------------------------------- */

/* Attention over keys [0, 40) equals the merge of attention over [0, 25)
 * and [25, 40), computed as two calls on slices of k and v; a third part
 * in which one sequence sees no key (lse -inf) adds nothing. */
static void merge_of_parts_is_the_whole(at_backend *b) {
  const int64_t B = 2, N = 40, H = 4, d = 32, cut = 25, Nq = 3;
  const attn_dtype dts[] = {ATTN_F32, ATTN_BF16};
  for (int di = 0; di < 2; di++) {
    const attn_dtype dt = dts[di];
    const size_t es = attn_dtype_size(dt);
    rng_state = 77 + (uint64_t)di;
    void *q = at_malloc((size_t)(B * Nq * H * d) * es),
         *k = at_malloc((size_t)(B * N * H * d) * es), *v = at_malloc((size_t)(B * N * H * d) * es);
    fill(q, dt, B * Nq * H * d, 1.5);
    fill(k, dt, B * N * H * d, 1.5);
    fill(v, dt, B * N * H * d, 1.0);
    attn_tensor tq = attn_tensor_bshd(q, dt, B, Nq, H, d), tk = attn_tensor_bshd(k, dt, B, N, H, d),
                tv = attn_tensor_bshd(v, dt, B, N, H, d);
    attn_params p;
    attn_params_init(&p);
    void *op[3];
    float *lp[3];
    attn_tensor to[3], tl[3];
    const int64_t lo[3] = {0, cut, 0}, hi[3] = {cut, N, 1};
    int32_t zero_used[2] = {0, 1};
    attn_tensor tz = attn_tensor_1d(zero_used, ATTN_I32, B);
    for (int s = 0; s < 3; s++) {
      attn_tensor ks = tk, vs = tv;
      ks.shape[1] = vs.shape[1] = hi[s] - lo[s];
      ks.data = (char *)k + (size_t)(lo[s] * H * d) * es;
      vs.data = (char *)v + (size_t)(lo[s] * H * d) * es;
      op[s] = at_malloc((size_t)(B * Nq * H * d) * es);
      lp[s] = at_malloc(sizeof(float) * (size_t)(B * H * Nq));
      to[s] = attn_tensor_bshd(op[s], dt, B, Nq, H, d);
      tl[s] = attn_tensor_lse(lp[s], B, H, Nq);
      attn_params ps = p;
      if (s == 2) ps.seqused_k = &tz; /* sequence 0 sees no key of this part */
      if (s == 2 && declined(b, &ps, &tq, &ks, &vs, 0))
        at_skip("%s declines: %s", b->name, attn_errmsg(b->ctx));
      int rc = attn_forward(b->ctx, &ps, &tq, &ks, &vs, &to[s], &tl[s]);
      if (rc) fail_msg("part %d: %s: %s", s, attn_status_name(rc), attn_errmsg(b->ctx));
    }
    void *o = at_malloc((size_t)(B * Nq * H * d) * es);
    float *l = at_malloc(sizeof(float) * (size_t)(B * H * Nq));
    attn_tensor tom = attn_tensor_bshd(o, dt, B, Nq, H, d), tlm = attn_tensor_lse(l, B, H, Nq);
    int rc = attn_merge(b->ctx, 2, to, tl, &tom, &tlm);
    if (rc == ATTN_EUNSUPPORTED)
      at_skip("%s declines attn_merge: %s", b->name, attn_errmsg(b->ctx));
    if (rc) fail_msg("attn_merge: %s: %s", attn_status_name(rc), attn_errmsg(b->ctx));
    double *ro = at_malloc(sizeof(double) * (size_t)(B * Nq * H * d)),
           *rl = at_malloc(sizeof(double) * (size_t)(B * H * Nq));
    assert_int_equal(at_ref_forward(b->ctx, &p, &tq, &tk, &tv, ro, rl), ATTN_OK);
    expect_near("merged o", o, dt, ro, B * Nq * H * d, at_tol_o(dt));
    expect_near("merged lse", l, ATTN_F32, rl, B * H * Nq, 1e-5);
    /* The part whose sequence 0 saw nothing leaves sequence 0 as it was; for
     * sequence 1 it adds key 0 again, which the reference cannot say: only
     * sequence 0 is compared. */
    assert_int_equal(attn_merge(b->ctx, 3, to, tl, &tom, &tlm), ATTN_OK);
    expect_near("merged o with an empty part", o, dt, ro, Nq * H * d, at_tol_o(dt));
    /* One part is itself. */
    assert_int_equal(attn_merge(b->ctx, 1, to, tl, &tom, NULL), ATTN_OK);
    assert_memory_equal(o, op[0], (size_t)(B * Nq * H * d) * es);
  }
}

/* ---------------------------------------------------------------------- */
/* Bad input                                                                */
/* ---------------------------------------------------------------------- */

/* The call fails with want and a message naming name, and o is untouched. */
static void expect_refused(at_backend *b, ibuf *x, int want, const char *name) {
  int rc = attn_forward(b->ctx, &x->p, &x->tq, &x->tk, &x->tv, &x->to, &x->tlse);
  if (rc != want)
    fail_msg("got %s (%s), want %s", attn_status_name(rc), attn_errmsg(b->ctx),
             attn_status_name(want));
  if (!at_mentions(attn_errmsg(b->ctx), name))
    fail_msg("the message \"%s\" does not name %s", attn_errmsg(b->ctx), name);
  for (int64_t i = 0; i < x->c.B * x->c.Nq * x->c.Hq * x->c.d; i++)
    if (!isnan(attn__load(x->o, x->c.dt, i))) fail_msg("o[%lld] was written", (long long)i);
}

static void cache_entries_out_of_range_are_refused(at_backend *b) {
  icase c = {.dt = ATTN_F32,
             .B = 2,
             .Nq = 1,
             .cap = 32,
             .Hq = 2,
             .Hkv = 1,
             .d = 16,
             .used = {32, 5},
             .has_used = 1,
             .page = 8};
  ibuf x;
  ibuf_init(b, &x, &c);
  x.used[0] = 33;
  expect_refused(b, &x, ATTN_ECACHE, "params.seqused_k");
  x.used[0] = -1;
  expect_refused(b, &x, ATTN_ECACHE, "params.seqused_k");
  x.used[0] = 32;
  x.table[1] = (int32_t)x.pages;
  expect_refused(b, &x, ATTN_ECACHE, "params.block_table");
  ibuf_free(&x);
}

static void inconsistent_inference_params_are_refused(at_backend *b) {
  icase c = {.dt = ATTN_F32,
             .B = 2,
             .Nq = 2,
             .cap = 32,
             .Hq = 2,
             .Hkv = 1,
             .d = 16,
             .used = {3, 5},
             .has_used = 1,
             .nnew = 2};
  ibuf x;
  ibuf_init(b, &x, &c);
  attn_params keep = x.p;
  x.p.seqused_k = NULL;
  expect_refused(b, &x, ATTN_EINVAL, "params.k_new");
  x.p = keep;
  x.p.v_new = NULL;
  expect_refused(b, &x, ATTN_ENULL, "params.v_new");
  x.p = keep;
  x.p.num_splits = -1;
  expect_refused(b, &x, ATTN_EINVAL, "params.num_splits");
  x.p = keep;
  float bias[2 * 2 * 2 * 31];
  attn_tensor tb = attn_tensor_bias(bias, ATTN_F32, 2, 2, 2, 31);
  x.p.bias = &tb;
  expect_refused(b, &x, ATTN_ESHAPE, "params.bias");
  tb = attn_tensor_bias(bias, ATTN_F32, 2, 3, 1, 32);
  expect_refused(b, &x, ATTN_ESHAPE, "params.bias");
  x.p = keep;
  x.p.dbias = &tb;
  expect_refused(b, &x, ATTN_EINVAL, "params.dbias");
  x.p = keep;
  float s[3];
  attn_tensor ts = attn_tensor_1d(s, ATTN_F32, 3);
  x.p.sinks = &ts;
  expect_refused(b, &x, ATTN_ESHAPE, "params.sinks");
  x.p = keep;
  x.p.k_new = &x.tk; /* the new rows may not be the cache itself */
  x.p.v_new = &x.tv;
  int rc = attn_forward(b->ctx, &x.p, &x.tq, &x.tk, &x.tv, &x.to, &x.tlse);
  assert_int_not_equal(rc, ATTN_OK);
  ibuf_free(&x);
}

static void merge_arguments_are_checked(at_backend *b) {
  float o[2 * 3 * 4 * 8], l[2 * 4 * 3], o2[2 * 3 * 4 * 8], l2[2 * 4 * 2];
  attn_tensor to = attn_tensor_bshd(o, ATTN_F32, 2, 3, 4, 8), tl = attn_tensor_lse(l, 2, 4, 3);
  attn_tensor po = attn_tensor_bshd(o2, ATTN_F32, 2, 3, 4, 8), pl = attn_tensor_lse(l2, 2, 4, 2);
  assert_int_equal(attn_merge(b->ctx, 0, &po, &pl, &to, &tl), ATTN_ESIZE);
  assert_int_equal(attn_merge(b->ctx, 1, &po, &pl, &to, &tl), ATTN_ESHAPE);
  assert_true(at_mentions(attn_errmsg(b->ctx), "lse_parts"));
  assert_int_equal(attn_merge(b->ctx, 1, &to, &tl, &to, &tl), ATTN_EALIAS);
}

static const at_test tests[] = {
    AT_TEST(decode_reads_only_the_used_rows),
    AT_TEST(causal_rows_align_to_the_used_length),
    AT_TEST(appended_rows_land_in_the_cache_and_are_seen),
    AT_TEST(paged_cache_any_page_size),
    AT_TEST(paged_cache_without_used_lengths),
    AT_TEST(paged_append_with_causal_rows),
    AT_TEST(metadata_in_device_buffers),
    AT_TEST(offsets_and_slopes_in_device_buffers),
    AT_TEST(splits_give_the_same_answer),
    AT_TEST(bias_full_and_broadcast),
    AT_TEST(bias_minus_inf_hides_a_whole_row),
    AT_TEST(bias_of_every_kind_of_value),
    AT_TEST(bias_in_aligned_rows),
    AT_TEST(cache_prefill_at_the_tensor_core_dims),
    AT_TEST(more_tiles_than_blocks_at_once),
    AT_TEST(opencl_tensor_cores_where_nvidia_has_them),
    AT_TEST(long_sequences_take_the_larger_tiles),
    AT_TEST(sinks_join_the_denominator),
    AT_TEST(bias_gradient_sums_over_broadcast),
    AT_TEST(bias_gradient_through_strides),
    AT_TEST(sink_gradient),
    AT_TEST(deterministic_bias_gradient_repeats_exactly),
    AT_TEST(merge_of_parts_is_the_whole),
    AT_TEST(cache_entries_out_of_range_are_refused),
    AT_TEST(inconsistent_inference_params_are_refused),
    AT_TEST(merge_arguments_are_checked),
};

int main(int argc, char **argv) {
  return at_main(argc, argv, "inference", tests, sizeof tests / sizeof tests[0], NULL, 0);
}
