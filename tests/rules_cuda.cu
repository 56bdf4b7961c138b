/*
 * The cross-language rules test's CUDA evaluator (tests/rules_table.h): a
 * kernel runs cuda/common.cuh's rule functions, the ones every CUDA kernel
 * family uses, on each row of the table.
 */
#include "common.cuh"

#include <cuda_runtime.h>
#include <stdio.h>

extern "C" {
#include "rules_table.h"
}

static __global__ void rules_kernel(const rules_in *in, int n, rules_out *out) {
  const int r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= n) return;
  const rules_in x = in[r];
  rules_out y;
  const int32_t dg = diag(x.i, x.nq, x.nk);
  y.diag = dg;
  key_range(dg, x.nk, x.wl, x.wr, &y.key_lo, &y.key_hi);
  query_range(x.j, x.nq, x.nk, x.wl, x.wr, &y.query_lo, &y.query_hi);
  key_block_range(x.i0, x.i1, x.nq, x.nk, x.wl, x.wr, &y.kblock_lo, &y.kblock_hi);
  query_block_range(x.j0, x.j1, x.nq, x.nk, x.wl, x.wr, &y.qblock_lo, &y.qblock_hi);
  y.visible = key_visible(dg, x.j, x.wl, x.wr);
  y.unmasked = block_unmasked(x.i0, x.i1 - 1, x.j0, x.j2, x.nq, x.nk, x.wl, x.wr);
  const float inv_softcap = x.softcap > 0.f ? 1.f / x.softcap : 0.f;
  y.score = score(x.dot, x.scale, x.softcap, inv_softcap, x.slope, dg - x.j, &y.t);
  /* The tensor-core kernels' constants (mma_fwd.cu's make_params). */
  const float log2e = 1.4426950408889634f;
  float t2;
  y.score_log2 =
      score_log2(x.dot, x.scale * log2e, x.softcap > 0.f, x.softcap * log2e,
                 x.softcap > 0.f ? x.scale / x.softcap : 0.f, x.slope * log2e, dg - x.j, &t2);
  y.grad = score_grad(x.ds, y.t);
  out[r] = y;
}

static int fail(cudaError_t e, const char *what, char *why, size_t why_len) {
  (void)cudaGetLastError();
  snprintf(why, why_len, "CUDA: %s failed: %s", what, cudaGetErrorString(e));
  return -1;
}

extern "C" int rules_eval_cuda(const rules_in *in, int n, rules_out *out, char *why,
                               size_t why_len) {
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    snprintf(why, why_len, "no usable CUDA device: %s", cudaGetErrorString(e));
    return -1;
  }
  if (count == 0) {
    snprintf(why, why_len, "no CUDA device");
    return -1;
  }
  if (n <= 0) return 0;
  rules_in *din = NULL;
  rules_out *dout = NULL;
  int rc = 0;
  if ((e = cudaMalloc(&din, sizeof *in * (size_t)n)) != cudaSuccess ||
      (e = cudaMalloc(&dout, sizeof *out * (size_t)n)) != cudaSuccess) {
    rc = fail(e, "cudaMalloc", why, why_len);
  } else if ((e = cudaMemcpy(din, in, sizeof *in * (size_t)n, cudaMemcpyHostToDevice)) !=
             cudaSuccess) {
    rc = fail(e, "copying the table to the device", why, why_len);
  } else {
    rules_kernel<<<(n + 127) / 128, 128>>>(din, n, dout);
    if ((e = cudaGetLastError()) != cudaSuccess)
      rc = fail(e, "launching the rules kernel", why, why_len);
    else if ((e = cudaMemcpy(out, dout, sizeof *out * (size_t)n, cudaMemcpyDeviceToHost)) !=
             cudaSuccess)
      rc = fail(e, "running the rules kernel", why, why_len);
  }
  cudaFree(din);
  cudaFree(dout);
  return rc;
}
