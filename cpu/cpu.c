/*
 * The CPU backend: the device (this machine), its buffers (aligned host
 * memory) and the vtable the core dispatches through. The attention passes
 * are in cpu_forward.c and cpu_backward.c.
 */
#include "cpu_internal.h"

#include <cblas.h>
#include <omp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static int cpu_device_count(char *why, size_t why_len) {
  if (why && why_len) why[0] = '\0';
  return 1;
}

/* The "model name" line of /proc/cpuinfo (Linux), else a generic name. */
static void cpu_model_name(char *out, size_t len) {
  snprintf(out, len, "CPU");
  FILE *f = fopen("/proc/cpuinfo", "r");
  if (!f) return;
  char line[512];
  while (fgets(line, sizeof line, f)) {
    if (strncmp(line, "model name", 10) != 0) continue;
    const char *colon = strchr(line, ':');
    if (!colon) continue;
    colon++;
    while (*colon == ' ' || *colon == '\t')
      colon++;
    size_t n = strcspn(colon, "\r\n");
    if (n == 0) continue;
    snprintf(out, len, "%.*s", (int)n, colon);
    break;
  }
  fclose(f);
}

static int cpu_device_info(int index, attn_device_info *out) {
  memset(out, 0, sizeof *out);
  out->backend = ATTN_BACKEND_CPU;
  out->index = index;
  out->is_gpu = 0;
  cpu_model_name(out->name, sizeof out->name);
  snprintf(out->version, sizeof out->version, "OpenMP %d, %.100s", _OPENMP, openblas_get_config());
  long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  out->memory_bytes = pages > 0 && page > 0 ? (uint64_t)pages * (uint64_t)page : 0;
  out->compute_units = omp_get_max_threads();
  return ATTN_OK;
}

/* The size of the OpenMP team the calling thread has started (libgomp keeps
 * one pool of threads per thread that opens parallel regions). */
static _Thread_local int cpu_team;

static void *cpu_probe_thread(void *arg) {
  return arg;
}

/* libgomp ends the process (gomp_fatal, then exit) when it cannot create a
 * thread of a team, as happens under an address-space limit (RLIMIT_AS). So
 * the threads are tried here first, all alive at once and with the default
 * attributes as libgomp makes them, where a failure can be answered: the
 * team shrinks to what succeeded. The team is then started, so that the
 * passes reuse its threads rather than create them. The first call on a
 * thread pays for this; later ones only read cpu_team. */
int attn__cpu_threads(void) {
  const int want = omp_get_max_threads();
  if (want <= cpu_team) return want;
  pthread_t *tid = malloc((size_t)want * sizeof *tid);
  int made = 0;
  while (tid && made < want - 1 && pthread_create(&tid[made], NULL, cpu_probe_thread, NULL) == 0)
    made++;
  for (int i = 0; i < made; i++)
    pthread_join(tid[i], NULL);
  free(tid);
  const int n = made + 1;
  if (n < want)
    attn__debug("cpu: only %d of %d OpenMP threads could be created; using %d", n, want, n);
#pragma omp parallel num_threads(n)
  { (void)0; }
  cpu_team = n;
  return n;
}

/* The tiles, per dtype and head dimension: the first row that fits. With
 * d = 64 and Br = Bc = 64 the working set of the forward inner loop (Q^T,
 * K, V, S^T and the O accumulator: 5 x 16 KiB) sits in the 1-2 MiB L2 of
 * current x86 cores with room to spare, and each tile product is at most
 * m*n*k = 64*64*64, the largest OpenBLAS still runs on the calling thread
 * (see attn__cpu_gemm); bigger products are cut into such pieces. Measured
 * on the 2-core AMD EPYC (Zen 4) build host, one thread, f32, B=1 H=12
 * N=1024, d = 64 and 128, every (Br, Bc) in {32, 64, 128}^2: 64 x 64 came
 * first or within noise of first in all four columns (78/82 GFLOP/s
 * forward, 83/88 backward; the others 71-82 and 74-84), and it keeps units
 * small enough to spread short sequences (ViT's 197 tokens) over the
 * threads. 2026-12-01, with the FMA kernels (cpu_gemm.c), Bc = 128 up to d
 * = 128: one thread's CPU time (perf stat, 3 alternating runs, B=1),
 * N=2048 H=4 d=64: backward 182-211 ms a call against 218-231 at 64 x 64,
 * 7 forwards 522-572 against 536-739; N=1024 H=8 d=128: backward 201-208
 * against 206-214, forwards 537-642 against 635-684 (128 x 64: 186-241);
 * decoding (32k keys, 32/8 heads) within noise (bench/NOTES.md). d = 256
 * keeps 64 x 64: its K and V blocks alone would fill 256 KiB. f16 and bf16 tiles are converted to
 * f32 when loaded, so their products are the f32 ones, but for a bf16 forward on a CPU with bf16
 * products (the rule below). The rows are split by head dimension so that attn_tune (cpu_tune.c)
 * can keep other tiles for each on another machine.
 *
 * Few rows: query blocks of up to 16 rows a head for bf16, 8 for f32 and f16 (a decoding step,
 * or a verifier's draft tokens), take the few-row products, with heads packed beside them in the
 * tile (16 x 4 at GQA 4): as 64-row tiles they would pay for 64 rows whatever they hold, and a
 * bf16 forward would transpose the whole cache first. f32's 64-row products on AVX-512 overtake
 * the few-row ones at 16 rows a head of GQA 4 (bench/NOTES_decode.md).
 *
 * Key splitting: 4 work items per thread let dynamic scheduling even out
 * tiles of unequal length and threads that lose their core for a while. A
 * part may be a single key block: its merge (a row of d per query row and
 * part) is about 1/bc of the part's products, and a larger minimum would
 * leave one item a thread where a few tiles cover few key blocks (one query
 * row over 8k keys on 16 threads: 16 parts of 4 blocks took 1.2-2x the
 * time of 64 parts of one). At most 64 MiB of parts: only an explicit
 * num_splits on a large problem gets near it, and splitting such a problem
 * gains nothing on a CPU. */
#define CPU_ROW(dt, hd, r, c, few)                                                                 \
  {                                                                                                \
    .dtype = (dt), .max_head_dim = (hd), .br = (r), .bc = (c), .split_fill = 4, .few_rows = (few), \
    .split_workspace = (size_t)64 << 20                                                            \
  }
static const attn__cpu_config cpu_configs[ATTN__CPU_ROWS] = {
    CPU_ROW(ATTN_F32, 64, 64, 128, 8),   CPU_ROW(ATTN_F32, 128, 64, 128, 8),
    CPU_ROW(ATTN_F32, 256, 64, 64, 8),   CPU_ROW(ATTN_F16, 64, 64, 128, 8),
    CPU_ROW(ATTN_F16, 128, 64, 128, 8),  CPU_ROW(ATTN_F16, 256, 64, 64, 8),
    CPU_ROW(ATTN_BF16, 64, 64, 128, 16), CPU_ROW(ATTN_BF16, 128, 64, 128, 16),
    CPU_ROW(ATTN_BF16, 256, 64, 64, 16)};
#undef CPU_ROW

attn__cpu_sgemm_fn *attn__cpu_row_gemm(const attn__cpu_config *cfg) {
  attn__cpu_sgemm_fn *own = cfg->fma ? attn__cpu_sgemm_native() : NULL;
  return own ? own : attn__cpu_gemm;
}

void attn__cpu_row_set(attn_context *ctx, attn__cpu_config *row, int br, int bc, int products,
                       int fma) {
  const attn__cpu_impl *im = ctx->impl;
  char what[48] = "";
  if (products == ATTN__CPU_PRODUCTS_BF16)
    snprintf(what, sizeof what, ", bf16 products (%s)",
             attn__cpu_bf16_kernel_name(im->bf16_kernel));
  else if (products == ATTN__CPU_PRODUCTS_SBGEMM)
    snprintf(what, sizeof what, ", bf16 products (OpenBLAS sbgemm)");
  row->br = br;
  row->bc = bc;
  row->products = products;
  row->fma = fma && attn__cpu_sgemm_native();
  const char *f32 = row->fma ? ", f32 products (FMA kernels)" : ", f32 products (OpenBLAS)";
  snprintf(row->forward_name, sizeof row->forward_name, "cpu blockwise forward, Br %d Bc %d%s", br,
           bc, products == ATTN__CPU_PRODUCTS_F32 ? f32 : what);
  snprintf(row->backward_name, sizeof row->backward_name, "cpu blockwise backward, Br %d Bc %d%s",
           br, bc, f32);
}

/* f32 products through the library's FMA kernels where the CPU has them
 * (cpu_gemm.c; measured on the build host, see bench/NOTES.md), else
 * OpenBLAS; attn_tune measures both. */
#define CPU_FMA_RULE 1

/* The products of a bf16 forward, the one rule: the CPU's bf16 instructions
 * through the library's own kernels where the CPU has them (AMX's tiles, or
 * AVX512_BF16's vdpbf16ps: attn__cpu_bf16_kernel_native; no packing of whole
 * operands and no call through OpenBLAS's interface per tile, at the 64 x 64
 * x 64 products of a tile); else OpenBLAS's sbgemm where the
 * library has it and the CPU has bf16 dot products (AMX-BF16 without
 * AVX512_BF16 is no CPU made so far, so in practice a build whose compiler
 * lacks the instruction); else f32 products. sbgemm is never chosen
 * without the hardware: OpenBLAS's generic bf16 kernel then runs far below
 * sgemm. attn_tune measures the others this machine has (cpu_tune.c). */
static int cpu_products_rule(const attn__cpu_impl *im) {
  if (im->bf16_kernel) return ATTN__CPU_PRODUCTS_BF16;
  if (attn__cpu_sbgemm_built() && attn__cpu_bf16_hardware()) return ATTN__CPU_PRODUCTS_SBGEMM;
  return ATTN__CPU_PRODUCTS_F32;
}

unsigned attn__cpu_products_usable(attn_context *ctx) {
  const attn__cpu_impl *im = ctx->impl;
  unsigned u = 1u << ATTN__CPU_PRODUCTS_F32;
  if (im->bf16_kernel) u |= 1u << ATTN__CPU_PRODUCTS_BF16;
  if (attn__cpu_sbgemm_built() && attn__cpu_bf16_hardware()) u |= 1u << ATTN__CPU_PRODUCTS_SBGEMM;
  return u;
}

int attn__cpu_products_force(attn_context *ctx, int products, attn__cpu_bf16_kernel *kernel) {
  attn__cpu_impl *im = ctx->impl;
  if (products == ATTN__CPU_PRODUCTS_BF16) {
    im->bf16_kernel = kernel ? kernel : attn__cpu_bf16_kernel_native();
    if (!im->bf16_kernel)
      return attn__error(ctx, ATTN_EUNSUPPORTED,
                         "products: this CPU has no AVX512_BF16, or the build no code for it");
  } else if (products == ATTN__CPU_PRODUCTS_SBGEMM) {
    if (!attn__cpu_sbgemm_built())
      return attn__error(ctx, ATTN_EUNSUPPORTED,
                         "products: the library was built with an OpenBLAS without cblas_sbgemm");
  } else if (products != ATTN__CPU_PRODUCTS_F32) {
    return attn__error(ctx, ATTN_EINVAL, "products: %d is none of the CPU's", products);
  }
  for (int i = 0; i < ATTN__CPU_ROWS; i++)
    if (im->rows[i].dtype == ATTN_BF16)
      attn__cpu_row_set(ctx, &im->rows[i], im->rows[i].br, im->rows[i].bc, products,
                        im->rows[i].fma);
  return ATTN_OK;
}

attn__cpu_config *attn__cpu_row(attn_context *ctx, attn_dtype dtype, int64_t head_dim) {
  attn__cpu_impl *im = ctx->impl;
  for (int i = 0; i < ATTN__CPU_ROWS; i++)
    if (im->rows[i].dtype == dtype && head_dim <= im->rows[i].max_head_dim) return &im->rows[i];
  return &im->rows[0];
}

static int cpu_open(attn_context *ctx, int index) {
  /* Per context only the tile table: the passes allocate their tiles per
   * call. The OpenMP team starts now, where a failure to create its threads
   * can be survived (see attn__cpu_threads), and before the tuned rows,
   * which are kept per thread count. */
  attn__cpu_impl *im = malloc(sizeof *im);
  if (!im) return attn__error(ctx, ATTN_ENOMEM, "cpu: cannot allocate the context's tile table");
  memcpy(im->rows, cpu_configs, sizeof cpu_configs);
  im->bf16_kernel = attn__cpu_bf16_kernel_native();
  im->ws = NULL;
  im->ws_bytes = 0;
  ctx->impl = im;
  const int products = cpu_products_rule(im);
  for (int i = 0; i < ATTN__CPU_ROWS; i++)
    attn__cpu_row_set(ctx, &im->rows[i], im->rows[i].br, im->rows[i].bc,
                      im->rows[i].dtype == ATTN_BF16 ? products : ATTN__CPU_PRODUCTS_F32,
                      CPU_FMA_RULE);
  attn__cpu_threads();
  attn__cpu_tuned_rows(ctx);
  return ATTN_OK;
}

void *attn__cpu_workspace(attn_context *ctx, size_t bytes) {
  attn__cpu_impl *im = ctx->impl;
  if (bytes > im->ws_bytes) {
    /* Freed before the larger one is taken: never both at once. */
    attn__cpu_free(im->ws);
    im->ws = attn__cpu_alloc(bytes);
    im->ws_bytes = im->ws ? bytes : 0;
  }
  return im->ws;
}

static void cpu_close(attn_context *ctx) {
  attn__cpu_impl *im = ctx->impl;
  if (im) attn__cpu_free(im->ws);
  free(ctx->impl);
  ctx->impl = NULL;
}

static int cpu_buffer_alloc(attn_context *ctx, size_t bytes, void **native) {
  void *p = attn__cpu_alloc(bytes);
  if (!p) return attn__error(ctx, ATTN_ENOMEM, "cpu: cannot allocate a buffer of %zu bytes", bytes);
  *native = p;
  return ATTN_OK;
}

static void cpu_buffer_release(attn_context *ctx, void *native) {
  attn__cpu_free(native);
}

static int cpu_buffer_write(attn_context *ctx, void *native, size_t offset, const void *src,
                            size_t bytes) {
  if (bytes) memcpy((char *)native + offset, src, bytes);
  return ATTN_OK;
}

static int cpu_buffer_read(attn_context *ctx, void *native, size_t offset, void *dst,
                           size_t bytes) {
  if (bytes) memcpy(dst, (const char *)native + offset, bytes);
  return ATTN_OK;
}

static int cpu_set_stream(attn_context *ctx, void *stream) {
  if (stream)
    return attn__error(ctx, ATTN_EINVAL,
                       "stream: the CPU backend runs every call to completion and takes only NULL");
  return ATTN_OK;
}

static int cpu_synchronize(attn_context *ctx) {
  return ATTN_OK;
}

static int cpu_selftest(attn_context *ctx) {
  enum { n = 1000 };
  float *a = attn__cpu_alloc(3 * n * sizeof(float));
  if (!a) return attn__error(ctx, ATTN_ENOMEM, "cpu selftest: cannot allocate 3 x %d floats", n);
  float *b = a + n, *c = b + n;
  for (int i = 0; i < n; i++) {
    a[i] = (float)i;
    b[i] = (float)(2 * i + 1);
  }
  /* Through the same OpenMP runtime the passes use. */
#pragma omp parallel for num_threads(attn__cpu_threads())
  for (int i = 0; i < n; i++)
    c[i] = a[i] + b[i];
  int bad = -1;
  for (int i = 0; i < n && bad < 0; i++)
    if (c[i] != (float)(3 * i + 1)) bad = i;
  attn__cpu_free(a);
  if (bad >= 0)
    return attn__error(ctx, ATTN_EDEVICE, "cpu selftest: C = A + B is wrong at element %d", bad);
  return ATTN_OK;
}

attn__cpu_schedule attn__cpu_schedule_forward(const attn__problem *pb, const attn__cpu_config *cfg,
                                              int nthreads) {
  attn__cpu_schedule sc = {.heads = 1, .rows = cfg->br, .splits = 1, .tiles = 0};
  /* bf16 products take pairs of the head dimension. */
  sc.products =
      pb->dtype == ATTN_BF16 && pb->head_dim % 2 == 0 ? cfg->products : ATTN__CPU_PRODUCTS_F32;
  sc.gemm = attn__cpu_row_gemm(cfg);
  const int64_t group = pb->heads_q / pb->heads_kv;
  /* GQA packing when a head's rows leave the tile part empty (decoding):
   * one block of rows per sequence, and as many heads of the group beside
   * each other as fit. The row blocks are then the unpacked ones (a
   * sequence's rows all in one block), which the backward's recomputed
   * scores rely on. */
  if (pb->seqlen_q > 0 && pb->seqlen_q <= cfg->few_rows) {
    /* Few rows (decoding): the products of few rows (attn__cpu_qk_few),
     * which take any heads, so a tile holds whole groups of as many kv
     * heads as fit, all of them when they do, and reads the cache's rows
     * whole. */
    sc.rows = (int)pb->seqlen_q;
    const int64_t fit = cfg->br / sc.rows;
    sc.heads = (int)(fit >= pb->heads_q ? pb->heads_q : fit >= group ? fit / group * group : fit);
  } else if (group > 1 && pb->seqlen_q > 0 && pb->seqlen_q < cfg->br) {
    sc.rows = (int)pb->seqlen_q;
    sc.heads = (int)(group < cfg->br / sc.rows ? group : cfg->br / sc.rows);
  }
  const int64_t heads = sc.heads > group ? (pb->heads_q + sc.heads - 1) / sc.heads
                                         : pb->heads_kv * ((group + sc.heads - 1) / sc.heads);
  for (int64_t b = 0; b < pb->batch; b++)
    sc.tiles += heads * ((attn__seq_q(pb, b) + sc.rows - 1) / sc.rows);

  /* Splits, counted on the key capacity: the plan looks at shapes only. */
  const int64_t kblocks = (pb->seqlen_k + cfg->bc - 1) / cfg->bc;
  int64_t parts = 1;
  if (pb->num_splits >= 2) {
    parts = pb->num_splits;
  } else if (pb->num_splits == 0 && sc.tiles > 0) {
    const int64_t target = (int64_t)cfg->split_fill * nthreads;
    if (sc.tiles < target) parts = (target + sc.tiles - 1) / sc.tiles;
  }
  if (parts > kblocks) parts = kblocks;
  if (parts > ATTN_MAX_MERGE) parts = ATTN_MAX_MERGE; /* the most attn_merge takes */
  const size_t per_part = (size_t)sc.tiles * (size_t)cfg->br * (size_t)(pb->head_dim + 2) * 4;
  if (parts > 1 && per_part && (size_t)parts > cfg->split_workspace / per_part)
    parts = (int64_t)(cfg->split_workspace / per_part);
  sc.splits = parts > 1 ? (int)parts : 1;
  return sc;
}

static int cpu_plan(attn_context *ctx, const attn__problem *pb, int backward, attn__plan *out) {
  /* The CPU is the backend of last resort: every valid problem, any dtype,
   * stride, window, softcap, ALiBi, GQA or varlen layout, KV cache, bias or
   * sinks, so some row always fits. */
  const attn__cpu_config *cfg = attn__cpu_row(ctx, pb->dtype, pb->head_dim);
  const int nthreads = attn__cpu_threads();
  memset(out, 0, sizeof *out);
  out->backward = backward;
  out->config = cfg;
  if (backward) {
    out->kernel = ATTN__CPU_BLOCKWISE_BACKWARD;
    out->name = cfg->backward_name;
    out->workspace = (size_t)nthreads * attn__cpu_backward_scratch(pb, cfg);
  } else {
    const attn__cpu_schedule sc = attn__cpu_schedule_forward(pb, cfg, nthreads);
    out->kernel = ATTN__CPU_BLOCKWISE_FORWARD;
    out->name = cfg->forward_name;
    out->workspace = attn__cpu_forward_workspace(pb, cfg, &sc, nthreads);
  }
  return ATTN_OK;
}

static int cpu_forward(attn_context *ctx, const attn__problem *pb, const attn__plan *plan) {
  /* The plan's schedule, made again from what made it: the same problem,
   * config row and thread count (attn__cpu_threads answers the same on the
   * calling thread). */
  const attn__cpu_config *cfg = (const attn__cpu_config *)plan->config;
  const attn__cpu_schedule sc = attn__cpu_schedule_forward(pb, cfg, attn__cpu_threads());
  return attn__cpu_forward(ctx, pb, cfg, &sc);
}

static int cpu_backward(attn_context *ctx, const attn__problem *pb, const attn__plan *plan) {
  return attn__cpu_backward(ctx, pb, (const attn__cpu_config *)plan->config);
}

const attn__backend attn__backend_cpu = {
    .kind = ATTN_BACKEND_CPU,
    .name = "cpu",
    .host_memory = 1,
    .device_count = cpu_device_count,
    .device_info = cpu_device_info,
    .open = cpu_open,
    .close = cpu_close,
    .buffer_alloc = cpu_buffer_alloc,
    .buffer_release = cpu_buffer_release,
    .buffer_write = cpu_buffer_write,
    .buffer_read = cpu_buffer_read,
    .set_stream = cpu_set_stream,
    .synchronize = cpu_synchronize,
    .selftest = cpu_selftest,
    .plan = cpu_plan,
    .forward = cpu_forward,
    .backward = cpu_backward,
    .append = attn__cpu_append,
    .merge = attn__cpu_merge,
    .tune_count = attn__cpu_tune_count,
    .tune_use = attn__cpu_tune_use,
    .tune_keep = attn__cpu_tune_keep,
};
