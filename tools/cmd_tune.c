/*
 * attn tune: attn_tune over dtypes and head dims on the selected device.
 * The library logs each configuration it measures and the one it keeps
 * (ATTN_DEBUG, which this command turns on unless --quiet), and stores the
 * winners for every later context on the device.
 */
#define _POSIX_C_SOURCE 200809L /* setenv */

#include "cli.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_LIST 16

int cmd_tune(int argc, char **argv) {
  const char *backend = NULL, *dtypes = "f32,f16,bf16", *dims = "64,128";
  int64_t seqlen = 0;
  int quiet = 0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      printf(
          "usage: attn tune [--backend SPEC] [--dtype LIST] [--dim LIST] [--seqlen N] [--quiet]\n"
          "Measures the backend's kernel configurations on the device for each dtype (a comma\n"
          "list of f32, f16, bf16; default all three) and head dim (default 64,128), forward\n"
          "and backward over one sequence of N rows (default 1024) and 8 heads, and keeps the\n"
          "fastest for every later run on this device and driver (the OpenCL and CPU backends\n"
          "store them beside the OpenCL program cache, ATTN_CL_CACHE_DIR; the CPU's per CPU\n"
          "model and thread count). Each measurement is logged on stderr unless --quiet. The\n"
          "CUDA backend has nothing to tune.\n"
          "Exit status: 0 done, 1 a failure while running, 2 a wrong option or value, or a\n"
          "backend with nothing to tune.\n");
      return 0;
    } else if (!strcmp(a, "--backend") || !strcmp(a, "--dtype") || !strcmp(a, "--dim")) {
      if (!val || !*val) return cli_complain("%s needs a value", a);
      const char **slot = !strcmp(a, "--backend") ? &backend
                          : !strcmp(a, "--dtype") ? &dtypes
                                                  : &dims;
      *slot = val;
      i++;
    } else if (!strcmp(a, "--seqlen")) {
      if (cli_parse_int(a, val, 16, 1 << 16, &seqlen)) return EXIT_USAGE;
      i++;
    } else if (!strcmp(a, "--quiet")) {
      quiet = 1;
    } else {
      return cli_complain("unknown option \"%s\" (see attn tune --help)", a);
    }
  }
  attn_dtype dt[MAX_LIST];
  int64_t d[MAX_LIST];
  int ndt = 0, nd = 0;
  char buf[256];
  snprintf(buf, sizeof buf, "%s", dtypes);
  for (char *s = strtok(buf, ","); s; s = strtok(NULL, ",")) {
    if (ndt == MAX_LIST) return cli_complain("--dtype: at most %d dtypes", MAX_LIST);
    if (cli_parse_dtype("--dtype", s, &dt[ndt])) return EXIT_USAGE;
    ndt++;
  }
  snprintf(buf, sizeof buf, "%s", dims);
  for (char *s = strtok(buf, ","); s; s = strtok(NULL, ",")) {
    if (nd == MAX_LIST) return cli_complain("--dim: at most %d head dims", MAX_LIST);
    if (cli_parse_int("--dim", s, 1, ATTN_MAX_HEAD_DIM, &d[nd])) return EXIT_USAGE;
    nd++;
  }
  if (!ndt || !nd) return cli_complain("--dtype and --dim need at least one value");
  /* Before the library's first call: the log is set up once a process. */
  if (!quiet) setenv("ATTN_DEBUG", "1", 1);

  attn_context *ctx = NULL;
  int rc = attn_context_create(backend, &ctx);
  if (rc) {
    int r = cli_fail_ctx(ctx, rc, "cannot create a context");
    attn_context_free(ctx);
    return r;
  }
  for (int i = 0; i < ndt && !rc; i++)
    for (int j = 0; j < nd && !rc; j++) {
      rc = attn_tune(ctx, dt[i], d[j], seqlen);
      if (rc) {
        snprintf(buf, sizeof buf, "tuning %s at head dim %lld", attn_dtype_name(dt[i]),
                 (long long)d[j]);
        rc = cli_fail_ctx(ctx, rc, buf);
      } else {
        printf("%s, head dim %lld: tuned\n", attn_dtype_name(dt[i]), (long long)d[j]);
      }
    }
  attn_context_free(ctx);
  return rc;
}
