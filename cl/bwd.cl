/*
 * Backward pass after FlashAttention-2, in three kernels:
 *   attn_bwd_pre   delta_i = rowsum(dO_i * O_i) (the paper's D_i)
 *   attn_bwd_dkdv  one work-group per block of BB keys of one key/value head:
 *                  for each query head sharing it and each block of BB query
 *                  rows that can see the keys, recompute P = exp(S - lse) and
 *                  dS = P (dP - delta) with dP = dO V^T, then
 *                  dV += P^T dO, dK += dS^T Q (scaled at the end)
 *   attn_bwd_dq    one work-group per block of BB query rows: the same P and
 *                  dS for each key block, dQ += dS K
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
 * All four operand tiles of a step (Q, dO, K, V: BB x HD) sit in local memory
 * with a row stride of HD + 4: rows stay float4-aligned, and the float4s that
 * neighbouring work-items read from neighbouring rows fall in distinct banks.
 * The tiles are square, Br = Bc = BB, a -D parameter that the host sizes
 * to the device's local memory (cl/plan.c).
 *
 * Work-items keep one operand row in registers across several products:
 * in P/dS an item owns key j and rows i, i + NTB/BB, ... so each K and V
 * float4 is read once for PP rows; in the dK/dV and dQ sums (when HD divides
 * NTB) an item owns one column c of several rows, so each dO, Q or K word is
 * read once for EB outputs.
 */
#ifndef HD
#define HD 64 /* the head dimension rounded up: 32, 64, then a multiple of 32 */
#endif
#ifndef BB
#define BB 32 /* Br = Bc: query rows and keys per tile, with BB * HD a multiple of NTB */
#endif

#ifndef DBIAS
#define DBIAS 0 /* dbias: 0 none, 1 added tile by tile, 2 through row-block sums */
#endif

#define NTB 128
#define DS (HD + 4)
#define PP ((BB * BB + NTB - 1) / NTB) /* (i, j) pairs per work-item */
#define IS (NTB / BB)                  /* rows between an item's pairs */
#define SS (BB + 1)
#define EB (BB * HD / NTB) /* output elements per work-item */

/* Stages BB rows of a [.., HD] operand as f32, zero-filled past n rows or d
 * columns so that padding contributes nothing. */
inline void stage_rows(__local float *dst, __global const T *src, long ss, long sd, int row0, int n,
                       int d, int lid) {
  for (int e = lid; e < BB * HD; e += NTB) {
    int r = e / HD, c = e % HD;
    float x = 0.0f;
    if (row0 + r < n && c < d) x = LOAD(src, (row0 + r) * ss + c * sd);
    dst[r * DS + c] = x;
  }
}

/* P and dS for query rows i0.. and keys j0.. of one sequence. */
#if HAS_BIAS
/* The bias rows of one (sequence, head): element (i, j) at bias_bh + i s2 +
 * j s3. */
#define TILE_BIAS_PARAM , __global const uchar *bias, long bias_bh, long4 bias_s
#define TILE_BIAS(bh) , bias, (bh), bias_s
#else
#define TILE_BIAS_PARAM
#define TILE_BIAS(bh)
#endif
#if DBIAS
/* dS before softcap's derivative, the bias's gradient. */
#define TILE_DR_PARAM , __local float *dRs
#define TILE_DR , dRs
#else
#define TILE_DR_PARAM
#define TILE_DR
#endif

inline void tile_p_ds(__local const float4 *Qs4, __local const float4 *dOs4,
                      __local const float4 *Ks4, __local const float4 *Vs4,
                      __local const float *lse_s, __local const float *lo_s,
                      __local const float *delta_s, __local float *Ps, __local float *dSs, int i0,
                      int j0, int nq, int nk, int d, float scale, float softcap, float slope,
                      int wl, int wr, int lid TILE_BIAS_PARAM TILE_DR_PARAM) {
  const int j = lid % BB, ib = lid / BB;
  float sq[PP], dp[PP];
#pragma unroll
  for (int k = 0; k < PP; ++k)
    sq[k] = dp[k] = 0.0f;
  /* Columns past d are zero in every tile, so whole float4s are safe. */
  for (int c4 = 0; c4 < (d + 3) / 4; ++c4) {
    const float4 kv = Ks4[j * (DS / 4) + c4], vv = Vs4[j * (DS / 4) + c4];
#pragma unroll
    for (int k = 0; k < PP; ++k) {
      const int i = min(ib + k * IS, BB - 1); /* BB*BB < NTB leaves items spare */
      const float4 qv = Qs4[i * (DS / 4) + c4], gv = dOs4[i * (DS / 4) + c4];
      /* Column by column, in the forward pass's order: S must come out
       * bit-identical to the forward's, or exp(S - lse) amplifies the
       * difference when the logits are large. */
      sq[k] = fma(qv.s0, kv.s0, sq[k]);
      sq[k] = fma(qv.s1, kv.s1, sq[k]);
      sq[k] = fma(qv.s2, kv.s2, sq[k]);
      sq[k] = fma(qv.s3, kv.s3, sq[k]);
      dp[k] = fma(gv.s0, vv.s0, dp[k]);
      dp[k] = fma(gv.s1, vv.s1, dp[k]);
      dp[k] = fma(gv.s2, vv.s2, dp[k]);
      dp[k] = fma(gv.s3, vv.s3, dp[k]);
    }
  }
#pragma unroll
  for (int k = 0; k < PP; ++k) {
    const int i = ib + k * IS;
    if (i < BB) {
      const int r = i0 + i, kj = j0 + j, dg = diag(r, nq, nk);
      const float li = lse_s[i];
      float p = 0.0f, ds = 0.0f, dr = 0.0f;
      if (r < nq && kj < nk && key_visible(dg, kj, wl, wr) && li != -INFINITY) {
        float t;
#if HAS_BIAS
        const float x = score(sq[k], scale, softcap, slope, dg - kj, &t) +
                        load_any(bias, BIAS_DTYPE, bias_bh + r * bias_s.s2 + kj * bias_s.s3);
#else
        const float x = score(sq[k], scale, softcap, slope, dg - kj, &t);
#endif
        p = exp((x - li) - lo_s[i]); /* see lse_split */
        dr = p * (dp[k] - delta_s[i]);
        ds = score_grad(dr, t, softcap);
      }
      Ps[i * SS + j] = p;
      dSs[i * SS + j] = ds;
#if DBIAS
      dRs[i * SS + j] = dr;
#endif
    }
  }
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

/* lse (hi, and lo where ls.s3 > 0) and delta for rows i0.. of head h; -inf
 * past the sequence's end, which marks the row as passing no gradient. */
inline void stage_row_stats(__local float *lse_s, __local float *lo_s, __local float *delta_s,
                            __global const float *lse, long lo_, long4 ls,
                            __global const float *delta, int b, int h, seq_info seq, int i0, int tq,
                            int lid) {
  for (int i = lid; i < BB; i += NTB) {
    const int r = i0 + i;
    __global const float *lp = HEAD_ROWS(lse, lo_, ls, b, h, seq.q0 + r);
    lse_s[i] = r < seq.nq ? lp[0] : -INFINITY;
    lo_s[i] = r < seq.nq && ls.s3 ? lp[ls.s3] : 0.0f;
    delta_s[i] = r < seq.nq ? delta[h * (long)tq + seq.qflat + r] : 0.0f;
  }
}

#define BWD_ARGS                                                                                   \
  __global const T *q, long qo, long4 qs, __global const T *k, long ko, long4 ks,                  \
      __global const T *v, long vo, long4 vs, __global const T *dout, long go, long4 gs,           \
      __global const float *lse, long lo_, long4 ls, __global const float *delta,                  \
      __global const int *cu_q, __global const int *cu_k, __global const float *alibi, int nq_all, \
      int nk_all, int group, int d, float scale, float softcap, int wl, int wr, int tq BIAS_ARGS

/* A step's local memory: the Q, dO, K and V tiles (float4 rows for
 * tile_p_ds, float words for the sums), P and dS, and the rows' stats. */
#define BWD_TILES                                                                         \
  __local float4 Qs4[BB * DS / 4], dOs4[BB * DS / 4], Ks4[BB * DS / 4], Vs4[BB * DS / 4]; \
  __local float *Qs = (__local float *)Qs4, *dOs = (__local float *)dOs4;                 \
  __local float *Ks = (__local float *)Ks4, *Vs = (__local float *)Vs4;                   \
  __local float Ps[BB * SS], dSs[BB * SS], lse_s[BB], lo_s[BB], delta_s[BB] BWD_DR_TILE

#if DBIAS
#define BWD_DR_TILE , dRs[BB * SS]
#else
#define BWD_DR_TILE
#endif

__kernel __attribute__((reqd_work_group_size(NTB, 1, 1))) void attn_bwd_dkdv(
    BWD_ARGS, __global T *dk, long dko, long4 dks, __global T *dv, long dvo, long4 dvs) {
  BWD_TILES;
  const int lid = get_local_id(0);
  const int b = get_group_id(2), hk = get_group_id(1), j0 = get_group_id(0) * BB;
  const seq_info seq = seq_info_of(cu_q, cu_k, b, nq_all, nk_all);
  const int nq = seq.nq, nk = seq.nk;
  if (j0 >= nk) return;
  __global const T *kp = HEAD_ROWS(k, ko, ks, b, hk, seq.k0);
  __global const T *vp = HEAD_ROWS(v, vo, vs, b, hk, seq.k0);
  stage_rows(Ks, kp, ks.s1, ks.s3, j0, nk, d, lid);
  stage_rows(Vs, vp, vs.s1, vs.s3, j0, nk, d, lid);

  /* The query rows that see some key of the block. */
  int ilo, ihi;
  query_block_range(j0, min(j0 + BB, nk), nq, nk, wl, wr, &ilo, &ihi);

  float dk_acc[EB], dv_acc[EB];
#pragma unroll
  for (int u = 0; u < EB; ++u)
    dk_acc[u] = dv_acc[u] = 0.0f;

  for (int hh = 0; hh < group; ++hh) {
    const int h = hk * group + hh;
    const float slope = alibi ? alibi[h] : 0.0f;
#if HAS_BIAS
    const long bias_bh = bias_o + b * bias_s.s0 + h * bias_s.s1;
#endif
    __global const T *qp = HEAD_ROWS(q, qo, qs, b, h, seq.q0);
    __global const T *gp = HEAD_ROWS(dout, go, gs, b, h, seq.q0);
    for (int i0 = (ilo / BB) * BB; i0 < ihi; i0 += BB) {
      barrier(CLK_LOCAL_MEM_FENCE); /* the last step's reads are done */
      stage_rows(Qs, qp, qs.s1, qs.s3, i0, nq, d, lid);
      stage_rows(dOs, gp, gs.s1, gs.s3, i0, nq, d, lid);
      stage_row_stats(lse_s, lo_s, delta_s, lse, lo_, ls, delta, b, h, seq, i0, tq, lid);
      barrier(CLK_LOCAL_MEM_FENCE);
      tile_p_ds(Qs4, dOs4, Ks4, Vs4, lse_s, lo_s, delta_s, Ps, dSs, i0, j0, nq, nk, d, scale,
                softcap, slope, wl, wr, lid TILE_BIAS(bias_bh) TILE_DR);
      barrier(CLK_LOCAL_MEM_FENCE);
#if NTB % HD == 0
      /* Item owns column lid % HD of keys lid / HD + u * NTB / HD. */
      for (int i = 0; i < BB; ++i) {
        const float g = dOs[i * DS + lid % HD], qq = Qs[i * DS + lid % HD];
#pragma unroll
        for (int u = 0; u < EB; ++u) {
          const int j = lid / HD + u * (NTB / HD);
          dv_acc[u] = fma(Ps[i * SS + j], g, dv_acc[u]);
          dk_acc[u] = fma(dSs[i * SS + j], qq, dk_acc[u]);
        }
      }
#else
#pragma unroll
      for (int u = 0; u < EB; ++u) {
        const int e = lid + u * NTB, j = e / HD, c = e % HD;
        float a = dv_acc[u], g = dk_acc[u];
        for (int i = 0; i < BB; ++i) {
          a = fma(Ps[i * SS + j], dOs[i * DS + c], a);
          g = fma(dSs[i * SS + j], Qs[i * DS + c], g);
        }
        dv_acc[u] = a;
        dk_acc[u] = g;
      }
#endif
    }
  }

  __global T *dkp = HEAD_ROWS(dk, dko, dks, b, hk, seq.k0);
  __global T *dvp = HEAD_ROWS(dv, dvo, dvs, b, hk, seq.k0);
#pragma unroll
  for (int u = 0; u < EB; ++u) {
    const int e = lid + u * NTB, j = e / HD, c = e % HD;
    if (j0 + j < nk && c < d) {
      STORE(dkp, (j0 + j) * dks.s1 + c * dks.s3, dk_acc[u] * scale);
      STORE(dvp, (j0 + j) * dvs.s1 + c * dvs.s3, dv_acc[u]);
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
  BWD_TILES;
  const int lid = get_local_id(0);
#if DBIAS
  const int b = get_group_id(2) + b0, h = get_group_id(1) + h0, i0 = get_group_id(0) * BB;
#else
  const int b = get_group_id(2), h = get_group_id(1), i0 = get_group_id(0) * BB;
#endif
  const seq_info seq = seq_info_of(cu_q, cu_k, b, nq_all, nk_all);
  const int nq = seq.nq, nk = seq.nk;
  if (i0 >= nq) return;
  const int hk = h / group;
  const float slope = alibi ? alibi[h] : 0.0f;
  __global const T *qp = HEAD_ROWS(q, qo, qs, b, h, seq.q0);
  __global const T *gp = HEAD_ROWS(dout, go, gs, b, h, seq.q0);
  __global const T *kp = HEAD_ROWS(k, ko, ks, b, hk, seq.k0);
  __global const T *vp = HEAD_ROWS(v, vo, vs, b, hk, seq.k0);
#if HAS_BIAS
  const long bias_bh = bias_o + b * bias_s.s0 + h * bias_s.s1;
#endif
#if DBIAS == 1
  __global float *dbp = dbias + dbias_o + b * dbias_s.s0 + h * dbias_s.s1;
#elif DBIAS == 2
  __global float *dbp = part + PART_SLOT(get_group_id(0), get_group_id(1), get_group_id(2),
                                         get_num_groups(0), get_num_groups(1));
#endif
  stage_rows(Qs, qp, qs.s1, qs.s3, i0, nq, d, lid);
  stage_rows(dOs, gp, gs.s1, gs.s3, i0, nq, d, lid);
  stage_row_stats(lse_s, lo_s, delta_s, lse, lo_, ls, delta, b, h, seq, i0, tq, lid);

  /* The keys some row of the block sees. */
  int lo, hi;
  key_block_range(i0, min(i0 + BB, nq), nq, nk, wl, wr, &lo, &hi);

  float dq_acc[EB];
#pragma unroll
  for (int u = 0; u < EB; ++u)
    dq_acc[u] = 0.0f;

  for (int j0 = (lo / BB) * BB; j0 < hi; j0 += BB) {
    barrier(CLK_LOCAL_MEM_FENCE);
    stage_rows(Ks, kp, ks.s1, ks.s3, j0, nk, d, lid);
    stage_rows(Vs, vp, vs.s1, vs.s3, j0, nk, d, lid);
    barrier(CLK_LOCAL_MEM_FENCE);
    tile_p_ds(Qs4, dOs4, Ks4, Vs4, lse_s, lo_s, delta_s, Ps, dSs, i0, j0, nq, nk, d, scale, softcap,
              slope, wl, wr, lid TILE_BIAS(bias_bh) TILE_DR);
    barrier(CLK_LOCAL_MEM_FENCE);
#if DBIAS == 1
    /* The launch's only adder of these elements. */
    for (int e = lid; e < BB * BB; e += NTB) {
      const int i = e / BB, j = e % BB;
      if (i0 + i < nq && j0 + j < nk)
        dbp[(i0 + i) * dbias_s.s2 + (j0 + j) * dbias_s.s3] += dRs[i * SS + j];
    }
#elif DBIAS == 2
    /* The block's rows summed in order, into the work-group's own slot. */
    if (lid < BB && j0 + lid < nk) {
      float sum = 0.0f;
      for (int i = 0; i < BB; ++i)
        sum += dRs[i * SS + lid];
      dbp[j0 + lid] = sum;
    }
#endif
#if NTB % HD == 0
    for (int j = 0; j < BB; ++j) {
      const float kk = Ks[j * DS + lid % HD];
#pragma unroll
      for (int u = 0; u < EB; ++u)
        dq_acc[u] = fma(dSs[(lid / HD + u * (NTB / HD)) * SS + j], kk, dq_acc[u]);
    }
#else
#pragma unroll
    for (int u = 0; u < EB; ++u) {
      const int e = lid + u * NTB, i = e / HD, c = e % HD;
      float a = dq_acc[u];
      for (int j = 0; j < BB; ++j)
        a = fma(dSs[i * SS + j], Ks[j * DS + c], a);
      dq_acc[u] = a;
    }
#endif
  }

  __global T *dqp = HEAD_ROWS(dq, dqo, dqs, b, h, seq.q0);
#pragma unroll
  for (int u = 0; u < EB; ++u) {
    const int e = lid + u * NTB, i = e / HD, c = e % HD;
    if (i0 + i < nq && c < d) STORE(dqp, (i0 + i) * dqs.s1 + c * dqs.s3, dq_acc[u] * scale);
  }
}

#if DBIAS
/* Zeroes a float tensor of shape (n0, n1, n2, n3) and strides s from p + o:
 * item (x, y, z) is element (z / n1, z % n1, y, x). */
__kernel void attn_bwd_zero(__global float *p, long o, long4 s, int n1, int n2, int n3) {
  const int x = get_global_id(0), y = get_global_id(1), z = get_global_id(2);
  if (x >= n3 || y >= n2) return;
  p[o + (z / n1) * s.s0 + (z % n1) * s.s1 + y * s.s2 + x * s.s3] = 0.0f;
}
#endif

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
