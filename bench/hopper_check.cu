/*
 * hopper_check: the first things to look at when the Hopper forward
 * (cuda/hopper_fwd.cu) runs on an H200. Not part of the library.
 *
 * Part 1 tests the building blocks of cuda/wgmma.cuh on their own, with
 * small integers (exact in f16, bf16 and f32) against the CPU:
 *   ss   S = Q K^T, both tiles K-major in the 128-byte swizzle, two
 *        warpgroups on a 128-row Q tile (the descriptor, the k-step offsets,
 *        the accumulator layout);
 *   rs   O = P V, P in registers as the A fragment, V [keys][d] through the
 *        MN-major (transposed) descriptor;
 *   tma  a box of a tensor map (bshd strides, rows past the end) landing in
 *        the same swizzle, completing on an mbarrier.
 * If part 1 fails, the kernel cannot work: the line says which piece.
 *
 * Part 2 runs the library (cuda backend) against the test kit's float64
 * reference on what `attn run` cannot ask: varlen with GQA, a NaN in the
 * next sequence's V rows, strided layouts (bhsd, a slice of fused qkv),
 * windows, softcap, ALiBi, rows that see no key. ATTN_DEBUG=1 shows the row
 * each call ran.
 *
 * Build (hopper_check.sh does): nvcc -std=c++17 -O2
 *   -gencode=arch=compute_90a,code=sm_90a -Iinclude -Isrc -Icuda -Itestkit
 *   bench/hopper_check.cu BUILD/testkit/libattn_testkit.a BUILD/libattn.a
 *   $(pkg-config --libs openblas) -Xcompiler -fopenmp -ldl
 * Exit status: 0 when every check passed.
 */
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

#include <vector>

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

static float h2f(__half x) {
  return __half2float(x);
}
static float h2f(__nv_bfloat16 x) {
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

/* ---------------------------------------------------------------------- */
/* Part 1: the building blocks                                             */
/* ---------------------------------------------------------------------- */

__device__ uint32_t smem_u32(const void *p) {
  return (uint32_t)__cvta_generic_to_shared(p);
}

/* Element (r, c) of a rows x D tile at its swizzled place. */
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

template <typename T>
__device__ uint32_t pack2(T lo, T hi) {
  const unsigned short a = *reinterpret_cast<unsigned short *>(&lo);
  const unsigned short b = *reinterpret_cast<unsigned short *>(&hi);
  return (uint32_t)a | (uint32_t)b << 16;
}

/* s[128][BC] = q[128][D] k[BC][D]^T, as hopper_fwd.cu's rows64::scores<128>. */
template <typename T, int D, int BC>
__global__ void __launch_bounds__(256) k_ss(const T *q, const T *k, float *s) {
  using mma = wg::mma<std::is_same<T, __nv_bfloat16>::value>;
  extern __shared__ __align__(1024) unsigned char sm[];
  const uint32_t sQ = (smem_u32(sm) + 1023u) & ~1023u, sK = sQ + 128 * D * 2;
  for (int i = threadIdx.x; i < 128 * D; i += 256)
    put(sQ, 128, i / D, i % D, q[i]);
  for (int i = threadIdx.x; i < BC * D; i += 256)
    put(sK, BC, i / D, i % D, k[i]);
  wg::fence_proxy_async();
  __syncthreads();
  const int tid = threadIdx.x, wgi = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31;
  const int g = lane >> 2, t = lane & 3;
  float acc[BC / 8][4];
  const uint64_t dq = wg::desc_k_major(sQ + wgi * 64 * 128), dk = wg::desc_k_major(sK);
  wg::pin(acc);
  wg::fence();
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk)
    mma::ss(acc, dq + (((kk / 4) * 128 * 128 + (kk % 4) * 32) >> 4),
            dk + (((kk / 4) * BC * 128 + (kk % 4) * 32) >> 4), kk > 0);
  wg::commit();
  wg::wait<0>();
  wg::pin(acc);
#pragma unroll
  for (int n = 0; n < BC / 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int row = wgi * 64 + warp * 16 + g + 8 * (e >> 1), col = 8 * n + 2 * t + (e & 1);
      s[row * BC + col] = acc[n][e];
    }
}

/* o[128][D] = p[128][BC] v[BC][D], as rows64::accumulate. */
template <typename T, int D, int BC>
__global__ void __launch_bounds__(256) k_rs(const T *p, const T *v, float *o) {
  using mma = wg::mma<std::is_same<T, __nv_bfloat16>::value>;
  extern __shared__ __align__(1024) unsigned char sm[];
  const uint32_t sV = (smem_u32(sm) + 1023u) & ~1023u;
  for (int i = threadIdx.x; i < BC * D; i += 256)
    put(sV, BC, i / D, i % D, v[i]);
  wg::fence_proxy_async();
  __syncthreads();
  const int tid = threadIdx.x, wgi = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31;
  const int g = lane >> 2, t = lane & 3;
  const int r0 = wgi * 64 + warp * 16 + g;
  uint32_t pa[BC / 16][4];
#pragma unroll
  for (int kk = 0; kk < BC / 16; ++kk) {
    const int c = 16 * kk + 2 * t;
    pa[kk][0] = pack2(p[r0 * BC + c], p[r0 * BC + c + 1]);
    pa[kk][1] = pack2(p[(r0 + 8) * BC + c], p[(r0 + 8) * BC + c + 1]);
    pa[kk][2] = pack2(p[r0 * BC + c + 8], p[r0 * BC + c + 9]);
    pa[kk][3] = pack2(p[(r0 + 8) * BC + c + 8], p[(r0 + 8) * BC + c + 9]);
  }
  float acc[D / 8][4];
#pragma unroll
  for (int n = 0; n < D / 8; ++n)
    acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;
  const uint64_t dv = wg::desc_mn_major(sV, BC * 128);
  wg::pin(pa);
  wg::pin(acc);
  wg::fence();
#pragma unroll
  for (int kk = 0; kk < BC / 16; ++kk)
    mma::rs(acc, pa[kk], dv + ((kk * 16 * 128) >> 4), 1);
  wg::commit();
  wg::wait<0>();
  wg::pin(acc);
#pragma unroll
  for (int n = 0; n < D / 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int row = r0 + 8 * (e >> 1), col = 8 * n + 2 * t + (e & 1);
      o[row * D + col] = acc[n][e];
    }
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

template <typename T>
static T *to_device(const std::vector<T> &h) {
  T *d;
  CK(cudaMalloc(&d, h.size() * sizeof(T)));
  CK(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}

static void report(const char *what, double err, long bad, long n) {
  const bool ok = bad == 0;
  if (!ok) failures++;
  printf("  %-4s %-44s %s (%ld of %ld wrong, max |err| %g)\n", ok ? "ok" : "FAIL", what,
         ok ? "exact" : "MISMATCH", bad, n, err);
}

template <typename T, int D, int BC>
static void test_ss(const char *name) {
  std::vector<T> q(128 * D), k(BC * D);
  for (auto &x : q)
    x = f2h<T>((float)rand_int(-3, 3));
  for (auto &x : k)
    x = f2h<T>((float)rand_int(-3, 3));
  T *dq = to_device(q), *dk = to_device(k);
  float *ds;
  CK(cudaMalloc(&ds, 128 * BC * sizeof(float)));
  CK(cudaMemset(ds, 0xff, 128 * BC * sizeof(float)));
  const size_t smem = (128 + BC) * D * 2 + 1024;
  CK(cudaFuncSetAttribute(k_ss<T, D, BC>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
  k_ss<T, D, BC><<<1, 256, smem>>>(dq, dk, ds);
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());
  std::vector<float> s(128 * BC);
  CK(cudaMemcpy(s.data(), ds, s.size() * 4, cudaMemcpyDeviceToHost));
  long bad = 0;
  double err = 0;
  for (int i = 0; i < 128; i++)
    for (int j = 0; j < BC; j++) {
      double want = 0;
      for (int c = 0; c < D; c++)
        want += (double)h2f(q[i * D + c]) * h2f(k[j * D + c]);
      const double e = fabs(s[i * BC + j] - want);
      if (!(e == 0)) {
        if (bad < 4) printf("       s[%d][%d] = %g, want %g\n", i, j, s[i * BC + j], want);
        bad++;
        err = e > err || isnan(e) ? e : err;
      }
    }
  report(name, err, bad, 128L * BC);
  CK(cudaFree(dq));
  CK(cudaFree(dk));
  CK(cudaFree(ds));
}

template <typename T, int D, int BC>
static void test_rs(const char *name) {
  std::vector<T> p(128 * BC), v(BC * D);
  for (auto &x : p)
    x = f2h<T>((float)rand_int(-3, 3));
  for (auto &x : v)
    x = f2h<T>((float)rand_int(-3, 3));
  T *dp = to_device(p), *dv = to_device(v);
  float *dout;
  CK(cudaMalloc(&dout, 128 * D * sizeof(float)));
  CK(cudaMemset(dout, 0xff, 128 * D * sizeof(float)));
  const size_t smem = BC * D * 2 + 1024;
  CK(cudaFuncSetAttribute(k_rs<T, D, BC>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
  k_rs<T, D, BC><<<1, 256, smem>>>(dp, dv, dout);
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());
  std::vector<float> o(128 * D);
  CK(cudaMemcpy(o.data(), dout, o.size() * 4, cudaMemcpyDeviceToHost));
  long bad = 0;
  double err = 0;
  for (int i = 0; i < 128; i++)
    for (int c = 0; c < D; c++) {
      double want = 0;
      for (int j = 0; j < BC; j++)
        want += (double)h2f(p[i * BC + j]) * h2f(v[j * D + c]);
      const double e = fabs(o[i * D + c] - want);
      if (!(e == 0)) {
        if (bad < 4) printf("       o[%d][%d] = %g, want %g\n", i, c, o[i * D + c], want);
        bad++;
        err = e > err || isnan(e) ? e : err;
      }
    }
  report(name, err, bad, 128L * D);
  CK(cudaFree(dp));
  CK(cudaFree(dv));
  CK(cudaFree(dout));
}

static PFN_cuTensorMapEncodeTiled_v12000 encode_fn() {
  void *f = nullptr;
  cudaDriverEntryPointQueryResult q;
  if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault,
                                       &q) != cudaSuccess ||
      q != cudaDriverEntryPointSuccess)
    return nullptr;
  return (PFN_cuTensorMapEncodeTiled_v12000)f;
}

/* x[B][N][H][D] (bshd, contiguous), the box at (row, head, batch). */
template <typename T>
static void test_tma(const char *name, int B, int N, int H, int D, int row, int head, int batch,
                     int box_rows) {
  std::vector<T> x((size_t)B * N * H * D);
  for (size_t i = 0; i < x.size(); i++)
    x[i] = f2h<T>((float)(int)(i % 251) - 125.f);
  T *dx = to_device(x), *dout;
  CK(cudaMalloc(&dout, (size_t)box_rows * D * sizeof(T)));
  CUtensorMap map;
  const cuuint64_t dim[4] = {(cuuint64_t)D, (cuuint64_t)N, (cuuint64_t)H, (cuuint64_t)B};
  const cuuint64_t strides[3] = {(cuuint64_t)H * D * 2, (cuuint64_t)D * 2,
                                 (cuuint64_t)N * H * D * 2};
  const cuuint32_t box[4] = {64, (cuuint32_t)box_rows, 1, 1}, es[4] = {1, 1, 1, 1};
  const PFN_cuTensorMapEncodeTiled_v12000 fn = encode_fn();
  const CUresult r =
      fn ? fn(&map,
              std::is_same<T, __nv_bfloat16>::value ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                                    : CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
              4, dx, dim, strides, box, es, CU_TENSOR_MAP_INTERLEAVE_NONE,
              CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
              CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE)
         : CUDA_ERROR_NOT_FOUND;
  if (r != CUDA_SUCCESS) {
    printf("  FAIL %-44s cuTensorMapEncodeTiled: error %d%s\n", name, (int)r,
           fn ? "" : " (no entry point)");
    failures++;
    return;
  }
  const size_t smem = (size_t)box_rows * D * 2 + 1024 + 64;
  CK(cudaFuncSetAttribute(k_tma<T>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
  k_tma<T><<<1, 128, smem>>>(map, D, row, head, batch, box_rows, dout);
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());
  std::vector<T> out((size_t)box_rows * D);
  CK(cudaMemcpy(out.data(), dout, out.size() * sizeof(T), cudaMemcpyDeviceToHost));
  long bad = 0;
  double err = 0;
  for (int i = 0; i < box_rows; i++)
    for (int c = 0; c < D; c++) {
      const int n = row + i;
      const float want =
          n < N ? h2f(x[(((size_t)batch * N + n) * H + head) * D + c]) : 0.f; /* past the end: 0 */
      const float got = h2f(out[(size_t)i * D + c]);
      if (got != want) {
        if (bad < 4) printf("       row %d col %d: %g, want %g\n", i, c, got, want);
        bad++;
        err = fabs(got - want) > err ? fabs(got - want) : err;
      }
    }
  report(name, err, bad, (long)box_rows * D);
  CK(cudaFree(dx));
  CK(cudaFree(dout));
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

static void run_problem(attn_context *ctx, const problem &pr) {
  const bool varlen = !pr.lq.empty();
  const int B = varlen ? (int)pr.lq.size() : pr.batch, D = pr.d;
  std::vector<int32_t> cq(B + 1, 0), ck(B + 1, 0);
  int nq_max = 0, nk_max = 0;
  if (varlen)
    for (int b = 0; b < B; b++) {
      cq[b + 1] = cq[b] + pr.lq[b];
      ck[b + 1] = ck[b] + pr.lk[b];
      nq_max = pr.lq[b] > nq_max ? pr.lq[b] : nq_max;
      nk_max = pr.lk[b] > nk_max ? pr.lk[b] : nk_max;
    }
  const int64_t rows_q = varlen ? cq[B] : (int64_t)B * pr.nq;
  const int64_t rows_k = varlen ? ck[B] : (int64_t)B * pr.nk;
  const size_t es = attn_dtype_size(pr.dt);
  /* Element storage: q, k, v each in its own array, or (layout 2) one fused
   * [B][N][3][H][D] array (nq = nk then). */
  const int64_t nq_all = rows_q * pr.hq * D, nk_all = rows_k * pr.hkv * D;
  std::vector<uint16_t> fused, qh, kh, vh;
  auto fill = [&](std::vector<uint16_t> &a, size_t n) {
    a.resize(n);
    for (auto &x : a) {
      const float f = rand_unit();
      if (pr.dt == ATTN_F16) {
        __half h = __float2half_rn(f);
        memcpy(&x, &h, 2);
      } else {
        __nv_bfloat16 h = __float2bfloat16_rn(f);
        memcpy(&x, &h, 2);
      }
    }
  };
  attn_tensor q, k, v;
  if (varlen) {
    fill(qh, nq_all);
    fill(kh, nk_all);
    fill(vh, nk_all);
    if (pr.nan_v_seq >= 0)
      for (int64_t i = (int64_t)ck[pr.nan_v_seq] * pr.hkv * D;
           i < (int64_t)ck[pr.nan_v_seq + 1] * pr.hkv * D; i++)
        vh[i] = pr.dt == ATTN_F16 ? 0x7e00 : 0x7fc0;
    q = attn_tensor_varlen(qh.data(), pr.dt, rows_q, pr.hq, D);
    k = attn_tensor_varlen(kh.data(), pr.dt, rows_k, pr.hkv, D);
    v = attn_tensor_varlen(vh.data(), pr.dt, rows_k, pr.hkv, D);
  } else if (pr.layout == 1) { /* bhsd */
    fill(qh, nq_all);
    fill(kh, nk_all);
    fill(vh, nk_all);
    q = strided(qh.data(), pr.dt, B, pr.nq, pr.hq, D, (int64_t)pr.hq * pr.nq * D, D,
                (int64_t)pr.nq * D);
    k = strided(kh.data(), pr.dt, B, pr.nk, pr.hkv, D, (int64_t)pr.hkv * pr.nk * D, D,
                (int64_t)pr.nk * D);
    v = strided(vh.data(), pr.dt, B, pr.nk, pr.hkv, D, (int64_t)pr.hkv * pr.nk * D, D,
                (int64_t)pr.nk * D);
  } else if (pr.layout == 2) { /* fused qkv [B][N][3][H][D], hq = hkv, nq = nk */
    fill(fused, (size_t)B * pr.nq * 3 * pr.hq * D);
    const int64_t ss = 3LL * pr.hq * D, sb = (int64_t)pr.nq * ss;
    q = strided(fused.data(), pr.dt, B, pr.nq, pr.hq, D, sb, ss, D);
    k = strided(fused.data() + (size_t)pr.hq * D, pr.dt, B, pr.nk, pr.hkv, D, sb, ss, D);
    v = strided(fused.data() + (size_t)2 * pr.hq * D, pr.dt, B, pr.nk, pr.hkv, D, sb, ss, D);
  } else {
    fill(qh, nq_all);
    fill(kh, nk_all);
    fill(vh, nk_all);
    q = attn_tensor_bshd(qh.data(), pr.dt, B, pr.nq, pr.hq, D);
    k = attn_tensor_bshd(kh.data(), pr.dt, B, pr.nk, pr.hkv, D);
    v = attn_tensor_bshd(vh.data(), pr.dt, B, pr.nk, pr.hkv, D);
  }
  std::vector<uint16_t> oh((size_t)nq_all, 0xffff); /* NaN: an element left unwritten shows */
  const int64_t nl = varlen ? (int64_t)pr.hq * rows_q : (int64_t)B * pr.hq * pr.nq;
  std::vector<float> lseh((size_t)nl, NAN);
  attn_tensor o = varlen ? attn_tensor_varlen(oh.data(), pr.dt, rows_q, pr.hq, D)
                         : attn_tensor_bshd(oh.data(), pr.dt, B, pr.nq, pr.hq, D);
  attn_tensor lse = varlen ? attn_tensor_lse(lseh.data(), 0, pr.hq, rows_q)
                           : attn_tensor_lse(lseh.data(), B, pr.hq, pr.nq);
  std::vector<float> slopes(pr.hq);
  for (int h = 0; h < pr.hq; h++)
    slopes[h] = powf(2.f, -8.f * (h + 1) / pr.hq);
  attn_params p;
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
  int rc = attn_forward(ctx, &p, &q, &k, &v, &o, &lse);
  if (rc) {
    printf("  FAIL %-44s attn_forward: %s: %s\n", pr.name, attn_status_name(rc), attn_errmsg(ctx));
    failures++;
    return;
  }
  std::vector<double> oref((size_t)nq_all), lref((size_t)nl);
  rc = at_ref_forward(ctx, &p, &q, &k, &v, oref.data(), lref.data());
  if (rc) {
    printf("  FAIL %-44s reference: %s\n", pr.name, attn_errmsg(ctx));
    failures++;
    return;
  }
  /* The golden rule without a peer figure; NaN must meet NaN, -inf -inf. */
  double eo = 0, mo = 0, el = 0, ml = 0;
  long nan_bad = 0, nans = 0;
  for (int64_t i = 0; i < nq_all; i++) {
    const double got = attn__load(oh.data(), pr.dt, i), want = oref[i];
    if (isnan(want) || isnan(got)) {
      nans += isnan(want);
      nan_bad += isnan(want) != isnan(got);
      continue;
    }
    eo = fmax(eo, fabs(got - want));
    mo = fmax(mo, fabs(want));
  }
  for (int64_t i = 0; i < nl; i++) {
    const double got = lseh[i], want = lref[i];
    if (isnan(want) || isnan(got)) {
      nan_bad += isnan(want) != isnan(got);
      continue;
    }
    if (isinf(want) || isinf(got)) {
      if (got != want) el = INFINITY;
      continue;
    }
    el = fmax(el, fabs(got - want));
    ml = fmax(ml, fabs(want));
  }
  const double bo = at_golden_bound("o", pr.dt, NAN, mo),
               bl = at_golden_bound("lse", pr.dt, NAN, ml);
  const bool ok = eo <= bo && el <= bl && nan_bad == 0;
  if (!ok) failures++;
  printf("  %-4s %-44s o %.3g (bound %.3g), lse %.3g (bound %.3g)%s", ok ? "ok" : "FAIL", pr.name,
         eo, bo, el, bl, nan_bad ? ", NaN where the reference has none or the reverse" : "");
  if (nans) printf(", %ld NaN as the reference", nans);
  printf("\n");
}

int main() {
  int dev = 0;
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, dev));
  printf("device: %s, compute capability %d.%d\n", prop.name, prop.major, prop.minor);
  if (prop.major != 9) {
    printf("not a Hopper GPU: part 1 needs sm_90a\n");
    return 2;
  }

  printf("part 1: wgmma.cuh's building blocks\n");
  test_ss<__half, 128, 128>("ss f16 d=128 Bc=128 (K-major, 2 col blocks)");
  test_ss<__nv_bfloat16, 128, 128>("ss bf16 d=128 Bc=128");
  test_ss<__half, 64, 128>("ss f16 d=64 Bc=128");
  test_ss<__nv_bfloat16, 256, 64>("ss bf16 d=256 Bc=64 (4 col blocks)");
  test_rs<__half, 128, 128>("rs f16 d=128 Bc=128 (V MN-major)");
  test_rs<__nv_bfloat16, 128, 128>("rs bf16 d=128 Bc=128");
  test_rs<__half, 64, 128>("rs f16 d=64 Bc=128");
  test_rs<__nv_bfloat16, 256, 64>("rs bf16 d=256 Bc=64");
  test_tma<__half>("tma f16 d=128, 128 rows from 200 of 300", 1, 300, 1, 128, 200, 0, 0, 128);
  test_tma<__nv_bfloat16>("tma bf16 d=64 bshd [2][300][3], (100, h2, b1)", 2, 300, 3, 64, 100, 2, 1,
                          128);
  test_tma<__half>("tma f16 d=256 bshd [2][150][2], 64 rows at 120", 2, 150, 2, 256, 120, 1, 1, 64);
  const int part1 = failures;

  printf("part 2: the library's cuda backend against the float64 reference\n");
  attn_context *ctx = nullptr;
  int rc = attn_context_create("cuda", &ctx);
  if (rc) {
    printf("  FAIL cannot open the cuda backend: %s\n", attn_status_name(rc));
    return 1;
  }
  std::vector<problem> ps = {
      {"varlen f16 d=128 causal GQA 4/2",
       ATTN_F16,
       128,
       4,
       2,
       true,
       -1,
       -1,
       0,
       false,
       {1, 130, 257, 0, 300},
       {1, 130, 257, 0, 300},
       0,
       0,
       0,
       0,
       -1},
      {"varlen bf16 d=64 MQA 2/1, nq != nk",
       ATTN_BF16,
       64,
       2,
       1,
       false,
       -1,
       -1,
       0,
       false,
       {200, 77, 512},
       {300, 77, 129},
       0,
       0,
       0,
       0,
       -1},
      {"varlen bf16 d=256 causal",
       ATTN_BF16,
       256,
       2,
       2,
       true,
       -1,
       -1,
       0,
       false,
       {129, 255, 64},
       {129, 255, 64},
       0,
       0,
       0,
       0,
       -1},
      {"varlen f16 d=128, NaN v in sequence 1",
       ATTN_F16,
       128,
       2,
       2,
       false,
       -1,
       -1,
       0,
       false,
       {100, 150, 90},
       {100, 150, 90},
       0,
       0,
       0,
       0,
       1},
      {"varlen bf16 d=64 window 50,20 softcap alibi",
       ATTN_BF16,
       64,
       4,
       4,
       false,
       50,
       20,
       30.f,
       true,
       {333, 64, 200},
       {400, 64, 250},
       0,
       0,
       0,
       0,
       -1},
      {"bhsd f16 d=128 causal window 100 softcap alibi",
       ATTN_F16,
       128,
       2,
       2,
       true,
       100,
       -1,
       30.f,
       true,
       {},
       {},
       2,
       300,
       300,
       1,
       -1},
      {"fused qkv bf16 d=64 window 64,32",
       ATTN_BF16,
       64,
       3,
       3,
       false,
       64,
       32,
       0,
       false,
       {},
       {},
       2,
       257,
       257,
       2,
       -1},
      {"bshd f16 d=256 causal 130 x 700 MQA 4/1",
       ATTN_F16,
       256,
       4,
       1,
       true,
       -1,
       -1,
       0,
       false,
       {},
       {},
       1,
       130,
       700,
       0,
       -1},
      {"bshd bf16 d=64 causal 300 x 100 (rows see none)",
       ATTN_BF16,
       64,
       2,
       2,
       true,
       -1,
       -1,
       0,
       false,
       {},
       {},
       2,
       300,
       100,
       0,
       -1},
      {"varlen f16 d=96 causal GQA 6/2",
       ATTN_F16,
       96,
       6,
       2,
       true,
       -1,
       -1,
       0,
       false,
       {250, 3, 129},
       {250, 3, 129},
       0,
       0,
       0,
       0,
       -1},
      {"bshd bf16 d=96 300 x 450, NaN-free padding",
       ATTN_BF16,
       96,
       2,
       2,
       false,
       -1,
       -1,
       0,
       false,
       {},
       {},
       2,
       300,
       450,
       0,
       -1},
      {"bshd f16 d=64 1 x 1000 (decode-sized)",
       ATTN_F16,
       64,
       8,
       8,
       false,
       -1,
       -1,
       0,
       false,
       {},
       {},
       1,
       1,
       1000,
       0,
       -1},
  };
  for (const problem &pr : ps)
    run_problem(ctx, pr);
  attn_context_free(ctx);

  printf("hopper_check: part 1 %s, part 2 %s\n", part1 ? "FAILED" : "ok",
         failures > part1 ? "FAILED" : "ok");
  return failures ? 1 : 0;
}
