/*
 * The device check run by attn_selftest() before any attention kernel:
 * C = A + B, element-wise. If this fails the device or its driver is broken,
 * not the attention kernels.
 */
__kernel void attn_selftest_add(__global const float *a, __global const float *b, __global float *c,
                                int n) {
  int i = get_global_id(0);
  if (i < n) c[i] = a[i] + b[i];
}
