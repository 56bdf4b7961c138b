/*
 * Golden cases: every case folder under ATTN_GOLDEN_DIR, forward and backward,
 * on every backend, held to the golden README's tolerance rule (F times the
 * peer implementation's error). The cases are the project's external ground
 * truth, computed in float64 by another implementation.
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
} golden_case;

static void print_report(const at_golden *g, const at_golden_report *rep, int from, int to) {
  for (int i = from; i < to && i < rep->n; i++) {
    const at_golden_result *r = &rep->r[i];
    /* The README's F achieved: max_err / peer (NaN where no peer figure). */
    double F = r->ratio * (r->output[0] == 'd' ? 3.0 : 2.0);
    print_message("  %-14s %-3s max_err %.3g bound %.3g F %.2f %s\n", g->name, r->output,
                  r->max_err, r->bound, F, r->pass ? "ok" : "FAIL");
  }
}

/* Runs one case; forward checks o and lse, backward dq, dk and dv. */
static void golden_case_matches_within_tolerance(at_backend *b) {
  const golden_case *c = at_arg();
  at_golden g;
  char err[1024];
  if (at_golden_load(c->dir, &g, err, sizeof err) != 0) fail_msg("%s", err);
  if (c->backward && !g.dq) {
    at_golden_free(&g);
    at_skip("%s has no dq/dk/dv references", c->dir);
  }
  at_golden_report rep;
  int st = at_golden_run(b->ctx, &g, !c->backward, &rep);
  if (st == ATTN_EUNSUPPORTED) {
    at_golden_free(&g);
    /* A backend may refuse a combination, with a reason; never compute it wrong. */
    assert_true(rep.message[0] != '\0');
    at_skip("%s refuses %s: %s", b->name, c->dir, rep.message);
  }
  if (st != ATTN_OK) {
    at_golden_free(&g);
    fail_msg("%s: %s: %s", c->dir, attn_status_name(st), rep.message);
  }
  int from = c->backward ? 2 : 0, to = c->backward ? rep.n : 2;
  print_report(&g, &rep, from, to);
  assert_int_equal(rep.n, c->backward ? 5 : 2);
  for (int i = from; i < to; i++)
    if (!rep.r[i].pass) {
      char msg[512];
      snprintf(msg, sizeof msg, "%s: %s max error %.3g exceeds the bound %.3g", g.name,
               rep.r[i].output, rep.r[i].max_err, rep.r[i].bound);
      at_golden_free(&g);
      fail_msg("%s", msg);
    }
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
  golden_case *cases = calloc((size_t)n * 2, sizeof *cases);
  at_test *tests = calloc((size_t)n * 2, sizeof *tests);
  char **names = calloc((size_t)n * 2, sizeof *names);
  if (!cases || !tests || !names) return 1;
  for (int i = 0; i < 2 * n; i++) {
    const char *dir = dirs[i / 2];
    const char *base = strrchr(dir, '/');
    base = base ? base + 1 : dir;
    int bwd = i % 2;
    size_t len = strlen(base) + sizeof "_backward_matches_within_tolerance";
    names[i] = malloc(len);
    if (!names[i]) return 1;
    snprintf(names[i], len, "%s_%s_matches_within_tolerance", base, bwd ? "backward" : "forward");
    cases[i].dir = dirs[i / 2];
    cases[i].backward = bwd;
    tests[i].name = names[i];
    tests[i].fn = golden_case_matches_within_tolerance;
    tests[i].arg = &cases[i];
  }
  int rc = at_main(argc, argv, "golden", tests, (size_t)n * 2, NULL, 0);
  for (int i = 0; i < 2 * n; i++)
    free(names[i]);
  free(names);
  free(tests);
  free(cases);
  at_golden_list_free(dirs, n);
  return rc;
}
