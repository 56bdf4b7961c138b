/*
 * Stand-ins for the tensor-core family (cuda/mma_*.cu), declared weak so that
 * the real definitions win at link time once they are built: until then every
 * problem goes to the general kernels.
 */
#include "attn_cuda.h"

__attribute__((weak)) size_t attn__cuda_mma_workspace(const attn__problem *pb, int backward) {
  (void)pb;
  (void)backward;
  return 0;
}

__attribute__((weak)) int attn__cuda_mma_forward(const attn__cuda_launch *L) {
  (void)L;
  return ATTN_EUNSUPPORTED;
}

__attribute__((weak)) int attn__cuda_mma_backward(const attn__cuda_launch *L) {
  (void)L;
  return ATTN_EUNSUPPORTED;
}
