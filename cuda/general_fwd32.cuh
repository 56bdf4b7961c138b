/*
 * Forward pass, true fp32 (FFMA), the fast form of general.cuh's fwd_kernel
 * for the common head dims (padded 64 and 128) with 16-byte-aligned rows.
 * Same algorithm and numbers as fwd_kernel (one block per query block,
 * S = Q K^T, online softmax in registers, O += P V, lse = m + log(l)); what
 * differs is the cost around the two inner loops:
 *
 *   - tile loads: each thread owns one 16-byte column chunk and a fixed row
 *     stride, so a cp.async costs an address add instead of a division and
 *     a bounds test (fwd_kernel's load_tile: ~30 instructions per copy);
 *   - two barriers per key tile instead of four: V_t is fetched after the
 *     first barrier (hidden by Q K^T), K_{t+1} after the second (hidden by
 *     P V); P travels only inside a half warp;
 *   - softmax without softcap/ALiBi: the row max is taken on the raw dot
 *     products (rounding is monotone, so max(acc) * scale is the max of the
 *     scaled scores bit for bit) and p = ex2((scaled(acc) - m) * log2 e):
 *     the score rounded as every kernel rounds it (general.cuh's scaled()),
 *     in natural units, as in the backward pass.
 *
 * The kernel computes 8 x 8 scores a thread (Br = Bc = 128, 256 threads):
 * a third fewer shared loads in Q K^T than 8 x 4, half the softmax
 * reductions and barriers per FMA. At d = 128 Q, K and V take 203 KB, so P
 * is written into the K tile (ALIAS) and K_{t+1}, V_{t+1} are fetched after
 * P V: K's latency is exposed (~3 % of a tile's time), V's is hidden by
 * Q K^T. Against it on the H200 (bench/NOTES_cuda.md, "f32 forward
 * variants"): 8 x 4 with Br = 128 and with two blocks of Br = 64 a
 * multiprocessor ran 4-12 % slower, and skipping the masked part of the
 * causal diagonal tile cost 2-3 % everywhere (register pressure); none is
 * kept.
 */
#ifndef ATTN_CUDA_GENERAL_FWD32_CUH
#define ATTN_CUDA_GENERAL_FWD32_CUH

#include "general.cuh"

namespace attn_general {

template <int DP, int MR, int MC, int NTY, bool ALIAS>
struct f32v_cfg {
  static constexpr int NT = 16 * NTY, Br = NTY * MR, Bc = 16 * MC;
  static constexpr int LD = DP + 4; /* conflict-free float4 rows, as fwd_cfg */
  /* +16: the two half warps' rows of P in other banks; +4 where that would
   * not fit in the K tile (2-way conflicts on the few P stores only). */
  static constexpr int LDP = ALIAS && Br * (Bc + 16) > Bc *LD ? Bc + 4 : Bc + 16;
  static constexpr size_t smem =
      sizeof(float) * ((size_t)Br * LD + 2 * (size_t)Bc * LD + (ALIAS ? 0 : (size_t)Br * LDP));
  static_assert(!ALIAS || Br * LDP <= Bc * LD, "P must fit in the K tile");
  static_assert(NT % (DP / 4) == 0, "a thread keeps one column chunk");
};

/* ROWS rows of DP floats (row 0 at g, row stride ss elements) into sm[ROWS][ld]
 * by cp.async; rows at or past nvalid and columns at or past d are zeros. */
template <int DP, int ROWS, int NT>
__device__ __forceinline__ void load_rows32(float *sm, int ld, const float *g, long long ss,
                                            long long nvalid, int d) {
  constexpr int C4 = DP / 4, RSTEP = NT / C4, N = (ROWS + RSTEP - 1) / RSTEP;
  const int tid = threadIdx.x;
  const int r = tid / C4, c = (tid - r * C4) * 4;
  float *dst = sm + r * ld + c;
  const float *src = g + r * ss + c;
  const long long step = RSTEP * ss;
  if (c < d && nvalid >= ROWS && ROWS % RSTEP == 0) {
#pragma unroll
    for (int k = 0; k < N; k++) {
      cp_async16(dst + k * RSTEP * ld, src, true);
      src += step;
    }
  } else {
#pragma unroll
    for (int k = 0; k < N; k++) {
      const int rr = r + k * RSTEP;
      if (rr < ROWS) {
        if (c < d && rr < nvalid)
          cp_async16(dst + k * RSTEP * ld, src, true);
        else
          *(float4 *)(dst + k * RSTEP * ld) = make_float4(0.f, 0.f, 0.f, 0.f);
      }
      src += step;
    }
  }
}

template <int DP, int MR, int MC, int NTY, bool ALIAS>
__global__ void __launch_bounds__(16 * NTY, 1) fwd32_kernel(const gparams P) {
  using C = f32v_cfg<DP, MR, MC, NTY, ALIAS>;
  constexpr int NT = C::NT, Br = C::Br, Bc = C::Bc, LD = C::LD, LDP = C::LDP, NG = DP / 32;
  extern __shared__ float4 smem4[];
  float *Qs = (float *)smem4;
  float *Ks = Qs + Br * LD;
  float *Vs = Ks + Bc * LD;
  float *Ps = ALIAS ? Ks : Vs + Bc * LD;

  fwd_block B;
  if (!fwd_block_at<Br>(P, &B)) return;
  const seqinfo &S = B.S;
  const long long i0 = B.i0;
  const int tid = threadIdx.x, tx = tid & 15, ty = tid >> 4;
  const float *qg = (const float *)P.q.p + head_base(P.q, B.b, S.row0q, B.h);
  const float *kg = (const float *)P.k.p + head_base(P.k, B.b, S.row0k, B.hk);
  const float *vg = (const float *)P.v.p + head_base(P.v, B.b, S.row0k, B.hk);
  fwd_tiles<Bc>(P, &B);
  const long long t_begin = B.t_begin, t_end = B.t_end;
  const float slope = P.alibi ? P.alibi[B.h] : 0.f;
  const bool plain = P.softcap == 0.f && P.alibi == nullptr;
  const bool fast = plain && P.scale > 0.f;

  float m_i[MR], l_i[MR]; /* l_i: this thread's share of the row sum */
  float2 o[MR][NG];
  init_rows(m_i, l_i, o);

  if (t_end > t_begin) {
    const long long k0 = t_begin * Bc;
    load_rows32<DP, Br, NT>(Qs, LD, qg + i0 * P.q.ss, P.q.ss, S.nq - i0, P.d);
    load_rows32<DP, Bc, NT>(Ks, LD, kg + k0 * P.k.ss, P.k.ss, S.nk - k0, P.d);
    cp_async_commit();
    if (ALIAS) {
      load_rows32<DP, Bc, NT>(Vs, LD, vg + k0 * P.v.ss, P.v.ss, S.nk - k0, P.d);
      cp_async_commit();
    }
  }

  for (long long t = t_begin; t < t_end; t++) {
    const long long k0 = t * Bc;
    /* Groups in flight: K_t (ALIAS: K_t, then V_t, which Q K^T need not
     * wait for). After the barrier every thread is also done with P V of
     * the previous tile. */
    if (ALIAS)
      cp_async_wait<1>();
    else
      cp_async_wait<0>();
    __syncthreads();
    if (!ALIAS) {
      load_rows32<DP, Bc, NT>(Vs, LD, vg + k0 * P.v.ss, P.v.ss, S.nk - k0, P.d);
      cp_async_commit();
    }

    /* S = Q K^T */
    float s[MR][MC];
    rows_dot_rows<MR, MC, DP, NTY, LD>(s, Qs, Ks, tx, ty);
    if (ALIAS) {
      cp_async_wait<0>(); /* V_t */
      __syncthreads();    /* V_t visible; everyone is done with K_t: P goes there */
    }

    /* Masks and the online softmax, row by row. */
    const bool full = k0 >= B.lo_last && k0 + Bc <= B.hi_first;
#pragma unroll
    for (int ii = 0; ii < MR; ii++) {
      const tile_row R = tile_row_at(P, S, i0 + ty + NTY * ii, full);
      float mx = -INFINITY;
#pragma unroll
      for (int jj = 0; jj < MC; jj++) {
        const long long j = k0 + tx + 16 * jj;
        float x = s[ii][jj], th;
        if (!fast) x = score_of(P, x, slope, R.dg - j, &th);
        if (!full && (j < R.lo || j >= R.hi)) x = -INFINITY;
        s[ii][jj] = x;
        mx = fmaxf(mx, x);
      }
      mx = half_warp_max(mx);
      /* fast: mx is a raw dot product; scale > 0 keeps it the max. */
      if (fast) mx = scaled(P, mx);
      const float m_new = fmaxf(m_i[ii], mx);
      const float m_use = exp_base(m_new);
      const float alpha = ex2((m_i[ii] - m_use) * kLog2e);
      float sum = 0.f;
#pragma unroll
      for (int jj = 0; jj < MC; jj++) {
        const float dx = (fast ? scaled(P, s[ii][jj]) : s[ii][jj]) - m_use;
        const float p = ex2(dx * kLog2e);
        sum += p;
        Ps[(ty + NTY * ii) * LDP + tx + 16 * jj] = p;
      }
      rescale_row(m_i[ii], l_i[ii], o[ii], m_new, alpha, sum);
    }
    if (ALIAS) {
      __syncwarp(); /* P rows are written and read by the same half warp */
    } else {
      cp_async_wait<0>(); /* V_t */
      __syncthreads();    /* V_t and P visible; everyone is done with K_t */
      if (t + 1 < t_end)
        load_rows32<DP, Bc, NT>(Ks, LD, kg + (k0 + Bc) * P.k.ss, P.k.ss, S.nk - k0 - Bc, P.d);
      cp_async_commit();
    }

    /* O += P V */
    rows_times_tile<MR, NG, Bc, NTY, LDP, LD>(o, Ps, Vs, tx, ty);
    if (ALIAS) {
      __syncthreads(); /* everyone is done with P (in K's tile) and V_t */
      /* K_{t+1} and V_{t+1} in two groups: the next Q K^T waits for K only. */
      if (t + 1 < t_end)
        load_rows32<DP, Bc, NT>(Ks, LD, kg + (k0 + Bc) * P.k.ss, P.k.ss, S.nk - k0 - Bc, P.d);
      cp_async_commit();
      if (t + 1 < t_end)
        load_rows32<DP, Bc, NT>(Vs, LD, vg + (k0 + Bc) * P.v.ss, P.v.ss, S.nk - k0 - Bc, P.d);
      cp_async_commit();
    }
  }
  cp_async_wait<0>();

  store_rows<float, MR, NG, NTY>(P, S, B.b, B.h, i0, o, m_i, l_i, tx, ty);
}

template <int DP, int MR, int MC, int NTY, bool ALIAS>
static int launch_fwd32(const attn__cuda_launch *L, const attn__cuda_config *) {
  using Cf = f32v_cfg<DP, MR, MC, NTY, ALIAS>;
  static_assert(Cf::NT == kThreads, "launch_cfg launches kThreads threads");
  const attn__problem *pb = L->pb;
  if (pb->batch == 0 || pb->seqlen_q == 0 || pb->heads_q == 0) return ATTN_OK;
  const gparams P = make_params(L, 0);
  dim3 grid((unsigned)((pb->seqlen_q + Cf::Br - 1) / Cf::Br), (unsigned)pb->heads_q,
            (unsigned)pb->batch);
  return launch_cfg(fwd32_kernel<DP, MR, MC, NTY, ALIAS>, Cf::smem, grid, L, P, true);
}

template <int DP, int MR, int MC, int NTY, bool ALIAS>
constexpr attn__cuda_config fwd32_row(const char *name) {
  using C = f32v_cfg<DP, MR, MC, NTY, ALIAS>;
  return {.kernel = ATTN__CUDA_F32_FORWARD,
          .dtype = ATTN_F32,
          .dim = DP,
          .cc = 0,
          .specific = 0,
          .tf32 = 0,
          .threads = C::NT,
          .br = C::Br,
          .bc = C::Bc,
          .stages = 0,
          .min_seqlen_q = 0,
          .min_keys_masked = 0,
          .smem = C::smem,
          .smem_det = 0,
          .features = 0,
          .nondeterministic = 0,
          .name = name,
          .launch = launch_fwd32<DP, MR, MC, NTY, ALIAS>};
}

/* The wide kernel's rows: padded head dims 64 and 128 (the plan also wants
 * q, k and v rows that load as float4). */
constexpr attn__cuda_config f32_rows[] = {
    fwd32_row<64, 8, 8, 16, false>("f32 wide forward, d <= 64, 128 x 128 tiles"),
    fwd32_row<128, 8, 8, 16, true>("f32 wide forward, d <= 128, 128 x 128 tiles, P in K"),
};

constexpr attn__cuda_rows f32_table() {
  return {f32_rows, (int)(sizeof f32_rows / sizeof f32_rows[0])};
}

}  // namespace attn_general

#endif /* ATTN_CUDA_GENERAL_FWD32_CUH */
