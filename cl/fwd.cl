/*
 * Forward pass, FlashAttention steps 1-4 for one block of Br query rows of
 * one (sequence, head):
 *   for each key tile of Bc keys that some row of the block can see
 *     S = Q K^T            (register tile of TM x TN per work-item,
 *                            Q and K staged in local memory DK columns at a time)
 *     S -> scale, softcap, ALiBi, mask
 *     m_i' = max(m_i, rowmax S)            (one exchange through local memory)
 *     P = exp(S - m_i'), l_i = l_i e^(m_i - m_i') + rowsum P
 *     O = O e^(m_i - m_i') + P V           (P and V staged in local memory)
 *   O /= l_i, lse = m_i + log l_i
 * The running m_i, l_i and O stay in private memory for the whole pass.
 *
 * Work-items form a TY x TX grid (TX = 16). Item (ty, tx) owns query rows
 * ty*TM .. ty*TM+TM-1, score columns tx + 16 n (n < Bc/16) and output
 * columns tx + 16 n (n < HD/16). Q is staged column-major and K row-major:
 * per 4 columns of the head dimension an item reads its TM query values of
 * each column as float4s (rows are contiguous; the items of a row share
 * them), and its TN keys' 4 values as one float4 each (rows KSTR = DK + 4
 * floats apart, so the 16 keys of a row of items fall in distinct bank
 * groups): TM + TN local reads per 4 TM TN FMAs.
 *
 * When HD/16 is a multiple of 4 the output columns are instead groups of 4
 * (tx*4 + 64 g + 0..3), so that V is read as float4s: half the local-memory
 * instructions of P V for the same bytes.
 *
 * The -D parameters below are chosen by the host per device (cl/plan.c);
 * the defaults are the tiles of a CPU device at HD = 64, so that the file
 * compiles on its own after common.cl. Window, causal, softcap and ALiBi are
 * run-time arguments so that one program serves them all.
 */
#ifndef HD
#define HD 64 /* the head dimension rounded up: 32, 64, then a multiple of 32 */
#endif
#ifndef BR
#define BR 64 /* Br: query rows per work-group */
#endif
#ifndef BC
#define BC 64 /* Bc: keys per tile, a multiple of 16 */
#endif
#ifndef TM
#define TM 8 /* query rows per work-item, a multiple of 4 dividing BR */
#endif
#ifndef DK
#define DK 16 /* Q/K columns per staging step */
#endif
#ifndef JK
#define JK 16 /* V rows per staging step, dividing BC */
#endif
#define TX 16
#define TY (BR / TM)
#define NT (TX * TY)
#define TN (BC / TX)
#define TD (HD / TX)
#define QSTR (BR + 4) /* +4 keeps float4 alignment and halves store conflicts */
#define KSTR (DK + 4) /* K rows: float4-aligned, 16 of them in distinct bank groups */
#define PSTR (BR + 4)
#define VV (TD % 4 == 0)                  /* V read as float4 */
#define QK4 ((DK * QSTR + BC * KSTR) / 4) /* float4s of the Q and K chunks */
#define PV4 ((BC * PSTR + JK * HD) / 4)   /* of P and the V chunk */
#define MAX4(a, b) ((a) > (b) ? (a) : (b))

/* Staging goes through registers: each item loads its share of the next
 * chunk (Q and K columns, or V rows) from global memory before the current
 * chunk is multiplied, so the loads' latency hides behind the FMAs, and
 * stores it to local memory after the next barrier. An item stages column
 * sc of rows sr, sr + RS, ... of a Q/K chunk. The host keeps DK dividing NT
 * and DK*BR, DK*BC multiples of NT. */
#define QPT (DK * BR / NT)
#define KPT (DK * BC / NT)
#define VPT ((JK * HD + NT - 1) / NT)
#define RS (NT / DK)

/* Output column n of work-item tx. */
#if VV
#define OCOL(tx, n) ((tx)*4 + ((n) / 4) * 64 + (n) % 4)
#else
#define OCOL(tx, n) ((tx) + TX * (n))
#endif

/* The next Q and K chunk (columns c0.. of query rows r0.. and keys j0..)
 * into registers, zero past the ends. */
inline void load_qk(float *qreg, float *kreg, __global const T *qp, long4 qs, __global const T *kp,
                    long4 ks, int r0, int j0, int c0, int sc, int sr, int nq, int nk,
                    int d KEY_PAGES_PARAM) {
  const int cc = c0 + sc;
#pragma unroll
  for (int u = 0; u < QPT; ++u) {
    const int r = r0 + sr + u * RS;
    qreg[u] = (r < nq && cc < d) ? LOAD(qp, r * qs.s1 + cc * qs.s3) : 0.0f;
  }
#pragma unroll
  for (int u = 0; u < KPT; ++u) {
    const int j = j0 + sr + u * RS;
    kreg[u] = (j < nk && cc < d) ? LOAD(kp, KEY_ROW(j, ks) + cc * ks.s3) : 0.0f;
  }
}

/* An item's TM rows of one column of a column-major local tile (Q or P),
 * from p[0 .. TM/4 - 1]. */
inline void load_rows(float *a, __local const float4 *p) {
#pragma unroll
  for (int u = 0; u < TM / 4; ++u) {
    const float4 t4 = p[u];
    a[4 * u + 0] = t4.s0;
    a[4 * u + 1] = t4.s1;
    a[4 * u + 2] = t4.s2;
    a[4 * u + 3] = t4.s3;
  }
}

/* The next V chunk (keys jv .. jv+JK-1, all columns) into registers. */
inline void load_v(float *vreg, __global const T *vp, long4 vs, int jv, int lid, int nk,
                   int d KEY_PAGES_PARAM) {
#pragma unroll
  for (int u = 0; u < VPT; ++u) {
    const int e = lid + u * NT, c = e % HD, j = jv + e / HD;
    vreg[u] = (e < JK * HD && j < nk && c < d) ? LOAD(vp, KEY_ROW(j, vs) + c * vs.s3) : 0.0f;
  }
}

__kernel __attribute__((reqd_work_group_size(NT, 1, 1))) void attn_fwd(FWD_ARGS) {
  /* Q and K chunks live only during Q K^T, P and V only during P V, with a
   * barrier between the phases: they share one buffer. */
  __local float4 tiles4[MAX4(QK4, PV4)];
  __local float4 red4[BR * TX / 4];
  __local float4 *Qs4 = tiles4, *Ks4 = tiles4 + DK * QSTR / 4;
  __local float4 *Ps4 = tiles4, *Vs4 = tiles4 + BC * PSTR / 4;
  __local float *Qs = (__local float *)Qs4;
  __local float *Ks = (__local float *)Ks4;
  __local float *Ps = (__local float *)Ps4;
  __local float *red = (__local float *)red4;
  __local float *Vs = (__local float *)Vs4;

  const int lid = get_local_id(0), tx = lid % TX, ty = lid / TX;
  FWD_BLOCK(BR);

  /* The keys some row of the block can see. */
  int lo, hi;
  key_block_range(r0, min(r0 + BR, nq), nq, nk, wl, wr, &lo, &hi);
  const float slope = alibi ? alibi[h] : 0.0f;
  /* No softcap and no ALiBi: a tile that every row sees whole needs only
   * the scale, which skips the mask on most tiles of a long sequence. */
  const int plain = softcap == 0.0f && slope == 0.0f && r0 + BR <= nq;
  int all_lo, all_hi;
  key_block_common(r0, r0 + BR, nq, nk, wl, wr, &all_lo, &all_hi);

  float m_i[TM], l_i[TM], acc[TM][TD];
#pragma unroll
  for (int i = 0; i < TM; ++i) {
    m_i[i] = -INFINITY;
    l_i[i] = 0.0f;
#pragma unroll
    for (int n = 0; n < TD; ++n)
      acc[i][n] = 0.0f;
  }

  const int sc = lid % DK, sr = lid / DK;
  float qreg[QPT], kreg[KPT], vreg[VPT];
  /* This split's share of the key tiles. */
  int j0, jend;
  split_keys(lo, hi, BC, split, nsplit, &j0, &jend);
  if (j0 < jend) load_qk(qreg, kreg, qp, qs, kp, ks, r0, j0, 0, sc, sr, nq, nk, d KEY_PAGES);
  for (; j0 < jend; j0 += BC) {
#if HAS_BIAS
    /* The tile's bias, in flight during Q K^T: read where the scores need
     * it, its latency would stall every tile. Past the sequence: 0, unread. */
    float bv[TM][TN];
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
      for (int n = 0; n < TN; ++n) {
        const int r = r0 + ty * TM + i, j = j0 + tx + TX * n;
        bv[i][n] = bias_at(bias, bias_h, bias_s, r, j, nq, nk);
      }
#endif
    /* S = Q K^T, DK columns of the head dimension at a time. */
    float s[TM][TN];
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
      for (int n = 0; n < TN; ++n)
        s[i][n] = 0.0f;
    for (int c0 = 0; c0 < d; c0 += DK) {
#pragma unroll
      for (int u = 0; u < QPT; ++u)
        Qs[sc * QSTR + sr + u * RS] = qreg[u];
#pragma unroll
      for (int u = 0; u < KPT; ++u)
        Ks[(sr + u * RS) * KSTR + sc] = kreg[u];
      barrier(CLK_LOCAL_MEM_FENCE);
      if (c0 + DK < d)
        load_qk(qreg, kreg, qp, qs, kp, ks, r0, j0, c0 + DK, sc, sr, nq, nk, d KEY_PAGES);
#pragma unroll
      for (int c4 = 0; c4 < DK; c4 += 4) {
        float4 k4[TN];
#pragma unroll
        for (int n = 0; n < TN; ++n)
          k4[n] = Ks4[((tx + TX * n) * KSTR + c4) / 4];
#pragma unroll
        for (int cc = 0; cc < 4; ++cc) {
          float a[TM];
          load_rows(a, Qs4 + ((c4 + cc) * QSTR + ty * TM) / 4);
#pragma unroll
          for (int i = 0; i < TM; ++i)
#pragma unroll
            for (int n = 0; n < TN; ++n) {
              const float kv = cc == 0   ? k4[n].s0
                               : cc == 1 ? k4[n].s1
                               : cc == 2 ? k4[n].s2
                                         : k4[n].s3;
              s[i][n] = fma(a[i], kv, s[i][n]);
            }
        }
      }
      barrier(CLK_LOCAL_MEM_FENCE);
    }

    load_v(vreg, vp, vs, j0, lid, nk, d KEY_PAGES); /* in flight during the softmax */

    /* Scores, mask, and this item's share of each row's maximum. */
    const int whole = plain && j0 >= all_lo && j0 + BC <= all_hi;
#pragma unroll
    for (int i = 0; i < TM; ++i) {
      const int r = r0 + ty * TM + i, dg = diag(r, nq, nk);
      float mt = -INFINITY;
#pragma unroll
      for (int n = 0; n < TN; ++n) {
        const int j = j0 + tx + TX * n;
        float t;
        /* One product for both paths, before the branch. */
        const float x = s[i][n] * scale;
#if HAS_BIAS
        if (whole) {
          s[i][n] = x + bv[i][n];
        } else {
          const int in = r < nq && j < nk && key_visible(dg, j, wl, wr);
          s[i][n] = in ? score_scaled(x, softcap, slope, dg - j, &t) + bv[i][n] : -INFINITY;
        }
#else
        if (whole) {
          s[i][n] = x;
        } else {
          const float v = score_scaled(x, softcap, slope, dg - j, &t);
          s[i][n] = (r < nq && j < nk && key_visible(dg, j, wl, wr)) ? v : -INFINITY;
        }
#endif
        mt = fmax(mt, s[i][n]);
      }
      red[(ty * TM + i) * TX + tx] = mt;
    }
    barrier(CLK_LOCAL_MEM_FENCE);

    /* Online softmax. Every item of a row computes the same m_i from the same
     * values, so the per-item partial sums l_i stay consistent and are added
     * up only once, at the end. A row with no visible key so far keeps
     * m_i = -inf; subtracting 0 instead keeps exp() at 0 rather than NaN. */
#pragma unroll
    for (int i = 0; i < TM; ++i) {
      float mx = m_i[i];
#pragma unroll
      for (int t = 0; t < TX / 4; ++t) {
        const float4 r4 = red4[(ty * TM + i) * (TX / 4) + t];
        mx = fmax(mx, fmax(fmax(r4.s0, r4.s1), fmax(r4.s2, r4.s3)));
      }
      const float mu = mx == -INFINITY ? 0.0f : mx;
      const float alpha = EXP_FROM(m_i[i], mu);
      m_i[i] = mx;
      l_i[i] *= alpha;
#pragma unroll
      for (int n = 0; n < TD; ++n)
        acc[i][n] *= alpha;
#pragma unroll
      for (int n = 0; n < TN; ++n) {
        const float p = EXP_FROM(s[i][n], mu);
        l_i[i] += p;
        Ps[(tx + TX * n) * PSTR + ty * TM + i] = p;
      }
    }

    /* O += P V, JK keys at a time. */
    for (int jj = 0; jj < BC && j0 + jj < nk; jj += JK) {
#pragma unroll
      for (int u = 0; u < VPT; ++u)
        if (lid + u * NT < JK * HD) Vs[lid + u * NT] = vreg[u];
      barrier(CLK_LOCAL_MEM_FENCE);
      if (jj + JK < BC && j0 + jj + JK < nk)
        load_v(vreg, vp, vs, j0 + jj + JK, lid, nk, d KEY_PAGES);
      else if (j0 + BC < jend)
        load_qk(qreg, kreg, qp, qs, kp, ks, r0, j0 + BC, 0, sc, sr, nq, nk, d KEY_PAGES);
#pragma unroll
      for (int jr = 0; jr < JK; ++jr) {
        float a[TM], vb[TD];
        load_rows(a, Ps4 + ((jj + jr) * PSTR + ty * TM) / 4);
#if VV
#pragma unroll
        for (int g = 0; g < TD / 4; ++g) {
          const float4 v4 = Vs4[(jr * HD + tx * 4 + g * 64) / 4];
          vb[4 * g + 0] = v4.s0;
          vb[4 * g + 1] = v4.s1;
          vb[4 * g + 2] = v4.s2;
          vb[4 * g + 3] = v4.s3;
        }
#else
#pragma unroll
        for (int n = 0; n < TD; ++n)
          vb[n] = Vs[jr * HD + tx + TX * n];
#endif
#pragma unroll
        for (int i = 0; i < TM; ++i)
#pragma unroll
          for (int n = 0; n < TD; ++n)
            acc[i][n] = fma(a[i], vb[n], acc[i][n]);
      }
      barrier(CLK_LOCAL_MEM_FENCE);
    }
  }

  /* l_i: add up the items' partial sums, then O / l_i and lse. */
#pragma unroll
  for (int i = 0; i < TM; ++i)
    red[(ty * TM + i) * TX + tx] = l_i[i];
  barrier(CLK_LOCAL_MEM_FENCE);
  __global T *op = HEAD_ROWS(o, oo, os, b, h, seq.q0);
  for (int i = 0; i < TM; ++i) {
    const int r = r0 + ty * TM + i;
    float l = 0.0f;
    for (int t = 0; t < TX; ++t)
      l += red[(ty * TM + i) * TX + t];
#if SPLIT
    /* The part, unnormalized: the merge ends the row. */
    if (r < nq) {
      const long pr = PART_ROW(split, h, get_num_groups(1), tq, seq.qflat + r);
      for (int n = 0; n < TD; ++n)
        part_o[pr * HD + OCOL(tx, n)] = acc[i][n];
      if (tx == 0) {
        part_ml[2 * pr] = m_i[i];
        part_ml[2 * pr + 1] = l;
      }
    }
#elif HAS_SINKS || HAS_BIAS
    /* The row's end by the rules (row_end): with a bias, a row whose scores
     * the bias all hid saw no key; with sinks, every row has an lse. */
    float div, lse_hi, lse_lo;
    const float fold = row_end_at(r, nq, nk, wl, wr, SINK_OF(h), m_i[i], l, &div, &lse_hi, &lse_lo);
    if (r < nq) {
      for (int n = 0; n < TD; ++n) {
        const int c = OCOL(tx, n);
        if (c < d) STORE(op, r * os.s1 + c * os.s3, acc[i][n] * fold / div);
      }
      if (lse && tx == 0) {
        __global float *lp = HEAD_ROWS(lse, lo_, ls, b, h, seq.q0 + r);
        lp[0] = lse_hi;
        if (ls.s3) lp[ls.s3] = lse_lo;
      }
    }
#else
    /* The mask says whether the row saw a key, not l: a NaN or inf among its
     * scores leaves l NaN (or 0 when all are -inf), and the row must then
     * come out NaN rather than as a row that saw nothing. */
    int klo, khi;
    key_range(diag(r, nq, nk), nk, wl, wr, &klo, &khi);
    const int seen = klo < khi;
    if (r < nq) {
      for (int n = 0; n < TD; ++n) {
        const int c = OCOL(tx, n);
        if (c < d) STORE(op, r * os.s1 + c * os.s3, seen ? acc[i][n] / l : 0.0f);
      }
      if (lse && tx == 0) {
        /* ls.s3 > 0: the (hi, lo) form, lo that far past hi. */
        __global float *lp = HEAD_ROWS(lse, lo_, ls, b, h, seq.q0 + r);
        float lo = 0.0f;
        lp[0] = !seen ? -INFINITY : l > 0.0f ? lse_split(m_i[i], log(l), &lo) : (lo = NAN);
        if (ls.s3) lp[ls.s3] = lo;
      }
    }
#endif
  }
}
