/*
 * The end of a forward pass whose keys were split (attn_decode, or attn_fwd
 * built with SPLIT): each part (O, m_i, l_i) of a row, over a share of its
 * keys (PART_ROW, common.cl), merged as one pass over all of them would
 * end (merge_max, merge_scale: a part's weight exp(lse_s - m) is l_s
 * merge_scale(m_s, m)), then the row ended by row_end_at: sinks, rows that saw
 * no key, lse as (hi, lo). One work-group of NTM items per (query row,
 * head, sequence). A decode's grid has few rows, so the parts are read in
 * parallel rather than one after another: the maximum and the sum l by a
 * tree over the parts, O by NG groups of items, each a float4 of columns
 * over every NG-th part (LP loads in flight), the groups then added in
 * order. Every sum has a fixed shape, so the result does not depend on
 * which part finished first.
 */
#ifndef HD
#define HD 64 /* the head dimension rounded up: the parts' row length */
#endif
#ifndef NTM
/* Work-items per row, as launch.c's kernel_items launches them: a power of
 * two, and the least work-group the plan accepts a device with. */
#define NTM 128
#endif
#ifndef MAX_SPLITS
#define MAX_SPLITS 128 /* the most key splits the host asks for */
#endif
#define LP 8           /* parts an item loads before it adds them */
#define NQD (HD / 4)   /* float4s of a part's row */
#define NG (NTM / NQD) /* groups of items over the parts */
#if MAX_SPLITS > NTM || NG < 1
#error "split.cl: NTM must cover MAX_SPLITS parts and HD / 4 columns"
#endif

/* Row r of head h of sequence b from its nsplit parts. Work-group (r, h,
 * b). */
__kernel __attribute__((reqd_work_group_size(NTM, 1, 1))) void attn_split_merge(
    __global T *o, long oo, long4 os, __global float *lse, long lo_, long4 ls,
    __global const int *cu_q, __global const int *cu_k, int nq_all, int nk_all, int d, int wl,
    int wr, int nsplit, __global const float *part_o, __global const float *part_ml,
    int tq KV_USED_ARGS SINK_ARGS) {
  __local float scale_s[MAX_SPLITS];
  __local float red[NTM];
  __local float4 red4[NTM];
  const int lid = get_local_id(0), r = get_group_id(0), h = get_group_id(1), b = get_group_id(2);
  const int heads = get_num_groups(1);
  const seq_info seq = seq_info_of(cu_q, cu_k, b, nq_all, nk_all);
  if (r >= seq.nq) return;
  const int nk = seq_keys(seq, b KV_USED_VALS);
  const long pr0 = PART_ROW(0, h, heads, tq, seq.qflat + r), pstride = (long)heads * tq;

  /* m = the parts' largest, then each part's weight and l = the sum of
   * the weighted l_s: part lid is item lid's. */
  const int mine = lid < nsplit;
  const float m_s = mine ? part_ml[2 * (pr0 + lid * pstride)] : -INFINITY;
  const float l_s = mine ? part_ml[2 * (pr0 + lid * pstride) + 1] : 0.0f;
  red[lid] = m_s;
  for (int w2 = NTM / 2; w2 > 0; w2 >>= 1) {
    barrier(CLK_LOCAL_MEM_FENCE);
    if (lid < w2) red[lid] = merge_max(red[lid], red[lid + w2]);
  }
  barrier(CLK_LOCAL_MEM_FENCE);
  const float mx = red[0];
  const float w = mine ? merge_scale(m_s, mx) : 0.0f;
  if (mine) scale_s[lid] = w;
  barrier(CLK_LOCAL_MEM_FENCE);
  red[lid] = w * l_s;
  for (int w2 = NTM / 2; w2 > 0; w2 >>= 1) {
    barrier(CLK_LOCAL_MEM_FENCE);
    if (lid < w2) red[lid] += red[lid + w2];
  }

  /* O: group g = lid / NQD adds parts g, g + NG, .. of float4 q = lid %
   * NQD. */
  const int q = lid % NQD, g = lid / NQD;
  float4 a = (float4)(0.0f);
  if (g < NG && 4 * q < d) {
    for (int s0 = g; s0 < nsplit; s0 += LP * NG) {
      float4 x[LP];
#pragma unroll
      for (int u = 0; u < LP; ++u) {
        const int s = s0 + u * NG;
        x[u] = s < nsplit ? vload4(q, part_o + (pr0 + s * pstride) * HD) : (float4)(0.0f);
      }
#pragma unroll
      for (int u = 0; u < LP; ++u) {
        const int s = s0 + u * NG;
        if (s < nsplit) a = fma((float4)(scale_s[s]), x[u], a);
      }
    }
  }
  red4[lid] = a;
  barrier(CLK_LOCAL_MEM_FENCE);
  const float l = red[0];
  float div, lse_hi, lse_lo;
  const float fold = row_end_at(r, seq.nq, nk, wl, wr, SINK_OF(h), mx, l, &div, &lse_hi, &lse_lo);
  if (lid < NQD && 4 * q < d) {
    float4 sum = red4[q];
    for (int gg = 1; gg < NG; ++gg)
      sum += red4[gg * NQD + q];
    __global T *op = HEAD_ROWS(o, oo, os, b, h, seq.q0 + r);
    const float f[4] = {sum.x, sum.y, sum.z, sum.w};
    for (int e = 0; e < 4 && 4 * q + e < d; ++e)
      STORE(op, (4 * q + e) * os.s3, f[e] * fold / div);
  }
  if (lse && lid == 0) {
    __global float *lp = HEAD_ROWS(lse, lo_, ls, b, h, seq.q0 + r);
    lp[0] = lse_hi;
    if (ls.s3) lp[ls.s3] = lse_lo;
  }
}
