/*
 * attn_merge: n partial results (o_s, lse_s) of the same rows, each in a
 * buffer of its own, merged by their lse (merge_max, merge_scale), one
 * launch per part in order s = 0 .. n - 1, so the sums are in a fixed order:
 *   attn_merge_max  m = the largest lse_s of each row, into ws
 *   attn_merge_add  l += exp(lse_s - m), acc += exp(lse_s - m) o_s; the
 *                   last part's launch writes o = acc / l and lse = m +
 *                   log l
 * ws holds each row's m, then l twice: every item of a row reads l while
 * one of them updates it, so a launch reads one copy and writes the other
 * (parity alternates them).
 * Row x = (b * seqlen + i) * heads + h; item (c, i * heads + h, b).
 * Tensors arrive as (buffer, offset, strides sb, ss, sh, sd).
 */

#define ROW_AT(s, b, i, h) ((b) * (s).s0 + (i) * (s).s1 + (h) * (s).s2)

__kernel void attn_merge_max(__global const float *lse_s, long lso, long4 lss, __global float *ws,
                             int seqlen, int heads, int first) {
  const int y = get_global_id(1), b = get_global_id(2);
  if (get_global_id(0) != 0) return;
  const int i = y / heads, h = y % heads;
  const long x = ((long)b * seqlen + i) * heads + h;
  ws[x] = merge_max(first ? -INFINITY : ws[x], lse_s[lso + ROW_AT(lss, b, i, h)]);
}

__kernel void attn_merge_add(__global const T *o_s, long oso, long4 oss,
                             __global const float *lse_s, long lso, long4 lss, __global float *ws,
                             __global float *ws_acc, __global T *o, long oo, long4 os,
                             __global float *lse, long lo_, long4 ls, int seqlen, int heads, int d,
                             int first, int last, int parity) {
  const int c = get_global_id(0), y = get_global_id(1), b = get_global_id(2);
  if (c >= d) return;
  const int i = y / heads, h = y % heads;
  const long rows = (long)get_global_size(2) * seqlen * heads;
  const long x = ((long)b * seqlen + i) * heads + h;
  const float m = ws[x], w = merge_scale(lse_s[lso + ROW_AT(lss, b, i, h)], m);
  const float l = (first ? 0.0f : ws[(1 + parity) * rows + x]) + w;
  const float acc =
      fma(w, LOAD(o_s, oso + ROW_AT(oss, b, i, h) + c * oss.s3), first ? 0.0f : ws_acc[x * d + c]);
  if (!last) {
    ws_acc[x * d + c] = acc;
    if (c == 0) ws[(2 - parity) * rows + x] = l;
    return;
  }
  /* Every part -inf: m = -inf, l = 0, and the row is o = 0, lse = -inf. */
  STORE(o, oo + ROW_AT(os, b, i, h) + c * os.s3, m == -INFINITY ? 0.0f : acc / l);
  if (lse && c == 0) lse[lo_ + ROW_AT(ls, b, i, h)] = m == -INFINITY ? -INFINITY : m + log(l);
}
