/*
 * The end of a forward pass whose keys were split (attn_decode, or attn_fwd
 * built with SPLIT): each part (O, m_i, l_i) of a row, over a share of its
 * keys (PART_ROW, common.cl), merged as one pass over all of them would
 * end (merge_max, merge_scale: a part's weight exp(lse_s - m) is l_s
 * merge_scale(m_s, m)), then the row ended by row_end_at: sinks, rows that saw
 * no key, lse as (hi, lo). One work-group of NTM items a row (merge_row):
 * attn_split_merge's work-group (query row, head, sequence) after the
 * forward, or, in a decode, the last work-group to finish a block of rows,
 * for each of its rows (last_part), so that a decode is one launch. A
 * decode's grid has few rows, so the parts are read in parallel rather than
 * one after another: the maximum and the sum l by a tree over the parts, O
 * by NG groups of items, each a float4 of columns over every NG-th part (LP
 * loads in flight), the groups then added in order. Every sum has a fixed
 * shape, so the result does not depend on which part finished first.
 */
#ifndef HD
#define HD 64 /* the head dimension rounded up: the parts' row length */
#endif
#ifndef NTM
/* Work-items a row: a power of two, as the host launches them (its kernel's
 * own, or the decode kernel's). */
#define NTM 128
#endif
#ifndef MAX_SPLITS
#define MAX_SPLITS 128 /* the most key splits the host asks for */
#endif
#define LP 8           /* parts an item loads before it adds them */
#define NQD (HD / 4)   /* float4s of a part's row */
#define NG (NTM / NQD) /* groups of items over the parts */
#if NG < 1
#error "split.cl: NTM must cover HD / 4 columns"
#endif

/* The local memory merge_row works in, declared by its kernel. */
#define MERGE_LOCALS               \
  __local float mg_w[MAX_SPLITS];  \
  __local float mg_red[NTM];       \
  __local float4 mg_red4[NTM];     \
  __local int mg_last

/* Query row r (of seq, over nk keys) of head h from its nsplit parts, by
 * the work-group's NTM items, into o and lse. The parts are read through
 * volatile pointers: in a decode they were written by other work-groups of
 * the same launch, whose lines a compute unit's cache (NVIDIA's L1, which
 * is not coherent within a kernel) may hold from before. */
inline void merge_row(int lid, int r, int h, int b, int heads, seq_info seq, int nk, int d,
                      int wl, int wr, float sink, __global T *o, long oo, long4 os,
                      __global float *lse, long lo_, long4 ls, int nsplit,
                      __global volatile const float *part_o, __global volatile const float *part_ml,
                      int tq, __local float *scale_s, __local float *red, __local float4 *red4) {
  const long pr0 = PART_ROW(0, h, heads, tq, seq.qflat + r), pstride = (long)heads * tq;

  /* m = the parts' largest, then each part's weight and l = the sum of
   * the weighted l_s: item lid takes parts lid, lid + NTM, .. */
  float m_i = -INFINITY;
  for (int s = lid; s < nsplit; s += NTM)
    m_i = merge_max(m_i, part_ml[2 * (pr0 + s * pstride)]);
  red[lid] = m_i;
  for (int w2 = NTM / 2; w2 > 0; w2 >>= 1) {
    barrier(CLK_LOCAL_MEM_FENCE);
    if (lid < w2) red[lid] = merge_max(red[lid], red[lid + w2]);
  }
  barrier(CLK_LOCAL_MEM_FENCE);
  const float mx = red[0];
  float l_i = 0.0f;
  for (int s = lid; s < nsplit; s += NTM) {
    const float w = merge_scale(part_ml[2 * (pr0 + s * pstride)], mx);
    scale_s[s] = w;
    l_i = fma(w, part_ml[2 * (pr0 + s * pstride) + 1], l_i);
  }
  barrier(CLK_LOCAL_MEM_FENCE);
  red[lid] = l_i;
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
        x[u] = s < nsplit ? *(__global volatile const float4 *)(part_o + (pr0 + s * pstride) * HD +
                                                                4 * q)
                          : (float4)(0.0f);
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
  const float fold = row_end_at(r, seq.nq, nk, wl, wr, sink, mx, l, &div, &lse_hi, &lse_lo);
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
  /* The next row's merge reuses the local arrays. */
  barrier(CLK_LOCAL_MEM_FENCE);
}

/* Whether this work-group is the last of the nsplit to have written its
 * parts of a block of rows: each counts itself on the block's turn (zero
 * before the launch), the last sets it back to zero for the next. Every
 * item's stores are fenced before the count, and the last's loads after
 * it. */
inline int last_part(__global volatile int *turn, int nsplit, int lid, __local int *flag) {
  mem_fence(CLK_GLOBAL_MEM_FENCE);
  barrier(CLK_GLOBAL_MEM_FENCE | CLK_LOCAL_MEM_FENCE);
  if (lid == 0) {
    const int last = atomic_inc(turn) == nsplit - 1;
    if (last) atomic_xchg(turn, 0);
    *flag = last;
    mem_fence(CLK_GLOBAL_MEM_FENCE);
  }
  barrier(CLK_GLOBAL_MEM_FENCE | CLK_LOCAL_MEM_FENCE);
  return *flag;
}

/* A decode work-group's end, after its parts (DECODE_OUT): the last of
 * its block's splits merges the block's rows w (rows_of). The names are
 * the decode kernels' (DECODE_ARGS, DECODE_BLOCK, MERGE_LOCALS, lid). */
#define DECODE_MERGE(w)                                                                         \
  do {                                                                                          \
    if (nsplit > 1 && last_part(turns + ((long)b * get_num_groups(1) + hk) * nrb + rb, nsplit,  \
                                lid, &mg_last))                                              \
      for (int rr_ = 0; rr_ < (w).nr; ++rr_)                                                    \
        merge_row(lid, (w).ri[rr_], (w).hh[rr_], b, heads, seq, nk, d, wl, wr,                  \
                  SINK_OF((w).hh[rr_]), o, oo, os, lse, lo_, ls, nsplit, part_o, part_ml, tq,   \
                  mg_w, mg_red, mg_red4);                                                       \
  } while (0)

/* Row r of head h of sequence b from its nsplit parts, after a split
 * forward. Work-group (r, h, b). */
__kernel __attribute__((reqd_work_group_size(NTM, 1, 1))) void attn_split_merge(
    __global T *o, long oo, long4 os, __global float *lse, long lo_, long4 ls,
    __global const int *cu_q, __global const int *cu_k, int nq_all, int nk_all, int d, int wl,
    int wr, int nsplit, __global const float *part_o, __global const float *part_ml,
    int tq KV_USED_ARGS SINK_ARGS) {
  MERGE_LOCALS;
  const int lid = get_local_id(0), r = get_group_id(0), h = get_group_id(1), b = get_group_id(2);
  const seq_info seq = seq_info_of(cu_q, cu_k, b, nq_all, nk_all);
  if (r >= seq.nq) return;
  merge_row(lid, r, h, b, get_num_groups(1), seq, seq_keys(seq, b KV_USED_VALS), d, wl, wr,
            SINK_OF(h), o, oo, os, lse, lo_, ls, nsplit, part_o, part_ml, tq, mg_w, mg_red, mg_red4);
}
