/*
 * Shared by every attention kernel: how an element of the input dtype becomes
 * a float and back, so that the forward and backward passes run entirely in
 * f32 whatever the storage type.
 *
 * DTYPE is a -D parameter: 0 f32, 1 f16, 2 bf16. f16 goes through
 * vload_half/vstore_half, which OpenCL C 1.2 has without cl_khr_fp16; bf16 is
 * the upper half of an f32, so it is a shift, rounded to nearest even on the
 * way out. No extension is needed for either.
 */
#ifndef DTYPE
#define DTYPE 0
#endif

#if DTYPE == 0
typedef float T;
#define LOAD(p, i) ((p)[i])
#define STORE(p, i, x) ((p)[i] = (x))
#elif DTYPE == 1
typedef half T;
#define LOAD(p, i) vload_half((size_t)(i), (p))
#define STORE(p, i, x) vstore_half_rte((x), (size_t)(i), (p))
#else
typedef ushort T;
#define LOAD(p, i) as_float((uint)(p)[i] << 16)
#define STORE(p, i, x) ((p)[i] = bf16_from_float(x))
#endif

/* Round to nearest even, as the host's attn__f32_to_bf16(); NaN stays NaN. */
inline ushort bf16_from_float(float f) {
  uint u = as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (ushort)((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (ushort)(u >> 16);
}

/* lse = m + ll (ll = log l) as the float pair (hi, lo): hi rounded, lo what
 * the rounding dropped (TwoSum, exact in float arithmetic). The backward
 * takes exp((s - hi) - lo), in which s - hi is exact near the row maximum:
 * a float lse alone would cost P up to half an ulp of lse (6e-4 at logits of
 * 1e4). */
inline float lse_split(float m, float ll, float *lo) {
  const float hi = m + ll, mb = hi - ll;
  *lo = (m - mb) + (ll - (hi - mb));
  return hi;
}

/* Whether key j is visible to the query row whose diagonal is dg. A bound of
 * -1 is no bound; causal arrives as wr = 0. */
inline int key_visible(int dg, int j, int wl, int wr) {
  return (wl < 0 || j >= dg - wl) && (wr < 0 || j <= dg + wr);
}

/* The score's epilogue in the order the semantics give: scale, softcap,
 * ALiBi. t receives tanh(s * scale / softcap) for the backward pass (0 when
 * softcap is off). */
inline float score_epilogue(float dot, float scale, float softcap, float slope, int dg, int j,
                            float *t) {
  float x = dot * scale;
  *t = 0.0f;
  if (softcap > 0.0f) {
    *t = tanh(x / softcap);
    x = softcap * *t;
  }
  return x - slope * fabs((float)(dg - j));
}
