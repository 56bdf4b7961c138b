/*
 * Each OpenCL kernel source compiles on its own, after common.cl, with no
 * -D option: every parameter has a default (CLBlast's #ifndef NAME style),
 * so a reader can build and read one file without the host's option list.
 * Runs on the device an "opencl" context gets; exits 77 (skipped) where
 * there is none. The tensor-core files (inline PTX) only where the device
 * is an NVIDIA GPU of compute capability 8.0 or later, which alone takes
 * them. A file that builds on another's definitions comes after the files
 * it names as its predecessors, as the programs have them: bwd.cl before
 * bwd_rows.cl and bwd_mma.cl (its arguments and p_ds, the backward's P and
 * dS), mma.cl before the tensor-core kernels.
 */
#include "attn_cl.h"

#include <stdio.h>

int main(void) {
  /* The backend's own device and cl_context. */
  attn_context *actx = NULL;
  if (attn_context_create("opencl", &actx) != ATTN_OK) {
    printf("skipped: %s\n", attn_errmsg(actx));
    attn_context_free(actx);
    return 77;
  }
  const attn__cl_impl *im = attn__cl_impl_of(actx);
  const attn__cl_api *cl = im->cl;
  cl_context ctx = im->ctx;
  cl_device_id dev = im->dev->id;
  cl_int err = CL_SUCCESS;
  struct {
    const char *name;
    const char *src;
    int ptx;            /* inline PTX: NVIDIA sm_80+ alone */
    const char *pre[2]; /* the files it follows, after common.cl */
  } files[] = {{"common.cl", "", 0, {NULL, NULL}},
               {"fwd.cl", attn__cl_src_fwd, 0, {NULL, NULL}},
               {"fwd_rows.cl", attn__cl_src_fwd_rows, 0, {NULL, NULL}},
               {"mma.cl", attn__cl_src_mma, 1, {NULL, NULL}},
               {"fwd_mma.cl", attn__cl_src_fwd_mma, 1, {attn__cl_src_mma, NULL}},
               {"bwd.cl", attn__cl_src_bwd, 0, {NULL, NULL}},
               {"bwd_rows.cl", attn__cl_src_bwd_rows, 0, {attn__cl_src_bwd, NULL}},
               {"bwd_mma.cl", attn__cl_src_bwd_mma, 1, {attn__cl_src_bwd, attn__cl_src_mma}},
               {"decode.cl", attn__cl_src_decode, 0, {NULL, NULL}},
               {"decode_mma.cl", attn__cl_src_decode_mma, 1, {attn__cl_src_mma, NULL}},
               {"split.cl", attn__cl_src_split, 0, {NULL, NULL}},
               {"append.cl", attn__cl_src_append, 0, {NULL, NULL}},
               {"merge.cl", attn__cl_src_merge, 0, {NULL, NULL}},
               {"meta.cl", attn__cl_src_meta, 0, {NULL, NULL}},
               {"selftest.cl", attn__cl_src_selftest, 0, {NULL, NULL}}};
  int failed = 0;
  for (size_t i = 0; i < sizeof files / sizeof files[0]; ++i) {
    if (files[i].ptx && im->dev->nv_cc < 80) {
      printf("%s not compiled: the device takes no sm_80 PTX\n", files[i].name);
      continue;
    }
    const char *srcs[4] = {attn__cl_src_common};
    cl_uint ns = 1;
    for (int j = 0; j < 2 && files[i].pre[j]; ++j)
      srcs[ns++] = files[i].pre[j];
    srcs[ns++] = files[i].src;
    cl_program prog = cl->clCreateProgramWithSource(ctx, ns, srcs, NULL, &err);
    if (prog) err = cl->clBuildProgram(prog, 1, &dev, "-cl-std=CL1.2", NULL, NULL);
    if (err != CL_SUCCESS) {
      static char log[8192];
      log[0] = 0;
      if (prog)
        cl->clGetProgramBuildInfo(prog, dev, CL_PROGRAM_BUILD_LOG, sizeof log - 1, log, NULL);
      printf("%s does not compile on its own (%s):\n%s\n", files[i].name, attn__cl_errname(err),
             log);
      failed = 1;
    } else {
      printf("%s compiles on its own\n", files[i].name);
    }
    if (prog) cl->clReleaseProgram(prog);
  }
  attn_context_free(actx);
  return failed;
}
