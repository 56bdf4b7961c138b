/*
 * How attn run and attn bench time a call: one untimed call first (kernel
 * compilation, the program cache, first touch of the memory), then calls
 * each timed on the host's monotonic clock from the call to its return, and
 * their median. Calls are synchronous (no ATTN_ASYNC), so on a device the
 * work is done when the call returns: a time includes the launch and the
 * wait, as an application sees it. attn run --async queues them instead
 * (run_time_queued): the device's time a call, launches overlapped.
 */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */

#include "run.h"

#include <stdlib.h>
#include <time.h>

double run_now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

void run_sort_times(double *t, size_t n) {
  qsort(t, n, sizeof *t, cmp_double);
}

int run_time_calls(run_call fn, void *arg, size_t max, double budget_s, double *t, size_t *n) {
  *n = 0;
  int rc = fn(arg);
  const double start = run_now_s();
  while (!rc && *n < max && (*n == 0 || run_now_s() - start < budget_s)) {
    double t0 = run_now_s();
    rc = fn(arg);
    t[(*n)++] = run_now_s() - t0;
  }
  run_sort_times(t, *n);
  return rc;
}

int run_time_queued(run_call fn, void *arg, attn_context *ctx, size_t max, double *t, size_t *n) {
  *n = 0;
  int rc = fn(arg);
  if (!rc) rc = attn_context_synchronize(ctx);
  while (!rc && *n < max) {
    double t0 = run_now_s();
    for (int i = 0; !rc && i < RUN_QUEUED_CALLS; i++)
      rc = fn(arg);
    if (!rc) rc = attn_context_synchronize(ctx);
    t[(*n)++] = (run_now_s() - t0) / RUN_QUEUED_CALLS;
  }
  run_sort_times(t, *n);
  return rc;
}

int run_forward(void *arg) {
  const run_pass *c = arg;
  run_tensors *t = c->t;
  return attn_forward(c->ctx, c->p, &t->q.t, &t->k.t, &t->v.t, &t->o.t, &t->lse.t);
}

int run_backward(void *arg) {
  const run_pass *c = arg;
  run_tensors *t = c->t;
  return attn_backward(c->ctx, c->p, &t->q.t, &t->k.t, &t->v.t, &t->o.t, &t->lse.t, &t->dout.t,
                       &t->dq.t, &t->dk.t, &t->dv.t);
}
