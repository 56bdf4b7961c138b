/*
 * The check of attn run and attn vit: the outputs against the float64
 * reference of the test kit, with the reference's progress on stderr when it
 * takes more than a second.
 */
#define _POSIX_C_SOURCE 200809L /* isatty */

#include "ref.h"
#include "run.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

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
  double t0, next;
  int tty, shown;
  const char *pass; /* "forward", "backward" */
} progress;

static void progress_start(progress *pg) {
  pg->t0 = run_now_s();
  pg->next = pg->t0 + 1.0;
  pg->tty = isatty(STDERR_FILENO);
  pg->shown = 0;
  pg->pass = "forward";
}

static void progress_show(void *user, int64_t done, int64_t total) {
  progress *pg = user;
  double t = run_now_s();
  if (t < pg->next) return;
  int pct = (int)(100.0 * (double)done / (double)(total > 0 ? total : 1));
  if (pg->tty) {
    fprintf(stderr, "\r%s: reference %s: %3d%% (%lld/%lld rows)", cli_prog, pg->pass, pct,
            (long long)done, (long long)total);
    pg->next = t + 0.2;
  } else {
    fprintf(stderr, "%s: reference %s: %d%% (%lld/%lld rows, %.0f s)\n", cli_prog, pg->pass, pct,
            (long long)done, (long long)total, t - pg->t0);
    pg->next = t + 5.0;
  }
  fflush(stderr);
  pg->shown = 1;
}

static void progress_end(progress *pg) {
  if (!pg->shown) return;
  if (pg->tty)
    fputs("\r\033[K", stderr); /* the results follow on stdout; leave no stale line */
  else
    fprintf(stderr, "%s: reference done in %.1f s\n", cli_prog, run_now_s() - pg->t0);
}

/* The error against the double reference, printed; returns the exit status. */
int run_check_reference(attn_context *ctx, const run_opts *o, const attn_params *p,
                        device_tensor *q, device_tensor *k, device_tensor *v, device_tensor *out,
                        device_tensor *lse, device_tensor *dout, device_tensor *dq,
                        device_tensor *dk, device_tensor *dv) {
  attn_tensor hq_ = attn_tensor_bshd(q->host, o->dtype, o->batch, o->nq, o->hq, o->d);
  attn_tensor hk_ = attn_tensor_bshd(k->host, o->dtype, o->batch, o->nk, o->hkv, o->d);
  attn_tensor hv_ = attn_tensor_bshd(v->host, o->dtype, o->batch, o->nk, o->hkv, o->d);
  size_t nqe = (size_t)(o->batch * o->nq * o->hq * o->d),
         nke = (size_t)(o->batch * o->nk * o->hkv * o->d);
  size_t nl = (size_t)(o->batch * o->hq * o->nq);
  int status = 0;
  double *ro = malloc(sizeof(double) * nqe), *rl = malloc(sizeof(double) * nl);
  double *rdq = NULL, *rdk = NULL, *rdv = NULL;
  if (o->backward) {
    rdq = malloc(sizeof(double) * nqe);
    rdk = malloc(sizeof(double) * nke);
    rdv = malloc(sizeof(double) * nke);
  }
  if (!ro || !rl || (o->backward && (!rdq || !rdk || !rdv))) {
    status = cli_out_of_host_memory();
    goto done;
  }
  progress pg;
  progress_start(&pg);
  int rc = at_ref_forward_progress(ctx, p, &hq_, &hk_, &hv_, ro, rl, progress_show, &pg);
  attn_tensor hdo = attn_tensor_bshd(dout->host, o->dtype, o->batch, o->nq, o->hq, o->d);
  pg.pass = "backward";
  if (!rc && o->backward)
    rc =
        at_ref_backward_progress(ctx, p, &hq_, &hk_, &hv_, &hdo, rdq, rdk, rdv, progress_show, &pg);
  progress_end(&pg);
  if (rc) {
    status = cli_fail_ctx(ctx, rc, "reference");
    goto done;
  }
  rc = attn_buffer_read(ctx, out->buf, 0, out->host, out->bytes);
  if (!rc) rc = attn_buffer_read(ctx, lse->buf, 0, lse->host, lse->bytes);
  if (!rc && o->backward) {
    rc = attn_buffer_read(ctx, dq->buf, 0, dq->host, dq->bytes);
    if (!rc) rc = attn_buffer_read(ctx, dk->buf, 0, dk->host, dk->bytes);
    if (!rc) rc = attn_buffer_read(ctx, dv->buf, 0, dv->host, dv->bytes);
  }
  if (rc) {
    status = cli_fail_ctx(ctx, rc, "reading the results");
    goto done;
  }
  double e, m, el = 0;
  compare(out->host, o->dtype, ro, nqe, &e, &m);
  for (size_t i = 0; i < nl; i++) {
    double a = ((float *)lse->host)[i];
    double diff = isinf(rl[i]) ? (a == rl[i] ? 0 : INFINITY) : fabs(a - rl[i]);
    if (isnan(a)) diff = INFINITY;
    if (diff > el) el = diff;
  }
  printf("  error     o max|err| %.3g (max|ref| %.3g), lse max|err| %.3g\n", e, m, el);
  if (o->backward) {
    double eg[3], mg[3];
    compare(dq->host, o->dtype, rdq, nqe, &eg[0], &mg[0]);
    compare(dk->host, o->dtype, rdk, nke, &eg[1], &mg[1]);
    compare(dv->host, o->dtype, rdv, nke, &eg[2], &mg[2]);
    printf("  error     dq %.3g (max|ref| %.3g), dk %.3g (%.3g), dv %.3g (%.3g)\n", eg[0], mg[0],
           eg[1], mg[1], eg[2], mg[2]);
  }
done:
  free(ro);
  free(rl);
  free(rdq);
  free(rdk);
  free(rdv);
  return status;
}
