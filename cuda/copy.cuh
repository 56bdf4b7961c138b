/*
 * The 16-byte global-to-shared copies that every kernel family stages its
 * tiles with. From sm_80 on they are cp.async: the copy runs behind the
 * thread's next instructions, and commit and wait groups order it. Before
 * sm_80 (a pre-Ampere device, or compute_75 PTX that the driver compiled
 * for a later one) they are a load and a store, complete when the thread
 * moves on, so commit and wait have nothing to do. Either way the block's
 * barrier after the wait makes a tile visible to the other threads.
 */
#ifndef ATTN_CUDA_COPY_CUH
#define ATTN_CUDA_COPY_CUH

#include <cuda_runtime.h>
#include <stdint.h>

/* Whether this pass compiles for sm_80 or later, or sm_75 (the host pass
 * counts as both). The tensor-core kernels keep their bodies to sm_75 and
 * later passes (ldmatrix and f16 mma.sync begin there); mma_common.cuh says
 * which element types each pass runs, and the rows' cc follow it. */
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
#define ATTN_CUDA_SM80 1
#else
#define ATTN_CUDA_SM80 0
#endif
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 750
#define ATTN_CUDA_SM75 1
#else
#define ATTN_CUDA_SM75 0
#endif

namespace attn_copy {

/* 16 bytes from src to dst in shared memory, bypassing L1; zeros when
 * !valid (src is then not read, but must still be a valid pointer). */
__device__ __forceinline__ void cp_async16(void *dst, const void *src, bool valid) {
#if ATTN_CUDA_SM80
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(
                   (uint32_t)__cvta_generic_to_shared(dst)),
               "l"(src), "r"(valid ? 16 : 0));
#else
  *(uint4 *)dst = valid ? *(const uint4 *)src : make_uint4(0u, 0u, 0u, 0u);
#endif
}

/* The first `bytes` (0 to 16) of the 16 at src into shared memory at
 * address dst, zeros after them; through L1 when L1 is true (rows that every
 * block reads at once), else bypassing it. src must be a valid pointer even
 * for 0 bytes. */
template <bool L1>
__device__ __forceinline__ void cp_async16_n(uint32_t dst, const void *src, int bytes) {
#if ATTN_CUDA_SM80
  if (L1)
    asm volatile("cp.async.ca.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
                 "r"(bytes));
  else
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
                 "r"(bytes));
#else
  uint4 v = make_uint4(0u, 0u, 0u, 0u);
  if (bytes >= 16) {
    v = *(const uint4 *)src;
  } else {
    unsigned char *b = (unsigned char *)&v;
    for (int i = 0; i < bytes; ++i)
      b[i] = ((const unsigned char *)src)[i];
  }
  asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(dst), "r"(v.x), "r"(v.y),
               "r"(v.z), "r"(v.w)
               : "memory");
#endif
}

/* cp_async16_n for a src aligned to its E-byte elements only (the chunks
 * of a bias whose rows are not whole 16-byte chunks): where src is not
 * 16-byte aligned, `bytes` (a multiple of E) by E-byte loads and a plain
 * 16-byte store, complete when the thread moves on. The barrier that
 * publishes the copies publishes the store, and the copy's slot is free
 * where a cp.async's is, so callers need no other change. */
template <bool L1, int E>
__device__ __forceinline__ void cp_async16_any(uint32_t dst, const void *src, int bytes) {
  static_assert(E == 2 || E == 4, "16-bit or 32-bit elements");
  if (((uintptr_t)src & 15u) == 0u) {
    cp_async16_n<L1>(dst, src, bytes);
    return;
  }
  uint32_t w[4] = {0u, 0u, 0u, 0u};
#pragma unroll
  for (int i = 0; i < 16 / E; ++i)
    if (i * E < bytes) {
      if constexpr (E == 2)
        w[i / 2] |= (uint32_t)((const unsigned short *)src)[i] << (16 * (i & 1));
      else
        w[i] = ((const uint32_t *)src)[i];
    }
  asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(dst), "r"(w[0]), "r"(w[1]),
               "r"(w[2]), "r"(w[3])
               : "memory");
}

__device__ __forceinline__ void cp_async_commit() {
#if ATTN_CUDA_SM80
  asm volatile("cp.async.commit_group;\n" ::);
#endif
}

/* Waits until at most N of the thread's committed groups are in flight. */
template <int N>
__device__ __forceinline__ void cp_async_wait() {
#if ATTN_CUDA_SM80
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}

__device__ __forceinline__ void cp_async_wait_all() {
#if ATTN_CUDA_SM80
  asm volatile("cp.async.wait_all;\n" ::: "memory");
#endif
}

}  // namespace attn_copy

#endif
