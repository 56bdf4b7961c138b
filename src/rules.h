/*
 * The attention rules in C, once: which keys a query row sees and what a
 * score is. The core, the CPU backend, the reference (testkit/ref.c) and the
 * program use these and write no rule of their own; cl/common.cl and
 * cuda/common.cuh are the same rules in their languages, with the same names,
 * and tests/test_rules.c holds all three to one table of inputs.
 *
 * For query row i and key j of one sequence of lengths nq, nk, with
 * dg = attn__diag(i, nq, nk) = i + nk - nq: key j is visible when
 * dg - wl <= j <= dg + wr, a bound of -1 being no bound; causal is wr = 0
 * (bottom-right aligned). A range [lo, hi) is clamped to [0, n) and empty
 * when lo >= hi. The score of a visible key is
 *     s = scale * dot, then s = softcap * tanh(s / softcap) when softcap > 0,
 *     then s -= slope * |dg - j| (ALiBi), then s += bias[b][h][i][j].
 * With a bias, a row whose visible scores are all -inf sees no key. A sink
 * joins each row's softmax denominator (attn__sink_fold).
 * The primitives take plain numbers (what the rules test calls); the
 * attn__problem_* forms read the window from a problem.
 */
#ifndef ATTN_RULES_H
#define ATTN_RULES_H

#include "attn_internal.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------------- */
/* Sequences                                                                */
/* ---------------------------------------------------------------------- */

/* Sequence b's query and key lengths and first rows. */
static inline int64_t attn__seq_q(const attn__problem *pb, int64_t b) {
  return pb->cu_q ? (int64_t)pb->cu_q[b + 1] - pb->cu_q[b] : pb->seqlen_q;
}
/* Rows of k and v sequence b can hold: its cu_seqlens_k length (varlen),
 * else seqlen_k (bshd: k's seqlen; paged: max_pages * page_size). */
static inline int64_t attn__capacity_k(const attn__problem *pb, int64_t b) {
  return pb->cu_k ? (int64_t)pb->cu_k[b + 1] - pb->cu_k[b] : pb->seqlen_k;
}
/* An int32 entry of a metadata tensor in host memory (the caller's, or a
 * host-memory backend's buffer). */
static inline int64_t attn__i32_at(const attn__tensor *t, int64_t e) {
  return ((const int32_t *)((const char *)t->native + t->offset))[e];
}
/* Sequence b's used cache rows, clamped to what fits beside the appended
 * ones (entries on the device are never checked, only clamped). */
static inline int64_t attn__seq_used(const attn__problem *pb, int64_t b) {
  const int64_t u = attn__i32_at(&pb->seqused_k, b * pb->seqused_k.sb);
  const int64_t cap = attn__capacity_k(pb, b) - pb->seqlen_new;
  return u < 0 ? 0 : u > cap ? cap : u;
}
static inline int64_t attn__seq_k(const attn__problem *pb, int64_t b) {
  return pb->has_seqused ? attn__seq_used(pb, b) + pb->seqlen_new : attn__capacity_k(pb, b);
}
static inline int64_t attn__row0_q(const attn__problem *pb, int64_t b) {
  return pb->cu_q ? pb->cu_q[b] : 0;
}
static inline int64_t attn__row0_k(const attn__problem *pb, int64_t b) {
  return pb->cu_k ? pb->cu_k[b] : 0;
}

/* The element offset of key row j of sequence b in k or v (t), before the
 * head and column terms: through the block table when paged (an entry out
 * of range is clamped to a page that exists). */
static inline int64_t attn__key_row(const attn__problem *pb, const attn__tensor *t, int64_t b,
                                    int64_t j) {
  if (pb->page_size) {
    const attn__tensor *bt = &pb->block_table;
    int64_t page = attn__i32_at(bt, b * bt->sb + (j / pb->page_size) * bt->ss);
    page = page < 0 ? 0 : page >= pb->num_pages ? pb->num_pages - 1 : page;
    return page * t->sb + (j % pb->page_size) * t->ss;
  }
  return b * t->sb + (attn__row0_k(pb, b) + j) * t->ss;
}

/* ---------------------------------------------------------------------- */
/* Visibility                                                               */
/* ---------------------------------------------------------------------- */

/* The key on row i's diagonal. */
static inline int64_t attn__diag(int64_t i, int64_t nq, int64_t nk) {
  return i + nk - nq;
}

static inline int attn__key_visible(int64_t dg, int64_t j, int64_t wl, int64_t wr) {
  return (wl < 0 || j >= dg - wl) && (wr < 0 || j <= dg + wr);
}

/* The keys [*lo, *hi) visible to the row of diagonal dg. */
static inline void attn__key_range(int64_t dg, int64_t nk, int64_t wl, int64_t wr, int64_t *lo,
                                   int64_t *hi) {
  const int64_t a = wl < 0 ? 0 : dg - wl, z = wr < 0 ? nk : dg + wr + 1;
  *lo = a < 0 ? 0 : a;
  *hi = z > nk ? nk : z;
}

/* The rows [*lo, *hi) that see key j: those whose diagonal is in
 * [j - wr, j + wl]. */
static inline void attn__query_range(int64_t j, int64_t nq, int64_t nk, int64_t wl, int64_t wr,
                                     int64_t *lo, int64_t *hi) {
  const int64_t a = wr < 0 ? 0 : j - wr - (nk - nq), z = wl < 0 ? nq : j + wl - (nk - nq) + 1;
  *lo = a < 0 ? 0 : a;
  *hi = z > nq ? nq : z;
}

/* The keys visible to some row of [i0, i1), i0 < i1: exactly those, as both
 * ends of a row's range grow by one per row and a window is at least one
 * key wide, so the rows' ranges overlap or touch. */
static inline void attn__key_block_range(int64_t i0, int64_t i1, int64_t nq, int64_t nk, int64_t wl,
                                         int64_t wr, int64_t *lo, int64_t *hi) {
  int64_t unused;
  attn__key_range(attn__diag(i0, nq, nk), nk, wl, wr, lo, &unused);
  attn__key_range(attn__diag(i1 - 1, nq, nk), nk, wl, wr, &unused, hi);
}

/* The rows that see some key of [j0, j1), j0 < j1: exactly those, for the
 * same reason. */
static inline void attn__query_block_range(int64_t j0, int64_t j1, int64_t nq, int64_t nk,
                                           int64_t wl, int64_t wr, int64_t *lo, int64_t *hi) {
  int64_t unused;
  attn__query_range(j0, nq, nk, wl, wr, lo, &unused);
  attn__query_range(j1 - 1, nq, nk, wl, wr, &unused, hi);
}

/* The same, with the window of a problem (causal is already in its
 * window_right). nq, nk are the sequence's lengths. */
static inline void attn__problem_key_range(const attn__problem *pb, int64_t i, int64_t nq,
                                           int64_t nk, int64_t *lo, int64_t *hi) {
  attn__key_range(attn__diag(i, nq, nk), nk, pb->window_left, pb->window_right, lo, hi);
}
static inline void attn__problem_key_block_range(const attn__problem *pb, int64_t i0, int64_t i1,
                                                 int64_t nq, int64_t nk, int64_t *lo, int64_t *hi) {
  attn__key_block_range(i0, i1, nq, nk, pb->window_left, pb->window_right, lo, hi);
}
static inline void attn__problem_query_block_range(const attn__problem *pb, int64_t j0, int64_t j1,
                                                   int64_t nq, int64_t nk, int64_t *lo,
                                                   int64_t *hi) {
  attn__query_block_range(j0, j1, nq, nk, pb->window_left, pb->window_right, lo, hi);
}

/* ---------------------------------------------------------------------- */
/* Scores                                                                   */
/* ---------------------------------------------------------------------- */

/* ALiBi's slope for query head h; 0 without ALiBi. */
static inline float attn__problem_slope(const attn__problem *pb, int64_t h) {
  return pb->alibi ? pb->alibi[h] : 0.0f;
}

/* The epilogue of a score s = scale * dot already computed (by a tile
 * product): softcap, then ALiBi at distance dist = dg - j. *t (when t is not
 * NULL) receives tanh(s / softcap), 0 without softcap, for attn__score_grad.
 * In this order, in float: the CPU backend and the GPU kernels round the
 * same way. */
static inline float attn__score_scaled(float s, float softcap, float slope, int64_t dist,
                                       float *t) {
  const float th = softcap > 0.0f ? tanhf(s / softcap) : 0.0f;
  if (t) *t = th;
  return (softcap > 0.0f ? softcap * th : s) - slope * (float)(dist < 0 ? -dist : dist);
}

static inline float attn__score(float dot, float scale, float softcap, float slope, int64_t dist,
                                float *t) {
  return attn__score_scaled(dot * scale, softcap, slope, dist, t);
}

/* attn__score_scaled in double, for the float64 reference: the same steps,
 * so that the reference and the backends compute one definition, each in
 * its own precision. */
static inline double attn__score_scaled_f64(double s, double softcap, double slope, int64_t dist,
                                            double *t) {
  const double th = softcap > 0.0 ? tanh(s / softcap) : 0.0;
  if (t) *t = th;
  return (softcap > 0.0 ? softcap * th : s) - slope * (double)(dist < 0 ? -dist : dist);
}

/* The bias term of row i, key j (sequence-local) of head h, sequence b: 0
 * without a bias. */
static inline float attn__problem_bias(const attn__problem *pb, int64_t b, int64_t h, int64_t i,
                                       int64_t j) {
  if (!pb->has_bias) return 0.0f;
  const attn__tensor *t = &pb->bias;
  return attn__load((const char *)t->native + t->offset, t->dtype,
                    b * t->sb + h * t->sh + i * t->ss + j * t->sd);
}

/* d(score)/d(scale * dot) applied to ds, with t from attn__score: softcap's
 * derivative 1 - tanh^2; ALiBi adds a constant and passes ds unchanged. */
static inline float attn__score_grad(float ds, float t, float softcap) {
  return softcap > 0.0f ? ds * (1.0f - t * t) : ds;
}

/* ---------------------------------------------------------------------- */
/* lse, sinks, merging                                                      */
/* ---------------------------------------------------------------------- */

/* Whether a row that the mask lets see keys (seen) saw one, by its final
 * max m and sum l: with a bias, a row whose scores were all -inf (m = -inf,
 * l = 0) saw none; a NaN among them left l NaN, and the row is NaN. Without
 * a bias the mask alone decides. */
static inline int attn__row_seen(int seen, int has_bias, float m, float l) {
  return seen && !(has_bias && m == -INFINITY && l == 0.0f);
}

/* Folds a sink logit into a row's final max m and sum l (l = sum of
 * exp(s - m)): afterwards lse = m + log(l), and the row's output
 * accumulator, taken relative to the old m, must be multiplied by the
 * returned factor exp(m_old - m) before dividing by l. A row with no key
 * (m = -inf, l = 0) comes out with m = sink, l = 1, factor 0: o = 0 and
 * lse = sink. NaN in m stays NaN in l. */
static inline float attn__sink_fold(float sink, float *m, float *l) {
  const float mn = *m > sink ? *m : sink;
  const float a = *m == -INFINITY ? 0.0f : expf(*m - mn);
  *l = *l * a + expf(sink - mn);
  *m = mn;
  return a;
}

/* A row's term of d(loss)/d(sink): the sink's probability exp(sink - lse)
 * times -D, D = rowsum(do * o) (the sink has no value, so its dP is 0 and
 * dS = P (0 - D)). */
static inline float attn__sink_grad(float sink, float lse, float dsum) {
  return lse == -INFINITY ? 0.0f : -expf(sink - lse) * dsum;
}

/* The merge of n partial results of one row, part s given by its scores'
 * running maximum m[s * stride] and sum l[s * stride] (l NULL: an lse, sum
 * 1): each part's weight l_s exp(m_s - M) into w, M the largest m_s, and
 * their sum into *sum; then lse = M + log(sum) and o = sum_s w[s] o_s / sum
 * for normalized o_s. Keeping M apart from the sum keeps the parts'
 * relative weights where |M| dwarfs log(l_s) in float32 (a row of huge
 * finite biases), as an unsplit row's running maximum does. M = -inf and
 * sum 0 when every part is -inf (weights 0); NaN in a part gives NaN. */
static inline float attn__merge_parts(const float *m, const float *l, int64_t stride, int n,
                                      float *w, float *sum) {
  float mx = -INFINITY;
  int nan = 0;
  for (int s = 0; s < n; s++) {
    const float x = m[s * stride];
    nan |= x != x || (l && l[s * stride] != l[s * stride]);
    mx = x > mx ? x : mx;
  }
  if (nan) {
    for (int s = 0; s < n; s++)
      w[s] = NAN;
    *sum = NAN;
    return NAN;
  }
  *sum = 0.0f;
  if (mx == -INFINITY) {
    for (int s = 0; s < n; s++)
      w[s] = 0.0f;
    return -INFINITY;
  }
  for (int s = 0; s < n; s++)
    *sum += w[s] = expf(m[s * stride] - mx) * (l ? l[s * stride] : 1.0f);
  return mx;
}

/* The lse of n partial results of one row (lse[s * stride]) and each part's
 * weight exp(lse_s - lse) in w: o = sum_s w[s] o_s. -inf when every part is
 * -inf (weights 0); NaN in a part gives NaN. */
static inline float attn__merge_lse(const float *lse, int64_t stride, int n, float *w) {
  float sum;
  const float mx = attn__merge_parts(lse, NULL, stride, n, w, &sum);
  if (!(sum > 0.0f)) return mx;
  for (int s = 0; s < n; s++)
    w[s] /= sum;
  return mx + logf(sum);
}

/* A row's lse = m + log(l) as the float pair the (hi, lo) form stores: hi
 * rounded to float32, lo the rest. A row with no key has hi = -inf, lo = 0;
 * NaN stays NaN in both. The backward pass then takes exp((s - hi) - lo):
 * s - hi is exact near the row maximum, so P keeps float32 accuracy however
 * large the logits. */
static inline void attn__lse_split(double lse, float *hi, float *lo) {
  *hi = (float)lse;
  *lo = lse == -INFINITY ? 0.0f : (float)(lse - (double)*hi);
}

#ifdef __cplusplus
}
#endif
#endif /* ATTN_RULES_H */
