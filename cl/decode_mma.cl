/*
 * attn_decode on NVIDIA's tensor cores (sm_80 and later; the PTX and the
 * staging are mma.cl's, which precedes this file): the vendor path beside
 * decode.cl for f16 and bf16, with its arguments, grid, rows (rows_of) and
 * parts (split.cl). A work-group of 4 warps takes DR = 16 rows, the M (MR) of
 * m16n8k16, those of every query head sharing the key/value head, so that
 * K and V are read once per key/value head. Per tile of MC = 64 keys:
 *   K and V by cp.async, which holds no register in flight (fwd_mma.cl's
 *   schedule: V lands under the tile's Q K^T and softmax, the next tile's
 *   K under its P V);
 *   warp w takes keys 16 w .. 16 w + 15 against all 16 rows: S = Q K^T
 *   (two 8-key tiles, Q's fragments in registers), the rules (common.cl),
 *   an online softmax of its own (m_i, l_i, O), O += P V (one k16 step).
 * A tile thus costs a warp a few dozen instructions beside its copies,
 * where decode.cl's items each compute whole rows of scores; the warps'
 * states merge once, at the end, through local memory (merge_max,
 * merge_scale), and the rows end as decode.cl ends them, or become parts.
 * Built only where the device's config runs fwd_mma.cl (the plan); a build
 * that fails leaves the decoding to the forward kernel.
 */
#ifndef HD
#define HD 64
#endif
#define MC 64         /* keys per tile, 16 a warp */
#define KST (HD + 8)  /* K and V rows in local memory, in 16-bit elements */
#define NON (HD / 8)  /* 8-column tiles of O */
#define NQK (HD / 16) /* k16 steps of Q K^T */
#define NW (MMA_ITEMS / 32)
#define MR 16 /* the rows of m16n8k16, of which the work-group's DR (the host's 16) */
#if DR > MR || MC != 16 * NW
#error "decode_mma.cl: at most 16 rows a work-group, 16 keys a warp"
#endif

__kernel __attribute__((reqd_work_group_size(MMA_ITEMS, 1, 1))) void attn_decode_mma(DECODE_ARGS) {
  /* K's tile, then V's; Q passes through K's before the first tile, the
   * warps' O through both after the last (4 x 16 x HD floats fit in 2 x 64
   * x KST 16-bit elements). 16-byte units, for the staging's stores. */
  __local uint4 KVs_w[2 * MC * KST / 8];
  __local ushort *Ks = (__local ushort *)KVs_w, *Vs = Ks + MC * KST;
  __local float mls[NW][2][MR]; /* each warp's m_i and l_i of the rows */

  const int lid = get_local_id(0), lane = lid % 32, w = lid / 32, g = lane / 4, t = lane % 4;
  DECODE_BLOCK(rw);
  const int nr = rw.nr; /* each row's query row and head by row_of */
  KV_HEADS(RAW);

  /* Q's rows, as stored, zero past the rows and past d; then every warp's
   * A fragments of them. */
  for (int e = lid; e < MR * HD; e += MMA_ITEMS) {
    const int rr = e / HD, c = e % HD;
    int i, h;
    row_of(rb, rr, hk, group, nq, &i, &h);
    __global const ushort *qp = (__global const ushort *)HEAD_ROWS(q, qo, qs, b, h, seq.q0 + i);
    Ks[rr * KST + c] = rr < nr && c < d ? qp[c * qs.s3] : (ushort)0;
  }
  barrier(CLK_LOCAL_MEM_FENCE);
  uint qa[NQK][4];
#pragma unroll
  for (int kk = 0; kk < NQK; ++kk) {
    qa[kk][0] = word_at(Ks, g, KST, 16 * kk + 2 * t);
    qa[kk][1] = word_at(Ks, g + 8, KST, 16 * kk + 2 * t);
    qa[kk][2] = word_at(Ks, g, KST, 16 * kk + 8 + 2 * t);
    qa[kk][3] = word_at(Ks, g + 8, KST, 16 * kk + 8 + 2 * t);
  }

  /* The lane's two rows, g and g + 8: query row, diagonal, ALiBi slope,
   * bias rows; their running max, (partial) sum and O. */
  const int va = g < nr, vb = g + 8 < nr;
  int ia, ib, ha, hb;
  row_of(rb, g, hk, group, nq, &ia, &ha);
  row_of(rb, g + 8, hk, group, nq, &ib, &hb);
  const int dga = diag(ia, nq, nk), dgb = diag(ib, nq, nk);
  const float sla = alibi ? alibi[ha] : 0.0f, slb = alibi ? alibi[hb] : 0.0f;
#if HAS_BIAS
  const long bha = bias_o + b * bias_s.s0 + ha * bias_s.s1;
  const long bhb = bias_o + b * bias_s.s0 + hb * bias_s.s1;
#endif
  float m_a = -INFINITY, m_b = -INFINITY, l_a = 0.0f, l_b = 0.0f;
  float acc[NON][4];
#pragma unroll
  for (int n = 0; n < NON; ++n)
    acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;

  /* This split's share of the keys the rows can see. */
  int lo, hi, j0, jend;
  key_block_range(ilo, ihi, nq, nk, wl, wr, &lo, &hi);
  split_keys(lo, hi, MC, split, nsplit, &j0, &jend);
  __global const ushort *kr = (__global const ushort *)kp, *vr = (__global const ushort *)vp;
  barrier(CLK_LOCAL_MEM_FENCE); /* Q's reads of Ks are done */
  if (j0 < jend) stage_rows(Ks, KST, MC, kr, ks, j0, nk, d, 1, lid KEY_PAGES);
  copies_commit();
  for (; j0 < jend; j0 += MC) {
    barrier(CLK_LOCAL_MEM_FENCE); /* the last tile's P V is done with Vs */
    stage_rows(Vs, KST, MC, vr, vs, j0, nk, d, 1, lid KEY_PAGES);
    copies_commit();
    copies_wait_but_last(); /* the tile's K */
    barrier(CLK_LOCAL_MEM_FENCE);

    float s[2][4];
    tile_times_rows(s, 2, qa, NQK, Ks + 16 * w * KST, KST, lane);

    /* Scores and mask by the rules, as decode.cl takes them; e: 0, 1 row
     * g, 2, 3 row g + 8; key j0 + 16 w + 8 n + 2 t + (e & 1). */
    float mx_a = m_a, mx_b = m_b;
#pragma unroll
    for (int n = 0; n < 2; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int ok = e < 2 ? va : vb, dg = e < 2 ? dga : dgb;
        const int j = j0 + 16 * w + 8 * n + 2 * t + (e & 1);
        float th, y = -INFINITY;
        if (ok && j >= lo && j < hi && key_visible(dg, j, wl, wr)) {
          y = score(s[n][e], scale, softcap, e < 2 ? sla : slb, dg - j, &th);
#if HAS_BIAS
          y += bias_at(bias, e < 2 ? bha : bhb, bias_s, e < 2 ? ia : ib, j, nq, nk);
#endif
        }
        s[n][e] = y;
        if (e < 2)
          mx_a = fmax(mx_a, y);
        else
          mx_b = fmax(mx_b, y);
      }
    mx_a = quad_max(mx_a);
    mx_b = quad_max(mx_b);

    /* The warp's own online softmax over its 16 keys. */
    softmax_step(s, 2, mx_a, mx_b, &m_a, &m_b, &l_a, &l_b, acc, NON);

    copies_wait();                /* the tile's V */
    barrier(CLK_LOCAL_MEM_FENCE); /* V landed; Ks read */
    if (j0 + MC < jend) stage_rows(Ks, KST, MC, kr, ks, j0 + MC, nk, d, 1, lid KEY_PAGES);
    copies_commit();

    /* O += P V over the warp's 16 keys, P from S's accumulators. */
    acc_times_tile(acc, NON, s, 16, Vs + 16 * w * KST, KST, lane);
  }

  /* The warps' states through local memory, then each row's merged (in
   * the warps' order) and ended by items over its columns. */
  l_a = quad_sum(l_a);
  l_b = quad_sum(l_b);
  copies_wait(); /* nothing is left in flight into Ks */
  barrier(CLK_LOCAL_MEM_FENCE);
  __local float *Os = (__local float *)KVs_w; /* warp w's row r at (w * MR + r) * HD */
#pragma unroll
  for (int n = 0; n < NON; ++n)
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      Os[(w * MR + g) * HD + 8 * n + 2 * t + u] = acc[n][u];
      Os[(w * MR + g + 8) * HD + 8 * n + 2 * t + u] = acc[n][2 + u];
    }
  if (t == 0) {
    mls[w][0][g] = m_a;
    mls[w][1][g] = l_a;
    mls[w][0][g + 8] = m_b;
    mls[w][1][g + 8] = l_b;
  }
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int e = lid; e < DR * HD; e += MMA_ITEMS) {
    const int rr = e / HD, c = e % HD;
    if (rr >= nr || c >= d) continue;
    float mr = -INFINITY, lr = 0.0f, a = 0.0f;
    for (int ww = 0; ww < NW; ++ww)
      mr = merge_max(mr, mls[ww][0][rr]);
    for (int ww = 0; ww < NW; ++ww) {
      const float sc = merge_scale(mls[ww][0][rr], mr);
      lr = fma(sc, mls[ww][1][rr], lr);
      a = fma(sc, Os[(ww * MR + rr) * HD + c], a);
    }
    int i, h;
    row_of(rb, rr, hk, group, nq, &i, &h);
    DECODE_OUT(i, h, c, a, mr, lr);
  }
}
