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
#define CPU_SIMD_CLONES ATTN__CPU_SIMD_CLONES

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

/* One row of d values of dtype dt, column stride sd, as f32. Inline, so
 * that each SIMD clone that calls it gets its own vectorized copy. */
static inline void cpu_row_f32(const char *src, attn_dtype dt, int64_t sd, int64_t d, int f16c,
                               float *out) {
  /* The unit column stride gets loops of its own: with sd a variable the
   * compiler does not vectorize the conversions (measured: f16 at 0.67 ns
   * per element, against 0.18 for bf16). */
  if (dt == ATTN_F32) {
    const float *x = (const float *)src;
    if (sd == 1)
      memcpy(out, x, (size_t)d * sizeof(float));
    else
      for (int64_t c = 0; c < d; c++)
        out[c] = x[c * sd];
  } else if (dt == ATTN_F16) {
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

static CPU_SIMD_CLONES void cpu_load_clones(const attn__problem *pb, const attn__tensor *t,
                                            int keys, int64_t b, int64_t row, int64_t nr, int64_t h,
                                            float *dst, int64_t ld) {
  const int f16c = t->dtype == ATTN_F16 && CPU_HAVE_F16C();
  for (int64_t r = 0; r < nr; r++)
    cpu_row_f32(cpu_tile_row(pb, t, keys, b, row + r, h), t->dtype, t->sd, pb->head_dim, f16c,
                dst + r * ld);
}

void attn__cpu_load(const attn__problem *pb, const attn__tensor *t, int64_t b, int64_t row,
                    int64_t nr, int64_t h, float *dst, int64_t ld) {
  cpu_load_clones(pb, t, 0, b, row, nr, h, dst, ld);
}

void attn__cpu_load_keys(const attn__problem *pb, const attn__tensor *t, int64_t b, int64_t j0,
                         int64_t nr, int64_t h, float *dst, int64_t ld) {
  cpu_load_clones(pb, t, 1, b, j0, nr, h, dst, ld);
}

/* Rows converted a chunk at a time into a contiguous buffer (cpu_row_f32,
 * reading each row's lines in order), then written transposed a column at
 * a time (a chunk's worth of consecutive floats each). Transposing straight
 * from the tensor read one element of each row per column and wrote a
 * column of d lines per row: rows a multiple of 4 KiB apart (H d = 1024)
 * share their L1 sets, and the copy took 5-12 % of a forward. */
#define CPU_T_CHUNK 16
static CPU_SIMD_CLONES void cpu_load_t_clones(const attn__problem *pb, const attn__tensor *t,
                                              int64_t b, int64_t row, int64_t nr, int64_t h,
                                              float *dst, int64_t ld) {
  const int64_t d = pb->head_dim;
  const int f16c = t->dtype == ATTN_F16 && CPU_HAVE_F16C();
  float buf[CPU_T_CHUNK * ATTN_MAX_HEAD_DIM];
  for (int64_t r0 = 0; r0 < nr; r0 += CPU_T_CHUNK) {
    const int64_t n = nr - r0 < CPU_T_CHUNK ? nr - r0 : CPU_T_CHUNK;
    for (int64_t r = 0; r < n; r++)
      cpu_row_f32(cpu_row(t, b, row + r0 + r, h), t->dtype, t->sd, d, f16c, buf + r * d);
    for (int64_t c = 0; c < d; c++) {
      float *out = dst + c * ld + r0;
      for (int64_t r = 0; r < n; r++)
        out[r] = buf[r * d + c];
    }
  }
}
#undef CPU_T_CHUNK

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

/* Whether rows ss elements of size bytes apart share the L1 sets of one
 * another: a multiple of 4 KiB apart (the set index of a 32-48 KiB, 8-12
 * way L1 runs over 4 KiB), the tile's rows then all fall into the same few
 * sets and evict each other in every product (H = 16, d = 128 in bshd: 8
 * KiB). Such rows are copied into a contiguous tile instead: measured on
 * the build host, one thread, B=1 H=16 N=1024 d=128, a backward of 471-486
 * ms against 489-519 in place (CPU time, 3 runs each). */
int attn__cpu_rows_alias(int64_t ss, int size, int64_t nr) {
  /* ss size % 4096 without the product, which a hostile stride overflows
   * (size divides 4096). */
  return nr > 8 && ss % (4096 / size) == 0;
}
static int cpu_rows_alias(int64_t ss, int64_t nr) {
  return attn__cpu_rows_alias(ss, (int)sizeof(float), nr);
}

const float *attn__cpu_view(const attn__problem *pb, const attn__tensor *t, int64_t b, int64_t row,
                            int64_t nr, int64_t h, float *scratch, int *ld) {
  const int64_t d = pb->head_dim;
  if (t->dtype == ATTN_F32 && t->sd == 1 && !cpu_rows_alias(t->ss, nr)) {
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

/* Whether nr > 1 key rows of t can be read in place, pages aside: f32
 * with unit column stride, rows that do not alias and a row stride an int
 * holds. */
static int cpu_keys_in_place(const attn__problem *pb, const attn__tensor *t, int64_t nr) {
  return t->dtype == ATTN_F32 && t->sd == 1 && !cpu_rows_alias(t->ss, nr) &&
         t->ss >= pb->head_dim && t->ss <= INT_MAX;
}

int attn__cpu_keys_copied(const attn__problem *pb, const attn__tensor *t, int64_t nr) {
  return nr > 1 && !cpu_keys_in_place(pb, t, nr);
}

const float *attn__cpu_view_keys(const attn__problem *pb, const attn__tensor *t, int64_t b,
                                 int64_t j0, int64_t nr, int64_t h, float *scratch, int *ld) {
  const int64_t d = pb->head_dim, ps = pb->page_size;
  /* Rows of one page (or of an unpaged tensor) are ss apart. */
  const int one_page = !ps || j0 / ps == (j0 + nr - 1) / ps;
  if (nr == 1 && t->dtype == ATTN_F32 && t->sd == 1) {
    *ld = (int)d;
    return (const float *)cpu_tile_row(pb, t, 1, b, j0, h);
  }
  if (one_page && cpu_keys_in_place(pb, t, nr)) {
    *ld = (int)t->ss;
    return (const float *)cpu_tile_row(pb, t, 1, b, j0, h);
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
/* Products of few query rows                                               */
/* ---------------------------------------------------------------------- */

/* Four dot products of a key row kf with query rows q0..q3, each in eight
 * lanes summed in a fixed tree: every element takes the same steps however
 * many rows the tile has, which sgemm does not promise (see
 * attn__cpu_qk_few). The four chains run side by side, so the adds of one
 * do not wait on another's. */
static inline void cpu_dot4(const float *kf, const float *q0, const float *q1, const float *q2,
                            const float *q3, int64_t d, float *out) {
  /* GCC's vector extension (clang has it too): eight lanes whatever the
   * clone, one AVX register or two SSE ones. Written as arrays of eight,
   * the loops came out of gcc 12 as shuffles and spills, 4x slower. */
  typedef float v8 __attribute__((vector_size(32)));
  v8 a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
  int64_t c = 0;
  for (; c + 8 <= d; c += 8) {
    v8 k, x0, x1, x2, x3;
    memcpy(&k, kf + c, sizeof k);
    memcpy(&x0, q0 + c, sizeof x0);
    memcpy(&x1, q1 + c, sizeof x1);
    memcpy(&x2, q2 + c, sizeof x2);
    memcpy(&x3, q3 + c, sizeof x3);
    a0 += k * x0;
    a1 += k * x1;
    a2 += k * x2;
    a3 += k * x3;
  }
  for (int x = 0; c + x < d; x++) {
    a0[x] += kf[c + x] * q0[c + x];
    a1[x] += kf[c + x] * q1[c + x];
    a2[x] += kf[c + x] * q2[c + x];
    a3[x] += kf[c + x] * q3[c + x];
  }
  const v8 acc[4] = {a0, a1, a2, a3};
  for (int r = 0; r < 4; r++) {
    const v8 a = acc[r];
    out[r] = ((a[0] + a[4]) + (a[1] + a[5])) + ((a[2] + a[6]) + (a[3] + a[7]));
  }
}

/* The kv heads of tile heads [h0, h0 + nh), and the tile columns (nr per
 * head) of kv head hk among them. */
static void cpu_kv_cols(const attn__problem *pb, int64_t h0, int nh, int nr, int64_t hk, int *c0,
                        int *c1) {
  const int64_t g = pb->heads_q / pb->heads_kv;
  const int64_t lo = hk * g > h0 ? hk * g : h0,
                hi = (hk + 1) * g < h0 + nh ? (hk + 1) * g : h0 + nh;
  *c0 = (int)(lo - h0) * nr;
  *c1 = (int)(hi - h0) * nr;
}

/* Key row j of kv head hk of t: its first element's address. */
static inline const char *cpu_key_at(const attn__problem *pb, const attn__tensor *t, int64_t b,
                                     int64_t j, int64_t hk) {
  return cpu_tile_row(pb, t, 1, b, j, hk);
}

/* The bytes from kv head hk's row of t to head hk + 1's. With one kv head
 * the stride is never followed, and validation leaves it free: any value,
 * even one whose byte count overflows, so the step is 0 then. */
static inline ptrdiff_t cpu_head_bytes(const attn__problem *pb, const attn__tensor *t) {
  return pb->heads_kv > 1 ? (ptrdiff_t)t->sh * (ptrdiff_t)attn_dtype_size(t->dtype) : 0;
}

static CPU_SIMD_CLONES void cpu_qk_few_clones(const attn__problem *pb, const attn__tensor *t,
                                              int64_t b, int64_t j0, int bc, int64_t h0, int nh,
                                              int nr, const float *q, int64_t ldq, float scale,
                                              float *st, int ld) {
  const int64_t d = pb->head_dim, g = pb->heads_q / pb->heads_kv;
  const int64_t hk0 = h0 / g, hk1 = (h0 + nh - 1) / g;
  const int f16c = t->dtype == ATTN_F16 && CPU_HAVE_F16C();
  float kf[ATTN_MAX_HEAD_DIM], out[4];
  for (int a = 0; a < bc; a++) {
    float *srow = st + (size_t)a * ld;
    for (int64_t hk = hk0; hk <= hk1; hk++) {
      int c0, c1;
      cpu_kv_cols(pb, h0, nh, nr, hk, &c0, &c1);
      cpu_row_f32(cpu_key_at(pb, t, b, j0 + a, hk), t->dtype, t->sd, d, f16c, kf);
      for (int c = c0; c < c1; c += 4) {
        /* Past the last column, the last one again: each lane's sum is its
         * own, so the repeats change nothing of the others. */
        const float *q0 = q + c * ldq;
        const float *q1 = c + 1 < c1 ? q0 + ldq : q0;
        const float *q2 = c + 2 < c1 ? q0 + 2 * ldq : q1;
        const float *q3 = c + 3 < c1 ? q0 + 3 * ldq : q2;
        cpu_dot4(kf, q0, q1, q2, q3, d, out);
        for (int x = 0; x < 4 && c + x < c1; x++)
          srow[c + x] = scale * out[x];
      }
    }
  }
}

static CPU_SIMD_CLONES void cpu_pv_few_clones(const attn__problem *pb, const attn__tensor *t,
                                              int64_t b, int64_t j0, int bc, int64_t h0, int nh,
                                              int nr, const float *pt, int ld, float *o) {
  const int64_t d = pb->head_dim, g = pb->heads_q / pb->heads_kv;
  const int64_t hk0 = h0 / g, hk1 = (h0 + nh - 1) / g;
  const int f16c = t->dtype == ATTN_F16 && CPU_HAVE_F16C();
  float vf[ATTN_MAX_HEAD_DIM];
  for (int a = 0; a < bc; a++) {
    const float *prow = pt + (size_t)a * ld;
    for (int64_t hk = hk0; hk <= hk1; hk++) {
      int c0, c1;
      cpu_kv_cols(pb, h0, nh, nr, hk, &c0, &c1);
      cpu_row_f32(cpu_key_at(pb, t, b, j0 + a, hk), t->dtype, t->sd, d, f16c, vf);
      for (int c = c0; c < c1; c++) {
        const float p = prow[c];
        float *orow = o + (size_t)c * d;
        for (int64_t x = 0; x < d; x++)
          orow[x] += p * vf[x];
      }
    }
  }
}

/* The same with AVX2 and FMA where the CPU has them and d is a multiple of
 * 8, or with AVX-512 where it has that and d is a multiple of 16 (a fixed
 * choice per machine and head dimension, so the forward and the backward
 * still agree): fused multiply-adds halve the arithmetic of the portable
 * loops, which gcc may not contract (the library is built as ISO C,
 * -ffp-contract=off), 16-bit rows are converted in registers, and P V
 * keeps its output rows in registers across keys. Measured on the build
 * host, one thread, B=1 Hq=32 Hkv=8 d=128, 256 keys (in cache), least of 5
 * runs: AVX2 0.103 ms in bf16 and in f32, against 0.165 and 0.175 for the
 * portable loops. AVX-512 doubles the lanes again, which decoding several
 * query rows needs: with 4 rows and a GQA group of 4 a key row meets 16
 * query columns, 16 flops per byte of a bf16 cache, more than 8-lane FMAs
 * keep up with at memory speed. */
#if defined(__x86_64__) && defined(__GNUC__)
#define CPU_FMA __attribute__((target("avx2,fma,f16c")))
#define CPU_HAVE_FMA() (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
#define CPU_FEW512 __attribute__((target("avx512f,avx2,fma,f16c")))
#define CPU_HAVE_AVX512() __builtin_cpu_supports("avx512f")
#define CPU_FEWBF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma,f16c")))
#define CPU_HAVE_AVX512BF16()                                                  \
  (__builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") && \
   __builtin_cpu_supports("avx512bf16"))
#define CPU_INLINE static inline __attribute__((always_inline))

/* call(dt) with the dtype dt as a constant, so that the loops call()
 * inlines convert their rows in registers without a branch. */
#define CPU_WITH_DTYPE(dt, call) \
  switch (dt) {                  \
    case ATTN_F16:               \
      call(ATTN_F16);            \
      break;                     \
    case ATTN_BF16:              \
      call(ATTN_BF16);           \
      break;                     \
    default:                     \
      call(ATTN_F32);            \
      break;                     \
  }

/* call(n) with a column count n (1..g, g 4 or 8) as a constant, so that
 * the loops call() inlines keep their accumulators in registers. */
#define CPU_COLS_CASE(k, g, call) \
  case k:                         \
    call((k) < (g) ? (k) : (g));  \
    break;
#define CPU_WITH_COLS(n, g, call) \
  switch (n) {                    \
    CPU_COLS_CASE(1, g, call)     \
    CPU_COLS_CASE(2, g, call)     \
    CPU_COLS_CASE(3, g, call)     \
    CPU_COLS_CASE(4, g, call)     \
    CPU_COLS_CASE(5, g, call)     \
    CPU_COLS_CASE(6, g, call)     \
    CPU_COLS_CASE(7, g, call)     \
    default:                      \
      call(g);                    \
      break;                      \
  }

/* The columns [c0, c1) in groups of up to g (4 or 8): CPU_COLS_CALL(dt_),
 * which the caller defines, with the group's first column c, its count n_
 * and the dtype dt_ (of the variable dt) as constants. */
#define CPU_FOR_COLS(c0, c1, g)                \
  for (int c = (c0); c < (c1); c += (g)) {     \
    const int n = (c1)-c < (g) ? (c1)-c : (g); \
    CPU_WITH_COLS(n, g, CPU_COLS_N)            \
  }
#define CPU_COLS_N(cols)              \
  {                                   \
    const int n_ = (cols);            \
    CPU_WITH_DTYPE(dt, CPU_COLS_CALL) \
  }

/* A key row of another column stride is converted into kf, and so is one
 * the caller reads many times (many); else it is converted in registers as
 * it is read. The sums are the same either way. */
static inline const char *cpu_qk_row_src(const char *k, attn_dtype *dt, int64_t sd, int64_t d,
                                         int many, float *kf) {
  if (sd == 1 && (*dt == ATTN_F32 || !many)) return k;
  cpu_row_f32(k, *dt, sd, d, *dt == ATTN_F16, kf);
  *dt = ATTN_F32;
  return (const char *)kf;
}

/* The sums of four vectors' lanes, in lanes 0..3. */
CPU_FMA CPU_INLINE __m128 cpu_hsum4(__m256 a0, __m256 a1, __m256 a2, __m256 a3) {
  const __m256 t = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
  return _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
}

/* W / 32 elements from x of a row of dtype dt with unit column stride, as
 * f32 in a vector of W bits (the 16-bit ones loaded as HB bits, with the
 * intrinsics of prefix _mm##HW). Inlined where dt is fixed per loop. */
#define CPU_LOAD_ROW(name, attr, W, HW, HB)                                               \
  attr CPU_INLINE __m##W name(const char *row, attn_dtype dt, int64_t x) {                \
    const __m##HB##i *h = (const __m##HB##i *)((const uint16_t *)row + x);                \
    switch (dt) {                                                                         \
      case ATTN_F16:                                                                      \
        return _mm##W##_cvtph_ps(_mm##HW##_loadu_si##HB(h));                              \
      case ATTN_BF16:                                                                     \
        return _mm##W##_castsi##W##_ps(                                                   \
            _mm##W##_slli_epi32(_mm##W##_cvtepu16_epi32(_mm##HW##_loadu_si##HB(h)), 16)); \
      default:                                                                            \
        return _mm##W##_loadu_ps((const float *)row + x);                                 \
    }                                                                                     \
  }
CPU_LOAD_ROW(cpu_load8, CPU_FMA, 256, , 128)

/* cpu_dot4's sums with fused multiply-adds, in two chains per row (16
 * elements a step) so that eight are in flight, as two FMA units of 4
 * cycles' latency need: with one chain per row the loop ran at half the
 * rate. k is a row of dtype kdt (unit stride), converted in registers. */
CPU_FMA CPU_INLINE __m128 cpu_dot4_fma(const char *k, attn_dtype kdt, const float *q0,
                                       const float *q1, const float *q2, const float *q3,
                                       int64_t d) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
  int64_t x = 0;
  for (; x + 16 <= d; x += 16) {
    const __m256 k0 = cpu_load8(k, kdt, x), k1 = cpu_load8(k, kdt, x + 8);
    a0 = _mm256_fmadd_ps(k0, _mm256_loadu_ps(q0 + x), a0);
    b0 = _mm256_fmadd_ps(k1, _mm256_loadu_ps(q0 + x + 8), b0);
    a1 = _mm256_fmadd_ps(k0, _mm256_loadu_ps(q1 + x), a1);
    b1 = _mm256_fmadd_ps(k1, _mm256_loadu_ps(q1 + x + 8), b1);
    a2 = _mm256_fmadd_ps(k0, _mm256_loadu_ps(q2 + x), a2);
    b2 = _mm256_fmadd_ps(k1, _mm256_loadu_ps(q2 + x + 8), b2);
    a3 = _mm256_fmadd_ps(k0, _mm256_loadu_ps(q3 + x), a3);
    b3 = _mm256_fmadd_ps(k1, _mm256_loadu_ps(q3 + x + 8), b3);
  }
  if (x < d) {
    const __m256 k0 = cpu_load8(k, kdt, x);
    a0 = _mm256_fmadd_ps(k0, _mm256_loadu_ps(q0 + x), a0);
    a1 = _mm256_fmadd_ps(k0, _mm256_loadu_ps(q1 + x), a1);
    a2 = _mm256_fmadd_ps(k0, _mm256_loadu_ps(q2 + x), a2);
    a3 = _mm256_fmadd_ps(k0, _mm256_loadu_ps(q3 + x), a3);
  }
  return cpu_hsum4(_mm256_add_ps(a0, b0), _mm256_add_ps(a1, b1), _mm256_add_ps(a2, b2),
                   _mm256_add_ps(a3, b3));
}

/* The columns [c0, c1) of one key row k of dtype dt and column stride sd:
 * srow[c] = scale k.q[c]. */
CPU_FMA CPU_INLINE void cpu_qk_one_fma(const char *k, attn_dtype dt, int64_t sd, int64_t d,
                                       const float *q, int64_t ldq, int c0, int c1, float scale,
                                       float *srow) {
  float kf[ATTN_MAX_HEAD_DIM] __attribute__((aligned(32)));
  /* Read once per group of four columns: converted once where there are
   * more groups. */
  k = cpu_qk_row_src(k, &dt, sd, d, c1 - c0 > 4, kf);
  const __m128 sc = _mm_set1_ps(scale);
  for (int c = c0; c < c1; c += 4) {
    /* Past the last column, the last one again (see cpu_qk_few_clones). */
    const float *q0 = q + c * ldq;
    const float *q1 = c + 1 < c1 ? q0 + ldq : q0;
    const float *q2 = c + 2 < c1 ? q0 + 2 * ldq : q1;
    const float *q3 = c + 3 < c1 ? q0 + 3 * ldq : q2;
    __m128 s4;
#define CPU_QK_DOT4(kdt) s4 = _mm_mul_ps(sc, cpu_dot4_fma(k, kdt, q0, q1, q2, q3, d))
    CPU_WITH_DTYPE(dt, CPU_QK_DOT4)
#undef CPU_QK_DOT4
    if (c + 4 <= c1) {
      _mm_storeu_ps(srow + c, s4);
    } else {
      float out[4];
      _mm_storeu_ps(out, s4);
      for (int x = 0; c + x < c1; x++)
        srow[c + x] = out[x];
    }
  }
}

/* The columns [c0, c1) of nk (1 or 2) key rows k[i] of dtype dt and column
 * stride sd: srow[i ld + c] = scale k[i].q[c]. */
CPU_FMA static void cpu_qk_row_fma(const char *const *k, int nk, attn_dtype dt, int64_t sd,
                                   int64_t d, const float *q, int64_t ldq, int c0, int c1,
                                   float scale, float *srow, int ld) {
  for (int i = 0; i < nk; i++)
    cpu_qk_one_fma(k[i], dt, sd, d, q, ldq, c0, c1, scale, srow + (size_t)i * ld);
}

CPU_LOAD_ROW(cpu_load16, CPU_FEW512, 512, 256, 256)

/* The levels of the lane sums below (a transpose: the shuffles put the
 * vectors' halves, then quarters, then pairs of lanes side by side). Half
 * of x's lanes i + (i + 8) in the low half, y's in the high one. */
CPU_FEW512 CPU_INLINE __m512 cpu_fold_halves(__m512 x, __m512 y) {
  return _mm512_add_ps(_mm512_shuffle_f32x4(x, y, _MM_SHUFFLE(1, 0, 1, 0)),
                       _mm512_shuffle_f32x4(x, y, _MM_SHUFFLE(3, 2, 3, 2)));
}

/* Of two cpu_fold_halves results: quarter q holds quarter 2q + quarter
 * 2q + 1 (x's for q < 2, y's after). */
CPU_FEW512 CPU_INLINE __m512 cpu_fold_quarters(__m512 x, __m512 y) {
  return _mm512_add_ps(_mm512_shuffle_f32x4(x, y, _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm512_shuffle_f32x4(x, y, _MM_SHUFFLE(3, 1, 3, 1)));
}

/* In each quarter: x's lanes 0 + 1 and 2 + 3, then y's. */
CPU_FEW512 CPU_INLINE __m512 cpu_fold_pairs(__m512 x, __m512 y) {
  return _mm512_add_ps(_mm512_shuffle_ps(x, y, _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm512_shuffle_ps(x, y, _MM_SHUFFLE(3, 1, 3, 1)));
}

/* The sums of the lanes of a[0..7], in lanes 0..7: eight sums take 4 adds.
 * Every sum takes the same tree whichever its place: lane i is added to
 * lane i + 8, those to the pair 4 lanes further, and the four partials
 * pairwise, (p0 + p1) + (p2 + p3). */
CPU_FEW512 CPU_INLINE __m256 cpu_hsum8_avx512(const __m512 *a) {
  /* t[y]: a[2y]'s halves folded, a[2y + 1]'s; u[y]: quarter x holds
   * a[4y + x]'s four partials. */
  __m512 t[4], u[2];
  for (int y = 0; y < 4; y++)
    t[y] = cpu_fold_halves(a[2 * y], a[2 * y + 1]);
  for (int y = 0; y < 2; y++)
    u[y] = cpu_fold_quarters(t[2 * y], t[2 * y + 1]);
  /* v: quarter x holds a[x]'s two pair sums in lanes 0, 1 and a[4 + x]'s
   * in lanes 2, 3; w: their sums in lanes 0 and 2. */
  const __m512 v = cpu_fold_pairs(u[0], u[1]);
  const __m512 w = _mm512_add_ps(v, _mm512_permute_ps(v, _MM_SHUFFLE(2, 3, 0, 1)));
  const __m512i at = _mm512_setr_epi32(0, 4, 8, 12, 2, 6, 10, 14, 0, 0, 0, 0, 0, 0, 0, 0);
  return _mm512_castps512_ps256(_mm512_permutexvar_ps(at, w));
}

/* The lane sums of a[0..15] in lanes 0..15, by cpu_hsum8_avx512's tree,
 * so that a score is the same sum whichever way its chain is reduced. */
CPU_FEW512 CPU_INLINE __m512 cpu_hsum16_avx512(const __m512 *a) {
  __m512 t[8], u[4], v[2];
  for (int y = 0; y < 8; y++)
    t[y] = cpu_fold_halves(a[2 * y], a[2 * y + 1]);
  for (int y = 0; y < 4; y++)
    u[y] = cpu_fold_quarters(t[2 * y], t[2 * y + 1]);
  /* v[y]: quarter x holds a[8y + x]'s two pair sums in lanes 0, 1 and
   * a[8y + 4 + x]'s in lanes 2, 3; w: quarter x, lane z holds a[4z + x]'s
   * sum. */
  for (int y = 0; y < 2; y++)
    v[y] = cpu_fold_pairs(u[2 * y], u[2 * y + 1]);
  const __m512 w = cpu_fold_pairs(v[0], v[1]);
  const __m512i at = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  return _mm512_permutexvar_ps(at, w);
}

/* srow[i ld + y] = scale * the lane sum of a[i][y], for r rows and n
 * columns. */
CPU_FEW512 CPU_INLINE void cpu_qk_store_avx512(__m512 (*a)[8], int r, int n, float scale,
                                               float *srow, int ld) {
  for (int i = 0; i < r; i++) {
    /* Past the last column, the last one again: each lane's sum is its
     * own. */
    for (int y = n; y < 8; y++)
      a[i][y] = a[i][n - 1];
    const __m256 s = _mm256_mul_ps(_mm256_set1_ps(scale), cpu_hsum8_avx512(a[i]));
    _mm512_mask_storeu_ps(srow + (size_t)i * ld, (__mmask16)((1u << n) - 1),
                          _mm512_castps256_ps512(s));
  }
}

/* The scores of r (1 or 2) key rows k[i] (dtype kdt, unit stride) with n
 * (1..8) columns from c, one chain of 16 lanes per row and column: each
 * query vector loaded meets both rows, two rows of eight columns keep 16
 * FMAs in flight, and 16 + 3 registers of 32. A score's steps are the same
 * whatever r, n and its place among the n, so the forward's many heads and
 * the backward's one agree. */
CPU_FEW512 CPU_INLINE void cpu_qk_cols_avx512(const char *const *k, int r, attn_dtype kdt,
                                              const float *q, int64_t ldq, int c, int n, int64_t d,
                                              float scale, float *srow, int ld) {
  __m512 a[2][8];
  for (int i = 0; i < r; i++)
    for (int y = 0; y < n; y++)
      a[i][y] = _mm512_setzero_ps();
  for (int64_t x = 0; x < d; x += 16) {
    __m512 kv[2];
    for (int i = 0; i < r; i++)
      kv[i] = cpu_load16(k[i], kdt, x);
    for (int y = 0; y < n; y++) {
      const __m512 qv = _mm512_loadu_ps(q + (c + y) * ldq + x);
      for (int i = 0; i < r; i++)
        a[i][y] = _mm512_fmadd_ps(kv[i], qv, a[i][y]);
    }
  }
  cpu_qk_store_avx512(a, r, n, scale, srow + c, ld);
}

/* cpu_qk_row_fma's product, eight columns and both rows at a time. */
CPU_FEW512 static void cpu_qk_row_avx512(const char *const *k, int nk, attn_dtype dt, int64_t sd,
                                         int64_t d, const float *q, int64_t ldq, int c0, int c1,
                                         float scale, float *srow, int ld) {
  float kf[2][ATTN_MAX_HEAD_DIM] __attribute__((aligned(64)));
  const char *rows[2];
  attn_dtype rdt = dt;
  /* Unit-stride rows are converted as they are loaded, once per group of
   * eight columns: 16 elements an instruction cost less than a converted
   * row's stores and reloads (bench/NOTES_decode.md). */
  for (int i = 0; i < nk; i++) {
    rdt = dt;
    rows[i] = cpu_qk_row_src(k[i], &rdt, sd, d, 0, kf[i]);
  }
  dt = rdt;
#define CPU_COLS_CALL(kdt) cpu_qk_cols_avx512(rows, r_, kdt, q, ldq, c, n_, d, scale, srow, ld)
  if (nk == 2) {
    const int r_ = 2;
    CPU_FOR_COLS(c0, c1, 8)
  } else {
    const int r_ = 1;
    CPU_FOR_COLS(c0, c1, 8)
  }
#undef CPU_COLS_CALL
}

/* O[c] += sum_a P[a][c] V[a] over keys [a0, a1) for n (1..4) columns
 * from c, the output rows held in registers over those keys: sixteen
 * elements of four columns are eight accumulators. Each V row (dtype dt,
 * unit stride) is converted in registers as it is read. */
CPU_FMA CPU_INLINE void cpu_pv_cols_fma(const char *const *rows, ptrdiff_t off, attn_dtype dt,
                                        int a0, int a1, const float *pt, int ld, int c, int n,
                                        float *o, int64_t d) {
  int64_t x = 0;
  for (; x + 16 <= d; x += 16) {
    __m256 acc[4][2];
    for (int y = 0; y < n; y++) {
      acc[y][0] = _mm256_loadu_ps(o + (size_t)(c + y) * d + x);
      acc[y][1] = _mm256_loadu_ps(o + (size_t)(c + y) * d + x + 8);
    }
    for (int a = a0; a < a1; a++) {
      const char *row = rows[a] + off;
      const __m256 v0 = cpu_load8(row, dt, x), v1 = cpu_load8(row, dt, x + 8);
      for (int y = 0; y < n; y++) {
        const __m256 p = _mm256_broadcast_ss(pt + (size_t)a * ld + c + y);
        acc[y][0] = _mm256_fmadd_ps(p, v0, acc[y][0]);
        acc[y][1] = _mm256_fmadd_ps(p, v1, acc[y][1]);
      }
    }
    for (int y = 0; y < n; y++) {
      _mm256_storeu_ps(o + (size_t)(c + y) * d + x, acc[y][0]);
      _mm256_storeu_ps(o + (size_t)(c + y) * d + x + 8, acc[y][1]);
    }
  }
  if (x < d) {
    __m256 acc[4];
    for (int y = 0; y < n; y++)
      acc[y] = _mm256_loadu_ps(o + (size_t)(c + y) * d + x);
    for (int a = a0; a < a1; a++) {
      const __m256 v0 = cpu_load8(rows[a] + off, dt, x);
      for (int y = 0; y < n; y++)
        acc[y] = _mm256_fmadd_ps(_mm256_broadcast_ss(pt + (size_t)a * ld + c + y), v0, acc[y]);
    }
    for (int y = 0; y < n; y++)
      _mm256_storeu_ps(o + (size_t)(c + y) * d + x, acc[y]);
  }
}

/* The columns [c0, c1) of one kv head over keys [a0, a1): V's rows at
 * rows[a] + off, dtype dt, unit stride. */
CPU_FMA static void cpu_pv_keys_fma(const char *const *rows, ptrdiff_t off, attn_dtype dt, int a0,
                                    int a1, const float *pt, int ld, int c0, int c1, float *o,
                                    int64_t d){
#define CPU_COLS_CALL(vdt) cpu_pv_cols_fma(rows, off, vdt, a0, a1, pt, ld, c, n_, o, d)
    CPU_FOR_COLS(c0, c1, 4)
#undef CPU_COLS_CALL
}

/* Elements [x, x + 16 w) of O's rows c..c + n - 1 (n up to 8, w 1 or 2)
 * += P V over keys [a0, a1), held in registers over those keys: eight
 * columns of 32 elements are 16 accumulators, each V row's two vectors
 * meet eight broadcast P values. */
CPU_FEW512 CPU_INLINE void cpu_pv_part_avx512(const char *const *rows, ptrdiff_t off, attn_dtype dt,
                                              int a0, int a1, const float *pt, int ld, int c, int n,
                                              float *o, int64_t d, int64_t x, int w) {
  __m512 acc[8][2];
  for (int y = 0; y < n; y++)
    for (int z = 0; z < w; z++)
      acc[y][z] = _mm512_loadu_ps(o + (size_t)(c + y) * d + x + 16 * z);
  for (int a = a0; a < a1; a++) {
    __m512 v[2];
    for (int z = 0; z < w; z++)
      v[z] = cpu_load16(rows[a] + off, dt, x + 16 * z);
    for (int y = 0; y < n; y++) {
      const __m512 p = _mm512_set1_ps(pt[(size_t)a * ld + c + y]);
      for (int z = 0; z < w; z++)
        acc[y][z] = _mm512_fmadd_ps(p, v[z], acc[y][z]);
    }
  }
  for (int y = 0; y < n; y++)
    for (int z = 0; z < w; z++)
      _mm512_storeu_ps(o + (size_t)(c + y) * d + x + 16 * z, acc[y][z]);
}

CPU_FEW512 CPU_INLINE void cpu_pv_cols_avx512(const char *const *rows, ptrdiff_t off, attn_dtype dt,
                                              int a0, int a1, const float *pt, int ld, int c, int n,
                                              float *o, int64_t d) {
  int64_t x = 0;
  for (; x + 32 <= d; x += 32)
    cpu_pv_part_avx512(rows, off, dt, a0, a1, pt, ld, c, n, o, d, x, 2);
  if (x < d) cpu_pv_part_avx512(rows, off, dt, a0, a1, pt, ld, c, n, o, d, x, 1);
}

/* cpu_pv_keys_fma's product, eight columns at a time. */
CPU_FEW512 static void cpu_pv_keys_avx512(const char *const *rows, ptrdiff_t off, attn_dtype dt,
                                          int a0, int a1, const float *pt, int ld, int c0, int c1,
                                          float *o, int64_t d) {
#define CPU_COLS_CALL(vdt) cpu_pv_cols_avx512(rows, off, vdt, a0, a1, pt, ld, c, n_, o, d)
  CPU_FOR_COLS(c0, c1, 8);
#undef CPU_COLS_CALL
}

/* The scores of r (1..4) bf16 key rows k[i] against n (1..4) columns of Q
 * in bf16 (qb, d apart) from c, with the CPU's bf16 dot product
 * (vdpbf16ps: a lane adds the two products of a pair of elements, 32
 * elements a step): one chain of 16 lanes per row and column, as
 * cpu_qk_cols_avx512's, with no conversion of the keys, and the 16 chains
 * reduced together. A step loads r + n vectors for r n products, and a
 * lane sum costs about 3 instructions where 8 chains (two rows of four
 * columns, padded to eight) cost about 6. A score's steps are the same whatever
 * r, n and its place, so the forward's many heads and the backward's one
 * agree. */
CPU_FEWBF16 CPU_INLINE void cpu_qk_tile_dpbf16(const uint16_t *const *k, int r, const uint16_t *qb,
                                               int c, int n, int64_t d, float scale, float *srow,
                                               int ld) {
  __m512 a[16];
  for (int z = 0; z < 16; z++)
    a[z] = _mm512_setzero_ps();
  for (int64_t x = 0; x < d; x += 32) {
    __m512bh kv[4];
    for (int i = 0; i < r; i++)
      kv[i] = (__m512bh)_mm512_loadu_si512(k[i] + x);
    for (int y = 0; y < n; y++) {
      const __m512bh qv = (__m512bh)_mm512_loadu_si512(qb + (size_t)(c + y) * d + x);
      for (int i = 0; i < r; i++)
        a[4 * i + y] = _mm512_dpbf16_ps(a[4 * i + y], kv[i], qv);
    }
  }
  const __m512 s = _mm512_mul_ps(_mm512_set1_ps(scale), cpu_hsum16_avx512(a));
  const __m128 row[4] = {_mm512_extractf32x4_ps(s, 0), _mm512_extractf32x4_ps(s, 1),
                         _mm512_extractf32x4_ps(s, 2), _mm512_extractf32x4_ps(s, 3)};
  for (int i = 0; i < r; i++)
    _mm_mask_storeu_ps(srow + (size_t)i * ld + c, (__mmask8)((1u << n) - 1), row[i]);
}

/* Columns [c0, c1) of nk (1..4) bf16 key rows, four columns at a time. */
CPU_FEWBF16 static void cpu_qk_rows_dpbf16(const char *const *k, int nk, int64_t d,
                                           const uint16_t *qb, int c0, int c1, float scale,
                                           float *srow, int ld) {
  const uint16_t *rows[4];
  for (int i = 0; i < 4; i++)
    rows[i] = (const uint16_t *)k[i < nk ? i : nk - 1];
#define CPU_QK_TILE(r_, n_)                                          \
  case 4 * (r_) + (n_):                                              \
    cpu_qk_tile_dpbf16(rows, (r_), qb, c, (n_), d, scale, srow, ld); \
    break;
#define CPU_QK_TILES(r_) CPU_QK_TILE(r_, 1) CPU_QK_TILE(r_, 2) CPU_QK_TILE(r_, 3) CPU_QK_TILE(r_, 4)
  for (int c = c0; c < c1; c += 4) {
    const int n = c1 - c < 4 ? c1 - c : 4;
    switch (4 * nk + n) {
      CPU_QK_TILES(1)
      CPU_QK_TILES(2)
      CPU_QK_TILES(3)
      CPU_QK_TILES(4)
      default:
        break;
    }
  }
#undef CPU_QK_TILES
#undef CPU_QK_TILE
}

/* Columns [0, cols) of Q (f32, ldq apart, each value a bf16 one: the
 * problem's dtype) as bf16 rows d apart, exactly. */
CPU_FEWBF16 static void cpu_q_bf16(const float *q, int64_t ldq, int cols, int64_t d, uint16_t *qb) {
  for (int c = 0; c < cols; c++)
    for (int64_t x = 0; x < d; x += 32) {
      const float *src = q + (size_t)c * ldq + x;
      const __m512bh h = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(src + 16), _mm512_loadu_ps(src));
      _mm512_storeu_si512(qb + (size_t)c * d + x, (__m512i)h);
    }
}

/* Elements [x, x + 32) of O's rows c..c + n - 1 (n up to 8) += P V over
 * the pairs of keys [p0, p1) of V's bf16 rows at rows[a] + off (a < bc,
 * unit stride), P as the
 * softmax's pairs (pairs[p ldp + c]: keys 2 p and 2 p + 1 of column c, in
 * bf16) with the bf16 dot product: a pair of V rows is interleaved once
 * (two permutations) for the n columns, and a lane adds both keys'
 * products, half the instructions of the f32 products. Past the last key
 * (bc odd), V's row of zeros meets P's zero. */
CPU_FEWBF16 CPU_INLINE void cpu_pv_part_dpbf16(const char *const *rows, ptrdiff_t off, int bc,
                                               int p0, int p1, const uint32_t *pairs, int ldp,
                                               int c, int n, float *o, int64_t d, int64_t x) {
  static const uint16_t order[2][32] = {
      {0, 32, 1, 33, 2,  34, 3,  35, 4,  36, 5,  37, 6,  38, 7,  39,
       8, 40, 9, 41, 10, 42, 11, 43, 12, 44, 13, 45, 14, 46, 15, 47},
      {16, 48, 17, 49, 18, 50, 19, 51, 20, 52, 21, 53, 22, 54, 23, 55,
       24, 56, 25, 57, 26, 58, 27, 59, 28, 60, 29, 61, 30, 62, 31, 63}};
  const __m512i lo = _mm512_loadu_si512(order[0]), hi = _mm512_loadu_si512(order[1]);
  __m512 acc[8][2];
  for (int y = 0; y < n; y++)
    for (int z = 0; z < 2; z++)
      acc[y][z] = _mm512_loadu_ps(o + (size_t)(c + y) * d + x + 16 * z);
  for (int p = p0; p < p1; p++) {
    const __m512i r0 = _mm512_loadu_si512((const uint16_t *)(rows[2 * p] + off) + x);
    const __m512i r1 = 2 * p + 1 < bc
                           ? _mm512_loadu_si512((const uint16_t *)(rows[2 * p + 1] + off) + x)
                           : _mm512_setzero_si512();
    const __m512bh vp[2] = {(__m512bh)_mm512_permutex2var_epi16(r0, lo, r1),
                            (__m512bh)_mm512_permutex2var_epi16(r0, hi, r1)};
    const uint32_t *pp = pairs + (size_t)p * ldp + c;
    for (int y = 0; y < n; y++) {
      const __m512bh pb = (__m512bh)_mm512_set1_epi32((int)pp[y]);
      for (int z = 0; z < 2; z++)
        acc[y][z] = _mm512_dpbf16_ps(acc[y][z], pb, vp[z]);
    }
  }
  for (int y = 0; y < n; y++)
    for (int z = 0; z < 2; z++)
      _mm512_storeu_ps(o + (size_t)(c + y) * d + x + 16 * z, acc[y][z]);
}

/* cpu_pv_keys_avx512's product over keys [a0, a1) (a0 even), P from the
 * softmax's pairs: eight columns at a time, d a multiple of 32. */
CPU_FEWBF16 static void cpu_pv_pairs_dpbf16(const char *const *rows, ptrdiff_t off, int bc, int a0,
                                            int a1, const uint32_t *pairs, int ldp, int c0, int c1,
                                            float *o, int64_t d) {
#define CPU_DP_COLS(cols)             \
  for (int64_t x = 0; x < d; x += 32) \
    cpu_pv_part_dpbf16(rows, off, bc, a0 / 2, (a1 + 1) / 2, pairs, ldp, c, cols, o, d, x);
  for (int c = c0; c < c1; c += 8) {
    const int n = c1 - c < 8 ? c1 - c : 8;
    CPU_WITH_COLS(n, 8, CPU_DP_COLS)
  }
#undef CPU_DP_COLS
}
#else
#define CPU_HAVE_FMA() 0
#define CPU_HAVE_AVX512() 0
#define CPU_HAVE_AVX512BF16() 0
#define cpu_qk_rows_dpbf16(k, nk, d, qb, c0, c1, scale, srow, ld) ((void)0)
#define cpu_pv_pairs_dpbf16(rows, off, bc, a0, a1, pairs, ldp, c0, c1, o, d) ((void)0)
#define cpu_q_bf16(q, ldq, cols, d, qb) ((void)0)
#define cpu_qk_row_fma NULL
#define cpu_qk_row_avx512 NULL
#define cpu_pv_keys_fma NULL
#define cpu_pv_keys_avx512 NULL
#endif

/* One key row's scores (cpu_qk_row_fma), and one kv head's P V over a run
 * of keys (cpu_pv_keys_fma), in one instruction set. */
typedef void cpu_qk_row_fn(const char *const *k, int nk, attn_dtype dt, int64_t sd, int64_t d,
                           const float *q, int64_t ldq, int c0, int c1, float scale, float *srow,
                           int ld);
typedef void cpu_pv_keys_fn(const char *const *rows, ptrdiff_t off, attn_dtype dt, int a0, int a1,
                            const float *pt, int ld, int c0, int c1, float *o, int64_t d);

/* AMX's tiles take 16 columns (query rows of a kv head) at the cost of 16
 * whatever a tile holds: with fewer, AVX-512's products do less. Measured
 * on the GPU host's 16 Xeon cores (bf16, 32 query heads over 8 kv heads,
 * d = 128, 32k keys, GB/s, two rounds): 4 query rows (16 columns) 62-68
 * with tiles against 42-45; 2 rows 66-73 against 70-77; 1 row 65-80
 * against 97-100. */
#define CPU_FEW_TILE_COLUMNS 16

/* From this many columns (query rows) a kv head meets, f32 values are
 * fetched with the keys too (attn__cpu_qk_few): the products of a key then
 * take long enough to cover the extra lines in flight. Measured on the
 * 2-core Zen 5 VM, f32 B=1 Hq=32 Hkv=8 d=128 32k keys, 2 threads, median
 * of 15: 4 query rows (16 columns) 10.7-11.5 ms against 16.2-16.3; 2 rows
 * (8 columns) 8.7-9.0 against 8.0-8.5. */
#define CPU_FETCH_V_COLUMNS 16

/* The instruction set of the products of few rows: 4 AMX's tiles (bf16
 * problems, d a multiple of 32, a kv head meeting at least
 * CPU_FEW_TILE_COLUMNS query rows: cpu_few_amx.c), 3 AVX-512 with the bf16
 * dot product (Q K^T, and P V from the softmax's pairs), 2 AVX-512, 1
 * AVX2 and FMA, 0 the portable loops. One fixed choice per machine and
 * problem (dtype, head dimension, rows per kv head), so that
 * attn__cpu_qk_few gives the backward the forward's scores to the bit. */
static int cpu_few_isa(const attn__problem *pb) {
#if defined(ATTN_CPU_HAVE_AMX)
  if (pb->head_dim % 32 == 0 && pb->dtype == ATTN_BF16 &&
      pb->seqlen_q * (pb->heads_q / pb->heads_kv) >= CPU_FEW_TILE_COLUMNS && attn__cpu_amx())
    return 4;
#endif
  if (pb->head_dim % 32 == 0 && pb->dtype == ATTN_BF16 && CPU_HAVE_AVX512() &&
      CPU_HAVE_AVX512BF16())
    return 3;
  if (pb->head_dim % 16 == 0 && CPU_HAVE_AVX512()) return 2;
  if (pb->head_dim % 8 == 0 && CPU_HAVE_FMA()) return 1;
  return 0;
}

/* Q's columns in bf16 for the bf16 dot product, per thread: a tile's
 * columns (Br) of d up to ATTN_MAX_HEAD_DIM. */
static _Thread_local uint16_t cpu_qb[ATTN__CPU_TILE_MAX * ATTN_MAX_HEAD_DIM];

#if defined(ATTN_CPU_HAVE_AMX)
/* And in pairs for AMX's tiles: qp[p ldq + c] = (q[c][2p], q[c][2p + 1]),
 * exactly (they are bf16 values), ldq = cols + 16 with zeros past cols, so
 * that a tile of 16 columns may start at any column. */
static _Thread_local uint32_t cpu_qp[ATTN_MAX_HEAD_DIM / 2 * (ATTN__CPU_TILE_MAX + 16)];
static int cpu_q_pairs(const float *q, int64_t ldq, int cols, int64_t d, uint32_t *qp) {
  const int ldp = cols + 16;
  for (int64_t p = 0; p < d / 2; p++) {
    uint32_t *row = qp + (size_t)p * ldp;
    for (int c = 0; c < cols; c++) {
      const float *x = q + (size_t)c * ldq + 2 * p;
      row[c] = attn__cpu_bf16_bits(x[0]) | attn__cpu_bf16_bits(x[1]) << 16;
    }
    memset(row + cols, 0, 16 * sizeof *row);
  }
  return ldp;
}

/* AMX's S^T of the tile, its kv heads side by side. */
static void cpu_qk_few_tiles(const attn__problem *pb, const attn__tensor *t, const attn__tensor *v,
                             int64_t b, int64_t j0, int bc, int64_t h0, int nh, int nr,
                             const float *q, int64_t ldq, float *st, int ld) {
  const int64_t d = pb->head_dim, g = pb->heads_q / pb->heads_kv;
  const int64_t hk0 = h0 / g, hk1 = (h0 + nh - 1) / g;
  const int ldp = cpu_q_pairs(q, ldq, nh * nr, d, cpu_qp);
  int cols[ATTN__CPU_TILE_MAX + 1];
  for (int64_t hk = hk0; hk <= hk1; hk++) {
    int c1;
    cpu_kv_cols(pb, h0, nh, nr, hk, &cols[hk - hk0], &c1);
    cols[hk - hk0 + 1] = c1;
  }
  /* The values' rows when they have the keys' layout, to fetch, and the
   * sequence's next 32 key rows past the block. */
  const int fetch = v && v->dtype == ATTN_BF16 && v->sd == 1 && v->sh == t->sh;
  const int64_t left = attn__seq_k(pb, b) - j0;
  const int kn = left < bc + 32 ? (int)(left > bc ? left : bc) : bc + 32;
  const uint16_t *k[ATTN__CPU_TILE_MAX + 32], *vr[ATTN__CPU_TILE_MAX];
  for (int a = 0; a < kn; a++)
    k[a] = (const uint16_t *)cpu_key_at(pb, t, b, j0 + a, hk0);
  for (int a = 0; fetch && a < bc; a++)
    vr[a] = (const uint16_t *)cpu_key_at(pb, v, b, j0 + a, hk0);
  attn__cpu_qk_few_amx(k, fetch ? vr : NULL, (ptrdiff_t)t->sh, (int)(hk1 - hk0 + 1), cols, bc, kn,
                       (int)d, cpu_qp, ldp, pb->scale, st, ld);
}
#endif

void attn__cpu_qk_few(const attn__problem *pb, const attn__tensor *t, const attn__tensor *v,
                      int64_t b, int64_t j0, int bc, int64_t h0, int nh, int nr, const float *q,
                      int64_t ldq, float *st, int ld) {
  int isa = cpu_few_isa(pb);
  /* The bf16 dot product reads the keys as they are stored: keys of
   * another layout take AVX-512, the forward's and the backward's alike
   * (the same keys). A tile's columns are at most Br. */
  if (isa >= 3 && (t->dtype != ATTN_BF16 || t->sd != 1)) isa = 2;
#if defined(ATTN_CPU_HAVE_AMX)
  if (isa == 4) {
    cpu_qk_few_tiles(pb, t, v, b, j0, bc, h0, nh, nr, q, ldq, st, ld);
    return;
  }
#endif
  if (!isa) {
    cpu_qk_few_clones(pb, t, b, j0, bc, h0, nh, nr, q, ldq, pb->scale, st, ld);
    return;
  }
  cpu_qk_row_fn *row = isa == 2 ? cpu_qk_row_avx512 : cpu_qk_row_fma;
  const int64_t d = pb->head_dim, g = pb->heads_q / pb->heads_kv;
  if (isa == 3) cpu_q_bf16(q, ldq, nh * nr, d, cpu_qb);
  const int64_t hk0 = h0 / g, hk1 = (h0 + nh - 1) / g;
  const attn_dtype dt = t->dtype;
  const ptrdiff_t hstep = cpu_head_bytes(pb, t);
  /* The value rows of the block are fetched meanwhile (pv, when not
   * NULL), so that attn__cpu_pv_few finds them in cache, where the keys
   * are 16-bit or a kv head meets CPU_FETCH_V_COLUMNS columns: measured,
   * one thread, least CPU time of 8 runs decoding B=1 Hq=32 Hkv=8 d=128
   * 32k keys: bf16 15.8 ms against 17.7; f32 24.7 against 21.6 (twice the
   * lines in flight beside the keys' own, for products too few to cover
   * them). */
  const attn__tensor *pv = t->sd == 1 && pb->v.sd == 1 ? v : NULL;
  const ptrdiff_t vstep = pv ? cpu_head_bytes(pb, pv) : 0;
  /* Key rows two at a time (four for the bf16 dot product), which the
   * products take together, and the next rows' keys fetched meanwhile:
   * read in pairs, the rows zigzag through the cache (head 0 of key a, of
   * key a + 1, head 1 of key a, ...), and the hardware prefetcher lost the
   * stream (decoding one query row, bf16, B=1 Hq=32 Hkv=8 d=128 32k keys,
   * 2 threads on the 2-core build host, median of 5: 13.2 ms without, 9.0
   * with, 11.8 with the rows taken one at a time). The next rows are those
   * of the sequence, past this block's end too, so that the stream does
   * not stop at every block. Keys and values go to L2, not L1: they wait
   * there for their products without holding L1's few miss buffers, which
   * left the loads waiting (decoding from memory 1.2-1.7x faster;
   * bench/NOTES_decode.md). */
  const int step = isa == 3 ? 4 : 2;
  const int64_t kbytes = d * (int64_t)attn_dtype_size(dt);
  const int64_t vbytes = pv ? d * (int64_t)attn_dtype_size(pv->dtype) : 0;
  const int64_t left = attn__seq_k(pb, b) - j0; /* keys from j0 that exist */
  for (int a = 0; a < bc; a += step) {
    const int nk = bc - a < step ? bc - a : step;
    const int64_t ahead = left - a - step;
    const int nn = ahead <= 0 ? 0 : ahead < step ? (int)ahead : step;
    const char *base[4], *vbase[4], *next[4];
    for (int i = 0; i < nk; i++) {
      base[i] = cpu_key_at(pb, t, b, j0 + a + i, 0);
      if (pv) vbase[i] = cpu_key_at(pb, pv, b, j0 + a + i, 0);
    }
    for (int i = 0; i < nn; i++)
      next[i] = cpu_key_at(pb, t, b, j0 + a + step + i, 0);
    for (int64_t hk = hk0; hk <= hk1; hk++) {
      int c0, c1;
      cpu_kv_cols(pb, h0, nh, nr, hk, &c0, &c1);
      /* A kv head's lines at a time, spread over the loop rather than a
       * whole row's in one burst. */
      const int fetch_v = pv && (attn_dtype_size(dt) == 2 || c1 - c0 >= CPU_FETCH_V_COLUMNS);
      for (int i = 0; fetch_v && i < nk; i++)
        for (int64_t x = 0; x < vbytes; x += 64)
          __builtin_prefetch(vbase[i] + hk * vstep + x, 0, 2);
      for (int i = 0; t->sd == 1 && i < nn; i++)
        for (int64_t x = 0; x < kbytes; x += 64)
          __builtin_prefetch(next[i] + hk * hstep + x, 0, 2);
      const char *rows[4];
      for (int i = 0; i < nk; i++)
        rows[i] = base[i] + hk * hstep;
      if (isa == 3)
        cpu_qk_rows_dpbf16(rows, nk, d, cpu_qb, c0, c1, pb->scale, st + (size_t)a * ld, ld);
      else
        row(rows, nk, dt, t->sd, d, q, ldq, c0, c1, pb->scale, st + (size_t)a * ld, ld);
    }
  }
}

/* Keys are taken 8 at a time, all kv heads of the tile before the next 8
 * (but by the bf16 dot product, below):
 * the cache is read in address order, and the 8 rows a pass over a chunk
 * of elements touches stay in L1 (rows of one kv head are Hkv * d elements
 * apart, often a multiple of 4 KiB, and then all fall in one set of the
 * 8-way L1: 64 keys at once thrashed it, and f32 decoding ran 1.6x
 * slower). */
#define CPU_PV_KEYS 8

int attn__cpu_few_pairs(const attn__problem *pb) {
  return cpu_few_isa(pb) >= 3 && pb->v.dtype == ATTN_BF16 && pb->v.sd == 1;
}

void attn__cpu_pv_few(const attn__problem *pb, const attn__tensor *t, int64_t b, int64_t j0, int bc,
                      int64_t h0, int nh, int nr, const float *pt, const uint32_t *pairs, int ld,
                      float *o) {
#if defined(ATTN_CPU_HAVE_AMX)
  if (pairs && cpu_few_isa(pb) == 4) {
    const int64_t d = pb->head_dim, g = pb->heads_q / pb->heads_kv;
    const uint16_t *rows[ATTN__CPU_TILE_MAX], *v[ATTN__CPU_TILE_MAX];
    for (int a = 0; a < bc; a++)
      rows[a] = (const uint16_t *)cpu_key_at(pb, t, b, j0 + a, 0);
    for (int64_t hk = h0 / g; hk <= (h0 + nh - 1) / g; hk++) {
      int c0, c1;
      cpu_kv_cols(pb, h0, nh, nr, hk, &c0, &c1);
      for (int a = 0; a < bc; a++)
        v[a] = rows[a] + hk * (ptrdiff_t)t->sh;
      attn__cpu_pv_few_amx(v, bc, (int)d, pairs + c0, ld, c1 - c0, o + (size_t)c0 * d);
    }
    return;
  }
#endif
  /* Any rounding does here (no pass recomputes O), so the portable loops
   * take only what these cannot: rows of other strides. Pairs come only
   * where the bf16 dot product takes them (attn__cpu_few_pairs). */
  const int isa = t->sd == 1 ? cpu_few_isa(pb) : 0;
  if (!isa) {
    cpu_pv_few_clones(pb, t, b, j0, bc, h0, nh, nr, pt, ld, o);
    return;
  }
  cpu_pv_keys_fn *keys = isa >= 2 ? cpu_pv_keys_avx512 : cpu_pv_keys_fma;
  const int64_t d = pb->head_dim, g = pb->heads_q / pb->heads_kv;
  const int64_t hk0 = h0 / g, hk1 = (h0 + nh - 1) / g;
  const ptrdiff_t hstep = cpu_head_bytes(pb, t);
  const char *rows[ATTN__CPU_TILE_MAX];
  for (int a = 0; a < bc; a++)
    rows[a] = cpu_key_at(pb, t, b, j0 + a, 0);
  /* CPU_PV_KEYS is even: a run holds whole pairs. The bf16 dot product
   * takes the block's keys in one run: its values were fetched into L2
   * with the keys (attn__cpu_qk_few), so L1's sets matter less than O's
   * accumulators, loaded and stored around each run (10-15 % of a
   * decoding call with runs of 8 keys). */
  const int run = pairs ? bc : CPU_PV_KEYS;
  for (int a0 = 0; a0 < bc; a0 += run) {
    const int a1 = a0 + run < bc ? a0 + run : bc;
    for (int64_t hk = hk0; hk <= hk1; hk++) {
      int c0, c1;
      cpu_kv_cols(pb, h0, nh, nr, hk, &c0, &c1);
      if (pairs)
        cpu_pv_pairs_dpbf16(rows, hk * hstep, bc, a0, a1, pairs, ld, c0, c1, o, d);
      else
        keys(rows, hk * hstep, t->dtype, a0, a1, pt, ld, c0, c1, o, d);
    }
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

/* The same, eight rows by eight keys at a time where all of them are
 * visible and the keys are adjacent (sd = 1): each 8 x 8 block of the bias
 * is transposed in registers and added to eight score rows at once, where
 * the scalar loop adds one element at a time, scattered a tile row apart.
 * Measured on the build host, forward B=1 H=8 N=2048 d=64 f32, one
 * thread, least CPU time of 18 runs: 200 ms without a bias, 219 ms with a
 * full f32 one (0.91x) and 221 with a bf16 one; the scalar loop alone made
 * it 0.80x. */
#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("avx2,f16c"))) static inline __m256 cpu_bias8(const char *x, attn_dtype dt) {
  switch (dt) {
    case ATTN_F16:
      return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)x));
    case ATTN_BF16:
      return _mm256_castsi256_ps(
          _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)x)), 16));
    default:
      return _mm256_loadu_ps((const float *)x);
  }
}

__attribute__((target("avx2,f16c"))) static void cpu_bias_cols_avx2(const attn__tensor *bt,
                                                                    const char *bias, int br,
                                                                    int bc, const int *c0,
                                                                    const int *c1, float *st,
                                                                    int ld) {
  const size_t es = attn_dtype_size(bt->dtype);
  int r = 0;
  for (; r + 8 <= br; r += 8) {
    /* The keys all eight rows see. */
    int lo = 0, hi = bc;
    for (int y = 0; y < 8; y++) {
      lo = c0[r + y] > lo ? c0[r + y] : lo;
      hi = c1[r + y] < hi ? c1[r + y] : hi;
    }
    int c = lo;
    if (hi - lo >= 8) {
      for (; c + 8 <= hi; c += 8) {
        __m256 x[8];
        for (int y = 0; y < 8; y++)
          x[y] = cpu_bias8(bias + (size_t)((r + y) * bt->ss + c) * es, bt->dtype);
        /* 8 x 8 transpose: x[y][k] becomes t[k][y]. */
        const __m256 a0 = _mm256_unpacklo_ps(x[0], x[1]), a1 = _mm256_unpackhi_ps(x[0], x[1]);
        const __m256 a2 = _mm256_unpacklo_ps(x[2], x[3]), a3 = _mm256_unpackhi_ps(x[2], x[3]);
        const __m256 a4 = _mm256_unpacklo_ps(x[4], x[5]), a5 = _mm256_unpackhi_ps(x[4], x[5]);
        const __m256 a6 = _mm256_unpacklo_ps(x[6], x[7]), a7 = _mm256_unpackhi_ps(x[6], x[7]);
        const __m256 b0 = _mm256_shuffle_ps(a0, a2, 0x44), b1 = _mm256_shuffle_ps(a0, a2, 0xee);
        const __m256 b2 = _mm256_shuffle_ps(a1, a3, 0x44), b3 = _mm256_shuffle_ps(a1, a3, 0xee);
        const __m256 b4 = _mm256_shuffle_ps(a4, a6, 0x44), b5 = _mm256_shuffle_ps(a4, a6, 0xee);
        const __m256 b6 = _mm256_shuffle_ps(a5, a7, 0x44), b7 = _mm256_shuffle_ps(a5, a7, 0xee);
        const __m256 t[8] = {
            _mm256_permute2f128_ps(b0, b4, 0x20), _mm256_permute2f128_ps(b1, b5, 0x20),
            _mm256_permute2f128_ps(b2, b6, 0x20), _mm256_permute2f128_ps(b3, b7, 0x20),
            _mm256_permute2f128_ps(b0, b4, 0x31), _mm256_permute2f128_ps(b1, b5, 0x31),
            _mm256_permute2f128_ps(b2, b6, 0x31), _mm256_permute2f128_ps(b3, b7, 0x31)};
        for (int k = 0; k < 8; k++) {
          float *srow = st + (size_t)(c + k) * ld + r;
          _mm256_storeu_ps(srow, _mm256_add_ps(_mm256_loadu_ps(srow), t[k]));
        }
      }
    }
    /* The rest of these rows' keys, one by one: those outside [lo, c). */
    for (int y = 0; y < 8; y++) {
      const int e = c1[r + y] < lo ? c1[r + y] : lo, f = c0[r + y] > c ? c0[r + y] : c;
      for (int k = c0[r + y]; k < e; k++)
        st[(size_t)k * ld + r + y] += attn__load(bias, bt->dtype, (r + y) * bt->ss + k);
      for (int k = f; k < c1[r + y]; k++)
        st[(size_t)k * ld + r + y] += attn__load(bias, bt->dtype, (r + y) * bt->ss + k);
    }
  }
  for (; r < br; r++)
    for (int k = c0[r]; k < c1[r]; k++)
      st[(size_t)k * ld + r] += attn__load(bias, bt->dtype, r * bt->ss + k);
}
#define CPU_HAVE_AVX2() __builtin_cpu_supports("avx2")
#else
#define CPU_HAVE_AVX2() 0
#define cpu_bias_cols_avx2(bt, bias, br, bc, c0, c1, st, ld) ((void)0)
#endif

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
    const char *bias = (const char *)bt->native + bt->offset +
                       (ptrdiff_t)e * (ptrdiff_t)attn_dtype_size(bt->dtype);
    if (bt->sd == 1 && CPU_HAVE_AVX2())
      cpu_bias_cols_avx2(bt, bias, br, bc, c0, c1, st, ld);
    else
      cpu_bias_cols_clones(bt, bias, br, c0, c1, st, ld);
  }
}

/* exp(x) for the softmax: x = s - m <= 0 in the forward pass, about that in
 * the backward. glibc's expf is a scalar call per element, and the tile has
 * Br*Bc of them for 4*Br*Bc*d flops of sgemm: at d = 64 the calls cost as
 * much as the products. This is the classic Cephes reduction, written so
 * that the compiler vectorizes the loop: x = n ln2 + r with n = round(x /
 * ln2) (ln2 split in two parts so r is exact), exp(r) by a degree-6
 * polynomial on |r| <= ln2/2 in Horner's form, 1 + r + r^2 (c2 + ... +
 * c6 r^4) with c2..c6 fitted for the least relative error (0.9 ulp at most
 * on [-87, 88] against exp in double; Cephes' degree-7 form, 1.0 ulp, took
 * two more instructions a vector), times 2^n built from the exponent bits.
 * Below -87 (and for -inf) the result is exactly 0: e^-87 is already below
 * FLT_MIN, and a masked score must weigh nothing. NaN gives NaN (a NaN
 * score must reach the row's sum), without converting NaN to an int, which
 * C leaves undefined. */
#define CPU_EXP_C2 4.9999994040e-01f
#define CPU_EXP_C3 1.6666521132e-01f
#define CPU_EXP_C4 4.1668388993e-02f
#define CPU_EXP_C5 8.3687100559e-03f
#define CPU_EXP_C6 1.3814612757e-03f
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
  float y = CPU_EXP_C6;
  y = y * r + CPU_EXP_C5;
  y = y * r + CPU_EXP_C4;
  y = y * r + CPU_EXP_C3;
  y = y * r + CPU_EXP_C2;
  y = y * r + 1.0f;
  y = y * r + 1.0f;
  uint32_t bits;
  memcpy(&bits, &t, sizeof bits);
  bits = (bits - 0x4b400000u + 127u) << 23;
  float scale;
  memcpy(&scale, &bits, sizeof scale);
  return x < -87.0f ? 0.0f : y * scale;
}

/* The pairs pass on AVX512_BF16 (below): 1 where it ran, 0 where the CPU
 * lacks the instructions. */
static int cpu_exp_pairs_avx512(const float *st, int bc, int br, int ld, const float *sub,
                                float *sum, uint32_t *pairs, int ldp);

static CPU_SIMD_CLONES void cpu_softmax_cols_clones(float *st, int bc, int br, int ld, float *m,
                                                    float *l, float *alpha, uint32_t *pairs,
                                                    int ldp) {
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
  /* The pairs pass on AVX512_BF16 where the CPU has it, else here. */
  if (pairs && !cpu_exp_pairs_avx512(st, bc, br, ld, sub, sum, pairs, ldp)) {
    /* Keys two at a time, each row's sum still in key order. */
    for (int c = 0; c < bc; c += 2) {
      const float *x0 = st + (size_t)c * ld, *x1 = x0 + ld;
      uint32_t *o = pairs + (size_t)(c / 2) * ldp;
      if (c + 1 < bc)
        for (int r = 0; r < br; r++) {
          const float p0 = cpu_exp(x0[r] - sub[r]), p1 = cpu_exp(x1[r] - sub[r]);
          sum[r] += p0;
          sum[r] += p1;
          o[r] = attn__cpu_bf16_bits(p0) | attn__cpu_bf16_bits(p1) << 16;
        }
      else
        for (int r = 0; r < br; r++) {
          const float p0 = cpu_exp(x0[r] - sub[r]);
          sum[r] += p0;
          o[r] = attn__cpu_bf16_bits(p0);
        }
    }
  } else if (!pairs) {
    for (int c = 0; c < bc; c++) {
      float *x = st + (size_t)c * ld;
      for (int r = 0; r < br; r++) {
        float p = cpu_exp(x[r] - sub[r]);
        x[r] = p;
        sum[r] += p;
      }
    }
  }
  for (int r = 0; r < br; r++)
    l[r] = alpha[r] * l[r] + sum[r];
}

/* cpu_exp's steps eight at a time with fused multiply-adds, for CPUs with
 * AVX2 and FMA but not AVX-512: the AVX2 clone of the loops above cannot
 * use FMA (the clone's target lacks it, and ISO C does not contract), and
 * their polynomial was most of the 18 % the softmax took of a forward
 * (perf, N 2048, d 64, one thread). AVX-512 machines take the same steps
 * sixteen at a time: their clone had no FMA either (19 % of an f32 forward
 * in the softmax, N 4096, d 64, one thread). NaN stays NaN: the clamps are
 * selects on compares, which a NaN fails, as cpu_exp's. */
#if defined(__x86_64__) && defined(__GNUC__)
/* cpu_exp's steps on a vector of W bits (256, 512) whose lanes xc are
 * already clamped, with fused multiply-adds, up to y and n of e^x = y 2^n:
 * the one body of cpu_exp8 and cpu_exp16, whose clamps, selects and 2^n
 * differ (AVX-512 takes masks, and scales by 2^n in one instruction). */
#define CPU_EXP_STEPS(W, xc, y_, n_)                                                            \
  do {                                                                                          \
    const __m##W magic_ = _mm##W##_set1_ps(12582912.0f);                                        \
    n_ = _mm##W##_sub_ps(_mm##W##_fmadd_ps(xc, _mm##W##_set1_ps(1.44269504088896341f), magic_), \
                         magic_);                                                               \
    __m##W r_ = _mm##W##_fnmadd_ps(n_, _mm##W##_set1_ps(0.693359375f), xc);                     \
    r_ = _mm##W##_fnmadd_ps(n_, _mm##W##_set1_ps(-2.12194440e-4f), r_);                         \
    y_ = _mm##W##_set1_ps(CPU_EXP_C6);                                                          \
    y_ = _mm##W##_fmadd_ps(y_, r_, _mm##W##_set1_ps(CPU_EXP_C5));                               \
    y_ = _mm##W##_fmadd_ps(y_, r_, _mm##W##_set1_ps(CPU_EXP_C4));                               \
    y_ = _mm##W##_fmadd_ps(y_, r_, _mm##W##_set1_ps(CPU_EXP_C3));                               \
    y_ = _mm##W##_fmadd_ps(y_, r_, _mm##W##_set1_ps(CPU_EXP_C2));                               \
    y_ = _mm##W##_fmadd_ps(y_, r_, _mm##W##_set1_ps(1.0f));                                     \
    y_ = _mm##W##_fmadd_ps(y_, r_, _mm##W##_set1_ps(1.0f));                                     \
  } while (0)

CPU_FMA static inline __m256 cpu_exp8(__m256 x) {
  const __m256 lo = _mm256_set1_ps(-87.0f), hi = _mm256_set1_ps(88.0f);
  __m256 xc = _mm256_blendv_ps(x, lo, _mm256_cmp_ps(x, lo, _CMP_LT_OQ)), e;
  xc = _mm256_blendv_ps(xc, hi, _mm256_cmp_ps(xc, hi, _CMP_GT_OQ));
  __m256 n;
  CPU_EXP_STEPS(256, xc, e, n);
  /* 2^n from its exponent bits (n is a whole number in [-126, 127]). */
  const __m256i p2 =
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(n), _mm256_set1_epi32(127)), 23);
  e = _mm256_mul_ps(e, _mm256_castsi256_ps(p2));
  return _mm256_blendv_ps(e, _mm256_setzero_ps(), _mm256_cmp_ps(x, lo, _CMP_LT_OQ));
}

/* cpu_exp16: cpu_exp8 on AVX-512 (AVX512F has the 512-bit FMAs). */
#define CPU_AVX512 __attribute__((target("avx512f")))
CPU_AVX512 static inline __m512 cpu_exp16(__m512 x) {
  /* No clamp below: scalef takes any n, and the lanes under -87 come out 0
   * by the mask. min_ps returns its second operand for a NaN one. */
  const __mmask16 under = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.0f), _CMP_LT_OQ);
  const __m512 xc = _mm512_min_ps(_mm512_set1_ps(88.0f), x);
  __m512 e, n;
  CPU_EXP_STEPS(512, xc, e, n);
  /* e 2^n, rounded as the product by 2^n is; 0 below -87. */
  return _mm512_maskz_scalef_ps((__mmask16)~under, e, n);
}

/* The softmax's and the backward's exponentials N = W / 32 rows at a time
 * through EXP (cpu_exp8, cpu_exp16), the rows past a multiple of N by
 * cpu_exp: the same steps as the portable loops, one function per width. */
#define CPU_EXP_COLS_SIMD(W, N, EXP, TARGET, SOFTMAX, EXPCOLS)                                     \
  TARGET static void SOFTMAX(float *st, int bc, int br, int ld, float *m, float *l,                \
                             float *alpha) {                                                       \
    float mx[ATTN__CPU_TILE_MAX], sub[ATTN__CPU_TILE_MAX], sum[ATTN__CPU_TILE_MAX];                \
    const int rv = br / (N) * (N);                                                                 \
    for (int r = 0; r < br; r++) {                                                                 \
      mx[r] = m[r];                                                                                \
      sum[r] = 0.0f;                                                                               \
    }                                                                                              \
    /* A vector of rows at a time down the keys, its max and sum in                                \
     * registers (max_ps(x, mx) is x > mx ? x : mx, NaN x included). */                            \
    for (int r = 0; r < rv; r += (N)) {                                                            \
      __m##W v = _mm##W##_loadu_ps(mx + r);                                                        \
      for (int c = 0; c < bc; c++)                                                                 \
        v = _mm##W##_max_ps(_mm##W##_loadu_ps(st + (size_t)c * ld + r), v);                        \
      _mm##W##_storeu_ps(mx + r, v);                                                               \
    }                                                                                              \
    for (int c = 0; c < bc; c++) {                                                                 \
      const float *x = st + (size_t)c * ld;                                                        \
      for (int r = rv; r < br; r++)                                                                \
        mx[r] = x[r] > mx[r] ? x[r] : mx[r];                                                       \
    }                                                                                              \
    for (int r = 0; r < br; r++) {                                                                 \
      sub[r] = mx[r] == -INFINITY ? 0.0f : mx[r];                                                  \
      alpha[r] = cpu_exp(m[r] - sub[r]);                                                           \
      m[r] = mx[r];                                                                                \
    }                                                                                              \
    for (int r = 0; r < rv; r += (N)) {                                                            \
      const __m##W s = _mm##W##_loadu_ps(sub + r);                                                 \
      __m##W acc = _mm##W##_setzero_ps();                                                          \
      for (int c = 0; c < bc; c++) {                                                               \
        float *x = st + (size_t)c * ld + r;                                                        \
        const __m##W p = EXP(_mm##W##_sub_ps(_mm##W##_loadu_ps(x), s));                            \
        _mm##W##_storeu_ps(x, p);                                                                  \
        acc = _mm##W##_add_ps(acc, p);                                                             \
      }                                                                                            \
      _mm##W##_storeu_ps(sum + r, acc);                                                            \
    }                                                                                              \
    for (int c = 0; c < bc; c++) {                                                                 \
      float *x = st + (size_t)c * ld;                                                              \
      for (int r = rv; r < br; r++) {                                                              \
        const float p = cpu_exp(x[r] - sub[r]);                                                    \
        x[r] = p;                                                                                  \
        sum[r] += p;                                                                               \
      }                                                                                            \
    }                                                                                              \
    for (int r = 0; r < br; r++)                                                                   \
      l[r] = alpha[r] * l[r] + sum[r];                                                             \
  }                                                                                                \
  TARGET static void EXPCOLS(float *st, int rows, int cols, int ld, const float *hi,               \
                             const float *lo) {                                                    \
    float sub[ATTN__CPU_TILE_MAX], keep[ATTN__CPU_TILE_MAX];                                       \
    const int rv = cols / (N) * (N);                                                               \
    for (int r = 0; r < cols; r++) {                                                               \
      keep[r] = hi[r] == -INFINITY ? 0.0f : 1.0f;                                                  \
      sub[r] = hi[r] == -INFINITY ? 0.0f : hi[r];                                                  \
    }                                                                                              \
    for (int c = 0; c < rows; c++) {                                                               \
      float *x = st + (size_t)c * ld;                                                              \
      for (int r = 0; r < rv; r += (N)) {                                                          \
        const __m##W d =                                                                           \
            _mm##W##_sub_ps(_mm##W##_sub_ps(_mm##W##_loadu_ps(x + r), _mm##W##_loadu_ps(sub + r)), \
                            _mm##W##_loadu_ps(lo + r));                                            \
        _mm##W##_storeu_ps(x + r, _mm##W##_mul_ps(EXP(d), _mm##W##_loadu_ps(keep + r)));           \
      }                                                                                            \
      for (int r = rv; r < cols; r++)                                                              \
        x[r] = cpu_exp((x[r] - sub[r]) - lo[r]) * keep[r];                                         \
    }                                                                                              \
  }
CPU_EXP_COLS_SIMD(256, 8, cpu_exp8, CPU_FMA, cpu_softmax_cols_fma, cpu_exp_cols_fma)
CPU_EXP_COLS_SIMD(512, 16, cpu_exp16, CPU_AVX512, cpu_softmax_cols_512, cpu_exp_cols_512)
#undef CPU_EXP_COLS_SIMD
/* Which of them the CPU runs: 2 (AVX-512), 1 (AVX2 and FMA), 0 (neither:
 * the portable loops' clones). */
static int cpu_exp_width(void) {
  return __builtin_cpu_supports("avx512f") ? 2 : CPU_HAVE_FMA() ? 1 : 0;
}
#else
#define cpu_exp_width() 0
#define cpu_softmax_cols_fma(st, bc, br, ld, m, l, alpha) ((void)0)
#define cpu_exp_cols_fma(st, rows, cols, ld, hi, lo) ((void)0)
#define cpu_softmax_cols_512(st, bc, br, ld, m, l, alpha) ((void)0)
#define cpu_exp_cols_512(st, rows, cols, ld, hi, lo) ((void)0)
#endif

/* The bf16 pairs pass of the softmax where the CPU has AVX512_BF16 (every
 * CPU whose bf16 instructions take pairs): cpu_exp's steps sixteen at a
 * time with fused multiply-adds, as cpu_exp8's, and the rounding by
 * VCVTNEPS2BF16, which is attn__cpu_bf16_bits's (to nearest even, NaN made
 * quiet; it flushes subnormals, which P never is: exp gives 0 below e^-87).
 * It was most of the softmax in a bf16 forward (perf: the AVX-512 clone's
 * integer rounding and separate multiplies and adds). Each row's sum still
 * adds its keys in order. */
#if defined(ATTN_CPU_HAVE_AVX512BF16) && defined(__x86_64__) && defined(__GNUC__)
#define CPU_AVX512_BF16 __attribute__((target("avx512f,avx512bw,avx512bf16,fma")))
/* Up to 64 rows at a time, their sums in registers across the tile's keys;
 * a pair of keys' 16 + 16 values rounded by one instruction and
 * interleaved into 16 pairs by one permutation. */
CPU_AVX512_BF16 static void cpu_exp_pairs_bf16(const float *st, int bc, int br, int ld,
                                               const float *sub, float *sum, uint32_t *pairs,
                                               int ldp) {
  static const uint16_t order[32] = {0, 16, 1, 17, 2,  18, 3,  19, 4,  20, 5,  21, 6,  22, 7,  23,
                                     8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
  const __m512i ilv = _mm512_loadu_si512(order);
  for (int r0 = 0; r0 < br; r0 += 64) {
    __mmask16 k[4];
    __m512 s[4], acc[4];
    for (int q = 0; q < 4; q++) {
      const int left = br - r0 - 16 * q;
      k[q] = left >= 16 ? (__mmask16)0xffff : left > 0 ? (__mmask16)((1u << left) - 1u) : 0;
      s[q] = _mm512_maskz_loadu_ps(k[q], sub + r0 + 16 * q);
      acc[q] = _mm512_maskz_loadu_ps(k[q], sum + r0 + 16 * q);
    }
    for (int c = 0; c < bc; c += 2) {
      const float *x0 = st + (size_t)c * ld + r0, *x1 = x0 + ld;
      uint32_t *o = pairs + (size_t)(c / 2) * ldp + r0;
      for (int q = 0; q < 4; q++) {
        if (!k[q]) break;
        const __m512 p0 = cpu_exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(k[q], x0 + 16 * q), s[q]));
        __m512 p1 = _mm512_setzero_ps();
        acc[q] = _mm512_add_ps(acc[q], p0);
        if (c + 1 < bc) {
          p1 = cpu_exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(k[q], x1 + 16 * q), s[q]));
          acc[q] = _mm512_add_ps(acc[q], p1);
        }
        const __m512i w = _mm512_permutexvar_epi16(ilv, (__m512i)_mm512_cvtne2ps_pbh(p1, p0));
        _mm512_mask_storeu_epi32(o + 16 * q, k[q], w);
      }
    }
    for (int q = 0; q < 4; q++)
      _mm512_mask_storeu_ps(sum + r0 + 16 * q, k[q], acc[q]);
  }
}

static int cpu_exp_pairs_avx512(const float *st, int bc, int br, int ld, const float *sub,
                                float *sum, uint32_t *pairs, int ldp) {
  if (!__builtin_cpu_supports("avx512bw") || !__builtin_cpu_supports("avx512bf16")) return 0;
  cpu_exp_pairs_bf16(st, bc, br, ld, sub, sum, pairs, ldp);
  return 1;
}
#else
static int cpu_exp_pairs_avx512(const float *st, int bc, int br, int ld, const float *sub,
                                float *sum, uint32_t *pairs, int ldp) {
  (void)st, (void)bc, (void)br, (void)ld, (void)sub, (void)sum, (void)pairs, (void)ldp;
  return 0;
}
#endif

void attn__cpu_softmax_cols(float *st, int bc, int br, int ld, float *m, float *l, float *alpha,
                            uint32_t *pairs, int ldp) {
  /* Pairs come with bf16 instructions, hence AVX-512 and its clone. */
  const int width = pairs ? 0 : cpu_exp_width();
  if (width == 2)
    cpu_softmax_cols_512(st, bc, br, ld, m, l, alpha);
  else if (width == 1)
    cpu_softmax_cols_fma(st, bc, br, ld, m, l, alpha);
  else
    cpu_softmax_cols_clones(st, bc, br, ld, m, l, alpha, pairs, ldp);
}

static CPU_SIMD_CLONES void cpu_rescale_o_clones(float *ot, float *o, int d, int br, int ld,
                                                 const float *alpha) {
  if (ot) {
    for (int c = 0; c < d; c++) {
      float *x = ot + (size_t)c * ld;
      for (int r = 0; r < br; r++)
        x[r] *= alpha[r];
    }
    return;
  }
  for (int r = 0; r < br; r++) {
    if (alpha[r] == 1.0f) continue;
    float *x = o + (size_t)r * d;
    const float a = alpha[r];
    for (int c = 0; c < d; c++)
      x[c] *= a;
  }
}

void attn__cpu_rescale_o(float *ot, float *o, int d, int br, int ld, const float *alpha) {
  cpu_rescale_o_clones(ot, o, d, br, ld, alpha);
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
  const int width = cpu_exp_width();
  if (width == 2)
    cpu_exp_cols_512(st, rows, cols, ld, hi, lo);
  else if (width == 1)
    cpu_exp_cols_fma(st, rows, cols, ld, hi, lo);
  else
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
