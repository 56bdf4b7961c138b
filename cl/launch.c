/*
 * The OpenCL backend's launches: the programs (common.cl followed by fwd.cl
 * and bwd.cl, decode.cl, append.cl or merge.cl, built with the plan's tiles
 * and the problem's features), the kernels' arguments, and the passes
 * enqueued on the context's queue: the forward (attn_fwd, or attn_decode
 * and its merge), the backward, the KV-cache append and attn_merge.
 *
 * Programs are built per (cl_context, config, kind, features) on first use
 * and kept for the context's life.
 *
 * Backward is always deterministic here: dQ and dK/dV come from separate
 * kernels that each own their outputs (bwd.cl, or bwd_rows.cl where the
 * config's bwd shape is ATTN__CL_BWD_ROWS), dbias is summed in launch
 * order or through row-block sums, dsinks in a fixed tree, with or without
 * ATTN_DETERMINISTIC.
 */
#include "attn_cl.h"

#include <stdio.h>

/* ---------------------------------------------------------------------- */
/* Programs                                                                 */
/* ---------------------------------------------------------------------- */

static const char *const kernel_names[ATTN__CL_K_COUNT] = {
    [ATTN__CL_K_FWD] = "attn_fwd",
    [ATTN__CL_K_FWD_ROWS] = "attn_fwd_rows",
    [ATTN__CL_K_FWD_MMA] = "attn_fwd_mma",
    [ATTN__CL_K_PRE] = "attn_bwd_pre",
    [ATTN__CL_K_DKDV] = "attn_bwd_dkdv",
    [ATTN__CL_K_DQ] = "attn_bwd_dq",
    [ATTN__CL_K_DKDV_ROWS] = "attn_bwd_dkdv_rows",
    [ATTN__CL_K_DQ_ROWS] = "attn_bwd_dq_rows",
    [ATTN__CL_K_DQ_PARTS] = "attn_bwd_dq_parts",
    [ATTN__CL_K_DKDV_MMA] = "attn_bwd_dkdv_mma",
    [ATTN__CL_K_DQ_MMA] = "attn_bwd_dq_mma",
    [ATTN__CL_K_ZERO] = "attn_bwd_zero",
    [ATTN__CL_K_DBIAS_SUM] = "attn_bwd_dbias_sum",
    [ATTN__CL_K_DSINKS] = "attn_bwd_dsinks",
    [ATTN__CL_K_DECODE] = "attn_decode",
    [ATTN__CL_K_DECODE_MMA] = "attn_decode_mma",
    [ATTN__CL_K_SPLIT_MERGE] = "attn_split_merge",
    [ATTN__CL_K_APPEND] = "attn_append",
    [ATTN__CL_K_MERGE_MAX] = "attn_merge_max",
    [ATTN__CL_K_MERGE_ADD] = "attn_merge_add",
    [ATTN__CL_K_OFFSETS] = "attn_clamp_offsets",
    [ATTN__CL_K_NAN_SCAN] = "attn_nan_scan",
};

/* The work-items per group each kernel is launched with (the forward's,
 * the decode's and bwd.cl's dK/dV and dQ kernels' depend on their tiles:
 * 0 here). */
static const size_t kernel_items[ATTN__CL_K_COUNT] = {
    [ATTN__CL_K_FWD] = 0,          [ATTN__CL_K_FWD_ROWS] = 1,      [ATTN__CL_K_FWD_MMA] = 128,
    [ATTN__CL_K_PRE] = 64,         [ATTN__CL_K_DKDV] = 0,          [ATTN__CL_K_DQ] = 0,
    [ATTN__CL_K_DKDV_ROWS] = 1,    [ATTN__CL_K_DQ_ROWS] = 1,       [ATTN__CL_K_DQ_MMA] = 128,
    [ATTN__CL_K_DQ_PARTS] = 64,    [ATTN__CL_K_DKDV_MMA] = 128,    [ATTN__CL_K_ZERO] = 64,
    [ATTN__CL_K_DBIAS_SUM] = 64,   [ATTN__CL_K_DSINKS] = 64,       [ATTN__CL_K_DECODE] = 0,
    [ATTN__CL_K_DECODE_MMA] = 128, [ATTN__CL_K_SPLIT_MERGE] = 128, [ATTN__CL_K_APPEND] = 64,
    [ATTN__CL_K_MERGE_MAX] = 1,    [ATTN__CL_K_MERGE_ADD] = 64,    [ATTN__CL_K_OFFSETS] = 64,
    [ATTN__CL_K_NAN_SCAN] = 64,
};

static void release_one(attn__cl_impl *im, attn__cl_program *p) {
  for (int j = 0; j < ATTN__CL_K_COUNT; ++j)
    if (p->k[j]) im->cl->clReleaseKernel(p->k[j]);
  if (p->prog) im->cl->clReleaseProgram(p->prog);
  if (p->clctx) im->cl->clReleaseContext(p->clctx);
  memset(p, 0, sizeof *p);
}

void attn__cl_release_programs(attn__cl_impl *im) {
  for (int i = 0; i < im->nprog; ++i)
    release_one(im, &im->progs[i]);
  im->nprog = 0;
}

void attn__cl_drop_programs(attn__cl_impl *im, const attn__cl_config *c) {
  for (int i = im->nprog - 1; i >= 0; --i)
    if (im->progs[i].config == c) {
      release_one(im, &im->progs[i]);
      im->progs[i] = im->progs[--im->nprog];
      memset(&im->progs[im->nprog], 0, sizeof im->progs[0]);
    }
}

/* bwd.cl's work-items per group (its NTB). */
static size_t bwd_items(const attn__cl_tiles *t) {
  return (size_t)(16 * (t->bq / t->btm));
}

/* The sources (*nsrc of them), -D options and kernels (returned: how
 * many, by slot) of a program of config c. */
static int program_parts(const attn__cl_config *c, int kind, unsigned f, const char **srcs,
                         int *nsrc, char *opts, size_t n, int *slots) {
  const attn__cl_tiles *t = &c->t;
  int ns = 1, nk = 0, mma = 0; /* mma: mma.cl is in */
  srcs[0] = attn__cl_src_common;
  int len = snprintf(opts, n, "-cl-std=CL1.2 -DDTYPE=%d -DHD=%d", c->dtype, c->hd);
  switch (kind) {
    case ATTN__CL_PROG_ATTN:
    case ATTN__CL_PROG_FWD:
    case ATTN__CL_PROG_BWD:
      len += snprintf(opts + len, n - (size_t)len,
                      " -DBR=%d -DBC=%d -DTM=%d -DDK=%d -DJK=%d -DBQ=%d -DBK=%d -DBTM=%d -DBDK=%d"
                      " -DBJK=%d",
                      t->br, t->bc, t->tm, t->dk, t->jk, t->bq, t->bk, t->btm, t->bdk, t->bjk);
      if (t->fwd == ATTN__CL_FWD_ROWS || t->bwd == ATTN__CL_BWD_ROWS)
        len +=
            snprintf(opts + len, n - (size_t)len, " -DRB=%d -DKB=%d -DVW=%d", t->rb, t->kb, t->vw);
      if (kind != ATTN__CL_PROG_BWD && t->fwd == ATTN__CL_FWD_ROWS) {
        srcs[ns++] = attn__cl_src_fwd_rows;
        slots[nk++] = ATTN__CL_K_FWD_ROWS;
      } else if (kind != ATTN__CL_PROG_BWD && t->fwd == ATTN__CL_FWD_MMA) {
        srcs[ns++] = attn__cl_src_mma;
        mma = 1;
        srcs[ns++] = attn__cl_src_fwd_mma;
        slots[nk++] = ATTN__CL_K_FWD_MMA;
      } else if (kind != ATTN__CL_PROG_BWD) {
        srcs[ns++] = attn__cl_src_fwd;
        slots[nk++] = ATTN__CL_K_FWD;
      }
      if (f & ATTN__CL_F_SPLIT) {
        srcs[ns++] = attn__cl_src_split;
        slots[nk++] = ATTN__CL_K_SPLIT_MERGE;
      }
      if (kind != ATTN__CL_PROG_FWD) {
        srcs[ns++] = attn__cl_src_bwd;
        slots[nk++] = ATTN__CL_K_PRE;
        if (t->bwd == ATTN__CL_BWD_ROWS) {
          srcs[ns++] = attn__cl_src_bwd_rows;
          slots[nk++] = ATTN__CL_K_DKDV_ROWS;
          slots[nk++] = ATTN__CL_K_DQ_ROWS;
          slots[nk++] = ATTN__CL_K_DQ_PARTS;
        } else if (t->bwd == ATTN__CL_BWD_MMA) {
          if (!mma) srcs[ns++] = attn__cl_src_mma;
          mma = 1;
          srcs[ns++] = attn__cl_src_bwd_mma;
          /* MQ makes room for the bias tile: its bytes an element. */
          int bias_bytes = 0;
          if (f & ATTN__CL_F_BIAS)
            bias_bytes = ((f >> ATTN__CL_F_BIAS_SHIFT) & 3u) == ATTN_F32 ? 4 : 2;
          len += snprintf(opts + len, n - (size_t)len, " -DMQ=%d -DKR=%d",
                          attn__cl_mma_query_rows(c->dtype, c->hd, bias_bytes),
                          attn__cl_mma_key_rows(c->dtype, c->hd));
          slots[nk++] = ATTN__CL_K_DKDV_MMA;
          slots[nk++] = ATTN__CL_K_DQ_MMA;
        } else {
          slots[nk++] = ATTN__CL_K_DKDV;
          slots[nk++] = ATTN__CL_K_DQ;
        }
        if (f & (ATTN__CL_F_DBIAS1 | ATTN__CL_F_DBIAS2) || t->bwd == ATTN__CL_BWD_ROWS)
          slots[nk++] = ATTN__CL_K_ZERO;
        if (f & ATTN__CL_F_DBIAS2) slots[nk++] = ATTN__CL_K_DBIAS_SUM;
        if (f & ATTN__CL_F_SINKS) slots[nk++] = ATTN__CL_K_DSINKS;
      }
      if (mma && c->dtype == ATTN_F32) {
        /* The f32 tensor-core kernels' NaN pass behind a scan (mma.cl). */
        len += snprintf(opts + len, n - (size_t)len, " -DNAN_FLAG=1");
        slots[nk++] = ATTN__CL_K_NAN_SCAN;
      }
      break;
    case ATTN__CL_PROG_DECODE:
      len += snprintf(opts + len, n - (size_t)len, " -DDR=%d -DNTD=%d",
                      1 << ((f >> ATTN__CL_F_DR_SHIFT) & 7u), t->ntd);
      if (ATTN__CL_DECODES_MMA(c)) {
        srcs[ns++] = attn__cl_src_mma;
        srcs[ns++] = attn__cl_src_decode_mma;
        slots[nk++] = ATTN__CL_K_DECODE_MMA;
      } else {
        srcs[ns++] = attn__cl_src_decode;
        slots[nk++] = ATTN__CL_K_DECODE;
      }
      srcs[ns++] = attn__cl_src_split;
      slots[nk++] = ATTN__CL_K_SPLIT_MERGE;
      break;
    case ATTN__CL_PROG_APPEND:
      srcs[ns++] = attn__cl_src_append;
      slots[nk++] = ATTN__CL_K_APPEND;
      break;
    case ATTN__CL_PROG_META:
      srcs[ns++] = attn__cl_src_meta;
      slots[nk++] = ATTN__CL_K_OFFSETS;
      break;
    default:
      srcs[ns++] = attn__cl_src_merge;
      slots[nk++] = ATTN__CL_K_MERGE_MAX;
      slots[nk++] = ATTN__CL_K_MERGE_ADD;
      break;
  }
  if (f & ATTN__CL_F_USED) len += snprintf(opts + len, n - (size_t)len, " -DKV_USED=1");
  if (f & ATTN__CL_F_PAGED) len += snprintf(opts + len, n - (size_t)len, " -DPAGED=1");
  if (f & ATTN__CL_F_BIAS)
    len += snprintf(opts + len, n - (size_t)len, " -DHAS_BIAS=1 -DBIAS_DTYPE=%u",
                    (f >> ATTN__CL_F_BIAS_SHIFT) & 3u);
  if (f & ATTN__CL_F_SINKS) len += snprintf(opts + len, n - (size_t)len, " -DHAS_SINKS=1");
  if (f & ATTN__CL_F_SPLIT) len += snprintf(opts + len, n - (size_t)len, " -DSPLIT=1");
  if (f & (ATTN__CL_F_DBIAS1 | ATTN__CL_F_DBIAS2))
    snprintf(opts + len, n - (size_t)len, " -DDBIAS=%d", f & ATTN__CL_F_DBIAS1 ? 1 : 2);
  *nsrc = ns;
  return nk;
}

/* Builds the program of (c, kind, f) into the next entry. *narrow is set
 * when the compiled forward kernel cannot run the GPU row's 256 items. */
static int build_program(attn_context *ctx, const attn__cl_config *c, int kind, unsigned f,
                         int *narrow, attn__cl_program **out) {
  attn__cl_impl *im = attn__cl_impl_of(ctx);
  const attn__cl_api *cl = im->cl;
  const attn__cl_tiles *t = &c->t;
  attn__cl_program p;
  memset(&p, 0, sizeof p);
  p.config = c;
  p.kind = kind;
  p.features = f;
  *narrow = 0;
  char opts[320];
  const char *srcs[8];
  int slots[ATTN__CL_K_COUNT];
  int nsrc;
  const int nk = program_parts(c, kind, f, srcs, &nsrc, opts, sizeof opts, slots);
  const char *names[ATTN__CL_K_COUNT];
  cl_kernel ks[ATTN__CL_K_COUNT];
  for (int i = 0; i < nk; ++i)
    names[i] = kernel_names[slots[i]];
  int st = attn__cl_build(ctx, cl, im->ctx, im->dev->id, srcs, nsrc, opts, names, nk, &p.prog, ks);
  if (st) return st;
  cl->clRetainContext(im->ctx);
  p.clctx = im->ctx;
  for (int i = 0; i < nk; ++i)
    p.k[slots[i]] = ks[i];
  for (int i = 0; i < nk && !st; ++i) {
    const int slot = slots[i];
    size_t wg = 0;
    cl->clGetKernelWorkGroupInfo(ks[i], im->dev->id, CL_KERNEL_WORK_GROUP_SIZE, sizeof wg, &wg,
                                 NULL);
    const size_t need = slot == ATTN__CL_K_FWD      ? (size_t)(16 * (t->br / t->tm))
                        : slot == ATTN__CL_K_DECODE ? (size_t)t->ntd
                        : slot == ATTN__CL_K_DKDV || slot == ATTN__CL_K_DQ ? bwd_items(t)
                                                                           : kernel_items[slot];
    if (wg < need && slot == ATTN__CL_K_FWD && need > 128 && !c->narrow) {
      attn__debug("opencl: attn_fwd runs at most %zu work-items per group; retrying with 128", wg);
      *narrow = 1;
    }
    if (wg < need)
      st = attn__error(ctx, ATTN_EUNSUPPORTED,
                       "OpenCL kernel %s runs at most %zu work-items per group on %s; it "
                       "needs %zu",
                       names[i], wg, im->dev->info.name, need);
  }
  /* On failure the entry is released at once (nprog is not advanced). */
  im->progs[im->nprog] = p;
  if (st) {
    release_one(im, &im->progs[im->nprog]);
    return st;
  }
  attn__debug("opencl: %s", opts);
  *out = &im->progs[im->nprog++];
  return ATTN_OK;
}

int attn__cl_program_of(attn_context *ctx, attn__cl_config *c, int kind, unsigned features,
                        attn__cl_program **out) {
  attn__cl_impl *im = attn__cl_impl_of(ctx);
  for (int i = 0; i < im->nprog; ++i) {
    attn__cl_program *p = &im->progs[i];
    if (p->clctx == im->ctx && p->config == c && p->kind == kind && p->features == features) {
      *out = p;
      return ATTN_OK;
    }
  }
  if (im->nprog == ATTN__CL_MAX_PROGRAMS)
    return attn__error(ctx, ATTN_EINTERNAL, "too many OpenCL program variants in one context");
  int narrow = 0;
  int st = build_program(ctx, c, kind, features, &narrow, out);
  /* A forward or backward the device's compiler cannot build in the CPU
   * shape or on the tensor cores is built in the tiled one (ATTN_DEBUG says
   * why); like a narrowed
   * config, the changed config is another: programs built for the old one
   * go, so that none is found for it again. */
  const int shaped =
      kind == ATTN__CL_PROG_ATTN || kind == ATTN__CL_PROG_FWD || kind == ATTN__CL_PROG_BWD;
  int other = 0;
  if ((st == ATTN_EBUILD || st == ATTN_EUNSUPPORTED) && shaped &&
      (attn__cl_config_portable(ctx, c) || attn__cl_config_tiles(c))) {
    attn__debug("opencl: %s; attn_fwd and bwd.cl run the context's passes", ctx->errmsg);
    ctx->errmsg[0] = 0;
    other = 1;
  } else if (st && narrow && attn__cl_config_narrow(ctx, c)) {
    other = 1;
  }
  if (other) {
    attn__cl_drop_programs(im, c);
    st = build_program(ctx, c, kind, features, &narrow, out);
  }
  return st;
}

/* ---------------------------------------------------------------------- */
/* Arguments and launches                                                   */
/* ---------------------------------------------------------------------- */

typedef struct args {
  const attn__cl_api *cl;
  cl_kernel k;
  cl_uint i;
  cl_int err;
} args;

static args args_of(attn__cl_impl *im, cl_kernel k) {
  args a = {im->cl, k, 0, CL_SUCCESS};
  return a;
}

static void arg(args *a, size_t size, const void *value) {
  if (a->err == CL_SUCCESS) a->err = a->cl->clSetKernelArg(a->k, a->i, size, value);
  a->i++;
}

static void arg_mem(args *a, cl_mem m) {
  arg(a, sizeof(cl_mem), m ? &m : NULL);
}

static void arg_int(args *a, cl_int x) {
  arg(a, sizeof x, &x);
}

static void arg_long(args *a, cl_long x) {
  arg(a, sizeof x, &x);
}

static void arg_float(args *a, float x) {
  arg(a, sizeof x, &x);
}

static void arg_long4(args *a, int64_t s0, int64_t s1, int64_t s2, int64_t s3) {
  cl_long4 st;
  st.s[0] = s0;
  st.s[1] = s1;
  st.s[2] = s2;
  st.s[3] = s3;
  arg(a, sizeof st, &st);
}

/* A tensor is three arguments: the buffer, its offset and its strides
 * (sb, ss, sh, sd), in elements. */
static void arg_tensor(args *a, const attn__tensor *t, size_t esize) {
  arg_mem(a, (cl_mem)t->native);
  arg_long(a, (cl_long)(t->offset / esize));
  arg_long4(a, t->sb, t->ss, t->sh, t->sd);
}

/* A bias or dbias: the buffer, its offset, and its strides in the order
 * of its dimensions (b, h, i, j). */
static void arg_bias(args *a, const attn__tensor *t) {
  arg_mem(a, (cl_mem)t->native);
  arg_long(a, (cl_long)(t->offset / attn_dtype_size(t->dtype)));
  arg_long4(a, t->sb, t->sh, t->ss, t->sd);
}

/* A 1-d tensor (sinks, dsinks): buffer, offset, stride. */
static void arg_vector(args *a, const attn__tensor *t) {
  arg_mem(a, (cl_mem)t->native);
  arg_long(a, (cl_long)(t->offset / 4));
  arg_long(a, t->sh);
}

static size_t esize_of(attn_dtype dt) {
  return dt == ATTN_F32 ? 4 : 2;
}

/* A window bound at least as long as both sequences is no bound. */
static cl_int window_arg(int64_t w, const attn__problem *pb) {
  return (w < 0 || w > pb->seqlen_q + pb->seqlen_k) ? -1 : (cl_int)w;
}

static int check_tensor(attn_context *ctx, const char *name, const attn__tensor *t, size_t esize) {
  attn__cl_impl *im = attn__cl_impl_of(ctx);
  if (!t->native) return ATTN_OK;
  if (t->offset % esize)
    return attn__error(ctx, ATTN_EUNSUPPORTED,
                       "%s: the OpenCL backend needs byte offsets that are multiples of the "
                       "element size (%zu), got %zu",
                       name, esize, t->offset);
  cl_context c = NULL;
  cl_int err = im->cl->clGetMemObjectInfo((cl_mem)t->native, CL_MEM_CONTEXT, sizeof c, &c, NULL);
  if (err != CL_SUCCESS)
    return attn__error(ctx, ATTN_EBUFFER, "%s: not a valid cl_mem (%s)", name,
                       attn__cl_errname(err));
  if (c != im->ctx)
    return attn__error(ctx, ATTN_EBUFFER,
                       "%s: the cl_mem belongs to another cl_context than the context's queue; "
                       "pass a queue of that cl_context to attn_context_set_stream()",
                       name);
  return ATTN_OK;
}

/* The native handles are checked only by the launches: plan() also sees
 * problems whose host tensors are not staged yet. */
static int check_tensors(attn_context *ctx, const attn__problem *pb, int backward) {
  const size_t es = esize_of(pb->dtype);
  const size_t bes = pb->has_bias ? attn_dtype_size(pb->bias.dtype) : 4;
  struct {
    const char *name;
    const attn__tensor *t;
    size_t es;
    int backward; /* 0 both passes, 1 backward only, -1 forward only */
  } ts[] = {{"q", &pb->q, es, 0},
            {"k", &pb->k, es, 0},
            {"v", &pb->v, es, 0},
            {"o", &pb->o, es, 0},
            {"lse", &pb->lse, 4, 0},
            {"params.bias", &pb->bias, bes, 0},
            {"params.sinks", &pb->sinks, 4, 0},
            {"params.seqused_k", &pb->seqused_k, 4, -1},
            {"params.block_table", &pb->block_table, 4, -1},
            {"params.k_new", &pb->k_new, es, -1},
            {"params.v_new", &pb->v_new, es, -1},
            {"do", &pb->dout, es, 1},
            {"dq", &pb->dq, es, 1},
            {"dk", &pb->dk, es, 1},
            {"dv", &pb->dv, es, 1},
            {"params.dbias", &pb->dbias, 4, 1},
            {"params.dsinks", &pb->dsinks, 4, 1}};
  for (size_t i = 0; i < sizeof ts / sizeof ts[0]; ++i) {
    if (ts[i].backward == (backward ? -1 : 1)) continue;
    int st = check_tensor(ctx, ts[i].name, ts[i].t, ts[i].es);
    if (st) return st;
  }
  return ATTN_OK;
}

static int launch(attn_context *ctx, cl_kernel k, const args *a, const char *name, size_t g0,
                  size_t g1, size_t g2, size_t l0) {
  attn__cl_impl *im = attn__cl_impl_of(ctx);
  if (a->err != CL_SUCCESS) {
    char what[96];
    snprintf(what, sizeof what, "%s: clSetKernelArg(%u)", name, a->i - 1);
    return attn__cl_fail(ctx, what, a->err);
  }
  if (g0 == 0 || g1 == 0 || g2 == 0) return ATTN_OK;
  size_t global[3] = {g0, g1, g2}, local[3] = {l0, 1, 1};
  cl_int err = im->cl->clEnqueueNDRangeKernel(im->queue, k, 3, NULL, global, local, 0, NULL, NULL);
  if (err != CL_SUCCESS) {
    char what[96];
    snprintf(what, sizeof what, "%s: clEnqueueNDRangeKernel", name);
    return attn__cl_fail(ctx, what, err);
  }
  return ATTN_OK;
}

/* Items covering n, in whole groups of l. */
static size_t cover(int64_t n, size_t l) {
  return ((size_t)n + l - 1) / l * l;
}

static int finish(attn_context *ctx, const attn__problem *pb) {
  attn__cl_impl *im = attn__cl_impl_of(ctx);
  cl_int err = pb->async ? im->cl->clFlush(im->queue) : im->cl->clFinish(im->queue);
  return err == CL_SUCCESS ? ATTN_OK : attn__cl_fail(ctx, pb->async ? "clFlush" : "clFinish", err);
}

/* Offsets into the scratch s, n entries: the caller's host copy, or those
 * of its device buffer (dev) through attn_clamp_offsets (meta.cl), as
 * nothing has checked them. The queue is in order: the kernels that read
 * them follow. */
static int put_offsets(attn_context *ctx, attn__cl_config *c, attn__cl_scratch *s,
                       const int32_t *host, const attn__tensor *dev, int64_t n, int64_t rows) {
  attn__cl_impl *im = attn__cl_impl_of(ctx);
  int st = attn__cl_scratch_put(ctx, s, (size_t)n * sizeof(int32_t), host);
  if (st || host) return st;
  attn__cl_program *p;
  if ((st = attn__cl_program_of(ctx, c, ATTN__CL_PROG_META, 0u, &p))) return st;
  args a = args_of(im, p->k[ATTN__CL_K_OFFSETS]);
  arg_mem(&a, (cl_mem)dev->native);
  arg_long(&a, (cl_long)(dev->offset / sizeof(int32_t)));
  arg_mem(&a, s->mem);
  arg_int(&a, (cl_int)n);
  arg_int(&a, (cl_int)rows);
  return launch(ctx, a.k, &a, "attn_clamp_offsets", 64, 1, 1, 64);
}

/* Puts cu_seqlens and the slopes where the kernels read them, and sizes
 * delta and the partial results; NULL handles for what the problem lacks.
 * Slopes in a device buffer are read there, or copied on the device where
 * they do not start the buffer (the kernels take no offset). */
static int upload_params(attn_context *ctx, attn__cl_config *c, const attn__problem *pb,
                         const attn__cl_workspace *ws, cl_mem *cu_q, cl_mem *cu_k, cl_mem *alibi) {
  attn__cl_impl *im = attn__cl_impl_of(ctx);
  const int64_t n = pb->batch + 1;
  int st = ATTN_OK;
  *cu_q = *cu_k = *alibi = NULL;
  if (ws->cu) {
    if ((st = put_offsets(ctx, c, &im->cu_q, pb->cu_q, &pb->cu_q_dev, n, pb->total_q))) return st;
    *cu_q = im->cu_q.mem;
    if (pb->cu_k || pb->cu_k_dev.native) {
      st = put_offsets(ctx, c, &im->cu_k, pb->cu_k, &pb->cu_k_dev, n, pb->total_k);
      if (st) return st;
      *cu_k = im->cu_k.mem;
    }
  }
  const attn__tensor *ad = &pb->alibi_dev;
  if (ad->native && ad->offset == 0) {
    *alibi = (cl_mem)ad->native;
  } else if (ws->alibi) {
    if ((st = attn__cl_scratch_put(ctx, &im->alibi, ws->alibi, pb->alibi))) return st;
    if (ad->native) {
      cl_int err = im->cl->clEnqueueCopyBuffer(im->queue, (cl_mem)ad->native, im->alibi.mem,
                                               ad->offset, 0, ws->alibi, 0, NULL, NULL);
      if (err != CL_SUCCESS) return attn__cl_fail(ctx, "copying the ALiBi slopes", err);
    }
    *alibi = im->alibi.mem;
  }
  if (ws->delta && (st = attn__cl_scratch_put(ctx, &im->delta, ws->delta, NULL))) return st;
  if (ws->work && (st = attn__cl_scratch_put(ctx, &im->work, ws->work, NULL))) return st;
  if (ws->work2) st = attn__cl_scratch_put(ctx, &im->work2, ws->work2, NULL);
  return st;
}

/* The arguments fwd.cl, decode.cl and bwd.cl share after the tensors. */
static void arg_common(args *a, const attn__problem *pb, cl_mem cu_q, cl_mem cu_k, cl_mem alibi,
                       cl_mem nans) {
  arg_mem(a, cu_q);
  arg_mem(a, cu_k);
  arg_mem(a, alibi);
  arg_int(a, (cl_int)pb->seqlen_q);
  arg_int(a, (cl_int)pb->seqlen_k);
  arg_int(a, (cl_int)(pb->heads_q / pb->heads_kv));
  arg_int(a, (cl_int)pb->head_dim);
  arg_float(a, pb->scale);
  arg_float(a, pb->softcap);
  arg_int(a, window_arg(pb->window_left, pb));
  arg_int(a, window_arg(pb->window_right, pb));
  if (nans) arg_mem(a, nans); /* NAN_ARGS */
}

/* KV_USED_ARGS, PAGED_ARGS, BIAS_ARGS and SINK_ARGS (common.cl), for the
 * features f a program has. */
static void arg_features(args *a, const attn__problem *pb, unsigned f) {
  if (f & ATTN__CL_F_USED) {
    arg_mem(a, (cl_mem)pb->seqused_k.native);
    arg_long(a, (cl_long)(pb->seqused_k.offset / 4));
    arg_long(a, pb->seqused_k.sb);
    arg_int(a, (cl_int)pb->seqlen_new);
  }
  if (f & ATTN__CL_F_PAGED) {
    arg_mem(a, (cl_mem)pb->block_table.native);
    arg_long(a, (cl_long)(pb->block_table.offset / 4));
    arg_long(a, pb->block_table.sb);
    arg_long(a, pb->block_table.ss);
    arg_int(a, (cl_int)pb->page_size);
    arg_int(a, (cl_int)pb->num_pages);
  }
  if (f & ATTN__CL_F_BIAS) arg_bias(a, &pb->bias);
  if (f & ATTN__CL_F_SINKS) arg_vector(a, &pb->sinks);
}

/* What a pass runs with: the plan's program and tiles, and the uploads. */
typedef struct call {
  attn__cl_workspace ws;
  attn__cl_program *p;
  const attn__cl_tiles *t;
  unsigned features;
  size_t es; /* bytes per element of q, k, v, o and the gradients */
  cl_mem cu_q, cu_k, alibi;
  cl_mem nans; /* attn_nan_scan's flag, where the program has the scan (NAN_FLAG) */
} call;

static int prepare(attn_context *ctx, const attn__problem *pb, const attn__plan *plan, call *c) {
  attn__cl_workspace_of(ctx, pb, plan, &c->ws);
  c->features = attn__cl_features(ctx, pb, plan);
  attn__cl_config *config = (attn__cl_config *)plan->config; /* the context's own */
  int st = check_tensors(ctx, pb, plan->backward);
  if (!st)
    st = attn__cl_program_of(ctx, config, attn__cl_prog_kind(plan->kernel, c->features),
                             c->features, &c->p);
  if (!st) st = upload_params(ctx, config, pb, &c->ws, &c->cu_q, &c->cu_k, &c->alibi);
  if (!st) c->t = &c->p->config->t;
  c->es = esize_of(pb->dtype);
  c->nans = NULL;
  if (!st && c->p->k[ATTN__CL_K_NAN_SCAN]) {
    attn__cl_impl *im = attn__cl_impl_of(ctx);
    st = attn__cl_scratch_put(ctx, &im->nans, sizeof(cl_int), NULL);
    c->nans = im->nans.mem;
  }
  return st;
}

/* attn_bwd_zero or attn_nan_scan (then with its flag) over the 4-byte
 * tensor (n0, n1, n2, n3) of strides s at mem + off: a work-item 4 elements
 * of a row in each of up to 16 rows, the grid's height and depth at most
 * 65535 groups (the kernels stride over the rest). */
static int over_rows(attn_context *ctx, cl_kernel k, const char *name, cl_mem mem, int64_t off,
                     const int64_t s[4], const int64_t n[4], cl_mem flag) {
  args a = args_of(attn__cl_impl_of(ctx), k);
  arg_mem(&a, mem);
  arg_long(&a, off);
  arg_long4(&a, s[0], s[1], s[2], s[3]);
  for (int i = 0; i < 4; ++i)
    arg_int(&a, (cl_int)n[i]);
  if (flag) arg_mem(&a, flag);
  const int64_t ny = (n[2] + 15) / 16, nz = n[0] * n[1];
  return launch(ctx, k, &a, name, cover((n[3] + 3) / 4, 64), (size_t)(ny < 65535 ? ny : 65535),
                (size_t)(nz < 65535 ? nz : 65535), 64);
}

/* attn_nan_scan over the call's f32 operands (q, k, v, and dout for the
 * backward), the flag cleared first: what the tensor-core kernels' NaN
 * pass reads. Whole tensors: a KV cache's capacity, every page, so a NaN
 * in a row no query sees costs the pass, not a wrong result. */
static int scan_nans(attn_context *ctx, const attn__problem *pb, const call *c, int backward) {
  attn__cl_impl *im = attn__cl_impl_of(ctx);
  static const cl_int clear = 0; /* a static source: the write need not block */
  cl_int err = im->cl->clEnqueueWriteBuffer(im->queue, c->nans, CL_FALSE, 0, sizeof clear, &clear,
                                            0, NULL, NULL);
  if (err != CL_SUCCESS) return attn__cl_fail(ctx, "clearing the NaN flag", err);
  const int64_t q_rows[2] = {pb->varlen ? 1 : pb->batch, pb->varlen ? pb->total_q : pb->seqlen_q};
  const int64_t k_rows[2] = {pb->page_size ? pb->num_pages
                             : pb->varlen  ? 1
                                           : pb->batch,
                             pb->page_size ? pb->page_size
                             : pb->varlen  ? pb->total_k
                                           : pb->seqlen_k};
  const attn__tensor *ts[4] = {&pb->q, &pb->k, &pb->v, &pb->dout};
  int st = ATTN_OK;
  for (int i = 0; i < (backward ? 4 : 3) && !st; ++i) {
    const attn__tensor *t = ts[i];
    const int64_t *rows = i == 1 || i == 2 ? k_rows : q_rows;
    const int64_t heads = i == 1 || i == 2 ? pb->heads_kv : pb->heads_q, d = pb->head_dim;
    const int64_t strides[4] = {t->sb, t->ss, t->sh, t->sd}, n[4] = {rows[0], rows[1], heads, d};
    st = over_rows(ctx, c->p->k[ATTN__CL_K_NAN_SCAN], "attn_nan_scan", (cl_mem)t->native,
                   (int64_t)(t->offset / 4), strides, n, c->nans);
  }
  return st;
}

/* ---------------------------------------------------------------------- */
/* Forward                                                                  */
/* ---------------------------------------------------------------------- */

/* Whether every row of k and v starts 16 bytes aligned with contiguous
 * columns, so that attn_decode reads 16-byte chunks whole. */
static int rows_aligned(const attn__problem *pb, size_t es) {
  const attn__tensor *ts[2] = {&pb->k, &pb->v};
  if ((size_t)pb->head_dim * es % 16) return 0;
  for (int i = 0; i < 2; ++i) {
    const attn__tensor *t = ts[i];
    if (t->sd != 1 || t->offset % 16 || (size_t)t->ss * es % 16 || (size_t)t->sh * es % 16 ||
        (size_t)t->sb * es % 16)
      return 0;
  }
  return 1;
}

/* The rows' parts merged and the rows ended (split.cl). */
static int split_merge(attn_context *ctx, const attn__problem *pb, const call *c, int nsplit) {
  attn__cl_impl *im = attn__cl_impl_of(ctx);
  attn__tensor no_lse;
  memset(&no_lse, 0, sizeof no_lse);
  args m = args_of(im, c->p->k[ATTN__CL_K_SPLIT_MERGE]);
  arg_tensor(&m, &pb->o, c->es);
  arg_tensor(&m, pb->has_lse ? &pb->lse : &no_lse, 4);
  arg_mem(&m, c->cu_q);
  arg_mem(&m, c->cu_k);
  arg_int(&m, (cl_int)pb->seqlen_q);
  arg_int(&m, (cl_int)pb->seqlen_k);
  arg_int(&m, (cl_int)pb->head_dim);
  arg_int(&m, window_arg(pb->window_left, pb));
  arg_int(&m, window_arg(pb->window_right, pb));
  arg_int(&m, nsplit);
  arg_mem(&m, im->work.mem);
  arg_mem(&m, im->work2.mem);
  arg_int(&m, (cl_int)c->ws.tq);
  arg_features(&m, pb, c->features & (ATTN__CL_F_USED | ATTN__CL_F_SINKS));
  const size_t items = kernel_items[ATTN__CL_K_SPLIT_MERGE];
  return launch(ctx, m.k, &m, "attn_split_merge", (size_t)pb->seqlen_q * items, (size_t)pb->heads_q,
                (size_t)pb->batch, items);
}

int attn__cl_forward(attn_context *ctx, const attn__problem *pb, const attn__plan *plan) {
  attn__cl_impl *im = attn__cl_impl_of(ctx);
  call c;
  int st = prepare(ctx, pb, plan, &c);
  if (st) return st;
  const attn__cl_program *p = c.p;
  const size_t es = c.es;
  const int decode = plan->kernel == ATTN__CL_DECODE;
  attn__cl_split sp;
  attn__cl_split_of(ctx, pb, plan, &sp);
  attn__tensor no_lse;
  memset(&no_lse, 0, sizeof no_lse);
  const int rows = !decode && c.t->fwd == ATTN__CL_FWD_ROWS;
  const int slot = decode && ATTN__CL_DECODES_MMA(c.p->config) ? ATTN__CL_K_DECODE_MMA
                   : decode                                    ? ATTN__CL_K_DECODE
                   : rows                                      ? ATTN__CL_K_FWD_ROWS
                   : c.t->fwd == ATTN__CL_FWD_MMA              ? ATTN__CL_K_FWD_MMA
                                                               : ATTN__CL_K_FWD;
  args a = args_of(im, p->k[slot]);
  arg_tensor(&a, &pb->q, es);
  arg_tensor(&a, &pb->k, es);
  arg_tensor(&a, &pb->v, es);
  arg_tensor(&a, &pb->o, es);
  arg_tensor(&a, pb->has_lse ? &pb->lse : &no_lse, 4);
  arg_common(&a, pb, c.cu_q, c.cu_k, c.alibi, c.nans);
  if (decode) {
    arg_int(&a, sp.nsplit);
    arg_int(&a, sp.nrb);
    arg_int(&a, rows_aligned(pb, es));
    arg_mem(&a, sp.nsplit > 1 ? im->work.mem : NULL);
    arg_mem(&a, sp.nsplit > 1 ? im->work2.mem : NULL);
    arg_int(&a, (cl_int)c.ws.tq);
  }
  arg_features(&a, pb, c.features);
  if (c.features & ATTN__CL_F_SPLIT) {
    arg_int(&a, sp.nsplit);
    arg_mem(&a, im->work.mem);
    arg_mem(&a, im->work2.mem);
    arg_int(&a, (cl_int)c.ws.tq);
  }
  /* Work-groups: the splits of each block of rows, per (key/value) head and
   * sequence. */
  const size_t items = slot == ATTN__CL_K_DECODE_MMA ? kernel_items[slot]
                       : decode                      ? (size_t)c.t->ntd
                       : rows                        ? 1
                                                     : 16 * (size_t)(c.t->br / c.t->tm);
  if (c.nans) st = scan_nans(ctx, pb, &c, 0);
  if (!st)
    st = launch(ctx, a.k, &a, kernel_names[slot], (size_t)sp.nsplit * (size_t)sp.nrb * items,
                (size_t)(decode ? pb->heads_kv : pb->heads_q), (size_t)pb->batch, items);
  if (!st && sp.nsplit > 1) st = split_merge(ctx, pb, &c, sp.nsplit);
  return st ? st : finish(ctx, pb);
}

/* ---------------------------------------------------------------------- */
/* Backward                                                                 */
/* ---------------------------------------------------------------------- */

/* Zeroes a float tensor of shape (n0, n1, n2, n3) and strides s. */
static int zero(attn_context *ctx, const call *c, cl_mem mem, int64_t off, const int64_t s[4],
                const int64_t n[4]) {
  return over_rows(ctx, c->p->k[ATTN__CL_K_ZERO], "attn_bwd_zero", mem, off, s, n, NULL);
}

/* dq, and dbias with it: one launch, or one per sequence and head over
 * which dbias broadcasts, in order, each adding to an element of dbias at
 * most once (DBIAS 1); where dbias broadcasts over the query rows, each
 * launch's row-block sums then added to it (DBIAS 2). */
static int backward_dq(attn_context *ctx, const attn__problem *pb, const call *c, args *b) {
  attn__cl_impl *im = attn__cl_impl_of(ctx);
  const int rows = c->t->bwd == ATTN__CL_BWD_ROWS, mma = c->t->bwd == ATTN__CL_BWD_MMA;
  const int block = attn__cl_dq_rows(c->t);
  const size_t items = rows ? 1 : mma ? kernel_items[ATTN__CL_K_DQ_MMA] : bwd_items(c->t);
  const char *name = kernel_names[rows  ? ATTN__CL_K_DQ_ROWS
                                  : mma ? ATTN__CL_K_DQ_MMA
                                        : ATTN__CL_K_DQ];
  const size_t blocks = (size_t)((pb->seqlen_q + block - 1) / block);
  arg_tensor(b, &pb->dq, c->es);
  if (!(c->features & (ATTN__CL_F_DBIAS1 | ATTN__CL_F_DBIAS2)))
    return launch(ctx, b->k, b, name, blocks * items, (size_t)pb->heads_q, (size_t)pb->batch,
                  items);

  /* dbias's shape: 1 where it broadcasts. */
  const attn__tensor *db = &pb->dbias;
  const int64_t n[4] = {db->sb ? pb->batch : 1, db->sh ? pb->heads_q : 1, db->ss ? pb->seqlen_q : 1,
                        pb->seqlen_k};
  const int64_t s[4] = {db->sb, db->sh, db->ss, db->sd};
  const int over_b = n[0] < pb->batch, over_h = n[1] < pb->heads_q;
  const int sums = (c->features & ATTN__CL_F_DBIAS2) != 0;
  /* Each launch's grid: one sequence or head where dbias sums over them. */
  const size_t gy = over_h ? 1 : (size_t)pb->heads_q, gz = over_b ? 1 : (size_t)pb->batch;
  arg_bias(b, db);
  const cl_uint i_b0 = b->i;
  arg_int(b, 0);
  arg_int(b, 0);
  arg_mem(b, sums ? im->work.mem : NULL);
  int st = zero(ctx, c, (cl_mem)db->native, (int64_t)(db->offset / 4), s, n);
  args a = args_of(im, sums ? c->p->k[ATTN__CL_K_DBIAS_SUM] : NULL);
  const int64_t ps[4] = {(int64_t)(gy * blocks) * pb->seqlen_k, (int64_t)blocks * pb->seqlen_k,
                         pb->seqlen_k, 1};
  const int64_t pn[4] = {(int64_t)gz, (int64_t)gy, (int64_t)blocks, pb->seqlen_k};
  const cl_uint i_sum_b0 = 3;
  if (sums) {
    arg_mem(&a, im->work.mem);
    arg_int(&a, (cl_int)blocks);
    arg_int(&a, (cl_int)pb->seqlen_k);
    arg_int(&a, 0);
    arg_int(&a, 0);
    arg_bias(&a, db);
  }
  const int64_t nb = over_b ? pb->batch : 1, nh = over_h ? pb->heads_q : 1;
  for (int64_t b0 = 0; b0 < nb && !st; ++b0)
    for (int64_t h0 = 0; h0 < nh && !st; ++h0) {
      const cl_int v[2] = {(cl_int)b0, (cl_int)h0};
      for (int j = 0; j < 2 && b->err == CL_SUCCESS; ++j)
        b->err = im->cl->clSetKernelArg(b->k, i_b0 + (cl_uint)j, sizeof v[j], &v[j]);
      if (sums) st = zero(ctx, c, im->work.mem, 0, ps, pn);
      if (!st) st = launch(ctx, b->k, b, name, blocks * items, gy, gz, items);
      if (st || !sums) continue;
      for (int j = 0; j < 2 && a.err == CL_SUCCESS; ++j)
        a.err = im->cl->clSetKernelArg(a.k, i_sum_b0 + (cl_uint)j, sizeof v[j], &v[j]);
      st = launch(ctx, a.k, &a, "attn_bwd_dbias_sum", cover(pb->seqlen_k, 64), gy, gz, 64);
    }
  return st;
}

int attn__cl_backward(attn_context *ctx, const attn__problem *pb, const attn__plan *plan) {
  attn__cl_impl *im = attn__cl_impl_of(ctx);
  call c;
  int st = prepare(ctx, pb, plan, &c);
  if (st) return st;
  const int64_t tq = c.ws.tq;
  const size_t es = c.es;
  const attn__cl_program *p = c.p;

  /* delta = rowsum(dO * O) */
  args a = args_of(im, p->k[ATTN__CL_K_PRE]);
  arg_tensor(&a, &pb->o, es);
  arg_tensor(&a, &pb->dout, es);
  arg_mem(&a, im->delta.mem);
  arg_mem(&a, c.cu_q);
  arg_int(&a, (cl_int)pb->seqlen_q);
  arg_int(&a, (cl_int)pb->head_dim);
  arg_int(&a, (cl_int)tq);
  st = launch(ctx, a.k, &a, "attn_bwd_pre", cover(pb->seqlen_q, 64), (size_t)pb->heads_q,
              (size_t)pb->batch, 64);
  if (st) return st;
  if (c.nans && (st = scan_nans(ctx, pb, &c, 1))) return st;

  const int rows = c.t->bwd == ATTN__CL_BWD_ROWS, mma = c.t->bwd == ATTN__CL_BWD_MMA;
  const int hd = ((const attn__cl_config *)plan->config)->hd;
  const int chunks = c.ws.dq_chunks, kpc = c.ws.dq_kpc;
  if (chunks) {
    /* dQ's parts, added to from zero. */
    const int64_t s[4] = {0, tq * hd, hd, 1}, n[4] = {1, (int64_t)chunks * pb->heads_q, tq, hd};
    st = zero(ctx, &c, im->work.mem, 0, s, n);
    if (st) return st;
  }
  const int slots[2] = {rows  ? ATTN__CL_K_DKDV_ROWS
                        : mma ? ATTN__CL_K_DKDV_MMA
                              : ATTN__CL_K_DKDV,
                        rows                           ? ATTN__CL_K_DQ_ROWS
                        : c.t->bwd == ATTN__CL_BWD_MMA ? ATTN__CL_K_DQ_MMA
                                                       : ATTN__CL_K_DQ};
  for (int w = 0; w < 2; ++w) {
    args b = args_of(im, p->k[slots[w]]);
    arg_tensor(&b, &pb->q, es);
    arg_tensor(&b, &pb->k, es);
    arg_tensor(&b, &pb->v, es);
    arg_tensor(&b, &pb->dout, es);
    arg_tensor(&b, &pb->lse, 4);
    arg_mem(&b, im->delta.mem);
    arg_common(&b, pb, c.cu_q, c.cu_k, c.alibi, c.nans);
    arg_int(&b, (cl_int)tq);
    if (c.features & ATTN__CL_F_BIAS) arg_bias(&b, &pb->bias);
    if (w == 0) {
      arg_tensor(&b, &pb->dk, es);
      arg_tensor(&b, &pb->dv, es);
      const int block = rows ? c.t->kb : mma ? attn__cl_mma_key_rows(pb->dtype, hd) : c.t->bk;
      const size_t items = rows ? 1 : mma ? kernel_items[ATTN__CL_K_DKDV_MMA] : bwd_items(c.t);
      size_t gx = (size_t)((pb->seqlen_k + block - 1) / block) * items;
      if (rows) {
        /* A key block a work-item, or a chunk of them with dQ's parts. */
        arg_mem(&b, chunks ? im->work.mem : NULL);
        arg_int(&b, chunks ? kpc : 1);
        if (chunks) gx = (size_t)chunks;
      }
      st = launch(ctx, b.k, &b, kernel_names[slots[0]], gx, (size_t)pb->heads_kv, (size_t)pb->batch,
                  items);
    } else if (chunks) {
      args s = args_of(im, p->k[ATTN__CL_K_DQ_PARTS]);
      arg_mem(&s, im->work.mem);
      arg_int(&s, chunks);
      arg_mem(&s, c.cu_q);
      arg_int(&s, (cl_int)pb->seqlen_q);
      arg_int(&s, (cl_int)tq);
      arg_int(&s, (cl_int)pb->head_dim);
      arg_float(&s, (float)pb->scale);
      arg_tensor(&s, &pb->dq, es);
      st = launch(ctx, s.k, &s, kernel_names[ATTN__CL_K_DQ_PARTS], cover(pb->seqlen_q, 64),
                  (size_t)pb->heads_q, (size_t)pb->batch, 64);
    } else {
      st = backward_dq(ctx, pb, &c, &b);
    }
    if (st) return st;
  }

  if (c.features & ATTN__CL_F_SINKS) {
    args s = args_of(im, p->k[ATTN__CL_K_DSINKS]);
    arg_tensor(&s, &pb->lse, 4);
    arg_mem(&s, im->delta.mem);
    arg_mem(&s, c.cu_q);
    arg_int(&s, (cl_int)pb->seqlen_q);
    arg_int(&s, (cl_int)pb->batch);
    arg_int(&s, (cl_int)tq);
    arg_vector(&s, &pb->sinks);
    arg_vector(&s, &pb->dsinks);
    st = launch(ctx, s.k, &s, "attn_bwd_dsinks", 64, (size_t)pb->heads_q, 1, 64);
    if (st) return st;
  }
  return finish(ctx, pb);
}

/* ---------------------------------------------------------------------- */
/* The KV-cache append and attn_merge                                       */
/* ---------------------------------------------------------------------- */

int attn__cl_append(attn_context *ctx, const attn__problem *pb) {
  attn__cl_impl *im = attn__cl_impl_of(ctx);
  attn__cl_config *c = attn__cl_config_for(ctx, pb->dtype, pb->head_dim);
  if (!c) return ATTN_EUNSUPPORTED;
  const unsigned f = pb->page_size ? ATTN__CL_F_PAGED : 0u;
  const size_t es = esize_of(pb->dtype);
  attn__cl_program *p;
  int st = check_tensors(ctx, pb, 0);
  if (!st) st = attn__cl_program_of(ctx, c, ATTN__CL_PROG_APPEND, f, &p);
  cl_mem cu_k = NULL;
  if (!st && (pb->cu_k || pb->cu_k_dev.native)) {
    st = put_offsets(ctx, c, &im->cu_k, pb->cu_k, &pb->cu_k_dev, pb->batch + 1, pb->total_k);
    cu_k = im->cu_k.mem;
  }
  if (st) return st;
  args a = args_of(im, p->k[ATTN__CL_K_APPEND]);
  arg_tensor(&a, &pb->k_new, es);
  arg_tensor(&a, &pb->v_new, es);
  arg_tensor(&a, &pb->k, es);
  arg_tensor(&a, &pb->v, es);
  arg_mem(&a, cu_k);
  arg_int(&a, (cl_int)pb->seqlen_k);
  arg_int(&a, (cl_int)pb->seqlen_new);
  arg_int(&a, (cl_int)pb->heads_kv);
  arg_int(&a, (cl_int)pb->head_dim);
  arg_mem(&a, (cl_mem)pb->seqused_k.native);
  arg_long(&a, (cl_long)(pb->seqused_k.offset / 4));
  arg_long(&a, pb->seqused_k.sb);
  arg_features(&a, pb, f);
  /* The forward pass follows on the same in-order queue. */
  return launch(ctx, a.k, &a, "attn_append", cover(pb->head_dim, 64),
                (size_t)(pb->seqlen_new * pb->heads_kv), (size_t)pb->batch, 64);
}

int attn__cl_merge(attn_context *ctx, const attn__merge *m) {
  attn__cl_impl *im = attn__cl_impl_of(ctx);
  attn__cl_config *c = attn__cl_config_for(ctx, m->dtype, m->head_dim);
  if (!c) return ATTN_EUNSUPPORTED;
  const size_t es = esize_of(m->dtype);
  const int64_t rows = m->batch * m->seqlen * m->heads;
  int st = check_tensor(ctx, "o", &m->o, es);
  if (!st && m->has_lse) st = check_tensor(ctx, "lse", &m->lse, 4);
  for (int s = 0; s < m->n && !st; ++s) {
    st = check_tensor(ctx, "o_parts", &m->o_parts[s], es);
    if (!st) st = check_tensor(ctx, "lse_parts", &m->lse_parts[s], 4);
  }
  attn__cl_program *p;
  if (!st) st = attn__cl_program_of(ctx, c, ATTN__CL_PROG_MERGE, 0u, &p);
  /* work: the sums of o; work2: each row's m, then l twice (read from one,
   * written to the other). */
  if (!st)
    st = attn__cl_scratch_put(ctx, &im->work, (size_t)(rows * m->head_dim) * sizeof(float), NULL);
  if (!st) st = attn__cl_scratch_put(ctx, &im->work2, (size_t)(3 * rows) * sizeof(float), NULL);
  if (st) return st;
  attn__tensor no_lse;
  memset(&no_lse, 0, sizeof no_lse);
  const size_t y = (size_t)(m->seqlen * m->heads);
  for (int s = 0; s < m->n && !st; ++s) {
    args a = args_of(im, p->k[ATTN__CL_K_MERGE_MAX]);
    arg_tensor(&a, &m->lse_parts[s], 4);
    arg_mem(&a, im->work2.mem);
    arg_int(&a, (cl_int)m->seqlen);
    arg_int(&a, (cl_int)m->heads);
    arg_int(&a, s == 0);
    st = launch(ctx, a.k, &a, "attn_merge_max", 1, y, (size_t)m->batch, 1);
  }
  for (int s = 0; s < m->n && !st; ++s) {
    args a = args_of(im, p->k[ATTN__CL_K_MERGE_ADD]);
    arg_tensor(&a, &m->o_parts[s], es);
    arg_tensor(&a, &m->lse_parts[s], 4);
    arg_mem(&a, im->work2.mem);
    arg_mem(&a, im->work.mem);
    arg_tensor(&a, &m->o, es);
    arg_tensor(&a, m->has_lse ? &m->lse : &no_lse, 4);
    arg_int(&a, (cl_int)m->seqlen);
    arg_int(&a, (cl_int)m->heads);
    arg_int(&a, (cl_int)m->head_dim);
    arg_int(&a, s == 0);
    arg_int(&a, s == m->n - 1);
    arg_int(&a, s % 2);
    st = launch(ctx, a.k, &a, "attn_merge_add", cover(m->head_dim, 64), y, (size_t)m->batch, 64);
  }
  if (st) return st;
  cl_int err = im->cl->clFinish(im->queue);
  return err == CL_SUCCESS ? ATTN_OK : attn__cl_fail(ctx, "clFinish", err);
}
