/*
 * attn_tune: on OpenCL and on the CPU it measures the tiles table's
 * variations, keeps the fastest in a file beside the program cache, and a
 * later process on the device runs that variation and computes right; a
 * damaged or foreign file is ignored. The backend with a fixed table (CUDA)
 * answers ATTN_EUNSUPPORTED, and bad arguments are named. The later
 * processes are children (at_child) with ATTN_DEBUG=1, whose log says which
 * tiles they loaded and ran.
 */
#define _POSIX_C_SOURCE 200809L /* mkdtemp */

#include "testutil.h"

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { N = 96, H = 2, D = 32 }; /* d = 32: the smallest programs PoCL compiles */

/* A child: a forward of f32 at head dim D on ATTN_BACKEND, against the
 * double reference. */
static int child(void) {
  alarm(600);
  attn_context *ctx = NULL;
  int rc = attn_context_create(NULL, &ctx);
  if (rc) {
    printf("%s: %s\n", attn_status_name(rc), attn_errmsg(ctx));
    attn_context_free(ctx);
    return 1;
  }
  rc = at_child_forward(ctx, N, H, D, 777);
  attn_context_free(ctx);
  return rc;
}

/* The tiles file in dir, or "" when there is none. */
static void tiles_file(const char *dir, char *path, size_t n) {
  DIR *d = opendir(dir);
  struct dirent *e;
  path[0] = 0;
  while (d && (e = readdir(d)))
    if (!strncmp(e->d_name, "tiles-", 6)) snprintf(path, n, "%s/%s", dir, e->d_name);
  if (d) closedir(d);
}

static void remove_dir(const char *dir) {
  DIR *d = opendir(dir);
  struct dirent *e;
  char p[1024];
  while (d && (e = readdir(d))) {
    if (e->d_name[0] == '.') continue;
    snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
    unlink(p);
  }
  if (d) closedir(d);
  rmdir(dir);
}

/* Runs the child on device spec with the cache in dir; fails on a wrong
 * result. The log is in log. */
static void run_child(const char *spec, const char *name, const char *dir, char *log, size_t n) {
  char be[64], cd[300];
  snprintf(be, sizeof be, "ATTN_BACKEND=%s", spec);
  snprintf(cd, sizeof cd, "ATTN_CL_CACHE_DIR=%s", dir);
  const char *env[] = {"ATTN_DEBUG=1", be, cd, "ATTN_CL_CACHE", NULL};
  const int rc = at_child("forward", env, log, n);
  if (at_child_elsewhere(log, name)) {
    remove_dir(dir);
    at_skip("the children see another device than this process's %s", name);
  }
  if (rc != 0) fail_msg("the child on %s exited with %d:\n%s", spec, rc, log);
}

static void tuning_keeps_a_variation_that_later_processes_run(at_backend *b) {
  if (b->kind != ATTN_BACKEND_OPENCL)
    at_skip("the OpenCL backend's tiles (the %s backend's: below)", b->name);
  char dir[64] = "/tmp/attn-test-tune-XXXXXX", spec[32], path[512], line[256], want[128];
  assert_non_null(mkdtemp(dir));
  snprintf(spec, sizeof spec, "opencl:%d", attn_context_device(b->ctx));
  attn_device_info info;
  assert_int_equal(attn_context_device_info(b->ctx, &info), ATTN_OK);
  at_env_set("ATTN_CL_CACHE_DIR", dir);
  at_env_set("ATTN_CL_CACHE", NULL);
  attn_context *ctx = NULL;
  assert_int_equal(attn_context_create(spec, &ctx), ATTN_OK);
  const int rc = attn_tune(ctx, ATTN_F32, D, 64);
  if (rc) fail_msg("attn_tune: %s: %s", attn_status_name(rc), attn_errmsg(ctx));
  attn_context_free(ctx);
  at_env_restore();

  /* One line, for f32 at the bucket of D: dtype, bucket, the kernels'
   * shapes, then br bc tm dk jk bq dr ntd rb kb bk btm bdk bjk. */
  tiles_file(dir, path, sizeof path);
  if (!path[0]) fail_msg("attn_tune stored nothing in %s", dir);
  FILE *f = fopen(path, "r");
  assert_non_null(f);
  int v[18], lines = 0;
  while (fgets(line, sizeof line, f)) {
    lines++;
    assert_int_equal(sscanf(line, "%d %d %d %d %d %d %d %d %d %d %d %d %d %d %d %d %d %d", &v[0],
                            &v[1], &v[2], &v[3], &v[4], &v[5], &v[6], &v[7], &v[8], &v[9], &v[10],
                            &v[11], &v[12], &v[13], &v[14], &v[15], &v[16], &v[17]),
                     18);
  }
  fclose(f);
  assert_int_equal(lines, 1);
  assert_int_equal(v[0], ATTN_F32);
  assert_int_equal(v[1], 32);

  /* A later process loads it and runs those tiles. */
  static char log[1 << 16];
  run_child(spec, info.name, dir, log, sizeof log);
  if (!at_mentions(log, "tiles for f32, head dim 32, from"))
    fail_msg("the child did not load %s:\n%s", path, log);
  if (v[2] == 1)
    snprintf(want, sizeof want, "HD=32 RB=%d KB=%d", v[12], v[13]);
  else
    snprintf(want, sizeof want, "HD=32 Br=%d Bc=%d TM=%d", v[4], v[5], v[6]);
  if (!strstr(log, want)) fail_msg("the child did not run %s:\n%s", want, log);

  /* Lines that do not parse, or tiles no variation has, are ignored: the
   * table's row runs, and computes right. */
  f = fopen(path, "w");
  assert_non_null(f);
  fprintf(f, "garbage\n%d %d %d %d 12 48 4 4 4 4 4 4 12 48 48 4 4 4\n\n%d 32\n", v[0], v[1], v[2],
          v[3], v[0]);
  fclose(f);
  run_child(spec, info.name, dir, log, sizeof log);
  if (at_mentions(log, "tiles for f32")) fail_msg("the child loaded a foreign line:\n%s", log);
  remove_dir(dir);
}

/* The CPU's tiles: one line "dtype max_head_dim br bc products fma" for the row of
 * head dims up to 64 that serves D, read back by a later process on the
 * same machine and thread count. */
static void cpu_tuning_keeps_tiles_that_later_processes_run(at_backend *b) {
  if (b->kind != ATTN_BACKEND_CPU)
    at_skip("the CPU backend's tiles (the %s backend's: above)", b->name);
  char dir[64] = "/tmp/attn-test-tune-XXXXXX", path[512], line[256], want[128];
  attn_device_info info;
  assert_int_equal(attn_context_device_info(b->ctx, &info), ATTN_OK);
  assert_non_null(mkdtemp(dir));
  at_env_set("ATTN_CL_CACHE_DIR", dir);
  at_env_set("ATTN_CL_CACHE", NULL);
  attn_context *ctx = NULL;
  assert_int_equal(attn_context_create("cpu", &ctx), ATTN_OK);
  const int rc = attn_tune(ctx, ATTN_F32, D, 64);
  if (rc) fail_msg("attn_tune: %s: %s", attn_status_name(rc), attn_errmsg(ctx));
  attn_context_free(ctx);
  at_env_restore();

  tiles_file(dir, path, sizeof path);
  if (!path[0]) fail_msg("attn_tune stored nothing in %s", dir);
  FILE *f = fopen(path, "r");
  assert_non_null(f);
  int v[6], lines = 0;
  while (fgets(line, sizeof line, f)) {
    lines++;
    assert_int_equal(sscanf(line, "%d %d %d %d %d %d", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5]),
                     6);
  }
  fclose(f);
  assert_int_equal(lines, 1);
  assert_int_equal(v[0], ATTN_F32);
  assert_int_equal(v[1], 64);
  assert_int_equal(v[4], 0); /* f32 products: the only ones of f32 */

  static char log[1 << 16];
  run_child("cpu", info.name, dir, log, sizeof log);
  if (!at_mentions(log, "tiles for f32, head dim 64, from"))
    fail_msg("the child did not load %s:\n%s", path, log);
  snprintf(want, sizeof want, "cpu blockwise forward, Br %d Bc %d, f32 products (%s)", v[2], v[3],
           v[5] ? "FMA kernels" : "OpenBLAS");
  if (!strstr(log, want)) fail_msg("the child did not run %s:\n%s", want, log);

  /* Tiles that are no variation, and lines that do not parse, are ignored:
   * the table's row runs, and computes right. */
  f = fopen(path, "w");
  assert_non_null(f);
  fprintf(f, "garbage\n%d 64 48 12 0 0\n%d 64 64 64 1 0\n\n%d\n", ATTN_F32, ATTN_F32, ATTN_F32);
  fclose(f);
  run_child("cpu", info.name, dir, log, sizeof log);
  if (at_mentions(log, "tiles for f32")) fail_msg("the child loaded a foreign line:\n%s", log);
  if (!strstr(log, "cpu blockwise forward, Br 64 Bc 128")) /* the table's row up to d = 64 */
    fail_msg("the child did not run the table's tiles:\n%s", log);
  remove_dir(dir);
}

static void backends_with_fixed_tables_have_nothing_to_tune(at_backend *b) {
  if (b->kind != ATTN_BACKEND_CUDA) at_skip("the %s backend tunes (the tests above)", b->name);
  const int rc = attn_tune(b->ctx, ATTN_BF16, 64, 0);
  assert_int_equal(rc, ATTN_EUNSUPPORTED);
  assert_true(at_mentions(attn_errmsg(b->ctx), "no configurations to tune"));
}

static void bad_arguments_are_named(void) {
  attn_context *ctx = NULL;
  assert_int_equal(attn_context_create("cpu", &ctx), ATTN_OK);
  assert_int_equal(attn_tune(NULL, ATTN_F32, 64, 0), ATTN_ENULL);
  assert_int_equal(attn_tune(ctx, ATTN_I32, 64, 0), ATTN_EDTYPE);
  assert_true(at_mentions(attn_errmsg(ctx), "dtype"));
  assert_int_equal(attn_tune(ctx, ATTN_F32, 0, 0), ATTN_ESIZE);
  assert_true(at_mentions(attn_errmsg(ctx), "head_dim"));
  assert_int_equal(attn_tune(ctx, ATTN_F32, ATTN_MAX_HEAD_DIM + 1, 0), ATTN_EHEADDIM);
  assert_true(at_mentions(attn_errmsg(ctx), "head_dim"));
  assert_int_equal(attn_tune(ctx, ATTN_F32, 64, -1), ATTN_ESIZE);
  assert_true(at_mentions(attn_errmsg(ctx), "seqlen"));
  assert_int_equal(attn_tune(ctx, ATTN_F32, 64, (1 << 16) + 1), ATTN_ESIZE);
  attn_context_free(ctx);
}

static void common_bad_arguments(at_backend *b) {
  (void)b;
  bad_arguments_are_named();
}

int main(int argc, char **argv) {
  if (argc == 3 && strcmp(argv[1], "--child") == 0) return child();
  const at_test tests[] = {
      AT_TEST(tuning_keeps_a_variation_that_later_processes_run),
      AT_TEST(cpu_tuning_keeps_tiles_that_later_processes_run),
      AT_TEST(backends_with_fixed_tables_have_nothing_to_tune),
  };
  const at_test common[] = {{"bad_arguments_are_named", common_bad_arguments, NULL}};
  return at_main(argc, argv, "tune", tests, sizeof tests / sizeof tests[0], common, 1);
}
