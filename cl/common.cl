/*
 * Shared by every attention kernel (fwd.cl, bwd.cl) and prepended to each:
 * how an element of the input dtype becomes a float and back, so that the
 * passes run entirely in f32 whatever the storage type; where a sequence's
 * rows are; and the attention rules, each written once, under the names
 * every language uses (tests/rules_table.h): diag, key_range, query_range,
 * key_block_range, query_block_range, key_visible, score, score_grad; and
 * those of the KV cache and the score terms, named as src/rules.h and
 * cuda/common.cuh name them: seq_used, paged_row, load_any, row_seen,
 * sink_fold, sink_grad, and the merging of partial results (merge_max,
 * merge_scale).
 *
 * f16 goes through vload_half/vstore_half, which OpenCL C 1.2 has without
 * cl_khr_fp16; bf16 is the upper half of an f32, so it is a shift, rounded
 * to nearest even on the way out. No extension is needed for either.
 */
#ifndef DTYPE
#define DTYPE 0 /* storage type of q, k, v, o and the gradients: 0 f32, 1 f16, 2 bf16 */
#endif

/* The optional features a program is built with. Each is compiled in only
 * where a problem uses it, so the kernels of a problem without them are
 * exactly those without them; each adds its arguments at the end of the
 * kernels' lists, in this order (*_ARGS). */
#ifndef KV_USED
#define KV_USED 0 /* 1: seqused_k gives each sequence's used cache rows */
#endif
#ifndef PAGED
#define PAGED 0 /* 1: k and v are pages, found through a block table */
#endif
#ifndef HAS_BIAS
#define HAS_BIAS 0 /* 1: an additive bias, of dtype BIAS_DTYPE */
#endif
#ifndef BIAS_DTYPE
#define BIAS_DTYPE 0 /* the bias's dtype: 0 f32, 1 f16, 2 bf16 */
#endif
#ifndef HAS_SINKS
#define HAS_SINKS 0 /* 1: one sink logit per query head */
#endif

#ifndef NAN_FLAG
#define NAN_FLAG 0 /* 1: f32 on the tensor cores, whose NaN pass a scan's flag decides (mma.cl) */
#endif
#if NAN_FLAG
#define NAN_ARGS , __global const int *nans
#else
#define NAN_ARGS
#endif
#if KV_USED
/* used[used_o + b * used_sb]: sequence b's used rows; nnew rows appended
 * after them. */
#define KV_USED_ARGS , __global const int *used, long used_o, long used_sb, int nnew
#define KV_USED_VALS , used, used_o, used_sb, nnew
#else
#define KV_USED_ARGS
#define KV_USED_VALS
#endif
#if PAGED
/* Key row j of sequence b is row j % page_size of page
 * bt[bt_o + b * bt_sb + (j / page_size) * bt_ss], of num_pages. */
#define PAGED_ARGS \
  , __global const int *bt, long bt_o, long bt_sb, long bt_ss, int page_size, int num_pages
#else
#define PAGED_ARGS
#endif
#if HAS_BIAS
/* bias[bias_o + b * s0 + h * s1 + i * s2 + j * s3], a broadcast stride 0. */
#define BIAS_ARGS , __global const uchar *bias, long bias_o, long4 bias_s
#else
#define BIAS_ARGS
#endif
#if HAS_SINKS
/* sinks[sinks_o + h * sinks_sh] */
#define SINK_ARGS , __global const float *sinks, long sinks_o, long sinks_sh
#else
#define SINK_ARGS
#endif

/* RAW: an element's bits, for kernels that move elements without reading
 * them (the cache append, the decode kernel's tiles). */
#if DTYPE == 0
typedef float T;
typedef uint RAW;
#define LOAD(p, i) ((p)[i])
#define STORE(p, i, x) ((p)[i] = (x))
#elif DTYPE == 1
typedef half T;
typedef ushort RAW;
#define LOAD(p, i) vload_half((size_t)(i), (p))
#define STORE(p, i, x) vstore_half_rte((x), (size_t)(i), (p))
#else
typedef ushort T;
typedef ushort RAW;
#define LOAD(p, i) as_float((uint)(p)[i] << 16)
#define STORE(p, i, x) ((p)[i] = bf16_from_float(x))
#endif

/* Elements i .. i + 3 of p as a float4 (bwd.cl's staging of whole rows). */
#if DTYPE == 0
#define LOAD4(p, i) vload4(0, (p) + (i))
#elif DTYPE == 1
#define LOAD4(p, i) vload_half4(0, (p) + (i))
#else
#define LOAD4(p, i) as_float4(convert_uint4(vload4(0, (p) + (i))) << 16)
#endif

/* Round to nearest even, as the host's attn__f32_to_bf16(); NaN stays NaN. */
inline ushort bf16_from_float(float f) {
  uint u = as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (ushort)((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (ushort)(u >> 16);
}

/* The first row of head h of sequence b of a tensor passed as (buffer,
 * offset, strides) with strides (sb, ss, sh, sd) in s.s0..s3, r0 rows in. */
#define HEAD_ROWS(p, off, s, b, h, r0) ((p) + (off) + (b) * (s).s0 + (h) * (s).s2 + (r0) * (s).s1)

/* Sequence b's lengths and first rows. Varlen problems (cu_q, cu_k given)
 * take them from cu_seqlens; bshd ones have nq_all and nk_all rows per
 * sequence, from row 0 (the batch stride does the rest). */
typedef struct seq_info {
  int nq, nk; /* query and key rows */
  int q0, k0; /* first query and key row in the tensors */
  int qflat;  /* first query row counted over all sequences: where the rows' delta is */
} seq_info;

inline seq_info seq_info_of(__global const int *cu_q, __global const int *cu_k, int b, int nq_all,
                            int nk_all) {
  seq_info s;
  s.nq = nq_all;
  s.nk = nk_all;
  s.q0 = 0;
  s.k0 = 0;
  s.qflat = b * nq_all;
  if (cu_q) {
    s.q0 = s.qflat = cu_q[b];
    s.nq = cu_q[b + 1] - s.q0;
  }
  if (cu_k) {
    s.k0 = cu_k[b];
    s.nk = cu_k[b + 1] - s.k0;
  }
  return s;
}

/* A row's part when its keys are split (decode.cl, fwd.cl, fwd_rows.cl; merged by
 * split.cl): the unnormalized O at part_o[PART_ROW * HD + c], m_i and l_i
 * at part_ml[2 PART_ROW] and the float after, for part s of query row qrow
 * (counted over all sequences) of head h. A part keeps m_i and l_i rather
 * than its lse = m_i + log l_i: a float lse would round the row's maximum,
 * and every P of the backward pass with it, by up to half an ulp of the
 * logits (see lse_split). */
#define PART_ROW(s, h, heads, tq, qrow) (((long)(s) * (heads) + (h)) * (tq) + (qrow))

/* The forward kernels' (fwd.cl, fwd_rows.cl) arguments for a split. */
#ifndef SPLIT
#define SPLIT 0 /* 1: each row's keys split over nsplit work-groups, each writing a part */
#endif
#if SPLIT
#define SPLIT_ARGS , int nsplit, __global float *part_o, __global float *part_ml, int tq
#else
#define SPLIT_ARGS
#endif

/* Part split of nsplit's share of the keys [lo, hi) in tiles of tile keys:
 * [*j0, *jend), whole tiles counted from lo's, the last cut at hi; one part
 * (split 0 of 1) gets them all. */
inline void split_keys(int lo, int hi, int tile, int split, int nsplit, int *j0, int *jend) {
  const int first = lo / tile, ntiles = lo < hi ? (hi + tile - 1) / tile - first : 0;
  *j0 = (first + split * ntiles / nsplit) * tile;
  *jend = min((first + (split + 1) * ntiles / nsplit) * tile, hi);
}

/* A forward work-group's first query row r0, in blocks of ROWS rows, and
 * its part split of nsplit: dimension 0 runs every block of part 0, then of
 * part 1, and so on (without SPLIT, part 0 of 1). */
#if SPLIT
#define ROW_BLOCK(ROWS)                                                        \
  const int nblk = get_num_groups(0) / nsplit, split = get_group_id(0) / nblk; \
  const int r0 = get_group_id(0) % nblk * (ROWS)
#else
#define ROW_BLOCK(ROWS) const int split = 0, nsplit = 1, r0 = get_group_id(0) * (ROWS)
#endif

/* lse = m + ll (ll = log l) as the float pair (hi, lo): hi rounded, lo what
 * the rounding dropped (TwoSum, exact in float arithmetic). The backward
 * takes exp((s - hi) - lo), in which s - hi is exact near the row maximum:
 * a float lse alone would cost P up to half an ulp of lse (6e-4 at logits of
 * 1e4). */
inline float lse_split(float m, float ll, float *lo) {
  const float hi = m + ll, mb = hi - ll;
  *lo = (m - mb) + (ll - (hi - mb));
  return hi;
}

/* The softmax's exponential of a score, exp(x - m) with m the row's
 * maximum (or lse), as exp2 of one product: GPUs run exp2 as one
 * instruction where exp() is a range-reduced sequence several times as
 * long, and the forward's softmax issues as many instructions as its
 * products at small head dims. x - m is exact near the maximum, so the
 * product's rounding moves p by about an ulp of x - m: 1e-6 of p where
 * x - m = -16 and p = 1e-7. A macro, for float and float8. */
#define EXP_FROM(x, m) exp2(((x) - (m)) * M_LOG2E_F)

/* The rules. A window bound wl, wr of -1 is no bound; causal arrives as
 * wr = 0. Query row i of a sequence of nq rows and nk keys sits on key
 * diag(i): the last row on the last key. Ranges are [lo, hi), clamped to
 * the sequence and empty when lo >= hi. */
inline int diag(int i, int nq, int nk) {
  return i + nk - nq;
}

/* Whether key j is visible to the row whose diagonal is dg. */
inline int key_visible(int dg, int j, int wl, int wr) {
  return (wl < 0 || j >= dg - wl) && (wr < 0 || j <= dg + wr);
}

/* The keys visible to the row whose diagonal is dg. */
inline void key_range(int dg, int nk, int wl, int wr, int *lo, int *hi) {
  *lo = wl < 0 ? 0 : max(dg - wl, 0);
  *hi = wr < 0 ? nk : min(dg + wr + 1, nk);
}

/* The rows that see key j. */
inline void query_range(int j, int nq, int nk, int wl, int wr, int *lo, int *hi) {
  *lo = wr < 0 ? 0 : max(j - wr - (nk - nq), 0);
  *hi = wl < 0 ? nq : min(j + wl - (nk - nq) + 1, nq);
}

/* The keys visible to some row of [i0, i1): rows further down see further
 * right, so the first row gives the left end and the last the right. */
inline void key_block_range(int i0, int i1, int nq, int nk, int wl, int wr, int *lo, int *hi) {
  int a, z;
  key_range(diag(i0, nq, nk), nk, wl, wr, lo, &z);
  key_range(diag(i1 - 1, nq, nk), nk, wl, wr, &a, hi);
}

/* The keys every row of [i0, i1) sees: the last row's first and the first
 * row's last, as both ends grow with the row. A tile of keys inside them is
 * whole, no key of it hidden from any row: a test of two compares. */
inline void key_block_common(int i0, int i1, int nq, int nk, int wl, int wr, int *lo, int *hi) {
  int a, z;
  key_range(diag(i1 - 1, nq, nk), nk, wl, wr, lo, &z);
  key_range(diag(i0, nq, nk), nk, wl, wr, &a, hi);
}

/* The rows that see some key of [j0, j1), likewise from its two ends. */
inline void query_block_range(int j0, int j1, int nq, int nk, int wl, int wr, int *lo, int *hi) {
  int a, z;
  query_range(j0, nq, nk, wl, wr, lo, &z);
  query_range(j1 - 1, nq, nk, wl, wr, &a, hi);
}

/* The score's epilogue in the order the semantics give: scale, softcap,
 * ALiBi (dist = dg - j, the key's distance from the row's diagonal). t
 * receives tanh(dot * scale / softcap) for the backward pass (0 when softcap
 * is off). score_scaled takes x = dot * scale already formed, as
 * src/rules.h's attn__score_scaled does, for a kernel that shares that
 * product with a path without the epilogue. */
inline float score_scaled(float x, float softcap, float slope, int dist, float *t) {
  *t = 0.0f;
  if (softcap > 0.0f) {
    *t = tanh(x / softcap);
    x = softcap * *t;
  }
  return x - slope * fabs((float)dist);
}

inline float score(float dot, float scale, float softcap, float slope, int dist, float *t) {
  return score_scaled(dot * scale, softcap, slope, dist, t);
}

/* ds times d(score)/d(dot * scale): softcap's tanh contributes 1 - t^2. */
inline float score_grad(float ds, float t, float softcap) {
  return softcap > 0.0f ? ds * (1.0f - t * t) : ds;
}

/* The KV cache (src/rules.h: attn__seq_used, attn__key_row). Lengths and
 * block-table entries on the device are never checked on the host, so they
 * are clamped here: a bad one reads a wrong row, never outside the tensors. */

/* Sequence b's used cache rows (used: entry b at b * sb), clamped to
 * [0, cap - nnew], cap being the rows the sequence can hold and nnew the rows
 * appended in the same call. */
inline int seq_used(__global const int *used, long sb, int b, int cap, int nnew) {
  const int u = used[b * sb], hi = cap - nnew;
  return u < 0 ? 0 : u > hi ? hi : u;
}

/* Sequence b's key count: with a KV cache, its used rows (clamped) and
 * those appended. */
inline int seq_keys(seq_info seq, int b KV_USED_ARGS) {
#if KV_USED
  return seq_used(used + used_o, used_sb, b, seq.nk, nnew) + nnew;
#else
  return seq.nk;
#endif
}

/* The element offset of key row j of sequence b in a paged k or v with page
 * stride t_sb and row stride t_ss: row j % page_size of page
 * bt[b * bt_sb + (j / page_size) * bt_ss], clamped to [0, num_pages). */
inline long paged_row(__global const int *bt, long bt_sb, long bt_ss, int b, int j, int page_size,
                      int num_pages, long t_sb, long t_ss) {
  long page = bt[b * bt_sb + (j / page_size) * bt_ss];
  page = page < 0 ? 0 : page >= num_pages ? num_pages - 1 : page;
  return page * t_sb + (long)(j % page_size) * t_ss;
}

#if PAGED
/* A sequence's key rows in a paged k or v, for KEY_ROW. */
typedef struct key_pages {
  __global const int *bt;
  long bt_sb, bt_ss;
  int b, size, count;
} key_pages;
#define KEY_PAGES_PARAM , key_pages kpg
#define KEY_PAGES , kpg
/* The element offset of key row j in a tensor of strides s (sb, ss, ..). */
#define KEY_ROW(j, s) \
  paged_row(kpg.bt, kpg.bt_sb, kpg.bt_ss, kpg.b, (j), kpg.size, kpg.count, (s).s0, (s).s1)
#else
#define KEY_PAGES_PARAM
#define KEY_PAGES
#define KEY_ROW(j, s) ((j) * (s).s1)
#endif

/* A kernel's kp and vp, row 0 of key/value head hk of sequence b in k and v
 * (elements of type KT), from which KEY_ROW counts: paged, the rows are
 * found through the pages (kpg) alone. The kernel's arguments and locals
 * carry the names used here (PAGED_ARGS, seq, hk). */
#if PAGED
#define KV_HEADS(KT)                                                        \
  const key_pages kpg = {bt + bt_o, bt_sb, bt_ss, b, page_size, num_pages}; \
  __global const KT *kp = k + ko + hk * ks.s2;                              \
  __global const KT *vp = v + vo + hk * vs.s2
#else
#define KV_HEADS(KT)                                           \
  __global const KT *kp = HEAD_ROWS(k, ko, ks, b, hk, seq.k0); \
  __global const KT *vp = HEAD_ROWS(v, vo, vs, b, hk, seq.k0)
#endif

/* The decode kernels' arguments (decode.cl, decode_mma.cl: the host sets
 * them alike): the forward's tensors and terms, then the key splits, the
 * blocks of DR rows per key/value head, whether every K and V row is whole
 * 16-byte chunks (vec), and the parts' workspace (PART_ROW). */
#define DECODE_ARGS                                                                                \
  __global const T *q, long qo, long4 qs, __global const RAW *k, long ko, long4 ks,                \
      __global const RAW *v, long vo, long4 vs, __global T *o, long oo, long4 os,                  \
      __global float *lse, long lo_, long4 ls, __global const int *cu_q, __global const int *cu_k, \
      __global const float *alibi, int nq_all, int nk_all, int group, int d, float scale,          \
      float softcap, int wl, int wr, int nsplit, int nrb, int vec, __global float *part_o,         \
      __global float *part_ml, int tq KV_USED_ARGS PAGED_ARGS BIAS_ARGS SINK_ARGS

/* A decode work-group's block: row block rb of key split split, key/value
 * head hk of sequence b (nq rows, nk keys; heads query heads in all), its
 * rows w (rows_of) and the query rows [ilo, ihi) they span. The whole
 * group leaves past the sequence's rows, so no barrier is skipped. */
#define DECODE_BLOCK(w)                                                \
  const int rb = get_group_id(0) % nrb, split = get_group_id(0) / nrb; \
  const int hk = get_group_id(1), b = get_group_id(2);                 \
  const int heads = group * get_num_groups(1);                         \
  const seq_info seq = seq_info_of(cu_q, cu_k, b, nq_all, nk_all);     \
  const int nq = seq.nq, nk = seq_keys(seq, b KV_USED_VALS);           \
  if (rb * DR >= group * nq) return;                                   \
  int ilo, ihi;                                                        \
  const rows w = rows_of(rb, hk, group, nq, &ilo, &ihi)

/* A decode kernel's column c of query row i of head h, from the
 * work-group's O accumulator a, max mr and sum lr over its keys: the row
 * ended (row_end_at) into o, and lse by column 0, where the keys were not
 * split; else its part for split.cl. The kernel's arguments and locals
 * carry the names used here (DECODE_ARGS, b, seq, nq, nk, split, heads). */
#define DECODE_OUT(i, h, c, a, mr, lr)                                                           \
  do {                                                                                           \
    if (nsplit == 1) {                                                                           \
      float div_, hi_, lo2_;                                                                     \
      const float fold_ = row_end_at(i, nq, nk, wl, wr, SINK_OF(h), mr, lr, &div_, &hi_, &lo2_); \
      __global T *op_ = HEAD_ROWS(o, oo, os, b, h, seq.q0 + (i));                                \
      STORE(op_, (c)*os.s3, (a)*fold_ / div_);                                                   \
      if (lse && (c) == 0) {                                                                     \
        __global float *lp_ = HEAD_ROWS(lse, lo_, ls, b, h, seq.q0 + (i));                       \
        lp_[0] = hi_;                                                                            \
        if (ls.s3) lp_[ls.s3] = lo2_;                                                            \
      }                                                                                          \
    } else {                                                                                     \
      const long pr_ = PART_ROW(split, h, heads, tq, seq.qflat + (i));                           \
      part_o[pr_ * HD + (c)] = (a);                                                              \
      if ((c) == 0) {                                                                            \
        part_ml[2 * pr_] = (mr);                                                                 \
        part_ml[2 * pr_ + 1] = (lr);                                                             \
      }                                                                                          \
    }                                                                                            \
  } while (0)

/* A decode work-group's rows: decode.cl's a power of two up to NTD,
 * decode_mma.cl's 16. */
#ifndef DR
#define DR 8
#endif

/* What a work-group's rows are: row rr is query row ri[rr] of head hh[rr],
 * valid when rr < nr. */
typedef struct rows {
  int nr;
  int ri[DR], hh[DR];
} rows;

/* Row rr of block rb of the group * nq rows of key/value head hk,
 * head-major: row rho = rb DR + rr is query row *i = rho % nq of head *h =
 * hk * group + rho / nq (past the last row, the last row's). */
inline void row_of(int rb, int rr, int hk, int group, int nq, int *i, int *h) {
  const int rho = min(rb * DR + rr, group * nq - 1);
  *i = rho % nq;
  *h = hk * group + rho / nq;
}

/* The work-group's rows: block rb's (row_of); and the query rows [*ilo,
 * *ihi) they span. */
inline rows rows_of(int rb, int hk, int group, int nq, int *ilo, int *ihi) {
  rows w;
  const int rho0 = rb * DR, all = group * nq;
  w.nr = min(DR, all - rho0);
  for (int rr = 0; rr < DR; ++rr)
    row_of(rb, rr, hk, group, nq, &w.ri[rr], &w.hh[rr]);
  const int last = rho0 + w.nr - 1;
  if (last / nq != rho0 / nq) {
    *ilo = 0;
    *ihi = nq;
  } else {
    *ilo = rho0 % nq;
    *ihi = last % nq + 1;
  }
  return w;
}

/* The forward kernels' arguments (fwd.cl, fwd_rows.cl, fwd_mma.cl: the
 * host sets them alike). */
#define FWD_ARGS                                                                                   \
  __global const T *q, long qo, long4 qs, __global const T *k, long ko, long4 ks,                  \
      __global const T *v, long vo, long4 vs, __global T *o, long oo, long4 os,                    \
      __global float *lse, long lo_, long4 ls, __global const int *cu_q, __global const int *cu_k, \
      __global const float *alibi, int nq_all, int nk_all, int group, int d, float scale,          \
      float softcap, int wl,                                                                       \
      int wr NAN_ARGS KV_USED_ARGS PAGED_ARGS BIAS_ARGS SINK_ARGS SPLIT_ARGS

/* A forward work-group's block of ROWS query rows (ROW_BLOCK) of head h of
 * sequence b, with nq rows and nk keys; qp, kp and vp (KV_HEADS); with a
 * bias, its (sequence, head) at bias_h (row i, key j: + i s2 + j s3). The
 * whole group leaves past the sequence's rows, so no barrier is skipped. */
#if HAS_BIAS
#define BIAS_HEAD const long bias_h = bias_o + b * bias_s.s0 + h * bias_s.s1
#else
#define BIAS_HEAD (void)0
#endif
#define FWD_BLOCK(ROWS)                                            \
  const int b = get_group_id(2), h = get_group_id(1);              \
  ROW_BLOCK(ROWS);                                                 \
  const seq_info seq = seq_info_of(cu_q, cu_k, b, nq_all, nk_all); \
  const int nq = seq.nq, nk = seq_keys(seq, b KV_USED_VALS);       \
  if (r0 >= nq) return;                                            \
  const int hk = h / group;                                        \
  __global const T *qp = HEAD_ROWS(q, qo, qs, b, h, seq.q0);       \
  KV_HEADS(T);                                                     \
  BIAS_HEAD

/* A dQ work-group's block of ROWS query rows of head h of sequence b (of
 * the launch's first sequence and head b0, h0 where dbias sums over them),
 * with nq rows and nk keys; ALiBi's slope, the bias's (sequence, head) at
 * bias_h, and dbias's rows at dbp (DBIAS 1) or the work-group's slot of
 * row-block sums (DBIAS 2). The whole group leaves past the sequence's
 * rows, so no barrier is skipped. */
#if DBIAS
#define DQ_HEAD const int b = get_group_id(2) + b0, h = get_group_id(1) + h0
#else
#define DQ_HEAD const int b = get_group_id(2), h = get_group_id(1)
#endif
#if DBIAS == 1
#define DBIAS_ROWS __global float *dbp = dbias + dbias_o + b * dbias_s.s0 + h * dbias_s.s1
#elif DBIAS == 2
#define DBIAS_ROWS                                                                          \
  __global float *dbp = part + PART_SLOT(get_group_id(0), get_group_id(1), get_group_id(2), \
                                         get_num_groups(0), get_num_groups(1))
#else
#define DBIAS_ROWS (void)0
#endif
#define DQ_BLOCK(ROWS)                                             \
  DQ_HEAD, i0 = get_group_id(0) * (ROWS);                          \
  const seq_info seq = seq_info_of(cu_q, cu_k, b, nq_all, nk_all); \
  const int nq = seq.nq, nk = seq.nk;                              \
  if (i0 >= nq) return;                                            \
  const int hk = h / group;                                        \
  const float slope = alibi ? alibi[h] : 0.0f;                     \
  BIAS_HEAD;                                                       \
  DBIAS_ROWS

/* The score terms after the epilogue: an additive bias (score += bias,
 * after scale, softcap and ALiBi) and attention sinks. */

/* Element i of a bias in any float dtype (attn_dtype's codes: 0 f32, 1 f16,
 * 2 bf16), as a float; a kernel passes a compile-time dtype, which folds the
 * choice away. */
inline float load_any(__global const uchar *base, int dtype, long i) {
  if (dtype == 1) return vload_half((size_t)i, (__global const half *)base);
  if (dtype == 2) return as_float((uint)((__global const ushort *)base)[i] << 16);
  return ((__global const float *)base)[i];
}

/* Elements i, i + s, .., i + 7 s of the same, as a float8: one vector load
 * where s is 1. */
inline float8 load_any8(__global const uchar *base, int dtype, long i, long s) {
  if (s == 1) {
    if (dtype == 1) return vload_half8(0, (__global const half *)base + i);
    if (dtype == 2)
      return as_float8(convert_uint8(vload8(0, (__global const ushort *)base + i)) << 16);
    return vload8(0, (__global const float *)base + i);
  }
  float x[8];
  for (int e = 0; e < 8; ++e)
    x[e] = load_any(base, dtype, i + e * s);
  return vload8(0, x);
}

/* The bias (of dtype BIAS_DTYPE) of query row r, key kj of the rows at
 * bias_h; 0 past the sequence's nq rows or nk keys, unread. */
inline float bias_at(__global const uchar *bias, long bias_h, long4 s, int r, int kj, int nq,
                     int nk) {
  return r < nq && kj < nk ? load_any(bias, BIAS_DTYPE, bias_h + r * s.s2 + kj * s.s3) : 0.0f;
}

/* Whether a row saw a key: the mask says so (seen), and with a bias a row
 * whose scores were all -inf (its max m still -inf) saw none. The kernels'
 * running max skips NaN (fmax), so they pass m as NaN where the row's sum is
 * NaN: such a row saw a NaN score and is NaN, not empty. */
inline int row_seen(int seen, int has_bias, float m) {
  return seen && !(has_bias && m == -INFINITY);
}

/* Folds a sink logit into a row's final max m and sum l (l = sum of
 * exp(s - m)), as attn__sink_fold: afterwards lse = m + log(l), and the
 * output accumulator, taken relative to the old m, is multiplied by the
 * returned factor before dividing by l. A row with no key (m = -inf, l = 0)
 * gets m = sink, l = 1, factor 0: o = 0 and lse = sink. NaN in l stays. */
inline float sink_fold(float sink, float *m, float *l) {
  const float mn = *m > sink ? *m : sink;
  const float a = *m == -INFINITY ? 0.0f : exp(*m - mn);
  *l = *l * a + exp(sink - mn);
  *m = mn;
  return a;
}

/* A row's term of d(loss)/d(sink) (attn__sink_grad): the sink's
 * probability exp(sink - lse) times -D, D = rowsum(dO * O). */
inline float sink_grad(float sink, float lse, float dsum) {
  return lse == -INFINITY ? 0.0f : -exp(sink - lse) * dsum;
}

/* Merging partial results (o_s, lse_s) of one row, each over a part of its
 * keys (attn__merge_lse): with m the largest lse_s, the row ends as one pass
 * over all the keys would, with sum l = sum_s exp(lse_s - m) and output
 * accumulator sum_s exp(lse_s - m) o_s. merge_max takes m one part further
 * (start from -inf); a NaN part makes it NaN for good. merge_scale is a
 * part's exp(lse_s - m): 0 for a part with no key, and for all of them when
 * every part is -inf (the row then has l = 0, o = 0, lse = -inf). */
inline float merge_max(float m, float lse_s) {
  return (m != m || lse_s != lse_s) ? NAN : fmax(m, lse_s);
}

inline float merge_scale(float lse_s, float m) {
  return m == -INFINITY ? 0.0f : exp(lse_s - m);
}

/* A row's end, from its max m and sum l over the keys it saw (seen: the
 * mask let it see one): o = acc * (returned factor) / *div, and lse as the
 * pair (*hi, *lo) (lse_split). With sinks, the sink joins the denominator,
 * so every row has an lse, a row without keys the sink's alone. Without,
 * a row that saw no key has o = 0 and lse = -inf, and one whose sum is 0
 * or NaN though it saw keys (infinite or NaN scores) is NaN. */
inline float row_end(float m, float l, int seen, float sink, float *div, float *hi, float *lo) {
#if HAS_SINKS
  const float a = sink_fold(sink, &m, &l);
  *div = l;
  *hi = lse_split(m, log(l), lo);
  return a;
#else
  seen = row_seen(seen, HAS_BIAS, l != l ? NAN : m);
  *div = seen ? l : 1.0f;
  *lo = 0.0f;
  *hi = !seen ? -INFINITY : l > 0.0f ? lse_split(m, log(l), lo) : (*lo = NAN);
  return seen ? 1.0f : 0.0f;
#endif
}

/* row_end for row i of a sequence of nq rows over nk keys, which saw a key
 * when the window let it. */
inline float row_end_at(int i, int nq, int nk, int wl, int wr, float sink, float m, float l,
                        float *div, float *hi, float *lo) {
  int klo, khi;
  key_range(diag(i, nq, nk), nk, wl, wr, &klo, &khi);
  return row_end(m, l, klo < khi, sink, div, hi, lo);
}

/* Query head h's sink in a kernel that takes SINK_ARGS; 0 without sinks. */
#if HAS_SINKS
#define SINK_OF(h) sinks[sinks_o + (h)*sinks_sh]
#else
#define SINK_OF(h) 0.0f
#endif

/* Work-group (x, y, z)'s slot in DBIAS 2's partial buffer, for a launch of
 * a dQ kernel (bwd.cl's or bwd_rows.cl's) with nx x ny x .. work-groups:
 * nk_all floats each. */
#define PART_SLOT(x, y, z, nx, ny) ((((long)(z) * (ny) + (y)) * (nx) + (x)) * nk_all)

/* Rows as float8s, for the CPU-shaped kernels (fwd_rows.cl, bwd_rows.cl),
 * which keep a row of the head dimension in NV registers of 8 floats.
 * ROWS_PROGRAM: this program is theirs (launch.c gives RB to CPU-class
 * programs only); the other programs compile these helpers unused. */
#ifdef RB
#define ROWS_PROGRAM 1
#else
#define ROWS_PROGRAM 0
#endif
#ifndef HD
#define HD 64 /* the head dimension rounded up: 32, 64, then a multiple of 32 */
#endif
#define NV (HD / 8) /* float8s per row, a multiple of 4 */
#ifndef RB
#define RB 32 /* query rows per work-item, a multiple of 16 */
#endif
#ifndef KB
#define KB 32 /* keys per tile, a multiple of 16 */
#endif

/* Eight float8s of the same element type: chunk c of a row as f32. */
#if DTYPE == 0
#define VLOAD8(c, p) vload8((c), (p))
#elif DTYPE == 1
#define VLOAD8(c, p) vload_half8((c), (p))
#else
#define VLOAD8(c, p) as_float8(convert_uint8(vload8((c), (p))) << 16)
#endif

/* A row of d columns of stride sd at p, as NV float8s zero past d. */
inline void load_row(float8 *dst, __global const T *p, long sd, int d) {
  if (sd == 1 && d == HD) {
    for (int c = 0; c < NV; ++c)
      dst[c] = VLOAD8(c, p);
    return;
  }
  for (int c = 0; c < NV; ++c) {
    float x[8];
    for (int e = 0; e < 8; ++e) {
      const int col = c * 8 + e;
      x[e] = col < d ? LOAD(p, col * sd) : 0.0f;
    }
    dst[c] = vload8(0, x);
  }
}

/* The 8 x 8 block r[0..7] (rows, 8 columns each) transposed into t[0..7]:
 * t[c] holds column c of the eight rows. Unrolled, so that a and b stay in
 * registers (PoCL kept the loops, and a and b on the stack). */
inline void transpose8(float8 *t, const float8 *r) {
  float8 a[8], b[8];
#pragma unroll
  for (int p = 0; p < 4; ++p) {
    const float8 x = r[2 * p], y = r[2 * p + 1];
    a[2 * p] = (float8)(x.s0, y.s0, x.s1, y.s1, x.s4, y.s4, x.s5, y.s5);
    a[2 * p + 1] = (float8)(x.s2, y.s2, x.s3, y.s3, x.s6, y.s6, x.s7, y.s7);
  }
#pragma unroll
  for (int p = 0; p < 2; ++p)
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      const float8 x = a[4 * p + u], y = a[4 * p + 2 + u];
      b[4 * p + 2 * u] = (float8)(x.s01, y.s01, x.s45, y.s45);
      b[4 * p + 2 * u + 1] = (float8)(x.s23, y.s23, x.s67, y.s67);
    }
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    t[c] = (float8)(b[c].lo, b[4 + c].lo);
    t[c + 4] = (float8)(b[c].hi, b[4 + c].hi);
  }
}

/* n rows r0.. of a [.., HD] operand into x[0 .. m - 1], zero past n. */
inline void load_block(float8 (*x)[NV], int m, __global const T *p, long4 s, int r0, int n, int d) {
  for (int i = 0; i < m; ++i)
    if (i < n) {
      load_row(x[i], p + (r0 + i) * s.s1, s.s3, d);
    } else {
      for (int c = 0; c < NV; ++c)
        x[i][c] = 0.0f;
    }
}

/* Rows j0 .. j0 + n of a [.., HD] operand transposed, 8 rows to a float8:
 * yt[c * ng + g] holds column c of rows 8g .. 8g + 7 (g < ng), zero past n:
 * K^T and V^T of a key block, or Q^T and dO^T of a row block. */
inline void stage_t(float8 *yt, int ng, __global const T *p, long4 s, int j0, int n, int d) {
  for (int g = 0; g < ng; ++g) {
    float8 r[8][NV];
    load_block(r, 8, p, s, j0 + 8 * g, n - 8 * g, d);
    for (int c = 0; c < NV; ++c) {
      float8 x[8], t[8];
      for (int u = 0; u < 8; ++u)
        x[u] = r[u][c];
      transpose8(t, x);
      for (int u = 0; u < 8; ++u)
        yt[(8 * c + u) * ng + g] = t[u];
    }
  }
}

/* The keys each n rows (8 or VW) all see, [glo[g], ghi[g]), from each
 * row's [klo, khi): where a run of n rows at one key needs no mask. */
inline void rows_common_keys(const int *klo, const int *khi, int n, int *glo, int *ghi) {
  for (int g = 0; g < RB / n; ++g) {
    glo[g] = klo[n * g];
    ghi[g] = khi[n * g];
    for (int e = 1; e < n; ++e) {
      glo[g] = max(glo[g], klo[n * g + e]);
      ghi[g] = min(ghi[g], khi[n * g + e]);
    }
  }
}

#if HAS_BIAS
/* The bias (of dtype BIAS_DTYPE, rows at bias_h) of query rows r0 .. r0 +
 * RB - 1 and keys j0 .. j0 + KB - 1 as f32, transposed: bt[j][i], zero
 * from row nq and key jn on, unread there. Read along the keys, 8 x 8 at a
 * time, for the kernels whose scores are S^T: a bias read down the rows
 * costs a load a score. The whole blocks' loads and stores unrolled, as
 * transpose8's loops: PoCL left them loops over arrays on the stack, and
 * the staging cost a full bias most of its time beside the products. */
inline void stage_bias_t(float (*bt)[RB], __global const uchar *bias, long bias_h, long4 s, int r0,
                         int nq, int j0, int jn) {
  for (int g = 0; g < RB / 8; ++g)
    for (int jb = 0; jb < KB; jb += 8) {
      const int i = r0 + 8 * g, j = j0 + jb, whole = i + 8 <= nq && j + 8 <= jn;
      float8 r[8], t[8];
      if (whole && s.s3 == 1) {
#pragma unroll
        for (int u = 0; u < 8; ++u)
          r[u] = load_any8(bias, BIAS_DTYPE, bias_h + (i + u) * s.s2 + j, 1);
      } else {
        for (int u = 0; u < 8; ++u) {
          const long at = bias_h + (i + u) * s.s2 + j * s.s3;
          if (whole) {
            r[u] = load_any8(bias, BIAS_DTYPE, at, s.s3);
          } else {
            float x[8];
            for (int e = 0; e < 8; ++e)
              x[e] = i + u < nq && j + e < jn ? load_any(bias, BIAS_DTYPE, at + e * s.s3) : 0.0f;
            r[u] = vload8(0, x);
          }
        }
      }
      transpose8(t, r);
#pragma unroll
      for (int u = 0; u < 8; ++u)
        vstore8(t[u], g, bt[jb + u]);
    }
}

/* The bias of rows r0 .. r0 + RB - 1 at keys j .. j + KB - 1 (none from
 * key jn on) asked of the caches, a line at a time, in CPU-class programs
 * whose compiler has a prefetch (PoCL's clang: its prefetch() emits
 * nothing): the rows lie a bias row apart, more streams than a CPU's
 * prefetchers follow, and stage_bias_t stalled on them. A tile ahead, so
 * that they land under that tile's products. The address goes through an
 * integer: a CPU's address spaces are one, and a compiler may refuse a
 * __global pointer where the builtin takes a plain one (NVIDIA's does). */
inline void prefetch_bias_t(__global const uchar *bias, long bias_h, long4 s, int r0, int nq, int j,
                            int jn) {
#if ROWS_PROGRAM && defined(__has_builtin)
#if __has_builtin(__builtin_prefetch)
  const int eb = BIAS_DTYPE == 0 ? 4 : 2, bytes = min(KB, jn - j) * eb;
  if (s.s3 != 1 || bytes <= 0) return;
  for (int u = 0; u < RB && r0 + u < nq; ++u) {
    __global const uchar *p = bias + (bias_h + (r0 + u) * s.s2 + j) * eb;
    for (int o = 0; o < bytes; o += 64)
      __builtin_prefetch((const void *)(size_t)(p + o));
  }
#endif
#endif
}
#endif

/* The sum of the lanes. */
inline float lane_sum(float8 x) {
  const float4 a = x.lo + x.hi;
  const float2 b = a.lo + a.hi;
  return b.s0 + b.s1;
}

/* The largest lane, NaN skipped (fmax), as fwd.cl's running max. */
inline float lane_max(float8 x) {
  const float4 a = fmax(x.lo, x.hi);
  const float2 b = fmax(a.lo, a.hi);
  return fmax(b.s0, b.s1);
}

/* The products' vectors: VW floats (cl/plan.c: 16 where the device's SIMD
 * holds 16, as AVX-512 does, and the tiles divide into them; else 8), GV
 * float8s of a row block or of a row each. */
#ifndef VW
#define VW 8
#endif
#if VW == 16
typedef float16 floatv;
#define VLOADV(p) vload16(0, (const float *)(p))
#define VSTOREV(x, p) vstore16((x), 0, (float *)(p))
#else
typedef float8 floatv;
#define VLOADV(p) vload8(0, (const float *)(p))
#define VSTOREV(x, p) vstore8((x), 0, (float *)(p))
#endif
#define GV (VW / 8)

/* out[a][8g .. 8g + 7] = row a of xf (rows of HD floats) . columns 8g ..
 * 8g + 7 of yt (HD rows of ldy float8s) for a < na, a multiple of 4, and
 * g < ng, a multiple of 2 GV: 4 rows x 2 vectors at a time, each an FMA
 * per column in column order from 0, as bwd.cl computes S too. The order
 * makes S = Q K^T (xf Q's rows, yt K^T) and S^T = K Q^T (xf K's rows, yt
 * Q^T) the same numbers: the forward's S and the backward's must be
 * bit-identical, or exp(S - lse) amplifies the difference where the logits
 * are large. */
inline void dot_products(float *out, int ldo, const float *xf, const float8 *yt, int ldy, int na,
                         int ng) {
  for (int a = 0; a < na; a += 4) {
    const float *x = xf + a * HD;
    for (int g = 0; g < ng; g += 2 * GV) {
      floatv a0 = 0.0f, a1 = 0.0f, a2 = 0.0f, a3 = 0.0f, a4 = 0.0f, a5 = 0.0f, a6 = 0.0f, a7 = 0.0f;
      for (int c = 0; c < HD; ++c) {
        const floatv y0 = VLOADV(yt + c * ldy + g), y1 = VLOADV(yt + c * ldy + g + GV);
        const floatv x0 = (floatv)(x[c]), x1 = (floatv)(x[HD + c]), x2 = (floatv)(x[2 * HD + c]),
                     x3 = (floatv)(x[3 * HD + c]);
        a0 = fma(x0, y0, a0);
        a1 = fma(x0, y1, a1);
        a2 = fma(x1, y0, a2);
        a3 = fma(x1, y1, a3);
        a4 = fma(x2, y0, a4);
        a5 = fma(x2, y1, a5);
        a6 = fma(x3, y0, a6);
        a7 = fma(x3, y1, a7);
      }
      float *o = out + a * ldo + 8 * g;
      VSTOREV(a0, o);
      VSTOREV(a1, o + VW);
      VSTOREV(a2, o + ldo);
      VSTOREV(a3, o + ldo + VW);
      VSTOREV(a4, o + 2 * ldo);
      VSTOREV(a5, o + 2 * ldo + VW);
      VSTOREV(a6, o + 3 * ldo);
      VSTOREV(a7, o + 3 * ldo + VW);
    }
  }
}

/* S = Q K^T of RB rows (xf) and the first kn keys of K^T (8 keys to a
 * float8), into out[RB][KB]; keys rounded up to 2 vectors. */
inline void rows_dot_keys(float (*out)[KB], const float *xf, float8 (*yt)[KB / 8], int kn) {
  dot_products(&out[0][0], KB, xf, &yt[0][0], KB / 8, RB, (kn + 16 * GV - 1) / (16 * GV) * 2 * GV);
}

/* S^T = K Q^T of the first kn keys (xf, K's rows) and RB rows of Q^T (8
 * rows to a float8), into out[KB][RB]; keys rounded up to 4. */
inline void keys_dot_rows(float (*out)[RB], const float *xf, float8 (*yt)[RB / 8], int kn) {
  dot_products(&out[0][0], RB, xf, &yt[0][0], RB / 8, (kn + 3) & ~3, RB / 8);
}

/* acc[a] += sum over b < nb of w[a * wa + b * wb] * x[b] for a < na, na
 * even (w is zero where a or b runs past the data): 2 rows of acc x 4
 * vectors at a time, b in order: the forward's P V and the backward's dQ
 * sum over the keys, dV and dK over the query rows (w[i][j] read down a
 * column). */
inline void sum_products(float8 (*acc)[NV], int na, const float *w, int wa, int wb, float8 (*x)[NV],
                         int nb) {
  for (int a = 0; a < na; a += 2)
    for (int c = 0; c < NV; c += 4 * GV) {
      float8 *r0 = acc[a] + c, *r1 = acc[a + 1] + c;
      floatv a0 = VLOADV(r0), a1 = VLOADV(r0 + GV), a2 = VLOADV(r0 + 2 * GV),
             a3 = VLOADV(r0 + 3 * GV);
      floatv a4 = VLOADV(r1), a5 = VLOADV(r1 + GV), a6 = VLOADV(r1 + 2 * GV),
             a7 = VLOADV(r1 + 3 * GV);
      for (int b = 0; b < nb; ++b) {
        const floatv w0 = w[a * wa + b * wb], w1 = w[(a + 1) * wa + b * wb];
        const float8 *y = x[b] + c;
        const floatv y0 = VLOADV(y), y1 = VLOADV(y + GV), y2 = VLOADV(y + 2 * GV),
                     y3 = VLOADV(y + 3 * GV);
        a0 = fma(w0, y0, a0);
        a1 = fma(w0, y1, a1);
        a2 = fma(w0, y2, a2);
        a3 = fma(w0, y3, a3);
        a4 = fma(w1, y0, a4);
        a5 = fma(w1, y1, a5);
        a6 = fma(w1, y2, a6);
        a7 = fma(w1, y3, a7);
      }
      VSTOREV(a0, r0);
      VSTOREV(a1, r0 + GV);
      VSTOREV(a2, r0 + 2 * GV);
      VSTOREV(a3, r0 + 3 * GV);
      VSTOREV(a4, r1);
      VSTOREV(a5, r1 + GV);
      VSTOREV(a6, r1 + 2 * GV);
      VSTOREV(a7, r1 + 3 * GV);
    }
}
