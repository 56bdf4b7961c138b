/*
 * The attention rules of every language held to one table (see
 * rules_table.h). The table is thousands of rows built deterministically
 * over sequence shapes (nq, nk in 1..300, nq above, equal to and below nk),
 * windows (none, 0, small, large, causal wr = 0), query and key blocks of
 * sizes 1 to 128 and score inputs (large and negative dots, softcap on and
 * off, ALiBi slopes 0 and not). The C rules (src/rules.h) are checked
 * against a brute-force definition written here from tests/golden/README.md
 * (ranges by scanning every key or row with the visibility definition,
 * scores in double); OpenCL's and CUDA's are then held to the C ones:
 *
 *   - diag, visibility: identical. Ranges: the same set, i.e. identical, or
 *     both empty (the value of an empty range's ends is not a rule).
 *   - block_unmasked (a tile of keys that may run past nk): identical, in
 *     the languages that have the rule (CUDA).
 *   - t: within 6 ulp. Each language's tanhf is within 2 ulp of tanh (the
 *     C library's and CUDA's math API both state 2), and a kernel may form
 *     the argument as a product by 1/softcap where C divides: up to 1.5 ulp
 *     more in the argument, which tanh passes on at most as is, since
 *     (1 - t^2) |x| <= |t|. 2 + 2 + 2 (an ulp boundary crossed) = 6.
 *   - score, natural domain: within 8 ulp of the largest term (the capped
 *     dot or the ALiBi bias): t's 6 and a rounding for each step after it.
 *   - score, log2 domain: within 12 ulp of the largest term times log2(e),
 *     against C's score * log2(e): the natural error times 1.44 and the
 *     folding of log2(e) into scale, softcap and slope.
 * The C rules against their double definition keep 2 ulp for t (tanhf's
 * own error) and 4 for the score.
 *   - score_grad: within 4 eps of ds plus what the difference in t makes of
 *     ds (1 - t^2), 2 |t| |dt| |ds|.
 *
 * A language whose evaluator returns -1 (its backend not built, no runtime
 * or no device) is skipped with the evaluator's reason.
 */
#include "testutil.h"

#include "rules.h"
#include "rules_table.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

/* ---------------------------------------------------------------------- */
/* The table                                                                */
/* ---------------------------------------------------------------------- */

static uint64_t rng;
static uint32_t next(void) {
  rng = rng * 6364136223846793005ull + 1442695040888963407ull;
  return (uint32_t)(rng >> 33);
}
static int32_t pick(int32_t n) { /* 0 .. n-1 */
  return (int32_t)(next() % (uint32_t)n);
}
static float uniform(float lo, float hi) {
  return lo + (hi - lo) * (float)((double)next() / 2147483648.0);
}

/* A block [*a, *b) of `size` (the last one shorter) of a sequence of n,
 * aligned as the kernels align theirs, or an unaligned one; *z is its end
 * before the clamp to n. */
static void block(int32_t n, int32_t size, int aligned, int32_t *a, int32_t *b, int32_t *z) {
  *a = pick(n);
  if (aligned) *a = *a / size * size;
  *z = *a + size;
  *b = *z < n ? *z : n;
}

static rules_in *table(int *count) {
  static const int32_t lens[] = {1, 2, 3, 5, 8, 16, 31, 33, 64, 65, 100, 127, 128, 129, 200, 300};
  static const int32_t wls[] = {-1, 0, 1, 3, 17, 64, 1000};
  static const int32_t wrs[] = {-1, 0, 2, 50, 1000};
  static const int32_t blocks[] = {1, 4, 16, 32, 64, 128};
  static const float dots[] = {0.0f, 1.0f, -1.0f, 0.5f, -3.25f, 30.0f, -80.0f, 1e3f, -1e4f, 2e4f};
  static const float scales[] = {1.0f, 0.125f, 0.088388346f, 2.0f};
  static const float caps[] = {0.0f, 0.0f, 5.0f, 30.0f, 50.0f};
  static const float slopes[] = {0.0f, 0.0f, 0.5f, 0.0625f, 0.00390625f, 1e-3f};
#define N(a) (int32_t)(sizeof a / sizeof a[0])
  const int n = N(lens) * N(lens) * N(wls) * N(wrs);
  rules_in *in = at_calloc((size_t)n, sizeof *in);
  rng = 0x9E3779B97F4A7C15ull;
  int x = 0;
  for (int a = 0; a < N(lens); a++)
    for (int b = 0; b < N(lens); b++)
      for (int l = 0; l < N(wls); l++)
        for (int r = 0; r < N(wrs); r++, x++) {
          rules_in *row = &in[x];
          row->nq = lens[a];
          row->nk = lens[b];
          row->wl = wls[l];
          row->wr = wrs[r];
          /* The first and last rows and keys, where the clamps act, as often
           * as any other. */
          row->i = x % 4 == 0 ? 0 : x % 4 == 1 ? row->nq - 1 : pick(row->nq);
          row->j = x % 3 == 0 ? 0 : x % 3 == 1 ? row->nk - 1 : pick(row->nk);
          int32_t unused;
          block(row->nq, blocks[pick(N(blocks))], x % 2, &row->i0, &row->i1, &unused);
          block(row->nk, blocks[pick(N(blocks))], x % 2, &row->j0, &row->j1, &row->j2);
          row->dot = x % 2 ? dots[pick(N(dots))] : uniform(-50.0f, 50.0f);
          row->scale = scales[pick(N(scales))];
          row->softcap = caps[pick(N(caps))];
          row->slope = slopes[pick(N(slopes))];
          row->ds = x % 5 ? uniform(-2.0f, 2.0f) : uniform(-1e3f, 1e3f);
        }
#undef N
  *count = n;
  return in;
}

/* ---------------------------------------------------------------------- */
/* The definition, by brute force                                           */
/* ---------------------------------------------------------------------- */

/* tests/golden/README.md: key j is visible to row i when
 * diag - l <= j <= diag + r, diag = i + Nk - Nq, a bound of -1 being none. */
static int defined_visible(int32_t i, int32_t j, const rules_in *r) {
  const int64_t diag = (int64_t)i + r->nk - r->nq;
  return j >= 0 && j < r->nk && (r->wl == -1 || j >= diag - r->wl) &&
         (r->wr == -1 || j <= diag + r->wr);
}

/* Keys [j0, j1) x rows [i0, i1): the first and one past the last key (or
 * row, by_rows) that some pair makes visible, and how many there are. */
typedef struct span {
  int32_t lo, hi, count;
} span;

static span scan(const rules_in *r, int32_t i0, int32_t i1, int32_t j0, int32_t j1, int by_rows) {
  span s = {0, 0, 0};
  const int32_t outer0 = by_rows ? i0 : j0, outer1 = by_rows ? i1 : j1;
  for (int32_t a = outer0; a < outer1; a++) {
    int seen = 0;
    for (int32_t b = by_rows ? j0 : i0; b < (by_rows ? j1 : i1) && !seen; b++)
      seen = by_rows ? defined_visible(a, b, r) : defined_visible(b, a, r);
    if (!seen) continue;
    if (!s.count) s.lo = a;
    s.hi = a + 1;
    s.count++;
  }
  return s;
}

/* Whether every row of [i0, i1) sees every key of [j0, j2) (keys past the
 * sequence are seen by none). */
static int defined_unmasked(const rules_in *r) {
  for (int32_t i = r->i0; i < r->i1; i++)
    for (int32_t j = r->j0; j < r->j2; j++)
      if (!defined_visible(i, j, r)) return 0;
  return 1;
}

/* [lo, hi) is the span's set: empty when the span is, else its ends, with
 * nothing missing in between. */
static int same_set(int32_t lo, int32_t hi, span s) {
  if (!s.count) return lo >= hi;
  return lo == s.lo && hi == s.hi && s.count == s.hi - s.lo;
}

static float ulp(float x) {
  x = fabsf(x);
  if (!(x < INFINITY)) return 0.0f;
  if (x < FLT_MIN) x = FLT_MIN;
  return nextafterf(x, INFINITY) - x;
}

/* The largest term of a score: the (capped) scaled dot or the ALiBi bias. */
static float score_magnitude(const rules_in *r, const rules_out *c) {
  const float bias = r->slope * (float)abs(c->diag - r->j);
  return fmaxf(fabsf(c->score + bias), fabsf(bias));
}

/* Row x of the table, in words, for a failure message. */
static const char *where(const rules_in *r, int x) {
  static char buf[256];
  snprintf(buf, sizeof buf,
           "row %d: nq %d nk %d window (%d, %d) i %d j %d rows [%d, %d) keys [%d, %d)", x, r->nq,
           r->nk, r->wl, r->wr, r->i, r->j, r->i0, r->i1, r->j0, r->j1);
  return buf;
}

static int within(float got, float want, float tol) {
  if (isnan(want)) return isnan(got);
  if (isinf(want)) return got == want;
  return fabsf(got - want) <= tol;
}

static void c_rules_match_their_definition(at_backend *unused) {
  int n;
  rules_in *in = table(&n);
  rules_out *out = at_calloc((size_t)n, sizeof *out);
  assert_int_equal(rules_eval_c(in, n, out), 0);
  for (int x = 0; x < n; x++) {
    const rules_in *r = &in[x];
    const rules_out *o = &out[x];
    if (o->diag != r->i + r->nk - r->nq) fail_msg("diag %d, %s", o->diag, where(r, x));
    if (o->visible != defined_visible(r->i, r->j, r))
      fail_msg("key_visible %d, %s", o->visible, where(r, x));
    if (o->unmasked != defined_unmasked(r))
      fail_msg("block_unmasked %d over keys [%d, %d), %s", o->unmasked, r->j0, r->j2, where(r, x));
    if (!same_set(o->key_lo, o->key_hi, scan(r, r->i, r->i + 1, 0, r->nk, 0)))
      fail_msg("key_range [%d, %d), %s", o->key_lo, o->key_hi, where(r, x));
    if (!same_set(o->query_lo, o->query_hi, scan(r, 0, r->nq, r->j, r->j + 1, 1)))
      fail_msg("query_range [%d, %d), %s", o->query_lo, o->query_hi, where(r, x));
    if (!same_set(o->kblock_lo, o->kblock_hi, scan(r, r->i0, r->i1, 0, r->nk, 0)))
      fail_msg("key_block_range [%d, %d), %s", o->kblock_lo, o->kblock_hi, where(r, x));
    if (!same_set(o->qblock_lo, o->qblock_hi, scan(r, 0, r->nq, r->j0, r->j1, 1)))
      fail_msg("query_block_range [%d, %d), %s", o->qblock_lo, o->qblock_hi, where(r, x));

    /* The score by its definition, in double. */
    const double s = (double)r->dot * r->scale;
    const double t = r->softcap > 0.0f ? tanh(s / r->softcap) : 0.0;
    const double bias = (double)r->slope * fabs((double)(o->diag - r->j));
    const double want = (r->softcap > 0.0f ? r->softcap * t : s) - bias;
    const float mag = score_magnitude(r, o);
    if (!within(o->score, (float)want, 4 * ulp(mag)))
      fail_msg("score %.9g, defined %.17g, %s", o->score, want, where(r, x));
    if (!within(o->t, (float)t, 2 * ulp((float)t)))
      fail_msg("t %.9g, defined %.17g, %s", o->t, t, where(r, x));
    const double g = r->softcap > 0.0f ? r->ds * (1.0 - t * t) : r->ds;
    if (!within(o->grad, (float)g, 4 * FLT_EPSILON * fabsf(r->ds) + ulp((float)g)))
      fail_msg("score_grad %.9g, defined %.17g, %s", o->grad, g, where(r, x));
  }
}

/* One language's evaluator against the C rules. */
static void held_to_c(const char *lang,
                      int (*eval)(const rules_in *, int, rules_out *, char *, size_t)) {
  int n;
  rules_in *in = table(&n);
  rules_out *want = at_calloc((size_t)n, sizeof *want), *got = at_calloc((size_t)n, sizeof *got);
  assert_int_equal(rules_eval_c(in, n, want), 0);
  char why[512] = "";
  /* -1: the language's runtime or device is missing; anything else that is
   * not 0 is the evaluator failing where it should have run. */
  int rc = eval(in, n, got, why, sizeof why);
  if (rc == -1) at_skip("%s: %s", lang, why[0] ? why : "no reason");
  if (rc != 0) fail_msg("%s: the evaluator failed: %s", lang, why);
  for (int x = 0; x < n; x++) {
    const rules_in *r = &in[x];
    const rules_out *c = &want[x], *o = &got[x];
    if (o->diag != c->diag) fail_msg("%s: diag %d, C %d, %s", lang, o->diag, c->diag, where(r, x));
    if (!o->visible != !c->visible)
      fail_msg("%s: key_visible %d, C %d, %s", lang, o->visible, c->visible, where(r, x));
    if (o->unmasked >= 0 && o->unmasked != c->unmasked)
      fail_msg("%s: block_unmasked %d, C %d over keys [%d, %d), %s", lang, o->unmasked, c->unmasked,
               r->j0, r->j2, where(r, x));
    const int32_t ends[4][4] = {{o->key_lo, o->key_hi, c->key_lo, c->key_hi},
                                {o->query_lo, o->query_hi, c->query_lo, c->query_hi},
                                {o->kblock_lo, o->kblock_hi, c->kblock_lo, c->kblock_hi},
                                {o->qblock_lo, o->qblock_hi, c->qblock_lo, c->qblock_hi}};
    static const char *const names[4] = {"key_range", "query_range", "key_block_range",
                                         "query_block_range"};
    for (int k = 0; k < 4; k++) {
      const int32_t *e = ends[k];
      const int both_empty = e[0] >= e[1] && e[2] >= e[3];
      if (!both_empty && (e[0] != e[2] || e[1] != e[3]))
        fail_msg("%s: %s [%d, %d), C [%d, %d), %s", lang, names[k], e[0], e[1], e[2], e[3],
                 where(r, x));
    }
    const float mag = score_magnitude(r, c);
    if (!within(o->score, c->score, 8 * ulp(mag)))
      fail_msg("%s: score %.9g, C %.9g, %s", lang, o->score, c->score, where(r, x));
    if (!within(o->t, c->t, 6 * ulp(c->t)))
      fail_msg("%s: t %.9g, C %.9g, %s", lang, o->t, c->t, where(r, x));
    const double log2e = 1.44269504088896340736;
    if (!within(o->score_log2, (float)(c->score * log2e), 12 * ulp(mag * (float)log2e)))
      fail_msg("%s: score_log2 %.9g, C score * log2(e) %.9g, %s", lang, o->score_log2,
               c->score * log2e, where(r, x));
    const float dt = fabsf(o->t - c->t);
    if (!within(o->grad, c->grad, fabsf(r->ds) * (4 * FLT_EPSILON + 2 * fabsf(c->t) * dt)))
      fail_msg("%s: score_grad %.9g, C %.9g, %s", lang, o->grad, c->grad, where(r, x));
  }
}

static void opencl_rules_match_c(at_backend *unused) {
  held_to_c("opencl", rules_eval_opencl);
}

static void cuda_rules_match_c(at_backend *unused) {
  held_to_c("cuda", rules_eval_cuda);
}

/* ---------------------------------------------------------------------- */
/* lse                                                                      */
/* ---------------------------------------------------------------------- */

static void lse_split_keeps_what_float_drops(at_backend *unused) {
  float hi, lo;
  const double lse = 1234.56789012345678;
  attn__lse_split(lse, &hi, &lo);
  assert_true(hi == (float)lse);
  assert_true(fabs((double)hi + lo - lse) <= 1e-12 * lse);
  attn__lse_split(-INFINITY, &hi, &lo);
  assert_true(hi == -INFINITY && lo == 0.0f);
  attn__lse_split(NAN, &hi, &lo);
  assert_true(isnan(hi) && isnan(lo));
}

int main(int argc, char **argv) {
  static const at_test common[] = {
      AT_TEST(c_rules_match_their_definition),
      AT_TEST(opencl_rules_match_c),
      AT_TEST(cuda_rules_match_c),
      AT_TEST(lse_split_keeps_what_float_drops),
  };
  return at_main(argc, argv, "rules", NULL, 0, common, sizeof common / sizeof common[0]);
}
