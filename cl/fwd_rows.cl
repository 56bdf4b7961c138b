/*
 * Forward pass shaped for CPU devices (PoCL): one work-item per work-group,
 * each running a block of RB query rows of one (sequence, head) through the
 * same FlashAttention steps as fwd.cl:
 *   stage Q^T (8 rows to a float8) once
 *   for each tile of KB keys that some row of the block can see
 *     stage K and V rows as f32 (read straight from global memory: the CPU's
 *     caches do what local memory does on a GPU)
 *     S^T = K Q^T          (dot products over the head dimension)
 *     S -> scale, softcap, ALiBi, mask, bias       (common.cl's rules)
 *     m_i' = max(m_i, rowmax S), P = exp(S - m_i'),
 *     l_i = l_i e^(m_i - m_i') + rowsum P, O = O e^(m_i - m_i') + P V
 *   O /= l_i, lse = m_i + log l_i                    (row_end_at)
 *
 * Why this shape: PoCL runs a work-group as loops over its items between
 * barriers, and vectorizes only across items, so fwd.cl's 128-item groups
 * spend their time in those loops and in local-memory copies. A single item
 * has neither; its vector types become the CPU's SIMD registers. The
 * products are register blocks of 4 keys x 2 vectors of rows (K Q^T: six
 * loads per eight FMAs) and 2 rows x 4 vectors of columns (P V: the same
 * ratio), so that the FMA units, not the loads, set the pace; a vector is
 * VW floats, as wide as the device's SIMD. Scores held transposed, 8
 * rows to a float8, let the key tiles serve as loaded (no transpose a
 * tile) and the row max, exponentials and sums run down the keys on whole
 * vectors.
 *
 * The -D parameters (cl/plan.c's tiles table, CPU class): RB, a multiple
 * of 16, and KB, a multiple of 16 (of 32 both, and HD of 64, where VW, the
 * products' vector width, is 16). RB * HD and KB * HD floats each stay
 * within a CPU's L1 or L2 cache.
 */
/* HD, NV, RB, KB and the rows' helpers (load_row, stage_t, keys_dot_rows):
 * common.cl. */

__kernel __attribute__((reqd_work_group_size(1, 1, 1))) void attn_fwd_rows(FWD_ARGS) {
  FWD_BLOCK(RB);
  const float slope = alibi ? alibi[h] : 0.0f;
  /* No softcap and no ALiBi: a key that a vector of rows sees needs only
   * the scale (and the bias, a vector load). */
  const int plain = softcap == 0.0f && slope == 0.0f;

  /* S^T = K Q^T over Q^T staged once, so that the key tiles serve as
   * loaded and the softmax runs VW rows a vector down the keys. */
  float8 qt[HD][RB / 8], acc[RB][NV], kt[KB][NV], vt[KB][NV];
  float s[KB][RB], m_i[RB], l_i[RB];
  int klo[RB], khi[RB];
  stage_t(&qt[0][0], RB / 8, qp, qs, r0, min(RB, nq - r0), d);
  for (int i = 0; i < RB; ++i) {
    const int r = r0 + i;
    klo[i] = khi[i] = 0; /* past the sequence: sees nothing */
    if (r < nq) key_range(diag(r, nq, nk), nk, wl, wr, &klo[i], &khi[i]);
    for (int c = 0; c < NV; ++c)
      acc[i][c] = 0.0f;
    m_i[i] = -INFINITY;
    l_i[i] = 0.0f;
  }
  int glo[RB / VW], ghi[RB / VW];
  rows_common_keys(klo, khi, VW, glo, ghi);

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

    /* S^T, bit-identical to the backward's S (common.cl). */
    keys_dot_rows(s, (const float *)kt, qt, kn);
#if HAS_BIAS
    float bt[KB][RB];
    stage_bias_t(bt, bias, bias_h, bias_s, r0, nq, j0, jend);
    prefetch_bias_t(bias, bias_h, bias_s, r0, nq, j0 + KB, jend);
#endif

    /* Scores and mask, a vector of rows at a time down each key, and the
     * rows' new max. */
    floatv mx[RB / VW];
    for (int g = 0; g < RB / VW; ++g)
      mx[g] = VLOADV(m_i + g * VW);
    for (int j = 0; j < KB; ++j) {
      const int jg = j0 + j;
      for (int g = 0; g < RB / VW; ++g) {
        floatv x = VLOADV(s[j] + g * VW) * scale;
        if (plain && jg >= glo[g] && jg < ghi[g] && jg < jend) {
#if HAS_BIAS
          x += VLOADV(bt[j] + g * VW);
#endif
        } else {
          float y[VW];
          VSTOREV(x, y);
          for (int e = 0; e < VW; ++e) {
            const int r = r0 + VW * g + e, dg = diag(r, nq, nk);
            float tc;
            const int in = r < nq && jg < jend && jg < nk && key_visible(dg, jg, wl, wr);
#if HAS_BIAS
            y[e] = in ? score_scaled(y[e], softcap, slope, dg - jg, &tc) + bt[j][VW * g + e]
                      : -INFINITY;
#else
            y[e] = in ? score_scaled(y[e], softcap, slope, dg - jg, &tc) : -INFINITY;
#endif
          }
          x = VLOADV(y);
        }
        VSTOREV(x, s[j] + g * VW);
        mx[g] = fmax(mx[g], x);
      }
    }
    /* alpha = e^(m_old - m_new), P = e^(S - m_new) and the rows' sums. A
     * row with no visible key so far keeps m_i = -inf; subtracting 0
     * instead keeps exp() at 0 rather than NaN. */
    float alpha[RB];
    for (int g = 0; g < RB / VW; ++g) {
      const floatv mu = select(mx[g], (floatv)0.0f, isequal(mx[g], -INFINITY));
      const floatv a = EXP_FROM(VLOADV(m_i + g * VW), mu);
      floatv lv = 0.0f;
      for (int j = 0; j < KB; ++j) {
        const floatv p = EXP_FROM(VLOADV(s[j] + g * VW), mu);
        lv += p;
        VSTOREV(p, s[j] + g * VW);
      }
      VSTOREV(a, alpha + g * VW);
      VSTOREV(VLOADV(l_i + g * VW) * a + lv, l_i + g * VW);
      VSTOREV(mx[g], m_i + g * VW);
    }

    /* O = O alpha + P V, keys in order. */
    for (int i = 0; i < RB; ++i)
      for (int c = 0; c < NV; c += GV)
        VSTOREV(VLOADV(acc[i] + c) * alpha[i], acc[i] + c);
    sum_products(acc, RB, &s[0][0], 1, RB, vt, kn);
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
