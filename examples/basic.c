/*
 * basic: one attention layer's forward and backward pass on host buffers.
 *
 * q, k and v are [batch, seqlen, heads, head_dim] arrays of float (the bshd
 * layout). The forward pass writes o = softmax(q k^T * scale) v and each
 * row's log-sum-exp; the backward pass takes the upstream gradient dout and
 * writes dq, dk and dv. Both run twice, without and with a causal mask, and
 * every output is checked against the plain computation below (the whole
 * score matrix, in double).
 *
 * The context's backend is the default one: ATTN_BACKEND, else CUDA, an
 * OpenCL GPU or the CPU (README.md, "Choosing a backend"). Host memory works
 * on every backend; a GPU backend copies it to the device for the call.
 */
#include <attn.h>
#include <math.h>
#include <stdio.h>

/* A problem small enough to follow by hand: 2 sequences, 5 query rows over
 * 7 keys, 4 query heads sharing 2 key/value heads (grouped-query attention). */
enum { B = 2, NQ = 5, NK = 7, HQ = 4, HKV = 2, D = 16 };
/* Element counts: q, o and their gradients; k, v and theirs; lse. */
enum { NQS = B * NQ * HQ * D, NKS = B * NK * HKV * D, NL = B * HQ * NQ };

/* Element (b, s, h, c) of a contiguous bshd array of seqlen n with `heads` heads. */
static size_t at(int b, int s, int h, int c, int n, int heads) {
  return (((size_t)b * n + s) * heads + h) * D + c;
}

/* Deterministic inputs in [-1, 1). */
static void fill(float *x, size_t n, unsigned *seed) {
  for (size_t i = 0; i < n; i++) {
    *seed = *seed * 1664525u + 1013904223u;
    x[i] = (float)((*seed >> 8) / 8388608.0 - 1.0);
  }
}

/* The plain computation, in double: scores s = scale q.k, causal keeping key
 * j <= i + NK - NQ (the mask is aligned to the bottom-right corner),
 * P = softmax(s), o = P v, lse = log(sum exp s); then, for the loss
 * sum(o * dout), dP = dout v^T, dS = P (dP - rowsum(dout o)), dq = scale dS k,
 * dk = scale dS^T q, dv = P^T dout. Query head h reads key/value head
 * h / (HQ / HKV). */
static void reference(const float *q, const float *k, const float *v, const float *dout, int causal,
                      double scale, double *o, double *lse, double *dq, double *dk, double *dv) {
  for (size_t i = 0; i < (size_t)B * NK * HKV * D; i++)
    dk[i] = dv[i] = 0;
  for (int b = 0; b < B; b++)
    for (int h = 0; h < HQ; h++) {
      int hk = h / (HQ / HKV);
      for (int i = 0; i < NQ; i++) {
        int last = causal ? i + NK - NQ : NK - 1;
        double s[NK], p[NK], m = -INFINITY, sum = 0, delta = 0;
        for (int j = 0; j <= last; j++) {
          double dot = 0;
          for (int c = 0; c < D; c++)
            dot += (double)q[at(b, i, h, c, NQ, HQ)] * k[at(b, j, hk, c, NK, HKV)];
          s[j] = scale * dot;
          if (s[j] > m) m = s[j];
        }
        for (int j = 0; j <= last; j++)
          sum += exp(s[j] - m);
        lse[((size_t)b * HQ + h) * NQ + i] = m + log(sum);
        for (int j = 0; j <= last; j++)
          p[j] = exp(s[j] - m) / sum;
        for (int c = 0; c < D; c++) {
          double acc = 0;
          for (int j = 0; j <= last; j++)
            acc += p[j] * v[at(b, j, hk, c, NK, HKV)];
          o[at(b, i, h, c, NQ, HQ)] = acc;
          delta += acc * dout[at(b, i, h, c, NQ, HQ)];
        }
        for (int c = 0; c < D; c++)
          dq[at(b, i, h, c, NQ, HQ)] = 0;
        for (int j = 0; j <= last; j++) {
          double dp = 0;
          for (int c = 0; c < D; c++)
            dp += (double)dout[at(b, i, h, c, NQ, HQ)] * v[at(b, j, hk, c, NK, HKV)];
          double ds = p[j] * (dp - delta);
          for (int c = 0; c < D; c++) {
            dq[at(b, i, h, c, NQ, HQ)] += scale * ds * k[at(b, j, hk, c, NK, HKV)];
            dk[at(b, j, hk, c, NK, HKV)] += scale * ds * q[at(b, i, h, c, NQ, HQ)];
            dv[at(b, j, hk, c, NK, HKV)] += p[j] * dout[at(b, i, h, c, NQ, HQ)];
          }
        }
      }
    }
}

/* Whether got (stride apart: lse pairs are read every other float) is within
 * the golden cases' tolerance for float32 without a peer figure,
 * 1e-5 * max(1, max|want|) (tests/golden/README.md); prints the error. */
static int close_to(const char *name, const float *got, size_t stride, const double *want,
                    size_t n) {
  double err = 0, big = 1;
  for (size_t i = 0; i < n; i++) {
    double e = fabs(got[i * stride] - want[i]);
    if (!(e <= err)) err = e; /* a NaN counts as the largest error */
    if (fabs(want[i]) > big) big = fabs(want[i]);
  }
  double bound = 1e-5 * big;
  printf("  %-4s max|err| %.2e (bound %.1e) %s\n", name, err, bound, err <= bound ? "ok" : "WRONG");
  return err <= bound;
}

int main(void) {
  attn_context *ctx = NULL;
  if (attn_context_create(NULL, &ctx) != ATTN_OK) { /* NULL: ATTN_BACKEND, else auto */
    fprintf(stderr, "basic: %s\n", attn_errmsg(ctx));
    attn_context_free(ctx);
    return 1;
  }
  printf("basic: backend %s\n", attn_backend_name(attn_context_backend(ctx)));

  static float q[NQS], k[NKS], v[NKS], dout[NQS], o[NQS], dq[NQS], dk[NKS], dv[NKS], lse[2 * NL];
  static double ro[NQS], rlse[NL], rdq[NQS], rdk[NKS], rdv[NKS];
  int ok = 1;
  unsigned seed = 1;
  fill(q, NQS, &seed);
  fill(k, NKS, &seed);
  fill(v, NKS, &seed);
  fill(dout, NQS, &seed);

  /* Tensors describe memory the caller owns; attn never keeps a pointer. */
  attn_tensor tq = attn_tensor_bshd(q, ATTN_F32, B, NQ, HQ, D);
  attn_tensor tk = attn_tensor_bshd(k, ATTN_F32, B, NK, HKV, D);
  attn_tensor tv = attn_tensor_bshd(v, ATTN_F32, B, NK, HKV, D);
  attn_tensor to = attn_tensor_bshd(o, ATTN_F32, B, NQ, HQ, D);
  attn_tensor tdout = attn_tensor_bshd(dout, ATTN_F32, B, NQ, HQ, D);
  attn_tensor tdq = attn_tensor_bshd(dq, ATTN_F32, B, NQ, HQ, D);
  attn_tensor tdk = attn_tensor_bshd(dk, ATTN_F32, B, NK, HKV, D);
  attn_tensor tdv = attn_tensor_bshd(dv, ATTN_F32, B, NK, HKV, D);
  /* The lse as two floats a row (hi, lo): the backward pass recomputes every
   * probability as exp(s - lse), and the pair keeps the rounding of a single
   * float out of the gradients. Training should use this form; lse[2 r] alone
   * is row r's plain float lse. */
  attn_tensor tlse = attn_tensor_lse_hilo(lse, B, HQ, NQ);

  for (int causal = 0; causal <= 1; causal++) {
    attn_params p;
    attn_params_init(&p); /* every attn_params starts here: scale 1/sqrt(D), no mask */
    if (causal) p.flags |= ATTN_CAUSAL;

    int rc = attn_forward(ctx, &p, &tq, &tk, &tv, &to, &tlse);
    if (rc == ATTN_OK)
      rc = attn_backward(ctx, &p, &tq, &tk, &tv, &to, &tlse, &tdout, &tdq, &tdk, &tdv);
    if (rc != ATTN_OK) {
      fprintf(stderr, "basic: %s: %s\n", attn_status_name(rc), attn_errmsg(ctx));
      ok = 0;
      break;
    }

    reference(q, k, v, dout, causal, 1.0 / sqrt(D), ro, rlse, rdq, rdk, rdv);
    printf("%s:\n", causal ? "causal" : "no mask");
    ok &= close_to("o", o, 1, ro, NQS);
    ok &= close_to("lse", lse, 2, rlse, NL);
    ok &= close_to("dq", dq, 1, rdq, NQS);
    ok &= close_to("dk", dk, 1, rdk, NKS);
    ok &= close_to("dv", dv, 1, rdv, NKS);
  }

  attn_context_free(ctx);
  printf("basic: %s\n", ok ? "passed" : "FAILED");
  return ok ? 0 : 1;
}
