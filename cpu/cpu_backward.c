/*
 * CPU backward pass: FlashAttention-2's Algorithm 2, in three sweeps over
 * one OpenMP parallel region.
 *
 *   0. D_i = rowsum(dO_i * O_i) for every query row and head, the dQ
 *      accumulator cleared, and Q^T and dO^T stored block by block (see
 *      below).
 *   1. Units (sequence, kv head, block of Bc keys), in ascending key order:
 *      dK and dV of the block stay in one thread's tiles while every query
 *      head sharing the kv head and every block of Br query rows that sees
 *      the keys streams by. The score tile is transposed, keys down and
 *      queries across, as in the forward:
 *        S^T  = scale * K Q^T, then softcap / ALiBi / mask
 *        P^T  = exp(S^T - lse)
 *        dV  += P^T dO
 *        dP^T = V dO^T
 *        dS^T = P^T * (dP^T - D)  (dbias += dS; then times 1 - tanh^2(s/softcap)
 *                                   with softcap)
 *        dK  += dS^T Q
 *        dQ  += dS K              (into the accumulator, in key-block order)
 *      and dK is scaled by `scale` once at the end.
 *   2. dQ = scale * accumulator, written in the output dtype; dsinks[h] =
 *      sum over rows of -exp(sink - lse) D (attn__sink_grad).
 *
 * Why S^T = K Q^T, computed exactly as the forward does (same sgemm call,
 * same operands, same Br/Bc-aligned tiles): P = exp(S - lse) divides the
 * backward's scores by the forward's softmax, so any difference between the
 * two is an error in P of the same relative size. With large logits that
 * dominates: OpenBLAS's Haswell/Zen kernels give Q K^T and K Q^T results one
 * ulp apart in a sixth of the elements, which made dV of the big_logits
 * golden case 10x less accurate (err/peer 22) until both passes shared the
 * call. Q^T is stored once for the whole problem in sweep 0 (memory like
 * dQ's), rather than transposed again for every key block, and so is dO^T,
 * which makes dP^T = V dO^T an untransposed product too (OpenBLAS's NT path
 * packs its operands: 85 GFLOP/s against 112, see attn__cpu_load_t).
 *
 * How dQ stays deterministic: every key block adds to the dQ of every query
 * block that sees it, from whatever thread holds the key block. Atomics, or
 * additions in whatever order threads arrive, would make the float sums
 * differ run to run; per-key-block partials reduced afterwards would take
 * Nq x d floats per key block (Nq x Nk x d / Bc in all). Instead each query
 * block has a turn counter holding the last key block that added to it, and
 * key block j adds only once its predecessor has (FlashAttention-2's
 * deterministic backward on GPUs orders dQ the same way). The sum for every
 * query block is then always taken in ascending key-block order, so dQ is
 * bit-identical run to run and for any thread count, with 5 tile products
 * per tile and scratch linear in the sequence length (D, Q^T, dO^T, one
 * counter per query block, and an f32 dQ unless dq is f32 and accumulates
 * in place).
 * It cannot deadlock: units are handed out in ascending order
 * (schedule(monotonic: dynamic)), a unit only ever waits for the one before
 * it, and the lowest unit still running never waits. (The alternative, a
 * second sweep that recomputes S, P and dP per query block to own dQ
 * outright, costs 7 products per tile instead of 5: measured 58 GFLOP/s
 * against 86 on one core of the build host, B=1 H=12 N=2048 d=64.)
 */
#define _POSIX_C_SOURCE 200809L /* sched_yield */

#include "cpu_internal.h"

#include <limits.h>
#include <omp.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>

typedef struct cpu_bwd_tiles {
  float *q, *dout;      /* Br x d, when gathered (attn__cpu_view) */
  float *k, *v;         /* Bc x d, idem */
  float *dk, *dv;       /* Bc x d */
  float *s;             /* Bc x Br: S^T, then P^T */
  float *dp;            /* Bc x Br: dP^T, then dS^T */
  float *th;            /* Bc x Br: tanh(s / softcap), softcap only */
  float *lse, *lo, *dd; /* Br: the rows' lse (hi, lo) and D */
  float *db;            /* a shared dbias: [heads][rows][Bc], the unit's part */
} cpu_bwd_tiles;

/* Whether units of other sequences or kv heads add to the same dbias
 * entries (see above). */
static int cpu_dbias_shared(const attn__problem *pb) {
  return pb->has_dbias &&
         ((pb->dbias.sb == 0 && pb->batch > 1) || (pb->dbias.sh == 0 && pb->heads_kv > 1));
}

/* A unit's share of a shared dbias: heads and rows of the tile it sums in
 * (1 where the bias broadcasts). */
static int64_t cpu_dbias_heads(const attn__problem *pb) {
  return pb->dbias.sh ? pb->heads_q / pb->heads_kv : 1;
}
static int64_t cpu_dbias_rows(const attn__problem *pb) {
  return pb->dbias.ss ? pb->seqlen_q : 1;
}

static size_t cpu_bwd_tile_floats(const attn__problem *pb, const attn__cpu_config *cfg) {
  const size_t d = (size_t)pb->head_dim, br = (size_t)cfg->br, bc = (size_t)cfg->bc;
  return br * d * 2 + bc * d * 4 + br * bc * 3 + 3 * br;
}

size_t attn__cpu_backward_scratch(const attn__problem *pb, const attn__cpu_config *cfg) {
  size_t floats = cpu_bwd_tile_floats(pb, cfg);
  if (cpu_dbias_shared(pb))
    floats += (size_t)cpu_dbias_heads(pb) * (size_t)cpu_dbias_rows(pb) * (size_t)cfg->bc;
  return (floats + 15) / 16 * 16 * sizeof(float);
}

static cpu_bwd_tiles cpu_bwd_carve(float *base, const attn__problem *pb,
                                   const attn__cpu_config *cfg) {
  const int64_t d = pb->head_dim;
  const size_t qd = (size_t)cfg->br * d, kd = (size_t)cfg->bc * d;
  const size_t ss = (size_t)cfg->br * cfg->bc;
  cpu_bwd_tiles t;
  t.q = base;
  t.dout = t.q + qd;
  t.k = t.dout + qd;
  t.v = t.k + kd;
  t.dk = t.v + kd;
  t.dv = t.dk + kd;
  t.s = t.dv + kd;
  t.dp = t.s + ss;
  t.th = t.dp + ss;
  t.lse = t.th + ss;
  t.lo = t.lse + cfg->br;
  t.dd = t.lo + cfg->br;
  t.db = base + cpu_bwd_tile_floats(pb, cfg);
  return t;
}

/* How dbias stays deterministic and free of races: it is cleared in sweep
 * 0, and a key-block unit owns the dbias entries of its keys and heads
 * unless the bias broadcasts over sequences or kv heads. An owner adds its
 * tiles straight in, in its own fixed order. Otherwise the units that share
 * entries (the same key block of other sequences or kv heads) each sum
 * their part in a tile of their own and add it in turn, in unit order, by a
 * counter per shared block, as dQ's turns: so the sums never depend on the
 * threads. */

/* Scratch shared by the threads. Query rows are numbered globally,
 * g = qrow(b) + i, over all sequences. */
typedef struct cpu_bwd_shared {
  int br, bc;       /* Br, Bc of the plan; Br is also the row stride of every
                     * Bc x Br tile and of the Q^T and dO^T blocks */
  int64_t total_q;  /* rows of q over all sequences */
  int64_t *qblock0; /* first query block of sequence b (Br-aligned per sequence) */
  int64_t qblocks;  /* query blocks over all sequences, per head */
  float *dd;        /* [Hq][total_q]: D */
  float *qt;        /* [Hq][qblocks][d][Br]: Q^T, block by block */
  float *doutt;     /* [Hq][qblocks][d][Br]: dO^T, block by block */
  float *dq;        /* [Hq][total_q][d]: the dQ accumulator, unscaled; NULL
                     * when it is dq itself (f32, rows of unit column stride) */
  atomic_int *turn; /* [Hq][qblocks]: the last key block that added to dQ, or -1 */
  float *sg;        /* dsinks: [Hq][total_q], each row's attn__sink_grad */
  /* A shared dbias: [sequences][kv heads][key blocks] (1 sequence, 1 kv head
   * where it broadcasts), the last unit (b * Hkv + hk) that added, or -1. */
  atomic_llong *bturn;
  int64_t kblocks; /* key blocks of the longest sequence */
  /* Whether a unit is a whole sequence and kv head (cpu_bwd_head): when
   * there are enough of them to fill the threads. */
  int by_head;
  attn__cpu_sgemm_fn *gemm; /* the f32 products (attn__cpu_row_gemm) */
  int few_rows;             /* the config's: see attn__cpu_qk_few */
} cpu_bwd_shared;

static int64_t cpu_qrow(const attn__problem *pb, int64_t b) {
  return pb->cu_q ? pb->cu_q[b] : b * pb->seqlen_q;
}

/* Row i0 of query head h of sequence b in the dQ accumulator, and its row
 * stride. */
static float *cpu_bwd_acc(const attn__problem *pb, const cpu_bwd_shared *sh, int64_t b, int64_t h,
                          int64_t i0, int *ld) {
  if (!sh->dq) return attn__cpu_inplace(pb, &pb->dq, b, attn__row0_q(pb, b) + i0, h, ld);
  *ld = (int)pb->head_dim;
  return sh->dq + (h * sh->total_q + cpu_qrow(pb, b) + i0) * pb->head_dim;
}

/* The Q^T or dO^T block (base sh->qt or sh->doutt) of rows [i0, i0 + Br)
 * of query head h of sequence b. */
static float *cpu_bwd_block_t(const attn__problem *pb, const cpu_bwd_shared *sh, float *base,
                              int64_t b, int64_t h, int64_t i0) {
  return base + (size_t)(h * sh->qblocks + sh->qblock0[b] + i0 / sh->br) * (size_t)pb->head_dim *
                    (size_t)sh->br;
}

/* Sweep 0: D for rows [i0, i0 + br) of head h of sequence b; their dQ
 * accumulator cleared; their Q^T block. */
static void cpu_bwd_delta(const attn__problem *pb, const cpu_bwd_tiles *t, const cpu_bwd_shared *sh,
                          int64_t b, int64_t h, int64_t i0, int br) {
  const int d = (int)pb->head_dim;
  const int64_t rq = attn__row0_q(pb, b) + i0;
  const int64_t g = h * sh->total_q + cpu_qrow(pb, b) + i0;
  attn__cpu_load(pb, &pb->o, b, rq, br, h, t->q, d);
  attn__cpu_load(pb, &pb->dout, b, rq, br, h, t->dout, d);
  for (int r = 0; r < br; r++) {
    const float *orow = t->q + (size_t)r * d, *drow = t->dout + (size_t)r * d;
    /* In double: D is subtracted from dP, and cancellation there is where
     * the backward loses most of its precision. */
    double acc = 0.0;
    for (int c = 0; c < d; c++)
      acc += (double)orow[c] * drow[c];
    sh->dd[g + r] = (float)acc;
  }
  if (sh->sg) {
    /* The rows that see no key pass nothing (their O is 0, and so is D). */
    const int64_t nq = attn__seq_q(pb, b), nk = attn__seq_k(pb, b);
    const float sink =
        ((const float *)((const char *)pb->sinks.native + pb->sinks.offset))[h * pb->sinks.sh];
    attn__cpu_load_lse(pb, b, rq, br, h, t->lse, t->lo);
    for (int r = 0; r < br; r++) {
      int64_t lo, hi;
      attn__problem_key_range(pb, i0 + r, nq, nk, &lo, &hi);
      sh->sg[g + r] = lo < hi ? attn__sink_grad(sink, t->lse[r], sh->dd[g + r]) : 0.0f;
    }
  }
  int ld;
  float *acc = cpu_bwd_acc(pb, sh, b, h, i0, &ld);
  for (int r = 0; r < br; r++)
    memset(acc + (size_t)r * ld, 0, (size_t)d * sizeof(float));
  attn__cpu_load_t(pb, &pb->q, b, rq, br, h, cpu_bwd_block_t(pb, sh, sh->qt, b, h, i0), sh->br);
  attn__cpu_load_t(pb, &pb->dout, b, rq, br, h, cpu_bwd_block_t(pb, sh, sh->doutt, b, h, i0),
                   sh->br);
}

/* Whether key block kb (keys [kb Bc, ...)) is seen by some row of query
 * block [i0, i0 + Br): the same test sweep 1 uses to pick the query blocks
 * of a key block, so the turn order below matches the visits exactly. */
static int cpu_bwd_touches(const attn__problem *pb, const cpu_bwd_shared *sh, int64_t kb,
                           int64_t i0, int64_t nq, int64_t nk) {
  int64_t j0 = kb * sh->bc, j1 = j0 + sh->bc, ilo, ihi;
  if (j1 > nk) j1 = nk;
  attn__problem_query_block_range(pb, j0, j1, nq, nk, &ilo, &ihi);
  return ilo < ihi && ilo < i0 + sh->br && ihi > i0;
}

static void cpu_bwd_wait(atomic_int *turn, int want) {
  int spins = 0;
  while (atomic_load_explicit(turn, memory_order_acquire) != want) {
    /* The predecessor is one tile's work away at most, unless its thread
     * was descheduled: then let it run. */
    if (++spins == 256) {
      spins = 0;
      sched_yield();
    }
  }
}

static void cpu_bwd_wait_unit(atomic_llong *turn, long long want) {
  int spins = 0;
  while (atomic_load_explicit(turn, memory_order_acquire) != want) {
    /* As cpu_bwd_wait: the predecessor is one unit's end away. */
    if (++spins == 256) {
      spins = 0;
      sched_yield();
    }
  }
}

/* A shared dbias (see the top): the counter of the entries of key block kb
 * that unit (b, hk) adds to, and the unit before it that adds there (b *
 * Hkv + hk), or -1. Units of a sequence too short to have key block kb do
 * not take part. */
static atomic_llong *cpu_dbias_turn(const attn__problem *pb, const cpu_bwd_shared *sh, int64_t b,
                                    int64_t hk, int64_t kb) {
  const attn__tensor *t = &pb->dbias;
  const int64_t heads = t->sh ? pb->heads_kv : 1;
  return sh->bturn + ((t->sb ? b : 0) * heads + (t->sh ? hk : 0)) * sh->kblocks + kb;
}
static long long cpu_dbias_pred(const attn__problem *pb, const cpu_bwd_shared *sh, int64_t b,
                                int64_t hk, int64_t kb) {
  const attn__tensor *t = &pb->dbias;
  const int64_t hkv = pb->heads_kv;
  if (t->sh == 0 && hk > 0) return b * hkv + hk - 1;
  if (t->sb == 0)
    for (int64_t p = b - 1; p >= 0; p--)
      if (kb < (attn__seq_k(pb, p) + sh->bc - 1) / sh->bc) return p * hkv + (t->sh ? hk : hkv - 1);
  return -1;
}

/* Element (b, h, i, j) of dbias. */
static float *cpu_dbias_at(const attn__problem *pb, int64_t b, int64_t h, int64_t i, int64_t j) {
  const attn__tensor *t = &pb->dbias;
  return (float *)((char *)t->native + t->offset) + b * t->sb + h * t->sh + i * t->ss + j * t->sd;
}

/* Sweep 1: dK, dV of key block kb (keys [j0, j0 + bc)) of kv head hk of
 * sequence b, and its share of dQ. */
static void cpu_bwd_kv(const attn__problem *pb, const cpu_bwd_tiles *t, const cpu_bwd_shared *sh,
                       int64_t b, int64_t hk, int64_t kb, int bc) {
  const int d = (int)pb->head_dim;
  const int capped = pb->softcap > 0.0f;
  const int64_t nq = attn__seq_q(pb, b), nk = attn__seq_k(pb, b);
  const int Br = sh->br, ld = sh->br;
  const int64_t j0 = kb * sh->bc;
  const int64_t group = pb->heads_q / pb->heads_kv;
  int64_t ilo, ihi;
  attn__problem_query_block_range(pb, j0, j0 + bc, nq, nk, &ilo, &ihi);

  int ldk, ldv;
  const float *k = attn__cpu_view_keys(pb, &pb->k, b, j0, bc, hk, t->k, &ldk);
  const float *v = attn__cpu_view_keys(pb, &pb->v, b, j0, bc, hk, t->v, &ldv);
  memset(t->dk, 0, (size_t)bc * d * sizeof(float));
  memset(t->dv, 0, (size_t)bc * d * sizeof(float));
  /* A shared dbias: this unit's part, cleared over the rows it visits. */
  const int db_shared = sh->bturn != NULL;
  const int64_t db_rows = db_shared ? cpu_dbias_rows(pb) : 0;
  const int64_t db_r0 = pb->dbias.ss ? ilo / Br * Br : 0, db_r1 = pb->dbias.ss ? ihi : 1;
  if (db_shared && ilo < ihi)
    for (int64_t x = 0; x < cpu_dbias_heads(pb); x++)
      memset(t->db + (x * db_rows + db_r0) * sh->bc, 0,
             (size_t)(db_r1 - db_r0) * (size_t)sh->bc * sizeof(float));
  /* No query block at all must also mean no turn taken: see
   * cpu_bwd_touches. */
  const int64_t h_end = ilo < ihi ? (hk + 1) * group : hk * group;
  for (int64_t h = hk * group; h < h_end; h++) {
    /* Query blocks aligned to Br within the sequence, as in the forward, so
     * that every key block adds to the same dQ blocks. */
    for (int64_t i0 = ilo / Br * Br; i0 < ihi; i0 += Br) {
      const int br = (int)(nq - i0 < Br ? nq - i0 : Br);
      const int64_t rq = attn__row0_q(pb, b) + i0, g = h * sh->total_q + cpu_qrow(pb, b) + i0;
      int ldq, lddo;
      const float *q = attn__cpu_view(pb, &pb->q, b, rq, br, h, t->q, &ldq);
      const float *dout = attn__cpu_view(pb, &pb->dout, b, rq, br, h, t->dout, &lddo);
      attn__cpu_load_lse(pb, b, rq, br, h, t->lse, t->lo);
      memcpy(t->dd, sh->dd + g, (size_t)br * sizeof(float));

      /* S^T = scale K Q^T, the forward's call; P^T = exp(S^T - lse) */
      if (br <= sh->few_rows)
        attn__cpu_qk_few(pb, &pb->k, NULL, b, j0, bc, h, 1, br, q, ldq, t->s, ld);
      else
        sh->gemm(0, 0, bc, br, d, pb->scale, k, ldk, cpu_bwd_block_t(pb, sh, sh->qt, b, h, i0), ld,
                 0.0f, t->s, ld);
      attn__cpu_scores(pb, b, h, i0, br, j0, bc, nq, nk, t->s, ld, capped ? t->th : NULL);
      attn__cpu_exp_cols(t->s, bc, br, ld, t->lse, t->lo);
      /* dV += P^T dO */
      sh->gemm(0, 0, bc, d, br, 1.0f, t->s, ld, dout, lddo, 1.0f, t->dv, d);
      /* dP^T = V dO^T, dS^T = P^T (dP^T - D) */
      sh->gemm(0, 0, bc, br, d, 1.0f, v, ldv, cpu_bwd_block_t(pb, sh, sh->doutt, b, h, i0), ld,
               0.0f, t->dp, ld);
      if (pb->has_dbias) {
        /* dbias takes dS itself; dK and dQ take it through softcap's
         * derivative. */
        attn__cpu_dsoftmax_cols(t->s, t->dp, NULL, pb->softcap, bc, br, ld, t->dd);
        if (db_shared)
          attn__cpu_add_cols(
              t->dp, bc, br, ld,
              t->db + ((pb->dbias.sh ? h - hk * group : 0) * db_rows + (pb->dbias.ss ? i0 : 0)) *
                          sh->bc,
              pb->dbias.ss ? sh->bc : 0, 1);
        else
          attn__cpu_add_cols(t->dp, bc, br, ld, cpu_dbias_at(pb, b, h, i0, j0), pb->dbias.ss,
                             pb->dbias.sd);
        if (capped) attn__cpu_score_grad_cols(t->dp, t->th, pb->softcap, bc, br, ld);
      } else {
        attn__cpu_dsoftmax_cols(t->s, t->dp, capped ? t->th : NULL, pb->softcap, bc, br, ld, t->dd);
      }
      /* dK += dS^T Q */
      sh->gemm(0, 0, bc, d, br, 1.0f, t->dp, ld, q, ldq, 1.0f, t->dk, d);
      /* dQ += dS K, after the previous key block that sees these rows:
       * kb - 1 or none, as the key blocks a query block sees are
       * consecutive (the rows that see any key are consecutive, and each
       * one's range starts at most one key after the previous one's). */
      const int64_t prev = kb > 0 && cpu_bwd_touches(pb, sh, kb - 1, i0, nq, nk) ? kb - 1 : -1;
      atomic_int *turn = sh->turn + h * sh->qblocks + sh->qblock0[b] + i0 / Br;
      cpu_bwd_wait(turn, (int)prev);
      int ldacc;
      float *acc = cpu_bwd_acc(pb, sh, b, h, i0, &ldacc);
      sh->gemm(1, 0, br, d, bc, 1.0f, t->dp, ld, k, ldk, 1.0f, acc, ldacc);
      atomic_store_explicit(turn, (int)kb, memory_order_release);
    }
  }
  if (db_shared) {
    /* This unit's part into dbias, in its turn (even when it visited no
     * row: the next unit waits for it). */
    atomic_llong *turn = cpu_dbias_turn(pb, sh, b, hk, kb);
    cpu_bwd_wait_unit(turn, cpu_dbias_pred(pb, sh, b, hk, kb));
    if (ilo < ihi)
      for (int64_t x = 0; x < cpu_dbias_heads(pb); x++)
        for (int64_t i = db_r0; i < db_r1; i++) {
          float *dst = cpu_dbias_at(pb, b, hk * group + x, i, j0);
          const float *src = t->db + (x * db_rows + i) * sh->bc;
          for (int c = 0; c < bc; c++)
            dst[c * pb->dbias.sd] += src[c];
        }
    atomic_store_explicit(turn, b * pb->heads_kv + hk, memory_order_release);
  }
  for (size_t x = 0; x < (size_t)bc * d; x++)
    t->dk[x] *= pb->scale;
  attn__cpu_store_keys(pb, &pb->dk, b, j0, bc, hk, t->dk, d);
  attn__cpu_store_keys(pb, &pb->dv, b, j0, bc, hk, t->dv, d);
}

/* Sweep 2: dQ of rows [i0, i0 + br) of query head h of sequence b. */
static void cpu_bwd_dq(const attn__problem *pb, const cpu_bwd_shared *sh, int64_t b, int64_t h,
                       int64_t i0, int br) {
  const int d = (int)pb->head_dim;
  int ld;
  float *acc = cpu_bwd_acc(pb, sh, b, h, i0, &ld);
  for (int r = 0; r < br; r++)
    for (int c = 0; c < d; c++)
      acc[(size_t)r * ld + c] *= pb->scale;
  if (sh->dq) attn__cpu_store(pb, &pb->dq, b, attn__row0_q(pb, b) + i0, br, h, acc, d);
}

/* Sequence b, kv head hk, whole: sweep 0 for the rows of its query heads,
 * sweep 1 over its key blocks in ascending order, sweep 2. Each dQ block
 * still sums its key blocks in ascending order, so the result is the
 * three-sweep one to the bit; but no thread waits for another's turn, and
 * the Q^T, dO^T and dQ blocks of the head stay in the thread's cache from
 * the sweep that writes them to the one that reads them. */
static void cpu_bwd_head(const attn__problem *pb, const cpu_bwd_tiles *t, const cpu_bwd_shared *sh,
                         int64_t b, int64_t hk) {
  const int64_t group = pb->heads_q / pb->heads_kv;
  const int64_t nq = attn__seq_q(pb, b), nk = attn__seq_k(pb, b);
  for (int64_t h = hk * group; h < (hk + 1) * group; h++)
    for (int64_t i0 = 0; i0 < nq; i0 += sh->br)
      cpu_bwd_delta(pb, t, sh, b, h, i0, (int)(nq - i0 < sh->br ? nq - i0 : sh->br));
  for (int64_t kb = 0; kb * sh->bc < nk; kb++)
    cpu_bwd_kv(pb, t, sh, b, hk, kb, (int)(nk - kb * sh->bc < sh->bc ? nk - kb * sh->bc : sh->bc));
  for (int64_t h = hk * group; h < (hk + 1) * group; h++)
    for (int64_t i0 = 0; i0 < nq; i0 += sh->br)
      cpu_bwd_dq(pb, sh, b, h, i0, (int)(nq - i0 < sh->br ? nq - i0 : sh->br));
}

static void cpu_bwd_run(const attn__problem *pb, const cpu_bwd_shared *sh,
                        const attn__cpu_config *cfg, const int64_t *qunits, const int64_t *kunits,
                        float *scratch, int nthreads, size_t per_thread) {
  const int64_t nqu = qunits[pb->batch], nku = kunits[pb->batch];

#pragma omp parallel num_threads(nthreads)
  {
    const cpu_bwd_tiles t =
        cpu_bwd_carve(scratch + (size_t)omp_get_thread_num() * per_thread, pb, cfg);
    int64_t b, h, i0;
    if (pb->has_dbias) {
      /* dbias cleared, its rows spread over the threads; the barrier after
       * the next loop orders this before sweep 1. */
      const attn__tensor *db = &pb->dbias;
      const int64_t hb = db->sh ? pb->heads_q : 1, ib = db->ss ? pb->seqlen_q : 1;
      const int64_t rows = (db->sb ? pb->batch : 1) * hb * ib;
#pragma omp for schedule(static) nowait
      for (int64_t x = 0; x < rows; x++) {
        float *row = cpu_dbias_at(pb, x / (hb * ib), x / ib % hb, x % ib, 0);
        for (int64_t j = 0; j < pb->seqlen_k; j++)
          row[j * db->sd] = 0.0f;
      }
    }
    if (sh->by_head) {
      /* The three sweeps of one sequence and kv head in one thread (see
       * cpu_bwd_by_head), units in ascending order as below (a shared
       * dbias waits for the unit before). */
#pragma omp barrier
#pragma omp for schedule(monotonic : dynamic, 1)
      for (int64_t u = 0; u < pb->batch * pb->heads_kv; u++)
        cpu_bwd_head(pb, &t, sh, u / pb->heads_kv, u % pb->heads_kv);
    } else {
      /* The implicit barrier after each loop orders the sweeps. */
#pragma omp for schedule(dynamic, 1)
      for (int64_t u = 0; u < nqu; u++) {
        const int br = attn__cpu_unit(pb, qunits, 0, cfg->br, u, &b, &h, &i0);
        cpu_bwd_delta(pb, &t, sh, b, h, i0, br);
      }
      /* Units in ascending order, key blocks innermost: see the top. */
#pragma omp for schedule(monotonic : dynamic, 1)
      for (int64_t u = 0; u < nku; u++) {
        const int bc = attn__cpu_unit(pb, kunits, 1, cfg->bc, u, &b, &h, &i0);
        cpu_bwd_kv(pb, &t, sh, b, h, i0 / cfg->bc, bc);
      }
#pragma omp for schedule(dynamic, 1)
      for (int64_t u = 0; u < nqu; u++) {
        const int br = attn__cpu_unit(pb, qunits, 0, cfg->br, u, &b, &h, &i0);
        cpu_bwd_dq(pb, sh, b, h, i0, br);
      }
    }
    if (sh->sg) {
      /* dsinks: each head's rows summed in row order, in double. */
#pragma omp for schedule(static)
      for (int64_t x = 0; x < pb->heads_q; x++) {
        double sum = 0.0;
        for (int64_t g = 0; g < sh->total_q; g++)
          sum += sh->sg[x * sh->total_q + g];
        ((float *)((char *)pb->dsinks.native + pb->dsinks.offset))[x * pb->dsinks.sh] = (float)sum;
      }
    }
  }
}

int attn__cpu_backward(attn_context *ctx, const attn__problem *pb, const attn__cpu_config *cfg) {
  const int64_t d = pb->head_dim, br = cfg->br, bc = cfg->bc;
  cpu_bwd_shared sh;
  sh.br = cfg->br;
  sh.bc = cfg->bc;
  sh.few_rows = cfg->few_rows;
  sh.gemm = attn__cpu_row_gemm(cfg);
  sh.total_q = cpu_qrow(pb, pb->batch);
  int64_t *qunits = attn__cpu_units(pb, 0, pb->heads_q, br);
  int64_t *kunits = attn__cpu_units(pb, 1, pb->heads_kv, bc);
  sh.qblock0 = malloc((size_t)(pb->batch + 1) * sizeof *sh.qblock0);
  sh.qblocks = qunits ? qunits[pb->batch] / pb->heads_q : 0;
  /* D, Q^T, dO^T, the dQ accumulator, the dsinks terms and the threads'
   * tiles, carved from the context's workspace: allocating them per call
   * cost the page faults of fresh memory on every call (ViT-B/16 batch 64:
   * 77 MB of Q^T and dO^T; see bench/NOTES.md). */
  const size_t tsize = (size_t)(pb->heads_q * sh.qblocks) * (size_t)d * (size_t)br;
  const size_t rows = (size_t)(pb->heads_q * sh.total_q);
  /* An f32 dq whose rows sgemm can address accumulates in place. */
  int unused;
  const int inplace = attn__cpu_inplace(pb, &pb->dq, 0, 0, 0, &unused) != NULL;
  const int nthreads = attn__cpu_threads();
  const size_t per_thread = attn__cpu_backward_scratch(pb, cfg) / sizeof(float);
  const size_t part[6] = {rows,
                          tsize,
                          tsize,
                          inplace ? 0 : rows * (size_t)d,
                          pb->has_dsinks ? rows : 0,
                          (size_t)nthreads * per_thread};
  size_t floats = 0;
  for (int x = 0; x < 6; x++)
    floats += (part[x] + 15) / 16 * 16;
  float *ws = attn__cpu_workspace(ctx, floats * sizeof(float)), *at = ws;
  float *slot[6];
  for (int x = 0; x < 6; x++) {
    slot[x] = part[x] ? at : NULL;
    at += (part[x] + 15) / 16 * 16;
  }
  sh.dd = slot[0];
  sh.qt = slot[1];
  sh.doutt = slot[2];
  sh.dq = slot[3];
  sh.sg = slot[4];
  float *scratch = slot[5];
  sh.turn = malloc((size_t)(pb->heads_q * sh.qblocks + 1) * sizeof *sh.turn);
  sh.kblocks = (pb->seqlen_k + bc - 1) / bc;
  /* As many units per thread as the forward's splits ask for to even out
   * units of unequal length (the config's split_fill). */
  sh.by_head = pb->batch * pb->heads_kv >= (int64_t)cfg->split_fill * nthreads;
  const int db_shared = cpu_dbias_shared(pb);
  const int64_t bturns =
      db_shared ? (pb->dbias.sb ? pb->batch : 1) * (pb->dbias.sh ? pb->heads_kv : 1) * sh.kblocks
                : 0;
  sh.bturn = db_shared ? malloc((size_t)(bturns + 1) * sizeof *sh.bturn) : NULL;
  int rc = ATTN_OK;
  if (!qunits || !kunits || !sh.qblock0 || !ws || !sh.turn || (db_shared && !sh.bturn)) {
    rc = attn__error(ctx, ATTN_ENOMEM,
                     "cpu backward: cannot allocate D, Q^T, dO^T and the dQ accumulator (%lld "
                     "rows x %lld heads) or %d threads' tiles",
                     (long long)sh.total_q, (long long)pb->heads_q, nthreads);
  } else if ((pb->seqlen_k + bc - 1) / bc > INT_MAX) {
    /* The turn counters hold key block numbers in an int. */
    rc = attn__error(ctx, ATTN_EUNSUPPORTED,
                     "cpu backward: seqlen_k %lld has more key blocks than an int counts",
                     (long long)pb->seqlen_k);
  } else {
    for (int64_t b = 0; b < pb->batch; b++)
      sh.qblock0[b] = qunits[b] / pb->heads_q;
    for (int64_t x = 0; x < pb->heads_q * sh.qblocks; x++)
      atomic_init(&sh.turn[x], -1);
    for (int64_t x = 0; x < bturns; x++)
      atomic_init(&sh.bturn[x], -1);
    attn__debug("cpu backward: %lld key units, %lld query blocks on %d threads%s, dQ %s",
                (long long)kunits[pb->batch], (long long)qunits[pb->batch], nthreads,
                sh.by_head ? " (a sequence and kv head per unit)" : "",
                inplace ? "accumulated in place" : "in an f32 scratch");
    cpu_bwd_run(pb, &sh, cfg, qunits, kunits, scratch, nthreads, per_thread);
  }

  free(qunits);
  free(kunits);
  free(sh.qblock0);
  free(sh.turn);
  free(sh.bturn);
  return rc;
}
