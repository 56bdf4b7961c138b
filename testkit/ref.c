/* The reference: attention by its definition, one row at a time, with every
 * score of the row materialized and everything accumulated in double. Slow
 * and simple on purpose: the tests and `attn check`/`attn run` measure the
 * backends against it. Memory is linear: one row's scores, and one
 * sequence's keys and values of one head as doubles (each element read once
 * per head rather than once per query row: the reference is most of what a
 * test of a long sequence costs, under the sanitizers above all).
 *
 * An f32 problem with ATTN_ALLOW_TF32 is computed as TF32 tensor cores
 * would, and otherwise in double: q, k, v and the probabilities rounded to
 * TF32 where they enter Q K^T and P V, and the backward from that forward's
 * o and lse (P = exp(s - lse) with exact scores, D = rowsum(do o)), as the
 * backends' backward reads what a TF32 forward gave it. The difference from
 * the exact answer is the error TF32 itself makes on the inputs: the
 * checkers' TF32 tolerance (ref.h). */
#include "ref.h"
#include "rules.h"

#include <stdlib.h>

static double load(const attn__tensor *t, int64_t elem) {
  return attn__load((const char *)t->native + t->offset, t->dtype, elem);
}

/* x as a float rounded to TF32 (10-bit mantissa) as cvt.rna.tf32.f32 does:
 * to nearest, ties away from zero; inf and NaN unchanged. */
static double tf32(double x) {
  float f = (float)x;
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  if ((u & 0x7f800000u) != 0x7f800000u) u = (u + 0x1000u) & 0xffffe000u;
  memcpy(&f, &u, sizeof f);
  return f;
}

/* Whether the problem is computed as TF32 (see the top). */
static int uses_tf32(const attn__problem *pb) {
  return pb->allow_tf32 && pb->dtype == ATTN_F32;
}

/* An operand of Q K^T or P V as the problem's products take it. */
static double operand(const attn__problem *pb, double x) {
  return uses_tf32(pb) ? tf32(x) : x;
}

static int64_t at(const attn__tensor *t, int64_t b, int64_t row, int64_t h, int64_t c) {
  return b * t->sb + row * t->ss + h * t->sh + c * t->sd;
}

/* Element c of key row j (sequence-local) of sequence b, head hk, in k or v
 * (t) or, for rows past the used cache, in the appended rows (tn). */
static double key_elem(const attn__problem *pb, const attn__tensor *t, const attn__tensor *tn,
                       int64_t b, int64_t j, int64_t hk, int64_t c) {
  if (pb->seqlen_new > 0) {
    const int64_t used = attn__seq_used(pb, b);
    if (j >= used) return load(tn, at(tn, b, j - used, hk, c));
  }
  return load(t, attn__key_row(pb, t, b, j) + hk * t->sh + c * t->sd);
}

/* Key rows [0, nk) of sequence b, kv head hk, of k or v (t, with tn's
 * appended rows), as doubles: x[j * d + c]. */
static void gather_keys(const attn__problem *pb, const attn__tensor *t, const attn__tensor *tn,
                        int64_t b, int64_t hk, int64_t nk, double *x) {
  for (int64_t j = 0; j < nk; j++)
    for (int64_t c = 0; c < pb->head_dim; c++)
      x[j * pb->head_dim + c] = key_elem(pb, t, tn, b, j, hk, c);
}

/* Both of a head's key operands: k into kd, v into vd. */
static void gather_head(const attn__problem *pb, int64_t b, int64_t hk, int64_t nk, double *kd,
                        double *vd) {
  gather_keys(pb, &pb->k, &pb->k_new, b, hk, nk, kd);
  gather_keys(pb, &pb->v, &pb->v_new, b, hk, nk, vd);
}

/* Row r (a row index of t's layout) of head h of a query-shaped tensor t as
 * doubles. */
static void gather_row(const attn__problem *pb, const attn__tensor *t, int64_t b, int64_t r,
                       int64_t h, double *x) {
  for (int64_t c = 0; c < pb->head_dim; c++)
    x[c] = load(t, at(t, b, r, h, c));
}

/* Scores of row i (of sequence b, query head h; its q in qr) against every
 * visible key (k gathered in kd): s[j - lo] for j in [lo, hi), from q and k
 * rounded to TF32 when round is set. Also the softcap derivative ds/du when
 * asked. */
static void row_scores(const attn__problem *pb, int64_t b, int64_t h, int64_t i, const double *qr,
                       const double *kd, int64_t lo, int64_t hi, int round, double *s,
                       double *dsdu) {
  int64_t nq = attn__seq_q(pb, b), nk = attn__seq_k(pb, b), d = pb->head_dim;
  int64_t diag = attn__diag(i, nq, nk);
  double slope = attn__problem_slope(pb, h);
  for (int64_t j = lo; j < hi; j++) {
    double u = 0;
    for (int64_t c = 0; c < d; c++)
      u += round ? tf32(qr[c]) * tf32(kd[j * d + c]) : qr[c] * kd[j * d + c];
    /* The rules' score in double (the backends' is float): the reference's
     * precision, with the same steps. t = 0 without softcap gives ds/du = 1. */
    double t;
    s[j - lo] = attn__score_scaled_f64(u * pb->scale, pb->softcap, slope, diag - j, &t) +
                (double)attn__problem_bias(pb, b, h, i, j);
    if (dsdu) dsdu[j - lo] = 1 - t * t;
  }
}

/* Softmax of s[0..n) in place, with the sink's logit in the denominator when
 * has_sink; returns lse. With a bias, a row whose scores are all -inf (the
 * bias hid every key) and that has no sink saw no key: -inf, and s is left
 * all 0. Without one, such scores come from infinite inputs, and the row is
 * NaN, as is a row with a NaN score. */
static double softmax(double *s, int64_t n, int has_bias, int has_sink, double sink) {
  double m = has_sink ? sink : -INFINITY, l = 0;
  for (int64_t j = 0; j < n; j++)
    m = s[j] > m || s[j] != s[j] ? s[j] : m;
  if (m == -INFINITY && has_bias) {
    for (int64_t j = 0; j < n; j++)
      s[j] = 0;
    return -INFINITY;
  }
  for (int64_t j = 0; j < n; j++)
    l += exp(s[j] - m);
  if (has_sink) l += exp(sink - m);
  for (int64_t j = 0; j < n; j++)
    s[j] = exp(s[j] - m) / l;
  return m + log(l);
}

static double sink_of(const attn__problem *pb, int64_t h) {
  return pb->has_sinks ? load(&pb->sinks, h * pb->sinks.sh) : -INFINITY;
}

int at_ref_forward(attn_context *ctx, const attn_params *p, const attn_tensor *q,
                   const attn_tensor *k, const attn_tensor *v, double *o, double *lse) {
  return at_ref_forward_progress(ctx, p, q, k, v, o, lse, NULL, NULL);
}

int at_ref_forward_progress(attn_context *ctx, const attn_params *p, const attn_tensor *q,
                            const attn_tensor *k, const attn_tensor *v, double *o, double *lse,
                            at_progress_fn progress, void *user) {
  attn__problem pb;
  int rc = attn__problem_build(ctx, ATTN__REFERENCE, p, q, k, v, NULL, NULL, NULL, NULL, NULL, NULL,
                               &pb);
  if (rc) return rc;
  int64_t d = pb.head_dim, hq = pb.heads_q, group = pb.heads_q / pb.heads_kv;
  size_t nk_max = (size_t)(pb.seqlen_k > 0 ? pb.seqlen_k : 1);
  double *s = malloc(sizeof(double) * (nk_max * (1 + 2 * (size_t)d) + (size_t)d));
  if (!s)
    return attn__error(ctx, ATTN_ENOMEM,
                       "reference: out of memory for a row of scores and a head's keys");
  double *kd = s + nk_max, *vd = kd + nk_max * (size_t)d, *qr = vd + nk_max * (size_t)d;
  int64_t done = 0, rows = pb.total_q * hq;
  for (int64_t b = 0; b < pb.batch; b++) {
    int64_t nq = attn__seq_q(&pb, b), nk = attn__seq_k(&pb, b);
    int64_t rq0 = attn__row0_q(&pb, b);
    for (int64_t h = 0; h < hq; h++) {
      if (h % group == 0) gather_head(&pb, b, h / group, nk, kd, vd);
      for (int64_t i = 0; i < nq; i++) {
        int64_t lo, hi, row = pb.cu_q ? rq0 + i : b * nq + i;
        attn__problem_key_range(&pb, i, nq, nk, &lo, &hi);
        double *orow = o ? o + (row * hq + h) * d : NULL;
        double l = -INFINITY;
        if (orow)
          for (int64_t c = 0; c < d; c++)
            orow[c] = 0;
        if (lo < hi) {
          gather_row(&pb, &pb.q, b, rq0 + i, h, qr);
          row_scores(&pb, b, h, i, qr, kd, lo, hi, uses_tf32(&pb), s, NULL);
          l = softmax(s, hi - lo, pb.has_bias, pb.has_sinks, sink_of(&pb, h));
          if (orow)
            for (int64_t j = lo; j < hi; j++)
              for (int64_t c = 0; c < d; c++)
                orow[c] += operand(&pb, s[j - lo]) * operand(&pb, vd[j * d + c]);
        } else if (pb.has_sinks) {
          l = sink_of(&pb, h); /* the sink alone: o = 0 */
        }
        if (lse) lse[pb.cu_q ? h * pb.total_q + row : (b * hq + h) * nq + i] = l;
        if (progress) progress(user, ++done, rows);
      }
    }
  }
  free(s);
  return ATTN_OK;
}

int at_ref_backward(attn_context *ctx, const attn_params *p, const attn_tensor *q,
                    const attn_tensor *k, const attn_tensor *v, const attn_tensor *dout, double *dq,
                    double *dk, double *dv) {
  return at_ref_backward_progress(ctx, p, q, k, v, dout, dq, dk, dv, NULL, NULL);
}

int at_ref_backward_progress(attn_context *ctx, const attn_params *p, const attn_tensor *q,
                             const attn_tensor *k, const attn_tensor *v, const attn_tensor *dout,
                             double *dq, double *dk, double *dv, at_progress_fn progress,
                             void *user) {
  return at_ref_backward_terms(ctx, p, q, k, v, dout, dq, dk, dv, NULL, NULL, progress, user);
}

int at_ref_backward_terms(attn_context *ctx, const attn_params *p, const attn_tensor *q,
                          const attn_tensor *k, const attn_tensor *v, const attn_tensor *dout,
                          double *dq, double *dk, double *dv, double *dbias, double *dsinks,
                          at_progress_fn progress, void *user) {
  attn__problem pb;
  int rc = attn__problem_build(ctx, ATTN__REFERENCE, p, q, k, v, NULL, NULL, NULL, NULL, NULL, NULL,
                               &pb);
  if (rc) return rc;
  if (!dout) return attn__error(ctx, ATTN_ENULL, "do is NULL");
  if (!dout->data || dout->buffer)
    return attn__error(ctx, ATTN_EINVAL, "do: the reference takes host tensors only");
  if (dout->dtype != q->dtype || dout->ndim != q->ndim)
    return attn__error(ctx, ATTN_ESHAPE, "do: dtype and rank must be q's");
  for (int i = 0; i < q->ndim; i++)
    if (dout->shape[i] != q->shape[i])
      return attn__error(ctx, ATTN_ESHAPE, "do: shape[%d] is %lld, expected q's %lld", i,
                         (long long)dout->shape[i], (long long)q->shape[i]);
  attn__tensor tdo = pb.q;
  tdo.native = dout->data;
  tdo.offset = 0;
  if (pb.cu_q) {
    tdo.ss = dout->stride[0];
    tdo.sh = dout->stride[1];
    tdo.sd = dout->stride[2];
  } else {
    tdo.sb = dout->stride[0];
    tdo.ss = dout->stride[1];
    tdo.sh = dout->stride[2];
    tdo.sd = dout->stride[3];
  }

  int64_t d = pb.head_dim, hq = pb.heads_q, hkv = pb.heads_kv, group = hq / hkv;
  int64_t done = 0, rows = pb.total_q * hq;
  size_t nk_max = (size_t)(pb.seqlen_k > 0 ? pb.seqlen_k : 1);
  double *s = malloc(sizeof(double) * (nk_max * (4 + 2 * (size_t)d) + 3 * (size_t)d));
  if (!s)
    return attn__error(ctx, ATTN_ENOMEM,
                       "reference: out of memory for a row of scores and a head's keys");
  double *g = s + nk_max, *dp = g + nk_max, *st = dp + nk_max, *kd = st + nk_max;
  double *vd = kd + nk_max * (size_t)d, *ot = vd + nk_max * (size_t)d, *qr = ot + d, *dor = qr + d;
  if (dq) memset(dq, 0, sizeof(double) * (size_t)(pb.total_q * hq * d));
  if (dk) memset(dk, 0, sizeof(double) * (size_t)(pb.total_k * hkv * d));
  if (dv) memset(dv, 0, sizeof(double) * (size_t)(pb.total_k * hkv * d));
  /* dbias in the bias's own shape: a broadcast dimension indexes 0. */
  const int64_t *bs = pb.has_bias ? p->bias->shape : NULL;
  if (dbias && bs) memset(dbias, 0, sizeof(double) * (size_t)(bs[0] * bs[1] * bs[2] * bs[3]));
  if (dsinks) memset(dsinks, 0, sizeof(double) * (size_t)hq);
  for (int64_t b = 0; b < pb.batch; b++) {
    int64_t nq = attn__seq_q(&pb, b), nk = attn__seq_k(&pb, b);
    int64_t rq0 = attn__row0_q(&pb, b), rk0 = attn__row0_k(&pb, b);
    int64_t qbase = pb.cu_q ? rq0 : b * nq, kbase = pb.cu_k ? rk0 : b * nk;
    for (int64_t h = 0; h < hq; h++) {
      int64_t hk = h / group;
      if (h % group == 0) gather_head(&pb, b, hk, nk, kd, vd);
      for (int64_t i = 0; i < nq; i++) {
        int64_t lo, hi;
        attn__problem_key_range(&pb, i, nq, nk, &lo, &hi);
        if (progress) progress(user, ++done, rows);
        if (lo >= hi) continue; /* a row that sees no key passes no gradient */
        gather_row(&pb, &pb.q, b, rq0 + i, h, qr);
        gather_row(&pb, &tdo, b, rq0 + i, h, dor);
        row_scores(&pb, b, h, i, qr, kd, lo, hi, 0, s, g);
        double lse = softmax(s, hi - lo, pb.has_bias, pb.has_sinks, sink_of(&pb, h));
        if (lse == -INFINITY) continue;
        /* TF32: P_ij = exp(s_ij - lse) with the TF32 forward's lse, and D_i
         * from its o (the top). */
        int64_t n = hi - lo;
        if (uses_tf32(&pb)) {
          row_scores(&pb, b, h, i, qr, kd, lo, hi, 1, st, NULL);
          const double lt = softmax(st, n, pb.has_bias, pb.has_sinks, sink_of(&pb, h));
          for (int64_t c = 0; c < d; c++) {
            ot[c] = 0;
            for (int64_t j = lo; j < hi; j++)
              ot[c] += tf32(st[j - lo]) * tf32(vd[j * d + c]);
          }
          for (int64_t j = 0; j < n; j++)
            s[j] *= exp(lse - lt);
          lse = lt;
        }
        /* dP_ij = do_i . v_j; D_i = sum_j P_ij dP_ij (= do_i . o_i). */
        double D = 0;
        for (int64_t j = lo; j < hi; j++) {
          double acc = 0;
          for (int64_t c = 0; c < d; c++)
            acc += dor[c] * vd[j * d + c];
          dp[j - lo] = acc;
          D += s[j - lo] * acc;
        }
        if (uses_tf32(&pb)) {
          D = 0;
          for (int64_t c = 0; c < d; c++)
            D += dor[c] * ot[c];
        }
        /* The sink has no value (dP = 0): its dS is P_sink (0 - D). */
        if (dsinks && pb.has_sinks) dsinks[h] += -exp(sink_of(&pb, h) - lse) * D;
        for (int64_t j = lo; j < hi; j++) {
          double pij = s[j - lo];
          double dsij = pij * (dp[j - lo] - D);
          double du = dsij * g[j - lo] * pb.scale;
          if (dbias && bs)
            dbias[(((bs[0] == 1 ? 0 : b) * bs[1] + (bs[1] == 1 ? 0 : h)) * bs[2] +
                   (bs[2] == 1 ? 0 : i)) *
                      bs[3] +
                  j] += dsij;
          int64_t krow = ((kbase + j) * hkv + hk) * d, qrow = ((qbase + i) * hq + h) * d;
          for (int64_t c = 0; c < d; c++) {
            if (dq) dq[qrow + c] += du * kd[j * d + c];
            if (dk) dk[krow + c] += du * qr[c];
            if (dv) dv[krow + c] += pij * dor[c];
          }
        }
      }
    }
  }
  free(s);
  return ATTN_OK;
}
