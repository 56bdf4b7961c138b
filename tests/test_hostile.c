/*
 * Hostile input that validation lets through, or must: window bounds near
 * INT64_MAX, NaN and inf in the inputs, scores that overflow float32, absurd
 * shapes in the tensor helpers, many threads at once, and a process whose
 * address space is too small for the OpenMP threads. Each answer is compared
 * with the reference, or with the same problem asked the ordinary way.
 */
#define _GNU_SOURCE /* RLIMIT_AS, getline */

#include "testutil.h"

#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

/* A small problem in contiguous f32 host memory: B 2, N 12 (at most NMAX),
 * H 2, d 16, with inputs in [-1, 1), and its outputs. 12 rows take each
 * backend's decode kernels (up to 16 query rows); the NaN and inf cases run
 * again at NMAX rows, which take its forward kernels. */
enum { B = 2, NMAX = 20, H = 2, D = 16 };
static int64_t N = 12;
#define QN (B * N * H * D)
#define LN (B * H * N)
#define QMAX (B * NMAX * H * D)
#define LMAX (B * H * NMAX)

typedef struct small {
  attn_params p;
  float q[QMAX], k[QMAX], v[QMAX], o[QMAX], lse[LMAX], dout[QMAX], dq[QMAX], dk[QMAX], dv[QMAX];
  attn_tensor tq, tk, tv, to, tl, tdo, tdq, tdk, tdv;
} small;

static small *small_new(void) {
  small *x = at_calloc(1, sizeof *x);
  assert_non_null(x);
  attn_params_init(&x->p);
  uint64_t st = 0x9e3779b97f4a7c15ull;
  float *in[] = {x->q, x->k, x->v, x->dout};
  for (int t = 0; t < 4; t++)
    for (int i = 0; i < QN; i++) {
      st = st * 6364136223846793005ull + 1442695040888963407ull;
      in[t][i] = (float)((st >> 40) / (double)(1 << 24)) * 2 - 1;
    }
  x->tq = attn_tensor_bshd(x->q, ATTN_F32, B, N, H, D);
  x->tk = attn_tensor_bshd(x->k, ATTN_F32, B, N, H, D);
  x->tv = attn_tensor_bshd(x->v, ATTN_F32, B, N, H, D);
  x->to = attn_tensor_bshd(x->o, ATTN_F32, B, N, H, D);
  x->tl = attn_tensor_lse(x->lse, B, H, N);
  x->tdo = attn_tensor_bshd(x->dout, ATTN_F32, B, N, H, D);
  x->tdq = attn_tensor_bshd(x->dq, ATTN_F32, B, N, H, D);
  x->tdk = attn_tensor_bshd(x->dk, ATTN_F32, B, N, H, D);
  x->tdv = attn_tensor_bshd(x->dv, ATTN_F32, B, N, H, D);
  return x;
}

static int64_t at_elem(int64_t b, int64_t i, int64_t h, int64_t c) {
  return ((b * N + i) * H + h) * D + c;
}
static int64_t at_lse(int64_t b, int64_t h, int64_t i) {
  return (b * H + h) * N + i;
}

static void forward(at_backend *b, small *x) {
  int rc = attn_forward(b->ctx, &x->p, &x->tq, &x->tk, &x->tv, &x->to, &x->tl);
  if (rc != ATTN_OK) fail_msg("forward: %s: %s", attn_status_name(rc), attn_errmsg(b->ctx));
}

static void backward(at_backend *b, small *x) {
  int rc = attn_backward(b->ctx, &x->p, &x->tq, &x->tk, &x->tv, &x->to, &x->tl, &x->tdo, &x->tdq,
                         &x->tdk, &x->tdv);
  if (rc != ATTN_OK) fail_msg("backward: %s: %s", attn_status_name(rc), attn_errmsg(b->ctx));
}

/* The reference's o and lse of x's problem. */
static void reference(at_backend *b, small *x, double *o, double *lse) {
  int rc = at_ref_forward(b->ctx, &x->p, &x->tq, &x->tk, &x->tv, o, lse);
  if (rc != ATTN_OK) fail_msg("reference: %s: %s", attn_status_name(rc), attn_errmsg(b->ctx));
}

/* Row i of head h of batch bb: every element of o NaN and lse NaN when nan
 * is set, else every element finite and within tolerance of the reference. */
static void check_row(const small *x, const double *ro, const double *rl, int64_t bb, int64_t i,
                      int64_t h, int nan, const char *what) {
  float l = x->lse[at_lse(bb, h, i)];
  if (nan) {
    if (!isnan(l))
      fail_msg("%s: batch %lld row %lld head %lld: lse is %g, expected NaN", what, (long long)bb,
               (long long)i, (long long)h, l);
    if (!isnan(rl[at_lse(bb, h, i)]))
      fail_msg("%s: the reference's lse of batch %lld row %lld head %lld is %g, expected NaN", what,
               (long long)bb, (long long)i, (long long)h, rl[at_lse(bb, h, i)]);
  } else if (!(fabs(l - rl[at_lse(bb, h, i)]) <= 1e-4 * (1 + fabs(rl[at_lse(bb, h, i)])))) {
    fail_msg("%s: batch %lld row %lld head %lld: lse is %g, the reference's %g", what,
             (long long)bb, (long long)i, (long long)h, l, rl[at_lse(bb, h, i)]);
  }
  for (int64_t c = 0; c < D; c++) {
    int64_t e = at_elem(bb, i, h, c);
    if (nan ? !isnan(x->o[e]) : !(fabs(x->o[e] - ro[e]) <= at_tol_o(ATTN_F32) * 2))
      fail_msg("%s: batch %lld row %lld head %lld col %lld: o is %g, %s %g", what, (long long)bb,
               (long long)i, (long long)h, (long long)c, x->o[e],
               nan ? "expected NaN; the reference gives" : "the reference gives", ro[e]);
  }
}

/* ---------------------------------------------------------------------- */
/* Window bounds                                                            */
/* ---------------------------------------------------------------------- */

/* The same problem with a window bound of -1 and of w must give the same
 * bits: validation turns a bound that cuts nothing into -1. */
static void same_as_unbounded(at_backend *b, int causal, int left, int64_t w) {
  small *x = small_new();
  x->p.flags = causal ? ATTN_CAUSAL : 0;
  forward(b, x);
  float o1[QMAX], l1[LMAX];
  memcpy(o1, x->o, sizeof o1);
  memcpy(l1, x->lse, sizeof l1);
  double *ro1 = at_malloc(sizeof(double) * QN), *rl1 = at_malloc(sizeof(double) * LN);
  double *ro2 = at_malloc(sizeof(double) * QN), *rl2 = at_malloc(sizeof(double) * LN);
  reference(b, x, ro1, rl1);
  if (left)
    x->p.window_left = w;
  else
    x->p.window_right = w;
  memset(x->o, 0, sizeof x->o);
  memset(x->lse, 0, sizeof x->lse);
  forward(b, x);
  reference(b, x, ro2, rl2);
  char what[96];
  snprintf(what, sizeof what, "%s window_%s %lld", causal ? "causal" : "full",
           left ? "left" : "right", (long long)w);
  if (memcmp(o1, x->o, sizeof o1) != 0 || memcmp(l1, x->lse, sizeof l1) != 0)
    fail_msg("%s: o or lse differs from the unbounded window's", what);
  if (memcmp(ro1, ro2, sizeof(double) * QN) != 0 || memcmp(rl1, rl2, sizeof(double) * LN) != 0)
    fail_msg("%s: the reference differs from its unbounded window's", what);
  for (int64_t i = 0; i < LN; i++)
    if (!isfinite(x->lse[i])) fail_msg("%s: lse[%lld] is %g", what, (long long)i, x->lse[i]);
  at_free(ro1);
  at_free(rl1);
  at_free(ro2);
  at_free(rl2);
  at_free(x);
}

static void window_bounds_near_int64_max_mean_no_bound(at_backend *b) {
  const int64_t ws[] = {INT64_MAX, INT64_MAX - 1, (int64_t)1 << 62, N};
  for (int causal = 0; causal < 2; causal++)
    for (int left = 0; left < 2; left++)
      for (size_t i = 0; i < sizeof ws / sizeof ws[0]; i++)
        same_as_unbounded(b, causal, left, ws[i]);
}

/* ---------------------------------------------------------------------- */
/* NaN and inf in, NaN out                                                  */
/* ---------------------------------------------------------------------- */

/* Runs x, whose q row i0 of head h0 in batch b0 holds a bad value: that
 * row alone must come out NaN, every other as the reference gives it. */
static void only_row_is_nan(at_backend *b, small *x, int64_t b0, int64_t h0, int64_t i0,
                            const char *what) {
  forward(b, x);
  double *ro = at_malloc(sizeof(double) * QN), *rl = at_malloc(sizeof(double) * LN);
  reference(b, x, ro, rl);
  for (int64_t bb = 0; bb < B; bb++)
    for (int64_t h = 0; h < H; h++)
      for (int64_t i = 0; i < N; i++)
        check_row(x, ro, rl, bb, i, h, bb == b0 && h == h0 && i == i0, what);
  at_free(ro);
  at_free(rl);
  at_free(x);
}

static void nan_in_one_q_element_makes_that_row_nan(at_backend *b) {
  small *x = small_new();
  x->q[at_elem(0, 5, 1, 3)] = NAN;
  only_row_is_nan(b, x, 0, 1, 5, "NaN in q");
}

/* Key row j of batch 0, head 0 holds `bad` in one element; causal, so rows
 * before j do not see it. */
static void bad_key_row(at_backend *b, float bad, int64_t j, const char *what) {
  small *x = small_new();
  x->p.flags = ATTN_CAUSAL;
  x->k[at_elem(0, j, 0, 0)] = bad;
  forward(b, x);
  double *ro = at_malloc(sizeof(double) * QN), *rl = at_malloc(sizeof(double) * LN);
  reference(b, x, ro, rl);
  for (int64_t bb = 0; bb < B; bb++)
    for (int64_t h = 0; h < H; h++)
      for (int64_t i = 0; i < N; i++) {
        /* With inf, a row whose score is -inf just does not weigh the key:
         * the reference says which rows are NaN. */
        int nan = isnan(rl[at_lse(bb, h, i)]);
        if (bb == 0 && h == 0 && i >= j && isnan(bad) && !nan)
          fail_msg("%s: the reference's row %lld sees the NaN key but is not NaN", what,
                   (long long)i);
        if ((bb != 0 || h != 0 || i < j) && nan)
          fail_msg("%s: the reference's row %lld does not see the key but is NaN", what,
                   (long long)i);
        check_row(x, ro, rl, bb, i, h, nan, what);
      }
  at_free(ro);
  at_free(rl);
  at_free(x);
}

static void nan_in_one_k_row_makes_the_rows_that_see_it_nan(at_backend *b) {
  bad_key_row(b, NAN, 6, "NaN in k row 6");
  bad_key_row(b, NAN, 0, "NaN in k row 0");
}

static void inf_in_q_or_k_gives_what_the_reference_gives(at_backend *b) {
  bad_key_row(b, INFINITY, 4, "+inf in k row 4");
  bad_key_row(b, -INFINITY, 7, "-inf in k row 7");
  small *x = small_new();
  x->q[at_elem(1, 2, 0, 0)] = -INFINITY;
  only_row_is_nan(b, x, 1, 0, 2, "-inf in q");
}

/* A float of the given bits. */
static float float_of_bits(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

/* NaNs whose payload is in the low bits only (a signalling NaN), or fills
 * the mantissa, in q and in k: NaN out wherever the row reaches, as for the
 * usual quiet NaN (a kernel that rounds or splits an operand must not turn
 * such a NaN into an infinity or a zero). */
static void nans_of_any_payload_stay_nan(at_backend *b) {
  const uint32_t payloads[] = {0x7f800001u, 0x7fffffffu, 0xffffffffu, 0xff800fffu};
  for (size_t n = 0; n < sizeof payloads / sizeof payloads[0]; n++) {
    char what[64];
    snprintf(what, sizeof what, "NaN 0x%08x in q", (unsigned)payloads[n]);
    small *x = small_new();
    x->q[at_elem(0, 5, 1, 3)] = float_of_bits(payloads[n]);
    only_row_is_nan(b, x, 0, 1, 5, what);
    snprintf(what, sizeof what, "NaN 0x%08x in k row 6", (unsigned)payloads[n]);
    bad_key_row(b, float_of_bits(payloads[n]), 6, what);
  }
}

/* Scores that overflow float32 (the reference, in double, does not
 * overflow) give NaN rows, never rows that look as if they saw no key. */
static void scores_that_overflow_float32_give_nan_rows(at_backend *b) {
  for (int t = 0; t < 2; t++) {
    small *x = small_new();
    float slopes[H] = {-1e38f, -1e38f};
    if (t == 0) {
      for (int i = 0; i < QN; i++)
        x->q[i] = x->k[i] = 1e30f;
    } else {
      /* Every row sees a key 4 or more positions away: s - slope * 4
       * overflows. */
      x->p.alibi_slopes = slopes;
      x->p.alibi_count = H;
    }
    forward(b, x);
    for (int64_t i = 0; i < LN; i++)
      if (!isnan(x->lse[i]))
        fail_msg("%s: lse[%lld] is %g, expected NaN", t ? "ALiBi slope -1e38" : "inputs 1e30",
                 (long long)i, x->lse[i]);
    for (int64_t i = 0; i < QN; i++)
      if (!isnan(x->o[i]))
        fail_msg("%s: o[%lld] is %g, expected NaN", t ? "ALiBi slope -1e38" : "inputs 1e30",
                 (long long)i, x->o[i]);
    at_free(x);
  }
}

static int all_nan(const float *a, int64_t n) {
  for (int64_t i = 0; i < n; i++)
    if (!isnan(a[i])) return 0;
  return 1;
}

static const char *const grad_names[3] = {"dq", "dk", "dv"};

/* The reference's dq, dk and dv of x's problem (free_gradients). */
static void reference_gradients(at_backend *b, const small *x, double *want[3]) {
  for (int g = 0; g < 3; g++)
    want[g] = at_malloc(sizeof(double) * QN);
  int rc =
      at_ref_backward(b->ctx, &x->p, &x->tq, &x->tk, &x->tv, &x->tdo, want[0], want[1], want[2]);
  assert_int_equal(rc, ATTN_OK);
}

static void free_gradients(double *want[3]) {
  for (int g = 0; g < 3; g++)
    at_free(want[g]);
}

/* x's dq, dk and dv from element `from` on within the gradients' tolerance
 * of the largest reference value compared (plus floor); dq's column 0 left
 * out where skip_dq0. */
static void gradients_match(const small *x, double *want[3], int64_t from, int skip_dq0,
                            double floor, const char *where) {
  const float *got[3] = {x->dq, x->dk, x->dv};
  for (int g = 0; g < 3; g++) {
    double mx = 0;
    for (int64_t e = from; e < QN; e++)
      if (g > 0 || !skip_dq0 || e % D != 0) mx = fmax(mx, fabs(want[g][e]));
    for (int64_t e = from; e < QN; e++)
      if ((g > 0 || !skip_dq0 || e % D != 0) &&
          !(fabs(got[g][e] - want[g][e]) <= at_tol_grad(ATTN_F32) * (mx + floor)))
        fail_msg("%s[%lld] %sis %g, the reference's %g", grad_names[g], (long long)e, where,
                 got[g][e], want[g][e]);
  }
}

/* NaN in q row 5 of batch 0, head 1, which sees keys 3..5 (window 2, causal):
 * its dq and the dk and dv of those keys are NaN; batch 1 is untouched. */
static void nan_in_q_gives_nan_gradients_where_the_row_reaches(at_backend *b) {
  small *x = small_new();
  x->p.flags = ATTN_CAUSAL | ATTN_DETERMINISTIC;
  x->p.window_left = 2;
  x->q[at_elem(0, 5, 1, 3)] = NAN;
  forward(b, x);
  backward(b, x);
  if (!all_nan(x->dq + at_elem(0, 5, 1, 0), D)) fail_msg("dq of the NaN row is not all NaN");
  for (int64_t j = 3; j <= 5; j++) {
    if (!all_nan(x->dk + at_elem(0, j, 1, 0), D))
      fail_msg("dk of key %lld, which the NaN row sees, is not all NaN", (long long)j);
    if (!all_nan(x->dv + at_elem(0, j, 1, 0), D))
      fail_msg("dv of key %lld, which the NaN row sees, is not all NaN", (long long)j);
  }
  double *want[3];
  reference_gradients(b, x, want);
  for (int g = 0; g < 3; g++)
    if (!isnan(want[g][at_elem(0, 5, 1, 0)]))
      fail_msg("the reference's %s is not NaN where the row reaches", grad_names[g]);
  gradients_match(x, want, at_elem(1, 0, 0, 0), 0, 1e-3, "of batch 1 ");
  free_gradients(want);
  at_free(x);
}

/* Key row 7 of batch 0, head 1 holds -inf where every q is positive: its
 * score is -inf in every row, so it weighs nothing, in the gradients too
 * (not causal, so every row's blocks meet it). dk and dv are all finite
 * and the reference's; so is dq but for column 0, where dS = 0 meets k's
 * -inf (0 * inf: NaN, or 0 where a backend skips the term). */
static void a_key_of_minus_inf_score_has_finite_gradients(at_backend *b) {
  small *x = small_new();
  for (int64_t bb = 0; bb < B; bb++)
    for (int64_t i = 0; i < N; i++)
      for (int64_t h = 0; h < H; h++)
        x->q[at_elem(bb, i, h, 0)] = 0.25f + fabsf(x->q[at_elem(bb, i, h, 0)]);
  x->k[at_elem(0, 7, 1, 0)] = -INFINITY;
  forward(b, x);
  backward(b, x);
  double *want[3];
  reference_gradients(b, x, want);
  gradients_match(x, want, 0, 1, 0.0, "");
  if (x->dk[at_elem(0, 7, 1, 1)] != 0.0f || x->dv[at_elem(0, 7, 1, 1)] != 0.0f)
    fail_msg("the -inf key's dk and dv are %g and %g, expected 0", x->dk[at_elem(0, 7, 1, 1)],
             x->dv[at_elem(0, 7, 1, 1)]);
  free_gradients(want);
  at_free(x);
}

/* ---------------------------------------------------------------------- */
/* Strides of one-element dimensions                                        */
/* ---------------------------------------------------------------------- */

/* A dimension of one element is never stepped along, so validation lets its
 * stride be anything, even a value whose byte count overflows int64: a
 * decoding step (one query row, one sequence, one KV head, 16-bit K and V,
 * the CPU's few-rows path) with such strides on K's and V's batch and head
 * dimensions and q's row dimension gives exactly what the ordinary strides
 * give. */
static void strides_of_one_element_dimensions_are_never_followed(at_backend *b) {
  enum { NK = 40, HQ = 4, DD = 64 };
  const int64_t huge = INT64_MAX / 2 + 1;
  const attn_dtype dts[] = {ATTN_BF16, ATTN_F16};
  for (int t = 0; t < 2; t++) {
    uint16_t *q = at_malloc(sizeof(uint16_t) * HQ * DD), *k = at_malloc(sizeof(uint16_t) * NK * DD),
             *v = at_malloc(sizeof(uint16_t) * NK * DD);
    uint16_t *o1 = at_malloc(sizeof(uint16_t) * HQ * DD),
             *o2 = at_malloc(sizeof(uint16_t) * HQ * DD);
    float l1[HQ], l2[HQ];
    uint64_t st = 0x2545f4914f6cdd1dull;
    uint16_t *in[] = {q, k, v};
    const int64_t n[] = {HQ * DD, NK * DD, NK * DD};
    for (int x = 0; x < 3; x++)
      for (int64_t i = 0; i < n[x]; i++) {
        st = st * 6364136223846793005ull + 1442695040888963407ull;
        const float f = (float)((st >> 40) / (double)(1 << 24)) * 2 - 1; /* in [-1, 1) */
        in[x][i] = dts[t] == ATTN_BF16 ? attn__f32_to_bf16(f) : attn__f32_to_f16(f);
      }
    attn_params p;
    attn_params_init(&p);
    attn_tensor tq = attn_tensor_bshd(q, dts[t], 1, 1, HQ, DD);
    attn_tensor tk = attn_tensor_bshd(k, dts[t], 1, NK, 1, DD);
    attn_tensor tv = attn_tensor_bshd(v, dts[t], 1, NK, 1, DD);
    attn_tensor to = attn_tensor_bshd(o1, dts[t], 1, 1, HQ, DD);
    attn_tensor tl = attn_tensor_lse(l1, 1, HQ, 1);
    int rc = attn_forward(b->ctx, &p, &tq, &tk, &tv, &to, &tl);
    if (rc != ATTN_OK) fail_msg("forward: %s: %s", attn_status_name(rc), attn_errmsg(b->ctx));
    tq.stride[0] = tq.stride[1] = huge;
    tk.stride[0] = tk.stride[2] = huge;
    tv.stride[0] = tv.stride[2] = huge;
    to.data = o2;
    tl.data = l2;
    rc = attn_forward(b->ctx, &p, &tq, &tk, &tv, &to, &tl);
    if (rc != ATTN_OK)
      fail_msg("%s with huge strides: %s: %s", attn_dtype_name(dts[t]), attn_status_name(rc),
               attn_errmsg(b->ctx));
    if (memcmp(o1, o2, sizeof(uint16_t) * HQ * DD) != 0 || memcmp(l1, l2, sizeof l1) != 0)
      fail_msg("%s: o or lse differs from the ordinary strides' answer", attn_dtype_name(dts[t]));
    at_free(q);
    at_free(k);
    at_free(v);
    at_free(o1);
    at_free(o2);
  }
}

/* ---------------------------------------------------------------------- */
/* Common: the tensor helpers, threads, the address-space limit             */
/* ---------------------------------------------------------------------- */

static void tensor_helpers_saturate_absurd_shapes(at_backend *b) {
  float buf[16];
  const int64_t big = (int64_t)1 << 40;
  attn_tensor t = attn_tensor_bshd(buf, ATTN_F32, big, big, big, 16);
  assert_int_equal(t.stride[3], 1);
  assert_int_equal(t.stride[2], 16);
  assert_int_equal(t.stride[1], 16 * big);
  assert_true(t.stride[0] == INT64_MAX);
  t = attn_tensor_varlen(buf, ATTN_F16, INT64_MAX, INT64_MAX, INT64_MAX);
  assert_true(t.stride[1] == INT64_MAX && t.stride[0] == INT64_MAX);
  t = attn_tensor_lse(buf, INT64_MAX, INT64_MAX, INT64_MAX);
  assert_true(t.stride[0] == INT64_MAX && t.stride[1] == INT64_MAX && t.stride[2] == 1);
  /* Validation then rejects them. */
  attn_context *ctx = NULL;
  assert_int_equal(attn_context_create("cpu", &ctx), ATTN_OK);
  attn_params p;
  attn_params_init(&p);
  attn_tensor q = attn_tensor_bshd(buf, ATTN_F32, big, big, big, 16);
  int rc = attn_forward(ctx, &p, &q, &q, &q, &q, NULL);
  assert_int_equal(rc, ATTN_EOVERFLOW);
  attn_context_free(ctx);
}

/* Contexts of their own on 8 threads at once, each failing validation (so
 * that each logs through attn__debug, whose lazy flag was a data race that
 * ThreadSanitizer reports) and then running a forward pass. */
static void *one_thread(void *arg) {
  int *ok = arg;
  attn_context *ctx = NULL;
  if (attn_context_create("cpu", &ctx) != ATTN_OK) return NULL;
  small *x = calloc(1, sizeof *x);
  if (x) {
    attn_params_init(&x->p);
    x->tq = attn_tensor_bshd(x->q, ATTN_F32, B, N, H, D);
    x->to = attn_tensor_bshd(x->o, ATTN_F32, B, N, H, D);
    x->p.window_left = -3;
    int bad = attn_forward(ctx, &x->p, &x->tq, &x->tq, &x->tq, &x->to, NULL);
    x->p.window_left = -1;
    int good = attn_forward(ctx, &x->p, &x->tq, &x->tq, &x->tq, &x->to, NULL);
    *ok = bad == ATTN_EWINDOW && good == ATTN_OK;
    free(x);
  }
  attn_context_free(ctx);
  return NULL;
}

static void contexts_on_eight_threads_at_once_work(at_backend *b) {
  pthread_t t[8];
  int ok[8] = {0};
  for (int i = 0; i < 8; i++)
    assert_int_equal(pthread_create(&t[i], NULL, one_thread, &ok[i]), 0);
  for (int i = 0; i < 8; i++)
    pthread_join(t[i], NULL);
  for (int i = 0; i < 8; i++)
    if (!ok[i]) fail_msg("thread %d: a call gave the wrong status", i);
}

/* The child: one forward pass on one thread, and one sgemm of OpenBLAS's
 * own, so that OpenBLAS has its buffers (it retries forever when it cannot
 * allocate them, at exit too; the CPU backend's f32 products need not call
 * it, see cpu/cpu_gemm.c); then 8 OpenMP
 * threads wanted, the address space limited to what the process has plus 2
 * MiB (less than one thread stack), a new CPU context and a forward pass
 * checked against the reference. libgomp, left alone, would end the process
 * there ("Thread creation failed"). */
static int child_rlimit(void) {
  /* OpenBLAS retries a buffer allocation that fails under the limit for as
   * long as it fails (seen in a CI run: 10 minutes in blas_memory_alloc):
   * the alarm ends that, and the parent says so (a skip, not attn's fault). */
  alarm(60);
  omp_set_num_threads(1);
  attn_context *warm = NULL;
  static small x0;
  small *x = &x0;
  attn_params_init(&x->p);
  x->tq = attn_tensor_bshd(x->q, ATTN_F32, B, N, H, D);
  x->to = attn_tensor_bshd(x->o, ATTN_F32, B, N, H, D);
  for (int i = 0; i < QN; i++)
    x->q[i] = (float)(i % 7) / 7;
  if (attn_context_create("cpu", &warm) != ATTN_OK ||
      attn_forward(warm, &x->p, &x->tq, &x->tq, &x->tq, &x->to, NULL) != ATTN_OK) {
    printf("warm-up: %s\n", attn_errmsg(warm));
    return 1;
  }
  {
    float a[16 * 16] = {0}, c[16 * 16];
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, 16, 16, 16, 1.0f, a, 16, a, 16, 0.0f, c,
                16);
  }
  attn_context_free(warm);
  omp_set_num_threads(8);
  long kb = -1;
  FILE *f = fopen("/proc/self/status", "r");
  char line[256];
  while (f && fgets(line, sizeof line, f))
    if (strncmp(line, "VmSize:", 7) == 0) kb = atol(line + 7);
  if (f) fclose(f);
  if (kb <= 0) {
    printf("skip: no VmSize in /proc/self/status\n");
    return 77;
  }
  struct rlimit rl = {.rlim_cur = (rlim_t)(kb + 2048) * 1024, .rlim_max = RLIM_INFINITY};
  if (setrlimit(RLIMIT_AS, &rl) != 0) {
    perror("setrlimit");
    return 1;
  }
  attn_context *ctx = NULL;
  int rc = attn_context_create("cpu", &ctx);
  if (rc != ATTN_OK) {
    printf("context: %s: %s\n", attn_status_name(rc), attn_errmsg(ctx));
    return 1;
  }
  memset(x->o, 0, sizeof x->o);
  rc = attn_forward(ctx, &x->p, &x->tq, &x->tq, &x->tq, &x->to, NULL);
  if (rc != ATTN_OK) {
    printf("forward: %s: %s\n", attn_status_name(rc), attn_errmsg(ctx));
    return 1;
  }
  static double ro[QMAX];
  rc = at_ref_forward(ctx, &x->p, &x->tq, &x->tq, &x->tq, ro, NULL);
  if (rc != ATTN_OK) {
    printf("reference: %s: %s\n", attn_status_name(rc), attn_errmsg(ctx));
    return 1;
  }
  for (int i = 0; i < QN; i++)
    if (!(fabs(x->o[i] - ro[i]) <= 1e-5)) {
      printf("o[%d] is %g, the reference's %g\n", i, x->o[i], ro[i]);
      return 1;
    }
  attn_context_free(ctx);
  printf("ok\n");
  return 0;
}

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define AT_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define AT_SANITIZED 1
#endif
#endif

static void too_little_address_space_for_threads_does_not_end_the_process(at_backend *b) {
#ifdef AT_SANITIZED
  at_skip("the sanitizers reserve terabytes of address space: RLIMIT_AS cannot be tried");
#else
  static char out[4096];
  int rc = at_child("rlimit", NULL, out, sizeof out);
  if (rc == 77) at_skip("%s", out);
  if (rc == 128 + SIGALRM)
    at_skip(
        "the child hung for a minute under RLIMIT_AS (OpenBLAS retrying a buffer it cannot "
        "allocate there): %s",
        out);
  if (rc != 0) fail_msg("the child under RLIMIT_AS exited with %d: %s", rc, out);
#endif
}

/* A signalling NaN in the last of 70000 key rows, past the 65535 rows a
 * grid dimension of NVIDIA's OpenCL takes (the f32 tensor-core kernels
 * look for NaNs in the whole operands first): every query row sees it, so
 * every row of o, every lse and every element of dq is NaN. */
static void a_nan_in_the_last_of_many_key_rows_reaches_every_row(at_backend *b) {
  enum { NQ = 20, NK = 70000, D1 = 16 };
  /* q, k, v, o, lse, dout, dq, dk, dv: the rows of each (lse: one a row) */
  const int rows[9] = {NQ, NK, NK, NQ, NQ, NQ, NQ, NK, NK};
  float *x[9];
  attn_tensor t[9];
  for (int i = 0; i < 9; i++) {
    x[i] = at_calloc((size_t)rows[i] * (i == 4 ? 1 : D1), sizeof(float));
    t[i] = i == 4 ? attn_tensor_lse(x[i], 1, 1, NQ)
                  : attn_tensor_bshd(x[i], ATTN_F32, 1, rows[i], 1, D1);
  }
  for (int i = 0; i < NQ * D1; i++)
    x[0][i] = x[5][i] = (float)(i % 7) / 7 - 0.5f;
  for (int i = 0; i < NK * D1; i++)
    x[1][i] = x[2][i] = (float)(i % 11) / 11 - 0.5f;
  x[1][(NK - 1) * D1 + 5] = float_of_bits(0x7f800001u);
  attn_params p;
  attn_params_init(&p);
  int rc = attn_forward(b->ctx, &p, &t[0], &t[1], &t[2], &t[3], &t[4]);
  if (rc != ATTN_OK) fail_msg("forward: %s: %s", attn_status_name(rc), attn_errmsg(b->ctx));
  if (!all_nan(x[3], NQ * D1) || !all_nan(x[4], NQ))
    fail_msg("a NaN in key row %d: o or lse holds a number", NK - 1);
  rc = attn_backward(b->ctx, &p, &t[0], &t[1], &t[2], &t[3], &t[4], &t[5], &t[6], &t[7], &t[8]);
  if (rc != ATTN_OK) fail_msg("backward: %s: %s", attn_status_name(rc), attn_errmsg(b->ctx));
  if (!all_nan(x[6], NQ * D1)) fail_msg("a NaN in key row %d: dq holds a number", NK - 1);
  for (int i = 0; i < 9; i++)
    at_free(x[i]);
}

/* The NaN and inf cases at NMAX rows, past the decode kernels' 16: the
 * forward kernels take them (on NVIDIA's OpenCL, f32 through the tensor
 * cores' split operands, whose infinite hi must not make a NaN lo). */
static void nan_and_inf_past_the_decode_rows(at_backend *b) {
  N = NMAX;
  nan_in_one_q_element_makes_that_row_nan(b);
  nan_in_one_k_row_makes_the_rows_that_see_it_nan(b);
  inf_in_q_or_k_gives_what_the_reference_gives(b);
  nans_of_any_payload_stay_nan(b);
  scores_that_overflow_float32_give_nan_rows(b);
  nan_in_q_gives_nan_gradients_where_the_row_reaches(b);
  a_key_of_minus_inf_score_has_finite_gradients(b);
  N = 12;
}

int main(int argc, char **argv) {
  if (argc == 3 && strcmp(argv[1], "--child") == 0 && strcmp(argv[2], "rlimit") == 0)
    return child_rlimit();
  const at_test tests[] = {
      AT_TEST(window_bounds_near_int64_max_mean_no_bound),
      AT_TEST(nan_in_one_q_element_makes_that_row_nan),
      AT_TEST(nan_in_one_k_row_makes_the_rows_that_see_it_nan),
      AT_TEST(inf_in_q_or_k_gives_what_the_reference_gives),
      AT_TEST(a_key_of_minus_inf_score_has_finite_gradients),
      AT_TEST(nans_of_any_payload_stay_nan),
      AT_TEST(scores_that_overflow_float32_give_nan_rows),
      AT_TEST(nan_in_q_gives_nan_gradients_where_the_row_reaches),
      AT_TEST(nan_and_inf_past_the_decode_rows),
      AT_TEST(a_nan_in_the_last_of_many_key_rows_reaches_every_row),
      AT_TEST(strides_of_one_element_dimensions_are_never_followed),
  };
  const at_test common[] = {
      AT_TEST(tensor_helpers_saturate_absurd_shapes),
      AT_TEST(contexts_on_eight_threads_at_once_work),
      AT_TEST(too_little_address_space_for_threads_does_not_end_the_process),
  };
  return at_main(argc, argv, "hostile", tests, sizeof tests / sizeof tests[0], common,
                 sizeof common / sizeof common[0]);
}
