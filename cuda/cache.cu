/*
 * The KV cache's append and attn_merge on the device.
 *
 * Append (before the forward pass, on its stream): row r of k_new and v_new
 * of sequence b goes to key row seq_used(b) + r of k and v, through the block
 * table when paged (common.cuh's seq_used and paged_row, which clamp what
 * the device holds). Elements are copied as their bits, so any strides of
 * either side do; a warp takes a row, its lanes neighbouring columns.
 *
 * Merge (attn__merge): a block per row of o; merge_lse (common.cuh) gives
 * the row's lse and the parts' weights, and the block's threads sum their
 * columns of the parts. The parts' descriptors (up to ATTN_MAX_MERGE, too
 * many for a kernel's parameters) go to the device in the workspace.
 */
#include "attn_cuda.h"
#include "common.cuh"

#include <stdlib.h>
#include <string.h>

namespace attn_cache {

/* ---------------------------------------------------------------------- */
/* Append                                                                   */
/* ---------------------------------------------------------------------- */

struct append_params {
  attn__cuda_view k, v, kn, vn;
  const int32_t *cu_k; /* device; NULL for bshd and paged caches */
  const int32_t *used;
  long long used_sb;
  const int32_t *bt; /* NULL: not paged */
  long long bt_sb, bt_ss;
  long long page_size, num_pages;
  long long batch, nnew, hkv, seqlen_k;
  int d;
};

constexpr int kAppendRows = 4; /* warps a block, a row each */

/* E: the elements' bits (16 or 32). */
template <typename E>
__global__ void __launch_bounds__(32 * kAppendRows) append_kernel(const append_params A) {
  const long long rows = A.batch * A.nnew * A.hkv;
  for (long long row = (long long)blockIdx.x * kAppendRows + threadIdx.y; row < rows;
       row += (long long)gridDim.x * kAppendRows) {
    const long long h = row % A.hkv, br = row / A.hkv, r = br % A.nnew, b = br / A.nnew;
    const long long cap = A.cu_k ? (long long)A.cu_k[b + 1] - A.cu_k[b] : A.seqlen_k;
    const long long j = seq_used(A.used, A.used_sb, b, cap, A.nnew) + r;
    long long krow, vrow;
    if (A.bt) {
      krow = paged_row(A.bt, A.bt_sb, A.bt_ss, b, j, A.page_size, A.num_pages, A.k.sb, A.k.ss);
      vrow = paged_row(A.bt, A.bt_sb, A.bt_ss, b, j, A.page_size, A.num_pages, A.v.sb, A.v.ss);
    } else {
      const long long j0 = A.cu_k ? A.cu_k[b] : 0;
      krow = b * A.k.sb + (j0 + j) * A.k.ss;
      vrow = b * A.v.sb + (j0 + j) * A.v.ss;
    }
    E *kd = (E *)A.k.p + krow + h * A.k.sh;
    E *vd = (E *)A.v.p + vrow + h * A.v.sh;
    const E *ks = (const E *)A.kn.p + b * A.kn.sb + r * A.kn.ss + h * A.kn.sh;
    const E *vs = (const E *)A.vn.p + b * A.vn.sb + r * A.vn.ss + h * A.vn.sh;
    for (int c = threadIdx.x; c < A.d; c += 32) {
      kd[c * A.k.sd] = ks[c * A.kn.sd];
      vd[c * A.v.sd] = vs[c * A.vn.sd];
    }
  }
}

/* ---------------------------------------------------------------------- */
/* Merge                                                                    */
/* ---------------------------------------------------------------------- */

/* One part: its o and lse, strides in elements. */
struct part {
  const char *o;
  long long osb, oss, osh, osd;
  const float *lse;
  long long lsb, lss, lsh;
};

struct merge_params {
  const part *parts; /* device, n */
  int n, d, has_lse;
  long long batch, seqlen, heads;
  attn__cuda_view o, lse;
};

constexpr int kMergeThreads = 128;

template <typename T>
__global__ void __launch_bounds__(kMergeThreads) merge_kernel(const merge_params M) {
  __shared__ part sp[ATTN_MAX_MERGE];
  __shared__ float sl[ATTN_MAX_MERGE], sw[ATTN_MAX_MERGE];
  __shared__ float slse;
  for (int s = threadIdx.x; s < M.n; s += kMergeThreads)
    sp[s] = M.parts[s];
  const long long rows = M.batch * M.seqlen * M.heads;
  for (long long row = blockIdx.x; row < rows; row += gridDim.x) {
    const long long h = row % M.heads, bs = row / M.heads, i = bs % M.seqlen, b = bs / M.seqlen;
    __syncthreads(); /* the descriptors are in; the previous row is done with sl, sw */
    for (int s = threadIdx.x; s < M.n; s += kMergeThreads)
      sl[s] = sp[s].lse[b * sp[s].lsb + i * sp[s].lss + h * sp[s].lsh];
    __syncthreads();
    if (threadIdx.x == 0) slse = merge_lse(sl, 1, M.n, sw);
    __syncthreads();
    T *orow = (T *)M.o.p + b * M.o.sb + i * M.o.ss + h * M.o.sh;
    for (int c = threadIdx.x; c < M.d; c += kMergeThreads) {
      float acc = 0.f;
      for (int s = 0; s < M.n; ++s) {
        /* A part with weight 0 (lse -inf) adds nothing, whatever its o
         * holds; a NaN weight is not 0 and spreads. */
        if (sw[s] != 0.f) {
          const T *po = (const T *)sp[s].o + b * sp[s].osb + i * sp[s].oss + h * sp[s].osh;
          acc += sw[s] * to_float<T>(po[c * sp[s].osd]);
        }
      }
      orow[c * M.o.sd] = from_float<T>(acc);
    }
    if (threadIdx.x == 0 && M.has_lse)
      *((float *)M.lse.p + b * M.lse.sb + i * M.lse.ss + h * M.lse.sh) = slse;
  }
}

}  // namespace attn_cache

using namespace attn_cache;

extern "C" int attn__cuda_append(const attn__cuda_launch *L) {
  const attn__problem *pb = L->pb;
  append_params A;
  memset(&A, 0, sizeof A);
  A.k = attn__cuda_view_of(&pb->k);
  A.v = attn__cuda_view_of(&pb->v);
  A.kn = attn__cuda_view_of(&pb->k_new);
  A.vn = attn__cuda_view_of(&pb->v_new);
  A.cu_k = pb->page_size ? nullptr : L->cu_k;
  A.used = (const int32_t *)attn__cuda_at(&pb->seqused_k);
  A.used_sb = pb->seqused_k.sb;
  if (pb->page_size) {
    A.bt = (const int32_t *)attn__cuda_at(&pb->block_table);
    A.bt_sb = pb->block_table.sb;
    A.bt_ss = pb->block_table.ss;
    A.page_size = pb->page_size;
    A.num_pages = pb->num_pages;
  }
  A.batch = pb->batch;
  A.nnew = pb->seqlen_new;
  A.hkv = pb->heads_kv;
  A.seqlen_k = pb->seqlen_k;
  A.d = (int)pb->head_dim;
  const long long rows = A.batch * A.nnew * A.hkv;
  const long long want = (rows + kAppendRows - 1) / kAppendRows;
  const dim3 grid((unsigned)(want < (1 << 20) ? want : (1 << 20)));
  const dim3 block(32, kAppendRows);
  if (attn_dtype_size(pb->dtype) == 4)
    append_kernel<uint32_t><<<grid, block, 0, L->stream>>>(A);
  else
    append_kernel<uint16_t><<<grid, block, 0, L->stream>>>(A);
  return cudaGetLastError() == cudaSuccess ? ATTN_OK : ATTN_EDEVICE;
}

extern "C" size_t attn__cuda_merge_workspace(const attn__merge *m) {
  return sizeof(part) * (size_t)m->n;
}

extern "C" int attn__cuda_merge(const attn__merge *m, cudaStream_t stream, void *workspace) {
  part *host = (part *)malloc(sizeof(part) * (size_t)m->n);
  if (!host) return ATTN_ENOMEM;
  for (int s = 0; s < m->n; s++) {
    const attn__tensor &o = m->o_parts[s], &l = m->lse_parts[s];
    host[s].o = attn__cuda_at(&o);
    host[s].osb = o.sb;
    host[s].oss = o.ss;
    host[s].osh = o.sh;
    host[s].osd = o.sd;
    host[s].lse = (const float *)attn__cuda_at(&l);
    host[s].lsb = l.sb;
    host[s].lss = l.ss;
    host[s].lsh = l.sh;
  }
  /* From pageable memory the copy is staged before the call returns, so
   * host may go at once; it lands in stream order before the kernel. */
  cudaError_t e =
      cudaMemcpyAsync(workspace, host, sizeof(part) * (size_t)m->n, cudaMemcpyHostToDevice, stream);
  free(host);
  if (e != cudaSuccess) return ATTN_EDEVICE;
  merge_params M;
  memset(&M, 0, sizeof M);
  M.parts = (const part *)workspace;
  M.n = m->n;
  M.d = (int)m->head_dim;
  M.has_lse = m->has_lse;
  M.batch = m->batch;
  M.seqlen = m->seqlen;
  M.heads = m->heads;
  M.o = attn__cuda_view_of(&m->o);
  if (m->has_lse) M.lse = attn__cuda_view_of(&m->lse);
  const long long rows = m->batch * m->seqlen * m->heads;
  const dim3 grid((unsigned)(rows < (1 << 20) ? rows : (1 << 20)));
  switch (m->dtype) {
    case ATTN_F16:
      merge_kernel<__half><<<grid, kMergeThreads, 0, stream>>>(M);
      break;
    case ATTN_BF16:
      merge_kernel<__nv_bfloat16><<<grid, kMergeThreads, 0, stream>>>(M);
      break;
    default:
      merge_kernel<float><<<grid, kMergeThreads, 0, stream>>>(M);
      break;
  }
  return cudaGetLastError() == cudaSuccess ? ATTN_OK : ATTN_EDEVICE;
}
