/*
 * Tensor-core forward pass (FlashAttention-2, forward), f16 and bf16, and f32
 * through TF32 where the caller allows it (ATTN_ALLOW_TF32): one thread block per
 * (block of Br query rows, query head, sequence); each warp owns MT m16 slabs
 * of query rows (two by default, as FlashAttention-2, so each K/V fragment
 * read from shared memory feeds two mma). Q is loaded once; K and V blocks of
 * Bc keys stream through STAGES shared-memory slots with cp.async (block j+1
 * in flight while block j is computed). Blocks no row of the tile can see
 * (causal, windows) are skipped; only blocks straddling a boundary are
 * masked. S = Q K^T lives in fp32 registers, the online softmax (m_i, l_i)
 * runs in registers in the exp2 domain, P is packed to 16 bits in registers
 * as the A operand of O += P V, and O / l_i and lse = m_i ln 2 + ln l_i are
 * written once at the end (rows with no key: 0 and -inf).
 *
 * f32 takes the same steps on f32 tiles: each thread rounds the chunks of Q,
 * K and V it loaded to TF32 in shared memory, once, before the barrier that
 * publishes them; P is rounded in registers; both products are m16n8k8 with
 * fp32 accumulation, and the softmax, masks and epilogue are the f16 ones.
 *
 * Also here: the parameter block shared with the backward pass.
 */
#include "mma_common.cuh"

#include <math.h>

namespace attn_mma {

static tensor_ref ref_of(const attn__tensor &t) {
  tensor_ref r;
  r.ptr = attn__cuda_at(&t);
  r.sb = t.sb;
  r.ss = t.ss;
  r.sh = t.sh;
  r.sd = t.sd;
  return r;
}

void make_params(const attn__cuda_launch *L, int backward, params *p) {
  const attn__problem *pb = L->pb;
  memset(p, 0, sizeof *p);
  p->q = ref_of(pb->q);
  p->k = ref_of(pb->k);
  p->v = ref_of(pb->v);
  p->o = ref_of(pb->o);
  if (pb->lse.native) p->lse = ref_of(pb->lse);
  if (backward) {
    p->dout = ref_of(pb->dout);
    p->dq = ref_of(pb->dq);
    p->dk = ref_of(pb->dk);
    p->dv = ref_of(pb->dv);
  }
  p->cu_q = L->cu_q;
  p->cu_k = L->cu_k;
  p->alibi = L->alibi;
  p->batch = (int)pb->batch;
  p->heads_q = (int)pb->heads_q;
  p->heads_kv = (int)pb->heads_kv;
  p->group = (int)(pb->heads_q / pb->heads_kv);
  p->seqlen_q = (int)pb->seqlen_q;
  p->seqlen_k = (int)pb->seqlen_k;
  /* A bound at least as wide as the sequences is no bound; clamping keeps
   * the kernels' window arithmetic in int. */
  p->window_left =
      pb->window_left < 0 || pb->window_left >= pb->seqlen_k ? -1 : (int)pb->window_left;
  p->window_right =
      pb->window_right < 0 || pb->window_right >= pb->seqlen_q ? -1 : (int)pb->window_right;
  p->scale = pb->scale;
  p->scale_log2 = pb->scale * kLog2e;
  p->softcap = pb->softcap;
  p->softcap_inv = pb->softcap > 0.f ? pb->scale / pb->softcap : 0.f;
  p->softcap_log2 = pb->softcap * kLog2e;
  p->has_lse = pb->has_lse && pb->lse.native;
  p->rows = pb->varlen ? pb->total_q : pb->batch * pb->seqlen_q;
  if (pb->has_bias) {
    p->bias = attn__cuda_at(&pb->bias);
    p->bias_sb = pb->bias.sb;
    p->bias_sh = pb->bias.sh;
    p->bias_ss = pb->bias.ss;
  }
  if (pb->has_sinks) {
    p->sinks = (const float *)attn__cuda_at(&pb->sinks);
    p->sinks_sh = pb->sinks.sh;
  }
  if (backward && pb->has_dbias) {
    p->dbias = (float *)attn__cuda_at(&pb->dbias);
    p->dbias_sb = pb->dbias.sb;
    p->dbias_sh = pb->dbias.sh;
    p->dbias_ss = pb->dbias.ss;
    p->dbias_sd = pb->dbias.sd;
    p->dbias_atomic = attn__cuda_dbias_sums(pb) && !pb->deterministic;
  }
  if (backward && pb->has_dsinks) {
    p->dsinks = (float *)attn__cuda_at(&pb->dsinks);
    p->dsinks_sh = pb->dsinks.sh;
  }
  if (pb->has_seqused) {
    p->seqused = (const int *)attn__cuda_at(&pb->seqused_k);
    p->seqused_sb = pb->seqused_k.sb;
    p->seqlen_new = (int)pb->seqlen_new;
  }
  if (pb->page_size) {
    p->block_table = (const int *)attn__cuda_at(&pb->block_table);
    p->bt_sb = pb->block_table.sb;
    p->bt_ss = pb->block_table.ss;
    p->page_size = (int)pb->page_size;
    p->num_pages = (int)pb->num_pages;
  }
}

/* One kernel shape: MT m16 slabs per warp (Br = 16 MT NW query rows), Bc
 * keys per step, STAGES shared-memory slots for K and V (block j + STAGES-1
 * is in flight while block j is computed), Q in registers or re-read from
 * shared memory, MINB blocks per SM asked of the register allocator.
 * SCORED compiles the score transforms (softcap, ALiBi) in: a kernel without
 * them keeps no registers for their operands, which at d >= 96 sit at the
 * register limit. The inference path's terms are compiled in the same way:
 * BIAS, the bias's element size (0: none; 2: T; 4: float), its tiles riding
 * in the K/V slots; CACHE, seqused_k, paged K/V and sinks. */
template <typename T, int D, int MT, int NW, int BC, int STAGES, bool Q_IN_REGS, int MINB,
          bool SCORED, int BIAS = 0, bool CACHE = false>
__global__ void __launch_bounds__(NW * 32, MINB) fwd_kernel(const params p) {
#if ATTN_CUDA_SM75
  if (!mma_here<T>()) {
    __trap(); /* the plan runs T only on mma_cc<T>() code */
    return;
  }
  using BT = std::conditional_t<BIAS == 4, float, T>;
  constexpr bool TF32 = std::is_same<T, float>::value;
  constexpr int NT = NW * 32;
  constexpr int BR = 16 * MT * NW;
  constexpr int E = kChunk<T>;   /* elements in 16 bytes */
  constexpr int LD = D + E;      /* Q, K, V tile rows */
  constexpr int LDB = BC + kPad; /* bias tile rows */
  constexpr int KS = 2 * E;      /* k of one mma: 16, or 8 for TF32 (32 bytes) */
  constexpr int KD = D / KS;     /* k-steps of Q K^T */
  constexpr int NS = BC / 8;     /* n-tiles of S */
  constexpr int NO = D / 8;      /* n-tiles of O */
  static_assert(BC % 16 == 0 && D % 16 == 0, "tiles are multiples of 16");
  static_assert(STAGES >= 2, "at least double buffering");
  static_assert(!TF32 || BIAS != 2, "an f32 problem's bias is f32 (plan.c)");

  extern __shared__ __align__(16) unsigned char smem_raw[];
  T *sQ = (T *)smem_raw;
  T *sK = sQ + BR * LD;                   /* [STAGES][Bc][LD] */
  T *sV = sK + STAGES * BC * LD;          /* [STAGES][Bc][LD] */
  BT *sB = (BT *)(sV + STAGES * BC * LD); /* BIAS: [STAGES][Br][LDB] */

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t = lane & 3;
  /* Heaviest blocks (most keys under a causal mask) start first. */
  int m_block, h, b;
  attn_block_coords(p.order, &m_block, &h, &b);
  const int hk = h / p.group;
  const seq sq = CACHE ? seq_of_cache(p, b) : seq_of(p, b);
  const int nq = sq.nq, nk = sq.nk;
  const int m0 = m_block * BR;
  if (m0 >= nq) return;
  const int m_last = min(m0 + BR, nq) - 1;
  const int w0 = warp * MT * 16; /* this warp's first row in the block */

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
  const BT *gb = BIAS ? (const BT *)p.bias + b * p.bias_sb + h * p.bias_sh : nullptr;
  constexpr uint32_t kSlotB = BR * LDB * sizeof(BT);

  /* Key block nbk's K and V (and bias) into slot st: paged rows one by one
   * through the block table. */
  auto load_kv = [&](int st, int nbk) {
    if (CACHE && p.block_table) {
      const int64_t ks = p.k.sh * hk, vs = p.v.sh * hk;
      auto krow = [&](int j) {
        return (const T *)p.k.ptr + ks +
               paged_row(p.block_table, p.bt_sb, p.bt_ss, b, j, p.page_size, p.num_pages, p.k.sb,
                         p.k.ss);
      };
      auto vrow = [&](int j) {
        return (const T *)p.v.ptr + vs +
               paged_row(p.block_table, p.bt_sb, p.bt_ss, b, j, p.page_size, p.num_pages, p.v.sb,
                         p.v.ss);
      };
      load_rows<BC, D, NT>(sK + st * BC * LD, krow, (const T *)p.k.ptr, nbk * BC, nk, tid);
      load_rows<BC, D, NT>(sV + st * BC * LD, vrow, (const T *)p.v.ptr, nbk * BC, nk, tid);
    } else {
      load_tile<BC, D, NT>(sK + st * BC * LD, gk, p.k.ss, nbk * BC, nk, tid);
      load_tile<BC, D, NT>(sV + st * BC * LD, gv, p.v.ss, nbk * BC, nk, tid);
    }
    if constexpr (BIAS != 0)
      load_bias_tile<BR, BC, NT>(smem_addr(sB) + st * kSlotB, gb, p.bias_ss, m0, nq, nbk * BC, nk,
                                 tid);
  };

  float acc_o[MT][NO][4];
  float m_i[MT][2], l_i[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int n = 0; n < NO; ++n)
      acc_o[mt][n][0] = acc_o[mt][n][1] = acc_o[mt][n][2] = acc_o[mt][n][3] = 0.f;
    m_i[mt][0] = m_i[mt][1] = -INFINITY;
    l_i[mt][0] = l_i[mt][1] = 0.f;
  }

  /* Per-lane shared addresses of the fragment loads (bytes). TF32 reads V
   * one float at a time: rows 2t and 2t + 1 of each 8 keys, column g. */
  const uint32_t aQ = smem_addr(sQ) + (uint32_t)(w0 * LD + lane_a<LD, E>(lane)) * sizeof(T);
  const uint32_t bK = smem_addr(sK) + (uint32_t)lane_b_nk<LD, E>(lane) * sizeof(T);
  const uint32_t bV =
      smem_addr(sV) + (uint32_t)(TF32 ? 2 * t * LD + g : lane_b_kn<LD>(lane)) * sizeof(T);
  constexpr uint32_t kSlot = BC * LD * sizeof(T);
  /* BIAS: the thread's pair of keys (2t, 2t + 1) in its row g of the warp. */
  const uint32_t aB = smem_addr(sB) + (uint32_t)((w0 + g) * LDB + 2 * t) * sizeof(BT);

  if (nblocks > 0) {
    /* Prologue: Q with the first K/V block, then STAGES-2 more blocks; one
     * commit group per block (empty groups keep the count uniform). */
    load_tile<BR, D, NT>(sQ, gq, p.q.ss, m0, nq, tid);
#pragma unroll
    for (int st = 0; st < STAGES - 1; ++st) {
      if (st < nblocks) load_kv(st, nb_min + st);
      cp_async_commit();
    }
    uint32_t qf[Q_IN_REGS ? MT : 1][Q_IN_REGS ? KD : 1][4];
    if (Q_IN_REGS) {
      cp_async_wait<STAGES - 2>();
      if constexpr (TF32) tf32_tile<BR, D, NT>((float *)sQ, tid);
      __syncthreads();
#pragma unroll
      for (int mt = 0; mt < (Q_IN_REGS ? MT : 0); ++mt)
#pragma unroll
        for (int kk = 0; kk < KD; ++kk)
          ldsm_x4(qf[Q_IN_REGS ? mt : 0][Q_IN_REGS ? kk : 0],
                  aQ + (mt * 16 * LD + kk * KS) * sizeof(T));
    }

    for (int it = 0; it < nblocks; ++it) {
      const int nb = nb_min + it;
      const uint32_t cK = bK + (it % STAGES) * kSlot;
      const uint32_t cV = bV + (it % STAGES) * kSlot;
      /* Block it has landed, and every warp is done with block it-1, whose
       * slot the load below reuses. TF32: the thread's chunks of it (and of
       * Q, first) rounded before the barrier publishes them. */
      cp_async_wait<STAGES - 2>();
      if constexpr (TF32) {
        if (!Q_IN_REGS && it == 0) tf32_tile<BR, D, NT>((float *)sQ, tid);
        tf32_tile<BC, D, NT>((float *)sK + (it % STAGES) * BC * LD, tid);
        tf32_tile<BC, D, NT>((float *)sV + (it % STAGES) * BC * LD, tid);
      }
      __syncthreads();
      {
        const int nx = it + STAGES - 1;
        if (nx < nblocks) load_kv(nx % STAGES, nb_min + nx);
        cp_async_commit();
      }

      /* S = Q K^T; each K fragment serves the warp's MT slabs. */
      float s[MT][NS][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int n = 0; n < NS; ++n)
          s[mt][n][0] = s[mt][n][1] = s[mt][n][2] = s[mt][n][3] = 0.f;
#pragma unroll
      for (int kk = 0; kk < KD; ++kk) {
        uint32_t a[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          if (Q_IN_REGS) {
#pragma unroll
            for (int x = 0; x < 4; ++x)
              a[mt][x] = qf[Q_IN_REGS ? mt : 0][Q_IN_REGS ? kk : 0][x];
          } else {
            ldsm_x4(a[mt], aQ + (mt * 16 * LD + kk * KS) * sizeof(T));
          }
        }
#pragma unroll
        for (int np = 0; np < NS / 2; ++np) {
          uint32_t bb[4];
          ldsm_x4(bb, cK + (np * 16 * LD + kk * KS) * sizeof(T));
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
            elem<T>::mma(s[mt][2 * np], a[mt], bb[0], bb[1]);
            elem<T>::mma(s[mt][2 * np + 1], a[mt], bb[2], bb[3]);
          }
        }
      }

      /* BIAS: the bias of the thread's pair of keys in row g + 8 r of slab
       * mt, n-tile n (block it's slot). */
      auto bias_pair = [&](int mt, int n, int r) {
        const uint32_t a =
            aB + (it % STAGES) * kSlotB + (uint32_t)((mt * 16 + r * 8) * LDB + n * 8) * sizeof(BT);
        if constexpr (BIAS == 2)
          return elem<T>::unpack(lds32(a));
        else
          return lds64(a);
      };

      /* Scores in the log2 domain; the mask only on blocks that straddle a
       * boundary (sequence end, causal diagonal, window edge). */
      const int n0 = nb * BC;
      const bool full =
          block_unmasked(m0, m_last, n0, n0 + BC, nq, nk, p.window_left, p.window_right);
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        /* Plain blocks keep the raw q.k and fold the scale into the exp2's
         * FMA below (scale > 0, so the max commutes with it). With a bias
         * and no transform, scores stay in natural units, scale * q.k +
         * bias, one FMA, and log2(e) moves into the exp2's FMA instead. */
        const bool natural = BIAS != 0 && !transform;
        const bool raw = full && !transform && BIAS == 0;
        const float mul = raw ? p.scale_log2 : natural ? kLog2e : 1.f;
        if (natural && full) {
#pragma unroll
          for (int n = 0; n < NS; ++n)
#pragma unroll
            for (int r = 0; r < 2; ++r) {
              const float2 bv = bias_pair(mt, n, r);
              s[mt][n][2 * r] = fmaf(s[mt][n][2 * r], p.scale, bv.x);
              s[mt][n][2 * r + 1] = fmaf(s[mt][n][2 * r + 1], p.scale, bv.y);
            }
        } else if (!raw) {
          /* Visible keys of the thread's two rows, as [lo, hi) relative to
           * the thread's first column. */
          int lo[2], hi[2];
#pragma unroll
          for (int r = 0; r < 2; ++r) {
            const int i = m0 + w0 + mt * 16 + g + r * 8;
            const int jt = n0 + 2 * t;
            const int dg = diag(i, nq, nk);
            lo[r] = full ? -BC : max(0, key_lo(dg, p.window_left)) - jt;
            hi[r] = full ? BC : min(nk, key_hi(dg, nk, p.window_right)) - jt;
          }
#pragma unroll
          for (int n = 0; n < NS; ++n) {
            float2 bv[2];
            if constexpr (BIAS != 0) bv[0] = bias_pair(mt, n, 0), bv[1] = bias_pair(mt, n, 1);
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const int r = e >> 1, c = n * 8 + (e & 1);
              const float bias = BIAS != 0 ? (e & 1 ? bv[r].y : bv[r].x) : 0.f;
              float v = s[mt][n][e];
              if (transform) {
                const int i = m0 + w0 + mt * 16 + g + r * 8;
                float th;
                v = score_log2(v, p.scale_log2, p.softcap_log2 > 0.f, p.softcap_log2, p.softcap_inv,
                               slope_log2, diag(i, nq, nk) - (n0 + 2 * t + c), &th);
                if constexpr (BIAS != 0) v = fmaf(bias, kLog2e, v);
              } else if (natural) {
                v = fmaf(v, p.scale, bias);
              } else {
                v *= p.scale_log2;
              }
              s[mt][n][e] = c >= lo[r] && c < hi[r] ? v : -INFINITY;
            }
          }
        }

        /* Online softmax: the row max over the quad that shares a row. */
        float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int n = 0; n < NS; ++n) {
          mx[0] = fmaxf(mx[0], fmaxf(s[mt][n][0], s[mt][n][1]));
          mx[1] = fmaxf(mx[1], fmaxf(s[mt][n][2], s[mt][n][3]));
        }
        float mu[2], alpha[2], rs[2] = {0.f, 0.f};
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
          mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
          mx[r] = fmaxf(m_i[mt][r], mx[r] * mul);
          /* A row with no visible key yet keeps max -inf; subtracting 0 then
           * gives exp2(-inf) = 0 instead of NaN. */
          mu[r] = mx[r] == -INFINITY ? 0.f : mx[r];
          alpha[r] = ex2(m_i[mt][r] - mu[r]);
          m_i[mt][r] = mx[r];
        }
#pragma unroll
        for (int n = 0; n < NS; ++n) {
          s[mt][n][0] = ex2(fmaf(s[mt][n][0], mul, -mu[0]));
          s[mt][n][1] = ex2(fmaf(s[mt][n][1], mul, -mu[0]));
          s[mt][n][2] = ex2(fmaf(s[mt][n][2], mul, -mu[1]));
          s[mt][n][3] = ex2(fmaf(s[mt][n][3], mul, -mu[1]));
          rs[0] += s[mt][n][0] + s[mt][n][1];
          rs[1] += s[mt][n][2] + s[mt][n][3];
        }
        /* l_i stays a per-thread partial sum until the end. */
        l_i[mt][0] = l_i[mt][0] * alpha[0] + rs[0];
        l_i[mt][1] = l_i[mt][1] * alpha[1] + rs[1];
#pragma unroll
        for (int n = 0; n < NO; ++n) {
          acc_o[mt][n][0] *= alpha[0];
          acc_o[mt][n][1] *= alpha[0];
          acc_o[mt][n][2] *= alpha[1];
          acc_o[mt][n][3] *= alpha[1];
        }
      }

      /* O += P V; P is already in A-fragment order (16 bits), or TF32 takes
       * n-tile kk of S as the A fragment of keys 8 kk.., its columns 2t, 2t+1
       * as A's t, t+4, and B as V's rows 2t, 2t+1 to match (see
       * mma_common.cuh). */
      if constexpr (TF32) {
#pragma unroll
        for (int kk = 0; kk < NS; ++kk) {
          uint32_t a[MT][4];
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
            a[mt][0] = elem<T>::tf32(s[mt][kk][0]);
            a[mt][1] = elem<T>::tf32(s[mt][kk][2]);
            a[mt][2] = elem<T>::tf32(s[mt][kk][1]);
            a[mt][3] = elem<T>::tf32(s[mt][kk][3]);
          }
#pragma unroll
          for (int n = 0; n < NO; ++n) {
            const uint32_t b0 = lds32(cV + (kk * 8 * LD + n * 8) * sizeof(T));
            const uint32_t b1 = lds32(cV + ((kk * 8 + 1) * LD + n * 8) * sizeof(T));
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
              elem<T>::mma(acc_o[mt][n], a[mt], b0, b1);
          }
        }
      } else {
#pragma unroll
        for (int kk = 0; kk < BC / 16; ++kk) {
          uint32_t a[MT][4];
#pragma unroll
          for (int mt = 0; mt < MT; ++mt)
            a_frag<T>(a[mt], s[mt][2 * kk], s[mt][2 * kk + 1]);
#pragma unroll
          for (int np = 0; np < D / 16; ++np) {
            uint32_t bb[4];
            ldsm_x4_t(bb, cV + (kk * 16 * LD + np * 16) * sizeof(T));
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
              elem<T>::mma(acc_o[mt][2 * np], a[mt], bb[0], bb[1]);
              elem<T>::mma(acc_o[mt][2 * np + 1], a[mt], bb[2], bb[3]);
            }
          }
        }
      }
    }
    /* Drain the trailing (empty) groups before the block exits. */
    cp_async_wait_all();
  }

  /* O = acc / l, lse = m ln 2 + ln l; rows with no key: 0 and -inf. A bias
   * may hide a row's every key (row_seen); a sink joins l here, once. */
  T *go = row_ptr<T>(p.o, b, sq.q0, h);
  const float sink_log2 = CACHE && p.sinks ? p.sinks[h * p.sinks_sh] * kLog2e : 0.f;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float l = l_i[mt][r];
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      const int i = m0 + w0 + mt * 16 + g + r * 8;
      /* The mask says whether the row saw a key, not l: a NaN or inf among
       * its scores leaves l NaN (or 0 when all are -inf), and the row must
       * then come out NaN rather than as a row that saw nothing. */
      int klo, khi;
      key_range(diag(i, nq, nk), nk, p.window_left, p.window_right, &klo, &khi);
      bool seen = klo < khi;
      float m = m_i[mt][r], inv;
      if constexpr (BIAS != 0 || CACHE) {
        seen = row_seen(seen, BIAS != 0, m, l);
        float a = 1.f;
        if (CACHE && p.sinks) {
          a = sink_fold_log2(sink_log2, &m, &l); /* no key: m = sink, l = 1, a = 0 */
          seen = true;
        }
        inv = seen ? a / l : 0.f;
      } else {
        inv = seen ? 1.f / l : 0.f;
      }
      if (i < nq) {
        T *orow = go + (int64_t)i * p.o.ss;
#pragma unroll
        for (int n = 0; n < NO; ++n) {
          const float lo = acc_o[mt][n][2 * r] * inv, hi = acc_o[mt][n][2 * r + 1] * inv;
          if constexpr (TF32)
            *(float2 *)(orow + n * 8 + 2 * t) = make_float2(lo, hi);
          else
            *(uint32_t *)(orow + n * 8 + 2 * t) = elem<T>::pack(lo, hi);
        }
        if (p.has_lse && t == 0)
          lse_store(row_ptr<float>(p.lse, b, sq.q0 + i, h), p.lse.sd, seen, m * kLn2, l);
      }
    }
  }
#else
  __trap(); /* the plan runs it only on sm_75 code and later */
#endif
}

template <typename T, int D, int MT, int NW, int BC, int STAGES, bool QR, int MINB, bool SCORED,
          int BIAS, bool CACHE>
static int launch_kernel(const attn__cuda_launch *L, const attn__cuda_config *c, const params &p) {
  constexpr int BR = 16 * MT * NW;
  auto kern = fwd_kernel<T, D, MT, NW, BC, STAGES, QR, MINB, SCORED, BIAS, CACHE>;
  const size_t smem = c->smem + attn__cuda_mma_fwd_bias_smem(c, BIAS);
  if (cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) !=
      cudaSuccess)
    return ATTN_EDEVICE;
  dim3 grid((unsigned)((p.seqlen_q + BR - 1) / BR), (unsigned)p.heads_q, (unsigned)p.batch);
  params pl = p;
  pl.order =
      attn_order_group(kern, NW * 32, smem, grid, L->dev->sm_count, p.window_left, p.window_right);
  kern<<<grid, NW * 32, smem, L->stream>>>(pl);
  return cudaGetLastError() == cudaSuccess ? ATTN_OK : ATTN_EDEVICE;
}

/* The kernel of the problem's terms: SCORED, then the bias's element size
 * (the plan gives this family a bias of T or float only), then CACHE. */
template <typename T, int D, int MT, int NW, int BC, int STAGES, bool QR, int MINB, bool SCORED,
          int BIAS>
static int launch_cache(const attn__cuda_launch *L, const attn__cuda_config *c, const params &p) {
  const attn__problem *pb = L->pb;
  if (pb->has_seqused || pb->page_size || pb->has_sinks)
    return launch_kernel<T, D, MT, NW, BC, STAGES, QR, MINB, SCORED, BIAS, true>(L, c, p);
  return launch_kernel<T, D, MT, NW, BC, STAGES, QR, MINB, SCORED, BIAS, false>(L, c, p);
}

template <typename T, int D, int MT, int NW, int BC, int STAGES, bool QR, int MINB, bool SCORED>
static int launch_bias(const attn__cuda_launch *L, const attn__cuda_config *c, const params &p) {
  const attn__problem *pb = L->pb;
  if (!pb->has_bias) return launch_cache<T, D, MT, NW, BC, STAGES, QR, MINB, SCORED, 0>(L, c, p);
  if constexpr (std::is_same<T, float>::value) {
    return launch_cache<T, D, MT, NW, BC, STAGES, QR, MINB, SCORED, 4>(L, c, p);
  } else {
    if (pb->bias.dtype == ATTN_F32)
      return launch_cache<T, D, MT, NW, BC, STAGES, QR, MINB, SCORED, 4>(L, c, p);
    return launch_cache<T, D, MT, NW, BC, STAGES, QR, MINB, SCORED, 2>(L, c, p);
  }
}

template <typename T, int D, int MT, int NW, int BC, int STAGES, bool QR, int MINB>
static int launch_fwd(const attn__cuda_launch *L, const attn__cuda_config *c) {
  params p;
  make_params(L, 0, &p);
  if (p.softcap > 0.f || p.alibi)
    return launch_bias<T, D, MT, NW, BC, STAGES, QR, MINB, true>(L, c, p);
  return launch_bias<T, D, MT, NW, BC, STAGES, QR, MINB, false>(L, c, p);
}

template <typename T, int D, int MT, int NW, int BC, int STAGES, bool QR, int MINB>
constexpr attn__cuda_config fwd_row(const char *name) {
  constexpr int BR = 16 * MT * NW;
  static_assert(STAGES == 2, "attn__cuda_mma_fwd_bias_smem counts two bias tiles");
  constexpr bool tf32 = std::is_same<T, float>::value;
  return {.kernel = ATTN__CUDA_MMA_FORWARD,
          .dtype = tf32                             ? ATTN_F32
                   : std::is_same<T, __half>::value ? ATTN_F16
                                                    : ATTN_BF16,
          .dim = D,
          .cc = mma_cc<T>(),
          .specific = 0,
          .tf32 = tf32,
          .threads = NW * 32,
          .br = BR,
          .bc = BC,
          .stages = 0,
          .min_seqlen_q = 0,
          .min_keys_masked = 0,
          .smem = (size_t)(BR + 2 * STAGES * BC) * (D + kChunk<T>)*sizeof(T),
          .smem_det = 0,
          .features = ATTN__USES_SEQUSED | ATTN__USES_PAGED | ATTN__USES_APPEND | ATTN__USES_BIAS |
                      ATTN__USES_SINKS,
          .nondeterministic = 0,
          .name = name,
          .launch = launch_fwd<T, D, MT, NW, BC, STAGES, QR, MINB>};
}

/* The rows, <MT, NW, Bc, STAGES, Q in registers, blocks per SM> per head
 * dim. Measured on the H200 (bench/NOTES_mma.md, run 2): two m16 slabs per
 * warp and 4 warps (Br = 128, as FlashAttention-2) halve the K/V fragment
 * loads per mma against one slab and ran fastest at d = 64 (Bc = 64) and
 * d = 128 (Bc = 32, the largest without spills); d = 96 follows d = 128;
 * d = 256 holds O in 128 registers, so one slab per warp and Q in shared
 * memory. f32 through TF32 (rows the plan takes only for problems that
 * allow it) has tiles twice the bytes, and with one block of 4 warps an SM
 * its loop waits on latency: the keys a block shrink until more blocks
 * share an SM (bench/NOTES.md: d = 128, 16 keys, two blocks in 101 KB, ran
 * 23 % faster than 32 keys and one block; d = 64, 32 keys, three blocks in
 * 70 KB, 3 % faster than 64 keys and two; one m16 slab a warp, or Q in
 * registers, ran slower at both). d = 96 follows d = 128, d = 32 d = 64.
 * d = 256 takes blocks of 16 keys, with which ptxas spills nothing (32
 * spilled up to 160 bytes), in 130 KB. */
constexpr attn__cuda_config fwd_rows[] = {
    fwd_row<__half, 64, 2, 4, 64, 2, false, 2>("tensor-core forward, f16, d = 64, 128 x 64 tiles"),
    fwd_row<__half, 96, 2, 4, 32, 2, false, 2>("tensor-core forward, f16, d = 96, 128 x 32 tiles"),
    fwd_row<__half, 128, 2, 4, 32, 2, false, 2>(
        "tensor-core forward, f16, d = 128, 128 x 32 tiles"),
    fwd_row<__half, 256, 1, 4, 32, 2, false, 2>("tensor-core forward, f16, d = 256, 64 x 32 tiles"),
    fwd_row<__nv_bfloat16, 64, 2, 4, 64, 2, false, 2>(
        "tensor-core forward, bf16, d = 64, 128 x 64 tiles"),
    fwd_row<__nv_bfloat16, 96, 2, 4, 32, 2, false, 2>(
        "tensor-core forward, bf16, d = 96, 128 x 32 tiles"),
    fwd_row<__nv_bfloat16, 128, 2, 4, 32, 2, false, 2>(
        "tensor-core forward, bf16, d = 128, 128 x 32 tiles"),
    fwd_row<__nv_bfloat16, 256, 1, 4, 32, 2, false, 2>(
        "tensor-core forward, bf16, d = 256, 64 x 32 tiles"),
    fwd_row<float, 32, 2, 4, 32, 2, false, 3>(
        "tensor-core forward, f32 as TF32, d = 32, 128 x 32 tiles"),
    fwd_row<float, 64, 2, 4, 32, 2, false, 3>(
        "tensor-core forward, f32 as TF32, d = 64, 128 x 32 tiles"),
    fwd_row<float, 96, 2, 4, 16, 2, false, 2>(
        "tensor-core forward, f32 as TF32, d = 96, 128 x 16 tiles"),
    fwd_row<float, 128, 2, 4, 16, 2, false, 2>(
        "tensor-core forward, f32 as TF32, d = 128, 128 x 16 tiles"),
    fwd_row<float, 256, 1, 4, 16, 2, false, 1>(
        "tensor-core forward, f32 as TF32, d = 256, 64 x 16 tiles"),
};

}  // namespace attn_mma

/* Two slots (fwd_row) of Br x (Bc + kPad) bias elements. */
extern "C" size_t attn__cuda_mma_fwd_bias_smem(const attn__cuda_config *c, size_t size) {
  return (size_t)2 * c->br * (c->bc + attn_mma::kPad) * size;
}

extern "C" const attn__cuda_rows attn__cuda_mma_forward_rows = {
    attn_mma::fwd_rows, (int)(sizeof attn_mma::fwd_rows / sizeof attn_mma::fwd_rows[0])};
