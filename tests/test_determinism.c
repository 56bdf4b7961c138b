/*
 * Determinism: the same call twice gives the same bits. Forward always; the
 * backward pass with ATTN_DETERMINISTIC on every backend, and by default on
 * the CPU, whose result must not depend on the number of OpenMP threads
 * either (a fixed reduction order, not one per thread).
 */
#include "testutil.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

/* GQA so that dk and dv reduce over query heads as well as rows; Nq != Nk
 * and a window so that blocks are uneven. */
static at_shape problem(unsigned flags) {
  at_shape s;
  memset(&s, 0, sizeof s);
  s.dtype = ATTN_F32;
  s.B = 2;
  s.Nq = 257;
  s.Nk = 300;
  s.Hq = 4;
  s.Hkv = 1;
  s.d = 64;
  s.flags = flags;
  s.win = 1;
  s.wl = 200;
  s.wr = 40;
  return s;
}

typedef struct outputs {
  unsigned char *o, *lse, *dq, *dkv;
  size_t no, nlse, ndq, ndkv;
} outputs;

static unsigned char *dup_bytes(const at_mem *m) {
  unsigned char *p = at_malloc(m->nbytes + 1);
  assert_non_null(p);
  memcpy(p, m->bytes, m->nbytes);
  return p;
}

/* Runs forward (and backward) on P and keeps the output bytes. */
static void run(at_backend *b, at_prob *P, int with_backward, outputs *out) {
  at_prob_reset_outputs(P);
  int rc = attn_forward(b->ctx, &P->p, &P->q, &P->k, &P->v, &P->o, &P->lse);
  if (rc == ATTN_EUNSUPPORTED) at_skip("refused: %s", attn_errmsg(b->ctx));
  if (rc != ATTN_OK) fail_msg("forward: %s: %s", attn_status_name(rc), attn_errmsg(b->ctx));
  if (with_backward) {
    rc = attn_backward(b->ctx, &P->p, &P->q, &P->k, &P->v, &P->o, &P->lse, &P->dout, &P->dq, &P->dk,
                       &P->dv);
    if (rc == ATTN_EUNSUPPORTED) at_skip("refused: %s", attn_errmsg(b->ctx));
    if (rc != ATTN_OK) fail_msg("backward: %s: %s", attn_status_name(rc), attn_errmsg(b->ctx));
  }
  out->o = dup_bytes(&P->mo);
  out->lse = dup_bytes(&P->mlse);
  out->dq = dup_bytes(&P->mdq);
  out->dkv = dup_bytes(&P->mdkv);
  out->no = P->mo.nbytes;
  out->nlse = P->mlse.nbytes;
  out->ndq = P->mdq.nbytes;
  out->ndkv = P->mdkv.nbytes;
}

static void expect_same(const outputs *a, const outputs *b, int with_backward, const char *how) {
  if (memcmp(a->o, b->o, a->no) != 0) fail_msg("o differs between %s", how);
  if (memcmp(a->lse, b->lse, a->nlse) != 0) fail_msg("lse differs between %s", how);
  if (with_backward && memcmp(a->dq, b->dq, a->ndq) != 0) fail_msg("dq differs between %s", how);
  if (with_backward && memcmp(a->dkv, b->dkv, a->ndkv) != 0)
    fail_msg("dk or dv differs between %s", how);
}

static void outputs_free(outputs *o) {
  at_free(o->o);
  at_free(o->lse);
  at_free(o->dq);
  at_free(o->dkv);
}

static void twice(at_backend *b, unsigned flags, int with_backward) {
  at_shape s = problem(flags);
  at_prob P;
  at_prob_init(&P, &s);
  outputs x, y;
  run(b, &P, with_backward, &x);
  run(b, &P, with_backward, &y);
  expect_same(&x, &y, with_backward, "two runs");
  outputs_free(&x);
  outputs_free(&y);
  at_prob_free(&P);
}

static void forward_twice_is_bit_identical(at_backend *b) {
  twice(b, 0, 0);
}

static void causal_forward_twice_is_bit_identical(at_backend *b) {
  twice(b, ATTN_CAUSAL, 0);
}

static void deterministic_backward_twice_is_bit_identical(at_backend *b) {
  twice(b, ATTN_DETERMINISTIC, 1);
}

static void deterministic_causal_backward_twice_is_bit_identical(at_backend *b) {
  twice(b, ATTN_DETERMINISTIC | ATTN_CAUSAL, 1);
}

static void cpu_backward_is_deterministic_by_default(at_backend *b) {
  if (b->kind != ATTN_BACKEND_CPU)
    at_skip("GPU backends may use atomics unless ATTN_DETERMINISTIC is set");
  twice(b, 0, 1);
}

static void thread_counts(at_backend *b, int with_backward) {
  if (b->kind != ATTN_BACKEND_CPU) at_skip("OpenMP thread counts concern the CPU backend only");
#ifndef _OPENMP
  at_skip("built without OpenMP");
#else
  int saved = omp_get_max_threads();
  at_shape s = problem(ATTN_CAUSAL);
  at_prob P;
  at_prob_init(&P, &s);
  const int counts[] = {1, 2, 3};
  outputs base, other;
  omp_set_num_threads(counts[0]);
  run(b, &P, with_backward, &base);
  for (int i = 1; i < 3; i++) {
    omp_set_num_threads(counts[i]);
    run(b, &P, with_backward, &other);
    char how[64];
    snprintf(how, sizeof how, "1 and %d OpenMP threads", counts[i]);
    omp_set_num_threads(saved);
    expect_same(&base, &other, with_backward, how);
    outputs_free(&other);
  }
  omp_set_num_threads(saved);
  outputs_free(&base);
  at_prob_free(&P);
#endif
}

static void forward_with_1_2_or_3_threads_is_bit_identical(at_backend *b) {
  thread_counts(b, 0);
}

static void backward_with_1_2_or_3_threads_is_bit_identical(at_backend *b) {
  thread_counts(b, 1);
}

typedef struct job {
  attn_context *ctx;
  at_prob *P;
  int rc;
} job;

static void *run_job(void *arg) {
  job *j = arg;
  at_prob *P = j->P;
  j->rc = attn_forward(j->ctx, &P->p, &P->q, &P->k, &P->v, &P->o, &P->lse);
  if (j->rc == ATTN_OK)
    j->rc = attn_backward(j->ctx, &P->p, &P->q, &P->k, &P->v, &P->o, &P->lse, &P->dout, &P->dq,
                          &P->dk, &P->dv);
  return NULL;
}

/* attn.h: distinct contexts may be used from distinct threads at once. */
static void two_contexts_in_two_threads_give_the_one_thread_result(at_backend *b) {
  at_shape s = problem(ATTN_DETERMINISTIC | ATTN_CAUSAL);
  at_prob P[3];
  outputs want;
  for (int i = 0; i < 3; i++)
    at_prob_init(&P[i], &s);
  run(b, &P[0], 1, &want);
  job jobs[2];
  pthread_t th[2];
  for (int i = 0; i < 2; i++) {
    jobs[i].P = &P[i + 1];
    jobs[i].rc = -1;
    assert_int_equal(attn_context_create(b->name, &jobs[i].ctx), ATTN_OK);
  }
  for (int i = 0; i < 2; i++)
    assert_int_equal(pthread_create(&th[i], NULL, run_job, &jobs[i]), 0);
  for (int i = 0; i < 2; i++)
    assert_int_equal(pthread_join(th[i], NULL), 0);
  for (int i = 0; i < 2; i++) {
    if (jobs[i].rc != ATTN_OK)
      fail_msg("thread %d: %s: %s", i, attn_status_name(jobs[i].rc), attn_errmsg(jobs[i].ctx));
    attn_context_free(jobs[i].ctx);
    outputs got;
    got.o = P[i + 1].mo.bytes;
    got.lse = P[i + 1].mlse.bytes;
    got.dq = P[i + 1].mdq.bytes;
    got.dkv = P[i + 1].mdkv.bytes;
    expect_same(&want, &got, 1, "one thread and two threads with a context each");
  }
  outputs_free(&want);
  for (int i = 0; i < 3; i++)
    at_prob_free(&P[i]);
}

int main(int argc, char **argv) {
  const at_test tests[] = {
      AT_TEST(forward_twice_is_bit_identical),
      AT_TEST(causal_forward_twice_is_bit_identical),
      AT_TEST(deterministic_backward_twice_is_bit_identical),
      AT_TEST(deterministic_causal_backward_twice_is_bit_identical),
      AT_TEST(cpu_backward_is_deterministic_by_default),
      AT_TEST(forward_with_1_2_or_3_threads_is_bit_identical),
      AT_TEST(backward_with_1_2_or_3_threads_is_bit_identical),
      AT_TEST(two_contexts_in_two_threads_give_the_one_thread_result),
  };
  return at_main(argc, argv, "determinism", tests, sizeof tests / sizeof tests[0], NULL, 0);
}
