/*
 * CPU backward pass: FlashAttention-2's Algorithm 2, in three sweeps over
 * one OpenMP parallel region.
 *
 *   0. D_i = rowsum(dO_i * O_i) for every query row and head (O(N) scratch).
 *   1. Units (sequence, kv head, block of Bc keys): dK and dV of the block
 *      stay in one thread's tiles while every query head sharing the kv head
 *      and every block of Br query rows that sees the keys streams by:
 *        S  = scale * Q K^T, then softcap / ALiBi / mask (as the forward)
 *        P  = exp(S - lse)
 *        dV += P^T dO
 *        dP = dO V^T
 *        dS = P * (dP - D)  (times 1 - tanh^2(s/softcap) with softcap)
 *        dK += dS^T Q
 *      and dK is scaled by `scale` once at the end.
 *   2. Units (sequence, query head, block of Br rows): the same S, P, dP, dS
 *      are recomputed for each visible key block and dQ += dS K, then dQ is
 *      scaled by `scale`.
 *
 * Why dQ gets its own sweep: in sweep 1 every key block adds to the dQ of
 * every query row that sees it, from whatever thread holds the block, so dQ
 * would need atomics or a lock, and float additions in scheduling order are
 * not reproducible. Per-key-block dQ partials reduced in a fixed order would
 * be, but they take Nq x d floats per key block (Nq x Nk x d / Bc in all),
 * not memory linear in the sequence length. Recomputing S, P and dP costs
 * two more tile products per tile (7 instead of 5) but gives dQ one owner
 * per row block, summed over key blocks in ascending order: the result is
 * bit-identical run to run and for any thread count, and the only scratch
 * beyond the tiles is D.
 */
#include "cpu_internal.h"

#include <omp.h>
#include <stdlib.h>

typedef struct cpu_bwd_tiles {
  float *q, *dout;   /* Br x d, when gathered (attn__cpu_view) */
  float *qt, *doutt; /* d x Br: Q and dO transposed (sweep 2) */
  float *dq;         /* Br x d */
  float *k, *v;      /* Bc x d, when gathered (attn__cpu_view) */
  float *kt, *vt;    /* d x Bc: K and V transposed (sweep 1) */
  float *dk, *dv;    /* Bc x d */
  float *s;          /* Br x Bc: scores, then P (sweep 2: transposed) */
  float *dp;         /* Br x Bc: dP, then dS (idem) */
  float *th;         /* Br x Bc: tanh(s / softcap), softcap only (idem) */
  float *lse, *dd;   /* Br: the rows' lse and D */
} cpu_bwd_tiles;

static size_t cpu_bwd_floats(int64_t d) {
  return (size_t)ATTN__CPU_BR * d * 5 + (size_t)ATTN__CPU_BC * d * 6 +
         (size_t)ATTN__CPU_BR * ATTN__CPU_BC * 3 + 2 * (size_t)ATTN__CPU_BR;
}

static cpu_bwd_tiles cpu_bwd_carve(float *base, int64_t d) {
  const size_t qd = (size_t)ATTN__CPU_BR * d, kd = (size_t)ATTN__CPU_BC * d;
  const size_t ss = (size_t)ATTN__CPU_BR * ATTN__CPU_BC;
  cpu_bwd_tiles t;
  t.q = base;
  t.dout = t.q + qd;
  t.qt = t.dout + qd;
  t.doutt = t.qt + qd;
  t.dq = t.doutt + qd;
  t.k = t.dq + qd;
  t.v = t.k + kd;
  t.kt = t.v + kd;
  t.vt = t.kt + kd;
  t.dk = t.vt + kd;
  t.dv = t.dk + kd;
  t.s = t.dv + kd;
  t.dp = t.s + ss;
  t.th = t.dp + ss;
  t.lse = t.th + ss;
  t.dd = t.lse + ATTN__CPU_BR;
  return t;
}

/* The first row of sequence b in the D scratch ([Hq][total_q]). */
static int64_t cpu_qrow(const attn__problem *pb, int64_t b) {
  return pb->cu_q ? pb->cu_q[b] : b * pb->seqlen_q;
}

/* lse and D of rows [i0, i0 + br) of query head h of sequence b. */
static void cpu_bwd_load_stats(const attn__problem *pb, const cpu_bwd_tiles *t, const float *dbuf,
                               int64_t b, int64_t h, int64_t i0, int br) {
  const int64_t total_q = cpu_qrow(pb, pb->batch);
  attn__cpu_load_lse(pb, b, attn__row0_q(pb, b) + i0, br, h, t->lse);
  memcpy(t->dd, dbuf + h * total_q + cpu_qrow(pb, b) + i0, (size_t)br * sizeof(float));
}

/* Sweep 0: D for rows [i0, i0 + br) of head h of sequence b. */
static void cpu_bwd_delta(const attn__problem *pb, const cpu_bwd_tiles *t, float *dbuf, int64_t b,
                          int64_t h, int64_t i0, int br) {
  const int d = (int)pb->head_dim;
  const int64_t rq = attn__row0_q(pb, b) + i0;
  const int64_t total_q = cpu_qrow(pb, pb->batch);
  attn__cpu_load(pb, &pb->o, b, rq, br, h, t->q, d);
  attn__cpu_load(pb, &pb->dout, b, rq, br, h, t->dout, d);
  float *out = dbuf + h * total_q + cpu_qrow(pb, b) + i0;
  for (int r = 0; r < br; r++) {
    const float *orow = t->q + (size_t)r * d, *drow = t->dout + (size_t)r * d;
    /* In double: D is subtracted from dP, and cancellation there is where
     * the backward loses most of its precision. */
    double acc = 0.0;
    for (int c = 0; c < d; c++)
      acc += (double)orow[c] * drow[c];
    out[r] = (float)acc;
  }
}

/* Sweep 1: dK, dV of keys [j0, j0 + bc) of kv head hk of sequence b. The
 * score tile has the queries down the rows here: K and V, fixed for the
 * unit, are the ones stored transposed. */
static void cpu_bwd_kv(const attn__problem *pb, const cpu_bwd_tiles *t, const float *dbuf,
                       int64_t b, int64_t hk, int64_t j0, int bc) {
  const int d = (int)pb->head_dim;
  const int capped = pb->softcap > 0.0f;
  const int64_t nq = attn__seq_q(pb, b), nk = attn__seq_k(pb, b);
  const int64_t rk = attn__row0_k(pb, b) + j0;
  const int64_t group = pb->heads_q / pb->heads_kv;
  int64_t ilo, ihi;
  attn__cpu_query_range(pb, j0, j0 + bc, nq, nk, &ilo, &ihi);

  attn__cpu_load_t(pb, &pb->k, b, rk, bc, hk, t->kt, ATTN__CPU_BC);
  attn__cpu_load_t(pb, &pb->v, b, rk, bc, hk, t->vt, ATTN__CPU_BC);
  memset(t->dk, 0, (size_t)bc * d * sizeof(float));
  memset(t->dv, 0, (size_t)bc * d * sizeof(float));
  for (int64_t h = hk * group; h < (hk + 1) * group; h++) {
    for (int64_t i0 = ilo; i0 < ihi; i0 += ATTN__CPU_BR) {
      const int br = (int)(ihi - i0 < ATTN__CPU_BR ? ihi - i0 : ATTN__CPU_BR);
      const int64_t rq = attn__row0_q(pb, b) + i0;
      int ldq, lddo;
      const float *q = attn__cpu_view(pb, &pb->q, b, rq, br, h, t->q, &ldq);
      const float *dout = attn__cpu_view(pb, &pb->dout, b, rq, br, h, t->dout, &lddo);
      cpu_bwd_load_stats(pb, t, dbuf, b, h, i0, br);

      /* S = scale Q K^T, P = exp(S - lse) */
      attn__cpu_gemm(0, 0, br, bc, d, pb->scale, q, ldq, t->kt, ATTN__CPU_BC, 0.0f, t->s,
                     ATTN__CPU_BC);
      attn__cpu_scores(pb, h, i0, br, j0, bc, nq, nk, t->s, ATTN__CPU_BC, 1, capped ? t->th : NULL);
      attn__cpu_exp_rows(t->s, br, bc, ATTN__CPU_BC, t->lse);
      /* dV += P^T dO */
      attn__cpu_gemm(1, 0, bc, d, br, 1.0f, t->s, ATTN__CPU_BC, dout, lddo, 1.0f, t->dv, d);
      /* dP = dO V^T, dS = P (dP - D) */
      attn__cpu_gemm(0, 0, br, bc, d, 1.0f, dout, lddo, t->vt, ATTN__CPU_BC, 0.0f, t->dp,
                     ATTN__CPU_BC);
      attn__cpu_dsoftmax(t->s, t->dp, capped ? t->th : NULL, br, bc, ATTN__CPU_BC, t->dd, 0);
      /* dK += dS^T Q */
      attn__cpu_gemm(1, 0, bc, d, br, 1.0f, t->dp, ATTN__CPU_BC, q, ldq, 1.0f, t->dk, d);
    }
  }
  for (size_t x = 0; x < (size_t)bc * d; x++)
    t->dk[x] *= pb->scale;
  attn__cpu_store(pb, &pb->dk, b, rk, bc, hk, t->dk, d);
  attn__cpu_store(pb, &pb->dv, b, rk, bc, hk, t->dv, d);
}

/* Sweep 2: dQ of rows [i0, i0 + br) of query head h of sequence b. The
 * score tile is transposed here (keys down, queries across), as in the
 * forward: Q and dO, fixed for the unit, are stored transposed. */
static void cpu_bwd_q(const attn__problem *pb, const cpu_bwd_tiles *t, const float *dbuf, int64_t b,
                      int64_t h, int64_t i0, int br) {
  const int d = (int)pb->head_dim;
  const int capped = pb->softcap > 0.0f;
  const int64_t nq = attn__seq_q(pb, b), nk = attn__seq_k(pb, b);
  const int64_t rq = attn__row0_q(pb, b) + i0, rk = attn__row0_k(pb, b);
  const int64_t hk = h / (pb->heads_q / pb->heads_kv);
  int64_t jlo, jhi, unused;
  attn__key_range(pb, i0, nq, nk, &jlo, &unused);
  attn__key_range(pb, i0 + br - 1, nq, nk, &unused, &jhi);

  attn__cpu_load_t(pb, &pb->q, b, rq, br, h, t->qt, ATTN__CPU_BR);
  attn__cpu_load_t(pb, &pb->dout, b, rq, br, h, t->doutt, ATTN__CPU_BR);
  cpu_bwd_load_stats(pb, t, dbuf, b, h, i0, br);
  memset(t->dq, 0, (size_t)br * d * sizeof(float));
  for (int64_t j0 = jlo; j0 < jhi; j0 += ATTN__CPU_BC) {
    const int bc = (int)(jhi - j0 < ATTN__CPU_BC ? jhi - j0 : ATTN__CPU_BC);
    int ldk, ldv;
    const float *k = attn__cpu_view(pb, &pb->k, b, rk + j0, bc, hk, t->k, &ldk);
    const float *v = attn__cpu_view(pb, &pb->v, b, rk + j0, bc, hk, t->v, &ldv);
    /* S^T = scale K Q^T, P^T = exp(S^T - lse) */
    attn__cpu_gemm(0, 0, bc, br, d, pb->scale, k, ldk, t->qt, ATTN__CPU_BR, 0.0f, t->s,
                   ATTN__CPU_BR);
    attn__cpu_scores(pb, h, i0, br, j0, bc, nq, nk, t->s, 1, ATTN__CPU_BR, capped ? t->th : NULL);
    attn__cpu_exp_cols(t->s, bc, br, ATTN__CPU_BR, t->lse);
    /* dP^T = V dO^T, dS^T = P^T (dP^T - D) */
    attn__cpu_gemm(0, 0, bc, br, d, 1.0f, v, ldv, t->doutt, ATTN__CPU_BR, 0.0f, t->dp,
                   ATTN__CPU_BR);
    attn__cpu_dsoftmax(t->s, t->dp, capped ? t->th : NULL, bc, br, ATTN__CPU_BR, t->dd, 1);
    /* dQ += dS K */
    attn__cpu_gemm(1, 0, br, d, bc, 1.0f, t->dp, ATTN__CPU_BR, k, ldk, 1.0f, t->dq, d);
  }
  for (size_t x = 0; x < (size_t)br * d; x++)
    t->dq[x] *= pb->scale;
  attn__cpu_store(pb, &pb->dq, b, rq, br, h, t->dq, d);
}

int attn__cpu_backward(attn_context *ctx, const attn__problem *pb) {
  const int64_t d = pb->head_dim, br = ATTN__CPU_BR, bc = ATTN__CPU_BC;
  const int64_t total_q = cpu_qrow(pb, pb->batch);
  int64_t *qunits = attn__cpu_units(pb, 0, pb->heads_q, br);
  int64_t *kunits = attn__cpu_units(pb, 1, pb->heads_kv, bc);
  float *dbuf = attn__cpu_alloc((size_t)(pb->heads_q * total_q) * sizeof(float));
  const int nthreads = omp_get_max_threads();
  const size_t per_thread = (cpu_bwd_floats(d) + 15) / 16 * 16;
  float *scratch = attn__cpu_alloc((size_t)nthreads * per_thread * sizeof(float));
  if (!qunits || !kunits || !dbuf || !scratch) {
    free(qunits);
    free(kunits);
    attn__cpu_free(dbuf);
    attn__cpu_free(scratch);
    return attn__error(ctx, ATTN_ENOMEM, "cpu backward: cannot allocate %d threads' tiles",
                       nthreads);
  }
  const int64_t nqu = qunits[pb->batch], nku = kunits[pb->batch];

#pragma omp parallel num_threads(nthreads)
  {
    const cpu_bwd_tiles t = cpu_bwd_carve(scratch + (size_t)omp_get_thread_num() * per_thread, d);
    /* The implicit barrier after each loop orders the sweeps. */
#pragma omp for schedule(dynamic, 1)
    for (int64_t u = 0; u < nqu; u++) {
      const int64_t b = attn__cpu_unit_seq(qunits, pb->batch, u);
      const int64_t nq = attn__seq_q(pb, b), blocks = (nq + br - 1) / br;
      const int64_t rest = u - qunits[b], h = rest / blocks, i0 = (rest % blocks) * br;
      cpu_bwd_delta(pb, &t, dbuf, b, h, i0, (int)(nq - i0 < br ? nq - i0 : br));
    }
#pragma omp for schedule(dynamic, 1)
    for (int64_t u = 0; u < nku; u++) {
      const int64_t b = attn__cpu_unit_seq(kunits, pb->batch, u);
      const int64_t nk = attn__seq_k(pb, b), blocks = (nk + bc - 1) / bc;
      const int64_t rest = u - kunits[b], hk = rest / blocks, j0 = (rest % blocks) * bc;
      cpu_bwd_kv(pb, &t, dbuf, b, hk, j0, (int)(nk - j0 < bc ? nk - j0 : bc));
    }
#pragma omp for schedule(dynamic, 1)
    for (int64_t u = 0; u < nqu; u++) {
      const int64_t b = attn__cpu_unit_seq(qunits, pb->batch, u);
      const int64_t nq = attn__seq_q(pb, b), blocks = (nq + br - 1) / br;
      const int64_t rest = u - qunits[b], h = rest / blocks, i0 = (rest % blocks) * br;
      cpu_bwd_q(pb, &t, dbuf, b, h, i0, (int)(nq - i0 < br ? nq - i0 : br));
    }
  }

  free(qunits);
  free(kunits);
  attn__cpu_free(dbuf);
  attn__cpu_free(scratch);
  return ATTN_OK;
}
