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

/* Whether this pass compiles for sm_80 or later (the host pass counts as
 * one). Kernels that need more than the copies (mma.sync on f16/bf16) keep
 * their bodies to such passes; their rows of the plan say cc 80, so older
 * code never runs them. */
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
#define ATTN_CUDA_SM80 1
#else
#define ATTN_CUDA_SM80 0
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
