/*
 * attn_tune on OpenCL: which variations of the tiles table's row
 * (plan.c) are measured, and where the winner is kept.
 *
 * The variations are data, per kernel shape: the forward's tiles and the
 * backward's for attn_fwd and bwd.cl (GPU devices), each forward with each
 * backward (attn_tune times the two passes together), the rows
 * and keys per work-item for attn_fwd_rows and bwd_rows.cl (CPU devices).
 * src/tune.c times each on the device and keeps the fastest.
 *
 * A kept variation goes to a text file beside the program cache, named by
 * attn__cl_device_key (platform, device, driver): a new driver or device
 * starts from the table again. One line per dtype, head-dim bucket and
 * device class. A line is read back only as one of the variations, which
 * plan.c's fit() then fits to the device as it does the table's rows; any
 * other line is skipped.
 */
#include "attn_cl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* attn_fwd's tiles (Br, TM, Bc, DK, JK), each with bwd.cl's. */
static const struct {
  int br, tm, bc, dk, jk;
} fwd_tiles[] = {
    {128, 8, 64, 16, 8},  {64, 4, 64, 16, 8},  {128, 8, 128, 16, 8},
    {64, 4, 128, 16, 16}, {128, 8, 64, 32, 8}, {64, 8, 64, 16, 16},
};
/* bwd.cl's (BQ, BK, BTM, BDK, BJK): the table's row; half the keys (fewer
 * registers, more work-groups); 128 rows of 8 per item (twice the FMAs per
 * read of the products, half the work-groups); twice the columns per
 * staging step (half the barriers of S and dP). */
static const struct {
  int bq, bk, btm, bdk, bjk;
} bwd_tiles[] = {{64, 64, 4, 16, 8}, {64, 32, 4, 16, 8}, {128, 64, 8, 16, 8}, {64, 64, 4, 32, 8}};

/* attn_fwd_rows's and bwd_rows.cl's rows per work-item and keys per tile. */
static const struct {
  int rb, kb;
} rows_tiles[] = {{32, 32}, {16, 32}, {32, 16}, {64, 32}, {32, 64}, {16, 64}};

#define COUNT(a) ((int)(sizeof(a) / sizeof((a)[0])))
#define LINE_INTS 18

/* The tensor-core forward's tiles are fixed: its rows vary the backward's. */
static int tune_count_of(const attn__cl_tiles *row) {
  return row->fwd == ATTN__CL_FWD_ROWS  ? COUNT(rows_tiles)
         : row->fwd == ATTN__CL_FWD_MMA ? COUNT(bwd_tiles)
                                        : COUNT(fwd_tiles) * COUNT(bwd_tiles);
}

/* Variation i of a row. */
static attn__cl_tiles variation(const attn__cl_tiles *row, int i) {
  attn__cl_tiles t = *row;
  if (row->fwd == ATTN__CL_FWD_ROWS) {
    t.rb = rows_tiles[i].rb;
    t.kb = rows_tiles[i].kb;
    return t;
  }
  const int f = i / COUNT(bwd_tiles), b = i % COUNT(bwd_tiles);
  if (row->fwd != ATTN__CL_FWD_MMA) {
    t.br = fwd_tiles[f].br;
    t.tm = fwd_tiles[f].tm;
    t.bc = fwd_tiles[f].bc;
    t.dk = fwd_tiles[f].dk;
    t.jk = fwd_tiles[f].jk;
  }
  t.bq = bwd_tiles[b].bq;
  t.bk = bwd_tiles[b].bk;
  t.btm = bwd_tiles[b].btm;
  t.bdk = bwd_tiles[b].bdk;
  t.bjk = bwd_tiles[b].bjk;
  return t;
}

int attn__cl_tune_count(attn_context *ctx, attn_dtype dtype, int64_t head_dim) {
  const attn__cl_config *c = attn__cl_config_for(ctx, dtype, head_dim);
  const attn__cl_tiles *row = c ? attn__cl_table_row(c) : NULL;
  return row ? tune_count_of(row) : 0;
}

int attn__cl_tune_use(attn_context *ctx, attn_dtype dtype, int64_t head_dim, int i) {
  attn__cl_config *c = attn__cl_config_for(ctx, dtype, head_dim);
  const attn__cl_tiles *row = c ? attn__cl_table_row(c) : NULL;
  if (!row) return ATTN_EINTERNAL;
  /* A config narrowed to the CPU class while measuring has other variations. */
  if (i < 0 || i >= tune_count_of(row))
    return attn__error(ctx, ATTN_EUNSUPPORTED, "variation %d is not one of this device's", i);
  const attn__cl_tiles t = variation(row, i);
  const int rc = attn__cl_config_use(ctx, c, &t);
  if (rc) return attn__error(ctx, rc, "variation %d does not fit the device", i);
  attn__debug("tune: configuration %d: %s; %s", i, c->name[ATTN__CL_FWD], c->name[ATTN__CL_BWD]);
  return ATTN_OK;
}

/* The device's file of kept tiles; 0 when the cache is off. */
static int tuned_path(attn_context *ctx, char *path, size_t n) {
  attn__cl_impl *im = attn__cl_impl_of(ctx);
  if (!ctx->settings.cl_cache) return 0;
  const int w = snprintf(path, n, "%s/tiles-%016llx.txt", ctx->settings.cl_cache_dir,
                         (unsigned long long)attn__cl_device_key(im->cl, im->dev->id));
  return w > 0 && (size_t)w < n;
}

/* A line as ints: dtype, bucket, the kernels' shapes (which say the
 * device class), then the tiles: br bc tm dk jk bq dr ntd rb kb bk btm bdk
 * bjk. */
static void line_of(const attn__cl_config *c, const attn__cl_tiles *t, int *v) {
  const int x[LINE_INTS] = {c->dtype, c->hd, t->fwd, t->bwd, t->br, t->bc, t->tm,  t->dk,  t->jk,
                            t->bq,    t->dr, t->ntd, t->rb,  t->kb, t->bk, t->btm, t->bdk, t->bjk};
  memcpy(v, x, sizeof x);
}

static int parse(const char *s, int *v) {
  return sscanf(s, "%d %d %d %d %d %d %d %d %d %d %d %d %d %d %d %d %d %d", &v[0], &v[1], &v[2],
                &v[3], &v[4], &v[5], &v[6], &v[7], &v[8], &v[9], &v[10], &v[11], &v[12], &v[13],
                &v[14], &v[15], &v[16], &v[17]) == LINE_INTS;
}

/* The variation of row t whose tiles a stored line holds, or -1: a line
 * applies only as one of the tiles attn_tune measures, so that a damaged or
 * foreign file can ask for nothing else. */
static int stored_variation(const attn__cl_tiles *t, const int *v) {
  for (int i = 0; i < tune_count_of(t); ++i) {
    const attn__cl_tiles x = variation(t, i);
    if (x.br == v[4] && x.bc == v[5] && x.tm == v[6] && x.dk == v[7] && x.jk == v[8] &&
        x.bq == v[9] && x.rb == v[12] && x.kb == v[13] && x.bk == v[14] && x.btm == v[15] &&
        x.bdk == v[16] && x.bjk == v[17])
      return i;
  }
  return -1;
}

void attn__cl_tuned_tiles(attn_context *ctx, int dtype, int hd, attn__cl_tiles *t) {
  char path[sizeof ctx->settings.cl_cache_dir + 40], line[256];
  if (!tuned_path(ctx, path, sizeof path)) return;
  FILE *f = fopen(path, "r");
  if (!f) return;
  int v[LINE_INTS];
  while (fgets(line, sizeof line, f)) {
    int i;
    if (!parse(line, v) || v[0] != dtype || v[1] != hd || v[2] != t->fwd || v[3] != t->bwd ||
        (i = stored_variation(t, v)) < 0)
      continue;
    *t = variation(t, i);
    attn__debug("opencl: tiles for %s, head dim %d, from %s", attn_dtype_name((attn_dtype)dtype),
                hd, path);
  }
  fclose(f);
}

int attn__cl_tune_keep(attn_context *ctx, attn_dtype dtype, int64_t head_dim, int i) {
  char path[sizeof ctx->settings.cl_cache_dir + 40], tmp[sizeof path + 24], line[256];
  attn__cl_config *c = attn__cl_config_for(ctx, dtype, head_dim);
  if (!c) return ATTN_EINTERNAL;
  int rc = attn__cl_tune_use(ctx, dtype, head_dim, i);
  if (rc) return rc;
  if (!tuned_path(ctx, path, sizeof path)) {
    attn__debug(
        "opencl: the program cache is off (ATTN_CL_CACHE=0): the tiles are kept for "
        "this context only");
    return ATTN_OK;
  }
  /* The other lines stay; this one replaces its (dtype, bucket, class). */
  int w[LINE_INTS];
  line_of(c, &c->t, w);
  snprintf(tmp, sizeof tmp, "%s.%ld.tmp", path, (long)getpid());
  attn__cl_make_dirs(ctx->settings.cl_cache_dir);
  FILE *out = fopen(tmp, "w");
  if (!out) return attn__error(ctx, ATTN_EIO, "cannot write the tuned tiles to %s", tmp);
  FILE *in = fopen(path, "r");
  while (in && fgets(line, sizeof line, in)) {
    int u[LINE_INTS];
    if (parse(line, u) && !(u[0] == w[0] && u[1] == w[1] && u[2] == w[2] && u[3] == w[3]))
      fputs(line, out);
  }
  if (in) fclose(in);
  for (int k = 0; k < LINE_INTS; ++k)
    fprintf(out, k ? " %d" : "%d", w[k]);
  fputc('\n', out);
  const int bad = ferror(out);
  if (fclose(out) != 0 || bad || rename(tmp, path) != 0) {
    remove(tmp);
    return attn__error(ctx, ATTN_EIO, "cannot write the tuned tiles to %s", path);
  }
  attn__debug("opencl: %s kept in %s", c->name[ATTN__CL_FWD], path);
  return ATTN_OK;
}
