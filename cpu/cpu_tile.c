/*
 * Tile plumbing shared by the CPU forward and backward passes: gathering
 * rows into f32 tiles and scattering them back, the tile products, the
 * score transform (softcap, ALiBi, window mask) and the exponential of the
 * online softmax. The algorithm itself is in cpu_forward.c and
 * cpu_backward.c.
 */
#include "cpu_internal.h"

#include <cblas.h>
#include <limits.h>
#include <stdlib.h>

void *attn__cpu_alloc(size_t bytes) {
  size_t rounded = (bytes + 63) / 64 * 64;
  if (rounded < bytes) return NULL;
  return aligned_alloc(64, rounded ? rounded : 64);
}

void attn__cpu_free(void *p) {
  free(p);
}

/* ---------------------------------------------------------------------- */
/* Tile products                                                            */
/* ---------------------------------------------------------------------- */

/* Every tile product runs inside an OpenMP parallel region, one per thread.
 * Debian's libopenblas0-pthread has its own thread pool and does not look at
 * omp_in_parallel(): interface/gemm.c of OpenBLAS 0.3.x runs a product on the
 * calling thread only when m*n*k <= SMP_THRESHOLD_MIN (65536) *
 * GEMM_MULTITHREAD_THRESHOLD (4 by default) = 262144, and hands bigger ones
 * to its pool, which would put its threads on top of ours (measured: a
 * 64x64x65 sgemm in a 2-thread process keeps both cores busy, a 64x64x64 one
 * only the caller's). Rather than calling openblas_set_num_threads(1), which
 * changes the whole process's setting behind the user's back (and races
 * with the user's own BLAS calls from other threads), the products are cut
 * into pieces that stay under that limit. A piece of 64x64x64 loses nothing:
 * single-threaded it runs at 112 GFLOP/s on the build host, while a
 * 64x64x128 product handed to the pool ran at 47. The cuts are fixed by the
 * shapes alone, so results do not depend on the thread count. With the
 * OpenMP build of OpenBLAS the limit is harmless (that build runs
 * single-threaded inside a parallel region anyway), and so is a build with
 * a larger GEMM_MULTITHREAD_THRESHOLD. */
#define CPU_GEMM_MAX_MNK 262144

static int cpu_half(int x) {
  int h = (x / 2 + 15) / 16 * 16; /* keep pieces a multiple of a SIMD width */
  return h < x ? h : x / 2;
}

void attn__cpu_gemm(int ta, int tb, int m, int n, int k, float alpha, const float *a, int lda,
                    const float *b, int ldb, float beta, float *c, int ldc) {
  if (m <= 0 || n <= 0) return;
  if (k <= 0) {
    for (int i = 0; i < m; i++)
      for (int j = 0; j < n; j++)
        c[(size_t)i * ldc + j] = beta == 0.0f ? 0.0f : beta * c[(size_t)i * ldc + j];
    return;
  }
  if ((int64_t)m * n * k <= CPU_GEMM_MAX_MNK) {
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m, n,
                k, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
  if (n >= k && n >= m) {
    /* Columns of C: columns of op(B). */
    int n1 = cpu_half(n);
    attn__cpu_gemm(ta, tb, m, n1, k, alpha, a, lda, b, ldb, beta, c, ldc);
    attn__cpu_gemm(ta, tb, m, n - n1, k, alpha, a, lda, tb ? b + (size_t)n1 * ldb : b + n1, ldb,
                   beta, c + n1, ldc);
  } else if (k >= m) {
    /* The inner dimension: the second half accumulates onto the first. */
    int k1 = cpu_half(k);
    attn__cpu_gemm(ta, tb, m, n, k1, alpha, a, lda, b, ldb, beta, c, ldc);
    attn__cpu_gemm(ta, tb, m, n, k - k1, alpha, ta ? a + (size_t)k1 * lda : a + k1, lda,
                   tb ? b + k1 : b + (size_t)k1 * ldb, ldb, 1.0f, c, ldc);
  } else {
    /* Rows of C: rows of op(A). */
    int m1 = cpu_half(m);
    attn__cpu_gemm(ta, tb, m1, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    attn__cpu_gemm(ta, tb, m - m1, n, k, alpha, ta ? a + m1 : a + (size_t)m1 * lda, lda, b, ldb,
                   beta, c + (size_t)m1 * ldc, ldc);
  }
}

/* The elementwise loops over a tile (gathers with dtype conversion, the
 * softmax) are built for AVX-512, AVX2 and the baseline, picked at load
 * time (an ifunc): the library is compiled for generic x86-64 (SSE2, 4
 * floats a vector), and after the products these loops are the passes'
 * main cost. The clones are static, behind plain attn__cpu_ wrappers:
 * clang names a cloned function's ifunc differently from gcc, so callers
 * in other files would not link to it. Elsewhere, or on compilers without the
 * attribute, the baseline alone. One machine always runs the same clone, so
 * results stay reproducible. */
/* ThreadSanitizer instruments the ifunc's resolver, which the loader runs
 * before TSan's runtime is up (a crash at load): a TSan build takes the
 * baseline. */
#if defined(__SANITIZE_THREAD__)
#define CPU_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define CPU_TSAN 1
#endif
#endif
#if defined(__x86_64__) && defined(__ELF__) && defined(__has_attribute) && !defined(CPU_TSAN)
#if __has_attribute(target_clones)
#define CPU_SIMD_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#endif
#endif
#ifndef CPU_SIMD_CLONES
#define CPU_SIMD_CLONES
#endif

/* ---------------------------------------------------------------------- */
/* Gather and scatter                                                       */
/* ---------------------------------------------------------------------- */

/* f16 to f32, bit-exact with attn__f16_to_f32 for all 65536 inputs
 * (checked exhaustively), but inline and branch-free so that the gather
 * loops vectorize: the call per element made f16 problems twice as slow as
 * f32 ones, K and V being converted again for every block of queries. */
static inline float cpu_f16_to_f32(uint16_t h) {
  /* Signed ints: SSE2 has no unsigned compare or unsigned-to-float. */
  int32_t em = h & 0x7fff; /* exponent and mantissa */
  int32_t bits = (em << 13) + ((127 - 15) << 23);
  bits += em >= 0x7c00 ? (128 - 16) << 23 : 0;       /* inf, NaN: exponent 255 */
  float f, sub = (float)em * 5.9604644775390625e-8f; /* subnormal: em * 2^-24 */
  memcpy(&f, &bits, sizeof f);
  f = em < 0x400 ? sub : f;
  uint32_t u; /* the sign: unsigned, as 0x8000 << 16 overflows an int */
  memcpy(&u, &f, sizeof u);
  u |= (uint32_t)(h & 0x8000u) << 16;
  memcpy(&f, &u, sizeof f);
  return f;
}

/* A row of f16 with unit stride: the F16C instruction where the CPU has it
 * (one vcvtph2ps per 8 values; the portable conversion above, vectorized,
 * still costs 0.6 ns a value, which made f16 forward passes 1.5x slower
 * than bf16 ones on the build host). */
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
__attribute__((target("avx2,f16c"))) static void cpu_f16_row_f16c(const uint16_t *x, float *out,
                                                                  int64_t d) {
  int64_t c = 0;
  for (; c + 8 <= d; c += 8)
    _mm256_storeu_ps(out + c, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + c))));
  for (; c < d; c++)
    out[c] = cpu_f16_to_f32(x[c]);
}
/* AVX2 stands for F16C: every CPU with AVX2 has it, and clang 14 cannot
 * test "f16c" by name. */
#define CPU_HAVE_F16C() __builtin_cpu_supports("avx2")
#else
#define CPU_HAVE_F16C() 0
#define cpu_f16_row_f16c(x, out, d) ((void)0)
#endif

static char *cpu_row(const attn__tensor *t, int64_t b, int64_t row, int64_t h) {
  int64_t idx = b * t->sb + row * t->ss + h * t->sh;
  return (char *)t->native + t->offset + (ptrdiff_t)idx * (ptrdiff_t)attn_dtype_size(t->dtype);
}

/* Row `row` of a tile: a query-side row (counting from the tensor's first
 * row, as cpu_row) or, when keys, key row `row` of sequence b through
 * attn__key_row, so that bshd, varlen and paged caches take one path. */
static char *cpu_tile_row(const attn__problem *pb, const attn__tensor *t, int keys, int64_t b,
                          int64_t row, int64_t h) {
  if (!keys) return cpu_row(t, b, row, h);
  const int64_t idx = attn__key_row(pb, t, b, row) + h * t->sh;
  return (char *)t->native + t->offset + (ptrdiff_t)idx * (ptrdiff_t)attn_dtype_size(t->dtype);
}

static CPU_SIMD_CLONES void cpu_load_clones(const attn__problem *pb, const attn__tensor *t,
                                            int keys, int64_t b, int64_t row, int64_t nr, int64_t h,
                                            float *dst, int64_t ld) {
  const int64_t d = pb->head_dim, sd = t->sd;
  const int f16c = t->dtype == ATTN_F16 && CPU_HAVE_F16C();
  for (int64_t r = 0; r < nr; r++) {
    const char *src = cpu_tile_row(pb, t, keys, b, row + r, h);
    float *out = dst + r * ld;
    /* The unit column stride gets loops of its own: with sd a variable the
     * compiler does not vectorize the conversions (measured: f16 at 0.67
     * ns per element, against 0.18 for bf16). */
    if (t->dtype == ATTN_F32) {
      const float *x = (const float *)src;
      if (sd == 1)
        memcpy(out, x, (size_t)d * sizeof(float));
      else
        for (int64_t c = 0; c < d; c++)
          out[c] = x[c * sd];
    } else if (t->dtype == ATTN_F16) {
      const uint16_t *x = (const uint16_t *)src;
      if (sd == 1 && f16c)
        cpu_f16_row_f16c(x, out, d);
      else if (sd == 1)
        for (int64_t c = 0; c < d; c++)
          out[c] = cpu_f16_to_f32(x[c]);
      else
        for (int64_t c = 0; c < d; c++)
          out[c] = cpu_f16_to_f32(x[c * sd]);
    } else {
      const uint16_t *x = (const uint16_t *)src;
      if (sd == 1)
        for (int64_t c = 0; c < d; c++)
          out[c] = attn__bf16_to_f32(x[c]);
      else
        for (int64_t c = 0; c < d; c++)
          out[c] = attn__bf16_to_f32(x[c * sd]);
    }
  }
}

void attn__cpu_load(const attn__problem *pb, const attn__tensor *t, int64_t b, int64_t row,
                    int64_t nr, int64_t h, float *dst, int64_t ld) {
  cpu_load_clones(pb, t, 0, b, row, nr, h, dst, ld);
}

void attn__cpu_load_keys(const attn__problem *pb, const attn__tensor *t, int64_t b, int64_t j0,
                         int64_t nr, int64_t h, float *dst, int64_t ld) {
  cpu_load_clones(pb, t, 1, b, j0, nr, h, dst, ld);
}

static CPU_SIMD_CLONES void cpu_load_t_clones(const attn__problem *pb, const attn__tensor *t,
                                              int64_t b, int64_t row, int64_t nr, int64_t h,
                                              float *dst, int64_t ld) {
  int64_t d = pb->head_dim, sd = t->sd;
  for (int64_t r = 0; r < nr; r++) {
    const char *src = cpu_row(t, b, row + r, h);
    float *out = dst + r;
    switch (t->dtype) {
      case ATTN_F32: {
        const float *x = (const float *)src;
        for (int64_t c = 0; c < d; c++)
          out[c * ld] = x[c * sd];
        break;
      }
      case ATTN_F16: {
        const uint16_t *x = (const uint16_t *)src;
        for (int64_t c = 0; c < d; c++)
          out[c * ld] = cpu_f16_to_f32(x[c * sd]);
        break;
      }
      case ATTN_BF16: {
        const uint16_t *x = (const uint16_t *)src;
        for (int64_t c = 0; c < d; c++)
          out[c * ld] = attn__bf16_to_f32(x[c * sd]);
        break;
      }
      case ATTN_I32: /* never an operand's dtype (validation) */
        break;
    }
  }
}

void attn__cpu_load_t(const attn__problem *pb, const attn__tensor *t, int64_t b, int64_t row,
                      int64_t nr, int64_t h, float *dst, int64_t ld) {
  cpu_load_t_clones(pb, t, b, row, nr, h, dst, ld);
}

float *attn__cpu_inplace(const attn__problem *pb, const attn__tensor *t, int64_t b, int64_t row,
                         int64_t h, int *ld) {
  if (t->dtype != ATTN_F32 || t->sd != 1 || t->ss < pb->head_dim || t->ss > INT_MAX) return NULL;
  *ld = (int)t->ss;
  return (float *)cpu_row(t, b, row, h);
}

const float *attn__cpu_view(const attn__problem *pb, const attn__tensor *t, int64_t b, int64_t row,
                            int64_t nr, int64_t h, float *scratch, int *ld) {
  const int64_t d = pb->head_dim;
  if (t->dtype == ATTN_F32 && t->sd == 1) {
    if (nr == 1) {
      *ld = (int)d;
      return (const float *)cpu_row(t, b, row, h);
    }
    if (t->ss >= d && t->ss <= INT_MAX) {
      *ld = (int)t->ss;
      return (const float *)cpu_row(t, b, row, h);
    }
  }
  attn__cpu_load(pb, t, b, row, nr, h, scratch, d);
  *ld = (int)d;
  return scratch;
}

const float *attn__cpu_view_keys(const attn__problem *pb, const attn__tensor *t, int64_t b,
                                 int64_t j0, int64_t nr, int64_t h, float *scratch, int *ld) {
  const int64_t d = pb->head_dim, ps = pb->page_size;
  /* Rows of one page (or of an unpaged tensor) are ss apart. */
  const int one_page = !ps || j0 / ps == (j0 + nr - 1) / ps;
  if (t->dtype == ATTN_F32 && t->sd == 1 && one_page) {
    if (nr == 1) {
      *ld = (int)d;
      return (const float *)cpu_tile_row(pb, t, 1, b, j0, h);
    }
    if (t->ss >= d && t->ss <= INT_MAX) {
      *ld = (int)t->ss;
      return (const float *)cpu_tile_row(pb, t, 1, b, j0, h);
    }
  }
  attn__cpu_load_keys(pb, t, b, j0, nr, h, scratch, d);
  *ld = (int)d;
  return scratch;
}

static void cpu_store_rows(const attn__problem *pb, const attn__tensor *t, int keys, int64_t b,
                           int64_t row, int64_t nr, int64_t h, const float *src, int64_t ld) {
  int64_t d = pb->head_dim, sd = t->sd;
  for (int64_t r = 0; r < nr; r++) {
    char *dst = cpu_tile_row(pb, t, keys, b, row + r, h);
    const float *in = src + r * ld;
    switch (t->dtype) {
      case ATTN_F32: {
        float *x = (float *)dst;
        if (sd == 1) {
          memcpy(x, in, (size_t)d * sizeof(float));
        } else {
          for (int64_t c = 0; c < d; c++)
            x[c * sd] = in[c];
        }
        break;
      }
      case ATTN_F16: {
        uint16_t *x = (uint16_t *)dst;
        for (int64_t c = 0; c < d; c++)
          x[c * sd] = attn__f32_to_f16(in[c]);
        break;
      }
      case ATTN_BF16: {
        uint16_t *x = (uint16_t *)dst;
        for (int64_t c = 0; c < d; c++)
          x[c * sd] = attn__f32_to_bf16(in[c]);
        break;
      }
      case ATTN_I32: /* never an operand's dtype (validation) */
        break;
    }
  }
}

void attn__cpu_store(const attn__problem *pb, const attn__tensor *t, int64_t b, int64_t row,
                     int64_t nr, int64_t h, const float *src, int64_t ld) {
  cpu_store_rows(pb, t, 0, b, row, nr, h, src, ld);
}

void attn__cpu_store_keys(const attn__problem *pb, const attn__tensor *t, int64_t b, int64_t j0,
                          int64_t nr, int64_t h, const float *src, int64_t ld) {
  cpu_store_rows(pb, t, 1, b, j0, nr, h, src, ld);
}

void attn__cpu_load_lse(const attn__problem *pb, int64_t b, int64_t row, int64_t nr, int64_t h,
                        float *hi, float *lo) {
  const attn__tensor *t = &pb->lse;
  const float *x = (const float *)cpu_row(t, b, row, h);
  for (int64_t r = 0; r < nr; r++) {
    hi[r] = x[r * t->ss];
    lo[r] = pb->lse_hilo ? x[r * t->ss + t->sd] : 0.0f;
  }
}

void attn__cpu_store_lse(const attn__problem *pb, int64_t b, int64_t row, int64_t nr, int64_t h,
                         const float *hi, const float *lo) {
  const attn__tensor *t = &pb->lse;
  float *x = (float *)cpu_row(t, b, row, h);
  for (int64_t r = 0; r < nr; r++) {
    x[r * t->ss] = hi[r];
    if (pb->lse_hilo) x[r * t->ss + t->sd] = lo[r];
  }
}

/* ---------------------------------------------------------------------- */
/* Scores and the softmax                                                   */
/* ---------------------------------------------------------------------- */

/* The bias of rows [0, br) and keys [c0[r], c1[r]) of the tile, added to
 * the transposed scores: st[c * ld + r] += bias[i0 + r][j0 + c] of head h,
 * sequence b (bias points at element (i0, j0) of that head). */
static CPU_SIMD_CLONES void cpu_bias_cols_clones(const attn__tensor *bt, const char *bias, int br,
                                                 const int *c0, const int *c1, float *st, int ld) {
  const int64_t ss = bt->ss, sd = bt->sd;
  for (int r = 0; r < br; r++) {
    float *scol = st + r;
    switch (bt->dtype) {
      case ATTN_F32: {
        const float *x = (const float *)bias + r * ss;
        for (int c = c0[r]; c < c1[r]; c++)
          scol[(size_t)c * ld] += x[c * sd];
        break;
      }
      case ATTN_F16: {
        const uint16_t *x = (const uint16_t *)bias + r * ss;
        for (int c = c0[r]; c < c1[r]; c++)
          scol[(size_t)c * ld] += cpu_f16_to_f32(x[c * sd]);
        break;
      }
      case ATTN_BF16: {
        const uint16_t *x = (const uint16_t *)bias + r * ss;
        for (int c = c0[r]; c < c1[r]; c++)
          scol[(size_t)c * ld] += attn__bf16_to_f32(x[c * sd]);
        break;
      }
      case ATTN_I32: /* never a bias's dtype (validation) */
        break;
    }
  }
}

void attn__cpu_scores(const attn__problem *pb, int64_t b, int64_t h, int64_t i0, int br, int64_t j0,
                      int bc, int64_t nq, int64_t nk, float *st, int ld, float *tanh_out) {
  const float cap = pb->softcap, slope = attn__problem_slope(pb, h);
  /* Each row's visible columns [c0, c1) within the tile. */
  int c0[ATTN__CPU_TILE_MAX], c1[ATTN__CPU_TILE_MAX];
  int full = 1;
  for (int r = 0; r < br; r++) {
    int64_t lo, hi;
    attn__problem_key_range(pb, i0 + r, nq, nk, &lo, &hi);
    lo -= j0;
    hi -= j0;
    lo = lo < 0 ? 0 : lo > bc ? bc : lo;
    hi = hi < lo ? lo : hi > bc ? bc : hi;
    c0[r] = (int)lo;
    c1[r] = (int)hi;
    full &= lo == 0 && hi == bc;
  }
  /* Most tiles of a long sequence: every key visible, nothing to add. */
  if (!full || cap > 0.0f || slope != 0.0f) {
    const int64_t dist0 = attn__diag(i0, nq, nk) - j0; /* dg - j of element (0, 0) */
    for (int c = 0; c < bc; c++) {
      float *scol = st + (size_t)c * ld;
      float *tcol = tanh_out ? tanh_out + (size_t)c * ld : NULL;
      for (int r = 0; r < br; r++) {
        const int visible = c >= c0[r] && c < c1[r];
        scol[r] =
            visible ? attn__score_scaled(scol[r], cap, slope, dist0 + r - c, tcol ? &tcol[r] : NULL)
                    : -INFINITY;
        if (tcol && !visible) tcol[r] = 0.0f;
      }
    }
  }
  /* The bias comes last, on visible scores only (a hidden key stays -inf
   * whatever its bias). */
  if (pb->has_bias) {
    const attn__tensor *bt = &pb->bias;
    const int64_t e = b * bt->sb + h * bt->sh + i0 * bt->ss + j0 * bt->sd;
    cpu_bias_cols_clones(bt,
                         (const char *)bt->native + bt->offset +
                             (ptrdiff_t)e * (ptrdiff_t)attn_dtype_size(bt->dtype),
                         br, c0, c1, st, ld);
  }
}

/* exp(x) for the softmax: x = s - m <= 0 in the forward pass, about that in
 * the backward. glibc's expf is a scalar call per element, and the tile has
 * Br*Bc of them for 4*Br*Bc*d flops of sgemm: at d = 64 the calls cost as
 * much as the products. This is the classic Cephes reduction, written so
 * that the compiler vectorizes the loop: x = n ln2 + r with n = round(x /
 * ln2) (ln2 split in two parts so r is exact), exp(r) by a degree-6
 * polynomial on |r| <= ln2/2 (about 1 ulp), times 2^n built from the
 * exponent bits. Below -87 (and for -inf) the result is exactly 0: e^-87 is
 * already below FLT_MIN, and a masked score must weigh nothing. NaN gives
 * NaN (a NaN score must reach the row's sum), without converting NaN to an
 * int, which C leaves undefined. */
static inline float cpu_exp(float x) {
  float xc = x < -87.0f ? -87.0f : x;
  xc = xc > 88.0f ? 88.0f : xc;
  /* Round to nearest by the 1.5 * 2^23 trick: no rintf call in the loop.
   * t holds n in its low mantissa bits, which give 2^n below with no
   * float-to-int conversion (undefined behaviour for NaN). */
  const float t = xc * 1.44269504088896341f + 12582912.0f;
  const float n = t - 12582912.0f;
  float r = xc - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float y = 1.9875691500e-4f;
  y = y * r + 1.3981999507e-3f;
  y = y * r + 8.3334519073e-3f;
  y = y * r + 4.1665795894e-2f;
  y = y * r + 1.6666665459e-1f;
  y = y * r + 5.0000001201e-1f;
  y = y * (r * r) + r + 1.0f;
  uint32_t bits;
  memcpy(&bits, &t, sizeof bits);
  bits = (bits - 0x4b400000u + 127u) << 23;
  float scale;
  memcpy(&scale, &bits, sizeof scale);
  return x < -87.0f ? 0.0f : y * scale;
}

static CPU_SIMD_CLONES void cpu_softmax_cols_clones(float *st, int bc, int br, int ld, float *m,
                                                    float *l, float *alpha) {
  float mx[ATTN__CPU_TILE_MAX], sub[ATTN__CPU_TILE_MAX], sum[ATTN__CPU_TILE_MAX];
  for (int r = 0; r < br; r++) {
    mx[r] = m[r];
    sum[r] = 0.0f;
  }
  /* The max skips NaN; a NaN score still reaches l through exp(NaN) = NaN,
   * and the row's finalization (by its key range) turns that into NaN. */
  for (int c = 0; c < bc; c++) {
    const float *x = st + (size_t)c * ld;
    for (int r = 0; r < br; r++)
      mx[r] = x[r] > mx[r] ? x[r] : mx[r];
  }
  for (int r = 0; r < br; r++) {
    /* A row that has seen nothing yet keeps m = -inf; subtracting 0 then
     * gives exp(-inf) = 0 for its P and its alpha, where -inf - -inf would
     * give NaN. */
    sub[r] = mx[r] == -INFINITY ? 0.0f : mx[r];
    alpha[r] = cpu_exp(m[r] - sub[r]);
    m[r] = mx[r];
  }
  for (int c = 0; c < bc; c++) {
    float *x = st + (size_t)c * ld;
    for (int r = 0; r < br; r++) {
      float p = cpu_exp(x[r] - sub[r]);
      x[r] = p;
      sum[r] += p;
    }
  }
  for (int r = 0; r < br; r++)
    l[r] = alpha[r] * l[r] + sum[r];
}

void attn__cpu_softmax_cols(float *st, int bc, int br, int ld, float *m, float *l, float *alpha) {
  cpu_softmax_cols_clones(st, bc, br, ld, m, l, alpha);
}

static CPU_SIMD_CLONES void cpu_exp_cols_clones(float *st, int rows, int cols, int ld,
                                                const float *hi, const float *lo) {
  float sub[ATTN__CPU_TILE_MAX], keep[ATTN__CPU_TILE_MAX];
  for (int r = 0; r < cols; r++) {
    /* lse = -inf: a query that sees no key; its column becomes 0. */
    keep[r] = hi[r] == -INFINITY ? 0.0f : 1.0f;
    sub[r] = hi[r] == -INFINITY ? 0.0f : hi[r];
  }
  /* s - hi first: exact near the row maximum, so lo is not lost in a
   * rounding of the large s - lse. */
  for (int c = 0; c < rows; c++) {
    float *x = st + (size_t)c * ld;
    for (int r = 0; r < cols; r++)
      x[r] = cpu_exp((x[r] - sub[r]) - lo[r]) * keep[r];
  }
}

void attn__cpu_exp_cols(float *st, int rows, int cols, int ld, const float *hi, const float *lo) {
  cpu_exp_cols_clones(st, rows, cols, ld, hi, lo);
}

static CPU_SIMD_CLONES void cpu_dsoftmax_cols_clones(const float *p, float *dp, const float *th,
                                                     float softcap, int rows, int cols, int ld,
                                                     const float *dd) {
  for (int a = 0; a < rows; a++) {
    const float *pr = p + (size_t)a * ld;
    float *dr = dp + (size_t)a * ld;
    if (th) {
      const float *tr = th + (size_t)a * ld;
      for (int c = 0; c < cols; c++)
        dr[c] = attn__score_grad(pr[c] * (dr[c] - dd[c]), tr[c], softcap);
    } else {
      for (int c = 0; c < cols; c++)
        dr[c] = pr[c] * (dr[c] - dd[c]);
    }
  }
}

void attn__cpu_dsoftmax_cols(const float *p, float *dp, const float *th, float softcap, int rows,
                             int cols, int ld, const float *dd) {
  cpu_dsoftmax_cols_clones(p, dp, th, softcap, rows, cols, ld, dd);
}

static CPU_SIMD_CLONES void cpu_score_grad_cols_clones(float *dp, const float *th, float softcap,
                                                       int rows, int cols, int ld) {
  for (int a = 0; a < rows; a++) {
    float *dr = dp + (size_t)a * ld;
    const float *tr = th + (size_t)a * ld;
    for (int c = 0; c < cols; c++)
      dr[c] = attn__score_grad(dr[c], tr[c], softcap);
  }
}

void attn__cpu_score_grad_cols(float *dp, const float *th, float softcap, int rows, int cols,
                               int ld) {
  cpu_score_grad_cols_clones(dp, th, softcap, rows, cols, ld);
}

void attn__cpu_add_cols(const float *st, int rows, int cols, int ld, float *dst, int64_t rs,
                        int64_t cs) {
  if (rs == 0) {
    /* Every query row adds to the same entries: a sum per key, over the
     * rows in order, then one addition. */
    for (int a = 0; a < rows; a++) {
      const float *x = st + (size_t)a * ld;
      float sum = 0.0f;
      for (int c = 0; c < cols; c++)
        sum += x[c];
      dst[a * cs] += sum;
    }
    return;
  }
  for (int c = 0; c < cols; c++)
    for (int a = 0; a < rows; a++)
      dst[c * rs + a * cs] += st[(size_t)a * ld + c];
}

/* ---------------------------------------------------------------------- */
/* Work division                                                            */
/* ---------------------------------------------------------------------- */

int64_t *attn__cpu_units(const attn__problem *pb, int by_keys, int64_t heads, int64_t block) {
  int64_t *units = malloc((size_t)(pb->batch + 1) * sizeof *units);
  if (!units) return NULL;
  units[0] = 0;
  for (int64_t b = 0; b < pb->batch; b++) {
    int64_t n = by_keys ? attn__seq_k(pb, b) : attn__seq_q(pb, b);
    units[b + 1] = units[b] + heads * ((n + block - 1) / block);
  }
  return units;
}

/* The last b with units[b] <= u; empty sequences share their start with the
 * next one, and the search skips past them. */
static int64_t cpu_unit_seq(const int64_t *units, int64_t batch, int64_t u) {
  int64_t lo = 0, hi = batch;
  while (hi - lo > 1) {
    int64_t mid = lo + (hi - lo) / 2;
    if (units[mid] <= u)
      lo = mid;
    else
      hi = mid;
  }
  return lo;
}

int attn__cpu_unit(const attn__problem *pb, const int64_t *units, int by_keys, int64_t block,
                   int64_t u, int64_t *b, int64_t *h, int64_t *i0) {
  *b = cpu_unit_seq(units, pb->batch, u);
  const int64_t n = by_keys ? attn__seq_k(pb, *b) : attn__seq_q(pb, *b);
  const int64_t blocks = (n + block - 1) / block, rest = u - units[*b];
  *h = rest / blocks;
  *i0 = rest % blocks * block;
  return (int)(n - *i0 < block ? n - *i0 : block);
}
