/*
 * The CUDA backend's private interface between its host code (cuda/cuda.c or
 * cuda/host.cu) and its kernel families:
 *   - the general kernels (any head dim 1..256, every dtype, f32 in true
 *     fp32 on the CUDA cores), which cover every problem;
 *   - the tensor-core kernels (mma.sync + ldmatrix, f16/bf16), which cover
 *     the common head dims
 *     fast and decline the rest.
 * The host tries the tensor-core family first and falls back on
 * ATTN_EUNSUPPORTED.
 */
#ifndef ATTN_CUDA_H
#define ATTN_CUDA_H

#include "attn_internal.h"

#include <cuda_runtime.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Everything a kernel family needs for one call. All pointers are device
 * pointers except pb's host-side fields (cu_q, cu_k, alibi in pb are host
 * memory; the device copies are here). */
typedef struct attn__cuda_launch {
  const attn__problem *pb;
  cudaStream_t stream;
  const int32_t *cu_q; /* device copy of pb->cu_q, NULL for bshd */
  const int32_t *cu_k;
  const float *alibi; /* device copy of pb->alibi, NULL for none */
  void *workspace;    /* at least *_workspace() bytes, 256-byte aligned */
  size_t workspace_bytes;
  int sm_count;
  int cc_major, cc_minor;
  size_t smem_optin; /* cudaDevAttrMaxSharedMemoryPerBlockOptin */
} attn__cuda_launch;

/* Each family: how much scratch a call needs (0 is fine), and the launch,
 * which returns ATTN_OK, ATTN_EUNSUPPORTED when it does not cover the problem
 * (nothing launched, the host falls back), or ATTN_EDEVICE for a launch or
 * runtime error. Launchers do not synchronize. */
size_t attn__cuda_general_workspace(const attn__problem *pb, int backward);
int attn__cuda_general_forward(const attn__cuda_launch *L);
int attn__cuda_general_backward(const attn__cuda_launch *L);

size_t attn__cuda_mma_workspace(const attn__problem *pb, int backward);
int attn__cuda_mma_forward(const attn__cuda_launch *L);
int attn__cuda_mma_backward(const attn__cuda_launch *L);

#ifdef __cplusplus
}
#endif
#endif /* ATTN_CUDA_H */
