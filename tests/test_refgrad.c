/*
 * The reference backward (testkit/ref.c) against finite differences of the
 * reference forward, on tiny problems: the gradients that every backend is
 * measured against are themselves checked against the definition
 *     dL/dx ~ (L(x + h) - L(x - h)) / 2h,   L = sum(o * do),
 * for every element of q, k and v, with each option that changes the
 * derivative (masks, softcap, ALiBi, grouped heads, varlen with empty
 * sequences, rows that see no key).
 */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

typedef struct fd_case {
  int64_t batch, nq, nk, hq, hkv, d; /* varlen: batch sequences, nq/nk the row totals */
  double scale;
  unsigned flags;
  int64_t window_left, window_right;
  double softcap;
  int alibi;
  const int32_t *cu_q, *cu_k;
} fd_case;

static uint64_t rng = 0x243F6A8885A308D3ull;
static float uniform(void) {
  rng = rng * 6364136223846793005ull + 1442695040888963407ull;
  return (float)((double)(rng >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

typedef struct fd_problem {
  attn_params p;
  attn_tensor q, k, v, dout;
  float slopes[8];
  size_t nq_el, nk_el;
  double *o;
} fd_problem;

static attn_tensor make(const fd_case *c, int64_t rows_or_seq, int64_t heads) {
  int64_t per = c->cu_q ? 1 : c->batch;
  float *data = at_malloc(sizeof(float) * (size_t)(per * rows_or_seq * heads * c->d));
  if (c->cu_q) return attn_tensor_varlen(data, ATTN_F32, rows_or_seq, heads, c->d);
  return attn_tensor_bshd(data, ATTN_F32, c->batch, rows_or_seq, heads, c->d);
}

static void setup(const fd_case *c, fd_problem *fp) {
  attn_params_init(&fp->p);
  fp->p.scale = c->scale;
  fp->p.flags = c->flags;
  fp->p.window_left = c->window_left;
  fp->p.window_right = c->window_right;
  fp->p.softcap = c->softcap;
  if (c->alibi) {
    for (int64_t h = 0; h < c->hq; h++)
      fp->slopes[h] = 0.5f / (float)(h + 1);
    fp->p.alibi_slopes = fp->slopes;
    fp->p.alibi_count = c->hq;
  }
  if (c->cu_q) {
    fp->p.cu_seqlens_q = c->cu_q;
    fp->p.cu_seqlens_k = c->cu_k;
    fp->p.batch = c->batch;
  }
  int64_t per = c->cu_q ? 1 : c->batch;
  fp->q = make(c, c->nq, c->hq);
  fp->k = make(c, c->nk, c->hkv);
  fp->v = make(c, c->nk, c->hkv);
  fp->dout = make(c, c->nq, c->hq);
  fp->nq_el = (size_t)(per * c->nq * c->hq * c->d);
  fp->nk_el = (size_t)(per * c->nk * c->hkv * c->d);
  for (size_t i = 0; i < fp->nq_el; i++) {
    ((float *)fp->q.data)[i] = uniform();
    ((float *)fp->dout.data)[i] = uniform();
  }
  for (size_t i = 0; i < fp->nk_el; i++) {
    ((float *)fp->k.data)[i] = uniform();
    ((float *)fp->v.data)[i] = uniform();
  }
  fp->o = at_malloc(sizeof(double) * fp->nq_el);
}

static double loss(attn_context *ctx, fd_problem *fp) {
  int rc = at_ref_forward(ctx, &fp->p, &fp->q, &fp->k, &fp->v, fp->o, NULL);
  if (rc) fail_msg("reference forward: %s", attn_errmsg(ctx));
  double l = 0;
  for (size_t i = 0; i < fp->nq_el; i++)
    l += fp->o[i] * ((float *)fp->dout.data)[i];
  return l;
}

/* Central differences with h = 2^-10: x + h is exact in f32 for |x| < 1, so
 * the step taken is the step divided by. Measured |fd - reference| on these
 * O(1) inputs: 1.5e-8 to 2.6e-8; the bound leaves a factor of 40 and still
 * catches a wrong derivative (dropping the softcap factor fails by 4e-3). */
static void check_grad(attn_context *ctx, fd_problem *fp, const char *name, float *x, size_t n,
                       const double *grad, double *worst) {
  const float h = 1.0f / 1024.0f;
  for (size_t i = 0; i < n; i++) {
    float x0 = x[i];
    x[i] = x0 + h;
    double up = loss(ctx, fp);
    x[i] = x0 - h;
    double down = loss(ctx, fp);
    x[i] = x0;
    double fd = (up - down) / ((double)(x0 + h) - (double)(x0 - h));
    double err = fabs(fd - grad[i]);
    if (err > *worst) *worst = err;
    if (err > 1e-6 + 1e-5 * fabs(grad[i]))
      fail_msg("d%s[%zu]: reference %.9g, finite difference %.9g", name, i, grad[i], fd);
  }
}

static void run_case(const fd_case *c) {
  attn_context *ctx = NULL;
  int rc = attn_context_create("cpu", &ctx);
  if (rc) fail_msg("cpu context: %s", attn_errmsg(ctx));
  fd_problem fp;
  setup(c, &fp);
  double *dq = at_malloc(sizeof(double) * fp.nq_el), *dk = at_malloc(sizeof(double) * fp.nk_el),
         *dv = at_malloc(sizeof(double) * fp.nk_el);
  rc = at_ref_backward(ctx, &fp.p, &fp.q, &fp.k, &fp.v, &fp.dout, dq, dk, dv);
  if (rc) fail_msg("reference backward: %s", attn_errmsg(ctx));
  double worst = 0, gmax = 0;
  for (size_t i = 0; i < fp.nq_el; i++)
    gmax = fmax(gmax, fabs(dq[i]));
  for (size_t i = 0; i < fp.nk_el; i++)
    gmax = fmax(gmax, fmax(fabs(dk[i]), fabs(dv[i])));
  /* Gradients that are all zero would make the comparison empty. */
  assert_true(gmax > 1e-3);
  check_grad(ctx, &fp, "q", fp.q.data, fp.nq_el, dq, &worst);
  check_grad(ctx, &fp, "k", fp.k.data, fp.nk_el, dk, &worst);
  check_grad(ctx, &fp, "v", fp.v.data, fp.nk_el, dv, &worst);
  print_message("    largest |finite difference - reference| %.2e (largest gradient %.2e)\n", worst,
                gmax);
  attn_context_free(ctx);
}

static void plain_gradients_match_finite_differences(at_backend *b) {
  fd_case c = {2, 5, 7, 2, 2, 4, 0.7, 0, -1, -1, 0, 0, NULL, NULL};
  run_case(&c);
}

static void causal_gradients_with_keyless_rows_match_finite_differences(at_backend *b) {
  /* Nq > Nk: the first rows see no key and must pass no gradient. */
  fd_case c = {1, 6, 3, 2, 2, 4, 0.7, ATTN_CAUSAL, -1, -1, 0, 0, NULL, NULL};
  run_case(&c);
}

static void window_gradients_match_finite_differences(at_backend *b) {
  fd_case c = {1, 7, 7, 2, 2, 3, 0.9, 0, 2, 1, 0, 0, NULL, NULL};
  run_case(&c);
}

static void softcap_gradients_match_finite_differences(at_backend *b) {
  /* Scores up to ~4 against a cap of 1.5: tanh's derivative matters. */
  fd_case c = {1, 5, 6, 2, 2, 4, 1.0, 0, -1, -1, 1.5, 0, NULL, NULL};
  run_case(&c);
}

static void alibi_gradients_match_finite_differences(at_backend *b) {
  fd_case c = {1, 5, 6, 3, 3, 4, 0.8, ATTN_CAUSAL, -1, -1, 0, 1, NULL, NULL};
  run_case(&c);
}

static void grouped_head_gradients_match_finite_differences(at_backend *b) {
  fd_case gqa = {1, 4, 5, 4, 2, 3, 0.8, 0, -1, -1, 0, 0, NULL, NULL};
  run_case(&gqa);
  fd_case mqa = {1, 4, 5, 3, 1, 3, 0.8, ATTN_CAUSAL, -1, -1, 0, 0, NULL, NULL};
  run_case(&mqa);
}

static void varlen_gradients_with_empty_sequences_match_finite_differences(at_backend *b) {
  /* Sequence 1 has no queries, sequence 2 no keys (its rows see nothing). */
  static const int32_t cu_q[4] = {0, 3, 3, 6}, cu_k[4] = {0, 4, 6, 6};
  fd_case c = {3, 6, 6, 2, 2, 3, 0.8, ATTN_CAUSAL, -1, -1, 0, 0, cu_q, cu_k};
  run_case(&c);
}

int main(int argc, char **argv) {
  const at_test common[] = {
      AT_TEST(plain_gradients_match_finite_differences),
      AT_TEST(causal_gradients_with_keyless_rows_match_finite_differences),
      AT_TEST(window_gradients_match_finite_differences),
      AT_TEST(softcap_gradients_match_finite_differences),
      AT_TEST(alibi_gradients_match_finite_differences),
      AT_TEST(grouped_head_gradients_match_finite_differences),
      AT_TEST(varlen_gradients_with_empty_sequences_match_finite_differences),
  };
  return at_main(argc, argv, "refgrad", NULL, 0, common, sizeof common / sizeof common[0]);
}
