/*
 * The forward pass for few query rows (decoding), FlashAttention's steps
 * 1-4 arranged to be bound by reading K and V rather than by arithmetic:
 *
 *   attn_decode        one work-group per (key split, block of DR query
 *                      rows, key/value head, sequence). The rows are those
 *                      of every query head sharing the key/value head (GQA),
 *                      so K and V are read once per key/value head, not per
 *                      query head. Per tile of NTD keys:
 *                        K, V tiles -> local memory (16-byte loads, each
 *                                      row's chunks on neighbouring items)
 *                        S = Q K^T    (item: two keys against half the rows)
 *                        S -> scale, softcap, ALiBi, bias, mask
 *                        m_i' = max(m_i, rowmax S), P = exp(S - m_i')
 *                        O = O e^(m_i - m_i') + P V (item: a 16-byte chunk
 *                                      of columns of every row, for a slice
 *                                      of the keys)
 *                      With one split the work-group ends its rows (O / l_i,
 *                      lse, sinks) as fwd.cl does; with several each writes
 *                      its part (O, m_i, l_i) to the workspace.
 *   attn_split_merge   (split.cl) the parts merged, the rows ended.
 *
 * Splitting the keys (flash-decoding) is what fills the device when the
 * sequences and heads alone give too few work-groups: the host chooses the
 * number (cl/plan.c), each work-group takes its share of its own key range.
 */
#ifndef HD
#define HD 64 /* the head dimension rounded up: 32, 64, then a multiple of 32 */
#endif
#ifndef DR
#define DR 8 /* query rows per work-group, a power of two up to NTD */
#endif
#ifndef NTD
#define NTD 64 /* work-items, and keys per tile: a power of two, 16 or more */
#endif

/* K and V travel as 16-byte chunks of CH elements, kept raw in local
 * memory and unpacked to floats when read. */
#if DTYPE == 0
#define CH 4
typedef float4 FV;
inline FV unpack(uint4 u) {
  return as_float4(u);
}
#elif DTYPE == 1
#define CH 8
typedef float8 FV;
inline FV unpack(uint4 u) {
  return vload_half8(0, (const half *)&u);
}
#else
#define CH 8
typedef float8 FV;
inline FV unpack(uint4 u) {
  return (FV)(as_float(u.x << 16), as_float(u.x & 0xffff0000u), as_float(u.y << 16),
              as_float(u.y & 0xffff0000u), as_float(u.z << 16), as_float(u.z & 0xffff0000u),
              as_float(u.w << 16), as_float(u.w & 0xffff0000u));
}
#endif

#define NCH (HD / CH) /* chunks per row */
/* Local rows are a chunk longer than the data: the 16-byte reads of the
 * items of a quarter warp, one row each, then fall in distinct banks. */
#define KSTR4 (NCH + 1)
/* P V: item lid owns chunks lid % NCH (+ NTD ..) of keys lid / NCH +
 * NKS k of the tile. */
#define CPI (NCH > NTD ? (NCH + NTD - 1) / NTD : 1)
#define NKS (NCH < NTD ? NTD / NCH : 1)
/* The row maximum: IPR items per row, each over DR keys. */
#define IPR (NTD / DR)
/* S and P: item lid owns keys lid % KG + KG u (u < KPI) against rows
 * lid / KG * RPI .. + RPI - 1: two keys per item read each Q chunk for
 * two, and neighbouring items still read neighbouring K rows. */
#define KPI (DR > 1 ? 2 : 1)
#define RPI (DR / KPI)
#define KG (NTD / KPI)
#define TILES4 MAX4(2 * NTD * KSTR4, NKS * DR * HD / 4)
#define MAX4(a, b) ((a) > (b) ? (a) : (b))

/* acc + a . b, column by column: S then comes out as the backward pass
 * recomputes it (bwd.cl's tile_p_ds), bit for bit, which exp(S - lse)
 * needs at large logits. */
inline float dot_fv(FV a, FV b, float acc) {
#if CH == 4
  return fma(a.s3, b.s3, fma(a.s2, b.s2, fma(a.s1, b.s1, fma(a.s0, b.s0, acc))));
#else
  return fma(
      a.s7, b.s7,
      fma(a.s6, b.s6,
          fma(a.s5, b.s5,
              fma(a.s4, b.s4,
                  fma(a.s3, b.s3, fma(a.s2, b.s2, fma(a.s1, b.s1, fma(a.s0, b.s0, acc))))))));
#endif
}

inline float fv_at(FV a, int e) {
#if CH == 4
  return e == 0 ? a.s0 : e == 1 ? a.s1 : e == 2 ? a.s2 : a.s3;
#else
  return e == 0   ? a.s0
         : e == 1 ? a.s1
         : e == 2 ? a.s2
         : e == 3 ? a.s3
         : e == 4 ? a.s4
         : e == 5 ? a.s5
         : e == 6 ? a.s6
                  : a.s7;
#endif
}

/* Where key jj of the tile (key j) is in a tensor of strides s: through
 * the tile's pages (page, row in it), found once per key and tile, when
 * paged. */
#if PAGED
#define TILE_PAGES_PARAM , __local const int2 *pg
#define TILE_PAGES , pg
#define TILE_ROW(jj, j, s) (pg[jj].x * (s).s0 + pg[jj].y * (s).s1)
#else
#define TILE_PAGES_PARAM
#define TILE_PAGES
#define TILE_ROW(jj, j, s) ((j) * (s).s1)
#endif

/* Keys j0 .. j0 + NTD - 1 of one head of k or v (p: its row 0 of the head,
 * as raw elements) into a local tile, zero past nk and past d. vec: the
 * host found every row 16-byte aligned with contiguous columns and d a
 * multiple of CH, so a chunk is one load. */
inline void stage_tile(__local uint4 *dst, __global const RAW *p, long4 s, int j0, int nk, int d,
                       int vec, int lid TILE_PAGES_PARAM) {
  for (int e = lid; e < NTD * NCH; e += NTD) {
    const int jj = e / NCH, c = e % NCH, j = j0 + jj;
    uint4 u = (uint4)(0u);
    if (j < nk && c * CH < d) {
      __global const RAW *row = p + TILE_ROW(jj, j, s);
      if (vec) {
        u = *(__global const uint4 *)(row + c * CH);
      } else {
        /* Element t in the bits a 16-byte load would put it in. */
        uint wv[4] = {0u, 0u, 0u, 0u};
        for (int t = 0; t < CH; ++t)
          if (c * CH + t < d)
            wv[t * sizeof(RAW) / 4] |= (uint)row[(c * CH + t) * s.s3]
                                       << (8 * sizeof(RAW) * (t % (4 / sizeof(RAW))));
        u = (uint4)(wv[0], wv[1], wv[2], wv[3]);
      }
    }
    dst[jj * KSTR4 + c] = u;
  }
}

/* What a work-group's rows are: row rr is query row ri[rr] of head hh[rr],
 * valid when rr < nr. */
typedef struct rows {
  int nr;
  int ri[DR], hh[DR];
} rows;

/* The work-group's rows: block rb of the group * nq rows of key/value head
 * hk, head-major (row rho is query row rho % nq of head hk * group + rho /
 * nq); and the query rows [*ilo, *ihi) they span. */
inline rows rows_of(int rb, int hk, int group, int nq, int *ilo, int *ihi) {
  rows w;
  const int rho0 = rb * DR, all = group * nq;
  w.nr = min(DR, all - rho0);
  for (int rr = 0; rr < DR; ++rr) {
    const int rho = min(rho0 + rr, all - 1);
    w.ri[rr] = rho % nq;
    w.hh[rr] = hk * group + rho / nq;
  }
  const int last = rho0 + w.nr - 1;
  if (last / nq != rho0 / nq) {
    *ilo = 0;
    *ihi = nq;
  } else {
    *ilo = rho0 % nq;
    *ihi = last % nq + 1;
  }
  return w;
}

__kernel __attribute__((reqd_work_group_size(NTD, 1, 1))) void attn_decode(
    __global const T *q, long qo, long4 qs, __global const RAW *k, long ko, long4 ks,
    __global const RAW *v, long vo, long4 vs, __global T *o, long oo, long4 os, __global float *lse,
    long lo_, long4 ls, __global const int *cu_q, __global const int *cu_k,
    __global const float *alibi, int nq_all, int nk_all, int group, int d, float scale,
    float softcap, int wl, int wr, int nsplit, int nrb, int vec, __global float *part_o,
    __global float *part_ml, int tq KV_USED_ARGS PAGED_ARGS BIAS_ARGS SINK_ARGS) {
  /* The K and V tiles, and at the end the key slices' sums. */
  __local uint4 tiles[TILES4];
  __local uint4 *Ks4 = tiles, *Vs4 = tiles + NTD * KSTR4;
  __local FV Qv[DR * NCH];
  __local float4 Ss4[(NTD * DR + 3) / 4]; /* S, then P, key-major */
  __local float *Ss = (__local float *)Ss4;
  __local float red[NTD]; /* the rows' partial maxima, then their new m_i */
#if PAGED
  __local int2 pg[NTD]; /* the tile's keys' pages and rows in them */
#endif

  const int lid = get_local_id(0);
  const int rb = get_group_id(0) % nrb, split = get_group_id(0) / nrb;
  const int hk = get_group_id(1), b = get_group_id(2);
  const int heads = group * get_num_groups(1);
  const seq_info seq = seq_info_of(cu_q, cu_k, b, nq_all, nk_all);
  const int nq = seq.nq, nk = seq_keys(seq, b KV_USED_VALS);
  if (rb * DR >= group * nq) return; /* the whole group leaves */
  int ilo, ihi;
  const rows w = rows_of(rb, hk, group, nq, &ilo, &ihi);

  KV_HEADS(RAW);

  /* Q, as floats, zero past the rows and past d. */
  __local float *Qs = (__local float *)Qv;
  for (int e = lid; e < DR * HD; e += NTD) {
    const int rr = e / HD, c = e % HD;
    __global const T *qp = HEAD_ROWS(q, qo, qs, b, w.hh[rr], seq.q0 + w.ri[rr]);
    Qs[e] = rr < w.nr && c < d ? LOAD(qp, c * qs.s3) : 0.0f;
  }

  /* This split's share of the tiles the rows can see. */
  int lo, hi;
  key_block_range(ilo, ihi, nq, nk, wl, wr, &lo, &hi);
  const int first = lo / NTD, ntiles = lo < hi ? (hi + NTD - 1) / NTD - first : 0;
  const int t0 = first + split * ntiles / nsplit, t1 = first + (split + 1) * ntiles / nsplit;

  /* Per row: the running m_i, l_i (over this item's key slice) and O; per
   * row of the item's S: its diagonal, ALiBi slope and bias row. */
  const int kg = lid % KG, rg = lid / KG * RPI;
  float m[DR], l[DR], acc[DR][CPI * CH];
#pragma unroll
  for (int rr = 0; rr < DR; ++rr) {
    m[rr] = -INFINITY;
    l[rr] = 0.0f;
#pragma unroll
    for (int e = 0; e < CPI * CH; ++e)
      acc[rr][e] = 0.0f;
  }
  int dg[RPI], live[RPI];
  float slope[RPI];
#if HAS_BIAS
  long brow[RPI];
#endif
#pragma unroll
  for (int v = 0; v < RPI; ++v) {
    dg[v] = diag(w.ri[rg + v], nq, nk);
    live[v] = rg + v < w.nr;
    slope[v] = alibi ? alibi[w.hh[rg + v]] : 0.0f;
#if HAS_BIAS
    brow[v] = bias_o + b * bias_s.s0 + w.hh[rg + v] * bias_s.s1 + w.ri[rg + v] * bias_s.s2;
#endif
  }

  for (int t = t0; t < t1; ++t) {
    const int j0 = t * NTD;
#if PAGED
    if (j0 + lid < nk) /* the page alone: paged_row with t_sb 1, t_ss 0 */
      pg[lid] = (int2)((int)paged_row(kpg.bt, kpg.bt_sb, kpg.bt_ss, b, j0 + lid, kpg.size,
                                      kpg.count, 1, 0),
                       (j0 + lid) % kpg.size);
#endif
    barrier(CLK_LOCAL_MEM_FENCE); /* the last tile's reads are done */
    stage_tile(Ks4, kp, ks, j0, nk, d, vec, lid TILE_PAGES);
    stage_tile(Vs4, vp, vs, j0, nk, d, vec, lid TILE_PAGES);
    barrier(CLK_LOCAL_MEM_FENCE);

    /* S of the item's keys and rows, masked. */
    float s[KPI][RPI];
#pragma unroll
    for (int u = 0; u < KPI; ++u)
#pragma unroll
      for (int v = 0; v < RPI; ++v)
        s[u][v] = 0.0f;
    for (int c = 0; c < NCH; ++c) {
      FV kf[KPI];
#pragma unroll
      for (int u = 0; u < KPI; ++u)
        kf[u] = unpack(Ks4[(kg + u * KG) * KSTR4 + c]);
#pragma unroll
      for (int v = 0; v < RPI; ++v) {
        const FV qf = Qv[(rg + v) * NCH + c];
#pragma unroll
        for (int u = 0; u < KPI; ++u)
          s[u][v] = dot_fv(qf, kf[u], s[u][v]);
      }
    }
#pragma unroll
    for (int u = 0; u < KPI; ++u) {
      const int jj = kg + u * KG, j = j0 + jj;
#pragma unroll
      for (int v = 0; v < RPI; ++v) {
        float th;
        const float x = score(s[u][v], scale, softcap, slope[v], dg[v] - j, &th);
        const int in = live[v] && j >= lo && j < hi && key_visible(dg[v], j, wl, wr);
#if HAS_BIAS
        Ss[jj * DR + rg + v] =
            in ? x + load_any(bias, BIAS_DTYPE, brow[v] + j * bias_s.s3) : -INFINITY;
#else
        Ss[jj * DR + rg + v] = in ? x : -INFINITY;
#endif
      }
    }
    barrier(CLK_LOCAL_MEM_FENCE);

    /* Each row's maximum: IPR items per row over DR keys each, then one
     * item per row over those. */
    {
      const int rr = lid % DR, seg = lid / DR;
      float mt = -INFINITY;
      for (int u = 0; u < DR; ++u)
        mt = fmax(mt, Ss[(seg + u * IPR) * DR + rr]);
      red[seg * DR + rr] = mt;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    float mx = -INFINITY;
    if (lid < DR) {
      mx = m[lid];
      for (int seg = 0; seg < IPR; ++seg)
        mx = fmax(mx, red[seg * DR + lid]);
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    if (lid < DR) red[lid] = mx;
    barrier(CLK_LOCAL_MEM_FENCE);

    /* P of the item's keys and rows; every row's accumulators rescaled. A
     * row with no visible key yet keeps m_i = -inf and subtracts 0 (exp
     * stays 0). */
#pragma unroll
    for (int v = 0; v < RPI; ++v) {
      const float mn = red[rg + v], mu = mn == -INFINITY ? 0.0f : mn;
#pragma unroll
      for (int u = 0; u < KPI; ++u) {
        const int e = (kg + u * KG) * DR + rg + v;
        Ss[e] = exp(Ss[e] - mu);
      }
    }
#pragma unroll
    for (int rr = 0; rr < DR; ++rr) {
      const float mn = red[rr], mu = mn == -INFINITY ? 0.0f : mn;
      const float alpha = exp(m[rr] - mu);
      m[rr] = mn;
      l[rr] *= alpha;
#pragma unroll
      for (int e = 0; e < CPI * CH; ++e)
        acc[rr][e] *= alpha;
    }
    barrier(CLK_LOCAL_MEM_FENCE);

    /* O += P V over this item's chunks and key slice. */
    for (int jj = lid / NCH % NKS; jj < NTD; jj += NKS) {
      float p[DR];
#if DR % 4 == 0
#pragma unroll
      for (int u = 0; u < DR / 4; ++u) {
        const float4 p4 = Ss4[jj * (DR / 4) + u];
        p[4 * u] = p4.s0;
        p[4 * u + 1] = p4.s1;
        p[4 * u + 2] = p4.s2;
        p[4 * u + 3] = p4.s3;
      }
#else
#pragma unroll
      for (int rr = 0; rr < DR; ++rr)
        p[rr] = Ss[jj * DR + rr];
#endif
#pragma unroll
      for (int cc = 0; cc < CPI; ++cc) {
        const int c = lid % NCH + cc * NTD;
        if (c < NCH) {
          const FV vf = unpack(Vs4[jj * KSTR4 + c]);
#pragma unroll
          for (int rr = 0; rr < DR; ++rr)
#pragma unroll
            for (int e = 0; e < CH; ++e)
              acc[rr][cc * CH + e] = fma(p[rr], fv_at(vf, e), acc[rr][cc * CH + e]);
        }
      }
#pragma unroll
      for (int rr = 0; rr < DR; ++rr)
        l[rr] += p[rr];
    }
  }

  /* The key slices' sums added in order: each slice's accumulators and l_i
   * through local memory (the tiles' space), then item lid ends outputs
   * lid, lid + NTD, .. of the DR x HD. */
  __local float *sum = (__local float *)tiles;
  __local float *lsum = Ss;
  barrier(CLK_LOCAL_MEM_FENCE);
  {
    const int ks = lid / NCH % NKS;
#pragma unroll
    for (int cc = 0; cc < CPI; ++cc) {
      const int c = lid % NCH + cc * NTD;
      if (c < NCH && lid < NCH * NKS)
#pragma unroll
        for (int rr = 0; rr < DR; ++rr)
#pragma unroll
          for (int e = 0; e < CH; ++e)
            sum[(ks * DR + rr) * HD + c * CH + e] = acc[rr][cc * CH + e];
    }
    if (lid % NCH == 0 && lid < NCH * NKS)
#pragma unroll
      for (int rr = 0; rr < DR; ++rr)
        lsum[ks * DR + rr] = l[rr];
  }
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int e = lid; e < DR * HD; e += NTD) {
    const int rr = e / HD, c = e % HD;
    if (rr >= w.nr || c >= d) continue;
    float a = 0.0f, lr = 0.0f;
    for (int ks = 0; ks < NKS; ++ks) {
      a += sum[(ks * DR + rr) * HD + c];
      lr += lsum[ks * DR + rr];
    }
    const int h = w.hh[rr], i = w.ri[rr];
    const float mr = m[rr];
    if (nsplit == 1) {
      float div, lse_hi, lse_lo;
      const float fold = row_end_at(i, nq, nk, wl, wr, SINK_OF(h), mr, lr, &div, &lse_hi, &lse_lo);
      __global T *op = HEAD_ROWS(o, oo, os, b, h, seq.q0 + i);
      STORE(op, c * os.s3, a * fold / div);
      if (lse && c == 0) {
        __global float *lp = HEAD_ROWS(lse, lo_, ls, b, h, seq.q0 + i);
        lp[0] = lse_hi;
        if (ls.s3) lp[ls.s3] = lse_lo;
      }
    } else {
      const long pr = PART_ROW(split, h, heads, tq, seq.qflat + i);
      part_o[pr * HD + c] = a;
      if (c == 0) {
        part_ml[2 * pr] = mr;
        part_ml[2 * pr + 1] = lr;
      }
    }
  }
}
