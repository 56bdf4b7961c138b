/*
 * hopper_bwd_check: the first things to look at when the Hopper backward
 * (cuda/hopper_bwd.cu) runs on an H200. Not part of the library.
 *
 * Part 1 tests the kernel's wgmma pieces on their own, with small integers
 * (exact in f16, bf16 and f32) against the CPU, in the kernel's order and
 * with its descriptors (cuda/wgmma.cuh), for one block of 128 keys (two
 * warpgroups of 64) and Br = 64 or 128 query rows:
 *   st    S^T = K Q^T: A = the warpgroup's 64 rows of K, B = Q (Br rows),
 *         both K-major;
 *   dv    dV = P^T dO: S^T's accumulators packed as the A fragments (the
 *         transposed layout: keys as M, queries as the reduction), dO
 *         through the MN-major descriptor of a Br-row tile;
 *   stash the same fragments written by stmatrix into the swizzled dS^T
 *         tile [128 keys][Br queries], read back element by element;
 *   dq    dQ = dS K from that tile as an MN-major A (ss_mn), K as an
 *         MN-major B, each warpgroup 64 rows by 64 columns: at d = 128 half
 *         the columns over all 128 keys, at d = 64 with Br = 128 half the
 *         rows over all keys (both after a barrier of both warpgroups), at
 *         d = 64 with Br = 64 all of it over the warpgroup's own keys;
 *   tma   a 64-row box through wgmma.cuh's encode_rows (bhsd strides, rows
 *         past the end).
 * If part 1 fails, the kernel cannot work: the line says which piece.
 *
 * Part 2 runs attn_backward (cuda backend) against the test kit's float64
 * reference (at_ref_backward) on varlen with GQA, a NaN in the next
 * sequence's V rows, strided layouts (bhsd, fused qkv), windows, softcap,
 * ALiBi, rows that see no key, d = 96 (tiles of 128 columns, half padding). Each problem runs
 * twice: as asked (the Hopper rows at d = 64 and 128) and deterministic (which the plan gives the
 * tensor-core backward): the second is the peer figure of the golden rule,
 * err <= 3 peer + 1e-6 max|ref| (testkit's at_golden_bound). ATTN_DEBUG=1
 * shows the row each call ran.
 *
 * Build (hopper_bwd_check.sh does): nvcc -std=c++17 -O2
 *   -gencode=arch=compute_90a,code=sm_90a -Iinclude -Isrc -Icuda -Itestkit
 *   bench/hopper_bwd_check.cu BUILD/testkit/libattn_testkit.a BUILD/libattn.a
 *   $(pkg-config --libs openblas) -Xcompiler -fopenmp -ldl
 * Exit status: 0 when every check passed.
 */
#include "hopper_check.cuh"

/* ---------------------------------------------------------------------- */
/* Part 1: the building blocks                                             */
/* ---------------------------------------------------------------------- */

template <typename T>
__device__ uint32_t pack2(float lo, float hi) {
  T a = std::is_same<T, __half>::value ? (T)__float2half_rn(lo) : (T)__float2bfloat16_rn(lo);
  T b = std::is_same<T, __half>::value ? (T)__float2half_rn(hi) : (T)__float2bfloat16_rn(hi);
  return (uint32_t) * reinterpret_cast<unsigned short *>(&a) |
         (uint32_t) * reinterpret_cast<unsigned short *>(&b) << 16;
}

/* hopper_bwd.cu's dQ split for (D, BR): each warpgroup's product is rows
 * [row0, + 64) by columns [col0, + 64) over keys [key0, + keys). */
struct dq_part {
  int row0, col0, key0, keys;
};
__host__ __device__ dq_part dq_part_of(int D, int BR, int c) {
  if (BR == 128) return {c * 64, 0, 0, 128}; /* rows */
  if (D == 64) return {0, 0, c * 64, 64};    /* keys */
  return {0, c * 64, 0, 128};                /* columns */
}

/* S^T = K Q^T, the kernel's first product: warpgroup c's 64 rows of the
 * 128-row K tile by the BR rows of the Q tile, both K-major. */
template <typename T, int D, int BR>
__device__ __forceinline__ void scores_t(float (&s)[BR / 8][4], uint32_t sK, uint32_t sQ, int c) {
  using mma = wg::mma<std::is_same<T, __nv_bfloat16>::value>;
  constexpr int kBc = 128;
  const uint64_t a_k = wg::desc_k_major(sK + c * 64 * 128), b_q = wg::desc_k_major(sQ);
  wg::pin(s);
  wg::fence();
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk)
    mma::ss(s, a_k + wg::kstep_k_major(kBc, kk), b_q + wg::kstep_k_major(BR, kk), kk > 0);
  wg::commit();
  wg::wait<0>();
  wg::pin(s);
}

/* S^T's accumulators as the A fragments, as the kernel packs P^T and dS^T. */
template <typename T, int KB>
__device__ __forceinline__ void pack_a(uint32_t (&pa)[KB][4], const float (&s)[2 * KB][4]) {
#pragma unroll
  for (int kk = 0; kk < KB; ++kk) {
    pa[kk][0] = pack2<T>(s[2 * kk][0], s[2 * kk][1]);
    pa[kk][1] = pack2<T>(s[2 * kk][2], s[2 * kk][3]);
    pa[kk][2] = pack2<T>(s[2 * kk + 1][0], s[2 * kk + 1][1]);
    pa[kk][3] = pack2<T>(s[2 * kk + 1][2], s[2 * kk + 1][3]);
  }
}

/* hopper_bwd.cu's consumer steps for one key block and one query block:
 * k[128][D], q[BR][D], o (dO)[BR][D] in, st[128][BR] = S^T, dv[128][D] =
 * S^T dO, ds[128][BR] = the stashed tile read back, dq[2][64][64] = each
 * warpgroup's dQ product (dq_part_of). */
template <typename T, int D, int BR>
__global__ void __launch_bounds__(256)
    k_chain(const T *k, const T *q, const T *o, float *st, float *dv, float *ds, float *dq) {
  using mma = wg::mma<std::is_same<T, __nv_bfloat16>::value>;
  constexpr int kBc = 128, NO = D / 8, NS = BR / 8, KB = BR / 16;
  extern __shared__ __align__(1024) unsigned char sm[];
  const uint32_t sK = (smem_u32(sm) + 1023u) & ~1023u, sQ = sK + kBc * D * 2;
  const uint32_t sdO = sQ + BR * D * 2, sdS = sdO + BR * D * 2;
  for (int i = threadIdx.x; i < kBc * D; i += 256)
    put(sK, kBc, i / D, i % D, k[i]);
  for (int i = threadIdx.x; i < BR * D; i += 256) {
    put(sQ, BR, i / D, i % D, q[i]);
    put(sdO, BR, i / D, i % D, o[i]);
  }
  wg::fence_proxy_async();
  __syncthreads();
  const int tid = threadIdx.x, c = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31;
  const int g = lane >> 2, t = lane & 3;

  /* S^T = K Q^T */
  float s[NS][4];
  scores_t<T, D, BR>(s, sK, sQ, c);
  const int row = c * 64 + warp * 16 + g;
#pragma unroll
  for (int n = 0; n < NS; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      st[(row + 8 * (e >> 1)) * BR + 8 * n + 2 * t + (e & 1)] = s[n][e];

  uint32_t pa[KB][4];
  pack_a<T>(pa, s);

  /* dV = P^T dO */
  float acc[NO][4];
  wg::pin(pa);
  wg::pin(acc);
  wg::fence();
  {
    const uint64_t b_do = wg::desc_mn_major(sdO, BR * 128);
#pragma unroll
    for (int kk = 0; kk < KB; ++kk)
      mma::rs(acc, pa[kk], b_do + wg::kstep_mn_major(kk), kk > 0);
  }
  wg::commit();
  wg::wait<0>();
  wg::pin(acc);
#pragma unroll
  for (int n = 0; n < NO; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      dv[(row + 8 * (e >> 1)) * D + 8 * n + 2 * t + (e & 1)] = acc[n][e];

  /* The stash and dQ = dS K */
  wg::stash<KB>(sdS, kBc, c * 64, pa);
  wg::fence_proxy_async();
  const dq_part part = dq_part_of(D, BR, c);
  if (part.keys == 64)
    wg::named_sync(2 + c, 128);
  else
    wg::named_sync(1, 256);
  float d8[8][4];
  wg::pin(d8);
  wg::fence();
  {
    const uint64_t a_ds =
        wg::desc_mn_major(sdS + (part.row0 / 64) * kBc * 128 + part.key0 * 128, kBc * 128);
    const uint64_t b_dq =
        wg::desc_mn_major(sK + (part.col0 / 64) * kBc * 128 + part.key0 * 128, kBc * 128);
    for (int kk = 0; kk < part.keys / 16; ++kk)
      mma::ss_mn(d8, a_ds + wg::kstep_mn_major(kk), b_dq + wg::kstep_mn_major(kk), kk > 0);
  }
  wg::commit();
  wg::wait<0>();
  wg::pin(d8);
#pragma unroll
  for (int n = 0; n < 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      dq[(c * 64 + warp * 16 + g + 8 * (e >> 1)) * 64 + 8 * n + 2 * t + (e & 1)] = d8[n][e];
  __syncthreads();
  for (int i = tid; i < kBc * BR; i += 256)
    ds[i] = h2f(get<T>(sdS, kBc, i / BR, i % BR));
}

template <typename T, int D, int BR>
static void test_chain(const char *tag) {
  constexpr int kBc = 128;
  std::vector<T> k(kBc * D), q(BR * D), o(BR * D);
  /* {-1, 0, 1}: S^T within +-128, exact in 16 bits; the products' sums
   * within 2^14, exact in f32. */
  for (auto &x : k)
    x = f2h<T>((float)rand_int(-1, 1));
  for (auto &x : q)
    x = f2h<T>((float)rand_int(-1, 1));
  for (auto &x : o)
    x = f2h<T>((float)rand_int(-1, 1));
  T *dk = to_device(k), *dq_in = to_device(q), *d_o = to_device(o);
  float *dst, *ddv, *dds, *ddq;
  CK(cudaMalloc(&dst, kBc * BR * 4));
  CK(cudaMalloc(&ddv, kBc * D * 4));
  CK(cudaMalloc(&dds, kBc * BR * 4));
  CK(cudaMalloc(&ddq, 2 * 64 * 64 * 4));
  CK(cudaMemset(dst, 0xff, kBc * BR * 4));
  CK(cudaMemset(ddv, 0xff, kBc * D * 4));
  CK(cudaMemset(dds, 0xff, kBc * BR * 4));
  CK(cudaMemset(ddq, 0xff, 2 * 64 * 64 * 4));
  const size_t smem = (size_t)(kBc + 2 * BR) * D * 2 + kBc * BR * 2 + 1024;
  CK(cudaFuncSetAttribute(k_chain<T, D, BR>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                          (int)smem));
  k_chain<T, D, BR><<<1, 256, smem>>>(dk, dq_in, d_o, dst, ddv, dds, ddq);
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());
  std::vector<float> st(kBc * BR), dv(kBc * D), ds(kBc * BR), dq(2 * 64 * 64);
  CK(cudaMemcpy(st.data(), dst, st.size() * 4, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(dv.data(), ddv, dv.size() * 4, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(ds.data(), dds, ds.size() * 4, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(dq.data(), ddq, dq.size() * 4, cudaMemcpyDeviceToHost));
  std::vector<double> ref(kBc * BR);
  for (int j = 0; j < kBc; j++)
    for (int i = 0; i < BR; i++) {
      double a = 0;
      for (int x = 0; x < D; x++)
        a += (double)h2f(k[j * D + x]) * h2f(q[i * D + x]);
      ref[j * BR + i] = a;
    }
  char name[96];
  tally t1, t2, t3, t4;
  for (int j = 0; j < kBc; j++)
    for (int i = 0; i < BR; i++)
      t1.add("st", j, i, st[j * BR + i], ref[j * BR + i]);
  snprintf(name, sizeof name, "st    %s S^T = K Q^T (K-major A and B)", tag);
  report(name, t1);
  for (int j = 0; j < kBc; j++)
    for (int x = 0; x < D; x++) {
      double a = 0;
      for (int i = 0; i < BR; i++)
        a += ref[j * BR + i] * h2f(o[i * D + x]);
      t2.add("dv", j, x, dv[j * D + x], a);
    }
  snprintf(name, sizeof name, "dv    %s P^T dO (A from S^T's registers)", tag);
  report(name, t2);
  for (int j = 0; j < kBc; j++)
    for (int i = 0; i < BR; i++)
      t3.add("ds", j, i, ds[j * BR + i], ref[j * BR + i]);
  snprintf(name, sizeof name, "stash %s stmatrix into the dS^T tile", tag);
  report(name, t3);
  for (int c = 0; c < 2; c++) {
    const dq_part part = dq_part_of(D, BR, c);
    for (int i = 0; i < 64; i++)
      for (int x = 0; x < 64; x++) {
        double a = 0;
        for (int j = part.key0; j < part.key0 + part.keys; j++)
          a += ref[j * BR + part.row0 + i] * h2f(k[j * D + part.col0 + x]);
        t4.add(c ? "dq1" : "dq0", i, x, dq[(c * 64 + i) * 64 + x], a);
      }
  }
  snprintf(name, sizeof name, "dq    %s dS K (both MN-major, %s split)", tag,
           BR == 128 ? "rows"
           : D == 64 ? "keys"
                     : "columns");
  report(name, t4);
  CK(cudaFree(dk));
  CK(cudaFree(dq_in));
  CK(cudaFree(d_o));
  CK(cudaFree(dst));
  CK(cudaFree(ddv));
  CK(cudaFree(dds));
  CK(cudaFree(ddq));
}

/* Not used by the kernel yet: at d = 64, dQ's columns split between the
 * warpgroups (32 each over all 128 keys, as at d = 128) would halve the
 * atomics of the keys split, if an MN-major B may start half-way through a
 * swizzle row (K's columns 32 ..). m64n32k16 with both operands MN-major. */
template <bool BF16>
__device__ void ss_mn32(float (&d)[4][4], uint64_t a, uint64_t b, int scale_d) {
#define ATTN_ACC16 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}"
#define ATTN_OUT16                                                                              \
  "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]),     \
      "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), \
      "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3])
  if (BF16)
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 " ATTN_ACC16
        ", %16, %17, p, 1, 1, 1, 1;\n}\n"
        : ATTN_OUT16
        : "l"(a), "l"(b), "r"(scale_d));
  else
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 " ATTN_ACC16
        ", %16, %17, p, 1, 1, 1, 1;\n}\n"
        : ATTN_OUT16
        : "l"(a), "l"(b), "r"(scale_d));
#undef ATTN_ACC16
#undef ATTN_OUT16
}

/* dq[2][64][32]: warpgroup c's dS K over all 128 keys, columns 32 c .. of a
 * d = 64 K tile; S^T from k and q as in k_chain. */
template <typename T>
__global__ void __launch_bounds__(256) k_dq32(const T *k, const T *q, float *dq) {
  constexpr int D = 64, kBc = 128, kBr = 64, KB = kBr / 16;
  extern __shared__ __align__(1024) unsigned char sm[];
  const uint32_t sK = (smem_u32(sm) + 1023u) & ~1023u, sQ = sK + kBc * D * 2;
  const uint32_t sdS = sQ + kBr * D * 2;
  for (int i = threadIdx.x; i < kBc * D; i += 256)
    put(sK, kBc, i / D, i % D, k[i]);
  for (int i = threadIdx.x; i < kBr * D; i += 256)
    put(sQ, kBr, i / D, i % D, q[i]);
  wg::fence_proxy_async();
  __syncthreads();
  const int tid = threadIdx.x, c = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31;
  const int g = lane >> 2, t = lane & 3;
  float s[8][4];
  scores_t<T, D, kBr>(s, sK, sQ, c);
  uint32_t pa[KB][4];
  pack_a<T>(pa, s);
  wg::stash<KB>(sdS, kBc, c * 64, pa);
  wg::fence_proxy_async();
  wg::named_sync(1, 256);
  float d4[4][4];
  wg::pin(d4);
  wg::fence();
  const uint64_t a_ds = wg::desc_mn_major(sdS, kBc * 128);
  const uint64_t b_k = wg::desc_mn_major(sK + c * 64, kBc * 128); /* columns 32 c: 64 c bytes */
#pragma unroll
  for (int kk = 0; kk < kBc / 16; ++kk)
    ss_mn32<std::is_same<T, __nv_bfloat16>::value>(d4, a_ds + wg::kstep_mn_major(kk),
                                                   b_k + wg::kstep_mn_major(kk), kk > 0);
  wg::commit();
  wg::wait<0>();
  wg::pin(d4);
#pragma unroll
  for (int n = 0; n < 4; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      dq[(c * 64 + warp * 16 + g + 8 * (e >> 1)) * 32 + 8 * n + 2 * t + (e & 1)] = d4[n][e];
}

template <typename T>
static void test_dq32(const char *name) {
  constexpr int D = 64, kBc = 128, kBr = 64;
  std::vector<T> k(kBc * D), q(kBr * D);
  for (auto &x : k)
    x = f2h<T>((float)rand_int(-1, 1));
  for (auto &x : q)
    x = f2h<T>((float)rand_int(-1, 1));
  T *dk = to_device(k), *dq_in = to_device(q);
  float *ddq;
  CK(cudaMalloc(&ddq, 2 * kBr * 32 * 4));
  CK(cudaMemset(ddq, 0xff, 2 * kBr * 32 * 4));
  const size_t smem = (size_t)(kBc + kBr) * D * 2 + kBc * kBr * 2 + 1024;
  CK(cudaFuncSetAttribute(k_dq32<T>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
  k_dq32<T><<<1, 256, smem>>>(dk, dq_in, ddq);
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());
  std::vector<float> dq(2 * kBr * 32);
  CK(cudaMemcpy(dq.data(), ddq, dq.size() * 4, cudaMemcpyDeviceToHost));
  tally tl;
  for (int c = 0; c < 2; c++)
    for (int i = 0; i < kBr; i++)
      for (int x = 0; x < 32; x++) {
        double a = 0;
        for (int j = 0; j < kBc; j++) {
          double st = 0;
          for (int y = 0; y < D; y++)
            st += (double)h2f(k[j * D + y]) * h2f(q[i * D + y]);
          a += st * h2f(k[j * D + 32 * c + x]);
        }
        tl.add(c ? "dq1" : "dq0", i, x, dq[(c * kBr + i) * 32 + x], a);
      }
  /* Informative: the kernel does not depend on it (a failure is not counted). */
  printf("  %-4s %-48s %s (%ld of %ld wrong, max |err| %g)\n", tl.bad ? "info" : "ok", name,
         tl.bad ? "MISMATCH: keep the keys split at d = 64" : "exact", tl.bad, tl.n, tl.err);
  CK(cudaFree(dk));
  CK(cudaFree(dq_in));
  CK(cudaFree(ddq));
}

/* x[B][H][N][D] (bhsd), the box of 64 rows at (row, head, batch) through
 * encode_rows, as the launcher encodes q and dout. */
template <typename T>
static void test_tma(const char *name, int B, int N, int H, int D, int row, int head, int batch) {
  const int box_rows = 64;
  std::vector<T> x((size_t)B * H * N * D);
  for (size_t i = 0; i < x.size(); i++)
    x[i] = f2h<T>((float)(int)(i % 251) - 125.f);
  T *dx = to_device(x);
  CUtensorMap map;
  if (!wg::encode_rows(&map, dx, std::is_same<T, __nv_bfloat16>::value, D, N, H, B, D,
                       (int64_t)N * D, (int64_t)H * N * D, box_rows)) {
    printf("  FAIL %-*s encode_rows failed\n", CHECK_NAME_WIDTH, name);
    failures++;
    return;
  }
  const std::vector<T> out = read_box<T>(map, D, row, head, batch, box_rows);
  tally tl;
  for (int i = 0; i < box_rows; i++)
    for (int c = 0; c < D; c++) {
      const int n = row + i;
      const float want = n < N ? h2f(x[(((size_t)batch * H + head) * N + n) * D + c]) : 0.f;
      tl.add("box", i, c, h2f(out[(size_t)i * D + c]), want);
    }
  report(name, tl);
  CK(cudaFree(dx));
}

/* ---------------------------------------------------------------------- */
/* Part 2: the library against the reference                                */
/* ---------------------------------------------------------------------- */

static void run_problem(attn_context *ctx, const problem &pr) {
  inputs in(pr);
  std::vector<uint16_t> doh;
  fill(doh, in.nq_all, pr.dt);
  const attn_tensor dout = in.like_q(doh.data());
  if (!forward(ctx, in)) return;
  /* NaN (0xffff) where a kernel leaves an element unwritten. */
  std::vector<uint16_t> g[2][3];
  for (int run = 0; run < 2; run++) {
    g[run][0].assign((size_t)in.nq_all, 0xffff);
    g[run][1].assign((size_t)in.nk_all, 0xffff);
    g[run][2].assign((size_t)in.nk_all, 0xffff);
    const attn_tensor dq = in.like_q(g[run][0].data()), dk = in.like_k(g[run][1].data()),
                      dv = in.like_k(g[run][2].data());
    attn_params pb = in.p;
    if (run == 1) pb.flags |= ATTN_DETERMINISTIC;
    const int rc =
        attn_backward(ctx, &pb, &in.q, &in.k, &in.v, &in.o, &in.lse, &dout, &dq, &dk, &dv);
    if (rc) {
      printf("  FAIL %-*s attn_backward%s: %s: %s\n", CHECK_NAME_WIDTH, pr.name,
             run ? " (deterministic)" : "", attn_status_name(rc), attn_errmsg(ctx));
      failures++;
      return;
    }
  }
  std::vector<double> rq((size_t)in.nq_all), rk((size_t)in.nk_all), rv((size_t)in.nk_all);
  const int rc =
      at_ref_backward(ctx, &in.p, &in.q, &in.k, &in.v, &dout, rq.data(), rk.data(), rv.data());
  if (rc) {
    printf("  FAIL %-*s reference: %s\n", CHECK_NAME_WIDTH, pr.name, attn_errmsg(ctx));
    failures++;
    return;
  }
  const char *names[3] = {"dq", "dk", "dv"};
  const std::vector<double> *refs[3] = {&rq, &rk, &rv};
  bool ok = true;
  char line[512];
  int len = 0;
  for (int x = 0; x < 3; x++) {
    const cmp a = compare(g[0][x], pr.dt, *refs[x]), b = compare(g[1][x], pr.dt, *refs[x]);
    const double bound = at_golden_bound(names[x], pr.dt, b.err, a.maxref);
    const bool good = a.err <= bound && a.nan_bad == 0;
    ok = ok && good;
    len += snprintf(line + len, sizeof line - len, "%s %s %.3g (peer %.3g)%s%s", x ? "," : "",
                    names[x], a.err, b.err, good ? "" : " BAD", a.nan_bad ? " NaN mismatch" : "");
    if (a.nans && x == 0) len += snprintf(line + len, sizeof line - len, " [%ld NaN]", a.nans);
  }
  if (!ok) failures++;
  printf("  %-4s %-*s%s\n", ok ? "ok" : "FAIL", CHECK_NAME_WIDTH, pr.name, line);
}

int main() {
  if (!on_hopper()) return 2;

  printf("part 1: the backward's wgmma pieces (one block of 128 keys x Br query rows)\n");
  test_chain<__half, 128, 64>("f16  d=128 Br=64 ");
  test_chain<__nv_bfloat16, 128, 64>("bf16 d=128 Br=64 ");
  test_chain<__half, 64, 128>("f16  d=64  Br=128");
  test_chain<__nv_bfloat16, 64, 128>("bf16 d=64  Br=128");
  test_chain<__half, 64, 64>("f16  d=64  Br=64 ");
  test_chain<__nv_bfloat16, 64, 64>("bf16 d=64  Br=64 ");
  test_dq32<__half>("dq32  f16  d=64 columns split, B from mid-row (unused)");
  test_dq32<__nv_bfloat16>("dq32  bf16 d=64 columns split, B from mid-row (unused)");
  test_tma<__half>("tma   f16 d=128 bhsd [2][3][300], 64 rows at 280", 2, 300, 3, 128, 280, 1, 1);
  test_tma<__nv_bfloat16>("tma   bf16 d=64 bhsd [1][2][100], 64 rows at 0", 1, 100, 2, 64, 0, 1, 0);
  const int part1 = failures;

  printf("part 2: attn_backward (cuda) against the float64 reference; peer: deterministic\n");
  attn_context *ctx = open_cuda();
  if (!ctx) return 1;
  /* clang-format off */
  std::vector<problem> ps = {
      {"varlen f16 d=128 causal GQA 4/2", ATTN_F16, 128, 4, 2, true, -1, -1, 0, false,
       {1, 130, 257, 0, 300}, {1, 130, 257, 0, 300}, 0, 0, 0, 0, -1},
      {"varlen bf16 d=64 MQA 2/1, nq != nk", ATTN_BF16, 64, 2, 1, false, -1, -1, 0, false,
       {200, 77, 512}, {300, 77, 129}, 0, 0, 0, 0, -1},
      {"varlen f16 d=128, NaN v in sequence 1", ATTN_F16, 128, 2, 2, false, -1, -1, 0, false,
       {100, 150, 90}, {100, 150, 90}, 0, 0, 0, 0, 1},
      {"varlen bf16 d=64, NaN v in sequence 0", ATTN_BF16, 64, 2, 1, true, -1, -1, 0, false,
       {70, 200}, {90, 200}, 0, 0, 0, 0, 0},
      {"varlen bf16 d=64 window 50,20 softcap alibi", ATTN_BF16, 64, 4, 4, false, 50, 20, 30.f,
       true, {333, 64, 200}, {400, 64, 250}, 0, 0, 0, 0, -1},
      {"bhsd f16 d=128 causal window 100 softcap alibi", ATTN_F16, 128, 2, 2, true, 100, -1, 30.f,
       true, {}, {}, 2, 300, 300, 1, -1},
      {"fused qkv bf16 d=64 window 64,32", ATTN_BF16, 64, 3, 3, false, 64, 32, 0, false, {}, {}, 2,
       257, 257, 2, -1},
      {"bshd bf16 d=64 causal 300 x 100 (rows see none)", ATTN_BF16, 64, 2, 2, true, -1, -1, 0,
       false, {}, {}, 2, 300, 100, 0, -1},
      {"bshd f16 d=128 causal 130 x 700 MQA 4/1", ATTN_F16, 128, 4, 1, true, -1, -1, 0, false, {},
       {}, 1, 130, 700, 0, -1},
      {"bshd bf16 d=128 softcap 513 x 513 GQA 8/2", ATTN_BF16, 128, 8, 2, false, -1, -1, 20.f,
       false, {}, {}, 1, 513, 513, 0, -1},
      {"bshd f16 d=64 1024 x 1024", ATTN_F16, 64, 4, 4, false, -1, -1, 0, false, {}, {}, 1, 1024,
       1024, 0, -1},
      {"bshd bf16 d=128 causal 1000 x 1000 alibi", ATTN_BF16, 128, 2, 2, true, -1, -1, 0, true,
       {}, {}, 1, 1000, 1000, 0, -1},
      {"bshd bf16 d=128 1 x 1000 (one query row)", ATTN_BF16, 128, 4, 4, false, -1, -1, 0, false,
       {}, {}, 2, 1, 1000, 0, -1},
      {"bshd f16 d=96 causal 200 x 200 (padded columns)", ATTN_F16, 96, 2, 2, true, -1, -1, 0,
       false, {}, {}, 1, 200, 200, 0, -1},
      {"varlen bf16 d=96 causal GQA 6/2", ATTN_BF16, 96, 6, 2, true, -1, -1, 0, false,
       {250, 3, 129}, {250, 3, 129}, 0, 0, 0, 0, -1},
  };
  /* clang-format on */
  for (const problem &pr : ps)
    run_problem(ctx, pr);
  attn_context_free(ctx);

  return finish("hopper_bwd_check", part1);
}
