/*
 * Checking the library against a golden case: run it on a context, forward
 * (once per num_splits of at_golden_splits) and then backward, and hold every
 * output to the golden README's tolerance rule; or run the test kit's
 * reference on the case and hold it to the same rule.
 */
#include "golden.h"

#include "attn_internal.h"
#include "ref.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The backend's own choice first: the backward pass takes that run's o and
 * lse, as training does. */
const int at_golden_splits[AT_GOLDEN_SPLIT_RUNS] = {0, 1, 3};

/* The README's F: 3 for gradients, 2 for the forward's outputs. */
static double factor(const char *out) {
  return out[0] == 'd' ? 3.0 : 2.0;
}

double at_golden_bound(const char *out, attn_dtype dt, double peer, double maxref) {
  double F = factor(out), scale = maxref > 1 ? maxref : 1;
  if (!isnan(peer)) return F * peer + 1e-6 * scale;
  if (strcmp(out, "lse") == 0) return 1e-5 * scale;
  return (dt == ATTN_F32 ? 1e-5 : dt == ATTN_F16 ? 1e-2 : 2e-2) * scale;
}

double at_golden_tf32_cost(const double *tf32, const double *exact, int64_t n) {
  double e = 0;
  for (int64_t i = 0; i < n; i++) {
    double d = tf32[i] == exact[i] ? 0 : fabs(tf32[i] - exact[i]);
    if (!(d <= e)) e = d;
  }
  return e;
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
  r->peer = peer;
  r->ratio = isnan(peer) ? NAN : peer > 0 ? err / (factor(out) * peer) : NAN;
  r->num_splits = -1;
  r->tf32 = 0;
  r->pass = err <= r->bound;
}

/* The cache after an append against the expected one: the appended rows are
 * copies, and every other row is left alone, so the bits must be equal. */
static void compare_exact(at_golden_result *r, const char *out, const void *x, const void *ref,
                          attn_dtype dt, int64_t n) {
  const size_t es = attn_dtype_size(dt);
  double err = 0;
  int same = 1;
  for (int64_t i = 0; i < n; i++) {
    if (!memcmp((const char *)x + i * es, (const char *)ref + i * es, es)) continue;
    same = 0;
    double e = fabs(attn__load(x, dt, i) - attn__load(ref, dt, i));
    /* NaN, or a difference no subtraction shows (-0 for +0): not a copy. */
    if (!(e > 0)) e = INFINITY;
    if (e > err) err = e;
  }
  r->output = out;
  r->max_err = err;
  r->bound = 0;
  r->peer = NAN;
  r->ratio = NAN;
  r->num_splits = -1;
  r->tf32 = 0;
  r->pass = same;
}

/* With TF32 allowed, what rounding to TF32 alone costs this output (the
 * reference computed as TF32, against the exact answer) joins its peer
 * figure: bound F * (peer + tf32) + 1e-6 * max(1, max|ref|), or with no
 * peer figure the dtype's bound plus F * tf32. */
static void add_tf32(at_golden_result *r, double tf32) {
  const double F = factor(r->output);
  r->tf32 = tf32;
  r->bound += F * tf32;
  if (!isnan(r->peer) && r->peer + tf32 > 0) r->ratio = r->max_err / (F * (r->peer + tf32));
  r->pass = r->max_err <= r->bound;
}

/* Keeps, per output, the worst of the forward's runs. */
static void keep_worst(at_golden_result *into, const at_golden_result *r, int first) {
  if (first) {
    *into = *r;
    return;
  }
  if (!(r->max_err <= into->max_err)) {
    into->max_err = r->max_err;
    into->ratio = r->ratio;
    into->num_splits = r->num_splits;
  }
  into->pass &= r->pass;
}

static void fail_report(at_golden_report *rep, int status, const char *prefix, const char *msg) {
  rep->status = status;
  snprintf(rep->message, sizeof rep->message, "%s%s", prefix, msg ? msg : "");
  rep->pass = 0;
}

/* ---------------------------------------------------------------------- */
/* Tensors                                                                  */
/* ---------------------------------------------------------------------- */

/* A tensor shaped like q (o, do, dq) or like k (v, dk, dv; pages when the
 * case is paged) over data of dtype dt. */
static attn_tensor like_q(const at_golden *g, void *data, attn_dtype dt) {
  return g->varlen ? attn_tensor_varlen(data, dt, g->total_q, g->heads_q, g->head_dim)
                   : attn_tensor_bshd(data, dt, g->batch, g->seqlen_q, g->heads_q, g->head_dim);
}

static attn_tensor like_k(const at_golden *g, void *data, attn_dtype dt) {
  if (g->page_size)
    return attn_tensor_bshd(data, dt, g->num_pages, g->page_size, g->heads_kv, g->head_dim);
  return g->varlen ? attn_tensor_varlen(data, dt, g->total_k, g->heads_kv, g->head_dim)
                   : attn_tensor_bshd(data, dt, g->batch, g->seqlen_k, g->heads_kv, g->head_dim);
}

static int64_t lse_index(const at_golden *g, int64_t row, int64_t h) {
  return g->varlen ? h * g->total_q + row
                   : ((row / g->seqlen_q) * g->heads_q + h) * g->seqlen_q + row % g->seqlen_q;
}

/* Which (row, head) elements of o and dq belong to a row that sees no key,
 * from the reference: lse -inf, or, with sinks, lse the sink and o zero. */
static void mark_empty(const at_golden *g, unsigned char *empty_o) {
  const int64_t Hq = g->heads_q, d = g->head_dim;
  for (int64_t r = 0; r < g->total_q; r++)
    for (int64_t h = 0; h < Hq; h++) {
      const float l = g->lse[lse_index(g, r, h)];
      const float *orow = g->o + (r * Hq + h) * d;
      unsigned char e = isinf(l) && l < 0;
      if (!e && g->sinks && l == g->sinks[h]) {
        e = 1;
        for (int64_t c = 0; c < d && e; c++)
          e = orow[c] == 0.0f;
      }
      memset(empty_o + (r * Hq + h) * d, e, (size_t)d);
    }
}

static int64_t bias_count(const at_golden *g) {
  return g->bias_shape[0] * g->bias_shape[1] * g->bias_shape[2] * g->bias_shape[3];
}

/* ---------------------------------------------------------------------- */
/* The run                                                                  */
/* ---------------------------------------------------------------------- */

/* Every buffer of one check, freed together. */
typedef struct bufs {
  void *o, *o2, *kc, *vc, *dq, *dk, *dv;
  float *l, *l2, *lhi, *dbias, *dsinks;
  double *xo, *xl, *xdq, *xdk, *xdv, *xdb, *xds; /* the reference's outputs */
  double *t; /* the reference computed as TF32, one output at a time */
  unsigned char *empty_o;
} bufs;

static void bufs_free(bufs *b) {
  void *all[] = {b->o,   b->o2,  b->kc,  b->vc,    b->dq,     b->dk, b->dv,
                 b->l,   b->l2,  b->lhi, b->dbias, b->dsinks, b->xo, b->xl,
                 b->xdq, b->xdk, b->xdv, b->xdb,   b->xds,    b->t,  b->empty_o};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
    free(all[i]);
}

/* n elements of size es, filled with all-ones bytes: NaN in every float
 * dtype, so an element the library never writes cannot pass. */
static void *nan_alloc(int64_t n, size_t es) {
  void *p = malloc((size_t)n * es + 1);
  if (p) memset(p, 0xff, (size_t)n * es);
  return p;
}

/* Doubles from the reference to floats, in place of n doubles' storage. */
static float *to_float(double *x, int64_t n) {
  float *f = (float *)x;
  for (int64_t i = 0; i < n; i++)
    f[i] = (float)x[i];
  return f;
}

/* The backend declines the case: a skip with its reason, never a pass. */
static int declined(attn_context *ctx, at_golden_report *rep, const char *pass, int splits) {
  char prefix[64];
  if (splits >= 0)
    snprintf(prefix, sizeof prefix, "%s (num_splits %d) declined: ", pass, splits);
  else
    snprintf(prefix, sizeof prefix, "%s declined: ", pass);
  fail_report(rep, ATTN_EUNSUPPORTED, prefix, attn_errmsg(ctx));
  rep->skipped = 1;
  return rep->status;
}

/* What rounding to TF32 alone costs each output of the case (add_tf32):
 * the reference computed as TF32 against the case's answers, in t[] in the
 * order o, lse, dq, dk, dv, dbias, dsinks (the backward's when backward is
 * set). Returns the reference's status. */
static int tf32_errors(attn_context *ctx, const at_golden *g, int backward, bufs *B, double t[7]) {
  const attn_dtype dt = g->dtype;
  const int64_t Hq = g->heads_q, Hkv = g->heads_kv, d = g->head_dim;
  const int64_t nq = g->total_q * Hq * d, nk = g->total_k * Hkv * d, nl = g->total_q * Hq;
  const int64_t nb = g->bias && g->dbias ? bias_count(g) : 0;
  attn_tensor q = like_q(g, g->q, dt), k = like_k(g, g->k, dt), v = like_k(g, g->v, dt);
  at_golden_result r;
  int64_t n = nq > nk ? nq : nk;
  if (nb > n) n = nb;
  free(B->t);
  B->t = malloc(sizeof(double) * (size_t)(4 * n + nl + Hq) + 1);
  if (!B->t) return attn__error(ctx, ATTN_ENOMEM, "out of memory for the TF32 reference");
  double *x0 = B->t, *x1 = x0 + n, *x2 = x1 + n, *x3 = x2 + n, *xl = x3 + n, *xs = xl + nl;
  for (int i = 0; i < 7; i++)
    t[i] = 0;
  int st;
  if (!backward) {
    st = at_ref_forward(ctx, &g->params, &q, &k, &v, x0, xl);
    if (st) return st;
    compare(&r, "o", to_float(x0, nq), ATTN_F32, g->o, nq, NULL, dt, NAN);
    t[0] = r.max_err;
    compare(&r, "lse", to_float(xl, nl), ATTN_F32, g->lse, nl, NULL, dt, NAN);
    t[1] = r.max_err;
    return ATTN_OK;
  }
  const int with_ds = g->sinks && g->dsinks;
  attn_tensor dout = like_q(g, g->dout, dt);
  st = at_ref_backward_terms(ctx, &g->params, &q, &k, &v, &dout, x0, x1, x2, nb ? x3 : NULL,
                             with_ds ? xs : NULL, NULL, NULL);
  if (st) return st;
  compare(&r, "dq", to_float(x0, nq), ATTN_F32, g->dq, nq, NULL, dt, NAN);
  t[2] = r.max_err;
  compare(&r, "dk", to_float(x1, nk), ATTN_F32, g->dk, nk, NULL, dt, NAN);
  t[3] = r.max_err;
  compare(&r, "dv", to_float(x2, nk), ATTN_F32, g->dv, nk, NULL, dt, NAN);
  t[4] = r.max_err;
  if (nb) {
    compare(&r, "dbias", to_float(x3, nb), ATTN_F32, g->dbias, nb, NULL, dt, NAN);
    t[5] = r.max_err;
  }
  if (with_ds) {
    compare(&r, "dsinks", to_float(xs, Hq), ATTN_F32, g->dsinks, Hq, NULL, dt, NAN);
    t[6] = r.max_err;
  }
  return ATTN_OK;
}

static int run_case(attn_context *ctx, const at_golden *g, int forward_only, int reference,
                    at_golden_report *rep) {
  memset(rep, 0, sizeof *rep);
  rep->status = ATTN_OK;
  const attn_dtype dt = g->dtype;
  const int64_t Hq = g->heads_q, Hkv = g->heads_kv, d = g->head_dim;
  const int64_t nq = g->total_q * Hq * d, nk = g->total_k * Hkv * d, nl = g->total_q * Hq;
  const size_t es = attn_dtype_size(dt);
  const int append = g->seqlen_new > 0 && !reference;
  bufs B = {0};
  attn_tensor q = like_q(g, g->q, dt), k = like_k(g, g->k, dt), v = like_k(g, g->v, dt);
  int st;

  B.empty_o = malloc((size_t)nq + 1);
  B.lhi = malloc((size_t)nl * sizeof(float) + 1);
  if (!B.empty_o || !B.lhi) {
    fail_report(rep, ATTN_ENOMEM, "", "out of memory allocating the outputs");
    goto done;
  }
  mark_empty(g, B.empty_o);

  /* TF32's own error on the case, where it is allowed (add_tf32). */
  const int tf32 = (g->params.flags & ATTN_ALLOW_TF32) && dt == ATTN_F32;
  double terr[7] = {0};
  if (tf32 && (st = tf32_errors(ctx, g, 0, &B, terr)) != ATTN_OK) {
    fail_report(rep, st, "TF32 reference forward: ", attn_errmsg(ctx));
    goto done;
  }

  /* Forward: o, lse and, after an append, the cache. */
  const char *fwd_names[4] = {"o", "lse", "k_out", "v_out"};
  const int nfwd = append ? 4 : 2;
  const int runs = reference ? 1 : AT_GOLDEN_SPLIT_RUNS;
  for (int run = 0; run < runs; run++) {
    at_golden_result r[4];
    const void *o_out;
    attn_dtype odt = dt;
    if (reference) {
      B.xo = malloc((size_t)nq * sizeof(double) + 1);
      B.xl = malloc((size_t)nl * sizeof(double) + 1);
      if (!B.xo || !B.xl) {
        fail_report(rep, ATTN_ENOMEM, "", "out of memory allocating the outputs");
        goto done;
      }
      st = at_ref_forward(ctx, &g->params, &q, &k, &v, B.xo, B.xl);
      if (st != ATTN_OK) {
        fail_report(rep, st, "reference forward: ", attn_errmsg(ctx));
        goto done;
      }
      o_out = to_float(B.xo, nq);
      odt = ATTN_F32;
      memcpy(B.lhi, to_float(B.xl, nl), (size_t)nl * sizeof(float));
    } else {
      attn_params p = g->params;
      p.num_splits = at_golden_splits[run];
      /* The first run's o and lse stay for the backward pass. */
      void **ob = run == 0 ? &B.o : &B.o2;
      float **lb = run == 0 ? &B.l : &B.l2;
      free(*ob);
      free(*lb);
      /* lse in the (hi, lo) form, which keeps f32 gradients exact at large
       * logits; hi is compared as the lse. */
      *ob = nan_alloc(nq, es);
      *lb = nan_alloc(nl * 2, sizeof(float));
      if (!*ob || !*lb) {
        fail_report(rep, ATTN_ENOMEM, "", "out of memory allocating the outputs");
        goto done;
      }
      /* An append writes into k and v: each run gets the case's cache afresh. */
      if (append) {
        free(B.kc);
        free(B.vc);
        B.kc = malloc((size_t)nk * es + 1);
        B.vc = malloc((size_t)nk * es + 1);
        if (!B.kc || !B.vc) {
          fail_report(rep, ATTN_ENOMEM, "", "out of memory copying the cache");
          goto done;
        }
        memcpy(B.kc, g->k, (size_t)nk * es);
        memcpy(B.vc, g->v, (size_t)nk * es);
        k = like_k(g, B.kc, dt);
        v = like_k(g, B.vc, dt);
      }
      attn_tensor o = like_q(g, *ob, dt);
      attn_tensor lse = g->varlen ? attn_tensor_lse_hilo(*lb, 0, Hq, g->total_q)
                                  : attn_tensor_lse_hilo(*lb, g->batch, Hq, g->seqlen_q);
      st = attn_supports(ctx, &p, &q, &k, &v, 0);
      if (st == ATTN_EUNSUPPORTED) {
        declined(ctx, rep, "forward", p.num_splits);
        goto done;
      }
      /* After attn_supports said yes, the call must not decline. */
      if (st == ATTN_OK) st = attn_forward(ctx, &p, &q, &k, &v, &o, &lse);
      if (st != ATTN_OK) {
        char prefix[64];
        snprintf(prefix, sizeof prefix, "forward (num_splits %d): ", p.num_splits);
        fail_report(rep, st, prefix, attn_errmsg(ctx));
        goto done;
      }
      o_out = *ob;
      for (int64_t i = 0; i < nl; i++)
        B.lhi[i] = (*lb)[2 * i];
    }
    compare(&r[0], "o", o_out, odt, g->o, nq, B.empty_o, dt, g->peer_o);
    compare(&r[1], "lse", B.lhi, ATTN_F32, g->lse, nl, NULL, dt, g->peer_lse);
    if (tf32) {
      add_tf32(&r[0], terr[0]);
      add_tf32(&r[1], terr[1]);
    }
    if (append) {
      compare_exact(&r[2], "k_out", B.kc, g->k_out, dt, nk);
      compare_exact(&r[3], "v_out", B.vc, g->v_out, dt, nk);
    }
    for (int i = 0; i < nfwd; i++) {
      r[i].output = fwd_names[i];
      r[i].num_splits = reference ? -1 : at_golden_splits[run];
      keep_worst(&rep->r[i], &r[i], run == 0);
    }
    rep->n = rep->n_forward = nfwd;
  }

  if (!forward_only && g->dout) {
    const int64_t nb = g->bias && g->dbias ? bias_count(g) : 0;
    const int with_ds = g->sinks && g->dsinks;
    attn_tensor dout = like_q(g, g->dout, dt);
    const void *gq, *gk, *gv, *gb = NULL, *gs = NULL;
    if (tf32 && (st = tf32_errors(ctx, g, 1, &B, terr)) != ATTN_OK) {
      fail_report(rep, st, "TF32 reference backward: ", attn_errmsg(ctx));
      goto done;
    }
    attn_dtype gdt = dt;
    if (reference) {
      B.xdq = malloc((size_t)nq * sizeof(double) + 1);
      B.xdk = malloc((size_t)nk * sizeof(double) + 1);
      B.xdv = malloc((size_t)nk * sizeof(double) + 1);
      B.xdb = malloc((size_t)nb * sizeof(double) + 1);
      B.xds = malloc((size_t)Hq * sizeof(double) + 1);
      if (!B.xdq || !B.xdk || !B.xdv || !B.xdb || !B.xds) {
        fail_report(rep, ATTN_ENOMEM, "", "out of memory allocating the gradients");
        goto done;
      }
      st = at_ref_backward_terms(ctx, &g->params, &q, &k, &v, &dout, B.xdq, B.xdk, B.xdv,
                                 nb ? B.xdb : NULL, with_ds ? B.xds : NULL, NULL, NULL);
      if (st != ATTN_OK) {
        fail_report(rep, st, "reference backward: ", attn_errmsg(ctx));
        goto done;
      }
      gq = to_float(B.xdq, nq);
      gk = to_float(B.xdk, nk);
      gv = to_float(B.xdv, nk);
      gb = to_float(B.xdb, nb);
      gs = to_float(B.xds, with_ds ? Hq : 0);
      gdt = ATTN_F32;
    } else {
      B.dq = nan_alloc(nq, es);
      B.dk = nan_alloc(nk, es);
      B.dv = nan_alloc(nk, es);
      B.dbias = nan_alloc(nb, sizeof(float));
      B.dsinks = nan_alloc(Hq, sizeof(float));
      if (!B.dq || !B.dk || !B.dv || !B.dbias || !B.dsinks) {
        fail_report(rep, ATTN_ENOMEM, "", "out of memory allocating the gradients");
        goto done;
      }
      attn_params p = g->params;
      attn_tensor dq = like_q(g, B.dq, dt), dk = like_k(g, B.dk, dt), dv = like_k(g, B.dv, dt);
      attn_tensor o = like_q(g, B.o, dt);
      attn_tensor lse = g->varlen ? attn_tensor_lse_hilo(B.l, 0, Hq, g->total_q)
                                  : attn_tensor_lse_hilo(B.l, g->batch, Hq, g->seqlen_q);
      attn_tensor tdb, tds;
      if (nb) {
        tdb = attn_tensor_bias(B.dbias, ATTN_F32, g->bias_shape[0], g->bias_shape[1],
                               g->bias_shape[2], g->bias_shape[3]);
        p.dbias = &tdb;
      }
      if (with_ds) {
        tds = attn_tensor_1d(B.dsinks, ATTN_F32, Hq);
        p.dsinks = &tds;
      }
      st = attn_supports(ctx, &p, &q, &k, &v, 1);
      if (st == ATTN_EUNSUPPORTED) {
        declined(ctx, rep, "backward", -1);
        goto done;
      }
      /* The backward pass takes the library's own forward outputs, as
       * training does. */
      if (st == ATTN_OK) st = attn_backward(ctx, &p, &q, &k, &v, &o, &lse, &dout, &dq, &dk, &dv);
      if (st != ATTN_OK) {
        fail_report(rep, st, "backward: ", attn_errmsg(ctx));
        goto done;
      }
      gq = B.dq, gk = B.dk, gv = B.dv, gb = B.dbias, gs = B.dsinks;
    }
    at_golden_result *r = rep->r + rep->n;
    compare(r, "dq", gq, gdt, g->dq, nq, B.empty_o, dt, g->peer_dq);
    if (tf32) add_tf32(r, terr[2]);
    r++;
    compare(r, "dk", gk, gdt, g->dk, nk, NULL, dt, g->peer_dk);
    if (tf32) add_tf32(r, terr[3]);
    r++;
    compare(r, "dv", gv, gdt, g->dv, nk, NULL, dt, g->peer_dv);
    if (tf32) add_tf32(r, terr[4]);
    r++;
    /* dbias and dsinks are float32 whatever the inputs' dtype. */
    if (nb) {
      compare(r, "dbias", gb, ATTN_F32, g->dbias, nb, NULL, dt, g->peer_dbias);
      if (tf32) add_tf32(r, terr[5]);
      r++;
    }
    if (with_ds) {
      compare(r, "dsinks", gs, ATTN_F32, g->dsinks, Hq, NULL, dt, g->peer_dsinks);
      if (tf32) add_tf32(r, terr[6]);
      r++;
    }
    rep->n = (int)(r - rep->r);
  }
  rep->pass = 1;
  for (int i = 0; i < rep->n; i++)
    rep->pass &= rep->r[i].pass;

done:
  bufs_free(&B);
  return rep->status;
}

int at_golden_run(attn_context *ctx, const at_golden *g, int forward_only, at_golden_report *rep) {
  return run_case(ctx, g, forward_only, 0, rep);
}

int at_golden_run_reference(attn_context *ctx, const at_golden *g, int forward_only,
                            at_golden_report *rep) {
  return run_case(ctx, g, forward_only, 1, rep);
}
