/*
 * Metadata that lives in a device buffer (attn_params' cu_seqlens_*_tensor):
 * nothing on the host has checked it, so before the kernels index with it,
 * a copy in the backend's scratch is made safe to index with. Offset b
 * becomes the largest of entries 0..b clamped into [0, rows]: the offsets
 * then never decrease and never leave the tensor, so every sequence lies
 * inside it (a malformed entry shortens sequences, it never moves a read or
 * a write outside). Well-formed offsets pass unchanged. A running maximum
 * is a scan: one block of warps, each taking a tile's entries, the warps'
 * maxima carried through shared memory.
 */
#include "attn_cuda.h"

namespace {

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads)
    clamp_offsets(const int32_t *__restrict__ in, int32_t *__restrict__ out, int n, int rows) {
  __shared__ int warp_max[kThreads / 32];
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  int carry = 0;
  for (int base = 0; base < n; base += kThreads) {
    const int i = base + (int)threadIdx.x;
    int x = i < n ? min(max(in[i], 0), rows) : 0;
    for (int o = 1; o < 32; o <<= 1) {
      const int y = __shfl_up_sync(0xffffffffu, x, o);
      if (lane >= o) x = max(x, y);
    }
    if (lane == 31) warp_max[w] = x;
    __syncthreads();
    int before = carry, all = carry;
    for (int j = 0; j < kThreads / 32; ++j) {
      if (j < w) before = max(before, warp_max[j]);
      all = max(all, warp_max[j]);
    }
    if (i < n) out[i] = max(x, before);
    carry = all;
    __syncthreads();
  }
}

}  // namespace

extern "C" int attn__cuda_clamp_offsets(const int32_t *in, int32_t *out, int64_t n, int64_t rows,
                                        cudaStream_t stream) {
  clamp_offsets<<<1, kThreads, 0, stream>>>(in, out, (int)n, (int)rows);
  return cudaGetLastError() == cudaSuccess ? ATTN_OK : ATTN_EDEVICE;
}
