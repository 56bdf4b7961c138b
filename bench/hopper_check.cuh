/*
 * What the two Hopper checkers share (bench/hopper_check.cu, the forward;
 * bench/hopper_bwd_check.cu, the backward). Not part of the library; each
 * checker is one translation unit that includes this once.
 *
 * Part 1 (the building blocks, exact): the CUDA error check, 16-bit
 * conversions, the random numbers, the tally of an exact comparison and its
 * line, element access to a swizzled tile, and a box of a tensor map read
 * back through that swizzle.
 *
 * Part 2 (the library against the float64 reference): the problems, their
 * inputs filled from the random numbers, attn_forward on them, and the
 * comparison of an output with the reference.
 *
 * The lines printed put the checks' names in a column CHECK_NAME_WIDTH
 * characters wide; a checker may define it before including this.
 */
#ifndef ATTN_BENCH_HOPPER_CHECK_CUH
#define ATTN_BENCH_HOPPER_CHECK_CUH

#include "attn.h"
#include "golden.h"
#include "ref.h"
#include "wgmma.cuh"

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <type_traits>
#include <vector>

/* Wide enough for the backward checker's names. */
#ifndef CHECK_NAME_WIDTH
#define CHECK_NAME_WIDTH 48
#endif

namespace wg = attn_wgmma;

static int failures = 0;

#define CK(x)                                                                                 \
  do {                                                                                        \
    cudaError_t e_ = (x);                                                                     \
    if (e_ != cudaSuccess) {                                                                  \
      printf("CUDA error: %s (%s:%d: %s)\n", cudaGetErrorString(e_), __FILE__, __LINE__, #x); \
      exit(2);                                                                                \
    }                                                                                         \
  } while (0)

static __host__ __device__ float h2f(__half x) {
  return __half2float(x);
}
static __host__ __device__ float h2f(__nv_bfloat16 x) {
  return __bfloat162float(x);
}
template <typename T>
static T f2h(float x);
template <>
__half f2h<__half>(float x) {
  return __float2half_rn(x);
}
template <>
__nv_bfloat16 f2h<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static int rand_int(int lo, int hi) { /* [lo, hi] */
  rng = rng * 6364136223846793005ull + 1442695040888963407ull;
  return lo + (int)((rng >> 33) % (uint64_t)(hi - lo + 1));
}
static float rand_unit() { /* [-1, 1) */
  rng = rng * 6364136223846793005ull + 1442695040888963407ull;
  return (float)((rng >> 40) / (double)(1 << 24)) * 2.f - 1.f;
}

/* The device's name; false, saying so, where it is not a Hopper GPU. */
static bool on_hopper() {
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  printf("device: %s, compute capability %d.%d\n", prop.name, prop.major, prop.minor);
  if (prop.major != 9) {
    printf("not a Hopper GPU: part 1 needs sm_90a\n");
    return false;
  }
  return true;
}

/* The last line; the exit status. part1: the failures counted by part 1. */
static int finish(const char *checker, int part1) {
  printf("%s: part 1 %s, part 2 %s\n", checker, part1 ? "FAILED" : "ok",
         failures > part1 ? "FAILED" : "ok");
  return failures ? 1 : 0;
}

/* ---------------------------------------------------------------------- */
/* Part 1: the building blocks                                             */
/* ---------------------------------------------------------------------- */

template <typename T>
static T *to_device(const std::vector<T> &h) {
  T *d;
  CK(cudaMalloc(&d, h.size() * sizeof(T)));
  CK(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}

/* One compared output: bad elements (not exactly equal), the largest |err|. */
struct tally {
  long bad = 0, n = 0;
  double err = 0;
  void add(const char *what, int r, int c, double got, double want) {
    n++;
    const double e = fabs(got - want);
    if (e == 0) return;
    if (bad < 4) printf("       %s[%d][%d] = %g, want %g\n", what, r, c, got, want);
    bad++;
    err = e > err || isnan(e) ? e : err;
  }
};

static void report(const char *what, const tally &t) {
  const bool ok = t.bad == 0;
  if (!ok) failures++;
  printf("  %-4s %-*s %s (%ld of %ld wrong, max |err| %g)\n", ok ? "ok" : "FAIL", CHECK_NAME_WIDTH,
         what, ok ? "exact" : "MISMATCH", t.bad, t.n, t.err);
}

__device__ uint32_t smem_u32(const void *p) {
  return (uint32_t)__cvta_generic_to_shared(p);
}

/* Element (r, c) of a swizzled tile of `rows` rows at its place (wgmma.cuh). */
template <typename T>
__device__ void put(uint32_t tile, int rows, int r, int c, T v) {
  const unsigned short u = *reinterpret_cast<unsigned short *>(&v);
  asm volatile("st.shared.u16 [%0], %1;\n" ::"r"(tile + wg::swizzled(rows, r, c / 8) + (c % 8) * 2),
               "h"(u)
               : "memory");
}
template <typename T>
__device__ T get(uint32_t tile, int rows, int r, int c) {
  unsigned short u;
  asm volatile("ld.shared.u16 %0, [%1];\n"
               : "=h"(u)
               : "r"(tile + wg::swizzled(rows, r, c / 8) + (c % 8) * 2)
               : "memory");
  return *reinterpret_cast<T *>(&u);
}

/* The box (64 x box_rows, D / 64 of them side by side) of a 4-d map at
 * (., c1, c2, c3), read back through the swizzle into out[box_rows][D]. */
template <typename T>
__global__ void k_tma(const __grid_constant__ CUtensorMap map, int D, int c1, int c2, int c3,
                      int box_rows, T *out) {
  extern __shared__ __align__(1024) unsigned char sm[];
  const uint32_t tile = (smem_u32(sm) + 1023u) & ~1023u;
  const uint32_t bar = tile + box_rows * D * 2;
  if (threadIdx.x == 0) {
    wg::mbar_init(bar, 1);
    wg::mbar_init_fence();
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    wg::mbar_expect_tx(bar, box_rows * D * 2);
    for (int cb = 0; cb < D / 64; ++cb)
      wg::tma_load_4d(tile + cb * box_rows * 128, &map, cb * 64, c1, c2, c3, bar);
  }
  wg::mbar_wait(bar, 0);
  for (int i = threadIdx.x; i < box_rows * D; i += blockDim.x)
    out[i] = get<T>(tile, box_rows, i / D, i % D);
}

/* k_tma's box at (row, head, batch), on the host. */
template <typename T>
static std::vector<T> read_box(const CUtensorMap &map, int D, int row, int head, int batch,
                               int box_rows) {
  T *dout;
  CK(cudaMalloc(&dout, (size_t)box_rows * D * sizeof(T)));
  const size_t smem = (size_t)box_rows * D * 2 + 1024 + 64;
  CK(cudaFuncSetAttribute(k_tma<T>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
  k_tma<T><<<1, 128, smem>>>(map, D, row, head, batch, box_rows, dout);
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());
  std::vector<T> out((size_t)box_rows * D);
  CK(cudaMemcpy(out.data(), dout, out.size() * sizeof(T), cudaMemcpyDeviceToHost));
  CK(cudaFree(dout));
  return out;
}

/* ---------------------------------------------------------------------- */
/* Part 2: the library against the reference                                */
/* ---------------------------------------------------------------------- */

struct problem {
  const char *name;
  attn_dtype dt;
  int d, hq, hkv;
  bool causal;
  long wl, wr;
  float softcap;
  bool alibi;
  std::vector<int> lq, lk; /* varlen: the sequences' lengths */
  int batch, nq, nk;       /* bshd */
  int layout;              /* bshd: 0 contiguous, 1 bhsd, 2 q/k/v slices of one fused tensor */
  int nan_v_seq;           /* varlen: this sequence's v rows are NaN (-1: none) */
};

/* The cuda backend's context; NULL after a FAIL line. */
static attn_context *open_cuda() {
  attn_context *ctx = nullptr;
  const int rc = attn_context_create("cuda", &ctx);
  if (rc) {
    printf("  FAIL cannot open the cuda backend: %s\n", attn_status_name(rc));
    return nullptr;
  }
  return ctx;
}

/* A bshd tensor over data (any strides, in elements). */
static attn_tensor strided(void *data, attn_dtype dt, int B, int N, int H, int D, int64_t sb,
                           int64_t ss, int64_t sh) {
  attn_tensor t = attn_tensor_bshd(data, dt, B, N, H, D);
  t.stride[0] = sb;
  t.stride[1] = ss;
  t.stride[2] = sh;
  t.stride[3] = 1;
  return t;
}

/* n elements of dt (f16 or bf16) from rand_unit. */
static void fill(std::vector<uint16_t> &a, size_t n, attn_dtype dt) {
  a.resize(n);
  for (auto &x : a) {
    const float f = rand_unit();
    if (dt == ATTN_F16) {
      __half h = __float2half_rn(f);
      memcpy(&x, &h, 2);
    } else {
      __nv_bfloat16 h = __float2bfloat16_rn(f);
      memcpy(&x, &h, 2);
    }
  }
}

/* A problem's q, k and v, filled from rand_unit in that order: each in its
 * own vector, or (layout 2) slices of one fused [B][N][3][H][D] vector (nq
 * = nk then); o and lse NaN, so that an element left unwritten shows; the
 * parameters. The tensors and p point into the vectors. */
struct inputs {
  const problem &pr;
  const bool varlen;
  const int B, D;
  std::vector<int32_t> cq, ck;
  int64_t rows_q, rows_k, nq_all, nk_all, nl;
  std::vector<uint16_t> fused, qh, kh, vh, oh;
  std::vector<float> lseh, slopes;
  attn_tensor q, k, v, o, lse;
  attn_params p;

  explicit inputs(const problem &pr_)
      : pr(pr_),
        varlen(!pr_.lq.empty()),
        B(varlen ? (int)pr_.lq.size() : pr_.batch),
        D(pr_.d),
        cq(B + 1, 0),
        ck(B + 1, 0) {
    if (varlen)
      for (int b = 0; b < B; b++) {
        cq[b + 1] = cq[b] + pr.lq[b];
        ck[b + 1] = ck[b] + pr.lk[b];
      }
    rows_q = varlen ? cq[B] : (int64_t)B * pr.nq;
    rows_k = varlen ? ck[B] : (int64_t)B * pr.nk;
    nq_all = rows_q * pr.hq * D;
    nk_all = rows_k * pr.hkv * D;
    if (varlen) {
      fill(qh, nq_all, pr.dt);
      fill(kh, nk_all, pr.dt);
      fill(vh, nk_all, pr.dt);
      if (pr.nan_v_seq >= 0)
        for (int64_t i = (int64_t)ck[pr.nan_v_seq] * pr.hkv * D;
             i < (int64_t)ck[pr.nan_v_seq + 1] * pr.hkv * D; i++)
          vh[i] = pr.dt == ATTN_F16 ? 0x7e00 : 0x7fc0;
      q = attn_tensor_varlen(qh.data(), pr.dt, rows_q, pr.hq, D);
      k = attn_tensor_varlen(kh.data(), pr.dt, rows_k, pr.hkv, D);
      v = attn_tensor_varlen(vh.data(), pr.dt, rows_k, pr.hkv, D);
    } else if (pr.layout == 1) { /* bhsd */
      fill(qh, nq_all, pr.dt);
      fill(kh, nk_all, pr.dt);
      fill(vh, nk_all, pr.dt);
      q = strided(qh.data(), pr.dt, B, pr.nq, pr.hq, D, (int64_t)pr.hq * pr.nq * D, D,
                  (int64_t)pr.nq * D);
      k = strided(kh.data(), pr.dt, B, pr.nk, pr.hkv, D, (int64_t)pr.hkv * pr.nk * D, D,
                  (int64_t)pr.nk * D);
      v = strided(vh.data(), pr.dt, B, pr.nk, pr.hkv, D, (int64_t)pr.hkv * pr.nk * D, D,
                  (int64_t)pr.nk * D);
    } else if (pr.layout == 2) { /* fused qkv [B][N][3][H][D], hq = hkv, nq = nk */
      fill(fused, (size_t)B * pr.nq * 3 * pr.hq * D, pr.dt);
      const int64_t ss = 3LL * pr.hq * D, sb = (int64_t)pr.nq * ss;
      q = strided(fused.data(), pr.dt, B, pr.nq, pr.hq, D, sb, ss, D);
      k = strided(fused.data() + (size_t)pr.hq * D, pr.dt, B, pr.nk, pr.hkv, D, sb, ss, D);
      v = strided(fused.data() + (size_t)2 * pr.hq * D, pr.dt, B, pr.nk, pr.hkv, D, sb, ss, D);
    } else {
      fill(qh, nq_all, pr.dt);
      fill(kh, nk_all, pr.dt);
      fill(vh, nk_all, pr.dt);
      q = attn_tensor_bshd(qh.data(), pr.dt, B, pr.nq, pr.hq, D);
      k = attn_tensor_bshd(kh.data(), pr.dt, B, pr.nk, pr.hkv, D);
      v = attn_tensor_bshd(vh.data(), pr.dt, B, pr.nk, pr.hkv, D);
    }
    oh.assign((size_t)nq_all, 0xffff);
    nl = varlen ? (int64_t)pr.hq * rows_q : (int64_t)B * pr.hq * pr.nq;
    lseh.assign((size_t)nl, NAN);
    o = like_q(oh.data());
    lse = varlen ? attn_tensor_lse(lseh.data(), 0, pr.hq, rows_q)
                 : attn_tensor_lse(lseh.data(), B, pr.hq, pr.nq);
    slopes.resize(pr.hq);
    for (int h = 0; h < pr.hq; h++)
      slopes[h] = powf(2.f, -8.f * (h + 1) / pr.hq);
    attn_params_init(&p);
    p.flags = pr.causal ? ATTN_CAUSAL : 0;
    p.window_left = pr.wl;
    p.window_right = pr.wr;
    p.softcap = pr.softcap;
    if (pr.alibi) {
      p.alibi_slopes = slopes.data();
      p.alibi_count = pr.hq;
    }
    if (varlen) {
      p.cu_seqlens_q = cq.data();
      p.cu_seqlens_k = ck.data();
      p.batch = B;
    }
  }
  inputs(const inputs &) = delete;
  inputs &operator=(const inputs &) = delete;

  /* A contiguous tensor over data shaped as q (o, dout, dq), as k (dk, dv). */
  attn_tensor like_q(void *data) const {
    return varlen ? attn_tensor_varlen(data, pr.dt, rows_q, pr.hq, D)
                  : attn_tensor_bshd(data, pr.dt, B, pr.nq, pr.hq, D);
  }
  attn_tensor like_k(void *data) const {
    return varlen ? attn_tensor_varlen(data, pr.dt, rows_k, pr.hkv, D)
                  : attn_tensor_bshd(data, pr.dt, B, pr.nk, pr.hkv, D);
  }
};

/* attn_forward on the inputs; false after a FAIL line. */
static bool forward(attn_context *ctx, inputs &in) {
  const int rc = attn_forward(ctx, &in.p, &in.q, &in.k, &in.v, &in.o, &in.lse);
  if (rc) {
    printf("  FAIL %-*s attn_forward: %s: %s\n", CHECK_NAME_WIDTH, in.pr.name, attn_status_name(rc),
           attn_errmsg(ctx));
    failures++;
    return false;
  }
  return true;
}

/* max |got - want| over the reference's finite elements, and max |want|;
 * a NaN where the reference has none (or the reverse) counts in nan_bad. */
struct cmp {
  double err = 0, maxref = 0;
  long nan_bad = 0, nans = 0;
};
static cmp compare(const std::vector<uint16_t> &got, attn_dtype dt,
                   const std::vector<double> &want) {
  cmp r;
  for (size_t i = 0; i < want.size(); i++) {
    const double g = attn__load(got.data(), dt, (int64_t)i), w = want[i];
    if (isnan(w) || isnan(g)) {
      r.nans += isnan(w);
      r.nan_bad += isnan(w) != isnan(g);
      continue;
    }
    r.err = fmax(r.err, fabs(g - w));
    r.maxref = fmax(r.maxref, fabs(w));
  }
  return r;
}

#endif /* ATTN_BENCH_HOPPER_CHECK_CUH */
