/*
 * The golden-case reader (testkit/golden.c, json.c, npy.c) itself: it loads
 * what the golden README describes, and refuses anything else with a
 * sentence, never a crash: every truncation of case.json and of a .npy file,
 * and random byte changes, are tried. Backend-independent ("common" tests only).
 */
#define _POSIX_C_SOURCE 200809L /* mkdtemp */

#include "golden.h"
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *const files[] = {"case.json", "q.npy",   "k.npy",  "v.npy",  "do.npy",
                                    "o.npy",     "lse.npy", "dq.npy", "dk.npy", "dv.npy"};
enum { NFILES = sizeof files / sizeof files[0] };

/* A writable copy of a golden case, to break. */
typedef struct copy {
  char dir[256];
  unsigned char *orig[NFILES];
  size_t len[NFILES];
} copy;

static void copy_case(copy *c, const char *name) {
  char src[2048], path[512];
  snprintf(c->dir, sizeof c->dir, "/tmp/attn-goldenio-XXXXXX");
  assert_non_null(mkdtemp(c->dir));
  for (int i = 0; i < NFILES; i++) {
    snprintf(src, sizeof src, "%s/%s/%s", at_golden_dir(), name, files[i]);
    c->orig[i] = at_read_file(src, &c->len[i]);
    if (!c->orig[i]) at_skip("no golden case %s/%s", at_golden_dir(), name);
    snprintf(path, sizeof path, "%s/%s", c->dir, files[i]);
    at_write_file(path, c->orig[i], c->len[i]);
  }
}

static void restore(copy *c, int i) {
  char path[512];
  snprintf(path, sizeof path, "%s/%s", c->dir, files[i]);
  at_write_file(path, c->orig[i], c->len[i]);
}

static void remove_copy(copy *c) {
  char path[512];
  for (int i = 0; i < NFILES; i++) {
    snprintf(path, sizeof path, "%s/%s", c->dir, files[i]);
    unlink(path);
    at_free(c->orig[i]);
  }
  rmdir(c->dir);
}

/* Loads c's folder; returns 0 or -1, and checks that -1 comes with a message. */
static int load(copy *c) {
  at_golden g;
  char err[512] = "";
  int rc = at_golden_load(c->dir, &g, err, sizeof err);
  if (rc != 0 && !err[0]) fail_msg("a refused case gives no message");
  if (rc == 0) at_golden_free(&g);
  return rc;
}

static void tiny_case_loads_as_described(at_backend *b) {
  (void)b;
  char dir[2048], err[512];
  snprintf(dir, sizeof dir, "%s/tiny", at_golden_dir());
  at_golden g;
  if (access(dir, F_OK) != 0) at_skip("no golden case %s", dir);
  if (at_golden_load(dir, &g, err, sizeof err) != 0) fail_msg("%s", err);
  assert_string_equal(g.name, "tiny");
  assert_int_equal(g.dtype, ATTN_F32);
  assert_int_equal(g.varlen, 0);
  assert_int_equal(g.batch, 3);
  assert_int_equal(g.seqlen_q, 1);
  assert_int_equal(g.seqlen_k, 3);
  assert_int_equal(g.heads_q, 1);
  assert_int_equal(g.heads_kv, 1);
  assert_int_equal(g.head_dim, 8);
  assert_int_equal(g.total_q, 3);
  assert_int_equal(g.total_k, 9);
  assert_true(fabs(g.params.scale - 0.3535533845424652) < 1e-15); /* float32 1/sqrt(8) */
  assert_int_equal(g.params.flags & ATTN_CAUSAL, 0);
  assert_int_equal(g.params.window_left, -1);
  assert_int_equal(g.params.window_right, -1);
  assert_null(g.params.alibi_slopes);
  assert_null(g.params.cu_seqlens_q);
  assert_non_null(g.q);
  assert_non_null(g.dq);
  assert_true(isfinite(g.peer_o) && isfinite(g.peer_dv));
  at_golden_free(&g);
}

static void varlen_case_loads_its_sequences(at_backend *b) {
  (void)b;
  char dir[2048], err[512];
  snprintf(dir, sizeof dir, "%s/varlen_causal", at_golden_dir());
  at_golden g;
  if (access(dir, F_OK) != 0) at_skip("no golden case %s", dir);
  if (at_golden_load(dir, &g, err, sizeof err) != 0) fail_msg("%s", err);
  assert_int_equal(g.varlen, 1);
  assert_int_equal(g.seqlen_q, 0);
  assert_int_equal(g.total_q, 74);
  assert_int_equal(g.params.batch, 3);
  assert_int_equal(g.params.cu_seqlens_q[1], 5);
  assert_int_equal(g.params.cu_seqlens_k[3], 74);
  assert_true(g.params.flags & ATTN_CAUSAL);
  at_golden_free(&g);
}

static void half_precision_case_has_no_lse_peer(at_backend *b) {
  (void)b;
  char dir[2048], err[512];
  snprintf(dir, sizeof dir, "%s/bf16_mha", at_golden_dir());
  at_golden g;
  if (access(dir, F_OK) != 0) at_skip("no golden case %s", dir);
  if (at_golden_load(dir, &g, err, sizeof err) != 0) fail_msg("%s", err);
  assert_int_equal(g.dtype, ATTN_BF16);
  assert_true(isnan(g.peer_lse));
  assert_true(isfinite(g.peer_o));
  at_golden_free(&g);
}

static void list_is_sorted_and_accepts_a_case_folder(at_backend *b) {
  (void)b;
  char **dirs = NULL, err[512];
  int n = at_golden_list(at_golden_dir(), &dirs, err, sizeof err);
  if (n < 0) fail_msg("%s", err);
  if (n == 0) at_skip("no golden cases in %s", at_golden_dir());
  for (int i = 1; i < n; i++)
    assert_true(strcmp(dirs[i - 1], dirs[i]) < 0);
  char one[2048];
  snprintf(one, sizeof one, "%s", dirs[0]);
  at_golden_list_free(dirs, n);
  assert_int_equal(at_golden_list(one, &dirs, err, sizeof err), 1);
  assert_string_equal(dirs[0], one);
  at_golden_list_free(dirs, 1);
  assert_int_equal(at_golden_list("/nonexistent/attn", &dirs, err, sizeof err), -1);
  assert_true(err[0] != '\0');
}

static void every_truncated_case_json_is_refused(at_backend *b) {
  (void)b;
  copy c;
  copy_case(&c, "tiny");
  char path[512];
  snprintf(path, sizeof path, "%s/case.json", c.dir);
  /* Every prefix shorter than the closing brace is malformed JSON. */
  const unsigned char *close = (const unsigned char *)strrchr((const char *)c.orig[0], '}');
  assert_non_null(close);
  size_t last = (size_t)(close - c.orig[0]);
  for (size_t len = 0; len <= last; len++) {
    at_write_file(path, c.orig[0], len);
    if (load(&c) == 0) fail_msg("case.json cut to %zu bytes was accepted", len);
  }
  restore(&c, 0);
  assert_int_equal(load(&c), 0);
  remove_copy(&c);
}

static void every_truncated_npy_is_refused(at_backend *b) {
  (void)b;
  copy c;
  copy_case(&c, "tiny");
  for (int f = 1; f < 7; f++) { /* inputs, o and lse: required */
    char path[512];
    snprintf(path, sizeof path, "%s/%s", c.dir, files[f]);
    for (size_t len = 0; len < c.len[f]; len++) {
      at_write_file(path, c.orig[f], len);
      if (load(&c) == 0) fail_msg("%s cut to %zu bytes was accepted", files[f], len);
    }
    restore(&c, f);
  }
  remove_copy(&c);
}

static void random_byte_changes_never_crash(at_backend *b) {
  (void)b;
  copy c;
  copy_case(&c, "varlen_causal");
  uint64_t s = 42;
  const int files_to_break[] = {0, 1, 6};
  for (int r = 0; r < 300; r++) {
    int f = files_to_break[r % 3];
    unsigned char *buf = malloc(c.len[f]);
    assert_non_null(buf);
    memcpy(buf, c.orig[f], c.len[f]);
    /* for .npy files, break the header: the data is any bytes anyway */
    size_t span = f == 0 ? c.len[f] : (c.len[f] < 128 ? c.len[f] : 128);
    for (int k = 0; k < 1 + r % 4; k++) {
      s = s * 6364136223846793005ull + 1442695040888963407ull;
      buf[(s >> 33) % span] = (unsigned char)(s >> 20);
    }
    char path[512];
    snprintf(path, sizeof path, "%s/%s", c.dir, files[f]);
    at_write_file(path, buf, c.len[f]);
    load(&c); /* accepted or refused with a message; never a crash */
    free(buf);
    restore(&c, f);
  }
  remove_copy(&c);
}

static void wrong_npy_shape_dtype_and_order_are_refused(at_backend *b) {
  (void)b;
  copy c;
  copy_case(&c, "tiny");
  struct {
    const char *from, *to, *file;
    int fi;
  } edits[] = {
      {"(3, 1, 1, 8)", "(3, 1, 1, 7)", "q.npy", 1},
      {"(3, 3, 1, 8)", "(3, 3, 8, 1)", "k.npy", 2},
      {"'<f4'", "'>f4'", "v.npy", 3},
      {"'<f4'", "'<i2'", "o.npy", 5},
      {"False", "True ", "lse.npy", 6},
  };
  for (size_t i = 0; i < sizeof edits / sizeof edits[0]; i++) {
    int f = edits[i].fi;
    unsigned char *buf = malloc(c.len[f]);
    assert_non_null(buf);
    memcpy(buf, c.orig[f], c.len[f]);
    char *hit = NULL;
    for (size_t k = 0; k + strlen(edits[i].from) < 128 && !hit; k++)
      if (memcmp(buf + k, edits[i].from, strlen(edits[i].from)) == 0) hit = (char *)buf + k;
    if (!hit) fail_msg("%s has no %s to edit", edits[i].file, edits[i].from);
    memcpy(hit, edits[i].to, strlen(edits[i].to));
    char path[512], err[512] = "";
    snprintf(path, sizeof path, "%s/%s", c.dir, files[f]);
    at_write_file(path, buf, c.len[f]);
    at_golden g;
    if (at_golden_load(c.dir, &g, err, sizeof err) == 0)
      fail_msg("%s with %s accepted", edits[i].file, edits[i].to);
    if (!strstr(err, edits[i].file)) fail_msg("the message should name %s: %s", edits[i].file, err);
    free(buf);
    restore(&c, f);
  }
  remove_copy(&c);
}

static void missing_gradient_files_leave_backward_out(at_backend *b) {
  (void)b;
  copy c;
  copy_case(&c, "tiny");
  char path[512], err[512];
  snprintf(path, sizeof path, "%s/dk.npy", c.dir);
  unlink(path);
  at_golden g;
  if (at_golden_load(c.dir, &g, err, sizeof err) != 0) fail_msg("%s", err);
  assert_null(g.dq);
  assert_null(g.dk);
  assert_null(g.dv);
  assert_null(g.dout);
  assert_non_null(g.o);
  at_golden_free(&g);
  remove_copy(&c);
}

static void bad_json_values_are_refused_with_the_key(at_backend *b) {
  (void)b;
  copy c;
  copy_case(&c, "tiny");
  const char *text = (const char *)c.orig[0];
  struct {
    const char *from, *to, *key;
  } edits[] = {
      {"\"heads_kv\": 1", "\"heads_kv\": 0", "heads_kv"},
      {"\"dtype\": \"f32\"", "\"dtype\": \"f64\"", "dtype"},
      {"\"layout\": \"bshd\"", "\"layout\": \"bhsd\"", "layout"},
      {"\"batch\": 3", "\"batch\": 2.5", "batch"},
      {"\"causal\": false", "\"causal\": 0", "causal"},
      {"\"head_dim\": 8", "\"head_dim\": \"8\"", "head_dim"},
  };
  for (size_t i = 0; i < sizeof edits / sizeof edits[0]; i++) {
    const char *hit = strstr(text, edits[i].from);
    if (!hit) fail_msg("tiny/case.json has no %s", edits[i].from);
    size_t pre = (size_t)(hit - text), fl = strlen(edits[i].from), tl = strlen(edits[i].to);
    size_t n = c.len[0] - fl + tl;
    char *buf = malloc(n + 1);
    assert_non_null(buf);
    memcpy(buf, text, pre);
    memcpy(buf + pre, edits[i].to, tl);
    memcpy(buf + pre + tl, hit + fl, c.len[0] - pre - fl);
    char path[512], err[512] = "";
    snprintf(path, sizeof path, "%s/case.json", c.dir);
    at_write_file(path, buf, n);
    at_golden g;
    if (at_golden_load(c.dir, &g, err, sizeof err) == 0) fail_msg("%s accepted", edits[i].to);
    if (!strstr(err, edits[i].key)) fail_msg("the message should name %s: %s", edits[i].key, err);
    free(buf);
  }
  remove_copy(&c);
}

int main(int argc, char **argv) {
  const at_test common[] = {
      AT_TEST(tiny_case_loads_as_described),
      AT_TEST(varlen_case_loads_its_sequences),
      AT_TEST(half_precision_case_has_no_lse_peer),
      AT_TEST(list_is_sorted_and_accepts_a_case_folder),
      AT_TEST(every_truncated_case_json_is_refused),
      AT_TEST(every_truncated_npy_is_refused),
      AT_TEST(random_byte_changes_never_crash),
      AT_TEST(wrong_npy_shape_dtype_and_order_are_refused),
      AT_TEST(missing_gradient_files_leave_backward_out),
      AT_TEST(bad_json_values_are_refused_with_the_key),
  };
  return at_main(argc, argv, "goldenio", NULL, 0, common, sizeof common / sizeof common[0]);
}
