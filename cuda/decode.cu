/*
 * The decoding family's tensor-core kernel (f16/bf16; the forward pass's
 * inner loop, FlashAttention-2 with FlashDecoding's key splits, see
 * decode.cuh), the kernel that merges the splits, and the host side: the
 * split count, the workspace, the rows of the tuning table.
 *
 * Per warp and tile of kTile = 16 keys: S = Q K^T by mma.sync m16n8k16 (the
 * block's query rows, padded to 16, as M: a decoding step has 1 to 16 of
 * them per KV head, and the tensor cores have ~10x the throughput the
 * memory needs even with the padding), the online softmax in registers, O +=
 * P V with P packed to 16 bits in registers as in mma_fwd.cu. The warp's K
 * and V tiles come through STAGES slots of its own by cp.async, two tiles in
 * flight while one is computed.
 *
 * Why this is memory-bound (H200, d = 128, bf16): a KV head's key is 512
 * bytes, and at 4.2 TB/s over 132 SMs an SM takes one per ~32 clocks. A
 * 16-key tile costs a warp 32 mma (~50 clocks of one SM sub-partition), 16
 * ldmatrix.x4 (8 KB, 64 clocks of shared-memory bandwidth), 8 KB of cp.async
 * writes and ~200 other instructions: about a fifth of the 512 clocks the
 * memory gives the SM for it. Two blocks of 4 warps per SM keep 2 tiles per
 * warp (128 KB) in flight, ~4x what Little's law asks at ~1 us latency.
 */
#include "decode.cuh"
#include "mma_common.cuh"

#include <string.h>

#include <type_traits>

namespace attn_decode {

using attn_mma::a_frag;
using attn_mma::cp_async16;
using attn_mma::cp_async_commit;
using attn_mma::cp_async_wait;
using attn_mma::cp_async_wait_all;
using attn_mma::elem;
using attn_mma::kPad;
using attn_mma::lane_a;
using attn_mma::lane_b_kn;
using attn_mma::lane_b_nk;
using attn_mma::ldsm_x4;
using attn_mma::ldsm_x4_t;
using attn_mma::mma_cc;
using attn_mma::mma_here;
using attn_mma::smem_addr;

constexpr int kWarps = 4;
/* Slots a warp: tiles it+1 and it+2 load while tile it is computed. */
constexpr int kStages = 3;

/* Dynamic shared memory: Q [kRows][D + kPad], then each warp's slots
 * [kStages][K, V][kTile][D + kPad]; the warps' states reuse the slots. */
template <typename T, int D>
constexpr size_t mma_smem() {
  return (size_t)(kRows + kWarps * kStages * 2 * kTile) * (D + kPad) * sizeof(T);
}

template <typename T, int D, bool PAGED, bool SCORED>
__global__ void __launch_bounds__(kWarps * 32) mma_kernel(const dparams P) {
#if ATTN_CUDA_SM75
  if (!mma_here<T>()) {
    __trap(); /* the plan runs T only on mma_cc<T>() code */
    return;
  }
  constexpr int NT = kWarps * 32;
  constexpr int LD = D + kPad;
  constexpr int KD = D / 16; /* k-steps of Q K^T */
  constexpr int NO = D / 8;  /* n-tiles of O */
  constexpr int SLOT = 2 * kTile * LD;
  /* Q's fragments stay in registers up to d = 128; at 256 O alone takes
   * 128 of them, and Q is read from shared memory per tile. */
  constexpr bool QREGS = D <= 128;
  /* Without Q in registers, a fully unrolled Q K^T would hoist every
   * fragment load of Q and K (128 registers at d = 256) beside O's 128. */
  constexpr int QK_UNROLL = QREGS ? KD : 4;
  static_assert(
      kWarps * kRows * (acc_ld<D>() + 2) * sizeof(float) <= kWarps * kStages * SLOT * sizeof(T),
      "the warps' states fit in their slots");

  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t = lane & 3;
  T *sQ = (T *)smem_raw;
  T *sW = sQ + kRows * LD + warp * kStages * SLOT;

  dblock k;
  if (!block_of(P, &k)) return;
  const dseq sq = k.sq;
  const int hk = k.hk, b = k.b, split = k.split, r0 = k.r0, rn = k.rn, jlo = k.jlo, jhi = k.jhi,
            hi_f = k.hi_f, lo_l = k.lo_l, tb = k.tb, te = k.te;
  /* This warp's share of the split's tiles. */
  const int nit = te - tb > warp ? (te - tb - warp + kWarps - 1) / kWarps : 0;

  /* The thread's two rows of the m16 tile (g and g + 8): their visible keys
   * and score terms. Padding rows see nothing. */
  int lo[2], hi[2], dg[2];
  bool ok[2];
  float slope[2] = {0.f, 0.f};
  long long brow[2] = {0, 0};
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int rr = r0 + g + 8 * r, i = rr / P.group, h = hk * P.group + rr % P.group;
    ok[r] = g + 8 * r < rn;
    dg[r] = diag(i, sq.nq, sq.nk);
    key_range(dg[r], sq.nk, P.wl, P.wr, &lo[r], &hi[r]);
    if (!ok[r]) lo[r] = hi[r] = 0;
    if (SCORED) {
      slope[r] = P.alibi ? __ldg(P.alibi + h) * kLog2e : 0.f;
      if (ok[r] && P.has_bias)
        brow[r] = (long long)b * P.bias.sb + (long long)h * P.bias.sh + (long long)i * P.bias.ss;
    }
  }

  load_q<T, D, LD, NT>(sQ, P, b, sq, hk, r0, rn);
  cp_async_commit();
  const kv_src<T, PAGED> src(P, b, sq, hk);
  auto load = [&](int tile, int slot) {
    T *sk = sW + slot * SLOT;
    load_kv<T, D, LD, PAGED>(sk, sk + kTile * LD, P, src, b, sq, tile * kTile, jlo, jhi);
  };

  /* Prologue: kStages - 1 tiles in flight (one commit group each, empty
   * groups keeping the count), then Q landed and seen by every warp. */
#pragma unroll
  for (int st = 0; st < kStages - 1; ++st) {
    if (st < nit) load(tb + warp + st * kWarps, st);
    cp_async_commit();
  }
  cp_async_wait<kStages - 1>();
  __syncthreads();

  const uint32_t aQ = smem_addr(sQ) + (uint32_t)lane_a<LD>(lane) * sizeof(T);
  const uint32_t bK = smem_addr(sW) + (uint32_t)lane_b_nk<LD>(lane) * sizeof(T);
  const uint32_t bV = smem_addr(sW + kTile * LD) + (uint32_t)lane_b_kn<LD>(lane) * sizeof(T);
  uint32_t qf[QREGS ? KD : 1][4];
  if (QREGS) {
#pragma unroll
    for (int kk = 0; kk < (QREGS ? KD : 0); ++kk)
      ldsm_x4(qf[QREGS ? kk : 0], aQ + kk * 16 * sizeof(T));
  }

  float acc[NO][4];
#pragma unroll
  for (int n = 0; n < NO; ++n)
    acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;
  float m_i[2] = {-INFINITY, -INFINITY}, l_i[2] = {0.f, 0.f};

  for (int it = 0; it < nit; ++it) {
    /* Tile it has landed, and every lane is done with tile it - 1, whose
     * slot the load below takes. */
    cp_async_wait<kStages - 2>();
    __syncwarp();
    if (it + kStages - 1 < nit)
      load(tb + warp + (it + kStages - 1) * kWarps, (it + kStages - 1) % kStages);
    cp_async_commit();
    const uint32_t cK = bK + (it % kStages) * SLOT * sizeof(T);
    const uint32_t cV = bV + (it % kStages) * SLOT * sizeof(T);
    const int j0 = (tb + warp + it * kWarps) * kTile;

    /* S = Q K^T: two n-tiles of 8 keys. */
    float s[2][4];
#pragma unroll
    for (int n = 0; n < 2; ++n)
      s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
#pragma unroll QK_UNROLL
    for (int kk = 0; kk < KD; ++kk) {
      uint32_t a[4], bb[4];
      if (QREGS) {
#pragma unroll
        for (int x = 0; x < 4; ++x)
          a[x] = qf[QREGS ? kk : 0][x];
      } else {
        ldsm_x4(a, aQ + kk * 16 * sizeof(T));
      }
      ldsm_x4(bb, cK + kk * 16 * sizeof(T));
      elem<T>::mma(s[0], a, bb[0], bb[1]);
      elem<T>::mma(s[1], a, bb[2], bb[3]);
    }

    /* Scores in the log2 domain; element e of n-tile n is row g + 8 (e / 2),
     * key j0 + 8 n + 2 t + e % 2. */
    const bool full = j0 >= lo_l && j0 + kTile <= hi_f;
#pragma unroll
    for (int n = 0; n < 2; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = e >> 1, j = j0 + n * 8 + 2 * t + (e & 1);
        const bool vis = full || (j >= lo[r] && j < hi[r]);
        float v;
        if (SCORED) {
          float th;
          v = score_log2(s[n][e], P.scale_log2, P.softcap_log2 > 0.f, P.softcap_log2, P.softcap_inv,
                         slope[r], dg[r] - j, &th);
          if (P.has_bias && vis && ok[r])
            v += kLog2e * load_any(P.bias.p, P.bias_dtype, brow[r] + (long long)j * P.bias.sd);
        } else {
          v = s[n][e] * P.scale_log2;
        }
        s[n][e] = vis ? v : -INFINITY;
      }

    /* Online softmax; a row's max over the quad that holds it. */
    float mx[2] = {fmaxf(fmaxf(s[0][0], s[0][1]), fmaxf(s[1][0], s[1][1])),
                   fmaxf(fmaxf(s[0][2], s[0][3]), fmaxf(s[1][2], s[1][3]))};
    float mu[2], alpha[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
      const float mn = fmaxf(m_i[r], mx[r]);
      /* A row with no visible key yet keeps max -inf; subtracting 0 then
       * gives exp2(-inf) = 0 instead of NaN. */
      mu[r] = mn == -INFINITY ? 0.f : mn;
      alpha[r] = ex2(m_i[r] - mu[r]);
      m_i[r] = mn;
    }
#pragma unroll
    for (int n = 0; n < 2; ++n) {
      s[n][0] = ex2(s[n][0] - mu[0]);
      s[n][1] = ex2(s[n][1] - mu[0]);
      s[n][2] = ex2(s[n][2] - mu[1]);
      s[n][3] = ex2(s[n][3] - mu[1]);
    }
    /* l_i stays a per-thread partial sum until the end. */
    l_i[0] = l_i[0] * alpha[0] + (s[0][0] + s[0][1]) + (s[1][0] + s[1][1]);
    l_i[1] = l_i[1] * alpha[1] + (s[0][2] + s[0][3]) + (s[1][2] + s[1][3]);
#pragma unroll
    for (int n = 0; n < NO; ++n) {
      acc[n][0] *= alpha[0];
      acc[n][1] *= alpha[0];
      acc[n][2] *= alpha[1];
      acc[n][3] *= alpha[1];
    }

    /* O += P V; P's C fragments are the A fragment of a k16 step. */
    uint32_t a[4];
    a_frag<T>(a, s[0], s[1]);
#pragma unroll
    for (int np = 0; np < D / 16; ++np) {
      uint32_t bb[4];
      ldsm_x4_t(bb, cV + np * 16 * sizeof(T));
      elem<T>::mma(acc[2 * np], a, bb[0], bb[1]);
      elem<T>::mma(acc[2 * np + 1], a, bb[2], bb[3]);
    }
  }
  cp_async_wait_all();
  __syncthreads(); /* every warp is done with its slots: they take the states */

  float *sAcc = (float *)(smem_raw + kRows * LD * sizeof(T));
  float *sM = sAcc + kWarps * kRows * acc_ld<D>();
  float *sL = sM + kWarps * kRows;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float l = l_i[r];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    const int row = g + 8 * r;
    if (t == 0) {
      sM[warp * kRows + row] = m_i[r];
      sL[warp * kRows + row] = l;
    }
    float *arow = sAcc + (warp * kRows + row) * acc_ld<D>() + 2 * t;
#pragma unroll
    for (int n = 0; n < NO; ++n)
      *(float2 *)(arow + n * 8) = make_float2(acc[n][2 * r], acc[n][2 * r + 1]);
  }
  __syncthreads();
  block_end<T, D, kWarps>(P, sAcc, sM, sL, b, sq, hk, r0, rn, split);
#else
  __trap(); /* the plan runs it only on sm_75 code and later */
#endif
}

/* ---------------------------------------------------------------------- */
/* The splits' merge                                                        */
/* ---------------------------------------------------------------------- */

constexpr int kCombineThreads = 128;

/* One block per query row and head: the splits' (m, l) merge as the warps'
 * do in block_end, and each thread sums its columns of O over the splits. */
template <typename T>
__global__ void __launch_bounds__(kCombineThreads) combine_kernel(const dparams P) {
  __shared__ float sf[ATTN__CUDA_DECODE_MAX_SPLITS];
  __shared__ float red[2][kCombineThreads / 32];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int b = blockIdx.y, i = blockIdx.x / P.hq, h = blockIdx.x % P.hq;
  const dseq sq = seq_of(P, b);
  if (i >= sq.nq) return;
  const long long row = (sq.row0 + i) * P.hq + h;

  float m = -INFINITY;
  for (int s = tid; s < P.splits; s += kCombineThreads)
    m = fmaxf(m, P.ws_ml[s * P.rows + row].x);
#pragma unroll
  for (int x = 16; x > 0; x >>= 1)
    m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, x));
  if (lane == 0) red[0][warp] = m;
  __syncthreads();
#pragma unroll
  for (int w = 0; w < kCombineThreads / 32; ++w)
    m = fmaxf(m, red[0][w]);

  float l = 0.f;
  for (int s = tid; s < P.splits; s += kCombineThreads) {
    const float2 ml = P.ws_ml[s * P.rows + row];
    const float f = ml.x == -INFINITY ? 0.f : ex2((ml.x - m) * units<T>::to_log2);
    sf[s] = f;
    l += f * ml.y;
  }
#pragma unroll
  for (int x = 16; x > 0; x >>= 1)
    l += __shfl_xor_sync(0xffffffffu, l, x);
  if (lane == 0) red[1][warp] = l;
  __syncthreads();
  l = 0.f;
#pragma unroll
  for (int w = 0; w < kCombineThreads / 32; ++w)
    l += red[1][w];

  const row_end e = finish_row<T>(P, h, mask_seen(P, i, sq), m, l);
  T *orow = o_row<T>(P, b, sq, i, h);
  const float *acc = P.ws_acc + row * P.d;
  const long long sstride = P.rows * P.d;
  for (int c = tid; c < P.d; c += kCombineThreads) {
    float o = 0.f;
#pragma unroll 8
    for (int s = 0; s < P.splits; ++s)
      o += sf[s] * acc[s * sstride + c];
    orow[c * P.o.sd] = from_float<T>(o * e.mul);
  }
  if (tid == 0 && P.has_lse) lse_store(lse_row(P, b, sq, i, h), P.lse.sd, e.seen, e.m, e.l);
}

int combine(const attn__cuda_launch *L, const dparams &P) {
  const dim3 grid((unsigned)(P.seqlen_q * P.hq), (unsigned)P.batch);
  switch (L->pb->dtype) {
    case ATTN_F16:
      combine_kernel<__half><<<grid, kCombineThreads, 0, L->stream>>>(P);
      break;
    case ATTN_BF16:
      combine_kernel<__nv_bfloat16><<<grid, kCombineThreads, 0, L->stream>>>(P);
      break;
    default:
      combine_kernel<float><<<grid, kCombineThreads, 0, L->stream>>>(P);
      break;
  }
  return cudaGetLastError() == cudaSuccess ? ATTN_OK : ATTN_EDEVICE;
}

/* ---------------------------------------------------------------------- */
/* Host side                                                                */
/* ---------------------------------------------------------------------- */

static const int32_t *i32_of(const attn__tensor &t) {
  return (const int32_t *)attn__cuda_at(&t);
}

dparams make_params(const attn__cuda_launch *L, int splits) {
  const attn__problem *pb = L->pb;
  dparams P;
  memset(&P, 0, sizeof P);
  P.q = attn__cuda_view_of(&pb->q);
  P.k = attn__cuda_view_of(&pb->k);
  P.v = attn__cuda_view_of(&pb->v);
  P.o = attn__cuda_view_of(&pb->o);
  if (pb->has_lse && pb->lse.native) {
    P.lse = attn__cuda_view_of(&pb->lse);
    P.has_lse = 1;
  }
  if (pb->has_bias) {
    P.bias = attn__cuda_view_of(&pb->bias);
    P.bias_dtype = (int)pb->bias.dtype;
    P.has_bias = 1;
  }
  P.cu_q = L->cu_q;
  P.cu_k = L->cu_k;
  P.alibi = L->alibi;
  if (pb->has_seqused) {
    P.used = i32_of(pb->seqused_k);
    P.used_sb = pb->seqused_k.sb;
  }
  if (pb->page_size) {
    P.bt = i32_of(pb->block_table);
    P.bt_sb = pb->block_table.sb;
    P.bt_ss = pb->block_table.ss;
    P.page_size = (int)pb->page_size;
    P.num_pages = (int)pb->num_pages;
  }
  if (pb->has_sinks) {
    P.sinks = (const float *)attn__cuda_at(&pb->sinks);
    P.sinks_sh = pb->sinks.sh;
  }
  P.batch = (int)pb->batch;
  P.hq = (int)pb->heads_q;
  P.hkv = (int)pb->heads_kv;
  P.group = (int)(pb->heads_q / pb->heads_kv);
  P.d = (int)pb->head_dim;
  P.seqlen_q = (int)pb->seqlen_q;
  P.seqlen_k = (int)pb->seqlen_k;
  P.nnew = (int)pb->seqlen_new;
  /* The core made a bound at least as long as the sequences unbounded, so
   * the rest fit in int (lengths < 2^30, plan.c). */
  P.wl = (int)pb->window_left;
  P.wr = (int)pb->window_right;
  P.scale = pb->scale;
  P.softcap = pb->softcap;
  P.inv_softcap = pb->softcap > 0.f ? 1.f / pb->softcap : 0.f;
  P.scale_log2 = pb->scale * kLog2e;
  P.softcap_log2 = pb->softcap * kLog2e;
  P.softcap_inv = pb->softcap > 0.f ? pb->scale / pb->softcap : 0.f;
  P.rblocks = (int)((P.group * pb->seqlen_q + kRows - 1) / kRows);
  P.splits = splits;
  P.rows = pb->total_q * pb->heads_q;
  if (splits > 1) {
    char *ws = (char *)L->workspace;
    P.ws_ml = (float2 *)ws;
    P.ws_acc = (float *)(ws + attn__cuda_decode_ws_ml(pb, splits));
  }
  return P;
}

template <typename T, int D>
static int launch_mma(const attn__cuda_launch *L, const attn__cuda_config *c) {
  const int splits = attn__cuda_decode_splits(L->dev, c, L->pb);
  const dparams P = make_params(L, splits);
  const bool scored = P.softcap_log2 > 0.f || P.alibi || P.has_bias;
  auto kern = P.bt ? (scored ? mma_kernel<T, D, true, true> : mma_kernel<T, D, true, false>)
                   : (scored ? mma_kernel<T, D, false, true> : mma_kernel<T, D, false, false>);
  if (cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)c->smem) !=
      cudaSuccess)
    return ATTN_EDEVICE;
  const dim3 grid((unsigned)(P.hkv * P.rblocks * splits), (unsigned)P.batch);
  kern<<<grid, kWarps * 32, c->smem, L->stream>>>(P);
  if (cudaGetLastError() != cudaSuccess) return ATTN_EDEVICE;
  return splits > 1 ? combine(L, P) : ATTN_OK;
}

template <typename T, int D>
constexpr attn__cuda_config mma_row(const char *name) {
  return {.kernel = ATTN__CUDA_DECODE,
          .dtype = std::is_same<T, __half>::value ? ATTN_F16 : ATTN_BF16,
          .dim = D,
          .cc = mma_cc<T>(),
          .specific = 0,
          .tf32 = 0,
          .threads = kWarps * 32,
          .br = kRows,
          .bc = kWarps * kTile,
          .stages = 0,
          .min_seqlen_q = 0,
          .min_keys_masked = 0,
          .smem = mma_smem<T, D>(),
          .smem_det = 0,
          .features = ATTN__USES_SEQUSED | ATTN__USES_PAGED | ATTN__USES_APPEND | ATTN__USES_BIAS |
                      ATTN__USES_SINKS,
          .nondeterministic = 0,
          .name = name,
          .launch = launch_mma<T, D>};
}

/* Head dims up to 64, 128 and 256 (multiples of 8; the columns past d are
 * zeros in shared memory). Shared memory a block: 56, 106 and 206 KB, so 3,
 * 2 and 1 blocks an SM on the H200. */
constexpr attn__cuda_config rows[] = {
    mma_row<__half, 64>("decode (tensor cores), f16, d <= 64"),
    mma_row<__half, 128>("decode (tensor cores), f16, d <= 128"),
    mma_row<__half, 256>("decode (tensor cores), f16, d <= 256"),
    mma_row<__nv_bfloat16, 64>("decode (tensor cores), bf16, d <= 64"),
    mma_row<__nv_bfloat16, 128>("decode (tensor cores), bf16, d <= 128"),
    mma_row<__nv_bfloat16, 256>("decode (tensor cores), bf16, d <= 256"),
};

}  // namespace attn_decode

extern "C" const attn__cuda_rows attn__cuda_decode_rows = {
    attn_decode::rows, (int)(sizeof attn_decode::rows / sizeof attn_decode::rows[0])};
