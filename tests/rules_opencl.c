/*
 * The OpenCL evaluator of the cross-language rules test (rules_table.h):
 * cl/common.cl, as the library embeds it, followed by a kernel that applies
 * each rule to one row of the table, run in an attn context on "opencl": the
 * device, cl_context and queue the backend itself picks, so this runs where
 * the backend does and says why where it does not. Built only with the
 * OpenCL backend (tests/rules_none.c stands in otherwise).
 *
 * OpenCL C has no log2-domain score: score_log2 is score * M_LOG2E_F,
 * computed in the kernel.
 */
#include "rules_table.h"

#include <stdio.h>

#include "attn_cl.h"

#include <stdlib.h>

/* Ten ints and five floats in, ten ints and four floats out, per row. The
 * rules' out-parameters are private pointers (OpenCL C 1.2 has no generic
 * address space), so the ranges land in v first. */
static const char rules_kernel[] =
    "__kernel void rules_eval(__global const int *ai, __global const float *af,\n"
    "                         __global int *oi, __global float *of, int n) {\n"
    "  const int r = get_global_id(0);\n"
    "  if (r >= n) return;\n"
    "  __global const int *a = ai + 10 * r;\n"
    "  __global const float *f = af + 5 * r;\n"
    "  const int nq = a[0], nk = a[1], wl = a[2], wr = a[3], i = a[4], j = a[5];\n"
    "  int v[10];\n"
    "  const int dg = diag(i, nq, nk);\n"
    "  v[0] = dg;\n"
    "  key_range(dg, nk, wl, wr, &v[1], &v[2]);\n"
    "  query_range(j, nq, nk, wl, wr, &v[3], &v[4]);\n"
    "  key_block_range(a[6], a[7], nq, nk, wl, wr, &v[5], &v[6]);\n"
    "  query_block_range(a[8], a[9], nq, nk, wl, wr, &v[7], &v[8]);\n"
    "  v[9] = key_visible(dg, j, wl, wr);\n"
    "  for (int u = 0; u < 10; ++u) oi[10 * r + u] = v[u];\n"
    "  float t;\n"
    "  const float s = score(f[0], f[1], f[2], f[3], dg - j, &t);\n"
    "  of[4 * r + 0] = s;\n"
    "  of[4 * r + 1] = t;\n"
    "  of[4 * r + 2] = s * M_LOG2E_F;\n"
    "  of[4 * r + 3] = score_grad(f[4], t, f[2]);\n"
    "}\n";

typedef struct run {
  const attn__cl_api *cl;
  cl_context ctx;         /* the attn context's */
  cl_command_queue queue; /* the attn context's */
  cl_program prog;
  cl_kernel kernel;
  cl_mem mem[4];
} run;

static void run_release(run *r) {
  const attn__cl_api *cl = r->cl;
  for (int i = 0; i < 4; ++i)
    if (r->mem[i]) cl->clReleaseMemObject(r->mem[i]);
  if (r->kernel) cl->clReleaseKernel(r->kernel);
  if (r->prog) cl->clReleaseProgram(r->prog);
}

/* Evaluates the rows on dev; a failure is a sentence in why. */
static int eval_on(run *r, cl_device_id dev, const rules_in *in, int n, rules_out *out, char *why,
                   size_t why_len) {
  const attn__cl_api *cl = r->cl;
  cl_int err = CL_SUCCESS;
  const char *step = "";
  if (!err) {
    step = "clCreateProgramWithSource";
    const char *srcs[2] = {attn__cl_src_common, rules_kernel};
    r->prog = cl->clCreateProgramWithSource(r->ctx, 2, srcs, NULL, &err);
  }
  if (!err) {
    step = "clBuildProgram";
    err = cl->clBuildProgram(r->prog, 1, &dev, "-cl-std=CL1.2", NULL, NULL);
    if (err) {
      char log[1024] = "";
      cl->clGetProgramBuildInfo(r->prog, dev, CL_PROGRAM_BUILD_LOG, sizeof log - 1, log, NULL);
      snprintf(why, why_len, "the rules kernel does not build (%s): %s", attn__cl_errname(err),
               log);
      return -2;
    }
  }
  if (!err) {
    step = "clCreateKernel";
    r->kernel = cl->clCreateKernel(r->prog, "rules_eval", &err);
  }
  int32_t *ai = (int32_t *)malloc((size_t)n * 10 * sizeof *ai);
  float *af = (float *)malloc((size_t)n * 5 * sizeof *af);
  int32_t *oi = (int32_t *)malloc((size_t)n * 10 * sizeof *oi);
  float *of = (float *)malloc((size_t)n * 4 * sizeof *of);
  if (!ai || !af || !oi || !of) {
    free(ai);
    free(af);
    free(oi);
    free(of);
    snprintf(why, why_len, "out of memory for %d rows", n);
    return -2;
  }
  for (int i = 0; i < n; ++i) {
    const rules_in *x = &in[i];
    const int32_t v[10] = {x->nq, x->nk, x->wl, x->wr, x->i, x->j, x->i0, x->i1, x->j0, x->j1};
    const float w[5] = {x->dot, x->scale, x->softcap, x->slope, x->ds};
    memcpy(ai + 10 * i, v, sizeof v);
    memcpy(af + 5 * i, w, sizeof w);
  }
  const size_t bytes[4] = {(size_t)n * 40, (size_t)n * 20, (size_t)n * 40, (size_t)n * 16};
  void *host[4] = {ai, af, oi, of};
  for (int m = 0; m < 4 && !err; ++m) {
    step = "clCreateBuffer";
    r->mem[m] = cl->clCreateBuffer(r->ctx, CL_MEM_READ_WRITE | (m < 2 ? CL_MEM_COPY_HOST_PTR : 0),
                                   bytes[m], m < 2 ? host[m] : NULL, &err);
  }
  for (cl_uint m = 0; m < 4 && !err; ++m) {
    step = "clSetKernelArg";
    err = cl->clSetKernelArg(r->kernel, m, sizeof(cl_mem), &r->mem[m]);
  }
  if (!err) err = cl->clSetKernelArg(r->kernel, 4, sizeof(cl_int), &n);
  if (!err) {
    step = "clEnqueueNDRangeKernel";
    size_t global = (size_t)n;
    err = cl->clEnqueueNDRangeKernel(r->queue, r->kernel, 1, NULL, &global, NULL, 0, NULL, NULL);
  }
  for (int m = 2; m < 4 && !err; ++m) {
    step = "clEnqueueReadBuffer";
    err =
        cl->clEnqueueReadBuffer(r->queue, r->mem[m], CL_TRUE, 0, bytes[m], host[m], 0, NULL, NULL);
  }
  if (!err)
    for (int i = 0; i < n; ++i) {
      const int32_t *v = oi + 10 * i;
      const float *w = of + 4 * i;
      rules_out *o = &out[i];
      o->diag = v[0];
      o->key_lo = v[1];
      o->key_hi = v[2];
      o->query_lo = v[3];
      o->query_hi = v[4];
      o->kblock_lo = v[5];
      o->kblock_hi = v[6];
      o->qblock_lo = v[7];
      o->qblock_hi = v[8];
      o->visible = v[9];
      o->unmasked = -1; /* OpenCL C has no tile rule (rows_common_keys is per row run) */
      o->score = w[0];
      o->t = w[1];
      o->score_log2 = w[2];
      o->grad = w[3];
    }
  free(ai);
  free(af);
  free(oi);
  free(of);
  if (err) {
    snprintf(why, why_len, "%s failed (%s)", step, attn__cl_errname(err));
    return -2;
  }
  return 0;
}

int rules_eval_opencl(const rules_in *in, int n, rules_out *out, char *why, size_t why_len) {
  attn_context *actx = NULL;
  if (attn_context_create("opencl", &actx) != ATTN_OK) {
    snprintf(why, why_len, "%s", attn_errmsg(actx));
    attn_context_free(actx);
    return -1;
  }
  int st = 0;
  if (n > 0) {
    const attn__cl_impl *im = attn__cl_impl_of(actx);
    run r;
    memset(&r, 0, sizeof r);
    r.cl = im->cl;
    r.ctx = im->ctx;
    r.queue = im->queue;
    st = eval_on(&r, im->dev->id, in, n, out, why, why_len);
    run_release(&r);
  }
  attn_context_free(actx);
  return st;
}
