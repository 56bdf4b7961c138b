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
 * and finally O = O / l_i, lse = m_i + log l_i. Only per-thread tiles are
 * allocated; nothing grows with Nq x Nk.
 */
#include "cpu_internal.h"

#include <omp.h>
#include <stdlib.h>

/* Per-thread scratch, in floats. */
typedef struct cpu_fwd_tiles {
  float *q;   /* Br x d (when the rows must be gathered; see attn__cpu_view) */
  float *k;   /* Bc x d (idem) */
  float *v;   /* Bc x d (idem) */
  float *s;   /* Br x Bc: scores, then P in place */
  float *o;   /* Br x d: unnormalized output */
  float *m;   /* Br: running row max m_i */
  float *l;   /* Br: running row sum l_i */
  float *lse; /* Br */
} cpu_fwd_tiles;

static size_t cpu_fwd_floats(int64_t d) {
  return (size_t)ATTN__CPU_BR * d * 2 + (size_t)ATTN__CPU_BC * d * 2 +
         (size_t)ATTN__CPU_BR * ATTN__CPU_BC + 3 * (size_t)ATTN__CPU_BR;
}

static cpu_fwd_tiles cpu_fwd_carve(float *base, int64_t d) {
  cpu_fwd_tiles t;
  t.q = base;
  t.o = t.q + (size_t)ATTN__CPU_BR * d;
  t.k = t.o + (size_t)ATTN__CPU_BR * d;
  t.v = t.k + (size_t)ATTN__CPU_BC * d;
  t.s = t.v + (size_t)ATTN__CPU_BC * d;
  t.m = t.s + (size_t)ATTN__CPU_BR * ATTN__CPU_BC;
  t.l = t.m + ATTN__CPU_BR;
  t.lse = t.l + ATTN__CPU_BR;
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

  int ldq, ldk, ldv;
  const float *q = attn__cpu_view(pb, &pb->q, b, rq, br, h, t->q, &ldq);
  memset(t->o, 0, (size_t)br * d * sizeof(float));
  for (int r = 0; r < br; r++) {
    t->m[r] = -INFINITY;
    t->l[r] = 0.0f;
  }

  for (int64_t j0 = jlo; j0 < jhi; j0 += ATTN__CPU_BC) {
    const int bc = (int)(jhi - j0 < ATTN__CPU_BC ? jhi - j0 : ATTN__CPU_BC);
    const float *k = attn__cpu_view(pb, &pb->k, b, rk + j0, bc, hk, t->k, &ldk);
    const float *v = attn__cpu_view(pb, &pb->v, b, rk + j0, bc, hk, t->v, &ldv);

    attn__cpu_gemm(0, 1, br, bc, d, pb->scale, q, ldq, k, ldk, 0.0f, t->s, ATTN__CPU_BC);
    attn__cpu_scores(pb, h, i0, br, j0, bc, nq, nk, t->s, ATTN__CPU_BC, NULL);

    for (int r = 0; r < br; r++) {
      float *srow = t->s + (size_t)r * ATTN__CPU_BC;
      float mx = -INFINITY;
      for (int c = 0; c < bc; c++)
        mx = srow[c] > mx ? srow[c] : mx;
      const float m_new = mx > t->m[r] ? mx : t->m[r];
      if (m_new == -INFINITY) {
        /* Nothing visible yet: exp(-inf - -inf) would be NaN. */
        memset(srow, 0, (size_t)bc * sizeof(float));
        continue;
      }
      const float alpha = t->m[r] == -INFINITY ? 0.0f : expf(t->m[r] - m_new);
      const float rowsum = attn__cpu_exp_sub(srow, m_new, srow, bc);
      t->l[r] = alpha * t->l[r] + rowsum;
      t->m[r] = m_new;
      if (alpha != 1.0f) {
        float *orow = t->o + (size_t)r * d;
        for (int c = 0; c < d; c++)
          orow[c] *= alpha;
      }
    }
    attn__cpu_gemm(0, 0, br, d, bc, 1.0f, t->s, ATTN__CPU_BC, v, ldv, 1.0f, t->o, d);
  }

  for (int r = 0; r < br; r++) {
    float *orow = t->o + (size_t)r * d;
    if (t->l[r] > 0.0f) {
      const float l = t->l[r];
      for (int c = 0; c < d; c++)
        orow[c] /= l;
      t->lse[r] = t->m[r] + logf(l);
    } else {
      /* A row with no visible key: o = 0, lse = -inf. */
      memset(orow, 0, (size_t)d * sizeof(float));
      t->lse[r] = -INFINITY;
    }
  }
  attn__cpu_store(pb, &pb->o, b, rq, br, h, t->o, d);
  if (pb->has_lse) attn__cpu_store_lse(pb, b, rq, br, h, t->lse);
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
