/*
 * What runs (ggml's "best kernel"): for a validated problem on a context's
 * device, the kernel family (attn_fwd, attn_decode for few query rows, or
 * attn_bwd_pre/dkdv/dq, or their _rows forms), the tiles it is built with, the optional features
 * compiled into it, the key splits of a decode and the workspace it takes.
 * plan() (attn_supports()), the workspace sizing and the launches all read
 * the one config decided here, once per (dtype, head-dim bucket) and
 * context, and derive the rest from the problem by the functions here.
 *
 * The tiles are data: a row of the tuning table, keyed by dtype, head-dim
 * bucket and device class, then fitted to the device's local memory and
 * work-group size. attn_tune measures variations of the row on the device
 * and stores the fastest (tune.c), which later contexts take in its place.
 */
#include "attn_cl.h"
#include "rules.h"

#include <limits.h>
#include <stdio.h>

/* The padded head dim a program is built for: 32, 64, then multiples of 32,
 * so that few programs cover every d and padding wastes little. 32 is the
 * smallest: PoCL 5.0 (the H200 machine's CPU driver) aborts the process in
 * its own compiler (Kernel.cc:129, region_entry_barrier) on the HD = 16
 * forward, and a head dim of 16 or less costs little padded to 32. */
static int hd_bucket(int64_t d) {
  if (d <= 32) return 32;
  if (d <= 64) return 64;
  return (int)((d + 31) / 32 * 32);
}

/* Device classes. NV_MMA: an NVIDIA GPU of compute capability 8.0 or
 * later, whose driver takes inline PTX: its f16 and bf16 rows up to
 * HD = 128 run the tensor-core forward and backward (fwd_mma.cl,
 * bwd_mma.cl), its f32 rows up to HD = 64 too (three TF32 products a
 * product, float32's accuracy: mma.cl); the rest its GPU rows. f32 stops
 * at 64 with the backward, whose block's K and V rows in f32 leave no
 * room above it in 48 KiB: a forward there beside bwd.cl would hand it an
 * lse its float32 scores do not match (big logits' dV off by 10^3 of
 * float32's error).
 * GPU: a GPU or accelerator running 256-item work-groups. CPU: the rest;
 * PoCL runs a work-group as loops over its items. A small local memory is
 * not a class: the fitting rule below shrinks any row to it. */
enum { CLASS_NV_MMA, CLASS_GPU, CLASS_CPU };
#define ANY_DTYPE (-1)

/* The tuning table: the first row of the device's class whose dtype matches
 * and whose hd_max is at least the bucket. Forward: 16 * Br / TM
 * work-items of TM x Bc/16 scores and TM x HD/16 outputs each, which keep
 * the two products' inner loops at 10-16 FMAs per local-memory instruction
 * (see fwd.cl). The GPU row's 256 items (Br = 128, Bc = 64) fit NVIDIA's
 * 48 KiB of local memory per work-group at HD = 128 (45 KiB, with V staged
 * 8 rows at a time); measured on an H200 (bench/NOTES_opencl.md, run 3),
 * Br = 128 beat Br = 64 by 14 % at HD = 64 and 19 % at HD = 128, and
 * Bc = 128 or DK = 32 at Br = 64 by 7-35 %. Above HD = 128, TM is halved to
 * stay within the register file. Decode: DR = 8 rows per
 * work-group holds a GQA group of 8 query heads at one query row (Llama's
 * 64/8) in one work-group, and costs 2 * 8 FMAs per K and V element, which
 * an H200 issues faster than it reads f16 K/V; NTD = 64 keys per tile,
 * one per work-item (K and V go straight to registers, 16 16-byte loads in
 * flight an item), halved until the work-group fits (see fit()). 128 items
 * read pages of 16 rows faster but contiguous caches slower (bench/NOTES.md).
 * The NV_MMA rows decode on the tensor cores instead (decode_mma.cl: 16
 * rows a work-group, 64-key tiles, NTD's count for the key splits).
 *
 * Backward (bwd.cl): tiles of BQ = 64 query rows by BK = 64 keys, 16 * BQ /
 * BTM = 256 work-items of BTM = 4 rows by 4 keys in S and dP (8 FMAs per
 * local read) and 4 keys (dK, dV) or 4 rows (dQ) by HD/16 columns in the
 * sums (about 10 FMAs per local read): 64 accumulators per item at HD = 128,
 * and 44 KiB of local memory for dK/dV's P, dS and row tiles, within
 * NVIDIA's 48 KiB. Above HD = 128, BK = 32 keeps the dK/dV accumulators at
 * 64. These are first sizes from that count, not measurements yet: attn
 * tune varies them (tune.c).
 *
 * The CPU class's forward is attn_fwd_rows (fwd.cl's tiles stay in its row
 * for the fallback, see attn__cl_config_tiles): RB query rows per
 * work-item, so that each K and V row staged as f32 serves RB rows, with
 * the rows' Q and O (2 * RB * HD floats) and the K and V tiles (2 * KB *
 * HD) within a core's L1 and L2 caches: RB = 32 up to HD = 64, 64 up to
 * HD = 128, 16 above; KB = 64 up to HD = 64, 32 above (attn tune through
 * PoCL on 2 Zen 4 cores, N = 2048, f32, forward and backward ms: HD 64 RB
 * 32 KB 64 61 + 194 against 60-65 + 198-207 for RB 32 or 64 at KB 32, the
 * others 63-94 + 201-245; HD 128 RB 64 KB 32 112 + 382 against 125-127 +
 * 378-386 for RB 32 at KB 32 or 64, the others 130-226 + 397-535).
 * Its backward's dK/dV and dQ kernels are bwd_rows.cl's, for the same
 * reasons, with the same RB and KB (bwd.cl's tiles stay for the fallback,
 * at 128 work-items: PoCL runs a group as loops over its items, so a larger
 * one gains nothing). */
static const struct tiles_row {
  int cls, dtype, hd_max;
  attn__cl_tiles t; /* in attn__cl_tiles's order */
} tiles_table[] = {
    /* br, bc, tm, dk, jk; bq, bk, btm, bdk, bjk; dr, ntd; the shapes; rb, kb; vw (fit()) */
    {CLASS_NV_MMA,
     ATTN_F16,
     128,
     {64, 64, 8, 16, 16, 64, 64, 4, 16, 8, 8, 64, ATTN__CL_FWD_MMA, ATTN__CL_BWD_MMA, 0, 0, 0}},
    {CLASS_NV_MMA,
     ATTN_BF16,
     128,
     {64, 64, 8, 16, 16, 64, 64, 4, 16, 8, 8, 64, ATTN__CL_FWD_MMA, ATTN__CL_BWD_MMA, 0, 0, 0}},
    {CLASS_NV_MMA,
     ATTN_F32,
     64,
     {64, 64, 8, 16, 16, 64, 64, 4, 16, 8, 8, 64, ATTN__CL_FWD_MMA, ATTN__CL_BWD_MMA, 0, 0, 0}},
    {CLASS_NV_MMA,
     ATTN_F32,
     128,
     {64, 16, 8, 16, 8, 64, 64, 4, 16, 8, 8, 64, ATTN__CL_FWD_MMA, ATTN__CL_BWD_MMA, 0, 0, 0}},
    {CLASS_GPU,
     ANY_DTYPE,
     128,
     {128, 64, 8, 16, 8, 64, 64, 4, 16, 8, 8, 64, ATTN__CL_FWD_TILES, ATTN__CL_BWD_TILES, 0, 0, 0}},
    {CLASS_GPU,
     ANY_DTYPE,
     ATTN_MAX_HEAD_DIM,
     {32, 64, 4, 16, 16, 64, 32, 4, 16, 8, 8, 64, ATTN__CL_FWD_TILES, ATTN__CL_BWD_TILES, 0, 0, 0}},
    {CLASS_CPU,
     ANY_DTYPE,
     64,
     {64, 64, 8, 16, 16, 32, 32, 4, 16, 8, 8, 64, ATTN__CL_FWD_ROWS, ATTN__CL_BWD_ROWS, 32, 64, 0}},
    {CLASS_CPU,
     ANY_DTYPE,
     128,
     {64, 64, 8, 16, 16, 32, 32, 4, 16, 8, 8, 64, ATTN__CL_FWD_ROWS, ATTN__CL_BWD_ROWS, 64, 32, 0}},
    {CLASS_CPU,
     ANY_DTYPE,
     ATTN_MAX_HEAD_DIM,
     {32, 64, 4, 16, 16, 32, 32, 4, 16, 8, 8, 64, ATTN__CL_FWD_ROWS, ATTN__CL_BWD_ROWS, 16, 32, 0}},
};

static const attn__cl_tiles *table_row(int cls, int dtype, int hd) {
  for (size_t i = 0; i < sizeof tiles_table / sizeof tiles_table[0]; ++i) {
    const struct tiles_row *r = &tiles_table[i];
    if (r->cls == cls && (r->dtype == ANY_DTYPE || r->dtype == dtype) && hd <= r->hd_max)
      return &r->t;
  }
  return NULL;
}

/* fwd.cl's local memory: the Q and K chunks share a buffer with P and the V
 * chunk, beside the row reductions. */
static size_t fwd_local_bytes(int hd, const attn__cl_tiles *t) {
  size_t qk = (size_t)t->dk * (t->br + 4) + (size_t)t->bc * (t->dk + 4);
  size_t pv = (size_t)t->bc * (t->br + 4) + (size_t)t->jk * hd;
  return 4u * ((qk > pv ? qk : pv) + (size_t)t->br * 16);
}

/* fwd.cl stages a Q/K chunk as whole rows of work-items: DK must divide
 * the work-group and DK*BR, DK*BC be multiples of it; K is read 4 columns
 * at a time. */
static int fwd_staging_fits(const attn__cl_tiles *t) {
  int nt = 16 * (t->br / t->tm);
  return nt % t->dk == 0 && t->dk % 4 == 0 && (t->dk * t->br) % nt == 0 &&
         (t->dk * t->bc) % nt == 0;
}

/* A row of Q, K, V or dO in the tensor-core kernels' local memory: HD
 * elements as stored and mma.cl's PAD (8 16-bit elements, 4 f32 ones). */
static size_t mma_row_bytes(int dtype, int hd) {
  return dtype == ATTN_F32 ? 4u * (size_t)(hd + 4) : 2u * (size_t)(hd + 8);
}

/* f32 rows above HD 64, of which 48 KiB holds 64 fewer (mma.cl's
 * WIDE_F32): the forward's key tiles and dQ's key blocks a quarter as
 * long, dQ's Q and dO staged one after the other, the forward's Q's,
 * dQ's Q's and dO's and dK/dV's K's last hd / 2 columns in local memory,
 * their first in registers. */
static int mma_wide(int dtype, int hd) {
  return dtype == ATTN_F32 && hd > 64;
}

/* Where mma_wide, a row's last hd / 2 columns in local memory (mma.cl's
 * keep_last_half), 4 floats longer. */
static size_t mma_half_row_bytes(int hd) {
  return 4u * ((size_t)hd / 2u + 4u);
}

int attn__cl_mma_key_rows(int dtype, int hd) {
  return mma_wide(dtype, hd) ? 32 : ATTN__CL_MMA_ROWS;
}

/* attn_bwd_dkdv_mma's local memory with a block of rows query rows: its
 * KR keys' K and V (where mma_wide, V and K's last hd / 2 columns, rows 4
 * floats longer, K staged through the Q and dO rows first), kept for the
 * whole pass, the block's Q and dO rows (16-bit rows 8 elements longer)
 * with their lse (hi, lo) and delta, and with a bias (bias_bytes an
 * element, 0 without) the block's bias tile, rows 8 elements longer. */
static size_t dkdv_mma_bytes(int dtype, int hd, int rows, int bias_bytes) {
  const size_t keys = (size_t)attn__cl_mma_key_rows(dtype, hd), r = (size_t)rows;
  const size_t k =
      mma_wide(dtype, hd) ? keys * mma_half_row_bytes(hd) : keys * mma_row_bytes(dtype, hd);
  return k + mma_row_bytes(dtype, hd) * (keys + 2u * r) + 3u * 4u * r +
         (size_t)bias_bytes * r * (keys + 8u);
}

/* Its query rows a block: as many as fit in NVIDIA's 48 KiB, up to 64;
 * without a bias 64 at HD 64, 32 at 96, 16 at 128 (f32: 64 at HD 32, 16
 * at 64, 32 at 96 (16 with an f32 bias) and 16 at 128 beside 32 keys). */
int attn__cl_mma_query_rows(int dtype, int hd, int bias_bytes) {
  int rows = 64;
  while (rows > 16 && dkdv_mma_bytes(dtype, hd, rows, bias_bytes) > 48 * 1024)
    rows /= 2;
  return rows;
}

/* The tensor-core kernels' local memory, the most of them over the bias
 * dtypes (no bias, 16-bit, f32): fwd_mma.cl's, K and V rows of a key
 * tile (64 keys; 16 where mma_wide, beside Q's last hd / 2 columns, rows 4
 * floats longer), and with a bias its 64-row tile, rows
 * 8 elements longer, where mma.cl stages it (BIAS_STAGED: an f32 bias
 * only up to HD 96, 32 on f32 data); attn_bwd_dkdv_mma's at its MQ;
 * attn_bwd_dq_mma's, 64 rows of Q and dO (one at a time where mma_wide)
 * or two blocks of K and V (32 keys; where mma_wide one of 8, beside Q's
 * and dO's last hd / 2 columns), a staged bias's slot for each block of
 * K and V, rows 8 elements longer, and 16 bytes a key of a block for the
 * sums. Their tiles are fixed: the row's br and bc are fwd_mma.cl's MR
 * and MC (the key splits count them), its tm, dk and jk attn_fwd's, for
 * the fallback (attn__cl_config_tiles). */
static size_t mma_local_bytes(int dtype, int hd) {
  const size_t rows = ATTN__CL_MMA_ROWS, row = mma_row_bytes(dtype, hd);
  const size_t wide = (size_t)mma_wide(dtype, hd), tile = wide ? 16u : 64u, block = wide ? 8u : 32u;
  const size_t staged = (dtype == ATTN_F32 ? hd <= 32 : hd <= 96) ? 4u : 2u;
  const size_t half = wide ? rows * mma_half_row_bytes(hd) : 0u; /* Q's or dO's */
  const size_t fwd = 2u * row * tile + half + staged * rows * (tile + 8u);
  const size_t slots = wide ? 1u : 2u, qg = (2u - wide) * rows * row;
  const size_t kv = 2u * half + slots * 2u * block * row;
  const size_t dq = (qg > kv ? qg : kv) + staged * slots * rows * (block + 8u) + 16u * block;
  size_t most = fwd > dq ? fwd : dq;
  for (int b = 0; b <= 4; b += 2) {
    const size_t dkdv = dkdv_mma_bytes(dtype, hd, attn__cl_mma_query_rows(dtype, hd, b), b);
    most = most > dkdv ? most : dkdv;
  }
  return most;
}

/* bwd.cl's local memory, the larger of its two kernels': the chunks of S
 * and dP, or the tiles of the sums (attn_bwd_dkdv: P, dS, Q and dO rows;
 * attn_bwd_dq: dS, dbias's dR under DBIAS 2, K rows) that share their
 * buffer; and the rows' lse (hi, lo) and delta. */
static size_t bwd_local_bytes(int hd, const attn__cl_tiles *t, int dbias_rows) {
  const size_t chunks = 2u * (size_t)t->bdk * (t->bq + 4) + 2u * (size_t)t->bk * (t->bdk + 4);
  const size_t dkdv = 2u * (size_t)t->bq * (t->bk + 4) + 2u * (size_t)t->bjk * hd;
  const size_t dq = (dbias_rows ? 2u : 1u) * (size_t)t->bk * (t->bq + 4) + (size_t)t->bjk * hd;
  size_t most = chunks > dkdv ? chunks : dkdv;
  most = most > dq ? most : dq;
  return 4u * (most + 3u * (size_t)t->bq);
}

/* bwd.cl's shape rules (its header): whole rows of 16 items, whole float4s
 * of rows, the chunks staged by whole rows of items. */
static int bwd_shape_fits(const attn__cl_tiles *t) {
  if (t->btm < 4 || t->btm % 4 || t->bq % t->btm || t->bk < 16 || t->bk % 16 || t->bdk < 4 ||
      t->bdk % 4 || t->bjk < 1 || t->bq % t->bjk || t->bk % t->bjk)
    return 0;
  const int nt = 16 * (t->bq / t->btm), ty = t->bq / t->btm;
  return t->bk % ty == 0 && nt % t->bdk == 0 && (t->bdk * t->bq) % nt == 0 &&
         (t->bdk * t->bk) % nt == 0;
}

/* decode.cl's local memory: Q (as floats, later the key slices' sums), S,
 * the rows' partial maxima and sums, and the tile's V rows when paged (K
 * and V themselves go straight to registers). */
static size_t decode_local_bytes(int hd, int dr, int ntd) {
  return 4u * ((size_t)dr * hd + (size_t)ntd * dr + (size_t)ntd + (size_t)dr) + 8u * (size_t)ntd;
}

/* The local-memory fitting rule: smaller local memories shrink the
 * forward's staging steps, then its key tile; the backward's key tile
 * first (its P and dS tiles are most of its local memory), then its
 * staging steps and query tile, which must also keep its work-items within
 * the device's work-group. 0 when nothing fits the device. */
static int fit(const attn__cl_device *dev, int dtype, int hd, attn__cl_tiles *t) {
  size_t lmem = (size_t)dev->local_mem;
  if (t->fwd == ATTN__CL_FWD_MMA && (mma_local_bytes(dtype, hd) > lmem || dev->max_wg < 128))
    return 0;
  while (fwd_local_bytes(hd, t) > lmem || !fwd_staging_fits(t)) {
    if (t->jk > 4)
      t->jk /= 2;
    else if (t->bc > 16)
      t->bc /= 2;
    else if (t->dk > 4)
      t->dk /= 2;
    else
      return 0;
  }
  while (bwd_local_bytes(hd, t, 0) > lmem || !bwd_shape_fits(t) ||
         (size_t)(16 * (t->bq / t->btm)) > dev->max_wg) {
    if (t->bk > 16 && t->bk / 2 % (t->bq / t->btm) == 0)
      t->bk /= 2;
    else if (t->bjk > 2)
      t->bjk /= 2;
    else if (t->bq > 16 && t->bq / 2 % t->btm == 0)
      t->bq /= 2;
    else if (t->bdk > 4)
      t->bdk /= 2;
    else
      return 0;
  }
  /* The decode kernel is an option, not a need: without it, the forward
   * kernel runs every problem. */
  while (t->ntd >= 16 &&
         ((size_t)t->ntd > dev->max_wg || decode_local_bytes(hd, t->dr, t->ntd) > lmem))
    t->ntd /= 2;
  if (t->ntd < 16 || t->ntd < t->dr) t->dr = t->ntd = 0;
  /* The rows kernels' products on vectors as wide as the device's SIMD
   * where the tiles divide into them: a float8 takes half an AVX-512 FMA
   * unit, and the compiler does not fuse two. */
  t->vw = dev->simd_floats >= 16 && hd % 64 == 0 && t->rb % 32 == 0 && t->kb % 32 == 0 ? 16 : 8;
  return dev->max_wg >= 128 && dev->max_wg >= (size_t)(16 * (t->br / t->tm));
}

static void name_fwd(attn__cl_config *c) {
  const attn__cl_tiles *t = &c->t;
  if (t->fwd == ATTN__CL_FWD_MMA)
    snprintf(c->name[ATTN__CL_FWD], sizeof c->name[0],
             "opencl attn_fwd_mma HD=%d Br=%d Bc=%d (tensor cores%s, inline PTX)", c->hd, t->br,
             t->bc, c->dtype == ATTN_F32 ? ", 3xTF32" : "");
  else if (t->fwd == ATTN__CL_FWD_ROWS)
    snprintf(c->name[ATTN__CL_FWD], sizeof c->name[0],
             "opencl attn_fwd_rows HD=%d RB=%d KB=%d VW=%d", c->hd, t->rb, t->kb, t->vw);
  else
    snprintf(c->name[ATTN__CL_FWD], sizeof c->name[0],
             "opencl attn_fwd HD=%d Br=%d Bc=%d TM=%d DK=%d JK=%d", c->hd, t->br, t->bc, t->tm,
             t->dk, t->jk);
}

static void name_bwd(attn__cl_config *c) {
  const attn__cl_tiles *t = &c->t;
  if (t->bwd == ATTN__CL_BWD_MMA)
    snprintf(c->name[ATTN__CL_BWD], sizeof c->name[0],
             "opencl attn_bwd_mma HD=%d KR=%d MQ=%d (tensor cores, inline PTX)", c->hd,
             attn__cl_mma_key_rows(c->dtype, c->hd), attn__cl_mma_query_rows(c->dtype, c->hd, 0));
  else if (t->bwd == ATTN__CL_BWD_ROWS)
    snprintf(c->name[ATTN__CL_BWD], sizeof c->name[0],
             "opencl attn_bwd_rows HD=%d RB=%d KB=%d VW=%d", c->hd, t->rb, t->kb, t->vw);
  else
    snprintf(c->name[ATTN__CL_BWD], sizeof c->name[0],
             "opencl attn_bwd HD=%d BQ=%d BK=%d BTM=%d BDK=%d BJK=%d", c->hd, t->bq, t->bk, t->btm,
             t->bdk, t->bjk);
}

static void name_all(attn__cl_config *c) {
  name_fwd(c);
  name_bwd(c);
  if (ATTN__CL_DECODES_MMA(c))
    snprintf(c->name[ATTN__CL_DECODE], sizeof c->name[0],
             "opencl attn_decode_mma HD=%d DR=%d (tensor cores, inline PTX)", c->hd,
             ATTN__CL_MMA_DECODE_ROWS);
  else
    snprintf(c->name[ATTN__CL_DECODE], sizeof c->name[0], "opencl attn_decode HD=%d DR<=%d NTD=%d",
             c->hd, c->t.dr, c->t.ntd);
}

int attn__cl_config_tiles(attn__cl_config *config) {
  if (config->t.fwd == ATTN__CL_FWD_TILES && config->t.bwd == ATTN__CL_BWD_TILES) return 0;
  config->t.fwd = ATTN__CL_FWD_TILES;
  config->t.bwd = ATTN__CL_BWD_TILES;
  name_fwd(config);
  name_bwd(config);
  return 1;
}

/* The config of class cls for (dtype, hd) on ctx's device, into c. */
static int choose(attn_context *ctx, int cls, int dtype, int hd, attn__cl_config *c) {
  attn__cl_impl *im = attn__cl_impl_of(ctx);
  const attn__cl_tiles *row = table_row(cls, dtype, hd);
  if (!row) return 0;
  attn__cl_tiles t = *row;
  attn__cl_tuned_tiles(ctx, dtype, hd, &t);
  if (!fit(im->dev, dtype, hd, &t)) return 0;
  c->valid = 1;
  c->dtype = dtype;
  c->hd = hd;
  c->cls = cls;
  c->narrow = cls == CLASS_CPU;
  c->t = t;
  name_all(c);
  return 1;
}

const attn__cl_tiles *attn__cl_table_row(const attn__cl_config *c) {
  return table_row(c->cls, c->dtype, c->hd);
}

int attn__cl_config_use(attn_context *ctx, attn__cl_config *c, const attn__cl_tiles *t) {
  attn__cl_impl *im = attn__cl_impl_of(ctx);
  attn__cl_tiles f = *t;
  if (!fit(im->dev, c->dtype, c->hd, &f)) return ATTN_EUNSUPPORTED;
  attn__cl_drop_programs(im, c);
  c->t = f;
  name_all(c);
  return ATTN_OK;
}

int attn__cl_dq_rows(const attn__cl_tiles *t) {
  return t->bwd == ATTN__CL_BWD_ROWS  ? t->rb
         : t->bwd == ATTN__CL_BWD_MMA ? ATTN__CL_MMA_ROWS
                                      : t->bq;
}

int attn__cl_config_portable(attn_context *ctx, attn__cl_config *config) {
  if (config->t.fwd != ATTN__CL_FWD_MMA) return 0;
  attn__cl_config c;
  if (choose(ctx, CLASS_GPU, config->dtype, config->hd, &c)) {
    *config = c;
    return 1;
  }
  return attn__cl_config_tiles(config);
}

int attn__cl_config_narrow(attn_context *ctx, attn__cl_config *config) {
  if (config->narrow) return 0;
  attn__cl_config c;
  if (!choose(ctx, CLASS_CPU, config->dtype, config->hd, &c)) return 0;
  *config = c;
  return 1;
}

/* The context's config for (dtype, hd), chosen on first use; NULL when the
 * device can run no row. */
static attn__cl_config *config_for(attn_context *ctx, int dtype, int hd) {
  attn__cl_impl *im = attn__cl_impl_of(ctx);
  attn__cl_config *c = &im->configs[dtype][hd / 32 - 1];
  if (c->valid) return c;
  const attn__cl_device *dev = im->dev;
  int gpu = dev->info.is_gpu && dev->max_wg >= 256;
  /* A class's row that does not fit falls back to the next one. */
  if ((dev->nv_cc >= 80 && choose(ctx, CLASS_NV_MMA, dtype, hd, c)) ||
      (gpu && choose(ctx, CLASS_GPU, dtype, hd, c)) || choose(ctx, CLASS_CPU, dtype, hd, c))
    return c;
  return NULL;
}

attn__cl_config *attn__cl_config_for(attn_context *ctx, attn_dtype dtype, int64_t head_dim) {
  attn__cl_impl *im = attn__cl_impl_of(ctx);
  attn__cl_config *c = config_for(ctx, (int)dtype, hd_bucket(head_dim));
  if (!c)
    attn__error(ctx, ATTN_EUNSUPPORTED,
                "the OpenCL device %s has too little local memory (%llu bytes) or too "
                "small work-groups (%zu) for head_dim %lld",
                im->dev->info.name, (unsigned long long)im->dev->local_mem, im->dev->max_wg,
                (long long)head_dim);
  return c;
}

/* Whether dbias sums over query rows (its rows dimension broadcasts over
 * more than one row): then through row-block sums (DBIAS 2). */
static int dbias_over_rows(const attn__problem *pb) {
  return pb->dbias.ss == 0 && pb->seqlen_q > 1;
}

/* The optional features a problem uses in one pass. */
static unsigned problem_features(const attn__problem *pb, int backward) {
  unsigned f = 0;
  if (pb->has_bias) f |= ATTN__CL_F_BIAS | (unsigned)pb->bias.dtype << ATTN__CL_F_BIAS_SHIFT;
  if (backward) {
    if (pb->has_dbias) f |= dbias_over_rows(pb) ? ATTN__CL_F_DBIAS2 : ATTN__CL_F_DBIAS1;
    if (pb->has_dsinks) f |= ATTN__CL_F_SINKS;
    return f;
  }
  if (pb->has_seqused) f |= ATTN__CL_F_USED;
  if (pb->page_size) f |= ATTN__CL_F_PAGED;
  if (pb->has_sinks) f |= ATTN__CL_F_SINKS;
  return f;
}

unsigned attn__cl_features(attn_context *ctx, const attn__problem *pb, const attn__plan *plan) {
  unsigned f = problem_features(pb, plan->backward);
  if (plan->backward) return f;
  attn__cl_split sp;
  attn__cl_split_of(ctx, pb, plan, &sp);
  if (plan->kernel == ATTN__CL_DECODE) {
    unsigned lg = 0;
    while ((1 << lg) < sp.dr)
      ++lg;
    f |= lg << ATTN__CL_F_DR_SHIFT;
  } else if (sp.nsplit > 1) {
    f |= ATTN__CL_F_SPLIT;
  }
  return f;
}

int attn__cl_prog_kind(int family, unsigned features) {
  if (family == ATTN__CL_DECODE) return ATTN__CL_PROG_DECODE;
  if (!features) return ATTN__CL_PROG_ATTN;
  return family == ATTN__CL_BWD ? ATTN__CL_PROG_BWD : ATTN__CL_PROG_FWD;
}

/* split.cl's MAX_SPLITS. */
#define MAX_SPLITS 128
/* The decode kernel runs problems of at most this many query rows per
 * sequence; above it, attn_fwd's blocks of Br rows are no longer mostly
 * padding. */
#define DECODE_MAX_NQ 16

/* The most keys a sequence attends to, as far as the host can tell: the
 * used lengths when they are in host memory, else the capacity. */
static int64_t longest_keys(const attn__problem *pb) {
  if (!pb->has_seqused || !pb->seqused_host) return pb->seqlen_k;
  int64_t most = 0;
  for (int64_t b = 0; b < pb->batch; ++b) {
    const int64_t nk = attn__seq_k(pb, b);
    most = nk > most ? nk : most;
  }
  return most;
}

void attn__cl_split_of(attn_context *ctx, const attn__problem *pb, const attn__plan *plan,
                       attn__cl_split *sp) {
  const attn__cl_device *dev = attn__cl_impl_of(ctx)->dev;
  const attn__cl_config *c = (const attn__cl_config *)plan->config;
  sp->nsplit = 1;
  sp->dr = sp->nrb = 0;
  if (plan->backward) return;
  int64_t groups, want, keys;
  if (plan->kernel == ATTN__CL_DECODE) {
    const int64_t rows = pb->heads_q / pb->heads_kv * pb->seqlen_q;
    /* As few rows per work-group as the rows of a key/value head need (a
     * power of two): rows past them would cost their share of the
     * arithmetic, reading nothing more. The tensor cores take 16 at once. */
    if (ATTN__CL_DECODES_MMA(c)) {
      sp->dr = ATTN__CL_MMA_DECODE_ROWS;
    } else {
      sp->dr = 1;
      while (sp->dr < c->t.dr && sp->dr < rows)
        sp->dr *= 2;
    }
    sp->nrb = (int)((rows + sp->dr - 1) / sp->dr);
    groups = pb->batch * pb->heads_kv * sp->nrb;
    keys = c->t.ntd;
    /* Four work-groups per compute unit: a GPU hides its memory latency
     * with several resident at once; a CPU device runs one per thread.
     * decode_mma.cl's (128 items, 35 KB of local memory, 160-170
     * registers at d = 128) run three at once on an H200, where a fourth
     * a compute unit makes a second wave of whole parts. */
    const int per_cu = ATTN__CL_DECODES_MMA(c) ? 3 : dev->info.is_gpu ? 4 : 1;
    want = (int64_t)per_cu * dev->info.compute_units;
  } else {
    const int rows = c->t.fwd == ATTN__CL_FWD_ROWS;
    sp->dr = rows ? c->t.rb : c->t.br;
    sp->nrb = (int)((pb->seqlen_q + sp->dr - 1) / sp->dr);
    groups = pb->batch * pb->heads_q * sp->nrb;
    keys = rows ? c->t.kb : c->t.bc;
    /* attn_fwd's work-groups fill a compute unit with one or two: split
     * only where the rows leave half the device idle, up to a wave. */
    want = groups * 2 <= dev->info.compute_units ? dev->info.compute_units : groups;
  }
  /* Parts of two key tiles at least: fewer keys per part would cost more
   * in parts written and merged than they gain. */
  const int64_t tiles = (longest_keys(pb) + keys - 1) / keys;
  int64_t most = tiles / 2 > 1 ? tiles / 2 : 1, n;
  if (pb->num_splits == 1) {
    n = 1;
  } else if (pb->num_splits > 1) {
    n = pb->num_splits;
    most = tiles > 1 ? tiles : 1;
  } else if (plan->kernel == ATTN__CL_DECODE) {
    /* At most the work-groups that run at once: one past them would run as
     * a wave of its own, a whole part's time for a sliver of the keys. */
    n = groups >= want ? 1 : want / groups;
  } else {
    n = groups >= want ? 1 : (want + groups - 1) / groups;
  }
  if (n > most) n = most;
  if (n > MAX_SPLITS) n = MAX_SPLITS;
  sp->nsplit = (int)(n < 1 ? 1 : n);
}

/* The key chunks of the rows backward's dQ parts (attn_bwd_dkdv_rows with
 * dq_part, summed by attn_bwd_dq_parts), and the key blocks a chunk (*kpc);
 * 0 where dQ takes its own kernel.
 * One pass computes S and dP once for dK, dV and dQ (5 products a tile
 * rather than 7): each work-item adds dS K into an f32 part of dQ of its
 * own chunk of keys, and the parts are summed in chunk order. Two chunks'
 * work-items a compute unit across sequences and kv heads, up to 64 MiB of
 * parts (one chunk, an f32 dQ, where the device can hold it). dbias keeps
 * dQ's own kernel: its broadcast dimensions would have work-items add to
 * one element. */
#define DQ_PARTS_BYTES ((size_t)64 << 20)
static int dq_chunks(attn_context *ctx, const attn__problem *pb, const attn__cl_config *c,
                     int *kpc) {
  attn__cl_impl *im = attn__cl_impl_of(ctx);
  *kpc = 0;
  if (c->t.bwd != ATTN__CL_BWD_ROWS || pb->has_dbias) return 0;
  const int64_t units = pb->batch * pb->heads_kv, kb = c->t.kb;
  const int64_t blocks = (longest_keys(pb) + kb - 1) / kb;
  const int64_t tq = pb->varlen ? pb->total_q : pb->batch * pb->seqlen_q;
  const size_t part = (size_t)pb->heads_q * (size_t)tq * (size_t)c->hd * sizeof(float);
  if (part > im->dev->max_alloc) return 0;
  int64_t n = (2 * (int64_t)im->dev->info.compute_units + units - 1) / units;
  if (part && (size_t)n > DQ_PARTS_BYTES / part) n = (int64_t)(DQ_PARTS_BYTES / part);
  if (n > blocks) n = blocks;
  if (n < 1) n = 1;
  *kpc = (int)((blocks + n - 1) / n);
  return blocks > 0 ? (int)((blocks + *kpc - 1) / *kpc) : 1;
}

void attn__cl_workspace_of(attn_context *ctx, const attn__problem *pb, const attn__plan *plan,
                           attn__cl_workspace *ws) {
  memset(ws, 0, sizeof *ws);
  const attn__cl_config *c = (const attn__cl_config *)plan->config;
  ws->cu = pb->varlen ? (size_t)(pb->batch + 1) * sizeof(int32_t) : 0;
  ws->alibi = pb->alibi || pb->alibi_dev.native ? (size_t)pb->heads_q * sizeof(float) : 0;
  ws->tq = pb->varlen ? pb->total_q : pb->batch * pb->seqlen_q;
  ws->delta = plan->backward ? (size_t)(pb->heads_q * ws->tq) * sizeof(float) : 0;
  attn__cl_split sp;
  attn__cl_split_of(ctx, pb, plan, &sp);
  if (sp.nsplit > 1) {
    /* Every row's parts: O, and m_i with l_i (PART_ROW, common.cl). */
    const size_t parts = (size_t)sp.nsplit * (size_t)pb->heads_q * (size_t)ws->tq;
    ws->work = parts * (size_t)c->hd * sizeof(float);
    ws->work2 = 2 * parts * sizeof(float);
  }
  if (plan->backward) ws->dq_chunks = dq_chunks(ctx, pb, c, &ws->dq_kpc);
  if (ws->dq_chunks)
    ws->work = (size_t)ws->dq_chunks * (size_t)pb->heads_q * (size_t)ws->tq * (size_t)c->hd *
               sizeof(float);
  if (plan->backward && pb->has_dbias && dbias_over_rows(pb)) {
    /* A row-block sum per work-group of one launch of attn_bwd_dq, which
     * covers one sequence or head where dbias sums over them. */
    const int block = attn__cl_dq_rows(&c->t);
    const size_t nqb = (size_t)((pb->seqlen_q + block - 1) / block);
    const size_t gb = pb->dbias.sb ? (size_t)pb->batch : 1,
                 gh = pb->dbias.sh ? (size_t)pb->heads_q : 1;
    ws->work = gb * gh * nqb * (size_t)pb->seqlen_k * sizeof(float);
  }
}

int attn__cl_plan(attn_context *ctx, const attn__problem *pb, int backward, attn__plan *out) {
  attn__cl_impl *im = attn__cl_impl_of(ctx);
  const int64_t big = INT_MAX / 4;
  if (pb->seqlen_q > big || pb->seqlen_k > big || pb->total_q > big || pb->total_k > big ||
      pb->num_pages > big)
    return attn__error(ctx, ATTN_EUNSUPPORTED,
                       "the OpenCL backend takes at most %lld rows per tensor", (long long)big);
  if (pb->batch > 65535 || pb->heads_q > 65535)
    return attn__error(ctx, ATTN_EUNSUPPORTED,
                       "the OpenCL backend takes at most 65535 sequences and heads");
  attn__cl_config *c = attn__cl_config_for(ctx, pb->dtype, pb->head_dim);
  if (!c) return ATTN_EUNSUPPORTED;
  if (backward && pb->has_dbias && c->t.bwd == ATTN__CL_BWD_TILES &&
      bwd_local_bytes(c->hd, &c->t, dbias_over_rows(pb)) > (size_t)im->dev->local_mem)
    return attn__error(ctx, ATTN_EUNSUPPORTED,
                       "the OpenCL device %s has too little local memory (%llu bytes) for dbias "
                       "at head_dim %lld",
                       im->dev->info.name, (unsigned long long)im->dev->local_mem,
                       (long long)pb->head_dim);
  memset(out, 0, sizeof *out);
  out->backward = backward;
  out->kernel = backward                                   ? ATTN__CL_BWD
                : c->t.dr && pb->seqlen_q <= DECODE_MAX_NQ ? ATTN__CL_DECODE
                                                           : ATTN__CL_FWD;
  out->config = c;
  unsigned features = attn__cl_features(ctx, pb, out);
  /* The program is built here, not at launch: whether its kernels run the
   * config's work-groups is known only from the compiled kernels, and the
   * answer must be the plan's (attn_supports() is exact). Built once per
   * (config, features) and context, and cached on disk. A decode kernel
   * the device cannot run, or its compiler cannot build, leaves the
   * problem to attn_fwd (ATTN_DEBUG says why). */
  attn__cl_program *prog;
  int st = attn__cl_program_of(ctx, c, attn__cl_prog_kind(out->kernel, features), features, &prog);
  if ((st == ATTN_EUNSUPPORTED || st == ATTN_EBUILD) && out->kernel == ATTN__CL_DECODE) {
    attn__debug("opencl: %s; the forward kernel runs it, and every later decode of the context",
                ctx->errmsg);
    ctx->errmsg[0] = 0;
    c->t.dr = 0; /* not tried again */
    out->kernel = ATTN__CL_FWD;
    features = attn__cl_features(ctx, pb, out);
    st = attn__cl_program_of(ctx, c, attn__cl_prog_kind(out->kernel, features), features, &prog);
  }
  if (st) return st;
  attn__cl_workspace ws;
  attn__cl_workspace_of(ctx, pb, out, &ws);
  out->workspace = 2 * ws.cu + ws.alibi + ws.delta + ws.work + ws.work2;
  out->name = c->name[out->kernel]; /* after a narrowing rebuild */
  return ATTN_OK;
}
