/*
 * attn check: run golden case folders (the test kit's reader and checker) on
 * the selected backend and print each output's error beside its bound.
 */
#include "cli.h"
#include "golden.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The case folders of every argument, listed before anything runs so that a
 * missing folder is said at once. */
typedef struct case_list {
  char **dirs;
  int n;
} case_list;

/* Prints a case that cannot be loaded on one line of stderr: which case and why. */
static void cannot_load(const char *dir, const char *why) {
  if (!strncmp(why, dir, strlen(dir)))
    cli_complain("%s", why); /* the reader's sentence starts with the path already */
  else
    cli_complain("%s: %s", dir, why);
}

int cmd_check(int argc, char **argv) {
  int forward_only = 0, tf32 = 0, nargs = 0;
  const char *backend = NULL;
  const char **roots = calloc((size_t)argc + 1, sizeof *roots);
  if (!roots) return cli_out_of_host_memory();
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      printf(
          "usage: attn check [--forward-only] [--tf32] [--backend SPEC] [DIR...]\n"
          "Runs each golden case (a folder with case.json and .npy files, or a folder of such\n"
          "folders) on the selected backend and prints each output's error beside the bound of\n"
          "the golden README's tolerance rule. A case that cannot be read is named on stderr and\n"
          "the others still run. Without DIR, the repository's cases:\n"
          "  %s\n"
          "Each forward case runs with num_splits 0, 1 and 3. A case the backend declines\n"
          "(attn_supports) is skipped, with its reason, and counted apart: never as passed.\n"
          "--tf32 allows TF32 (ATTN_ALLOW_TF32): f32 cases are held to the README's TF32 rule,\n"
          "and the column tf32 gives what rounding to TF32 alone costs each output (the\n"
          "reference computed as TF32), which joins the peer figure in the bound.\n"
          "Exit status: 0 no case failed, 1 a case failed or could not run, 2 a wrong option,\n"
          "a missing folder or a case that cannot be read.\n",
          ATTN_DEFAULT_GOLDEN_DIR);
      free(roots);
      return 0;
    } else if (!strcmp(argv[i], "--forward-only")) {
      forward_only = 1;
    } else if (!strcmp(argv[i], "--tf32")) {
      tf32 = 1;
    } else if (!strcmp(argv[i], "--backend")) {
      if (i + 1 >= argc || !*argv[i + 1]) {
        free(roots);
        return cli_complain("--backend needs a value (auto, cpu, opencl, cuda[:N])");
      }
      backend = argv[++i];
    } else if (argv[i][0] == '-') {
      free(roots);
      return cli_complain("unknown option \"%s\" (see attn check --help)", argv[i]);
    } else {
      roots[nargs++] = argv[i];
    }
  }
  if (!nargs) roots[nargs++] = ATTN_DEFAULT_GOLDEN_DIR;

  int bad = 0, ncases = 0;
  case_list *lists = calloc((size_t)nargs, sizeof *lists);
  if (!lists) {
    free(roots);
    return cli_out_of_host_memory();
  }
  for (int i = 0; i < nargs; i++) {
    char err[512];
    lists[i].n = at_golden_list(roots[i], &lists[i].dirs, err, sizeof err);
    if (lists[i].n < 0) {
      cli_complain("%s", err);
      lists[i].n = 0;
      bad++;
    } else if (lists[i].n == 0) {
      cli_complain("%s holds no case folder (a folder with case.json, or a folder of them)",
                   roots[i]);
      bad++;
    }
    ncases += lists[i].n;
  }

  attn_context *ctx = NULL;
  int status = 0, cases = 0, failed = 0, skipped = 0, header = 0;
  if (ncases) {
    int rc = attn_context_create(backend, &ctx);
    if (rc) status = cli_fail_ctx(ctx, rc, "cannot create a context");
  }
  for (int i = 0; i < nargs && ncases && !status; i++)
    for (int c = 0; c < lists[i].n; c++) {
      const char *dir = lists[i].dirs[c];
      char err[512];
      at_golden g;
      if (at_golden_load(dir, &g, err, sizeof err) != 0) {
        cannot_load(dir, err);
        bad++;
        continue;
      }
      /* The table starts with the first case that loads: a run where none
       * does prints nothing that looks like a result. */
      if (!header) {
        attn_device_info info;
        attn_context_device_info(ctx, &info);
        printf("backend %s:%d (%s)\n", attn_backend_name(info.backend), info.index, info.name);
        printf("%-26s %-4s %-6s %12s %12s %8s%s  %s\n", "case", "type", "out", "max|err|", "bound",
               "err/peer", tf32 ? "         tf32" : "", "result");
        header = 1;
      }
      cases++;
      if (tf32) g.params.flags |= ATTN_ALLOW_TF32;
      at_golden_report rep;
      at_golden_run(ctx, &g, forward_only, &rep);
      for (int r = 0; r < rep.n; r++) {
        const at_golden_result *x = &rep.r[r];
        char ratio[32] = "-";
        if (isfinite(x->peer) && x->peer > 0)
          snprintf(ratio, sizeof ratio, "%.2f", x->max_err / x->peer);
        printf("%-26s %-4s %-6s %12.4g %12.4g %8s", r == 0 ? g.name : "",
               r == 0 ? attn_dtype_name(g.dtype) : "", x->output, x->max_err, x->bound, ratio);
        if (tf32) printf(" %12.4g", x->tf32);
        printf("  %s", x->pass ? "ok" : "FAIL");
        /* The forward runs once per num_splits; a failure says which. */
        if (!x->pass && x->num_splits >= 0) printf(" (num_splits %d)", x->num_splits);
        printf("\n");
      }
      /* A case the backend declines is neither passed nor failed. */
      if (rep.skipped) {
        printf("%-26s %-4s skipped: %s\n", rep.n ? "" : g.name,
               rep.n ? "" : attn_dtype_name(g.dtype), rep.message);
        int bad_result = 0;
        for (int r = 0; r < rep.n; r++)
          bad_result |= !rep.r[r].pass;
        if (bad_result)
          failed++;
        else
          skipped++;
      } else {
        if (rep.status != ATTN_OK)
          printf("%-26s %-4s cannot run: %s (%s)  FAIL\n", rep.n ? "" : g.name,
                 rep.n ? "" : attn_dtype_name(g.dtype), rep.message, attn_status_name(rep.status));
        if (!rep.pass) failed++;
      }
      at_golden_free(&g);
    }
  if (header) {
    printf("%d case%s, %d failed", cases, cases == 1 ? "" : "s", failed);
    if (skipped) printf(", %d skipped (declined by the backend)", skipped);
    if (bad) printf(", %d could not be read", bad);
    printf(" (%s%s)\n", forward_only ? "forward" : "forward and backward",
           tf32 ? ", TF32 allowed" : "");
  }
  for (int i = 0; i < nargs; i++)
    at_golden_list_free(lists[i].dirs, lists[i].n);
  free(lists);
  free(roots);
  attn_context_free(ctx);
  if (status) return status;
  return bad ? EXIT_USAGE : failed ? EXIT_FAILED : 0;
}
