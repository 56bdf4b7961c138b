/*
 * Threads. Eight threads, each on its own context, all compute right at
 * once. Eight threads sharing one context (which attn.h forbids) get, call
 * by call, either the right answer or ATTN_EBUSY with the outputs untouched:
 * never a crash or a wrong answer. Run under ThreadSanitizer in CI
 * (ATTN_TSAN=ON), these also show that the library has no data race.
 *
 * The workers use no cmocka assertion (cmocka is not thread-safe): each
 * fills its own report, which the test checks after joining.
 *
 * And OpenBLAS's threads: where the build chose OpenBLAS's OpenMP build
 * (CMakeLists.txt says why), the one loaded is that build, not a pthreads
 * one whose pool would spin beside attn's OpenMP threads.
 */
#define _POSIX_C_SOURCE 200809L

#include "testutil.h"

#include <cblas.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { THREADS = 8, N = 48, H = 2, D = 16, ELEMS = N * H * D };

/* One thread's problem, its reference answer, and what happened. The
 * problems differ from thread to thread in what the backends keep per
 * context between calls (programs, scratch copies of cu_seqlens and the
 * ALiBi slopes, sized to the problem), so that calls mixed up on a shared
 * context would show. */
typedef struct job {
  at_backend *b;
  attn_context *shared; /* NULL: the thread makes its own context */
  int calls;
  attn_params p;
  int32_t cu[5];
  float alibi[H];
  float q[ELEMS], k[ELEMS], v[ELEMS], o[ELEMS];
  double ref[ELEMS];
  int ok, busy;
  char error[600]; /* the first thing that went wrong, "" if nothing */
} job;

/* q, k, v and o: varlen, [N, H, D] rows split into p.batch sequences. */
static void tensors(job *j, attn_tensor *q, attn_tensor *k, attn_tensor *v, attn_tensor *o) {
  *q = attn_tensor_varlen(j->q, ATTN_F32, N, H, D);
  *k = attn_tensor_varlen(j->k, ATTN_F32, N, H, D);
  *v = attn_tensor_varlen(j->v, ATTN_F32, N, H, D);
  if (o) *o = attn_tensor_varlen(j->o, ATTN_F32, N, H, D);
}

static void job_init(job *j, at_backend *b, attn_context *shared, int calls, uint32_t seed) {
  memset(j, 0, sizeof *j);
  j->b = b;
  j->shared = shared;
  j->calls = calls;
  uint32_t s = seed * 2654435761u + 1;
  for (int i = 0; i < ELEMS; i++) {
    s = s * 1664525u + 1013904223u;
    j->q[i] = (float)(s >> 8) / 8388608.0f - 1.0f;
    s = s * 1664525u + 1013904223u;
    j->k[i] = (float)(s >> 8) / 8388608.0f - 1.0f;
    s = s * 1664525u + 1013904223u;
    j->v[i] = (float)(s >> 8) / 8388608.0f - 1.0f;
  }
  attn_params_init(&j->p);
  j->p.flags = seed % 2 ? ATTN_CAUSAL : 0;
  j->p.batch = 1 + seed % 4;
  for (int64_t i = 0; i <= j->p.batch; i++)
    j->cu[i] = (int32_t)(i * N / j->p.batch);
  j->p.cu_seqlens_q = j->cu;
  j->p.cu_seqlens_k = j->cu;
  if (seed % 3) {
    for (int h = 0; h < H; h++)
      j->alibi[h] = 0.25f * (float)(seed % 5 + h);
    j->p.alibi_slopes = j->alibi;
    j->p.alibi_count = H;
  }
  attn_tensor q, k, v;
  tensors(j, &q, &k, &v, NULL);
  assert_int_equal(at_ref_forward(b->ctx, &j->p, &q, &k, &v, j->ref, NULL), ATTN_OK);
}

static void report(job *j, const char *fmt, ...) ATTN__PRINTF(2, 3);
static void report(job *j, const char *fmt, ...) {
  if (j->error[0]) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(j->error, sizeof j->error, fmt, ap);
  va_end(ap);
}

/* o with every bit set (NaN): what a refused call must leave. */
static int untouched(const float *o) {
  const unsigned char *p = (const unsigned char *)o;
  for (size_t i = 0; i < ELEMS * sizeof(float); i++)
    if (p[i] != 0xFF) return 0;
  return 1;
}

/* One call: right, or (on a shared context) ATTN_EBUSY with o untouched. */
static void one_call(job *j, attn_context *ctx) {
  attn_tensor q, k, v, o;
  tensors(j, &q, &k, &v, &o);
  memset(j->o, 0xFF, sizeof j->o);
  int rc = attn_forward(ctx, &j->p, &q, &k, &v, &o, NULL);
  if (rc == ATTN_EBUSY && j->shared) {
    j->busy++;
    if (!untouched(j->o)) report(j, "attn_forward returned ATTN_EBUSY but wrote o");
    return;
  }
  if (rc != ATTN_OK) {
    /* On a shared context the message may be another call's by now. */
    report(j, "attn_forward returned %s (%s)", attn_status_name(rc),
           j->shared ? "shared context" : attn_errmsg(ctx));
    return;
  }
  double maxref = 0, err = 0;
  for (int i = 0; i < ELEMS; i++) {
    maxref = fmax(maxref, fabs(j->ref[i]));
    double e = fabs(j->o[i] - j->ref[i]);
    if (!(e <= err)) err = e; /* NaN counts as the worst */
  }
  if (!(err <= 1e-5 * maxref)) {
    report(j, "o max error %.3g > 1e-5 * max|ref| %.3g", err, maxref);
    return;
  }
  j->ok++;
}

/* The other calls that touch a context's state, on a shared context: each
 * either works or is refused. */
static void other_calls(job *j, attn_context *ctx) {
  attn_tensor q, k, v;
  tensors(j, &q, &k, &v, NULL);
  int rc = attn_supports(ctx, &j->p, &q, &k, &v, 1);
  if (rc != ATTN_OK && rc != ATTN_EBUSY)
    report(j, "attn_supports returned %s", attn_status_name(rc));
  rc = attn_context_synchronize(ctx);
  if (rc != ATTN_OK && rc != ATTN_EBUSY)
    report(j, "attn_context_synchronize returned %s", attn_status_name(rc));
  attn_buffer *buf = NULL;
  rc = attn_buffer_create(ctx, sizeof j->q, &buf);
  if (rc == ATTN_OK) {
    float back[ELEMS];
    rc = attn_buffer_write(ctx, buf, 0, j->q, sizeof j->q);
    if (rc == ATTN_OK) {
      memset(back, 0, sizeof back);
      rc = attn_buffer_read(ctx, buf, 0, back, sizeof back);
      if (rc == ATTN_OK && memcmp(back, j->q, sizeof back) != 0)
        report(j, "a buffer read back other bytes than were written");
    }
    if (rc != ATTN_OK && rc != ATTN_EBUSY)
      report(j, "attn_buffer_write/read returned %s", attn_status_name(rc));
    attn_buffer_free(buf);
  } else if (rc != ATTN_EBUSY) {
    report(j, "attn_buffer_create returned %s", attn_status_name(rc));
  }
}

static void *worker(void *arg) {
  job *j = arg;
  attn_context *ctx = j->shared;
  if (!ctx) {
    int rc = attn_context_create(j->b->name, &ctx);
    if (rc) {
      report(j, "attn_context_create(\"%s\"): %s: %s", j->b->name, attn_status_name(rc),
             attn_errmsg(ctx));
      attn_context_free(ctx);
      return NULL;
    }
  }
  /* On a shared context a thread keeps trying until it has had its calls
   * (a refused call returns at once, so counting attempts would let the
   * other threads finish while the first is still inside its first call). */
  struct timespec t0, now;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  while (j->ok < j->calls && !j->error[0]) {
    one_call(j, ctx);
    if (!j->shared) continue;
    other_calls(j, ctx);
    sched_yield();
    clock_gettime(CLOCK_MONOTONIC, &now);
    if (now.tv_sec - t0.tv_sec > 120) {
      report(j, "%d of %d calls got through in two minutes", j->ok, j->calls);
      break;
    }
  }
  if (!j->shared) attn_context_free(ctx);
  return NULL;
}

/* Runs THREADS workers, on their own contexts or on one shared context,
 * and checks their reports. */
static void run_threads(at_backend *b, int shared, int calls, int *ok, int *busy) {
  job *jobs = at_calloc(THREADS, sizeof *jobs);
  pthread_t tid[THREADS];
  attn_context *one = NULL;
  if (shared) {
    /* A fresh context: its threads race for the first program build too. */
    assert_int_equal(attn_context_create(b->name, &one), ATTN_OK);
  } else {
    /* The programs are in the disk cache before the threads race, so that
     * their calls overlap instead of queueing behind one compile. */
    job warm;
    job_init(&warm, b, b->ctx, 1, 99);
    one_call(&warm, b->ctx);
    if (warm.error[0]) fail_msg("the first call: %s", warm.error);
  }
  for (int t = 0; t < THREADS; t++)
    job_init(&jobs[t], b, one, calls, (uint32_t)t + 1);
  for (int t = 0; t < THREADS; t++)
    assert_int_equal(pthread_create(&tid[t], NULL, worker, &jobs[t]), 0);
  for (int t = 0; t < THREADS; t++)
    assert_int_equal(pthread_join(tid[t], NULL), 0);
  *ok = *busy = 0;
  for (int t = 0; t < THREADS; t++) {
    if (jobs[t].error[0]) fail_msg("thread %d: %s", t, jobs[t].error);
    *ok += jobs[t].ok;
    *busy += jobs[t].busy;
  }
  if (one) {
    /* The context is whole afterwards: one call from one thread. */
    job j;
    job_init(&j, b, one, 1, 7);
    one_call(&j, one);
    if (j.error[0] || j.ok != 1) fail_msg("after the threads: %s", j.error);
    attn_context_free(one);
  }
  at_free(jobs);
}

static void eight_threads_on_their_own_contexts_compute_right(at_backend *b) {
  int ok, busy;
  run_threads(b, 0, 4, &ok, &busy);
  assert_int_equal(busy, 0);
  assert_int_equal(ok, THREADS * 4);
}

static void eight_threads_sharing_a_context_get_right_answers_or_ebusy(at_backend *b) {
  int ok, busy;
  run_threads(b, 1, 25, &ok, &busy);
  print_message("  %d calls right, %d refused with ATTN_EBUSY\n", ok, busy);
  assert_int_equal(ok, THREADS * 25);
}

static void a_refused_call_leaves_the_message_alone(at_backend *b) {
  /* Another thread's call inside the context is played by setting the flag
   * such a call sets: deterministic, where real threads race. */
  attn_params p;
  attn_params_init(&p);
  p.scale = -1;
  float x[ELEMS] = {0};
  attn_tensor t = attn_tensor_bshd(x, ATTN_F32, 1, N, H, D);
  assert_int_equal(attn_supports(b->ctx, &p, &t, &t, &t, 0), ATTN_ESCALAR);
  char before[sizeof b->ctx->errmsg];
  snprintf(before, sizeof before, "%s", attn_errmsg(b->ctx));
  atomic_store(&b->ctx->busy, 1);
  int rc = attn_context_synchronize(b->ctx);
  int rc2 = attn_supports(b->ctx, &p, &t, &t, &t, 0);
  atomic_store(&b->ctx->busy, 0);
  assert_int_equal(rc, ATTN_EBUSY);
  assert_int_equal(rc2, ATTN_EBUSY);
  assert_string_equal(attn_errmsg(b->ctx), before);
  assert_int_equal(attn_context_synchronize(b->ctx), ATTN_OK);
}

static void openblas_threads_are_openmps_where_built_so(at_backend *b) {
  if (b->kind != ATTN_BACKEND_CPU) at_skip("OpenBLAS is the CPU backend's");
#if defined(ATTN_TEST_OPENBLAS_OPENMP)
  /* 0 sequential, 1 pthreads, 2 OpenMP (OpenBLAS's cblas.h). */
  print_message("  OpenBLAS: %s\n", openblas_get_config());
  assert_int_equal(openblas_get_parallel(), 2);
#else
  at_skip("built with the system's default OpenBLAS (no OpenMP build beside it, or not GCC)");
#endif
}

int main(int argc, char **argv) {
  const at_test tests[] = {
      AT_TEST(eight_threads_on_their_own_contexts_compute_right),
      AT_TEST(eight_threads_sharing_a_context_get_right_answers_or_ebusy),
      AT_TEST(a_refused_call_leaves_the_message_alone),
      AT_TEST(openblas_threads_are_openmps_where_built_so),
  };
  return at_main(argc, argv, "threads", tests, sizeof tests / sizeof tests[0], NULL, 0);
}
