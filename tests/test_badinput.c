/*
 * Bad input: each class of invalid argument has its own test, which asserts
 * the status code, that attn_errmsg() names the argument, and that no byte of
 * memory changed (the outputs are untouched; so are the inputs). The core
 * validates before any backend runs, so this holds on every backend.
 */
#include "testutil.h"

#include <stddef.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The valid problem every test breaks in one way: B 2, N 8, H 2, d 16. */
enum { B = 2, N = 8, H = 2, D = 16 };
/* Room for the largest tensor any test describes (head dim 257). */
#define SLOT (B * N * H * 260 + 64)
enum { Q, K, V, O, LSE, DO, DQ, DK, DV, SPARE, NSLOTS };

typedef struct bad {
  float *arena, *snapshot;
  attn_params p;
  attn_tensor q, k, v, o, lse, dout, dq, dk, dv;
  float alibi[4];
} bad;

static float *slot(bad *x, int i) {
  return x->arena + (size_t)i * SLOT;
}

static bad *bad_new(void) {
  bad *x = at_calloc(1, sizeof *x);
  assert_non_null(x);
  x->arena = at_malloc(sizeof(float) * SLOT * NSLOTS);
  x->snapshot = at_malloc(sizeof(float) * SLOT * NSLOTS);
  assert_non_null(x->arena);
  assert_non_null(x->snapshot);
  for (size_t i = 0; i < (size_t)SLOT * NSLOTS; i++)
    x->arena[i] = (float)((i * 37) % 101) / 50.0f - 1;
  attn_params_init(&x->p);
  x->q = attn_tensor_bshd(slot(x, Q), ATTN_F32, B, N, H, D);
  x->k = attn_tensor_bshd(slot(x, K), ATTN_F32, B, N, H, D);
  x->v = attn_tensor_bshd(slot(x, V), ATTN_F32, B, N, H, D);
  x->o = attn_tensor_bshd(slot(x, O), ATTN_F32, B, N, H, D);
  x->lse = attn_tensor_lse(slot(x, LSE), B, H, N);
  x->dout = attn_tensor_bshd(slot(x, DO), ATTN_F32, B, N, H, D);
  x->dq = attn_tensor_bshd(slot(x, DQ), ATTN_F32, B, N, H, D);
  x->dk = attn_tensor_bshd(slot(x, DK), ATTN_F32, B, N, H, D);
  x->dv = attn_tensor_bshd(slot(x, DV), ATTN_F32, B, N, H, D);
  for (int h = 0; h < 4; h++)
    x->alibi[h] = 0.5f;
  return x;
}

static void bad_free(bad *x) {
  at_free(x->arena);
  at_free(x->snapshot);
  at_free(x);
}

/* Whether msg names one of the '|'-separated words. */
static int names_one_of(const char *msg, const char *words) {
  char buf[128];
  snprintf(buf, sizeof buf, "%s", words);
  for (char *w = strtok(buf, "|"); w; w = strtok(NULL, "|"))
    if (at_mentions(msg, w)) return 1;
  return 0;
}

static void check_failure(at_backend *b, bad *x, const char *call, const char *what, int rc,
                          int status, const char *names) {
  const char *msg = attn_errmsg(b->ctx);
  if (rc != status)
    fail_msg("%s: %s gave %s (\"%s\"), expected %s", what, call, attn_status_name(rc), msg,
             attn_status_name(status));
  if (names && !names_one_of(msg, names))
    fail_msg("%s: the message should name %s: \"%s\"", what, names, msg);
  if (memcmp(x->arena, x->snapshot, sizeof(float) * SLOT * NSLOTS) != 0)
    fail_msg("%s: a failed %s changed memory", what, call);
}

/* Forward (with o and lse) must fail with status, naming one of names. */
static void fwd_fails(at_backend *b, bad *x, const char *what, int status, const char *names) {
  memcpy(x->snapshot, x->arena, sizeof(float) * SLOT * NSLOTS);
  int rc = attn_forward(b->ctx, &x->p, &x->q, &x->k, &x->v, &x->o, &x->lse);
  check_failure(b, x, "attn_forward", what, rc, status, names);
}

static void bwd_fails(at_backend *b, bad *x, const char *what, int status, const char *names) {
  memcpy(x->snapshot, x->arena, sizeof(float) * SLOT * NSLOTS);
  int rc = attn_backward(b->ctx, &x->p, &x->q, &x->k, &x->v, &x->o, &x->lse, &x->dout, &x->dq,
                         &x->dk, &x->dv);
  check_failure(b, x, "attn_backward", what, rc, status, names);
}

/* The unbroken problem is valid: otherwise every test below proves nothing. */
static void the_base_problem_is_valid(at_backend *b) {
  bad *x = bad_new();
  int rc = attn_forward(b->ctx, &x->p, &x->q, &x->k, &x->v, &x->o, &x->lse);
  if (rc != ATTN_OK) fail_msg("forward: %s: %s", attn_status_name(rc), attn_errmsg(b->ctx));
  rc = attn_supports(b->ctx, &x->p, &x->q, &x->k, &x->v, 1);
  if (rc != ATTN_OK) fail_msg("supports: %s: %s", attn_status_name(rc), attn_errmsg(b->ctx));
  bad_free(x);
}

/* ---------------------------------------------------------------------- */
/* NULL                                                                     */
/* ---------------------------------------------------------------------- */

static void null_context_is_enull(at_backend *b) {
  (void)b;
  bad *x = bad_new();
  memcpy(x->snapshot, x->arena, sizeof(float) * SLOT * NSLOTS);
  assert_int_equal(attn_forward(NULL, &x->p, &x->q, &x->k, &x->v, &x->o, &x->lse), ATTN_ENULL);
  assert_int_equal(attn_backward(NULL, &x->p, &x->q, &x->k, &x->v, &x->o, &x->lse, &x->dout, &x->dq,
                                 &x->dk, &x->dv),
                   ATTN_ENULL);
  assert_int_equal(attn_supports(NULL, &x->p, &x->q, &x->k, &x->v, 0), ATTN_ENULL);
  assert_memory_equal(x->arena, x->snapshot, sizeof(float) * SLOT * NSLOTS);
  bad_free(x);
}

static void null_params_is_enull(at_backend *b) {
  bad *x = bad_new();
  memcpy(x->snapshot, x->arena, sizeof(float) * SLOT * NSLOTS);
  int rc = attn_forward(b->ctx, NULL, &x->q, &x->k, &x->v, &x->o, &x->lse);
  check_failure(b, x, "attn_forward", "params NULL", rc, ATTN_ENULL, "params|p");
  bad_free(x);
}

static void null_tensors_are_enull(at_backend *b) {
  bad *x = bad_new();
  const char *names[] = {"q", "k", "v", "o"};
  for (int i = 0; i < 4; i++) {
    const attn_tensor *t[4] = {&x->q, &x->k, &x->v, &x->o};
    t[i] = NULL;
    memcpy(x->snapshot, x->arena, sizeof(float) * SLOT * NSLOTS);
    int rc = attn_forward(b->ctx, &x->p, t[0], t[1], t[2], t[3], &x->lse);
    char what[32];
    snprintf(what, sizeof what, "%s NULL", names[i]);
    check_failure(b, x, "attn_forward", what, rc, ATTN_ENULL, names[i]);
  }
  bad_free(x);
}

static void tensor_without_memory_is_enull(at_backend *b) {
  bad *x = bad_new();
  x->k.data = NULL;
  fwd_fails(b, x, "k.data NULL", ATTN_ENULL, "k");
  bad_free(x);
}

static void tensor_with_both_data_and_buffer_is_einval(at_backend *b) {
  bad *x = bad_new();
  attn_buffer *buf = NULL;
  assert_int_equal(attn_buffer_create(b->ctx, sizeof(float) * SLOT, &buf), ATTN_OK);
  x->v.buffer = buf;
  fwd_fails(b, x, "v with data and buffer", ATTN_EINVAL, "v");
  attn_buffer_free(buf);
  bad_free(x);
}

/* ---------------------------------------------------------------------- */
/* Sizes                                                                    */
/* ---------------------------------------------------------------------- */

static void zero_sizes_are_esize(at_backend *b) {
  const char *names[] = {"q", "k", "v", "o"};
  for (int t = 0; t < 4; t++)
    for (int dim = 0; dim < 4; dim++) {
      bad *x = bad_new();
      attn_tensor *ts[4] = {&x->q, &x->k, &x->v, &x->o};
      ts[t]->shape[dim] = 0;
      char what[64];
      snprintf(what, sizeof what, "%s.shape[%d] = 0", names[t], dim);
      fwd_fails(b, x, what, ATTN_ESIZE, names[t]);
      bad_free(x);
    }
}

static void negative_sizes_are_esize(at_backend *b) {
  bad *x = bad_new();
  x->q.shape[1] = -8;
  fwd_fails(b, x, "q.shape[1] = -8", ATTN_ESIZE, "q");
  bad_free(x);
  x = bad_new();
  x->k.shape[2] = -1;
  fwd_fails(b, x, "k.shape[2] = -1", ATTN_ESIZE, "k");
  bad_free(x);
}

static void zero_varlen_batch_is_esize(at_backend *b) {
  bad *x = bad_new();
  static const int32_t cu[] = {0, 16};
  x->q = attn_tensor_varlen(slot(x, Q), ATTN_F32, 16, H, D);
  x->k = attn_tensor_varlen(slot(x, K), ATTN_F32, 16, H, D);
  x->v = attn_tensor_varlen(slot(x, V), ATTN_F32, 16, H, D);
  x->o = attn_tensor_varlen(slot(x, O), ATTN_F32, 16, H, D);
  x->lse = attn_tensor_lse(slot(x, LSE), 0, H, 16);
  x->p.cu_seqlens_q = cu;
  x->p.cu_seqlens_k = cu;
  x->p.batch = 0;
  fwd_fails(b, x, "params.batch = 0 for varlen", ATTN_ESIZE, "batch");
  bad_free(x);
}

static void head_dim_257_is_eheaddim(at_backend *b) {
  bad *x = bad_new();
  x->q = attn_tensor_bshd(slot(x, Q), ATTN_F32, B, N, H, 257);
  x->k = attn_tensor_bshd(slot(x, K), ATTN_F32, B, N, H, 257);
  x->v = attn_tensor_bshd(slot(x, V), ATTN_F32, B, N, H, 257);
  x->o = attn_tensor_bshd(slot(x, O), ATTN_F32, B, N, H, 257);
  fwd_fails(b, x, "head_dim 257", ATTN_EHEADDIM, "head_dim");
  bad_free(x);
}

static void query_heads_not_a_multiple_of_kv_heads_is_eheads(at_backend *b) {
  bad *x = bad_new();
  x->q = attn_tensor_bshd(slot(x, Q), ATTN_F32, B, N, 3, D);
  x->o = attn_tensor_bshd(slot(x, O), ATTN_F32, B, N, 3, D);
  x->lse = attn_tensor_lse(slot(x, LSE), B, 3, N);
  fwd_fails(b, x, "Hq 3, Hkv 2", ATTN_EHEADS, "k|q|heads");
  bad_free(x);
}

static void differing_head_dims_are_eshape(at_backend *b) {
  bad *x = bad_new();
  x->k = attn_tensor_bshd(slot(x, K), ATTN_F32, B, N, H, 8);
  fwd_fails(b, x, "k head_dim 8, q 16", ATTN_ESHAPE, "k");
  bad_free(x);
  x = bad_new();
  x->v = attn_tensor_bshd(slot(x, V), ATTN_F32, B, N, H, 8);
  fwd_fails(b, x, "v head_dim 8, q 16", ATTN_ESHAPE, "v");
  bad_free(x);
}

static void disagreeing_shapes_are_eshape(at_backend *b) {
  struct {
    const char *what, *names;
    int which;
  } cases[] = {
      {"k batch 1, q 2", "k", 0}, {"v seqlen 7, k 8", "v", 1}, {"o seqlen 7, q 8", "o", 2},
      {"lse seqlen 7", "lse", 3}, {"q of ndim 5", "q", 4},     {"k varlen (3-d), q bshd", "k", 5},
      {"v heads 1, k 2", "v", 6}, {"o heads 1, q 2", "o", 7},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    bad *x = bad_new();
    switch (cases[i].which) {
      case 0:
        x->k = attn_tensor_bshd(slot(x, K), ATTN_F32, 1, N, H, D);
        break;
      case 1:
        x->v = attn_tensor_bshd(slot(x, V), ATTN_F32, B, N - 1, H, D);
        break;
      case 2:
        x->o = attn_tensor_bshd(slot(x, O), ATTN_F32, B, N - 1, H, D);
        break;
      case 3:
        x->lse = attn_tensor_lse(slot(x, LSE), B, H, N - 1);
        break;
      case 4:
        x->q.ndim = 5;
        break;
      case 5:
        x->k = attn_tensor_varlen(slot(x, K), ATTN_F32, B * N, H, D);
        break;
      case 6:
        x->v = attn_tensor_bshd(slot(x, V), ATTN_F32, B, N, 1, D);
        break;
      case 7:
        x->o = attn_tensor_bshd(slot(x, O), ATTN_F32, B, N, 1, D);
        break;
    }
    fwd_fails(b, x, cases[i].what, ATTN_ESHAPE, cases[i].names);
    bad_free(x);
  }
}

/* ---------------------------------------------------------------------- */
/* Strides and overflow                                                     */
/* ---------------------------------------------------------------------- */

static void overlapping_strides_are_estride(at_backend *b) {
  bad *x = bad_new();
  x->q.stride[2] = 0; /* both heads on the same memory */
  fwd_fails(b, x, "q heads stride 0", ATTN_ESTRIDE, "q");
  bad_free(x);
  x = bad_new();
  x->o.stride[1] = 1; /* rows one element apart: they overlap */
  fwd_fails(b, x, "o seqlen stride 1", ATTN_ESTRIDE, "o");
  bad_free(x);
  x = bad_new();
  x->lse.stride[2] = 0;
  fwd_fails(b, x, "lse seqlen stride 0", ATTN_ESTRIDE, "lse");
  bad_free(x);
}

static void negative_strides_are_estride(at_backend *b) {
  bad *x = bad_new();
  x->k.stride[3] = -1;
  fwd_fails(b, x, "k head_dim stride -1", ATTN_ESTRIDE, "k");
  bad_free(x);
}

static void sizes_whose_product_overflows_are_eoverflow(at_backend *b) {
  bad *x = bad_new();
  /* Strides of 2^40 elements over 2^30 rows: offsets past int64. */
  x->q.shape[1] = (int64_t)1 << 30;
  x->q.stride[1] = (int64_t)1 << 40;
  x->q.stride[0] = (int64_t)1 << 41;
  fwd_fails(b, x, "q extent past int64", ATTN_EOVERFLOW, "q");
  bad_free(x);
  x = bad_new();
  /* Element counts whose product overflows int64 with plain strides. */
  x->v.shape[0] = (int64_t)1 << 40;
  x->v.shape[1] = (int64_t)1 << 40;
  x->v.stride[1] = H * D;
  x->v.stride[0] = ((int64_t)1 << 40) * H * D;
  x->k = x->v;
  x->k.data = slot(x, K);
  x->q.shape[0] = x->v.shape[0];
  x->q.stride[0] = x->k.stride[0];
  x->q.shape[1] = N;
  fwd_fails(b, x, "batch 2^40 times seqlen 2^40", ATTN_EOVERFLOW, "q|k|v");
  bad_free(x);
  x = bad_new();
  /* Fits int64 in elements, not in bytes. */
  x->o.shape[0] = 2;
  x->o.stride[0] = INT64_MAX / 3;
  fwd_fails(b, x, "o extent in bytes past size_t", ATTN_EOVERFLOW, "o");
  bad_free(x);
}

/* Found by fuzz_api: an extent of exactly INT64_MAX elements overflowed
 * while the message counted them (UBSan: signed overflow). */
static void extent_of_int64_max_elements_is_eoverflow(at_backend *b) {
  bad *x = bad_new();
  /* The other dimensions reach (N-1)*H*D + (H-1)*D + D-1 = 255 elements. */
  x->q.stride[0] = INT64_MAX - ((N - 1) * H * D + (H - 1) * D + D - 1);
  fwd_fails(b, x, "q extent of INT64_MAX elements", ATTN_EOVERFLOW, "q");
  bad_free(x);
}

/* ---------------------------------------------------------------------- */
/* cu_seqlens                                                               */
/* ---------------------------------------------------------------------- */

static bad *varlen_problem(const int32_t *cu_q, const int32_t *cu_k, int64_t batch) {
  bad *x = bad_new();
  x->q = attn_tensor_varlen(slot(x, Q), ATTN_F32, 16, H, D);
  x->k = attn_tensor_varlen(slot(x, K), ATTN_F32, 16, H, D);
  x->v = attn_tensor_varlen(slot(x, V), ATTN_F32, 16, H, D);
  x->o = attn_tensor_varlen(slot(x, O), ATTN_F32, 16, H, D);
  x->lse = attn_tensor_lse(slot(x, LSE), 0, H, 16);
  x->p.cu_seqlens_q = cu_q;
  x->p.cu_seqlens_k = cu_k;
  x->p.batch = batch;
  return x;
}

static const int32_t cu_ok[] = {0, 5, 16};

static void valid_varlen_problem_is_accepted(at_backend *b) {
  bad *x = varlen_problem(cu_ok, cu_ok, 2);
  int rc = attn_forward(b->ctx, &x->p, &x->q, &x->k, &x->v, &x->o, &x->lse);
  if (rc != ATTN_OK) fail_msg("%s: %s", attn_status_name(rc), attn_errmsg(b->ctx));
  bad_free(x);
}

static void cu_seqlens_not_starting_at_zero_is_eseqlens(at_backend *b) {
  static const int32_t cu[] = {1, 5, 16};
  bad *x = varlen_problem(cu, cu_ok, 2);
  fwd_fails(b, x, "cu_seqlens_q[0] = 1", ATTN_ESEQLENS, "cu_seqlens_q");
  bad_free(x);
  x = varlen_problem(cu_ok, cu, 2);
  fwd_fails(b, x, "cu_seqlens_k[0] = 1", ATTN_ESEQLENS, "cu_seqlens_k");
  bad_free(x);
}

static void decreasing_cu_seqlens_is_eseqlens(at_backend *b) {
  static const int32_t cu[] = {0, 9, 8, 16};
  bad *x = varlen_problem(cu, cu, 3);
  fwd_fails(b, x, "cu_seqlens {0, 9, 8, 16}", ATTN_ESEQLENS, "cu_seqlens_q|cu_seqlens_k");
  bad_free(x);
}

static void cu_seqlens_disagreeing_with_the_rows_is_eseqlens(at_backend *b) {
  static const int32_t short_cu[] = {0, 5, 15}, long_cu[] = {0, 5, 17};
  bad *x = varlen_problem(short_cu, cu_ok, 2);
  fwd_fails(b, x, "cu_seqlens_q ends at 15 of 16 rows", ATTN_ESEQLENS, "cu_seqlens_q");
  bad_free(x);
  x = varlen_problem(cu_ok, long_cu, 2);
  fwd_fails(b, x, "cu_seqlens_k ends at 17 of 16 rows", ATTN_ESEQLENS, "cu_seqlens_k");
  bad_free(x);
}

static void missing_cu_seqlens_for_varlen_is_eseqlens(at_backend *b) {
  bad *x = varlen_problem(NULL, cu_ok, 2);
  fwd_fails(b, x, "cu_seqlens_q NULL", ATTN_ESEQLENS, "cu_seqlens_q");
  bad_free(x);
}

static void cu_seqlens_with_bshd_tensors_is_eseqlens(at_backend *b) {
  bad *x = bad_new();
  x->p.cu_seqlens_q = cu_ok;
  x->p.cu_seqlens_k = cu_ok;
  x->p.batch = 2;
  fwd_fails(b, x, "cu_seqlens with 4-d tensors", ATTN_ESEQLENS, "cu_seqlens_q|cu_seqlens_k");
  bad_free(x);
}

/* ---------------------------------------------------------------------- */
/* Scalars and options                                                      */
/* ---------------------------------------------------------------------- */

static void window_bounds_below_minus_one_are_ewindow(at_backend *b) {
  bad *x = bad_new();
  x->p.window_left = -2;
  fwd_fails(b, x, "window_left -2", ATTN_EWINDOW, "window_left");
  bad_free(x);
  x = bad_new();
  x->p.window_right = -5;
  fwd_fails(b, x, "window_right -5", ATTN_EWINDOW, "window_right");
  bad_free(x);
}

static void negative_or_non_finite_scale_is_escalar(at_backend *b) {
  const double bad_values[] = {-1.0, NAN, INFINITY, -INFINITY};
  for (int i = 0; i < 4; i++) {
    bad *x = bad_new();
    x->p.scale = bad_values[i];
    char what[32];
    snprintf(what, sizeof what, "scale %g", bad_values[i]);
    fwd_fails(b, x, what, ATTN_ESCALAR, "scale");
    bad_free(x);
  }
}

static void negative_or_non_finite_softcap_is_escalar(at_backend *b) {
  const double bad_values[] = {-1.0, NAN, INFINITY};
  for (int i = 0; i < 3; i++) {
    bad *x = bad_new();
    x->p.softcap = bad_values[i];
    char what[32];
    snprintf(what, sizeof what, "softcap %g", bad_values[i]);
    fwd_fails(b, x, what, ATTN_ESCALAR, "softcap");
    bad_free(x);
  }
}

static void scale_or_softcap_outside_float32_is_escalar(at_backend *b) {
  /* 1e39 is inf in float32, 1e-50 is 0: neither may pass for a usable value
   * (or for "default scale" and "softcap off"). */
  const double values[] = {1e39, 1e-50};
  for (int i = 0; i < 2; i++)
    for (int which = 0; which < 2; which++) {
      bad *x = bad_new();
      *(which ? &x->p.softcap : &x->p.scale) = values[i];
      char what[32];
      snprintf(what, sizeof what, "%s %g", which ? "softcap" : "scale", values[i]);
      fwd_fails(b, x, what, ATTN_ESCALAR, which ? "softcap" : "scale");
      bad_free(x);
    }
}

static void misaligned_host_data_is_einval(at_backend *b) {
  /* f32 at +1 and +2 bytes, f16 and bf16 at +1. */
  const struct {
    attn_dtype dt;
    size_t shift;
  } cases[] = {{ATTN_F32, 1}, {ATTN_F32, 2}, {ATTN_F16, 1}, {ATTN_BF16, 1}};
  for (int i = 0; i < 4; i++) {
    for (int which = 0; which < 2; which++) {
      bad *x = bad_new();
      attn_tensor *ts[] = {&x->q, &x->k, &x->v, &x->o};
      for (int t = 0; t < 4; t++)
        ts[t]->dtype = cases[i].dt;
      attn_tensor *t = which ? &x->k : &x->q;
      t->data = (char *)t->data + cases[i].shift;
      char what[48];
      snprintf(what, sizeof what, "%s %s at +%zu bytes", which ? "k" : "q",
               attn_dtype_name(cases[i].dt), cases[i].shift);
      fwd_fails(b, x, what, ATTN_EINVAL, which ? "k" : "q");
      bad_free(x);
    }
  }
  bad *x = bad_new();
  x->lse.data = (char *)x->lse.data + 2;
  fwd_fails(b, x, "lse at +2 bytes", ATTN_EINVAL, "lse");
  bad_free(x);
}

static void misaligned_wrapped_host_memory_is_ebuffer(at_backend *b) {
  if (b->kind != ATTN_BACKEND_CPU) at_skip("only the CPU wraps host pointers");
  bad *x = bad_new();
  attn_buffer *buf = NULL;
  size_t bytes = sizeof(float) * B * N * H * D;
  assert_int_equal(attn_buffer_wrap(b->ctx, (char *)slot(x, SPARE) + 1, bytes, &buf), ATTN_OK);
  x->q = attn_tensor_on(x->q, buf, 0);
  fwd_fails(b, x, "q in a wrapped host buffer at +1 byte", ATTN_EBUFFER, "q");
  attn_buffer_free(buf);
  bad_free(x);
}

static void disagreeing_dtypes_are_edtype(at_backend *b) {
  struct {
    const char *what, *names;
    int which;
  } cases[] = {
      {"k f16, q f32", "k", 0}, {"v bf16, q f32", "v", 1}, {"o f16, q f32", "o", 2},
      {"lse f16", "lse", 3},    {"q dtype 7", "q", 4},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    bad *x = bad_new();
    switch (cases[i].which) {
      case 0:
        x->k = attn_tensor_bshd(slot(x, K), ATTN_F16, B, N, H, D);
        break;
      case 1:
        x->v = attn_tensor_bshd(slot(x, V), ATTN_BF16, B, N, H, D);
        break;
      case 2:
        x->o = attn_tensor_bshd(slot(x, O), ATTN_F16, B, N, H, D);
        break;
      case 3:
        x->lse.dtype = ATTN_F16;
        break;
      case 4:
        x->q.dtype = (attn_dtype)7;
        break;
    }
    fwd_fails(b, x, cases[i].what, ATTN_EDTYPE, cases[i].names);
    bad_free(x);
  }
}

static void output_sharing_memory_with_an_input_is_ealias(at_backend *b) {
  const char *inputs[] = {"q", "k", "v"};
  for (int i = 0; i < 3; i++) {
    bad *x = bad_new();
    attn_tensor *in[3] = {&x->q, &x->k, &x->v};
    x->o.data = in[i]->data;
    char what[32];
    snprintf(what, sizeof what, "o is %s", inputs[i]);
    fwd_fails(b, x, what, ATTN_EALIAS, "o");
    bad_free(x);
  }
  bad *x = bad_new();
  x->o.data = (float *)x->v.data + 8; /* partly over v */
  fwd_fails(b, x, "o overlaps v", ATTN_EALIAS, "o");
  bad_free(x);
  x = bad_new();
  x->lse.data = (float *)x->q.data + 3;
  fwd_fails(b, x, "lse inside q", ATTN_EALIAS, "lse");
  bad_free(x);
  x = bad_new();
  x->lse.data = (float *)x->o.data + 5;
  fwd_fails(b, x, "lse inside o", ATTN_EALIAS, "lse");
  bad_free(x);
}

static void missing_alibi_slopes_are_ealibi(at_backend *b) {
  bad *x = bad_new();
  x->p.alibi_slopes = NULL;
  x->p.alibi_count = H;
  fwd_fails(b, x, "alibi_slopes NULL, alibi_count 2", ATTN_EALIBI, "alibi_slopes|alibi_count");
  bad_free(x);
}

static void alibi_slopes_of_the_wrong_length_are_ealibi(at_backend *b) {
  const int64_t counts[] = {1, 3, 0};
  for (int i = 0; i < 3; i++) {
    bad *x = bad_new();
    x->p.alibi_slopes = x->alibi;
    x->p.alibi_count = counts[i];
    char what[48];
    snprintf(what, sizeof what, "alibi_count %lld for 2 heads", (long long)counts[i]);
    fwd_fails(b, x, what, ATTN_EALIBI, "alibi_count|alibi_slopes");
    bad_free(x);
  }
}

static void non_finite_alibi_slope_is_ealibi(at_backend *b) {
  bad *x = bad_new();
  x->alibi[1] = NAN;
  x->p.alibi_slopes = x->alibi;
  x->p.alibi_count = H;
  fwd_fails(b, x, "alibi slope NaN", ATTN_EALIBI, "alibi_slopes");
  bad_free(x);
}

static void unknown_flag_bits_are_einval(at_backend *b) {
  bad *x = bad_new();
  x->p.flags = ATTN_CAUSAL | 0x4u;
  fwd_fails(b, x, "a retired flag bit", ATTN_EINVAL, "flags");
  x->p.flags = 0x80000000u;
  bwd_fails(b, x, "an unknown flag bit", ATTN_EINVAL, "flags");
  bad_free(x);
}

static void params_without_init_are_einval(at_backend *b) {
  bad *x = bad_new();
  x->p.size = 0;
  fwd_fails(b, x, "params.size 0", ATTN_EINVAL, "params.size");
  x->p.size = sizeof(attn_params) - 8;
  fwd_fails(b, x, "params.size too small", ATTN_EINVAL, "params.size");
  bad_free(x);
}

/* A caller built against the first attn.h, whose attn_params ended at
 * batch: the fields after it take their defaults, and a bad one of its own
 * is still refused. */
static void params_of_the_first_version_run_with_defaults(at_backend *b) {
  bad *x = bad_new();
  const size_t v1 = offsetof(attn_params, batch) + sizeof(int64_t);
  unsigned char *mem = at_malloc(v1);
  attn_params p;
  attn_params_init(&p);
  p.size = v1;
  p.flags = ATTN_CAUSAL;
  memcpy(mem, &p, v1);
  int rc = attn_forward(b->ctx, (const attn_params *)mem, &x->q, &x->k, &x->v, &x->o, &x->lse);
  if (rc != ATTN_OK)
    fail_msg("first-version params: %s: %s", attn_status_name(rc), attn_errmsg(b->ctx));
  ((attn_params *)mem)->window_left = -5;
  memcpy(x->snapshot, x->arena, sizeof(float) * SLOT * NSLOTS);
  rc = attn_forward(b->ctx, (const attn_params *)mem, &x->q, &x->k, &x->v, &x->o, &x->lse);
  check_failure(b, x, "attn_forward", "a first-version window below -1", rc, ATTN_EWINDOW,
                "window_left");
  at_free(mem);
  bad_free(x);
}

/* A caller built against a later attn.h, whose attn_params has grown. */
static void params_of_a_later_version_run_when_new_fields_are_defaults(at_backend *b) {
  bad *x = bad_new();
  struct {
    attn_params p;
    int64_t later[2];
  } grown;
  memset(&grown, 0, sizeof grown);
  attn_params_init(&grown.p);
  grown.p.size = sizeof grown;
  int rc = attn_forward(b->ctx, &grown.p, &x->q, &x->k, &x->v, &x->o, &x->lse);
  if (rc != ATTN_OK)
    fail_msg("zero later fields: %s: %s", attn_status_name(rc), attn_errmsg(b->ctx));
  grown.later[1] = 1;
  memcpy(x->snapshot, x->arena, sizeof(float) * SLOT * NSLOTS);
  rc = attn_forward(b->ctx, &grown.p, &x->q, &x->k, &x->v, &x->o, &x->lse);
  check_failure(b, x, "attn_forward", "a later field set", rc, ATTN_EINVAL, "params");
  bad_free(x);
}

static void unknown_backend_name_is_ebackend(at_backend *b) {
  (void)b;
  attn_context *ctx = NULL;
  assert_int_equal(attn_context_create("nonsense", &ctx), ATTN_EBACKEND);
  assert_true(at_mentions(attn_errmsg(ctx), "nonsense"));
  attn_context_free(ctx);
  at_env_set("ATTN_BACKEND", "gpu");
  assert_int_equal(attn_context_create(NULL, &ctx), ATTN_EBACKEND);
  assert_true(at_mentions(attn_errmsg(ctx), "ATTN_BACKEND"));
  attn_context_free(ctx);
}

/* ---------------------------------------------------------------------- */
/* Buffers                                                                  */
/* ---------------------------------------------------------------------- */

static void buffer_of_another_context_is_ebuffer(at_backend *b) {
  attn_context *other = NULL;
  assert_int_equal(attn_context_create(b->name, &other), ATTN_OK);
  attn_buffer *buf = NULL;
  assert_int_equal(attn_buffer_create(other, sizeof(float) * B * N * H * D, &buf), ATTN_OK);
  bad *x = bad_new();
  x->o = attn_tensor_on(x->o, buf, 0);
  fwd_fails(b, x, "o on another context's buffer", ATTN_EBUFFER, "o");
  bad_free(x);
  attn_buffer_free(buf);
  attn_context_free(other);
}

static void buffer_too_small_is_ebuffer(at_backend *b) {
  attn_buffer *buf = NULL;
  size_t bytes = sizeof(float) * B * N * H * D;
  assert_int_equal(attn_buffer_create(b->ctx, bytes, &buf), ATTN_OK);
  bad *x = bad_new();
  x->k = attn_tensor_on(x->k, buf, 4);
  fwd_fails(b, x, "k 4 bytes into a buffer of its exact size", ATTN_EBUFFER, "k");
  bad_free(x);
  x = bad_new();
  x->k = attn_tensor_on(attn_tensor_bshd(NULL, ATTN_F32, B, N + 1, H, D), buf, 0);
  x->v = attn_tensor_bshd(slot(x, V), ATTN_F32, B, N + 1, H, D);
  fwd_fails(b, x, "k past its buffer's end", ATTN_EBUFFER, "k");
  bad_free(x);
  attn_buffer_free(buf);
}

static void misaligned_buffer_offset_is_ebuffer(at_backend *b) {
  attn_buffer *buf = NULL;
  assert_int_equal(attn_buffer_create(b->ctx, sizeof(float) * (B * N * H * D + 4), &buf), ATTN_OK);
  bad *x = bad_new();
  x->q = attn_tensor_on(x->q, buf, 2);
  fwd_fails(b, x, "q at byte offset 2 (f32)", ATTN_EBUFFER, "q");
  bad_free(x);
  attn_buffer_free(buf);
}

static void buffer_reads_and_writes_past_the_end_are_ebuffer(at_backend *b) {
  attn_buffer *buf = NULL;
  char data[64] = {0};
  assert_int_equal(attn_buffer_create(b->ctx, 32, &buf), ATTN_OK);
  assert_int_equal(attn_buffer_write(b->ctx, buf, 0, data, 33), ATTN_EBUFFER);
  assert_int_equal(attn_buffer_write(b->ctx, buf, 30, data, 4), ATTN_EBUFFER);
  assert_int_equal(attn_buffer_read(b->ctx, buf, 33, data, 0), ATTN_EBUFFER);
  attn_buffer *none = NULL;
  assert_int_equal(attn_buffer_create(b->ctx, 0, &none), ATTN_ESIZE);
  assert_null(none);
  attn_buffer *w = NULL;
  assert_int_equal(attn_buffer_wrap(b->ctx, NULL, 16, &w), ATTN_ENULL);
  attn_buffer_free(w);
  attn_buffer_free(buf);
}

/* ---------------------------------------------------------------------- */
/* Backward                                                                 */
/* ---------------------------------------------------------------------- */

static void backward_without_lse_is_enull(at_backend *b) {
  bad *x = bad_new();
  memcpy(x->snapshot, x->arena, sizeof(float) * SLOT * NSLOTS);
  int rc = attn_backward(b->ctx, &x->p, &x->q, &x->k, &x->v, &x->o, NULL, &x->dout, &x->dq, &x->dk,
                         &x->dv);
  check_failure(b, x, "attn_backward", "lse NULL", rc, ATTN_ENULL, "lse");
  bad_free(x);
}

static void backward_with_null_gradients_is_enull(at_backend *b) {
  const char *names[] = {"do", "dq", "dk", "dv"};
  for (int i = 0; i < 4; i++) {
    bad *x = bad_new();
    const attn_tensor *t[4] = {&x->dout, &x->dq, &x->dk, &x->dv};
    t[i] = NULL;
    memcpy(x->snapshot, x->arena, sizeof(float) * SLOT * NSLOTS);
    int rc =
        attn_backward(b->ctx, &x->p, &x->q, &x->k, &x->v, &x->o, &x->lse, t[0], t[1], t[2], t[3]);
    check_failure(b, x, "attn_backward", names[i], rc, ATTN_ENULL, names[i]);
    bad_free(x);
  }
}

static void backward_lse_of_the_wrong_shape_is_eshape(at_backend *b) {
  bad *x = bad_new();
  x->lse = attn_tensor_lse(slot(x, LSE), B, H, N + 1);
  bwd_fails(b, x, "lse seqlen 9 for 8", ATTN_ESHAPE, "lse");
  bad_free(x);
  x = bad_new();
  x->lse = attn_tensor_lse(slot(x, LSE), 0, H, B * N); /* varlen form for bshd */
  bwd_fails(b, x, "lse 2-d for bshd", ATTN_ESHAPE, "lse");
  bad_free(x);
}

static void backward_do_of_the_wrong_shape_is_eshape(at_backend *b) {
  bad *x = bad_new();
  x->dout = attn_tensor_bshd(slot(x, DO), ATTN_F32, B, N - 1, H, D);
  bwd_fails(b, x, "do seqlen 7", ATTN_ESHAPE, "do");
  bad_free(x);
  x = bad_new();
  x->dk = attn_tensor_bshd(slot(x, DK), ATTN_F32, B, N, H, D / 2);
  bwd_fails(b, x, "dk head_dim 8", ATTN_ESHAPE, "dk");
  bad_free(x);
}

static void backward_gradients_sharing_memory_with_inputs_are_ealias(at_backend *b) {
  struct {
    const char *what, *names;
    int grad, input;
  } cases[] = {
      {"dq is q", "dq", DQ, Q}, {"dk is k", "dk", DK, K},   {"dv is v", "dv", DV, V},
      {"dq is o", "dq", DQ, O}, {"dv is do", "dv", DV, DO}, {"dk is lse", "dk", DK, LSE},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    bad *x = bad_new();
    attn_tensor *g = cases[i].grad == DQ ? &x->dq : cases[i].grad == DK ? &x->dk : &x->dv;
    g->data = slot(x, cases[i].input);
    bwd_fails(b, x, cases[i].what, ATTN_EALIAS, cases[i].names);
    bad_free(x);
  }
}

static void backward_gradients_sharing_memory_with_each_other_are_ealias(at_backend *b) {
  bad *x = bad_new();
  x->dv.data = x->dk.data;
  bwd_fails(b, x, "dv is dk", ATTN_EALIAS, "dv|dk");
  bad_free(x);
  x = bad_new();
  x->dk.data = (float *)x->dq.data + 4;
  bwd_fails(b, x, "dk overlaps dq", ATTN_EALIAS, "dk|dq");
  bad_free(x);
}

static void backward_validates_like_forward(at_backend *b) {
  bad *x = bad_new();
  x->p.softcap = -3;
  bwd_fails(b, x, "softcap -3", ATTN_ESCALAR, "softcap");
  bad_free(x);
  x = bad_new();
  x->k.stride[2] = 0;
  bwd_fails(b, x, "k heads stride 0", ATTN_ESTRIDE, "k");
  bad_free(x);
}

static void supports_reports_the_validation_error(at_backend *b) {
  bad *x = bad_new();
  x->p.window_left = -7;
  int rc = attn_supports(b->ctx, &x->p, &x->q, &x->k, &x->v, 0);
  assert_int_equal(rc, ATTN_EWINDOW);
  assert_true(at_mentions(attn_errmsg(b->ctx), "window_left"));
  bad_free(x);
}

int main(int argc, char **argv) {
  const at_test tests[] = {
      AT_TEST(the_base_problem_is_valid),
      AT_TEST(null_context_is_enull),
      AT_TEST(null_params_is_enull),
      AT_TEST(null_tensors_are_enull),
      AT_TEST(tensor_without_memory_is_enull),
      AT_TEST(tensor_with_both_data_and_buffer_is_einval),
      AT_TEST(zero_sizes_are_esize),
      AT_TEST(negative_sizes_are_esize),
      AT_TEST(zero_varlen_batch_is_esize),
      AT_TEST(head_dim_257_is_eheaddim),
      AT_TEST(query_heads_not_a_multiple_of_kv_heads_is_eheads),
      AT_TEST(differing_head_dims_are_eshape),
      AT_TEST(disagreeing_shapes_are_eshape),
      AT_TEST(overlapping_strides_are_estride),
      AT_TEST(negative_strides_are_estride),
      AT_TEST(sizes_whose_product_overflows_are_eoverflow),
      AT_TEST(extent_of_int64_max_elements_is_eoverflow),
      AT_TEST(valid_varlen_problem_is_accepted),
      AT_TEST(cu_seqlens_not_starting_at_zero_is_eseqlens),
      AT_TEST(decreasing_cu_seqlens_is_eseqlens),
      AT_TEST(cu_seqlens_disagreeing_with_the_rows_is_eseqlens),
      AT_TEST(missing_cu_seqlens_for_varlen_is_eseqlens),
      AT_TEST(cu_seqlens_with_bshd_tensors_is_eseqlens),
      AT_TEST(window_bounds_below_minus_one_are_ewindow),
      AT_TEST(negative_or_non_finite_scale_is_escalar),
      AT_TEST(negative_or_non_finite_softcap_is_escalar),
      AT_TEST(scale_or_softcap_outside_float32_is_escalar),
      AT_TEST(misaligned_host_data_is_einval),
      AT_TEST(misaligned_wrapped_host_memory_is_ebuffer),
      AT_TEST(disagreeing_dtypes_are_edtype),
      AT_TEST(output_sharing_memory_with_an_input_is_ealias),
      AT_TEST(missing_alibi_slopes_are_ealibi),
      AT_TEST(alibi_slopes_of_the_wrong_length_are_ealibi),
      AT_TEST(non_finite_alibi_slope_is_ealibi),
      AT_TEST(unknown_flag_bits_are_einval),
      AT_TEST(params_without_init_are_einval),
      AT_TEST(params_of_a_later_version_run_when_new_fields_are_defaults),
      AT_TEST(params_of_the_first_version_run_with_defaults),
      AT_TEST(unknown_backend_name_is_ebackend),
      AT_TEST(buffer_of_another_context_is_ebuffer),
      AT_TEST(buffer_too_small_is_ebuffer),
      AT_TEST(misaligned_buffer_offset_is_ebuffer),
      AT_TEST(buffer_reads_and_writes_past_the_end_are_ebuffer),
      AT_TEST(backward_without_lse_is_enull),
      AT_TEST(backward_with_null_gradients_is_enull),
      AT_TEST(backward_lse_of_the_wrong_shape_is_eshape),
      AT_TEST(backward_do_of_the_wrong_shape_is_eshape),
      AT_TEST(backward_gradients_sharing_memory_with_inputs_are_ealias),
      AT_TEST(backward_gradients_sharing_memory_with_each_other_are_ealias),
      AT_TEST(backward_validates_like_forward),
      AT_TEST(supports_reports_the_validation_error),
  };
  return at_main(argc, argv, "badinput", tests, sizeof tests / sizeof tests[0], NULL, 0);
}
