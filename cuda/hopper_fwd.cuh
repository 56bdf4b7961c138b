/*
 * Hopper forward pass (FlashAttention-2's forward steps on sm_90a's
 * warpgroup MMA, in FlashAttention-3's warp-specialized form): tiles of
 * (block of Br = 128 query rows, query head, sequence), a thread block per
 * tile or, when tiles are equally long, a block per SM that walks them
 * (persistent: launch_grid); consumer warpgroups of 64 rows each (wgmma's
 * M), two or, at d = 64, three (fwd_rows; one for TF32 at d = 256), and one
 * producer. The producer's one thread loads Q once and streams K and V
 * blocks of Bc keys through STAGES shared-memory slots with the bulk tensor
 * copy engine (TMA, the 128-byte swizzle that wgmma reads; wgmma.cuh), each
 * slot handed over on an mbarrier when its bytes land and handed back by the
 * consumers in two halves: K (with its bias) after the block's softmax, V
 * after its P V. V loads a block behind K, so that block j + 1's K need not
 * wait for block j's P V (at d = 128, 11-19 % of the forward on the H200).
 * The producer keeps 24 registers and the consumers take 240 (setmaxnreg).
 * Blocks no row of the tile can see (causal, windows) are skipped; only
 * blocks straddling a boundary are masked. Each consumer computes S = Q K^T
 * as one wgmma chain with both operands in shared memory, its fp32
 * accumulators in registers; the online softmax (m_i, l_i) runs on them in
 * the exp2 domain; P is packed to 16 bits in registers as the A operand
 * of O += P V, V read from shared memory through a transposed (MN-major)
 * descriptor. O / l_i and lse = m_i ln 2 + ln l_i are written once at the
 * end (rows with no key: 0 and -inf).
 *
 * As in FlashAttention-3, a consumer issues block j's Q K^T together with
 * block j-1's P V and runs block j's softmax while they execute, and up to
 * d = 128 the two consumers take turns issuing (ping-pong on named barriers),
 * so that the tensor cores work through the exponentials of either.
 *
 * Where the operands cannot be described by a tensor map, the same steps run
 * one after the other with every thread loading through cp.async into two
 * slots (fwd_kernel).
 *
 * A bias of the data's dtype rides with K: its tile of Br x Bc comes by TMA
 * (or cp.async) into a slot beside K's, swizzled the same way, and ldmatrix
 * reads it back in the accumulator layout of S, one instruction per two n8
 * tiles; with it the scores stay in natural units (scale q.k + bias, one
 * FMA), as in the tensor-core family.
 *
 * A KV cache (used lengths, rows appended before the call) reads the
 * cache's rows up to each sequence's used length, those past it in the last
 * block zeroed in shared memory; a sink joins each row's sum at the end.
 *
 * f32 runs the same kernel on TF32 wgmma (k8 steps, 32 bytes as a 16-bit
 * k16's, so Q's and K's tiles are laid out alike in bytes, 32 floats a
 * swizzled row), over copies that hopper_fwd_tf32.cu stages: q and k
 * rounded, and v as V^T, because TF32 takes both operands K-major; P goes
 * into P V as rounded fp32, not packed.
 *
 * The parameters, the masks and the score epilogue are the tensor-core
 * family's (mma_common.cuh, common.cuh); this family covers the problems of
 * its kernels but paged caches (rows a TMA box cannot gather) and a bias
 * of another dtype than the data's, which the plan gives to mma_fwd.cu.
 * The rows are hopper_fwd.cu's (f16, bf16) and hopper_fwd_tf32.cu's.
 */
#ifndef ATTN_HOPPER_FWD_CUH
#define ATTN_HOPPER_FWD_CUH

#include "mma_common.cuh"
#include "wgmma.cuh"

#include <cuda.h>
#include <cudaTypedefs.h>
#include <math.h>

namespace attn_hopper {

using namespace attn_mma;
namespace wg = attn_wgmma;

/* Query rows a tile: 64 a consumer warpgroup (wgmma's M), two of them in
 * the cp.async kernel, NC in the warp-specialized one (tile_rows). */
constexpr int kBr = 128;
__host__ __device__ constexpr int tile_rows(int nc) {
  return 64 * nc;
}

/* Shared-memory tiles hold whole 64-element column blocks (the swizzle's
 * row): d = 96 takes two, the last half empty (zeros from the tensor map;
 * Q K^T skips them, and P V's columns past d are never stored). */
__host__ __device__ constexpr int padded(int d) {
  return (d + 63) / 64 * 64;
}

/* Three consumers' 192-row tiles pad a sequence to a multiple of 192 rows:
 * 12 % more rows than 128-row tiles at 1024, 50 % at ViT's 197, 3 % at
 * 2048 and beyond; they are taken from this length on (rows' min_seqlen_q). */
constexpr int kMinRows3 = 2048;

/* A causal (windowed) row's last key block is part padding, the more the
 * wider the block: with 176-key blocks at 1024 keys the diagonal's blocks
 * do 15 % more work than with 128 (10 % slower on the H200), at 4096 about
 * 4 % (even), at 16384 under 1 % (4-6 % faster); 208-key blocks pad more
 * still. Masked problems take the rows of key blocks wider than 128 from
 * this length on (rows' min_keys_masked); unmasked ones from any length. */
constexpr int kMinKeysMaskedWide = 8192;

/* The warp-specialized kernel: a producer warpgroup and NC consumers. */
__host__ __device__ constexpr int threads_ws(int nc) {
  return 128 * (nc + 1);
}

/* The cp.async kernel: two warpgroups that load and compute. */
constexpr int kThreadsCp = 256;

/* ---------------------------------------------------------------------- */
/* A consumer warpgroup's 64 query rows                                     */
/* ---------------------------------------------------------------------- */

/* The online softmax of one warpgroup's rows over the key blocks, on
 * wgmma's accumulator layout (wgmma.cuh): each thread holds rows r0 and
 * r0 + 8 of the block (r0 = 16 w + g) and, per n8 tile, keys 2t, 2t + 1. */
template <typename T, int D, int BC, int BR, bool SCORED, bool BIAS>
struct rows64 {
  /* f32 runs as TF32: k8 steps (32 bytes, as a 16-bit k16), V^T's K-major
   * slot for P V (hopper_fwd_tf32.cu's staging), P rounded in registers. */
  static constexpr bool TF32 = std::is_same<T, float>::value;
  static constexpr int KS = 32 / (int)sizeof(T); /* k of one step */
  static constexpr int KD = D / KS;              /* k-steps of Q K^T */
  static constexpr int KB = BC / KS;             /* k-steps of P V */
  static constexpr int NS = BC / 8;              /* n8 tiles of S */
  static constexpr int NO = padded(D) / 8;       /* n8 tiles of O, d's and the padding's */
  using mma = wg::mma_of<T>;
  static_assert(!TF32 || !BIAS, "a bias tile is 16-bit (ldmatrix)");

  int m0, m_last, nq, nk;
  int i0; /* the thread's first row, m0 + r0 */
  int t;
  uint32_t bias_lane; /* BIAS: the byte offset of the lane's ldmatrix row in a bias tile, */
  uint32_t bias_xor;  /* and the swizzle of its chunks (the row mod 8) */
  float slope_log2;
  bool transform;
  float o[NO][4], m_i[2], l_i[2];
  float alpha[2]; /* the last block's rescaling of O, exp2(m_i before - m_i) */

  __device__ __forceinline__ rows64(const params &p, int m0_, int nq_, int nk_, int row0, int lane,
                                    int h)
      : m0(m0_),
        m_last(min(m0_ + BR, nq_) - 1),
        nq(nq_),
        nk(nk_),
        i0(m0_ + row0 + (lane >> 2)),
        t(lane & 3) {
    /* ldmatrix's lanes 8 m .. 8 m + 7 address the rows of matrix m: rows
     * row0 + 8 (m & 1) .., n8 tile 2 np + (m >> 1) (bias_pairs); a bias
     * that broadcasts over the rows has its one row. */
    const bool rows = p.bias_ss != 0;
    bias_lane = rows ? (uint32_t)((row0 + ((lane >> 3) & 1) * 8 + (lane & 7)) * 128) : 0u;
    bias_xor = rows ? (uint32_t)(lane & 7) : 0u;
    slope_log2 = SCORED && p.alibi ? p.alibi[h] * kLog2e : 0.f;
    transform = SCORED && (p.softcap > 0.f || slope_log2 != 0.f);
#pragma unroll
    for (int n = 0; n < NO; ++n)
      o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
    m_i[0] = m_i[1] = -INFINITY;
    l_i[0] = l_i[1] = 0.f;
  }

  /*
   * The two products are issued (issue_scores, issue_pv) between a
   * wgmma::fence, after the last ordinary write of the registers they use,
   * and a commit; their results are read after the wait for their group, the
   * registers pinned there (wgmma.cuh) so that no access moves across. The
   * cp.async kernel runs them one at a time (scores, accumulate); the
   * warp-specialized one overlaps block j's softmax with block j-1's P V.
   */

  /* S = Q K^T: D / 16 k-steps of m64 n(Bc) k16, the first overwriting. dq
   * describes the warpgroup's 64 rows of a Q tile of Q_ROWS rows, k_tile is
   * the K slot's shared address; column block kk / 4, 32 bytes a k16 in it. */
  template <int Q_ROWS>
  __device__ __forceinline__ void issue_scores(float (&s)[NS][4], uint64_t dq,
                                               uint32_t k_tile) const {
    const uint64_t dk = wg::desc_k_major(k_tile);
#pragma unroll
    for (int kk = 0; kk < KD; ++kk)
      mma::ss(s, dq + wg::kstep_k_major(Q_ROWS, kk), dk + wg::kstep_k_major(BC, kk), kk > 0);
  }

  /* O += P V, V's slot at v_tile: k-step kk reads its rows 16 kk.. (2048
   * bytes a step), the column blocks Bc * 128 bytes apart. TF32: the slot
   * holds V^T, [Bc / 32][padded(D)][32] (K-major, as K in Q K^T), k-step kk
   * 8 keys of column block kk / 4. */
  __device__ __forceinline__ void issue_pv(uint32_t (&pa)[KB][4], uint32_t v_tile) {
    if constexpr (TF32) {
      const uint64_t dv = wg::desc_k_major(v_tile);
#pragma unroll
      for (int kk = 0; kk < KB; ++kk)
        mma::rs(o, pa[kk], dv + wg::kstep_k_major(padded(D), kk), 1);
    } else {
      const uint64_t dv = wg::desc_mn_major(v_tile, BC * 128);
#pragma unroll
      for (int kk = 0; kk < KB; ++kk)
        mma::rs(o, pa[kk], dv + wg::kstep_mn_major(kk), 1);
    }
  }

  template <int Q_ROWS>
  __device__ __forceinline__ void scores(float (&s)[NS][4], uint64_t dq, uint32_t k_tile) const {
    wg::pin(s);
    wg::fence();
    issue_scores<Q_ROWS>(s, dq, k_tile);
    wg::commit();
    wg::wait<0>();
    wg::pin(s);
  }

  __device__ __forceinline__ void accumulate(uint32_t (&pa)[KB][4], uint32_t v_tile) {
    wg::pin(pa);
    wg::pin(o);
    wg::fence();
    issue_pv(pa, v_tile);
    wg::commit();
    wg::wait<0>();
    wg::pin(o);
  }

  /* BIAS: the bias of the thread's keys in n8 tiles 2 np and 2 np + 1 of
   * the tile at `tile` ([Bc / 64][BR][64], swizzled as K's): b[0], b[1]
   * rows r0 and r0 + 8 of tile 2 np, b[2], b[3] of 2 np + 1, each a pair
   * of keys 2t, 2t + 1 as wgmma's accumulators hold them. */
  __device__ __forceinline__ void bias_pairs(uint32_t tile, int np, uint32_t (&b)[4]) const {
    const int n = 2 * np + ((threadIdx.x & 31) >> 4);
    ldsm_x4(b, tile + (uint32_t)((n >> 3) * BR * 128) + bias_lane +
                   ((((uint32_t)n & 7u) ^ bias_xor) << 4));
  }

  /* Key block nb's scores to their exponentials, in place, with m_i and
   * l_i moved on; alpha says how O must be rescaled (rescale), which may
   * wait until O's last product is done. BIAS: the block's bias tile is at
   * bias_tile. */
  __device__ __forceinline__ void softmax(const params &p, float (&s)[NS][4], int nb,
                                          uint32_t bias_tile) {
    /* Scores in the log2 domain; the mask only on blocks that straddle a
     * boundary (sequence end, causal diagonal, window edge). Plain blocks
     * keep the raw q.k and fold the scale into the exp2's FMA below
     * (scale > 0, so the max commutes with it). With a bias and no
     * transform, scores stay in natural units, scale * q.k + bias, one
     * FMA, and log2(e) moves into the exp2's FMA instead. */
    const int n0 = nb * BC;
    const bool full =
        block_unmasked(m0, m_last, n0, n0 + BC, nq, nk, p.window_left, p.window_right);
    const bool natural = BIAS && !transform;
    const bool raw = full && !transform && !BIAS;
    const float mul = raw ? p.scale_log2 : natural ? kLog2e : 1.f;
    if (natural && full) {
      if constexpr (BIAS) {
#pragma unroll
        for (int np = 0; np < NS / 2; ++np) {
          uint32_t b[4];
          bias_pairs(bias_tile, np, b);
#pragma unroll
          for (int u = 0; u < 4; ++u) {
            const float2 v = elem<T>::unpack(b[u]);
            float *x = &s[2 * np + (u >> 1)][(u & 1) * 2];
            x[0] = fmaf(x[0], p.scale, v.x);
            x[1] = fmaf(x[1], p.scale, v.y);
          }
        }
      }
    } else if (!raw) {
      /* Visible keys of the thread's two rows, as [lo, hi) relative to the
       * thread's first column. */
      int lo[2], hi[2];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int dg = diag(i0 + r * 8, nq, nk);
        const int jt = n0 + 2 * t;
        lo[r] = full ? -BC : max(0, key_lo(dg, p.window_left)) - jt;
        hi[r] = full ? BC : min(nk, key_hi(dg, nk, p.window_right)) - jt;
      }
      uint32_t b[4] = {0u, 0u, 0u, 0u};
#pragma unroll
      for (int n = 0; n < NS; ++n) {
        float2 bv[2] = {make_float2(0.f, 0.f), make_float2(0.f, 0.f)};
        if constexpr (BIAS) {
          if (n % 2 == 0) bias_pairs(bias_tile, n / 2, b);
          bv[0] = elem<T>::unpack(b[(n & 1) * 2]);
          bv[1] = elem<T>::unpack(b[(n & 1) * 2 + 1]);
        }
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int r = e >> 1, c = n * 8 + (e & 1);
          const float bias = e & 1 ? bv[r].y : bv[r].x;
          float v = s[n][e];
          if (transform) {
            float th;
            v = score_log2(v, p.scale_log2, p.softcap_log2 > 0.f, p.softcap_log2, p.softcap_inv,
                           slope_log2, diag(i0 + r * 8, nq, nk) - (n0 + 2 * t + c), &th);
            if constexpr (BIAS) v = fmaf(bias, kLog2e, v);
          } else if (natural) {
            v = fmaf(v, p.scale, bias);
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
    float mu[2], rs[2] = {0.f, 0.f};
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
  }

  __device__ __forceinline__ void rescale() {
#pragma unroll
    for (int n = 0; n < NO; ++n) {
      o[n][0] *= alpha[0];
      o[n][1] *= alpha[0];
      o[n][2] *= alpha[1];
      o[n][3] *= alpha[1];
    }
  }

  /* P to 16 bits: k-step kk's A fragment of P V is n8 tiles 2 kk and
   * 2 kk + 1. TF32: n8 tile kk rounded, its keys 2t and 2t + 1 as A's
   * columns t and t + 4 (wgmma.cuh), which V^T's staging matches by storing
   * each 8 keys in the order 0, 2, 4, 6, 1, 3, 5, 7. */
  __device__ __forceinline__ void pack(const float (&s)[NS][4], uint32_t (&pa)[KB][4]) const {
#pragma unroll
    for (int kk = 0; kk < KB; ++kk) {
      if constexpr (TF32) {
        pa[kk][0] = elem<float>::tf32(s[kk][0]);
        pa[kk][1] = elem<float>::tf32(s[kk][2]);
        pa[kk][2] = elem<float>::tf32(s[kk][1]);
        pa[kk][3] = elem<float>::tf32(s[kk][3]);
      } else {
        a_frag<T>(pa[kk], s[2 * kk], s[2 * kk + 1]);
      }
    }
  }

  /* O = acc / l, lse = m ln 2 + ln l; rows with no key: 0 and -inf. A
   * sink joins l here, once (a row with no key then has lse = sink). */
  __device__ __forceinline__ void store(const params &p, int b, int h, const seq &sq) {
    T *go = row_ptr<T>(p.o, b, sq.q0, h);
    const float sink_log2 = p.sinks ? p.sinks[h * p.sinks_sh] * kLog2e : 0.f;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float l = l_i[r];
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      const int i = i0 + r * 8;
      /* The mask says whether the row saw a key, not l: a NaN or inf among
       * its scores leaves l NaN (or 0 when all are -inf), and the row must
       * then come out NaN rather than as a row that saw nothing. */
      int klo, khi;
      key_range(diag(i, nq, nk), nk, p.window_left, p.window_right, &klo, &khi);
      bool seen = row_seen(klo < khi, BIAS, m_i[r], l);
      float m = m_i[r], a = 1.f;
      if (p.sinks) {
        a = sink_fold_log2(sink_log2, &m, &l); /* no key: m = sink, l = 1, a = 0 */
        seen = true;
      }
      const float inv = seen ? a / l : 0.f;
      if (i < nq) {
        T *orow = go + (int64_t)i * p.o.ss;
#pragma unroll
        for (int n = 0; n < D / 8; ++n) {
          if constexpr (TF32)
            *(float2 *)(orow + n * 8 + 2 * t) =
                make_float2(o[n][2 * r] * inv, o[n][2 * r + 1] * inv);
          else
            *(uint32_t *)(orow + n * 8 + 2 * t) =
                elem<T>::pack(o[n][2 * r] * inv, o[n][2 * r + 1] * inv);
        }
        if (p.has_lse && t == 0)
          lse_store(row_ptr<float>(p.lse, b, sq.q0 + i, h), p.lse.sd, seen, m * kLn2, l);
      }
    }
  }
};

/* The block's work: its query block, head and sequence, and the key blocks
 * [nb_min, nb_min + nblocks) its rows see (the others are skipped). */
struct block_work {
  int m0, h, b, hk;
  seq sq;
  int nb_min, nblocks;
};

/* Query blocks a sequence has (the grid's x), and the tiles of a launch:
 * query blocks x query heads x sequences. */
template <int BR>
__device__ __forceinline__ int query_blocks(const params &p) {
  return (p.seqlen_q + BR - 1) / BR;
}
template <int BR>
__device__ __forceinline__ int tiles_of(const params &p) {
  return query_blocks<BR>(p) * p.heads_q * p.batch;
}

/* The block's first tile and the stride of its rounds: one tile a block
 * when the grid is the tiles'; when it is smaller (persistent), round r
 * gives the blocks tiles r * stride .. + stride - 1, in the blocks' order
 * in even rounds and the reverse in odd ones (tile_in_round). The tiles
 * come heaviest first (attn_tile_coords): a block that took one of the
 * longest tiles of a round takes one of the shortest of the next, so that
 * under a causal mask the blocks' sums stay level. */
__device__ __forceinline__ int first_tile() {
  return (int)(blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z));
}
__device__ __forceinline__ int tile_stride() {
  return (int)(gridDim.x * gridDim.y * gridDim.z);
}
__device__ __forceinline__ int tile_in_round(int r, int stride) {
  return r * stride + (r & 1 ? stride - 1 - first_tile() : first_tile());
}

template <int BC, int BR>
__device__ __forceinline__ block_work work_of(const params &p, int tile) {
  block_work w;
  int m_block;
  /* Heaviest blocks (most keys under a causal mask) start first. */
  attn_tile_coords(p.order, tile, query_blocks<BR>(p), p.heads_q, p.batch, &m_block, &w.h, &w.b);
  w.hk = w.h / p.group;
  w.sq = p.seqused ? seq_of_cache(p, w.b) : seq_of(p, w.b);
  w.m0 = m_block * BR;
  w.nb_min = w.nblocks = 0;
  if (w.m0 < w.sq.nq) {
    int j_lo, j_hi;
    key_block_range(w.m0, min(w.m0 + BR, w.sq.nq), w.sq.nq, w.sq.nk, p.window_left, p.window_right,
                    &j_lo, &j_hi);
    w.nb_min = j_lo / BC;
    w.nblocks = j_hi > j_lo ? (j_hi + BC - 1) / BC - w.nb_min : 0;
  }
  return w;
}

/* ---------------------------------------------------------------------- */
/* The warp-specialized kernel (TMA)                                        */
/* ---------------------------------------------------------------------- */

/* One kernel shape: head dim D (64, 96, 128 or 256; tiles of padded(D)
 * columns), Bc keys per step (64, 128, 176 or 208, the N of S's wgmma),
 * STAGES K/V slots. SCORED compiles the score transforms (softcap, ALiBi)
 * in, BIAS the bias. The maps are the 4-d views (head dim, rows, heads,
 * sequences) of q, k and v, with a box of 64 x Br (q) or 64 x Bc (k, v),
 * and the bias's (keys, rows, heads, sequences) with a box of 64 x Br
 * (64 x 1 where its rows broadcast), all with the 128-byte swizzle
 * (launcher). */
template <typename T, int D, int BC, int STAGES, int QS, int NC, bool SCORED, bool BIAS>
__global__ void __launch_bounds__(threads_ws(NC), 1)
    fwd_ws_kernel(const __grid_constant__ CUtensorMap tq, const __grid_constant__ CUtensorMap tk,
                  const __grid_constant__ CUtensorMap tv, const __grid_constant__ CUtensorMap tb,
                  const params p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int BR = tile_rows(NC), CT = 128 * NC; /* rows, consumer threads */
  using R = rows64<T, D, BC, BR, SCORED, BIAS>;
  constexpr int DP = padded(D);
  constexpr int kE = 128 / (int)sizeof(T); /* elements a swizzled row */
  constexpr uint32_t kQBytes = BR * DP * sizeof(T);
  constexpr uint32_t kSlot = BC * DP * sizeof(T);
  constexpr uint32_t kSlotB = BIAS ? BR * BC * sizeof(T) : 0;
  /* The registers each role keeps, FlashAttention-3's splits of the SM's
   * 64K: 24 x 128 + 240 x 256 for two consumers, 24 x 128 + 160 x 384 for
   * three; one consumer (TF32 at d = 256: O alone is 128 registers) takes
   * the 256 a thread may have: ptxas gives that kernel 255 with no spills
   * (nvcc -Xptxas -v), and a consumer may not keep fewer than its code
   * uses. */
  constexpr int kProducerRegs = 24, kConsumerRegs = NC == 1 ? 256 : NC == 2 ? 240 : 160;
  /* Two consumers take turns on the tensor cores up to d = 128, as in
   * FlashAttention-3 (at d = 256 its P V is long enough alone); three
   * overlap without turns. */
  constexpr bool PINGPONG = NC == 2 && D <= 128;
  static_assert(NC >= 1 && NC <= 3, "the register splits above");
  static_assert(D % 32 == 0 && BC % 16 == 0 && (!BIAS || BC % 64 == 0),
                "k16 steps of both products, whole 8-row groups, bias tiles of whole 64 keys");
  static_assert(sizeof(T) == 2 || BC % kE == 0, "TF32: V^T's column blocks of 32 keys");
  static_assert(STAGES >= 2 && QS >= 1, "at least double buffering");

  /* The swizzle works on shared addresses: every tile 1024-byte aligned
   * (the launcher asks 1024 bytes more than the tiles and barriers need). */
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const uint32_t sQ = (smem_addr(smem_raw) + 1023u) & ~1023u;
  const uint32_t sK = sQ + QS * kQBytes;   /* [STAGES][DP / 64][Bc][64]; Q: [QS][..] */
  const uint32_t sV = sK + STAGES * kSlot; /* [STAGES][DP / 64][Bc][64] */
  const uint32_t sB = sV + STAGES * kSlot; /* BIAS: [STAGES][Bc / 64][Br][64] */
  /* mbarriers, 8 bytes each: Q slot q landed, the consumers are done with
   * it; K/V slot s's K landed, its V landed, the consumers are done with
   * its K (and bias: after the block's softmax), with its V (after the
   * block's P V), and its bias landed (a barrier of its own, so that Q K^T
   * starts on K alone and the bias's bytes arrive under it). */
  const uint32_t barQ = sB + STAGES * kSlotB, emptyQ = barQ + 8 * QS;
  const uint32_t fullK = emptyQ + 8 * QS, fullV = fullK + 8 * STAGES;
  const uint32_t emptyK = fullV + 8 * STAGES, emptyV = emptyK + 8 * STAGES;
  const uint32_t fullB = emptyV + 8 * STAGES;

  const int tid = threadIdx.x, wgi = tid >> 7;
  const int tiles = tiles_of<BR>(p), stride = tile_stride();

  if (tid == 0) {
#pragma unroll
    for (int q = 0; q < QS; ++q) {
      wg::mbar_init(barQ + 8 * q, 1);
      wg::mbar_init(emptyQ + 8 * q, CT); /* every consumer thread */
    }
#pragma unroll
    for (int st = 0; st < STAGES; ++st) {
      wg::mbar_init(fullK + 8 * st, 1);
      wg::mbar_init(fullV + 8 * st, 1);
      wg::mbar_init(emptyK + 8 * st, CT);
      wg::mbar_init(emptyV + 8 * st, CT);
      wg::mbar_init(fullB + 8 * st, 1);
    }
    wg::mbar_init_fence();
  }
  __syncthreads();

  /*
   * A block takes a tile a round (tile_in_round; one when the grid is the
   * tiles'). Both roles walk the same tiles and skip the same ones (no
   * rows, no keys), so that they agree on two running counts: n, the tiles
   * with keys so far (tile n takes Q slot n % QS in round n / QS), and kv,
   * the K/V blocks so far (block kv takes slot kv % STAGES in round
   * kv / STAGES). A Q slot is handed back once a tile's last Q K^T is done:
   * the next tile's Q and first K/V blocks land under this one's last
   * products and stores, and with two Q slots (and STAGES at least twice a
   * tile's blocks) while it is computed.
   */
  if (wgi == 0) {
    /* Producer: one thread issues every copy. */
    wg::regs_dec<kProducerRegs>();
    if (tid != 0) return;
    int n = 0, kv = 0;
    for (int r = 0; r * stride < tiles; ++r) {
      const int tile = tile_in_round(r, stride);
      if (tile >= tiles) continue;
      const block_work w = work_of<BC, BR>(p, tile);
      if (w.m0 >= w.sq.nq || w.nblocks == 0) continue;
      /* Varlen tensors are one sequence of all the rows (batch coordinate
       * 0); rows past a tensor's end arrive as zeros. */
      const int qb = p.cu_q ? 0 : w.b, kb = p.cu_k ? 0 : w.b;
      const int q_row = (int)w.sq.q0 + w.m0, k_row = (int)w.sq.k0 + w.nb_min * BC;
      /* The bias's coordinates (broadcast dimensions: 0) and bytes a block. */
      const int b_row = p.bias_ss ? w.m0 : 0, b_h = p.bias_sh ? w.h : 0, b_b = p.bias_sb ? w.b : 0;
      const uint32_t bias_bytes = p.bias_ss ? kSlotB : kSlotB / BR;
      const int qs = n % QS, q_round = n / QS;
      if (q_round > 0) wg::mbar_wait(emptyQ + 8 * qs, (uint32_t)(q_round - 1) & 1);
      ++n;
      wg::mbar_expect_tx(barQ + 8 * qs, kQBytes);
#pragma unroll
      for (int cb = 0; cb < DP / kE; ++cb)
        wg::tma_load_4d(sQ + qs * kQBytes + cb * BR * 128, &tq, cb * kE, q_row, w.h, qb,
                        barQ + 8 * qs);
      /* Block g's V into its slot once the consumers' P V of the slot's
       * previous block is done. V runs a block behind K: the consumers
       * release a K slot after the block's softmax, a V slot only after the
       * next block's P V, so K of block j + 1 is free to load before V of
       * block j. TF32: V^T's boxes of 32 keys by every column. */
      auto load_v = [&](int g, int row) {
        const int st = g % STAGES, round = g / STAGES;
        if (round > 0) wg::mbar_wait(emptyV + 8 * st, (uint32_t)(round - 1) & 1);
        wg::mbar_expect_tx(fullV + 8 * st, kSlot);
        if constexpr (R::TF32) {
#pragma unroll
          for (int cb = 0; cb < BC / kE; ++cb)
            wg::tma_load_4d(sV + st * kSlot + cb * DP * 128, &tv, row + cb * kE, 0, w.hk, kb,
                            fullV + 8 * st);
        } else {
#pragma unroll
          for (int cb = 0; cb < DP / 64; ++cb)
            wg::tma_load_4d(sV + st * kSlot + cb * BC * 128, &tv, cb * 64, row, w.hk, kb,
                            fullV + 8 * st);
        }
      };
      for (int it = 0; it < w.nblocks; ++it, ++kv) {
        const int st = kv % STAGES, round = kv / STAGES;
        /* The slot's previous K (and bias) block (round - 1) is released. */
        if (round > 0) wg::mbar_wait(emptyK + 8 * st, (uint32_t)(round - 1) & 1);
        const int row = k_row + it * BC;
        wg::mbar_expect_tx(fullK + 8 * st, kSlot);
#pragma unroll
        for (int cb = 0; cb < DP / kE; ++cb)
          wg::tma_load_4d(sK + st * kSlot + cb * BC * 128, &tk, cb * kE, row, w.hk, kb,
                          fullK + 8 * st);
        if constexpr (BIAS) {
          wg::mbar_expect_tx(fullB + 8 * st, bias_bytes);
#pragma unroll
          for (int cb = 0; cb < BC / 64; ++cb)
            wg::tma_load_4d(sB + st * kSlotB + cb * BR * 128, &tb, (w.nb_min + it) * BC + cb * 64,
                            b_row, b_h, b_b, fullB + 8 * st);
        }
        if (it > 0) load_v(kv - 1, row - BC);
      }
      load_v(kv - 1, k_row + (w.nblocks - 1) * BC);
    }
    return;
  }

  /* Consumers: warpgroup c owns rows 64 c .. 64 c + 63. Block j's softmax
   * runs while the tensor cores do block j-1's P V (issued with block j's
   * Q K^T), so O's rescaling by block j waits for that product, and P_j is
   * packed only once P_(j-1)'s registers are free again. */
  wg::regs_inc<kConsumerRegs>();
  const int c = wgi - 1, lane = tid & 31, ctid = tid - 128;
  auto stage = [](int g) { return (uint32_t)(g % STAGES); };
  auto parity = [](int g) { return (uint32_t)(g / STAGES) & 1; };
  int n = 0, kv = 0;
  for (int r = 0; r * stride < tiles; ++r) {
    const int tile = tile_in_round(r, stride);
    if (tile >= tiles) continue;
    const block_work w = work_of<BC, BR>(p, tile);
    if (w.m0 >= w.sq.nq) continue;
    R rows(p, w.m0, w.sq.nq, w.sq.nk, c * 64 + ((tid >> 5) & 3) * 16, lane, w.h);
    if (w.nblocks > 0) {
      float s[R::NS][4];
      uint32_t pa[R::KB][4];
      const uint32_t qs = (uint32_t)(n % QS);
      const uint64_t dq = wg::desc_k_major(sQ + qs * kQBytes + c * 64 * 128);
      wg::mbar_wait(barQ + 8 * qs, (uint32_t)(n / QS) & 1);
      wg::mbar_wait(fullK + 8 * stage(kv), parity(kv));
      rows.template scores<BR>(s, dq, sK + stage(kv) * kSlot);
      if constexpr (BIAS) wg::mbar_wait(fullB + 8 * stage(kv), parity(kv));
      rows.softmax(p, s, w.nb_min, sB + stage(kv) * kSlotB);
      wg::mbar_arrive(emptyK + 8 * stage(kv));
      rows.rescale();
      rows.pack(s, pa);
      /* Ping-pong (FlashAttention-3's scheduler barriers, ids 2 and 3): the
       * warpgroups take turns issuing their products, so that one's softmax
       * fills the tensor cores' time of the other's. The first turn is
       * consumer 0's; a tile hands its last turn on to the next, so the
       * first turn is given once, on the block's first tile. */
      if (PINGPONG && c == 0 && n == 0) wg::named_arrive(2, 256);
      for (int it = 1; it < w.nblocks; ++it) {
        const int cur = kv + it, prev = cur - 1;
        if (PINGPONG) wg::named_sync(2 + c, 256);
        wg::mbar_wait(fullK + 8 * stage(cur), parity(cur));
        wg::mbar_wait(fullV + 8 * stage(prev), parity(prev));
        wg::pin(s);
        wg::pin(pa);
        wg::pin(rows.o);
        wg::fence();
        rows.template issue_scores<BR>(s, dq, sK + stage(cur) * kSlot);
        wg::commit();
        rows.issue_pv(pa, sV + stage(prev) * kSlot);
        wg::commit();
        if (PINGPONG) wg::named_arrive(2 + (1 - c), 256);
        wg::wait<1>();
        wg::pin(s);
        if constexpr (BIAS) wg::mbar_wait(fullB + 8 * stage(cur), parity(cur));
        rows.softmax(p, s, w.nb_min + it, sB + stage(cur) * kSlotB);
        wg::mbar_arrive(emptyK + 8 * stage(cur));
        wg::wait<0>();
        wg::pin(rows.o);
        wg::pin(pa);
        wg::mbar_arrive(emptyV + 8 * stage(prev));
        rows.rescale();
        rows.pack(s, pa);
      }
      /* Every Q K^T of the tile is done: its Q slot goes to a next tile. */
      wg::mbar_arrive(emptyQ + 8 * qs);
      const int last = kv + w.nblocks - 1, nb = w.nb_min + w.nblocks - 1;
      wg::mbar_wait(fullV + 8 * stage(last), parity(last));
      /* (TF32 rows take neither: their staging is dense.) */
      if (!R::TF32 && (p.cu_k || p.seqused) && (nb + 1) * BC > w.sq.nk) {
        /* The block's rows past a varlen sequence's end are the next
         * sequence's, past a cache's used length whatever it holds: zeros
         * instead, so that P's zeros meet no inf or NaN
         * there. It is the last block, which both consumers reach. */
        const int z0 = w.sq.nk - nb * BC;
        for (int i = ctid; i < (BC - z0) * (DP / 8); i += CT)
          asm volatile(
              "st.shared.v4.u32 [%0], {%1, %1, %1, %1};\n" ::"r"(
                  sV + stage(last) * kSlot + wg::swizzled(BC, z0 + i / (DP / 8), i % (DP / 8))),
              "r"(0)
              : "memory");
        wg::fence_proxy_async();
        wg::named_sync(1, CT);
      }
      rows.accumulate(pa, sV + stage(last) * kSlot);
      wg::mbar_arrive(emptyV + 8 * stage(last));
      kv += w.nblocks;
      ++n;
    }
    rows.store(p, w.b, w.h, w.sq);
  }
#else
  __trap();
#endif
}

/* ---------------------------------------------------------------------- */
/* The cp.async kernel                                                      */
/* ---------------------------------------------------------------------- */

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
  for (int c0 = 0; c0 < kTotal; c0 += kThreadsCp) {
    const int c = c0 + tid;
    if (kTotal % kThreadsCp == 0 || c < kTotal) {
      const int r = c / kChunks, ch = c % kChunks;
      const bool ok = row0 + r < nrows;
      cp_async16_to(s + wg::swizzled(ROWS, r, ch), ok ? g + (int64_t)(row0 + r) * ss + ch * 8 : g,
                    ok);
    }
  }
}

/* The bias of rows row0.. and keys col0 .. col0 + BC - 1 (row stride ss,
 * 0 where the rows broadcast: then row 0 alone) into the swizzled tile at s
 * as the tensor map lays it out ([BC / 64][kBr][64]); rows at or past nrows
 * and keys at or past ncols are zeros (a chunk that straddles ncols is read
 * in part); rows of any length, which no tensor map describes, by
 * cp_async16_any. */
template <int BC, typename T>
__device__ __forceinline__ void load_bias(uint32_t s, const T *g, int64_t ss, int row0, int nrows,
                                          int col0, int ncols, int tid) {
  constexpr int kChunks = BC / 8;
  const int rows = ss ? kBr : 1;
  for (int c = tid; c < rows * kChunks; c += kThreadsCp) {
    const int r = c / kChunks, ch = c % kChunks, left = ncols - (col0 + ch * 8);
    const int bytes = row0 + r >= nrows || left <= 0 ? 0 : left >= 8 ? 16 : left * 2;
    attn_copy::cp_async16_any<false, sizeof(T)>(
        s + wg::swizzled(kBr, r, ch), bytes ? g + (int64_t)(row0 + r) * ss + col0 + ch * 8 : g,
        bytes);
  }
}

/* The same steps with both warpgroups loading (cp.async into two slots,
 * block j+1 in flight while block j is computed) and computing. */
template <typename T, int D, int BC, bool SCORED, bool BIAS>
__global__ void __launch_bounds__(kThreadsCp, 1) fwd_kernel(const params p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using R = rows64<T, D, BC, kBr, SCORED, BIAS>;
  constexpr int STAGES = 2;
  constexpr int DP = padded(D);
  constexpr uint32_t kQBytes = kBr * DP * sizeof(T);
  constexpr uint32_t kSlot = BC * DP * sizeof(T);
  constexpr uint32_t kSlotB = BIAS ? kBr * BC * sizeof(T) : 0;
  static_assert(D % 32 == 0 && BC % 16 == 0 && (!BIAS || BC % 64 == 0),
                "k16 steps of both products, whole 8-row groups, bias tiles of whole 64 keys");
  static_assert(sizeof(T) == 2, "16-bit elements: 64 a swizzled row");

  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const uint32_t sQ = (smem_addr(smem_raw) + 1023u) & ~1023u;
  const uint32_t sK = sQ + kQBytes;        /* [STAGES][DP / 64][Bc][64] */
  const uint32_t sV = sK + STAGES * kSlot; /* [STAGES][DP / 64][Bc][64] */
  const uint32_t sB = sV + STAGES * kSlot; /* BIAS: [STAGES][Bc / 64][Br][64] */

  const int tid = threadIdx.x, lane = tid & 31, wgi = tid >> 7;
  const block_work w = work_of<BC, kBr>(p, first_tile());
  if (w.m0 >= w.sq.nq) return;
  const int nk = w.sq.nk;
  const T *gq = row_ptr<T>(p.q, w.b, w.sq.q0, w.h);
  const T *gk = row_ptr<T>(p.k, w.b, w.sq.k0, w.hk);
  const T *gv = row_ptr<T>(p.v, w.b, w.sq.k0, w.hk);
  const T *gb = BIAS ? (const T *)p.bias + w.b * p.bias_sb + w.h * p.bias_sh : nullptr;
  auto load_kv = [&](int st, int nbk) {
    load_tile<BC, D>(sK + st * kSlot, gk, p.k.ss, nbk * BC, nk, tid);
    load_tile<BC, D>(sV + st * kSlot, gv, p.v.ss, nbk * BC, nk, tid);
    if constexpr (BIAS)
      load_bias<BC>(sB + st * kSlotB, gb, p.bias_ss, w.m0, w.sq.nq, nbk * BC, nk, tid);
  };

  R rows(p, w.m0, w.sq.nq, nk, wgi * 64 + ((tid >> 5) & 3) * 16, lane, w.h);
  if (w.nblocks > 0) {
    const uint64_t dq = wg::desc_k_major(sQ + wgi * 64 * 128);
    /* Prologue: Q with the first K/V block; one commit group per block
     * (empty groups keep the count uniform). */
    load_tile<kBr, D>(sQ, gq, p.q.ss, w.m0, w.sq.nq, tid);
    load_kv(0, w.nb_min);
    cp_async_commit();
    for (int it = 0; it < w.nblocks; ++it) {
      const uint32_t slot = (uint32_t)(it % STAGES) * kSlot;
      /* Block it has landed and is handed to the async proxy (wgmma); both
       * warpgroups are done with block it-1, whose slot the load below
       * reuses (each waited for its wgmma before this barrier). */
      cp_async_wait<0>();
      wg::fence_proxy_async();
      __syncthreads();
      if (it + 1 < w.nblocks) load_kv((it + 1) % STAGES, w.nb_min + it + 1);
      cp_async_commit();
      float s[R::NS][4];
      uint32_t pa[R::KB][4];
      rows.template scores<kBr>(s, dq, sK + slot);
      rows.softmax(p, s, w.nb_min + it, sB + (uint32_t)(it % STAGES) * kSlotB);
      rows.rescale();
      rows.pack(s, pa);
      rows.accumulate(pa, sV + slot);
    }
    /* Drain the trailing (empty) group before the block exits. */
    cp_async_wait_all();
  }
  rows.store(p, w.b, w.h, w.sq);
#else
  __trap();
#endif
}

/* ---------------------------------------------------------------------- */
/* Launchers and rows                                                       */
/* ---------------------------------------------------------------------- */

/* Shared memory: the tiles, 4 STAGES + 2 QS mbarriers (the cp.async kernel has
 * two slots and needs none), and the 1024 bytes that align the tiles; a
 * bias adds a Br x Bc tile a slot (bias_smem). */
__host__ __device__ constexpr size_t bias_smem(int bc, int stages, int br) {
  return (size_t)stages * br * bc * 2;
}
template <typename T, int D, int BC, int STAGES, int QS, int NC, bool BIAS = false>
constexpr size_t smem_ws() {
  return (size_t)(QS * tile_rows(NC) + 2 * STAGES * BC) * padded(D) * sizeof(T) +
         8 * (5 * STAGES + 2 * QS) + 1024 + (BIAS ? bias_smem(BC, STAGES, tile_rows(NC)) : 0);
}
template <int D, int BC, bool BIAS = false>
constexpr size_t smem_cp() {
  return (size_t)(kBr + 2 * 2 * BC) * padded(D) * 2 + 1024 + (BIAS ? bias_smem(BC, 2, kBr) : 0);
}

/* The grid: a block a tile, or, for the warp-specialized kernel when more
 * tiles than fit at once, one block a resident slot that walks the tiles
 * (persistent, tile_in_round), so that a tile's loads land under the
 * previous one's last products and stores instead of after a block's
 * start. */
template <typename K>
static int launch_grid(const attn__cuda_launch *L, K kern, int threads, size_t smem, int br,
                       params *p, bool persistent, dim3 *grid) {
  if (cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) !=
      cudaSuccess)
    return ATTN_EDEVICE;
  *grid = dim3((unsigned)((p->seqlen_q + br - 1) / br), (unsigned)p->heads_q, (unsigned)p->batch);
  p->order = attn_order_group(kern, threads, smem, *grid, L->dev->sm_count, p->window_left,
                              p->window_right);
  if (persistent) {
    const long long tiles = (long long)grid->x * grid->y * grid->z;
    const long long slots = attn_resident_blocks(kern, threads, smem, L->dev->sm_count);
    if (tiles > slots) *grid = dim3((unsigned)slots);
  }
  return ATTN_OK;
}

/* The warp-specialized kernel over the tensor maps of q, k and v (and the
 * bias). */
template <typename T, int D, int BC, int STAGES, int QS, int NC, bool SCORED, bool BIAS>
static int launch_ws(const attn__cuda_launch *L, params p, const CUtensorMap &tq,
                     const CUtensorMap &tk, const CUtensorMap &tv, const CUtensorMap &tb) {
  auto kern = fwd_ws_kernel<T, D, BC, STAGES, QS, NC, SCORED, BIAS>;
  constexpr size_t smem = smem_ws<T, D, BC, STAGES, QS, NC, BIAS>();
  constexpr int threads = threads_ws(NC);
  dim3 grid;
  const int st = launch_grid(L, kern, threads, smem, tile_rows(NC), &p, true, &grid);
  if (st != ATTN_OK) return st;
  kern<<<grid, threads, smem, L->stream>>>(tq, tk, tv, tb, p);
  return cudaGetLastError() == cudaSuccess ? ATTN_OK : ATTN_EDEVICE;
}

template <typename T, int D, int BC, int STAGES, int QS, int NC, bool SCORED, bool BIAS>
static int launch_kernel(const attn__cuda_launch *L, params p) {
  const attn__problem *pb = L->pb;
  CUtensorMap tq, tk, tv, tb = {};
  const int64_t seqs = pb->varlen ? 1 : pb->batch;
  const int64_t rows_q = pb->varlen ? pb->total_q : pb->seqlen_q;
  const int64_t rows_k = pb->varlen ? pb->total_k : pb->seqlen_k;
  auto encode = [&](CUtensorMap *m, const tensor_ref &t, int64_t rows, int64_t heads, int box) {
    return wg::encode_rows<T>(m, t.ptr, D, rows, heads, seqs, t.ss, t.sh, t.sb, box);
  };
  /* The bias as [sequences][heads][rows][keys], a broadcast dimension of
   * one (its coordinate 0 in the kernel). */
  constexpr int BR = tile_rows(NC);
  auto encode_bias = [&]() {
    const attn__tensor &b = pb->bias;
    const int64_t n[3] = {b.ss ? pb->seqlen_q : 1, b.sh ? pb->heads_q : 1, b.sb ? pb->batch : 1};
    return wg::encode_rows<T>(&tb, const_cast<void *>(p.bias), (int)pb->seqlen_k, n[0], n[1], n[2],
                              b.ss, b.sh, b.sb, b.ss ? BR : 1);
  };
  if (encode(&tq, p.q, rows_q, pb->heads_q, BR) && encode(&tk, p.k, rows_k, pb->heads_kv, BC) &&
      encode(&tv, p.v, rows_k, pb->heads_kv, BC) && (!BIAS || encode_bias()))
    return launch_ws<T, D, BC, STAGES, QS, NC, SCORED, BIAS>(L, p, tq, tk, tv, tb);
  auto kern = fwd_kernel<T, D, BC, SCORED, BIAS>;
  constexpr size_t smem = smem_cp<D, BC, BIAS>();
  dim3 grid;
  const int st = launch_grid(L, kern, kThreadsCp, smem, kBr, &p, false, &grid);
  if (st != ATTN_OK) return st;
  kern<<<grid, kThreadsCp, smem, L->stream>>>(p);
  return cudaGetLastError() == cudaSuccess ? ATTN_OK : ATTN_EDEVICE;
}

/* f32 as TF32 (hopper_fwd_tf32.cu): q, k and v staged rounded into the
 * workspace, then launch_ws over them. */
template <int D, int BC, int STAGES, int QS, int NC, bool SCORED>
int launch_tf32(const attn__cuda_launch *L, params p);

/* Whether a row's tiles leave room for a bias's in sm_90's 227 KB of
 * shared memory a block: its bias kernels are compiled, and the row takes
 * a bias (features), only then; never under TF32. */
template <typename T, int D, int BC, int STAGES, int QS, int NC>
constexpr bool bias_fits() {
  return sizeof(T) == 2 && BC % 64 == 0 &&
         smem_ws<T, D, BC, STAGES, QS, NC, true>() <= (size_t)227 * 1024;
}

template <typename T, int D, int BC, int STAGES, int QS, int NC>
static int launch_fwd(const attn__cuda_launch *L, const attn__cuda_config *c) {
  (void)c;
  params p;
  make_params(L, 0, &p);
  const bool scored = p.softcap > 0.f || p.alibi;
  if constexpr (std::is_same<T, float>::value) {
    return scored ? launch_tf32<D, BC, STAGES, QS, NC, true>(L, p)
                  : launch_tf32<D, BC, STAGES, QS, NC, false>(L, p);
  } else {
    if (L->pb->has_bias) {
      if constexpr (bias_fits<T, D, BC, STAGES, QS, NC>())
        return scored ? launch_kernel<T, D, BC, STAGES, QS, NC, true, true>(L, p)
                      : launch_kernel<T, D, BC, STAGES, QS, NC, false, true>(L, p);
      return ATTN_EINTERNAL; /* the plan gives this row no bias */
    }
    return scored ? launch_kernel<T, D, BC, STAGES, QS, NC, true, false>(L, p)
                  : launch_kernel<T, D, BC, STAGES, QS, NC, false, false>(L, p);
  }
}

/* A row of the family: f16 and bf16 (hopper_fwd.cu), or f32 as TF32
 * (hopper_fwd_tf32.cu, for problems that allow it: no bias, no KV cache). */
template <typename T, int D, int BC, int STAGES, int QS, int NC>
constexpr attn__cuda_config fwd_row(const char *name) {
  constexpr bool tf32 = std::is_same<T, float>::value;
  constexpr size_t ws = smem_ws<T, D, BC, STAGES, QS, NC>(), cp = tf32 ? 0 : smem_cp<D, BC>();
  return {
      .kernel = ATTN__CUDA_HOPPER_FORWARD,
      .dtype = tf32                             ? ATTN_F32
               : std::is_same<T, __half>::value ? ATTN_F16
                                                : ATTN_BF16,
      .dim = D,
      .cc = 90,
      .specific = 1,
      .tf32 = tf32,
      .threads = threads_ws(NC),
      .br = tile_rows(NC),
      .bc = BC,
      .stages = STAGES,
      .min_seqlen_q = NC == 3 ? kMinRows3 : 0,
      .min_keys_masked = BC > 128 ? kMinKeysMaskedWide : 0,
      .smem = ws > cp ? ws : cp,
      .smem_det = 0,
      .features = tf32 ? (unsigned)ATTN__USES_SINKS
                       : (bias_fits<T, D, BC, STAGES, QS, NC>() ? (unsigned)ATTN__USES_BIAS : 0u) |
                             ATTN__USES_SEQUSED | ATTN__USES_APPEND | ATTN__USES_SINKS,
      .nondeterministic = 0,
      .name = name,
      .launch = launch_fwd<T, D, BC, STAGES, QS, NC>};
}

}  // namespace attn_hopper

#endif /* ATTN_HOPPER_FWD_CUH */
