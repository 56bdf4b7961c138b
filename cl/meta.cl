/*
 * Offsets that live in a device buffer (attn_params' cu_seqlens_*_tensor):
 * nothing on the host has checked them, so before the kernels index with
 * them a copy in the scratch is made safe to index with. Offset b becomes
 * the largest of entries 0..b clamped into [0, rows]: the offsets then never
 * decrease and never leave the tensor, so every sequence lies inside it (a
 * malformed entry shortens sequences, it never moves a read or a write
 * outside). Well-formed offsets pass unchanged. A running maximum is a
 * scan: one work-group of 64 items, each a run of entries, the runs' maxima
 * carried through local memory. in_o is in entries.
 */
__kernel __attribute__((reqd_work_group_size(64, 1, 1))) void attn_clamp_offsets(
    __global const int *in, long in_o, __global int *out, int n, int rows) {
  __local int run_max[64];
  const int lid = get_local_id(0), per = (n + 63) / 64;
  const int lo = min(lid * per, n), hi = min(lo + per, n);
  int m = 0;
  for (int i = lo; i < hi; ++i)
    m = max(m, clamp(in[in_o + i], 0, rows));
  run_max[lid] = m;
  barrier(CLK_LOCAL_MEM_FENCE);
  int before = 0;
  for (int j = 0; j < lid; ++j)
    before = max(before, run_max[j]);
  for (int i = lo; i < hi; ++i) {
    before = max(before, clamp(in[in_o + i], 0, rows));
    out[i] = before;
  }
}
