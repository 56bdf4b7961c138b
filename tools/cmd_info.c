/*
 * attn info: the backends attn was built with, their devices (or why there
 * are none), what ATTN_BACKEND selects, and with --selftest a tiny kernel on
 * every device.
 */
#include "cli.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void print_device(const attn_device_info *d) {
  printf("    %s:%d  %s  [%s]", attn_backend_name(d->backend), d->index, d->name,
         d->is_gpu ? "gpu" : "cpu");
  if (d->compute_major) printf("  sm_%d%d", d->compute_major, d->compute_minor);
  if (d->version[0]) printf("  %s", d->version);
  if (d->memory_bytes) printf("  %.1f GiB", (double)d->memory_bytes / (1024.0 * 1024 * 1024));
  if (d->compute_units) printf("  %d units", d->compute_units);
  printf("\n");
}

int cmd_info(int argc, char **argv) {
  int selftest = 0;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      printf(
          "usage: attn info [--selftest]\n"
          "Lists every backend attn was built with, its devices (or why it has none), and the\n"
          "backend that ATTN_BACKEND selects. --selftest runs a tiny C = A + B kernel on every\n"
          "device and checks it. Exits non-zero if ATTN_BACKEND cannot be met or a self-test "
          "fails.\n");
      return 0;
    } else if (!strcmp(argv[i], "--selftest")) {
      selftest = 1;
    } else {
      return cli_complain("unknown option \"%s\" (see attn info --help)", argv[i]);
    }
  }
  int status = 0;
  printf("attn %s\nbackends:\n", ATTN_VERSION_STRING);
  const attn_backend kinds[] = {ATTN_BACKEND_CUDA, ATTN_BACKEND_OPENCL, ATTN_BACKEND_CPU};
  for (int k = 0; k < 3; k++) {
    attn_backend b = kinds[k];
    if (!attn_backend_compiled(b)) {
      printf("  %-7s not built\n", attn_backend_name(b));
      continue;
    }
    int n = attn_device_count(b);
    if (n == 0) {
      printf("  %-7s unavailable: %s\n", attn_backend_name(b), attn_backend_unavailable_reason(b));
      continue;
    }
    printf("  %-7s %d device%s\n", attn_backend_name(b), n, n == 1 ? "" : "s");
    for (int i = 0; i < n; i++) {
      attn_device_info d;
      if (attn_device_info_get(b, i, &d) != ATTN_OK) continue;
      print_device(&d);
      if (selftest) {
        char spec[32];
        snprintf(spec, sizeof spec, "%s:%d", attn_backend_name(b), i);
        attn_context *ctx = NULL;
        int rc = attn_context_create(spec, &ctx);
        if (rc == ATTN_OK) rc = attn_selftest(ctx);
        if (rc == ATTN_OK) {
          printf("      selftest: ok\n");
        } else {
          printf("      selftest: FAILED: %s (%s)\n", attn_errmsg(ctx), attn_status_name(rc));
          status = 1;
        }
        attn_context_free(ctx);
      }
    }
  }
  const char *env = getenv("ATTN_BACKEND");
  attn_context *ctx = NULL;
  int rc = attn_context_create(NULL, &ctx);
  printf("ATTN_BACKEND=%s selects: ", env ? env : "(unset)");
  if (rc == ATTN_OK) {
    attn_device_info d;
    attn_context_device_info(ctx, &d);
    printf("%s:%d (%s)\n", attn_backend_name(d.backend), d.index, d.name);
  } else {
    printf("nothing\n");
    status = cli_fail_ctx(ctx, rc, "no backend selected");
  }
  attn_context_free(ctx);
  return status;
}
