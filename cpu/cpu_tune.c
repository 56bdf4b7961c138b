/*
 * attn_tune on the CPU: which tiles (Br, Bc) are measured, with which
 * products for bf16 (each this CPU and build can run: cpu.c's rule picks
 * one of them untuned), and where the fastest is kept.
 *
 * src/tune.c times a forward and a backward of each variation on this
 * machine and keeps the fastest. A kept variation goes to a text file
 * beside the OpenCL program cache (ATTN_CL_CACHE_DIR; with ATTN_CL_CACHE=0,
 * for the context only), named by a key of the CPU model, the OpenMP
 * thread count and OpenBLAS's kernel set: the best tiles depend on the
 * caches each thread has and on the sgemm kernels, so another machine, or
 * the same one run with another thread count, starts from the table again.
 * One line per dtype and head-dimension row: "dtype max_head_dim br bc
 * products fma". A line is taken only when it is one of the variations this
 * machine has, so a damaged or foreign file can ask for nothing else.
 */
#define _POSIX_C_SOURCE 200809L /* mkdir, getpid */

#include "cpu_internal.h"

#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

/* (Br, Bc): the table's 64 x 64 first, then the neighbours the build host's
 * sweep of {32, 64, 128}^2 found within 10 % of it (see cpu.c). */
static const struct {
  int br, bc;
} cpu_variations[] = {{64, 64}, {32, 64}, {64, 32}, {128, 64}, {64, 128}, {32, 32}, {128, 128}};

#define COUNT(a) ((int)(sizeof(a) / sizeof((a)[0])))

/* The products a row of dtype may take here, in enum order: f32 alone
 * but for bf16. */
static int cpu_products_of(attn_context *ctx, attn_dtype dtype, int *out) {
  const unsigned usable = dtype == ATTN_BF16 ? attn__cpu_products_usable(ctx) : 1u;
  int n = 0;
  for (int p = 0; p < 3; p++)
    if (usable >> p & 1u) out[n++] = p;
  return n;
}

/* The f32 products: OpenBLAS, and the FMA kernels where the CPU has them. */
static int cpu_fmas(void) {
  return attn__cpu_sgemm_native() ? 2 : 1;
}

int attn__cpu_tune_count(attn_context *ctx, attn_dtype dtype, int64_t head_dim) {
  int products[3];
  return COUNT(cpu_variations) * cpu_fmas() * cpu_products_of(ctx, dtype, products);
}

/* Variation i: the tiles, then the f32 products, then the bf16 ones. */
static void cpu_variation(attn_context *ctx, attn_dtype dtype, int i, int *br, int *bc,
                          int *products, int *fma) {
  int list[3];
  cpu_products_of(ctx, dtype, list);
  *br = cpu_variations[i % COUNT(cpu_variations)].br;
  *bc = cpu_variations[i % COUNT(cpu_variations)].bc;
  i /= COUNT(cpu_variations);
  *fma = i % cpu_fmas();
  *products = list[i / cpu_fmas()];
}

int attn__cpu_tune_use(attn_context *ctx, attn_dtype dtype, int64_t head_dim, int i) {
  if (i < 0 || i >= attn__cpu_tune_count(ctx, dtype, head_dim))
    return attn__error(ctx, ATTN_EUNSUPPORTED, "variation %d is not one of the CPU's", i);
  attn__cpu_config *row = attn__cpu_row(ctx, dtype, head_dim);
  int br, bc, products, fma;
  cpu_variation(ctx, dtype, i, &br, &bc, &products, &fma);
  attn__cpu_row_set(ctx, row, br, bc, products, fma);
  attn__debug("tune: configuration %d: %s", i, row->forward_name);
  return ATTN_OK;
}

static uint64_t cpu_hash(uint64_t h, const char *s) {
  for (; *s; s++) {
    h ^= (unsigned char)*s;
    h *= 0x100000001b3ull;
  }
  return h ^ 0xff; /* a separator, so that "ab" + "c" differs from "a" + "bc" */
}

/* The file of kept tiles for this machine and thread count; 0 when the
 * cache is off. */
static int cpu_tuned_path(attn_context *ctx, char *path, size_t n) {
  if (!ctx->settings.cl_cache) return 0;
  attn_device_info info;
  char threads[16];
  attn_device_info_get(ATTN_BACKEND_CPU, 0, &info);
  snprintf(threads, sizeof threads, "%d", attn__cpu_threads());
  uint64_t key = 0xcbf29ce484222325ull;
  key = cpu_hash(key, info.name);
  key = cpu_hash(key, threads);
  key = cpu_hash(key, openblas_get_corename());
  const int w = snprintf(path, n, "%s/tiles-cpu-%016llx.txt", ctx->settings.cl_cache_dir,
                         (unsigned long long)key);
  return w > 0 && (size_t)w < n;
}

static int cpu_parse(const char *s, int *v) {
  return sscanf(s, "%d %d %d %d %d %d", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5]) == 6;
}

/* The variation of a row of dtype that a line holds, or -1. */
static int cpu_stored_variation(attn_context *ctx, attn_dtype dtype, const int *v) {
  const int n = attn__cpu_tune_count(ctx, dtype, 0);
  for (int i = 0; i < n; i++) {
    int br, bc, products, fma;
    cpu_variation(ctx, dtype, i, &br, &bc, &products, &fma);
    if (br == v[2] && bc == v[3] && products == v[4] && fma == v[5]) return i;
  }
  return -1;
}

void attn__cpu_tuned_rows(attn_context *ctx) {
  attn__cpu_impl *im = ctx->impl;
  char path[sizeof ctx->settings.cl_cache_dir + 40], line[256];
  if (!cpu_tuned_path(ctx, path, sizeof path)) return;
  FILE *f = fopen(path, "r");
  if (!f) return;
  int v[6];
  while (fgets(line, sizeof line, f)) {
    if (!cpu_parse(line, v)) continue;
    for (int r = 0; r < ATTN__CPU_ROWS; r++) {
      attn__cpu_config *row = &im->rows[r];
      int i, br, bc, products, fma;
      if ((int)row->dtype != v[0] || row->max_head_dim != v[1] ||
          (i = cpu_stored_variation(ctx, row->dtype, v)) < 0)
        continue;
      cpu_variation(ctx, row->dtype, i, &br, &bc, &products, &fma);
      attn__cpu_row_set(ctx, row, br, bc, products, fma);
      attn__debug("cpu: tiles for %s, head dim %d, from %s: Br %d Bc %d",
                  attn_dtype_name(row->dtype), row->max_head_dim, path, row->br, row->bc);
    }
  }
  fclose(f);
}

/* mkdir -p: the folder may not exist before the first kept line. */
static void cpu_make_dirs(const char *dir) {
  char tmp[sizeof((attn__settings *)0)->cl_cache_dir];
  snprintf(tmp, sizeof tmp, "%s", dir);
  for (char *p = tmp + 1; *p; ++p) {
    if (*p != '/') continue;
    *p = 0;
    mkdir(tmp, 0755);
    *p = '/';
  }
  mkdir(tmp, 0755);
}

int attn__cpu_tune_keep(attn_context *ctx, attn_dtype dtype, int64_t head_dim, int i) {
  char path[sizeof ctx->settings.cl_cache_dir + 40], tmp[sizeof path + 24], line[256];
  int rc = attn__cpu_tune_use(ctx, dtype, head_dim, i);
  if (rc) return rc;
  const attn__cpu_config *row = attn__cpu_row(ctx, dtype, head_dim);
  if (!cpu_tuned_path(ctx, path, sizeof path)) {
    attn__debug(
        "cpu: the cache is off (ATTN_CL_CACHE=0): the tiles are kept for this context only");
    return ATTN_OK;
  }
  /* The other lines stay; this one replaces its (dtype, row). */
  snprintf(tmp, sizeof tmp, "%s.%ld.tmp", path, (long)getpid());
  cpu_make_dirs(ctx->settings.cl_cache_dir);
  FILE *out = fopen(tmp, "w");
  if (!out) return attn__error(ctx, ATTN_EIO, "cannot write the tuned tiles to %s", tmp);
  FILE *in = fopen(path, "r");
  while (in && fgets(line, sizeof line, in)) {
    int u[6];
    if (cpu_parse(line, u) && !(u[0] == (int)dtype && u[1] == row->max_head_dim)) fputs(line, out);
  }
  if (in) fclose(in);
  fprintf(out, "%d %d %d %d %d %d\n", (int)dtype, row->max_head_dim, row->br, row->bc,
          row->products, row->fma);
  const int bad = ferror(out);
  if (fclose(out) != 0 || bad || rename(tmp, path) != 0) {
    remove(tmp);
    return attn__error(ctx, ATTN_EIO, "cannot write the tuned tiles to %s", path);
  }
  attn__debug("cpu: %s kept in %s", row->forward_name, path);
  return ATTN_OK;
}
