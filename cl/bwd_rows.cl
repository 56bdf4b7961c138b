/*
 * Backward pass shaped for CPU devices (PoCL), beside fwd_rows.cl: the
 * kernels of bwd.cl's dK/dV and dQ steps with one work-item per work-group,
 * run after bwd.cl's attn_bwd_pre (delta_i = rowsum(dO_i * O_i)):
 *   attn_bwd_dkdv_rows  one item per block of KB keys of one key/value head:
 *                       for each query head sharing it and each block of RB
 *                       query rows that can see the keys, recompute
 *                       P = exp(S - lse) and dS = P (dP - delta), dP = dO V^T,
 *                       then dV += P^T dO, dK += dS^T Q (scaled at the end)
 *   attn_bwd_dq_rows    one item per block of RB query rows: the same P and
 *                       dS for each tile of KB keys, dQ += dS K, and dbias
 *                       as bwd.cl's attn_bwd_dq adds it (DBIAS 1 and 2)
 * As in bwd.cl, each output element is owned by one work-item and summed in
 * a fixed order, without atomics.
 *
 * Why this shape: as for fwd_rows.cl, PoCL runs a work-group as loops over
 * its items between barriers and vectorizes across items, so bwd.cl's
 * 128-item groups spend their time in those loops and in local-memory
 * copies; a single item keeps its operands in the CPU's caches and its
 * float8s in SIMD registers. S and dP are register blocks of 4 rows x 16
 * keys over K^T and V^T staged 8 keys to a float8 (fwd_rows.cl's product,
 * so that S comes out bit-identical to the forward's: exp(S - lse)
 * amplifies any difference where the logits are large); the sums over rows
 * (dV, dK) and over keys (dQ) are blocks of 2 rows x 4 float8 columns.
 *
 * The -D parameters (cl/plan.c's tiles table, CPU class): RB, a multiple
 * of 8, and KB, a multiple of 16, as fwd_rows.cl takes them.
 */
/* RB and KB, the product S = Q K^T (rows_dot_keys) and the sums of products
 * (sum_products): common.cl. */
#ifndef DBIAS
#define DBIAS 0 /* dbias: 0 none, 1 added tile by tile, 2 through row-block sums */
#endif
#define KG (KB / 8) /* float8s of keys in a row of K^T */

/* Keys j0 .. j0 + kn of a [.., HD] operand transposed, 8 keys to a float8:
 * yt[c][g] holds column c of keys 8g .. 8g + 7, zero past kn. */
inline void stage_keys_t(float8 (*yt)[KG], __global const T *p, long4 s, int j0, int kn, int d) {
  for (int g = 0; g < KG; ++g) {
    float8 r[8][NV];
    for (int u = 0; u < 8; ++u) {
      if (8 * g + u < kn) {
        load_row(r[u], p + (j0 + 8 * g + u) * s.s1, s.s3, d);
      } else {
        for (int c = 0; c < NV; ++c)
          r[u][c] = 0.0f;
      }
    }
    for (int c = 0; c < NV; ++c) {
      float8 x[8], t[8];
      for (int u = 0; u < 8; ++u)
        x[u] = r[u][c];
      transpose8(t, x);
      for (int u = 0; u < 8; ++u)
        yt[8 * c + u][g] = t[u];
    }
  }
}

/* The rows' operands and statistics: Q and dO rows (zero past the
 * sequence), lse (hi, lo) and delta; lse -inf past the sequence's end, which
 * marks the row as passing no gradient. */
typedef struct rows_block {
  float8 q[RB][NV], g[RB][NV];
  float lse[RB], lo[RB], delta[RB];
} rows_block;

inline void stage_rows_block(rows_block *rb, __global const T *qp, long4 qs, __global const T *gp,
                             long4 gs, __global const float *lse, long lo_, long4 ls,
                             __global const float *delta, int b, int h, seq_info seq, int i0,
                             int tq, int d) {
  for (int i = 0; i < RB; ++i) {
    const int r = i0 + i;
    if (r < seq.nq) {
      load_row(rb->q[i], qp + r * qs.s1, qs.s3, d);
      load_row(rb->g[i], gp + r * gs.s1, gs.s3, d);
      __global const float *lp = HEAD_ROWS(lse, lo_, ls, b, h, seq.q0 + r);
      rb->lse[i] = lp[0];
      rb->lo[i] = ls.s3 ? lp[ls.s3] : 0.0f;
      rb->delta[i] = delta[h * (long)tq + seq.qflat + r];
    } else {
      for (int c = 0; c < NV; ++c)
        rb->q[i][c] = rb->g[i][c] = 0.0f;
      rb->lse[i] = -INFINITY;
      rb->lo[i] = rb->delta[i] = 0.0f;
    }
  }
}

#if HAS_BIAS
#define ROWS_BIAS_PARAM , __global const uchar *bias, long bias_h, long4 bias_s
#define ROWS_BIAS(bh) , bias, (bh), bias_s
#else
#define ROWS_BIAS_PARAM
#define ROWS_BIAS(bh)
#endif
#if DBIAS
/* dS before softcap's derivative, the bias's gradient. */
#define ROWS_DR_PARAM , float(*dr)[KB]
#define ROWS_DR(x) , (x)
#else
#define ROWS_DR_PARAM
#define ROWS_DR(x)
#endif

/* P into p and dS into ds for rows i0.. of rb and keys j0 .. j0 + kn of
 * kt/vt (K^T and V^T), by bwd.cl's p_ds. */
inline void rows_p_ds(const rows_block *rb, float8 (*kt)[KG], float8 (*vt)[KG], float (*p)[KB],
                      float (*ds)[KB], int i0, int j0, int kn, int nq, int nk, float scale,
                      float softcap, float slope, int wl, int wr ROWS_BIAS_PARAM ROWS_DR_PARAM) {
  /* S * scale rounded before lse is taken from it, as the forward and
   * bwd.cl round it: a fused multiply-subtract here would differ by the
   * rounding, which exp amplifies where the logits are large. */
#pragma OPENCL FP_CONTRACT OFF
  rows_dot_keys(p, (const float *)rb->q, kt, kn);
  rows_dot_keys(ds, (const float *)rb->g, vt, kn);
  /* No softcap or ALiBi: a run of 8 keys that a row sees whole needs only
   * the scale (and the bias, 8 keys a load), on float8s. */
  const int plain = softcap == 0.0f && slope == 0.0f;
  for (int i = 0; i < RB; ++i) {
    const int r = i0 + i, dg = diag(r, nq, nk);
    const float li = rb->lse[i], lo = rb->lo[i], de = rb->delta[i];
    int klo, khi;
    key_range(dg, nk, wl, wr, &klo, &khi);
    const int live = r < nq && li != -INFINITY;
    for (int j = 0; j < KB; j += 8) {
      const int jg = j0 + j;
      if (plain && live && jg >= klo && jg + 8 <= khi && j + 8 <= kn) {
        float8 x = vload8(0, &p[i][j]) * scale;
#if HAS_BIAS
        x += load_any8(bias, BIAS_DTYPE, bias_h + r * bias_s.s2 + jg * bias_s.s3, bias_s.s3);
#endif
        const float8 pp = EXP_FROM(x - li, lo);
        const float8 dd = pp * (vload8(0, &ds[i][j]) - de);
        vstore8(pp, 0, &p[i][j]);
        vstore8(dd, 0, &ds[i][j]);
#if DBIAS
        vstore8(dd, 0, &dr[i][j]);
#endif
        continue;
      }
      for (int e = 0; e < 8; ++e) {
        float de_ = 0.0f, dre = 0.0f;
        p[i][j + e] = j + e < kn
                          ? p_ds(p[i][j + e], ds[i][j + e], r, jg + e, nq, nk, li, lo, de, scale,
                                 softcap, slope, wl, wr, 0, &de_,
                                 &dre P_DS_BIAS(bias_at(bias, bias_h, bias_s, r, jg + e, nq, nk)))
                          : 0.0f;
        ds[i][j + e] = de_;
#if DBIAS
        dr[i][j + e] = dre;
#endif
      }
    }
  }
}

/* n rows of acc (times f) into the first d columns of rows r0.. of p. */
inline void store_rows(__global T *p, long4 s, int r0, int n, float8 (*acc)[NV], float f, int d) {
  for (int i = 0; i < n; ++i)
    for (int c = 0; c < NV; ++c) {
      float x[8];
      vstore8(acc[i][c] * f, 0, x);
      for (int e = 0; e < 8 && c * 8 + e < d; ++e)
        STORE(p, (r0 + i) * s.s1 + (c * 8 + e) * s.s3, x[e]);
    }
}

#define ROWS_BWD_ARGS                                                                              \
  __global const T *q, long qo, long4 qs, __global const T *k, long ko, long4 ks,                  \
      __global const T *v, long vo, long4 vs, __global const T *dout, long go, long4 gs,           \
      __global const float *lse, long lo_, long4 ls, __global const float *delta,                  \
      __global const int *cu_q, __global const int *cu_k, __global const float *alibi, int nq_all, \
      int nk_all, int group, int d, float scale, float softcap, int wl, int wr, int tq BIAS_ARGS

__kernel __attribute__((reqd_work_group_size(1, 1, 1))) void attn_bwd_dkdv_rows(
    ROWS_BWD_ARGS, __global T *dk, long dko, long4 dks, __global T *dv, long dvo, long4 dvs) {
  const int b = get_group_id(2), hk = get_group_id(1), j0 = get_group_id(0) * KB;
  const seq_info seq = seq_info_of(cu_q, cu_k, b, nq_all, nk_all);
  const int nq = seq.nq, nk = seq.nk;
  if (j0 >= nk) return;
  const int kn = min(KB, nk - j0);
  float8 kt[HD][KG], vt[HD][KG], dk_acc[KB][NV], dv_acc[KB][NV];
  float p[RB][KB], ds[RB][KB];
#if DBIAS
  float dr[RB][KB];
#endif
  rows_block rb;
  stage_keys_t(kt, HEAD_ROWS(k, ko, ks, b, hk, seq.k0), ks, j0, kn, d);
  stage_keys_t(vt, HEAD_ROWS(v, vo, vs, b, hk, seq.k0), vs, j0, kn, d);
  for (int j = 0; j < KB; ++j)
    for (int c = 0; c < NV; ++c)
      dk_acc[j][c] = dv_acc[j][c] = 0.0f;

  /* The query rows that see some key of the block. */
  int ilo, ihi;
  query_block_range(j0, j0 + kn, nq, nk, wl, wr, &ilo, &ihi);
  for (int hh = 0; hh < group; ++hh) {
    const int h = hk * group + hh;
    const float slope = alibi ? alibi[h] : 0.0f;
    BIAS_HEAD;
    __global const T *qp = HEAD_ROWS(q, qo, qs, b, h, seq.q0);
    __global const T *gp = HEAD_ROWS(dout, go, gs, b, h, seq.q0);
    for (int i0 = ilo; i0 < ihi; i0 += RB) {
      stage_rows_block(&rb, qp, qs, gp, gs, lse, lo_, ls, delta, b, h, seq, i0, tq, d);
      rows_p_ds(&rb, kt, vt, p, ds, i0, j0, kn, nq, nk, scale, softcap, slope, wl,
                wr ROWS_BIAS(bias_h) ROWS_DR(dr));
      /* Keys rounded up to 2: p and ds are zero past kn. */
      sum_products(dv_acc, (kn + 1) & ~1, &p[0][0], 1, KB, rb.g, RB);
      sum_products(dk_acc, (kn + 1) & ~1, &ds[0][0], 1, KB, rb.q, RB);
    }
  }
  store_rows(HEAD_ROWS(dk, dko, dks, b, hk, seq.k0), dks, j0, kn, dk_acc, scale, d);
  store_rows(HEAD_ROWS(dv, dvo, dvs, b, hk, seq.k0), dvs, j0, kn, dv_acc, 1.0f, d);
}

#if DBIAS
/* As bwd.cl's attn_bwd_dq takes them. */
#define ROWS_DBIAS_ARGS \
  , __global float *dbias, long dbias_o, long4 dbias_s, int b0, int h0, __global float *part
#else
#define ROWS_DBIAS_ARGS
#endif

__kernel __attribute__((reqd_work_group_size(1, 1, 1))) void attn_bwd_dq_rows(
    ROWS_BWD_ARGS, __global T *dq, long dqo, long4 dqs ROWS_DBIAS_ARGS) {
  DQ_BLOCK(RB);
  __global const T *kp = HEAD_ROWS(k, ko, ks, b, hk, seq.k0);
  __global const T *vp = HEAD_ROWS(v, vo, vs, b, hk, seq.k0);
  float8 kt[HD][KG], vt[HD][KG], kr[KB][NV], dq_acc[RB][NV];
  float p[RB][KB], ds[RB][KB];
#if DBIAS
  float dr[RB][KB];
#endif
  rows_block rb;
  stage_rows_block(&rb, HEAD_ROWS(q, qo, qs, b, h, seq.q0), qs,
                   HEAD_ROWS(dout, go, gs, b, h, seq.q0), gs, lse, lo_, ls, delta, b, h, seq, i0,
                   tq, d);
  for (int i = 0; i < RB; ++i)
    for (int c = 0; c < NV; ++c)
      dq_acc[i][c] = 0.0f;

  /* The keys some row of the block sees. */
  int lo, hi;
  key_block_range(i0, min(i0 + RB, nq), nq, nk, wl, wr, &lo, &hi);
  for (int j0 = lo; j0 < hi; j0 += KB) {
    const int kn = min(KB, nk - j0);
    stage_keys_t(kt, kp, ks, j0, kn, d);
    stage_keys_t(vt, vp, vs, j0, kn, d);
    for (int j = 0; j < KB; ++j)
      if (j < kn) {
        load_row(kr[j], kp + (j0 + j) * ks.s1, ks.s3, d);
      } else {
        for (int c = 0; c < NV; ++c)
          kr[j][c] = 0.0f;
      }
    rows_p_ds(&rb, kt, vt, p, ds, i0, j0, kn, nq, nk, scale, softcap, slope, wl,
              wr ROWS_BIAS(bias_h) ROWS_DR(dr));
#if DBIAS == 1
    /* The launch's only adder of these elements. */
    for (int i = 0; i < RB && i0 + i < nq; ++i)
      for (int j = 0; j < kn; ++j)
        dbp[(i0 + i) * dbias_s.s2 + (j0 + j) * dbias_s.s3] += dr[i][j];
#elif DBIAS == 2
    /* The block's rows summed in order, into the work-item's own slot. */
    for (int j = 0; j < kn; ++j) {
      float sum = 0.0f;
      for (int i = 0; i < RB; ++i)
        sum += dr[i][j];
      dbp[j0 + j] = sum;
    }
#endif
    /* dQ += dS K, keys in order. */
    sum_products(dq_acc, RB, &ds[0][0], KB, 1, kr, kn);
  }
  store_rows(HEAD_ROWS(dq, dqo, dqs, b, h, seq.q0), dqs, i0, min(RB, nq - i0), dq_acc, scale, d);
}
