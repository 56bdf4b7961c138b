/*
 * Which of the build's code a device runs. The fat binary holds machine code
 * and PTX for CMake's architectures (archs.c); the driver loads the best one
 * for the device, compiling PTX on the spot where no machine code fits. The
 * kernels can use only what that image was compiled for: an H200 running
 * compute_75 PTX has no mma.sync on bf16 and no cp.async, and sm_90 machine
 * code has no wgmma (that is sm_90a's). Every image holds its own value of
 * code_arch, so reading it back tells which one the device loaded.
 */
#include "attn_cuda.h"

#if defined(__CUDA_ARCH__)
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define ATTN_CODE_SPECIFIC 1
#else
#define ATTN_CODE_SPECIFIC 0
#endif
static __device__ int code_arch[2] = {__CUDA_ARCH__ / 10, ATTN_CODE_SPECIFIC};
#else
static __device__ int code_arch[2] = {0, 0};
#endif

extern "C" cudaError_t attn__cuda_code_arch(attn__cuda_device *dev) {
  int v[2] = {0, 0};
  const cudaError_t e = cudaMemcpyFromSymbol(v, code_arch, sizeof v);
  if (e == cudaSuccess) {
    dev->arch = v[0];
    dev->arch_specific = v[1];
  }
  return e;
}
