/*
 * vit_block: the multi-head self-attention of a ViT-B/16 encoder block.
 *
 * 197 tokens (196 patches and the class token) of width 768, 12 heads of 64:
 *
 *   [Q K V] = X W_qkv + b_qkv     one product, [tokens, 3 * 768]
 *   O_h     = softmax(Q_h K_h^T / sqrt(64)) V_h   for each head h, by attn
 *   Y       = [O_1 ... O_12] W_o + b_o
 *
 * The products run through BLAS (cblas_sgemm). attn reads the heads straight
 * out of the projection's output: head h of Q is columns 64 h .. 64 h + 63 of
 * its first 768, so a tensor of shape [batch, tokens, 12, 64] with strides
 * {tokens * 2304, 2304, 64, 1} (in elements) over the output describes Q, and
 * the same at offsets 768 and 1536 describes K and V; no reshuffle, no copy.
 * attn writes O as a contiguous [batch, tokens, 12, 64] tensor, which is the
 * concatenation [O_1 ... O_12] as a [tokens, 768] matrix, ready for W_o.
 *
 * The example checks attn's O against plain attention over the same Q, K, V,
 * and the block's Y against the same block computed by plain loops in double.
 */
#include <attn.h>
#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

enum { B = 2, T = 197, C = 768, H = 12, D = C / H, QKV = 3 * C };

/* Inputs in [-a, a). */
static void fill(float *x, size_t n, double a, unsigned *seed) {
  for (size_t i = 0; i < n; i++) {
    *seed = *seed * 1664525u + 1013904223u;
    x[i] = (float)(a * ((*seed >> 8) / 8388608.0 - 1.0));
  }
}

/* out [rows, n] = x [rows, k] w [k, n] + bias [n], in double. */
static void linear(const double *x, const float *w, const float *bias, int rows, int k, int n,
                   double *out) {
  for (int r = 0; r < rows; r++)
    for (int j = 0; j < n; j++) {
      double acc = bias[j];
      for (int i = 0; i < k; i++)
        acc += x[(size_t)r * k + i] * w[(size_t)i * n + j];
      out[(size_t)r * n + j] = acc;
    }
}

/* Plain attention, in double, of every head of every image: qkv is [B * T,
 * 3 C] (Q, K, V side by side), o is [B * T, C]. */
static void attention(const double *qkv, double *o) {
  double s[T];
  for (int b = 0; b < B; b++)
    for (int h = 0; h < H; h++)
      for (int i = 0; i < T; i++) {
        const double *qi = qkv + ((size_t)b * T + i) * QKV + h * D;
        double m = -INFINITY, sum = 0;
        for (int j = 0; j < T; j++) {
          const double *kj = qkv + ((size_t)b * T + j) * QKV + C + h * D;
          double dot = 0;
          for (int c = 0; c < D; c++)
            dot += qi[c] * kj[c];
          s[j] = dot / sqrt(D);
          if (s[j] > m) m = s[j];
        }
        for (int j = 0; j < T; j++)
          sum += exp(s[j] - m);
        for (int c = 0; c < D; c++) {
          double acc = 0;
          for (int j = 0; j < T; j++)
            acc += exp(s[j] - m) / sum * qkv[((size_t)b * T + j) * QKV + 2 * C + h * D + c];
          o[((size_t)b * T + i) * C + h * D + c] = acc;
        }
      }
}

/* The largest |got - want| over n elements, and the tolerance of the golden
 * cases for float32 without a peer figure, 1e-5 * max(1, max|want|)
 * (tests/golden/README.md). */
static int check(const char *what, const float *got, const double *want, size_t n) {
  double err = 0, big = 1;
  for (size_t i = 0; i < n; i++) {
    double e = fabs(got[i] - want[i]);
    if (!(e <= err)) err = e; /* a NaN counts as the largest error */
    if (fabs(want[i]) > big) big = fabs(want[i]);
  }
  double bound = 1e-5 * big;
  printf("  %s: max|err| %.2e (bound %.1e) %s\n", what, err, bound, err <= bound ? "ok" : "WRONG");
  return err <= bound;
}

int main(void) {
  const size_t rows = (size_t)B * T;
  float *x = malloc(rows * C * sizeof *x), *w_qkv = malloc((size_t)C * QKV * sizeof *w_qkv);
  float *b_qkv = malloc(QKV * sizeof *b_qkv), *w_o = malloc((size_t)C * C * sizeof *w_o);
  float *b_o = malloc(C * sizeof *b_o), *qkv = malloc(rows * QKV * sizeof *qkv);
  float *o = malloc(rows * C * sizeof *o), *y = malloc(rows * C * sizeof *y);
  double *x64 = malloc(rows * C * sizeof *x64), *qkv64 = malloc(rows * QKV * sizeof *qkv64);
  double *o64 = malloc(rows * C * sizeof *o64), *y64 = malloc(rows * C * sizeof *y64);
  attn_context *ctx = NULL;
  int ok = x && w_qkv && b_qkv && w_o && b_o && qkv && o && y && x64 && qkv64 && o64 && y64;
  if (!ok) fprintf(stderr, "vit_block: out of memory\n");

  if (ok && attn_context_create(NULL, &ctx) != ATTN_OK) {
    fprintf(stderr, "vit_block: %s\n", attn_errmsg(ctx));
    ok = 0;
  }

  if (ok) {
    printf("vit_block: backend %s, %d images of %d tokens, %d heads of %d\n",
           attn_backend_name(attn_context_backend(ctx)), B, T, H, D);
    /* Weights of scale 3/sqrt(C) give Q, K and V of about unit variance from
     * inputs in [-1, 1), as a trained block's LayerNorm and weights do. */
    unsigned seed = 11;
    fill(x, rows * C, 1.0, &seed);
    fill(w_qkv, (size_t)C * QKV, 3.0 / sqrt(C), &seed);
    fill(b_qkv, QKV, 0.1, &seed);
    fill(w_o, (size_t)C * C, 3.0 / sqrt(C), &seed);
    fill(b_o, C, 0.1, &seed);

    /* [Q K V] = X W_qkv + b_qkv: the bias in every row first, then the product
     * added to it (beta = 1). */
    for (size_t r = 0; r < rows; r++)
      for (int j = 0; j < QKV; j++)
        qkv[r * QKV + j] = b_qkv[j];
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)rows, QKV, C, 1.0f, x, C, w_qkv,
                QKV, 1.0f, qkv, QKV);

    /* Q, K and V as [B, T, H, D] views of the [B * T, 3 C] output. */
    attn_tensor q = attn_tensor_bshd(qkv, ATTN_F32, B, T, H, D);
    q.stride[0] = (int64_t)T * QKV; /* next image */
    q.stride[1] = QKV;              /* next token: one row of the output */
    q.stride[2] = D;                /* next head: 64 columns on */
    q.stride[3] = 1;
    attn_tensor k = q, v = q;
    k.data = qkv + C;
    v.data = qkv + 2 * C;
    attn_tensor out = attn_tensor_bshd(o, ATTN_F32, B, T, H, D);

    attn_params p;
    attn_params_init(&p); /* scale 1/sqrt(64), no mask: a ViT sees every token */
    int rc = attn_forward(ctx, &p, &q, &k, &v, &out, NULL);
    if (rc != ATTN_OK) {
      fprintf(stderr, "vit_block: %s: %s\n", attn_status_name(rc), attn_errmsg(ctx));
      ok = 0;
    }
  }

  if (ok) {
    /* Y = O W_o + b_o. */
    for (size_t r = 0; r < rows; r++)
      for (int j = 0; j < C; j++)
        y[r * C + j] = b_o[j];
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)rows, C, C, 1.0f, o, C, w_o, C,
                1.0f, y, C);

    /* attn alone: plain attention over the Q, K, V that attn was given. */
    for (size_t i = 0; i < rows * QKV; i++)
      qkv64[i] = qkv[i];
    attention(qkv64, o64);
    ok &= check("attention O against plain attention", o, o64, rows * C);

    /* The whole block by plain loops in double, from X and the weights. Y
     * also carries float32's rounding in the two products of 768 terms each
     * (about sqrt(768) * 2^-24, 2e-6, of the terms' size), which the same
     * bound covers. */
    for (size_t i = 0; i < rows * C; i++)
      x64[i] = x[i];
    linear(x64, w_qkv, b_qkv, (int)rows, C, QKV, qkv64);
    attention(qkv64, o64);
    linear(o64, w_o, b_o, (int)rows, C, C, y64);
    ok &= check("block Y against the plain block", y, y64, rows * C);
  }

  attn_context_free(ctx);
  void *blocks[] = {x, w_qkv, b_qkv, w_o, b_o, qkv, o, y, x64, qkv64, o64, y64};
  for (size_t i = 0; i < sizeof blocks / sizeof *blocks; i++)
    free(blocks[i]);
  printf("vit_block: %s\n", ok ? "passed" : "FAILED");
  return ok ? 0 : 1;
}
