/*
 * The general CUDA kernels: the FlashAttention-2 forward and backward passes on
 * the CUDA cores, in true fp32 arithmetic (FFMA), for every problem the API
 * accepts: any head dim 1..256, f32/f16/bf16 storage, any strides, every mask,
 * softcap, ALiBi, GQA and varlen. They are the f32 path and the last rows of
 * the plan (plan.c), for everything the tensor-core rows do not cover.
 *
 * The steps, with the CPU backend's names:
 *   forward   a block per (query block of Br rows, query head, sequence): Q_i in
 *             shared memory, K_j and V_j streamed through two shared buffers;
 *             S = Q_i K_j^T * scale, masks, softcap and ALiBi, then the online
 *             softmax in registers (m_i, l_i), O_i = diag(alpha) O_i + P V_j;
 *             at the end O_i /= l_i and lse_i = m_i + log(l_i).
 *   backward  D_i = rowsum(dO_i * O_i) (rowdot_kernel); a block per (key block,
 *             kv head, sequence) keeps dK_j, dV_j in registers while it loops
 *             over the query heads of its group and the query blocks that see
 *             it: P = exp(S - lse), dP = dO V^T, dS = P * (dP - D),
 *             dV += P^T dO, dK += dS^T Q, and dQ += dS K either by fp32 atomics
 *             into a workspace (dkdv_kernel with ATOMIC_DQ) or, in deterministic
 *             mode, by a second kernel per query block looping over key blocks
 *             (dq_kernel) in a fixed order.
 *
 * Register blocking: 256 threads as a 16 x 16 grid (ty, tx). A thread computes
 * MR x MC scores, rows ty + 16*ii and keys tx + 16*jj: the rows are shared by
 * the 16 lanes of a half warp (shared-memory broadcast) and the 16 keys of a
 * half warp are consecutive rows of the K tile, whose stride (DP + 4 floats)
 * puts their 16-byte loads in distinct bank groups. Output columns are owned
 * as float2 pairs, tx*2 + 32*g. Scores stay in natural units and exp(x) is
 * ex2(x * log2(e)) of a difference that is already small (see score()).
 */
#ifndef ATTN_CUDA_GENERAL_CUH
#define ATTN_CUDA_GENERAL_CUH

#include "attn_cuda.h"
#include "common.cuh"
#include "copy.cuh"
#include "order.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include <type_traits>

namespace attn_general {

constexpr int kThreads = 256;
constexpr float kLog2e = 1.4426950408889634f;

/* One operand, a tensor view (attn_cuda.h: p already includes the byte
 * offset). vec = 1 when every row starts 16-byte aligned (f32) or 8-byte
 * aligned (f16/bf16), the d-stride is 1 and d is a multiple of 4, so a row
 * loads as groups of 4 elements. */
struct gtensor : attn__cuda_view {
  int vec;
};

struct gparams {
  gtensor q, k, v, o, lse, dout, dq, dk, dv;
  int batch, hq, hkv, group, d;
  long long nq, nk; /* bshd lengths; varlen: the longest ones */
  const int32_t *cu_q, *cu_k;
  float scale, softcap, inv_softcap;
  long long wl, wr; /* -1 = no bound; causal already folded into wr */
  const float *alibi;
  float *ws_D;  /* [total_q][hq] */
  float *ws_dq; /* [total_q][hq][d], fp32 atomics target */
  long long total_q;
  int order; /* forward block order: attn_order_group's G, 0 = natural */
  /* The inference path's terms, read only by the kernels built with them
   * (template flag X); NULL pointers where the problem has none. The cache
   * and the score terms address their own strides: seqused (sb), block
   * table bt (sb, ss), bias and dbias (sb, sh, ss, sd; 0 = broadcast),
   * sinks and dsinks (sh). */
  gtensor seqused, bt, bias, dbias, sinks, dsinks;
  long long nnew;             /* rows appended per sequence (seqused only) */
  long long page_size, pages; /* paged k and v: rows a page, pages */
  int bias_dt;                /* attn_dtype of bias */
  int dbias_atomic;           /* dbias broadcasts: dkdv adds into it */
};

/* Sequence b: lengths, first rows in the tensors, first row in workspaces. */
struct seqinfo {
  long long nq, nk, row0q, row0k, wrow0;
};

__device__ __forceinline__ seqinfo get_seq(const gparams &P, int b) {
  seqinfo s;
  if (P.cu_q) {
    s.row0q = P.cu_q[b];
    s.nq = (long long)P.cu_q[b + 1] - s.row0q;
    s.row0k = P.cu_k[b];
    s.nk = (long long)P.cu_k[b + 1] - s.row0k;
    s.wrow0 = s.row0q;
  } else {
    s.row0q = 0;
    s.row0k = 0;
    s.nq = P.nq;
    s.nk = P.nk;
    s.wrow0 = (long long)b * P.nq;
  }
  return s;
}

/* The same for the kernels built for the inference path (X): a paged cache
 * has no cu_seqlens_k (its keys start at row 0 of the sequence's pages), and
 * with seqused_k a sequence attends to its used rows plus the appended ones
 * (common.cuh's seq_used clamps what the device holds). */
__device__ __forceinline__ seqinfo get_seq_x(const gparams &P, int b) {
  seqinfo s;
  s.row0q = P.cu_q ? P.cu_q[b] : 0;
  s.nq = P.cu_q ? (long long)P.cu_q[b + 1] - s.row0q : P.nq;
  s.wrow0 = P.cu_q ? s.row0q : (long long)b * P.nq;
  s.row0k = P.cu_k ? P.cu_k[b] : 0;
  const long long cap = P.cu_k ? (long long)P.cu_k[b + 1] - s.row0k : P.nk;
  s.nk = P.seqused.p
             ? seq_used((const int *)P.seqused.p, P.seqused.sb, (long long)b, cap, P.nnew) + P.nnew
             : cap;
  return s;
}

template <bool X>
__device__ __forceinline__ seqinfo get_seq_of(const gparams &P, int b) {
  return X ? get_seq_x(P, b) : get_seq(P, b);
}

/* The element offset of head h's first row in t for sequence b, whose first
 * row in t is row0. */
__device__ __forceinline__ long long head_base(const gtensor &t, int b, long long row0, int h) {
  return (long long)b * t.sb + row0 * t.ss + h * t.sh;
}

/* The element offsets of key rows of sequence b, kv head hk, in k or v (t):
 * row j at base + j * ss, or through the block table when paged. */
struct key_rows {
  const gparams &P;
  const gtensor &t;
  long long base; /* head_base, or the head's offset alone when paged */
  int b;
  __device__ __forceinline__ long long operator()(long long j) const {
    if (!P.bt.p) return base + j * t.ss;
    return paged_row((const int *)P.bt.p, P.bt.sb, P.bt.ss, (long long)b, j, P.page_size, P.pages,
                     t.sb, t.ss) +
           base;
  }
};

__device__ __forceinline__ key_rows key_rows_of(const gparams &P, const gtensor &t,
                                                const seqinfo &S, int b, int hk) {
  return key_rows{P, t, P.bt.p ? hk * t.sh : head_base(t, b, S.row0k, hk), b};
}

/* The bias (or dbias) element of row i, key j (sequence-local) of head h,
 * sequence b. */
__device__ __forceinline__ long long term_at(const gtensor &t, int b, int h, long long i,
                                             long long j) {
  return (long long)b * t.sb + (long long)h * t.sh + i * t.ss + j * t.sd;
}

/* Query row i's lse (hi, when the tensor holds (hi, lo) pairs). */
__device__ __forceinline__ float *lse_row(const gparams &P, const seqinfo &S, int b, int h,
                                          long long i) {
  return (float *)P.lse.p + (long long)b * P.lse.sb + (S.row0q + i) * P.lse.ss + h * P.lse.sh;
}

/* The visible keys [lo, hi) of query row i of a sequence (common.cuh). */
__device__ __forceinline__ void row_keys(const gparams &P, long long i, long long nq, long long nk,
                                         long long *lo, long long *hi) {
  key_range(diag(i, nq, nk), nk, P.wl, P.wr, lo, hi);
}

/* ---------------------------------------------------------------------- */
/* Element access                                                           */
/* ---------------------------------------------------------------------- */

template <typename T>
struct elem;
template <>
struct elem<float> {
  static __device__ __forceinline__ float ld(const char *p, long long i) {
    return ((const float *)p)[i];
  }
  static __device__ __forceinline__ void st(char *p, long long i, float x) {
    ((float *)p)[i] = x;
  }
};
template <>
struct elem<__half> {
  static __device__ __forceinline__ float ld(const char *p, long long i) {
    return __half2float(((const __half *)p)[i]);
  }
  static __device__ __forceinline__ void st(char *p, long long i, float x) {
    ((__half *)p)[i] = __float2half_rn(x);
  }
};
template <>
struct elem<__nv_bfloat16> {
  static __device__ __forceinline__ float ld(const char *p, long long i) {
    return __bfloat162float(((const __nv_bfloat16 *)p)[i]);
  }
  static __device__ __forceinline__ void st(char *p, long long i, float x) {
    ((__nv_bfloat16 *)p)[i] = __float2bfloat16_rn(x);
  }
};

/* Four consecutive 16-bit elements, 8-byte aligned, to floats. */
__device__ __forceinline__ float4 cvt4(uint2 u, const __half *) {
  __half2 a = *(__half2 *)&u.x, b = *(__half2 *)&u.y;
  float2 fa = __half22float2(a), fb = __half22float2(b);
  return make_float4(fa.x, fa.y, fb.x, fb.y);
}
__device__ __forceinline__ float4 cvt4(uint2 u, const __nv_bfloat16 *) {
  return make_float4(__uint_as_float(u.x << 16), __uint_as_float(u.x & 0xffff0000u),
                     __uint_as_float(u.y << 16), __uint_as_float(u.y & 0xffff0000u));
}

using attn_copy::cp_async16;
using attn_copy::cp_async_commit;
using attn_copy::cp_async_wait;

/* Loads rows r0 .. r0+ROWS-1 (of a sequence with nrows rows) of one head,
 * row r starting at element row_at(r) of t, into a [ROWS][ld] float tile; rows past nrows and
 * columns past d are zero, so that padded keys and columns add nothing (and never carry a NaN). f32
 * rows go by cp.async, which the caller commits and waits for; f16/bf16 rows are converted on the
 * way and are in place after the next barrier. */
template <typename T, int DP, int ROWS, typename RowAt>
__device__ __forceinline__ void load_rows(float *sm, int ld, const gtensor &t, RowAt row_at,
                                          long long r0, long long nrows, int d) {
  const int tid = threadIdx.x;
  if (t.vec) {
    constexpr int C4 = DP / 4;
    for (int idx = tid; idx < ROWS * C4; idx += kThreads) {
      int r = idx / C4, c = (idx - r * C4) * 4;
      float *dst = sm + r * ld + c;
      if (r0 + r < nrows && c < d) {
        const T *src = (const T *)t.p + row_at(r0 + r) + c;
        if constexpr (sizeof(T) == 4) {
          cp_async16(dst, src, true);
        } else {
          *(float4 *)dst = cvt4(*(const uint2 *)src, (const T *)nullptr);
        }
      } else {
        *(float4 *)dst = make_float4(0.f, 0.f, 0.f, 0.f);
      }
    }
  } else {
    for (int idx = tid; idx < ROWS * DP; idx += kThreads) {
      int r = idx / DP, c = idx - r * DP;
      float x = 0.f;
      if (r0 + r < nrows && c < d) x = elem<T>::ld(t.p, row_at(r0 + r) + c * t.sd);
      sm[r * ld + c] = x;
    }
  }
}

/* The same for rows at base + r * ss. */
template <typename T, int DP, int ROWS>
__device__ __forceinline__ void load_tile(float *sm, int ld, const gtensor &t, long long base,
                                          long long r0, long long nrows, int d) {
  load_rows<T, DP, ROWS>(
      sm, ld, t, [&](long long r) { return base + r * t.ss; }, r0, nrows, d);
}

/* scale * q.k rounded to float, as score() (common.cuh) rounds it: the
 * score without softcap and ALiBi. */
__device__ __forceinline__ float scaled(const gparams &P, float acc) {
  return __fmul_rn(acc, P.scale);
}

/* The score in natural units (common.cuh's score): converting s itself to
 * log2 units rounds a large logit once more, and the backward pass's
 * exp(s - lse) loses that many bits (the big_logits golden case). *t feeds
 * score_grad. */
__device__ __forceinline__ float score_of(const gparams &P, float acc, float slope, long long dist,
                                          float *t) {
  return score(acc, P.scale, P.softcap, P.inv_softcap, slope, dist, t);
}

/* acc + a . b, in the order x, y, z, w. */
__device__ __forceinline__ float dot4(float acc, float4 a, float4 b) {
  acc = fmaf(a.x, b.x, acc);
  acc = fmaf(a.y, b.y, acc);
  acc = fmaf(a.z, b.z, acc);
  return fmaf(a.w, b.w, acc);
}

/* ---------------------------------------------------------------------- */
/* Register-tiled products of shared-memory tiles                           */
/* ---------------------------------------------------------------------- */

/* s[ii][jj] = A row (ty + RS*ii) . B row (tx + 16*jj) over DP columns of
 * two [.][LD] tiles: S = Q K^T. */
template <int MR, int MC, int DP, int RS, int LD>
__device__ __forceinline__ void rows_dot_rows(float (&s)[MR][MC], const float *A, const float *B,
                                              int tx, int ty) {
#pragma unroll
  for (int ii = 0; ii < MR; ii++)
#pragma unroll
    for (int jj = 0; jj < MC; jj++)
      s[ii][jj] = 0.f;
#pragma unroll 2
  for (int c = 0; c < DP; c += 4) {
    float4 av[MR], bv[MC];
#pragma unroll
    for (int ii = 0; ii < MR; ii++)
      av[ii] = *(const float4 *)&A[(ty + RS * ii) * LD + c];
#pragma unroll
    for (int jj = 0; jj < MC; jj++)
      bv[jj] = *(const float4 *)&B[(tx + 16 * jj) * LD + c];
#pragma unroll
    for (int ii = 0; ii < MR; ii++)
#pragma unroll
      for (int jj = 0; jj < MC; jj++)
        s[ii][jj] = dot4(s[ii][jj], av[ii], bv[jj]);
  }
}

/* acc[ii][g] += sum over j < N of A[ty + RS*ii][j] B[j][tx*2 + 32*g, +1]:
 * rows of an [.][LDA] tile times float2 column pairs of an [N][LDB] tile
 * (O += P V, dQ += dS K). */
template <int MR, int NG, int N, int RS, int LDA, int LDB>
__device__ __forceinline__ void rows_times_tile(float2 (&acc)[MR][NG], const float *A,
                                                const float *B, int tx, int ty) {
#pragma unroll 2
  for (int j = 0; j < N; j += 4) {
    float4 av[MR];
#pragma unroll
    for (int ii = 0; ii < MR; ii++)
      av[ii] = *(const float4 *)&A[(ty + RS * ii) * LDA + j];
#pragma unroll
    for (int q = 0; q < 4; q++) {
      float2 bv[NG];
#pragma unroll
      for (int g = 0; g < NG; g++)
        bv[g] = *(const float2 *)&B[(j + q) * LDB + tx * 2 + 32 * g];
#pragma unroll
      for (int ii = 0; ii < MR; ii++) {
        const float x = q == 0 ? av[ii].x : q == 1 ? av[ii].y : q == 2 ? av[ii].z : av[ii].w;
#pragma unroll
        for (int g = 0; g < NG; g++) {
          acc[ii][g].x = fmaf(x, bv[g].x, acc[ii][g].x);
          acc[ii][g].y = fmaf(x, bv[g].y, acc[ii][g].y);
        }
      }
    }
  }
}

/* acc = 0. */
template <int R, int NG>
__device__ __forceinline__ void zero_acc(float2 (&acc)[R][NG]) {
#pragma unroll
  for (int r = 0; r < R; r++)
#pragma unroll
    for (int g = 0; g < NG; g++)
      acc[r][g] = make_float2(0.f, 0.f);
}

/* The forward's end: O = acc / l and lse = m + log(l) for the thread's rows
 * ty + RS*ii of the query block at i0 (l_i: the thread's share of the row
 * sum, added over the 16 lanes of its half warp); a row with no key gets
 * o = 0 and lse = -inf. Built for the inference path (X), a bias can hide a
 * row's every key (row_seen) and a sink joins the sum, once, here. */
template <typename T, int MR, int NG, int RS, bool X = false>
__device__ __forceinline__ void store_rows(const gparams &P, const seqinfo &S, int b, int h,
                                           long long i0, const float2 (&o)[MR][NG],
                                           const float (&m_i)[MR], const float (&l_i)[MR], int tx,
                                           int ty) {
  const long long obase = head_base(P.o, b, S.row0q, h);
  const float sink = X && P.sinks.p ? ((const float *)P.sinks.p)[h * P.sinks.sh] : 0.f;
#pragma unroll
  for (int ii = 0; ii < MR; ii++) {
    float l = l_i[ii];
#pragma unroll
    for (int off = 1; off < 16; off <<= 1)
      l += __shfl_xor_sync(0xffffffffu, l, off);
    const long long i = i0 + ty + RS * ii;
    if (i >= S.nq) continue;
    /* The mask says whether the row saw a key, not l: a NaN or inf among its
     * scores leaves l NaN (or 0 when all are -inf), and the row must then
     * come out NaN rather than as a row that saw nothing. */
    long long klo, khi;
    row_keys(P, i, S.nq, S.nk, &klo, &khi);
    bool seen = klo < khi;
    float m = m_i[ii], inv;
    if constexpr (X) {
      seen = row_seen(seen, P.bias.p != nullptr, m, l);
      float a = 1.f;
      if (P.sinks.p) {
        a = sink_fold(sink, &m, &l); /* a row with no key: m = sink, l = 1, a = 0 */
        seen = true;
      }
      inv = seen ? a / l : 0.f;
    } else {
      inv = seen ? 1.f / l : 0.f;
    }
#pragma unroll
    for (int g = 0; g < NG; g++) {
      const int c = tx * 2 + 32 * g;
      char *op = P.o.p;
      if (c < P.d) elem<T>::st(op, obase + i * P.o.ss + c * P.o.sd, o[ii][g].x * inv);
      if (c + 1 < P.d) elem<T>::st(op, obase + i * P.o.ss + (c + 1) * P.o.sd, o[ii][g].y * inv);
    }
    if (P.lse.p && tx == 0) lse_store(lse_row(P, S, b, h, i), P.lse.sd, seen, m, l);
  }
}

/* ---------------------------------------------------------------------- */
/* Forward                                                                  */
/* ---------------------------------------------------------------------- */

/* A forward block: query rows [i0, i1) of head h (kv head hk) of sequence
 * b, and the key tiles [t_begin, t_end) that its rows see; every row sees
 * the keys [lo_last, hi_first) (a tile inside them needs no mask). */
struct fwd_block {
  int h, b, hk;
  seqinfo S;
  long long i0, i1, t_begin, t_end, lo_last, hi_first;
};

/* This block's rows for Br-row blocks, the longest blocks (the last rows
 * under causal) first; false when the block is past its sequence's end. */
template <int Br, bool X = false>
__device__ __forceinline__ bool fwd_block_at(const gparams &P, fwd_block *B) {
  int qb;
  attn_block_coords(P.order, &qb, &B->h, &B->b);
  const seqinfo S = get_seq_of<X>(P, B->b);
  const long long i0 = (long long)qb * Br;
  if (i0 >= S.nq) return false;
  const long long i1 = min(S.nq, i0 + Br);
  B->S = S;
  B->i0 = i0;
  B->i1 = i1;
  B->hk = B->h / P.group;
  return true;
}

/* The key tiles of Bc keys that the rows of block B see (fwd_block). */
template <int Bc>
__device__ __forceinline__ void fwd_tiles(const gparams &P, fwd_block *B) {
  const seqinfo S = B->S;
  const long long i0 = B->i0, i1 = B->i1;
  long long klo, khi, tmp;
  row_keys(P, i0, S.nq, S.nk, &klo, &tmp);
  row_keys(P, i1 - 1, S.nq, S.nk, &tmp, &khi);
  B->lo_last = tmp;
  row_keys(P, i0, S.nq, S.nk, &tmp, &B->hi_first);
  B->t_begin = klo / Bc;
  B->t_end = khi > klo ? (khi + Bc - 1) / Bc : B->t_begin;
}

/* Query row i in a key tile: its diagonal (for ALiBi) and its visible keys
 * [lo, hi), which a tile that every row of the block sees whole (full) does
 * not need; a row past the sequence sees nothing (its results are never
 * stored). */
struct tile_row {
  long long dg, lo, hi;
};

__device__ __forceinline__ tile_row tile_row_at(const gparams &P, const seqinfo &S, long long i,
                                                bool full) {
  tile_row R;
  R.dg = diag(i, S.nq, S.nk);
  R.lo = 0;
  R.hi = 0;
  if (!full && i < S.nq) row_keys(P, i, S.nq, S.nk, &R.lo, &R.hi);
  return R;
}

/* The online softmax's start for MR rows: m = -inf, l = 0, O = 0. */
template <int MR, int NG>
__device__ __forceinline__ void init_rows(float (&m_i)[MR], float (&l_i)[MR], float2 (&o)[MR][NG]) {
#pragma unroll
  for (int ii = 0; ii < MR; ii++) {
    m_i[ii] = -INFINITY;
    l_i[ii] = 0.f;
#pragma unroll
    for (int g = 0; g < NG; g++)
      o[ii][g] = make_float2(0.f, 0.f);
  }
}

/* The maximum over the 16 lanes of a half warp: a row's keys. */
__device__ __forceinline__ float half_warp_max(float x) {
#pragma unroll
  for (int off = 1; off < 16; off <<= 1)
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, off));
  return x;
}

/* What a row's scores are exponentiated against: a row that has seen no key
 * yet keeps m = -inf and uses 0, so that -inf - -inf never makes a NaN. */
__device__ __forceinline__ float exp_base(float m_new) {
  return m_new == -INFINITY ? 0.f : m_new;
}

/* A row's state after a tile: l = l * alpha + the tile's sum of p, m = m_new,
 * O *= alpha. */
template <int NG>
__device__ __forceinline__ void rescale_row(float &m, float &l, float2 (&o)[NG], float m_new,
                                            float alpha, float sum) {
  l = l * alpha + sum;
  m = m_new;
#pragma unroll
  for (int g = 0; g < NG; g++) {
    o[g].x *= alpha;
    o[g].y *= alpha;
  }
}

template <int DP, int MR, int MC>
struct fwd_cfg {
  static constexpr int Br = 16 * MR, Bc = 16 * MC;
  static constexpr int LD = DP + 4;   /* +4 floats: conflict-free float4 rows */
  static constexpr int LDP = Bc + 16; /* +16: the two half warps hit other banks */
  static constexpr size_t smem =
      sizeof(float) * ((size_t)Br * LD + 2 * (size_t)Bc * LD + (size_t)Br * LDP);
  /* Two blocks a multiprocessor when two fit in the 227 KB of an H100/H200:
   * the register cap (128) then follows. Only for f32 (ptxas -v: the 16-bit
   * loads' conversions spill under that cap). */
  static constexpr int minb = 2 * smem + 2048 <= 232448 && MR * MC <= 16 && DP <= 64 ? 2 : 1;
};

/* X: built for the inference path (a KV cache with used lengths or pages,
 * a bias, sinks), which the plain kernel keeps no registers for; one block a
 * multiprocessor (ptxas -v: under the two-block cap of 128 registers, the
 * f32 64 x 64 tiles spill). */
template <typename T, int DP, int MR, int MC, bool X>
__global__ void __launch_bounds__(kThreads, (sizeof(T) == 4 && !X ? fwd_cfg<DP, MR, MC>::minb : 1))
    fwd_kernel(const gparams P) {
  using C = fwd_cfg<DP, MR, MC>;
  constexpr int Br = C::Br, Bc = C::Bc, LD = C::LD, LDP = C::LDP, NG = DP / 32;
  extern __shared__ float4 smem4[];
  float *Qs = (float *)smem4;
  float *Ks = Qs + Br * LD;
  float *Vs = Ks + Bc * LD;
  float *Ps = Vs + Bc * LD;

  fwd_block B;
  if (!fwd_block_at<Br, X>(P, &B)) return;
  const seqinfo &S = B.S;
  const long long i0 = B.i0;
  const int tid = threadIdx.x, tx = tid & 15, ty = tid >> 4;
  const long long qbase = head_base(P.q, B.b, S.row0q, B.h);
  const long long kbase = head_base(P.k, B.b, S.row0k, B.hk);
  const long long vbase = head_base(P.v, B.b, S.row0k, B.hk);
  const key_rows krows = key_rows_of(P, P.k, S, B.b, B.hk);
  const key_rows vrows = key_rows_of(P, P.v, S, B.b, B.hk);
  /* K and V tiles: the plain kernel's rows, or the cache's. */
  auto load_k = [&](long long k0) {
    if constexpr (X)
      load_rows<T, DP, Bc>(Ks, LD, P.k, krows, k0, S.nk, P.d);
    else
      load_tile<T, DP, Bc>(Ks, LD, P.k, kbase, k0, S.nk, P.d);
  };
  auto load_v = [&](long long k0) {
    if constexpr (X)
      load_rows<T, DP, Bc>(Vs, LD, P.v, vrows, k0, S.nk, P.d);
    else
      load_tile<T, DP, Bc>(Vs, LD, P.v, vbase, k0, S.nk, P.d);
  };
  fwd_tiles<Bc>(P, &B);
  const long long t_begin = B.t_begin, t_end = B.t_end;
  const float slope = P.alibi ? P.alibi[B.h] : 0.f;
  const bool plain = P.softcap == 0.f && P.alibi == nullptr;

  float m_i[MR], l_i[MR]; /* l_i: this thread's share of the row sum */
  float2 o[MR][NG];
  init_rows(m_i, l_i, o);

  if (t_end > t_begin) {
    /* Group order: Q, K_t, V_t; then per tile K_{t+1}, V_{t+1}. */
    load_tile<T, DP, Br>(Qs, LD, P.q, qbase, i0, S.nq, P.d);
    cp_async_commit();
    load_k(t_begin * Bc);
    cp_async_commit();
    load_v(t_begin * Bc);
    cp_async_commit();
  }

  for (long long t = t_begin; t < t_end; t++) {
    const long long k0 = t * Bc;
    cp_async_wait<1>(); /* Q and K_t */
    __syncthreads();

    /* S = Q K^T */
    float s[MR][MC];
    rows_dot_rows<MR, MC, DP, 16, LD>(s, Qs, Ks, tx, ty);
    __syncthreads(); /* every thread is done with K_t */
    if (t + 1 < t_end) load_k(k0 + Bc);
    cp_async_commit();

    /* Masks and the online softmax, row by row. */
    const bool full = k0 >= B.lo_last && k0 + Bc <= B.hi_first;
#pragma unroll
    for (int ii = 0; ii < MR; ii++) {
      const long long i = i0 + ty + 16 * ii;
      const tile_row R = tile_row_at(P, S, i, full);
      float mx = -INFINITY;
#pragma unroll
      for (int jj = 0; jj < MC; jj++) {
        const long long j = k0 + tx + 16 * jj;
        float x, th;
        if (plain) {
          x = scaled(P, s[ii][jj]);
        } else {
          x = score_of(P, s[ii][jj], slope, R.dg - j, &th);
        }
        if constexpr (X) {
          /* The bias is read only where the key is visible: elsewhere it may
           * lie past the tensor (rows past the sequence, keys past nk). */
          const bool vis = full ? i < S.nq : j >= R.lo && j < R.hi;
          if (vis && P.bias.p) x += load_any(P.bias.p, P.bias_dt, term_at(P.bias, B.b, B.h, i, j));
          if (!vis) x = -INFINITY;
        } else if (!full && (j < R.lo || j >= R.hi)) {
          x = -INFINITY;
        }
        s[ii][jj] = x;
        mx = fmaxf(mx, x);
      }
      mx = half_warp_max(mx);
      const float m_new = fmaxf(m_i[ii], mx);
      const float m_use = exp_base(m_new);
      const float alpha = exp2f((m_i[ii] - m_use) * kLog2e);
      float sum = 0.f;
#pragma unroll
      for (int jj = 0; jj < MC; jj++) {
        float p = exp2f((s[ii][jj] - m_use) * kLog2e);
        sum += p;
        Ps[(ty + 16 * ii) * LDP + tx + 16 * jj] = p;
      }
      rescale_row(m_i[ii], l_i[ii], o[ii], m_new, alpha, sum);
    }
    cp_async_wait<1>(); /* V_t */
    __syncthreads();

    /* O += P V */
    rows_times_tile<MR, NG, Bc, 16, LDP, LD>(o, Ps, Vs, tx, ty);
    __syncthreads(); /* every thread is done with V_t and P */
    if (t + 1 < t_end) load_v(k0 + Bc);
    cp_async_commit();
  }
  cp_async_wait<0>();

  store_rows<T, MR, NG, 16, X>(P, S, B.b, B.h, i0, o, m_i, l_i, tx, ty);
}

/* ---------------------------------------------------------------------- */
/* Backward                                                                 */
/* ---------------------------------------------------------------------- */

/* D_i = rowsum(dO_i * O_i), one warp per (row, head). */
template <typename T>
__global__ void rowdot_kernel(const gparams P) {
  const long long w = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (w >= P.total_q * P.hq) return;
  const long long row = w / P.hq;
  const int h = (int)(w - row * P.hq);
  long long b = 0, r = row;
  if (!P.cu_q) {
    b = row / P.nq;
    r = row - b * P.nq;
  }
  const long long ob = b * P.o.sb + r * P.o.ss + h * P.o.sh;
  const long long db = b * P.dout.sb + r * P.dout.ss + h * P.dout.sh;
  float acc = 0.f;
  for (int c = lane; c < P.d; c += 32)
    acc += elem<T>::ld(P.o.p, ob + c * P.o.sd) * elem<T>::ld(P.dout.p, db + c * P.dout.sd);
#pragma unroll
  for (int off = 16; off > 0; off >>= 1)
    acc += __shfl_xor_sync(0xffffffffu, acc, off);
  if (lane == 0) P.ws_D[w] = acc;
}

/* The fp32 dq workspace to dq's dtype and strides. */
template <typename T>
__global__ void dq_convert_kernel(const gparams P) {
  const long long n = P.total_q * P.hq * P.d;
  for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < n;
       e += (long long)gridDim.x * blockDim.x) {
    const long long rh = e / P.d;
    const int c = (int)(e - rh * P.d);
    const long long row = rh / P.hq;
    const int h = (int)(rh - row * P.hq);
    long long b = 0, r = row;
    if (!P.cu_q) {
      b = row / P.nq;
      r = row - b * P.nq;
    }
    elem<T>::st(P.dq.p, b * P.dq.sb + r * P.dq.ss + h * P.dq.sh + c * P.dq.sd, P.ws_dq[e]);
  }
}

template <int DP, int M>
struct bwd_cfg {
  static constexpr int Br = 16 * M, Bc = 16 * M;
  static constexpr int LD = DP + 4, LDP = Bc + 16;
  /* dkdv: K, V, Q, dO tiles; P, dS; lse (hi, lo) and D of the query block. */
  static constexpr size_t smem_dkdv =
      sizeof(float) * (4 * (size_t)Br * LD + 2 * (size_t)Br * LDP + 3 * (size_t)Br);
  /* dq: Q, dO, K, V tiles; dS; lse (hi, lo) and D. */
  static constexpr size_t smem_dq =
      sizeof(float) * (4 * (size_t)Br * LD + (size_t)Br * LDP + 3 * (size_t)Br);
};

/* A backward kernel's shared memory in bwd_cfg's sizes: the two tiles the
 * block keeps (dkdv: K, V; dq: Q, dO), the two it streams through, P (dkdv
 * only: WITH_P), dS, and the query block's lse (hi, lo) and D. */
template <int DP, int M, bool WITH_P>
struct bwd_smem {
  float *own0, *own1, *in0, *in1, *Ps, *dSs, *lses, *Ds, *los;
  __device__ __forceinline__ explicit bwd_smem(float4 *sm) {
    using C = bwd_cfg<DP, M>;
    constexpr int T = C::Br * C::LD, TP = C::Br * C::LDP;
    own0 = (float *)sm;
    own1 = own0 + T;
    in0 = own1 + T;
    in1 = in0 + T;
    Ps = WITH_P ? in1 + T : nullptr;
    dSs = in1 + T + (WITH_P ? TP : 0);
    lses = dSs + TP;
    Ds = lses + C::Br;
    los = Ds + C::Br;
  }
};

/* No dS hook: the plain kernels' and dq's. */
struct no_ds {
  __device__ __forceinline__ void operator()(int, int, long long, long long, float) const {}
};

/* The shared middle of the backward kernels, for one (query block, key
 * block) pair of head h, sequence b whose tiles are in shared memory:
 * S = Q K^T and dP = dO V^T in registers, then P = exp(S - lse) and
 * dS = P * (dP - D) (times the softcap derivative) into Ps / dSs, row-major
 * [Br][LDP]. Ps may be NULL. Built for the inference path's terms (X), S
 * takes the bias and on_ds(ii, jj, i, j, dS) sees the dS of each visible
 * element before the softcap derivative (what dbias sums). */
template <int DP, int M, bool X = false, typename OnDs = no_ds>
__device__ __forceinline__ void bwd_p_ds(const gparams &P, const seqinfo &S, const float *Qs,
                                         const float *dOs, const float *Ks, const float *Vs,
                                         const float *lses, const float *los, const float *Ds,
                                         float *Ps, float *dSs, long long i0, long long j0,
                                         float slope, bool plain, int b = 0, int h = 0,
                                         OnDs on_ds = OnDs()) {
  using C = bwd_cfg<DP, M>;
  constexpr int Br = C::Br, Bc = C::Bc, LD = C::LD, LDP = C::LDP;
  const int tx = threadIdx.x & 15, ty = threadIdx.x >> 4;
  float s[M][M], dp[M][M];
#pragma unroll
  for (int ii = 0; ii < M; ii++)
#pragma unroll
    for (int jj = 0; jj < M; jj++)
      s[ii][jj] = dp[ii][jj] = 0.f;
#pragma unroll 2
  for (int c = 0; c < DP; c += 4) {
    float4 qv[M], dov[M], kv[M], vv[M];
#pragma unroll
    for (int ii = 0; ii < M; ii++) {
      qv[ii] = *(const float4 *)&Qs[(ty + 16 * ii) * LD + c];
      dov[ii] = *(const float4 *)&dOs[(ty + 16 * ii) * LD + c];
    }
#pragma unroll
    for (int jj = 0; jj < M; jj++) {
      kv[jj] = *(const float4 *)&Ks[(tx + 16 * jj) * LD + c];
      vv[jj] = *(const float4 *)&Vs[(tx + 16 * jj) * LD + c];
    }
#pragma unroll
    for (int ii = 0; ii < M; ii++)
#pragma unroll
      for (int jj = 0; jj < M; jj++) {
        s[ii][jj] = dot4(s[ii][jj], qv[ii], kv[jj]);
        dp[ii][jj] = dot4(dp[ii][jj], dov[ii], vv[jj]);
      }
  }
  (void)Bc;
#pragma unroll
  for (int ii = 0; ii < M; ii++) {
    const int r = ty + 16 * ii;
    const long long i = i0 + r;
    long long lo = 0, hi = 0;
    if (i < S.nq) row_keys(P, i, S.nq, S.nk, &lo, &hi);
    const long long dg = diag(i, S.nq, S.nk);
    const float lse = lses[r], lo_r = los[r], Dr = Ds[r];
#pragma unroll
    for (int jj = 0; jj < M; jj++) {
      const long long j = j0 + tx + 16 * jj;
      /* s - hi, exact near the row maximum, then lse's lo (common.cuh). */
      float x, th = 0.f;
      if constexpr (X) {
        const bool vis = j >= lo && j < hi;
        x = plain ? scaled(P, s[ii][jj]) : score_of(P, s[ii][jj], slope, dg - j, &th);
        if (vis && P.bias.p) x += load_any(P.bias.p, P.bias_dt, term_at(P.bias, b, h, i, j));
        x = (x - lse) - lo_r;
        float p = 0.f;
        if (vis && lse != -INFINITY) p = exp2f(x * kLog2e);
        if (Ps) Ps[r * LDP + tx + 16 * jj] = p;
        const float ds = p * (dp[ii][jj] - Dr);
        if (vis) on_ds(ii, jj, i, j, ds);
        dSs[r * LDP + tx + 16 * jj] = score_grad(ds, th);
      } else {
        if (plain) {
          x = (scaled(P, s[ii][jj]) - lse) - lo_r;
        } else {
          x = (score_of(P, s[ii][jj], slope, dg - j, &th) - lse) - lo_r;
        }
        float p = 0.f;
        if (j >= lo && j < hi && lse != -INFINITY) p = exp2f(x * kLog2e);
        if (Ps) Ps[r * LDP + tx + 16 * jj] = p;
        dSs[r * LDP + tx + 16 * jj] = score_grad(p * (dp[ii][jj] - Dr), th);
      }
    }
  }
  (void)Br;
}

/* lse (hi, lo) and D of query rows i0 .. i0+Br-1 into shared memory. */
template <int Br>
__device__ __forceinline__ void load_row_stats(const gparams &P, const seqinfo &S, int b, int h,
                                               long long i0, float *lses, float *los, float *Ds) {
  for (int r = threadIdx.x; r < Br; r += kThreads) {
    const long long i = i0 + r;
    float lse = -INFINITY, lo = 0.f, D = 0.f;
    if (i < S.nq) {
      const float *lp = lse_row(P, S, b, h, i);
      lse = lp[0];
      if (P.lse.sd) lo = lp[P.lse.sd];
      D = P.ws_D[(S.wrow0 + i) * P.hq + h];
    }
    lses[r] = lse;
    los[r] = lo;
    Ds[r] = D;
  }
}

/* dbias in dkdv, which computes each dS element once: stored where dbias
 * has the bias's full shape, added (atomics) where it broadcasts; in
 * deterministic mode a broadcast dbias is dbias_kernel's, not dkdv's. */
struct dbias_out {
  const gparams &P;
  int b, h;
  __device__ __forceinline__ void operator()(int, int, long long i, long long j, float ds) const {
    if (!P.dbias.p) return;
    float *dst = (float *)P.dbias.p + term_at(P.dbias, b, h, i, j);
    if (P.dbias_atomic)
      atomicAdd(dst, ds);
    else
      *dst = ds;
  }
};

/* X: built for the bias (and dbias); the plain kernel keeps no registers
 * for it. */
template <typename T, int DP, int M, bool ATOMIC_DQ, bool X>
__global__ void __launch_bounds__(kThreads, 1) dkdv_kernel(const gparams P) {
  using C = bwd_cfg<DP, M>;
  constexpr int Br = C::Br, Bc = C::Bc, LD = C::LD, LDP = C::LDP, NG = DP / 32;
  extern __shared__ float4 smem4[];
  const bwd_smem<DP, M, true> sm(smem4);
  float *const Ks = sm.own0, *const Vs = sm.own1, *const Qs = sm.in0, *const dOs = sm.in1;
  float *const Ps = sm.Ps, *const dSs = sm.dSs;

  const int kb = gridDim.x - 1 - blockIdx.x, hk = blockIdx.y, b = blockIdx.z;
  const seqinfo S = get_seq(P, b);
  const long long j0 = (long long)kb * Bc;
  if (j0 >= S.nk) return;
  const int tid = threadIdx.x, tx = tid & 15, ty = tid >> 4;

  load_tile<T, DP, Bc>(Ks, LD, P.k, head_base(P.k, b, S.row0k, hk), j0, S.nk, P.d);
  load_tile<T, DP, Bc>(Vs, LD, P.v, head_base(P.v, b, S.row0k, hk), j0, S.nk, P.d);
  cp_async_commit();

  long long qlo, qhi;
  query_block_range(j0, min(S.nk, j0 + Bc), S.nq, S.nk, P.wl, P.wr, &qlo, &qhi);
  const bool plain = P.softcap == 0.f && P.alibi == nullptr;

  /* Keys ty*M + a, columns tx*2 + 32*g. */
  float2 dk[M][NG], dv[M][NG];
  zero_acc(dk);
  zero_acc(dv);

  for (int h = hk * P.group; h < (hk + 1) * P.group && qhi > qlo; h++) {
    const float slope = P.alibi ? P.alibi[h] : 0.f;
    const long long qbase = head_base(P.q, b, S.row0q, h);
    const long long dobase = head_base(P.dout, b, S.row0q, h);
    for (long long i0 = (qlo / Br) * Br; i0 < qhi; i0 += Br) {
      load_tile<T, DP, Br>(Qs, LD, P.q, qbase, i0, S.nq, P.d);
      load_tile<T, DP, Br>(dOs, LD, P.dout, dobase, i0, S.nq, P.d);
      cp_async_commit();
      load_row_stats<Br>(P, S, b, h, i0, sm.lses, sm.los, sm.Ds);
      cp_async_wait<0>();
      __syncthreads();

      if constexpr (X)
        bwd_p_ds<DP, M, true>(P, S, Qs, dOs, Ks, Vs, sm.lses, sm.los, sm.Ds, Ps, dSs, i0, j0, slope,
                              plain, b, h, dbias_out{P, b, h});
      else
        bwd_p_ds<DP, M>(P, S, Qs, dOs, Ks, Vs, sm.lses, sm.los, sm.Ds, Ps, dSs, i0, j0, slope,
                        plain);
      __syncthreads();

      /* dV += P^T dO, dK += dS^T Q over the Br rows. */
#pragma unroll 2
      for (int r = 0; r < Br; r++) {
        float pa[M], da[M];
#pragma unroll
        for (int a = 0; a < M; a++) {
          pa[a] = Ps[r * LDP + ty * M + a];
          da[a] = dSs[r * LDP + ty * M + a];
        }
#pragma unroll
        for (int g = 0; g < NG; g++) {
          const float2 dov = *(const float2 *)&dOs[r * LD + tx * 2 + 32 * g];
          const float2 qv = *(const float2 *)&Qs[r * LD + tx * 2 + 32 * g];
#pragma unroll
          for (int a = 0; a < M; a++) {
            dv[a][g].x = fmaf(pa[a], dov.x, dv[a][g].x);
            dv[a][g].y = fmaf(pa[a], dov.y, dv[a][g].y);
            dk[a][g].x = fmaf(da[a], qv.x, dk[a][g].x);
            dk[a][g].y = fmaf(da[a], qv.y, dk[a][g].y);
          }
        }
      }

      if constexpr (ATOMIC_DQ) {
        /* dQ (rows ty + 16*ii) += scale * dS K, added into the workspace. */
        float2 dq[M][NG];
        zero_acc(dq);
        rows_times_tile<M, NG, Bc, 16, LDP, LD>(dq, dSs, Ks, tx, ty);
#pragma unroll
        for (int ii = 0; ii < M; ii++) {
          const long long i = i0 + ty + 16 * ii;
          if (i >= S.nq) continue;
          float *dst = P.ws_dq + ((S.wrow0 + i) * P.hq + h) * P.d;
#pragma unroll
          for (int g = 0; g < NG; g++) {
            const int c = tx * 2 + 32 * g;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
            /* Hopper adds a float2 in one atomic: half the L2 operations. An
             * even d keeps the pair 8-byte aligned and inside the row. */
            if ((P.d & 1) == 0) {
              if (c < P.d)
                atomicAdd((float2 *)(dst + c),
                          make_float2(dq[ii][g].x * P.scale, dq[ii][g].y * P.scale));
              continue;
            }
#endif
            if (c < P.d) atomicAdd(dst + c, dq[ii][g].x * P.scale);
            if (c + 1 < P.d) atomicAdd(dst + c + 1, dq[ii][g].y * P.scale);
          }
        }
      }
      __syncthreads(); /* before the next Q, dO, P and dS overwrite these */
    }
  }
  cp_async_wait<0>();

  const long long dkbase = head_base(P.dk, b, S.row0k, hk);
  const long long dvbase = head_base(P.dv, b, S.row0k, hk);
#pragma unroll
  for (int a = 0; a < M; a++) {
    const long long j = j0 + ty * M + a;
    if (j >= S.nk) continue;
#pragma unroll
    for (int g = 0; g < NG; g++) {
      const int c = tx * 2 + 32 * g;
      if (c < P.d) {
        elem<T>::st(P.dk.p, dkbase + j * P.dk.ss + c * P.dk.sd, dk[a][g].x * P.scale);
        elem<T>::st(P.dv.p, dvbase + j * P.dv.ss + c * P.dv.sd, dv[a][g].x);
      }
      if (c + 1 < P.d) {
        elem<T>::st(P.dk.p, dkbase + j * P.dk.ss + (c + 1) * P.dk.sd, dk[a][g].y * P.scale);
        elem<T>::st(P.dv.p, dvbase + j * P.dv.ss + (c + 1) * P.dv.sd, dv[a][g].y);
      }
    }
  }
}

/* Deterministic dQ: a block per (query block, query head, sequence) sums
 * dS K over its key blocks in order, with no atomics, and writes dq. */
template <typename T, int DP, int M, bool X>
__global__ void __launch_bounds__(kThreads, 1) dq_kernel(const gparams P) {
  using C = bwd_cfg<DP, M>;
  constexpr int Br = C::Br, Bc = C::Bc, LD = C::LD, LDP = C::LDP, NG = DP / 32;
  extern __shared__ float4 smem4[];
  const bwd_smem<DP, M, false> sm(smem4);
  float *const Qs = sm.own0, *const dOs = sm.own1, *const Ks = sm.in0, *const Vs = sm.in1;
  float *const dSs = sm.dSs;

  const int qb = gridDim.x - 1 - blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const seqinfo S = get_seq(P, b);
  const long long i0 = (long long)qb * Br;
  if (i0 >= S.nq) return;
  const long long i1 = min(S.nq, i0 + Br);
  const int hk = h / P.group;
  const int tid = threadIdx.x, tx = tid & 15, ty = tid >> 4;
  const float slope = P.alibi ? P.alibi[h] : 0.f;
  const bool plain = P.softcap == 0.f && P.alibi == nullptr;

  load_tile<T, DP, Br>(Qs, LD, P.q, head_base(P.q, b, S.row0q, h), i0, S.nq, P.d);
  load_tile<T, DP, Br>(dOs, LD, P.dout, head_base(P.dout, b, S.row0q, h), i0, S.nq, P.d);
  cp_async_commit();
  load_row_stats<Br>(P, S, b, h, i0, sm.lses, sm.los, sm.Ds);

  long long klo, khi;
  key_block_range(i0, i1, S.nq, S.nk, P.wl, P.wr, &klo, &khi);
  const long long kbase = head_base(P.k, b, S.row0k, hk);
  const long long vbase = head_base(P.v, b, S.row0k, hk);

  float2 dq[M][NG];
  zero_acc(dq);

  for (long long j0 = (klo / Bc) * Bc; j0 < khi; j0 += Bc) {
    load_tile<T, DP, Bc>(Ks, LD, P.k, kbase, j0, S.nk, P.d);
    load_tile<T, DP, Bc>(Vs, LD, P.v, vbase, j0, S.nk, P.d);
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();
    bwd_p_ds<DP, M, X>(P, S, Qs, dOs, Ks, Vs, sm.lses, sm.los, sm.Ds, nullptr, dSs, i0, j0, slope,
                       plain, b, h);
    __syncthreads();
    rows_times_tile<M, NG, Bc, 16, LDP, LD>(dq, dSs, Ks, tx, ty);
    __syncthreads(); /* before the next K, V and dS overwrite these */
  }
  cp_async_wait<0>();

  const long long dqbase = head_base(P.dq, b, S.row0q, h);
#pragma unroll
  for (int ii = 0; ii < M; ii++) {
    const long long i = i0 + ty + 16 * ii;
    if (i >= S.nq) continue;
#pragma unroll
    for (int g = 0; g < NG; g++) {
      const int c = tx * 2 + 32 * g;
      if (c < P.d) elem<T>::st(P.dq.p, dqbase + i * P.dq.ss + c * P.dq.sd, dq[ii][g].x * P.scale);
      if (c + 1 < P.d)
        elem<T>::st(P.dq.p, dqbase + i * P.dq.ss + (c + 1) * P.dq.sd, dq[ii][g].y * P.scale);
    }
  }
}

/* Deterministic dbias where it broadcasts: a block per tile of dbias (a
 * key block, by a query block or, where the rows broadcast, by the one row;
 * of one dbias head and sequence) sums, in a fixed order, the dS of every
 * (sequence, head, query block) that adds into it, recomputing them from
 * dq_kernel's tiles, and writes the tile once. Grid: (key blocks x query
 * blocks, dbias heads, dbias sequences). */
template <typename T, int DP, int M>
__global__ void __launch_bounds__(kThreads, 1) dbias_kernel(const gparams P) {
  using C = bwd_cfg<DP, M>;
  constexpr int Br = C::Br, Bc = C::Bc, LD = C::LD, LDP = C::LDP;
  extern __shared__ float4 smem4[];
  const bwd_smem<DP, M, false> sm(smem4);
  float *const Qs = sm.own0, *const dOs = sm.own1, *const Ks = sm.in0, *const Vs = sm.in1;
  float *const dSs = sm.dSs;

  const long long nkb = (P.nk + Bc - 1) / Bc;
  const long long kb = blockIdx.x % nkb, qb = blockIdx.x / nkb;
  const int hd = blockIdx.y, bd = blockIdx.z;
  const long long j0 = kb * Bc;
  const int tid = threadIdx.x, tx = tid & 15, ty = tid >> 4;
  const bool rows = P.dbias.ss != 0;
  const bool plain = P.softcap == 0.f && P.alibi == nullptr;

  float acc[M][M];
#pragma unroll
  for (int ii = 0; ii < M; ii++)
#pragma unroll
    for (int jj = 0; jj < M; jj++)
      acc[ii][jj] = 0.f;
  auto add = [&](int ii, int jj, long long, long long, float ds) { acc[ii][jj] += ds; };

  const int b_end = P.dbias.sb ? bd + 1 : P.batch, h_end = P.dbias.sh ? hd + 1 : P.hq;
  for (int b = P.dbias.sb ? bd : 0; b < b_end; b++) {
    const seqinfo S = get_seq(P, b);
    if (j0 >= S.nk) continue;
    long long qlo, qhi;
    query_block_range(j0, min(S.nk, j0 + Bc), S.nq, S.nk, P.wl, P.wr, &qlo, &qhi);
    if (rows) {
      qlo = max(qlo, qb * Br);
      qhi = min(qhi, qb * Br + Br);
    }
    if (qhi <= qlo) continue;
    for (int h = P.dbias.sh ? hd : 0; h < h_end; h++) {
      const int hk = h / P.group;
      const float slope = P.alibi ? P.alibi[h] : 0.f;
      __syncthreads(); /* every thread is done with the previous tiles */
      load_tile<T, DP, Bc>(Ks, LD, P.k, head_base(P.k, b, S.row0k, hk), j0, S.nk, P.d);
      load_tile<T, DP, Bc>(Vs, LD, P.v, head_base(P.v, b, S.row0k, hk), j0, S.nk, P.d);
      for (long long i0 = (qlo / Br) * Br; i0 < qhi; i0 += Br) {
        load_tile<T, DP, Br>(Qs, LD, P.q, head_base(P.q, b, S.row0q, h), i0, S.nq, P.d);
        load_tile<T, DP, Br>(dOs, LD, P.dout, head_base(P.dout, b, S.row0q, h), i0, S.nq, P.d);
        cp_async_commit();
        load_row_stats<Br>(P, S, b, h, i0, sm.lses, sm.los, sm.Ds);
        cp_async_wait<0>();
        __syncthreads();
        bwd_p_ds<DP, M, true>(P, S, Qs, dOs, Ks, Vs, sm.lses, sm.los, sm.Ds, nullptr, dSs, i0, j0,
                              slope, plain, b, h, add);
        __syncthreads(); /* before the next Q, dO and dS overwrite these */
      }
    }
  }

  float *const db = (float *)P.dbias.p;
  if (rows) {
#pragma unroll
    for (int ii = 0; ii < M; ii++)
#pragma unroll
      for (int jj = 0; jj < M; jj++) {
        const long long i = qb * Br + ty + 16 * ii, j = j0 + tx + 16 * jj;
        if (i < P.nq && j < P.nk) db[term_at(P.dbias, bd, hd, i, j)] = acc[ii][jj];
      }
    return;
  }
  /* One row: the column sums, over the thread's rows, then over the 16
   * row groups in order. dS's tile is free after the loop's last barrier. */
  float *const red = dSs; /* [16][LDP] */
#pragma unroll
  for (int jj = 0; jj < M; jj++) {
    float t = 0.f;
#pragma unroll
    for (int ii = 0; ii < M; ii++)
      t += acc[ii][jj];
    red[ty * LDP + tx + 16 * jj] = t;
  }
  __syncthreads();
  if (tid < Bc && j0 + tid < P.nk) {
    float t = 0.f;
    for (int y = 0; y < 16; y++)
      t += red[y * LDP + tid];
    db[term_at(P.dbias, bd, hd, 0, j0 + tid)] = t;
  }
}

/* ---------------------------------------------------------------------- */
/* Host side: the launchers and the tuning table's rows, one set per dtype  */
/* ---------------------------------------------------------------------- */

/* The kernels' parameter block for a launch (general.cu). */
gparams make_params(const attn__cuda_launch *L, int backward);

/* forward: the kernel takes its blocks in attn_order_group's order. */
template <typename K>
static int launch_cfg(K kernel, size_t smem, dim3 grid, const attn__cuda_launch *L,
                      const gparams &P, bool forward = false) {
  if (grid.x == 0 || grid.y == 0 || grid.z == 0) return ATTN_OK;
  if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) !=
      cudaSuccess)
    return ATTN_EDEVICE;
  gparams Pl = P;
  Pl.order =
      forward ? attn_order_group(kernel, kThreads, smem, grid, L->dev->sm_count, P.wl, P.wr) : 0;
  kernel<<<grid, kThreads, smem, L->stream>>>(Pl);
  return cudaPeekAtLastError() == cudaSuccess ? ATTN_OK : ATTN_EDEVICE;
}

template <typename T, int DP, int MR, int MC>
static int launch_fwd(const attn__cuda_launch *L, const attn__cuda_config *) {
  using Cf = fwd_cfg<DP, MR, MC>;
  const attn__problem *pb = L->pb;
  if (pb->batch == 0 || pb->seqlen_q == 0 || pb->heads_q == 0) return ATTN_OK;
  const gparams P = make_params(L, 0);
  dim3 grid((unsigned)((pb->seqlen_q + Cf::Br - 1) / Cf::Br), (unsigned)pb->heads_q,
            (unsigned)pb->batch);
  if (attn__problem_uses(pb))
    return launch_cfg(fwd_kernel<T, DP, MR, MC, true>, Cf::smem, grid, L, P, true);
  return launch_cfg(fwd_kernel<T, DP, MR, MC, false>, Cf::smem, grid, L, P, true);
}

/* The backward's passes after D: dK and dV, then dQ; X: built for the bias
 * (and dbias). */
template <typename T, int DP, int M, bool X>
static int launch_bwd_passes(const attn__cuda_launch *L, const gparams &P) {
  using Cb = bwd_cfg<DP, M>;
  const attn__problem *pb = L->pb;
  dim3 gk((unsigned)((pb->seqlen_k + Cb::Bc - 1) / Cb::Bc), (unsigned)pb->heads_kv,
          (unsigned)pb->batch);
  int st;
  if (pb->deterministic) {
    /* A dbias that sums over broadcast dimensions is dbias_kernel's. */
    gparams Pk = P;
    if (attn__cuda_dbias_sums(pb)) Pk.dbias.p = nullptr;
    st = launch_cfg(dkdv_kernel<T, DP, M, false, X>, Cb::smem_dkdv, gk, L, Pk);
    if (st != ATTN_OK) return st;
    dim3 gq((unsigned)((pb->seqlen_q + Cb::Br - 1) / Cb::Br), (unsigned)pb->heads_q,
            (unsigned)pb->batch);
    st = launch_cfg(dq_kernel<T, DP, M, X>, Cb::smem_dq, gq, L, P);
    if (st != ATTN_OK || !X || Pk.dbias.p || !P.dbias.p) return st;
    const long long nkb = (pb->seqlen_k + Cb::Bc - 1) / Cb::Bc;
    const long long nqb = P.dbias.ss ? (pb->seqlen_q + Cb::Br - 1) / Cb::Br : 1;
    dim3 gb((unsigned)(nkb * nqb), P.dbias.sh ? (unsigned)pb->heads_q : 1u,
            P.dbias.sb ? (unsigned)pb->batch : 1u);
    return launch_cfg(dbias_kernel<T, DP, M>, Cb::smem_dq, gb, L, P);
  }
  st = launch_cfg(dkdv_kernel<T, DP, M, true, X>, Cb::smem_dkdv, gk, L, P);
  if (st != ATTN_OK) return st;
  const long long n = P.total_q * P.hq * P.d;
  long long blocks = (n + 255) / 256;
  if (blocks > 65535LL * 16) blocks = 65535LL * 16;
  if (blocks < 1) blocks = 1;
  dq_convert_kernel<T><<<(unsigned)blocks, 256, 0, L->stream>>>(P);
  return cudaPeekAtLastError() == cudaSuccess ? ATTN_OK : ATTN_EDEVICE;
}

template <typename T, int DP, int M>
static int launch_bwd(const attn__cuda_launch *L, const attn__cuda_config *) {
  const attn__problem *pb = L->pb;
  if (pb->batch == 0 || pb->heads_q == 0) return ATTN_OK;
  const gparams P = make_params(L, 1);
  if (!pb->deterministic && P.ws_dq) {
    const size_t n = sizeof(float) * (size_t)pb->total_q * pb->heads_q * pb->head_dim;
    if (n && cudaMemsetAsync(P.ws_dq, 0, n, L->stream) != cudaSuccess) return ATTN_EDEVICE;
  }
  if (attn__cuda_dbias_zero(pb, L->stream) != ATTN_OK) return ATTN_EDEVICE;
  const long long warps = P.total_q * P.hq;
  if (warps > 0) {
    rowdot_kernel<T><<<(unsigned)((warps + 7) / 8), 256, 0, L->stream>>>(P);
    if (cudaPeekAtLastError() != cudaSuccess) return ATTN_EDEVICE;
  }
  if (attn__cuda_dsinks(pb, P.ws_D, P.hq, 1, L->stream) != ATTN_OK) return ATTN_EDEVICE;
  /* Sinks change lse alone, which the plain kernels read. */
  if (pb->has_bias) return launch_bwd_passes<T, DP, M, true>(L, P);
  return launch_bwd_passes<T, DP, M, false>(L, P);
}

template <typename T>
constexpr attn_dtype dtype_of() {
  return sizeof(T) == 4 ? ATTN_F32 : std::is_same<T, __half>::value ? ATTN_F16 : ATTN_BF16;
}

/* A row of the table: the traits come from the kernel's template arguments
 * (C: its fwd_cfg or bwd_cfg). */
template <typename T, typename C>
constexpr attn__cuda_config general_row(attn__cuda_kernel kernel, int dim, size_t smem,
                                        size_t smem_det, unsigned features, const char *name,
                                        attn__cuda_launcher launch) {
  return {.kernel = kernel,
          .dtype = dtype_of<T>(),
          .dim = dim,
          .cc = 0,
          .specific = 0,
          .tf32 = 0,
          .threads = kThreads,
          .br = C::Br,
          .bc = C::Bc,
          .stages = 0,
          .min_seqlen_q = 0,
          .min_keys_masked = 0,
          .smem = smem,
          .smem_det = smem_det,
          .features = features,
          .nondeterministic = 0,
          .name = name,
          .launch = launch};
}

template <typename T, int DP, int MR, int MC>
constexpr attn__cuda_config fwd_row(const char *name) {
  using C = fwd_cfg<DP, MR, MC>;
  return general_row<T, C>(ATTN__CUDA_GENERAL_FORWARD, DP, C::smem, 0,
                           ATTN__USES_SEQUSED | ATTN__USES_PAGED | ATTN__USES_APPEND |
                               ATTN__USES_BIAS | ATTN__USES_SINKS,
                           name, launch_fwd<T, DP, MR, MC>);
}

template <typename T, int DP, int M>
constexpr attn__cuda_config bwd_row(const char *name) {
  using C = bwd_cfg<DP, M>;
  return general_row<T, C>(
      ATTN__CUDA_GENERAL_BACKWARD, DP, C::smem_dkdv, C::smem_dq,
      ATTN__USES_BIAS | ATTN__USES_SINKS | ATTN__USES_DBIAS | ATTN__USES_DSINKS, name,
      launch_bwd<T, DP, M>);
}

/* The general family's rows for dtype T, per padded head dim the first that
 * fits the device's shared memory: 8 rows a thread (Br = 128) where it fits,
 * fewer rows and then fewer keys above. The last rows of each head dim are
 * for the shared memory of older GPUs a block (KB, forward / backward):
 *   P100 (48): d <= 192 / 128;  T4 (64): every d / d <= 192;  V100 (96): every d. */
template <typename T>
constexpr attn__cuda_config rows[] = {
    fwd_row<T, 32, 8, 4>("general forward, d <= 32, 128 x 64 tiles"),
    fwd_row<T, 64, 8, 4>("general forward, d <= 64, 128 x 64 tiles"),
    fwd_row<T, 32, 4, 2>("general forward, d <= 32, 64 x 32 tiles"),
    fwd_row<T, 64, 4, 4>("general forward, d <= 64, 64 x 64 tiles"),
    fwd_row<T, 64, 4, 2>("general forward, d <= 64, 64 x 32 tiles"),
    fwd_row<T, 96, 8, 4>("general forward, d <= 96, 128 x 64 tiles"),
    fwd_row<T, 96, 4, 2>("general forward, d <= 96, 64 x 32 tiles"),
    fwd_row<T, 96, 2, 2>("general forward, d <= 96, 32 x 32 tiles"),
    fwd_row<T, 128, 8, 4>("general forward, d <= 128, 128 x 64 tiles"),
    fwd_row<T, 128, 4, 4>("general forward, d <= 128, 64 x 64 tiles"),
    fwd_row<T, 128, 2, 2>("general forward, d <= 128, 32 x 32 tiles"),
    fwd_row<T, 128, 2, 1>("general forward, d <= 128, 32 x 16 tiles"),
    fwd_row<T, 192, 4, 4>("general forward, d <= 192, 64 x 64 tiles"),
    fwd_row<T, 192, 4, 2>("general forward, d <= 192, 64 x 32 tiles"),
    fwd_row<T, 192, 2, 2>("general forward, d <= 192, 32 x 32 tiles"),
    fwd_row<T, 192, 2, 1>("general forward, d <= 192, 32 x 16 tiles"),
    fwd_row<T, 192, 1, 1>("general forward, d <= 192, 16 x 16 tiles"),
    fwd_row<T, 256, 4, 4>("general forward, d <= 256, 64 x 64 tiles"),
    fwd_row<T, 256, 4, 2>("general forward, d <= 256, 64 x 32 tiles"),
    fwd_row<T, 256, 2, 1>("general forward, d <= 256, 32 x 16 tiles"),
    fwd_row<T, 256, 1, 1>("general forward, d <= 256, 16 x 16 tiles"),
    bwd_row<T, 32, 4>("general backward, d <= 32, 64 x 64 tiles"),
    bwd_row<T, 32, 2>("general backward, d <= 32, 32 x 32 tiles"),
    bwd_row<T, 64, 4>("general backward, d <= 64, 64 x 64 tiles"),
    bwd_row<T, 64, 2>("general backward, d <= 64, 32 x 32 tiles"),
    bwd_row<T, 96, 4>("general backward, d <= 96, 64 x 64 tiles"),
    bwd_row<T, 96, 2>("general backward, d <= 96, 32 x 32 tiles"),
    bwd_row<T, 96, 1>("general backward, d <= 96, 16 x 16 tiles"),
    bwd_row<T, 128, 4>("general backward, d <= 128, 64 x 64 tiles"),
    bwd_row<T, 128, 2>("general backward, d <= 128, 32 x 32 tiles"),
    bwd_row<T, 128, 1>("general backward, d <= 128, 16 x 16 tiles"),
    bwd_row<T, 192, 2>("general backward, d <= 192, 32 x 32 tiles"),
    bwd_row<T, 192, 1>("general backward, d <= 192, 16 x 16 tiles"),
    bwd_row<T, 256, 2>("general backward, d <= 256, 32 x 32 tiles"),
    bwd_row<T, 256, 1>("general backward, d <= 256, 16 x 16 tiles"),
};

template <typename T>
constexpr attn__cuda_rows table() {
  return {rows<T>, (int)(sizeof rows<T> / sizeof rows<T>[0])};
}

}  // namespace attn_general

#endif /* ATTN_CUDA_GENERAL_CUH */
