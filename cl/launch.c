/*
 * The OpenCL backend's launches: the attention programs (common.cl, fwd.cl
 * and bwd.cl built with the plan's tiles), the kernels' arguments, and the
 * forward and backward passes enqueued on the context's queue.
 *
 * Programs are built per (cl_context, config) on first use and kept for the
 * context's life.
 *
 * Backward is always deterministic here: dQ and dK/dV come from separate
 * kernels that each own their outputs (bwd.cl), with or without
 * ATTN_DETERMINISTIC.
 */
#include "attn_cl.h"

#include <stdio.h>

/* ---------------------------------------------------------------------- */
/* Programs                                                                 */
/* ---------------------------------------------------------------------- */

static void release_one(attn__cl_impl *im, attn__cl_program *p) {
  cl_kernel ks[4] = {p->fwd, p->pre, p->dkdv, p->dq};
  for (int j = 0; j < 4; ++j)
    if (ks[j]) im->cl->clReleaseKernel(ks[j]);
  if (p->prog) im->cl->clReleaseProgram(p->prog);
  if (p->clctx) im->cl->clReleaseContext(p->clctx);
  memset(p, 0, sizeof *p);
}

void attn__cl_release_programs(attn__cl_impl *im) {
  for (int i = 0; i < im->nprog; ++i)
    release_one(im, &im->progs[i]);
  im->nprog = 0;
}

/* Builds the program of config c into the next entry. *narrow is set when
 * the compiled forward kernel cannot run the GPU row's 256 work-items. */
static int build_program(attn_context *ctx, const attn__cl_config *c, int *narrow,
                         attn__cl_program **out) {
  attn__cl_impl *im = attn__cl_impl_of(ctx);
  const attn__cl_api *cl = im->cl;
  const attn__cl_tiles *t = &c->t;
  attn__cl_program p;
  memset(&p, 0, sizeof p);
  p.config = c;
  *narrow = 0;
  char opts[256];
  snprintf(opts, sizeof opts,
           "-cl-std=CL1.2 -DDTYPE=%d -DHD=%d -DBR=%d -DBC=%d -DTM=%d -DDK=%d -DJK=%d -DBB=%d",
           c->dtype, c->hd, t->br, t->bc, t->tm, t->dk, t->jk, t->bb);
  const char *srcs[3] = {attn__cl_src_common, attn__cl_src_fwd, attn__cl_src_bwd};
  const char *names[4] = {"attn_fwd", "attn_bwd_pre", "attn_bwd_dkdv", "attn_bwd_dq"};
  cl_kernel ks[4];
  int st = attn__cl_build(ctx, cl, im->ctx, im->dev->id, srcs, 3, opts, names, 4, &p.prog, ks);
  if (st) return st;
  cl->clRetainContext(im->ctx);
  p.clctx = im->ctx;
  p.fwd = ks[0];
  p.pre = ks[1];
  p.dkdv = ks[2];
  p.dq = ks[3];
  for (int i = 0; i < 4 && !st; ++i) {
    size_t wg = 0;
    cl->clGetKernelWorkGroupInfo(ks[i], im->dev->id, CL_KERNEL_WORK_GROUP_SIZE, sizeof wg, &wg,
                                 NULL);
    const size_t need = i == 0 ? (size_t)(16 * (t->br / t->tm)) : i == 1 ? 64 : 128;
    if (wg < need && i == 0 && need > 128 && !c->narrow) {
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

/* The program of the plan's config in the context's cl_context. A GPU
 * config whose forward kernel cannot run its work-group is replaced, once,
 * by the device's 128-item row (attn__cl_config_narrow), so that the plan's
 * config still names what runs. */
int attn__cl_program_of(attn_context *ctx, const attn__plan *plan, attn__cl_program **out) {
  attn__cl_impl *im = attn__cl_impl_of(ctx);
  attn__cl_config *c = (attn__cl_config *)plan->config; /* the context's own */
  for (int i = 0; i < im->nprog; ++i) {
    attn__cl_program *p = &im->progs[i];
    if (p->clctx == im->ctx && p->config == c) {
      *out = p;
      return ATTN_OK;
    }
  }
  if (im->nprog == ATTN__CL_MAX_PROGRAMS)
    return attn__error(ctx, ATTN_EINTERNAL, "too many OpenCL program variants in one context");
  int narrow = 0;
  int st = build_program(ctx, c, &narrow, out);
  if (st && narrow && attn__cl_config_narrow(ctx, c)) st = build_program(ctx, c, &narrow, out);
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

static void arg_float(args *a, float x) {
  arg(a, sizeof x, &x);
}

/* A tensor is three arguments: the buffer, its offset and its strides, in
 * elements. */
static void arg_tensor(args *a, const attn__tensor *t, size_t esize) {
  cl_long off = (cl_long)(t->offset / esize);
  cl_long4 st;
  st.s[0] = t->sb;
  st.s[1] = t->ss;
  st.s[2] = t->sh;
  st.s[3] = t->sd;
  arg_mem(a, (cl_mem)t->native);
  arg(a, sizeof off, &off);
  arg(a, sizeof st, &st);
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

/* The native handles are checked only by forward and backward: plan()
 * also sees problems whose host tensors are not staged yet. */
static int check_tensors(attn_context *ctx, const attn__problem *pb, int backward) {
  const size_t es = esize_of(pb->dtype);
  struct {
    const char *name;
    const attn__tensor *t;
    size_t es;
  } ts[9] = {{"q", &pb->q, es},   {"k", &pb->k, es},    {"v", &pb->v, es},
             {"o", &pb->o, es},   {"lse", &pb->lse, 4}, {"dout", &pb->dout, es},
             {"dq", &pb->dq, es}, {"dk", &pb->dk, es},  {"dv", &pb->dv, es}};
  int n = backward ? 9 : 5;
  for (int i = 0; i < n; ++i) {
    int st = check_tensor(ctx, ts[i].name, ts[i].t, ts[i].es);
    if (st) return st;
  }
  return ATTN_OK;
}

/* Uploads cu_seqlens and slopes, and sizes delta; NULL handles for what
 * the problem lacks. */
static int upload_params(attn_context *ctx, const attn__problem *pb, const attn__cl_workspace *ws,
                         cl_mem *cu_q, cl_mem *cu_k, cl_mem *alibi) {
  attn__cl_impl *im = attn__cl_impl_of(ctx);
  int st = ATTN_OK;
  *cu_q = *cu_k = *alibi = NULL;
  if (ws->cu) {
    if ((st = attn__cl_scratch_put(ctx, &im->cu_q, ws->cu, pb->cu_q))) return st;
    if ((st = attn__cl_scratch_put(ctx, &im->cu_k, ws->cu, pb->cu_k))) return st;
    *cu_q = im->cu_q.mem;
    *cu_k = im->cu_k.mem;
  }
  if (ws->alibi) {
    if ((st = attn__cl_scratch_put(ctx, &im->alibi, ws->alibi, pb->alibi))) return st;
    *alibi = im->alibi.mem;
  }
  if (ws->delta) st = attn__cl_scratch_put(ctx, &im->delta, ws->delta, NULL);
  return st;
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

static int finish(attn_context *ctx, const attn__problem *pb) {
  attn__cl_impl *im = attn__cl_impl_of(ctx);
  cl_int err = pb->async ? im->cl->clFlush(im->queue) : im->cl->clFinish(im->queue);
  return err == CL_SUCCESS ? ATTN_OK : attn__cl_fail(ctx, pb->async ? "clFlush" : "clFinish", err);
}

/* The arguments fwd.cl and bwd.cl share after the tensors. */
static void arg_common(args *a, const attn__problem *pb, cl_mem cu_q, cl_mem cu_k, cl_mem alibi) {
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
}

/* What a pass runs with: the plan's program and tiles, and the uploads. */
typedef struct call {
  attn__cl_workspace ws;
  attn__cl_program *p;
  const attn__cl_tiles *t;
  size_t es; /* bytes per element of q, k, v, o and the gradients */
  cl_mem cu_q, cu_k, alibi;
} call;

static int prepare(attn_context *ctx, const attn__problem *pb, const attn__plan *plan, call *c) {
  attn__cl_workspace_of(pb, plan->backward, &c->ws);
  int st = check_tensors(ctx, pb, plan->backward);
  if (!st) st = attn__cl_program_of(ctx, plan, &c->p);
  if (!st) st = upload_params(ctx, pb, &c->ws, &c->cu_q, &c->cu_k, &c->alibi);
  if (!st) c->t = &c->p->config->t;
  c->es = esize_of(pb->dtype);
  return st;
}

int attn__cl_forward(attn_context *ctx, const attn__problem *pb, const attn__plan *plan) {
  attn__cl_impl *im = attn__cl_impl_of(ctx);
  call c;
  int st = prepare(ctx, pb, plan, &c);
  if (st) return st;
  const attn__cl_program *p = c.p;
  const attn__cl_tiles *t = c.t;
  const size_t es = c.es;
  args a = {im->cl, p->fwd, 0, CL_SUCCESS};
  arg_tensor(&a, &pb->q, es);
  arg_tensor(&a, &pb->k, es);
  arg_tensor(&a, &pb->v, es);
  arg_tensor(&a, &pb->o, es);
  attn__tensor no_lse;
  memset(&no_lse, 0, sizeof no_lse);
  arg_tensor(&a, pb->has_lse ? &pb->lse : &no_lse, 4);
  arg_common(&a, pb, c.cu_q, c.cu_k, c.alibi);
  const size_t nt = 16 * (size_t)(t->br / t->tm);
  const size_t blocks = (size_t)((pb->seqlen_q + t->br - 1) / t->br);
  st = launch(ctx, p->fwd, &a, "attn_fwd", blocks * nt, (size_t)pb->heads_q, (size_t)pb->batch, nt);
  return st ? st : finish(ctx, pb);
}

int attn__cl_backward(attn_context *ctx, const attn__problem *pb, const attn__plan *plan) {
  attn__cl_impl *im = attn__cl_impl_of(ctx);
  call c;
  int st = prepare(ctx, pb, plan, &c);
  if (st) return st;
  const int64_t tq = c.ws.tq;
  const size_t es = c.es;

  /* delta = rowsum(dO * O) */
  args a = {im->cl, c.p->pre, 0, CL_SUCCESS};
  arg_tensor(&a, &pb->o, es);
  arg_tensor(&a, &pb->dout, es);
  arg_mem(&a, im->delta.mem);
  arg_mem(&a, c.cu_q);
  arg_int(&a, (cl_int)pb->seqlen_q);
  arg_int(&a, (cl_int)pb->head_dim);
  arg_int(&a, (cl_int)tq);
  st = launch(ctx, c.p->pre, &a, "attn_bwd_pre", (size_t)(pb->seqlen_q + 63) / 64 * 64,
              (size_t)pb->heads_q, (size_t)pb->batch, 64);
  if (st) return st;

  cl_kernel ks[2] = {c.p->dkdv, c.p->dq};
  for (int w = 0; w < 2; ++w) {
    args b = {im->cl, ks[w], 0, CL_SUCCESS};
    arg_tensor(&b, &pb->q, es);
    arg_tensor(&b, &pb->k, es);
    arg_tensor(&b, &pb->v, es);
    arg_tensor(&b, &pb->dout, es);
    arg_tensor(&b, &pb->lse, 4);
    arg_mem(&b, im->delta.mem);
    arg_common(&b, pb, c.cu_q, c.cu_k, c.alibi);
    arg_int(&b, (cl_int)tq);
    if (w == 0) {
      arg_tensor(&b, &pb->dk, es);
      arg_tensor(&b, &pb->dv, es);
      st = launch(ctx, ks[w], &b, "attn_bwd_dkdv",
                  (size_t)((pb->seqlen_k + c.t->bb - 1) / c.t->bb) * 128, (size_t)pb->heads_kv,
                  (size_t)pb->batch, 128);
    } else {
      arg_tensor(&b, &pb->dq, es);
      st = launch(ctx, ks[w], &b, "attn_bwd_dq",
                  (size_t)((pb->seqlen_q + c.t->bb - 1) / c.t->bb) * 128, (size_t)pb->heads_q,
                  (size_t)pb->batch, 128);
    }
    if (st) return st;
  }
  return finish(ctx, pb);
}
