/*
 * Appending to the KV cache, before the forward pass that reads it: row r
 * of k_new and v_new of sequence b goes to key row seq_used(b) + r of k and
 * v (through the block table when PAGED), element for element, bits
 * unchanged. The used length is clamped as the forward pass clamps it, so
 * the rows land where that pass looks for them and never outside the cache.
 * Item (c, r * heads_kv + hk, b) moves column c of one row of k and of v.
 */
__kernel void attn_append(__global const RAW *kn, long kno, long4 kns, __global const RAW *vn,
                          long vno, long4 vns, __global RAW *k, long ko, long4 ks, __global RAW *v,
                          long vo, long4 vs, __global const int *cu_k, int nk_all, int nnew,
                          int heads_kv, int d, __global const int *used, long used_o,
                          long used_sb PAGED_ARGS) {
  const int c = get_global_id(0), x = get_global_id(1), b = get_global_id(2);
  if (c >= d) return;
  const int r = x / heads_kv, hk = x % heads_kv;
  const seq_info seq = seq_info_of(NULL, cu_k, b, 0, nk_all);
  const int j = seq_used(used + used_o, used_sb, b, seq.nk, nnew) + r;
#if PAGED
  const key_pages kpg = {bt + bt_o, bt_sb, bt_ss, b, page_size, num_pages};
  const long kr = ko + KEY_ROW(j, ks), vr = vo + KEY_ROW(j, vs);
#else
  const long kr = ko + b * ks.s0 + (seq.k0 + j) * ks.s1;
  const long vr = vo + b * vs.s0 + (seq.k0 + j) * vs.s1;
#endif
  k[kr + hk * ks.s2 + c * ks.s3] = kn[kno + b * kns.s0 + r * kns.s1 + hk * kns.s2 + c * kns.s3];
  v[vr + hk * vs.s2 + c * vs.s3] = vn[vno + b * vns.s0 + r * vns.s1 + hk * vns.s2 + c * vns.s3];
}
