/*
 * The decoding family's f32 kernel (decode.cuh's blocks, splits and
 * finishing; the forward pass's inner loop), on the CUDA cores in true fp32
 * as the library computes f32 everywhere.
 *
 * Per warp and tile of kTile = 16 keys, K and V through two slots of its own
 * by cp.async:
 *   S = Q K^T    lane l takes key l % 16 and half l / 16 of the columns: a
 *                float4 of its K row a step (the row stride D + 4 puts a
 *                quarter warp's 8 rows in distinct banks) against each row of
 *                Q, broadcast; the halves add by one shuffle.
 *   softmax      online, per row, the max over the tile's 16 keys by four
 *                shuffles; P goes to shared memory.
 *   O += P V     lane l owns columns 4l..4l+3 (and 128 + 4l.. at d = 256) of
 *                every row, with P read back four keys a broadcast float4.
 * Only the block's valid rows are computed (rn of kRows, a uniform bound),
 * so a decoding step's 4 rows cost 4 rows.
 *
 * Why memory-bound (H200, d = 128, 4 rows): a KV head's key is 1 KB in f32,
 * ~64 SM clocks at 4.2 TB/s; a tile costs a warp ~750 instructions (2 x 4 x
 * 128 FMA per key over 32 lanes, the shared-memory reads beside them), and
 * an SM's 4 warps issue them in about 3/8 of the 1024 clocks its 16 KB take
 * to arrive. Two slots a warp (one tile in flight while one is computed)
 * keep 64 KB in flight an SM, twice what Little's law asks.
 */
#include "decode.cuh"

#include <string.h>

namespace attn_decode {

using attn_mma::cp_async_commit;
using attn_mma::cp_async_wait;
using attn_mma::cp_async_wait_all;

constexpr int kF32Stages = 2;

/* Four warps, but two at d = 256, whose slots would not fit four. */
template <int D>
__host__ __device__ constexpr int f32_warps() {
  return D > 128 ? 2 : 4;
}

/* Dynamic shared memory: Q [kRows][D + 4], each warp's slots
 * [kF32Stages][K, V][kTile][D + 4], then each warp's P [kRows][kTile]; the
 * warps' states reuse the slots. */
template <int D>
constexpr size_t f32_smem() {
  return ((size_t)(kRows + f32_warps<D>() * kF32Stages * 2 * kTile) * (D + 4) +
          (size_t)f32_warps<D>() * kRows * kTile) *
         sizeof(float);
}

template <int D, bool PAGED, bool SCORED>
__global__ void __launch_bounds__(f32_warps<D>() * 32) f32_kernel(const dparams P) {
  constexpr int NW = f32_warps<D>(), NT = NW * 32, LD = D + 4;
  constexpr int SLOT = 2 * kTile * LD;
  constexpr int HALF = D / 2;            /* columns of Q K^T a lane takes */
  constexpr int CPL = D / 32;            /* columns of O a lane owns */
  constexpr int VW = CPL >= 4 ? 4 : CPL; /* as float4s (float2s at d = 64) */
  /* Keys a step of P V: V's values for them stay in registers beside O's
   * 16 x CPL (two keys at d = 256, where O alone takes 128). */
  constexpr int PK = D > 128 ? 2 : 4;
  static_assert(NW * kRows * (acc_ld<D>() + 2) <= NW * kF32Stages * SLOT,
                "the warps' states fit in their slots");

  extern __shared__ __align__(16) unsigned char smem_raw[];
  __shared__ int sLo[kRows], sHi[kRows], sDg[kRows];
  __shared__ float sSlope[kRows];
  __shared__ long long sBrow[kRows];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  float *sQ = (float *)smem_raw;
  float *sW = sQ + kRows * LD + warp * kF32Stages * SLOT;
  float *sP = sQ + kRows * LD + NW * kF32Stages * SLOT + warp * kRows * kTile;

  dblock k;
  if (!block_of(P, &k)) return;
  const dseq sq = k.sq;
  const int hk = k.hk, b = k.b, split = k.split, r0 = k.r0, rn = k.rn, jlo = k.jlo, jhi = k.jhi,
            hi_f = k.hi_f, lo_l = k.lo_l, tb = k.tb, te = k.te;
  /* This warp's share of the split's tiles. */
  const int nit = te - tb > warp ? (te - tb - warp + NW - 1) / NW : 0;

  /* The rows' visible keys and score terms, shared by every lane. */
  if (tid < kRows) {
    const int rr = r0 + tid, i = rr / P.group, h = hk * P.group + rr % P.group;
    sDg[tid] = diag(i, sq.nq, sq.nk);
    key_range(sDg[tid], sq.nk, P.wl, P.wr, &sLo[tid], &sHi[tid]);
    sSlope[tid] = SCORED && P.alibi ? __ldg(P.alibi + h) : 0.f;
    sBrow[tid] = (long long)b * P.bias.sb + (long long)h * P.bias.sh + (long long)i * P.bias.ss;
  }

  load_q<float, D, LD, NT>(sQ, P, b, sq, hk, r0, rn);
  cp_async_commit();
  const kv_src<float, PAGED> src(P, b, sq, hk);
  auto load = [&](int tile, int slot) {
    float *sk = sW + slot * SLOT;
    load_kv<float, D, LD, PAGED>(sk, sk + kTile * LD, P, src, b, sq, tile * kTile, jlo, jhi);
  };
  if (nit > 0) load(tb + warp, 0);
  cp_async_commit();
  cp_async_wait<1>(); /* Q */
  __syncthreads();

  float acc[kRows][CPL], m_i[kRows], l_i[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
#pragma unroll
    for (int c = 0; c < CPL; ++c)
      acc[r][c] = 0.f;
    m_i[r] = -INFINITY;
    l_i[r] = 0.f;
  }
  const int key = lane & 15, half = lane >> 4;

  for (int it = 0; it < nit; ++it) {
    /* Tile it has landed, and every lane is done with tile it - 1 and with
     * P, whose places are taken next. */
    cp_async_wait<0>();
    __syncwarp();
    if (it + 1 < nit) load(tb + warp + (it + 1) * NW, (it + 1) % kF32Stages);
    cp_async_commit();
    const float *sk = sW + (it % kF32Stages) * SLOT, *sv = sk + kTile * LD;
    const int j0 = (tb + warp + it * NW) * kTile, j = j0 + key;

    /* S = Q K^T for the lane's key, over its half of the columns. */
    float s[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r)
      s[r] = 0.f;
    const float *kr = sk + key * LD + half * HALF, *qh = sQ + half * HALF;
#pragma unroll 2
    for (int c = 0; c < HALF; c += 4) {
      const float4 kv = *(const float4 *)(kr + c);
#pragma unroll
      for (int r = 0; r < kRows; ++r)
        if (r < rn) {
          const float4 qv = *(const float4 *)(qh + r * LD + c);
          s[r] = fmaf(qv.x, kv.x, s[r]);
          s[r] = fmaf(qv.y, kv.y, s[r]);
          s[r] = fmaf(qv.z, kv.z, s[r]);
          s[r] = fmaf(qv.w, kv.w, s[r]);
        }
    }

    /* Scores (natural units: score, common.cuh), the mask, the online
     * softmax; exponentials of differences, which are small. */
    const bool full = j0 >= lo_l && j0 + kTile <= hi_f;
#pragma unroll
    for (int r = 0; r < kRows; ++r)
      if (r < rn) {
        s[r] += __shfl_xor_sync(0xffffffffu, s[r], 16);
        const bool vis = full || (j >= sLo[r] && j < sHi[r]);
        float v;
        if (SCORED) {
          float th;
          v = score(s[r], P.scale, P.softcap, P.inv_softcap, sSlope[r], sDg[r] - j, &th);
          if (P.has_bias && vis)
            v += load_any(P.bias.p, P.bias_dtype, sBrow[r] + (long long)j * P.bias.sd);
        } else {
          v = __fmul_rn(s[r], P.scale); /* as score() rounds it */
        }
        v = vis ? v : -INFINITY;
        float mx = v;
#pragma unroll
        for (int x = 8; x > 0; x >>= 1)
          mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, x));
        const float mn = fmaxf(m_i[r], mx);
        /* No visible key yet: max -inf, and exp(-inf - 0) = 0, not NaN. */
        const float mu = mn == -INFINITY ? 0.f : mn;
        const float alpha = ex2((m_i[r] - mu) * kLog2e);
        m_i[r] = mn;
        const float p = ex2((v - mu) * kLog2e);
        /* Both halves hold the tile's 16 keys: l_i is a half's sum. */
        l_i[r] = l_i[r] * alpha + p;
#pragma unroll
        for (int c = 0; c < CPL; ++c)
          acc[r][c] *= alpha;
        if (half == 0) sP[r * kTile + key] = p;
      }
    __syncwarp();

    /* O += P V, PK keys at a time. */
#pragma unroll
    for (int k0 = 0; k0 < kTile; k0 += PK) {
      float vv[PK][CPL];
#pragma unroll
      for (int kk = 0; kk < PK; ++kk)
#pragma unroll
        for (int u = 0; u < CPL / VW; ++u) {
          const float *src = sv + (k0 + kk) * LD + u * 32 * VW + lane * VW;
          if constexpr (VW == 4) {
            const float4 x = *(const float4 *)src;
            vv[kk][u * VW] = x.x;
            vv[kk][u * VW + 1] = x.y;
            vv[kk][u * VW + 2] = x.z;
            vv[kk][u * VW + 3] = x.w;
          } else {
            const float2 x = *(const float2 *)src;
            vv[kk][u * VW] = x.x;
            vv[kk][u * VW + 1] = x.y;
          }
        }
#pragma unroll
      for (int r = 0; r < kRows; ++r)
        if (r < rn) {
          float pk[PK];
          if constexpr (PK == 4) {
            const float4 x = *(const float4 *)(sP + r * kTile + k0);
            pk[0] = x.x, pk[1] = x.y, pk[2] = x.z, pk[3] = x.w;
          } else {
            const float2 x = *(const float2 *)(sP + r * kTile + k0);
            pk[0] = x.x, pk[1] = x.y;
          }
#pragma unroll
          for (int c = 0; c < CPL; ++c)
#pragma unroll
            for (int kk = 0; kk < PK; ++kk)
              acc[r][c] = fmaf(pk[kk], vv[kk][c], acc[r][c]);
        }
    }
  }
  cp_async_wait_all();
  __syncthreads(); /* every warp is done with its slots: they take the states */

  float *sAcc = sQ + kRows * LD;
  float *sM = sAcc + NW * kRows * acc_ld<D>();
  float *sL = sM + NW * kRows;
#pragma unroll
  for (int r = 0; r < kRows; ++r)
    if (r < rn) {
      float l = l_i[r];
#pragma unroll
      for (int x = 8; x > 0; x >>= 1)
        l += __shfl_xor_sync(0xffffffffu, l, x);
      if (lane == 0) {
        sM[warp * kRows + r] = m_i[r];
        sL[warp * kRows + r] = l;
      }
      float *arow = sAcc + (warp * kRows + r) * acc_ld<D>();
#pragma unroll
      for (int c = 0; c < CPL; ++c)
        arow[(c / VW) * 32 * VW + lane * VW + c % VW] = acc[r][c];
    }
  __syncthreads();
  block_end<float, D, NW>(P, sAcc, sM, sL, b, sq, hk, r0, rn, split);
}

template <int D>
static int launch_f32(const attn__cuda_launch *L, const attn__cuda_config *c) {
  const int splits = attn__cuda_decode_splits(L->dev, c, L->pb);
  const dparams P = make_params(L, splits);
  const bool scored = P.softcap_log2 > 0.f || P.alibi || P.has_bias;
  auto kern = P.bt ? (scored ? f32_kernel<D, true, true> : f32_kernel<D, true, false>)
                   : (scored ? f32_kernel<D, false, true> : f32_kernel<D, false, false>);
  if (cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)c->smem) !=
      cudaSuccess)
    return ATTN_EDEVICE;
  const dim3 grid((unsigned)(P.hkv * P.rblocks * splits), (unsigned)P.batch);
  kern<<<grid, f32_warps<D>() * 32, c->smem, L->stream>>>(P);
  if (cudaGetLastError() != cudaSuccess) return ATTN_EDEVICE;
  return splits > 1 ? combine(L, P) : ATTN_OK;
}

template <int D>
constexpr attn__cuda_config f32_row(const char *name) {
  return {.kernel = ATTN__CUDA_DECODE,
          .dtype = ATTN_F32,
          .dim = D,
          .cc = 0, /* cp.async where there is one (copy.cuh) */
          .specific = 0,
          .tf32 = 0,
          .threads = f32_warps<D>() * 32,
          .br = kRows,
          .bc = f32_warps<D>() * kTile,
          .stages = 0,
          .min_seqlen_q = 0,
          .min_keys_masked = 0,
          .smem = f32_smem<D>(),
          .smem_det = 0,
          .features = ATTN__USES_SEQUSED | ATTN__USES_PAGED | ATTN__USES_APPEND | ATTN__USES_BIAS |
                      ATTN__USES_SINKS,
          .nondeterministic = 0,
          .name = name,
          .launch = launch_f32<D>};
}

/* Shared memory a block: 74, 144 and 150 KB. */
constexpr attn__cuda_config f32_rows[] = {
    f32_row<64>("decode (CUDA cores), f32, d <= 64"),
    f32_row<128>("decode (CUDA cores), f32, d <= 128"),
    f32_row<256>("decode (CUDA cores), f32, d <= 256"),
};

}  // namespace attn_decode

extern "C" const attn__cuda_rows attn__cuda_decode_rows_f32 = {
    attn_decode::f32_rows, (int)(sizeof attn_decode::f32_rows / sizeof attn_decode::f32_rows[0])};
