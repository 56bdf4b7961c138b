/*
 * Random problems against the reference (testkit/ref.c: the definition, in
 * double): every mask kind, softcap, ALiBi, GQA/MQA, varlen with empty
 * sequences, strided inputs, f32/f16/bf16, forward and backward, host tensors
 * and device buffers. f16/bf16 are compared with the reference computed on
 * the same rounded inputs. Each test is one behaviour; at_check_forward() and
 * at_check_backward() (testutil.c) hold the checks every output must pass.
 */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static at_shape base(attn_dtype dt, int64_t B, int64_t Nq, int64_t Nk, int64_t Hq, int64_t Hkv,
                     int64_t d) {
  at_shape s;
  memset(&s, 0, sizeof s);
  s.dtype = dt;
  s.B = B;
  s.Nq = Nq;
  s.Nk = Nk;
  s.Hq = Hq;
  s.Hkv = Hkv;
  s.d = d;
  return s;
}

static at_shape varlen(attn_dtype dt, int64_t B, const int32_t *cu_q, const int32_t *cu_k,
                       int64_t Hq, int64_t Hkv, int64_t d) {
  at_shape s = base(dt, B, 0, 0, Hq, Hkv, d);
  s.cu_q = cu_q;
  s.cu_k = cu_k;
  return s;
}

static at_shape windowed(at_shape s, int64_t left, int64_t right) {
  s.win = 1;
  s.wl = left;
  s.wr = right;
  return s;
}

static at_shape causal(at_shape s) {
  s.flags |= ATTN_CAUSAL;
  return s;
}

static at_shape with_empty_rows(at_shape s) {
  s.want_empty = 1;
  return s;
}

static at_shape laid(at_shape s, at_layout L) {
  s.layout = L;
  return s;
}

/* On a slow device (PoCL) every (dtype, head-dim bucket) is one kernel build
 * of ~45 s; half-precision problems there use the head dims the golden cases
 * build anyway (f16: 64, bf16: 128), so the suite stays within minutes. */
static at_shape sized_for(const at_backend *b, at_shape s) {
  if (b->small && s.dtype == ATTN_F16) s.d = 64;
  if (b->small && s.dtype == ATTN_BF16) s.d = 128;
  return s;
}

/* One problem: skipped (not passed) when the backend refuses it with a reason. */
static void forward(at_backend *b, at_shape s) {
  s = sized_for(b, s);
  if (!at_check_forward(b, &s)) at_skip("the %s backend refuses this problem", b->name);
}

static void backward(at_backend *b, at_shape s) {
  s = sized_for(b, s);
  if (!at_check_backward(b, &s)) at_skip("the %s backend refuses this problem", b->name);
}

/* ---------------------------------------------------------------------- */
/* Forward: shapes                                                          */
/* ---------------------------------------------------------------------- */

static void single_query_and_single_key_match_reference(at_backend *b) {
  forward(b, base(ATTN_F32, 2, 1, 1, 2, 2, 64));
}

static void single_query_row_over_many_keys_matches_reference(at_backend *b) {
  forward(b, base(ATTN_F32, 2, 1, 777, 8, 1, 128));
}

static const int64_t head_dims[] = {1, 3, 8, 17, 64, 96, 128, 200, 256};
static const int64_t head_dims_small[] = {1, 17, 256};

static void head_dims_from_1_to_256_match_reference(at_backend *b) {
  const int64_t *ds = b->small ? head_dims_small : head_dims;
  size_t n = b->small ? 3 : sizeof head_dims / sizeof head_dims[0];
  int ran = 0;
  for (size_t i = 0; i < n; i++) {
    at_shape s = base(ATTN_F32, 1, 37, 53, 2, 2, ds[i]);
    s.seed = (uint64_t)ds[i];
    ran += at_check_forward(b, &s);
  }
  if (!ran) at_skip("the %s backend refuses every head dim", b->name);
}

static void more_queries_than_keys_matches_reference(at_backend *b) {
  forward(b, base(ATTN_F32, 2, 150, 40, 2, 2, 64));
}

static void more_keys_than_queries_matches_reference(at_backend *b) {
  forward(b, base(ATTN_F32, 2, 40, 150, 2, 2, 64));
}

static void several_sequences_in_a_batch_match_reference(at_backend *b) {
  forward(b, base(ATTN_F32, 3, 65, 65, 3, 3, 32));
}

static void long_sequence_matches_reference(at_backend *b) {
  int64_t n = b->small ? 600 : 1500;
  forward(b, causal(base(ATTN_F32, 1, n, n, 1, 1, 64)));
}

static void explicit_scale_matches_reference(at_backend *b) {
  at_shape s = base(ATTN_F32, 1, 80, 80, 2, 2, 64);
  s.scale = 0.3;
  forward(b, s);
}

static void large_scores_do_not_overflow(at_backend *b) {
  /* Scores of a few hundred: exp overflows float unless the running max is
   * subtracted. A float32 score of magnitude S is off by ~S * 6e-8 * sqrt(d),
   * and exp turns that into a relative error of o: hence the looser bound. */
  at_shape s = base(ATTN_F32, 1, 100, 130, 2, 2, 64);
  s.scale = 1.0;
  s.amp = 5.0;
  s.tol_o = 2e-4;
  forward(b, s);
}

/* ---------------------------------------------------------------------- */
/* Forward: masks                                                           */
/* ---------------------------------------------------------------------- */

static void causal_square_matches_reference(at_backend *b) {
  forward(b, causal(base(ATTN_F32, 2, 130, 130, 2, 2, 32)));
}

static void causal_with_more_keys_than_queries_aligns_bottom_right(at_backend *b) {
  forward(b, causal(base(ATTN_F32, 1, 50, 200, 2, 2, 64)));
}

static void causal_rows_with_no_key_give_zero_and_minus_inf(at_backend *b) {
  /* Nq > Nk: the first 130 rows have diag < 0 and see no key. */
  forward(b, with_empty_rows(causal(base(ATTN_F32, 2, 200, 70, 2, 2, 64))));
}

static void window_left_matches_reference(at_backend *b) {
  forward(b, windowed(base(ATTN_F32, 1, 300, 300, 2, 2, 64), 64, -1));
}

static void window_right_matches_reference(at_backend *b) {
  forward(b, windowed(base(ATTN_F32, 1, 300, 300, 2, 2, 64), -1, 16));
}

static void window_both_sides_matches_reference(at_backend *b) {
  forward(b, windowed(base(ATTN_F32, 1, 200, 260, 2, 2, 48), 32, 16));
}

static void window_with_causal_matches_reference(at_backend *b) {
  forward(b, causal(windowed(base(ATTN_F32, 1, 300, 300, 2, 2, 64), 48, -1)));
}

static void causal_with_wider_right_window_stays_causal(at_backend *b) {
  forward(b, causal(windowed(base(ATTN_F32, 1, 120, 120, 2, 2, 32), 20, 7)));
}

static void zero_width_window_sees_only_the_diagonal(at_backend *b) {
  forward(b, windowed(base(ATTN_F32, 1, 90, 90, 2, 2, 32), 0, 0));
}

static void window_rows_with_no_key_give_zero_and_minus_inf(at_backend *b) {
  /* diag = i - 60: rows below 58 are left of every key's window. */
  forward(b, with_empty_rows(windowed(base(ATTN_F32, 1, 100, 40, 2, 2, 32), 5, 2)));
}

/* ---------------------------------------------------------------------- */
/* Forward: score modifiers, heads                                          */
/* ---------------------------------------------------------------------- */

static void softcap_matches_reference(at_backend *b) {
  at_shape s = base(ATTN_F32, 1, 200, 200, 2, 2, 64);
  s.softcap = 30;
  s.scale = 0.5;
  s.amp = 3;
  forward(b, s);
}

static void small_softcap_matches_reference(at_backend *b) {
  at_shape s = base(ATTN_F32, 1, 100, 100, 2, 2, 64);
  s.softcap = 2;
  forward(b, s);
}

static void alibi_matches_reference(at_backend *b) {
  at_shape s = base(ATTN_F32, 1, 150, 170, 4, 4, 64);
  s.alibi = 1;
  forward(b, s);
}

static void alibi_with_causal_and_softcap_matches_reference(at_backend *b) {
  at_shape s = causal(base(ATTN_F32, 1, 150, 150, 4, 2, 64));
  s.alibi = 1;
  s.softcap = 10;
  forward(b, s);
}

static void grouped_query_heads_match_reference(at_backend *b) {
  forward(b, causal(base(ATTN_F32, 1, 120, 120, 8, 2, 64)));
}

static void multi_query_heads_match_reference(at_backend *b) {
  forward(b, base(ATTN_F32, 2, 70, 90, 6, 1, 64));
}

/* Rows a multiple of 4 KiB apart (H d = 1024 in f32, 2048 in bf16), which
 * the CPU copies out of the tensors rather than read in place (once per
 * call for the forward's keys, per tile elsewhere): several query tiles
 * over the same key blocks, forward and backward. */
static void rows_4_kib_apart_match_reference(at_backend *b) {
  backward(b, causal(base(ATTN_F32, 1, 150, 150, 16, 8, 128)));
  forward(b, base(ATTN_BF16, 1, 150, 140, 16, 16, 128));
}

/* ---------------------------------------------------------------------- */
/* Forward: variable-length batches                                         */
/* ---------------------------------------------------------------------- */

static const int32_t cu_a[] = {0, 37, 100, 101, 230};
static const int32_t cu_q_b[] = {0, 10, 60, 61}, cu_k_b[] = {0, 70, 80, 200};
/* Empty query and empty key sequences side by side. */
static const int32_t cu_q_e[] = {0, 0, 7, 7, 20}, cu_k_e[] = {0, 5, 5, 19, 30};

static void varlen_matches_reference(at_backend *b) {
  forward(b, varlen(ATTN_F32, 4, cu_a, cu_a, 3, 3, 64));
}

static void varlen_with_different_key_lengths_matches_reference(at_backend *b) {
  forward(b, causal(varlen(ATTN_F32, 3, cu_q_b, cu_k_b, 4, 2, 32)));
}

static void varlen_with_empty_sequences_gives_zero_rows(at_backend *b) {
  forward(b, with_empty_rows(causal(varlen(ATTN_F32, 4, cu_q_e, cu_k_e, 2, 2, 32))));
}

static void varlen_with_window_matches_reference(at_backend *b) {
  forward(b, windowed(varlen(ATTN_F32, 4, cu_a, cu_a, 2, 1, 64), 16, 4));
}

/* ---------------------------------------------------------------------- */
/* Forward: memory layouts                                                  */
/* ---------------------------------------------------------------------- */

static void bhsd_strides_match_reference(at_backend *b) {
  forward(b, laid(causal(base(ATTN_F32, 2, 70, 90, 4, 2, 32)), AT_BHSD));
}

static void slices_of_a_fused_qkv_tensor_match_reference(at_backend *b) {
  forward(b, laid(causal(base(ATTN_F32, 2, 80, 80, 3, 3, 32)), AT_QKV));
}

static void padded_head_dim_leaves_padding_untouched(at_backend *b) {
  forward(b, laid(base(ATTN_F32, 2, 50, 60, 2, 2, 40), AT_PAD));
}

static void head_dim_stride_of_two_matches_reference(at_backend *b) {
  forward(b, laid(base(ATTN_F32, 1, 50, 60, 2, 2, 32), AT_DSTRIDE));
}

static void each_tensor_in_its_own_layout_matches_reference(at_backend *b) {
  forward(b, laid(causal(base(ATTN_F32, 2, 70, 90, 4, 2, 32)), AT_MIXED));
}

static void varlen_in_bhsd_strides_matches_reference(at_backend *b) {
  forward(b, laid(causal(varlen(ATTN_F32, 3, cu_q_b, cu_k_b, 2, 2, 32)), AT_BHSD));
}

static void varlen_fused_qkv_matches_reference(at_backend *b) {
  forward(b, laid(causal(varlen(ATTN_F32, 4, cu_a, cu_a, 2, 2, 64)), AT_QKV));
}

/* ---------------------------------------------------------------------- */
/* Forward: half precision                                                  */
/* ---------------------------------------------------------------------- */

static void f16_matches_reference_on_rounded_inputs(at_backend *b) {
  forward(b, base(ATTN_F16, 1, 200, 200, 2, 2, 64));
}

static void bf16_matches_reference_on_rounded_inputs(at_backend *b) {
  forward(b, base(ATTN_BF16, 1, 200, 200, 2, 2, 64));
}

static void f16_causal_grouped_heads_match_reference(at_backend *b) {
  forward(b, causal(base(ATTN_F16, 2, 130, 130, 4, 2, 128)));
}

static void bf16_window_alibi_softcap_match_reference(at_backend *b) {
  at_shape s = windowed(base(ATTN_BF16, 1, 150, 150, 2, 2, 64), 40, 10);
  s.alibi = 1;
  s.softcap = 20;
  forward(b, s);
}

static void f16_varlen_with_empty_sequences_gives_zero_rows(at_backend *b) {
  forward(b, with_empty_rows(causal(varlen(ATTN_F16, 4, cu_q_e, cu_k_e, 2, 2, 32))));
}

static void bf16_head_dim_256_matches_reference(at_backend *b) {
  forward(b, base(ATTN_BF16, 1, 64, 64, 2, 2, 256));
}

static void f16_padded_head_dim_leaves_padding_untouched(at_backend *b) {
  forward(b, laid(base(ATTN_F16, 1, 50, 60, 2, 2, 24), AT_PAD));
}

/* ---------------------------------------------------------------------- */
/* Forward: lse is optional                                                 */
/* ---------------------------------------------------------------------- */

static void forward_without_lse_gives_the_same_o(at_backend *b) {
  at_prob P;
  at_shape s = causal(base(ATTN_F32, 2, 70, 70, 2, 2, 32));
  at_prob_init(&P, &s);
  int rc = attn_forward(b->ctx, &P.p, &P.q, &P.k, &P.v, &P.o, &P.lse);
  if (rc == ATTN_EUNSUPPORTED) at_skip("refused: %s", attn_errmsg(b->ctx));
  assert_int_equal(rc, ATTN_OK);
  size_t n = P.mo.nbytes;
  unsigned char *with = at_malloc(n);
  assert_non_null(with);
  memcpy(with, P.mo.bytes, n);
  at_prob_reset_outputs(&P);
  rc = attn_forward(b->ctx, &P.p, &P.q, &P.k, &P.v, &P.o, NULL);
  if (rc != ATTN_OK) fail_msg("lse NULL: %s: %s", attn_status_name(rc), attn_errmsg(b->ctx));
  if (memcmp(with, P.mo.bytes, n) != 0) fail_msg("o differs when lse is not asked for");
  at_free(with);
  at_prob_free(&P);
}

/* ---------------------------------------------------------------------- */
/* Backward                                                                 */
/* ---------------------------------------------------------------------- */

static void backward_matches_reference(at_backend *b) {
  backward(b, base(ATTN_F32, 2, 70, 70, 2, 2, 32));
}

static void backward_single_query_row_matches_reference(at_backend *b) {
  backward(b, base(ATTN_F32, 2, 1, 300, 4, 1, 64));
}

static void backward_head_dims_from_1_to_256_match_reference(at_backend *b) {
  const int64_t *ds = b->small ? head_dims_small : head_dims;
  size_t n = b->small ? 3 : sizeof head_dims / sizeof head_dims[0];
  int ran = 0;
  for (size_t i = 0; i < n; i++) {
    at_shape s = base(ATTN_F32, 1, 33, 45, 2, 2, ds[i]);
    s.seed = (uint64_t)ds[i] + 100;
    ran += at_check_backward(b, &s);
  }
  if (!ran) at_skip("the %s backend refuses every head dim", b->name);
}

static void backward_causal_matches_reference(at_backend *b) {
  backward(b, causal(base(ATTN_F32, 2, 130, 130, 2, 2, 64)));
}

static void backward_causal_more_keys_than_queries_matches_reference(at_backend *b) {
  backward(b, causal(base(ATTN_F32, 1, 60, 190, 2, 2, 64)));
}

static void backward_rows_with_no_key_pass_no_gradient(at_backend *b) {
  backward(b, with_empty_rows(causal(base(ATTN_F32, 1, 190, 60, 2, 2, 64))));
}

static void backward_window_matches_reference(at_backend *b) {
  backward(b, windowed(base(ATTN_F32, 1, 200, 200, 2, 2, 48), 32, 16));
}

static void backward_window_with_causal_matches_reference(at_backend *b) {
  backward(b, causal(windowed(base(ATTN_F32, 1, 200, 200, 2, 2, 64), 40, -1)));
}

static void backward_softcap_matches_reference(at_backend *b) {
  at_shape s = base(ATTN_F32, 1, 150, 150, 2, 2, 64);
  s.softcap = 30;
  s.scale = 0.5;
  s.amp = 3;
  backward(b, s);
}

static void backward_alibi_matches_reference(at_backend *b) {
  at_shape s = causal(base(ATTN_F32, 1, 150, 150, 4, 4, 64));
  s.alibi = 1;
  backward(b, s);
}

static void backward_grouped_query_heads_sum_into_kv_heads(at_backend *b) {
  backward(b, causal(base(ATTN_F32, 1, 120, 120, 8, 2, 64)));
}

static void backward_multi_query_heads_sum_into_one_kv_head(at_backend *b) {
  backward(b, base(ATTN_F32, 2, 70, 90, 6, 1, 32));
}

static void backward_varlen_matches_reference(at_backend *b) {
  backward(b, causal(varlen(ATTN_F32, 3, cu_q_b, cu_k_b, 4, 2, 32)));
}

static void backward_varlen_with_empty_sequences_matches_reference(at_backend *b) {
  backward(b, with_empty_rows(causal(varlen(ATTN_F32, 4, cu_q_e, cu_k_e, 2, 2, 32))));
}

static void backward_bhsd_strides_match_reference(at_backend *b) {
  backward(b, laid(causal(base(ATTN_F32, 2, 70, 90, 4, 2, 32)), AT_BHSD));
}

static void backward_into_a_fused_gradient_tensor_matches_reference(at_backend *b) {
  backward(b, laid(causal(base(ATTN_F32, 2, 80, 80, 3, 3, 32)), AT_QKV));
}

static void backward_padded_head_dim_leaves_padding_untouched(at_backend *b) {
  backward(b, laid(base(ATTN_F32, 2, 50, 60, 2, 2, 40), AT_PAD));
}

static void backward_head_dim_stride_of_two_matches_reference(at_backend *b) {
  backward(b, laid(base(ATTN_F32, 1, 50, 60, 2, 2, 32), AT_DSTRIDE));
}

static void backward_each_tensor_in_its_own_layout_matches_reference(at_backend *b) {
  backward(b, laid(causal(varlen(ATTN_F32, 3, cu_q_b, cu_k_b, 4, 2, 32)), AT_MIXED));
}

static void backward_f16_matches_reference_on_rounded_inputs(at_backend *b) {
  backward(b, causal(base(ATTN_F16, 1, 150, 150, 2, 2, 64)));
}

static void backward_bf16_matches_reference_on_rounded_inputs(at_backend *b) {
  backward(b, base(ATTN_BF16, 1, 150, 150, 2, 2, 64));
}

static void backward_bf16_grouped_heads_varlen_match_reference(at_backend *b) {
  backward(b, causal(varlen(ATTN_BF16, 4, cu_a, cu_a, 4, 2, 64)));
}

/* ---------------------------------------------------------------------- */
/* Device buffers                                                           */
/* ---------------------------------------------------------------------- */

typedef enum { SEPARATE, SEPARATE_ASYNC, ONE_BUFFER, WRAPPED } buf_mode;

/* Runs P forward (and backward) on device buffers in the given arrangement;
 * the outputs are read back into P's host memory. */
static void run_on_buffers(at_backend *b, at_prob *P, buf_mode mode, int with_backward) {
  attn_context *ctx = b->ctx;
  assert_int_not_equal(P->s.layout, AT_QKV); /* one tensor per block below */
  at_mem *mems[] = {&P->mq, &P->mk, &P->mv, &P->mo, &P->mlse, &P->mdo, &P->mdq, &P->mdkv};
  attn_tensor *ts[] = {&P->q, &P->k, &P->v, &P->o, &P->lse, &P->dout, &P->dq, &P->dk, &P->dv};
  /* the block each tensor lives in */
  at_mem *home[] = {&P->mq, &P->mk, &P->mv, &P->mo, &P->mlse, &P->mdo, &P->mdq, &P->mdkv, &P->mdkv};
  enum { NM = 8, NT = 9 };
  attn_buffer *own[NM] = {0}, *wrap[NM] = {0}, *one = NULL;
  size_t at[NM] = {0}, total = 0;
  for (int i = 0; i < NM; i++) {
    at[i] = total;
    total += (mems[i]->nbytes + 255) / 256 * 256 + 256; /* room, and offsets not at 0 */
  }
  if (mode == ONE_BUFFER) assert_int_equal(attn_buffer_create(ctx, total, &one), ATTN_OK);
  for (int i = 0; i < NM; i++) {
    if (!mems[i]->nbytes) continue;
    if (mode == ONE_BUFFER) {
      at[i] += 256 - 4 * (size_t)i; /* odd-ish offsets, still element-aligned */
      assert_int_equal(attn_buffer_write(ctx, one, at[i], mems[i]->bytes, mems[i]->nbytes),
                       ATTN_OK);
      continue;
    }
    at[i] = 0;
    assert_int_equal(attn_buffer_create(ctx, mems[i]->nbytes, &own[i]), ATTN_OK);
    if (mode == WRAPPED) {
      /* A wrapper of the same native memory; the tensors use only it. */
      int rc = attn_buffer_wrap(ctx, attn_buffer_native(own[i]), mems[i]->nbytes, &wrap[i]);
      if (rc != ATTN_OK)
        fail_msg("attn_buffer_wrap: %s: %s", attn_status_name(rc), attn_errmsg(ctx));
      assert_int_equal(attn_buffer_size(wrap[i]), mems[i]->nbytes);
    }
    attn_buffer *w = mode == WRAPPED ? wrap[i] : own[i];
    assert_int_equal(attn_buffer_write(ctx, w, 0, mems[i]->bytes, mems[i]->nbytes), ATTN_OK);
  }
  attn_tensor dt[NT];
  for (int t = 0; t < NT; t++) {
    int i = 0;
    while (mems[i] != home[t])
      i++;
    size_t within = (size_t)((unsigned char *)ts[t]->data - home[t]->bytes);
    attn_buffer *buf = mode == ONE_BUFFER ? one : mode == WRAPPED ? wrap[i] : own[i];
    dt[t] = attn_tensor_on(*ts[t], buf, at[i] + within);
  }
  attn_params p = P->p;
  if (mode == SEPARATE_ASYNC) p.flags |= ATTN_ASYNC; /* complete only at synchronize */
  int rc = attn_forward(ctx, &p, &dt[0], &dt[1], &dt[2], &dt[3], &dt[4]);
  if (rc == ATTN_EUNSUPPORTED) at_skip("refused on buffers: %s", attn_errmsg(ctx));
  if (rc != ATTN_OK) fail_msg("forward on buffers: %s: %s", attn_status_name(rc), attn_errmsg(ctx));
  if (with_backward) {
    rc = attn_backward(ctx, &p, &dt[0], &dt[1], &dt[2], &dt[3], &dt[4], &dt[5], &dt[6], &dt[7],
                       &dt[8]);
    if (rc != ATTN_OK)
      fail_msg("backward on buffers: %s: %s", attn_status_name(rc), attn_errmsg(ctx));
  }
  assert_int_equal(attn_context_synchronize(ctx), ATTN_OK);
  for (int i = 0; i < NM; i++) {
    if (!mems[i]->nbytes) continue;
    attn_buffer *r = mode == ONE_BUFFER ? one : own[i]; /* read through the owner */
    assert_int_equal(attn_buffer_read(ctx, r, at[i], mems[i]->bytes, mems[i]->nbytes), ATTN_OK);
  }
  for (int i = 0; i < NM; i++) {
    attn_buffer_free(wrap[i]);
    attn_buffer_free(own[i]);
  }
  attn_buffer_free(one);
}

/* The outputs of P through host tensors and through buffers, bit for bit. */
static void same_through_buffers(at_backend *b, buf_mode mode, int with_backward) {
  at_shape s = causal(base(ATTN_F32, 2, 70, 90, 4, 2, 32));
  s.layout = AT_PAD; /* padding must survive the round trip too */
  at_prob P;
  at_prob_init(&P, &s);
  int rc = attn_forward(b->ctx, &P.p, &P.q, &P.k, &P.v, &P.o, &P.lse);
  if (rc == ATTN_EUNSUPPORTED) at_skip("refused: %s", attn_errmsg(b->ctx));
  assert_int_equal(rc, ATTN_OK);
  if (with_backward) {
    rc = attn_backward(b->ctx, &P.p, &P.q, &P.k, &P.v, &P.o, &P.lse, &P.dout, &P.dq, &P.dk, &P.dv);
    if (rc != ATTN_OK) fail_msg("host backward: %s: %s", attn_status_name(rc), attn_errmsg(b->ctx));
  }
  at_mem *outs[] = {&P.mo, &P.mlse, &P.mdq, &P.mdkv};
  const char *names[] = {"o", "lse", "dq", "dk/dv"};
  unsigned char *host[4];
  for (int i = 0; i < 4; i++) {
    host[i] = at_malloc(outs[i]->nbytes + 1);
    assert_non_null(host[i]);
    memcpy(host[i], outs[i]->bytes, outs[i]->nbytes);
  }
  at_prob_reset_outputs(&P);
  run_on_buffers(b, &P, mode, with_backward);
  for (int i = 0; i < (with_backward ? 4 : 2); i++) {
    if (memcmp(host[i], outs[i]->bytes, outs[i]->nbytes) == 0) continue;
    /* Tensors at odd offsets may take another (e.g. unvectorized) code path
     * with another summation order: equal within float rounding, then, and
     * the padding still exactly the same. */
    if (mode != ONE_BUFFER)
      fail_msg("%s through device buffers differs from host tensors", names[i]);
    const float *x = (const float *)outs[i]->bytes, *y = (const float *)host[i];
    for (size_t e = 0; e < outs[i]->nbytes / 4; e++) {
      int pad = !outs[i]->used[4 * e];
      if (pad ? memcmp(&x[e], &y[e], 4) != 0 : !(fabsf(x[e] - y[e]) <= 1e-6f * (1 + fabsf(y[e]))))
        fail_msg("%s at offsets in one buffer: element %zu is %.9g, through host tensors %.9g",
                 names[i], e, x[e], y[e]);
    }
  }
  for (int i = 0; i < 4; i++)
    at_free(host[i]);
  at_prob_free(&P);
}

static void device_buffers_give_the_same_result_as_host_tensors(at_backend *b) {
  same_through_buffers(b, SEPARATE, 0);
}

static void async_on_device_buffers_is_complete_after_synchronize(at_backend *b) {
  same_through_buffers(b, SEPARATE_ASYNC, 1);
}

static void async_flag_with_host_tensors_returns_complete_results(at_backend *b) {
  /* Host tensors are staged, so the call must not return before they are back. */
  at_shape s = causal(base(ATTN_F32, 2, 90, 90, 2, 2, 64));
  s.flags |= ATTN_ASYNC;
  backward(b, s);
}

static void tensors_at_offsets_in_one_buffer_give_the_same_result(at_backend *b) {
  same_through_buffers(b, ONE_BUFFER, 0);
}

static void wrapped_buffers_give_the_same_result(at_backend *b) {
  same_through_buffers(b, WRAPPED, 0);
}

static void backward_on_device_buffers_gives_the_same_result(at_backend *b) {
  same_through_buffers(b, SEPARATE, 1);
}

static void buffer_round_trip_keeps_bytes(at_backend *b) {
  attn_buffer *buf = NULL;
  unsigned char in[1000], out[1000];
  for (int i = 0; i < 1000; i++)
    in[i] = (unsigned char)(i * 7 + 3);
  assert_int_equal(attn_buffer_create(b->ctx, 1000, &buf), ATTN_OK);
  assert_int_equal(attn_buffer_size(buf), 1000);
  assert_non_null(attn_buffer_native(buf));
  assert_int_equal(attn_buffer_write(b->ctx, buf, 0, in, 1000), ATTN_OK);
  memset(out, 0, sizeof out);
  assert_int_equal(attn_buffer_read(b->ctx, buf, 100, out, 900), ATTN_OK);
  assert_memory_equal(out, in + 100, 900);
  attn_buffer_free(buf);
}

static void host_memory_wraps_on_the_cpu(at_backend *b) {
  if (b->kind != ATTN_BACKEND_CPU)
    at_skip("a %s buffer wraps device memory, not a host pointer", b->name);
  float host[64], back[64];
  for (int i = 0; i < 64; i++)
    host[i] = (float)i;
  attn_buffer *w = NULL;
  assert_int_equal(attn_buffer_wrap(b->ctx, host, sizeof host, &w), ATTN_OK);
  assert_ptr_equal(attn_buffer_native(w), host);
  assert_int_equal(attn_buffer_read(b->ctx, w, 0, back, sizeof back), ATTN_OK);
  assert_memory_equal(back, host, sizeof host);
  attn_buffer_free(w);
  /* Freeing a wrapper leaves the memory to its owner. */
  assert_true(host[63] == 63.0f);
}

int main(int argc, char **argv) {
  const at_test tests[] = {
      AT_TEST(single_query_and_single_key_match_reference),
      AT_TEST(single_query_row_over_many_keys_matches_reference),
      AT_TEST(head_dims_from_1_to_256_match_reference),
      AT_TEST(more_queries_than_keys_matches_reference),
      AT_TEST(more_keys_than_queries_matches_reference),
      AT_TEST(several_sequences_in_a_batch_match_reference),
      AT_TEST(long_sequence_matches_reference),
      AT_TEST(explicit_scale_matches_reference),
      AT_TEST(large_scores_do_not_overflow),
      AT_TEST(causal_square_matches_reference),
      AT_TEST(causal_with_more_keys_than_queries_aligns_bottom_right),
      AT_TEST(causal_rows_with_no_key_give_zero_and_minus_inf),
      AT_TEST(window_left_matches_reference),
      AT_TEST(window_right_matches_reference),
      AT_TEST(window_both_sides_matches_reference),
      AT_TEST(window_with_causal_matches_reference),
      AT_TEST(causal_with_wider_right_window_stays_causal),
      AT_TEST(zero_width_window_sees_only_the_diagonal),
      AT_TEST(window_rows_with_no_key_give_zero_and_minus_inf),
      AT_TEST(softcap_matches_reference),
      AT_TEST(small_softcap_matches_reference),
      AT_TEST(alibi_matches_reference),
      AT_TEST(alibi_with_causal_and_softcap_matches_reference),
      AT_TEST(grouped_query_heads_match_reference),
      AT_TEST(multi_query_heads_match_reference),
      AT_TEST(rows_4_kib_apart_match_reference),
      AT_TEST(varlen_matches_reference),
      AT_TEST(varlen_with_different_key_lengths_matches_reference),
      AT_TEST(varlen_with_empty_sequences_gives_zero_rows),
      AT_TEST(varlen_with_window_matches_reference),
      AT_TEST(bhsd_strides_match_reference),
      AT_TEST(slices_of_a_fused_qkv_tensor_match_reference),
      AT_TEST(padded_head_dim_leaves_padding_untouched),
      AT_TEST(head_dim_stride_of_two_matches_reference),
      AT_TEST(each_tensor_in_its_own_layout_matches_reference),
      AT_TEST(varlen_in_bhsd_strides_matches_reference),
      AT_TEST(varlen_fused_qkv_matches_reference),
      AT_TEST(f16_matches_reference_on_rounded_inputs),
      AT_TEST(bf16_matches_reference_on_rounded_inputs),
      AT_TEST(f16_causal_grouped_heads_match_reference),
      AT_TEST(bf16_window_alibi_softcap_match_reference),
      AT_TEST(f16_varlen_with_empty_sequences_gives_zero_rows),
      AT_TEST(bf16_head_dim_256_matches_reference),
      AT_TEST(f16_padded_head_dim_leaves_padding_untouched),
      AT_TEST(forward_without_lse_gives_the_same_o),
      AT_TEST(backward_matches_reference),
      AT_TEST(backward_single_query_row_matches_reference),
      AT_TEST(backward_head_dims_from_1_to_256_match_reference),
      AT_TEST(backward_causal_matches_reference),
      AT_TEST(backward_causal_more_keys_than_queries_matches_reference),
      AT_TEST(backward_rows_with_no_key_pass_no_gradient),
      AT_TEST(backward_window_matches_reference),
      AT_TEST(backward_window_with_causal_matches_reference),
      AT_TEST(backward_softcap_matches_reference),
      AT_TEST(backward_alibi_matches_reference),
      AT_TEST(backward_grouped_query_heads_sum_into_kv_heads),
      AT_TEST(backward_multi_query_heads_sum_into_one_kv_head),
      AT_TEST(backward_varlen_matches_reference),
      AT_TEST(backward_varlen_with_empty_sequences_matches_reference),
      AT_TEST(backward_bhsd_strides_match_reference),
      AT_TEST(backward_into_a_fused_gradient_tensor_matches_reference),
      AT_TEST(backward_padded_head_dim_leaves_padding_untouched),
      AT_TEST(backward_head_dim_stride_of_two_matches_reference),
      AT_TEST(backward_each_tensor_in_its_own_layout_matches_reference),
      AT_TEST(backward_f16_matches_reference_on_rounded_inputs),
      AT_TEST(backward_bf16_matches_reference_on_rounded_inputs),
      AT_TEST(backward_bf16_grouped_heads_varlen_match_reference),
      AT_TEST(device_buffers_give_the_same_result_as_host_tensors),
      AT_TEST(async_on_device_buffers_is_complete_after_synchronize),
      AT_TEST(async_flag_with_host_tensors_returns_complete_results),
      AT_TEST(tensors_at_offsets_in_one_buffer_give_the_same_result),
      AT_TEST(wrapped_buffers_give_the_same_result),
      AT_TEST(backward_on_device_buffers_gives_the_same_result),
      AT_TEST(buffer_round_trip_keeps_bytes),
      AT_TEST(host_memory_wraps_on_the_cpu),
  };
  return at_main(argc, argv, "reference", tests, sizeof tests / sizeof tests[0], NULL, 0);
}
