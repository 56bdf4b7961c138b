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
#define CHECK_NAME_WIDTH 44
#include "hopper_check.cuh"

/* ---------------------------------------------------------------------- */
/* Part 1: the building blocks                                             */
/* ---------------------------------------------------------------------- */

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
  tally tl;
  for (int i = 0; i < 128; i++)
    for (int j = 0; j < BC; j++) {
      double want = 0;
      for (int c = 0; c < D; c++)
        want += (double)h2f(q[i * D + c]) * h2f(k[j * D + c]);
      tl.add("s", i, j, s[i * BC + j], want);
    }
  report(name, tl);
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
  tally tl;
  for (int i = 0; i < 128; i++)
    for (int c = 0; c < D; c++) {
      double want = 0;
      for (int j = 0; j < BC; j++)
        want += (double)h2f(p[i * BC + j]) * h2f(v[j * D + c]);
      tl.add("o", i, c, o[i * D + c], want);
    }
  report(name, tl);
  CK(cudaFree(dp));
  CK(cudaFree(dv));
  CK(cudaFree(dout));
}

/* x[B][N][H][D] (bshd, contiguous), the box at (row, head, batch). */
template <typename T>
static void test_tma(const char *name, int B, int N, int H, int D, int row, int head, int batch,
                     int box_rows) {
  std::vector<T> x((size_t)B * N * H * D);
  for (size_t i = 0; i < x.size(); i++)
    x[i] = f2h<T>((float)(int)(i % 251) - 125.f);
  T *dx = to_device(x);
  CUtensorMap map;
  const cuuint64_t dim[4] = {(cuuint64_t)D, (cuuint64_t)N, (cuuint64_t)H, (cuuint64_t)B};
  const cuuint64_t strides[3] = {(cuuint64_t)H * D * 2, (cuuint64_t)D * 2,
                                 (cuuint64_t)N * H * D * 2};
  const cuuint32_t box[4] = {64, (cuuint32_t)box_rows, 1, 1}, es[4] = {1, 1, 1, 1};
  const PFN_cuTensorMapEncodeTiled_v12000 fn = wg::encode_tiled();
  const CUresult r =
      fn ? fn(&map,
              std::is_same<T, __nv_bfloat16>::value ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                                    : CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
              4, dx, dim, strides, box, es, CU_TENSOR_MAP_INTERLEAVE_NONE,
              CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
              CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE)
         : CUDA_ERROR_NOT_FOUND;
  if (r != CUDA_SUCCESS) {
    printf("  FAIL %-*s cuTensorMapEncodeTiled: error %d%s\n", CHECK_NAME_WIDTH, name, (int)r,
           fn ? "" : " (no entry point)");
    failures++;
    return;
  }
  const std::vector<T> out = read_box<T>(map, D, row, head, batch, box_rows);
  tally tl;
  tl.n = (long)box_rows * D;
  for (int i = 0; i < box_rows; i++)
    for (int c = 0; c < D; c++) {
      const int n = row + i;
      const float want =
          n < N ? h2f(x[(((size_t)batch * N + n) * H + head) * D + c]) : 0.f; /* past the end: 0 */
      const float got = h2f(out[(size_t)i * D + c]);
      if (got != want) {
        if (tl.bad < 4) printf("       row %d col %d: %g, want %g\n", i, c, got, want);
        tl.bad++;
        tl.err = fabs(got - want) > tl.err ? fabs(got - want) : tl.err;
      }
    }
  report(name, tl);
  CK(cudaFree(dx));
}

/* ---------------------------------------------------------------------- */
/* Part 2: the library against the reference                                */
/* ---------------------------------------------------------------------- */

static void run_problem(attn_context *ctx, const problem &pr) {
  inputs in(pr);
  if (!forward(ctx, in)) return;
  std::vector<double> oref((size_t)in.nq_all), lref((size_t)in.nl);
  const int rc = at_ref_forward(ctx, &in.p, &in.q, &in.k, &in.v, oref.data(), lref.data());
  if (rc) {
    printf("  FAIL %-*s reference: %s\n", CHECK_NAME_WIDTH, pr.name, attn_errmsg(ctx));
    failures++;
    return;
  }
  /* The golden rule without a peer figure; NaN must meet NaN, -inf -inf. */
  const cmp o = compare(in.oh, pr.dt, oref);
  double el = 0, ml = 0;
  long nan_bad = o.nan_bad;
  for (int64_t i = 0; i < in.nl; i++) {
    const double got = in.lseh[i], want = lref[i];
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
  const double bo = at_golden_bound("o", pr.dt, NAN, o.maxref),
               bl = at_golden_bound("lse", pr.dt, NAN, ml);
  const bool ok = o.err <= bo && el <= bl && nan_bad == 0;
  if (!ok) failures++;
  printf("  %-4s %-*s o %.3g (bound %.3g), lse %.3g (bound %.3g)%s", ok ? "ok" : "FAIL",
         CHECK_NAME_WIDTH, pr.name, o.err, bo, el, bl,
         nan_bad ? ", NaN where the reference has none or the reverse" : "");
  if (o.nans) printf(", %ld NaN as the reference", o.nans);
  printf("\n");
}

int main() {
  if (!on_hopper()) return 2;

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
  attn_context *ctx = open_cuda();
  if (!ctx) return 1;
  /* clang-format off */
  std::vector<problem> ps = {
      {"varlen f16 d=128 causal GQA 4/2", ATTN_F16, 128, 4, 2, true, -1, -1, 0, false,
       {1, 130, 257, 0, 300}, {1, 130, 257, 0, 300}, 0, 0, 0, 0, -1},
      {"varlen bf16 d=64 MQA 2/1, nq != nk", ATTN_BF16, 64, 2, 1, false, -1, -1, 0, false,
       {200, 77, 512}, {300, 77, 129}, 0, 0, 0, 0, -1},
      {"varlen bf16 d=256 causal", ATTN_BF16, 256, 2, 2, true, -1, -1, 0, false, {129, 255, 64},
       {129, 255, 64}, 0, 0, 0, 0, -1},
      {"varlen f16 d=128, NaN v in sequence 1", ATTN_F16, 128, 2, 2, false, -1, -1, 0, false,
       {100, 150, 90}, {100, 150, 90}, 0, 0, 0, 0, 1},
      {"varlen bf16 d=64 window 50,20 softcap alibi", ATTN_BF16, 64, 4, 4, false, 50, 20, 30.f,
       true, {333, 64, 200}, {400, 64, 250}, 0, 0, 0, 0, -1},
      {"bhsd f16 d=128 causal window 100 softcap alibi", ATTN_F16, 128, 2, 2, true, 100, -1, 30.f,
       true, {}, {}, 2, 300, 300, 1, -1},
      {"fused qkv bf16 d=64 window 64,32", ATTN_BF16, 64, 3, 3, false, 64, 32, 0, false, {}, {}, 2,
       257, 257, 2, -1},
      {"bshd f16 d=256 causal 130 x 700 MQA 4/1", ATTN_F16, 256, 4, 1, true, -1, -1, 0, false, {},
       {}, 1, 130, 700, 0, -1},
      {"bshd bf16 d=64 causal 300 x 100 (rows see none)", ATTN_BF16, 64, 2, 2, true, -1, -1, 0,
       false, {}, {}, 2, 300, 100, 0, -1},
      {"varlen f16 d=96 causal GQA 6/2", ATTN_F16, 96, 6, 2, true, -1, -1, 0, false, {250, 3, 129},
       {250, 3, 129}, 0, 0, 0, 0, -1},
      {"bshd bf16 d=96 300 x 450, NaN-free padding", ATTN_BF16, 96, 2, 2, false, -1, -1, 0, false,
       {}, {}, 2, 300, 450, 0, -1},
      {"bshd f16 d=64 1 x 1000 (decode-sized)", ATTN_F16, 64, 8, 8, false, -1, -1, 0, false, {}, {},
       1, 1, 1000, 0, -1},
  };
  /* clang-format on */
  for (const problem &pr : ps)
    run_problem(ctx, pr);
  attn_context_free(ctx);

  return finish("hopper_check", part1);
}
