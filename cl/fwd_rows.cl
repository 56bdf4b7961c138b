/*
 * Forward pass shaped for CPU devices (PoCL): one work-item per work-group,
 * each running a block of RB query rows of one (sequence, head) through the
 * same FlashAttention steps as fwd.cl:
 *   for each tile of KB keys that some row of the block can see
 *     stage K and V rows as f32 (read straight from global memory: the CPU's
 *     caches do what local memory does on a GPU)
 *     S = Q K^T            (dot products over float8s of the head dimension)
 *     S -> scale, softcap, ALiBi, mask, bias       (common.cl's rules)
 *     m_i' = max(m_i, rowmax S), P = exp(S - m_i'),
 *     l_i = l_i e^(m_i - m_i') + rowsum P, O = O e^(m_i - m_i') + P V
 *   O /= l_i, lse = m_i + log l_i                    (row_end_at)
 *
 * Why this shape: PoCL runs a work-group as loops over its items between
 * barriers, and vectorizes only across items, so fwd.cl's 128-item groups
 * spend their time in those loops and in local-memory copies. A single item
 * has neither; its vector types become the CPU's SIMD registers. The
 * products are register blocks of 4 rows x 16 keys (Q K^T, over K^T staged
 * 8 keys to a float8: six loads per eight FMAs) and 2 rows x 4 float8
 * columns (P V: the same ratio), so that the FMA units, not the loads, set
 * the pace. The exponentials run on float8s.
 *
 * The -D parameters (cl/plan.c's tiles table, CPU class): RB, a multiple
 * of 8, and KB, a multiple of 16. RB * HD and KB * HD floats each stay
 * within a CPU's L1 or L2 cache.
 */
/* HD, NV, RB, KB and the rows' helpers (load_row, transpose8, rows_dot_keys):
 * common.cl. */

__kernel __attribute__((reqd_work_group_size(1, 1, 1))) void attn_fwd_rows(FWD_ARGS) {
  FWD_BLOCK(RB);
  const float slope = alibi ? alibi[h] : 0.0f;
  /* No softcap and no ALiBi: a run of keys that a row sees whole needs only
   * the scale (and the bias, 8 keys a load). */
  const int plain = softcap == 0.0f && slope == 0.0f;

  float8 qr[RB][NV], acc[RB][NV], kt[KB][NV], vt[KB][NV], ktr[HD][KB / 8];
  float s[RB][KB], m_i[RB], l_i[RB], alpha[RB];
  const float *qf = (const float *)qr; /* row i, column c: qf[i * HD + c] */
  int klo[RB], khi[RB];
  for (int i = 0; i < RB; ++i) {
    const int r = r0 + i;
    if (r < nq) {
      load_row(qr[i], qp + r * qs.s1, qs.s3, d);
      key_range(diag(r, nq, nk), nk, wl, wr, &klo[i], &khi[i]);
    } else {
      for (int c = 0; c < NV; ++c)
        qr[i][c] = 0.0f;
      klo[i] = khi[i] = 0; /* past the sequence: sees nothing */
    }
    for (int c = 0; c < NV; ++c)
      acc[i][c] = 0.0f;
    m_i[i] = -INFINITY;
    l_i[i] = 0.0f;
  }

  /* The keys some row of the block can see. */
  int lo, hi;
  key_block_range(r0, min(r0 + RB, nq), nq, nk, wl, wr, &lo, &hi);
  /* This split's share of the key tiles. */
  int j0, jend;
  split_keys(lo, hi, KB, split, nsplit, &j0, &jend);
  for (; j0 < jend; j0 += KB) {
    /* Keys past the range are padding: zero K and V rows, masked scores. */
    const int kn = min(KB, jend - j0);
    for (int j = 0; j < KB; ++j) {
      if (j < kn) {
        load_row(kt[j], kp + KEY_ROW(j0 + j, ks), ks.s3, d);
        load_row(vt[j], vp + KEY_ROW(j0 + j, vs), vs.s3, d);
      } else {
        for (int c = 0; c < NV; ++c)
          kt[j][c] = vt[j][c] = 0.0f;
      }
    }

    /* K^T, 8 keys to a float8. */
    for (int g = 0; g < KB / 8; ++g)
      for (int c = 0; c < NV; ++c) {
        float8 r[8], t[8];
        for (int u = 0; u < 8; ++u)
          r[u] = kt[8 * g + u][c];
        transpose8(t, r);
        for (int u = 0; u < 8; ++u)
          ktr[8 * c + u][g] = t[u];
      }

    /* S = Q K^T, bit-identical to the backward's (common.cl). */
    rows_dot_keys(s, qf, ktr, kn);

    /* Scores, mask and each row's new max, row by row, 8 keys at a time. */
    float mx_i[RB];
    for (int i = 0; i < RB; ++i) {
      const int r = r0 + i, dg = diag(r, nq, nk);
      float mx = m_i[i];
      for (int j = 0; j < KB; j += 8) {
        const int jg = j0 + j;
        float x[8];
        vstore8(vload8(0, &s[i][j]) * scale, 0, x);
        if (plain && jg >= klo[i] && jg + 8 <= khi[i] && jg + 8 <= jend) {
#if HAS_BIAS
          vstore8(vload8(0, x) + load_any8(bias, BIAS_DTYPE,
                                           bias_h + r * bias_s.s2 + jg * bias_s.s3, bias_s.s3),
                  0, x);
#endif
        } else {
          for (int e = 0; e < 8; ++e) {
            const int jj = jg + e;
            float tc;
            const int in = r < nq && jj < jend && jj < nk && key_visible(dg, jj, wl, wr);
#if HAS_BIAS
            x[e] = in ? score_scaled(x[e], softcap, slope, dg - jj, &tc) +
                            load_any(bias, BIAS_DTYPE, bias_h + r * bias_s.s2 + jj * bias_s.s3)
                      : -INFINITY;
#else
            x[e] = in ? score_scaled(x[e], softcap, slope, dg - jj, &tc) : -INFINITY;
#endif
          }
        }
        const float8 x8 = vload8(0, x);
        vstore8(x8, 0, &s[i][j]);
        mx = fmax(mx, lane_max(x8));
      }
      mx_i[i] = mx;
    }
    /* alpha = e^(m_old - m_new), 8 rows a vector: as one scalar call per
     * row and tile (PoCL's exp2 is some 60 instructions) it cost about a
     * tenth of the forward. A row with no visible key so far keeps m_i =
     * -inf; subtracting 0 instead keeps exp() at 0 rather than NaN. */
    float mu_i[RB];
    for (int i = 0; i < RB; i += 8) {
      const float8 mx = vload8(0, &mx_i[i]), mu = select(mx, (float8)0.0f, isequal(mx, -INFINITY));
      vstore8(EXP_FROM(vload8(0, &m_i[i]), mu), 0, &alpha[i]);
      vstore8(mu, 0, &mu_i[i]);
      vstore8(mx, 0, &m_i[i]);
    }
    /* P = e^(S - mu) and the rows' sums. */
    for (int i = 0; i < RB; ++i) {
      const float mu = mu_i[i];
      float8 l8 = 0.0f;
      for (int j = 0; j < KB; j += 8) {
        const float8 p = EXP_FROM(vload8(0, &s[i][j]), mu);
        l8 += p;
        vstore8(p, 0, &s[i][j]);
      }
      l_i[i] = l_i[i] * alpha[i] + lane_sum(l8);
    }

    /* O = O alpha + P V, keys in order. */
    for (int i = 0; i < RB; ++i)
      for (int c = 0; c < NV; ++c)
        acc[i][c] *= alpha[i];
    sum_products(acc, RB, &s[0][0], KB, 1, vt, kn);
  }

  /* The rows' ends. */
  __global T *op = HEAD_ROWS(o, oo, os, b, h, seq.q0);
  for (int i = 0; i < RB && r0 + i < nq; ++i) {
    const int r = r0 + i;
#if SPLIT
    /* The part, unnormalized: the merge ends the row. */
    const long pr = PART_ROW(split, h, get_num_groups(1), tq, seq.qflat + r);
    for (int c = 0; c < NV; ++c)
      vstore8(acc[i][c], c, part_o + pr * HD);
    part_ml[2 * pr] = m_i[i];
    part_ml[2 * pr + 1] = l_i[i];
#else
    float div, lse_hi, lse_lo;
    const float fold =
        row_end_at(r, nq, nk, wl, wr, SINK_OF(h), m_i[i], l_i[i], &div, &lse_hi, &lse_lo);
    for (int c = 0; c < NV; ++c) {
      float x[8];
      vstore8(acc[i][c] * fold / div, 0, x);
      for (int e = 0; e < 8 && c * 8 + e < d; ++e)
        STORE(op, r * os.s1 + (c * 8 + e) * os.s3, x[e]);
    }
    if (lse) {
      __global float *lp = HEAD_ROWS(lse, lo_, ls, b, h, seq.q0 + r);
      lp[0] = lse_hi;
      if (ls.s3) lp[ls.s3] = lse_lo;
    }
#endif
  }
}
