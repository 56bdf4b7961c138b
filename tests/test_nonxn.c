/*
 * No N x N memory: the point of the blockwise algorithm. A child process
 * limits its address space (RLIMIT_AS) to what it has mapped plus 1 GiB and
 * runs N = 32768, d = 64, H = 1, where one N x N float score matrix alone is
 * 4 GiB. A causal mask with a 256-key window keeps the work modest; a naive
 * implementation would still allocate the whole score matrix. One causal
 * forward without a window, N = 20480 (1.6 GiB of scores), covers an
 * implementation that allocates only what a window lets it skip.
 *
 * RLIMIT_AS cannot be used under AddressSanitizer or ThreadSanitizer (their
 * shadow memory is a huge reservation), nor on GPU backends (drivers map large address ranges):
 * those skip, with the reason.
 */
#define _POSIX_C_SOURCE 200809L

#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define UNDER_ASAN 1
#endif
#endif
#ifndef UNDER_ASAN
#define UNDER_ASAN 0
#endif

enum { LONG_D = 64 };
#define HEADROOM ((size_t)1 << 30)

/* ---------------------------------------------------------------------- */
/* The child                                                                */
/* ---------------------------------------------------------------------- */

static size_t mapped_bytes(void) {
  FILE *f = fopen("/proc/self/statm", "r");
  unsigned long pages = 0;
  if (!f) return 0;
  if (fscanf(f, "%lu", &pages) != 1) pages = 0;
  fclose(f);
  return (size_t)pages * (size_t)sysconf(_SC_PAGESIZE);
}

static int limit_address_space(void) {
  size_t now = mapped_bytes();
  if (!now) {
    fprintf(stderr, "cannot read /proc/self/statm\n");
    return -1;
  }
  struct rlimit rl = {now + HEADROOM, now + HEADROOM};
  if (setrlimit(RLIMIT_AS, &rl) != 0) {
    perror("setrlimit");
    return -1;
  }
  printf("address space limited to %zu MiB (%zu mapped + 1024)\n", (now + HEADROOM) >> 20,
         now >> 20);
  return 0;
}

static float *randoms(size_t n, unsigned seed) {
  float *x = malloc(n * sizeof *x);
  if (!x) return NULL;
  for (size_t i = 0; i < n; i++) {
    seed = seed * 1664525u + 1013904223u;
    x[i] = (float)(seed >> 8) / 16777216.0f - 0.5f;
  }
  return x;
}

static int run_long(int with_backward, int seqlen, int window) {
  attn_context *ctx = NULL;
  if (attn_context_create("cpu", &ctx) != ATTN_OK) {
    fprintf(stderr, "cpu context: %s\n", attn_errmsg(ctx));
    return 2;
  }
  attn_params p;
  attn_params_init(&p);
  p.flags = ATTN_CAUSAL;
  p.window_left = window - 1;

  /* Warm up first, so that thread pools and their stacks exist before the
   * limit and count as already mapped. */
  {
    enum { n = 300 };
    float *a = randoms((size_t)n * LONG_D * 8, 1);
    if (!a) return 2;
    float *q = a, *k = a + n * LONG_D, *v = a + 2 * n * LONG_D, *o = a + 3 * n * LONG_D,
          *l = a + 4 * n * LONG_D, *dq = a + 5 * n * LONG_D, *dk = a + 6 * n * LONG_D,
          *dv = a + 7 * n * LONG_D;
    attn_tensor tq = attn_tensor_bshd(q, ATTN_F32, 1, n, 1, LONG_D),
                tk = attn_tensor_bshd(k, ATTN_F32, 1, n, 1, LONG_D),
                tv = attn_tensor_bshd(v, ATTN_F32, 1, n, 1, LONG_D),
                to = attn_tensor_bshd(o, ATTN_F32, 1, n, 1, LONG_D),
                tl = attn_tensor_lse(l, 1, 1, n),
                tdq = attn_tensor_bshd(dq, ATTN_F32, 1, n, 1, LONG_D),
                tdk = attn_tensor_bshd(dk, ATTN_F32, 1, n, 1, LONG_D),
                tdv = attn_tensor_bshd(dv, ATTN_F32, 1, n, 1, LONG_D);
    attn_forward(ctx, &p, &tq, &tk, &tv, &to, &tl);
    if (with_backward) attn_backward(ctx, &p, &tq, &tk, &tv, &to, &tl, &tq, &tdq, &tdk, &tdv);
    free(a);
  }

  size_t n = (size_t)seqlen * LONG_D;
  float *q = randoms(n, 2), *k = randoms(n, 3), *v = randoms(n, 4), *dout = randoms(n, 5);
  float *o = malloc(n * 4), *lse = malloc((size_t)seqlen * 4);
  float *dq = malloc(n * 4), *dk = malloc(n * 4), *dv = malloc(n * 4);
  if (!q || !k || !v || !dout || !o || !lse || !dq || !dk || !dv) return 2;
  /* Touch the outputs so their pages are not counted against the headroom. */
  memset(o, 0, n * 4);
  memset(lse, 0, (size_t)seqlen * 4);
  memset(dq, 0, n * 4);
  memset(dk, 0, n * 4);
  memset(dv, 0, n * 4);
  attn_tensor tq = attn_tensor_bshd(q, ATTN_F32, 1, seqlen, 1, LONG_D),
              tk = attn_tensor_bshd(k, ATTN_F32, 1, seqlen, 1, LONG_D),
              tv = attn_tensor_bshd(v, ATTN_F32, 1, seqlen, 1, LONG_D),
              to = attn_tensor_bshd(o, ATTN_F32, 1, seqlen, 1, LONG_D),
              tl = attn_tensor_lse(lse, 1, 1, seqlen),
              tdo = attn_tensor_bshd(dout, ATTN_F32, 1, seqlen, 1, LONG_D),
              tdq = attn_tensor_bshd(dq, ATTN_F32, 1, seqlen, 1, LONG_D),
              tdk = attn_tensor_bshd(dk, ATTN_F32, 1, seqlen, 1, LONG_D),
              tdv = attn_tensor_bshd(dv, ATTN_F32, 1, seqlen, 1, LONG_D);
  if (limit_address_space() != 0) return 2;
  int rc = attn_forward(ctx, &p, &tq, &tk, &tv, &to, &tl);
  if (rc != ATTN_OK) {
    fprintf(stderr, "forward, N = %d: %s: %s\n", seqlen, attn_status_name(rc), attn_errmsg(ctx));
    return 1;
  }
  if (with_backward) {
    rc = attn_backward(ctx, &p, &tq, &tk, &tv, &to, &tl, &tdo, &tdq, &tdk, &tdv);
    if (rc != ATTN_OK) {
      fprintf(stderr, "backward, N = %d: %s: %s\n", seqlen, attn_status_name(rc), attn_errmsg(ctx));
      return 1;
    }
  }
  /* A result, not just a status: finite everywhere. */
  for (size_t i = 0; i < n; i++)
    if (!isfinite(o[i]) ||
        (with_backward && (!isfinite(dq[i]) || !isfinite(dk[i]) || !isfinite(dv[i])))) {
      fprintf(stderr, "non-finite output at element %zu\n", i);
      return 1;
    }
  printf("N = %d %s ran within the limit\n", seqlen,
         with_backward ? "forward+backward" : "forward");
  attn_context_free(ctx);
  return 0;
}

/* The premise: under the limit, an N x N float matrix cannot be had. */
static int probe_limit(int seqlen) {
  if (limit_address_space() != 0) return 2;
  size_t bytes = (size_t)seqlen * seqlen * sizeof(float);
  /* volatile: a compiler may drop a malloc whose result is only freed */
  void *volatile p = malloc(bytes);
  if (p) {
    fprintf(stderr, "malloc of %zu MiB succeeded under the limit\n", bytes >> 20);
    free(p);
    return 1;
  }
  return 0;
}

static int child(const char *mode) {
  if (strcmp(mode, "forward") == 0) return run_long(0, 32768, 256);
  if (strcmp(mode, "backward") == 0) return run_long(1, 32768, 256);
  if (strcmp(mode, "forward-causal") == 0) return run_long(0, 20480, 0);
  if (strcmp(mode, "probe") == 0) return probe_limit(32768);
  return 2;
}

/* ---------------------------------------------------------------------- */
/* The tests                                                                */
/* ---------------------------------------------------------------------- */

static void only_where_rlimit_works(at_backend *b) {
  if (UNDER_ASAN) at_skip("RLIMIT_AS does not work under AddressSanitizer or ThreadSanitizer");
  if (b->kind != ATTN_BACKEND_CPU)
    at_skip("the %s driver maps large address ranges; RLIMIT_AS checks the CPU backend", b->name);
}

static void in_child(const char *mode) {
  static char out[8192];
  /* glibc reserves 64 MiB of address space per malloc arena, one per thread
   * on a many-core machine: few arenas keep that out of the headroom. */
  const char *env[] = {"MALLOC_ARENA_MAX=2", NULL};
  int rc = at_child(mode, env, out, sizeof out);
  print_message("%s", out);
  if (rc != 0) fail_msg("child \"%s\" exited with %d: %s", mode, rc, out);
}

static void n_by_n_floats_do_not_fit_under_the_limit(at_backend *b) {
  only_where_rlimit_works(b);
  in_child("probe");
}

static void long_sequence_forward_needs_no_n_by_n_memory(at_backend *b) {
  only_where_rlimit_works(b);
  in_child("forward");
}

static void long_sequence_backward_needs_no_n_by_n_memory(at_backend *b) {
  only_where_rlimit_works(b);
  in_child("backward");
}

/* Without a window: every block of the lower triangle is computed. */
static void long_causal_sequence_needs_no_n_by_n_memory(at_backend *b) {
  only_where_rlimit_works(b);
  in_child("forward-causal");
}

int main(int argc, char **argv) {
  if (argc == 3 && strcmp(argv[1], "--child") == 0) return child(argv[2]);
  const at_test tests[] = {
      AT_TEST(n_by_n_floats_do_not_fit_under_the_limit),
      AT_TEST(long_sequence_forward_needs_no_n_by_n_memory),
      AT_TEST(long_sequence_backward_needs_no_n_by_n_memory),
      AT_TEST(long_causal_sequence_needs_no_n_by_n_memory),
  };
  return at_main(argc, argv, "nonxn", tests, sizeof tests / sizeof tests[0], NULL, 0);
}
