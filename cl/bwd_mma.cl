/*
 * The backward's dK/dV and dQ on NVIDIA's tensor cores (sm_80 and later),
 * in place of bwd.cl's attn_bwd_dkdv and attn_bwd_dq: the same arguments,
 * the same outputs (and dbias) by the same rules (common.cl, bwd.cl's
 * p_ds), after bwd.cl's attn_bwd_pre. Work-groups of 4 warps, 16 rows
 * (keys or query rows) a warp.
 *
 * attn_bwd_dkdv_mma: KR = 64 keys of one (sequence, key/value head), for
 * each query head of the group and each block of MQ query rows that sees
 * them (f32 above HD 64, WIDE_F32: KR = 32, each 16-key slab two warps',
 * each taking half of a block's rows, K's first half in registers, their
 * sums added at the end):
 *   S^T = K Q^T, dP^T = V dO^T   K's and V's A fragments read from local
 *                                memory (ldmatrix), Q and dO row-major
 *                                there as the B operand
 *   P^T, dS^T                    as below, a row per key
 *   dV += P^T dO, dK += dS^T Q   P^T and dS^T packed to 16 bits from the
 *                                accumulators, dO's and Q's fragments read
 *                                transposed; dK scaled at the end
 * K and V stay in local memory for the whole pass, so MQ is what fits
 * beside them and a block's bias tile (the plan's
 * attn__cl_mma_query_rows, -DMQ). Each S^T element is the forward's S
 * element: the same 16-element products summed k16 step by k16 step in the
 * same order, the operands' roles swapped (f32: the same three TF32
 * products a k8 step, the two small ones summed apart in swapped order,
 * which moves S by float32's rounding, not the split's).
 *
 * attn_bwd_dq_mma: BQ = 64 query rows of one (sequence, head), over key
 * blocks of MK = 32 (WIDE_F32: 8, one at a time, Q's and dO's last HD /
 * 2 columns kept in local memory, not registers):
 *   S = Q K^T, dP = dO V^T     Q's and dO's fragments held in registers, K
 *                              and V row-major in local memory, two blocks
 *                              of them: the next in flight (cp.async)
 *                              while this one's products run
 *   P = exp((S scale - lse_hi) - lse_lo), dS = P (dP - delta) (softcap's
 *                              derivative, bias, mask: the rules)
 *   dQ += dS K                 dS packed to 16 bits from the accumulators
 *                              (the A fragment's layout), K's fragments
 *                              read transposed (ldmatrix)
 * dbias: stored or added element by element (DBIAS 1), or the block's
 * rows summed per key into the work-group's slot (DBIAS 2), over the lanes
 * of a warp and then the warps, in a fixed order.
 *
 * A bias comes through local memory beside the operands, by cp.async
 * (bias_copy): dK/dV's block of MQ query rows with each block's Q and dO,
 * dQ's key block with its K and V (BIAS_STAGED; an f32 bias above HD 96
 * is loaded by each lane, a block at once): read element by element in
 * the score loop instead, each load's wait stands alone. The PTX and the
 * staging: mma.cl; the arguments: bwd.cl. HD at most 128; f32 as three
 * TF32 products a product, with fwd_mma.cl's f32 forward, whose lse these
 * scores must match.
 */
#define QR 64                  /* query rows per work-group (BQ) */
#define MK (WIDE_F32 ? 8 : 32) /* keys per block */
#define QST (HD + PAD)         /* Q, dO, K and V rows in local memory */
#define NDN (HD / 8)           /* 8-column tiles of dQ, dK, dV a warp holds */
#define NDK (HD / KSTEP)       /* k steps of Q K^T */
#define NSK (MK / 8)           /* 8-column tiles of S */
#define QUNITS ((WIDE_F32 ? 1 : 2) * QR * QST / UNIT)  /* Q and dO, 16-byte units */
#define GHST (HD / 2 + PAD)                            /* Qh's and Gh's rows (WIDE_F32) */
#define GHUNITS (WIDE_F32 ? 2 * QR * GHST / UNIT : 0)  /* Qh, Gh */
#define NSLOT (WIDE_F32 ? 1 : 2)                       /* K and V blocks in local memory */
#define KUNITS (GHUNITS + NSLOT * 2 * MK * QST / UNIT) /* Qh, Gh, then K and V */
#define BUNITS (QUNITS > KUNITS ? QUNITS : KUNITS)     /* they share the buffer */
#if WIDE_F32 && (3 * QR / 2 * GHST + QR / 2 * QST) / UNIT > BUNITS
#error "dQ: dO's second 32 rows are staged past Qh and Gh's first 32 rows"
#endif
#ifndef KR
#define KR (WIDE_F32 ? 32 : 64) /* keys per dK/dV work-group (the plan's -DKR) */
#endif
#ifndef MQ
#define MQ 16 /* query rows per dK/dV block */
#endif
#define NQT (MQ / 8)           /* 8-column tiles of S^T */
#define SLAB_WARPS (64 / KR)   /* dK/dV's warps a 16-key slab, each a share of the block's rows */
#define NQW (NQT / SLAB_WARPS) /* a warp's 8-column tiles of S^T */
#define KHST (HD / 2 + PAD)    /* Kh's rows (SLAB_WARPS 2) */
#if SLAB_WARPS > 1 && (2 * MQ < KR || NQT % SLAB_WARPS)
#error "dK/dV: K is staged through the Q and dO buffer, and a slab's rows shared by its warps"
#endif
#define KBST (KR + 8) /* dK/dV's bias rows in local memory: a block's MQ query rows of KR keys */
#define QBST (MK + 8) /* dQ's: QR query rows of MK keys, a slot a key block (BIAS_STAGED) */

__kernel __attribute__((reqd_work_group_size(MMA_ITEMS, 1, 1))) void attn_bwd_dkdv_mma(
    BWD_ARGS, __global T *dk, long dko, long4 dks, __global T *dv, long dvo, long4 dvs) {
  /* As attn_bwd_dq_mma: S * scale rounded before lse is taken from it. */
#pragma OPENCL FP_CONTRACT OFF
  /* K and V in local memory for the whole pass; with slabs shared by two
   * warps (SLAB_WARPS 2), V and K's last HD / 2 columns (Kh), K's first
   * HD / 2 in registers, K staged through the Q and dO buffer before the
   * first block. */
  __local uint4 kv_w[(SLAB_WARPS > 1 ? 1 : 2) * KR * QST / UNIT], qg_w[2 * MQ * QST / UNIT];
  __local RAW *Qs = (__local RAW *)qg_w, *Gs = Qs + MQ * QST;
#if SLAB_WARPS > 1
  __local uint4 kh_w[KR * KHST / UNIT];
  __local RAW *Ks = Qs, *Vs = (__local RAW *)kv_w, *Kh = (__local RAW *)kh_w;
#else
  __local RAW *Ks = (__local RAW *)kv_w, *Vs = Ks + KR * QST;
#endif
  __local float lse_s[MQ], lo_s[MQ], delta_s[MQ];
#if HAS_BIAS
  __local uint4 bias_w[MQ * KBST * BIAS_BYTES / 16];
  __local uchar *Bs = (__local uchar *)bias_w;
#endif

  const int lid = get_local_id(0), lane = lid % 32, w = lid / 32, g = lane / 4, t = lane % 4;
  const int seen = NANS_SEEN; /* quiet_nans' pass needed */
  const int b = get_group_id(2), hk = get_group_id(1), j0 = get_group_id(0) * KR;
  const seq_info seq = seq_info_of(cu_q, cu_k, b, nq_all, nk_all);
  const int nq = seq.nq, nk = seq.nk;
  if (j0 >= nk) return; /* the whole group leaves: no barrier is skipped */

  /* The block's K and V, for the whole pass; they land with the first
   * block's Q and dO (copies_wait), their NaNs made quiet then. */
  stage_rows(Ks, QST, KR, (__global const RAW *)HEAD_ROWS(k, ko, ks, b, hk, seq.k0), ks, j0, nk, d,
             0, lid);
  stage_rows(Vs, QST, KR, (__global const RAW *)HEAD_ROWS(v, vo, vs, b, hk, seq.k0), vs, j0, nk, d,
             0, lid);

  /* The warp's keys: the lane's two, kw + g and kw + g + 8; and its share
   * of a block's query rows, qw .. qw + 8 NQW - 1. */
  const int kw = 16 * (w % (KR / 16)), qw = 8 * NQW * (w / (KR / 16));
  float dka[NDN][4], dva[NDN][4];
#pragma unroll
  for (int n = 0; n < NDN; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      dka[n][e] = dva[n][e] = 0.0f;
#if SLAB_WARPS > 1
  uint ka[NDK / 2][4];
  copies_wait();
  quiet_nans(Ks, QST, KR, lid, seen);
  quiet_nans(Vs, QST, KR, lid, seen);
  barrier(CLK_LOCAL_MEM_FENCE);
  rows_fragments(ka, NDK / 2, Ks + kw * QST, QST, lane);
  keep_last_half(Kh, KHST, Ks, QST, KR, lid);
#endif

  /* The query rows that see some key of the block. */
  int ilo, ihi;
  query_block_range(j0, min(j0 + KR, nk), nq, nk, wl, wr, &ilo, &ihi);
  for (int hh = 0; hh < group && ilo < ihi; ++hh) {
    const int h = hk * group + hh;
    const float slope = alibi ? alibi[h] : 0.0f;
    BIAS_HEAD;
    __global const RAW *qp = (__global const RAW *)HEAD_ROWS(q, qo, qs, b, h, seq.q0);
    __global const RAW *gp = (__global const RAW *)HEAD_ROWS(dout, go, gs, b, h, seq.q0);
    for (int i0 = ilo / MQ * MQ; i0 < ihi; i0 += MQ) {
      barrier(CLK_LOCAL_MEM_FENCE); /* the last block's reads are done */
      stage_rows(Qs, QST, MQ, qp, qs, i0, nq, d, 0, lid);
      stage_rows(Gs, QST, MQ, gp, gs, i0, nq, d, 0, lid);
#if HAS_BIAS
      bias_copy(Bs, KBST, MQ, KR, bias, bias_h, bias_s, i0, nq, j0, nk, lid);
#endif
      stage_row_stats(lse_s, lo_s, delta_s, lse, lo_, ls, delta, b, h, seq, i0, tq, MQ, MMA_ITEMS,
                      lid);
      copies_wait();
#if SLAB_WARPS == 1
      if (hh == 0 && i0 == ilo / MQ * MQ) { /* the first block: K and V landed too */
        quiet_nans(Ks, QST, KR, lid, seen);
        quiet_nans(Vs, QST, KR, lid, seen);
      }
#endif
      quiet_nans(Qs, QST, MQ, lid, seen);
      quiet_nans(Gs, QST, MQ, lid, seen);
      barrier(CLK_LOCAL_MEM_FENCE);

      float s[NQW][4], dp[NQW][4];
#if SLAB_WARPS > 1
      halves_times_rows(s, NQW, ka, Kh + kw * KHST, KHST, NDK, Qs + qw * QST, QST, lane);
      rows_times_rows(dp, NQW, Vs + kw * QST, QST, NDK, Gs + qw * QST, QST, lane);
#else
      uint fa[NDK][4];
      rows_fragments(fa, NDK, Ks + kw * QST, QST, lane);
      tile_times_rows(s, NQW, fa, NDK, Qs, QST, lane);
      rows_fragments(fa, NDK, Vs + kw * QST, QST, lane);
      tile_times_rows(dp, NQW, fa, NDK, Gs, QST, lane);
#endif

      /* P^T (into s) and dS^T (into dp) by the rules; e: 0, 1 the lane's
       * first key, 2, 3 its second; query row i0 + qw + 8 n + 2 t + (e & 1). */
      int all_lo, all_hi;
      key_block_common(i0, i0 + MQ, nq, nk, wl, wr, &all_lo, &all_hi);
      const int whole =
          softcap == 0.0f && slope == 0.0f && i0 + MQ <= nq && j0 >= all_lo && j0 + KR <= all_hi;
#pragma unroll
      for (int n = 0; n < NQW; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int c = qw + 8 * n + 2 * t + (e & 1), kc = kw + g + 8 * (e >> 1);
          float ds, gr;
          s[n][e] =
              p_ds(s[n][e], dp[n][e], i0 + c, j0 + kc, nq, nk, lse_s[c], lo_s[c], delta_s[c], scale,
                   softcap, slope, wl, wr, whole, &ds, &gr P_DS_BIAS(bias_one(Bs, KBST, c, kc)));
          dp[n][e] = ds;
        }

      /* dV += P^T dO, dK += dS^T Q, over the warp's rows. */
      acc_times_tile(dva, NDN, s, 8 * NQW, Gs + qw * QST, QST, lane);
      acc_times_tile(dka, NDN, dp, 8 * NQW, Qs + qw * QST, QST, lane);
    }
  }
  copies_wait(); /* a block no query row sees staged K and V all the same */

#if SLAB_WARPS > 1
  /* A slab's second warp's sums added to its first's, dK's and then dV's
   * through local memory (V's buffer, free now: HD / 2 floats a lane, the
   * lanes of a step adjacent), in that fixed order; the first warp
   * stores. */
  __local float *part = (__local float *)kv_w;
  const int slot = w % (KR / 16) * 32 + lane, share = w / (KR / 16);
#pragma unroll
  for (int x = 0; x < 2; ++x) {
    barrier(CLK_LOCAL_MEM_FENCE);
    if (share == 1)
#pragma unroll
      for (int n = 0; n < NDN; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          part[(4 * n + e) * 2 * KR + slot] = x ? dva[n][e] : dka[n][e];
    barrier(CLK_LOCAL_MEM_FENCE);
    if (share == 0)
#pragma unroll
      for (int n = 0; n < NDN; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float y = part[(4 * n + e) * 2 * KR + slot];
          if (x)
            dva[n][e] += y;
          else
            dka[n][e] += y;
        }
  }
  if (share) return;
#endif

  __global T *dkp = HEAD_ROWS(dk, dko, dks, b, hk, seq.k0);
  __global T *dvp = HEAD_ROWS(dv, dvo, dvs, b, hk, seq.k0);
#pragma unroll
  for (int u = 0; u < 2; ++u) {
    const int j = j0 + kw + g + 8 * u;
    if (j >= nk) continue;
#pragma unroll
    for (int n = 0; n < NDN; ++n)
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int col = 8 * n + 2 * t + c;
        if (col < d) {
          STORE(dkp, j * dks.s1 + col * dks.s3, dka[n][2 * u + c] * scale);
          STORE(dvp, j * dvs.s1 + col * dvs.s3, dva[n][2 * u + c]);
        }
      }
  }
}

/* Block j's slot in attn_bwd_dq_mma's buffer (and in its bias tiles'),
 * and its copies asked for. */
#define KV_SLOT(j) (KVs + (j) / MK % NSLOT * 2 * MK * QST)
#if BIAS_STAGED
#define BIAS_SLOT(j) (Bs + (j) / MK % NSLOT * QR * QBST * BIAS_BYTES)
#define STAGE_DQ_BIAS(j) \
  bias_copy(BIAS_SLOT(j), QBST, QR, MK, bias, bias_h, bias_s, i0, nq, (j), nk, lid)
#else
#define STAGE_DQ_BIAS(j)
#endif
#define STAGE_KV(j)                                                                               \
  do {                                                                                            \
    stage_rows(KV_SLOT(j), QST, MK, (__global const RAW *)kp, ks, (j), nk, d, 0, lid);            \
    stage_rows(KV_SLOT(j) + MK * QST, QST, MK, (__global const RAW *)vp, vs, (j), nk, d, 0, lid); \
    STAGE_DQ_BIAS(j);                                                                             \
  } while (0)

__kernel __attribute__((reqd_work_group_size(MMA_ITEMS, 1, 1))) void attn_bwd_dq_mma(
    BWD_ARGS, __global T *dq, long dqo, long4 dqs DBIAS_ARGS) {
  /* S * scale rounded before lse is taken from it, as the forward and
   * bwd.cl round it (see tile_p_ds). */
#pragma OPENCL FP_CONTRACT OFF
  __local uint4 buf[BUNITS];
  __local RAW *Qs = (__local RAW *)buf, *Gs = Qs + (WIDE_F32 ? 0 : QR * QST);
  /* (WIDE_F32: Q's and dO's last HD / 2 columns, Qh and Gh, kept for the
   * pass, then) block j's K, V at its slot (j / MK) % NSLOT */
  __local RAW *Qh = (__local RAW *)buf, *Gh = Qh + (WIDE_F32 ? QR * GHST : 0),
              *KVs = Qh + GHUNITS * UNIT;
#if DBIAS == 2
  __local float colsum[4 * MK];
#endif
#if BIAS_STAGED
  __local uint4 bias_w[NSLOT * QR * QBST * BIAS_BYTES / 16];
  __local uchar *Bs = (__local uchar *)bias_w;
#endif

  const int lid = get_local_id(0), lane = lid % 32, w = lid / 32, g = lane / 4, t = lane % 4;
  const int seen = NANS_SEEN; /* quiet_nans' pass needed */
  DQ_BLOCK(QR);
  __global const T *kp = HEAD_ROWS(k, ko, ks, b, hk, seq.k0);
  __global const T *vp = HEAD_ROWS(v, vo, vs, b, hk, seq.k0);

  /* The warp's rows of Q and dO as A fragments, for the whole pass,
   * staged together; or (WIDE_F32) the first HD / 2 columns' fragments,
   * the last columns kept in Qh and Gh: Q staged first, then dO by halves
   * of 32 rows past what Qh and Gh hold so far. */
  const int qr = 16 * w + g;
  __global const RAW *qp = (__global const RAW *)HEAD_ROWS(q, qo, qs, b, h, seq.q0);
  __global const RAW *gp = (__global const RAW *)HEAD_ROWS(dout, go, gs, b, h, seq.q0);
#if WIDE_F32
  uint qa[NDK / 2][4], ga[NDK / 2][4];
  stage_rows(Qs, QST, QR, qp, qs, i0, nq, d, 0, lid);
  copies_wait();
  quiet_nans(Qs, QST, QR, lid, seen);
  barrier(CLK_LOCAL_MEM_FENCE);
  rows_fragments(qa, NDK / 2, Qs + 16 * w * QST, QST, lane);
  keep_last_half(Qh, GHST, Qs, QST, QR, lid);
#pragma unroll
  for (int part = 0; part < 2; ++part) {
    __local RAW *at = Gh + part * QR / 2 * GHST;
    barrier(CLK_LOCAL_MEM_FENCE); /* the last rows' reads are done */
    stage_rows(at, QST, QR / 2, gp, gs, i0 + part * QR / 2, nq, d, 0, lid);
    copies_wait();
    quiet_nans(at, QST, QR / 2, lid, seen);
    barrier(CLK_LOCAL_MEM_FENCE);
    if (w / 2 == part) rows_fragments(ga, NDK / 2, at + 16 * (w % 2) * QST, QST, lane);
    keep_last_half(at, GHST, at, QST, QR / 2, lid);
  }
#else
  uint qa[NDK][4], ga[NDK][4];
  stage_rows(Qs, QST, QR, qp, qs, i0, nq, d, 0, lid);
  stage_rows(Gs, QST, QR, gp, gs, i0, nq, d, 0, lid);
  copies_wait();
  quiet_nans(Qs, QST, QR, lid, seen);
  quiet_nans(Gs, QST, QR, lid, seen);
  barrier(CLK_LOCAL_MEM_FENCE);
  rows_fragments(qa, NDK, Qs + 16 * w * QST, QST, lane);
  rows_fragments(ga, NDK, Gs + 16 * w * QST, QST, lane);
#endif

  /* The lane's two rows: lse (hi, lo) and delta; -inf past the sequence,
   * which marks a row as passing no gradient. */
  int rr[2];
  float li[2], lo2[2], dl[2];
#pragma unroll
  for (int u = 0; u < 2; ++u) {
    rr[u] = i0 + qr + 8 * u;
    __global const float *lp = HEAD_ROWS(lse, lo_, ls, b, h, seq.q0 + rr[u]);
    li[u] = rr[u] < nq ? lp[0] : -INFINITY;
    lo2[u] = rr[u] < nq && ls.s3 ? lp[ls.s3] : 0.0f;
    dl[u] = rr[u] < nq ? delta[h * (long)tq + seq.qflat + rr[u]] : 0.0f;
  }

  float acc[NDN][4];
#pragma unroll
  for (int n = 0; n < NDN; ++n)
    acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;

  /* The keys some row of the block sees, and those every row sees. */
  int lo, hi, all_lo, all_hi;
  key_block_range(i0, min(i0 + QR, nq), nq, nk, wl, wr, &lo, &hi);
  key_block_common(i0, i0 + QR, nq, nk, wl, wr, &all_lo, &all_hi);
  const int plain = softcap == 0.0f && slope == 0.0f && i0 + QR <= nq;
  /* A block's K and V are one group of copies, the next block's in flight
   * while this one's products run, in the other slot; with one slot
   * (WIDE_F32) each block's once the last one's products are done, the
   * other work-groups of the SM running meanwhile. */
  barrier(CLK_LOCAL_MEM_FENCE); /* Q's and dO's reads are done */
  if (NSLOT == 2 && lo < hi) STAGE_KV(lo / MK * MK);
  copies_commit();
  for (int j0 = lo / MK * MK; j0 < hi; j0 += MK) {
    __local RAW *Ks = KV_SLOT(j0), *Vs = Ks + MK * QST;
    barrier(CLK_LOCAL_MEM_FENCE); /* the last block's reads of the slot are done */
#if NSLOT == 1
    STAGE_KV(j0);
    copies_commit();
    copies_wait();
#else
    if (j0 + MK < hi) STAGE_KV(j0 + MK);
    copies_commit();
    copies_wait_but_last(); /* this block's */
#endif
    quiet_nans(Ks, QST, MK, lid, seen);
    quiet_nans(Vs, QST, MK, lid, seen);
    barrier(CLK_LOCAL_MEM_FENCE);

    float s[NSK][4], dp[NSK][4];
#if WIDE_F32
    halves_times_rows(s, NSK, qa, Qh + 16 * w * GHST, GHST, NDK, Ks, QST, lane);
    halves_times_rows(dp, NSK, ga, Gh + 16 * w * GHST, GHST, NDK, Vs, QST, lane);
#else
    tile_times_rows(s, NSK, qa, NDK, Ks, QST, lane);
    tile_times_rows(dp, NSK, ga, NDK, Vs, QST, lane);
#endif

#if HAS_BIAS
    /* The lane's bias of the block: from its staged tile, else loaded all
     * at once, one wait a block rather than one an element. */
    float bv[NSK][4];
#pragma unroll
    for (int n = 0; n < NSK; ++n) {
#if BIAS_STAGED
      const float2 x = bias_pair(BIAS_SLOT(j0), QBST, qr, 8 * n + 2 * t),
                   y = bias_pair(BIAS_SLOT(j0), QBST, qr + 8, 8 * n + 2 * t);
      bv[n][0] = x.x;
      bv[n][1] = x.y;
      bv[n][2] = y.x;
      bv[n][3] = y.y;
#else
#pragma unroll
      for (int e = 0; e < 4; ++e)
        bv[n][e] = bias_at(bias, bias_h, bias_s, rr[e >> 1], j0 + 8 * n + 2 * t + (e & 1), nq, nk);
#endif
    }
#endif

    /* dS (into s) and dbias's term g (into dp) by p_ds; e: 0, 1 the lane's first row, 2, 3 its
     * second; key j0 + 8 n + 2 t + (e & 1). */
    const int whole = plain && j0 >= all_lo && j0 + MK <= all_hi;
#pragma unroll
    for (int n = 0; n < NSK; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int u = e >> 1, r = rr[u], kj = j0 + 8 * n + 2 * t + (e & 1);
        float ds, gr;
        p_ds(s[n][e], dp[n][e], r, kj, nq, nk, li[u], lo2[u], dl[u], scale, softcap, slope, wl, wr,
             whole, &ds, &gr P_DS_BIAS(bv[n][e]));
        s[n][e] = ds;
        dp[n][e] = gr;
      }

#if DBIAS == 1
    /* The launch is its elements' only adder. The first launch, at (b0, h0)
     * = (0, 0) (launch.c), gives each element its first term, stored over
     * the zero; a later one reads every old value before it stores any, one
     * wait a block. */
    if (b0 == 0 && h0 == 0) {
#pragma unroll
      for (int n = 0; n < NSK; ++n)
#pragma unroll
        for (int u = 0; u < 2; ++u) {
          const int r = rr[u], kj = j0 + 8 * n + 2 * t;
          if (r >= nq) continue;
          __global float *at = dbp + r * dbias_s.s2 + kj * dbias_s.s3;
          if (dbias_s.s3 == 1 && kj + 2 <= nk && ((ulong)at & 7u) == 0u) {
            *(__global float2 *)at = (float2)(dp[n][2 * u], dp[n][2 * u + 1]);
          } else {
            if (kj < nk) at[0] = dp[n][2 * u];
            if (kj + 1 < nk) at[dbias_s.s3] = dp[n][2 * u + 1];
          }
        }
    } else {
      float old[NSK][4];
#pragma unroll
      for (int n = 0; n < NSK; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int r = rr[e >> 1], kj = j0 + 8 * n + 2 * t + (e & 1);
          old[n][e] = r < nq && kj < nk ? dbp[r * dbias_s.s2 + kj * dbias_s.s3] : 0.0f;
        }
#pragma unroll
      for (int n = 0; n < NSK; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int r = rr[e >> 1], kj = j0 + 8 * n + 2 * t + (e & 1);
          if (r < nq && kj < nk) dbp[r * dbias_s.s2 + kj * dbias_s.s3] = old[n][e] + dp[n][e];
        }
    }
#endif

#if DBIAS == 2
    /* Each key's sum over the block's rows: the lane's two, the warp's 8
     * lanes of a column, then the 4 warps in order, into the work-group's
     * own slot. */
#pragma unroll
    for (int n = 0; n < NSK; ++n)
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        float x = dp[n][c] + dp[n][2 + c];
        x += lane_xor(x, 4);
        x += lane_xor(x, 8);
        x += lane_xor(x, 16);
        if (g == 0) colsum[w * MK + 8 * n + 2 * t + c] = x;
      }
    barrier(CLK_LOCAL_MEM_FENCE);
    if (lid < MK && j0 + lid < nk)
      dbp[j0 + lid] =
          ((colsum[lid] + colsum[MK + lid]) + colsum[2 * MK + lid]) + colsum[3 * MK + lid];
#endif

    /* dQ += dS K, dS from the accumulators. */
    acc_times_tile(acc, NDN, s, MK, Ks, QST, lane);
  }

  __global T *dqp = HEAD_ROWS(dq, dqo, dqs, b, h, seq.q0);
#pragma unroll
  for (int u = 0; u < 2; ++u) {
    if (rr[u] >= nq) continue;
#pragma unroll
    for (int n = 0; n < NDN; ++n)
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int col = 8 * n + 2 * t + c;
        if (col < d) STORE(dqp, rr[u] * dqs.s1 + col * dqs.s3, acc[n][2 * u + c] * scale);
      }
  }
}
