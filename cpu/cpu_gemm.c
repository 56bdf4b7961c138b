/*
 * f32 tile products on the CPU's FMA units, without OpenBLAS: C = alpha
 * op(A) B + beta C, op(A) = A or A^T (attn__cpu_sgemm_fn, as attn__cpu_gemm
 * but never B^T, which no pass asks for). The passes' operands are tiles
 * already in cache, laid out for these products (see attn__cpu_load_t), so
 * nothing is packed: each step broadcasts MR elements of A and loads two
 * vectors of a row of B. OpenBLAS 0.3.21's Haswell/Zen sgemm packs both
 * operands of every 64 x 64 x 64 tile product, which on the build host
 * took a third as long as its kernel (perf: 25 % of the backward in the
 * copy routines against 50 % in the kernel).
 *
 * Each element of C is one chain of fused multiply-adds over k in order,
 * whatever the shapes around it: the forward and the backward compute the
 * same scores to the bit with any tile widths.
 *
 * AVX2 with FMA and AVX-512, each through the target attribute, chosen at
 * run time (attn__cpu_sgemm_native). With ATTN_CPU_GEMM_SIMDE the AVX-512
 * kernel builds on SIMDe's portable intrinsics under the name
 * ATTN_CPU_GEMM512_NAME (the tests), as cpu_bf16_avx512.c does.
 */
#include "cpu_internal.h"

#include <string.h>

#if defined(ATTN_CPU_GEMM_SIMDE)
#define SIMDE_ENABLE_NATIVE_ALIASES
#include <simde/x86/avx512.h>
#define CPU_512_TARGET
#define CPU_GEMM_ONLY_512 1
#elif defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define CPU_512_TARGET __attribute__((target("avx512f")))
#define CPU_256_TARGET __attribute__((target("avx2,fma")))
#define CPU_GEMM_X86 1
#endif

#ifndef ATTN_CPU_GEMM512_NAME
#define ATTN_CPU_GEMM512_NAME attn__cpu_sgemm_avx512
#endif

#if defined(CPU_GEMM_X86) || defined(CPU_GEMM_ONLY_512)

/* ---------------------------------------------------------------------- */
/* AVX-512: 8 rows x 32 columns a step (16 accumulators)                     */
/* ---------------------------------------------------------------------- */

/* The first w (0..16) lanes of p as a vector, the others 0; and back. SIMDe
 * 0.7 has no masked loads: there, lane by lane. */
#if defined(CPU_GEMM_ONLY_512)
static inline __m512 cpu_ld16(const float *p, int w) {
  float x[16] = {0};
  for (int i = 0; i < w; i++)
    x[i] = p[i];
  return _mm512_loadu_ps(x);
}
static inline void cpu_st16(float *p, int w, __m512 v) {
  float x[16];
  _mm512_storeu_ps(x, v);
  for (int i = 0; i < w; i++)
    p[i] = x[i];
}
#else
CPU_512_TARGET static inline __m512 cpu_ld16(const float *p, int w) {
  return w >= 16 ? _mm512_loadu_ps(p) : _mm512_maskz_loadu_ps((__mmask16)((1u << w) - 1), p);
}
CPU_512_TARGET static inline void cpu_st16(float *p, int w, __m512 v) {
  if (w >= 16)
    _mm512_storeu_ps(p, v);
  else
    _mm512_mask_storeu_ps(p, (__mmask16)((1u << w) - 1), v);
}
#endif

/* mr rows (a constant where inlined) by w0 + w1 columns (w0 16 when w1 >
 * 0) over k. ta: A stored transposed (element (i, p) at a[p * lda + i]). */
CPU_512_TARGET static inline __attribute__((always_inline)) void cpu_tile512(
    const int mr, const int ta, int k, float alpha, const float *a, int lda, const float *b,
    int ldb, float beta, float *c, int ldc, const int w0, const int w1) {
  __m512 acc[8][2];
  for (int i = 0; i < mr; i++) {
    acc[i][0] = _mm512_setzero_ps();
    acc[i][1] = _mm512_setzero_ps();
  }
  for (int p = 0; p < k; p++) {
    const float *brow = b + (size_t)p * ldb;
    const __m512 b0 = cpu_ld16(brow, w0);
    const __m512 b1 = w1 ? cpu_ld16(brow + 16, w1) : _mm512_setzero_ps();
    for (int i = 0; i < mr; i++) {
      const __m512 x = _mm512_set1_ps(ta ? a[(size_t)p * lda + i] : a[(size_t)i * lda + p]);
      acc[i][0] = _mm512_fmadd_ps(x, b0, acc[i][0]);
      if (w1) acc[i][1] = _mm512_fmadd_ps(x, b1, acc[i][1]);
    }
  }
  const __m512 va = _mm512_set1_ps(alpha);
  for (int i = 0; i < mr; i++) {
    float *crow = c + (size_t)i * ldc;
    __m512 r0 = _mm512_mul_ps(va, acc[i][0]);
    /* beta = 0 never reads C (it may hold NaN). */
    if (beta != 0.0f) r0 = _mm512_fmadd_ps(_mm512_set1_ps(beta), cpu_ld16(crow, w0), r0);
    cpu_st16(crow, w0, r0);
    if (w1) {
      __m512 r1 = _mm512_mul_ps(va, acc[i][1]);
      if (beta != 0.0f) r1 = _mm512_fmadd_ps(_mm512_set1_ps(beta), cpu_ld16(crow + 16, w1), r1);
      cpu_st16(crow + 16, w1, r1);
    }
  }
}

CPU_512_TARGET void ATTN_CPU_GEMM512_NAME(int ta, int tb, int m, int n, int k, float alpha,
                                          const float *a, int lda, const float *b, int ldb,
                                          float beta, float *c, int ldc) {
  (void)tb; /* never 1 (attn__cpu_sgemm_fn) */
  for (int j = 0; j < n; j += 32) {
    const int w = n - j < 32 ? n - j : 32;
    const int w0 = w < 16 ? w : 16, w1 = w - w0;
    int i = 0;
    /* A's rows (ta 0) or columns (ta 1) from row i. */
#define CPU_A(i) (ta ? a + (i) : a + (size_t)(i)*lda)
    if (w == 32 && !ta)
      for (; i + 8 <= m; i += 8)
        cpu_tile512(8, 0, k, alpha, CPU_A(i), lda, b + j, ldb, beta, c + (size_t)i * ldc + j, ldc,
                    16, 16);
    else if (w == 32)
      for (; i + 8 <= m; i += 8)
        cpu_tile512(8, 1, k, alpha, CPU_A(i), lda, b + j, ldb, beta, c + (size_t)i * ldc + j, ldc,
                    16, 16);
    for (; i + 8 <= m; i += 8)
      cpu_tile512(8, ta, k, alpha, CPU_A(i), lda, b + j, ldb, beta, c + (size_t)i * ldc + j, ldc,
                  w0, w1);
    if (i + 4 <= m) {
      cpu_tile512(4, ta, k, alpha, CPU_A(i), lda, b + j, ldb, beta, c + (size_t)i * ldc + j, ldc,
                  w0, w1);
      i += 4;
    }
    for (; i < m; i++)
      cpu_tile512(1, ta, k, alpha, CPU_A(i), lda, b + j, ldb, beta, c + (size_t)i * ldc + j, ldc,
                  w0, w1);
#undef CPU_A
  }
}

#endif

#if defined(CPU_GEMM_X86)

/* ---------------------------------------------------------------------- */
/* AVX2 and FMA: 6 rows x 16 columns a step (12 accumulators)                */
/* ---------------------------------------------------------------------- */

/* The first w (0..8) lanes of p, the others 0; and back. */
CPU_256_TARGET static inline __m256i cpu_mask8(int w) {
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(w), lane);
}
CPU_256_TARGET static inline __m256 cpu_ld8(const float *p, int w) {
  return w >= 8 ? _mm256_loadu_ps(p) : _mm256_maskload_ps(p, cpu_mask8(w));
}
CPU_256_TARGET static inline void cpu_st8(float *p, int w, __m256 v) {
  if (w >= 8)
    _mm256_storeu_ps(p, v);
  else
    _mm256_maskstore_ps(p, cpu_mask8(w), v);
}

CPU_256_TARGET static inline __attribute__((always_inline)) void cpu_tile256(
    const int mr, const int ta, int k, float alpha, const float *a, int lda, const float *b,
    int ldb, float beta, float *c, int ldc, const int w0, const int w1) {
  __m256 acc[6][2];
  for (int i = 0; i < mr; i++) {
    acc[i][0] = _mm256_setzero_ps();
    acc[i][1] = _mm256_setzero_ps();
  }
  for (int p = 0; p < k; p++) {
    const float *brow = b + (size_t)p * ldb;
    const __m256 b0 = cpu_ld8(brow, w0);
    const __m256 b1 = w1 ? cpu_ld8(brow + 8, w1) : _mm256_setzero_ps();
    for (int i = 0; i < mr; i++) {
      const __m256 x = _mm256_broadcast_ss(ta ? a + (size_t)p * lda + i : a + (size_t)i * lda + p);
      acc[i][0] = _mm256_fmadd_ps(x, b0, acc[i][0]);
      if (w1) acc[i][1] = _mm256_fmadd_ps(x, b1, acc[i][1]);
    }
  }
  const __m256 va = _mm256_set1_ps(alpha);
  for (int i = 0; i < mr; i++) {
    float *crow = c + (size_t)i * ldc;
    __m256 r0 = _mm256_mul_ps(va, acc[i][0]);
    if (beta != 0.0f) r0 = _mm256_fmadd_ps(_mm256_set1_ps(beta), cpu_ld8(crow, w0), r0);
    cpu_st8(crow, w0, r0);
    if (w1) {
      __m256 r1 = _mm256_mul_ps(va, acc[i][1]);
      if (beta != 0.0f) r1 = _mm256_fmadd_ps(_mm256_set1_ps(beta), cpu_ld8(crow + 8, w1), r1);
      cpu_st8(crow + 8, w1, r1);
    }
  }
}

CPU_256_TARGET static void cpu_sgemm_avx2(int ta, int tb, int m, int n, int k, float alpha,
                                          const float *a, int lda, const float *b, int ldb,
                                          float beta, float *c, int ldc) {
  (void)tb;
  for (int j = 0; j < n; j += 16) {
    const int w = n - j < 16 ? n - j : 16;
    const int w0 = w < 8 ? w : 8, w1 = w - w0;
    int i = 0;
#define CPU_A(i) (ta ? a + (i) : a + (size_t)(i)*lda)
    /* Whole tiles with every width and A's layout constant, so that the
     * accumulators stay in registers and the loop has no branch. */
    if (w == 16 && !ta)
      for (; i + 6 <= m; i += 6)
        cpu_tile256(6, 0, k, alpha, CPU_A(i), lda, b + j, ldb, beta, c + (size_t)i * ldc + j, ldc,
                    8, 8);
    else if (w == 16)
      for (; i + 6 <= m; i += 6)
        cpu_tile256(6, 1, k, alpha, CPU_A(i), lda, b + j, ldb, beta, c + (size_t)i * ldc + j, ldc,
                    8, 8);
    for (; i + 6 <= m; i += 6)
      cpu_tile256(6, ta, k, alpha, CPU_A(i), lda, b + j, ldb, beta, c + (size_t)i * ldc + j, ldc,
                  w0, w1);
    if (i + 3 <= m) {
      cpu_tile256(3, ta, k, alpha, CPU_A(i), lda, b + j, ldb, beta, c + (size_t)i * ldc + j, ldc,
                  w0, w1);
      i += 3;
    }
    for (; i < m; i++)
      cpu_tile256(1, ta, k, alpha, CPU_A(i), lda, b + j, ldb, beta, c + (size_t)i * ldc + j, ldc,
                  w0, w1);
#undef CPU_A
  }
}

attn__cpu_sgemm_fn *attn__cpu_sgemm_native(void) {
  if (__builtin_cpu_supports("avx512f")) return attn__cpu_sgemm_avx512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return cpu_sgemm_avx2;
  return NULL;
}

#elif !defined(CPU_GEMM_ONLY_512)

attn__cpu_sgemm_fn *attn__cpu_sgemm_native(void) {
  return NULL;
}

#endif
