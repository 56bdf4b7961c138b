/*
 * The bf16 tile product on the CPU's own bf16 dot-product instruction
 * (AVX512_BF16's vdpbf16ps): C = alpha A B + beta C with A in bf16 rows
 * and B in pairs of bf16 rows interleaved (attn__cpu_bf16_gemm in
 * cpu_internal.h says the layout), each step summing two products of a
 * pair into an f32 lane. The forward's two products, S^T = scale K Q^T and
 * O += P V, take it where the CPU has the instruction (cpu.c's rule).
 *
 * Built for AVX-512 through the target attribute, so the library stays
 * generic x86-64 and calls it only after the run-time check. With
 * ATTN_CPU_BF16_SIMDE the same source builds on SIMDe's portable
 * definitions of the intrinsics instead, under the name the build gives
 * it (ATTN_CPU_BF16_KERNEL_NAME): the test suite runs the kernel that way
 * on CPUs without the instruction.
 */
#include "cpu_internal.h"

#include <string.h>

#if defined(ATTN_CPU_BF16_SIMDE)
#define SIMDE_ENABLE_NATIVE_ALIASES
#include <simde/x86/avx512.h>
#define CPU_BF16_TARGET
typedef simde__mmask16 cpu_mask16;
#else
#include <immintrin.h>
#define CPU_BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))
typedef __mmask16 cpu_mask16;
#endif

/* Masked loads and stores of 16 lanes (lane i where bit i of k is set; the
 * others load 0 and are not stored). SIMDe 0.7 lacks them: there, lane by
 * lane. */
#if defined(ATTN_CPU_BF16_SIMDE)
static inline __m512i cpu_load_epi32(cpu_mask16 k, const uint32_t *p) {
  uint32_t x[16];
  for (int i = 0; i < 16; i++)
    x[i] = k >> i & 1 ? p[i] : 0;
  return _mm512_loadu_si512(x);
}
static inline __m512 cpu_load_ps(cpu_mask16 k, const float *p) {
  float x[16];
  for (int i = 0; i < 16; i++)
    x[i] = k >> i & 1 ? p[i] : 0.0f;
  return _mm512_loadu_ps(x);
}
static inline void cpu_store_ps(float *p, cpu_mask16 k, __m512 v) {
  float x[16];
  _mm512_storeu_ps(x, v);
  for (int i = 0; i < 16; i++)
    if (k >> i & 1) p[i] = x[i];
}
#else
#define cpu_load_epi32(k, p) _mm512_maskz_loadu_epi32((k), (p))
#define cpu_load_ps(k, p) _mm512_maskz_loadu_ps((k), (p))
#define cpu_store_ps(p, k, v) _mm512_mask_storeu_ps((p), (k), (v))
#endif

#ifndef ATTN_CPU_BF16_KERNEL_NAME
#define ATTN_CPU_BF16_KERNEL_NAME attn__cpu_bf16_gemm_avx512
#endif

/* Rows of C a micro-tile holds; its columns are two vectors of 16. 8 x 2
 * accumulators, two B vectors and a broadcast A pair take 19 of the 32
 * registers, and each step's 16 dot products hide the instruction's
 * latency. */
#define CPU_BF16_MR 8
#define CPU_BF16_NR 32

CPU_BF16_TARGET static inline __m512bh cpu_as_bh(__m512i x) {
  __m512bh y;
  memcpy(&y, &x, sizeof y);
  return y;
}

/* mr rows (a constant where inlined) by up to 32 columns (masks m0, m1) of
 * C over kp pairs. */
CPU_BF16_TARGET static inline __attribute__((always_inline)) void cpu_bf16_tile(
    const int mr, int kp, float alpha, const uint16_t *a, int lda, const uint32_t *b, int ldb,
    float beta, float *c, int ldc, cpu_mask16 m0, cpu_mask16 m1) {
  __m512 acc[CPU_BF16_MR][2];
  for (int i = 0; i < mr; i++) {
    acc[i][0] = _mm512_setzero_ps();
    acc[i][1] = _mm512_setzero_ps();
  }
  for (int p = 0; p < kp; p++) {
    const __m512bh b0 = cpu_as_bh(cpu_load_epi32(m0, b + (size_t)p * ldb));
    const __m512bh b1 = cpu_as_bh(cpu_load_epi32(m1, b + (size_t)p * ldb + 16));
    for (int i = 0; i < mr; i++) {
      int32_t pair;
      memcpy(&pair, a + (size_t)i * lda + 2 * p, sizeof pair);
      const __m512bh x = cpu_as_bh(_mm512_set1_epi32(pair));
      acc[i][0] = _mm512_dpbf16_ps(acc[i][0], x, b0);
      acc[i][1] = _mm512_dpbf16_ps(acc[i][1], x, b1);
    }
  }
  const __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
  for (int i = 0; i < mr; i++) {
    float *crow = c + (size_t)i * ldc;
    __m512 r0 = _mm512_mul_ps(va, acc[i][0]), r1 = _mm512_mul_ps(va, acc[i][1]);
    /* beta = 0 never reads C, which may hold anything (NaN included). */
    if (beta != 0.0f) {
      r0 = _mm512_fmadd_ps(vb, cpu_load_ps(m0, crow), r0);
      r1 = _mm512_fmadd_ps(vb, cpu_load_ps(m1, crow + 16), r1);
    }
    cpu_store_ps(crow, m0, r0);
    cpu_store_ps(crow + 16, m1, r1);
  }
}

CPU_BF16_TARGET void ATTN_CPU_BF16_KERNEL_NAME(int m, int n, int kp, float alpha, const uint16_t *a,
                                               int lda, const uint32_t *b, int ldb, float beta,
                                               float *c, int ldc) {
  for (int j = 0; j < n; j += CPU_BF16_NR) {
    const int w = n - j < CPU_BF16_NR ? n - j : CPU_BF16_NR;
    const cpu_mask16 m0 = (cpu_mask16)(w >= 16 ? 0xffff : (1u << w) - 1);
    const cpu_mask16 m1 = (cpu_mask16)(w <= 16 ? 0 : w >= 32 ? 0xffff : (1u << (w - 16)) - 1);
    const uint32_t *bj = b + j;
    float *cj = c + j;
    int i = 0;
    for (; i + CPU_BF16_MR <= m; i += CPU_BF16_MR)
      cpu_bf16_tile(CPU_BF16_MR, kp, alpha, a + (size_t)i * lda, lda, bj, ldb, beta,
                    cj + (size_t)i * ldc, ldc, m0, m1);
    /* The rest of the rows: four at once, then one by one. */
    if (i + 4 <= m) {
      cpu_bf16_tile(4, kp, alpha, a + (size_t)i * lda, lda, bj, ldb, beta, cj + (size_t)i * ldc,
                    ldc, m0, m1);
      i += 4;
    }
    for (; i < m; i++)
      cpu_bf16_tile(1, kp, alpha, a + (size_t)i * lda, lda, bj, ldb, beta, cj + (size_t)i * ldc,
                    ldc, m0, m1);
  }
}
