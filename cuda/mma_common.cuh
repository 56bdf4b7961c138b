/*
 * Shared pieces of the tensor-core kernels (mma_fwd.cu, mma_bwd.cu): the
 * parameter block the launchers fill, the PTX wrappers (cp.async, ldmatrix,
 * mma.sync m16n8k16 with fp32 accumulation) and the fragment helpers. The
 * masks and the score transform are common.cuh's, in the log2 domain.
 *
 * Fragment layout of mma.sync.m16n8k16 (PTX ISA, "Matrix fragments for
 * mma.m16n8k16"), with g = lane / 4 and t = lane % 4:
 *   A (16x16, row-major): a0 = (g, 2t..2t+1), a1 = (g+8, 2t..), a2 = (g, 8+2t..),
 *                         a3 = (g+8, 8+2t..)
 *   B (16x8, k-major):    b0 = (k 2t..2t+1, n g), b1 = (k 8+2t.., n g)
 *   C (16x8, fp32):       c0,c1 = (g, 2t..2t+1), c2,c3 = (g+8, 2t..2t+1)
 * A C fragment of two neighbouring n-tiles is therefore an A fragment of the
 * next product once packed to 16 bits (P in P V, dS in dS K), with no shuffles.
 *
 * f32 runs the forward through TF32 (mma.sync m16n8k8 .tf32, fp32
 * accumulation; "Matrix fragments for mma.m16n8k8", .tf32), operands rounded
 * to TF32 by cvt.rna:
 *   A (16x8, row-major):  a0 = (g, t), a1 = (g+8, t), a2 = (g, t+4), a3 = (g+8, t+4)
 *   B (8x8, k-major):     b0 = (k t, n g), b1 = (k t+4, n g)
 *   C (16x8, fp32):       as above
 * An ldmatrix 8x8 of b16 over 32-bit data is an 8x4 block of it, lane
 * (g, t) holding element (g, t): the same ldmatrix.x4 loads, at the same byte
 * offsets, give the A fragment of a row-major tile and the B fragments of a
 * tile stored [n][k], k-steps of 8 floats where 16-bit types take 16 (32
 * bytes either way). A C fragment is no A fragment here, but the sum over k
 * does not care for its order: columns 2t and 2t+1 of P go in as A's t and
 * t+4, and B reads the matching rows 2t and 2t+1 of V one float at a time.
 *
 * Shared-memory tiles are row-major with rows padded by 16 bytes (8 elements
 * of 16 bits, 4 floats), so the 8 rows an ldmatrix phase reads land in 8
 * distinct 16-byte bank groups for every head dim we specialise (a
 * power-of-two swizzle would not cover 96). For f32 rows of D + 4 floats
 * (D a multiple of 16) also put V's rows 2t, 2t + 1 (t = 0..3) 8 banks apart,
 * so the warp's scalar B loads of P V, columns g = 0..7, meet no conflict.
 */
#ifndef ATTN_MMA_COMMON_CUH
#define ATTN_MMA_COMMON_CUH

#include "attn_cuda.h"
#include "common.cuh"
#include "copy.cuh"
#include "order.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include <type_traits>

namespace attn_mma {

/* Row padding of the bias tiles and of the backward's tiles, in elements
 * (see the top). */
constexpr int kPad = 8;

/* Elements of T in 16 bytes: a cp.async, an ldmatrix row, and the row
 * padding of the forward's Q, K and V tiles (see the top). */
template <typename T>
constexpr int kChunk = 16 / (int)sizeof(T);

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

/* One operand in device memory: base already at (native + offset), strides in
 * elements, head-dim stride 1 (the plan, plan.c, gives them nothing else). */
struct tensor_ref {
  void *ptr;
  int64_t sb, ss, sh;
  int64_t sd; /* lse only: hi to lo of the (hi, lo) form, 0 for a plain lse */
};

/* Everything the kernels read, by value. Lengths are ints: the plan gives
 * the launchers no sequence of 2^30 rows or more. */
struct params {
  tensor_ref q, k, v, o, lse;
  tensor_ref dout, dq, dk, dv;
  const int32_t *cu_q; /* device, batch + 1; NULL for bshd */
  const int32_t *cu_k;
  const float *alibi;                  /* device, heads_q slopes; NULL for none */
  int batch, heads_q, heads_kv, group; /* group = heads_q / heads_kv */
  int seqlen_q, seqlen_k;              /* bshd lengths; varlen: the longest */
  int window_left, window_right;       /* -1 = unbounded, clamped by the host */
  float scale;                         /* softmax scale */
  float scale_log2;                    /* scale * log2(e): scores go to exp2 */
  float softcap;                       /* 0 = off */
  float softcap_inv;                   /* scale / softcap: tanh argument */
  float softcap_log2;                  /* softcap * log2(e) */
  int has_lse;
  int dq_atomic; /* backward: dq through fp32 atomics (else the dq kernel) */
  /* Backward workspace, [heads_q][total rows] (and x head_dim for dq_acc). */
  float *dq_acc;
  float *dsum;  /* D = rowsum(dO * O) */
  float *lse2;  /* lse * log2(e); +inf where lse = -inf (rows with no key) */
  int64_t rows; /* total query rows over the batch */
  int order;    /* block order, 0 = natural: the forward's attn_order_group G; the
                 * backward dK/dV pass's log2 of its kv heads a group (order.cuh) */
  /* The inference path's terms, read only by the kernels built with them;
   * NULL where the problem has none. The bias's key stride is 1 (plan.c),
   * dbias's any; a broadcast dimension has stride 0. */
  const void *bias;
  int64_t bias_sb, bias_sh, bias_ss;
  float *dbias;
  int64_t dbias_sb, dbias_sh, dbias_ss, dbias_sd;
  int dbias_atomic; /* dbias broadcasts: dkdv adds into it */
  const float *sinks;
  int64_t sinks_sh;
  float *dsinks;
  int64_t dsinks_sh;
  const int *seqused; /* int32, entry b at b * seqused_sb */
  int64_t seqused_sb;
  int seqlen_new;         /* rows appended per sequence (seqused only) */
  const int *block_table; /* paged k and v, NULL = not paged */
  int64_t bt_sb, bt_ss;
  int page_size, num_pages;
};

/* Fills p from a launch (mma_fwd.cu); the plan (plan.c) has checked that
 * the family covers the problem. */
void make_params(const attn__cuda_launch *L, int backward, params *p);

/* ---------------------------------------------------------------------- */
/* Element types                                                            */
/* ---------------------------------------------------------------------- */

/* The compute capability from which T's mma.sync exists: f16 from sm_75
 * (Turing's m16n8k8; a m16n8k16 is two of them), bf16 and TF32 from sm_80.
 * The families' rows take it as their cc, and a kernel's body checks it at
 * compile time (mma_here), so that each pass compiles the types it runs. */
template <typename T>
__host__ __device__ constexpr int mma_cc() {
  return std::is_same<T, __half>::value ? 75 : 80;
}

/* Whether this pass has T's mma.sync (the host pass counts as one). A kernel
 * of another type traps: the plan runs none there. */
template <typename T>
__host__ __device__ constexpr bool mma_here() {
#ifdef __CUDA_ARCH__
  return __CUDA_ARCH__ >= 10 * mma_cc<T>();
#else
  return true;
#endif
}

template <typename T>
struct elem;

template <>
struct elem<__half> {
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
    __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&h);
  }
  static __device__ __forceinline__ float2 unpack(uint32_t u) {
    __half2 h = *reinterpret_cast<__half2 *>(&u);
    return __half22float2(h);
  }
  static __device__ __forceinline__ void mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                             uint32_t b1) {
#if ATTN_CUDA_SM80
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
    /* k 0-7 are a[0], a[1] and b0; k 8-15 are a[2], a[3] and b1. */
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5}, {%6}, "
        "{%0,%1,%2,%3};\n"
        "mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%7,%8}, {%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(b0), "r"(a[2]), "r"(a[3]), "r"(b1));
#endif
  }
};

template <>
struct elem<__nv_bfloat16> {
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
    __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&h);
  }
  static __device__ __forceinline__ float2 unpack(uint32_t u) {
    __nv_bfloat162 h = *reinterpret_cast<__nv_bfloat162 *>(&u);
    /* What __bfloat1622float2 does, which CUDA 11's cuda_bf16.h defines
     * only for sm_80 and up (__low2float and __high2float everywhere). */
    return make_float2(__low2float(h), __high2float(h));
  }
  static __device__ __forceinline__ void mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                             uint32_t b1) {
#if ATTN_CUDA_SM80
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
    __trap(); /* mma_here<__nv_bfloat16>() is false */
#endif
  }
};

/* An accumulator as the next product's A operand (16-bit T): n8 tiles lo
 * and hi of the C layout (columns 16 kk .. 16 kk + 7 and + 8 .. + 15 of
 * a warp's 16 rows, mma.sync's or a wgmma warp's share) are k-step kk's A
 * fragment of a k16 product, packed to T. */
template <typename T>
__device__ __forceinline__ void a_frag(uint32_t (&a)[4], const float (&lo)[4],
                                       const float (&hi)[4]) {
  a[0] = elem<T>::pack(lo[0], lo[1]);
  a[1] = elem<T>::pack(lo[2], lo[3]);
  a[2] = elem<T>::pack(hi[0], hi[1]);
  a[3] = elem<T>::pack(hi[2], hi[3]);
}

/* f32 through TF32: the tensor cores' m16n8k8, operands rounded to TF32
 * (10-bit mantissa, ties away from zero) by tf32(). */
template <>
struct elem<float> {
  static __device__ __forceinline__ uint32_t tf32(float x) {
    uint32_t r;
#if ATTN_CUDA_SM80
    asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x));
#else
    r = __float_as_uint(x);
    __trap(); /* mma_here<float>() is false */
#endif
    return r;
  }
  static __device__ __forceinline__ void mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                             uint32_t b1) {
#if ATTN_CUDA_SM80
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
    __trap(); /* mma_here<float>() is false */
#endif
  }
};

/* ---------------------------------------------------------------------- */
/* PTX wrappers                                                             */
/* ---------------------------------------------------------------------- */

__device__ __forceinline__ uint32_t smem_addr(const void *p) {
  return (uint32_t)__cvta_generic_to_shared(p);
}

using attn_copy::cp_async16;
using attn_copy::cp_async_commit;
using attn_copy::cp_async_wait;
using attn_copy::cp_async_wait_all;

__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const void *p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t (&r)[4], const void *p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}

/* The same on 32-bit shared addresses: a kernel forms one per-lane base per
 * operand and adds compile-time tile offsets, which ptxas folds into the
 * instruction (generic 64-bit pointers per fragment cost registers). */
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], uint32_t a) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t (&r)[4], uint32_t a) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
}

/* 2, 4 and 8 bytes of shared memory at a 32-bit shared address (bias
 * elements: one, or a pair). */
__device__ __forceinline__ uint32_t lds16(uint32_t a) {
  unsigned short v;
  asm volatile("ld.shared.u16 %0, [%1];\n" : "=h"(v) : "r"(a));
  return v;
}
__device__ __forceinline__ uint32_t lds32(uint32_t a) {
  uint32_t v;
  asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(v) : "r"(a));
  return v;
}
__device__ __forceinline__ float2 lds64(uint32_t a) {
  float2 v;
  asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];\n" : "=f"(v.x), "=f"(v.y) : "r"(a));
  return v;
}

/* Per-lane element offsets of the fragment loads below, for a tile of row
 * stride LD whose 16 bytes hold E elements: A from [m][k] (non-transposed),
 * B from [n][k] (non-transposed), B from [k][n] (transposed). Add (row * LD
 * + col) of the fragment's corner. */
template <int LD, int E = 8>
__device__ __forceinline__ int lane_a(int lane) {
  return (lane & 15) * LD + (lane >> 4) * E;
}
template <int LD, int E = 8>
__device__ __forceinline__ int lane_b_nk(int lane) {
  return ((lane & 7) + (lane >> 4) * 8) * LD + ((lane >> 3) & 1) * E;
}
template <int LD>
__device__ __forceinline__ int lane_b_kn(int lane) {
  return ((lane & 7) + ((lane >> 3) & 1) * 8) * LD + (lane >> 4) * 8;
}

/* ---------------------------------------------------------------------- */
/* Fragment loads from padded row-major tiles (row stride LD elements)      */
/* ---------------------------------------------------------------------- */

/* A fragment (16x16) of a tile stored [m][k]: rows m0.., cols k0.. */
template <int LD, typename T>
__device__ __forceinline__ void load_a(uint32_t (&a)[4], const T *s, int m0, int k0, int lane) {
  ldsm_x4(a, s + (m0 + (lane & 15)) * LD + k0 + (lane >> 4) * 8);
}

/* A fragment (16x16) of a tile stored transposed, [k][m]. */
template <int LD, typename T>
__device__ __forceinline__ void load_a_t(uint32_t (&a)[4], const T *s, int m0, int k0, int lane) {
  int mi = lane >> 3;
  ldsm_x4_t(a, s + (k0 + (lane & 7) + (mi >> 1) * 8) * LD + m0 + (mi & 1) * 8);
}

/* B fragments of two n-tiles (n0..n0+7, n0+8..n0+15) for k0..k0+15 from a
 * tile stored [n][k] (K in Q K^T): b[0], b[1] for the first, b[2], b[3] for
 * the second. */
template <int LD, typename T>
__device__ __forceinline__ void load_b_nk(uint32_t (&b)[4], const T *s, int n0, int k0, int lane) {
  int mi = lane >> 3;
  ldsm_x4(b, s + (n0 + (lane & 7) + (mi >> 1) * 8) * LD + k0 + (mi & 1) * 8);
}

/* The same from a tile stored [k][n] (V in P V). */
template <int LD, typename T>
__device__ __forceinline__ void load_b_kn(uint32_t (&b)[4], const T *s, int n0, int k0, int lane) {
  int mi = lane >> 3;
  ldsm_x4_t(b, s + (k0 + (lane & 7) + (mi & 1) * 8) * LD + n0 + (mi >> 1) * 8);
}

/* ---------------------------------------------------------------------- */
/* Tiles                                                                    */
/* ---------------------------------------------------------------------- */

/* ROWS x D elements from global rows row0.. (row stride ss) into a shared
 * tile of rows padded by 16 bytes; rows at or past nrows are zero-filled.
 * Chunk c (16 bytes, row-major) is thread c % NT's, as in load_rows and
 * tf32_tile. */
template <int ROWS, int D, int NT, typename T>
__device__ __forceinline__ void load_tile(T *s, const T *g, int64_t ss, int row0, int nrows,
                                          int tid) {
  constexpr int E = kChunk<T>, LD = D + E;
  constexpr int kChunks = D / E;
  constexpr int kStep = NT / kChunks;
  if constexpr (NT % kChunks == 0 && ROWS % kStep == 0) {
    /* Each thread keeps one column of 16-byte chunks and walks rows kStep
     * apart: one base address per thread, whole rows per step. */
    const int r0 = tid / kChunks, col = (tid % kChunks) * E;
    const T *src = g + (int64_t)(row0 + r0) * ss + col;
    T *dst = s + r0 * LD + col;
#pragma unroll
    for (int k = 0; k < ROWS / kStep; ++k) {
      const bool ok = row0 + r0 + k * kStep < nrows;
      cp_async16(dst + k * kStep * LD, ok ? src + (int64_t)k * kStep * ss : g, ok);
    }
  } else { /* d = 96: 12 chunks a row (24 of f32) do not divide the threads */
#pragma unroll
    for (int c = tid; c < ROWS * kChunks; c += NT) {
      const int r = c / kChunks, col = (c % kChunks) * E;
      const bool ok = row0 + r < nrows;
      cp_async16(s + r * LD + col, ok ? g + (int64_t)(row0 + r) * ss + col : g, ok);
    }
  }
}

/* The same for rows anywhere (a paged cache): row r starts at row_at(r);
 * `any` is a valid address for the rows that are zero-filled. */
template <int ROWS, int D, int NT, typename T, typename RowAt>
__device__ __forceinline__ void load_rows(T *s, RowAt row_at, const T *any, int row0, int nrows,
                                          int tid) {
  constexpr int E = kChunk<T>, LD = D + E;
  constexpr int kChunks = D / E;
#pragma unroll
  for (int c = tid; c < ROWS * kChunks; c += NT) {
    const int r = c / kChunks, col = (c % kChunks) * E;
    const bool ok = row0 + r < nrows;
    cp_async16(s + r * LD + col, ok ? row_at(row0 + r) + col : any, ok);
  }
}

/* A float tile of load_tile or load_rows rounded to TF32 in place, once for
 * every warp that reads it: each thread rounds the chunks its own cp.async
 * wrote, which cp_async_wait has made visible to it (a barrier then shows
 * them to the others). */
template <int ROWS, int D, int NT>
__device__ __forceinline__ void tf32_tile(float *s, int tid) {
  constexpr int E = kChunk<float>, LD = D + E;
  constexpr int kChunks = D / E;
#pragma unroll 2
  for (int c = tid; c < ROWS * kChunks; c += NT) {
    float4 *p = reinterpret_cast<float4 *>(s + (c / kChunks) * LD + (c % kChunks) * E);
    float4 v = *p;
    v.x = __uint_as_float(elem<float>::tf32(v.x));
    v.y = __uint_as_float(elem<float>::tf32(v.y));
    v.z = __uint_as_float(elem<float>::tf32(v.z));
    v.w = __uint_as_float(elem<float>::tf32(v.w));
    *p = v;
  }
}

/* ROWS x BC elements of a bias (rows ss apart, keys contiguous) from row
 * row0, key col0 into the tile at shared address s, of row stride BC + kPad:
 * rows at or past nrows and keys at or past ncols are zeros, and the chunk
 * that straddles ncols is read only up to it (past it may lie outside the
 * tensor). Each thread keeps one column of 16-byte chunks, as load_tile;
 * rows of any length (chunks not 16-byte aligned) by cp_async16_any.
 * Rows that broadcast (ss = 0) are one row for every block of the grid at
 * once: read through L1, so that one L2 slice does not serve them all. */
template <int ROWS, int BC, int NT, typename BT>
__device__ __forceinline__ void load_bias_tile(uint32_t s, const BT *g, int64_t ss, int row0,
                                               int nrows, int col0, int ncols, int tid) {
  constexpr int kE = 16 / (int)sizeof(BT), kChunks = BC / kE, kStep = NT / kChunks;
  static_assert(BC % kE == 0 && NT % kChunks == 0 && ROWS % kStep == 0, "whole chunks a thread");
  const int r0 = tid / kChunks, k = (tid % kChunks) * kE;
  const int left = ncols - (col0 + k);
  const int bytes = left <= 0 ? 0 : left >= kE ? 16 : left * (int)sizeof(BT);
  const BT *src = g + (int64_t)(row0 + r0) * ss + col0 + k;
  const uint32_t dst = s + (uint32_t)(r0 * (BC + kPad) + k) * sizeof(BT);
  if (ss == 0) {
#pragma unroll
    for (int i = 0; i < ROWS / kStep; ++i) {
      const bool ok = bytes > 0 && row0 + r0 + i * kStep < nrows;
      attn_copy::cp_async16_any<true, sizeof(BT)>(
          dst + (uint32_t)(i * kStep * (BC + kPad) * sizeof(BT)), ok ? src : g, ok ? bytes : 0);
    }
    return;
  }
#pragma unroll
  for (int i = 0; i < ROWS / kStep; ++i) {
    const bool ok = bytes > 0 && row0 + r0 + i * kStep < nrows;
    attn_copy::cp_async16_any<false, sizeof(BT)>(
        dst + (uint32_t)(i * kStep * (BC + kPad) * sizeof(BT)),
        ok ? src + (int64_t)i * kStep * ss : g, ok ? bytes : 0);
  }
}

/* ---------------------------------------------------------------------- */
/* Sequences and masks                                                      */
/* ---------------------------------------------------------------------- */

struct seq {
  int nq, nk;     /* lengths of this sequence */
  int64_t q0, k0; /* first row (varlen) or 0 */
};

__device__ __forceinline__ seq seq_of(const params &p, int b) {
  seq s;
  if (p.cu_q) {
    s.q0 = p.cu_q[b];
    s.nq = (int)(p.cu_q[b + 1] - s.q0);
  } else {
    s.q0 = 0;
    s.nq = p.seqlen_q;
  }
  if (p.cu_k) {
    s.k0 = p.cu_k[b];
    s.nk = (int)(p.cu_k[b + 1] - s.k0);
  } else {
    s.k0 = 0;
    s.nk = p.seqlen_k;
  }
  return s;
}

/* The same for the kernels built for the inference path: a paged cache has
 * no cu_seqlens_k (its keys start at row 0 of the sequence's pages), and
 * with seqused_k a sequence attends to its used rows plus the appended ones
 * (common.cuh's seq_used clamps what the device holds). */
__device__ __forceinline__ seq seq_of_cache(const params &p, int b) {
  seq s = seq_of(p, b);
  if (p.seqused) s.nk = seq_used(p.seqused, p.seqused_sb, b, s.nk, p.seqlen_new) + p.seqlen_new;
  return s;
}

/* Element pointer of row r (of the sequence), head h. */
template <typename T>
__device__ __forceinline__ T *row_ptr(const tensor_ref &t, int b, int64_t first, int h) {
  return (T *)t.ptr + (int64_t)b * t.sb + first * t.ss + (int64_t)h * t.sh;
}

/* Whether query row i sees key j, which may lie past the keys (a zero-filled
 * row of a partial tile). */
__device__ __forceinline__ bool sees(const params &p, int i, int j, int nq, int nk) {
  const int dg = diag(i, nq, nk);
  return j < nk && j >= key_lo(dg, p.window_left) && j < key_hi(dg, nk, p.window_right);
}

}  // namespace attn_mma

#endif /* ATTN_MMA_COMMON_CUH */
