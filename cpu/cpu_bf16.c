/*
 * The forward's tiles for bf16 products (a config row's products other
 * than ATTN__CPU_PRODUCTS_F32; cpu.c says which a CPU gets): bf16 rows
 * gathered or used in place, the layouts the CPU's bf16 instruction reads
 * (cpu_bf16_avx512.c), P rounded to bf16 before P V, and the products
 * through that instruction or through OpenBLAS's sbgemm.
 *
 * What the rounding of P costs: P V then sums bf16 probabilities, as the
 * GPU kernels and PyTorch's bf16 attention do, which is what the golden
 * cases' bf16 peer figures measure; l_i, the row's sum, stays the f32 sum
 * of the unrounded P. Q K^T loses nothing: a product of two bf16 values is
 * exact in f32, so the scores differ from the f32 path's by the order of
 * their sums alone.
 */
#define _DEFAULT_SOURCE /* syscall */

#include "cpu_internal.h"

#include <cblas.h>
#include <limits.h>
#include <threads.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#endif
#if defined(ATTN_CPU_HAVE_AMX) && defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

static inline char *cpu_bf16_row(const attn__problem *pb, const attn__tensor *t, int keys,
                                 int64_t b, int64_t row, int64_t h) {
  const int64_t idx = (keys ? attn__key_row(pb, t, b, row) : b * t->sb + row * t->ss) + h * t->sh;
  return (char *)t->native + t->offset + (ptrdiff_t)idx * (ptrdiff_t)sizeof(uint16_t);
}

void attn__cpu_load_bf16(const attn__problem *pb, const attn__tensor *t, int keys, int64_t b,
                         int64_t row, int64_t nr, int64_t h, uint16_t *dst, int64_t ld) {
  const int64_t d = pb->head_dim, sd = t->sd;
  for (int64_t r = 0; r < nr; r++) {
    const uint16_t *x = (const uint16_t *)cpu_bf16_row(pb, t, keys, b, row + r, h);
    uint16_t *out = dst + r * ld;
    if (sd == 1)
      memcpy(out, x, (size_t)d * sizeof *out);
    else
      for (int64_t c = 0; c < d; c++)
        out[c] = x[c * sd];
  }
}

/* nr > 1 rows of t in place, pages aside: ss apart, ss keeping each row's
 * pairs 4-byte aligned as the pairs' loads read them (even), and rows that
 * do not alias (H d = 2048 in bshd: 4 KiB apart, a tenth of a one-thread
 * forward at d = 128 on AVX512_BF16, against 5 % copied per tile). */
static int cpu_bf16_in_place(const attn__problem *pb, const attn__tensor *t, int64_t nr) {
  return t->sd == 1 && t->ss >= pb->head_dim && t->ss <= INT_MAX && t->ss % 2 == 0 &&
         !attn__cpu_rows_alias(t->ss, 2, nr);
}

int attn__cpu_keys_copied_bf16(const attn__problem *pb, const attn__tensor *t, int64_t nr) {
  return nr > 1 && !cpu_bf16_in_place(pb, t, nr);
}

const uint16_t *attn__cpu_view_keys_bf16(const attn__problem *pb, const attn__tensor *t, int64_t b,
                                         int64_t j0, int64_t nr, int64_t h, uint16_t *scratch,
                                         int *ld) {
  const int64_t d = pb->head_dim, ps = pb->page_size;
  const int one_page = !ps || j0 / ps == (j0 + nr - 1) / ps;
  if (t->sd == 1 && one_page && (nr == 1 || cpu_bf16_in_place(pb, t, nr))) {
    *ld = nr == 1 ? (int)d : (int)t->ss;
    return (const uint16_t *)cpu_bf16_row(pb, t, 1, b, j0, h);
  }
  attn__cpu_load_bf16(pb, t, 1, b, j0, nr, h, scratch, d);
  *ld = (int)d;
  return scratch;
}

void attn__cpu_bf16_pairs_t(const uint16_t *q, int64_t ldq, int nr, int d, uint32_t *qp, int ldp) {
  for (int r = 0; r < nr; r++) {
    const uint16_t *x = q + (size_t)r * ldq;
    for (int p = 0; p < d / 2; p++)
      qp[(size_t)p * ldp + r] = (uint32_t)x[2 * p] | (uint32_t)x[2 * p + 1] << 16;
  }
}

static ATTN__CPU_SIMD_CLONES void cpu_bf16_round_clones(const float *pt, int rows, int cols, int ld,
                                                        uint16_t *out, int ldo) {
  for (int a = 0; a < rows; a++)
    for (int r = 0; r < cols; r++)
      out[(size_t)a * ldo + r] = (uint16_t)attn__cpu_bf16_bits(pt[(size_t)a * ld + r]);
}

void attn__cpu_bf16_round(const float *pt, int rows, int cols, int ld, uint16_t *out, int ldo) {
  cpu_bf16_round_clones(pt, rows, cols, ld, out, ldo);
}

void attn__cpu_bf16_transpose(const uint16_t *v, int64_t ldv, int rows, int d, uint16_t *vt,
                              int ldt) {
  for (int c = 0; c < d; c++) {
    uint16_t *o = vt + (size_t)c * ldt;
    for (int a = 0; a < rows; a++)
      o[a] = v[(size_t)a * ldv + c];
    for (int a = rows; a < ldt; a++)
      o[a] = 0;
  }
}

/* ---------------------------------------------------------------------- */
/* Which products this CPU has                                              */
/* ---------------------------------------------------------------------- */

#if defined(ATTN_CPU_HAVE_AVX512BF16)
void attn__cpu_bf16_gemm_avx512(int m, int n, int kp, float alpha, const uint16_t *a, int lda,
                                const uint32_t *b, int ldb, float beta, float *c, int ldc);
#endif
#if defined(ATTN_CPU_HAVE_AMX)
void attn__cpu_bf16_gemm_amx(int m, int n, int kp, float alpha, const uint16_t *a, int lda,
                             const uint32_t *b, int ldb, float beta, float *c, int ldc);
#endif

/* CPUID leaf 7 (subleaf 0) EDX bit 22 AMX-BF16, bit 24 AMX-TILE; XCR0 bits 17
 * and 18 the tile state the OS enables; and Linux's permission for this
 * process to use that state (arch_prctl ARCH_REQ_XCOMP_PERM for
 * XFEATURE_XTILEDATA, since Linux 5.16): without it the first tile
 * instruction faults. Asked once per process. */
static int cpu_amx_ready;
static once_flag cpu_amx_once = ONCE_FLAG_INIT;
static void cpu_amx_probe(void) {
#if defined(ATTN_CPU_HAVE_AMX) && defined(__linux__)
  unsigned a, b, c, d;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(d >> 22 & 1u) || !(d >> 24 & 1u)) return;
  if (!__get_cpuid(1, &a, &b, &c, &d) || !(c >> 27 & 1u)) return; /* OSXSAVE */
  unsigned lo, hi;
  __asm__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  if ((lo & 0x60000u) != 0x60000u) return;
  if (syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) != 0) return;
  cpu_amx_ready = 1;
#endif
}

attn__cpu_bf16_kernel *attn__cpu_bf16_kernel_native(void) {
#if defined(ATTN_CPU_HAVE_AVX512BF16)
  /* avx512f: the OS saves the AVX-512 state (the compiler's check reads
   * XCR0 too). AMX takes the tiles, and this kernel the rest. */
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bf16")) {
    call_once(&cpu_amx_once, cpu_amx_probe);
#if defined(ATTN_CPU_HAVE_AMX)
    if (cpu_amx_ready) return attn__cpu_bf16_gemm_amx;
#endif
    return attn__cpu_bf16_gemm_avx512;
  }
#endif
  return NULL;
}

int attn__cpu_amx(void) {
#if defined(ATTN_CPU_HAVE_AMX)
  return attn__cpu_bf16_kernel_native() == attn__cpu_bf16_gemm_amx;
#else
  return 0;
#endif
}

const char *attn__cpu_bf16_kernel_name(attn__cpu_bf16_kernel *k) {
#if defined(ATTN_CPU_HAVE_AMX)
  if (k == attn__cpu_bf16_gemm_amx) return "AMX";
#endif
#if defined(ATTN_CPU_HAVE_AVX512BF16)
  if (k == attn__cpu_bf16_gemm_avx512) return "vdpbf16ps";
#endif
  return k ? "a test's kernel" : "none";
}

int attn__cpu_bf16_hardware(void) {
#if defined(__x86_64__) && defined(__GNUC__)
  unsigned a, b, c, d;
  /* AMX-BF16: CPUID leaf 7, EDX bit 22. */
  const int amx = __get_cpuid_count(7, 0, &a, &b, &c, &d) && (d >> 22 & 1u);
  return amx || (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bf16"));
#else
  return 0;
#endif
}

int attn__cpu_sbgemm_built(void) {
#if defined(ATTN_HAVE_SBGEMM)
  return 1;
#else
  return 0;
#endif
}

#if defined(ATTN_HAVE_SBGEMM)
/* As attn__cpu_gemm (cpu_tile.c), the product cut into pieces OpenBLAS runs
 * on the calling thread (m*n*k at most 262144): the same threshold rules
 * its sbgemm and its sgemm. */
void attn__cpu_sbgemm(int ta, int tb, int m, int n, int k, float alpha, const uint16_t *a, int lda,
                      const uint16_t *b, int ldb, float beta, float *c, int ldc) {
  if (m <= 0 || n <= 0 || k <= 0) return;
  if ((int64_t)m * n * k <= 262144) {
    cblas_sbgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m,
                 n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  } else if (n >= k && n >= m) {
    int n1 = n / 2 / 16 * 16; /* pieces a multiple of 16 */
    if (n1 == 0) n1 = n / 2;
    attn__cpu_sbgemm(ta, tb, m, n1, k, alpha, a, lda, b, ldb, beta, c, ldc);
    attn__cpu_sbgemm(ta, tb, m, n - n1, k, alpha, a, lda, tb ? b + (size_t)n1 * ldb : b + n1, ldb,
                     beta, c + n1, ldc);
  } else if (k >= m) {
    int k1 = k / 2 / 16 * 16; /* pieces a multiple of 16 */
    if (k1 == 0) k1 = k / 2;
    attn__cpu_sbgemm(ta, tb, m, n, k1, alpha, a, lda, b, ldb, beta, c, ldc);
    attn__cpu_sbgemm(ta, tb, m, n, k - k1, alpha, ta ? a + (size_t)k1 * lda : a + k1, lda,
                     tb ? b + k1 : b + (size_t)k1 * ldb, ldb, 1.0f, c, ldc);
  } else {
    int m1 = m / 2 / 16 * 16; /* pieces a multiple of 16 */
    if (m1 == 0) m1 = m / 2;
    attn__cpu_sbgemm(ta, tb, m1, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    attn__cpu_sbgemm(ta, tb, m - m1, n, k, alpha, ta ? a + m1 : a + (size_t)m1 * lda, lda, b, ldb,
                     beta, c + (size_t)m1 * ldc, ldc);
  }
}
#endif
