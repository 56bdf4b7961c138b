/*
 * The golden-case reader (testkit/golden.c, json.c, npy.c) itself: it loads
 * what the golden README describes, and refuses anything else with a
 * sentence, never a crash: every truncation of case.json and of a .npy file,
 * and random byte changes, are tried. Backend-independent ("common" tests only).
 */
#define _POSIX_C_SOURCE 200809L /* mkdtemp */

#include "golden.h"
#include "testutil.h"

#include <dirent.h>
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

/* ---------------------------------------------------------------------- */
/* The inference path's fields and files                                    */
/* ---------------------------------------------------------------------- */

/* A writable copy of every file of a case folder. */
typedef struct copy_all {
  char dir[256];
} copy_all;

static void copy_whole_case(copy_all *c, const char *name) {
  char src[2048], path[2400];
  snprintf(src, sizeof src, "%s/%s", at_golden_dir(), name);
  DIR *d = opendir(src);
  if (!d) at_skip("no golden case %s", src);
  snprintf(c->dir, sizeof c->dir, "/tmp/attn-goldenio-XXXXXX");
  assert_non_null(mkdtemp(c->dir));
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    if (e->d_name[0] == '.') continue;
    size_t len;
    snprintf(path, sizeof path, "%s/%s", src, e->d_name);
    unsigned char *bytes = at_read_file(path, &len);
    assert_non_null(bytes);
    snprintf(path, sizeof path, "%s/%s", c->dir, e->d_name);
    at_write_file(path, bytes, len);
    at_free(bytes);
  }
  closedir(d);
}

static void remove_whole_copy(copy_all *c) {
  char path[600];
  DIR *d = opendir(c->dir);
  if (!d) return;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    if (e->d_name[0] == '.') continue;
    snprintf(path, sizeof path, "%s/%s", c->dir, e->d_name);
    unlink(path);
  }
  closedir(d);
  rmdir(c->dir);
}

/* Replaces the first `from` in the copy's file by `to`; fails the test if there is none. */
static void edit_file(const copy_all *c, const char *file, const char *from, const char *to) {
  char path[600];
  size_t len;
  snprintf(path, sizeof path, "%s/%s", c->dir, file);
  unsigned char *text = at_read_file(path, &len);
  assert_non_null(text);
  const char *hit = strstr((const char *)text, from);
  if (!hit) fail_msg("%s has no %s", path, from);
  size_t pre = (size_t)(hit - (const char *)text), fl = strlen(from), tl = strlen(to);
  char *buf = at_malloc(len - fl + tl + 1);
  memcpy(buf, text, pre);
  memcpy(buf + pre, to, tl);
  memcpy(buf + pre + tl, hit + fl, len - pre - fl);
  at_write_file(path, buf, len - fl + tl);
  at_free(buf);
  at_free(text);
}

static void load_named(const char *name, at_golden *g) {
  char dir[2048], err[512];
  snprintf(dir, sizeof dir, "%s/%s", at_golden_dir(), name);
  if (access(dir, F_OK) != 0) at_skip("no golden case %s", dir);
  if (at_golden_load(dir, g, err, sizeof err) != 0) fail_msg("%s", err);
}

static void paged_case_loads_its_table_and_used_lengths(at_backend *b) {
  (void)b;
  at_golden g;
  load_named("paged_p16_varlen_q", &g);
  assert_int_equal(g.varlen, 1);
  assert_int_equal(g.page_size, 16);
  assert_int_equal(g.max_pages, 3);
  assert_int_equal(g.num_pages, 11);
  assert_int_equal(g.total_k, 11 * 16);
  assert_null(g.params.cu_seqlens_k);
  assert_non_null(g.params.block_table);
  assert_int_equal(g.params.block_table->shape[0], 4);
  assert_int_equal(g.params.block_table->shape[1], 3);
  assert_int_equal(g.params.block_table->dtype, ATTN_I32);
  assert_non_null(g.params.seqused_k);
  assert_int_equal(((const int32_t *)g.params.seqused_k->data)[3], 48);
  assert_null(g.params.k_new);
  /* A KV cache is forward only. */
  assert_null(g.dout);
  assert_null(g.dq);
  at_golden_free(&g);
}

static void append_case_loads_new_rows_and_expected_cache(at_backend *b) {
  (void)b;
  at_golden g;
  load_named("kvcache_append_causal", &g);
  assert_int_equal(g.seqlen_new, 3);
  assert_non_null(g.params.k_new);
  assert_non_null(g.params.v_new);
  assert_int_equal(g.params.k_new->shape[1], 3);
  assert_non_null(g.k_out);
  assert_non_null(g.v_out);
  assert_int_equal(g.seqused_k[1], 21);
  assert_null(g.params.block_table);
  at_golden_free(&g);
}

static void bias_and_sinks_case_loads_its_terms(at_backend *b) {
  (void)b;
  at_golden g;
  load_named("sinks_bias_gqa_backward", &g);
  assert_int_equal(g.bias_dtype, ATTN_BF16);
  assert_int_equal(g.bias_shape[0], 2);
  assert_int_equal(g.bias_shape[1], 1);
  assert_int_equal(g.bias_shape[2], 1);
  assert_int_equal(g.bias_shape[3], 20);
  assert_non_null(g.params.bias);
  assert_int_equal(g.params.bias->dtype, ATTN_BF16);
  assert_non_null(g.params.sinks);
  assert_true(g.sinks[0] == 1.5f && g.sinks[3] == 3.0f);
  assert_non_null(g.dbias);
  assert_non_null(g.dsinks);
  assert_true(isfinite(g.peer_dbias) && isfinite(g.peer_dsinks));
  assert_null(g.params.dbias); /* the checker's to set */
  at_golden_free(&g);
  /* Without a feature, its fields stay off. */
  load_named("tiny", &g);
  assert_null(g.params.bias);
  assert_null(g.params.sinks);
  assert_null(g.params.seqused_k);
  assert_int_equal(g.page_size, 0);
  assert_true(isnan(g.peer_dbias));
  at_golden_free(&g);
}

static void a_feature_without_its_file_is_refused_naming_it(at_backend *b) {
  (void)b;
  const struct {
    const char *name, *file;
  } cases[] = {{"kvcache_append_causal", "k_out.npy"},
               {"kvcache_append_causal", "v_new.npy"},
               {"bias_full_f32", "bias.npy"}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    copy_all c;
    copy_whole_case(&c, cases[i].name);
    char path[600], err[512] = "";
    snprintf(path, sizeof path, "%s/%s", c.dir, cases[i].file);
    unlink(path);
    at_golden g;
    if (at_golden_load(c.dir, &g, err, sizeof err) == 0)
      fail_msg("%s without %s accepted", cases[i].name, cases[i].file);
    if (!strstr(err, cases[i].file))
      fail_msg("the message should name %s: %s", cases[i].file, err);
    remove_whole_copy(&c);
  }
}

static void a_cache_case_with_gradients_is_refused(at_backend *b) {
  (void)b;
  copy_all c;
  copy_whole_case(&c, "kvcache_decode");
  char src[600], dst[600], err[512] = "";
  size_t len;
  snprintf(src, sizeof src, "%s/q.npy", c.dir);
  snprintf(dst, sizeof dst, "%s/do.npy", c.dir);
  unsigned char *q = at_read_file(src, &len);
  assert_non_null(q);
  at_write_file(dst, q, len);
  at_free(q);
  at_golden g;
  if (at_golden_load(c.dir, &g, err, sizeof err) == 0)
    fail_msg("a KV-cache case with do.npy was accepted");
  if (!strstr(err, "forward only")) fail_msg("the message should say why: %s", err);
  remove_whole_copy(&c);
}

static void bad_feature_values_are_refused_with_the_key(at_backend *b) {
  (void)b;
  const struct {
    const char *name, *from, *to, *key;
  } edits[] = {
      {"kvcache_decode", "\"seqused_k\": [\n  17,", "\"seqused_k\": [\n  -1,", "seqused_k"},
      {"kvcache_append_causal", "\"seqlen_new\": 3", "\"seqlen_new\": -3", "seqlen_new"},
      {"paged_p1", "\"max_pages\": 20", "\"max_pages\": 19", "block_table"},
      {"paged_p1", "\"page_size\": 1", "\"page_size\": 0", "page_size"},
      {"bias_full_f32", "\"bias_dtype\": \"f32\"", "\"bias_dtype\": \"f64\"", "bias_dtype"},
      {"bias_full_f32", "\"bias_shape\": [\n  2,", "\"bias_shape\": [\n  3,", "bias_shape"},
      {"sinks_causal", "\"sinks\": [\n  -1.0,", "\"sinks\": [\n  -1.0, 1,", "sinks"},
  };
  for (size_t i = 0; i < sizeof edits / sizeof edits[0]; i++) {
    copy_all c;
    copy_whole_case(&c, edits[i].name);
    edit_file(&c, "case.json", edits[i].from, edits[i].to);
    char err[512] = "";
    at_golden g;
    if (at_golden_load(c.dir, &g, err, sizeof err) == 0)
      fail_msg("%s with %s accepted", edits[i].name, edits[i].to);
    if (!strstr(err, edits[i].key)) fail_msg("the message should name %s: %s", edits[i].key, err);
    remove_whole_copy(&c);
  }
}

/* The reference check is a check: with a field changed, the case's answers
 * no longer hold, so each feature is passed through and not ignored. */
static void reference_check_fails_when_a_feature_changes(at_backend *b) {
  (void)b;
  const struct {
    const char *name, *from, *to;
    int backward;
  } edits[] = {
      {"kvcache_decode", "\"seqused_k\": [\n  17,", "\"seqused_k\": [\n  16,", 0},
      {"kvcache_append_causal", "\"seqused_k\": [\n  5,", "\"seqused_k\": [\n  4,", 0},
      {"paged_p3_append", "\"block_table\": [\n  [\n   0,", "\"block_table\": [\n  [\n   11,", 0},
      {"sinks_causal", "\"sinks\": [\n  -1.0,", "\"sinks\": [\n  -1.5,", 0},
      {"sinks_causal", "\"sinks\": [\n  -1.0,", "\"sinks\": [\n  -1.5,", 1},
      {"bias_full_f32", "\"seed\": 207", "\"seed\": 207, \"sinks\": [0.0, 0.0]", 0},
  };
  attn_context *ctx = NULL;
  assert_int_equal(attn_context_create("cpu", &ctx), ATTN_OK);
  for (size_t i = 0; i < sizeof edits / sizeof edits[0]; i++) {
    copy_all c;
    copy_whole_case(&c, edits[i].name);
    char err[512] = "";
    at_golden g;
    at_golden_report rep;
    /* Unchanged, it passes. */
    if (at_golden_load(c.dir, &g, err, sizeof err) != 0) fail_msg("%s", err);
    assert_int_equal(at_golden_run_reference(ctx, &g, !edits[i].backward, &rep), ATTN_OK);
    assert_true(rep.pass);
    at_golden_free(&g);
    edit_file(&c, "case.json", edits[i].from, edits[i].to);
    if (at_golden_load(c.dir, &g, err, sizeof err) != 0) fail_msg("%s", err);
    assert_int_equal(at_golden_run_reference(ctx, &g, !edits[i].backward, &rep), ATTN_OK);
    if (rep.pass) fail_msg("%s with %s still passes", edits[i].name, edits[i].to);
    at_golden_free(&g);
    remove_whole_copy(&c);
  }
  attn_context_free(ctx);
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
      AT_TEST(paged_case_loads_its_table_and_used_lengths),
      AT_TEST(append_case_loads_new_rows_and_expected_cache),
      AT_TEST(bias_and_sinks_case_loads_its_terms),
      AT_TEST(a_feature_without_its_file_is_refused_naming_it),
      AT_TEST(a_cache_case_with_gradients_is_refused),
      AT_TEST(bad_feature_values_are_refused_with_the_key),
      AT_TEST(reference_check_fails_when_a_feature_changes),
  };
  return at_main(argc, argv, "goldenio", NULL, 0, common, sizeof common / sizeof common[0]);
}
