/*
 * The check of attn run and attn vit: the outputs against the float64
 * reference of the test kit, held to the golden README's tolerance rule (its
 * form without a peer figure: a random problem has none, and with TF32
 * allowed, F times what rounding to TF32 alone costs joins each bound), with
 * the reference's progress on stderr when it takes more than a second; and,
 * when the call appends to a KV cache, the cache read back.
 */
#include "golden.h"
#include "ref.h"
#include "run.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Max |x - ref| over n elements, and max |ref|. */
static void compare(const void *x, attn_dtype dt, const double *ref, size_t n, double *err,
                    double *refmax) {
  *err = 0;
  *refmax = 0;
  for (size_t i = 0; i < n; i++) {
    double a = attn__load(x, dt, (int64_t)i), e = fabs(a - ref[i]);
    if (isnan(a)) e = INFINITY;
    if (e > *err) *err = e;
    if (fabs(ref[i]) > *refmax) *refmax = fabs(ref[i]);
  }
}

/* The reference is plain double-precision loops and can take minutes on a
 * large problem: after a second, say how far it has come. On a terminal one
 * line is rewritten in place; in a log a line every few seconds. */
typedef struct progress {
  run_progress line;
  double next;
  const char *pass; /* "forward", "backward" */
} progress;

static void progress_start(progress *pg) {
  run_progress_start(&pg->line);
  pg->next = pg->line.t0 + 1.0;
  pg->pass = "forward";
}

static void progress_show(void *user, int64_t done, int64_t total) {
  progress *pg = user;
  double t = run_now_s();
  if (t < pg->next) return;
  int pct = (int)(100.0 * (double)done / (double)(total > 0 ? total : 1));
  if (pg->line.tty) {
    run_progress_show(&pg->line, "reference %s: %3d%% (%lld/%lld rows)", pg->pass, pct,
                      (long long)done, (long long)total);
    pg->next = t + 0.2;
  } else {
    run_progress_show(&pg->line, "reference %s: %d%% (%lld/%lld rows, %.0f s)", pg->pass, pct,
                      (long long)done, (long long)total, t - pg->line.t0);
    pg->next = t + 5.0;
  }
}

static void progress_end(progress *pg) {
  if (!pg->line.shown) return;
  /* On a terminal the results follow on stdout: no stale line is left. */
  if (pg->line.tty)
    run_progress_clear(&pg->line);
  else
    run_progress_show(&pg->line, "reference done in %.1f s", run_now_s() - pg->line.t0);
}

/* One output's error and its bound; failed names the outputs over theirs. */
typedef struct verdict {
  char failed[96];
} verdict;

/* The bound of one output: the README's without a peer figure, plus F times
 * TF32's own error tf32 (0 without TF32). */
static double judge(verdict *v, const char *name, double err, double refmax, attn_dtype dt,
                    double tf32) {
  double bound = at_golden_bound(name, dt, NAN, refmax) + (name[0] == 'd' ? 3 : 2) * tf32;
  if (!(err <= bound)) {
    size_t n = strlen(v->failed);
    snprintf(v->failed + n, sizeof v->failed - n, "%s%s", n ? ", " : "", name);
  }
  return bound;
}

static void print_verdict(const verdict *v, size_t mark) {
  /* mark: the length of failed before this line's outputs were judged. */
  if (strlen(v->failed) == mark)
    printf(": ok\n");
  else
    printf(": FAIL (%s)\n", v->failed + mark + (mark ? 2 : 0));
}

/* Where row i of lse ([batch, heads, seqlen_q]) starts in o and dq
 * ([batch, seqlen_q, heads, d]). */
static size_t row_of(const run_opts *o, size_t i) {
  const size_t nq = (size_t)o->nq, hq = (size_t)o->hq;
  return ((i / (hq * nq) * nq + i % nq) * hq + i / nq % hq) * (size_t)o->d;
}

/* Whether every row marked empty is zero in x (q-shaped, q's dtype). */
static int zero_rows(const void *x, const run_opts *o, const unsigned char *empty, size_t nl) {
  for (size_t i = 0; i < nl; i++)
    for (size_t c = 0; empty[i] && c < (size_t)o->d; c++)
      if (attn__load(x, o->dtype, (int64_t)(row_of(o, i) + c)) != 0.0f) return 0;
  return 1;
}

/* The element offset of key row j of sequence b in the cache. */
static int64_t cache_row(const run_opts *o, const run_cache *c, int64_t b, int64_t j) {
  int64_t row =
      o->page_size
          ? (int64_t)c->table[b * c->max_pages + j / o->page_size] * o->page_size + j % o->page_size
          : b * c->cap + j;
  return row * o->hkv * o->d;
}

/* Reads the cache (k or v) back: the appended rows must be where the lengths
 * say, and every other row as it was. Returns -1 when out of memory, else
 * the wrong rows (appended, then other) in bad[2]. */
static int check_cache(attn_context *ctx, const run_opts *o, const run_cache *c,
                       const device_tensor *cache, const device_tensor *fresh, int64_t bad[2]) {
  bad[0] = bad[1] = 0;
  unsigned char *got = malloc(cache->bytes ? cache->bytes : 1);
  if (!got) return -1;
  int rc = attn_buffer_read(ctx, cache->buf, 0, got, cache->bytes);
  if (rc) {
    free(got);
    return rc;
  }
  const size_t es = attn_dtype_size(o->dtype), rowb = (size_t)(o->hkv * o->d) * es;
  for (int64_t b = 0; b < o->batch; b++)
    for (int64_t r = 0; r < o->nq; r++) {
      size_t at = (size_t)cache_row(o, c, b, c->seqused[b] + r) * es;
      const unsigned char *want =
          (const unsigned char *)fresh->host + (size_t)(b * o->nq + r) * rowb;
      if (memcmp(got + at, want, rowb)) bad[0]++;
      /* Put the old row back, so that what remains compares whole. */
      memcpy(got + at, (const unsigned char *)cache->host + at, rowb);
    }
  for (size_t at = 0; at < cache->bytes; at += rowb)
    if (memcmp(got + at, (const unsigned char *)cache->host + at, rowb)) bad[1]++;
  free(got);
  return 0;
}

/* The error against the double reference, printed; returns the exit status. */
int run_check_reference(attn_context *ctx, const run_opts *o, const run_cache *c,
                        const attn_params *p, run_tensors *t) {
  /* The reference reads host memory: the same tensors over their host
   * copies, the cache as it was before any call appended to it. */
  attn_tensor hq_ = run_host_tensor(&t->q), hk_ = run_host_tensor(&t->k),
              hv_ = run_host_tensor(&t->v), hdo = run_host_tensor(&t->dout);
  attn_tensor hsu = run_host_tensor(&t->seqused), htb = run_host_tensor(&t->table),
              hkn = run_host_tensor(&t->k_new), hvn = run_host_tensor(&t->v_new),
              hb = run_host_tensor(&t->bias), hs = run_host_tensor(&t->sinks);
  attn_params ph = *p;
  /* The exact answer; with TF32 allowed, a second pass computes as TF32. */
  const int tf32 = (p->flags & ATTN_ALLOW_TF32) && o->dtype == ATTN_F32;
  ph.flags &= ~ATTN_ALLOW_TF32;
  if (p->seqused_k) ph.seqused_k = &hsu;
  if (p->block_table) ph.block_table = &htb;
  if (p->k_new) ph.k_new = &hkn, ph.v_new = &hvn;
  if (p->bias) ph.bias = &hb;
  if (p->sinks) ph.sinks = &hs;

  size_t nqe = (size_t)(o->batch * o->nq * o->hq * o->d),
         nke = t->k.bytes / attn_dtype_size(o->dtype);
  size_t nl = (size_t)(o->batch * o->hq * o->nq);
  size_t nb = t->bias.bytes / attn_dtype_size(o->dtype), nh = (size_t)o->hq;
  int status = 0;
  unsigned char *empty = NULL;
  double *ro = malloc(sizeof(double) * nqe), *rl = malloc(sizeof(double) * nl);
  double *rdq = NULL, *rdk = NULL, *rdv = NULL, *rdb = NULL, *rds = NULL, *tx = NULL;
  if (o->backward) {
    rdq = malloc(sizeof(double) * nqe);
    rdk = malloc(sizeof(double) * nke);
    rdv = malloc(sizeof(double) * nke);
    rdb = malloc(sizeof(double) * (nb ? nb : 1));
    rds = malloc(sizeof(double) * nh);
  }
  /* The TF32 pass's outputs, in the order of the exact ones. */
  size_t ntx = nqe + nl + (o->backward ? nqe + 2 * nke + nb + nh : 0);
  if (tf32) tx = malloc(sizeof(double) * ntx);
  if (!ro || !rl || (o->backward && (!rdq || !rdk || !rdv || !rdb || !rds)) || (tf32 && !tx)) {
    status = cli_out_of_host_memory();
    goto done;
  }
  progress pg;
  progress_start(&pg);
  int rc = at_ref_forward_progress(ctx, &ph, &hq_, &hk_, &hv_, ro, rl, progress_show, &pg);
  pg.pass = "backward";
  if (!rc && o->backward)
    rc = at_ref_backward_terms(ctx, &ph, &hq_, &hk_, &hv_, &hdo, rdq, rdk, rdv,
                               o->bias ? rdb : NULL, o->sinks ? rds : NULL, progress_show, &pg);
  /* TF32's own error per output: o, lse, dq, dk, dv, dbias, dsinks. */
  double te[7] = {0};
  if (!rc && tf32) {
    attn_params pt = ph;
    pt.flags |= ATTN_ALLOW_TF32;
    double *xo = tx, *xl = xo + nqe, *xdq = xl + nl, *xdk = xdq + nqe, *xdv = xdk + nke,
           *xdb = xdv + nke, *xds = xdb + nb;
    pg.pass = "forward as TF32";
    rc = at_ref_forward_progress(ctx, &pt, &hq_, &hk_, &hv_, xo, xl, progress_show, &pg);
    pg.pass = "backward as TF32";
    if (!rc && o->backward)
      rc = at_ref_backward_terms(ctx, &pt, &hq_, &hk_, &hv_, &hdo, xdq, xdk, xdv,
                                 o->bias ? xdb : NULL, o->sinks ? xds : NULL, progress_show, &pg);
    if (!rc) {
      te[0] = at_golden_tf32_cost(xo, ro, nqe);
      te[1] = at_golden_tf32_cost(xl, rl, nl);
      if (o->backward) {
        te[2] = at_golden_tf32_cost(xdq, rdq, nqe);
        te[3] = at_golden_tf32_cost(xdk, rdk, nke);
        te[4] = at_golden_tf32_cost(xdv, rdv, nke);
        if (o->bias) te[5] = at_golden_tf32_cost(xdb, rdb, nb);
        if (o->sinks) te[6] = at_golden_tf32_cost(xds, rds, nh);
      }
    }
  }
  progress_end(&pg);
  if (rc) {
    status = cli_fail_ctx(ctx, rc, "reference");
    goto done;
  }
  device_tensor *outs[] = {&t->o, &t->lse, &t->dq, &t->dk, &t->dv, &t->dbias, &t->dsinks};
  for (size_t i = 0; i < sizeof outs / sizeof outs[0] && !rc; i++)
    if (outs[i]->buf) rc = attn_buffer_read(ctx, outs[i]->buf, 0, outs[i]->host, outs[i]->bytes);
  if (rc) {
    status = cli_fail_ctx(ctx, rc, "reading the results");
    goto done;
  }
  verdict v = {""};
  /* Rows that see no key (the reference's lse -inf; with sinks, lse the
   * sink and o zero) must give exactly zero o and dq rows. */
  empty = calloc(nl ? nl : 1, 1);
  if (!empty) {
    status = cli_out_of_host_memory();
    goto done;
  }
  for (size_t i = 0; i < nl; i++) {
    const size_t h = i / (size_t)o->nq % (size_t)o->hq, at = row_of(o, i);
    empty[i] = rl[i] == -INFINITY;
    if (o->sinks && rl[i] == (double)((const float *)t->sinks.host)[h]) {
      empty[i] = 1;
      for (size_t x = 0; x < (size_t)o->d; x++)
        if (ro[at + x] != 0) empty[i] = 0;
    }
  }
  double e, m, el = 0, ml = 0;
  compare(t->o.host, o->dtype, ro, nqe, &e, &m);
  if (!zero_rows(t->o.host, o, empty, nl)) e = INFINITY;
  for (size_t i = 0; i < nl; i++) {
    double a = ((float *)t->lse.host)[i];
    double diff = isinf(rl[i]) ? (a == rl[i] ? 0 : INFINITY) : fabs(a - rl[i]);
    if (isnan(a)) diff = INFINITY;
    if (diff > el) el = diff;
    if (isfinite(rl[i]) && fabs(rl[i]) > ml) ml = fabs(rl[i]);
  }
  double bo = judge(&v, "o", e, m, o->dtype, te[0]), bl = judge(&v, "lse", el, ml, o->dtype, te[1]);
  printf("  error     o max|err| %.3g (max|ref| %.3g, bound %.3g), lse max|err| %.3g (bound %.3g)",
         e, m, bo, el, bl);
  print_verdict(&v, 0);
  if (tf32)
    printf("  tf32      rounding to TF32 alone (the reference as TF32): o %.3g, lse %.3g\n", te[0],
           te[1]);
  if (o->backward) {
    size_t mark = strlen(v.failed);
    double eg[3], mg[3], bg[3];
    compare(t->dq.host, o->dtype, rdq, nqe, &eg[0], &mg[0]);
    if (!zero_rows(t->dq.host, o, empty, nl)) eg[0] = INFINITY;
    compare(t->dk.host, o->dtype, rdk, nke, &eg[1], &mg[1]);
    compare(t->dv.host, o->dtype, rdv, nke, &eg[2], &mg[2]);
    static const char *const names[3] = {"dq", "dk", "dv"};
    for (int i = 0; i < 3; i++)
      bg[i] = judge(&v, names[i], eg[i], mg[i], o->dtype, te[2 + i]);
    printf(
        "  error     dq %.3g (max|ref| %.3g, bound %.3g), dk %.3g (%.3g, %.3g), dv %.3g (%.3g, "
        "%.3g)",
        eg[0], mg[0], bg[0], eg[1], mg[1], bg[1], eg[2], mg[2], bg[2]);
    print_verdict(&v, mark);
    if (o->bias || o->sinks) {
      mark = strlen(v.failed);
      printf("  error    ");
      if (o->bias) {
        compare(t->dbias.host, ATTN_F32, rdb, nb, &e, &m);
        printf(" dbias %.3g (max|ref| %.3g, bound %.3g)%s", e, m,
               judge(&v, "dbias", e, m, o->dtype, te[5]), o->sinks ? "," : "");
      }
      if (o->sinks) {
        compare(t->dsinks.host, ATTN_F32, rds, nh, &e, &m);
        printf(" dsinks %.3g (max|ref| %.3g, bound %.3g)", e, m,
               judge(&v, "dsinks", e, m, o->dtype, te[6]));
      }
      print_verdict(&v, mark);
    }
  }
  if (o->append) {
    int64_t bk[2], bv[2];
    rc = check_cache(ctx, o, c, &t->k, &t->k_new, bk);
    if (!rc) rc = check_cache(ctx, o, c, &t->v, &t->v_new, bv);
    if (rc) {
      status = rc < 0 ? cli_out_of_host_memory() : cli_fail_ctx(ctx, rc, "reading the cache");
      goto done;
    }
    int ok = !bk[0] && !bk[1] && !bv[0] && !bv[1];
    if (ok) {
      printf(
          "  cache     k and v hold the %lld appended rows in place, every other row as it was: "
          "ok\n",
          (long long)(o->batch * o->nq));
    } else {
      printf(
          "  cache     appended rows wrong: k %lld, v %lld of %lld; other rows changed: k %lld, "
          "v %lld: FAIL\n",
          (long long)bk[0], (long long)bv[0], (long long)(o->batch * o->nq), (long long)bk[1],
          (long long)bv[1]);
      cli_complain("the cache does not hold the appended rows as it should");
      status = EXIT_FAILED;
    }
  }
  if (v.failed[0]) {
    cli_complain("%s outside the tolerance (the golden README's rule without a peer figure%s)",
                 v.failed, tf32 ? ", TF32's" : "");
    status = EXIT_FAILED;
  }
done:
  free(empty);
  free(ro);
  free(rl);
  free(rdq);
  free(rdk);
  free(rdv);
  free(rdb);
  free(rds);
  free(tx);
  return status;
}
