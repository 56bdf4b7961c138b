/*
 * Tensor-core backward pass (FlashAttention-2, backward), four launches:
 *   1. prep:  D = rowsum(dO * O) and lse2 = lse * log2(e) per query row and
 *             head (lse2 = +inf where lse = -inf, so a row with no key gets
 *             P = exp2(s - lse2) = 0 and passes no gradient, never NaN).
 *   2. dkdv:  one thread block per (block of Bc keys, kv head, sequence),
 *             each warp owning 16 keys with dK and dV in fp32 registers; it
 *             loops over the query heads of the GQA group and the query blocks
 *             that see these keys (Q, dO double-buffered with cp.async),
 *             recomputing S^T = K Q^T and P^T = exp2(S^T - lse2) on tensor
 *             cores, then dV += P^T dO, dP^T = V dO^T, dS^T = P^T (dP^T - D)
 *             (times the softcap derivative), dK += dS^T Q, and in atomic mode
 *             dQ += dS K through shared memory and fp32 atomics.
 *   3. dq:    deterministic mode only: one block per (Br query rows, head,
 *             sequence) looping over key blocks (K, V double-buffered),
 *             recomputing S, P, dP, dS and accumulating dQ = dS K in registers:
 *             a fixed order, no atomics.
 *   4. dq_convert: atomic mode only: the fp32 accumulator to dq's dtype and
 *             strides, times the softmax scale.
 * The softmax scale multiplies dK and dQ once at the end.
 */
#include "bwd_common.cuh"

#include <math.h>

namespace attn_mma {

/* acc = A B^T for one warp: A is 16 rows at the per-lane address a, B is
 * NS * 8 rows at b (row stride LD elements), both KD columns long. */
template <typename T, int NS, int KD, int LD>
__device__ __forceinline__ void warp_abt(float (&acc)[NS][4], uint32_t a, uint32_t b) {
#pragma unroll
  for (int n = 0; n < NS; ++n)
    acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;
#pragma unroll
  for (int kk = 0; kk < KD / 16; ++kk) {
    uint32_t af[4];
    ldsm_x4(af, a + kk * 16 * sizeof(T));
#pragma unroll
    for (int np = 0; np < NS / 2; ++np) {
      uint32_t bb[4];
      ldsm_x4(bb, b + (np * 16 * LD + kk * 16) * sizeof(T));
      elem<T>::mma(acc[2 * np], af, bb[0], bb[1]);
      elem<T>::mma(acc[2 * np + 1], af, bb[2], bb[3]);
    }
  }
}

/* acc += X B for one warp: X is the warp's 16 x (NX * 8) tile in registers
 * (an accumulator layout, packed to T as the A operand), B is NX * 8 rows of
 * NO * 8 columns at the per-lane address b, read transposed. */
template <typename T, int NX, int NO, int LD>
__device__ __forceinline__ void warp_xb(float (&acc)[NO][4], const float (&x)[NX][4], uint32_t b) {
#pragma unroll
  for (int kk = 0; kk < NX / 2; ++kk) {
    uint32_t a[4];
    a_frag<T>(a, x[2 * kk], x[2 * kk + 1]);
#pragma unroll
    for (int np = 0; np < NO / 2; ++np) {
      uint32_t bb[4];
      ldsm_x4_t(bb, b + (kk * 16 * LD + np * 16) * sizeof(T));
      elem<T>::mma(acc[2 * np], a, bb[0], bb[1]);
      elem<T>::mma(acc[2 * np + 1], a, bb[2], bb[3]);
    }
  }
}

/* The bias element at shared address a: f32 (BIAS 4) or of q's dtype. */
template <typename T, int BIAS>
__device__ __forceinline__ float bias_lds(uint32_t a) {
  return BIAS == 4 ? __uint_as_float(lds32(a)) : elem<T>::unpack(lds16(a)).x;
}

/* BIAS: the bias's element size (0: none; 2: T; 4: float), its tiles
 * riding with Q and dO; the plain kernels keep no registers for it. */
template <typename T, int D, int BC, int BR, int NW, bool SOFTCAP, int BIAS = 0>
__global__ void __launch_bounds__(NW * 32, 1) dkdv_kernel(const params p) {
#if ATTN_CUDA_SM75
  if (!mma_here<T>()) {
    __trap(); /* the plan runs T only on mma_cc<T>() code */
    return;
  }
  using BT = std::conditional_t<BIAS == 4, float, T>;
  constexpr int NT = NW * 32;
  constexpr int LD = D + kPad;
  constexpr int LDS = BR + kPad; /* dS^T tile [Bc][Br] */
  constexpr int LDB = BC + kPad; /* bias tile [Br][Bc] */
  constexpr int NS = BR / 8;     /* n-tiles of S^T (query columns) */
  constexpr int NO = D / 8;      /* n-tiles of dK, dV */
  constexpr int MT = BR / 16;    /* m-tiles of the dQ product */
  constexpr int WPM = NW / MT;   /* warps sharing one dQ m-tile */
  constexpr int DW = D / WPM;    /* dQ columns per warp */
  static_assert(BC == 16 * NW, "one m16 slab of keys per warp");
  static_assert(NW % MT == 0 && DW % 16 == 0, "dQ split across warps");

  extern __shared__ __align__(16) unsigned char smem_raw[];
  T *sK = (T *)smem_raw;
  T *sV = sK + BC * LD;
  T *sQ = sV + BC * LD;                  /* [2][Br][LD] */
  T *sdO = sQ + 2 * BR * LD;             /* [2][Br][LD] */
  T *sdS = sdO + 2 * BR * LD;            /* [Bc][LDS] */
  float *sL = (float *)(sdS + BC * LDS); /* [2][Br] */
  float *sD = sL + 2 * BR;               /* [2][Br] */
  BT *sB = (BT *)(sD + 2 * BR);          /* BIAS: [2][Br][LDB] */
  constexpr uint32_t kSlotB = BR * LDB * sizeof(BT);

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t = lane & 3;
  int kb, hk, b;
  attn_key_block_coords(p.order, &kb, &hk, &b);
  if (hk >= p.heads_kv) return;
  const seq sq = seq_of(p, b);
  const int nq = sq.nq, nk = sq.nk;
  const int n0 = kb * BC;
  if (n0 >= nk) return;
  const int n_last = min(n0 + BC, nk) - 1;

  /* Query rows that see any of these keys. */
  int i_lo, i_hi;
  query_block_range(n0, n_last + 1, nq, nk, p.window_left, p.window_right, &i_lo, &i_hi);
  const int mb_min = i_lo / BR;
  const int nmb = i_hi > i_lo ? (i_hi + BR - 1) / BR - mb_min : 0;
  const int items = nmb * p.group;

  const T *gk = row_ptr<T>(p.k, b, sq.k0, hk);
  const T *gv = row_ptr<T>(p.v, b, sq.k0, hk);

  float acc_dk[NO][4], acc_dv[NO][4];
#pragma unroll
  for (int n = 0; n < NO; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      acc_dk[n][e] = acc_dv[n][e] = 0.f;

  /* Queue the Q, dO tiles of item `it` (query head, query block) into
   * buffer `buf`, and store its lse2 and D rows (plain stores: the barrier
   * at the top of the item that uses them publishes them). */
  auto fetch = [&](int it, int buf) {
    const int h = hk * p.group + it / nmb;
    const int i0 = (mb_min + it % nmb) * BR;
    load_tile<BR, D, NT>(sQ + buf * BR * LD, row_ptr<T>(p.q, b, sq.q0, h), p.q.ss, i0, nq, tid);
    load_tile<BR, D, NT>(sdO + buf * BR * LD, row_ptr<T>(p.dout, b, sq.q0, h), p.dout.ss, i0, nq,
                         tid);
    if constexpr (BIAS != 0)
      load_bias_tile<BR, BC, NT>(smem_addr(sB) + buf * kSlotB,
                                 (const BT *)p.bias + b * p.bias_sb + h * p.bias_sh, p.bias_ss, i0,
                                 nq, n0, nk, tid);
    cp_async_commit();
    if (tid < BR) {
      const int i = i0 + tid;
      const bool ok = i < nq;
      const int64_t w = ok ? ws_row(p, sq, b, h, i) : 0;
      sL[buf * BR + tid] = ok ? p.lse2[w] : INFINITY;
      sD[buf * BR + tid] = ok ? p.dsum[w] : 0.f;
    }
  };

  /* Per-lane shared addresses of the fragment loads (bytes), see
   * mma_common.cuh: A of K and V (this warp's keys), B of Q and dO either
   * way round, the transposed A of dS^T and the B of K for dQ. */
  const uint32_t aK = smem_addr(sK) + (warp * 16 * LD + lane_a<LD>(lane)) * sizeof(T);
  const uint32_t aV = smem_addr(sV) + (warp * 16 * LD + lane_a<LD>(lane)) * sizeof(T);
  const uint32_t bQ_nk = smem_addr(sQ) + lane_b_nk<LD>(lane) * sizeof(T);
  const uint32_t bQ_kn = smem_addr(sQ) + lane_b_kn<LD>(lane) * sizeof(T);
  const uint32_t bO_nk = smem_addr(sdO) + lane_b_nk<LD>(lane) * sizeof(T);
  const uint32_t bO_kn = smem_addr(sdO) + lane_b_kn<LD>(lane) * sizeof(T);
  /* BIAS: this thread's key g of the warp's 16 in the bias tile's query
   * row 2t. */
  const uint32_t aB = smem_addr(sB) + ((2 * t) * LDB + warp * 16 + g) * sizeof(BT);

  if (items > 0) {
    load_tile<BC, D, NT>(sK, gk, p.k.ss, n0, nk, tid);
    load_tile<BC, D, NT>(sV, gv, p.v.ss, n0, nk, tid);
    fetch(0, 0);
  }

  for (int it = 0; it < items; ++it) {
    const int buf = it & 1;
    const int h = hk * p.group + it / nmb;
    const int i0 = (mb_min + it % nmb) * BR;
    const uint32_t bufo = buf * BR * LD * sizeof(T);
    const float *cL = sL + buf * BR;
    const float *cD = sD + buf * BR;
    const float slope_log2 = p.alibi ? p.alibi[h] * kLog2e : 0.f;

    /* This item's tiles have landed, and every warp is done with the other
     * buffer and with dS^T. */
    cp_async_wait_all();
    __syncthreads();
    if (it + 1 < items) fetch(it + 1, buf ^ 1);

    /* S^T = K Q^T for this warp's 16 keys. */
    float s[NS][4];
    warp_abt<T, NS, D, LD>(s, aK, bQ_nk + bufo);

    /* P^T = exp2(score - lse2). Keys past the sequence must be masked here
     * (their zero-filled K gives a finite score); query rows past it have
     * lse2 = +inf and so P = 0 already. */
    const int i_last = min(i0 + BR, nq) - 1;
    const bool full =
        block_unmasked(i0, i_last, n0, n0 + BC, nq, nk, p.window_left, p.window_right);
    /* v plus the bias of element (n, e) in the log2 domain (BIAS only). */
    auto with_bias = [&](float v, int n, int e) {
      if constexpr (BIAS != 0)
        v = fmaf(bias_lds<T, BIAS>(aB + buf * kSlotB +
                                   ((n * 8 + (e & 1)) * LDB + (e >> 1) * 8) * sizeof(BT)),
                 kLog2e, v);
      return v;
    };
    float dt[SOFTCAP ? NS : 1][4];
    if (!SOFTCAP && full && slope_log2 == 0.f) {
      /* A block with no mask, softcap or ALiBi: nvcc interleaves the
       * general pass's per-element terms below whether or not they apply. */
#pragma unroll
      for (int n = 0; n < NS; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int qc = n * 8 + 2 * t + (e & 1);
          s[n][e] = ex2(with_bias(s[n][e] * p.scale_log2, n, e) - cL[qc]);
        }
    } else {
#pragma unroll
      for (int n = 0; n < NS; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int j = n0 + warp * 16 + g + (e >> 1) * 8;
          const int qc = n * 8 + 2 * t + (e & 1);
          const int i = i0 + qc;
          /* common.cuh's score_log2 with a constant softcap, written out here
           * and in dq_kernel: called, or shared as one function, it compiles to
           * other mask code in every kernel, and the d = 96 softcap dkdv kernel
           * reaches 255 registers and spills. */
          float v;
          if constexpr (SOFTCAP) {
            const float th = tanhf(s[n][e] * p.softcap_inv);
            v = p.softcap_log2 * th;
            dt[n][e] = th;
          } else {
            v = s[n][e] * p.scale_log2;
          }
          if (slope_log2 != 0.f) v -= slope_log2 * fabsf((float)(diag(i, nq, nk) - j));
          v = with_bias(v, n, e);
          if (!full && !sees(p, i, j, nq, nk)) v = -INFINITY;
          s[n][e] = ex2(v - cL[qc]);
        }
      }
    }

    /* dV += P^T dO */
    warp_xb<T, NS, NO, LD>(acc_dv, s, bO_kn + bufo);

    /* dP^T = V dO^T */
    float dp[NS][4];
    warp_abt<T, NS, D, LD>(dp, aV, bO_nk + bufo);

    /* dS^T = P^T (dP^T - D), in place of dP^T; dbias takes it before the
     * softcap derivative: stored where dbias has the bias's full shape (each
     * element is this pass's once), added where it broadcasts. */
#pragma unroll
    for (int n = 0; n < NS; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int qc = n * 8 + 2 * t + (e & 1);
        float ds = s[n][e] * (dp[n][e] - cD[qc]);
        if constexpr (BIAS != 0) {
          const int i = i0 + qc, j = n0 + warp * 16 + g + (e >> 1) * 8;
          if (p.dbias && i < nq && j < nk) {
            float *dst =
                p.dbias + b * p.dbias_sb + h * p.dbias_sh + i * p.dbias_ss + j * p.dbias_sd;
            if (!p.dbias_atomic)
              *dst = ds;
            else if (ds != 0.f)
              atomicAdd(dst, ds);
          }
        }
        if constexpr (SOFTCAP) ds = score_grad(ds, dt[n][e]);
        dp[n][e] = ds;
      }
    }

    /* dK += dS^T Q */
    warp_xb<T, NS, NO, LD>(acc_dk, dp, bQ_kn + bufo);

    if (p.dq_atomic) {
      /* dQ (Br x D) = dS K sums over this block's keys, which four or eight
       * warps hold: dS^T goes through shared memory, and each warp takes an
       * m-tile of rows and DW columns of the product. */
#pragma unroll
      for (int n = 0; n < NS; ++n)
#pragma unroll
        for (int r = 0; r < 2; ++r)
          *(uint32_t *)(sdS + (warp * 16 + g + r * 8) * LDS + n * 8 + 2 * t) =
              elem<T>::pack(dp[n][2 * r], dp[n][2 * r + 1]);
      __syncthreads();
      const int mt = warp % MT, c0 = (warp / MT) * DW;
      const uint32_t aS = smem_addr(sdS) + (mt * 16 + lane_b_nk<LDS>(lane)) * sizeof(T);
      const uint32_t bK = smem_addr(sK) + (c0 + lane_b_kn<LD>(lane)) * sizeof(T);
      float dq[DW / 8][4];
#pragma unroll
      for (int n = 0; n < DW / 8; ++n)
        dq[n][0] = dq[n][1] = dq[n][2] = dq[n][3] = 0.f;
#pragma unroll
      for (int kk = 0; kk < BC / 16; ++kk) {
        uint32_t a[4];
        ldsm_x4_t(a, aS + kk * 16 * LDS * sizeof(T));
#pragma unroll
        for (int np = 0; np < DW / 16; ++np) {
          uint32_t bb[4];
          ldsm_x4_t(bb, bK + (kk * 16 * LD + np * 16) * sizeof(T));
          elem<T>::mma(dq[2 * np], a, bb[0], bb[1]);
          elem<T>::mma(dq[2 * np + 1], a, bb[2], bb[3]);
        }
      }
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int i = i0 + mt * 16 + g + r * 8;
        if (i < nq) {
          float *dst = p.dq_acc + ws_row(p, sq, b, h, i) * D + c0 + 2 * t;
#pragma unroll
          for (int n = 0; n < DW / 8; ++n) {
            atomicAdd(dst + n * 8, dq[n][2 * r]);
            atomicAdd(dst + n * 8 + 1, dq[n][2 * r + 1]);
          }
        }
      }
    }
  }

  /* dK (times the softmax scale) and dV; keys no query sees get zeros. */
  T *gdk = row_ptr<T>(p.dk, b, sq.k0, hk);
  T *gdv = row_ptr<T>(p.dv, b, sq.k0, hk);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int j = n0 + warp * 16 + g + r * 8;
    if (j < nk) {
      T *rk = gdk + (int64_t)j * p.dk.ss;
      T *rv = gdv + (int64_t)j * p.dv.ss;
#pragma unroll
      for (int n = 0; n < NO; ++n) {
        *(uint32_t *)(rk + n * 8 + 2 * t) =
            elem<T>::pack(acc_dk[n][2 * r] * p.scale, acc_dk[n][2 * r + 1] * p.scale);
        *(uint32_t *)(rv + n * 8 + 2 * t) = elem<T>::pack(acc_dv[n][2 * r], acc_dv[n][2 * r + 1]);
      }
    }
  }
#else
  __trap(); /* the plan runs it only on sm_75 code and later */
#endif
}

template <typename T, int D, int BR, int BC, int NW, bool SOFTCAP, int BIAS = 0>
__global__ void __launch_bounds__(NW * 32) dq_kernel(const params p) {
#if ATTN_CUDA_SM75
  if (!mma_here<T>()) {
    __trap(); /* the plan runs T only on mma_cc<T>() code */
    return;
  }
  using BT = std::conditional_t<BIAS == 4, float, T>;
  constexpr int NT = NW * 32;
  constexpr int LD = D + kPad;
  constexpr int LDB = BC + kPad; /* bias tile [Br][Bc] */
  constexpr int NS = BC / 8;
  constexpr int NO = D / 8;
  static_assert(BR == 16 * NW, "one m16 slab per warp");

  extern __shared__ __align__(16) unsigned char smem_raw[];
  T *sQ = (T *)smem_raw;
  T *sdO = sQ + BR * LD;
  T *sK = sdO + BR * LD;             /* [2][Bc][LD] */
  T *sV = sK + 2 * BC * LD;          /* [2][Bc][LD] */
  BT *sB = (BT *)(sV + 2 * BC * LD); /* BIAS: [2][Br][LDB] */
  constexpr uint32_t kSlotB = BR * LDB * sizeof(BT);

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int m_block = gridDim.x - 1 - blockIdx.x;
  const int h = blockIdx.y, b = blockIdx.z, hk = h / p.group;
  const seq sq = seq_of(p, b);
  const int nq = sq.nq, nk = sq.nk;
  const int m0 = m_block * BR;
  if (m0 >= nq) return;
  const int m_last = min(m0 + BR, nq) - 1;
  int j_lo, j_hi;
  key_block_range(m0, m_last + 1, nq, nk, p.window_left, p.window_right, &j_lo, &j_hi);
  const int nb_min = j_lo / BC;
  const int nb_max = j_hi > j_lo ? (j_hi + BC - 1) / BC : nb_min;

  const T *gk = row_ptr<T>(p.k, b, sq.k0, hk);
  const T *gv = row_ptr<T>(p.v, b, sq.k0, hk);
  const float slope_log2 = p.alibi ? p.alibi[h] * kLog2e : 0.f;
  const BT *gb = BIAS ? (const BT *)p.bias + b * p.bias_sb + h * p.bias_sh : nullptr;
  /* BIAS: this thread's pair of keys (2t, 2t + 1) in its row g of the warp. */
  const uint32_t aB = smem_addr(sB) + ((warp * 16 + g) * LDB + 2 * t) * sizeof(BT);

  float lr[2], dr[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int i = m0 + warp * 16 + g + r * 8;
    const bool ok = i < nq;
    const int64_t w = ok ? ws_row(p, sq, b, h, i) : 0;
    lr[r] = ok ? p.lse2[w] : INFINITY;
    dr[r] = ok ? p.dsum[w] : 0.f;
  }

  float acc[NO][4];
#pragma unroll
  for (int n = 0; n < NO; ++n)
    acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;

  if (nb_min < nb_max) {
    load_tile<BR, D, NT>(sQ, row_ptr<T>(p.q, b, sq.q0, h), p.q.ss, m0, nq, tid);
    load_tile<BR, D, NT>(sdO, row_ptr<T>(p.dout, b, sq.q0, h), p.dout.ss, m0, nq, tid);
    load_tile<BC, D, NT>(sK, gk, p.k.ss, nb_min * BC, nk, tid);
    load_tile<BC, D, NT>(sV, gv, p.v.ss, nb_min * BC, nk, tid);
    if constexpr (BIAS != 0)
      load_bias_tile<BR, BC, NT>(smem_addr(sB), gb, p.bias_ss, m0, nq, nb_min * BC, nk, tid);
    cp_async_commit();
  }
  for (int nb = nb_min; nb < nb_max; ++nb) {
    const int buf = (nb - nb_min) & 1;
    const T *cK = sK + buf * BC * LD;
    const T *cV = sV + buf * BC * LD;
    cp_async_wait_all();
    __syncthreads();
    if (nb + 1 < nb_max) {
      load_tile<BC, D, NT>(sK + (buf ^ 1) * BC * LD, gk, p.k.ss, (nb + 1) * BC, nk, tid);
      load_tile<BC, D, NT>(sV + (buf ^ 1) * BC * LD, gv, p.v.ss, (nb + 1) * BC, nk, tid);
      if constexpr (BIAS != 0)
        load_bias_tile<BR, BC, NT>(smem_addr(sB) + (buf ^ 1) * kSlotB, gb, p.bias_ss, m0, nq,
                                   (nb + 1) * BC, nk, tid);
      cp_async_commit();
    }

    float s[NS][4], dp[NS][4];
#pragma unroll
    for (int n = 0; n < NS; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        s[n][e] = dp[n][e] = 0.f;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      uint32_t a[4], ad[4];
      load_a<LD>(a, sQ, warp * 16, kk * 16, lane);
      load_a<LD>(ad, sdO, warp * 16, kk * 16, lane);
#pragma unroll
      for (int np = 0; np < NS / 2; ++np) {
        uint32_t bb[4];
        load_b_nk<LD>(bb, cK, np * 16, kk * 16, lane);
        elem<T>::mma(s[2 * np], a, bb[0], bb[1]);
        elem<T>::mma(s[2 * np + 1], a, bb[2], bb[3]);
        load_b_nk<LD>(bb, cV, np * 16, kk * 16, lane);
        elem<T>::mma(dp[2 * np], ad, bb[0], bb[1]);
        elem<T>::mma(dp[2 * np + 1], ad, bb[2], bb[3]);
      }
    }

    const int n0 = nb * BC;
    const bool full =
        block_unmasked(m0, m_last, n0, n0 + BC, nq, nk, p.window_left, p.window_right);
    /* v plus the bias of element (n, e) in the log2 domain (BIAS only). */
    auto with_bias = [&](float v, int n, int e) {
      if constexpr (BIAS != 0)
        v = fmaf(bias_lds<T, BIAS>(aB + buf * kSlotB +
                                   ((e >> 1) * 8 * LDB + n * 8 + (e & 1)) * sizeof(BT)),
                 kLog2e, v);
      return v;
    };
    if (!SOFTCAP && full && slope_log2 == 0.f) {
      /* A plain block, as in dkdv_kernel. */
#pragma unroll
      for (int n = 0; n < NS; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int r = e >> 1;
          dp[n][e] = ex2(with_bias(s[n][e] * p.scale_log2, n, e) - lr[r]) * (dp[n][e] - dr[r]);
        }
    } else {
#pragma unroll
      for (int n = 0; n < NS; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int r = e >> 1;
          const int i = m0 + warp * 16 + g + r * 8;
          const int j = n0 + n * 8 + 2 * t + (e & 1);
          /* score_log2 written out, as in dkdv_kernel (see there why). */
          float v, th = 0.f;
          if constexpr (SOFTCAP) {
            th = tanhf(s[n][e] * p.softcap_inv);
            v = p.softcap_log2 * th;
          } else {
            v = s[n][e] * p.scale_log2;
          }
          if (slope_log2 != 0.f) v -= slope_log2 * fabsf((float)(diag(i, nq, nk) - j));
          v = with_bias(v, n, e);
          if (!full && !sees(p, i, j, nq, nk)) v = -INFINITY;
          const float pr = ex2(v - lr[r]);
          dp[n][e] = score_grad(pr * (dp[n][e] - dr[r]), th);
        }
      }
    }

    /* dQ += dS K */
#pragma unroll
    for (int kk = 0; kk < BC / 16; ++kk) {
      uint32_t a[4];
      a_frag<T>(a, dp[2 * kk], dp[2 * kk + 1]);
#pragma unroll
      for (int np = 0; np < D / 16; ++np) {
        uint32_t bb[4];
        load_b_kn<LD>(bb, cK, np * 16, kk * 16, lane);
        elem<T>::mma(acc[2 * np], a, bb[0], bb[1]);
        elem<T>::mma(acc[2 * np + 1], a, bb[2], bb[3]);
      }
    }
  }

  T *gdq = row_ptr<T>(p.dq, b, sq.q0, h);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int i = m0 + warp * 16 + g + r * 8;
    if (i < nq) {
      T *row = gdq + (int64_t)i * p.dq.ss;
#pragma unroll
      for (int n = 0; n < NO; ++n)
        *(uint32_t *)(row + n * 8 + 2 * t) =
            elem<T>::pack(acc[n][2 * r] * p.scale, acc[n][2 * r + 1] * p.scale);
    }
  }
#else
  __trap(); /* the plan runs it only on sm_75 code and later */
#endif
}

static int set_smem(const void *kern, size_t smem) {
  return cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) ==
                 cudaSuccess
             ? ATTN_OK
             : ATTN_EDEVICE;
}

/* Tile shapes. dkdv: 8 warps of 16 keys (Bc = 128) against Br = KBR query
 * rows per step; dq: 4 warps of 16 rows against Bc = 64 keys, K and V
 * double-buffered. */
template <typename T, int D, int KBR>
struct bwd_tiles {
  static constexpr int KBC = 128, KNW = 8;          /* dkdv */
  static constexpr int QBR = 64, QBC = 64, QNW = 4; /* dq */
  static constexpr int LD = D + kPad;
  static constexpr size_t smem_kv = (size_t)(2 * KBC + 4 * KBR) * LD * sizeof(T) +
                                    (size_t)KBC * (KBR + kPad) * sizeof(T) +
                                    4 * KBR * sizeof(float);
  static constexpr size_t smem_q = (size_t)(2 * QBR + 4 * QBC) * LD * sizeof(T);
  /* A bias of e-byte elements: two [Br][Bc + kPad] tiles each. */
  static constexpr size_t bias_kv(size_t e) {
    return 2 * (size_t)KBR * (KBC + kPad) * e;
  }
  static constexpr size_t bias_q(size_t e) {
    return 2 * (size_t)QBR * (QBC + kPad) * e;
  }
};

template <typename T, int D, int KBR, bool SOFTCAP, int BIAS>
static int backward_shape(const params &p, const attn__cuda_launch *L) {
  using C = bwd_tiles<T, D, KBR>;
  constexpr int KBC = C::KBC, KNW = C::KNW, QBR = C::QBR, QBC = C::QBC, QNW = C::QNW;
  constexpr size_t smem_kv = C::smem_kv + C::bias_kv(BIAS), smem_q = C::smem_q + C::bias_q(BIAS);
  auto kv = dkdv_kernel<T, D, KBC, KBR, KNW, SOFTCAP, BIAS>;
  auto kq = dq_kernel<T, D, QBR, QBC, QNW, SOFTCAP, BIAS>;
  int rc = set_smem((const void *)kv, smem_kv);
  if (rc == ATTN_OK && !p.dq_atomic) rc = set_smem((const void *)kq, smem_q);
  if (rc != ATTN_OK) return rc;

  if ((rc = bwd_prep<T, D>(p, L->dev->sm_count, L->stream)) != ATTN_OK) return rc;
  params po = p;
  const dim3 gkv = attn_key_block_grid(
      kv, KNW * 32, smem_kv, (unsigned)((p.seqlen_k + KBC - 1) / KBC), p.heads_kv, p.batch,
      L->dev->sm_count, p.window_left, p.window_right, &po.order);
  kv<<<gkv, KNW * 32, smem_kv, L->stream>>>(po);
  if (p.dq_atomic) {
    if ((rc = bwd_dq_convert<T, D>(p, L->dev->sm_count, L->stream)) != ATTN_OK) return rc;
  } else {
    dim3 gq((unsigned)((p.seqlen_q + QBR - 1) / QBR), (unsigned)p.heads_q, (unsigned)p.batch);
    kq<<<gq, QNW * 32, smem_q, L->stream>>>(p);
  }
  return cudaGetLastError() == cudaSuccess ? ATTN_OK : ATTN_EDEVICE;
}

/* The kernels of the problem's terms: the bias's element size (the plan
 * gives this family a bias of T or float only). */
template <typename T, int D, int KBR, bool SOFTCAP>
static int backward_bias(const params &p, const attn__cuda_launch *L) {
  const attn__problem *pb = L->pb;
  if (!pb->has_bias) return backward_shape<T, D, KBR, SOFTCAP, 0>(p, L);
  if (pb->bias.dtype == ATTN_F32) return backward_shape<T, D, KBR, SOFTCAP, 4>(p, L);
  return backward_shape<T, D, KBR, SOFTCAP, 2>(p, L);
}

template <typename T, int D, int KBR>
static int launch_bwd(const attn__cuda_launch *L, const attn__cuda_config *) {
  const attn__problem *pb = L->pb;
  params p;
  make_params(L, 1, &p);
  bwd_workspace(L, &p);
  if (attn__cuda_dbias_zero(pb, L->stream) != ATTN_OK) return ATTN_EDEVICE;
  int rc = p.softcap > 0.f ? backward_bias<T, D, KBR, true>(p, L)
                           : backward_bias<T, D, KBR, false>(p, L);
  /* After prep's D. */
  if (rc == ATTN_OK) rc = attn__cuda_dsinks(pb, p.dsum, 1, p.rows, L->stream);
  return rc;
}

template <typename T, int D, int KBR>
constexpr attn__cuda_config bwd_row(const char *name) {
  using C = bwd_tiles<T, D, KBR>;
  return {.kernel = ATTN__CUDA_MMA_BACKWARD,
          .dtype = std::is_same<T, __half>::value ? ATTN_F16 : ATTN_BF16,
          .dim = D,
          .cc = mma_cc<T>(),
          .specific = 0,
          .tf32 = 0,
          .threads = C::KNW * 32,
          .br = KBR,
          .bc = C::KBC,
          .stages = 0,
          .min_seqlen_q = 0,
          .min_keys_masked = 0,
          .smem = C::smem_kv,
          .smem_det = C::smem_q,
          .features = ATTN__USES_BIAS | ATTN__USES_SINKS | ATTN__USES_DBIAS | ATTN__USES_DSINKS,
          .nondeterministic = 0,
          .name = name,
          .launch = launch_bwd<T, D, KBR>};
}

/* The rows: query rows per dkdv step (Br) per head dim, 64, but 32 at
 * d = 128, where dK and dV take 128 registers and Br = 64 spilled. */
constexpr attn__cuda_config bwd_rows[] = {
    bwd_row<__half, 64, 64>("tensor-core backward, f16, d = 64, 64 x 128 tiles"),
    bwd_row<__half, 96, 64>("tensor-core backward, f16, d = 96, 64 x 128 tiles"),
    bwd_row<__half, 128, 32>("tensor-core backward, f16, d = 128, 32 x 128 tiles"),
    bwd_row<__nv_bfloat16, 64, 64>("tensor-core backward, bf16, d = 64, 64 x 128 tiles"),
    bwd_row<__nv_bfloat16, 96, 64>("tensor-core backward, bf16, d = 96, 64 x 128 tiles"),
    bwd_row<__nv_bfloat16, 128, 32>("tensor-core backward, bf16, d = 128, 32 x 128 tiles"),
};

}  // namespace attn_mma

/* The larger of dkdv's and dq's (bwd_tiles). */
extern "C" size_t attn__cuda_mma_bwd_bias_smem(const attn__cuda_config *c, size_t size) {
  using Q = attn_mma::bwd_tiles<__half, 64, 64>;
  const size_t kv = (size_t)2 * c->br * (c->bc + attn_mma::kPad) * size;
  return kv > Q::bias_q(size) ? kv : Q::bias_q(size);
}

extern "C" const attn__cuda_rows attn__cuda_mma_backward_rows = {
    attn_mma::bwd_rows, (int)(sizeof attn_mma::bwd_rows / sizeof attn_mma::bwd_rows[0])};
