/*
 * Forward pass on NVIDIA's tensor cores (sm_80 and later), through inline
 * PTX: the vendor path beside fwd.cl, with fwd.cl's arguments, steps and
 * rules (common.cl). One work-group of 4 warps takes MR = 64 query rows of
 * one (sequence, head), 16 rows a warp, over key tiles of MC = 64 (16 for
 * f32 above HD 64, WIDE_F32, whose Q keeps its last HD / 2 columns in
 * local memory, Qh, and its first as fragments):
 *   S = Q K^T      mma.sync (m16n8k16 f16/bf16, or f32 as three TF32
 *                  m16n8k8 products, mma.cl), Q's fragments held in
 *                  registers, K row-major in local memory
 *   S -> scale, softcap, ALiBi, bias, mask, online softmax (common.cl), the
 *        row maxima and sums over the 4 lanes that share a row (shfl.sync)
 *   O += P V       P from S's accumulators, which already lie as the next
 *                  product's A fragments (packed to 16 bits, or split to
 *                  TF32 pairs); V row-major in local memory too
 * Lane (g, t) = (lane / 4, lane % 4) of warp w holds rows 16 w + g and
 * 16 w + g + 8, and of each 8 columns of S or O the columns 2 t, 2 t + 1:
 * the m16n8k16 layout of C and D. K, V and a bias tile come by cp.async,
 * which holds no register in flight, one buffer each: a tile's V while
 * its Q K^T and softmax run, the next tile's K while its P V runs, and
 * its bias while that P V and its own Q K^T run.
 *
 * The PTX and the staging: mma.cl, which precedes this file. Built only
 * for a device whose driver takes PTX in OpenCL C (NVIDIA, the plan checks
 * the compute capability); a build that fails falls back to the device's
 * GPU row, fwd.cl (attn__cl_config_portable). HD at most 128: O, S and Q's fragments take
 * HD / 2 + MC / 2 + HD / 4 registers a lane (f32: HD / 2 + MC + HD / 2, S's small terms
 * summed apart; WIDE_F32: HD / 2 + MC + HD / 4, 112 at HD 128, where 32-key tiles with all
 * of Q's fragments took 255 and spilled).
 */
#ifndef HD
#define HD 64
#endif
#define MR 64                   /* query rows per work-group */
#define MC (WIDE_F32 ? 16 : 64) /* keys per tile; Q (MR rows) passes through K and V */
#define QHST (HD / 2 + PAD)     /* Qh's rows (WIDE_F32) */
#define QHUNITS (WIDE_F32 ? MR * QHST / UNIT : 0)
#define MT MMA_ITEMS
#define KST (HD + PAD)   /* Q, K and V rows in local memory, in elements */
#define NSN (MC / 8)     /* 8-column tiles of S a warp holds */
#define NON (HD / 8)     /* of O */
#define NQK (HD / KSTEP) /* k steps of Q K^T */
/* A staged bias tile's rows (BIAS_STAGED, mma.cl) are BST elements apart:
 * a lane's pairs of row g and of row g + 8 fall in distinct banks. */
#if BIAS_STAGED
#define BST (MC + 8)
#endif

/* Rows j .. j + rows - 1 of Q, K or V (keyed) asked for, into dst: by
 * stage_whole_rows where the rows allow it, except in the biased programs
 * up to d = 64. NVIDIA's compiler keeps the biased d = 64 program in 128
 * registers (four work-groups an SM) only with stage_tile's loop; with both
 * it takes 168 (three), which costs more than the copies save. */
#if HAS_BIAS && HD <= 64
#define STAGE_ROWS(dst, rows, p, s, j, n, keyed) \
  stage_tile(dst, KST, rows, p, s, j, n, d, keyed, lid KEY_PAGES)
#else
#define STAGE_ROWS(dst, rows, p, s, j, n, keyed) \
  stage_rows(dst, KST, rows, p, s, j, n, d, keyed, lid KEY_PAGES)
#endif

/* Key tile j's K rows (and bias tile) asked for, into Ks (and Bs). A
 * staged bias is a group of copies of its own, after K's: its rows come
 * from memory once, where K's are mostly in the L2, so Q K^T waits for K
 * alone and the bias lands under it. */
#if BIAS_STAGED
#define STAGE_K(j)                                            \
  STAGE_ROWS(Ks, MC, (__global const RAW *)kp, ks, j, nk, 1); \
  copies_commit();                                            \
  bias_copy(Bs, BST, MR, MC, bias, bias_h, bias_s, r0, nq, j, nk, lid)
#else
#define STAGE_K(j) STAGE_ROWS(Ks, MC, (__global const RAW *)kp, ks, j, nk, 1)
#endif

__kernel __attribute__((reqd_work_group_size(MT, 1, 1))) void attn_fwd_mma(FWD_ARGS) {
  /* Q passes through Ks and Vs, one buffer, before the first tile.
   * 16-byte units, for the staging's stores (KST keeps rows whole units
   * apart). */
  __local uint4 KVs_w[2 * MC * KST / UNIT + QHUNITS];
  __local RAW *Ks = (__local RAW *)KVs_w, *Vs = Ks + MC * KST, *Qh = Vs + MC * KST;
#if BIAS_STAGED
  __local uint4 Bs_w[MR * BST * BIAS_BYTES / 16];
  __local uchar *Bs = (__local uchar *)Bs_w;
#endif

  const int lid = get_local_id(0), lane = lid % 32, w = lid / 32, g = lane / 4, t = lane % 4;
  const int seen = NANS_SEEN; /* quiet_nans' pass needed */
  FWD_BLOCK(MR);

  int lo, hi;
  key_block_range(r0, min(r0 + MR, nq), nq, nk, wl, wr, &lo, &hi);
  const float slope = alibi ? alibi[h] : 0.0f;
  /* As fwd.cl: a tile that every row sees whole needs the scale alone. */
  const int plain = softcap == 0.0f && slope == 0.0f && r0 + MR <= nq;
  int all_lo, all_hi;
  key_block_common(r0, r0 + MR, nq, nk, wl, wr, &all_lo, &all_hi);

  /* The warp's rows of Q as A fragments, for the whole pass. */
  STAGE_ROWS(Ks, MR, (__global const RAW *)qp, qs, r0, nq, 0);
  copies_wait();
  quiet_nans(Ks, KST, MR, lid, seen);
  barrier(CLK_LOCAL_MEM_FENCE);
  const int qr = 16 * w + g;
#if WIDE_F32
  /* Q's first HD / 2 columns' fragments in registers, its last in Qh. */
  uint qa[NQK / 2][4];
  rows_fragments(qa, NQK / 2, Ks + 16 * w * KST, KST, lane);
  keep_last_half(Qh, QHST, Ks, KST, MR, lid);
#else
  uint qa[NQK][4];
  rows_fragments(qa, NQK, Ks + 16 * w * KST, KST, lane);
#endif

  /* The lane's two rows: their running max and (partial) sum, and O. */
  const int ra = r0 + qr, rb = ra + 8;
  const int dga = diag(ra, nq, nk), dgb = diag(rb, nq, nk);
  float m_a = -INFINITY, m_b = -INFINITY, l_a = 0.0f, l_b = 0.0f;
  float acc[NON][4];
#pragma unroll
  for (int n = 0; n < NON; ++n)
    acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;

  /* A tile's K, its bias and its V are groups of copies in flight at
   * once, in their buffers: V lands under Q K^T and the softmax, the next
   * tile's K under P V, its bias under that P V and its Q K^T. */
  int j0, jend;
  split_keys(lo, hi, MC, split, nsplit, &j0, &jend);
  barrier(CLK_LOCAL_MEM_FENCE); /* Q's reads of Ks are done */
  if (j0 < jend) {
    STAGE_K(j0);
  }
  copies_commit();
  for (; j0 < jend; j0 += MC) {
#if HAS_BIAS && !BIAS_STAGED
    /* The lane's bias of the tile, in flight while K and V are staged and
     * Q K^T runs (as in fwd.cl). Past the sequence: 0, unread. */
    float bv[NSN][4];
#pragma unroll
    for (int n = 0; n < NSN; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = e < 2 ? ra : rb, j = j0 + 8 * n + 2 * t + (e & 1);
        bv[n][e] = bias_at(bias, bias_h, bias_s, r, j, nq, nk);
      }
#endif
    barrier(CLK_LOCAL_MEM_FENCE); /* the last tile's P V is done with Vs */
    STAGE_ROWS(Vs, MC, (__global const RAW *)vp, vs, j0, nk, 1);
    copies_commit();
#if BIAS_STAGED
    copies_wait_but_two(); /* the tile's K; its bias and V in flight */
#else
    copies_wait_but_last(); /* the tile's K */
#endif
    quiet_nans(Ks, KST, MC, lid, seen);
    barrier(CLK_LOCAL_MEM_FENCE);

    float s[NSN][4];
#if WIDE_F32
    halves_times_rows(s, NSN, qa, Qh + 16 * w * QHST, QHST, NQK, Ks, KST, lane);
#else
    tile_times_rows(s, NSN, qa, NQK, Ks, KST, lane);
#endif

#if BIAS_STAGED
    copies_wait_but_last(); /* the tile's bias */
    barrier(CLK_LOCAL_MEM_FENCE);
#endif

    /* Scores and mask by the rules, as fwd.cl takes them; e: 0, 1 row a,
     * 2, 3 row b; key j0 + 8 n + 2 t + (e & 1). */
    const int whole = plain && j0 >= all_lo && j0 + MC <= all_hi;
    float mx_a = m_a, mx_b = m_b;
#pragma unroll
    for (int n = 0; n < NSN; ++n) {
#if BIAS_STAGED
      /* The staged bias read where it is added, a tile of S at a time: read
       * all at once after the wait, its NSN * 4 values held beside S took
       * NVIDIA's compiler from 128 registers to 160 for the d = 64 program
       * (three work-groups an SM instead of four). */
      const float2 bx = bias_pair(Bs, BST, qr, 8 * n + 2 * t),
                   by = bias_pair(Bs, BST, qr + 8, 8 * n + 2 * t);
      const float bn[4] = {bx.x, bx.y, by.x, by.y};
#elif HAS_BIAS
      const float *bn = bv[n];
#endif
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = e < 2 ? ra : rb, dg = e < 2 ? dga : dgb, j = j0 + 8 * n + 2 * t + (e & 1);
        const float x = s[n][e] * scale;
        float tt, y;
#if HAS_BIAS
        if (whole)
          y = x + bn[e];
        else
          y = r < nq && j < nk && key_visible(dg, j, wl, wr)
                  ? score_scaled(x, softcap, slope, dg - j, &tt) + bn[e]
                  : -INFINITY;
#else
        if (whole)
          y = x;
        else
          y = r < nq && j < nk && key_visible(dg, j, wl, wr)
                  ? score_scaled(x, softcap, slope, dg - j, &tt)
                  : -INFINITY;
#endif
        s[n][e] = y;
        if (e < 2)
          mx_a = fmax(mx_a, y);
        else
          mx_b = fmax(mx_b, y);
      }
    }
    mx_a = quad_max(mx_a);
    mx_b = quad_max(mx_b);

    /* The online softmax (mma.cl). */
    softmax_step(s, NSN, mx_a, mx_b, &m_a, &m_b, &l_a, &l_b, acc, NON);

    copies_wait();                /* the tile's V (P V needs no quiet_nans) */
    barrier(CLK_LOCAL_MEM_FENCE); /* V landed; Ks and Bs read */
    if (j0 + MC < jend) {
      STAGE_K(j0 + MC);
    }
    copies_commit();

    /* O += P V, P from S's accumulators. */
    acc_times_tile(acc, NON, s, MC, Vs, KST, lane);
  }

  /* The rows' ends (fwd_rows.cl's), each row's sum over its 4 lanes. */
  l_a = quad_sum(l_a);
  l_b = quad_sum(l_b);
  __global T *op = HEAD_ROWS(o, oo, os, b, h, seq.q0);
#pragma unroll
  for (int hr = 0; hr < 2; ++hr) {
    const int r = hr ? rb : ra;
    const float m = hr ? m_b : m_a, l = hr ? l_b : l_a;
    if (r >= nq) continue;
#if SPLIT
    const long pr = PART_ROW(split, h, get_num_groups(1), tq, seq.qflat + r);
#pragma unroll
    for (int n = 0; n < NON; ++n) {
      part_o[pr * HD + 8 * n + 2 * t] = acc[n][2 * hr];
      part_o[pr * HD + 8 * n + 2 * t + 1] = acc[n][2 * hr + 1];
    }
    if (t == 0) {
      part_ml[2 * pr] = m;
      part_ml[2 * pr + 1] = l;
    }
#else
    float div, lse_hi, lse_lo;
    const float fold = row_end_at(r, nq, nk, wl, wr, SINK_OF(h), m, l, &div, &lse_hi, &lse_lo);
#pragma unroll
    for (int n = 0; n < NON; ++n)
#pragma unroll
      for (int u = 0; u < 2; ++u) {
        const int c = 8 * n + 2 * t + u;
        if (c < d) STORE(op, r * os.s1 + c * os.s3, acc[n][2 * hr + u] * fold / div);
      }
    if (lse && t == 0) {
      __global float *lp = HEAD_ROWS(lse, lo_, ls, b, h, seq.q0 + r);
      lp[0] = lse_hi;
      if (ls.s3) lp[ls.s3] = lse_lo;
    }
#endif
  }
}
