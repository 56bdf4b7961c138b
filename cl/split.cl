/*
 * The end of a forward pass whose keys were split (attn_decode, or attn_fwd
 * built with SPLIT): each part (O, m_i, l_i) of a row, over a share of its
 * keys (PART_ROW, common.cl), merged as one pass over all of them would
 * end (merge_max, merge_scale: a part's weight exp(lse_s - m) is l_s
 * merge_scale(m_s, m)), then the row ended by row_end_at: sinks, rows that saw
 * no key, lse as (hi, lo). One work-group of NTM items per (query row,
 * head, sequence); the parts are added in order, so the result does not
 * depend on which finished first.
 */
#ifndef HD
#define HD 64 /* the head dimension rounded up: the parts' row length */
#endif
#ifndef NTM
#define NTM 64 /* work-items per row */
#endif
#ifndef MAX_SPLITS
#define MAX_SPLITS 128 /* the most key splits the host asks for */
#endif

/* Row r of head h of sequence b from its nsplit parts. Work-group (r, h,
 * b). */
__kernel __attribute__((reqd_work_group_size(NTM, 1, 1))) void attn_split_merge(
    __global T *o, long oo, long4 os, __global float *lse, long lo_, long4 ls,
    __global const int *cu_q, __global const int *cu_k, int nq_all, int nk_all, int d, int wl,
    int wr, int nsplit, __global const float *part_o, __global const float *part_ml,
    int tq KV_USED_ARGS SINK_ARGS) {
  __local float scale_s[MAX_SPLITS];
  const int lid = get_local_id(0), r = get_group_id(0), h = get_group_id(1), b = get_group_id(2);
  const int heads = get_num_groups(1);
  const seq_info seq = seq_info_of(cu_q, cu_k, b, nq_all, nk_all);
  if (r >= seq.nq) return;
  const int nk = seq_keys(seq, b KV_USED_VALS);
  const long pr0 = PART_ROW(0, h, heads, tq, seq.qflat + r), pstride = (long)heads * tq;

  float mx = -INFINITY;
  for (int s = 0; s < nsplit; ++s)
    mx = merge_max(mx, part_ml[2 * (pr0 + s * pstride)]);
  for (int s = lid; s < nsplit; s += NTM)
    scale_s[s] = merge_scale(part_ml[2 * (pr0 + s * pstride)], mx);
  barrier(CLK_LOCAL_MEM_FENCE);
  float l = 0.0f;
  for (int s = 0; s < nsplit; ++s)
    l = fma(scale_s[s], part_ml[2 * (pr0 + s * pstride) + 1], l);

  float div, lse_hi, lse_lo;
  const float fold = row_end_at(r, seq.nq, nk, wl, wr, SINK_OF(h), mx, l, &div, &lse_hi, &lse_lo);
  __global T *op = HEAD_ROWS(o, oo, os, b, h, seq.q0 + r);
  for (int c = lid; c < d; c += NTM) {
    float a = 0.0f;
    for (int s = 0; s < nsplit; ++s)
      a = fma(scale_s[s], part_o[(pr0 + s * pstride) * HD + c], a);
    STORE(op, c * os.s3, a * fold / div);
  }
  if (lse && lid == 0) {
    __global float *lp = HEAD_ROWS(lse, lo_, ls, b, h, seq.q0 + r);
    lp[0] = lse_hi;
    if (ls.s3) lp[ls.s3] = lse_lo;
  }
}
