/*
 * Backward pass after FlashAttention-2, shaped for GPUs, in three kernels:
 *   attn_bwd_pre   delta_i = rowsum(dO_i * O_i) (the paper's D_i)
 *   attn_bwd_dkdv  one work-group per block of BK keys of one key/value head,
 *                  dK and dV held in registers: for each query head sharing
 *                  it and each block of BQ query rows that can see the keys,
 *                    S = Q K^T, dP = dO V^T        (register tiles)
 *                    P = exp(S - lse), dS = P (dP - delta)
 *                    dV += P^T dO, dK += dS^T Q    (register tiles)
 *                  dK scaled at the end
 *   attn_bwd_dq    one work-group per block of BQ query rows, dQ in
 *                  registers: the same S, dP, P and dS for each block of BK
 *                  keys, then dQ += dS K
 * Each output element is owned by exactly one work-item and summed in a fixed
 * order, with no atomics, so the gradients are bit-identical run to run; the
 * price is computing S and dP twice (once per kernel).
 *
 * The score terms' gradients, each compiled in only when asked for:
 *   dbias          attn_bwd_dq adds each tile's dS (before softcap's
 *                  derivative: the bias is added after it) to dbias, zeroed
 *                  first by attn_bwd_zero. Where dbias broadcasts over the
 *                  batch or the heads, the host launches attn_bwd_dq once per
 *                  sequence or head, in order, so no two work-groups of a
 *                  launch add to one element (DBIAS 1). Where it broadcasts
 *                  over the query rows, each work-group of a launch sums its
 *                  block's rows into a slot of its own in a partial buffer,
 *                  which attn_bwd_dbias_sum then adds to dbias, block by block
 *                  (DBIAS 2).
 *   dsinks         attn_bwd_dsinks: one work-group per head sums sink_grad
 *                  over every row, in a fixed order.
 *
 * The work-items (NTB = 16 BQ / BTM of them) form BTY rows of 16, as fwd.cl's.
 * In S and dP, item (ty, tx) owns query rows ty BTM .. ty BTM + BTM - 1 and
 * keys tx + 16 n (n < BK / 16): Q and dO are staged column-major, K and V
 * row-major, BDK columns at a time, so that per 4 columns an item reads BTM
 * floats of Q and of dO as float4s and one float4 of each of its keys' K and
 * V rows, 2 (BTM + BTN) local reads for 8 BTM BTN FMAs (16 reads for 128 at
 * the GPU row's BTM = BTN = 4). Each S is an FMA per column in column order
 * from 0, as the forward computes it: S must come out bit-identical to the
 * forward's, or exp(S - lse) amplifies the difference where the logits are
 * large.
 *
 * In the sums an item owns a register tile of outputs: in dK and dV keys
 * ty BTK .. (BTK = BK / BTY) by the columns of fwd.cl's O (BCOL), fed per
 * query row by BTK/4 float4s of P and of dS and the row's Q and dO columns,
 * 4 BTK BTD FMAs for 2 (BTK + BTD) / 4 reads; in dQ rows ty BTM .. by the same
 * columns, fed per key by BTM/4 float4s of dS^T and the key's K columns. The
 * rows of these sums are staged BJK at a time with float4 loads where a row's
 * columns are contiguous.
 *
 * The staging goes through registers, as in fwd.cl: the next chunk is loaded
 * from global memory before the current one is multiplied, so that its
 * latency hides behind the FMAs. The chunks of S and dP and the tiles of the
 * sums live in different phases, with a barrier between: they share one
 * buffer. f16 and bf16 become f32 when staged, not when read: each staged
 * element is read by 4 to 16 items, and a conversion per read (half the FMA
 * rate on NVIDIA GPUs) would cost more than 16-bit tiles save in local
 * bytes, of which these products are not short.
 *
 * The -D parameters are the tiles table's (cl/plan.c), which keeps BK a
 * multiple of 16, BTM of 4 dividing BQ, BK a multiple of BTY, BJK dividing
 * BQ and BK, BDK a multiple of 4 dividing NTB with BDK BQ and BDK BK
 * multiples of NTB. The defaults are the CPU class's fallback tiles.
 */
#ifndef HD
#define HD 64 /* the head dimension rounded up: 32, 64, then a multiple of 32 */
#endif
#ifndef BQ
#define BQ 32 /* query rows per tile: a dQ work-group's, a dK/dV step's */
#endif
#ifndef BK
#define BK 32 /* keys per tile: a dK/dV work-group's, a dQ step's */
#endif
#ifndef BTM
#define BTM 4 /* query rows per work-item in S and dP, and in dQ */
#endif
#ifndef BDK
#define BDK 16 /* Q, dO, K and V columns per staging step of S and dP */
#endif
#ifndef BJK
#define BJK 8 /* rows per staging step of the sums: Q and dO (dK/dV), K (dQ) */
#endif
#ifndef DBIAS
#define DBIAS 0 /* dbias: 0 none, 1 added tile by tile, 2 through row-block sums */
#endif

#define NTB (16 * BQ / BTM) /* work-items */
#define BTY (BQ / BTM)      /* rows of 16 items */
#define BTN (BK / 16)       /* keys per item in S and dP */
#define BTK (BK / BTY)      /* keys per item in dK and dV */
#define BTD (HD / 16)       /* output columns per item */
#define QCS (BQ + 4)        /* Q and dO chunks, column-major: float4-aligned rows */
#define KCS (BDK + 4)       /* K and V chunks: 16 keys' float4s in distinct bank groups */
#define PKS (BK + 4)        /* dK/dV's P and dS, [row][key] */
#define PQS (BQ + 4)        /* dQ's dS (and dbias's dR), [key][row] */
#define QPB (BDK * BQ / NTB)
#define KPB (BDK * BK / NTB)
#define RSB (NTB / BDK)                          /* rows between an item's chunk elements */
#define RW4 ((BJK * HD / 4 + NTB - 1) / NTB)     /* an item's float4s of a sums step */
#define CH4 ((2 * BDK * QCS + 2 * BK * KCS) / 4) /* float4s of the four chunks */
#define KV4 ((2 * BQ * PKS + 2 * BJK * HD) / 4)  /* of dK/dV's P, dS and row tiles */
#define DQ4 (((DBIAS == 2 ? 2 : 1) * BK * PQS + BJK * HD) / 4) /* of dQ's */
#define BMAX(a, b) ((a) > (b) ? (a) : (b))
#define BVV (BTD % 4 == 0) /* output columns read as float4s */

/* Output column n of work-item tx, as fwd.cl's OCOL. */
#if BVV
#define BCOL(tx, n) ((tx)*4 + ((n) / 4) * 64 + (n) % 4)
#else
#define BCOL(tx, n) ((tx) + 16 * (n))
#endif

/* Component cc of x. */
inline float comp4(float4 x, int cc) {
  return cc == 0 ? x.s0 : cc == 1 ? x.s1 : cc == 2 ? x.s2 : x.s3;
}

/* x into a[0 .. 3]. */
inline void put4(float *a, float4 x) {
  a[0] = x.s0;
  a[1] = x.s1;
  a[2] = x.s2;
  a[3] = x.s3;
}

/* n floats from p: as float4s where n is a multiple of 4 (p then 16-byte
 * aligned, which the typed read tells the compiler), else one by one. */
inline void load_run(float *a, __local const float *p, int n) {
  if (n % 4 == 0) {
#pragma unroll
    for (int u = 0; u < n / 4; ++u)
      put4(a + 4 * u, ((__local const float4 *)p)[u]);
  } else {
#pragma unroll
    for (int u = 0; u < n; ++u)
      a[u] = p[u];
  }
}

/* Item tx's BTD output columns of a staged row (16-byte aligned). */
inline void load_cols(float *a, __local const float *row, int tx) {
#if BVV
#pragma unroll
  for (int g = 0; g < BTD / 4; ++g)
    put4(a + 4 * g, ((__local const float4 *)row)[tx + g * 16]);
#else
#pragma unroll
  for (int n = 0; n < BTD; ++n)
    a[n] = row[BCOL(tx, n)];
#endif
}

/* A chunk of S and dP's operands in an item's registers: item (sc, sr)
 * holds column sc of rows sr, sr + RSB, .. of the chunk's Q, dO, K and V. */
typedef struct chunk_regs {
  float q[QPB], g[QPB], k[KPB], v[KPB];
} chunk_regs;

/* The operands of S and dP: rows of one (sequence, head), and where the
 * tile starts. */
typedef struct tile_src {
  __global const T *qp, *gp, *kp, *vp;
  long4 qs, gs, ks, vs;
  int i0, j0, nq, nk, d;
} tile_src;

/* The tile at (i0, j0) of query head h and key/value head hk of sequence
 * b, from the kernels' arguments. */
inline tile_src tile_src_of(__global const T *q, long qo, long4 qs, __global const T *k, long ko,
                            long4 ks, __global const T *v, long vo, long4 vs,
                            __global const T *dout, long go, long4 gs, int b, int h, int hk,
                            seq_info seq, int d, int i0, int j0) {
  tile_src t;
  t.qp = HEAD_ROWS(q, qo, qs, b, h, seq.q0);
  t.gp = HEAD_ROWS(dout, go, gs, b, h, seq.q0);
  t.kp = HEAD_ROWS(k, ko, ks, b, hk, seq.k0);
  t.vp = HEAD_ROWS(v, vo, vs, b, hk, seq.k0);
  t.qs = qs;
  t.gs = gs;
  t.ks = ks;
  t.vs = vs;
  t.i0 = i0;
  t.j0 = j0;
  t.nq = seq.nq;
  t.nk = seq.nk;
  t.d = d;
  return t;
}

/* The chunk of columns c0 .. c0 + BDK - 1 of tile t into registers, zero
 * past the ends. */
inline void load_chunk(chunk_regs *r, const tile_src *t, int c0, int sc, int sr) {
  const int cc = c0 + sc;
#pragma unroll
  for (int u = 0; u < QPB; ++u) {
    const int i = t->i0 + sr + u * RSB;
    const int ok = i < t->nq && cc < t->d;
    r->q[u] = ok ? LOAD(t->qp, i * t->qs.s1 + cc * t->qs.s3) : 0.0f;
    r->g[u] = ok ? LOAD(t->gp, i * t->gs.s1 + cc * t->gs.s3) : 0.0f;
  }
#pragma unroll
  for (int u = 0; u < KPB; ++u) {
    const int j = t->j0 + sr + u * RSB;
    const int ok = j < t->nk && cc < t->d;
    r->k[u] = ok ? LOAD(t->kp, j * t->ks.s1 + cc * t->ks.s3) : 0.0f;
    r->v[u] = ok ? LOAD(t->vp, j * t->vs.s1 + cc * t->vs.s3) : 0.0f;
  }
}

/* S = Q K^T and dP = dO V^T for item (ty, tx)'s rows and keys, through the
 * four chunks at ch (CH4 float4s), from r holding the first chunk (the
 * caller loads it during its previous step). Starts and ends with the
 * chunks free: the caller's barrier before, this one's after. */
inline void tile_products(float (*s)[BTN], float (*dp)[BTN], __local float4 *ch4, const tile_src *t,
                          chunk_regs *r, int lid) {
  __local float *Qc = (__local float *)ch4, *Gc = Qc + BDK * QCS;
  __local float *Kc = Gc + BDK * QCS, *Vc = Kc + BK * KCS;
  __local const float4 *Kc4 = (__local const float4 *)Kc, *Vc4 = (__local const float4 *)Vc;
  const int tx = lid % 16, ty = lid / 16, sc = lid % BDK, sr = lid / BDK;
#pragma unroll
  for (int i = 0; i < BTM; ++i)
#pragma unroll
    for (int n = 0; n < BTN; ++n)
      s[i][n] = dp[i][n] = 0.0f;
  for (int c0 = 0; c0 < t->d; c0 += BDK) {
#pragma unroll
    for (int u = 0; u < QPB; ++u) {
      Qc[sc * QCS + sr + u * RSB] = r->q[u];
      Gc[sc * QCS + sr + u * RSB] = r->g[u];
    }
#pragma unroll
    for (int u = 0; u < KPB; ++u) {
      Kc[(sr + u * RSB) * KCS + sc] = r->k[u];
      Vc[(sr + u * RSB) * KCS + sc] = r->v[u];
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    if (c0 + BDK < t->d) load_chunk(r, t, c0 + BDK, sc, sr);
#pragma unroll
    for (int c4 = 0; c4 < BDK; c4 += 4) {
      float4 k4[BTN], v4[BTN];
#pragma unroll
      for (int n = 0; n < BTN; ++n) {
        k4[n] = Kc4[((tx + 16 * n) * KCS + c4) / 4];
        v4[n] = Vc4[((tx + 16 * n) * KCS + c4) / 4];
      }
#pragma unroll
      for (int cc = 0; cc < 4; ++cc) {
        float a[BTM], g[BTM];
        load_run(a, Qc + (c4 + cc) * QCS + ty * BTM, BTM);
        load_run(g, Gc + (c4 + cc) * QCS + ty * BTM, BTM);
#pragma unroll
        for (int i = 0; i < BTM; ++i)
#pragma unroll
          for (int n = 0; n < BTN; ++n) {
            s[i][n] = fma(a[i], comp4(k4[n], cc), s[i][n]);
            dp[i][n] = fma(g[i], comp4(v4[n], cc), dp[i][n]);
          }
      }
    }
    barrier(CLK_LOCAL_MEM_FENCE);
  }
}

/* The rows' statistics of a tile, in local memory. */
typedef struct row_stats {
  __local const float *lse, *lo, *delta;
} row_stats;

#if HAS_BIAS
/* The bias rows of one (sequence, head): element (i, j) at bias_h + i s2 +
 * j s3. */
#define TILE_BIAS_PARAM , __global const uchar *bias, long bias_h, long4 bias_s
#define TILE_BIAS(bh) , bias, (bh), bias_s
/* p_ds takes its score's bias as a value: read from memory by bias_at
 * (common.cl), or from a tile the kernel staged. */
#define P_DS_BIAS_PARAM , float bx
#define P_DS_BIAS(x) , (x)
#else
#define TILE_BIAS_PARAM
#define TILE_BIAS(bh)
#define P_DS_BIAS_PARAM
#define P_DS_BIAS(x)
#endif
#if DBIAS
/* dS before softcap's derivative, the bias's gradient. */
#define TILE_DR_PARAM , float(*dr)[BTN]
#define TILE_DR(x) , (x)
#else
#define TILE_DR_PARAM
#define TILE_DR(x)
#endif

/* P of one score (query row r, key kj, S = s, dP = dp, bias bx) by
 * common.cl's rules, with dS (*ds) and dbias's term g = P (dP - delta) (*g:
 * dS before softcap's derivative, as the bias is added after softcap): zero where
 * the mask hides the key, past the sequence, or on a row that passes no
 * gradient (lse li = -inf). whole: a tile each row of which sees every key,
 * with no softcap or ALiBi, whose score is S * scale (plus the bias). Every
 * OpenCL backward kernel takes its P and dS from here (bwd.cl's,
 * bwd_rows.cl's and bwd_mma.cl's). */
inline float p_ds(float s, float dp, int r, int kj, int nq, int nk, float li, float lo, float dl,
                  float scale, float softcap, float slope, int wl, int wr, int whole, float *ds,
                  float *g P_DS_BIAS_PARAM) {
  /* S * scale rounded before lse is taken from it, as the forward rounds
   * it: a fused multiply-subtract would differ by the rounding, which exp
   * amplifies where the logits are large. */
#pragma OPENCL FP_CONTRACT OFF
  float p = 0.0f;
  *ds = *g = 0.0f;
  if (whole) {
    float x = s * scale;
#if HAS_BIAS
    x += bx;
#endif
    p = li != -INFINITY ? EXP_FROM(x - li, lo) : 0.0f;
    *ds = *g = p * (dp - dl);
  } else if (r < nq && kj < nk && li != -INFINITY) {
    const int dg = diag(r, nq, nk);
    if (key_visible(dg, kj, wl, wr)) {
      float th;
      float x = score(s, scale, softcap, slope, dg - kj, &th);
#if HAS_BIAS
      x += bx;
#endif
      p = EXP_FROM(x - li, lo); /* see lse_split */
      *g = p * (dp - dl);
      *ds = score_grad(*g, th, softcap);
    }
  }
  return p;
}

/* P (into s) and dS (into dp) for item (ty, tx)'s rows and keys of the tile
 * at (t->i0, t->j0), by p_ds. */
inline void tile_p_ds(float (*s)[BTN], float (*dp)[BTN], row_stats st, const tile_src *t,
                      float scale, float softcap, float slope, int wl, int wr,
                      int lid TILE_BIAS_PARAM TILE_DR_PARAM) {
  const int tx = lid % 16, ty = lid / 16;
  /* No softcap or ALiBi on a tile each row of which sees every key (the
   * last row's first key to the first row's last, as in fwd.cl): the score
   * is S * scale (plus the bias) and the mask passes, which skips both on
   * most tiles of a long sequence. */
  int all_lo, all_hi;
  key_block_common(t->i0, t->i0 + BQ, t->nq, t->nk, wl, wr, &all_lo, &all_hi);
  const int whole = softcap == 0.0f && slope == 0.0f && t->i0 + BQ <= t->nq && t->j0 >= all_lo &&
                    t->j0 + BK <= all_hi;
#pragma unroll
  for (int i = 0; i < BTM; ++i) {
    const int ri = ty * BTM + i, r = t->i0 + ri;
    const float li = st.lse[ri], lo = st.lo[ri], dl = st.delta[ri];
#pragma unroll
    for (int n = 0; n < BTN; ++n) {
      const int kj = t->j0 + tx + 16 * n;
      float ds, g;
      s[i][n] =
          p_ds(s[i][n], dp[i][n], r, kj, t->nq, t->nk, li, lo, dl, scale, softcap, slope, wl, wr,
               whole, &ds, &g P_DS_BIAS(bias_at(bias, bias_h, bias_s, r, kj, t->nq, t->nk)));
      dp[i][n] = ds;
#if DBIAS
      dr[i][n] = g;
#endif
    }
  }
}

/* lse (hi, and lo where ls.s3 > 0) and delta for rows i0 .. i0 + rows - 1
 * of head h, by a work-group of items work-items; -inf past the sequence's
 * end, which marks the row as passing no gradient. */
inline void stage_row_stats(__local float *lse_s, __local float *lo_s, __local float *delta_s,
                            __global const float *lse, long lo_, long4 ls,
                            __global const float *delta, int b, int h, seq_info seq, int i0, int tq,
                            int rows, int items, int lid) {
  for (int i = lid; i < rows; i += items) {
    const int r = i0 + i;
    __global const float *lp = HEAD_ROWS(lse, lo_, ls, b, h, seq.q0 + r);
    lse_s[i] = r < seq.nq ? lp[0] : -INFINITY;
    lo_s[i] = r < seq.nq && ls.s3 ? lp[ls.s3] : 0.0f;
    delta_s[i] = r < seq.nq ? delta[h * (long)tq + seq.qflat + r] : 0.0f;
  }
}

/* Rows r0 .. r0 + BJK - 1 of a [.., HD] operand (n rows, d columns, strides
 * s) into registers, zero past the ends: item lid takes float4 units lid,
 * lid + NTB, .. of the BJK x HD tile, read whole where the columns are
 * contiguous. */
inline void load_row_tile(float4 *x, __global const T *p, long4 s, int r0, int n, int d, int lid) {
#pragma unroll
  for (int u = 0; u < RW4; ++u) {
    const int e = lid + u * NTB, r = r0 + e / (HD / 4), c = 4 * (e % (HD / 4));
    float4 y = 0.0f;
    if (e < BJK * HD / 4 && r < n) {
      __global const T *row = p + r * s.s1;
      if (s.s3 == 1 && c + 4 <= d) {
        y = LOAD4(row, c);
      } else {
        y.s0 = c < d ? LOAD(row, c * s.s3) : 0.0f;
        y.s1 = c + 1 < d ? LOAD(row, (c + 1) * s.s3) : 0.0f;
        y.s2 = c + 2 < d ? LOAD(row, (c + 2) * s.s3) : 0.0f;
        y.s3 = c + 3 < d ? LOAD(row, (c + 3) * s.s3) : 0.0f;
      }
    }
    x[u] = y;
  }
}

inline void store_row_tile(__local float4 *dst, const float4 *x, int lid) {
#pragma unroll
  for (int u = 0; u < RW4; ++u)
    if (lid + u * NTB < BJK * HD / 4) dst[lid + u * NTB] = x[u];
}

/* delta_i = rowsum(dO_i * O_i), stored at h * tq + (b's first row counted
 * over all sequences) + r. */
__kernel void attn_bwd_pre(__global const T *o, long oo, long4 os, __global const T *dout, long go,
                           long4 gs, __global float *delta, __global const int *cu_q, int nq_all,
                           int d, int tq) {
  const int r = get_global_id(0), h = get_global_id(1), b = get_global_id(2);
  const seq_info seq = seq_info_of(cu_q, NULL, b, nq_all, 0);
  if (r >= seq.nq) return;
  __global const T *op = HEAD_ROWS(o, oo, os, b, h, seq.q0 + r);
  __global const T *gp = HEAD_ROWS(dout, go, gs, b, h, seq.q0 + r);
  float acc = 0.0f;
  for (int c = 0; c < d; ++c)
    acc = fma(LOAD(op, c * os.s3), LOAD(gp, c * gs.s3), acc);
  delta[h * (long)tq + seq.qflat + r] = acc;
}

#define BWD_ARGS                                                                                   \
  __global const T *q, long qo, long4 qs, __global const T *k, long ko, long4 ks,                  \
      __global const T *v, long vo, long4 vs, __global const T *dout, long go, long4 gs,           \
      __global const float *lse, long lo_, long4 ls, __global const float *delta,                  \
      __global const int *cu_q, __global const int *cu_k, __global const float *alibi, int nq_all, \
      int nk_all, int group, int d, float scale, float softcap, int wl, int wr NAN_ARGS,           \
      int tq BIAS_ARGS

__kernel __attribute__((reqd_work_group_size(NTB, 1, 1))) void attn_bwd_dkdv(
    BWD_ARGS, __global T *dk, long dko, long4 dks, __global T *dv, long dvo, long4 dvs) {
  /* The chunks of S and dP, then P, dS and the Q and dO rows of the sums:
   * [P | dS | Q rows | dO rows]. */
  __local float4 tiles4[BMAX(CH4, KV4)];
  __local float lse_s[BQ], lo_s[BQ], delta_s[BQ];
  __local float *Ps = (__local float *)tiles4, *dSs = Ps + BQ * PKS;
  __local float4 *Qr4 = (__local float4 *)(dSs + BQ * PKS), *Gr4 = Qr4 + BJK * HD / 4;
  __local const float *Qr = (__local const float *)Qr4, *Gr = (__local const float *)Gr4;
  const row_stats st = {lse_s, lo_s, delta_s};

  const int lid = get_local_id(0), tx = lid % 16, ty = lid / 16;
  const int b = get_group_id(2), hk = get_group_id(1), j0 = get_group_id(0) * BK;
  const seq_info seq = seq_info_of(cu_q, cu_k, b, nq_all, nk_all);
  const int nq = seq.nq, nk = seq.nk;
  if (j0 >= nk) return; /* the whole group leaves: no barrier is skipped */

  /* The query rows that see some key of the block. */
  int ilo, ihi;
  query_block_range(j0, min(j0 + BK, nk), nq, nk, wl, wr, &ilo, &ihi);

  float dk_acc[BTK][BTD], dv_acc[BTK][BTD];
#pragma unroll
  for (int u = 0; u < BTK; ++u)
#pragma unroll
    for (int n = 0; n < BTD; ++n)
      dk_acc[u][n] = dv_acc[u][n] = 0.0f;

  /* The steps: each query head of the group, each block of rows; the
   * first chunk of a step's products is loaded during the step before. */
  const int ib0 = (ilo / BQ) * BQ, nib = ilo < ihi ? (ihi - ib0 + BQ - 1) / BQ : 0;
  const int steps = group * nib;
  chunk_regs next;
  tile_src t = tile_src_of(q, qo, qs, k, ko, ks, v, vo, vs, dout, go, gs, b, hk * group, hk, seq, d,
                           ib0, j0);
  if (steps) load_chunk(&next, &t, 0, lid % BDK, lid / BDK);
  for (int step = 0; step < steps; ++step) {
    const int h = hk * group + step / nib, i0 = t.i0;
    const float slope = alibi ? alibi[h] : 0.0f;
    BIAS_HEAD;
    const int hn = hk * group + (step + 1) / nib, inx = ib0 + (step + 1) % nib * BQ;
    const tile_src tn = step + 1 < steps ? tile_src_of(q, qo, qs, k, ko, ks, v, vo, vs, dout, go,
                                                       gs, b, hn, hk, seq, d, inx, j0)
                                         : t;
    float s[BTM][BTN], dp[BTM][BTN];
#if DBIAS
    float dr[BTM][BTN]; /* attn_bwd_dq's alone */
#endif
    barrier(CLK_LOCAL_MEM_FENCE); /* the last step's reads are done */
    stage_row_stats(lse_s, lo_s, delta_s, lse, lo_, ls, delta, b, h, seq, i0, tq, BQ, NTB, lid);
    tile_products(s, dp, tiles4, &t, &next, lid);
    /* The first rows of the sums, in flight during the exponentials. */
    float4 qreg[RW4], greg[RW4];
    load_row_tile(qreg, t.qp, qs, i0, nq, d, lid);
    load_row_tile(greg, t.gp, gs, i0, nq, d, lid);
    tile_p_ds(s, dp, st, &t, scale, softcap, slope, wl, wr, lid TILE_BIAS(bias_h) TILE_DR(dr));
#pragma unroll
    for (int i = 0; i < BTM; ++i)
#pragma unroll
      for (int n = 0; n < BTN; ++n) {
        Ps[(ty * BTM + i) * PKS + tx + 16 * n] = s[i][n];
        dSs[(ty * BTM + i) * PKS + tx + 16 * n] = dp[i][n];
      }

    /* dV += P^T dO, dK += dS^T Q, BJK rows at a time. */
    for (int ii = 0; ii < BQ && i0 + ii < nq; ii += BJK) {
      store_row_tile(Qr4, qreg, lid);
      store_row_tile(Gr4, greg, lid);
      barrier(CLK_LOCAL_MEM_FENCE);
      /* The next rows while there are more, the next step's first chunk on
       * the last pass: both loads every pass, the unwanted one reading
       * nothing (no rows, no columns), because PoCL 5.0's compiler aborts
       * (Kernel.cc:129, region_entry_barrier) on an if/else between these
       * barriers. A chunk of zeros left in `next` is overwritten on the
       * last pass, before the next step reads it. */
      {
        const int more = ii + BJK < BQ && i0 + ii + BJK < nq;
        tile_src tc = tn;
        tc.d = !more && step + 1 < steps ? tn.d : 0;
        load_row_tile(qreg, t.qp, qs, i0 + ii + BJK, more ? nq : 0, d, lid);
        load_row_tile(greg, t.gp, gs, i0 + ii + BJK, more ? nq : 0, d, lid);
        load_chunk(&next, &tc, 0, lid % BDK, lid / BDK);
      }
#pragma unroll
      for (int r = 0; r < BJK; ++r) {
        float pk[BTK], dsk[BTK], qc[BTD], gc[BTD];
        load_run(pk, Ps + (ii + r) * PKS + ty * BTK, BTK);
        load_run(dsk, dSs + (ii + r) * PKS + ty * BTK, BTK);
        load_cols(qc, Qr + r * HD, tx);
        load_cols(gc, Gr + r * HD, tx);
#pragma unroll
        for (int u = 0; u < BTK; ++u)
#pragma unroll
          for (int n = 0; n < BTD; ++n) {
            dv_acc[u][n] = fma(pk[u], gc[n], dv_acc[u][n]);
            dk_acc[u][n] = fma(dsk[u], qc[n], dk_acc[u][n]);
          }
      }
      barrier(CLK_LOCAL_MEM_FENCE);
    }
    t = tn;
  }

  __global T *dkp = HEAD_ROWS(dk, dko, dks, b, hk, seq.k0);
  __global T *dvp = HEAD_ROWS(dv, dvo, dvs, b, hk, seq.k0);
#pragma unroll
  for (int u = 0; u < BTK; ++u) {
    const int j = j0 + ty * BTK + u;
#pragma unroll
    for (int n = 0; n < BTD; ++n) {
      const int c = BCOL(tx, n);
      if (j < nk && c < d) {
        STORE(dkp, j * dks.s1 + c * dks.s3, dk_acc[u][n] * scale);
        STORE(dvp, j * dvs.s1 + c * dvs.s3, dv_acc[u][n]);
      }
    }
  }
}

/* PART_SLOT, a work-group's slot in DBIAS 2's partial buffer: common.cl. */

#if DBIAS
/* dbias[dbias_o + b s0 + h s1 + i s2 + j s3]; this launch's first sequence
 * and head (b0, h0); part, DBIAS 2's partial buffer: work-group (x, y, z)
 * of the launch owns the nk_all floats at PART_SLOT. */
#define DBIAS_ARGS \
  , __global float *dbias, long dbias_o, long4 dbias_s, int b0, int h0, __global float *part
#else
#define DBIAS_ARGS
#endif

__kernel __attribute__((reqd_work_group_size(NTB, 1, 1))) void attn_bwd_dq(BWD_ARGS, __global T *dq,
                                                                           long dqo,
                                                                           long4 dqs DBIAS_ARGS) {
  /* The chunks of S and dP, then dS^T (and dR^T) and the K rows of the sum:
   * [dS^T | (dR^T) | K rows]. */
  __local float4 tiles4[BMAX(CH4, DQ4)];
  __local float lse_s[BQ], lo_s[BQ], delta_s[BQ];
  __local float *dSt = (__local float *)tiles4;
#if DBIAS == 2
  __local float *dRt = dSt + BK * PQS;
  __local float4 *Kr4 = (__local float4 *)(dRt + BK * PQS);
#else
  __local float4 *Kr4 = (__local float4 *)(dSt + BK * PQS);
#endif
  __local const float *Kr = (__local const float *)Kr4;
  const row_stats st = {lse_s, lo_s, delta_s};

  const int lid = get_local_id(0), tx = lid % 16, ty = lid / 16;
  DQ_BLOCK(BQ);
  /* Read after the first step's barriers. */
  stage_row_stats(lse_s, lo_s, delta_s, lse, lo_, ls, delta, b, h, seq, i0, tq, BQ, NTB, lid);

  /* The keys some row of the block sees. */
  int lo, hi;
  key_block_range(i0, min(i0 + BQ, nq), nq, nk, wl, wr, &lo, &hi);

  float dq_acc[BTM][BTD];
#pragma unroll
  for (int i = 0; i < BTM; ++i)
#pragma unroll
    for (int n = 0; n < BTD; ++n)
      dq_acc[i][n] = 0.0f;

  /* The first chunk of a step's products is loaded during the step before. */
  chunk_regs next;
  tile_src t = tile_src_of(q, qo, qs, k, ko, ks, v, vo, vs, dout, go, gs, b, h, hk, seq, d, i0,
                           (lo / BK) * BK);
  if (t.j0 < hi) load_chunk(&next, &t, 0, lid % BDK, lid / BDK);
  for (int j0 = (lo / BK) * BK; j0 < hi; j0 += BK) {
    t.j0 = j0;
    float s[BTM][BTN], dp[BTM][BTN];
#if DBIAS
    float dr[BTM][BTN];
#endif
    barrier(CLK_LOCAL_MEM_FENCE); /* the last step's reads are done */
    tile_products(s, dp, tiles4, &t, &next, lid);
    float4 kreg[RW4];
    load_row_tile(kreg, t.kp, ks, j0, nk, d, lid);
    tile_p_ds(s, dp, st, &t, scale, softcap, slope, wl, wr, lid TILE_BIAS(bias_h) TILE_DR(dr));
#pragma unroll
    for (int i = 0; i < BTM; ++i)
#pragma unroll
      for (int n = 0; n < BTN; ++n) {
        const int ri = ty * BTM + i, kj = tx + 16 * n;
        dSt[kj * PQS + ri] = dp[i][n];
#if DBIAS == 1
        /* The launch's only adder of this element. */
        if (i0 + ri < nq && j0 + kj < nk)
          dbp[(i0 + ri) * dbias_s.s2 + (j0 + kj) * dbias_s.s3] += dr[i][n];
#elif DBIAS == 2
        dRt[kj * PQS + ri] = dr[i][n];
#endif
      }
#if DBIAS == 2
    /* The block's rows summed in order, into the work-group's own slot. */
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int kj = lid; kj < BK && j0 + kj < nk; kj += NTB) {
      float sum = 0.0f;
      for (int i = 0; i < BQ; ++i)
        sum += dRt[kj * PQS + i];
      dbp[j0 + kj] = sum;
    }
#endif

    /* dQ += dS K, BJK keys at a time. */
    for (int jj = 0; jj < BK && j0 + jj < nk; jj += BJK) {
      store_row_tile(Kr4, kreg, lid);
      barrier(CLK_LOCAL_MEM_FENCE);
      /* As attn_bwd_dkdv's: the next keys, or on the last pass the next
       * block's first chunk, without an if/else between barriers. */
      {
        const int more = jj + BJK < BK && j0 + jj + BJK < nk;
        tile_src tn = t;
        tn.j0 = j0 + BK;
        tn.d = !more && j0 + BK < hi ? d : 0;
        load_row_tile(kreg, t.kp, ks, j0 + jj + BJK, more ? nk : 0, d, lid);
        load_chunk(&next, &tn, 0, lid % BDK, lid / BDK);
      }
#pragma unroll
      for (int r = 0; r < BJK; ++r) {
        float a[BTM], kc[BTD];
        load_run(a, dSt + (jj + r) * PQS + ty * BTM, BTM);
        load_cols(kc, Kr + r * HD, tx);
#pragma unroll
        for (int i = 0; i < BTM; ++i)
#pragma unroll
          for (int n = 0; n < BTD; ++n)
            dq_acc[i][n] = fma(a[i], kc[n], dq_acc[i][n]);
      }
      barrier(CLK_LOCAL_MEM_FENCE);
    }
  }

  __global T *dqp = HEAD_ROWS(dq, dqo, dqs, b, h, seq.q0);
#pragma unroll
  for (int i = 0; i < BTM; ++i) {
    const int r = i0 + ty * BTM + i;
#pragma unroll
    for (int n = 0; n < BTD; ++n) {
      const int c = BCOL(tx, n);
      if (r < nq && c < d) STORE(dqp, r * dqs.s1 + c * dqs.s3, dq_acc[i][n] * scale);
    }
  }
}

/* Zeroes a float tensor of shape (n0, n1, n2, n3) and strides s from p + o:
 * item (x, y, z) takes elements 4 x .. 4 x + 3 of rows y, y + the grid's
 * height, .. of (z / n1, z % n1), z, z + the grid's depth, .., as one float4
 * where they are contiguous and aligned. A work-item an element left the
 * GPU dispatching work-groups (millions of them for one dbias) rather than
 * writing; the strides over the grid keep it within the 65535 groups a
 * dimension NVIDIA's OpenCL takes. */
__kernel void attn_bwd_zero(__global float *p, long o, long4 s, int n0, int n1, int n2, int n3) {
  const int x = 4 * get_global_id(0);
  if (x >= n3) return;
  for (long z = get_global_id(2); z < (long)n0 * n1; z += get_global_size(2)) {
    __global float *row = p + o + (z / n1) * s.s0 + (z % n1) * s.s1 + x * s.s3;
    for (int y = get_global_id(1); y < n2; y += get_global_size(1)) {
      __global float *at = row + y * s.s2;
      if (s.s3 == 1 && x + 4 <= n3 && ((ulong)at & 15u) == 0u) {
        *(__global float4 *)at = (float4)(0.0f);
      } else {
        for (int u = 0; u < 4 && x + u < n3; ++u)
          at[u * s.s3] = 0.0f;
      }
    }
  }
}

#if DBIAS == 2
/* After a launch of attn_bwd_dq with the grid (nqb, ny, nz) and first
 * sequence and head (b0, h0): dbias (b0 + z, h0 + y, 0, j) += the sum of
 * the launch's slots of (y, z) over the query blocks, in order. Item
 * (j, y, z). */
__kernel void attn_bwd_dbias_sum(__global const float *part, int nqb, int nk_all, int b0, int h0,
                                 __global float *dbias, long dbias_o, long4 dbias_s) {
  const int j = get_global_id(0), y = get_global_id(1), z = get_global_id(2);
  if (j >= nk_all) return;
  const int ny = get_global_size(1);
  float sum = 0.0f;
  for (int qb = 0; qb < nqb; ++qb)
    sum += part[PART_SLOT(qb, y, z, nqb, ny) + j];
  dbias[dbias_o + (b0 + z) * dbias_s.s0 + (h0 + y) * dbias_s.s1 + j * dbias_s.s3] += sum;
}
#endif

#if HAS_SINKS
#define NTS 64 /* work-items summing one head's dsinks */

/* dsinks[h] = the sum over every row of sink_grad(sink, lse, delta): item
 * lid takes rows lid, lid + NTS, .. of each sequence in order, then the
 * items' sums are added in a fixed tree. One work-group per head. */
__kernel __attribute__((reqd_work_group_size(NTS, 1, 1))) void attn_bwd_dsinks(
    __global const float *lse, long lo_, long4 ls, __global const float *delta,
    __global const int *cu_q, int nq_all, int batch, int tq, __global const float *sinks,
    long sinks_o, long sinks_sh, __global float *dsinks, long dsinks_o, long dsinks_sh) {
  __local float red[NTS];
  const int lid = get_local_id(0), h = get_group_id(1);
  const float sink = sinks[sinks_o + h * sinks_sh];
  float acc = 0.0f;
  for (int b = 0; b < batch; ++b) {
    const seq_info seq = seq_info_of(cu_q, NULL, b, nq_all, 0);
    for (int r = lid; r < seq.nq; r += NTS) {
      __global const float *lp = HEAD_ROWS(lse, lo_, ls, b, h, seq.q0 + r);
      acc += sink_grad(sink, lp[0], delta[h * (long)tq + seq.qflat + r]);
    }
  }
  red[lid] = acc;
  for (int w = NTS / 2; w > 0; w /= 2) {
    barrier(CLK_LOCAL_MEM_FENCE);
    if (lid < w) red[lid] += red[lid + w];
  }
  if (lid == 0) dsinks[dsinks_o + h * dsinks_sh] = red[0];
}
#endif
