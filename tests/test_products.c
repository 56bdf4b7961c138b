/*
 * The CPU backend's bf16 products (cpu/cpu_bf16.c): each path a CPU may be
 * given, forced through the backend's internal hook whatever this CPU
 * would get, holds the golden cases and random problems to their
 * tolerance. The AVX512_BF16 and AMX kernels (cpu/cpu_bf16_avx512.c,
 * cpu/cpu_bf16_amx.c) run here twice: natively where the CPU has the
 * instructions (the AMX one when the library picks it), and everywhere
 * built on portable definitions of the intrinsics (SIMDe's; AMX's tile
 * operations in amx_emulation.h), the same sources linked into this test,
 * so that their indexing, tails and packing are checked on any machine.
 * OpenBLAS's sbgemm runs where the library was linked with it. The
 * products of few query rows (decoding) are checked here too, through the
 * path this CPU takes, and their AMX kernels (cpu/cpu_few_amx.c) on the
 * emulated tiles as well.
 */
#include "cpu_internal.h"
#include "golden.h"
#include "testutil.h"

#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(AT_HAVE_SIMDE)
void at_bf16_kernel_simde(int m, int n, int kp, float alpha, const uint16_t *a, int lda,
                          const uint32_t *b, int ldb, float beta, float *c, int ldc);
void at_amx_kernel_emulated(int m, int n, int kp, float alpha, const uint16_t *a, int lda,
                            const uint32_t *b, int ldb, float beta, float *c, int ldc);

void at_qk_few_amx_emulated(const uint16_t *const *k, const uint16_t *const *v, ptrdiff_t hstep,
                            int nkv, const int *cols, int bc, int kn, int d, const uint32_t *qp,
                            int ldq, float scale, float *st, int ld);
void at_pv_few_amx_emulated(const uint16_t *const *v, int bc, int d, const uint32_t *pairs, int ldp,
                            int n, float *o);

void at_sgemm512_simde(int ta, int tb, int m, int n, int k, float alpha, const float *a, int lda,
                       const float *b, int ldb, float beta, float *c, int ldc);

/* The emulated tiles (amx_emulation.h), and what the hardware would fault on. */
#include "amx_emulation.h"
_Thread_local at_amx_tiles at_amx;
void at_amx_fault(const char *what) {
  fprintf(stderr, "AMX emulation: %s\n", what);
  abort();
}
#endif

/* The portable kernels, counting their calls: a forced path must be the
 * one that ran. */
static atomic_long simde_calls;
static void counted_simde(int m, int n, int kp, float alpha, const uint16_t *a, int lda,
                          const uint32_t *b, int ldb, float beta, float *c, int ldc) {
#if defined(AT_HAVE_SIMDE)
  atomic_fetch_add(&simde_calls, 1);
  at_bf16_kernel_simde(m, n, kp, alpha, a, lda, b, ldb, beta, c, ldc);
#else
  (void)m, (void)n, (void)kp, (void)alpha, (void)a, (void)lda, (void)b, (void)ldb, (void)beta;
  (void)c, (void)ldc;
#endif
}
static void counted_amx(int m, int n, int kp, float alpha, const uint16_t *a, int lda,
                        const uint32_t *b, int ldb, float beta, float *c, int ldc) {
#if defined(AT_HAVE_SIMDE)
  atomic_fetch_add(&simde_calls, 1);
  at_amx_kernel_emulated(m, n, kp, alpha, a, lda, b, ldb, beta, c, ldc);
#else
  (void)m, (void)n, (void)kp, (void)alpha, (void)a, (void)lda, (void)b, (void)ldb, (void)beta;
  (void)c, (void)ldc;
#endif
}

enum { PATH_SIMDE, PATH_AMX_EMULATED, PATH_NATIVE, PATH_SBGEMM };
static const int paths[] = {PATH_SIMDE, PATH_AMX_EMULATED, PATH_NATIVE, PATH_SBGEMM};

/* A CPU context whose bf16 rows take `path`, or a skip saying why it cannot. */
static attn_context *forced(int path) {
  attn_context *ctx = NULL;
  assert_int_equal(attn_context_create("cpu", &ctx), ATTN_OK);
  int rc = ATTN_OK;
  if (path == PATH_SIMDE || path == PATH_AMX_EMULATED) {
#if !defined(AT_HAVE_SIMDE)
    attn_context_free(ctx);
    at_skip("SIMDe's headers were not found when the tests were built (libsimde-dev)");
#endif
    rc = attn__cpu_products_force(ctx, ATTN__CPU_PRODUCTS_BF16,
                                  path == PATH_SIMDE ? counted_simde : counted_amx);
  } else {
    rc = attn__cpu_products_force(
        ctx, path == PATH_NATIVE ? ATTN__CPU_PRODUCTS_BF16 : ATTN__CPU_PRODUCTS_SBGEMM, NULL);
  }
  if (rc == ATTN_EUNSUPPORTED) {
    char why[512];
    snprintf(why, sizeof why, "%s", attn_errmsg(ctx));
    attn_context_free(ctx);
    at_skip("%s", why);
  }
  assert_int_equal(rc, ATTN_OK);
  return ctx;
}

#if defined(AT_HAVE_SIMDE)
static uint16_t bf16_of(double x) {
  return attn__f32_to_bf16((float)x);
}
#endif

/* The kernel against double sums of the same bf16 values, over shapes with
 * every kind of tail: rows past the 8-row tiles, columns past the 32-wide
 * ones, one pair or many; beta 0 (C holds NaN, never read) and beta 1. */
static void bf16_kernel_sums_pairs_of_products(at_backend *b) {
  (void)b;
#if !defined(AT_HAVE_SIMDE)
  at_skip("SIMDe's headers were not found when the tests were built (libsimde-dev)");
#else
  /* The native kernel is AMX's where the library picks it, else AVX512_BF16's. */
  attn__cpu_bf16_kernel *kernels[3] = {at_bf16_kernel_simde, at_amx_kernel_emulated,
                                       attn__cpu_bf16_kernel_native()};
  static const int ms[] = {1, 3, 4, 7, 8, 9, 13, 16, 33, 48, 64};
  static const int ns[] = {1, 5, 16, 17, 32, 33, 48, 64, 70};
  static const int kps[] = {1, 3, 16, 32, 40};
  /* A's rows hold 2 x 40 bf16, B has 40 pair rows; B and C rows 72 wide. */
  enum { MAXM = 64, MAXKP = 40, LDA = 96, LD = 72 };
  uint16_t *a = at_malloc(MAXM * LDA * sizeof *a);
  uint32_t *bp = at_malloc(MAXKP * LD * sizeof *bp);
  float *c = at_malloc(MAXM * LD * sizeof *c), *c0 = at_malloc(MAXM * LD * sizeof *c0);
  uint32_t s = 12345;
  for (int x = 0; x < MAXM * LDA; x++) {
    s = s * 1664525u + 1013904223u;
    a[x] = bf16_of((double)(s >> 8) / 8388608.0 - 1.0);
  }
  for (int x = 0; x < MAXM * LD; x++) {
    s = s * 1664525u + 1013904223u;
    c0[x] = (float)((double)(s >> 8) / 16777216.0);
  }
  for (int x = 0; x < MAXKP * LD; x++) {
    s = s * 1664525u + 1013904223u;
    bp[x] = (uint32_t)bf16_of((double)(s >> 8) / 8388608.0 - 1.0) |
            (uint32_t)bf16_of((double)((s * 13u) >> 8) / 8388608.0 - 1.0) << 16;
  }
  for (int kx = 0; kx < 3 && kernels[kx]; kx++)
    for (size_t mi = 0; mi < sizeof ms / sizeof *ms; mi++)
      for (size_t ni = 0; ni < sizeof ns / sizeof *ns; ni++)
        for (size_t ki = 0; ki < sizeof kps / sizeof *kps; ki++)
          for (int beta = 0; beta < 2; beta++) {
            const int m = ms[mi], n = ns[ni], kp = kps[ki];
            const float alpha = 0.125f;
            for (int x = 0; x < MAXM * LD; x++)
              c[x] = beta ? c0[x] : NAN;
            kernels[kx](m, n, kp, alpha, a, LDA, bp, LD, (float)beta, c, LD);
            for (int i = 0; i < MAXM; i++)
              for (int j = 0; j < LD; j++) {
                const float got = c[i * LD + j];
                if (i >= m || j >= n) {
                  /* Outside the product: untouched. */
                  if (!(beta ? got == c0[i * LD + j] : isnan(got)))
                    fail_msg("kernel %d: m %d n %d kp %d: C[%d][%d] outside was written", kx, m, n,
                             kp, i, j);
                  continue;
                }
                double want = 0, mag = 0;
                for (int p = 0; p < kp; p++) {
                  const uint32_t pair = bp[p * LD + j];
                  const double t0 = (double)attn__bf16_to_f32(a[i * LDA + 2 * p]) *
                                    attn__bf16_to_f32((uint16_t)(pair & 0xffff));
                  const double t1 = (double)attn__bf16_to_f32(a[i * LDA + 2 * p + 1]) *
                                    attn__bf16_to_f32((uint16_t)(pair >> 16));
                  want += t0 + t1;
                  mag += fabs(t0) + fabs(t1);
                }
                want = alpha * want + (beta ? c0[i * LD + j] : 0.0);
                /* f32 sums of 2 kp exact products, then alpha and beta. */
                const double tol = (2.0 * kp + 4) * 0x1p-24 * (alpha * mag + fabs(want));
                if (!(fabs(got - want) <= tol))
                  fail_msg("kernel %d: m %d n %d kp %d beta %d: C[%d][%d] = %.9g, want %.9g", kx, m,
                           n, kp, beta, i, j, got, want);
              }
          }
  at_free(a);
  at_free(bp);
  at_free(c);
  at_free(c0);
#endif
}

/* The f32 FMA kernels (cpu/cpu_gemm.c: this CPU's, and the AVX-512 one on
 * SIMDe) against double sums, A as stored and transposed, every tail. */
static void f32_kernels_sum_products(at_backend *b) {
  (void)b;
  attn__cpu_sgemm_fn *kernels[2] = {attn__cpu_sgemm_native(), NULL};
#if defined(AT_HAVE_SIMDE)
  kernels[1] = at_sgemm512_simde;
#endif
  if (!kernels[0] && !kernels[1]) at_skip("no FMA kernel on this CPU, and no SIMDe");
  static const int ms[] = {1, 2, 3, 5, 6, 7, 8, 9, 13, 64}, ns[] = {1, 7, 8, 9, 16, 17, 33, 64, 70};
  static const int ks[] = {1, 5, 64};
  enum { LD = 72 };
  float *a = at_malloc(LD * LD * sizeof *a), *bm = at_malloc(LD * LD * sizeof *bm);
  float *c = at_malloc(LD * LD * sizeof *c), *c0 = at_malloc(LD * LD * sizeof *c0);
  uint32_t s = 777;
  for (int x = 0; x < LD * LD; x++) {
    s = s * 1664525u + 1013904223u;
    a[x] = (float)((double)(s >> 8) / 8388608.0 - 1.0);
    bm[x] = (float)((double)((s * 13u) >> 8) / 8388608.0 - 1.0);
    c0[x] = (float)((double)((s * 7u) >> 8) / 16777216.0);
  }
  for (int kx = 0; kx < 2; kx++) {
    if (!kernels[kx]) continue;
    for (size_t mi = 0; mi < sizeof ms / sizeof *ms; mi++)
      for (size_t ni = 0; ni < sizeof ns / sizeof *ns; ni++)
        for (size_t ki = 0; ki < sizeof ks / sizeof *ks; ki++)
          for (int ta = 0; ta < 2; ta++)
            for (int beta = 0; beta < 2; beta++) {
              const int m = ms[mi], n = ns[ni], k = ks[ki];
              const float alpha = 0.25f;
              for (int x = 0; x < LD * LD; x++)
                c[x] = beta ? c0[x] : NAN;
              kernels[kx](ta, 0, m, n, k, alpha, a, LD, bm, LD, (float)beta, c, LD);
              for (int i = 0; i < LD; i++)
                for (int j = 0; j < LD; j++) {
                  const float got = c[i * LD + j];
                  if (i >= m || j >= n) {
                    if (!(beta ? got == c0[i * LD + j] : isnan(got)))
                      fail_msg("kernel %d: m %d n %d k %d ta %d: C[%d][%d] outside was written", kx,
                               m, n, k, ta, i, j);
                    continue;
                  }
                  double want = 0, mag = 0;
                  for (int p = 0; p < k; p++) {
                    const double t = (double)(ta ? a[p * LD + i] : a[i * LD + p]) * bm[p * LD + j];
                    want += t;
                    mag += fabs(t);
                  }
                  want = alpha * want + (beta ? c0[i * LD + j] : 0.0);
                  const double tol = (k + 4) * 0x1p-24 * (alpha * mag + fabs(want));
                  if (!(fabs(got - want) <= tol))
                    fail_msg("kernel %d: m %d n %d k %d ta %d beta %d: C[%d][%d] = %.9g, want %.9g",
                             kx, m, n, k, ta, beta, i, j, got, want);
                }
            }
  }
  at_free(a);
  at_free(bm);
  at_free(c);
  at_free(c0);
}

/* Every bf16 golden case, forward and backward, on a context forced to the
 * path; the count of kernel calls shows the SIMDe path ran. */
static void golden_bf16_cases_hold_through_each_path(at_backend *b) {
  if (b->kind != ATTN_BACKEND_CPU) at_skip("the CPU backend's products");
  const int path = *(const int *)at_arg();
  attn_context *ctx = forced(path);
  char err[1024];
  char **dirs = NULL;
  const int n = at_golden_list(at_golden_dir(), &dirs, err, sizeof err);
  if (n <= 0) {
    attn_context_free(ctx);
    fail_msg("no golden cases in %s: %s", at_golden_dir(), n < 0 ? err : "none");
  }
  int ran = 0;
  atomic_store(&simde_calls, 0);
  for (int i = 0; i < n; i++) {
    at_golden g;
    if (at_golden_load(dirs[i], &g, err, sizeof err) != 0) fail_msg("%s", err);
    if (g.dtype != ATTN_BF16) {
      at_golden_free(&g);
      continue;
    }
    at_golden_report rep;
    const int st = at_golden_run(ctx, &g, !g.dq, &rep);
    if (st != ATTN_OK || rep.skipped)
      fail_msg("%s: %s: %s", g.name, attn_status_name(st), rep.message);
    for (int r = 0; r < rep.n; r++)
      if (!rep.r[r].pass)
        fail_msg("%s: %s max error %.3g exceeds the bound %.3g", g.name, rep.r[r].output,
                 rep.r[r].max_err, rep.r[r].bound);
    print_message("  %-26s %d outputs within the bounds\n", g.name, rep.n);
    at_golden_free(&g);
    ran++;
  }
  at_golden_list_free(dirs, n);
  attn_context_free(ctx);
  assert_true(ran >= 4);
  if (path == PATH_SIMDE || path == PATH_AMX_EMULATED) assert_true(atomic_load(&simde_calls) > 0);
}

/* Random bf16 problems whose tiles have every tail: 197 rows (a partial
 * last block), causal, GQA packing, odd key counts, strided and fused
 * layouts (gathered rows), a sliding window, head dims 64, 96 and 128. */
static void random_bf16_problems_hold_through_each_path(at_backend *b) {
  if (b->kind != ATTN_BACKEND_CPU) at_skip("the CPU backend's products");
  const int path = *(const int *)at_arg();
  at_backend mine = *b;
  mine.ctx = forced(path);
  const at_shape shapes[] = {
      {.dtype = ATTN_BF16, .B = 2, .Nq = 197, .Nk = 197, .Hq = 3, .Hkv = 3, .d = 64},
      {.dtype = ATTN_BF16,
       .B = 1,
       .Nq = 130,
       .Nk = 131,
       .Hq = 4,
       .Hkv = 2,
       .d = 128,
       .flags = ATTN_CAUSAL},
      {.dtype = ATTN_BF16,
       .B = 1,
       .Nq = 40,
       .Nk = 77,
       .Hq = 8,
       .Hkv = 1,
       .d = 96,
       .layout = AT_MIXED},
      {.dtype = ATTN_BF16,
       .B = 2,
       .Nq = 100,
       .Nk = 100,
       .Hq = 2,
       .Hkv = 2,
       .d = 64,
       .layout = AT_QKV,
       .win = 1,
       .wl = 30,
       .wr = 5},
  };
  atomic_store(&simde_calls, 0);
  for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++)
    assert_true(at_check_backward(&mine, &shapes[i]));
  attn_context_free(mine.ctx);
  if (path == PATH_SIMDE || path == PATH_AMX_EMULATED) assert_true(atomic_load(&simde_calls) > 0);
}

/* f16 and f32 keep their f32 products whatever the bf16 rows take, and so
 * does a bf16 head dimension of odd size (the pairs need an even one). */
static void other_dtypes_keep_f32_products(at_backend *b) {
  if (b->kind != ATTN_BACKEND_CPU) at_skip("the CPU backend's products");
  attn_context *ctx = forced(PATH_SIMDE);
  at_backend mine = *b;
  mine.ctx = ctx;
  atomic_store(&simde_calls, 0);
  const at_shape shapes[] = {
      {.dtype = ATTN_F32, .B = 1, .Nq = 70, .Nk = 70, .Hq = 2, .Hkv = 2, .d = 64},
      {.dtype = ATTN_F16, .B = 1, .Nq = 70, .Nk = 70, .Hq = 2, .Hkv = 2, .d = 64},
      {.dtype = ATTN_BF16, .B = 1, .Nq = 70, .Nk = 70, .Hq = 2, .Hkv = 2, .d = 33},
  };
  for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++)
    assert_true(at_check_forward(&mine, &shapes[i]));
  assert_int_equal(atomic_load(&simde_calls), 0);
  attn_context_free(ctx);
}

/* The query heads of the few-row problems below. */
enum { HQ_FEW = 8 };

/* O of few rows (ld = HQ nr columns, d each) after attn__cpu_pv_few onto
 * ones, against 1 + P V in double: P the scores sb (nk x ld), as the
 * softmax's bf16 pairs round them where paired, V's values vf (nk x hkv x
 * d, column c's kv head c / nr / (ld / nr / hkv)). */
static void few_o_agrees(const float *o, const float *sb, const float *vf, int nk, int hkv,
                         attn_dtype dt, int d, int nr, int paired) {
  const int ld = HQ_FEW * nr, g = HQ_FEW / hkv;
  for (int c = 0; c < ld; c++)
    for (int x = 0; x < d; x++) {
      double want = 1, mag = 1;
      for (int a = 0; a < nk; a++) {
        const float pa = sb[a * ld + c];
        const float pr = paired ? attn__bf16_to_f32(attn__cpu_bf16_bits(pa)) : pa;
        const double p = (double)pr * vf[((size_t)a * hkv + c / nr / g) * d + x];
        want += p;
        mag += fabs(p);
      }
      const double got = o[(size_t)c * d + x], tol = (nk + 2) * 0x1p-24 * mag;
      if (!(fabs(got - want) <= tol))
        fail_msg("%s d %d rows %d: O%s %d,%d %.9g, want %.9g", attn_dtype_name(dt), d, nr,
                 paired ? " from pairs" : "", c, x, got, want);
    }
}

/* The products of few query rows (attn__cpu_qk_few, attn__cpu_pv_few)
 * against double sums, and the scores' bits across tilings: the forward
 * takes a tile of many heads (a kv head's key row meeting 4 to 16
 * columns), the backward one head at a time (1 to 4), and the backward's
 * P = exp(S - lse) needs the forward's S to the bit. Head dimensions for
 * each path a CPU may take: multiples of 16 (AVX-512), of 8 (AVX2), and
 * others (the portable loops), each a fixed choice per d. */
static void few_row_products_agree_across_tiles(at_backend *b) {
  (void)b;
  enum { HQ = HQ_FEW, HKV = 2, NK = 37, MAXD = 256 };
  static const attn_dtype dts[] = {ATTN_F32, ATTN_BF16, ATTN_F16};
  static const int ds[] = {16, 36, 40, 48, 64, 72, 128, 256};
  /* Tiles of the forward's kind (heads [h0, h0 + nh)), beside the
   * backward's single heads: all heads, and a part cutting a group. */
  static const int tiles[][2] = {{0, HQ}, {1, 5}};
  const size_t nkv = (size_t)NK * HKV * MAXD;
  float *kf = at_malloc(nkv * sizeof *kf), *vf = at_malloc(nkv * sizeof *vf);
  void *kn = at_malloc(nkv * 4), *vn = at_malloc(nkv * 4);
  float *q = at_malloc((size_t)HQ * 4 * MAXD * sizeof *q);
  float *st = at_malloc((size_t)NK * HQ * 4 * sizeof *st),
        *sb = at_malloc(NK * HQ * 4 * sizeof *sb);
  float *o = at_malloc((size_t)HQ * 4 * MAXD * sizeof *o);
  uint32_t *pairs = at_malloc((size_t)(NK + 1) / 2 * HQ * 4 * sizeof *pairs);
  int paired = 0;
  uint32_t s = 777;
  for (size_t di = 0; di < sizeof dts / sizeof *dts; di++)
    for (size_t xi = 0; xi < sizeof ds / sizeof *ds; xi++)
      for (int nr = 1; nr <= 4; nr++) {
        const attn_dtype dt = dts[di];
        const int d = ds[xi], ld = HQ * nr, g = HQ / HKV;
        attn__problem pb;
        memset(&pb, 0, sizeof pb);
        pb.dtype = dt;
        pb.batch = 1;
        pb.heads_q = HQ;
        pb.heads_kv = HKV;
        pb.head_dim = d;
        pb.seqlen_q = pb.total_q = nr;
        pb.seqlen_k = pb.total_k = NK;
        pb.scale = 1.0f / sqrtf((float)d);
        pb.window_left = pb.window_right = -1;
        attn__tensor *ts[] = {&pb.k, &pb.v};
        void *native[] = {kn, vn};
        float *vals[] = {kf, vf};
        for (int t = 0; t < 2; t++) {
          ts[t]->native = native[t];
          ts[t]->dtype = dt;
          ts[t]->sd = 1;
          ts[t]->sh = d;
          ts[t]->ss = HKV * d;
          ts[t]->sb = NK * HKV * d;
          /* Values the dtype holds, so that the sums below see the same. */
          for (int x = 0; x < NK * HKV * d; x++) {
            s = s * 1664525u + 1013904223u;
            const float f = (float)((double)(s >> 8) / 8388608.0 - 1.0);
            if (dt == ATTN_F32) {
              ((float *)native[t])[x] = vals[t][x] = f;
            } else {
              uint16_t *h = (uint16_t *)native[t] + x;
              *h = dt == ATTN_BF16 ? attn__f32_to_bf16(f) : attn__f32_to_f16(f);
              vals[t][x] = dt == ATTN_BF16 ? attn__bf16_to_f32(*h) : attn__f16_to_f32(*h);
            }
          }
        }
        /* Q as the passes give it: values of the problem's dtype (the bf16
         * dot product takes them as bf16). */
        for (int x = 0; x < ld * d; x++) {
          s = s * 1664525u + 1013904223u;
          q[x] = (float)((double)(s >> 8) / 8388608.0 - 1.0);
          if (dt == ATTN_BF16) q[x] = attn__bf16_to_f32(attn__f32_to_bf16(q[x]));
          if (dt == ATTN_F16) q[x] = attn__f16_to_f32(attn__f32_to_f16(q[x]));
        }
        /* Column c = h nr + r of the scores holds query row r of head h. */
        /* And one key at a time. */
        for (int h = 0; h < HQ; h++)
          for (int a = 0; a < NK; a++)
            attn__cpu_qk_few(&pb, &pb.k, NULL, 0, a, 1, h, 1, nr, q + (size_t)h * nr * d, d,
                             sb + a * ld + h * nr, ld);
        for (size_t ti = 0; ti < sizeof tiles / sizeof *tiles; ti++) {
          const int h0 = tiles[ti][0], nh = tiles[ti][1];
          attn__cpu_qk_few(&pb, &pb.k, &pb.v, 0, 0, NK, h0, nh, nr, q + (size_t)h0 * nr * d, d, st,
                           ld);
          for (int a = 0; a < NK; a++)
            for (int c = 0; c < nh * nr; c++) {
              const float got = st[a * ld + c], one = sb[a * ld + h0 * nr + c];
              if (memcmp(&got, &one, sizeof got) != 0)
                fail_msg(
                    "%s d %d rows %d heads [%d, %d): score %d,%d %.9g, one head at a time %.9g",
                    attn_dtype_name(dt), d, nr, h0, h0 + nh, a, c, got, one);
            }
        }
        for (int a = 0; a < NK; a++)
          for (int c = 0; c < ld; c++) {
            const float *kr = kf + ((size_t)a * HKV + c / nr / g) * d, *qr = q + (size_t)c * d;
            double want = 0, mag = 0;
            for (int x = 0; x < d; x++) {
              want += (double)kr[x] * qr[x];
              mag += fabs((double)kr[x] * qr[x]);
            }
            want *= pb.scale;
            const double got = sb[a * ld + c], tol = (d + 2) * 0x1p-24 * pb.scale * mag;
            if (!(fabs(got - want) <= tol))
              fail_msg("%s d %d rows %d: score %d,%d %.9g, want %.9g", attn_dtype_name(dt), d, nr,
                       a, c, got, want);
          }
        /* O += P V with the scores for P, onto an O of ones. */
        for (int x = 0; x < ld * d; x++)
          o[x] = 1.0f;
        attn__cpu_pv_few(&pb, &pb.v, 0, 0, NK, 0, HQ, nr, sb, NULL, ld, o);
        few_o_agrees(o, sb, vf, NK, HKV, dt, d, nr, 0);
        /* And with P as the softmax's bf16 pairs, where this CPU's products
         * take them (the bf16 dot product, AMX's tiles): P as rounded. */
        if (!attn__cpu_few_pairs(&pb)) continue;
        for (int a = 0; a < NK + 1; a += 2)
          for (int c = 0; c < ld; c++)
            pairs[(size_t)(a / 2) * ld + c] =
                attn__cpu_bf16_bits(sb[a * ld + c]) |
                (a + 1 < NK ? attn__cpu_bf16_bits(sb[(a + 1) * ld + c]) << 16 : 0u);
        for (int x = 0; x < ld * d; x++)
          o[x] = 1.0f;
        attn__cpu_pv_few(&pb, &pb.v, 0, 0, NK, 0, HQ, nr, NULL, pairs, ld, o);
        few_o_agrees(o, sb, vf, NK, HKV, dt, d, nr, 1);
        ++paired;
      }
  /* This CPU's bf16 products take pairs at every d a multiple of 32. */
  if (attn__cpu_bf16_kernel_native() && paired == 0) fail_msg("no case took P in pairs");
  at_free(kf);
  at_free(vf);
  at_free(kn);
  at_free(vn);
  at_free(q);
  at_free(st);
  at_free(sb);
  at_free(o);
  at_free(pairs);
}

static void forcing_a_missing_path_says_why(void) {
  attn_context *ctx = NULL;
  assert_int_equal(attn_context_create("cpu", &ctx), ATTN_OK);
  assert_int_equal(attn__cpu_products_force(ctx, 7, NULL), ATTN_EINVAL);
  assert_true(at_mentions(attn_errmsg(ctx), "products"));
  if (!attn__cpu_sbgemm_built()) {
    assert_int_equal(attn__cpu_products_force(ctx, ATTN__CPU_PRODUCTS_SBGEMM, NULL),
                     ATTN_EUNSUPPORTED);
    assert_true(strstr(attn_errmsg(ctx), "cblas_sbgemm") != NULL);
  }
  if (!attn__cpu_bf16_kernel_native()) {
    assert_int_equal(attn__cpu_products_force(ctx, ATTN__CPU_PRODUCTS_BF16, NULL),
                     ATTN_EUNSUPPORTED);
    assert_true(strstr(attn_errmsg(ctx), "AVX512_BF16") != NULL);
  }
  attn_context_free(ctx);
}

/* The products of few rows on AMX's tiles (cpu/cpu_few_amx.c), built on
 * the emulated tiles: two kv heads' scores and one's O against double
 * sums, keys read where they lie evenly spaced and copied where not (a
 * paged cache) or where a block of 16 runs out, columns past a tile of 16
 * (C = 20), and each score's bits the same whichever heads and columns
 * are computed beside it (the forward's many heads, the backward's one). */
static void few_row_tiles_agree_with_sums(at_backend *b) {
  (void)b;
#if defined(AT_HAVE_SIMDE)
  /* Two kv heads of C columns each; a key row holds K of both, then V. */
  enum { NK = 45, C = 20, CT = 2 * C, LDQ = CT + 16, MAXD = 256 };
  static const int ds[] = {32, 128, 256};
  const size_t nkv = (size_t)2 * NK * 4 * MAXD;
  uint16_t *kv = at_malloc(nkv * sizeof *kv);
  float *qf = at_malloc((size_t)CT * MAXD * sizeof *qf), *pf = at_malloc((size_t)NK * C * 4);
  uint32_t *qp = at_malloc((size_t)MAXD / 2 * LDQ * sizeof *qp);
  uint32_t *pairs = at_malloc((size_t)(NK + 1) / 2 * C * sizeof *pairs);
  float *st = at_malloc((size_t)NK * CT * sizeof *st), *one = at_malloc((size_t)NK * CT * 4);
  float *o = at_malloc((size_t)C * MAXD * sizeof *o);
  uint32_t s = 4242;
  for (size_t di = 0; di < sizeof ds / sizeof *ds; di++)
    for (int paged = 0; paged < 2; paged++) {
      const int d = ds[di];
      /* Rows 4 d apart; paged: a gap after every fifth key, as pages of 5
       * would leave. */
      const uint16_t *k[NK], *v[NK], *kh[NK];
      for (int a = 0; a < NK; a++) {
        const size_t at = ((size_t)a + (paged ? (size_t)a / 5 : 0)) * 4 * d;
        k[a] = kv + at;
        v[a] = kv + at + 2 * d;
      }
      for (size_t x = 0; x < nkv; x++) {
        s = s * 1664525u + 1013904223u;
        kv[x] = attn__f32_to_bf16((float)((double)(s >> 8) / 8388608.0 - 1.0));
      }
      for (int c = 0; c < CT; c++)
        for (int x = 0; x < d; x++) {
          s = s * 1664525u + 1013904223u;
          const float f = (float)((double)(s >> 8) / 8388608.0 - 1.0);
          qf[c * d + x] = attn__bf16_to_f32(attn__f32_to_bf16(f));
        }
      memset(qp, 0, (size_t)MAXD / 2 * LDQ * sizeof *qp);
      for (int p = 0; p < d / 2; p++)
        for (int c = 0; c < CT; c++)
          qp[p * LDQ + c] = attn__cpu_bf16_bits(qf[c * d + 2 * p]) |
                            attn__cpu_bf16_bits(qf[c * d + 2 * p + 1]) << 16;
      const float scale = 1.0f / sqrtf((float)d);
      static const int cols[] = {0, C, CT};
      at_qk_few_amx_emulated(k, v, d, 2, cols, NK, NK, d, qp, LDQ, scale, st, CT);
      /* One head, four columns at a time. */
      for (int c0 = 0; c0 < CT; c0 += 4) {
        const int four[] = {c0, c0 + 4};
        for (int a = 0; a < NK; a++)
          kh[a] = k[a] + c0 / C * d;
        at_qk_few_amx_emulated(kh, NULL, d, 1, four, NK, NK, d, qp, LDQ, scale, one, CT);
      }
      for (int a = 0; a < NK; a++)
        for (int c = 0; c < CT; c++) {
          const float got = st[a * CT + c];
          if (memcmp(&got, &one[a * CT + c], sizeof got) != 0)
            fail_msg("d %d paged %d: score %d,%d %.9g with all columns, %.9g with four", d, paged,
                     a, c, got, one[a * CT + c]);
          double want = 0, mag = 0;
          for (int x = 0; x < d; x++) {
            const double t = (double)attn__bf16_to_f32(k[a][c / C * d + x]) * qf[c * d + x];
            want += t;
            mag += fabs(t);
          }
          const double tol = (d + 2) * 0x1p-24 * scale * mag;
          if (!(fabs(got - want * scale) <= tol))
            fail_msg("d %d paged %d: score %d,%d %.9g, want %.9g", d, paged, a, c, got,
                     want * scale);
        }
      /* O += P V onto ones, P in pairs of bf16 (an odd last key alone). */
      for (int a = 0; a < NK; a++)
        for (int c = 0; c < C; c++) {
          s = s * 1664525u + 1013904223u;
          pf[a * C + c] =
              attn__bf16_to_f32(attn__f32_to_bf16((float)((double)(s >> 8) / 16777216.0)));
        }
      for (int p = 0; p < (NK + 1) / 2; p++)
        for (int c = 0; c < C; c++)
          pairs[p * C + c] =
              attn__cpu_bf16_bits(pf[2 * p * C + c]) |
              (2 * p + 1 < NK ? attn__cpu_bf16_bits(pf[(2 * p + 1) * C + c]) << 16 : 0);
      for (int n = 16; n <= C; n += C - 16) {
        for (int x = 0; x < C * d; x++)
          o[x] = 1.0f;
        at_pv_few_amx_emulated(v, NK, d, pairs, C, n, o);
        for (int c = 0; c < C; c++)
          for (int x = 0; x < d; x++) {
            double want = 1, mag = 1;
            for (int a = 0; c < n && a < NK; a++) {
              const double t = (double)pf[a * C + c] * attn__bf16_to_f32(v[a][x]);
              want += t;
              mag += fabs(t);
            }
            const double got = o[c * d + x], tol = (2 * NK + 2) * 0x1p-24 * mag;
            if (!(fabs(got - want) <= tol))
              fail_msg("d %d paged %d columns %d: O %d,%d %.9g, want %.9g", d, paged, n, c, x, got,
                       want);
          }
      }
    }
  at_free(kv);
  at_free(qf);
  at_free(pf);
  at_free(qp);
  at_free(pairs);
  at_free(st);
  at_free(one);
  at_free(o);
#else
  at_skip("no SIMDe here (libsimde-dev): the emulated tiles are built beside it");
#endif
}

static void common_forcing(at_backend *b) {
  (void)b;
  forcing_a_missing_path_says_why();
}

int main(int argc, char **argv) {
  static const char *names[] = {"simde", "amx_emulated", "native", "sbgemm"};
  static char tn[8][96];
  at_test tests[9];
  size_t nt = 0;
  for (int i = 0; i < 4; i++) {
    snprintf(tn[2 * i], sizeof tn[0], "golden_bf16_cases_hold_through_%s_products", names[i]);
    tests[nt++] = (at_test){tn[2 * i], golden_bf16_cases_hold_through_each_path, &paths[i]};
    snprintf(tn[2 * i + 1], sizeof tn[0], "random_bf16_problems_hold_through_%s_products",
             names[i]);
    tests[nt++] = (at_test){tn[2 * i + 1], random_bf16_problems_hold_through_each_path, &paths[i]};
  }
  tests[nt++] = (at_test){"other_dtypes_keep_f32_products", other_dtypes_keep_f32_products, NULL};
  const at_test common[] = {
      {"bf16_kernel_sums_pairs_of_products", bf16_kernel_sums_pairs_of_products, NULL},
      {"f32_kernels_sum_products", f32_kernels_sum_products, NULL},
      {"few_row_products_agree_across_tiles", few_row_products_agree_across_tiles, NULL},
      {"few_row_tiles_agree_with_sums", few_row_tiles_agree_with_sums, NULL},
      {"forcing_a_missing_path_says_why", common_forcing, NULL}};
  return at_main(argc, argv, "products", tests, nt, common, 5);
}
