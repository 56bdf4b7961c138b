/*
 * varlen: a batch of sequences of different lengths in one call, packed
 * without padding.
 *
 * The rows of all sequences are stacked: q is [total_q, heads, head_dim], k
 * and v [total_k, heads, head_dim], and sequence b is rows cu_q[b] ..
 * cu_q[b+1]-1 of q and cu_k[b] .. cu_k[b+1]-1 of k and v. Query rows see
 * only their own sequence's keys. The example runs the forward and backward
 * passes over the packed batch, causal, then each sequence alone (a bshd
 * call of batch 1 over the same rows) and checks that both give the same
 * outputs and gradients.
 */
#include <attn.h>
#include <math.h>
#include <stdio.h>

enum { NSEQ = 3, H = 2, D = 16 };
/* Three sequences: 3 queries over 6 keys, 8 over 8, 1 over 4. Causal masks
 * align to the bottom-right corner: the last query row of a sequence sees
 * all of its keys. */
static const int32_t cu_q[NSEQ + 1] = {0, 3, 11, 12};
static const int32_t cu_k[NSEQ + 1] = {0, 6, 14, 18};
enum { TOTAL_Q = 12, TOTAL_K = 18, MAXLEN = 8, ROW = H * D };

static void fill(float *x, size_t n, unsigned *seed) {
  for (size_t i = 0; i < n; i++) {
    *seed = *seed * 1664525u + 1013904223u;
    x[i] = (float)((*seed >> 8) / 8388608.0 - 1.0);
  }
}

/* Whether the packed result got agrees with the separate calls' want. Each is
 * within 1e-5 * max(1, max|exact|) of the exact answer, the golden cases'
 * float32 tolerance without a peer figure (tests/golden/README.md), so the
 * two agree within twice that. */
static int same(const char *name, int seq, const float *got, const float *want, size_t n) {
  double err = 0, big = 1;
  for (size_t i = 0; i < n; i++) {
    double e = fabs((double)got[i] - want[i]);
    if (!(e <= err)) err = e; /* a NaN counts as the largest error */
    if (fabs(want[i]) > big) big = fabs(want[i]);
  }
  double bound = 2e-5 * big;
  if (err > bound)
    printf("  sequence %d: %s differs by %.2e (bound %.1e)\n", seq, name, err, bound);
  return err <= bound;
}

static int fail(attn_context *ctx, int rc, const char *what) {
  fprintf(stderr, "varlen: %s: %s: %s\n", what, attn_status_name(rc), attn_errmsg(ctx));
  return 0;
}

int main(void) {
  attn_context *ctx = NULL;
  if (attn_context_create(NULL, &ctx) != ATTN_OK) {
    fprintf(stderr, "varlen: %s\n", attn_errmsg(ctx));
    attn_context_free(ctx);
    return 1;
  }
  printf("varlen: backend %s\n", attn_backend_name(attn_context_backend(ctx)));

  static float q[TOTAL_Q * ROW], k[TOTAL_K * ROW], v[TOTAL_K * ROW], dout[TOTAL_Q * ROW];
  static float o[TOTAL_Q * ROW], lse[H * TOTAL_Q];
  static float dq[TOTAL_Q * ROW], dk[TOTAL_K * ROW], dv[TOTAL_K * ROW];
  unsigned seed = 7;
  fill(q, TOTAL_Q * ROW, &seed);
  fill(k, TOTAL_K * ROW, &seed);
  fill(v, TOTAL_K * ROW, &seed);
  fill(dout, TOTAL_Q * ROW, &seed);

  attn_params p;
  attn_params_init(&p);
  p.flags |= ATTN_CAUSAL;
  p.cu_seqlens_q = cu_q;
  p.cu_seqlens_k = cu_k;
  p.batch = NSEQ;

  /* The packed call: tensors of ndim 3, lse [heads, total_q] (batch 0). */
  attn_tensor tq = attn_tensor_varlen(q, ATTN_F32, TOTAL_Q, H, D);
  attn_tensor tk = attn_tensor_varlen(k, ATTN_F32, TOTAL_K, H, D);
  attn_tensor tv = attn_tensor_varlen(v, ATTN_F32, TOTAL_K, H, D);
  attn_tensor to = attn_tensor_varlen(o, ATTN_F32, TOTAL_Q, H, D);
  attn_tensor tdout = attn_tensor_varlen(dout, ATTN_F32, TOTAL_Q, H, D);
  attn_tensor tdq = attn_tensor_varlen(dq, ATTN_F32, TOTAL_Q, H, D);
  attn_tensor tdk = attn_tensor_varlen(dk, ATTN_F32, TOTAL_K, H, D);
  attn_tensor tdv = attn_tensor_varlen(dv, ATTN_F32, TOTAL_K, H, D);
  attn_tensor tlse = attn_tensor_lse(lse, 0, H, TOTAL_Q);
  int rc = attn_forward(ctx, &p, &tq, &tk, &tv, &to, &tlse);
  if (rc == ATTN_OK)
    rc = attn_backward(ctx, &p, &tq, &tk, &tv, &to, &tlse, &tdout, &tdq, &tdk, &tdv);
  int ok = rc == ATTN_OK || fail(ctx, rc, "the packed batch");

  /* Each sequence alone: its rows are a contiguous [1, len, H, D] bshd
   * tensor inside the packed arrays. */
  attn_params one;
  attn_params_init(&one);
  one.flags |= ATTN_CAUSAL;
  for (int b = 0; ok && b < NSEQ; b++) {
    int nq = cu_q[b + 1] - cu_q[b], nk = cu_k[b + 1] - cu_k[b];
    float so[MAXLEN * ROW], slse[H * MAXLEN], sdq[MAXLEN * ROW], sdk[MAXLEN * ROW],
        sdv[MAXLEN * ROW];
    attn_tensor sq = attn_tensor_bshd(q + cu_q[b] * ROW, ATTN_F32, 1, nq, H, D);
    attn_tensor sk = attn_tensor_bshd(k + cu_k[b] * ROW, ATTN_F32, 1, nk, H, D);
    attn_tensor sv = attn_tensor_bshd(v + cu_k[b] * ROW, ATTN_F32, 1, nk, H, D);
    attn_tensor sdout = attn_tensor_bshd(dout + cu_q[b] * ROW, ATTN_F32, 1, nq, H, D);
    attn_tensor to1 = attn_tensor_bshd(so, ATTN_F32, 1, nq, H, D);
    attn_tensor tdq1 = attn_tensor_bshd(sdq, ATTN_F32, 1, nq, H, D);
    attn_tensor tdk1 = attn_tensor_bshd(sdk, ATTN_F32, 1, nk, H, D);
    attn_tensor tdv1 = attn_tensor_bshd(sdv, ATTN_F32, 1, nk, H, D);
    attn_tensor tlse1 = attn_tensor_lse(slse, 1, H, nq);
    rc = attn_forward(ctx, &one, &sq, &sk, &sv, &to1, &tlse1);
    if (rc == ATTN_OK)
      rc = attn_backward(ctx, &one, &sq, &sk, &sv, &to1, &tlse1, &sdout, &tdq1, &tdk1, &tdv1);
    if (rc != ATTN_OK) {
      ok = fail(ctx, rc, "a sequence alone");
      break;
    }
    int good = same("o", b, o + cu_q[b] * ROW, so, (size_t)nq * ROW);
    /* The packed lse is [H, TOTAL_Q]: head h's rows of sequence b start at
     * h * TOTAL_Q + cu_q[b]. */
    for (int h = 0; h < H; h++)
      good &= same("lse", b, lse + h * TOTAL_Q + cu_q[b], slse + h * nq, (size_t)nq);
    good &= same("dq", b, dq + cu_q[b] * ROW, sdq, (size_t)nq * ROW);
    good &= same("dk", b, dk + cu_k[b] * ROW, sdk, (size_t)nk * ROW);
    good &= same("dv", b, dv + cu_k[b] * ROW, sdv, (size_t)nk * ROW);
    printf("  sequence %d (%d queries, %d keys): %s\n", b, nq, nk, good ? "ok" : "WRONG");
    ok &= good;
  }

  attn_context_free(ctx);
  printf("varlen: %s\n", ok ? "passed" : "FAILED");
  return ok ? 0 : 1;
}
