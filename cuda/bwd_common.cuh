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

/* The row a warp of the per-row kernels (prep, dq_convert) takes, eight
 * warps a block: w over heads and rows (the workspace's order), and its
 * head, sequence and row there. 0 for a warp past the last row. */
struct warp_row {
  int64_t w, first;
  int h, b;
};

__device__ __forceinline__ bool warp_row_of(const params &p, warp_row *r) {
  r->w = (int64_t)blockIdx.x * 8 + (threadIdx.x >> 5);
  if (r->w >= p.rows * p.heads_q) return false;
  r->h = (int)(r->w / p.rows);
  split_row(p, r->w % p.rows, &r->b, &r->first);
  return true;
}

template <typename T, int D>
__global__ void __launch_bounds__(256) prep_kernel(const params p) {
  const int lane = threadIdx.x & 31;
  warp_row r;
  if (!warp_row_of(p, &r)) return;
  const int64_t w = r.w, first = r.first;
  const int h = r.h, b = r.b;
  const T *o = row_ptr<T>(p.o, b, first, h);
  const T *d = row_ptr<T>(p.dout, b, first, h);
  float acc = 0.f;
  for (int c = 2 * lane; c < D; c += 64) {
    float2 x = elem<T>::unpack(*(const uint32_t *)(o + c));
    float2 y = elem<T>::unpack(*(const uint32_t *)(d + c));
    acc += x.x * y.x + x.y * y.y;
  }
#pragma unroll
  for (int off = 16; off > 0; off >>= 1)
    acc += __shfl_xor_sync(0xffffffffu, acc, off);
  if (lane == 0) {
    /* hi alone of a (hi, lo) lse: P is rounded to 16 bits for the
     * products, far above what lo corrects (common.cuh). */
    const float lse = *row_ptr<float>(p.lse, b, first, h);
    p.dsum[w] = acc;
    p.lse2[w] = lse == -INFINITY ? INFINITY : lse * kLog2e;
  }
}

template <typename T, int D>
__global__ void __launch_bounds__(256) dq_convert_kernel(const params p) {
  const int lane = threadIdx.x & 31;
  warp_row r;
  if (!warp_row_of(p, &r)) return;
  T *dq = row_ptr<T>(p.dq, r.b, r.first, r.h);
  const float *acc = p.dq_acc + r.w * D;
  for (int c = 2 * lane; c < D; c += 64) {
    float2 x = *(const float2 *)(acc + c);
    *(uint32_t *)(dq + c) = elem<T>::pack(x.x * p.scale, x.y * p.scale);
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

/* The per-row kernels: a warp a row, eight a block. */
static inline unsigned bwd_row_blocks(const params &p) {
  return (unsigned)((p.rows * p.heads_q + 7) / 8);
}

/* Before the dK/dV pass: the dq accumulator zeroed (atomic mode), D and
 * lse2 filled. ATTN_OK or ATTN_EDEVICE. */
template <typename T, int D>
static int bwd_prep(const params &p, cudaStream_t stream) {
  if (p.dq_atomic && cudaMemsetAsync(p.dq_acc, 0, (size_t)(p.rows * p.heads_q) * D * sizeof(float),
                                     stream) != cudaSuccess)
    return ATTN_EDEVICE;
  prep_kernel<T, D><<<bwd_row_blocks(p), 256, 0, stream>>>(p);
  return cudaGetLastError() == cudaSuccess ? ATTN_OK : ATTN_EDEVICE;
}

/* After it, in atomic mode: dq = the accumulator times the softmax scale. */
template <typename T, int D>
static int bwd_dq_convert(const params &p, cudaStream_t stream) {
  dq_convert_kernel<T, D><<<bwd_row_blocks(p), 256, 0, stream>>>(p);
  return cudaGetLastError() == cudaSuccess ? ATTN_OK : ATTN_EDEVICE;
}

}  // namespace attn_mma

#endif /* ATTN_BWD_COMMON_CUH */
