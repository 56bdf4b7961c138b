/*
 * attn bandwidth: the memory read rate of the selected device, the ceiling
 * of a memory-bound call (a decoding step reads its whole KV cache once), to
 * hold attn run's GB/s against. On the CPU: a sum over a buffer of the
 * context, far larger than any cache, by the CPU backend's OpenMP threads,
 * each over the slice it wrote first (so its pages sit on its own node).
 * The library has no device-to-device copy, so a GPU's rate is not
 * measurable here: bench/decode_bench.py times a torch copy instead.
 */
#include "run.h"

#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* One pass: the sum of every word, in the static schedule that wrote them. */
static uint64_t read_pass(const uint64_t *w, int64_t n) {
  uint64_t sum = 0;
#pragma omp parallel for schedule(static) reduction(+ : sum)
  for (int64_t i = 0; i < n; i++)
    sum += w[i];
  return sum;
}

/* 2 GB is some 2x the largest L3 cache of a server socket (1.1 GB on AMD's
 * 3D V-Cache parts), so no pass is served from a cache. */
#define DEFAULT_MB 2048

int cmd_bandwidth(int argc, char **argv) {
  const char *backend = NULL;
  int64_t mb = 0, repeat = 10;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      printf(
          "usage: attn bandwidth [--backend SPEC] [--size MIB] [--repeat R]\n"
          "The memory read rate of the device, the ceiling of attn run's GB/s for a memory-bound\n"
          "call such as decoding. On the CPU backend: the sum of a buffer of MIB mebibytes\n"
          "(default %d, or half the memory available if that is less), read by the backend's\n"
          "OpenMP threads (OMP_NUM_THREADS), the median of R passes (10) after one untimed.\n"
          "A GPU backend is refused: the library has no device-to-device copy to time\n"
          "(bench/decode_bench.py times a torch copy on CUDA).\n"
          "Exit status: 0 done, 1 a failure while running, 2 a wrong option or value, or a GPU.\n",
          DEFAULT_MB);
      return 0;
    } else if (!strcmp(a, "--backend")) {
      if (!val || !*val)
        return cli_complain("--backend needs a value (auto, cpu, opencl, cuda[:N])");
      backend = val;
      i++;
    } else if (!strcmp(a, "--size")) {
      if (cli_parse_int(a, val, 1, INT64_MAX / (1 << 20), &mb)) return EXIT_USAGE;
      i++;
    } else if (!strcmp(a, "--repeat")) {
      if (cli_parse_int(a, val, 1, 10000, &repeat)) return EXIT_USAGE;
      i++;
    } else {
      return cli_complain("unknown option \"%s\" (see attn bandwidth --help)", a);
    }
  }
  double avail = cli_memory_available();
  if (mb == 0) {
    mb = DEFAULT_MB;
    if ((double)mb * (1 << 20) > avail / 2) mb = (int64_t)(avail / 2 / (1 << 20));
    if (mb < 1) mb = 1;
  } else if ((double)mb * (1 << 20) > avail) {
    char a[32], b[32];
    return cli_complain("--size %lld: %s is more than the %s of memory available", (long long)mb,
                        cli_human_bytes((double)mb * (1 << 20), a, sizeof a),
                        cli_human_bytes(avail, b, sizeof b));
  }

  attn_context *ctx = NULL;
  int rc = attn_context_create(backend, &ctx);
  if (rc) {
    int r = cli_fail_ctx(ctx, rc, "cannot create a context");
    attn_context_free(ctx);
    return r;
  }
  attn_device_info info;
  attn_context_device_info(ctx, &info);
  if (info.backend != ATTN_BACKEND_CPU) {
    attn_context_free(ctx);
    return cli_complain(
        "%s:%d (%s): the library has no device-to-device copy to time on this backend; "
        "bench/decode_bench.py times a torch copy on CUDA",
        attn_backend_name(info.backend), info.index, info.name);
  }
  const size_t bytes = (size_t)mb << 20;
  const int64_t n = (int64_t)(bytes / sizeof(uint64_t));
  attn_buffer *buf = NULL;
  double *t = calloc((size_t)repeat, sizeof *t);
  int status = 0;
  if (!t) {
    status = cli_out_of_host_memory();
    goto done;
  }
  if ((rc = attn_buffer_create(ctx, bytes, &buf))) {
    status = cli_fail_ctx(ctx, rc, "cannot allocate the buffer");
    goto done;
  }
  /* The CPU backend's buffers are host memory. */
  uint64_t *w = attn_buffer_native(buf);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; i++)
    w[i] = (uint64_t)i;
  /* Every word read once: the sum of 0 .. n-1, modulo 2^64. */
  const uint64_t want = (uint64_t)n % 2 ? (uint64_t)n * ((uint64_t)(n - 1) / 2)
                                        : (uint64_t)(n / 2) * (uint64_t)(n - 1);
  uint64_t got = read_pass(w, n);
  for (int64_t r = 0; r < repeat && got == want; r++) {
    double t0 = run_now_s();
    got = read_pass(w, n);
    t[r] = run_now_s() - t0;
  }
  if (got != want) {
    status = cli_complain("a pass summed to %llu, not %llu: the memory did not read back",
                          (unsigned long long)got, (unsigned long long)want);
    status = EXIT_FAILED;
    goto done;
  }
  run_sort_times(t, (size_t)repeat);
  double med = t[repeat / 2];
  char sz[32];
  printf("attn bandwidth\n");
  printf("  backend   %s:%d (%s)\n", attn_backend_name(info.backend), info.index, info.name);
  printf("  read      %.1f GB/s median of %lld passes over %s, %d threads (best %.1f GB/s)\n",
         (double)bytes / med * 1e-9, (long long)repeat,
         cli_human_bytes((double)bytes, sz, sizeof sz), omp_get_max_threads(),
         (double)bytes / t[0] * 1e-9);
done:
  free(t);
  attn_buffer_free(buf);
  attn_context_free(ctx);
  return status;
}
