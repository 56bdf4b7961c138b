/*
 * The forward pass for few query rows (decoding), FlashAttention's steps
 * 1-4 arranged to be bound by reading K and V rather than by arithmetic:
 *
 *   attn_decode        one work-group per (key split, block of DR query
 *                      rows, key/value head, sequence). The rows are those
 *                      of every query head sharing the key/value head (GQA),
 *                      so K and V are read once per key/value head, not per
 *                      query head. Per tile of NTD keys, one per item:
 *                        S = Q K^T    item j: key j against every row, its
 *                                     K row read straight into registers
 *                                     (16-byte loads, all of a row at once)
 *                        S -> scale, softcap, ALiBi, bias, mask
 *                        m_i' = max(m_i, rowmax S): partial maxima over DR
 *                                     keys, then each item over those
 *                        P = exp(S - m_i')
 *                        O = O e^(m_i - m_i') + P V (item: a 16-byte chunk
 *                                     of columns of every row, for a slice
 *                                     of the keys, V read straight into
 *                                     registers)
 *                      K and V never pass through local memory: a tile is
 *                      three barriers, and each item has a whole K row, then
 *                      a whole V slice, in flight at once, which is what
 *                      keeps the memory busy; the next tile's K row is
 *                      loaded under this tile's softmax and P V. With one
 *                      split the work-group ends its rows (O / l_i, lse,
 *                      sinks) as fwd.cl does; with several each writes its
 *                      part (O, m_i, l_i) to the workspace.
 *   attn_split_merge   (split.cl) the parts merged, the rows ended.
 *
 * Splitting the keys (flash-decoding) is what fills the device when the
 * sequences and heads alone give too few work-groups: the host chooses the
 * number (cl/plan.c), each work-group takes its share of its own key range.
 */
#ifndef HD
#define HD 64 /* the head dimension rounded up: 32, 64, then a multiple of 32 */
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
/* P V: item lid owns chunks lid % NCH (+ NTD ..) of keys lid / NCH +
 * NKS k of the tile. */
#define CPI (NCH > NTD ? (NCH + NTD - 1) / NTD : 1)
#define NKS (NCH < NTD ? NTD / NCH : 1)
/* The row maxima: NSEG partial maxima per row, each over DR keys. */
#define NSEG (NTD / DR)
/* Chunks an item loads before it uses them. */
#define LB 16

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

/* Chunk c of a K or V row (row: its element 0, as raw elements), zero
 * past d. vec: the host found every row 16-byte aligned with contiguous
 * columns and d a multiple of CH, so a chunk is one load. */
inline uint4 load_chunk(__global const RAW *row, int c, int d, long s3, int vec) {
  if (c * CH >= d) return (uint4)(0u);
  if (vec) return *(__global const uint4 *)(row + c * CH);
  /* Element t in the bits a 16-byte load would put it in. */
  uint wv[4] = {0u, 0u, 0u, 0u};
  for (int t = 0; t < CH; ++t)
    if (c * CH + t < d)
      wv[t * sizeof(RAW) / 4] |= (uint)row[(c * CH + t) * s3]
                                 << (8 * sizeof(RAW) * (t % (4 / sizeof(RAW))));
  return (uint4)(wv[0], wv[1], wv[2], wv[3]);
}

/* Chunks c0 .. c0 + LB - 1 of key row kr into kc, zero past the row or
 * for no row (kr NULL). */
inline void load_k(uint4 *kc, __global const RAW *kr, int c0, int d, long s3, int vec) {
#pragma unroll
  for (int u = 0; u < LB; ++u)
    kc[u] = kr && c0 + u < NCH ? load_chunk(kr, c0 + u, d, s3, vec) : (uint4)(0u);
}

__kernel __attribute__((reqd_work_group_size(NTD, 1, 1))) void attn_decode(DECODE_ARGS) {
  __local FV Qv[DR * NCH];                /* Q as floats; at the end the key slices' sums */
  __local float4 Ss4[(NTD * DR + 3) / 4]; /* S, key-major */
  __local float *Ss = (__local float *)Ss4;
  __local float red[NTD]; /* the rows' partial maxima, segment-major */
  __local float lsum[DR];
#if PAGED
  __local long vrow[NTD]; /* the tile's keys' V rows */
#endif

  const int lid = get_local_id(0);
  DECODE_BLOCK(w);

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

  /* Per row: the running m_i, l_i (over this item's key slice) and O, its
   * diagonal, ALiBi slope and bias row. */
  const int slice = lid / NCH % NKS;
  float m[DR], l[DR], acc[DR][CPI * CH];
  int dg[DR];
  float slope[DR];
#if HAS_BIAS
  long brow[DR];
#endif
#pragma unroll
  for (int rr = 0; rr < DR; ++rr) {
    m[rr] = -INFINITY;
    l[rr] = 0.0f;
#pragma unroll
    for (int e = 0; e < CPI * CH; ++e)
      acc[rr][e] = 0.0f;
    dg[rr] = diag(w.ri[rr], nq, nk);
    slope[rr] = alibi ? alibi[w.hh[rr]] : 0.0f;
#if HAS_BIAS
    brow[rr] = bias_o + b * bias_s.s0 + w.hh[rr] * bias_s.s1 + w.ri[rr] * bias_s.s2;
#endif
  }

  /* The first LB chunks of each tile's key row are loaded a tile ahead,
   * under the softmax and P V of the tile before. */
  uint4 kn[LB];
  load_k(kn, t0 < t1 && t0 * NTD + lid < hi ? kp + KEY_ROW(t0 * NTD + lid, ks) : 0, 0, d, ks.s3,
         vec);
  for (int t = t0; t < t1; ++t) {
    const int j0 = t * NTD, j = j0 + lid;
    barrier(CLK_LOCAL_MEM_FENCE); /* the last tile's reads of S and the maxima are done */

    /* S of key j against every row, masked; the row's chunks loaded
     * before they are used. */
    {
      float s[DR];
#pragma unroll
      for (int rr = 0; rr < DR; ++rr)
        s[rr] = 0.0f;
      if (j < hi) {
        __global const RAW *kr = kp + KEY_ROW(j, ks);
#if PAGED
        vrow[lid] = KEY_ROW(j, vs);
#endif
        for (int c0 = 0; c0 < NCH; c0 += LB) {
          uint4 kc[LB];
          if (c0 == 0) {
#pragma unroll
            for (int u = 0; u < LB; ++u)
              kc[u] = kn[u];
          } else {
            load_k(kc, kr, c0, d, ks.s3, vec);
          }
#pragma unroll
          for (int u = 0; u < LB; ++u) {
            const FV kf = unpack(kc[u]);
#pragma unroll
            for (int rr = 0; rr < DR; ++rr)
              if (c0 + u < NCH) s[rr] = dot_fv(Qv[rr * NCH + c0 + u], kf, s[rr]);
          }
        }
      }
      load_k(kn, t + 1 < t1 && j + NTD < hi ? kp + KEY_ROW(j + NTD, ks) : 0, 0, d, ks.s3, vec);
#pragma unroll
      for (int rr = 0; rr < DR; ++rr) {
        float th;
        const float x = score(s[rr], scale, softcap, slope[rr], dg[rr] - j, &th);
        const int in = rr < w.nr && j >= lo && j < hi && key_visible(dg[rr], j, wl, wr);
#if HAS_BIAS
        Ss[lid * DR + rr] =
            in ? x + load_any(bias, BIAS_DTYPE, brow[rr] + j * bias_s.s3) : -INFINITY;
#else
        Ss[lid * DR + rr] = in ? x : -INFINITY;
#endif
      }
    }
    barrier(CLK_LOCAL_MEM_FENCE);

    /* Each row's maximum: NSEG items per row over DR keys each, then every
     * item over those. */
    {
      const int rr = lid % DR, seg = lid / DR;
      float mt = -INFINITY;
      for (int u = 0; u < DR; ++u)
        mt = fmax(mt, Ss[(seg + u * NSEG) * DR + rr]);
      red[seg * DR + rr] = mt;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    float mu[DR];
#pragma unroll
    for (int rr = 0; rr < DR; ++rr)
      mu[rr] = m[rr];
    for (int seg = 0; seg < NSEG; ++seg) {
#pragma unroll
      for (int rr = 0; rr < DR; ++rr)
        mu[rr] = fmax(mu[rr], red[seg * DR + rr]);
    }

    /* Every row's accumulators rescaled. A row with no visible key yet
     * keeps m_i = -inf and subtracts 0 (exp stays 0). */
#pragma unroll
    for (int rr = 0; rr < DR; ++rr) {
      const float mn = mu[rr];
      mu[rr] = mn == -INFINITY ? 0.0f : mn;
      const float alpha = EXP_FROM(m[rr], mu[rr]);
      m[rr] = mn;
      l[rr] *= alpha;
#pragma unroll
      for (int e = 0; e < CPI * CH; ++e)
        acc[rr][e] *= alpha;
    }

    /* O += P V over this item's chunks and key slice, LB keys' V chunks
     * loaded before they are used. */
    for (int jb = slice; jb < NTD; jb += LB * NKS) {
#pragma unroll
      for (int cc = 0; cc < CPI; ++cc) {
        const int c = lid % NCH + cc * NTD;
        uint4 vc[LB];
#pragma unroll
        for (int u = 0; u < LB; ++u) {
          const int jj = jb + u * NKS, jv = j0 + jj;
          vc[u] = (uint4)(0u);
#if PAGED
          if (jj < NTD && jv < hi && c < NCH) vc[u] = load_chunk(vp + vrow[jj], c, d, vs.s3, vec);
#else
          if (jj < NTD && jv < hi && c < NCH)
            vc[u] = load_chunk(vp + (long)jv * vs.s1, c, d, vs.s3, vec);
#endif
        }
#pragma unroll
        for (int u = 0; u < LB; ++u) {
          const int jj = jb + u * NKS;
          if (jj >= NTD) break;
          const FV vf = unpack(vc[u]);
#pragma unroll
          for (int rr = 0; rr < DR; ++rr) {
            const float p = EXP_FROM(Ss[jj * DR + rr], mu[rr]);
            if (cc == 0) l[rr] += p;
#pragma unroll
            for (int e = 0; e < CH; ++e)
              acc[rr][cc * CH + e] = fma(p, fv_at(vf, e), acc[rr][cc * CH + e]);
          }
        }
      }
    }
  }

  /* The key slices' sums added in order, through local memory (Q's
   * space): slice 0 writes, the others add in turn; then item lid ends
   * outputs lid, lid + NTD, .. of the DR x HD. */
  __local float *sum = Qs;
  for (int ks2 = 0; ks2 < NKS; ++ks2) {
    barrier(CLK_LOCAL_MEM_FENCE);
    if (slice == ks2 && lid < NCH * NKS) {
#pragma unroll
      for (int cc = 0; cc < CPI; ++cc) {
        const int c = lid % NCH + cc * NTD;
        if (c < NCH)
#pragma unroll
          for (int rr = 0; rr < DR; ++rr)
#pragma unroll
            for (int e = 0; e < CH; ++e) {
              const int i = rr * HD + c * CH + e;
              sum[i] = ks2 ? sum[i] + acc[rr][cc * CH + e] : acc[rr][cc * CH + e];
            }
      }
      if (lid % NCH == 0)
#pragma unroll
        for (int rr = 0; rr < DR; ++rr)
          lsum[rr] = ks2 ? lsum[rr] + l[rr] : l[rr];
    }
  }
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int e = lid; e < DR * HD; e += NTD) {
    const int rr = e / HD, c = e % HD;
    if (rr >= w.nr || c >= d) continue;
    const float a = sum[e], lr = lsum[rr];
    const int h = w.hh[rr], i = w.ri[rr];
    const float mr = m[rr];
    DECODE_OUT(i, h, c, a, mr, lr);
  }
}
