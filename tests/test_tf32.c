/*
 * ATTN_ALLOW_TF32: an f32 forward that allows TF32 is held to the golden
 * README's TF32 rule on every backend (the float32 bound plus F times what
 * rounding q, k, v and P to TF32 alone costs, the test kit's reference
 * computed as TF32 against the exact one; testutil.c), and so is the backward
 * that reads its o and lse. The CUDA backend then runs such problems on the
 * tensor cores in TF32, and only those; every other backend computes in
 * float32 whatever the flag, which the rule allows. The flag changes nothing
 * for f16 and bf16.
 */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static at_shape tf32(int64_t B, int64_t Nq, int64_t Nk, int64_t Hq, int64_t Hkv, int64_t d) {
  at_shape s;
  memset(&s, 0, sizeof s);
  s.dtype = ATTN_F32;
  s.B = B;
  s.Nq = Nq;
  s.Nk = Nk;
  s.Hq = Hq;
  s.Hkv = Hkv;
  s.d = d;
  s.flags = ATTN_ALLOW_TF32;
  return s;
}

static at_shape windowed(at_shape s, int64_t left, int64_t right) {
  s.win = 1;
  s.wl = left;
  s.wr = right;
  return s;
}

static void forward(at_backend *b, at_shape s) {
  if (!at_check_forward(b, &s)) at_skip("the %s backend refuses this problem", b->name);
}

static void backward(at_backend *b, at_shape s) {
  if (!at_check_backward(b, &s)) at_skip("the %s backend refuses this problem", b->name);
}

/* The head dims of CUDA's TF32 rows, with lengths that leave partial tiles,
 * and one the rows do not cover (float32 there). */
static const int64_t dims[] = {32, 64, 96, 128, 256, 80};
static const int64_t dims_small[] = {64, 128};

static void tf32_forward_at_every_head_dim_matches_reference(at_backend *b) {
  const int64_t *ds = b->small ? dims_small : dims;
  size_t n = b->small ? 2 : sizeof dims / sizeof dims[0];
  for (size_t i = 0; i < n; i++)
    forward(b, tf32(2, 150, 150, 2, 2, ds[i]));
}

static void tf32_causal_with_more_queries_than_keys_gives_rows_with_no_key(at_backend *b) {
  at_shape s = tf32(1, 200, 130, 2, 2, 64);
  s.flags |= ATTN_CAUSAL;
  s.want_empty = 1;
  forward(b, s);
}

static void tf32_causal_with_more_keys_than_queries_matches_reference(at_backend *b) {
  at_shape s = tf32(2, 70, 300, 2, 2, 128);
  s.flags |= ATTN_CAUSAL;
  forward(b, s);
}

static void tf32_window_matches_reference(at_backend *b) {
  forward(b, windowed(tf32(1, 250, 250, 2, 2, 64), 40, 10));
}

static void tf32_softcap_and_alibi_match_reference(at_backend *b) {
  at_shape s = tf32(1, 130, 190, 4, 4, 64);
  s.softcap = 20;
  s.alibi = 1;
  s.flags |= ATTN_CAUSAL;
  forward(b, s);
}

/* Many key blocks and query tiles (CUDA's Hopper rows: 64- or 128-key
 * blocks, 128-row tiles, blocks that walk several tiles), keys not a
 * multiple of 8. */
static void tf32_long_sequences_match_reference(at_backend *b) {
  forward(b, tf32(1, 520, 1003, 4, 2, 128));
  at_shape s = tf32(2, 390, 390, 2, 2, 64);
  s.flags |= ATTN_CAUSAL;
  forward(b, s);
  /* d = 256: 64-row tiles over 32-key blocks, a GQA group of two. */
  forward(b, tf32(1, 300, 700, 4, 2, 256));
  s = tf32(1, 333, 333, 2, 1, 256);
  s.flags |= ATTN_CAUSAL;
  forward(b, s);
}

static void tf32_grouped_query_heads_match_reference(at_backend *b) {
  forward(b, tf32(2, 100, 160, 8, 2, 128));
}

static const int32_t cu_q[] = {0, 0, 70, 71, 200}, cu_k[] = {0, 30, 30, 150, 260};

static void tf32_varlen_with_empty_sequences_matches_reference(at_backend *b) {
  at_shape s = tf32(4, 0, 0, 2, 2, 64);
  s.cu_q = cu_q;
  s.cu_k = cu_k;
  s.flags |= ATTN_CAUSAL;
  forward(b, s);
}

/* Scores of a few hundred: TF32's error grows with them (about 2^-11 of
 * sum |q_c k_c| scale), and the rule with it. */
static void tf32_large_scores_stay_within_their_own_rounding(at_backend *b) {
  at_shape s = tf32(1, 100, 130, 2, 2, 64);
  s.scale = 1.0;
  s.amp = 5.0;
  s.tol_o = 2e-4; /* float32's own, as test_reference.c's large_scores_do_not_overflow */
  forward(b, s);
}

static void tf32_strided_inputs_match_reference(at_backend *b) {
  at_shape s = tf32(2, 90, 90, 2, 2, 64);
  s.layout = AT_BHSD;
  forward(b, s);
}

static void backward_after_a_tf32_forward_matches_reference(at_backend *b) {
  backward(b, tf32(2, 120, 150, 4, 2, 64));
}

static void backward_after_a_causal_tf32_forward_matches_reference(at_backend *b) {
  at_shape s = tf32(1, 150, 150, 2, 2, 128);
  s.flags |= ATTN_CAUSAL;
  backward(b, s);
}

/* Max |o - ref| over the problem, after a forward with flags. */
static double o_error(at_backend *b, at_shape s, unsigned flags, double *maxref) {
  s.flags = flags;
  at_prob P;
  at_prob_init(&P, &s);
  int rc = attn_forward(b->ctx, &P.p, &P.q, &P.k, &P.v, &P.o, &P.lse);
  if (rc != ATTN_OK)
    fail_msg("attn_forward returned %s: %s", attn_status_name(rc), attn_errmsg(b->ctx));
  int64_t n = at_count(&P.o);
  double *ro = at_malloc((size_t)n * sizeof *ro);
  assert_non_null(ro);
  attn_params exact = P.p;
  exact.flags &= ~ATTN_ALLOW_TF32;
  assert_int_equal(at_ref_forward(b->ctx, &exact, &P.rq, &P.rk, &P.rv, ro, NULL), ATTN_OK);
  double err = 0;
  *maxref = 0;
  for (int64_t i = 0; i < n; i++) {
    err = fmax(err, fabs(at_get(&P.o, i) - ro[i]));
    *maxref = fmax(*maxref, fabs(ro[i]));
  }
  at_prob_free(&P);
  return err;
}

/* Without the flag, CUDA's f32 is float32 (within 1e-5 of the exact answer,
 * as every backend); with it, the tensor cores' TF32 shows: an error TF32's
 * 10-bit mantissa explains and float32's 23 bits do not. */
static void cuda_rounds_f32_to_tf32_only_when_allowed(at_backend *b) {
  if (b->kind != ATTN_BACKEND_CUDA)
    at_skip("the TF32 kernels are CUDA's; %s computes f32 in float32 whatever the flag", b->name);
  at_shape s = tf32(2, 256, 256, 4, 4, 64);
  double m0, m1;
  double e0 = o_error(b, s, 0, &m0), e1 = o_error(b, s, ATTN_ALLOW_TF32, &m1);
  if (!(e0 <= 1e-5 * m0))
    fail_msg("without ATTN_ALLOW_TF32, o is off by %.3g (max|ref| %.3g): not float32", e0, m0);
  if (!(e1 > 1e-5 * m1))
    fail_msg("with ATTN_ALLOW_TF32, o is off by only %.3g (max|ref| %.3g): no TF32 ran", e1, m1);
}

/* f16 and bf16 inputs: the same bits with the flag as without. */
static void the_flag_changes_nothing_for_f16_and_bf16(at_backend *b) {
  const attn_dtype dts[2] = {ATTN_F16, ATTN_BF16};
  for (int i = 0; i < 2; i++) {
    at_shape s = tf32(1, 100, 100, 2, 2, b->small ? (i ? 128 : 64) : 64);
    s.dtype = dts[i];
    s.flags = 0;
    at_prob P;
    at_prob_init(&P, &s);
    int rc = attn_forward(b->ctx, &P.p, &P.q, &P.k, &P.v, &P.o, &P.lse);
    if (rc == ATTN_EUNSUPPORTED) {
      at_prob_free(&P);
      continue;
    }
    assert_int_equal(rc, ATTN_OK);
    int64_t no = at_count(&P.o), nl = at_count(&P.lse);
    double *o = at_malloc((size_t)(no + nl) * sizeof *o);
    assert_non_null(o);
    for (int64_t j = 0; j < no; j++)
      o[j] = at_get(&P.o, j);
    for (int64_t j = 0; j < nl; j++)
      o[no + j] = at_get(&P.lse, j);
    at_prob_reset_outputs(&P);
    P.p.flags |= ATTN_ALLOW_TF32;
    assert_int_equal(attn_forward(b->ctx, &P.p, &P.q, &P.k, &P.v, &P.o, &P.lse), ATTN_OK);
    for (int64_t j = 0; j < no; j++)
      if (at_get(&P.o, j) != o[j])
        fail_msg("%s: o[%lld] is %.9g with ATTN_ALLOW_TF32, %.9g without", attn_dtype_name(dts[i]),
                 (long long)j, at_get(&P.o, j), o[j]);
    for (int64_t j = 0; j < nl; j++)
      if (at_get(&P.lse, j) != o[no + j])
        fail_msg("%s: lse[%lld] is %.9g with ATTN_ALLOW_TF32, %.9g without",
                 attn_dtype_name(dts[i]), (long long)j, at_get(&P.lse, j), o[no + j]);
    at_prob_free(&P);
  }
}

int main(int argc, char **argv) {
  const at_test tests[] = {
      AT_TEST(tf32_forward_at_every_head_dim_matches_reference),
      AT_TEST(tf32_causal_with_more_queries_than_keys_gives_rows_with_no_key),
      AT_TEST(tf32_causal_with_more_keys_than_queries_matches_reference),
      AT_TEST(tf32_window_matches_reference),
      AT_TEST(tf32_softcap_and_alibi_match_reference),
      AT_TEST(tf32_long_sequences_match_reference),
      AT_TEST(tf32_grouped_query_heads_match_reference),
      AT_TEST(tf32_varlen_with_empty_sequences_matches_reference),
      AT_TEST(tf32_large_scores_stay_within_their_own_rounding),
      AT_TEST(tf32_strided_inputs_match_reference),
      AT_TEST(backward_after_a_tf32_forward_matches_reference),
      AT_TEST(backward_after_a_causal_tf32_forward_matches_reference),
      AT_TEST(cuda_rounds_f32_to_tf32_only_when_allowed),
      AT_TEST(the_flag_changes_nothing_for_f16_and_bf16),
  };
  return at_main(argc, argv, "tf32", tests, sizeof tests / sizeof tests[0], NULL, 0);
}
