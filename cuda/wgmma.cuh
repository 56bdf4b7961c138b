/*
 * PTX wrappers of the Hopper kernels (hopper_fwd.cu, hopper_bwd.cu): the
 * warpgroup matrix multiply (wgmma, sm_90a only) with its shared-memory
 * matrix descriptors, the bulk tensor copy (TMA) with the mbarriers it
 * completes on and its reduction into global memory, the register
 * reallocation between warpgroups (setmaxnreg, sm_90a), and the proxy fence
 * that hands shared memory written by threads to the tensor cores; and, for
 * the host, the tensor maps the copies read. Only code compiled for sm_90a
 * may call the device ones (the kernels guard their body with
 * __CUDA_ARCH_FEAT_SM90_ALL); elsewhere they are never instantiated.
 *
 * wgmma.mma_async m64nNk16 with f32 accumulators, PTX ISA "Asynchronous
 * Warpgroup Level Matrix Multiply-Accumulate": a warpgroup (4 warps, the
 * first at a warp index divisible by 4) computes a 64 x N tile; warp w of
 * the group owns rows 16 w .. 16 w + 15 and, with g = lane / 4, t = lane % 4,
 * holds them as mma.m16n8k16 does, one n8 tile after the other:
 *   D (64xN, f32):  d[4 j + 0], d[4 j + 1] = (16 w + g,     8 j + 2t, +1)
 *                   d[4 j + 2], d[4 j + 3] = (16 w + g + 8, 8 j + 2t, +1)
 *   A (64x16, registers, 16-bit pairs):
 *                   a0 = (16 w + g, 2t..2t+1),  a1 = (16 w + g + 8, 2t..),
 *                   a2 = (16 w + g, 8+2t..),    a3 = (16 w + g + 8, 8+2t..)
 * so an accumulator's n8 tiles 2 kk and 2 kk + 1, packed to 16 bits, are the
 * A fragment of k-step kk of the next product (P in P V; the backward's P^T
 * in P^T dO, whose accumulator S^T has the keys as rows), as with mma.sync.
 *
 * Shared-memory operands use the 128-byte swizzle, which the bulk tensor
 * copy writes too (CU_TENSOR_MAP_SWIZZLE_128B, a box 64 elements wide): a
 * tile of 16-bit elements is stored as column blocks of 64 elements (128
 * bytes a row), each block rows x 128 bytes, with the 16-byte chunk c of row
 * r at chunk c ^ (r % 8). The swizzle is a function of the shared address
 * (bits 4-6 ^= bits 7-9), so every tile starts 1024-byte aligned (8 rows,
 * one swizzle atom).
 */
#ifndef ATTN_WGMMA_CUH
#define ATTN_WGMMA_CUH

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include <type_traits>

namespace attn_wgmma {

/* The byte offset of 16-byte chunk c (of 8 elements) of row r in a swizzled
 * tile of `rows` rows (see the top). */
__device__ __forceinline__ uint32_t swizzled(int rows, int r, int c) {
  return (uint32_t)((c >> 3) * rows * 128 + r * 128 + (((c & 7) ^ (r & 7)) << 4));
}

/*
 * Matrix descriptors (PTX ISA, "Matrix Descriptor Format"): bits 0-13 the
 * start address >> 4, 16-29 the leading dimension byte offset >> 4, 32-45
 * the stride dimension byte offset >> 4, 49-51 the base offset (0: every
 * tile is 1024-byte aligned), 62-63 the swizzle mode (1: 128 bytes).
 *
 * K-major (the reduction dimension contiguous: Q and K in Q K^T): the 8-row
 * groups are 1024 bytes apart (stride offset); the leading offset is unused
 * with a swizzle whose row (64 elements) holds the instruction's k16 and is
 * set to 1 by convention. k-step kk of a head dim starts (kk / 4) column
 * blocks and (kk % 4) * 32 bytes in.
 *
 * MN-major (the M or N dimension contiguous: V, [keys][d], as B of P V with
 * the transpose flag; the backward's dS^T, [keys][queries], as A of dQ = dS
 * K): the leading offset is the distance between column blocks of 64 M or N
 * elements (rows * 128 bytes), the stride offset the distance between groups
 * of 8 k rows (1024 bytes); k-step kk starts 16 kk rows (2048 kk bytes) in.
 */
constexpr uint64_t kSwizzle128 = (uint64_t)1 << 62;

__device__ __forceinline__ uint64_t desc_k_major(uint32_t addr) {
  return (uint64_t)((addr & 0x3FFFF) >> 4) | (uint64_t)1 << 16 | (uint64_t)(1024 >> 4) << 32 |
         kSwizzle128;
}

__device__ __forceinline__ uint64_t desc_mn_major(uint32_t addr, uint32_t block_bytes) {
  return (uint64_t)((addr & 0x3FFFF) >> 4) | (uint64_t)(block_bytes >> 4) << 16 |
         (uint64_t)(1024 >> 4) << 32 | kSwizzle128;
}

/* What k-step kk (16 elements of the reduction) adds to a descriptor: K-major
 * in a tile of `rows` rows (kk / 4 column blocks, then 32 bytes a step), and
 * MN-major (16 rows of 128 bytes a step). */
__host__ __device__ constexpr uint64_t kstep_k_major(int rows, int kk) {
  return (uint64_t)(((kk / 4) * rows * 128 + (kk % 4) * 32) >> 4);
}
__host__ __device__ constexpr uint64_t kstep_mn_major(int kk) {
  return (uint64_t)((kk * 16 * 128) >> 4);
}

/* wgmma.fence: registers written by ordinary instructions (accumulators,
 * A fragments) are then read by the wgmma that follow. */
__device__ __forceinline__ void fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

/* Pins registers in program order around the asynchronous instructions: the
 * compiler may not move their reads and writes across this point (CUTLASS's
 * warpgroup_fence_operand). */
template <int N>
__device__ __forceinline__ void pin(float (&r)[N][4]) {
#pragma unroll
  for (int i = 0; i < N; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      asm volatile("" : "+f"(r[i][e])::"memory");
}
template <int N>
__device__ __forceinline__ void pin(uint32_t (&r)[N][4]) {
#pragma unroll
  for (int i = 0; i < N; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      asm volatile("" : "+r"(r[i][e])::"memory");
}

/* Shared memory written by this thread's ordinary stores or cp.async is
 * next read by wgmma or the bulk copy engine (the async proxy): each writing
 * thread fences before the barrier that hands it over. */
__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

/* Stores a warpgroup's 64 x (16 KS) tile held as wgmma A fragments (the top:
 * k-step kk is columns 16 kk .. 16 kk + 15) into rows row0 .. row0 + 63 of
 * the swizzled tile at `tile` of `rows` rows, as 16-bit elements: one
 * stmatrix of four 8 x 8 matrices a k-step, a0 .. a3 in the order of the A
 * fragment, each lane giving one matrix row's address (lanes 8 m .. 8 m + 7
 * the rows of matrix m). The 128-byte swizzle puts a matrix's 8 rows in 8
 * different bank groups. The caller fences (fence_proxy_async) before the
 * barrier that hands the tile to wgmma. */
template <int KS>
__device__ __forceinline__ void stash(uint32_t tile, int rows, int row0,
                                      const uint32_t (&a)[KS][4]) {
  const int lane = threadIdx.x & 31, m = lane >> 3;
  const int r = row0 + ((threadIdx.x >> 5) & 3) * 16 + (lane & 7) + (m & 1) * 8;
#pragma unroll
  for (int kk = 0; kk < KS; ++kk)
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(
                     tile + swizzled(rows, r, 2 * kk + (m >> 1))),
                 "r"(a[kk][0]), "r"(a[kk][1]), "r"(a[kk][2]), "r"(a[kk][3])
                 : "memory");
}

/*
 * The instructions, N/2 accumulators each: operands %0 .. %(N/2 - 1), then
 * A (a descriptor, or four registers), the B descriptor and scale-d (0: D =
 * A B, 1: D += A B). ss: both operands K-major; ss_mn: both MN-major
 * (transposed); rs: B MN-major.
 */
#define ATTN_WG_10(x)                                                                              \
  "%" #x "0, %" #x "1, %" #x "2, %" #x "3, %" #x "4, %" #x "5, %" #x "6, %" #x "7, %" #x "8, %" #x \
  "9, "
#define ATTN_WG_ACC16 "{" ATTN_WG_10() "%10, %11, %12, %13, %14, %15}"
#define ATTN_WG_ACC32 "{" ATTN_WG_10() ATTN_WG_10(1) ATTN_WG_10(2) "%30, %31}"
#define ATTN_WG_ACC64                                                      \
  "{" ATTN_WG_10() ATTN_WG_10(1) ATTN_WG_10(2) ATTN_WG_10(3) ATTN_WG_10(4) \
      ATTN_WG_10(5) "%60, %61, %62, %63}"
#define ATTN_WG_ACC88                                                                    \
  "{" ATTN_WG_10() ATTN_WG_10(1) ATTN_WG_10(2) ATTN_WG_10(3) ATTN_WG_10(4) ATTN_WG_10(5) \
      ATTN_WG_10(6) ATTN_WG_10(7) "%80, %81, %82, %83, %84, %85, %86, %87}"
#define ATTN_WG_ACC104                                                                   \
  "{" ATTN_WG_10() ATTN_WG_10(1) ATTN_WG_10(2) ATTN_WG_10(3) ATTN_WG_10(4) ATTN_WG_10(5) \
      ATTN_WG_10(6) ATTN_WG_10(7) ATTN_WG_10(8) ATTN_WG_10(9) "%100, %101, %102, %103}"
#define ATTN_WG_ACC128                                                                   \
  "{" ATTN_WG_10() ATTN_WG_10(1) ATTN_WG_10(2) ATTN_WG_10(3) ATTN_WG_10(4) ATTN_WG_10(5) \
      ATTN_WG_10(6) ATTN_WG_10(7) ATTN_WG_10(8) ATTN_WG_10(9) ATTN_WG_10(10)             \
          ATTN_WG_10(11) "%120, %121, %122, %123, %124, %125, %126, %127}"

#define ATTN_WG_F4(i) "+f"(d[i][0]), "+f"(d[i][1]), "+f"(d[i][2]), "+f"(d[i][3])
#define ATTN_WG_F32(i)                                                                       \
  ATTN_WG_F4(i), ATTN_WG_F4(i + 1), ATTN_WG_F4(i + 2), ATTN_WG_F4(i + 3), ATTN_WG_F4(i + 4), \
      ATTN_WG_F4(i + 5), ATTN_WG_F4(i + 6), ATTN_WG_F4(i + 7)

#define ATTN_WG_SS(N, TY, ACC, A, B, S, TR)                                             \
  "{\n.reg .pred p;\nsetp.ne.b32 p, %" #S                                               \
  ", 0;\n"                                                                              \
  "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." TY "." TY " " ACC ", %" #A ", %" #B \
  ", p, 1, 1, " TR ", " TR ";\n}\n"
#define ATTN_WG_RS(N, TY, ACC, A0, A1, A2, A3, B, S)                                       \
  "{\n.reg .pred p;\nsetp.ne.b32 p, %" #S                                                  \
  ", 0;\n"                                                                                 \
  "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." TY "." TY " " ACC ", {%" #A0 ", %" #A1 \
  ", %" #A2 ", %" #A3 "}, %" #B ", p, 1, 1, 1;\n}\n"

/* The element type's name in the instruction: f16 or bf16. */
template <bool BF16>
struct mma;

#define ATTN_WG_DEFINE(BF16, TY)                                                            \
  template <>                                                                               \
  struct mma<BF16> {                                                                        \
    static __device__ __forceinline__ void ss(float (&d)[8][4], uint64_t a, uint64_t b,     \
                                              int scale_d) {                                \
      asm volatile(ATTN_WG_SS(64, TY, ATTN_WG_ACC32, 32, 33, 34, "0")                       \
                   : ATTN_WG_F32(0)                                                         \
                   : "l"(a), "l"(b), "r"(scale_d));                                         \
    }                                                                                       \
    static __device__ __forceinline__ void ss(float (&d)[16][4], uint64_t a, uint64_t b,    \
                                              int scale_d) {                                \
      asm volatile(ATTN_WG_SS(128, TY, ATTN_WG_ACC64, 64, 65, 66, "0")                      \
                   : ATTN_WG_F32(0), ATTN_WG_F32(8)                                         \
                   : "l"(a), "l"(b), "r"(scale_d));                                         \
    }                                                                                       \
    static __device__ __forceinline__ void ss(float (&d)[22][4], uint64_t a, uint64_t b,    \
                                              int scale_d) {                                \
      asm volatile(ATTN_WG_SS(176, TY, ATTN_WG_ACC88, 88, 89, 90, "0")                      \
                   : ATTN_WG_F32(0), ATTN_WG_F32(8), ATTN_WG_F4(16), ATTN_WG_F4(17),        \
                     ATTN_WG_F4(18), ATTN_WG_F4(19), ATTN_WG_F4(20), ATTN_WG_F4(21)         \
                   : "l"(a), "l"(b), "r"(scale_d));                                         \
    }                                                                                       \
    static __device__ __forceinline__ void ss(float (&d)[26][4], uint64_t a, uint64_t b,    \
                                              int scale_d) {                                \
      asm volatile(ATTN_WG_SS(208, TY, ATTN_WG_ACC104, 104, 105, 106, "0")                  \
                   : ATTN_WG_F32(0), ATTN_WG_F32(8), ATTN_WG_F32(16), ATTN_WG_F4(24),       \
                     ATTN_WG_F4(25)                                                         \
                   : "l"(a), "l"(b), "r"(scale_d));                                         \
    }                                                                                       \
    static __device__ __forceinline__ void ss_mn(float (&d)[8][4], uint64_t a, uint64_t b,  \
                                                 int scale_d) {                             \
      asm volatile(ATTN_WG_SS(64, TY, ATTN_WG_ACC32, 32, 33, 34, "1")                       \
                   : ATTN_WG_F32(0)                                                         \
                   : "l"(a), "l"(b), "r"(scale_d));                                         \
    }                                                                                       \
    static __device__ __forceinline__ void ss_mn(float (&d)[16][4], uint64_t a, uint64_t b, \
                                                 int scale_d) {                             \
      asm volatile(ATTN_WG_SS(128, TY, ATTN_WG_ACC64, 64, 65, 66, "1")                      \
                   : ATTN_WG_F32(0), ATTN_WG_F32(8)                                         \
                   : "l"(a), "l"(b), "r"(scale_d));                                         \
    }                                                                                       \
    static __device__ __forceinline__ void rs(float (&d)[8][4], const uint32_t (&a)[4],     \
                                              uint64_t b, int scale_d) {                    \
      asm volatile(ATTN_WG_RS(64, TY, ATTN_WG_ACC32, 32, 33, 34, 35, 36, 37)                \
                   : ATTN_WG_F32(0)                                                         \
                   : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(scale_d));     \
    }                                                                                       \
    static __device__ __forceinline__ void rs(float (&d)[16][4], const uint32_t (&a)[4],    \
                                              uint64_t b, int scale_d) {                    \
      asm volatile(ATTN_WG_RS(128, TY, ATTN_WG_ACC64, 64, 65, 66, 67, 68, 69)               \
                   : ATTN_WG_F32(0), ATTN_WG_F32(8)                                         \
                   : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(scale_d));     \
    }                                                                                       \
    static __device__ __forceinline__ void rs(float (&d)[32][4], const uint32_t (&a)[4],    \
                                              uint64_t b, int scale_d) {                    \
      asm volatile(ATTN_WG_RS(256, TY, ATTN_WG_ACC128, 128, 129, 130, 131, 132, 133)        \
                   : ATTN_WG_F32(0), ATTN_WG_F32(8), ATTN_WG_F32(16), ATTN_WG_F32(24)       \
                   : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(scale_d));     \
    }                                                                                       \
  };

ATTN_WG_DEFINE(false, "f16")
ATTN_WG_DEFINE(true, "bf16")

/* TF32 (f32 operands whose low 13 mantissa bits the caller has rounded
 * away): m64nNk8, 32 bytes of a row a k-step as for 16 bits, both operands
 * K-major (the instruction has no transpose for 32-bit elements). A from
 * registers is a0 = (16 w + g, t), a1 = (16 w + g + 8, t), a2 = (16 w + g,
 * t + 4), a3 = (16 w + g + 8, t + 4), as mma.sync's m16n8k8 (PTX ISA,
 * "Register Fragments and Shared Memory Matrix Layouts", .tf32). */
#define ATTN_WG_SS_TF32(N, ACC, A, B, S)                                           \
  "{\n.reg .pred p;\nsetp.ne.b32 p, %" #S                                          \
  ", 0;\n"                                                                         \
  "wgmma.mma_async.sync.aligned.m64n" #N "k8.f32.tf32.tf32 " ACC ", %" #A ", %" #B \
  ", p, 1, 1;\n}\n"
#define ATTN_WG_RS_TF32(N, ACC, A0, A1, A2, A3, B, S)                                           \
  "{\n.reg .pred p;\nsetp.ne.b32 p, %" #S                                                       \
  ", 0;\n"                                                                                      \
  "wgmma.mma_async.sync.aligned.m64n" #N "k8.f32.tf32.tf32 " ACC ", {%" #A0 ", %" #A1 ", %" #A2 \
  ", %" #A3 "}, %" #B ", p, 1, 1;\n}\n"

struct mma_tf32 {
  static __device__ __forceinline__ void ss(float (&d)[4][4], uint64_t a, uint64_t b, int scale_d) {
    asm volatile(ATTN_WG_SS_TF32(32, ATTN_WG_ACC16, 16, 17, 18)
                 : ATTN_WG_F4(0), ATTN_WG_F4(1), ATTN_WG_F4(2), ATTN_WG_F4(3)
                 : "l"(a), "l"(b), "r"(scale_d));
  }
  static __device__ __forceinline__ void ss(float (&d)[8][4], uint64_t a, uint64_t b, int scale_d) {
    asm volatile(ATTN_WG_SS_TF32(64, ATTN_WG_ACC32, 32, 33, 34)
                 : ATTN_WG_F32(0)
                 : "l"(a), "l"(b), "r"(scale_d));
  }
  static __device__ __forceinline__ void ss(float (&d)[16][4], uint64_t a, uint64_t b,
                                            int scale_d) {
    asm volatile(ATTN_WG_SS_TF32(128, ATTN_WG_ACC64, 64, 65, 66)
                 : ATTN_WG_F32(0), ATTN_WG_F32(8)
                 : "l"(a), "l"(b), "r"(scale_d));
  }
  static __device__ __forceinline__ void rs(float (&d)[8][4], const uint32_t (&a)[4], uint64_t b,
                                            int scale_d) {
    asm volatile(ATTN_WG_RS_TF32(64, ATTN_WG_ACC32, 32, 33, 34, 35, 36, 37)
                 : ATTN_WG_F32(0)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(scale_d));
  }
  static __device__ __forceinline__ void rs(float (&d)[16][4], const uint32_t (&a)[4], uint64_t b,
                                            int scale_d) {
    asm volatile(ATTN_WG_RS_TF32(128, ATTN_WG_ACC64, 64, 65, 66, 67, 68, 69)
                 : ATTN_WG_F32(0), ATTN_WG_F32(8)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(scale_d));
  }
  static __device__ __forceinline__ void rs(float (&d)[32][4], const uint32_t (&a)[4], uint64_t b,
                                            int scale_d) {
    asm volatile(ATTN_WG_RS_TF32(256, ATTN_WG_ACC128, 128, 129, 130, 131, 132, 133)
                 : ATTN_WG_F32(0), ATTN_WG_F32(8), ATTN_WG_F32(16), ATTN_WG_F32(24)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(scale_d));
  }
};

/* The instructions of an element type: f16, bf16, or f32 as TF32. */
template <typename T>
using mma_of = typename std::conditional<std::is_same<T, float>::value, mma_tf32,
                                         mma<std::is_same<T, __nv_bfloat16>::value>>::type;

#undef ATTN_WG_RS_TF32
#undef ATTN_WG_SS_TF32
#undef ATTN_WG_DEFINE
#undef ATTN_WG_RS
#undef ATTN_WG_SS
#undef ATTN_WG_F32
#undef ATTN_WG_F4
#undef ATTN_WG_ACC128
#undef ATTN_WG_ACC104
#undef ATTN_WG_ACC88
#undef ATTN_WG_ACC64
#undef ATTN_WG_ACC32
#undef ATTN_WG_ACC16
#undef ATTN_WG_10

/* ---------------------------------------------------------------------- */
/* mbarriers and the bulk tensor copy                                       */
/* ---------------------------------------------------------------------- */

/* An mbarrier (8 bytes of shared memory at bar) expecting `count` arrivals
 * a phase; its initialisation is made visible to the copy engine (the async
 * proxy) before the block's barrier that publishes it. */
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

/* One arrival that also announces `bytes` to be written by bulk copies
 * completing on bar in this phase. */
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}

/* Waits (acquire) until the phase of parity `parity` has completed: phases
 * count from 0, so a fresh barrier's phase 0 is waited for with parity 0,
 * and parity 1 passes at once (the phase before it). */
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  uint32_t done;
  do {
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.b32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (!done);
}

/* The box of a 4-d tensor map at coordinates (c0 innermost .. c3) into
 * shared memory at dst, completing `box bytes` on bar; elements outside the
 * tensor arrive as zeros. map is the generic address of a __grid_constant__
 * kernel parameter. */
__device__ __forceinline__ void tma_load_4d(uint32_t dst, const void *map, int c0, int c1, int c2,
                                            int c3, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, "
      "{%2, %3, %4, %5}], [%6];\n" ::"r"(dst),
      "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar)
      : "memory");
}

/* Adds (f32) the box at src in shared memory into a 4-d tensor map's
 * elements at coordinates (c0 innermost .. c3), in this thread's current
 * bulk group; the box's elements outside the tensor are dropped. The
 * threads that wrote src fence (fence_proxy_async) before the barrier that
 * hands it to this thread. */
__device__ __forceinline__ void tma_add_4d(const void *map, int c0, int c1, int c2, int c3,
                                           uint32_t src) {
  asm volatile(
      "cp.reduce.async.bulk.tensor.4d.global.shared::cta.add.tile.bulk_group [%0, {%1, %2, %3, "
      "%4}], [%5];\n" ::"l"(map),
      "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(src)
      : "memory");
}

/* This thread's bulk groups: commit closes the current one; wait_read
 * returns once every committed group has read its shared memory (which may
 * then be written again), wait once their writes are done. */
__device__ __forceinline__ void bulk_commit() {
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}
__device__ __forceinline__ void bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
}
__device__ __forceinline__ void bulk_wait() {
  asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
}

/* ---------------------------------------------------------------------- */
/* Warpgroup roles                                                          */
/* ---------------------------------------------------------------------- */

/* The registers a thread of this warpgroup may hold from here on: a
 * producer gives its share back, consumers take it. The kernel must start
 * with a register cap (__launch_bounds__ with a minimum of 1 block). */
template <int N>
__device__ __forceinline__ void regs_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N>
__device__ __forceinline__ void regs_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}

/* A barrier of `threads` threads (whole warps) on hardware barrier id (0 is
 * __syncthreads'): named_sync waits for all of them, named_arrive counts
 * this warp in without waiting. */
__device__ __forceinline__ void named_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

/* ---------------------------------------------------------------------- */
/* Tensor maps (host)                                                       */
/* ---------------------------------------------------------------------- */

/* cuTensorMapEncodeTiled from the driver (the library links the runtime
 * statically and never libcuda), looked up once; NULL where the driver has
 * none. */
inline PFN_cuTensorMapEncodeTiled_v12000 encode_tiled() {
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void *f = nullptr;
    cudaDriverEntryPointQueryResult q;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault,
                                         &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess) {
      (void)cudaGetLastError();
      f = nullptr;
    }
    return (PFN_cuTensorMapEncodeTiled_v12000)f;
  }();
  return fn;
}

/* A 4-d tensor map of `dim` elements of `type` at ptr, dimension 0
 * contiguous and `stride` the byte strides of dimensions 1-3, in boxes of
 * box0 x box1 elements (box0 of them 128 bytes), swizzled as wgmma reads
 * them; loads outside the tensor arrive as zeros and reductions there are
 * dropped. */
inline bool encode_box(CUtensorMap *m, CUtensorMapDataType type, void *ptr,
                       const cuuint64_t (&dim)[4], const cuuint64_t (&stride)[3], int box0,
                       int box1) {
  const PFN_cuTensorMapEncodeTiled_v12000 fn = encode_tiled();
  if (!fn) return false;
  /* The encoder's own limits, checked here: an operand outside them takes
   * the caller's other path, and the driver is never asked (a refused
   * encode is an API error to tools such as compute-sanitizer). */
  if ((uintptr_t)ptr % 16 != 0) return false;
  for (int i = 0; i < 4; i++)
    if (dim[i] == 0 || dim[i] > ((cuuint64_t)1 << 32)) return false;
  for (int i = 0; i < 3; i++)
    if (stride[i] % 16 != 0 || stride[i] >= ((cuuint64_t)1 << 40)) return false;
  const cuuint32_t box[4] = {(cuuint32_t)box0, (cuuint32_t)box1, 1, 1};
  const cuuint32_t elem_strides[4] = {1, 1, 1, 1};
  return fn(m, type, 4, ptr, dim, stride, box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
            CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

/* The tensor map of `rows` rows of `heads` heads of `seqs` sequences (varlen:
 * 1, its rows all of them) of d elements of T at ptr, strides ss, sh, sb in
 * elements, in boxes of 128 bytes x box_rows rows. A dimension of one has
 * no stride that matters; 16 bytes stand in for any. */
template <typename T>
inline bool encode_rows(CUtensorMap *m, void *ptr, int d, int64_t rows, int64_t heads, int64_t seqs,
                        int64_t ss, int64_t sh, int64_t sb, int box_rows) {
  constexpr int64_t e = (int64_t)sizeof(T);
  auto stride = [](int64_t n, int64_t s) { return (cuuint64_t)(n == 1 || s == 0 ? 16 : e * s); };
  const cuuint64_t dim[4] = {(cuuint64_t)d, (cuuint64_t)rows, (cuuint64_t)heads, (cuuint64_t)seqs};
  const cuuint64_t strides[3] = {stride(rows, ss), stride(heads, sh), stride(seqs, sb)};
  const CUtensorMapDataType type = std::is_same<T, float>::value ? CU_TENSOR_MAP_DATA_TYPE_FLOAT32
                                   : std::is_same<T, __nv_bfloat16>::value
                                       ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                       : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  return encode_box(m, type, ptr, dim, strides, (int)(128 / e), box_rows);
}

}  // namespace attn_wgmma

#endif /* ATTN_WGMMA_CUH */
