/*
 * Hopper forward pass (FlashAttention-2's forward steps on sm_90a's
 * warpgroup MMA): one thread block per (block of Br = 128 query rows, query
 * head, sequence), two warpgroups of 64 rows each (wgmma's M). Q is loaded
 * once; K and V blocks of Bc keys stream through STAGES shared-memory slots
 * with cp.async (block j+1 in flight while block j is computed), written in
 * the 128-byte swizzle that wgmma reads (wgmma.cuh). Blocks no row of the
 * tile can see (causal, windows) are skipped; only blocks straddling a
 * boundary are masked. S = Q K^T is one wgmma chain per warpgroup with both
 * operands in shared memory, its fp32 accumulators in registers; the online
 * softmax (m_i, l_i) runs on them in the exp2 domain; P is packed to 16 bits
 * in registers as the A operand of O += P V, V read from shared memory
 * through a transposed (MN-major) descriptor. O / l_i and lse = m_i ln 2 +
 * ln l_i are written once at the end (rows with no key: 0 and -inf).
 *
 * The parameters, the masks and the score epilogue are the tensor-core
 * family's (mma_common.cuh, common.cuh); this family covers the problems of
 * its kernel without the inference path's terms (bias, KV cache, sinks),
 * which the plan gives to mma_fwd.cu.
 */
#include "mma_common.cuh"
#include "wgmma.cuh"

#include <math.h>

namespace attn_hopper {

using namespace attn_mma;
namespace wg = attn_wgmma;

constexpr int kThreads = 256; /* two warpgroups */
constexpr int kBr = 128;      /* 64 query rows a warpgroup */

/* cp.async of 16 bytes to a 32-bit shared address; zero-filled when !valid
 * (src is then not read but must be a valid address). */
__device__ __forceinline__ void cp_async16_to(uint32_t dst, const void *src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(valid ? 16 : 0));
}

/* ROWS x D elements from global rows row0.. (row stride ss) into the
 * swizzled tile at shared address s (wgmma.cuh); rows at or past nrows are
 * zero-filled, so that P's zeros never meet stale values in V. Consecutive
 * threads take consecutive chunks of a row: whole rows per warp. */
template <int ROWS, int D, typename T>
__device__ __forceinline__ void load_tile(uint32_t s, const T *g, int64_t ss, int row0, int nrows,
                                          int tid) {
  constexpr int kChunks = D / 8;
  constexpr int kTotal = ROWS * kChunks;
#pragma unroll
  for (int c0 = 0; c0 < kTotal; c0 += kThreads) {
    const int c = c0 + tid;
    if (kTotal % kThreads == 0 || c < kTotal) {
      const int r = c / kChunks, ch = c % kChunks;
      const bool ok = row0 + r < nrows;
      cp_async16_to(s + wg::swizzled(ROWS, r, ch), ok ? g + (int64_t)(row0 + r) * ss + ch * 8 : g,
                    ok);
    }
  }
}

/* One kernel shape: head dim D (64, 128 or 256: whole 64-element column
 * blocks), Bc keys per step (64 or 128, the N of S's wgmma), STAGES K/V
 * slots. SCORED compiles the score transforms (softcap, ALiBi) in. */
template <typename T, int D, int BC, int STAGES, bool SCORED>
__global__ void __launch_bounds__(kThreads, 1) fwd_kernel(const params p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int KD = D / 16;  /* k-steps of Q K^T */
  constexpr int KB = BC / 16; /* k-steps of P V */
  constexpr int NS = BC / 8;  /* n8 tiles of S */
  constexpr int NO = D / 8;   /* n8 tiles of O */
  constexpr uint32_t kQBytes = kBr * D * sizeof(T);
  constexpr uint32_t kSlot = BC * D * sizeof(T);
  static_assert(D % 64 == 0 && BC % 64 == 0, "whole swizzle column blocks and 8-row groups");
  static_assert(sizeof(T) == 2, "16-bit elements: 64 a swizzled row");
  static_assert(STAGES >= 2, "at least double buffering");
  using mma = wg::mma<std::is_same<T, __nv_bfloat16>::value>;

  /* The swizzle works on shared addresses: every tile 1024-byte aligned
   * (the launcher asks 1024 bytes more than the tiles need). */
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const uint32_t sQ = (smem_addr(smem_raw) + 1023u) & ~1023u;
  const uint32_t sK = sQ + kQBytes;        /* [STAGES][D / 64][Bc][64] */
  const uint32_t sV = sK + STAGES * kSlot; /* [STAGES][D / 64][Bc][64] */

  const int tid = threadIdx.x, lane = tid & 31;
  const int wgi = tid >> 7, warp = (tid >> 5) & 3; /* warpgroup, warp in it */
  const int g = lane >> 2, t = lane & 3;
  /* Heaviest blocks (most keys under a causal mask) start first. */
  int m_block, h, b;
  attn_block_coords(p.order, &m_block, &h, &b);
  const int hk = h / p.group;
  const seq sq = seq_of(p, b);
  const int nq = sq.nq, nk = sq.nk;
  const int m0 = m_block * kBr;
  if (m0 >= nq) return;
  const int m_last = min(m0 + kBr, nq) - 1;
  const int w0 = wgi * 64 + warp * 16; /* this warp's first row in the block */

  /* Keys any row of this block sees; blocks outside are skipped. */
  int j_lo, j_hi;
  key_block_range(m0, m_last + 1, nq, nk, p.window_left, p.window_right, &j_lo, &j_hi);
  const int nb_min = j_lo / BC;
  const int nblocks = j_hi > j_lo ? (j_hi + BC - 1) / BC - nb_min : 0;

  const T *gq = row_ptr<T>(p.q, b, sq.q0, h);
  const T *gk = row_ptr<T>(p.k, b, sq.k0, hk);
  const T *gv = row_ptr<T>(p.v, b, sq.k0, hk);
  const float slope_log2 = SCORED && p.alibi ? p.alibi[h] * kLog2e : 0.f;
  const bool transform = SCORED && (p.softcap > 0.f || slope_log2 != 0.f);

  auto load_kv = [&](int st, int nbk) {
    load_tile<BC, D>(sK + st * kSlot, gk, p.k.ss, nbk * BC, nk, tid);
    load_tile<BC, D>(sV + st * kSlot, gv, p.v.ss, nbk * BC, nk, tid);
  };

  float acc_o[NO][4];
  float m_i[2], l_i[2];
#pragma unroll
  for (int n = 0; n < NO; ++n)
    acc_o[n][0] = acc_o[n][1] = acc_o[n][2] = acc_o[n][3] = 0.f;
  m_i[0] = m_i[1] = -INFINITY;
  l_i[0] = l_i[1] = 0.f;

  /* The warpgroup's 64 rows of Q (K-major, 8-row groups 1024 bytes apart),
   * k-step kk at column block kk / 4, 32 bytes per k16 within it. */
  const uint64_t dQ = wg::desc_k_major(sQ + wgi * 64 * 128);

  if (nblocks > 0) {
    /* Prologue: Q with the first K/V block, then STAGES-2 more blocks; one
     * commit group per block (empty groups keep the count uniform). */
    load_tile<kBr, D>(sQ, gq, p.q.ss, m0, nq, tid);
#pragma unroll
    for (int st = 0; st < STAGES - 1; ++st) {
      if (st < nblocks) load_kv(st, nb_min + st);
      cp_async_commit();
    }

    for (int it = 0; it < nblocks; ++it) {
      const int nb = nb_min + it;
      const uint32_t slot = (uint32_t)(it % STAGES) * kSlot;
      /* Block it has landed and is handed to the async proxy (wgmma); every
       * warpgroup is done with block it-1, whose slot the load below reuses
       * (each waited for its wgmma before this barrier). */
      cp_async_wait<STAGES - 2>();
      wg::fence_proxy_async();
      __syncthreads();
      {
        const int nx = it + STAGES - 1;
        if (nx < nblocks) load_kv(nx % STAGES, nb_min + nx);
        cp_async_commit();
      }

      /* S = Q K^T: D / 16 k-steps of m64 n(Bc) k16, the first overwriting. */
      float s[NS][4];
      const uint64_t dK = wg::desc_k_major(sK + slot);
      wg::pin(s);
      wg::fence();
#pragma unroll
      for (int kk = 0; kk < KD; ++kk) {
        const uint32_t qo = ((kk / 4) * kBr * 128 + (kk % 4) * 32) >> 4;
        const uint32_t ko = ((kk / 4) * BC * 128 + (kk % 4) * 32) >> 4;
        mma::ss(s, dQ + qo, dK + ko, kk > 0);
      }
      wg::commit();
      wg::wait<0>();
      wg::pin(s);

      /* Scores in the log2 domain; the mask only on blocks that straddle a
       * boundary (sequence end, causal diagonal, window edge). Plain blocks
       * keep the raw q.k and fold the scale into the exp2's FMA below
       * (scale > 0, so the max commutes with it). */
      const int n0 = nb * BC;
      const bool full = n0 + BC <= nk && n0 >= key_lo(diag(m_last, nq, nk), p.window_left) &&
                        n0 + BC <= key_hi(diag(m0, nq, nk), nk, p.window_right);
      const bool raw = full && !transform;
      const float mul = raw ? p.scale_log2 : 1.f;
      if (!raw) {
        /* Visible keys of the thread's two rows, as [lo, hi) relative to
         * the thread's first column. */
        int lo[2], hi[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int i = m0 + w0 + g + r * 8;
          const int jt = n0 + 2 * t;
          const int dg = diag(i, nq, nk);
          lo[r] = full ? -BC : max(0, key_lo(dg, p.window_left)) - jt;
          hi[r] = full ? BC : min(nk, key_hi(dg, nk, p.window_right)) - jt;
        }
#pragma unroll
        for (int n = 0; n < NS; ++n) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int r = e >> 1, c = n * 8 + (e & 1);
            float v = s[n][e];
            if (transform) {
              const int i = m0 + w0 + g + r * 8;
              float th;
              v = score_log2(v, p.scale_log2, p.softcap_log2 > 0.f, p.softcap_log2, p.softcap_inv,
                             slope_log2, diag(i, nq, nk) - (n0 + 2 * t + c), &th);
            } else {
              v *= p.scale_log2;
            }
            s[n][e] = c >= lo[r] && c < hi[r] ? v : -INFINITY;
          }
        }
      }

      /* Online softmax: the row max over the quad that shares a row. */
      float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
      for (int n = 0; n < NS; ++n) {
        mx[0] = fmaxf(mx[0], fmaxf(s[n][0], s[n][1]));
        mx[1] = fmaxf(mx[1], fmaxf(s[n][2], s[n][3]));
      }
      float mu[2], alpha[2], rs[2] = {0.f, 0.f};
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
        mx[r] = fmaxf(m_i[r], mx[r] * mul);
        /* A row with no visible key yet keeps max -inf; subtracting 0 then
         * gives exp2(-inf) = 0 instead of NaN. */
        mu[r] = mx[r] == -INFINITY ? 0.f : mx[r];
        alpha[r] = ex2(m_i[r] - mu[r]);
        m_i[r] = mx[r];
      }
#pragma unroll
      for (int n = 0; n < NS; ++n) {
        s[n][0] = ex2(fmaf(s[n][0], mul, -mu[0]));
        s[n][1] = ex2(fmaf(s[n][1], mul, -mu[0]));
        s[n][2] = ex2(fmaf(s[n][2], mul, -mu[1]));
        s[n][3] = ex2(fmaf(s[n][3], mul, -mu[1]));
        rs[0] += s[n][0] + s[n][1];
        rs[1] += s[n][2] + s[n][3];
      }
      /* l_i stays a per-thread partial sum until the end. */
      l_i[0] = l_i[0] * alpha[0] + rs[0];
      l_i[1] = l_i[1] * alpha[1] + rs[1];
#pragma unroll
      for (int n = 0; n < NO; ++n) {
        acc_o[n][0] *= alpha[0];
        acc_o[n][1] *= alpha[0];
        acc_o[n][2] *= alpha[1];
        acc_o[n][3] *= alpha[1];
      }

      /* O += P V: P's n8 tiles 2 kk, 2 kk + 1 are k-step kk's A fragment;
       * V's k-step kk is its rows 16 kk.., 2048 bytes a step. */
      uint32_t pa[KB][4];
#pragma unroll
      for (int kk = 0; kk < KB; ++kk) {
        pa[kk][0] = elem<T>::pack(s[2 * kk][0], s[2 * kk][1]);
        pa[kk][1] = elem<T>::pack(s[2 * kk][2], s[2 * kk][3]);
        pa[kk][2] = elem<T>::pack(s[2 * kk + 1][0], s[2 * kk + 1][1]);
        pa[kk][3] = elem<T>::pack(s[2 * kk + 1][2], s[2 * kk + 1][3]);
      }
      const uint64_t dV = wg::desc_mn_major(sV + slot, BC * 128);
      wg::pin(pa);
      wg::pin(acc_o);
      wg::fence();
#pragma unroll
      for (int kk = 0; kk < KB; ++kk)
        mma::rs(acc_o, pa[kk], dV + ((kk * 16 * 128) >> 4), 1);
      wg::commit();
      wg::wait<0>();
      wg::pin(acc_o);
    }
    /* Drain the trailing (empty) groups before the block exits. */
    cp_async_wait_all();
  }

  /* O = acc / l, lse = m ln 2 + ln l; rows with no key: 0 and -inf. */
  T *go = row_ptr<T>(p.o, b, sq.q0, h);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float l = l_i[r];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    const int i = m0 + w0 + g + r * 8;
    /* The mask says whether the row saw a key, not l: a NaN or inf among
     * its scores leaves l NaN (or 0 when all are -inf), and the row must
     * then come out NaN rather than as a row that saw nothing. */
    int klo, khi;
    key_range(diag(i, nq, nk), nk, p.window_left, p.window_right, &klo, &khi);
    const bool seen = klo < khi;
    const float inv = seen ? 1.f / l : 0.f;
    if (i < nq) {
      T *orow = go + (int64_t)i * p.o.ss;
#pragma unroll
      for (int n = 0; n < NO; ++n)
        *(uint32_t *)(orow + n * 8 + 2 * t) =
            elem<T>::pack(acc_o[n][2 * r] * inv, acc_o[n][2 * r + 1] * inv);
      if (p.has_lse && t == 0)
        lse_store(row_ptr<float>(p.lse, b, sq.q0 + i, h), p.lse.sd, seen, m_i[r] * kLn2, l);
    }
  }
#else
  __trap();
#endif
}

/* The tiles plus the 1024 bytes that align them. */
template <typename T, int D, int BC, int STAGES>
constexpr size_t smem_bytes() {
  return (size_t)(kBr + 2 * STAGES * BC) * D * sizeof(T) + 1024;
}

template <typename T, int D, int BC, int STAGES, bool SCORED>
static int launch_kernel(const attn__cuda_launch *L, const params &p) {
  auto kern = fwd_kernel<T, D, BC, STAGES, SCORED>;
  constexpr size_t smem = smem_bytes<T, D, BC, STAGES>();
  if (cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) !=
      cudaSuccess)
    return ATTN_EDEVICE;
  dim3 grid((unsigned)((p.seqlen_q + kBr - 1) / kBr), (unsigned)p.heads_q, (unsigned)p.batch);
  params pl = p;
  pl.order =
      attn_order_group(kern, kThreads, smem, grid, L->dev->sm_count, p.window_left, p.window_right);
  kern<<<grid, kThreads, smem, L->stream>>>(pl);
  return cudaGetLastError() == cudaSuccess ? ATTN_OK : ATTN_EDEVICE;
}

template <typename T, int D, int BC, int STAGES>
static int launch_fwd(const attn__cuda_launch *L, const attn__cuda_config *c) {
  (void)c;
  params p;
  make_params(L, 0, &p);
  if (p.softcap > 0.f || p.alibi) return launch_kernel<T, D, BC, STAGES, true>(L, p);
  return launch_kernel<T, D, BC, STAGES, false>(L, p);
}

template <typename T, int D, int BC, int STAGES>
constexpr attn__cuda_config fwd_row(const char *name) {
  return {.kernel = ATTN__CUDA_HOPPER_FORWARD,
          .dtype = std::is_same<T, __half>::value ? ATTN_F16 : ATTN_BF16,
          .dim = D,
          .cc = 90,
          .specific = 1,
          .threads = kThreads,
          .br = kBr,
          .bc = BC,
          .smem = smem_bytes<T, D, BC, STAGES>(),
          .smem_det = 0,
          .features = 0,
          .name = name,
          .launch = launch_fwd<T, D, BC, STAGES>};
}

/* The rows, <head dim, Bc, STAGES>. Bc = 128 for d <= 128 (FlashAttention-3's
 * tile for these dims) and 64 at d = 256, where O alone holds 128 registers a
 * thread; two stages fit every shape in the H200's 227 KB (d = 256: 193 KB). */
constexpr attn__cuda_config fwd_rows[] = {
    fwd_row<__half, 64, 128, 2>("Hopper forward (wgmma), f16, d = 64, 128 x 128 tiles"),
    fwd_row<__half, 128, 128, 2>("Hopper forward (wgmma), f16, d = 128, 128 x 128 tiles"),
    fwd_row<__half, 256, 64, 2>("Hopper forward (wgmma), f16, d = 256, 128 x 64 tiles"),
    fwd_row<__nv_bfloat16, 64, 128, 2>("Hopper forward (wgmma), bf16, d = 64, 128 x 128 tiles"),
    fwd_row<__nv_bfloat16, 128, 128, 2>("Hopper forward (wgmma), bf16, d = 128, 128 x 128 tiles"),
    fwd_row<__nv_bfloat16, 256, 64, 2>("Hopper forward (wgmma), bf16, d = 256, 128 x 64 tiles"),
};

}  // namespace attn_hopper

extern "C" const attn__cuda_rows attn__cuda_hopper_forward_rows = {
    attn_hopper::fwd_rows, (int)(sizeof attn_hopper::fwd_rows / sizeof attn_hopper::fwd_rows[0])};
