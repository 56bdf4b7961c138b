/*
 * lse in its two forms: a float per row (attn_tensor_lse), or the pair
 * (hi, lo) of attn_tensor_lse_hilo, whose lo keeps the backward pass's
 * exp(s - lse) exact at large logits (the golden cases logits_* hold every
 * backend to that). Here: hi is the plain lse bit for bit, lo is what
 * rounding dropped, rows with no key are (-inf, 0), the backward takes
 * either form, and a malformed pair is refused.
 */
#include "testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { B = 2, NQ = 48, NK = 40, H = 2, D = 32 };

typedef struct lse_case {
  attn_dtype dt;
  int varlen;
  float *q, *k, *v, *dout; /* f32 values, converted into the buffers below */
  void *bq, *bk, *bv, *bdo, *o, *dq, *dk, *dv;
  int32_t cu_q[B + 1], cu_k[B + 1];
  attn_params p;
} lse_case;

static void fill(void *buf, attn_dtype dt, int64_t n, unsigned *seed, float amp) {
  for (int64_t i = 0; i < n; i++) {
    *seed = *seed * 1664525u + 1013904223u;
    float x = amp * ((float)(*seed >> 8) / 16777216.0f - 0.5f);
    attn__store(buf, dt, i, x);
  }
}

/* Bottom-right causal with Nq > Nk: the first Nq - Nk rows of every
 * sequence see no key. */
static void case_init(lse_case *c, attn_dtype dt, int varlen) {
  memset(c, 0, sizeof *c);
  c->dt = dt;
  c->varlen = varlen;
  size_t es = attn_dtype_size(dt);
  int64_t nq = (int64_t)B * NQ * H * D, nk = (int64_t)B * NK * H * D;
  c->bq = at_malloc((size_t)nq * es);
  c->bk = at_malloc((size_t)nk * es);
  c->bv = at_malloc((size_t)nk * es);
  c->bdo = at_malloc((size_t)nq * es);
  c->o = at_malloc((size_t)nq * es);
  c->dq = at_malloc((size_t)nq * es);
  c->dk = at_malloc((size_t)nk * es);
  c->dv = at_malloc((size_t)nk * es);
  unsigned seed = 12345u;
  /* Amplitude 8: logits of a few hundred, where lse's rounding is visible. */
  fill(c->bq, dt, nq, &seed, 8.0f);
  fill(c->bk, dt, nk, &seed, 8.0f);
  fill(c->bv, dt, nk, &seed, 2.0f);
  fill(c->bdo, dt, nq, &seed, 2.0f);
  for (int b = 0; b <= B; b++) {
    c->cu_q[b] = b * NQ;
    c->cu_k[b] = b * NK;
  }
  attn_params_init(&c->p);
  c->p.flags = ATTN_CAUSAL;
  if (varlen) {
    c->p.cu_seqlens_q = c->cu_q;
    c->p.cu_seqlens_k = c->cu_k;
    c->p.batch = B;
  }
}

static void case_free(lse_case *c) {
  void *all[] = {c->bq, c->bk, c->bv, c->bdo, c->o, c->dq, c->dk, c->dv};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
    at_free(all[i]);
}

static attn_tensor qlike(const lse_case *c, void *data) {
  return c->varlen ? attn_tensor_varlen(data, c->dt, (int64_t)B * NQ, H, D)
                   : attn_tensor_bshd(data, c->dt, B, NQ, H, D);
}
static attn_tensor klike(const lse_case *c, void *data) {
  return c->varlen ? attn_tensor_varlen(data, c->dt, (int64_t)B * NK, H, D)
                   : attn_tensor_bshd(data, c->dt, B, NK, H, D);
}
static attn_tensor lse_plain(const lse_case *c, float *data) {
  return c->varlen ? attn_tensor_lse(data, 0, H, (int64_t)B * NQ) : attn_tensor_lse(data, B, H, NQ);
}
static attn_tensor lse_hilo(const lse_case *c, float *data) {
  return c->varlen ? attn_tensor_lse_hilo(data, 0, H, (int64_t)B * NQ)
                   : attn_tensor_lse_hilo(data, B, H, NQ);
}

static void forward(at_backend *b, lse_case *c, const attn_tensor *lse) {
  attn_tensor q = qlike(c, c->bq), k = klike(c, c->bk), v = klike(c, c->bv), o = qlike(c, c->o);
  int rc = attn_forward(b->ctx, &c->p, &q, &k, &v, &o, lse);
  if (rc == ATTN_EUNSUPPORTED) at_skip("refused: %s", attn_errmsg(b->ctx));
  if (rc != ATTN_OK) fail_msg("forward: %s: %s", attn_status_name(rc), attn_errmsg(b->ctx));
}

static void backward(at_backend *b, lse_case *c, const attn_tensor *lse) {
  attn_tensor q = qlike(c, c->bq), k = klike(c, c->bk), v = klike(c, c->bv), o = qlike(c, c->o);
  attn_tensor g = qlike(c, c->bdo), dq = qlike(c, c->dq), dk = klike(c, c->dk),
              dv = klike(c, c->dv);
  int rc = attn_backward(b->ctx, &c->p, &q, &k, &v, &o, lse, &g, &dq, &dk, &dv);
  if (rc != ATTN_OK) fail_msg("backward: %s: %s", attn_status_name(rc), attn_errmsg(b->ctx));
}

static void hi_is_the_plain_lse_and_lo_what_rounding_dropped(at_backend *b, attn_dtype dt,
                                                             int varlen) {
  lse_case c;
  case_init(&c, dt, varlen);
  const int64_t rows = (int64_t)B * H * NQ;
  float *plain = at_malloc((size_t)rows * sizeof(float));
  float *pair = at_malloc((size_t)rows * 2 * sizeof(float));
  attn_tensor tp = lse_plain(&c, plain), th = lse_hilo(&c, pair);
  forward(b, &c, &tp);
  forward(b, &c, &th);
  int64_t empty = 0, nonzero = 0;
  for (int64_t r = 0; r < rows; r++) {
    float hi = pair[2 * r], lo = pair[2 * r + 1];
    if (memcmp(&hi, &plain[r], sizeof hi) != 0)
      fail_msg("row %lld: hi %.9g differs from the plain lse %.9g", (long long)r, hi, plain[r]);
    if (hi == -INFINITY) {
      empty++;
      if (lo != 0.0f) fail_msg("row %lld sees no key but lo is %g", (long long)r, lo);
      continue;
    }
    float half_ulp = (nextafterf(fabsf(hi), INFINITY) - fabsf(hi)) / 2;
    if (!(fabsf(lo) <= half_ulp))
      fail_msg("row %lld: lo %g beyond half an ulp of hi %.9g", (long long)r, lo, hi);
    nonzero += lo != 0.0f;
  }
  /* An lse is rarely a float exactly: most rows must carry a lo. */
  if (nonzero < (rows - empty) / 2)
    fail_msg("only %lld of %lld rows have a lo", (long long)nonzero, (long long)(rows - empty));
  /* Causal with Nq > Nk: NQ - NK rows of each sequence and head see no key. */
  assert_int_equal(empty, (int64_t)B * H * (NQ - NK));
  at_free(plain);
  at_free(pair);
  case_free(&c);
}

static void hilo_f32_bshd(at_backend *b) {
  hi_is_the_plain_lse_and_lo_what_rounding_dropped(b, ATTN_F32, 0);
}
static void hilo_f32_varlen(at_backend *b) {
  hi_is_the_plain_lse_and_lo_what_rounding_dropped(b, ATTN_F32, 1);
}
static void hilo_bf16_bshd(at_backend *b) {
  hi_is_the_plain_lse_and_lo_what_rounding_dropped(b, ATTN_BF16, 0);
}

/* The pair corrects P by at most half an ulp of lse, relative: the
 * gradients of both forms agree to that, and the pair's are the more exact
 * (checked against the double reference). */
static void backward_takes_either_form(at_backend *b) {
  lse_case c;
  case_init(&c, ATTN_F32, 0);
  const int64_t rows = (int64_t)B * H * NQ, nq = (int64_t)B * NQ * H * D,
                nk = (int64_t)B * NK * H * D;
  float *pair = at_malloc((size_t)rows * 2 * sizeof(float));
  float *plain = at_malloc((size_t)rows * sizeof(float));
  double *rdq = at_malloc((size_t)nq * sizeof(double)),
         *rdk = at_malloc((size_t)nk * sizeof(double)),
         *rdv = at_malloc((size_t)nk * sizeof(double));
  attn_tensor q = qlike(&c, c.bq), k = klike(&c, c.bk), v = klike(&c, c.bv), g = qlike(&c, c.bdo);
  assert_int_equal(at_ref_backward(b->ctx, &c.p, &q, &k, &v, &g, rdq, rdk, rdv), ATTN_OK);
  attn_tensor tp = lse_plain(&c, plain), th = lse_hilo(&c, pair);
  const float *grads[3] = {c.dq, c.dk, c.dv};
  const double *refs[3] = {rdq, rdk, rdv};
  const int64_t counts[3] = {nq, nk, nk};
  double err[2][3];
  for (int form = 0; form < 2; form++) {
    const attn_tensor *lse = form ? &th : &tp;
    forward(b, &c, lse);
    backward(b, &c, lse);
    for (int t = 0; t < 3; t++) {
      double e = 0, m = 0;
      for (int64_t i = 0; i < counts[t]; i++) {
        e = fmax(e, fabs(grads[t][i] - refs[t][i]));
        m = fmax(m, fabs(refs[t][i]));
      }
      err[form][t] = e / fmax(m, 1.0);
      if (!(err[form][t] < 1e-4))
        fail_msg("%s lse: %s is off by %g of its largest value", form ? "(hi, lo)" : "plain",
                 t == 0   ? "dq"
                 : t == 1 ? "dk"
                          : "dv",
                 err[form][t]);
    }
  }
  print_message("relative error plain / (hi, lo): dq %.2g / %.2g, dk %.2g / %.2g, dv %.2g / %.2g\n",
                err[0][0], err[1][0], err[0][1], err[1][1], err[0][2], err[1][2]);
  at_free(pair);
  at_free(plain);
  at_free(rdq);
  at_free(rdk);
  at_free(rdv);
  case_free(&c);
}

static void a_pair_dimension_other_than_two_is_eshape(at_backend *b) {
  lse_case c;
  case_init(&c, ATTN_F32, 0);
  float *buf = at_malloc((size_t)B * H * NQ * 3 * sizeof(float));
  attn_tensor lse = attn_tensor_lse_hilo(buf, B, H, NQ);
  lse.shape[3] = 3;
  lse.stride[2] = 3;
  lse.stride[1] = 3 * NQ;
  lse.stride[0] = 3 * NQ * H;
  memset(c.o, 0x5a, (size_t)B * NQ * H * D * sizeof(float));
  attn_tensor q = qlike(&c, c.bq), k = klike(&c, c.bk), v = klike(&c, c.bv), o = qlike(&c, c.o);
  int rc = attn_forward(b->ctx, &c.p, &q, &k, &v, &o, &lse);
  assert_int_equal(rc, ATTN_ESHAPE);
  assert_true(at_mentions(attn_errmsg(b->ctx), "lse"));
  for (int64_t i = 0; i < (int64_t)B * NQ * H * D; i++)
    if (((unsigned char *)c.o)[i * 4] != 0x5a) fail_msg("o was written by a refused call");
  at_free(buf);
  case_free(&c);
}

int main(int argc, char **argv) {
  const at_test tests[] = {
      AT_TEST(hilo_f32_bshd),
      AT_TEST(hilo_f32_varlen),
      AT_TEST(hilo_bf16_bshd),
      AT_TEST(backward_takes_either_form),
      AT_TEST(a_pair_dimension_other_than_two_is_eshape),
  };
  return at_main(argc, argv, "lse", tests, sizeof tests / sizeof tests[0], NULL, 0);
}
