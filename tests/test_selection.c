/*
 * Backend selection: attn_context_create()'s specification and the
 * ATTN_BACKEND environment variable. An explicit choice that cannot be met
 * fails with ATTN_EUNAVAILABLE and a message naming it; there is no silent
 * fallback. An unknown or malformed name is ATTN_EBACKEND, and the message
 * lists the valid values.
 */
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>

static const attn_backend gpu_kinds[2] = {ATTN_BACKEND_OPENCL, ATTN_BACKEND_CUDA};

/* What "auto" must give: CUDA, else an OpenCL GPU, else the CPU. */
static attn_backend expected_auto(void) {
  if (attn_device_count(ATTN_BACKEND_CUDA) > 0) return ATTN_BACKEND_CUDA;
  int n = attn_device_count(ATTN_BACKEND_OPENCL);
  for (int i = 0; i < n; i++) {
    attn_device_info info;
    if (attn_device_info_get(ATTN_BACKEND_OPENCL, i, &info) == ATTN_OK && info.is_gpu)
      return ATTN_BACKEND_OPENCL;
  }
  return ATTN_BACKEND_CPU;
}

/* Creates a context and expects `status`; returns it (freed by the caller). */
static attn_context *create(const char *spec, int status) {
  attn_context *ctx = NULL;
  int rc = attn_context_create(spec, &ctx);
  if (rc != status)
    fail_msg("attn_context_create(%s%s%s) with ATTN_BACKEND=%s: %s (%s), expected %s",
             spec ? "\"" : "", spec ? spec : "NULL", spec ? "\"" : "",
             getenv("ATTN_BACKEND") ? getenv("ATTN_BACKEND") : "(unset)", attn_status_name(rc),
             attn_errmsg(ctx), attn_status_name(status));
  assert_non_null(ctx); /* like sqlite3_open: a context even on failure */
  if (status != ATTN_OK && attn_errmsg(ctx)[0] == '\0')
    fail_msg("a failed attn_context_create leaves no message");
  return ctx;
}

/* ---------------------------------------------------------------------- */
/* Backend-independent                                                      */
/* ---------------------------------------------------------------------- */

/* What one thread saw of the device queries, per backend kind. */
typedef struct {
  int count[4];
  char why[4][512];
} seen_devices;

static void *query_devices(void *arg) {
  seen_devices *s = arg;
  for (int k = 0; k < 4; k++) {
    s->count[k] = attn_device_count((attn_backend)k);
    snprintf(s->why[k], sizeof s->why[k], "%s", attn_backend_unavailable_reason((attn_backend)k));
  }
  return NULL;
}

/* First in its process, so that the threads race for the first probe. */
static void threads_asking_at_once_get_the_same_answers(at_backend *b) {
  (void)b;
  enum { N = 8 };
  seen_devices seen[N], mine;
  pthread_t t[N];
  for (int i = 0; i < N; i++)
    assert_int_equal(pthread_create(&t[i], NULL, query_devices, &seen[i]), 0);
  for (int i = 0; i < N; i++)
    assert_int_equal(pthread_join(t[i], NULL), 0);
  query_devices(&mine);
  for (int i = 0; i < N; i++)
    for (int k = 1; k < 4; k++) {
      assert_int_equal(seen[i].count[k], mine.count[k]);
      assert_string_equal(seen[i].why[k], mine.why[k]);
    }
}

static void cpu_is_always_built_with_exactly_one_device(at_backend *b) {
  (void)b;
  assert_int_equal(attn_backend_compiled(ATTN_BACKEND_CPU), 1);
  assert_int_equal(attn_device_count(ATTN_BACKEND_CPU), 1);
  assert_string_equal(attn_backend_unavailable_reason(ATTN_BACKEND_CPU), "");
}

static void backend_names_are_the_spec_words(at_backend *b) {
  (void)b;
  assert_string_equal(attn_backend_name(ATTN_BACKEND_AUTO), "auto");
  assert_string_equal(attn_backend_name(ATTN_BACKEND_CPU), "cpu");
  assert_string_equal(attn_backend_name(ATTN_BACKEND_OPENCL), "opencl");
  assert_string_equal(attn_backend_name(ATTN_BACKEND_CUDA), "cuda");
}

static void status_names_and_messages_come_from_one_table(at_backend *b) {
  (void)b;
  assert_string_equal(attn_status_name(ATTN_OK), "ATTN_OK");
  assert_string_equal(attn_status_name(ATTN_EALIAS), "ATTN_EALIAS");
  assert_string_equal(attn_status_name(ATTN_EINTERNAL), "ATTN_EINTERNAL");
  assert_string_equal(attn_status_name(9999), "ATTN_UNKNOWN");
  assert_string_equal(attn_strerror(ATTN_OK), "success");
  assert_string_equal(attn_strerror(ATTN_EWINDOW), "a window bound is below -1");
}

static void env_auto_picks_cuda_then_an_opencl_gpu_then_the_cpu(at_backend *b) {
  (void)b;
  at_env_set("ATTN_BACKEND", "auto");
  attn_context *ctx = create(NULL, ATTN_OK);
  assert_int_equal(attn_context_backend(ctx), expected_auto());
  attn_context_free(ctx);
}

static void unset_env_means_auto(at_backend *b) {
  (void)b;
  at_env_set("ATTN_BACKEND", NULL);
  attn_context *ctx = create(NULL, ATTN_OK);
  assert_int_equal(attn_context_backend(ctx), expected_auto());
  attn_context_free(ctx);
  ctx = create("", ATTN_OK);
  assert_int_equal(attn_context_backend(ctx), expected_auto());
  attn_context_free(ctx);
}

static void env_cpu_gives_the_cpu(at_backend *b) {
  (void)b;
  const char *specs[] = {"cpu", "cpu:0"};
  for (int i = 0; i < 2; i++) {
    at_env_set("ATTN_BACKEND", specs[i]);
    attn_context *ctx = create(NULL, ATTN_OK);
    assert_int_equal(attn_context_backend(ctx), ATTN_BACKEND_CPU);
    assert_int_equal(attn_context_device(ctx), 0);
    attn_context_free(ctx);
  }
}

static void env_cpu_device_7_is_unavailable_and_names_it(at_backend *b) {
  (void)b;
  at_env_set("ATTN_BACKEND", "cpu:7");
  attn_context *ctx = create(NULL, ATTN_EUNAVAILABLE);
  const char *msg = attn_errmsg(ctx);
  if (!at_mentions(msg, "7") || !strstr(msg, "cpu"))
    fail_msg("the message should name cpu and device 7: \"%s\"", msg);
  attn_context_free(ctx);
}

static void unknown_name_is_ebackend_listing_the_valid_ones(at_backend *b) {
  (void)b;
  at_env_set("ATTN_BACKEND", "nonsense");
  attn_context *ctx = create(NULL, ATTN_EBACKEND);
  const char *msg = attn_errmsg(ctx);
  const char *words[] = {"nonsense", "auto", "cpu", "opencl", "cuda"};
  for (int i = 0; i < 5; i++)
    if (!at_mentions(msg, words[i])) fail_msg("the message lacks \"%s\": \"%s\"", words[i], msg);
  attn_context_free(ctx);
}

static void malformed_device_index_is_ebackend(at_backend *b) {
  (void)b;
  const char *specs[] = {"cuda:x", "cpu:", "cpu:-1", "cpu:0x", "cpu:1:2", "cpu: 0"};
  for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++) {
    at_env_set("ATTN_BACKEND", specs[i]);
    attn_context *ctx = create(NULL, ATTN_EBACKEND);
    if (!strstr(attn_errmsg(ctx), specs[i]))
      fail_msg("the message should quote \"%s\": \"%s\"", specs[i], attn_errmsg(ctx));
    attn_context_free(ctx);
    ctx = create(specs[i], ATTN_EBACKEND);
    attn_context_free(ctx);
  }
}

/* A value of any length is read whole, never cut to another one:
 * "cpu:000...0x" is malformed however long, and "cpu:000...0" is device 0. */
static void env_of_any_length_is_read_whole(at_backend *b) {
  (void)b;
  char spec[400];
  memset(spec, '0', sizeof spec);
  memcpy(spec, "cpu:", 4);
  spec[sizeof spec - 2] = 'x';
  spec[sizeof spec - 1] = '\0';
  at_env_set("ATTN_BACKEND", spec);
  attn_context_free(create(NULL, ATTN_EBACKEND));
  spec[sizeof spec - 2] = '0';
  at_env_set("ATTN_BACKEND", spec);
  attn_context_free(create(NULL, ATTN_OK));
  at_env_set("ATTN_BACKEND", NULL);
}

static void explicit_spec_beats_the_env(at_backend *b) {
  (void)b;
  at_env_set("ATTN_BACKEND", "nonsense");
  attn_context *ctx = create("cpu", ATTN_OK);
  assert_int_equal(attn_context_backend(ctx), ATTN_BACKEND_CPU);
  attn_context_free(ctx);
  at_env_set("ATTN_BACKEND", "cpu");
  ctx = create("nonsense", ATTN_EBACKEND);
  attn_context_free(ctx);
}

static void explicit_choice_of_an_absent_backend_is_unavailable_and_named(at_backend *b) {
  (void)b;
  int tried = 0;
  at_env_set("ATTN_BACKEND", NULL);
  for (int i = 0; i < 2; i++) {
    attn_backend kind = gpu_kinds[i];
    if (attn_device_count(kind) > 0) continue;
    const char *name = attn_backend_name(kind);
    if (attn_backend_unavailable_reason(kind)[0] == '\0')
      fail_msg("%s has no device but gives no reason", name);
    char spec[32];
    const char *forms[] = {"%s", "%s:0"};
    for (int f = 0; f < 2; f++) {
      snprintf(spec, sizeof spec, forms[f], name);
      attn_context *ctx = create(spec, ATTN_EUNAVAILABLE);
      if (!at_mentions(attn_errmsg(ctx), name))
        fail_msg("the message for \"%s\" should name %s: \"%s\"", spec, name, attn_errmsg(ctx));
      attn_context_free(ctx);
      at_env_set("ATTN_BACKEND", spec);
      ctx = create(NULL, ATTN_EUNAVAILABLE); /* the same through the env */
      attn_context_free(ctx);
      at_env_set("ATTN_BACKEND", NULL);
    }
    tried++;
  }
  if (!tried) at_skip("OpenCL and CUDA both have devices here");
}

static void failed_context_answers_only_with_its_message(at_backend *b) {
  (void)b;
  attn_context *ctx = create("nonsense", ATTN_EBACKEND);
  attn_params p;
  attn_params_init(&p);
  float x[8] = {0};
  attn_tensor t = attn_tensor_bshd(x, ATTN_F32, 1, 1, 1, 8);
  assert_int_equal(attn_context_backend(ctx), ATTN_BACKEND_AUTO);
  assert_int_equal(attn_context_device(ctx), -1);
  int rc = attn_forward(ctx, &p, &t, &t, &t, &t, NULL);
  assert_int_not_equal(rc, ATTN_OK);
  assert_true(attn_errmsg(ctx)[0] != '\0');
  attn_context_free(ctx);
  attn_context_free(NULL); /* a no-op */
}

static void backend_that_was_not_built_has_no_device_and_says_so(at_backend *b) {
  (void)b;
  int tried = 0;
  for (int i = 0; i < 2; i++) {
    if (attn_backend_compiled(gpu_kinds[i])) continue;
    assert_int_equal(attn_device_count(gpu_kinds[i]), 0);
    const char *why = attn_backend_unavailable_reason(gpu_kinds[i]);
    if (!strstr(why, attn_backend_name(gpu_kinds[i])))
      fail_msg("the reason should name %s: \"%s\"", attn_backend_name(gpu_kinds[i]), why);
    tried++;
  }
  if (!tried) at_skip("every backend was built");
}

/* ---------------------------------------------------------------------- */
/* Per backend                                                              */
/* ---------------------------------------------------------------------- */

static void env_name_selects_the_backend(at_backend *b) {
  at_env_set("ATTN_BACKEND", b->name);
  attn_context *ctx = create(NULL, ATTN_OK);
  assert_int_equal(attn_context_backend(ctx), b->kind);
  assert_true(attn_context_device(ctx) >= 0);
  assert_true(attn_context_device(ctx) < attn_device_count(b->kind));
  attn_context_free(ctx);
}

static void spec_with_index_0_selects_device_0(at_backend *b) {
  char spec[32];
  snprintf(spec, sizeof spec, "%s:0", b->name);
  attn_context *ctx = create(spec, ATTN_OK);
  assert_int_equal(attn_context_backend(ctx), b->kind);
  assert_int_equal(attn_context_device(ctx), 0);
  attn_context_free(ctx);
}

static void device_index_past_the_last_is_unavailable(at_backend *b) {
  char spec[32];
  int n = attn_device_count(b->kind);
  snprintf(spec, sizeof spec, "%s:%d", b->name, n);
  attn_context *ctx = create(spec, ATTN_EUNAVAILABLE);
  char num[16];
  snprintf(num, sizeof num, "%d", n);
  if (!at_mentions(attn_errmsg(ctx), num))
    fail_msg("the message should name device %d: \"%s\"", n, attn_errmsg(ctx));
  attn_context_free(ctx);
}

static void context_reports_its_backend_and_device(at_backend *b) {
  attn_device_info info;
  assert_int_equal(attn_context_backend(b->ctx), b->kind);
  assert_int_equal(attn_context_device_info(b->ctx, &info), ATTN_OK);
  assert_int_equal(info.backend, b->kind);
  assert_int_equal(info.index, attn_context_device(b->ctx));
  assert_true(info.name[0] != '\0');
  assert_true(info.compute_units > 0);
  if (b->kind == ATTN_BACKEND_CUDA) assert_int_equal(info.is_gpu, 1);
  if (b->kind == ATTN_BACKEND_CPU) assert_int_equal(info.is_gpu, 0);
}

static void every_device_describes_itself(at_backend *b) {
  int n = attn_device_count(b->kind);
  for (int i = 0; i < n; i++) {
    attn_device_info info;
    assert_int_equal(attn_device_info_get(b->kind, i, &info), ATTN_OK);
    assert_int_equal(info.index, i);
    assert_int_equal(info.backend, b->kind);
    assert_true(info.name[0] != '\0');
  }
  attn_device_info info;
  assert_int_not_equal(attn_device_info_get(b->kind, n, &info), ATTN_OK);
  assert_string_equal(attn_backend_unavailable_reason(b->kind), "");
}

int main(int argc, char **argv) {
  const at_test common[] = {
      AT_TEST(threads_asking_at_once_get_the_same_answers),
      AT_TEST(cpu_is_always_built_with_exactly_one_device),
      AT_TEST(backend_names_are_the_spec_words),
      AT_TEST(status_names_and_messages_come_from_one_table),
      AT_TEST(env_auto_picks_cuda_then_an_opencl_gpu_then_the_cpu),
      AT_TEST(unset_env_means_auto),
      AT_TEST(env_cpu_gives_the_cpu),
      AT_TEST(env_cpu_device_7_is_unavailable_and_names_it),
      AT_TEST(unknown_name_is_ebackend_listing_the_valid_ones),
      AT_TEST(malformed_device_index_is_ebackend),
      AT_TEST(env_of_any_length_is_read_whole),
      AT_TEST(explicit_spec_beats_the_env),
      AT_TEST(explicit_choice_of_an_absent_backend_is_unavailable_and_named),
      AT_TEST(failed_context_answers_only_with_its_message),
      AT_TEST(backend_that_was_not_built_has_no_device_and_says_so),
  };
  const at_test tests[] = {
      AT_TEST(env_name_selects_the_backend),
      AT_TEST(spec_with_index_0_selects_device_0),
      AT_TEST(device_index_past_the_last_is_unavailable),
      AT_TEST(context_reports_its_backend_and_device),
      AT_TEST(every_device_describes_itself),
  };
  return at_main(argc, argv, "selection", tests, sizeof tests / sizeof tests[0], common,
                 sizeof common / sizeof common[0]);
}
