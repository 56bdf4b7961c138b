/*
 * cuda_stream: attn inside a CUDA program, on the program's own memory and
 * stream.
 *
 * The program allocates q, k, v, o, lse and the gradients with cudaMalloc and
 * hands them to attn with attn_buffer_wrap (attn neither copies nor frees
 * them), gives attn its cudaStream_t with attn_context_set_stream, and queues
 * everything on that stream: the copies in, the forward and backward passes
 * (ATTN_ASYNC: the calls return once their kernels are queued), the copies
 * out. One cudaStreamSynchronize at the end waits for all of it. The results
 * are checked against the CPU backend's on the same inputs.
 *
 * Without a CUDA device (or with an attn built without the CUDA backend) it
 * says so and exits with 77, which ctest reports as skipped.
 */
#include <attn.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

enum { B = 2, N = 100, H = 4, D = 64, NQ = B * N * H * D, NL = B * H * N, SKIP = 77 };

/* The tensors of one attention layer: what the program gives, what attn
 * writes. */
enum { Q, K, V, DOUT, O, LSE, DQ, DK, DV, NT };
static const char *const names[NT] = {"q", "k", "v", "dout", "o", "lse", "dq", "dk", "dv"};
static const int inputs[] = {Q, K, V, DOUT}, outputs[] = {O, LSE, DQ, DK, DV};
enum { NIN = sizeof inputs / sizeof *inputs, NOUT = sizeof outputs / sizeof *outputs };

#define CHECK_CUDA(call)                                                       \
  do {                                                                         \
    cudaError_t e_ = (call);                                                   \
    if (e_ != cudaSuccess) {                                                   \
      fprintf(stderr, "cuda_stream: %s: %s\n", #call, cudaGetErrorString(e_)); \
      goto done;                                                               \
    }                                                                          \
  } while (0)
#define CHECK_ATTN(ctx, call)                                                    \
  do {                                                                           \
    int rc_ = (call);                                                            \
    if (rc_ != ATTN_OK) {                                                        \
      fprintf(stderr, "cuda_stream: %s: %s: %s\n", #call, attn_status_name(rc_), \
              attn_errmsg(ctx));                                                 \
      goto done;                                                                 \
    }                                                                            \
  } while (0)

static void fill(float *x, size_t n, unsigned *seed) {
  for (size_t i = 0; i < n; i++) {
    *seed = *seed * 1664525u + 1013904223u;
    x[i] = (float)((*seed >> 8) / 8388608.0 - 1.0);
  }
}

/* The tensor of slot i over memory at data (host) or in buf (device). */
static attn_tensor tensor(int i, float *data, attn_buffer *buf) {
  attn_tensor t =
      i == LSE ? attn_tensor_lse(data, B, H, N) : attn_tensor_bshd(data, ATTN_F32, B, N, H, D);
  return buf ? attn_tensor_on(t, buf, 0) : t;
}

/* attn numbers the CUDA devices its build has code for, in CUDA's order; the
 * CUDA device of attn's device `info` is the first with its name, compute
 * capability and memory (CUDA's own number, for cudaSetDevice). */
static int cuda_device_of(const attn_device_info *info) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) return -1;
  for (int d = 0; d < n; d++) {
    struct cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, d) == cudaSuccess && !strcmp(prop.name, info->name) &&
        prop.major == info->compute_major && prop.minor == info->compute_minor &&
        prop.totalGlobalMem == info->memory_bytes)
      return d;
  }
  return -1;
}

/* Runs the forward and backward passes on ctx over the tensors t. */
static int layer(attn_context *ctx, const attn_tensor *t, unsigned flags) {
  attn_params p;
  attn_params_init(&p);
  p.flags |= ATTN_CAUSAL | flags;
  int rc = attn_forward(ctx, &p, &t[Q], &t[K], &t[V], &t[O], &t[LSE]);
  if (rc == ATTN_OK)
    rc = attn_backward(ctx, &p, &t[Q], &t[K], &t[V], &t[O], &t[LSE], &t[DOUT], &t[DQ], &t[DK],
                       &t[DV]);
  if (rc != ATTN_OK)
    fprintf(stderr, "cuda_stream: %s: %s\n", attn_status_name(rc), attn_errmsg(ctx));
  return rc;
}

int main(void) {
  static float host[NT][NQ], cpu[NT][NQ]; /* the CUDA results, the CPU's */
  size_t bytes[NT];
  void *dev[NT] = {0};
  attn_buffer *buf[NT] = {0};
  attn_tensor t[NT];
  attn_context *gpu = NULL, *ref = NULL;
  cudaStream_t stream = NULL;
  attn_tensor th[NT];
  attn_device_info info;
  unsigned seed = 2;
  int ok = 0, device;

  if (attn_device_count(ATTN_BACKEND_CUDA) == 0) {
    printf("cuda_stream: skipped: %s\n", attn_backend_unavailable_reason(ATTN_BACKEND_CUDA));
    return SKIP;
  }
  CHECK_ATTN(gpu, attn_context_create("cuda:0", &gpu));
  CHECK_ATTN(gpu, attn_context_device_info(gpu, &info));
  device = cuda_device_of(&info);
  if (device < 0) {
    fprintf(stderr, "cuda_stream: no CUDA device matches attn's %s\n", info.name);
    goto done;
  }
  printf("cuda_stream: %s (CUDA device %d)\n", info.name, device);

  /* The program's stream, one that does not wait for the legacy default
   * stream; attn queues its kernels on it from now on. */
  CHECK_CUDA(cudaSetDevice(device));
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  CHECK_ATTN(gpu, attn_context_set_stream(gpu, stream));

  for (int i = 0; i < NT; i++) {
    bytes[i] = (i == LSE ? NL : NQ) * sizeof(float);
    CHECK_CUDA(cudaMalloc(&dev[i], bytes[i]));
    CHECK_ATTN(gpu, attn_buffer_wrap(gpu, dev[i], bytes[i], &buf[i])); /* the pointer, as it is */
    t[i] = tensor(i, NULL, buf[i]);
  }

  /* Everything in stream order, with no wait in between. */
  for (int n = 0; n < NIN; n++) {
    int i = inputs[n];
    fill(host[i], bytes[i] / sizeof(float), &seed);
    CHECK_CUDA(cudaMemcpyAsync(dev[i], host[i], bytes[i], cudaMemcpyHostToDevice, stream));
  }
  if (layer(gpu, t, ATTN_ASYNC) != ATTN_OK) goto done;
  for (int n = 0; n < NOUT; n++) {
    int i = outputs[n];
    CHECK_CUDA(cudaMemcpyAsync(host[i], dev[i], bytes[i], cudaMemcpyDeviceToHost, stream));
  }
  CHECK_CUDA(cudaStreamSynchronize(stream));

  /* The same layer on the CPU backend, over host memory. */
  CHECK_ATTN(ref, attn_context_create("cpu", &ref));
  for (int n = 0; n < NIN; n++)
    memcpy(cpu[inputs[n]], host[inputs[n]], bytes[inputs[n]]);
  for (int i = 0; i < NT; i++)
    th[i] = tensor(i, cpu[i], NULL);
  if (layer(ref, th, 0) != ATTN_OK) goto done;

  /* Each backend is within the golden cases' float32 tolerance without a
   * peer figure, 1e-5 * max(1, max|exact|), of the exact answer
   * (tests/golden/README.md), so the two agree within twice that. */
  ok = 1;
  for (int n = 0; n < NOUT; n++) {
    int i = outputs[n];
    double err = 0, big = 1;
    for (size_t e = 0; e < bytes[i] / sizeof(float); e++) {
      double d = fabs((double)host[i][e] - cpu[i][e]);
      if (!(d <= err)) err = d; /* a NaN counts as the largest error */
      if (fabs(cpu[i][e]) > big) big = fabs(cpu[i][e]);
    }
    double bound = 2e-5 * big;
    printf("  %-3s CUDA against CPU: max|diff| %.2e (bound %.1e) %s\n", names[i], err, bound,
           err <= bound ? "ok" : "WRONG");
    ok &= err <= bound;
  }

done:
  /* The wrappers first, then the contexts (a context frees nothing of the
   * program's), then the memory and the stream, which attn no longer uses. */
  for (int i = 0; i < NT; i++)
    attn_buffer_free(buf[i]);
  attn_context_free(gpu);
  attn_context_free(ref);
  for (int i = 0; i < NT; i++)
    cudaFree(dev[i]);
  if (stream) cudaStreamDestroy(stream);
  printf("cuda_stream: %s\n", ok ? "passed" : "FAILED");
  return ok ? 0 : 1;
}
