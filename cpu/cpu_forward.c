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

/* Per-thread scratch, in floats. */
typedef struct cpu_fwd_tiles {
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

static size_t cpu_fwd_floats(int64_t d) {
  return (size_t)ATTN__CPU_BR * d * 2 + (size_t)ATTN__CPU_BC * d * 2 +
         (size_t)ATTN__CPU_BR * ATTN__CPU_BC + 5 * (size_t)ATTN__CPU_BR;
}

static cpu_fwd_tiles cpu_fwd_carve(float *base, int64_t d) {
  cpu_fwd_tiles t;
  t.qt = base;
  t.o = t.qt + (size_t)ATTN__CPU_BR * d;
  t.k = t.o + (size_t)ATTN__CPU_BR * d;
  t.v = t.k + (size_t)ATTN__CPU_BC * d;
  t.st = t.v + (size_t)ATTN__CPU_BC * d;
  t.m = t.st + (size_t)ATTN__CPU_BR * ATTN__CPU_BC;
  t.l = t.m + ATTN__CPU_BR;
  t.alpha = t.l + ATTN__CPU_BR;
  t.lse = t.alpha + ATTN__CPU_BR;
  t.lo = t.lse + ATTN__CPU_BR;
  return t;
}

/* One unit: rows [i0, i0 + br) of query head h of sequence b. */
static void cpu_fwd_block(const attn__problem *pb, const cpu_fwd_tiles *t, int64_t b, int64_t h,
                          int64_t i0, int br) {
  const int d = (int)pb->head_dim;
  const int64_t nq = attn__seq_q(pb, b), nk = attn__seq_k(pb, b);
  const int64_t rq = attn__row0_q(pb, b) + i0, rk = attn__row0_k(pb, b);
  const int64_t hk = h / (pb->heads_q / pb->heads_kv);

  /* Both ends of a row's key range grow with the row, so the block sees at
   * most keys [lo of its first row, hi of its last row): key blocks outside
   * are never touched (causal skips the upper triangle this way). */
  int64_t jlo, jhi, unused;
  attn__key_range(pb, i0, nq, nk, &jlo, &unused);
  attn__key_range(pb, i0 + br - 1, nq, nk, &unused, &jhi);

  attn__cpu_load_t(pb, &pb->q, b, rq, br, h, t->qt, ATTN__CPU_BR);
  memset(t->o, 0, (size_t)br * d * sizeof(float));
  for (int r = 0; r < br; r++) {
    t->m[r] = -INFINITY;
    t->l[r] = 0.0f;
  }

  /* Key blocks aligned to Bc, as the backward's: it recomputes each score
   * tile with this very sgemm call (see cpu_backward.c). */
  for (int64_t j0 = jlo / ATTN__CPU_BC * ATTN__CPU_BC; j0 < jhi; j0 += ATTN__CPU_BC) {
    const int bc = (int)(nk - j0 < ATTN__CPU_BC ? nk - j0 : ATTN__CPU_BC);
    int ldk, ldv;
    const float *k = attn__cpu_view(pb, &pb->k, b, rk + j0, bc, hk, t->k, &ldk);
    const float *v = attn__cpu_view(pb, &pb->v, b, rk + j0, bc, hk, t->v, &ldv);

    attn__cpu_gemm(0, 0, bc, br, d, pb->scale, k, ldk, t->qt, ATTN__CPU_BR, 0.0f, t->st,
                   ATTN__CPU_BR);
    attn__cpu_scores(pb, h, i0, br, j0, bc, nq, nk, t->st, 1, ATTN__CPU_BR, NULL);
    attn__cpu_softmax_cols(t->st, bc, br, ATTN__CPU_BR, t->m, t->l, t->alpha);
    for (int r = 0; r < br; r++) {
      if (t->alpha[r] == 1.0f) continue;
      float *orow = t->o + (size_t)r * d;
      const float alpha = t->alpha[r];
      for (int c = 0; c < d; c++)
        orow[c] *= alpha;
    }
    attn__cpu_gemm(1, 0, br, d, bc, 1.0f, t->st, ATTN__CPU_BR, v, ldv, 1.0f, t->o, d);
  }

  for (int r = 0; r < br; r++) {
    float *orow = t->o + (size_t)r * d;
    if (t->l[r] > 0.0f) {
      const float l = t->l[r];
      for (int c = 0; c < d; c++)
        orow[c] /= l;
      /* In double: one rounding instead of two (log, then the sum). */
      attn__lse_split((double)t->m[r] + log((double)l), &t->lse[r], &t->lo[r]);
    } else {
      /* A row with no visible key: o = 0, lse = -inf. */
      memset(orow, 0, (size_t)d * sizeof(float));
      attn__lse_split(-INFINITY, &t->lse[r], &t->lo[r]);
    }
  }
  attn__cpu_store(pb, &pb->o, b, rq, br, h, t->o, d);
  if (pb->has_lse) attn__cpu_store_lse(pb, b, rq, br, h, t->lse, t->lo);
}

int attn__cpu_forward(attn_context *ctx, const attn__problem *pb) {
  const int64_t d = pb->head_dim, nb = ATTN__CPU_BR;
  int64_t *units = attn__cpu_units(pb, 0, pb->heads_q, nb);
  const int nthreads = omp_get_max_threads();
  const size_t per_thread = (cpu_fwd_floats(d) + 15) / 16 * 16;
  float *scratch = attn__cpu_alloc((size_t)nthreads * per_thread * sizeof(float));
  if (!units || !scratch) {
    free(units);
    attn__cpu_free(scratch);
    return attn__error(ctx, ATTN_ENOMEM, "cpu forward: cannot allocate %d threads' tiles",
                       nthreads);
  }
  const int64_t total = units[pb->batch];
  attn__debug("cpu forward: %lld units of up to %d query rows on %d threads", (long long)total,
              ATTN__CPU_BR, nthreads);

#pragma omp parallel num_threads(nthreads)
  {
    const cpu_fwd_tiles t = cpu_fwd_carve(scratch + (size_t)omp_get_thread_num() * per_thread, d);
#pragma omp for schedule(dynamic, 1)
    for (int64_t u = 0; u < total; u++) {
      const int64_t b = attn__cpu_unit_seq(units, pb->batch, u);
      const int64_t nq = attn__seq_q(pb, b), blocks = (nq + nb - 1) / nb;
      const int64_t rest = u - units[b], h = rest / blocks, i0 = (rest % blocks) * nb;
      cpu_fwd_block(pb, &t, b, h, i0, (int)(nq - i0 < nb ? nq - i0 : nb));
    }
  }

  free(units);
  attn__cpu_free(scratch);
  return ATTN_OK;
}
