/*
 * Shared by every attention kernel (fwd.cl, bwd.cl) and prepended to each:
 * how an element of the input dtype becomes a float and back, so that the
 * passes run entirely in f32 whatever the storage type; where a sequence's
 * rows are; and the attention rules, each written once, under the names
 * every language uses (tests/rules_table.h): diag, key_range, query_range,
 * key_block_range, query_block_range, key_visible, score, score_grad.
 *
 * f16 goes through vload_half/vstore_half, which OpenCL C 1.2 has without
 * cl_khr_fp16; bf16 is the upper half of an f32, so it is a shift, rounded
 * to nearest even on the way out. No extension is needed for either.
 */
#ifndef DTYPE
#define DTYPE 0 /* storage type of q, k, v, o and the gradients: 0 f32, 1 f16, 2 bf16 */
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

/* The first row of head h of sequence b of a tensor passed as (buffer,
 * offset, strides) with strides (sb, ss, sh, sd) in s.s0..s3, r0 rows in. */
#define HEAD_ROWS(p, off, s, b, h, r0) ((p) + (off) + (b) * (s).s0 + (h) * (s).s2 + (r0) * (s).s1)

/* Sequence b's lengths and first rows. Varlen problems (cu_q, cu_k given)
 * take them from cu_seqlens; bshd ones have nq_all and nk_all rows per
 * sequence, from row 0 (the batch stride does the rest). */
typedef struct seq_info {
  int nq, nk; /* query and key rows */
  int q0, k0; /* first query and key row in the tensors */
  int qflat;  /* first query row counted over all sequences: where the rows' delta is */
} seq_info;

inline seq_info seq_info_of(__global const int *cu_q, __global const int *cu_k, int b, int nq_all,
                            int nk_all) {
  seq_info s;
  s.nq = nq_all;
  s.nk = nk_all;
  s.q0 = 0;
  s.k0 = 0;
  s.qflat = b * nq_all;
  if (cu_q) {
    s.q0 = s.qflat = cu_q[b];
    s.nq = cu_q[b + 1] - s.q0;
  }
  if (cu_k) {
    s.k0 = cu_k[b];
    s.nk = cu_k[b + 1] - s.k0;
  }
  return s;
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

/* The rules. A window bound wl, wr of -1 is no bound; causal arrives as
 * wr = 0. Query row i of a sequence of nq rows and nk keys sits on key
 * diag(i): the last row on the last key. Ranges are [lo, hi), clamped to
 * the sequence and empty when lo >= hi. */
inline int diag(int i, int nq, int nk) {
  return i + nk - nq;
}

/* Whether key j is visible to the row whose diagonal is dg. */
inline int key_visible(int dg, int j, int wl, int wr) {
  return (wl < 0 || j >= dg - wl) && (wr < 0 || j <= dg + wr);
}

/* The keys visible to the row whose diagonal is dg. */
inline void key_range(int dg, int nk, int wl, int wr, int *lo, int *hi) {
  *lo = wl < 0 ? 0 : max(dg - wl, 0);
  *hi = wr < 0 ? nk : min(dg + wr + 1, nk);
}

/* The rows that see key j. */
inline void query_range(int j, int nq, int nk, int wl, int wr, int *lo, int *hi) {
  *lo = wr < 0 ? 0 : max(j - wr - (nk - nq), 0);
  *hi = wl < 0 ? nq : min(j + wl - (nk - nq) + 1, nq);
}

/* The keys visible to some row of [i0, i1): rows further down see further
 * right, so the first row gives the left end and the last the right. */
inline void key_block_range(int i0, int i1, int nq, int nk, int wl, int wr, int *lo, int *hi) {
  int a, z;
  key_range(diag(i0, nq, nk), nk, wl, wr, lo, &z);
  key_range(diag(i1 - 1, nq, nk), nk, wl, wr, &a, hi);
}

/* The rows that see some key of [j0, j1), likewise from its two ends. */
inline void query_block_range(int j0, int j1, int nq, int nk, int wl, int wr, int *lo, int *hi) {
  int a, z;
  query_range(j0, nq, nk, wl, wr, lo, &z);
  query_range(j1 - 1, nq, nk, wl, wr, &a, hi);
}

/* The score's epilogue in the order the semantics give: scale, softcap,
 * ALiBi (dist = dg - j, the key's distance from the row's diagonal). t
 * receives tanh(dot * scale / softcap) for the backward pass (0 when softcap
 * is off). score_scaled takes x = dot * scale already formed, as
 * src/rules.h's attn__score_scaled does, for a kernel that shares that
 * product with a path without the epilogue. */
inline float score_scaled(float x, float softcap, float slope, int dist, float *t) {
  *t = 0.0f;
  if (softcap > 0.0f) {
    *t = tanh(x / softcap);
    x = softcap * *t;
  }
  return x - slope * fabs((float)dist);
}

inline float score(float dot, float scale, float softcap, float slope, int dist, float *t) {
  return score_scaled(dot * scale, softcap, slope, dist, t);
}

/* ds times d(score)/d(dot * scale): softcap's tanh contributes 1 - t^2. */
inline float score_grad(float ds, float t, float softcap) {
  return softcap > 0.0f ? ds * (1.0f - t * t) : ds;
}
