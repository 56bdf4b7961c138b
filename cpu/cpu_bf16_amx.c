/*
 * The bf16 tile product on AMX (AMX-TILE, AMX-BF16: Sapphire Rapids and
 * later): the layouts of attn__cpu_bf16_gemm (A in bf16 rows, B in pairs
 * of rows interleaved) are the ones TDPBF16PS reads, A a tile of 16 rows x
 * 32 bf16 and B one of 16 pair rows x 16 columns, summed into a tile of 16
 * x 16 f32. C is taken in blocks of up to 32 x 32 (four accumulator tiles,
 * each A and B tile loaded once for two products); what is left of the
 * rows, the columns and the pairs beyond multiples of 16 goes through the
 * AVX512_BF16 kernel (cpu_bf16_avx512.c), which every AMX CPU has. cpu.c's
 * rule takes this kernel only after the kernel has asked Linux for the
 * tile state (attn__cpu_bf16_amx_ready in cpu_bf16.c).
 *
 * With ATTN_CPU_BF16_EMULATED the source builds without the target
 * attribute and without <immintrin.h>, against whatever the build
 * includes first (-include) to define the _tile_* operations and the
 * kernels' names: the tests check it on CPUs without AMX that way.
 */
#include "cpu_amx.h"
#include "cpu_internal.h"

#ifndef ATTN_CPU_AMX_KERNEL_NAME
#define ATTN_CPU_AMX_KERNEL_NAME attn__cpu_bf16_gemm_amx
#endif
#ifndef ATTN_CPU_BF16_KERNEL_NAME
#define ATTN_CPU_BF16_KERNEL_NAME attn__cpu_bf16_gemm_avx512
#endif

void ATTN_CPU_BF16_KERNEL_NAME(int m, int n, int kp, float alpha, const uint16_t *a, int lda,
                               const uint32_t *b, int ldb, float beta, float *c, int ldc);

/* Accumulators 0-3 (C blocks (0,0), (0,1), (1,0), (1,1)), A 4-5, B 6-7. */
CPU_AMX_TARGET static void cpu_amx_block(int two_rows, int two_cols, int kp16, const uint16_t *a,
                                         int lda, const uint32_t *b, int ldb, float *acc) {
  const size_t sa = (size_t)lda * sizeof(uint16_t), sb = (size_t)ldb * sizeof(uint32_t);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (int p = 0; p < kp16; p += 16) {
    _tile_loadd(4, a + 2 * p, sa);
    _tile_loadd(6, b + (size_t)p * ldb, sb);
    _tile_dpbf16ps(0, 4, 6);
    if (two_cols) {
      _tile_loadd(7, b + (size_t)p * ldb + 16, sb);
      _tile_dpbf16ps(1, 4, 7);
    }
    if (two_rows) {
      _tile_loadd(5, a + (size_t)16 * lda + 2 * p, sa);
      _tile_dpbf16ps(2, 5, 6);
      if (two_cols) _tile_dpbf16ps(3, 5, 7);
    }
  }
  /* acc: 32 x 32 f32, row stride 32. */
  _tile_stored(0, acc, 32 * sizeof(float));
  if (two_cols) _tile_stored(1, acc + 16, 32 * sizeof(float));
  if (two_rows) _tile_stored(2, acc + 16 * 32, 32 * sizeof(float));
  if (two_rows && two_cols) _tile_stored(3, acc + 16 * 32 + 16, 32 * sizeof(float));
}

CPU_AMX_TARGET void ATTN_CPU_AMX_KERNEL_NAME(int m, int n, int kp, float alpha, const uint16_t *a,
                                             int lda, const uint32_t *b, int ldb, float beta,
                                             float *c, int ldc) {
  const int m16 = m / 16 * 16, n16 = n / 16 * 16, kp16 = kp / 16 * 16;
  if (m16 && n16 && kp16) {
    cpu_amx_tiles();
    float acc[32 * 32];
    for (int i = 0; i < m16; i += 32)
      for (int j = 0; j < n16; j += 32) {
        const int two_rows = i + 32 <= m16, two_cols = j + 32 <= n16;
        cpu_amx_block(two_rows, two_cols, kp16, a + (size_t)i * lda, lda, b + j, ldb, acc);
        const int rows = two_rows ? 32 : 16, cols = two_cols ? 32 : 16;
        for (int r = 0; r < rows; r++) {
          float *crow = c + (size_t)(i + r) * ldc + j;
          const float *x = acc + r * 32;
          /* beta = 0 never reads C (it may hold NaN). */
          if (beta == 0.0f)
            for (int q = 0; q < cols; q++)
              crow[q] = alpha * x[q];
          else
            for (int q = 0; q < cols; q++)
              crow[q] = alpha * x[q] + beta * crow[q];
        }
      }
    _tile_release();
    /* The pairs past the multiple of 16, onto the same block. */
    if (kp16 < kp)
      ATTN_CPU_BF16_KERNEL_NAME(m16, n16, kp - kp16, alpha, a + 2 * kp16, lda,
                                b + (size_t)kp16 * ldb, ldb, 1.0f, c, ldc);
  } else {
    ATTN_CPU_BF16_KERNEL_NAME(m, n, kp, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
  /* The columns right of the block, then the rows below it. */
  if (n16 < n)
    ATTN_CPU_BF16_KERNEL_NAME(m16, n - n16, kp, alpha, a, lda, b + n16, ldb, beta, c + n16, ldc);
  if (m16 < m)
    ATTN_CPU_BF16_KERNEL_NAME(m - m16, n, kp, alpha, a + (size_t)m16 * lda, lda, b, ldb, beta,
                              c + (size_t)m16 * ldc, ldc);
}
