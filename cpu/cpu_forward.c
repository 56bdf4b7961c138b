/*
 * CPU forward pass: FlashAttention's Algorithm 1 with the FlashAttention-2
 * loop order. One work unit is a tile of query rows (sequence b, a block of
 * rows of one query head, or of each of several heads: see
 * attn__cpu_schedule); its rows stay in the tile while the visible blocks
 * of Bc keys stream by:
 *
 *   S   = scale * Q K^T                      (sgemm; few rows: attn__cpu_qk_few)
 *   S   = softcap / ALiBi / window mask, + bias  (attn__cpu_scores)
 *   m_i = max(m_i, rowmax S), alpha = exp(m_old - m_i)
 *   P   = exp(S - m_i), l_i = alpha l_i + rowsum P
 *   O   = diag(alpha) O + P V                (sgemm; few rows: attn__cpu_pv_few)
 *
 * and finally the sink folded in (attn__sink_fold), O = O / l_i, lse = m_i +
 * log l_i. The score tile is kept transposed, S^T = K Q^T (keys down,
 * queries across), so that both products take their operands as stored or
 * transposed once per unit (see attn__cpu_load_t) and the softmax runs down
 * columns, vectorized across the queries. Only per-thread tiles are
 * allocated; nothing grows with Nq x Nk.
 *
 * Split keys (flash-decoding): when the tiles alone cannot occupy the
 * threads, a work item is (tile, part of its key blocks); each part leaves
 * its normalized output, running maximum and sum in the workspace, and a
 * last sweep merges each row's parts (attn__merge_parts) and then finishes
 * it as above.
 */
#include "cpu_internal.h"

#include <omp.h>
#include <stdlib.h>

/* Per-thread scratch, in floats, and the tiles' sizes. */
typedef struct cpu_fwd_tiles {
  int br, bc;   /* Br, Bc of the plan; Br is also the row stride of qt and st */
  float *qt;    /* d x Br: Q transposed */
  float *k;     /* Bc x d, when the rows must be gathered (attn__cpu_view_keys) */
  float *v;     /* Bc x d, idem */
  float *st;    /* Bc x Br: S^T, then P^T in place */
  float *o;     /* Br x d: unnormalized output */
  float *m;     /* Br: running row max m_i */
  float *l;     /* Br: running row sum l_i */
  float *alpha; /* Br */
  float *lse;   /* Br */
  float *lo;    /* Br: what rounding lse to float dropped (the (hi, lo) form) */
  float *w;     /* splits: the parts' weights of a row */
  /* bf16 products (cpu_bf16.c): */
  uint16_t *qb; /* Br x d: Q's rows in bf16 */
  uint32_t *qp; /* d/2 x Br: Q^T in pairs (the CPU's instruction) */
  uint16_t *kb; /* Bc x d: K, when gathered */
  uint16_t *vb; /* Bc x d: V, idem */
  /* P^T in bf16: (Bc + 1) x Br, rounded as it is (sbgemm) or in pairs of
   * rows (the CPU's instructions), row stride Br either way */
  void *pb;
  float *ot; /* d x Br: O^T, the bf16 products' accumulator */
} cpu_fwd_tiles;

/* What the work items share. A tile's rows: tile row x * nr + r is row i0
 * + r of query head h0 + x. */
typedef struct cpu_fwd_work {
  const attn__problem *pb;
  attn__cpu_schedule sc;
  int few_rows;                  /* the config's: see attn__cpu_qk_few */
  int64_t chunks;                /* tiles' head groups per kv head, or over all heads
                                  * when a tile spans kv heads (sc.heads > group) */
  const int64_t *units;          /* attn__cpu_units over (kv head, chunk) and rows */
  float *part_o;                 /* splits: [tile][part][Br][d], each part's normalized O */
  float *part_m, *part_l;        /* splits: [tile][part][Br] each, m and l */
  attn__cpu_bf16_kernel *kernel; /* ATTN__CPU_PRODUCTS_BF16's */
  uint16_t *vt;                  /* its V^T, or NULL (cpu_fwd_prepacks) */
  float *kf, *vf;                /* K and V in f32, or NULL (cpu_fwd_kvf_floats) */
  uint16_t *kh;                  /* K in bf16, or NULL (cpu_fwd_kh_floats) */
  int64_t kblocks;               /* key blocks of the capacity */
  size_t slot;                   /* bf16 elements of one key block's V^T */
} cpu_fwd_work;

static size_t cpu_fwd_thread_floats(const attn__problem *pb, const attn__cpu_config *cfg,
                                    const attn__cpu_schedule *sc) {
  const size_t d = (size_t)pb->head_dim, br = (size_t)cfg->br, bc = (size_t)cfg->bc;
  size_t floats = br * d * 2 + bc * d * 2 + br * bc + 5 * br + (size_t)sc->splits;
  floats = (floats + 15) / 16 * 16;
  if (sc->products != ATTN__CPU_PRODUCTS_F32) {
    /* qb, qp, kb, vb, pb, ot, each rounded up to a cache line. */
    const size_t halves = br * d * 2 + bc * d * 2 + br * (bc + 2) + br * d * 2 + 6 * 32;
    floats += (halves / 2 + 15) / 16 * 16;
  }
  return floats;
}

static size_t cpu_fwd_part_floats(const attn__problem *pb, const attn__cpu_config *cfg,
                                  const attn__cpu_schedule *sc) {
  if (sc->splits <= 1) return 0;
  return (size_t)sc->tiles * (size_t)sc->splits * (size_t)cfg->br * (size_t)(pb->head_dim + 2);
}

/* The CPU's bf16 instructions take O^T += V^T P^T (see
 * attn__cpu_bf16_pairs_f32), V^T in rows of keys: every key block of every
 * sequence and kv head is transposed once per call, before the tiles,
 * rather than once per tile that reads it (4 times a block at ViT's 197
 * rows, 64 at N = 4096). Slot (b, kb, hk) of d x Bcp bf16, Bcp = Bc rounded
 * up to even (in pairs: as many u32 as (Bc + 1) / 2 x d); the capacity's
 * blocks, as the plan sees shapes only. */
static int cpu_fwd_prepacks(const attn__cpu_config *cfg, const attn__cpu_schedule *sc) {
  return sc->products == ATTN__CPU_PRODUCTS_BF16 && sc->rows > cfg->few_rows;
}
static size_t cpu_fwd_slot_pairs(const attn__problem *pb, const attn__cpu_config *cfg) {
  return (size_t)(cfg->bc + 1) / 2 * (size_t)pb->head_dim;
}
static size_t cpu_fwd_vp_floats(const attn__problem *pb, const attn__cpu_config *cfg,
                                const attn__cpu_schedule *sc) {
  if (!cpu_fwd_prepacks(cfg, sc)) return 0;
  const size_t kblocks = (size_t)((pb->seqlen_k + cfg->bc - 1) / cfg->bc);
  return (size_t)pb->batch * kblocks * (size_t)pb->heads_kv * cpu_fwd_slot_pairs(pb, cfg);
}

/* K and V rows that the f32 products cannot read in place (f16 and bf16,
 * f32 rows that alias: see attn__cpu_keys_copied) are copied into f32
 * tiles, every key block once per tile that reads it: once per block of
 * query rows (16 times a block at N = 1024, which took 13 % of a bf16
 * forward on the build host and 10-12 % of an f32 one at H d = 2048 on the
 * VM, perf). Copied once per call instead, K then V, in slots laid out as
 * the pairs above (Bc x d floats each), when tiles would copy a block more
 * than once and the copy stays under CPU_FWD_CONVERT_MAX: a long context
 * copies per tile rather than double its memory. */
#define CPU_FWD_CONVERT_MAX ((size_t)256 << 20)
/* Elements of one such copy of K (or V): Bc x d a slot, the capacity's
 * blocks; 0 where each block is read once (a single tile of rows and of
 * heads per kv head). */
static size_t cpu_fwd_copy_elements(const attn__problem *pb, const attn__cpu_config *cfg,
                                    const attn__cpu_schedule *sc) {
  const int64_t group = pb->heads_q / pb->heads_kv;
  if (sc->rows <= cfg->few_rows || (pb->seqlen_q <= sc->rows && group <= sc->heads)) return 0;
  const size_t kblocks = (size_t)((pb->seqlen_k + cfg->bc - 1) / cfg->bc);
  return (size_t)pb->batch * kblocks * (size_t)pb->heads_kv * (size_t)cfg->bc *
         (size_t)pb->head_dim;
}
static size_t cpu_fwd_kvf_floats(const attn__problem *pb, const attn__cpu_config *cfg,
                                 const attn__cpu_schedule *sc) {
  if (sc->products != ATTN__CPU_PRODUCTS_F32) return 0;
  if (!attn__cpu_keys_copied(pb, &pb->k, cfg->bc) && !attn__cpu_keys_copied(pb, &pb->v, cfg->bc))
    return 0;
  const size_t floats = 2 * cpu_fwd_copy_elements(pb, cfg, sc);
  return floats * sizeof(float) <= CPU_FWD_CONVERT_MAX ? floats : 0;
}
/* The bf16 products read K's rows in place (V's come transposed, above)
 * but where their rows alias or are strided: K's bf16 rows copied once
 * per call then, under the same bound. In floats, rounded up. */
static size_t cpu_fwd_kh_floats(const attn__problem *pb, const attn__cpu_config *cfg,
                                const attn__cpu_schedule *sc) {
  if (sc->products == ATTN__CPU_PRODUCTS_F32 || !attn__cpu_keys_copied_bf16(pb, &pb->k, cfg->bc))
    return 0;
  const size_t halves = cpu_fwd_copy_elements(pb, cfg, sc);
  return halves * sizeof(uint16_t) <= CPU_FWD_CONVERT_MAX ? (halves + 1) / 2 : 0;
}

size_t attn__cpu_forward_workspace(const attn__problem *pb, const attn__cpu_config *cfg,
                                   const attn__cpu_schedule *sc, int nthreads) {
  return ((size_t)nthreads * cpu_fwd_thread_floats(pb, cfg, sc) + cpu_fwd_part_floats(pb, cfg, sc) +
          cpu_fwd_vp_floats(pb, cfg, sc) + cpu_fwd_kvf_floats(pb, cfg, sc) +
          cpu_fwd_kh_floats(pb, cfg, sc)) *
         sizeof(float);
}

/* n 16-bit elements from *p, which moves past them to the next cache line. */
static void *cpu_fwd_take(char **p, size_t n) {
  void *r = *p;
  *p += (n * 2 + 63) / 64 * 64;
  return r;
}

static cpu_fwd_tiles cpu_fwd_carve(float *base, int64_t d, const attn__cpu_config *cfg,
                                   const attn__cpu_schedule *sc) {
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
  t.w = t.lo + br;
  t.qb = NULL;
  t.qp = NULL;
  t.kb = t.vb = NULL;
  t.pb = NULL;
  t.ot = NULL;
  if (sc->products != ATTN__CPU_PRODUCTS_F32) {
    const size_t floats = br * d * 2 + bc * d * 2 + br * bc + 5 * br + (size_t)sc->splits;
    char *p = (char *)(base + (floats + 15) / 16 * 16);
    t.qb = cpu_fwd_take(&p, br * d);
    t.qp = cpu_fwd_take(&p, br * d);
    t.kb = cpu_fwd_take(&p, bc * d);
    t.vb = cpu_fwd_take(&p, bc * d);
    t.pb = cpu_fwd_take(&p, br * (bc + 2));
    t.ot = cpu_fwd_take(&p, br * d * 2);
  }
  return t;
}

/* Tile u's sequence, first head, heads, first row and rows. */
typedef struct cpu_fwd_tile {
  int64_t b, h0, hk, i0;
  int nh, nr;
} cpu_fwd_tile;

static cpu_fwd_tile cpu_fwd_find(const cpu_fwd_work *w, int64_t u) {
  const attn__problem *pb = w->pb;
  const int64_t group = pb->heads_q / pb->heads_kv, heads = w->sc.heads;
  cpu_fwd_tile x;
  int64_t hh;
  x.nr = attn__cpu_unit(pb, w->units, 0, w->sc.rows, u, &x.b, &hh, &x.i0);
  if (heads > group) {
    x.h0 = hh * heads;
    x.nh = (int)(pb->heads_q - x.h0 < heads ? pb->heads_q - x.h0 : heads);
  } else {
    const int64_t first = hh % w->chunks * heads;
    x.h0 = hh / w->chunks * group + first;
    x.nh = (int)(group - first < heads ? group - first : heads);
  }
  x.hk = x.h0 / group;
  return x;
}

/* A row's end: the sink joins its sum, then O = O / l, lse = m + log l; a
 * row that saw no key gets O = 0 and lse = -inf (or the sink). seen: whether
 * the mask lets the row see a key. */
static void cpu_fwd_finish(const attn__problem *pb, int64_t h, int seen, float m, float l,
                           float *orow, float *lse, float *lo) {
  const int d = (int)pb->head_dim;
  if (pb->has_sinks) {
    /* A row with no key (m = -inf, l = 0, O = 0) comes out with the sink
     * alone: factor 0, l = 1. */
    const float sink =
        ((const float *)((const char *)pb->sinks.native + pb->sinks.offset))[h * pb->sinks.sh];
    const float a = attn__sink_fold(sink, &m, &l);
    for (int c = 0; c < d; c++)
      orow[c] *= a;
  } else if (!attn__row_seen(seen, pb->has_bias, m, l)) {
    memset(orow, 0, (size_t)d * sizeof(float));
    attn__lse_split(-INFINITY, lse, lo);
    return;
  }
  /* The mask (or the bias) says whether the row saw a key, not l: a NaN or
   * inf among its scores leaves l NaN (or 0, when they are all -inf without
   * a bias), and such a row must come out NaN, not as a row that saw
   * nothing. */
  for (int c = 0; c < d; c++)
    orow[c] /= l;
  /* In double: one rounding instead of two (log, then the sum). */
  attn__lse_split(l > 0.0f ? (double)m + log((double)l) : NAN, lse, lo);
}

/* Part s of tile x's key blocks: blocks [*kb0, *kb1) of Bc keys, aligned to
 * Bc as the backward's (it recomputes each score tile with this very sgemm
 * call: see cpu_backward.c). Key blocks outside the keys the tile's rows
 * see are never touched (causal skips the upper triangle this way). */
static void cpu_fwd_part(const cpu_fwd_work *w, const cpu_fwd_tile *x, int bc, int s, int64_t nq,
                         int64_t nk, int64_t *kb0, int64_t *kb1) {
  int64_t jlo, jhi;
  attn__problem_key_block_range(w->pb, x->i0, x->i0 + x->nr, nq, nk, &jlo, &jhi);
  if (jlo >= jhi) {
    *kb0 = *kb1 = 0;
    return;
  }
  const int64_t first = jlo / bc, n = (jhi + bc - 1) / bc - first, parts = w->sc.splits;
  *kb0 = first + n * s / parts;
  *kb1 = first + n * (s + 1) / parts;
}

/* S^T = scale K Q^T of one key block in bf16 products: per head, as the
 * f32 path (and of the same shape). */
static void cpu_fwd_qk_bf16(const cpu_fwd_work *w, const cpu_fwd_tiles *t, const cpu_fwd_tile *x,
                            int products, int64_t j0, int bc) {
  const attn__problem *pb = w->pb;
  const int d = (int)pb->head_dim, ld = t->br, nr = x->nr;
  int ldk = d;
  const uint16_t *k =
      w->kh ? w->kh + (size_t)((x->b * w->kblocks + j0 / t->bc) * pb->heads_kv + x->hk) * t->bc * d
            : attn__cpu_view_keys_bf16(pb, &pb->k, x->b, j0, bc, x->hk, t->kb, &ldk);
  for (int hx = 0; hx < x->nh; hx++) {
    if (products == ATTN__CPU_PRODUCTS_BF16)
      w->kernel(bc, nr, d / 2, pb->scale, k, ldk, t->qp + hx * nr, ld, 0.0f, t->st + hx * nr, ld);
#if defined(ATTN_HAVE_SBGEMM)
    else
      attn__cpu_sbgemm(0, 1, bc, nr, d, pb->scale, k, ldk, t->qb + (size_t)hx * nr * d, d, 0.0f,
                       t->st + hx * nr, ld);
#endif
  }
}

/* O^T += V^T P^T of one key block in bf16 products: P rounded to bf16 (see
 * cpu_bf16.c), zero-padded to an even count of keys. */
static void cpu_fwd_pv_bf16(const cpu_fwd_work *w, const cpu_fwd_tiles *t, const cpu_fwd_tile *x,
                            int products, int64_t j0, int bc) {
  const attn__problem *pb = w->pb;
  const int d = (int)pb->head_dim, br = x->nh * x->nr, Br = t->br;
  if (products == ATTN__CPU_PRODUCTS_BF16) {
    const int bcp = (bc + 1) / 2 * 2, ldt = (t->bc + 1) / 2 * 2;
    const uint16_t *vt =
        w->vt + (size_t)((x->b * w->kblocks + j0 / t->bc) * pb->heads_kv + x->hk) * w->slot;
    w->kernel(d, br, bcp / 2, 1.0f, vt, ldt, t->pb, Br, 1.0f, t->ot, Br);
  }
#if defined(ATTN_HAVE_SBGEMM)
  else {
    int ldv;
    const uint16_t *v = attn__cpu_view_keys_bf16(pb, &pb->v, x->b, j0, bc, x->hk, t->vb, &ldv);
    attn__cpu_bf16_round(t->st, bc, br, Br, t->pb, Br);
    attn__cpu_sbgemm(1, 0, d, br, bc, 1.0f, v, ldv, t->pb, Br, 1.0f, t->ot, Br);
  }
#endif
}

/* Work item (tile u, part s). */
static void cpu_fwd_item(const cpu_fwd_work *w, const cpu_fwd_tiles *t, int64_t u, int s) {
  const attn__problem *pb = w->pb;
  const cpu_fwd_tile x = cpu_fwd_find(w, u);
  const int d = (int)pb->head_dim, ld = t->br, Bc = t->bc, nr = x.nr, br = x.nh * nr;
  const int64_t nq = attn__seq_q(pb, x.b), nk = attn__seq_k(pb, x.b);
  const int64_t rq = attn__row0_q(pb, x.b) + x.i0;
  int64_t kb0, kb1;
  cpu_fwd_part(w, &x, Bc, s, nq, nk, &kb0, &kb1);

  /* Few rows: Q as rows (d apart) for attn__cpu_qk_few; bf16 products: Q's
   * rows in bf16, and in pairs for the CPU's instruction; else Q^T. */
  const int few = nr <= w->few_rows;
  const int products = few ? ATTN__CPU_PRODUCTS_F32 : w->sc.products;
  for (int hx = 0; hx < x.nh; hx++)
    if (few) {
      attn__cpu_load(pb, &pb->q, x.b, rq, nr, x.h0 + hx, t->qt + (size_t)hx * nr * d, d);
    } else if (products != ATTN__CPU_PRODUCTS_F32) {
      uint16_t *qb = t->qb + (size_t)hx * nr * d;
      attn__cpu_load_bf16(pb, &pb->q, 0, x.b, rq, nr, x.h0 + hx, qb, d);
      if (products == ATTN__CPU_PRODUCTS_BF16)
        attn__cpu_bf16_pairs_t(qb, d, nr, d, t->qp + hx * nr, ld);
    } else {
      attn__cpu_load_t(pb, &pb->q, x.b, rq, nr, x.h0 + hx, t->qt + hx * nr, ld);
    }
  float *ot = few || products == ATTN__CPU_PRODUCTS_F32 ? NULL : t->ot;
  if (ot)
    memset(ot, 0, (size_t)ld * d * sizeof(float));
  else
    memset(t->o, 0, (size_t)br * d * sizeof(float));
  for (int r = 0; r < br; r++) {
    t->m[r] = -INFINITY;
    t->l[r] = 0.0f;
  }

  for (int64_t kb = kb0; kb < kb1; kb++) {
    const int64_t j0 = kb * Bc;
    const int bc = (int)(nk - j0 < Bc ? nk - j0 : Bc);
    int ldk = 0, ldv = 0;
    const float *k = NULL, *v = NULL;
    if (few) {
      attn__cpu_qk_few(pb, &pb->k, &pb->v, x.b, j0, bc, x.h0, x.nh, nr, t->qt, d, t->st, ld);
    } else if (products != ATTN__CPU_PRODUCTS_F32) {
      cpu_fwd_qk_bf16(w, t, &x, products, j0, bc);
    } else {
      if (w->kf) {
        const size_t at = (size_t)((x.b * w->kblocks + kb) * pb->heads_kv + x.hk) * Bc * d;
        k = w->kf + at;
        v = w->vf + at;
        ldk = ldv = d;
      } else {
        k = attn__cpu_view_keys(pb, &pb->k, x.b, j0, bc, x.hk, t->k, &ldk);
        v = attn__cpu_view_keys(pb, &pb->v, x.b, j0, bc, x.hk, t->v, &ldv);
      }
      /* One product per head, of the backward's shape: OpenBLAS rounds an
       * element of a product differently for different widths n (see
       * attn__cpu_qk_few), and the backward's P = exp(S - lse) needs the
       * forward's S to the bit. */
      for (int hx = 0; hx < x.nh; hx++)
        w->sc.gemm(0, 0, bc, nr, d, pb->scale, k, ldk, t->qt + hx * nr, ld, 0.0f, t->st + hx * nr,
                   ld);
    }
    for (int hx = 0; hx < x.nh; hx++)
      attn__cpu_scores(pb, x.b, x.h0 + hx, x.i0, nr, j0, bc, nq, nk, t->st + hx * nr, ld, NULL);
    /* The CPU's bf16 instructions take P in pairs, which the softmax
     * writes. */
    const int pairs = few ? t->pb && attn__cpu_few_pairs(pb) : products == ATTN__CPU_PRODUCTS_BF16;
    attn__cpu_softmax_cols(t->st, bc, br, ld, t->m, t->l, t->alpha,
                           pairs ? (uint32_t *)t->pb : NULL, ld);
    attn__cpu_rescale_o(ot, t->o, d, br, ld, t->alpha);
    if (few)
      attn__cpu_pv_few(pb, &pb->v, x.b, j0, bc, x.h0, x.nh, nr, t->st,
                       pairs ? (const uint32_t *)t->pb : NULL, ld, t->o);
    else if (products != ATTN__CPU_PRODUCTS_F32)
      cpu_fwd_pv_bf16(w, t, &x, products, j0, bc);
    else
      w->sc.gemm(1, 0, br, d, bc, 1.0f, t->st, ld, v, ldv, 1.0f, t->o, d);
  }

  if (ot)
    for (int r = 0; r < br; r++)
      for (int c = 0; c < d; c++)
        t->o[(size_t)r * d + c] = ot[(size_t)c * ld + r];

  if (w->sc.splits > 1) {
    /* The part's normalized O, m and l; (-inf, 0) (and O = 0) where the
     * row saw nothing here, NaN where its scores were NaN or inf. */
    const size_t slot = (size_t)u * (size_t)w->sc.splits + (size_t)s;
    float *po = w->part_o + slot * (size_t)t->br * (size_t)d;
    float *pm = w->part_m + slot * (size_t)t->br, *pl = w->part_l + slot * (size_t)t->br;
    for (int r = 0; r < br; r++) {
      const float m = t->m[r], l = t->l[r];
      const int none = m == -INFINITY && l == 0.0f;
      pm[r] = none || l > 0.0f ? m : NAN;
      pl[r] = l;
      for (int c = 0; c < d; c++)
        po[(size_t)r * d + c] = none ? 0.0f : t->o[(size_t)r * d + c] / l;
    }
    return;
  }

  for (int hx = 0; hx < x.nh; hx++)
    for (int r = 0; r < nr; r++) {
      const int y = hx * nr + r;
      int64_t lo, hi;
      attn__problem_key_range(pb, x.i0 + r, nq, nk, &lo, &hi);
      cpu_fwd_finish(pb, x.h0 + hx, lo < hi, t->m[y], t->l[y], t->o + (size_t)y * d, &t->lse[y],
                     &t->lo[y]);
    }
  for (int hx = 0; hx < x.nh; hx++) {
    attn__cpu_store(pb, &pb->o, x.b, rq, nr, x.h0 + hx, t->o + (size_t)hx * nr * d, d);
    if (pb->has_lse)
      attn__cpu_store_lse(pb, x.b, rq, nr, x.h0 + hx, t->lse + hx * nr, t->lo + hx * nr);
  }
}

/* O's row of a merge: orow = sum of w[s] os_s over the parts s (os_s =
 * po + s stride), vectorized over d. A part that saw nothing (w[s] = 0)
 * is left out: its O is 0. */
static ATTN__CPU_SIMD_CLONES void cpu_fwd_weigh(float *orow, const float *po, size_t stride,
                                                const float *w, int parts, int d) {
  for (int c = 0; c < d; c++)
    orow[c] = 0.0f;
  for (int s = 0; s < parts; s++) {
    if (w[s] == 0.0f) continue;
    const float ws = w[s], *os = po + (size_t)s * stride;
    for (int c = 0; c < d; c++)
      orow[c] += ws * os[c];
  }
}

/* The merge of head hx of tile u's parts: per row, the running maximum M
 * and sum of all its keys (attn__merge_parts) and O = sum w_s O_s, then the
 * row's end as without splitting. A head at a time, so that a tile of many
 * heads (decoding: every head of a sequence) spreads its merge over the
 * threads. */
static void cpu_fwd_merge(const cpu_fwd_work *w, const cpu_fwd_tiles *t, int64_t u, int hx) {
  const attn__problem *pb = w->pb;
  const cpu_fwd_tile x = cpu_fwd_find(w, u);
  if (hx >= x.nh) return;
  const int d = (int)pb->head_dim, parts = w->sc.splits, Br = t->br;
  const int64_t nq = attn__seq_q(pb, x.b), nk = attn__seq_k(pb, x.b);
  const int64_t rq = attn__row0_q(pb, x.b) + x.i0;
  const size_t slot = (size_t)u * (size_t)parts;
  const float *po = w->part_o + slot * (size_t)Br * (size_t)d;
  const float *pm = w->part_m + slot * (size_t)Br, *pl = w->part_l + slot * (size_t)Br;
  for (int r = 0; r < x.nr; r++) {
    const int y = hx * x.nr + r;
    float *orow = t->o + (size_t)y * d;
    float l;
    const float m = attn__merge_parts(pm + y, pl + y, Br, parts, t->w, &l);
    cpu_fwd_weigh(orow, po + (size_t)y * d, (size_t)Br * d, t->w, parts, d);
    int64_t lo, hi;
    attn__problem_key_range(pb, x.i0 + r, nq, nk, &lo, &hi);
    cpu_fwd_finish(pb, x.h0 + hx, lo < hi, m, l, orow, &t->lse[y], &t->lo[y]);
  }
  attn__cpu_store(pb, &pb->o, x.b, rq, x.nr, x.h0 + hx, t->o + (size_t)hx * x.nr * d, d);
  if (pb->has_lse)
    attn__cpu_store_lse(pb, x.b, rq, x.nr, x.h0 + hx, t->lse + hx * x.nr, t->lo + hx * x.nr);
}

int attn__cpu_forward(attn_context *ctx, const attn__problem *pb, const attn__cpu_config *cfg,
                      const attn__cpu_schedule *sc) {
  const int64_t group = pb->heads_q / pb->heads_kv;
  cpu_fwd_work w;
  w.pb = pb;
  w.sc = *sc;
  w.few_rows = cfg->few_rows;
  w.kernel = ((const attn__cpu_impl *)ctx->impl)->bf16_kernel;
  w.chunks = sc->heads > group ? (pb->heads_q + sc->heads - 1) / sc->heads
                               : (group + sc->heads - 1) / sc->heads;
  int64_t *units =
      attn__cpu_units(pb, 0, sc->heads > group ? w.chunks : pb->heads_kv * w.chunks, sc->rows);
  w.units = units;
  const int nthreads = attn__cpu_threads();
  const size_t per_thread = cpu_fwd_thread_floats(pb, cfg, sc);
  const size_t parts = cpu_fwd_part_floats(pb, cfg, sc);
  float *scratch = attn__cpu_workspace(ctx, attn__cpu_forward_workspace(pb, cfg, sc, nthreads));
  if (!units || !scratch) {
    free(units);
    return attn__error(ctx, ATTN_ENOMEM,
                       "cpu forward: cannot allocate %d threads' tiles and %zu bytes of parts",
                       nthreads, parts * sizeof(float));
  }
  w.part_o = scratch + (size_t)nthreads * per_thread;
  const size_t part_rows = (size_t)sc->tiles * (size_t)sc->splits * (size_t)cfg->br;
  w.part_m = w.part_o + part_rows * (size_t)pb->head_dim;
  w.part_l = w.part_m + part_rows;
  w.vt = cpu_fwd_prepacks(cfg, sc) ? (uint16_t *)(w.part_o + parts) : NULL;
  w.kblocks = (pb->seqlen_k + cfg->bc - 1) / cfg->bc;
  w.slot = 2 * cpu_fwd_slot_pairs(pb, cfg);
  const size_t kvf = cpu_fwd_kvf_floats(pb, cfg, sc);
  w.kf = kvf ? w.part_o + parts + cpu_fwd_vp_floats(pb, cfg, sc) : NULL;
  w.vf = kvf ? w.kf + kvf / 2 : NULL;
  w.kh = cpu_fwd_kh_floats(pb, cfg, sc)
             ? (uint16_t *)(w.part_o + parts + cpu_fwd_vp_floats(pb, cfg, sc) + kvf)
             : NULL;
  const int64_t tiles = units[pb->batch], items = tiles * sc->splits;
  attn__debug("cpu forward: %lld tiles of %d head(s) x %d rows, keys in %d part(s), on %d threads",
              (long long)tiles, sc->heads, sc->rows, sc->splits, nthreads);

#pragma omp parallel num_threads(nthreads)
  {
    const cpu_fwd_tiles t =
        cpu_fwd_carve(scratch + (size_t)omp_get_thread_num() * per_thread, pb->head_dim, cfg, sc);
    if (w.vt) {
      /* V^T, before any tile reads it (the loop's barrier). */
      const int64_t hkv = pb->heads_kv, slots = pb->batch * w.kblocks * hkv;
#pragma omp for schedule(dynamic, 8)
      for (int64_t x = 0; x < slots; x++) {
        const int64_t b = x / (w.kblocks * hkv), kb = x / hkv % w.kblocks, hk = x % hkv;
        const int64_t nk = attn__seq_k(pb, b), j0 = kb * cfg->bc;
        if (j0 >= nk) continue;
        const int bc = (int)(nk - j0 < cfg->bc ? nk - j0 : cfg->bc);
        int ldv;
        const uint16_t *v = attn__cpu_view_keys_bf16(pb, &pb->v, b, j0, bc, hk, t.vb, &ldv);
        attn__cpu_bf16_transpose(v, ldv, bc, (int)pb->head_dim, w.vt + (size_t)x * w.slot,
                                 (cfg->bc + 1) / 2 * 2);
      }
    }
    if (w.kf || w.kh) {
      /* K and V in f32, or K in bf16, before any tile reads them. */
      const int64_t hkv = pb->heads_kv, slots = pb->batch * w.kblocks * hkv;
      const size_t slot = (size_t)cfg->bc * (size_t)pb->head_dim;
#pragma omp for schedule(dynamic, 8)
      for (int64_t x = 0; x < slots; x++) {
        const int64_t b = x / (w.kblocks * hkv), kb = x / hkv % w.kblocks, hk = x % hkv;
        const int64_t nk = attn__seq_k(pb, b), j0 = kb * cfg->bc;
        if (j0 >= nk) continue;
        const int64_t bc = nk - j0 < cfg->bc ? nk - j0 : cfg->bc;
        if (w.kh) {
          attn__cpu_load_bf16(pb, &pb->k, 1, b, j0, bc, hk, w.kh + (size_t)x * slot, pb->head_dim);
        } else {
          attn__cpu_load_keys(pb, &pb->k, b, j0, bc, hk, w.kf + (size_t)x * slot, pb->head_dim);
          attn__cpu_load_keys(pb, &pb->v, b, j0, bc, hk, w.vf + (size_t)x * slot, pb->head_dim);
        }
      }
    }
#pragma omp for schedule(dynamic, 1)
    for (int64_t it = 0; it < items; it++)
      cpu_fwd_item(&w, &t, it / sc->splits, (int)(it % sc->splits));
    if (sc->splits > 1) {
      /* After the loop's barrier: every part is written. */
#pragma omp for schedule(dynamic, 1)
      for (int64_t m = 0; m < tiles * sc->heads; m++)
        cpu_fwd_merge(&w, &t, m / sc->heads, (int)(m % sc->heads));
    }
  }

  free(units);
  return ATTN_OK;
}
