/*
 * What the tensor-core backward (mma_bwd.cu) and the Hopper backward
 * (hopper_bwd.cu) share: the workspace (attn__cuda_workspace's layout: D =
 * rowsum(dO * O), lse2 = lse * log2(e), then in atomic mode the fp32 dq
 * accumulator, each [heads_q][rows over the batch]), the pass that fills D
 * and lse2 before the dK/dV pass, and the one that turns the dq accumulator
 * into dq after it.
 */
#ifndef ATTN_BWD_COMMON_CUH
#define ATTN_BWD_COMMON_CUH

#include "mma_common.cuh"

#include <math.h>

namespace attn_mma {

/* Row index over the batch (the workspace's) -> (sequence, row within it) as
 * the tensors' strides see it: varlen tensors have sb = 0 and take the global
 * row directly. */
__device__ __forceinline__ void split_row(const params &p, int64_t grow, int *b, int64_t *first) {
  if (p.cu_q) {
    *b = 0;
    *first = grow;
  } else {
    *b = (int)(grow / p.seqlen_q);
    *first = grow % p.seqlen_q;
  }
}

/* A row of the per-row kernels (prep, dq_convert): w over heads and rows
 * (the workspace's order), and its head, sequence and row there. */
struct warp_row {
  int64_t w, first;
  int h, b;
};

__device__ __forceinline__ warp_row row_at(const params &p, int64_t w) {
  warp_row r;
  r.w = w;
  r.h = (int)(w / p.rows);
  split_row(p, w % p.rows, &r.b, &r.first);
  return r;
}

/* The per-row kernels: eight warps a block, a few blocks an SM, each warp
 * striding over groups of kWarpRows rows whose loads it issues together, so
 * that enough reads are in flight without a block a handful of rows (the
 * block launches then bounded the passes, about 2 TB/s). */
constexpr int kWarpRows = 4;

__device__ __forceinline__ int64_t first_row_group(void) {
  return ((int64_t)blockIdx.x * 8 + (threadIdx.x >> 5)) * kWarpRows;
}
__device__ __forceinline__ int64_t row_group_stride(void) {
  return (int64_t)gridDim.x * 8 * kWarpRows;
}

/* D = rowsum(dO * O) and lse2 for each row, and in atomic mode the row's dq
 * accumulator zeroed (in the same pass as the reads, rather than a memset
 * of its own before them). */
template <typename T, int D>
__global__ void __launch_bounds__(256) prep_kernel(const params p) {
  const int lane = threadIdx.x & 31;
  const int64_t n = p.rows * p.heads_q;
  for (int64_t w0 = first_row_group(); w0 < n; w0 += row_group_stride()) {
    float acc[kWarpRows];
#pragma unroll
    for (int u = 0; u < kWarpRows; ++u) {
      acc[u] = 0.f;
      if (w0 + u >= n) continue;
      const warp_row r = row_at(p, w0 + u);
      const T *o = row_ptr<T>(p.o, r.b, r.first, r.h);
      const T *d = row_ptr<T>(p.dout, r.b, r.first, r.h);
#pragma unroll
      for (int c = 2 * lane; c < D; c += 64) {
        float2 x = elem<T>::unpack(*(const uint32_t *)(o + c));
        float2 y = elem<T>::unpack(*(const uint32_t *)(d + c));
        acc[u] += x.x * y.x + x.y * y.y;
      }
      if (p.dq_atomic) {
#pragma unroll
        for (int c = 4 * lane; c < D; c += 128)
          *(float4 *)(p.dq_acc + (w0 + u) * D + c) = make_float4(0.f, 0.f, 0.f, 0.f);
      }
    }
#pragma unroll
    for (int u = 0; u < kWarpRows; ++u)
#pragma unroll
      for (int off = 16; off > 0; off >>= 1)
        acc[u] += __shfl_xor_sync(0xffffffffu, acc[u], off);
    /* Lane u writes row w0 + u. hi alone of a (hi, lo) lse: P is rounded
     * to 16 bits for the products, far above what lo corrects
     * (common.cuh). */
    float mine = acc[0];
#pragma unroll
    for (int u = 1; u < kWarpRows; ++u)
      if (lane == u) mine = acc[u];
    if (lane < kWarpRows && w0 + lane < n) {
      const warp_row r = row_at(p, w0 + lane);
      const float lse = *row_ptr<float>(p.lse, r.b, r.first, r.h);
      p.dsum[r.w] = mine;
      p.lse2[r.w] = lse == -INFINITY ? INFINITY : lse * kLog2e;
    }
  }
}

template <typename T, int D>
__global__ void __launch_bounds__(256) dq_convert_kernel(const params p) {
  const int lane = threadIdx.x & 31;
  const int64_t n = p.rows * p.heads_q;
  for (int64_t w0 = first_row_group(); w0 < n; w0 += row_group_stride()) {
    float2 x[kWarpRows][(D + 63) / 64];
#pragma unroll
    for (int u = 0; u < kWarpRows; ++u)
      if (w0 + u < n) {
        const float *acc = p.dq_acc + (w0 + u) * D;
#pragma unroll
        for (int c = 2 * lane, k = 0; c < D; c += 64, ++k)
          x[u][k] = *(const float2 *)(acc + c);
      }
#pragma unroll
    for (int u = 0; u < kWarpRows; ++u)
      if (w0 + u < n) {
        const warp_row r = row_at(p, w0 + u);
        T *dq = row_ptr<T>(p.dq, r.b, r.first, r.h);
#pragma unroll
        for (int c = 2 * lane, k = 0; c < D; c += 64, ++k)
          *(uint32_t *)(dq + c) = elem<T>::pack(x[u][k].x * p.scale, x[u][k].y * p.scale);
      }
  }
}

/* Workspace index of query row i of sequence b, head h. */
__device__ __forceinline__ int64_t ws_row(const params &p, const seq &sq, int b, int h, int i) {
  const int64_t grow = p.cu_q ? sq.q0 + i : (int64_t)b * p.seqlen_q + i;
  return (int64_t)h * p.rows + grow;
}

/* p's workspace pointers, attn__cuda_workspace's layout; dq through the
 * atomic accumulator unless the problem is deterministic. */
static inline void bwd_workspace(const attn__cuda_launch *L, params *p) {
  const size_t per = attn__cuda_ws_rows(L->pb);
  p->dsum = (float *)L->workspace;
  p->lse2 = (float *)((char *)L->workspace + per);
  p->dq_atomic = !L->pb->deterministic;
  p->dq_acc = p->dq_atomic ? (float *)((char *)L->workspace + 2 * per) : NULL;
}

/* The per-row kernels' grid: enough groups of rows for each warp to take
 * one, but no more blocks than fill the SMs (eight 256-thread blocks
 * each). */
static inline unsigned bwd_row_blocks(const params &p, int sm_count) {
  const int64_t groups = (p.rows * p.heads_q + kWarpRows - 1) / kWarpRows;
  const int64_t blocks = (groups + 7) / 8, cap = (int64_t)(sm_count > 0 ? sm_count : 1) * 8;
  return (unsigned)(blocks < cap ? blocks : cap);
}

/* Before the dK/dV pass: D and lse2 filled, and the dq accumulator zeroed
 * (atomic mode). ATTN_OK or ATTN_EDEVICE. */
template <typename T, int D>
static int bwd_prep(const params &p, int sm_count, cudaStream_t stream) {
  prep_kernel<T, D><<<bwd_row_blocks(p, sm_count), 256, 0, stream>>>(p);
  return cudaGetLastError() == cudaSuccess ? ATTN_OK : ATTN_EDEVICE;
}

/* After it, in atomic mode: dq = the accumulator times the softmax scale. */
template <typename T, int D>
static int bwd_dq_convert(const params &p, int sm_count, cudaStream_t stream) {
  dq_convert_kernel<T, D><<<bwd_row_blocks(p, sm_count), 256, 0, stream>>>(p);
  return cudaGetLastError() == cudaSuccess ? ATTN_OK : ATTN_EDEVICE;
}

}  // namespace attn_mma

#endif /* ATTN_BWD_COMMON_CUH */
