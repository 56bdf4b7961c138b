/*
 * Golden cases: every case folder under ATTN_GOLDEN_DIR, forward and backward,
 * on every backend, held to the golden README's tolerance rule (F times the
 * peer implementation's error), the forward once per num_splits of
 * at_golden_splits; a backend that declines a case is skipped with its
 * reason. Each f32 case runs again with ATTN_ALLOW_TF32, held to the README's
 * TF32 rule (CUDA then takes the TF32 tensor cores; the other backends stay
 * float32, which the rule allows). The cases are the project's external
 * ground truth, computed in float64 by another implementation; the common
 * tests hold the test kit's own reference to them, backend independent.
 */
#include "golden.h"
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct golden_case {
  char *dir;
  int backward;
  int tf32; /* run with ATTN_ALLOW_TF32 (f32 cases) */
} golden_case;

static void print_report(const at_golden *g, const at_golden_report *rep, int from, int to) {
  for (int i = from; i < to && i < rep->n; i++) {
    const at_golden_result *r = &rep->r[i];
    /* The README's F achieved: max_err / peer (NaN where no peer figure). */
    double F = r->ratio * (r->output[0] == 'd' ? 3.0 : 2.0);
    char splits[32] = "";
    if (r->num_splits >= 0) snprintf(splits, sizeof splits, " (num_splits %d)", r->num_splits);
    print_message("  %-26s %-6s max_err %.3g bound %.3g F %.2f%s %s\n", g->name, r->output,
                  r->max_err, r->bound, F, splits, r->pass ? "ok" : "FAIL");
  }
}

/* Fails the test with the first result of [from, to) that is out of bounds. */
static void expect_within(at_golden *g, const at_golden_report *rep, int from, int to,
                          const char *who) {
  for (int i = from; i < to; i++)
    if (!rep->r[i].pass) {
      char msg[512];
      snprintf(msg, sizeof msg, "%s: %s: %s max error %.3g exceeds the bound %.3g", who, g->name,
               rep->r[i].output, rep->r[i].max_err, rep->r[i].bound);
      at_golden_free(g);
      fail_msg("%s", msg);
    }
}

static void load_case(const golden_case *c, at_golden *g) {
  char err[1024];
  if (at_golden_load(c->dir, g, err, sizeof err) != 0) fail_msg("%s", err);
  if (c->tf32) g->params.flags |= ATTN_ALLOW_TF32;
  if (c->backward && !g->dq) {
    at_golden_free(g);
    at_skip("%s has no dq/dk/dv references", c->dir);
  }
}

/* Runs one case; forward checks o and lse (and the cache after an append)
 * for every num_splits of at_golden_splits, backward dq, dk, dv (and dbias,
 * dsinks). */
static void golden_case_matches_within_tolerance(at_backend *b) {
  const golden_case *c = at_arg();
  at_golden g;
  load_case(c, &g);
  at_golden_report rep;
  int st = at_golden_run(b->ctx, &g, !c->backward, &rep);
  if (rep.skipped) {
    at_golden_free(&g);
    /* A backend may decline a combination, with a reason; never compute it wrong. */
    assert_int_equal(st, ATTN_EUNSUPPORTED);
    assert_true(rep.message[0] != '\0');
    at_skip("%s: %s", b->name, rep.message);
  }
  if (st != ATTN_OK) {
    at_golden_free(&g);
    fail_msg("%s: %s: %s", c->dir, attn_status_name(st), rep.message);
  }
  int from = c->backward ? rep.n_forward : 0, to = c->backward ? rep.n : rep.n_forward;
  print_report(&g, &rep, from, to);
  assert_true(rep.n_forward >= 2);
  if (c->backward) assert_true(rep.n >= rep.n_forward + 3);
  expect_within(&g, &rep, from, to, b->name);
  at_golden_free(&g);
}

/* The test kit's float64 reference reproduces the case within the same
 * rule: the golden cases (NumPy) and testkit/ref.c (C) agree on the
 * semantics, whatever any backend does. */
static void golden_case_reference_matches_within_tolerance(at_backend *b) {
  (void)b;
  const golden_case *c = at_arg();
  at_golden g;
  load_case(c, &g);
  attn_context *ctx = NULL;
  if (attn_context_create("cpu", &ctx) != ATTN_OK) {
    attn_context_free(ctx);
    at_golden_free(&g);
    fail_msg("no cpu context to carry the reference's messages");
  }
  at_golden_report rep;
  int st = at_golden_run_reference(ctx, &g, !c->backward, &rep);
  attn_context_free(ctx);
  if (st != ATTN_OK) {
    at_golden_free(&g);
    fail_msg("%s: %s: %s", c->dir, attn_status_name(st), rep.message);
  }
  int from = c->backward ? rep.n_forward : 0, to = c->backward ? rep.n : rep.n_forward;
  print_report(&g, &rep, from, to);
  expect_within(&g, &rep, from, to, "reference");
  at_golden_free(&g);
}

static char g_dir_error[1100];

static void golden_folder_holds_cases(at_backend *b) {
  (void)b;
  fail_msg("%s", g_dir_error);
}

int main(int argc, char **argv) {
  char err[1024];
  char **dirs = NULL;
  int n = at_golden_list(at_golden_dir(), &dirs, err, sizeof err);
  if (n <= 0) {
    snprintf(g_dir_error, sizeof g_dir_error, "no golden cases in %s: %s", at_golden_dir(),
             n < 0 ? err : "no folder with a case.json");
    at_test t[] = {AT_TEST(golden_folder_holds_cases)};
    return at_main(argc, argv, "golden", t, 1, NULL, 0);
  }
  /* Per backend: each case forward and backward, and again with TF32 allowed
   * where the case is f32; common: the reference on each. */
  golden_case *cases = calloc((size_t)n * 4, sizeof *cases);
  at_test *tests = calloc((size_t)n * 4, sizeof *tests);
  at_test *common = calloc((size_t)n * 2, sizeof *common);
  char **names = calloc((size_t)n * 6, sizeof *names);
  if (!cases || !tests || !common || !names) return 1;
  size_t ntests = 0;
  for (int i = 0; i < 4 * n; i++) {
    const char *dir = dirs[i / 4];
    const char *base = strrchr(dir, '/');
    base = base ? base + 1 : dir;
    int bwd = i % 2, tf32 = i / 2 % 2;
    if (tf32) {
      /* A case that cannot be loaded fails in its plain tests. */
      at_golden g;
      if (at_golden_load(dir, &g, err, sizeof err) != 0) continue;
      attn_dtype dt = g.dtype;
      at_golden_free(&g);
      if (dt != ATTN_F32) continue;
    }
    size_t len = strlen(base) + sizeof "_reference_backward_tf32_matches_within_tolerance";
    char *name = names[ntests] = malloc(len);
    if (!name) return 1;
    snprintf(name, len, "%s_%s%s_matches_within_tolerance", base, bwd ? "backward" : "forward",
             tf32 ? "_tf32" : "");
    cases[ntests].dir = dirs[i / 4];
    cases[ntests].backward = bwd;
    cases[ntests].tf32 = tf32;
    tests[ntests].name = name;
    tests[ntests].fn = golden_case_matches_within_tolerance;
    tests[ntests].arg = &cases[ntests];
    if (!tf32) {
      int c = i / 4 * 2 + bwd;
      names[4 * n + c] = malloc(len);
      if (!names[4 * n + c]) return 1;
      snprintf(names[4 * n + c], len, "%s_reference_%s_matches_within_tolerance", base,
               bwd ? "backward" : "forward");
      common[c].name = names[4 * n + c];
      common[c].fn = golden_case_reference_matches_within_tolerance;
      common[c].arg = &cases[ntests];
    }
    ntests++;
  }
  int rc = at_main(argc, argv, "golden", tests, ntests, common, (size_t)n * 2);
  for (int i = 0; i < 6 * n; i++)
    free(names[i]);
  free(names);
  free(common);
  free(tests);
  free(cases);
  at_golden_list_free(dirs, n);
  return rc;
}
