/*
 * Checking the library against a golden case: run it on a context, forward
 * and then backward, and hold every output to the golden README's tolerance
 * rule.
 */
#include "golden.h"

#include "attn_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

double at_golden_bound(const char *out, attn_dtype dt, double peer, double maxref) {
  double F = out[0] == 'd' ? 3.0 : 2.0, scale = maxref > 1 ? maxref : 1;
  if (!isnan(peer)) return F * peer + 1e-6 * scale;
  if (strcmp(out, "lse") == 0) return 1e-5 * scale;
  return (dt == ATTN_F32 ? 1e-5 : dt == ATTN_F16 ? 1e-2 : 2e-2) * scale;
}

/* Compares x (n elements of dtype dt) with ref. empty, when given, marks the
 * elements that belong to a row with no visible key: those must be exactly
 * zero (o, dq) and a -inf reference must be matched exactly (lse). */
static void compare(at_golden_result *r, const char *out, const void *x, attn_dtype dt,
                    const float *ref, int64_t n, const unsigned char *empty, attn_dtype case_dt,
                    double peer) {
  double err = 0, maxref = 0;
  for (int64_t i = 0; i < n; i++) {
    double want = ref[i], got = attn__load(x, dt, i);
    if (isnan(got)) {
      err = INFINITY;
      continue;
    }
    if (empty && empty[i] && got != 0.0) {
      err = INFINITY;
      continue;
    }
    if (isinf(want)) {
      if (got != want) err = INFINITY;
      continue;
    }
    if (isnan(want)) continue;
    if (fabs(want) > maxref) maxref = fabs(want);
    double e = fabs(got - want);
    if (!(e <= err)) err = e;
  }
  r->output = out;
  r->max_err = err;
  r->bound = at_golden_bound(out, case_dt, peer, maxref);
  r->ratio = isnan(peer) ? NAN : peer > 0 ? err / ((out[0] == 'd' ? 3.0 : 2.0) * peer) : NAN;
  r->pass = err <= r->bound;
}

static void fail_report(at_golden_report *rep, int status, const char *prefix, const char *msg) {
  rep->status = status;
  snprintf(rep->message, sizeof rep->message, "%s%s", prefix, msg ? msg : "");
  rep->pass = 0;
}

int at_golden_run(attn_context *ctx, const at_golden *g, int forward_only, at_golden_report *rep) {
  memset(rep, 0, sizeof *rep);
  rep->status = ATTN_OK;
  const attn_dtype dt = g->dtype;
  const int64_t Hq = g->heads_q, Hkv = g->heads_kv, d = g->head_dim;
  const int64_t nq = g->total_q * Hq * d, nk = g->total_k * Hkv * d, nl = g->total_q * Hq;
  const size_t es = attn_dtype_size(dt);

  attn_tensor q, k, v, o, lse, dout, dq, dk, dv;
  void *obuf = malloc((size_t)nq * es + 1), *dqb = NULL, *dkb = NULL, *dvb = NULL;
  /* lse in the (hi, lo) form, which keeps f32 gradients exact at large
   * logits; hi is compared as the lse. */
  float *lbuf = malloc((size_t)nl * 2 * sizeof(float) + 1);
  float *lhi = malloc((size_t)nl * sizeof(float) + 1);
  unsigned char *empty_o = malloc((size_t)nq + 1), *empty_l = malloc((size_t)nl + 1);
  if (!obuf || !lbuf || !lhi || !empty_o || !empty_l) {
    fail_report(rep, ATTN_ENOMEM, "", "out of memory allocating the outputs");
    goto done;
  }
  /* All-ones bytes are NaN in every dtype: an element the library never
   * writes cannot pass. */
  memset(obuf, 0xff, (size_t)nq * es);
  memset(lbuf, 0xff, (size_t)nl * 2 * sizeof(float));

  if (g->varlen) {
    q = attn_tensor_varlen(g->q, dt, g->total_q, Hq, d);
    k = attn_tensor_varlen(g->k, dt, g->total_k, Hkv, d);
    v = attn_tensor_varlen(g->v, dt, g->total_k, Hkv, d);
    o = attn_tensor_varlen(obuf, dt, g->total_q, Hq, d);
    lse = attn_tensor_lse_hilo(lbuf, 0, Hq, g->total_q);
  } else {
    q = attn_tensor_bshd(g->q, dt, g->batch, g->seqlen_q, Hq, d);
    k = attn_tensor_bshd(g->k, dt, g->batch, g->seqlen_k, Hkv, d);
    v = attn_tensor_bshd(g->v, dt, g->batch, g->seqlen_k, Hkv, d);
    o = attn_tensor_bshd(obuf, dt, g->batch, g->seqlen_q, Hq, d);
    lse = attn_tensor_lse_hilo(lbuf, g->batch, Hq, g->seqlen_q);
  }

  /* Which (row, head) pairs see no key, from the reference lse; the o and dq
   * masks are the same per element of the row. */
  for (int64_t r = 0; r < g->total_q; r++)
    for (int64_t h = 0; h < Hq; h++) {
      int64_t li = g->varlen ? h * g->total_q + r
                             : ((r / g->seqlen_q) * Hq + h) * g->seqlen_q + r % g->seqlen_q;
      unsigned char e = isinf(g->lse[li]) && g->lse[li] < 0;
      empty_l[li] = e;
      memset(empty_o + (r * Hq + h) * d, e, (size_t)d);
    }

  int st = attn_forward(ctx, &g->params, &q, &k, &v, &o, &lse);
  if (st != ATTN_OK) {
    fail_report(rep, st, "forward: ", attn_errmsg(ctx));
    goto done;
  }
  compare(&rep->r[0], "o", obuf, dt, g->o, nq, empty_o, dt, g->peer_o);
  for (int64_t i = 0; i < nl; i++)
    lhi[i] = lbuf[2 * i];
  compare(&rep->r[1], "lse", lhi, ATTN_F32, g->lse, nl, NULL, dt, g->peer_lse);
  rep->n = 2;

  if (!forward_only && g->dout) {
    dqb = malloc((size_t)nq * es + 1);
    dkb = malloc((size_t)nk * es + 1);
    dvb = malloc((size_t)nk * es + 1);
    if (!dqb || !dkb || !dvb) {
      fail_report(rep, ATTN_ENOMEM, "", "out of memory allocating the gradients");
      goto done;
    }
    memset(dqb, 0xff, (size_t)nq * es);
    memset(dkb, 0xff, (size_t)nk * es);
    memset(dvb, 0xff, (size_t)nk * es);
    if (g->varlen) {
      dout = attn_tensor_varlen(g->dout, dt, g->total_q, Hq, d);
      dq = attn_tensor_varlen(dqb, dt, g->total_q, Hq, d);
      dk = attn_tensor_varlen(dkb, dt, g->total_k, Hkv, d);
      dv = attn_tensor_varlen(dvb, dt, g->total_k, Hkv, d);
    } else {
      dout = attn_tensor_bshd(g->dout, dt, g->batch, g->seqlen_q, Hq, d);
      dq = attn_tensor_bshd(dqb, dt, g->batch, g->seqlen_q, Hq, d);
      dk = attn_tensor_bshd(dkb, dt, g->batch, g->seqlen_k, Hkv, d);
      dv = attn_tensor_bshd(dvb, dt, g->batch, g->seqlen_k, Hkv, d);
    }
    /* The backward pass takes the library's own forward outputs, as training
     * does. */
    st = attn_backward(ctx, &g->params, &q, &k, &v, &o, &lse, &dout, &dq, &dk, &dv);
    if (st != ATTN_OK) {
      fail_report(rep, st, "backward: ", attn_errmsg(ctx));
      goto done;
    }
    compare(&rep->r[2], "dq", dqb, dt, g->dq, nq, empty_o, dt, g->peer_dq);
    compare(&rep->r[3], "dk", dkb, dt, g->dk, nk, NULL, dt, g->peer_dk);
    compare(&rep->r[4], "dv", dvb, dt, g->dv, nk, NULL, dt, g->peer_dv);
    rep->n = 5;
  }
  rep->pass = 1;
  for (int i = 0; i < rep->n; i++)
    rep->pass &= rep->r[i].pass;

done:
  free(obuf);
  free(lbuf);
  free(lhi);
  free(empty_o);
  free(empty_l);
  free(dqb);
  free(dkb);
  free(dvb);
  return rep->status;
}
