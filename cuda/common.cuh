/*
 * What every CUDA kernel family, forward and backward, computes the same
 * way: the attention rules (which keys a query row sees and the score
 * epilogue), under the names of tests/rules_table.h, which holds them to
 * the C ones; and a row's lse in the form the caller's tensor holds.
 *
 * The rules take the window as the problem gives it: a bound of -1 is no
 * bound and causal arrives as wr = 0. Ranges come clamped to [0, n) and are
 * empty when lo >= hi. I is the index type of the caller (int in the
 * tensor-core kernels, long long in the general ones).
 */
#ifndef ATTN_CUDA_COMMON_CUH
#define ATTN_CUDA_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>

/* The key on query row i's diagonal (the last key a causal row sees). */
template <typename I>
__device__ __forceinline__ I diag(I i, I nq, I nk) {
  return i + nk - nq;
}

/* The first key the row of diagonal dg sees and one past its last, before
 * clamping: below 0 and above nk where the window reaches past the keys. */
template <typename I>
__device__ __forceinline__ I key_lo(I dg, I wl) {
  return wl < 0 ? 0 : dg - wl;
}
template <typename I>
__device__ __forceinline__ I key_hi(I dg, I nk, I wr) {
  return wr < 0 ? nk : dg + wr + 1;
}

/* Keys [lo, hi) visible to the row of diagonal dg. */
template <typename I>
__device__ __forceinline__ void key_range(I dg, I nk, I wl, I wr, I *lo, I *hi) {
  const I a = key_lo(dg, wl), z = key_hi(dg, nk, wr);
  *lo = a < 0 ? 0 : a;
  *hi = z > nk ? nk : z;
}

/* Keys visible to any row of [i0, i1): key_lo and key_hi never decrease
 * with the row, so the first row's lo and the last row's hi. */
template <typename I>
__device__ __forceinline__ void key_block_range(I i0, I i1, I nq, I nk, I wl, I wr, I *lo, I *hi) {
  I tmp;
  key_range(diag(i0, nq, nk), nk, wl, wr, lo, &tmp);
  key_range(diag(i1 - 1, nq, nk), nk, wl, wr, &tmp, hi);
}

/* Whether every row of [i0, i_last] sees every key of [j0, j1), all of
 * them in the sequence: a tile with no mask to apply. key_lo and key_hi
 * never decrease with the row, so the last row's lo and the first row's hi
 * bound it. */
template <typename I>
__device__ __forceinline__ bool block_unmasked(I i0, I i_last, I j0, I j1, I nq, I nk, I wl, I wr) {
  return j1 <= nk && j0 >= key_lo(diag(i_last, nq, nk), wl) &&
         j1 <= key_hi(diag(i0, nq, nk), nk, wr);
}

/* Rows [lo, hi) that see at least one key of [j0, j1): key_range inverted. */
template <typename I>
__device__ __forceinline__ void query_block_range(I j0, I j1, I nq, I nk, I wl, I wr, I *lo,
                                                  I *hi) {
  const I a = wr < 0 ? 0 : j0 - wr - nk + nq;
  const I z = wl < 0 ? nq : j1 + wl - nk + nq;
  *lo = a < 0 ? 0 : a;
  *hi = z > nq ? nq : z;
}

/* Rows [lo, hi) that see key j. */
template <typename I>
__device__ __forceinline__ void query_range(I j, I nq, I nk, I wl, I wr, I *lo, I *hi) {
  query_block_range(j, j + 1, nq, nk, wl, wr, lo, hi);
}

/* Whether key j (in range) is visible to the row of diagonal dg. */
template <typename I>
__device__ __forceinline__ bool key_visible(I dg, I j, I wl, I wr) {
  return j >= key_lo(dg, wl) && (wr < 0 || j <= dg + wr);
}

/* The score of a dot product q.k in natural units, in order: scale, softcap
 * (inv_softcap = 1 / softcap), ALiBi at distance dist = diag - j. The scaled
 * product is rounded to float and never fused into a following add: every
 * kernel, forward and backward, must see the same score, or the backward's
 * exp(s - lse) is off by the product's rounding (half an ulp of s, as much
 * as a float lse would cost at large logits). *t = tanh(dot * scale /
 * softcap), 0 without softcap. */
template <typename I>
__device__ __forceinline__ float score(float dot, float scale, float softcap, float inv_softcap,
                                       float slope, I dist, float *t) {
  float s = __fmul_rn(dot, scale);
  *t = 0.f;
  if (softcap > 0.f) {
    *t = tanhf(s * inv_softcap);
    s = softcap * *t;
  }
  return s - slope * (float)(dist < 0 ? -dist : dist);
}

/* The same in the log2 domain, where exp is ex2: scale_log2 = scale *
 * log2(e), capped when there is a softcap (a constant where a kernel is
 * specialized on it), softcap_log2 = softcap * log2(e), softcap_inv = scale /
 * softcap (the tanh argument straight from the dot product), slope_log2 =
 * slope * log2(e) (0 = no ALiBi). */
template <typename I>
__device__ __forceinline__ float score_log2(float dot, float scale_log2, bool capped,
                                            float softcap_log2, float softcap_inv, float slope_log2,
                                            I dist, float *t) {
  /* One select per step, no branch on capped: the kernels unroll this
   * over every element of a tile, where branches grow the loop's code. */
  const float th = capped ? tanhf(dot * softcap_inv) : 0.f;
  *t = th;
  float s = capped ? softcap_log2 * th : dot * scale_log2;
  if (slope_log2 != 0.f) s -= slope_log2 * fabsf((float)dist);
  return s;
}

/* d(score)/d(dot * scale) applied to ds: ds (1 - t^2) under softcap; t = 0
 * without it (as score and score_log2 leave it) gives ds exactly, so the
 * softcap itself is not needed. */
__device__ __forceinline__ float score_grad(float ds, float t) {
  return ds * (1.f - t * t);
}

/*
 * A row's lse in the form the caller's tensor holds: a float, or the float
 * pair (hi, lo) of attn_tensor_lse_hilo (lse.sd > 0 is the distance from hi
 * to lo; see attn__lse_split in src/rules.h for the host's version).
 * The f32 backward takes exp((s - hi) - lo): s - hi is exact near the row
 * maximum, where a float lse alone would cost P up to half an ulp of lse
 * (6e-4 at logits of 1e4).
 */

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

/* 2^x, flushing subnormals: the exponentials of the online softmax. */
__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

/*
 * The KV cache (src/rules.h: attn__seq_used, attn__key_row). Entries that
 * live on the device are never checked on the host, so they are clamped
 * here: a bad one reads a wrong row, never outside the tensors.
 */

/* Sequence b's used cache rows (used: int32, entry b at b * sb), clamped to
 * [0, cap - nnew], cap the rows the sequence can hold. */
template <typename I>
__device__ __forceinline__ I seq_used(const int *used, long long sb, I b, I cap, I nnew) {
  const I u = (I)__ldg(used + b * sb), hi = cap - nnew;
  return u < 0 ? 0 : u > hi ? hi : u;
}

/* The element offset of key row j of sequence b in a paged k or v with
 * page stride t_sb and row stride t_ss: row j % page_size of page
 * bt[b * bt_sb + (j / page_size) * bt_ss], clamped to [0, num_pages). */
template <typename I>
__device__ __forceinline__ long long paged_row(const int *bt, long long bt_sb, long long bt_ss, I b,
                                               I j, I page_size, I num_pages, long long t_sb,
                                               long long t_ss) {
  long long page = __ldg(bt + b * bt_sb + (j / page_size) * bt_ss);
  page = page < 0 ? 0 : page >= num_pages ? num_pages - 1 : page;
  return page * t_sb + (long long)(j % page_size) * t_ss;
}

/*
 * Score terms after the epilogue: an additive bias (score += bias, after
 * scale, softcap and ALiBi) and attention sinks.
 */

/* Element i of a bias in any float dtype (attn_dtype's codes: 0 f32, 1 f16,
 * 2 bf16), as a float. */
__device__ __forceinline__ float load_any(const void *base, int dtype, long long i) {
  if (dtype == 1) return __half2float(((const __half *)base)[i]);
  if (dtype == 2) return __bfloat162float(((const __nv_bfloat16 *)base)[i]);
  return ((const float *)base)[i];
}

/* Whether a row saw a key (attn__row_seen), by its final max m and sum l:
 * the mask says so (seen), and with a bias a row whose scores were all -inf
 * (m = -inf, l = 0) saw none; a NaN among them left l NaN, and the row is
 * NaN. */
__device__ __forceinline__ bool row_seen(bool seen, bool has_bias, float m, float l) {
  return seen && !(has_bias && m == -INFINITY && l == 0.f);
}

/* Folds a sink logit into a row's final max m and sum l (as attn__sink_fold):
 * afterwards lse = m + log(l), and the output accumulator, relative to the
 * old m, is multiplied by the returned factor. A row with no key gets m =
 * sink, l = 1, factor 0. sink_fold_log2 is the same with m and the sink in
 * the log2 domain. */
__device__ __forceinline__ float sink_fold(float sink, float *m, float *l) {
  const float mn = *m > sink ? *m : sink;
  const float a = *m == -INFINITY ? 0.f : __expf(*m - mn);
  *l = *l * a + __expf(sink - mn);
  *m = mn;
  return a;
}
__device__ __forceinline__ float sink_fold_log2(float sink_log2, float *m, float *l) {
  const float mn = *m > sink_log2 ? *m : sink_log2;
  const float a = *m == -INFINITY ? 0.f : ex2(*m - mn);
  *l = *l * a + ex2(sink_log2 - mn);
  *m = mn;
  return a;
}

/* A row's term of d(loss)/d(sink) (attn__sink_grad): -exp(sink - lse) D. */
__device__ __forceinline__ float sink_grad(float sink, float lse, float dsum) {
  return lse == -INFINITY ? 0.f : -__expf(sink - lse) * dsum;
}

/* The lse of n partial results of one row (lse[s * stride]) and each part's
 * weight exp(lse_s - lse) in w, so that o = sum_s w[s] o_s (as
 * attn__merge_lse): -inf when every part is -inf (weights 0); NaN in a part
 * gives NaN. */
__device__ inline float merge_lse(const float *lse, long long stride, int n, float *w) {
  float mx = -INFINITY;
  bool nan = false;
  for (int s = 0; s < n; s++) {
    const float x = lse[s * stride];
    nan |= x != x;
    mx = x > mx ? x : mx;
  }
  if (nan) {
    for (int s = 0; s < n; s++)
      w[s] = NAN;
    return NAN;
  }
  if (mx == -INFINITY) {
    for (int s = 0; s < n; s++)
      w[s] = 0.f;
    return -INFINITY;
  }
  float sum = 0.f;
  for (int s = 0; s < n; s++)
    sum += w[s] = expf(lse[s * stride] - mx);
  const float out = mx + logf(sum);
  for (int s = 0; s < n; s++)
    w[s] /= sum;
  return out;
}

/* An element of T as a float and back (round to nearest even): the kernels'
 * loads and stores of single elements. */
template <typename T>
__device__ __forceinline__ float to_float(T x);
template <>
__device__ __forceinline__ float to_float<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ float to_float<__half>(__half x) {
  return __half2float(x);
}
template <>
__device__ __forceinline__ float to_float<__nv_bfloat16>(__nv_bfloat16 x) {
  return __bfloat162float(x);
}
template <typename T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __half from_float<__half>(float x) {
  return __float2half_rn(x);
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

#endif /* ATTN_CUDA_COMMON_CUH */
