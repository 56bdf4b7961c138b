/*
 * attn_selftest() on CUDA: C = A + B on the device, checked on the host,
 * before any attention kernel runs. It proves the driver, the context, the
 * copies and a launch work, nothing more.
 */
#include "attn_cuda.h"

#include <stdlib.h>

static __global__ void add_kernel(const float *a, const float *b, float *c, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) c[i] = a[i] + b[i];
}

/* Returns the first CUDA error, or cudaSuccess with *bad the first wrong
 * index (-1 when every element is right). */
extern "C" cudaError_t attn__cuda_selftest_run(cudaStream_t stream, int *bad) {
  const int n = 4099; /* not a multiple of the block: the tail is checked too */
  float *h = (float *)malloc(sizeof(float) * 3 * (size_t)n);
  float *d = NULL;
  cudaError_t e = cudaSuccess;
  *bad = -1;
  if (!h) return cudaErrorMemoryAllocation;
  for (int i = 0; i < n; i++) {
    h[i] = (float)i * 0.5f;
    h[n + i] = (float)(n - i);
    h[2 * n + i] = -1.f;
  }
  e = cudaMalloc((void **)&d, sizeof(float) * 3 * (size_t)n);
  if (e != cudaSuccess) goto done;
  e = cudaMemcpyAsync(d, h, sizeof(float) * 3 * (size_t)n, cudaMemcpyHostToDevice, stream);
  if (e != cudaSuccess) goto done;
  add_kernel<<<(n + 255) / 256, 256, 0, stream>>>(d, d + n, d + 2 * n, n);
  e = cudaGetLastError();
  if (e != cudaSuccess) goto done;
  e = cudaMemcpyAsync(h + 2 * n, d + 2 * n, sizeof(float) * (size_t)n, cudaMemcpyDeviceToHost,
                      stream);
  if (e != cudaSuccess) goto done;
  e = cudaStreamSynchronize(stream);
  if (e != cudaSuccess) goto done;
  for (int i = 0; i < n; i++) {
    if (h[2 * n + i] != h[i] + h[n + i]) {
      *bad = i;
      break;
    }
  }
done:
  if (d) cudaFree(d);
  free(h);
  return e;
}
