/*
 * The OpenCL program cache survives whatever lies under a cache file's name:
 * a truncated file, random bytes, another program's file or binary, a FIFO,
 * a folder, an 8 GiB file. Each time the call still computes the right
 * answer, and where the name held a file (or FIFO) the next process finds a
 * valid one there and loads it.
 *
 * Each step runs in a child process (at_child) with ATTN_DEBUG=1, so that
 * the program is built afresh and the debug log says which file it loaded,
 * rejected or wrote. The damage is done to the self-test's program, which
 * PoCL compiles in a second; one test damages the attention program itself
 * (half a minute of compiling on PoCL).
 */
#define _POSIX_C_SOURCE 200809L /* mkdtemp, mkfifo, ftruncate */

#include "testutil.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---------------------------------------------------------------------- */
/* The children                                                             */
/* ---------------------------------------------------------------------- */

static int child(const char *mode) {
  alarm(300); /* a hang (a FIFO opened for reading) fails the test, not ctest's timeout */
  attn_context *ctx = NULL;
  int rc = attn_context_create(NULL, &ctx); /* ATTN_BACKEND: the parent's device */
  if (rc) {
    printf("attn_context_create: %s: %s\n", attn_status_name(rc), attn_errmsg(ctx));
    attn_context_free(ctx);
    return 1;
  }
  int bad = 0;
  if (strcmp(mode, "selftest") == 0) {
    rc = attn_selftest(ctx); /* checks C = A + B itself */
    if (rc) printf("attn_selftest: %s: %s\n", attn_status_name(rc), attn_errmsg(ctx));
    bad = rc != ATTN_OK;
  } else {
    bad = at_child_forward(ctx, 64, 2, 16, 12345); /* a small forward */
  }
  attn_context_free(ctx);
  return bad;
}

/* ---------------------------------------------------------------------- */
/* The parent                                                               */
/* ---------------------------------------------------------------------- */

typedef struct cache {
  char dir[256];
  char self[512]; /* the self-test program's file */
  char log[16384];
} cache;

/* The path after `what` in the debug log, or "" when the log lacks it. */
static const char *logged_path(const char *log, const char *what, char *path, size_t n) {
  const char *p = strstr(log, what);
  path[0] = 0;
  if (p) snprintf(path, n, "%.*s", (int)strcspn(p + strlen(what), "\n"), p + strlen(what));
  return path;
}

/* Runs a child on the cache folder dir (NULL: the environment's own cache)
 * and returns its exit status; the log is in c->log. */
static char g_device[64]; /* ATTN_BACKEND=opencl:N, the device under test */
static char g_name[128];  /* its name */

static int run_child(cache *c, const char *mode, const char *dir) {
  char dirvar[300];
  snprintf(dirvar, sizeof dirvar, "ATTN_CL_CACHE_DIR=%s", dir ? dir : "");
  const char *own[] = {"ATTN_DEBUG=1", g_device, NULL};
  const char *in_dir[] = {"ATTN_DEBUG=1", g_device, dirvar, "ATTN_CL_CACHE", NULL};
  int rc = at_child(mode, dir ? in_dir : own, c->log, sizeof c->log);
  /* Another device's compiler may fail on its own: skip before judging rc. */
  if (at_child_elsewhere(c->log, g_name))
    at_skip("the children see another device than this process's %s", g_name);
  return rc;
}

static void must_run(cache *c, const char *mode, const char *dir, const char *what) {
  int rc = run_child(c, mode, dir);
  if (rc != 0) fail_msg("%s: the %s child exited with %d:\n%s", what, mode, rc, c->log);
}

/* A fresh cache folder holding a valid self-test program. */
static cache *cache_new(void) {
  cache *c = at_calloc(1, sizeof *c);
  snprintf(c->dir, sizeof c->dir, "/tmp/attn-test-clcache-XXXXXX");
  assert_non_null(mkdtemp(c->dir));
  must_run(c, "selftest", c->dir, "the first self-test");
  logged_path(c->log, "opencl: program cached in ", c->self, sizeof c->self);
  if (!c->self[0]) fail_msg("the first self-test wrote no cache file:\n%s", c->log);
  return c;
}

/* Removes the folder: files, and the one folder a test may have made. */
static void cache_free(cache *c) {
  DIR *d = opendir(c->dir);
  struct dirent *e;
  char p[1024];
  while (d && (e = readdir(d))) {
    if (e->d_name[0] == '.') continue;
    snprintf(p, sizeof p, "%s/%s", c->dir, e->d_name);
    if (unlink(p) != 0) rmdir(p);
  }
  if (d) closedir(d);
  rmdir(c->dir);
  at_free(c);
}

/* Only finished cache files are left: no temporary from a failed write. */
static void no_temporaries(const cache *c) {
  DIR *d = opendir(c->dir);
  assert_non_null(d);
  struct dirent *e;
  while ((e = readdir(d))) {
    size_t n = strlen(e->d_name);
    if (e->d_name[0] != '.' && (n < 4 || strcmp(e->d_name + n - 4, ".bin") != 0))
      fail_msg("a temporary file was left in the cache: %s", e->d_name);
  }
  closedir(d);
}

/* After the damage: the call computes right, the file is rejected for the
 * reason expected and rebuilt, and (replaced = 1) a file is written that the
 * next process loads. */
static void survives(cache *c, const char *mode, const char *file, const char *reason, int replaced,
                     const char *what) {
  char path[512], expect[700];
  must_run(c, mode, c->dir, what);
  snprintf(expect, sizeof expect, "opencl: cached program %s %s; rebuilding it", file, reason);
  if (!strstr(c->log, expect)) fail_msg("%s: the log lacks \"%s\":\n%s", what, expect, c->log);
  no_temporaries(c);
  if (!replaced) return;
  if (strcmp(logged_path(c->log, "opencl: program cached in ", path, sizeof path), file) != 0)
    fail_msg("%s: the rebuilt program was not written to %s:\n%s", what, file, c->log);
  struct stat st;
  assert_int_equal(stat(file, &st), 0);
  if (!S_ISREG(st.st_mode)) fail_msg("%s: %s is not a regular file after the rebuild", what, file);
  must_run(c, mode, c->dir, what);
  if (strcmp(logged_path(c->log, "opencl: program loaded from ", path, sizeof path), file) != 0)
    fail_msg("%s: the next process did not load the rewritten %s:\n%s", what, file, c->log);
}

/* The attention program's file for a small f32 forward, copied into c's
 * folder from the environment's cache (or built there when it has none). */
static void copy_forward_program(cache *c, char *copy, size_t n) {
  char path[512];
  must_run(c, "forward", NULL, "the forward from the environment's cache");
  if (!logged_path(c->log, "opencl: program loaded from ", path, sizeof path)[0])
    logged_path(c->log, "opencl: program cached in ", path, sizeof path);
  if (!path[0]) {
    must_run(c, "forward", c->dir, "the forward");
    logged_path(c->log, "opencl: program cached in ", path, sizeof path);
  }
  if (!path[0]) fail_msg("the forward wrote no cache file:\n%s", c->log);
  const char *base = strrchr(path, '/');
  snprintf(copy, n, "%s/%s", c->dir, base ? base + 1 : path);
  if (strcmp(copy, path) == 0) return;
  size_t len;
  unsigned char *b = at_read_file(path, &len);
  assert_non_null(b);
  at_write_file(copy, b, len);
  at_free(b);
}

static void skip_unless_opencl(at_backend *b) {
  if (b->kind != ATTN_BACKEND_OPENCL) at_skip("the program cache is the OpenCL backend's");
  /* The children use this device, not whatever plain "opencl" finds then. */
  snprintf(g_device, sizeof g_device, "ATTN_BACKEND=opencl:%d", attn_context_device(b->ctx));
  attn_device_info info;
  assert_int_equal(attn_context_device_info(b->ctx, &info), ATTN_OK);
  snprintf(g_name, sizeof g_name, "%s", info.name);
}

static void truncated_cache_file_is_rebuilt_and_replaced(at_backend *b) {
  skip_unless_opencl(b);
  cache *c = cache_new();
  struct stat st;
  assert_int_equal(stat(c->self, &st), 0);
  assert_int_equal(truncate(c->self, st.st_size / 2), 0);
  survives(c, "selftest", c->self, "is truncated or too long", 1, "a truncated file");
  cache_free(c);
}

static void cache_file_of_64_random_bytes_is_rebuilt_and_replaced(at_backend *b) {
  skip_unless_opencl(b);
  cache *c = cache_new();
  unsigned char junk[64];
  uint64_t s = 0x243F6A8885A308D3ull;
  for (int i = 0; i < 64; i++) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    junk[i] = (unsigned char)(s >> 56);
  }
  at_write_file(c->self, junk, sizeof junk);
  survives(c, "selftest", c->self, "is not in this library's format", 1, "64 random bytes");
  cache_free(c);
}

static void another_programs_cache_file_under_this_name_is_rebuilt(at_backend *b) {
  skip_unless_opencl(b);
  cache *c = cache_new();
  char fwd[512];
  copy_forward_program(c, fwd, sizeof fwd);
  size_t n;
  unsigned char *other = at_read_file(fwd, &n);
  assert_non_null(other);
  at_write_file(c->self, other, n);
  at_free(other);
  survives(c, "selftest", c->self, "was made for another program", 1,
           "the attention program's file under the self-test's name");
  cache_free(c);
}

/* FNV-1a 64 and the header layout of cl/program.c, to forge a file that
 * passes every check before the driver: another program's binary, with
 * this program's key and a correct length and hash. Only clCreateKernel can
 * then tell that the program lacks the kernel. */
static uint64_t fnv1a(const unsigned char *p, size_t n) {
  uint64_t h = 14695981039346656037ull;
  for (size_t i = 0; i < n; i++) {
    h ^= p[i];
    h *= 1099511628211ull;
  }
  return h;
}

static void another_programs_binary_with_this_programs_key_is_rebuilt(at_backend *b) {
  skip_unless_opencl(b);
  enum { HEADER = 40 };
  cache *c = cache_new();
  char fwd[512];
  copy_forward_program(c, fwd, sizeof fwd);
  size_t nf, ns;
  unsigned char *f = at_read_file(fwd, &nf), *s = at_read_file(c->self, &ns);
  assert_true(f && s);
  assert_true(nf > HEADER && ns > HEADER);
  assert_memory_equal(f, "attnclb\n", 8);
  memcpy(f + 16, s + 16, 8); /* the self-test's key */
  uint64_t h = fnv1a(f + HEADER, nf - HEADER);
  for (int i = 0; i < 8; i++)
    f[32 + i] = (unsigned char)(h >> (8 * i));
  at_write_file(c->self, f, nf);
  at_free(f);
  at_free(s);
  survives(c, "selftest", c->self, "lacks a kernel (clCreateKernel failed)", 1,
           "the attention program's binary under the self-test's key");
  cache_free(c);
}

static void fifo_under_the_cache_name_does_not_hang(at_backend *b) {
  skip_unless_opencl(b);
  cache *c = cache_new();
  assert_int_equal(unlink(c->self), 0);
  assert_int_equal(mkfifo(c->self, 0644), 0);
  survives(c, "selftest", c->self, "is not a regular file", 1, "a FIFO");
  cache_free(c);
}

static void folder_under_the_cache_name_is_left_and_the_call_works(at_backend *b) {
  skip_unless_opencl(b);
  cache *c = cache_new();
  assert_int_equal(unlink(c->self), 0);
  assert_int_equal(mkdir(c->self, 0755), 0);
  survives(c, "selftest", c->self, "is not a regular file", 0, "a folder");
  struct stat st;
  assert_int_equal(stat(c->self, &st), 0);
  assert_true(S_ISDIR(st.st_mode)); /* the library never removes a folder */
  cache_free(c);
}

static void huge_sparse_cache_file_is_not_read_and_is_replaced(at_backend *b) {
  skip_unless_opencl(b);
  cache *c = cache_new();
  int fd = open(c->self, O_WRONLY | O_TRUNC);
  assert_true(fd >= 0);
  assert_int_equal(ftruncate(fd, (off_t)8 << 30), 0); /* 8 GiB of holes: no disk used */
  close(fd);
  survives(c, "selftest", c->self, "has a size no cached program has", 1, "an 8 GiB file");
  struct stat st;
  assert_int_equal(stat(c->self, &st), 0);
  assert_true(st.st_size < (off_t)64 << 20);
  cache_free(c);
}

static void damaged_attention_program_is_rebuilt_and_computes_right(at_backend *b) {
  skip_unless_opencl(b);
  cache *c = cache_new();
  char fwd[512];
  copy_forward_program(c, fwd, sizeof fwd);
  struct stat st;
  assert_int_equal(stat(fwd, &st), 0);
  assert_int_equal(truncate(fwd, st.st_size - 1), 0);
  survives(c, "forward", fwd, "is truncated or too long", 1, "a truncated attention program");
  cache_free(c);
}

int main(int argc, char **argv) {
  if (argc == 3 && strcmp(argv[1], "--child") == 0) return child(argv[2]);
  const at_test tests[] = {
      AT_TEST(truncated_cache_file_is_rebuilt_and_replaced),
      AT_TEST(cache_file_of_64_random_bytes_is_rebuilt_and_replaced),
      AT_TEST(another_programs_cache_file_under_this_name_is_rebuilt),
      AT_TEST(another_programs_binary_with_this_programs_key_is_rebuilt),
      AT_TEST(fifo_under_the_cache_name_does_not_hang),
      AT_TEST(folder_under_the_cache_name_is_left_and_the_call_works),
      AT_TEST(huge_sparse_cache_file_is_not_read_and_is_replaced),
      AT_TEST(damaged_attention_program_is_rebuilt_and_computes_right),
  };
  return at_main(argc, argv, "clcache", tests, sizeof tests / sizeof tests[0], NULL, 0);
}
