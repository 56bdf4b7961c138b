/*
 * Hopper backward pass (FlashAttention-2's backward steps on sm_90a's
 * warpgroup MMA, in FlashAttention-3's warp-specialized form), the dK/dV
 * pass of mma_bwd.cu's four launches; prep (D = rowsum(dO * O), lse2) and the
 * dq conversion are bwd_common.cuh's, on the same workspace.
 *
 * One thread block per (block of Bc = 128 keys, kv head, sequence): K and V
 * stay in shared memory, and the block loops over the query heads of the GQA
 * group and the query blocks of Br rows (64, or 128 at d = 64) that see
 * these keys. A producer
 * warp streams Q and dO through two slots with the bulk tensor copy (TMA,
 * the 128-byte swizzle that wgmma reads; wgmma.cuh), with their lse2 and D
 * rows, each slot handed over on mbarriers and handed back by the consumers.
 * Two consumer warpgroups own 64 keys each, with dK and dV in fp32
 * registers; per query block each computes, on the tensor cores,
 *   S^T  = K Q^T  and  dP^T = V dO^T   (both operands in shared memory),
 * then P^T = exp2(score - lse2) and dS^T = P^T (dP^T - D) (times the softcap
 * derivative) on the accumulators, with common.cuh's rules, and
 *   dV += P^T dO  and  dK += dS^T Q    (P^T, dS^T as A from registers: the
 *                                       accumulator of S^T is the A fragment
 *                                       of a product over the queries),
 *   dQ  = dS K                         (dS^T through shared memory, read as
 *                                       an MN-major A),
 * the last added into the workspace's fp32 dq accumulator by the bulk copy
 * engine: each warpgroup stores its dQ tile in shared memory and one of its
 * threads issues the tensor reduction (FlashAttention-3's way), which takes
 * the adds off the load/store unit that per-thread atomics kept busy.
 * Each warpgroup's dQ product is 64 query rows by 64 columns: at d = 128 (and
 * 96, padded; Br = 64) half of the columns over all 128 keys, at d = 64 with
 * Br = 128 half of the rows over all keys, so that both warpgroups' dS^T must
 * be in shared memory first; at d = 64 with Br = 64 (under softcap, whose
 * tanh values take the registers of the larger tile) every column over the
 * warpgroup's own 64 keys, the two halves meeting in the reductions.
 *
 * At d = 256 the consumers split by role instead (bwd256_kernel, below).
 *
 * The softmax scale multiplies dK at the end and dQ in the conversion. dQ's
 * reductions make the sum's order vary run to run: the plan gives
 * deterministic problems to mma_bwd.cu. This family covers the problems of
 * its kernels without the inference path's terms (bias, sinks and their
 * gradients).
 */
#include "bwd_common.cuh"
#include "wgmma.cuh"

#include <math.h>

namespace attn_hopper_bwd {

using namespace attn_mma;
namespace wg = attn_wgmma;

constexpr int kBc = 128;   /* keys a block, 64 a consumer warpgroup (wgmma's M) */
constexpr int kStages = 2; /* Q/dO slots */
constexpr int kThreads = 384;

/* Shared-memory tiles hold whole 64-element column blocks (the swizzle's
 * row): d = 96 takes two, the last half zeros from the tensor map. */
__host__ __device__ constexpr int padded(int d) {
  return (d + 63) / 64 * 64;
}

/* Shared memory for Br query rows a step, bytes from the 1024-aligned base
 * (every tile starts on a swizzle atom): K, V, the Q and dO slots, two dS^T
 * slots ([Bc][Br], Br / 64 column blocks; two, so that a warpgroup writes
 * the next one while the other may still read this one), each consumer's
 * fp32 dQ tile (64 x 64, two boxes of 32 columns: the swizzle's 128-byte
 * row), the slots' lse2 and D rows, and the mbarriers: K/V landed; slot
 * s's Q (with lse2) landed, its dO (with D) landed, and the consumers are
 * done with it. */
template <int D, int BR>
struct tiles {
  static constexpr int DP = padded(D);
  static constexpr uint32_t kKV = kBc * DP * 2, kQ = BR * DP * 2, kDS = kBc * BR * 2;
  static constexpr uint32_t kDQ = 64 * 64 * 4, kDQBox = 64 * 32 * 4;
  static constexpr uint32_t K = 0, V = kKV, Q = 2 * kKV, dO = Q + kStages * kQ;
  static constexpr uint32_t dS = dO + kStages * kQ;
  static constexpr uint32_t dQ = dS + 2 * kDS, L = dQ + 2 * kDQ, Dsum = L + kStages * BR * 4;
  static constexpr uint32_t bar_kv = Dsum + kStages * BR * 4, full_q = bar_kv + 8,
                            full_do = full_q + 8 * kStages, empty = full_do + 8 * kStages;
  static constexpr size_t smem = empty + 8 * kStages + 1024; /* and the alignment */
};

__device__ __forceinline__ void sts32(uint32_t a, float v) {
  asm volatile("st.shared.f32 [%0], %1;\n" ::"r"(a), "f"(v) : "memory");
}

/* Rows r0 .. rows - 1 of a swizzled tile to zeros, by the 256 consumer
 * threads: the varlen rows past a sequence's end, which the tensor map
 * brings from the next sequence, so that the zeros of P and dS there meet no
 * inf or NaN. The swizzle permutes chunks within a row, so the whole row is
 * the same set of chunks. */
template <int DP>
__device__ __forceinline__ void zero_rows(uint32_t tile, int rows, int r0, int ctid) {
  constexpr int kChunks = DP / 8;
  for (int i = ctid; i < (rows - r0) * kChunks; i += 256)
    asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};\n" ::"r"(
                     tile + wg::swizzled(rows, r0 + i / kChunks, i % kChunks)),
                 "r"(0)
                 : "memory");
}

/* A tile pair's rows r0 .. rows - 1 to zeros (zero_rows), handed to the
 * tensor cores by both consumer warpgroups (named barrier 1): K and V's
 * past a varlen sequence's keys, Q and dO's past its queries. */
template <int DP>
__device__ __forceinline__ void zero_tails(uint32_t a, uint32_t b, int rows, int r0, int ctid) {
  zero_rows<DP>(a, rows, r0, ctid);
  zero_rows<DP>(b, rows, r0, ctid);
  wg::fence_proxy_async();
  wg::named_sync(1, 256);
}

/* Whether the block has keys to take (a group's place past the last head,
 * or a key block past a shorter sequence's end, has none). */
template <int BC>
__device__ __forceinline__ bool block_has_keys(const params &p) {
  int kb, hk, b;
  attn_key_block_coords(p.order, &kb, &hk, &b);
  return hk < p.heads_kv && kb * BC < seq_of(p, b).nk;
}

/* The mbarriers, by thread 0, before the block's first barrier: K/V landed
 * (the copy's arrival); each slot's Q and dO landed (the copy's arrival
 * with its bytes and producer warp 1's 32, each after its lse2 or D
 * stores), and the slot released by every consumer thread. */
__device__ __forceinline__ void init_barriers(uint32_t bar_kv, uint32_t full_q, uint32_t full_do,
                                              uint32_t empty) {
  if (threadIdx.x != 0) return;
  wg::mbar_init(bar_kv, 1);
#pragma unroll
  for (int st = 0; st < kStages; ++st) {
    wg::mbar_init(full_q + 8 * st, 33);
    wg::mbar_init(full_do + 8 * st, 33);
    wg::mbar_init(empty + 8 * st, 256);
  }
  wg::mbar_init_fence();
}

/* The block's work: its keys and the query blocks that see any of them,
 * item it being query head hk * group + it / nmb, query block mb_min + it %
 * nmb. */
struct block_work {
  int n0, hk, b;
  seq sq;
  int mb_min, nmb, items;
};

template <int BR, int BC>
__device__ __forceinline__ block_work work_of(const params &p) {
  block_work w;
  int kb;
  attn_key_block_coords(p.order, &kb, &w.hk, &w.b);
  w.n0 = kb * BC;
  w.sq = seq_of(p, w.b);
  w.mb_min = w.nmb = w.items = 0;
  if (w.n0 < w.sq.nk) {
    int i_lo, i_hi;
    query_block_range(w.n0, min(w.n0 + BC, w.sq.nk), w.sq.nq, w.sq.nk, p.window_left,
                      p.window_right, &i_lo, &i_hi);
    w.mb_min = i_lo / BR;
    w.nmb = i_hi > i_lo ? (i_hi + BR - 1) / BR - w.mb_min : 0;
    w.items = w.nmb * p.group;
  }
  return w;
}

/* The producer warpgroup (warpgroup 0): warp 0's lane 0 issues every copy
 * (K and V once, then each item's Q and dO into its slot); warp 1's lanes
 * write BR / 32 rows each of the slot's lse2 and D (+inf and 0 past the
 * sequence, so that P = 0 there), whose loads do not hold the copies up.
 * Each role walks the items in the consumers' order and waits for a slot's
 * release on its own. Tiles of DP columns as column blocks of 64 (the
 * swizzle's row), BC keys and BR query rows. */
template <int DP, int BR, int BC>
__device__ __forceinline__ void produce(const params &p, const block_work &w, const CUtensorMap *tq,
                                        const CUtensorMap *tk, const CUtensorMap *tv,
                                        const CUtensorMap *tdo, uint32_t sK, uint32_t sV,
                                        uint32_t sQ, uint32_t sdO, uint32_t sL, uint32_t sD,
                                        uint32_t bar_kv, uint32_t full_q, uint32_t full_do,
                                        uint32_t empty, int tid) {
  constexpr uint32_t kKV = BC * DP * 2, kQ = BR * DP * 2;
  const int warp = tid >> 5, lane = tid & 31;
  if (warp == 0 && lane == 0 && w.items > 0) {
    /* Varlen tensors are one sequence of all the rows (batch coordinate
     * 0); rows past a tensor's end arrive as zeros. */
    const int qb = p.cu_q ? 0 : w.b, kb = p.cu_k ? 0 : w.b;
    const int k_row = (int)w.sq.k0 + w.n0;
    wg::mbar_expect_tx(bar_kv, 2 * kKV);
#pragma unroll
    for (int cb = 0; cb < DP / 64; ++cb) {
      wg::tma_load_4d(sK + cb * BC * 128, tk, cb * 64, k_row, w.hk, kb, bar_kv);
      wg::tma_load_4d(sV + cb * BC * 128, tv, cb * 64, k_row, w.hk, kb, bar_kv);
    }
    int it = 0;
    for (int hh = 0; hh < p.group; ++hh) {
      const int h = w.hk * p.group + hh;
      for (int mb = 0; mb < w.nmb; ++mb, ++it) {
        const int st = it % kStages, round = it / kStages;
        const int q_row = (int)w.sq.q0 + (w.mb_min + mb) * BR;
        /* The slot's previous item (round - 1) is released. */
        if (round > 0) wg::mbar_wait(empty + 8 * st, (round - 1) & 1);
        wg::mbar_expect_tx(full_q + 8 * st, kQ);
#pragma unroll
        for (int cb = 0; cb < DP / 64; ++cb)
          wg::tma_load_4d(sQ + st * kQ + cb * BR * 128, tq, cb * 64, q_row, h, qb, full_q + 8 * st);
        wg::mbar_expect_tx(full_do + 8 * st, kQ);
#pragma unroll
        for (int cb = 0; cb < DP / 64; ++cb)
          wg::tma_load_4d(sdO + st * kQ + cb * BR * 128, tdo, cb * 64, q_row, h, qb,
                          full_do + 8 * st);
      }
    }
  } else if (warp == 1 && w.items > 0) {
    int it = 0;
    for (int hh = 0; hh < p.group; ++hh) {
      /* The workspace rows of the sequence's row 0 of this head. */
      const int64_t ws0 = ws_row(p, w.sq, w.b, w.hk * p.group + hh, 0);
      for (int mb = 0; mb < w.nmb; ++mb, ++it) {
        const int st = it % kStages, round = it / kStages;
        const int m0 = (w.mb_min + mb) * BR;
        if (round > 0) wg::mbar_wait(empty + 8 * st, (round - 1) & 1);
#pragma unroll
        for (int r = lane; r < BR; r += 32) {
          const bool ok = m0 + r < w.sq.nq;
          sts32(sL + (st * BR + r) * 4, ok ? p.lse2[ws0 + m0 + r] : INFINITY);
          sts32(sD + (st * BR + r) * 4, ok ? p.dsum[ws0 + m0 + r] : 0.f);
        }
        wg::mbar_arrive(full_q + 8 * st);
        wg::mbar_arrive(full_do + 8 * st);
      }
    }
  }
}

/* The opening of both backward kernels, S their shared-memory layout from
 * the 1024-aligned base: the barriers set up, then the producer warpgroup
 * lowers its registers and issues every copy of the block. True in the
 * consumers, their registers raised; false where the thread is done (the
 * producer's, and every thread of a block with no keys). */
template <typename S, int DP, int BR, int BC>
__device__ __forceinline__ bool consumer_of(const params &p, uint32_t base, const CUtensorMap *tq,
                                            const CUtensorMap *tk, const CUtensorMap *tv,
                                            const CUtensorMap *tdo) {
  /* The registers each role keeps (FlashAttention-3's split for two
   * consumers: 24 x 128 + 240 x 256 fits the SM's 64K). */
  constexpr int kProducerRegs = 24, kConsumerRegs = 240;
  if (!block_has_keys<BC>(p)) return false;
  init_barriers(base + S::bar_kv, base + S::full_q, base + S::full_do, base + S::empty);
  __syncthreads();
  if (threadIdx.x >= 128) {
    wg::regs_inc<kConsumerRegs>();
    return true;
  }
  wg::regs_dec<kProducerRegs>();
  produce<DP, BR, BC>(p, work_of<BR, BC>(p), tq, tk, tv, tdo, base + S::K, base + S::V, base + S::Q,
                      base + S::dO, base + S::L, base + S::Dsum, base + S::bar_kv, base + S::full_q,
                      base + S::full_do, base + S::empty, (int)threadIdx.x);
  return false;
}

/* Whether the item of query rows m0 .. m0 + BR - 1 sees every key of the
 * block of BC from n0: no mask to apply. */
template <int BR, int BC>
__device__ __forceinline__ bool block_full(const params &p, int m0, int n0, int nq, int nk) {
  return block_unmasked(m0, min(m0 + BR, nq) - 1, n0, n0 + BC, nq, nk, p.window_left,
                        p.window_right);
}

/* P^T = exp2(score - lse2) in place of S^T's accumulators, with
 * common.cuh's rules: rows the thread's keys j0 and j0 + 8, columns the
 * queries m0 + 8 n + 2 t (+1), whose lse2 pairs are at a_l + 32 n; th gets
 * tanh's values under softcap. full: the block straddles no boundary (no
 * mask). */
template <int NS, bool SOFTCAP>
__device__ __forceinline__ void p_pass(const params &p, float (&s)[NS][4],
                                       float (&th)[SOFTCAP ? NS : 1][4], bool full,
                                       float slope_log2, int m0, int j0, int nq, int nk,
                                       uint32_t a_l) {
  const int t = threadIdx.x & 3;
  if (!SOFTCAP && full && slope_log2 == 0.f) {
    /* A plain block: one FMA and the exponential an element. The
     * general pass below carries every element's mask and ALiBi
     * terms, which nvcc interleaves whether or not they apply. */
#pragma unroll
    for (int n = 0; n < NS; ++n) {
      const float2 l2 = lds64(a_l + n * 32);
#pragma unroll
      for (int e = 0; e < 4; ++e)
        s[n][e] = ex2(fmaf(s[n][e], p.scale_log2, -((e & 1) ? l2.y : l2.x)));
    }
  } else {
    /* The queries each of the thread's two keys sees, as columns [lo,
     * hi) relative to its first (m0 + 2 t), so that the mask is two
     * compares an element against constants of the unrolled loop;
     * none for a key past the sequence. Under softcap, whose tanh
     * values leave no registers for the ranges, the rule an element. */
    int lo[2], hi[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int j = j0 + r * 8, c0 = m0 + 2 * t;
      int qlo = 0, qhi = 0;
      if (full) {
        qlo = c0;
        qhi = c0 + 8 * NS;
      } else if (j < nk) {
        query_range(j, nq, nk, p.window_left, p.window_right, &qlo, &qhi);
      }
      lo[r] = qlo - c0;
      hi[r] = qhi - c0;
    }
#pragma unroll
    for (int n = 0; n < NS; ++n) {
      const float2 l2 = lds64(a_l + n * 32);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = e >> 1, c = n * 8 + (e & 1);
        const int i = m0 + 2 * t + c;
        float tanh_v;
        const int j = j0 + r * 8, dg = diag(i, nq, nk);
        float v = score_log2(s[n][e], p.scale_log2, SOFTCAP, p.softcap_log2, p.softcap_inv,
                             slope_log2, dg - j, &tanh_v);
        if constexpr (SOFTCAP) {
          if (!full && !(j < nk && key_visible(dg, j, p.window_left, p.window_right)))
            v = -INFINITY;
        } else if (c < lo[r] || c >= hi[r]) {
          v = -INFINITY;
        }
        s[n][e] = ex2(v - ((e & 1) ? l2.y : l2.x));
        if constexpr (SOFTCAP) th[n][e] = tanh_v;
      }
    }
  }
}

/* The first D columns of a consumer's 64-key accumulator (rows the
 * thread's keys j0 and j0 + 8; N n8 tiles, the padding's past D) times mul
 * into the gradient's rows of a sequence starting at g, those past the keys
 * (nk) left out: dK, dV. */
template <int D, typename T, int N>
__device__ __forceinline__ void store_key_rows(const float (&acc)[N][4], T *g, int64_t ss, int j0,
                                               int nk, float mul) {
  static_assert(D <= 8 * N, "the stored columns are the accumulator's");
  const int t = threadIdx.x & 3;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int j = j0 + r * 8;
    if (j < nk) {
      T *row = g + (int64_t)j * ss;
#pragma unroll
      for (int n = 0; n < D / 8; ++n)
        *(uint32_t *)(row + n * 8 + 2 * t) =
            elem<T>::pack(acc[n][2 * r] * mul, acc[n][2 * r + 1] * mul);
    }
  }
}

/* dQ = dS K's split between the two warpgroups, each a product of 64 query
 * rows by 64 columns (the top). */
enum dq_split { kSplitColumns, kSplitKeys, kSplitRows };

/* One kernel shape: head dim D (64, 96 or 128; tiles of padded(D) columns),
 * BR query rows a step (64; 128 at d = 64). SOFTCAP compiles the softcap's
 * tanh and derivative in; ALiBi is a run-time slope. The maps are the 4-d
 * views (head dim, rows, heads, sequences) of q, k, v and dout, with a box
 * of 64 x BR (q, dout) or 64 x Bc (k, v), and of the dq accumulator in the
 * same coordinates with a box of 32 x 64, all with the 128-byte swizzle
 * (launcher). */
template <typename T, int D, int BR, bool SOFTCAP>
__global__ void __launch_bounds__(kThreads, 1)
    bwd_kernel(const __grid_constant__ CUtensorMap tq, const __grid_constant__ CUtensorMap tk,
               const __grid_constant__ CUtensorMap tv, const __grid_constant__ CUtensorMap tdo,
               const __grid_constant__ CUtensorMap tdq, const params p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using S = tiles<D, BR>;
  using mma = wg::mma<std::is_same<T, __nv_bfloat16>::value>;
  constexpr int DP = S::DP;
  constexpr int NO = DP / 8;  /* n8 tiles of dK, dV */
  constexpr int NS = BR / 8;  /* n8 tiles of S^T, dP^T (query columns) */
  constexpr int KB = BR / 16; /* k-steps of dV += P^T dO, dK += dS^T Q */
  constexpr dq_split kSplit = BR == 128 ? kSplitRows : DP == 64 ? kSplitKeys : kSplitColumns;
  static_assert(D % 16 == 0 && DP <= 128, "k16 steps of S^T; dK and dV fit the registers");
  static_assert(BR == 64 || (BR == 128 && DP == 64 && !SOFTCAP),
                "S^T, dP^T, dK and dV (and tanh's values) within the consumers' registers");
  static_assert(sizeof(T) == 2, "16-bit elements: 64 a swizzled row");

  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const uint32_t base = (smem_addr(smem_raw) + 1023u) & ~1023u;
  if (!consumer_of<S, DP, BR, kBc>(p, base, &tq, &tk, &tv, &tdo)) return;
  const uint32_t sK = base + S::K, sV = base + S::V, sQ = base + S::Q, sdO = base + S::dO;
  const uint32_t sdS = base + S::dS, sdQ = base + S::dQ, sL = base + S::L, sD = base + S::Dsum;
  const uint32_t bar_kv = base + S::bar_kv, full_q = base + S::full_q, full_do = base + S::full_do,
                 empty = base + S::empty;
  const int tid = threadIdx.x, wgi = tid >> 7;
  const block_work w = work_of<BR, kBc>(p);
  const int nq = w.sq.nq, nk = w.sq.nk, n0 = w.n0;
  const int c = wgi - 1, ctid = tid - 128, lane = tid & 31, warp = (tid >> 5) & 3;
  /* The warpgroup's thread that adds its dQ tile. */
  const bool lead = (ctid & 127) == 0;
  const uint32_t dq_tile = sdQ + c * S::kDQ;
  const int g = lane >> 2, t = lane & 3;
  /* The thread's keys: rows j0 and j0 + 8 of S^T. */
  const int j0 = n0 + c * 64 + warp * 16 + g;
  float dk[NO][4], dv[NO][4];
#pragma unroll
  for (int n = 0; n < NO; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      dk[n][e] = dv[n][e] = 0.f;

  if (w.items > 0) {
    wg::mbar_wait(bar_kv, 0);
    if (p.cu_k && n0 + kBc > nk) {
      zero_tails<DP>(sK, sV, kBc, nk - n0, ctid);
    }
    /* A of S^T and dP^T: this warpgroup's 64 rows of K and V. */
    const uint64_t a_k = wg::desc_k_major(sK + c * 64 * 128);
    const uint64_t a_v = wg::desc_k_major(sV + c * 64 * 128);
    /* dQ = dS K for query rows [dq_row0, + 64) of the step and columns
     * [q_col0, + 64), over keys [k_row0, + KQ): A is the dS^T slot's rows
     * k_row0.. of column block dq_row0 / 64, B the same rows of K's column
     * block q_col0 / 64, both MN-major (one 64-element block each). */
    constexpr int KQ = kSplit == kSplitKeys ? 64 : kBc;
    const int k_row0 = kSplit == kSplitKeys ? c * 64 : 0;
    const int q_col0 = kSplit == kSplitColumns ? c * 64 : 0;
    const int dq_row0 = kSplit == kSplitRows ? c * 64 : 0;
    const uint64_t b_dq =
        wg::desc_mn_major(sK + (q_col0 / 64) * kBc * 128 + k_row0 * 128, kBc * 128);

    for (int it = 0; it < w.items; ++it) {
      const int st = it % kStages;
      const uint32_t ph = (uint32_t)(it / kStages) & 1;
      const int h = w.hk * p.group + it / w.nmb, m0 = (w.mb_min + it % w.nmb) * BR;
      const uint32_t q_slot = sQ + st * S::kQ, do_slot = sdO + st * S::kQ;
      const uint32_t ds_slot = sdS + (it & 1) * S::kDS;

      wg::mbar_wait(full_q + 8 * st, ph);
      if (p.cu_q && m0 + BR > nq) {
        wg::mbar_wait(full_do + 8 * st, ph);
        zero_tails<DP>(q_slot, do_slot, BR, nq - m0, ctid);
      }

      /* S^T = K Q^T and dP^T = V dO^T, one commit group each; P^T =
       * exp2(score - lse2) runs while dP^T's product does. Under softcap,
       * dS needs tanh's values too, which with tanhf's temporaries do not
       * fit beside dP^T's accumulators at d = 128: there dP^T's product
       * follows the P pass, which keeps tanh in th. */
      float s[NS][4], dp[NS][4], th[SOFTCAP ? NS : 1][4];
      auto issue_dp = [&] {
        wg::mbar_wait(full_do + 8 * st, ph);
        wg::fence();
        const uint64_t b_do = wg::desc_k_major(do_slot);
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk)
          mma::ss(dp, a_v + wg::kstep_k_major(kBc, kk), b_do + wg::kstep_k_major(BR, kk), kk > 0);
        wg::commit();
      };
      wg::pin(s);
      wg::pin(dp);
      wg::fence();
      {
        const uint64_t b_q = wg::desc_k_major(q_slot);
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk)
          mma::ss(s, a_k + wg::kstep_k_major(kBc, kk), b_q + wg::kstep_k_major(BR, kk), kk > 0);
      }
      wg::commit();
      if constexpr (SOFTCAP) {
        wg::wait<0>();
      } else {
        issue_dp();
        wg::wait<1>();
      }
      wg::pin(s);

      /* The mask only on blocks that straddle a boundary (sequence end,
       * causal diagonal, window edge); query rows past the sequence have
       * lse2 = +inf and so P = 0. The thread's columns are queries 8 n + 2 t
       * (+1), whose lse2 and D pairs it reads from the slot. */
      const bool full = block_full<BR, kBc>(p, m0, n0, nq, nk);
      const float slope_log2 = p.alibi ? p.alibi[h] * kLog2e : 0.f;
      const uint32_t a_l = sL + (st * BR + 2 * t) * 4, a_d = sD + (st * BR + 2 * t) * 4;
      p_pass<NS, SOFTCAP>(p, s, th, full, slope_log2, m0, j0, nq, nk, a_l);
      if constexpr (SOFTCAP) {
        wg::pin(s);
        wg::pin(th);
        issue_dp();
      }
      /* P^T and dS^T to 16 bits as A fragments (k-step kk: queries 16 kk
       * .. 16 kk + 15). With 64 query rows and no softcap, dV += P^T dO
       * is issued now, so that the tensor cores have it while dS^T is
       * computed and handed over below; under softcap (tanh's values) or
       * with 128 rows, P^T's fragments beside its fp32 values would not
       * fit the registers, and dV waits for dQ. */
      constexpr bool kEarlyDv = !SOFTCAP && BR == 64;
      uint32_t pa[KB][4], da[KB][4];
      if constexpr (kEarlyDv) {
#pragma unroll
        for (int kk = 0; kk < KB; ++kk)
          a_frag<T>(pa[kk], s[2 * kk], s[2 * kk + 1]);
        wg::pin(pa);
        wg::pin(dv);
        wg::fence();
        const uint64_t b_do = wg::desc_mn_major(do_slot, BR * 128);
#pragma unroll
        for (int kk = 0; kk < KB; ++kk)
          mma::rs(dv, pa[kk], b_do + wg::kstep_mn_major(kk), 1);
        wg::commit();
      }
      /* dS^T = P^T (dP^T - D), times the softcap's derivative, in place of
       * dP^T. */
      wg::wait<kEarlyDv ? 1 : 0>();
      wg::pin(dp);
#pragma unroll
      for (int n = 0; n < NS; ++n) {
        const float2 dd = lds64(a_d + n * 32);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float ds = s[n][e] * (dp[n][e] - ((e & 1) ? dd.y : dd.x));
          dp[n][e] = SOFTCAP ? score_grad(ds, th[n][e]) : ds;
        }
      }

      /* dS^T into its slot for dQ. */
#pragma unroll
      for (int kk = 0; kk < KB; ++kk) {
        if constexpr (!kEarlyDv) a_frag<T>(pa[kk], s[2 * kk], s[2 * kk + 1]);
        a_frag<T>(da[kk], dp[2 * kk], dp[2 * kk + 1]);
      }
      wg::stash<KB>(ds_slot, kBc, c * 64, da);
      wg::fence_proxy_async();
      /* The previous item's dQ tile read out before this barrier, after
       * which the warpgroup writes the next. */
      if (lead) wg::bulk_wait_read();
      /* dQ reads dS^T rows [k_row0, + KQ): both warpgroups' rows, or this
       * one's. The slot alternates, so this barrier also tells a
       * warpgroup that the other is done with the slot it writes next. */
      if (kSplit == kSplitKeys)
        wg::named_sync(2 + c, 128);
      else
        wg::named_sync(1, 256);

      /* dV += P^T dO (under softcap) and dQ = dS K, then dK += dS^T Q:
       * dQ's tile goes to shared memory and its reduction is issued while
       * dK's product runs. */
      float dq[8][4];
      wg::pin(pa);
      wg::pin(da);
      wg::pin(dv);
      wg::pin(dk);
      wg::pin(dq);
      wg::fence();
      {
        const uint64_t b_do = wg::desc_mn_major(do_slot, BR * 128);
        const uint64_t a_ds =
            wg::desc_mn_major(ds_slot + (dq_row0 / 64) * kBc * 128 + k_row0 * 128, kBc * 128);
        constexpr int NQ = KQ / 16;
        /* dV's k-steps between dQ's: two accumulator chains in flight
         * rather than one waiting on its own results (1-3 % at d = 96
         * and 128). Not at d = 64: at Br = 128 its two chains of eight
         * steps ran slower, and its softcap tiles are untimed. */
        constexpr bool kPaired = !kEarlyDv && BR == 64 && DP > 64;
        static_assert(!kPaired || KB <= NQ, "dV's k-steps fit between dQ's");
        if constexpr (!kEarlyDv && !kPaired) {
#pragma unroll
          for (int kk = 0; kk < KB; ++kk)
            mma::rs(dv, pa[kk], b_do + wg::kstep_mn_major(kk), 1);
        }
#pragma unroll
        for (int kk = 0; kk < NQ; ++kk) {
          if constexpr (kPaired) {
            if (kk < KB) mma::rs(dv, pa[kk], b_do + wg::kstep_mn_major(kk), 1);
          }
          mma::ss_mn(dq, a_ds + wg::kstep_mn_major(kk), b_dq + wg::kstep_mn_major(kk), kk > 0);
        }
      }
      wg::commit();
      {
        const uint64_t b_q = wg::desc_mn_major(q_slot, BR * 128);
#pragma unroll
        for (int kk = 0; kk < KB; ++kk)
          mma::rs(dk, da[kk], b_q + wg::kstep_mn_major(kk), 1);
      }
      wg::commit();
      wg::wait<1>();
      wg::pin(dq);
      wg::pin(dv);
      /* Rows past the sequence store zeros: a varlen box runs into the
       * next sequence's rows, where it must add nothing (the map drops
       * what lies past the tensor: rows, and the padding's columns at
       * d = 96). */
      {
        /* Columns 8 n + 2 t, + 1 of row 16 warp + g (+ 8): 16-byte chunk
         * 2 n + t / 2 of the tile's row (boxes of 8 chunks), 8 bytes in
         * where t is odd. */
        const int tr = warp * 16 + g, row = m0 + dq_row0 + tr;
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const bool ok = row + r * 8 < nq;
#pragma unroll
          for (int n = 0; n < 8; ++n) {
            const uint32_t at =
                dq_tile + (t & 1) * 8 + wg::swizzled(64, tr + r * 8, 2 * n + (t >> 1));
            asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(at),
                         "f"(ok ? dq[n][2 * r] : 0.f), "f"(ok ? dq[n][2 * r + 1] : 0.f)
                         : "memory");
          }
        }
      }
      wg::fence_proxy_async();
      wg::named_sync(4 + c, 128);
      if (lead) {
        const int qb = p.cu_q ? 0 : w.b;
        const int q_row = (int)w.sq.q0 + m0 + dq_row0;
#pragma unroll
        for (int bx = 0; bx < 2; ++bx)
          wg::tma_add_4d(&tdq, q_col0 + bx * 32, q_row, h, qb, dq_tile + bx * S::kDQBox);
        wg::bulk_commit();
      }
      wg::wait<0>();
      wg::pin(dk);
      wg::pin(pa);
      wg::pin(da);
      wg::mbar_arrive(empty + 8 * st);
    }
    /* The tile stays in shared memory until its last reduction is done. */
    if (lead) wg::bulk_wait();
  }

  /* dK (times the softmax scale) and dV; keys no query sees get zeros. */
  store_key_rows<D>(dk, row_ptr<T>(p.dk, w.b, w.sq.k0, w.hk), p.dk.ss, j0, nk, p.scale);
  store_key_rows<D>(dv, row_ptr<T>(p.dv, w.b, w.sq.k0, w.hk), p.dv.ss, j0, nk, 1.f);
#else
  __trap(); /* the plan runs it only on sm_90a code */
#endif
}

/* ---------------------------------------------------------------------- */
/* d = 256: the two consumers split by role                                 */
/* ---------------------------------------------------------------------- */

/*
 * At d = 256 one warpgroup's dK and dV over 64 keys would take 256
 * registers a thread, so over a block of 64 keys the consumers split the
 * work by role: warpgroup 1 keeps dV and computes S^T = K Q^T, P^T and dV
 * += P^T dO; warpgroup 2 keeps dK and computes dP^T = V dO^T, dS^T and dK
 * += dS^T Q. P^T (times the softcap's derivative) goes from the first to
 * the second through shared memory as fp32, each thread its own
 * accumulator elements (both accumulators have one layout), and dS^T goes
 * to both as 16 bits for dQ = dS K, whose 256 columns they split, 128 each,
 * added into the fp32 accumulator by atomics: K, V, two Q/dO slots, P^T and
 * dS^T take 218 KB and leave no room for the tiles of the bulk reduction.
 * The work per item is even: S^T, P^T dO and half of dQ against dP^T,
 * dS^T Q and the other half.
 */
constexpr int kBc256 = 64, kBr256 = 64;

struct tiles256 {
  static constexpr int DP = 256, BR = kBr256, BC = kBc256;
  static constexpr uint32_t kKV = BC * DP * 2, kQ = BR * DP * 2;
  static constexpr uint32_t K = 0, V = kKV, Q = 2 * kKV, dO = Q + kStages * kQ;
  static constexpr uint32_t P = dO + kStages * kQ, dS = P + BC * BR * 4;
  static constexpr uint32_t L = dS + BC * BR * 2, Dsum = L + kStages * BR * 4;
  static constexpr uint32_t bar_kv = Dsum + kStages * BR * 4, full_q = bar_kv + 8,
                            full_do = full_q + 8 * kStages, empty = full_do + 8 * kStages;
  static constexpr size_t smem = empty + 8 * kStages + 1024; /* and the alignment */
};

template <typename T, bool SOFTCAP>
__global__ void __launch_bounds__(kThreads, 1)
    bwd256_kernel(const __grid_constant__ CUtensorMap tq, const __grid_constant__ CUtensorMap tk,
                  const __grid_constant__ CUtensorMap tv, const __grid_constant__ CUtensorMap tdo,
                  const __grid_constant__ CUtensorMap /* dq's: bwd_kernel's */, const params p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using S = tiles256;
  using mma = wg::mma<std::is_same<T, __nv_bfloat16>::value>;
  constexpr int DP = S::DP, BR = S::BR, BC = S::BC;
  constexpr int NS = BR / 8, KB = BR / 16, KS = DP / 16;

  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const uint32_t base = (smem_addr(smem_raw) + 1023u) & ~1023u;
  if (!consumer_of<S, DP, BR, BC>(p, base, &tq, &tk, &tv, &tdo)) return;
  const uint32_t sK = base + S::K, sV = base + S::V, sQ = base + S::Q, sdO = base + S::dO;
  const uint32_t sP = base + S::P, sdS = base + S::dS, sL = base + S::L, sD = base + S::Dsum;
  const uint32_t bar_kv = base + S::bar_kv, full_q = base + S::full_q, full_do = base + S::full_do,
                 empty = base + S::empty;
  const int tid = threadIdx.x, wgi = tid >> 7;
  const block_work w = work_of<BR, BC>(p);
  const int nq = w.sq.nq, nk = w.sq.nk, n0 = w.n0;
  const bool keeps_dv = wgi == 1;
  const int ctid = tid - 128, wtid = tid & 127, lane = tid & 31, warp = (tid >> 5) & 3;
  const int g = lane >> 2, t = lane & 3;
  /* The thread's keys (rows j0 and j0 + 8 of S^T and dP^T) and its dQ
   * rows (16 warp + g, + 8 of the item's queries), columns from c0. */
  const int j0 = n0 + warp * 16 + g, c0 = keeps_dv ? 0 : DP / 2;
  float acc[DP / 8][4]; /* dV or dK */
#pragma unroll
  for (int n = 0; n < DP / 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      acc[n][e] = 0.f;

  if (w.items > 0) {
    wg::mbar_wait(bar_kv, 0);
    if (p.cu_k && n0 + BC > nk) {
      zero_tails<DP>(sK, sV, BC, nk - n0, ctid);
    }
    /* A of S^T or dP^T: K or V, all the block's keys. B of dQ: K's
     * columns c0 .. c0 + 127, MN-major. A of dQ: the dS^T tile. */
    const uint64_t a_kv = wg::desc_k_major(keeps_dv ? sK : sV);
    const uint64_t b_dq = wg::desc_mn_major(sK + (c0 / 64) * BC * 128, BC * 128);
    const uint64_t a_ds = wg::desc_mn_major(sdS, BC * 128);
    /* This thread's P^T elements: float4 n of the accumulator, 2 KB apart. */
    const uint32_t p_at = sP + wtid * 16;

    for (int it = 0; it < w.items; ++it) {
      const int st = it % kStages;
      const uint32_t ph = (uint32_t)(it / kStages) & 1;
      const int h = w.hk * p.group + it / w.nmb, m0 = (w.mb_min + it % w.nmb) * BR;
      const uint32_t q_slot = sQ + st * S::kQ, do_slot = sdO + st * S::kQ;

      wg::mbar_wait(full_q + 8 * st, ph);
      wg::mbar_wait(full_do + 8 * st, ph);
      if (p.cu_q && m0 + BR > nq) {
        zero_tails<DP>(q_slot, do_slot, BR, nq - m0, ctid);
      }

      /* S^T = K Q^T (warpgroup 1) or dP^T = V dO^T (warpgroup 2). */
      float s[NS][4];
      wg::pin(s);
      wg::fence();
      {
        const uint64_t b = wg::desc_k_major(keeps_dv ? q_slot : do_slot);
#pragma unroll
        for (int kk = 0; kk < KS; ++kk)
          mma::ss(s, a_kv + wg::kstep_k_major(BC, kk), b + wg::kstep_k_major(BR, kk), kk > 0);
      }
      wg::commit();
      wg::wait<0>();
      wg::pin(s);

      uint32_t fa[KB][4]; /* P^T or dS^T as A fragments */
      if (keeps_dv) {
        const bool full = block_full<BR, BC>(p, m0, n0, nq, nk);
        const float slope_log2 = p.alibi ? p.alibi[h] * kLog2e : 0.f;
        float th[SOFTCAP ? NS : 1][4];
        p_pass<NS, SOFTCAP>(p, s, th, full, slope_log2, m0, j0, nq, nk, sL + (st * BR + 2 * t) * 4);
        /* P^T times the softcap's derivative to warpgroup 2, which
         * takes dS^T = that times (dP^T - D). */
#pragma unroll
        for (int n = 0; n < NS; ++n) {
          float v[4];
#pragma unroll
          for (int e = 0; e < 4; ++e)
            v[e] = SOFTCAP ? score_grad(s[n][e], th[n][e]) : s[n][e];
          asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"r"(p_at + n * 2048),
                       "f"(v[0]), "f"(v[1]), "f"(v[2]), "f"(v[3])
                       : "memory");
        }
        wg::named_arrive(2, 256);
#pragma unroll
        for (int kk = 0; kk < KB; ++kk)
          a_frag<T>(fa[kk], s[2 * kk], s[2 * kk + 1]);
        wg::pin(fa);
        wg::pin(acc);
        wg::fence();
        const uint64_t b_do = wg::desc_mn_major(do_slot, BR * 128);
#pragma unroll
        for (int kk = 0; kk < KB; ++kk)
          mma::rs(acc, fa[kk], b_do + wg::kstep_mn_major(kk), 1);
        wg::commit();
      } else {
        wg::named_sync(2, 256);
        const uint32_t a_d = sD + (st * BR + 2 * t) * 4;
#pragma unroll
        for (int n = 0; n < NS; ++n) {
          float v[4];
          asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];\n"
                       : "=f"(v[0]), "=f"(v[1]), "=f"(v[2]), "=f"(v[3])
                       : "r"(p_at + n * 2048)
                       : "memory");
          const float2 dd = lds64(a_d + n * 32);
#pragma unroll
          for (int e = 0; e < 4; ++e)
            s[n][e] = v[e] * (s[n][e] - ((e & 1) ? dd.y : dd.x));
        }
#pragma unroll
        for (int kk = 0; kk < KB; ++kk)
          a_frag<T>(fa[kk], s[2 * kk], s[2 * kk + 1]);
        wg::stash<KB>(sdS, BC, 0, fa);
        wg::fence_proxy_async();
        wg::pin(fa);
        wg::pin(acc);
        wg::fence();
        const uint64_t b_q = wg::desc_mn_major(q_slot, BR * 128);
#pragma unroll
        for (int kk = 0; kk < KB; ++kk)
          mma::rs(acc, fa[kk], b_q + wg::kstep_mn_major(kk), 1);
        wg::commit();
      }
      /* dS^T in place (both warpgroups' threads), and warpgroup 2 done
       * reading P^T, which warpgroup 1 may write again after this. */
      wg::named_sync(3, 256);

      /* dQ's columns c0 .. c0 + 127 = dS K, over the block's keys, in two
       * halves of 64, each added as it is done: one product of 128 beside
       * dV's or dK's accumulators leaves ptxas too few registers, and it
       * serializes the wgmmas. The first half's wait also completes dV's
       * or dK's product; the slot is released after the second's. */
      const seq &sq = w.sq;
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        float dq[8][4];
        wg::pin(dq);
        wg::fence();
#pragma unroll
        for (int kk = 0; kk < BC / 16; ++kk)
          mma::ss_mn(dq, a_ds + wg::kstep_mn_major(kk),
                     b_dq + ((uint64_t)(half * BC * 128) >> 4) + wg::kstep_mn_major(kk), kk > 0);
        wg::commit();
        wg::wait<0>();
        wg::pin(dq);
        if (half == 0) {
          wg::pin(acc);
          wg::pin(fa);
        } else {
          wg::mbar_arrive(empty + 8 * st);
        }
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int i = m0 + warp * 16 + g + r * 8;
          if (i < nq) {
            float *dst = p.dq_acc + ws_row(p, sq, w.b, h, i) * DP + c0 + half * 64 + 2 * t;
#pragma unroll
            for (int n = 0; n < 8; ++n)
              atomicAdd((float2 *)(dst + n * 8), make_float2(dq[n][2 * r], dq[n][2 * r + 1]));
          }
        }
      }
    }
  }

  /* dV, or dK times the softmax scale; keys no query sees get zeros. */
  const tensor_ref out = keeps_dv ? p.dv : p.dk;
  store_key_rows<DP>(acc, row_ptr<T>(out, w.b, w.sq.k0, w.hk), out.ss, j0, nk,
                     keeps_dv ? 1.f : p.scale);
#else
  __trap(); /* the plan runs it only on sm_90a code */
#endif
}

/* ---------------------------------------------------------------------- */
/* Launchers and rows                                                       */
/* ---------------------------------------------------------------------- */

/* The row that runs the problem in this row's place where a tensor map
 * cannot describe an operand (or the driver has no encoder), on the same
 * workspace: the tensor-core backward's row of its dtype and head dim, or
 * at d = 256, which that family has no row for, the general backward's
 * first that fits the device. */
static int fall_back(const attn__cuda_launch *L) {
  const attn__problem *pb = L->pb;
  const attn__cuda_rows *const tables[] = {
      &attn__cuda_mma_backward_rows,
      pb->dtype == ATTN_F16 ? &attn__cuda_general_rows_f16 : &attn__cuda_general_rows_bf16};
  for (const attn__cuda_rows *t : tables)
    for (int i = 0; i < t->n; i++) {
      const attn__cuda_config *c = &t->row[i];
      if ((c->kernel == ATTN__CUDA_MMA_BACKWARD || c->kernel == ATTN__CUDA_GENERAL_BACKWARD) &&
          c->dtype == pb->dtype && c->dim == attn__cuda_dim_bucket(c->kernel, pb->head_dim) &&
          c->smem <= L->dev->smem_optin)
        return c->launch(L, c);
    }
  return ATTN_EINTERNAL;
}

/* One kernel's launches around the prep pass and the dq conversion: kern
 * with tiles of BR query rows and BC keys, and smem bytes of shared memory;
 * false where a tensor map cannot describe an operand. */
template <typename T, int D, int BR, int BC, typename K>
static bool run(const attn__cuda_launch *L, const params &p, int *rc, K kern, size_t smem) {
  const attn__problem *pb = L->pb;
  const int64_t seqs = pb->varlen ? 1 : pb->batch;
  const int64_t rows_q = pb->varlen ? pb->total_q : pb->seqlen_q;
  const int64_t rows_k = pb->varlen ? pb->total_k : pb->seqlen_k;
  auto encode = [&](CUtensorMap *m, const tensor_ref &t, int64_t rows, int64_t heads, int box) {
    return wg::encode_rows<T>(m, t.ptr, D, rows, heads, seqs, t.ss, t.sh, t.sb, box);
  };
  /* The dq accumulator, [heads_q][rows over the batch][D] fp32, in q's
   * coordinates (head dim, row, head, sequence). */
  const cuuint64_t row_bytes = (cuuint64_t)D * 4;
  const cuuint64_t dq_dim[4] = {(cuuint64_t)D, (cuuint64_t)rows_q, (cuuint64_t)pb->heads_q,
                                (cuuint64_t)seqs};
  const cuuint64_t dq_stride[3] = {row_bytes, (cuuint64_t)p.rows * row_bytes,
                                   seqs == 1 ? 16 : (cuuint64_t)rows_q * row_bytes};
  CUtensorMap tq, tk, tv, tdo, tdq;
  if (!encode(&tq, p.q, rows_q, pb->heads_q, BR) ||
      !encode(&tdo, p.dout, rows_q, pb->heads_q, BR) ||
      !encode(&tk, p.k, rows_k, pb->heads_kv, BC) || !encode(&tv, p.v, rows_k, pb->heads_kv, BC) ||
      !wg::encode_box(&tdq, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, p.dq_acc, dq_dim, dq_stride, 32, 64))
    return false;
  if (cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) !=
      cudaSuccess) {
    *rc = ATTN_EDEVICE;
    return true;
  }
  if ((*rc = bwd_prep<T, D>(p, L->dev->sm_count, L->stream)) != ATTN_OK) return true;
  params po = p;
  const dim3 grid =
      attn_key_block_grid(kern, kThreads, smem, (unsigned)((p.seqlen_k + BC - 1) / BC), p.heads_kv,
                          p.batch, L->dev->sm_count, p.window_left, p.window_right, &po.order);
  kern<<<grid, kThreads, smem, L->stream>>>(tq, tk, tv, tdo, tdq, po);
  *rc = cudaGetLastError() == cudaSuccess ? bwd_dq_convert<T, D>(p, L->dev->sm_count, L->stream)
                                          : ATTN_EDEVICE;
  return true;
}

/* Under softcap, Br = 64 (tanh's values need the registers of the larger
 * tile). */
template <typename T, int D, int BR>
static int launch_bwd(const attn__cuda_launch *L, const attn__cuda_config *) {
  params p;
  make_params(L, 1, &p);
  bwd_workspace(L, &p);
  int rc = ATTN_OK;
  const bool ran =
      p.dq_atomic &&
      (p.softcap > 0.f
           ? run<T, D, 64, kBc>(L, p, &rc, bwd_kernel<T, D, 64, true>, tiles<D, 64>::smem)
           : run<T, D, BR, kBc>(L, p, &rc, bwd_kernel<T, D, BR, false>, tiles<D, BR>::smem));
  return ran ? rc : fall_back(L);
}

template <typename T>
static int launch_bwd256(const attn__cuda_launch *L, const attn__cuda_config *) {
  params p;
  make_params(L, 1, &p);
  bwd_workspace(L, &p);
  int rc = ATTN_OK;
  const bool ran =
      p.dq_atomic &&
      (p.softcap > 0.f
           ? run<T, 256, kBr256, kBc256>(L, p, &rc, bwd256_kernel<T, true>, tiles256::smem)
           : run<T, 256, kBr256, kBc256>(L, p, &rc, bwd256_kernel<T, false>, tiles256::smem));
  return ran ? rc : fall_back(L);
}

template <typename T>
constexpr attn__cuda_config row_of(int dim, int br, int bc, size_t smem, const char *name,
                                   int (*launch)(const attn__cuda_launch *,
                                                 const attn__cuda_config *)) {
  return {.kernel = ATTN__CUDA_HOPPER_BACKWARD,
          .dtype = std::is_same<T, __half>::value ? ATTN_F16 : ATTN_BF16,
          .dim = dim,
          .cc = 90,
          .specific = 1,
          .tf32 = 0,
          .threads = kThreads,
          .br = br,
          .bc = bc,
          .stages = 0,
          .min_seqlen_q = 0,
          .min_keys_masked = 0,
          .smem = smem,
          .smem_det = 0,
          .features = 0,
          .nondeterministic = 1,
          .name = name,
          .launch = launch};
}

template <typename T, int D, int BR>
constexpr attn__cuda_config bwd_row(const char *name) {
  constexpr size_t smem = tiles<D, BR>::smem, smem_64 = tiles<D, 64>::smem;
  return row_of<T>(D, BR, kBc, smem > smem_64 ? smem : smem_64, name, launch_bwd<T, D, BR>);
}

template <typename T>
constexpr attn__cuda_config bwd256_row(const char *name) {
  return row_of<T>(256, kBr256, kBc256, tiles256::smem, name, launch_bwd256<T>);
}

/* The rows, <head dim, Br>: FlashAttention-3's tiles for these dims (Bc =
 * 128 keys; Br = 128 query rows at d = 64, 64 at d = 128, where dK and dV
 * take 128 of the consumers' 240 registers); d = 96 runs d = 128's tiles
 * (the padding's columns computed, never stored); d = 256 the split by
 * role over 64 x 64 tiles. Shared memory: 194 KB at d = 96 and 128, 195 KB
 * at d = 64, 218 KB at d = 256. */
constexpr attn__cuda_config bwd_rows[] = {
    bwd_row<__half, 64, 128>("Hopper backward (wgmma), f16, d = 64, 128 x 128 tiles"),
    bwd_row<__half, 96, 64>("Hopper backward (wgmma), f16, d = 96, 64 x 128 tiles"),
    bwd_row<__half, 128, 64>("Hopper backward (wgmma), f16, d = 128, 64 x 128 tiles"),
    bwd256_row<__half>("Hopper backward (wgmma), f16, d = 256, 64 x 64 tiles, dK and dV apart"),
    bwd_row<__nv_bfloat16, 64, 128>("Hopper backward (wgmma), bf16, d = 64, 128 x 128 tiles"),
    bwd_row<__nv_bfloat16, 96, 64>("Hopper backward (wgmma), bf16, d = 96, 64 x 128 tiles"),
    bwd_row<__nv_bfloat16, 128, 64>("Hopper backward (wgmma), bf16, d = 128, 64 x 128 tiles"),
    bwd256_row<__nv_bfloat16>(
        "Hopper backward (wgmma), bf16, d = 256, 64 x 64 tiles, dK and dV apart"),
};

}  // namespace attn_hopper_bwd

extern "C" const attn__cuda_rows attn__cuda_hopper_backward_rows = {
    attn_hopper_bwd::bwd_rows,
    (int)(sizeof attn_hopper_bwd::bwd_rows / sizeof attn_hopper_bwd::bwd_rows[0])};
