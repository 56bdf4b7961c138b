/*
 * CPU forward pass: FlashAttention's Algorithm 1 with the FlashAttention-2
 * loop order. One work unit is (sequence b, query head h, block of Br query
 * rows); its rows stay in a tile while the visible blocks of Bc keys stream
 * by:
 *
 *   S   = scale * Q K^T                      (sgemm)
 *   S   = softcap / ALiBi / window mask      (attn__cpu_scores)
 *   m_i = max(m_i, rowmax S), alpha = exp(m_old - m_i)
 *   P   = exp(S - m_i), l_i = alpha l_i + rowsum P
 *   O   = diag(alpha) O + P V                (sgemm)
 *
 * and finally O = O / l_i, lse = m_i + log l_i. The score tile is kept
 * transposed, S^T = K Q^T (keys down, queries across), so that both
 * products take their operands as stored or transposed once per unit (see
 * attn__cpu_load_t) and the softmax runs down columns, vectorized across
 * the queries. Only per-thread tiles are allocated; nothing grows with
 * Nq x Nk.
 */
#include "cpu_internal.h"

#include <omp.h>
#include <stdlib.h>

/* Per-thread scratch, in floats, and the tiles' sizes. */
typedef struct cpu_fwd_tiles {
  int br, bc;   /* Br, Bc of the plan; Br is also the row stride of qt and st */
  float *qt;    /* d x Br: Q transposed */
  float *k;     /* Bc x d, when the rows must be gathered (attn__cpu_view) */
  float *v;     /* Bc x d, idem */
  float *st;    /* Bc x Br: S^T, then P^T in place */
  float *o;     /* Br x d: unnormalized output */
  float *m;     /* Br: running row max m_i */
  float *l;     /* Br: running row sum l_i */
  float *alpha; /* Br */
  float *lse;   /* Br */
  float *lo;    /* Br: what rounding lse to float dropped (the (hi, lo) form) */
} cpu_fwd_tiles;

size_t attn__cpu_forward_scratch(const attn__problem *pb, const attn__cpu_config *cfg) {
  const size_t d = (size_t)pb->head_dim, br = (size_t)cfg->br, bc = (size_t)cfg->bc;
  const size_t floats = br * d * 2 + bc * d * 2 + br * bc + 5 * br;
  return (floats + 15) / 16 * 16 * sizeof(float);
}

static cpu_fwd_tiles cpu_fwd_carve(float *base, int64_t d, const attn__cpu_config *cfg) {
  const size_t br = (size_t)cfg->br, bc = (size_t)cfg->bc;
  cpu_fwd_tiles t;
  t.br = cfg->br;
  t.bc = cfg->bc;
  t.qt = base;
  t.o = t.qt + br * d;
  t.k = t.o + br * d;
  t.v = t.k + bc * d;
  t.st = t.v + bc * d;
  t.m = t.st + br * bc;
  t.l = t.m + br;
  t.alpha = t.l + br;
  t.lse = t.alpha + br;
  t.lo = t.lse + br;
  return t;
}

/* One unit: rows [i0, i0 + br) of query head h of sequence b. */
static void cpu_fwd_block(const attn__problem *pb, const cpu_fwd_tiles *t, int64_t b, int64_t h,
                          int64_t i0, int br) {
  const int d = (int)pb->head_dim, ld = t->br, Bc = t->bc;
  const int64_t nq = attn__seq_q(pb, b), nk = attn__seq_k(pb, b);
  const int64_t rq = attn__row0_q(pb, b) + i0, rk = attn__row0_k(pb, b);
  const int64_t hk = h / (pb->heads_q / pb->heads_kv);

  /* Key blocks outside the keys the block's rows see are never touched
   * (causal skips the upper triangle this way). */
  int64_t jlo, jhi;
  attn__problem_key_block_range(pb, i0, i0 + br, nq, nk, &jlo, &jhi);

  attn__cpu_load_t(pb, &pb->q, b, rq, br, h, t->qt, ld);
  memset(t->o, 0, (size_t)br * d * sizeof(float));
  for (int r = 0; r < br; r++) {
    t->m[r] = -INFINITY;
    t->l[r] = 0.0f;
  }

  /* Key blocks aligned to Bc, as the backward's: it recomputes each score
   * tile with this very sgemm call (see cpu_backward.c). */
  for (int64_t j0 = jlo / Bc * Bc; j0 < jhi; j0 += Bc) {
    const int bc = (int)(nk - j0 < Bc ? nk - j0 : Bc);
    int ldk, ldv;
    const float *k = attn__cpu_view(pb, &pb->k, b, rk + j0, bc, hk, t->k, &ldk);
    const float *v = attn__cpu_view(pb, &pb->v, b, rk + j0, bc, hk, t->v, &ldv);

    attn__cpu_gemm(0, 0, bc, br, d, pb->scale, k, ldk, t->qt, ld, 0.0f, t->st, ld);
    attn__cpu_scores(pb, h, i0, br, j0, bc, nq, nk, t->st, ld, NULL);
    attn__cpu_softmax_cols(t->st, bc, br, ld, t->m, t->l, t->alpha);
    for (int r = 0; r < br; r++) {
      if (t->alpha[r] == 1.0f) continue;
      float *orow = t->o + (size_t)r * d;
      const float alpha = t->alpha[r];
      for (int c = 0; c < d; c++)
        orow[c] *= alpha;
    }
    attn__cpu_gemm(1, 0, br, d, bc, 1.0f, t->st, ld, v, ldv, 1.0f, t->o, d);
  }

  for (int r = 0; r < br; r++) {
    float *orow = t->o + (size_t)r * d;
    /* The mask says whether the row saw a key, not l: a NaN or inf among its
     * scores leaves l NaN (or 0, when they are all -inf), and such a row
     * must come out NaN, not as a row that saw nothing. */
    int64_t lo, hi;
    attn__problem_key_range(pb, i0 + r, nq, nk, &lo, &hi);
    if (lo < hi) {
      const float l = t->l[r];
      for (int c = 0; c < d; c++)
        orow[c] /= l;
      /* In double: one rounding instead of two (log, then the sum). */
      attn__lse_split(l > 0.0f ? (double)t->m[r] + log((double)l) : NAN, &t->lse[r], &t->lo[r]);
    } else {
      /* A row with no visible key: o = 0, lse = -inf. */
      memset(orow, 0, (size_t)d * sizeof(float));
      attn__lse_split(-INFINITY, &t->lse[r], &t->lo[r]);
    }
  }
  attn__cpu_store(pb, &pb->o, b, rq, br, h, t->o, d);
  if (pb->has_lse) attn__cpu_store_lse(pb, b, rq, br, h, t->lse, t->lo);
}

int attn__cpu_forward(attn_context *ctx, const attn__problem *pb, const attn__cpu_config *cfg) {
  int64_t *units = attn__cpu_units(pb, 0, pb->heads_q, cfg->br);
  const int nthreads = attn__cpu_threads();
  const size_t per_thread = attn__cpu_forward_scratch(pb, cfg) / sizeof(float);
  float *scratch = attn__cpu_alloc((size_t)nthreads * per_thread * sizeof(float));
  if (!units || !scratch) {
    free(units);
    attn__cpu_free(scratch);
    return attn__error(ctx, ATTN_ENOMEM, "cpu forward: cannot allocate %d threads' tiles",
                       nthreads);
  }
  const int64_t total = units[pb->batch];
  attn__debug("cpu forward: %lld units of up to %d query rows on %d threads", (long long)total,
              cfg->br, nthreads);

#pragma omp parallel num_threads(nthreads)
  {
    const cpu_fwd_tiles t =
        cpu_fwd_carve(scratch + (size_t)omp_get_thread_num() * per_thread, pb->head_dim, cfg);
#pragma omp for schedule(dynamic, 1)
    for (int64_t u = 0; u < total; u++) {
      int64_t b, h, i0;
      const int br = attn__cpu_unit(pb, units, 0, cfg->br, u, &b, &h, &i0);
      cpu_fwd_block(pb, &t, b, h, i0, br);
    }
  }

  free(units);
  attn__cpu_free(scratch);
  return ATTN_OK;
}
