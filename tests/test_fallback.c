/*
 * Fallback: "auto" takes CUDA, else an OpenCL GPU, else the CPU, so a machine
 * without a GPU runtime still works; an explicit GPU choice there fails with
 * ATTN_EUNAVAILABLE. The runtime's absence is shown in a child process (the
 * probes are cached per process) whose environment hides the drivers:
 * OCL_ICD_VENDORS pointing at an empty folder leaves the OpenCL ICD loader
 * with no platform, ATTN_CL_LIBRARY naming no file leaves attn with no
 * OpenCL library, and CUDA_VISIBLE_DEVICES="" leaves CUDA with no device.
 * What auto then picks depends on what is still present, so the child asks
 * instead of assuming the CPU; a loader that ignores OCL_ICD_VENDORS (not
 * every vendor's does) makes that test a skip, not a failure.
 */
#define _POSIX_C_SOURCE 200809L /* mkdtemp */

#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int has_gpu(void) {
  if (attn_device_count(ATTN_BACKEND_CUDA) > 0) return 1;
  int n = attn_device_count(ATTN_BACKEND_OPENCL);
  for (int i = 0; i < n; i++) {
    attn_device_info info;
    if (attn_device_info_get(ATTN_BACKEND_OPENCL, i, &info) == ATTN_OK && info.is_gpu) return 1;
  }
  return 0;
}

/* ---------------------------------------------------------------------- */
/* The child: exits 0 when what it sees is right, else says what is wrong   */
/* ---------------------------------------------------------------------- */

/* The child's exit status when the environment could not hide a driver. */
#define HIDING_FAILED 77

static int expect_unavailable(attn_backend kind) {
  const char *name = attn_backend_name(kind);
  if (attn_device_count(kind) != 0) {
    fprintf(stderr, "%s still has %d device(s) with its driver hidden\n", name,
            attn_device_count(kind));
    return 1;
  }
  if (!attn_backend_unavailable_reason(kind)[0]) {
    fprintf(stderr, "%s has no device but gives no reason\n", name);
    return 1;
  }
  attn_context *ctx = NULL;
  int rc = attn_context_create(name, &ctx);
  if (rc != ATTN_EUNAVAILABLE || !at_mentions(attn_errmsg(ctx), name)) {
    fprintf(stderr, "attn_context_create(\"%s\"): %s \"%s\"; want ATTN_EUNAVAILABLE naming it\n",
            name, attn_status_name(rc), attn_errmsg(ctx));
    attn_context_free(ctx);
    return 1;
  }
  printf("%s: unavailable: %s\n", name, attn_errmsg(ctx));
  attn_context_free(ctx);
  return 0;
}

static int expect_auto_is_cpu(void) {
  attn_context *ctx = NULL;
  int rc = attn_context_create(NULL, &ctx);
  if (rc != ATTN_OK || attn_context_backend(ctx) != ATTN_BACKEND_CPU) {
    fprintf(stderr, "auto: %s \"%s\", backend %s; want the cpu\n", attn_status_name(rc),
            attn_errmsg(ctx), attn_backend_name(attn_context_backend(ctx)));
    attn_context_free(ctx);
    return 1;
  }
  printf("auto: cpu\n");
  attn_context_free(ctx);
  return 0;
}

/* A forward, a backward and a failing call on the named backend; prints
 * nothing itself, so whatever comes out is the library's. */
static int quiet_run(const char *backend) {
  attn_context *ctx = NULL;
  if (attn_context_create(backend, &ctx) != ATTN_OK) return 3;
  enum { N = 40, H = 2, D = 32 };
  static float q[N * H * D], o[N * H * D], lse[H * N], dq[N * H * D], dk[N * H * D], dv[N * H * D];
  for (int i = 0; i < N * H * D; i++)
    q[i] = (float)((i * 7) % 13) / 13.0f;
  attn_params p;
  attn_params_init(&p);
  p.flags = ATTN_CAUSAL;
  attn_tensor tq = attn_tensor_bshd(q, ATTN_F32, 1, N, H, D),
              to = attn_tensor_bshd(o, ATTN_F32, 1, N, H, D), tl = attn_tensor_lse(lse, 1, H, N),
              tdq = attn_tensor_bshd(dq, ATTN_F32, 1, N, H, D),
              tdk = attn_tensor_bshd(dk, ATTN_F32, 1, N, H, D),
              tdv = attn_tensor_bshd(dv, ATTN_F32, 1, N, H, D);
  int rc = attn_forward(ctx, &p, &tq, &tq, &tq, &to, &tl);
  rc |= attn_backward(ctx, &p, &tq, &tq, &tq, &to, &tl, &tq, &tdq, &tdk, &tdv);
  p.window_left = -5;
  rc |= attn_forward(ctx, &p, &tq, &tq, &tq, &to, &tl) == ATTN_EWINDOW ? 0 : 1;
  attn_context_free(ctx);
  return rc ? 4 : 0;
}

static int child(const char *mode) {
  if (strncmp(mode, "quiet-", 6) == 0) return quiet_run(mode + 6);
  if (strcmp(mode, "no-opencl") == 0) {
    if (attn_device_count(ATTN_BACKEND_OPENCL) != 0) {
      printf("this OpenCL loader ignores OCL_ICD_VENDORS\n");
      return HIDING_FAILED;
    }
    int rc = expect_unavailable(ATTN_BACKEND_OPENCL);
    attn_context *ctx = NULL;
    if (attn_context_create(NULL, &ctx) != ATTN_OK ||
        attn_context_backend(ctx) == ATTN_BACKEND_OPENCL) {
      fprintf(stderr, "auto without OpenCL: %s\n", attn_errmsg(ctx));
      rc = 1;
    }
    attn_context_free(ctx);
    return rc;
  }
  if (strcmp(mode, "no-cuda") == 0) {
    int rc = expect_unavailable(ATTN_BACKEND_CUDA);
    attn_context *ctx = NULL;
    if (attn_context_create(NULL, &ctx) != ATTN_OK ||
        attn_context_backend(ctx) == ATTN_BACKEND_CUDA) {
      fprintf(stderr, "auto without CUDA: %s\n", attn_errmsg(ctx));
      rc = 1;
    }
    attn_context_free(ctx);
    return rc;
  }
  if (strcmp(mode, "no-gpu") == 0) {
    int rc = 0;
    if (attn_backend_compiled(ATTN_BACKEND_OPENCL)) rc |= expect_unavailable(ATTN_BACKEND_OPENCL);
    if (attn_backend_compiled(ATTN_BACKEND_CUDA)) rc |= expect_unavailable(ATTN_BACKEND_CUDA);
    return rc | expect_auto_is_cpu();
  }
  return 2;
}

/* ---------------------------------------------------------------------- */
/* The tests                                                                */
/* ---------------------------------------------------------------------- */

static char g_empty[64];

static void in_child(const char *mode, const char *const *env) {
  static char out[8192];
  int rc = at_child(mode, env, out, sizeof out);
  print_message("%s", out);
  if (rc == HIDING_FAILED) at_skip("%s", out);
  if (rc != 0) fail_msg("child \"%s\" exited with %d: %s", mode, rc, out);
}

static void auto_gives_the_cpu_when_no_gpu_is_present(at_backend *b) {
  (void)b;
  if (has_gpu())
    at_skip("a GPU is present here; see auto_falls_back_to_the_cpu_without_gpu_drivers");
  at_env_set("ATTN_BACKEND", NULL);
  attn_context *ctx = NULL;
  assert_int_equal(attn_context_create(NULL, &ctx), ATTN_OK);
  assert_int_equal(attn_context_backend(ctx), ATTN_BACKEND_CPU);
  attn_context_free(ctx);
}

static void auto_falls_back_to_the_cpu_without_gpu_drivers(at_backend *b) {
  (void)b;
  /* attn's own switch hides OpenCL whatever the loader does. */
  const char *env[] = {"ATTN_CL_LIBRARY=/nonexistent/libOpenCL.so.1",
                       "CUDA_VISIBLE_DEVICES=", "ATTN_BACKEND", NULL};
  in_child("no-gpu", env);
}

static void opencl_without_a_driver_is_unavailable(at_backend *b) {
  (void)b;
  if (!attn_backend_compiled(ATTN_BACKEND_OPENCL)) at_skip("built without the OpenCL backend");
  char vendors[96];
  snprintf(vendors, sizeof vendors, "OCL_ICD_VENDORS=%s", g_empty);
  const char *env[] = {vendors, "ATTN_BACKEND", NULL};
  in_child("no-opencl", env);
}

static void cuda_without_a_device_is_unavailable(at_backend *b) {
  (void)b;
  if (!attn_backend_compiled(ATTN_BACKEND_CUDA)) at_skip("built without the CUDA backend");
  const char *env[] = {"CUDA_VISIBLE_DEVICES=", "ATTN_BACKEND", NULL};
  in_child("no-cuda", env);
}

static void library_prints_nothing_unless_attn_debug_is_set(at_backend *b) {
  static char out[8192];
  char mode[32];
  snprintf(mode, sizeof mode, "quiet-%s", b->name);
  const char *quiet[] = {"ATTN_DEBUG", NULL};
  int rc = at_child(mode, quiet, out, sizeof out);
  if (rc != 0) fail_msg("child exited with %d: %s", rc, out);
  if (out[0]) fail_msg("the library printed without ATTN_DEBUG: \"%s\"", out);
  const char *loud[] = {"ATTN_DEBUG=1", NULL};
  rc = at_child(mode, loud, out, sizeof out);
  if (rc != 0) fail_msg("child exited with %d: %s", rc, out);
  if (!out[0]) fail_msg("ATTN_DEBUG=1 gave no debug log");
}

static void selftest_passes(at_backend *b) {
  int rc = attn_selftest(b->ctx);
  if (rc != ATTN_OK) fail_msg("attn_selftest: %s: %s", attn_status_name(rc), attn_errmsg(b->ctx));
}

static void default_stream_restores_and_synchronizes(at_backend *b) {
  assert_int_equal(attn_context_set_stream(b->ctx, NULL), ATTN_OK);
  assert_int_equal(attn_context_synchronize(b->ctx), ATTN_OK);
}

int main(int argc, char **argv) {
  if (argc == 3 && strcmp(argv[1], "--child") == 0) return child(argv[2]);
  snprintf(g_empty, sizeof g_empty, "/tmp/attn-test-empty-XXXXXX");
  if (!mkdtemp(g_empty)) {
    perror("mkdtemp");
    return 1;
  }
  const at_test common[] = {
      AT_TEST(auto_gives_the_cpu_when_no_gpu_is_present),
      AT_TEST(auto_falls_back_to_the_cpu_without_gpu_drivers),
      AT_TEST(opencl_without_a_driver_is_unavailable),
      AT_TEST(cuda_without_a_device_is_unavailable),
  };
  const at_test tests[] = {
      AT_TEST(library_prints_nothing_unless_attn_debug_is_set),
      AT_TEST(selftest_passes),
      AT_TEST(default_stream_restores_and_synchronizes),
  };
  int rc = at_main(argc, argv, "fallback", tests, sizeof tests / sizeof tests[0], common,
                   sizeof common / sizeof common[0]);
  rmdir(g_empty);
  return rc;
}
