/*
 * A row's lse in the form the caller's tensor holds: a float, or the float
 * pair (hi, lo) of attn_tensor_lse_hilo (lse.sd > 0 is the distance from hi
 * to lo; see attn__lse_split in src/rules.h for the host's version).
 * The f32 backward takes exp((s - hi) - lo): s - hi is exact near the row
 * maximum, where a float lse alone would cost P up to half an ulp of lse
 * (6e-4 at logits of 1e4).
 */
#pragma once

/* hi = m + ll rounded, *lo = what the rounding dropped (TwoSum: exact in
 * float arithmetic, which nvcc does not reassociate). */
__device__ __forceinline__ float lse_split(float m, float ll, float *lo) {
  const float hi = m + ll, mb = hi - ll;
  *lo = (m - mb) + (ll - (hi - mb));
  return hi;
}

/* Writes lse = m + log(l) at lp, and lo sd floats further when sd > 0: -inf
 * (lo 0) for a row that sees no key (seen, from the mask), NaN for one that
 * sees keys but whose sum l is not positive (a NaN or inf among its scores). */
__device__ __forceinline__ void lse_store(float *lp, long long sd, bool seen, float m, float l) {
  float lo = 0.f, hi = -INFINITY;
  if (seen) hi = l > 0.f ? lse_split(m, logf(l), &lo) : (lo = NAN);
  lp[0] = hi;
  if (sd) lp[sd] = lo;
}
