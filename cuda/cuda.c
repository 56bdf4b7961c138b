/*
 * The CUDA backend's host side: device enumeration, contexts bound to a
 * device and a stream, device buffers, and the forward/backward calls, which
 * run the row of the tuning table that the plan (plan.c) chose.
 *
 * The CUDA runtime is linked statically, so the library loads on a machine
 * with no NVIDIA driver: the runtime then fails its first call, the device
 * count is 0 with the runtime's sentence, and "auto" moves on.
 */
#include "attn_cuda.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

/* selftest.cu */
cudaError_t attn__cuda_selftest_run(cudaStream_t stream, int *bad);

typedef struct cuda_impl {
  int device;
  /* Created with the context as a blocking stream: it waits for the legacy
   * default stream, where a caller that never heard of streams wrote the
   * inputs. */
  cudaStream_t own;
  cudaStream_t stream; /* own, or the caller's (attn_context_set_stream) */
  attn__cuda_device dev;
  size_t total_mem; /* the device's memory, from cudaMemGetInfo */
  void *scratch;    /* per-call copies of cu_seqlens and the ALiBi slopes */
  size_t scratch_bytes;
  void *ws; /* the kernels' workspace, grown on demand, never shrunk */
  size_t ws_bytes;
} cuda_impl;

static int cuda_fail(attn_context *ctx, cudaError_t e, const char *what) {
  int status = e == cudaErrorMemoryAllocation ? ATTN_ENOMEM : ATTN_EDEVICE;
  /* Clear a sticky-free error so it does not resurface in the next call. */
  (void)cudaGetLastError();
  return attn__error(ctx, status, "CUDA: %s failed: %s (%s)", what, cudaGetErrorString(e),
                     cudaGetErrorName(e));
}

#define CU(ctx, call, what)                                 \
  do {                                                      \
    cudaError_t e_ = (call);                                \
    if (e_ != cudaSuccess) return cuda_fail(ctx, e_, what); \
  } while (0)

static size_t align256(size_t n) {
  return (n + 255) & ~(size_t)255;
}

/* ---------------------------------------------------------------------- */
/* Devices                                                                  */
/* ---------------------------------------------------------------------- */

/* The devices the build has code for (archs.c), as CUDA numbers them:
 * device i of this backend is CUDA's probe_map[i]. A device without code
 * would fail at its first launch; not counting it lets `auto` move on. */
#define MAX_DEVICES 64
static pthread_once_t probe_once = PTHREAD_ONCE_INIT;
static int probe_count, probe_map[MAX_DEVICES];
static char probe_why[320];

static void probe(void) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    snprintf(probe_why, sizeof probe_why,
             "the CUDA runtime found no usable device: %s (is the NVIDIA driver installed?)",
             cudaGetErrorString(e));
    n = 0;
  } else if (n == 0) {
    snprintf(probe_why, sizeof probe_why, "the CUDA driver reports no device");
  }
  const char *archs = attn__cuda_archs();
  int count = 0, uncovered = -1; /* uncovered: the first device's cc without code */
  for (int d = 0; d < n && count < MAX_DEVICES; d++) {
    int major = 0, minor = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, d) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, d) != cudaSuccess) {
      (void)cudaGetLastError();
      continue;
    }
    if (!*archs || attn__cuda_arch_covers(archs, 10 * major + minor)) {
      probe_map[count++] = d;
    } else {
      attn__debug("cuda: device %d (compute %d.%d) has no code in this build (built for %s)", d,
                  major, minor, archs);
      if (uncovered < 0) uncovered = 10 * major + minor;
    }
  }
  if (n > 0 && count == 0 && uncovered >= 0)
    snprintf(probe_why, sizeof probe_why,
             "this build has no code for the CUDA device%s here (compute %d.%d%s); it was built "
             "for %s (CMAKE_CUDA_ARCHITECTURES)",
             n > 1 ? "s" : "", uncovered / 10, uncovered % 10, n > 1 ? ", ..." : "", archs);
  else if (n > 0 && count == 0)
    snprintf(probe_why, sizeof probe_why,
             "the CUDA runtime could not read the devices' compute capability");
  probe_count = count;
}

static int cuda_device_count(char *why, size_t why_len) {
  pthread_once(&probe_once, probe);
  if (why && why_len) snprintf(why, why_len, "%s", probe_count ? "" : probe_why);
  return probe_count;
}

static int cuda_device_info(int index, attn_device_info *out) {
  struct cudaDeviceProp prop;
  int drv = 0, rt = 0;
  pthread_once(&probe_once, probe);
  if (index < 0 || index >= probe_count) return ATTN_EDEVICE;
  if (cudaGetDeviceProperties(&prop, probe_map[index]) != cudaSuccess) {
    (void)cudaGetLastError();
    return ATTN_EDEVICE;
  }
  cudaDriverGetVersion(&drv);
  cudaRuntimeGetVersion(&rt);
  memset(out, 0, sizeof *out);
  out->backend = ATTN_BACKEND_CUDA;
  out->index = index;
  out->is_gpu = 1;
  memcpy(out->name, prop.name, sizeof out->name - 1); /* prop.name is 256 bytes */
  out->name[sizeof out->name - 1] = '\0';
  snprintf(out->version, sizeof out->version, "CUDA driver %d.%d, runtime %d.%d", drv / 1000,
           drv % 1000 / 10, rt / 1000, rt % 1000 / 10);
  out->memory_bytes = prop.totalGlobalMem;
  out->compute_major = prop.major;
  out->compute_minor = prop.minor;
  out->compute_units = prop.multiProcessorCount;
  return ATTN_OK;
}

/* ---------------------------------------------------------------------- */
/* Contexts                                                                 */
/* ---------------------------------------------------------------------- */

static int cuda_open(attn_context *ctx, int index) {
  cuda_impl *I = (cuda_impl *)calloc(1, sizeof *I);
  int v = 0, major = 0, minor = 0;
  if (!I) return attn__error(ctx, ATTN_ENOMEM, "out of host memory for the CUDA context");
  pthread_once(&probe_once, probe);
  if (index < 0 || index >= probe_count) {
    free(I);
    return attn__error(ctx, ATTN_EUNAVAILABLE, "CUDA device %d does not exist here", index);
  }
  I->device = probe_map[index];
  cudaError_t e = cudaSetDevice(I->device);
  if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&I->own, cudaStreamDefault);
  if (e == cudaSuccess)
    e = cudaDeviceGetAttribute(&I->dev.sm_count, cudaDevAttrMultiProcessorCount, I->device);
  if (e == cudaSuccess)
    e = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, I->device);
  if (e == cudaSuccess)
    e = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, I->device);
  if (e == cudaSuccess)
    e = cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, I->device);
  size_t free_mem = 0;
  if (e == cudaSuccess) e = cudaMemGetInfo(&free_mem, &I->total_mem);
  if (e == cudaSuccess) e = attn__cuda_code_arch(&I->dev);
  if (e != cudaSuccess) {
    if (I->own) cudaStreamDestroy(I->own);
    free(I);
    return cuda_fail(ctx, e, "opening the device");
  }
  I->dev.cc = 10 * major + minor;
  I->dev.smem_optin = (size_t)v;
  I->stream = I->own;
  ctx->impl = I;
  attn__debug(
      "cuda:%d: %d multiprocessors, compute %d.%d, %zu bytes of shared memory a block, "
      "running code for %d.%d%s",
      index, I->dev.sm_count, major, minor, I->dev.smem_optin, I->dev.arch / 10, I->dev.arch % 10,
      I->dev.arch_specific ? "a" : "");
  return ATTN_OK;
}

static void cuda_close(attn_context *ctx) {
  cuda_impl *I = (cuda_impl *)ctx->impl;
  if (!I) return;
  cudaSetDevice(I->device);
  cudaStreamSynchronize(I->stream);
  if (I->scratch) cudaFree(I->scratch);
  if (I->ws) cudaFree(I->ws);
  cudaStreamDestroy(I->own);
  (void)cudaGetLastError();
  free(I);
  ctx->impl = NULL;
}

static int cuda_set_stream(attn_context *ctx, void *stream) {
  cuda_impl *I = (cuda_impl *)ctx->impl;
  CU(ctx, cudaSetDevice(I->device), "cudaSetDevice");
  /* Work queued on the old stream may still read the scratch and the
   * workspace that the new stream will overwrite. */
  CU(ctx, cudaStreamSynchronize(I->stream), "synchronizing the previous stream");
  I->stream = stream ? (cudaStream_t)stream : I->own;
  return ATTN_OK;
}

static int cuda_synchronize(attn_context *ctx) {
  cuda_impl *I = (cuda_impl *)ctx->impl;
  CU(ctx, cudaSetDevice(I->device), "cudaSetDevice");
  CU(ctx, cudaStreamSynchronize(I->stream), "cudaStreamSynchronize");
  return ATTN_OK;
}

static int cuda_selftest(attn_context *ctx) {
  cuda_impl *I = (cuda_impl *)ctx->impl;
  int bad = -1;
  CU(ctx, cudaSetDevice(I->device), "cudaSetDevice");
  CU(ctx, attn__cuda_selftest_run(I->stream, &bad), "the C = A + B self-test");
  if (bad >= 0)
    return attn__error(ctx, ATTN_EDEVICE, "CUDA self-test: C = A + B is wrong at element %d", bad);
  return ATTN_OK;
}

/* ---------------------------------------------------------------------- */
/* Buffers                                                                  */
/* ---------------------------------------------------------------------- */

static int cuda_buffer_alloc(attn_context *ctx, size_t bytes, void **native) {
  cuda_impl *I = (cuda_impl *)ctx->impl;
  void *p = NULL;
  /* A request above the device's whole memory is refused before asking,
   * with the limit named. */
  if (bytes > I->total_mem)
    return attn__error(ctx, ATTN_ENOMEM,
                       "%zu bytes is more than the %zu bytes of memory of cuda:%d", bytes,
                       I->total_mem, attn_context_device(ctx));
  CU(ctx, cudaSetDevice(I->device), "cudaSetDevice");
  cudaError_t e = cudaMalloc(&p, bytes ? bytes : 1);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return attn__error(ctx, e == cudaErrorMemoryAllocation ? ATTN_ENOMEM : ATTN_EDEVICE,
                       "CUDA: cudaMalloc of %zu bytes failed: %s", bytes, cudaGetErrorString(e));
  }
  *native = p;
  return ATTN_OK;
}

static void cuda_buffer_release(attn_context *ctx, void *native) {
  cuda_impl *I = (cuda_impl *)ctx->impl;
  cudaSetDevice(I->device);
  cudaFree(native); /* waits for work that may still use it */
  (void)cudaGetLastError();
}

static int cuda_buffer_write(attn_context *ctx, void *native, size_t offset, const void *src,
                             size_t bytes) {
  cuda_impl *I = (cuda_impl *)ctx->impl;
  CU(ctx, cudaSetDevice(I->device), "cudaSetDevice");
  CU(ctx, cudaMemcpyAsync((char *)native + offset, src, bytes, cudaMemcpyHostToDevice, I->stream),
     "copying to the device");
  CU(ctx, cudaStreamSynchronize(I->stream), "copying to the device");
  return ATTN_OK;
}

static int cuda_buffer_read(attn_context *ctx, void *native, size_t offset, void *dst,
                            size_t bytes) {
  cuda_impl *I = (cuda_impl *)ctx->impl;
  CU(ctx, cudaSetDevice(I->device), "cudaSetDevice");
  CU(ctx,
     cudaMemcpyAsync(dst, (const char *)native + offset, bytes, cudaMemcpyDeviceToHost, I->stream),
     "copying from the device");
  CU(ctx, cudaStreamSynchronize(I->stream), "copying from the device");
  return ATTN_OK;
}

/* Device memory that only grows. The old block may still be read by queued
 * work, so the stream is drained before it is freed. */
static int grow(attn_context *ctx, void **p, size_t *have, size_t need, const char *what) {
  cuda_impl *I = (cuda_impl *)ctx->impl;
  if (need <= *have) return ATTN_OK;
  if (*p) {
    CU(ctx, cudaStreamSynchronize(I->stream), "draining the stream before growing a buffer");
    cudaFree(*p);
    *p = NULL;
    *have = 0;
  }
  cudaError_t e = cudaMalloc(p, need);
  if (e != cudaSuccess) {
    *p = NULL;
    (void)cudaGetLastError();
    return attn__error(ctx, e == cudaErrorMemoryAllocation ? ATTN_ENOMEM : ATTN_EDEVICE,
                       "CUDA: allocating %zu bytes of %s failed: %s", need, what,
                       cudaGetErrorString(e));
  }
  *have = need;
  return ATTN_OK;
}

/* ---------------------------------------------------------------------- */
/* Attention                                                                */
/* ---------------------------------------------------------------------- */

static int cuda_plan(attn_context *ctx, const attn__problem *pb, int backward, attn__plan *out) {
  cuda_impl *I = (cuda_impl *)ctx->impl;
  /* Grid y and z carry the heads and the sequences. */
  if (pb->heads_q > 65535)
    return attn__error(ctx, ATTN_EUNSUPPORTED,
                       "cuda: %lld query heads is above the 65535 supported",
                       (long long)pb->heads_q);
  if (pb->batch > 65535)
    return attn__error(ctx, ATTN_EUNSUPPORTED, "cuda: a batch of %lld is above the 65535 supported",
                       (long long)pb->batch);
  if (pb->seqlen_q > INT32_MAX || pb->seqlen_k > INT32_MAX)
    return attn__error(ctx, ATTN_EUNSUPPORTED,
                       "cuda: sequences longer than 2^31-1 rows are not supported");
  char why[256];
  const attn__cuda_config *c = attn__cuda_plan(&I->dev, pb, backward, why, sizeof why);
  if (!c) return attn__error(ctx, ATTN_EUNSUPPORTED, "%s", why);
  memset(out, 0, sizeof *out);
  out->backward = backward;
  out->kernel = (int)c->kernel;
  out->config = c;
  out->name = c->name;
  out->workspace = c->kernel == ATTN__CUDA_DECODE ? attn__cuda_decode_workspace(&I->dev, c, pb)
                                                  : attn__cuda_workspace(c->kernel, pb);
  return ATTN_OK;
}

/* The offsets and slopes where the kernels read them (L). Host memory is
 * copied into the scratch block, in stream order behind any earlier call
 * still reading it. Offsets in a device buffer are copied there clamped
 * (meta.cu), as nothing has checked them; slopes in a device buffer are
 * read where they are. keys_only: cu_seqlens_k alone (the append). */
static int put_metadata(attn_context *ctx, const attn__problem *pb, int keys_only,
                        attn__cuda_launch *L) {
  cuda_impl *I = (cuda_impl *)ctx->impl;
  const int64_t n = pb->batch + 1;
  const size_t cu_bytes = pb->varlen ? align256(sizeof(int32_t) * (size_t)n) : 0;
  const size_t al_bytes =
      pb->alibi && !keys_only ? align256(sizeof(float) * (size_t)pb->heads_q) : 0;
  if (pb->alibi_dev.native && !keys_only) L->alibi = (const float *)attn__cuda_at(&pb->alibi_dev);
  if (!(cu_bytes + al_bytes)) return ATTN_OK;
  int st = grow(ctx, &I->scratch, &I->scratch_bytes, 2 * cu_bytes + al_bytes, "scratch");
  if (st != ATTN_OK) return st;
  char *s = (char *)I->scratch;
  const int32_t *host[2] = {pb->cu_q, pb->cu_k};
  const attn__tensor *dev[2] = {&pb->cu_q_dev, &pb->cu_k_dev};
  const int64_t rows[2] = {pb->total_q, pb->total_k};
  const int32_t **to[2] = {&L->cu_q, &L->cu_k};
  const char *what[2] = {"copying cu_seqlens_q", "copying cu_seqlens_k"};
  for (int i = keys_only; i < 2 && cu_bytes; i++) {
    int32_t *dst = (int32_t *)(s + (size_t)i * cu_bytes);
    if (host[i]) {
      CU(ctx,
         cudaMemcpyAsync(dst, host[i], sizeof(int32_t) * (size_t)n, cudaMemcpyHostToDevice,
                         I->stream),
         what[i]);
    } else if (dev[i]->native) {
      const int32_t *src = (const int32_t *)attn__cuda_at(dev[i]);
      if (attn__cuda_clamp_offsets(src, dst, n, rows[i], I->stream) != ATTN_OK)
        return cuda_fail(ctx, cudaGetLastError(), what[i]);
    } else {
      continue; /* a paged cache has no cu_seqlens_k */
    }
    *to[i] = dst;
  }
  if (al_bytes) {
    CU(ctx,
       cudaMemcpyAsync(s + 2 * cu_bytes, pb->alibi, sizeof(float) * (size_t)pb->heads_q,
                       cudaMemcpyHostToDevice, I->stream),
       "copying the ALiBi slopes");
    L->alibi = (const float *)(s + 2 * cu_bytes);
  }
  return ATTN_OK;
}

/* A launch of pb on the context's device and stream, the rest zero. */
static attn__cuda_launch launch_of(cuda_impl *I, const attn__problem *pb) {
  attn__cuda_launch L;
  memset(&L, 0, sizeof L);
  L.pb = pb;
  L.dev = &I->dev;
  L.stream = I->stream;
  return L;
}

/* forward and backward: the plan says which. */
static int cuda_run(attn_context *ctx, const attn__problem *pb, const attn__plan *plan) {
  cuda_impl *I = (cuda_impl *)ctx->impl;
  const attn__cuda_config *c = (const attn__cuda_config *)plan->config;
  int st;
  CU(ctx, cudaSetDevice(I->device), "cudaSetDevice");
  attn__cuda_launch L = launch_of(I, pb);
  st = put_metadata(ctx, pb, 0, &L);
  if (st != ATTN_OK) return st;

  if (plan->workspace) {
    st = grow(ctx, &I->ws, &I->ws_bytes, plan->workspace, "workspace");
    /* The Hopper TF32 rows' workspace holds copies of q, k and v: where it
     * cannot grow, the mma.sync TF32 row runs the problem without one. */
    const attn__cuda_config *u =
        st == ATTN_ENOMEM && c->tf32 && c->kernel == ATTN__CUDA_HOPPER_FORWARD
            ? attn__cuda_plan_unstaged(&I->dev, pb)
            : NULL;
    if (u) {
      attn__debug("cuda:%d: no room for %zu bytes of TF32 copies: %s", I->device, plan->workspace,
                  u->name);
      ctx->errmsg[0] = '\0';
      c = u;
      st = ATTN_OK;
    }
    if (st != ATTN_OK) return st;
  }
  L.workspace = I->ws;

  st = c->launch(&L, c);
  if (st != ATTN_OK) {
    cudaError_t e = cudaGetLastError();
    if (st == ATTN_EDEVICE || e != cudaSuccess)
      return attn__error(ctx, ATTN_EDEVICE, "CUDA: launching the %s kernels failed: %s", c->name,
                         cudaGetErrorString(e));
    return attn__error(ctx, st, "cuda: the %s kernels failed (%s)", c->name, attn_status_name(st));
  }
  if (!pb->async) {
    cudaError_t e = cudaStreamSynchronize(I->stream);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      return attn__error(ctx, ATTN_EDEVICE, "CUDA: the %s kernels failed: %s", c->name,
                         cudaGetErrorString(e));
    }
  }
  return ATTN_OK;
}

/* The KV cache's new rows, before the forward pass on the same stream. A
 * varlen cache needs cu_seqlens_k on the device: the scratch block holds it
 * as it does for the forward pass, which puts it there again behind this. */
static int cuda_append(attn_context *ctx, const attn__problem *pb) {
  cuda_impl *I = (cuda_impl *)ctx->impl;
  CU(ctx, cudaSetDevice(I->device), "cudaSetDevice");
  attn__cuda_launch L = launch_of(I, pb);
  int st = put_metadata(ctx, pb, 1, &L);
  if (st != ATTN_OK) return st;
  if (attn__cuda_append(&L) != ATTN_OK)
    return cuda_fail(ctx, cudaGetLastError(), "appending to the KV cache");
  return ATTN_OK;
}

static int cuda_merge(attn_context *ctx, const attn__merge *m) {
  cuda_impl *I = (cuda_impl *)ctx->impl;
  CU(ctx, cudaSetDevice(I->device), "cudaSetDevice");
  int st = grow(ctx, &I->ws, &I->ws_bytes, attn__cuda_merge_workspace(m), "workspace");
  if (st != ATTN_OK) return st;
  st = attn__cuda_merge(m, I->stream, I->ws);
  if (st == ATTN_ENOMEM) return attn__error(ctx, st, "out of host memory for %d parts", m->n);
  if (st != ATTN_OK) return cuda_fail(ctx, cudaGetLastError(), "attn_merge's kernel");
  CU(ctx, cudaStreamSynchronize(I->stream), "attn_merge's kernel");
  return ATTN_OK;
}

const attn__backend attn__backend_cuda = {
    .kind = ATTN_BACKEND_CUDA,
    .name = "cuda",
    .host_memory = 0,
    .device_count = cuda_device_count,
    .device_info = cuda_device_info,
    .open = cuda_open,
    .close = cuda_close,
    .buffer_alloc = cuda_buffer_alloc,
    .buffer_release = cuda_buffer_release,
    .buffer_write = cuda_buffer_write,
    .buffer_read = cuda_buffer_read,
    .set_stream = cuda_set_stream,
    .synchronize = cuda_synchronize,
    .selftest = cuda_selftest,
    .plan = cuda_plan,
    .forward = cuda_run,
    .backward = cuda_run,
    .append = cuda_append,
    .merge = cuda_merge,
};
