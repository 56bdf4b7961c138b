/*
 * The decoding family (FlashDecoding), shared by its kernels: the forward
 * pass for a few query rows over a long KV cache, where the grid of the
 * other families (query blocks x heads x sequences) leaves the device idle
 * and every query head re-reads its K/V head.
 *
 * A block owns (sequence, KV head, block of kRows query rows, key split).
 * Its rows are those of every query head that shares the KV head (GQA
 * packing: row r of the block is query row (r0 + r) / group of head
 * hk * group + (r0 + r) % group), so K and V are read once per KV head. The
 * block's keys (those its rows see, cut into `splits` parts of whole
 * kTile-key tiles) are dealt to its warps tile by tile, warp w taking tiles
 * w, w + NW, ...; each warp streams its tiles through its own shared-memory
 * slots and keeps its own online softmax (m_i, l_i, O_i) over all the rows,
 * so the loop has no block-wide barrier. At the end the warps' states merge
 * through shared memory (block_end); a block of an unsplit problem then
 * finishes its rows into o and lse (the sink folded in, rows with no key
 * decided by common.cuh's row_seen), a split block writes its state (m, l,
 * unnormalized O) to the workspace and combine_kernel (decode.cu) merges the
 * splits the same way and finishes the rows.
 *
 * Scores are in log2 units for f16/bf16, as in the tensor-core family
 * (score_log2; the bias joins as bias * log2(e)), and natural for f32, as in
 * the general family (score); m_i keeps the kernel's units until a row is
 * finished, where it becomes natural for sink_fold and lse_store.
 */
#ifndef ATTN_CUDA_DECODE_CUH
#define ATTN_CUDA_DECODE_CUH

#include "attn_cuda.h"
#include "common.cuh"
#include "mma_common.cuh" /* cp.async */

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

namespace attn_decode {

using attn_mma::kLn2;
using attn_mma::kLog2e;
/* Query rows a block: one m16 tile of the tensor cores. */
constexpr int kRows = 16;
/* Keys a warp takes per step: one k16 step of P V. */
constexpr int kTile = 16;

/* One operand: p already at (native + offset); strides in elements. */
typedef attn__cuda_view dtensor;

/* Everything the kernels read, by value. Lengths and key indices are int:
 * the plan gives this family no sequence of 2^30 rows or more and no more
 * than 2^31 - 1 pages. */
struct dparams {
  dtensor q, k, v, o, lse, bias;
  const int32_t *cu_q, *cu_k; /* device, batch + 1; NULL for bshd (cu_k: and paged) */
  const float *alibi;         /* device, heads_q slopes; NULL for none */
  const int32_t *used;        /* seqused_k, device; NULL: every row of the capacity */
  long long used_sb;
  const int32_t *bt; /* block table, device; NULL: not paged */
  long long bt_sb, bt_ss;
  const float *sinks; /* device, NULL for none */
  long long sinks_sh;
  int bias_dtype, has_bias, has_lse;
  int batch, hq, hkv, group, d;
  int seqlen_q, seqlen_k; /* bshd lengths (seqlen_k the capacity); varlen: the longest */
  int nnew;               /* rows appended this call (already in the cache) */
  int page_size, num_pages;
  int wl, wr;                                  /* -1 = unbounded */
  float scale, softcap, inv_softcap;           /* natural units (f32) */
  float scale_log2, softcap_log2, softcap_inv; /* log2 units (f16, bf16) */
  int rblocks;                                 /* blocks of kRows rows per KV head */
  int splits;
  /* Split blocks' states: (m in the kernel's units, l) per [split][row] and
   * the unnormalized O per [split][row][d], row = global query row * hq +
   * head. */
  float2 *ws_ml;
  float *ws_acc;
  long long rows; /* total_q * hq */
};

/* Fills P from a launch (decode.cu). */
dparams make_params(const attn__cuda_launch *L, int splits);
/* Merges the splits' states into o and lse (decode.cu). */
int combine(const attn__cuda_launch *L, const dparams &P);

/* The blocks' grid: x = (split * rblocks + row block) * hkv + KV head (heads
 * fastest, so that the blocks running together read the same key rows of
 * every head), y = sequence. */
__device__ __forceinline__ void block_coords(const dparams &P, int *hk, int *rb, int *split) {
  int x = blockIdx.x;
  *hk = x % P.hkv;
  x /= P.hkv;
  *rb = x % P.rblocks;
  *split = x / P.rblocks;
}

/* Sequence b as the kernels see it. */
struct dseq {
  int nq, nk;     /* query rows; keys attended (used + appended, or the capacity) */
  long long q0;   /* first row in q, o and lse (varlen), else 0 */
  long long k0;   /* first row in k and v (varlen, not paged), else 0 */
  long long row0; /* first row over the batch: the workspace's */
};

__device__ __forceinline__ dseq seq_of(const dparams &P, int b) {
  dseq s;
  int cap;
  if (P.cu_q) {
    s.q0 = P.cu_q[b];
    s.nq = P.cu_q[b + 1] - P.cu_q[b];
    s.row0 = s.q0;
  } else {
    s.q0 = 0;
    s.nq = P.seqlen_q;
    s.row0 = (long long)b * P.seqlen_q;
  }
  if (P.cu_k) {
    s.k0 = P.cu_k[b];
    cap = P.cu_k[b + 1] - P.cu_k[b];
  } else {
    s.k0 = 0;
    cap = P.seqlen_k;
  }
  s.nk = P.used ? seq_used(P.used, P.used_sb, b, cap, P.nnew) + P.nnew : cap;
  return s;
}

/* The element offset of key row j of sequence b in k or v (t), before the
 * head and column terms. */
template <bool PAGED>
__device__ __forceinline__ long long key_row(const dparams &P, const dtensor &t, int b,
                                             const dseq &s, int j) {
  if (PAGED) return paged_row(P.bt, P.bt_sb, P.bt_ss, b, j, P.page_size, P.num_pages, t.sb, t.ss);
  return (long long)b * t.sb + (s.k0 + j) * t.ss;
}

/* Whether query row i sees a key, by the mask. */
__device__ __forceinline__ bool mask_seen(const dparams &P, int i, const dseq &s) {
  int lo, hi;
  key_range(diag(i, s.nq, s.nk), s.nk, P.wl, P.wr, &lo, &hi);
  return lo < hi;
}

/* The units of a kernel's scores and row maxima. f16/bf16 (the tensor-core
 * kernel) work in log2 units, as the tensor-core family: the scale folds
 * into one multiply. f32 works in natural units, as the general family: a
 * large logit converted to log2 units is rounded once more, and exp(s -
 * lse) loses those bits (the big_logits golden case). to_log2 takes a
 * difference of scores to ex2's units, to_nat a max to natural units. */
template <typename T>
struct units {
  static constexpr float to_log2 = 1.f, to_nat = kLn2;
};
template <>
struct units<float> {
  static constexpr float to_log2 = kLog2e, to_nat = 1.f;
};

/* A row's last step, from its max m (in T's kernel's units) and sum l over
 * all its keys: the sink folded in (common.cuh), whether it saw a key, its
 * natural lse as (m, l) for lse_store, and the factor of its accumulator. */
struct row_end {
  float m, l, mul;
  bool seen;
};
template <typename T>
__device__ __forceinline__ row_end finish_row(const dparams &P, int h, bool mask, float m,
                                              float l) {
  row_end e;
  e.m = m * units<T>::to_nat;
  e.l = l;
  float a = 1.f;
  if (P.sinks) {
    a = sink_fold(__ldg(P.sinks + h * P.sinks_sh), &e.m, &e.l);
    e.seen = true; /* the sink is always seen: no key gives o = 0, lse = sink */
  } else {
    e.seen = row_seen(mask, P.has_bias != 0, e.m, e.l);
  }
  /* seen with l = 0 (every score -inf without a bias: infinite inputs)
   * gives 0 * inf = NaN, as lse_store's NaN. */
  e.mul = e.seen ? a / e.l : 0.f;
  return e;
}

/* Query row i of head h, sequence b: its o row and its lse. */
template <typename T>
__device__ __forceinline__ T *o_row(const dparams &P, int b, const dseq &s, int i, int h) {
  return (T *)P.o.p + (long long)b * P.o.sb + (s.q0 + i) * P.o.ss + (long long)h * P.o.sh;
}
__device__ __forceinline__ float *lse_row(const dparams &P, int b, const dseq &s, int i, int h) {
  return (float *)P.lse.p + (long long)b * P.lse.sb + (s.q0 + i) * P.lse.ss +
         (long long)h * P.lse.sh;
}

/* Row stride of the warps' O in shared memory (floats): 4 past D, so that
 * the 8 rows a quad-strided store touches fall in distinct banks. */
template <int D>
__host__ __device__ constexpr int acc_ld() {
  return D + 4;
}

/* The block's last step. The NW warps' states are in shared memory: O as
 * [NW][kRows][acc_ld<D>()] floats (relative to each warp's m), m (log2)
 * and l as [NW][kRows]. Row by row they merge (FlashAttention's rescaling:
 * a warp with m = -inf weighs 0, and 0 * NaN keeps a NaN it carries);
 * then an unsplit block finishes the row into o and lse, a split block
 * writes (m, l, O) for combine_kernel. The block's threads take the rows'
 * columns four at a time (d is a multiple of 4). */
template <typename T, int D, int NW>
__device__ __forceinline__ void block_end(const dparams &P, const float *sAcc, const float *sM,
                                          const float *sL, int b, const dseq &sq, int hk, int r0,
                                          int rn, int split) {
  constexpr int C4 = D / 4, ALD = acc_ld<D>();
  for (int it = threadIdx.x; it < rn * C4; it += NW * 32) {
    const int row = it / C4, c = (it % C4) * 4;
    if (c >= P.d) continue;
    float M = -INFINITY;
#pragma unroll
    for (int w = 0; w < NW; ++w)
      M = fmaxf(M, sM[w * kRows + row]);
    float L = 0.f;
    float4 O = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int w = 0; w < NW; ++w) {
      const float mw = sM[w * kRows + row];
      const float f = mw == -INFINITY ? 0.f : ex2((mw - M) * units<T>::to_log2);
      const float4 a = *(const float4 *)(sAcc + (w * kRows + row) * ALD + c);
      L += f * sL[w * kRows + row];
      O.x += f * a.x;
      O.y += f * a.y;
      O.z += f * a.z;
      O.w += f * a.w;
    }
    const int rr = r0 + row, i = rr / P.group, h = hk * P.group + rr % P.group;
    if (P.splits > 1) {
      const long long at = split * P.rows + (sq.row0 + i) * P.hq + h;
      *(float4 *)(P.ws_acc + at * P.d + c) = O;
      if (c == 0) P.ws_ml[at] = make_float2(M, L);
      continue;
    }
    const row_end e = finish_row<T>(P, h, mask_seen(P, i, sq), M, L);
    T *orow = o_row<T>(P, b, sq, i, h) + c * P.o.sd;
    orow[0] = from_float<T>(O.x * e.mul);
    orow[P.o.sd] = from_float<T>(O.y * e.mul);
    orow[2 * P.o.sd] = from_float<T>(O.z * e.mul);
    orow[3 * P.o.sd] = from_float<T>(O.w * e.mul);
    if (c == 0 && P.has_lse) lse_store(lse_row(P, b, sq, i, h), P.lse.sd, e.seen, e.m, e.l);
  }
}

/* ---------------------------------------------------------------------- */
/* Tiles in shared memory, as 16-byte chunks by cp.async (the plan gives    */
/* this family rows of 16-byte chunks: d a multiple of 16 / sizeof(T))      */
/* ---------------------------------------------------------------------- */

/* The block's kRows query rows into sQ ([kRows][LD]) by its NT threads:
 * padding rows and the columns past d are zero-filled. One commit group, the
 * caller's to commit and wait for. */
template <typename T, int D, int LD, int NT>
__device__ __forceinline__ void load_q(T *sQ, const dparams &P, int b, const dseq &sq, int hk,
                                       int r0, int rn) {
  constexpr int E = 16 / sizeof(T), CH = D / E;
  for (int c = threadIdx.x; c < kRows * CH; c += NT) {
    const int r = c / CH, col = (c % CH) * E;
    const bool in = r < rn && col < P.d;
    const T *src = (const T *)P.q.p;
    if (in) {
      const int rr = r0 + r, i = rr / P.group, h = hk * P.group + rr % P.group;
      src += (long long)b * P.q.sb + (sq.q0 + i) * P.q.ss + (long long)h * P.q.sh + col;
    }
    attn_mma::cp_async16(sQ + r * LD + col, src, in);
  }
}

/* Where a warp's tiles of KV head hk of sequence b come from: for a
 * contiguous cache, key row 0 of the sequence; for a paged one, the head's
 * offset within a page. */
template <typename T, bool PAGED>
struct kv_src {
  const T *k, *v;
  __device__ __forceinline__ kv_src(const dparams &P, int b, const dseq &sq, int hk) {
    k = (const T *)P.k.p + (long long)hk * P.k.sh;
    v = (const T *)P.v.p + (long long)hk * P.v.sh;
    if (!PAGED) {
      k += key_row<false>(P, P.k, b, sq, 0);
      v += key_row<false>(P, P.v, b, sq, 0);
    }
  }
};

/* Keys j0 .. j0 + kTile - 1 (j0 a multiple of kTile) into sk and sv
 * ([kTile][LD]) by the warp's lanes, side by side along a row (a row's d
 * elements in one request). Keys outside [jlo, jhi) and the columns past d
 * are zero-filled without a read, so no row past the used ones is touched
 * and K's padding never meets Q's in a NaN. The tile overlaps [jlo, jhi),
 * so j0 and jlo are keys of the sequence: an address computed for them is
 * one the block table has. */
template <typename T, int D, int LD, bool PAGED>
__device__ __forceinline__ void load_kv(T *sk, T *sv, const dparams &P, const kv_src<T, PAGED> &src,
                                        int b, const dseq &sq, int j0, int jlo, int jhi) {
  constexpr int E = 16 / sizeof(T), CH = D / E;
  static_assert(kTile * CH % 32 == 0, "a tile is whole rounds of the warp");
  const int lane = threadIdx.x % 32;
  /* Pages of whole tiles (a multiple of kTile rows): the tile lies in one
   * page, whose rows are ss apart, and one look-up serves it. */
  const bool one_page = PAGED && P.page_size % kTile == 0;
  long long k0 = 0, v0 = 0;
  if (one_page) {
    k0 = key_row<PAGED>(P, P.k, b, sq, j0);
    v0 = key_row<PAGED>(P, P.v, b, sq, j0);
  }
#pragma unroll
  for (int e = 0; e < kTile * CH / 32; ++e) {
    const int idx = lane + 32 * e, r = idx / CH, col = (idx % CH) * E;
    const int j = j0 + r;
    const bool in = j >= jlo && j < jhi && col < P.d;
    const int jj = in ? j : jlo, cc = in ? col : 0;
    long long ko, vo;
    if (!PAGED) {
      ko = (long long)jj * P.k.ss;
      vo = (long long)jj * P.v.ss;
    } else if (one_page) {
      ko = k0 + (long long)r * P.k.ss;
      vo = v0 + (long long)r * P.v.ss;
    } else {
      ko = key_row<PAGED>(P, P.k, b, sq, jj);
      vo = key_row<PAGED>(P, P.v, b, sq, jj);
    }
    attn_mma::cp_async16(sk + r * LD + col, src.k + ko + cc, in);
    attn_mma::cp_async16(sv + r * LD + col, src.v + vo + cc, in);
  }
}

/* The split of the block's keys [jlo, jhi) (those its rows see) that split
 * s of n takes, as whole tiles [*tb, *te) of kTile keys: the same count to
 * every split but the last ones, which may have fewer or none. */
__device__ __forceinline__ void split_tiles(int jlo, int jhi, int s, int n, int *tb, int *te) {
  *tb = *te = 0;
  if (jlo >= jhi) return;
  const int t0 = jlo / kTile, t1 = (jhi + kTile - 1) / kTile;
  const int per = (t1 - t0 + n - 1) / n;
  *tb = min(t1, t0 + s * per);
  *te = min(t1, *tb + per);
}

/* What a block works on: its KV head, sequence and rows (rows r0 .. r0 + rn
 * - 1 of the sequence's group * nq, query rows i_first .. i_last), the keys
 * its rows see [jlo, jhi), its first and last rows' key ranges (a tile is
 * visible to every row when it lies in lo_l and hi_f: both grow with the
 * row), and its split's tiles [tb, te). */
struct dblock {
  int hk, b, split, r0, rn, i_first, i_last;
  dseq sq;
  int jlo, jhi, lo_f, hi_f, lo_l, hi_l, tb, te;
};

/* The block's work; false when its row block lies past its sequence's rows. */
__device__ __forceinline__ bool block_of(const dparams &P, dblock *k) {
  int rb;
  block_coords(P, &k->hk, &rb, &k->split);
  k->b = blockIdx.y;
  k->sq = seq_of(P, k->b);
  const int nq = k->sq.nq, nk = k->sq.nk;
  k->r0 = rb * kRows;
  if (k->r0 >= P.group * nq) return false;
  k->rn = min(kRows, P.group * nq - k->r0);
  k->i_first = k->r0 / P.group;
  k->i_last = (k->r0 + k->rn - 1) / P.group;
  key_block_range(k->i_first, k->i_last + 1, nq, nk, P.wl, P.wr, &k->jlo, &k->jhi);
  key_range(diag(k->i_first, nq, nk), nk, P.wl, P.wr, &k->lo_f, &k->hi_f);
  key_range(diag(k->i_last, nq, nk), nk, P.wl, P.wr, &k->lo_l, &k->hi_l);
  split_tiles(k->jlo, k->jhi, k->split, P.splits, &k->tb, &k->te);
  return true;
}

}  // namespace attn_decode

#endif /* ATTN_CUDA_DECODE_CUH */
