/*
 * Backward pass shaped for CPU devices (PoCL), beside fwd_rows.cl: the
 * kernels of bwd.cl's dK/dV and dQ steps with one work-item per work-group,
 * run after bwd.cl's attn_bwd_pre (delta_i = rowsum(dO_i * O_i)):
 *   attn_bwd_dkdv_rows  one item per chunk of key blocks (KB keys each) of one
 *                       key/value head: for each block, each query head
 *                       sharing it and each block of RB query rows that can
 *                       see the keys, recompute P = exp(S - lse) and
 *                       dS = P (dP - delta), dP = dO V^T, then dV += P^T dO,
 *                       dK += dS^T Q (scaled at the end), and, without
 *                       dbias, the chunk's part of dQ += dS K
 *   attn_bwd_dq_parts   dQ, the parts summed in chunk order
 *   attn_bwd_dq_rows    with dbias (chunks of one key block): one item per
 *                       block of RB query rows, the same P and dS for each
 *                       tile of KB keys, dQ += dS K, and dbias as bwd.cl's
 *                       attn_bwd_dq adds it (DBIAS 1 and 2)
 * As in bwd.cl, each output element is owned by one work-item and summed in
 * a fixed order, without atomics. dQ in parts takes 5 products a tile where
 * dQ's own kernel repeats S and dP (7); a part per chunk of keys rather than
 * per key block keeps the parts' memory within cl/plan.c's bound.
 *
 * Why this shape: as for fwd_rows.cl, PoCL runs a work-group as loops over
 * its items between barriers and vectorizes across items, so bwd.cl's
 * 128-item groups spend their time in those loops and in local-memory
 * copies; a single item keeps its operands in the CPU's caches and its
 * float8s in SIMD registers. S and dP are register blocks of 4 x 16 over
 * an operand staged transposed, 8 to a float8, once a work-item: K^T and
 * V^T of the key block in dK/dV, Q^T and dO^T of the row block in dQ (which
 * computes S^T and dP^T, so that its key tiles serve as loaded). The
 * products' order makes S bit-identical to the forward's either way
 * (exp(S - lse) amplifies any difference where the logits are large); the
 * sums over rows (dV, dK) and over keys (dQ) are blocks of 2 rows x 4
 * vectors (VW floats each) of columns.
 *
 * The -D parameters (cl/plan.c's tiles table, CPU class): RB, KB and VW as
 * fwd_rows.cl takes them.
 */
/* RB and KB, the products S = Q K^T and S^T = K Q^T (rows_dot_keys,
 * keys_dot_rows) and the sums of products (sum_products): common.cl. */
#ifndef DBIAS
#define DBIAS 0 /* dbias: 0 none, 1 added tile by tile, 2 through row-block sums */
#endif
#define KG (KB / 8) /* float8s of keys in a row of K^T */

/* The statistics of a block of rows: lse (hi, lo) and delta, lse -inf past
 * the sequence's end, which marks the row as passing no gradient; and the
 * keys each row sees, [klo, khi), and each 8 rows all see, [glo, ghi):
 * none for a row that passes no gradient. */
typedef struct rows_stats {
  float lse[RB], lo[RB], delta[RB];
  int klo[RB], khi[RB], glo[RB / 8], ghi[RB / 8];
} rows_stats;

inline void stage_stats(rows_stats *st, __global const float *lse, long lo_, long4 ls,
                        __global const float *delta, int b, int h, seq_info seq, int i0, int tq,
                        int wl, int wr) {
  for (int i = 0; i < RB; ++i) {
    const int r = i0 + i;
    st->klo[i] = st->khi[i] = 0;
    if (r < seq.nq) {
      __global const float *lp = HEAD_ROWS(lse, lo_, ls, b, h, seq.q0 + r);
      st->lse[i] = lp[0];
      st->lo[i] = ls.s3 ? lp[ls.s3] : 0.0f;
      st->delta[i] = delta[h * (long)tq + seq.qflat + r];
      if (st->lse[i] != -INFINITY)
        key_range(diag(r, seq.nq, seq.nk), seq.nk, wl, wr, &st->klo[i], &st->khi[i]);
    } else {
      st->lse[i] = -INFINITY;
      st->lo[i] = st->delta[i] = 0.0f;
    }
  }
  rows_common_keys(st->klo, st->khi, 8, st->glo, st->ghi);
}

#if HAS_BIAS
/* The bias at bias_h, read where it is needed (bt 0) or from the tile that
 * stage_bias_t staged at bt. */
#define ROWS_BIAS_PARAM , __global const uchar *bias, long bias_h, long4 bias_s, const float *bt
#define ROWS_BIAS(bh, t) , bias, (bh), bias_s, (t)
#else
#define ROWS_BIAS_PARAM
#define ROWS_BIAS(bh, t)
#endif
#if DBIAS
/* dS before softcap's derivative, the bias's gradient. */
#define ROWS_DR_PARAM , float *dr
#define ROWS_DR(x) , (x)
#else
#define ROWS_DR_PARAM
#define ROWS_DR(x)
#endif

/* P and dS, in place over S in p and dP in ds, of rows i0.. (st) and keys
 * j0 .. j0 + kn, by bwd.cl's p_ds: p and ds [RB][KB], or with kt [KB][RB]
 * (S^T and dP^T). A run of 8 scores along the contiguous dimension whose
 * rows all see its keys, with no softcap or ALiBi, takes p_ds's whole case
 * on float8s; dr (DBIAS) gets dS before softcap's derivative. */
inline void p_ds_tile(const rows_stats *st, float *p, float *ds, int kt, int i0, int j0, int kn,
                      int nq, int nk, float scale, float softcap, float slope, int wl,
                      int wr ROWS_BIAS_PARAM ROWS_DR_PARAM) {
  /* S * scale rounded before lse is taken from it, as the forward and
   * bwd.cl round it: a fused multiply-subtract here would differ by the
   * rounding, which exp amplifies where the logits are large. */
#pragma OPENCL FP_CONTRACT OFF
  const int plain = softcap == 0.0f && slope == 0.0f;
  const int na = kt ? KB : RB, nb = kt ? RB : KB, di = kt ? 1 : 0, dj = kt ? 0 : 1;
  for (int a = 0; a < na; ++a)
    for (int c = 0; c < nb; c += 8) {
      const int i = kt ? c : a, j = kt ? a : c, jg = j0 + j, o = a * nb + c;
      /* The keys all of the run's rows see, and the rows' statistics. */
      const int rlo = kt ? st->glo[i / 8] : st->klo[i], rhi = kt ? st->ghi[i / 8] : st->khi[i];
      const int run = kt ? 1 : 8; /* keys in the run */
      if (plain && jg >= rlo && jg + run <= rhi && j + run <= kn) {
        const float8 li = kt ? vload8(0, &st->lse[i]) : (float8)(st->lse[i]);
        const float8 lo = kt ? vload8(0, &st->lo[i]) : (float8)(st->lo[i]);
        const float8 de = kt ? vload8(0, &st->delta[i]) : (float8)(st->delta[i]);
        float8 x = vload8(0, p + o) * scale;
#if HAS_BIAS
        x += bt ? vload8(0, bt + o)
                : load_any8(bias, BIAS_DTYPE, bias_h + (i0 + i) * bias_s.s2 + jg * bias_s.s3,
                            kt ? bias_s.s2 : bias_s.s3);
#endif
        const float8 pp = EXP_FROM(x - li, lo);
        const float8 dd = pp * (vload8(0, ds + o) - de);
        vstore8(pp, 0, p + o);
        vstore8(dd, 0, ds + o);
#if DBIAS
        vstore8(dd, 0, dr + o);
#endif
        continue;
      }
      for (int e = 0; e < 8; ++e) {
        const int ie = i + e * di, je = j + e * dj, r = i0 + ie;
        float de_ = 0.0f, dre = 0.0f;
        p[o + e] =
            je < kn ? p_ds(p[o + e], ds[o + e], r, j0 + je, nq, nk, st->lse[ie], st->lo[ie],
                           st->delta[ie], scale, softcap, slope, wl, wr, 0, &de_,
                           &dre P_DS_BIAS(bt ? bt[o + e]
                                             : bias_at(bias, bias_h, bias_s, r, j0 + je, nq, nk)))
                    : 0.0f;
        ds[o + e] = de_;
#if DBIAS
        dr[o + e] = dre;
#endif
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

/* dK and dV of chunk_blocks key blocks from block chunk_blocks *
 * group_id(0) on, one after another; with dq_part, dQ's part from those
 * keys too (dS K, unscaled, added into rows of HD floats at dq_part +
 * ((chunk * heads + h) * tq + row) * HD, zeroed before the launch), so that
 * S and dP are computed once rather than again by attn_bwd_dq_rows: the
 * parts are summed in chunk order by attn_bwd_dq_parts. */
__kernel __attribute__((reqd_work_group_size(1, 1, 1))) void attn_bwd_dkdv_rows(
    ROWS_BWD_ARGS, __global T *dk, long dko, long4 dks, __global T *dv, long dvo, long4 dvs,
    __global float *dq_part, int chunk_blocks) {
  const int b = get_group_id(2), hk = get_group_id(1), ch = get_group_id(0);
  const seq_info seq = seq_info_of(cu_q, cu_k, b, nq_all, nk_all);
  const int nq = seq.nq, nk = seq.nk;
  const int heads = get_num_groups(1) * group;
  float8 kt[HD][KG], vt[HD][KG], kr[KB][NV], qr[RB][NV], gr[RB][NV], dk_acc[KB][NV], dv_acc[KB][NV],
      dq_acc[RB][NV];
  float p[RB][KB], ds[RB][KB];
#if DBIAS
  float dr[RB][KB];
#endif
  rows_stats st;
  const int jend = min(nk, (ch + 1) * chunk_blocks * KB);
  __global const T *kp = HEAD_ROWS(k, ko, ks, b, hk, seq.k0);
  __global const T *vp = HEAD_ROWS(v, vo, vs, b, hk, seq.k0);
  for (int j0 = ch * chunk_blocks * KB; j0 < jend; j0 += KB) {
    const int kn = min(KB, nk - j0);
    stage_t(&kt[0][0], KG, kp, ks, j0, kn, d);
    stage_t(&vt[0][0], KG, vp, vs, j0, kn, d);
    if (dq_part) load_block(kr, KB, kp, ks, j0, kn, d);
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
      __global float *dqp =
          dq_part ? dq_part + (((long)ch * heads + h) * tq + seq.qflat) * HD : dq_part;
      for (int i0 = ilo; i0 < ihi; i0 += RB) {
        const int n = min(RB, nq - i0);
        load_block(qr, RB, qp, qs, i0, n, d);
        load_block(gr, RB, gp, gs, i0, n, d);
        stage_stats(&st, lse, lo_, ls, delta, b, h, seq, i0, tq, wl, wr);
        rows_dot_keys(p, (const float *)qr, kt, kn);
        rows_dot_keys(ds, (const float *)gr, vt, kn);
        p_ds_tile(&st, &p[0][0], &ds[0][0], 0, i0, j0, kn, nq, nk, scale, softcap, slope, wl,
                  wr ROWS_BIAS(bias_h, 0) ROWS_DR(&dr[0][0]));
        /* Keys rounded up to 2: p and ds are zero past kn. */
        sum_products(dv_acc, (kn + 1) & ~1, &p[0][0], 1, KB, gr, RB);
        sum_products(dk_acc, (kn + 1) & ~1, &ds[0][0], 1, KB, qr, RB);
        if (!dq_part) continue;
        /* dQ's part += dS K, keys in order. */
        for (int i = 0; i < RB; ++i)
          for (int c = 0; c < NV; ++c)
            dq_acc[i][c] = i < n ? vload8(c, dqp + (long)(i0 + i) * HD) : 0.0f;
        sum_products(dq_acc, RB, &ds[0][0], KB, 1, kr, kn);
        for (int i = 0; i < n; ++i)
          for (int c = 0; c < NV; ++c)
            vstore8(dq_acc[i][c], c, dqp + (long)(i0 + i) * HD);
      }
    }
    store_rows(HEAD_ROWS(dk, dko, dks, b, hk, seq.k0), dks, j0, kn, dk_acc, scale, d);
    store_rows(HEAD_ROWS(dv, dvo, dvs, b, hk, seq.k0), dvs, j0, kn, dv_acc, 1.0f, d);
  }
}

/* dQ from the parts of attn_bwd_dkdv_rows's nchunk chunks, summed in chunk
 * order and scaled: a work-item a row of a head. */
__kernel void attn_bwd_dq_parts(__global const float *dq_part, int nchunk, __global const int *cu_q,
                                int nq_all, int tq, int d, float scale, __global T *dq, long dqo,
                                long4 dqs) {
  const int r = get_global_id(0), h = get_group_id(1), b = get_group_id(2);
  const seq_info seq = seq_info_of(cu_q, cu_q, b, nq_all, nq_all);
  if (r >= seq.nq) return;
  const int heads = get_num_groups(1);
  __global T *op = HEAD_ROWS(dq, dqo, dqs, b, h, seq.q0);
  for (int c = 0; c < d; ++c) {
    float x = 0.0f;
    for (int ch = 0; ch < nchunk; ++ch)
      x += dq_part[(((long)ch * heads + h) * tq + seq.qflat + r) * HD + c];
    STORE(op, r * dqs.s1 + c * dqs.s3, x * scale);
  }
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
  /* S^T = K Q^T and dP^T = V dO^T over Q^T and dO^T staged once: the key
   * tiles' rows serve as they are, and K's rows are dQ's operand too. */
  float8 qt[HD][RB / 8], gt[HD][RB / 8], kr[KB][NV], vr[KB][NV], dq_acc[RB][NV];
  float p[KB][RB], ds[KB][RB];
#if DBIAS
  float dr[KB][RB];
#endif
  rows_stats st;
  const int n = min(RB, nq - i0);
  stage_t(&qt[0][0], RB / 8, HEAD_ROWS(q, qo, qs, b, h, seq.q0), qs, i0, n, d);
  stage_t(&gt[0][0], RB / 8, HEAD_ROWS(dout, go, gs, b, h, seq.q0), gs, i0, n, d);
  stage_stats(&st, lse, lo_, ls, delta, b, h, seq, i0, tq, wl, wr);
  for (int i = 0; i < RB; ++i)
    for (int c = 0; c < NV; ++c)
      dq_acc[i][c] = 0.0f;

  /* The keys some row of the block sees. */
  int lo, hi;
  key_block_range(i0, min(i0 + RB, nq), nq, nk, wl, wr, &lo, &hi);
  for (int j0 = lo; j0 < hi; j0 += KB) {
    const int kn = min(KB, nk - j0);
    load_block(kr, KB, kp, ks, j0, kn, d);
    load_block(vr, KB, vp, vs, j0, kn, d);
    keys_dot_rows(p, (const float *)kr, qt, kn);
    keys_dot_rows(ds, (const float *)vr, gt, kn);
#if HAS_BIAS
    float bt[KB][RB];
    stage_bias_t(bt, bias, bias_h, bias_s, i0, nq, j0, j0 + kn);
    prefetch_bias_t(bias, bias_h, bias_s, i0, nq, j0 + KB, min(hi, nk));
#endif
    p_ds_tile(&st, &p[0][0], &ds[0][0], 1, i0, j0, kn, nq, nk, scale, softcap, slope, wl,
              wr ROWS_BIAS(bias_h, &bt[0][0]) ROWS_DR(&dr[0][0]));
#if DBIAS == 1
    /* The launch's only adder of these elements. */
    for (int i = 0; i < RB && i0 + i < nq; ++i)
      for (int j = 0; j < kn; ++j)
        dbp[(i0 + i) * dbias_s.s2 + (j0 + j) * dbias_s.s3] += dr[j][i];
#elif DBIAS == 2
    /* The block's rows summed in order, into the work-item's own slot. */
    for (int j = 0; j < kn; ++j) {
      float sum = 0.0f;
      for (int i = 0; i < RB; ++i)
        sum += dr[j][i];
      dbp[j0 + j] = sum;
    }
#endif
    /* dQ += dS K, keys in order. */
    sum_products(dq_acc, RB, &ds[0][0], 1, RB, kr, kn);
  }
  store_rows(HEAD_ROWS(dq, dqo, dqs, b, h, seq.q0), dqs, i0, min(RB, nq - i0), dq_acc, scale, d);
}
