/*
 * Each OpenCL kernel source compiles on its own, after common.cl, with no
 * -D option: every parameter has a default (CLBlast's #ifndef NAME style),
 * so a reader can build and read one file without the host's option list.
 * Runs on the first OpenCL device; exits 77 (skipped) where there is none.
 */
#include "attn_cl.h"

#include <stdio.h>

static int first_device(const attn__cl_api *cl, cl_device_id *dev) {
  cl_platform_id plats[16];
  cl_uint np = 0;
  if (cl->clGetPlatformIDs(16, plats, &np) != CL_SUCCESS) return 0;
  for (cl_uint p = 0; p < np && p < 16; ++p) {
    cl_uint nd = 0;
    if (cl->clGetDeviceIDs(plats[p], CL_DEVICE_TYPE_ALL, 1, dev, &nd) == CL_SUCCESS && nd > 0)
      return 1;
  }
  return 0;
}

int main(void) {
  const char *why = "";
  const attn__cl_api *cl = attn__cl_load(&why);
  cl_device_id dev = NULL;
  if (!cl || !first_device(cl, &dev)) {
    printf("skipped: %s\n", cl ? "no OpenCL device" : why);
    return 77;
  }
  cl_int err = CL_SUCCESS;
  cl_context ctx = cl->clCreateContext(NULL, 1, &dev, NULL, NULL, &err);
  if (!ctx) {
    printf("clCreateContext: %s\n", attn__cl_errname(err));
    return 1;
  }
  struct {
    const char *name;
    const char *src;
  } files[] = {{"common.cl", ""},
               {"fwd.cl", attn__cl_src_fwd},
               {"bwd.cl", attn__cl_src_bwd},
               {"selftest.cl", attn__cl_src_selftest}};
  int failed = 0;
  for (size_t i = 0; i < sizeof files / sizeof files[0]; ++i) {
    const char *srcs[2] = {attn__cl_src_common, files[i].src};
    cl_program prog = cl->clCreateProgramWithSource(ctx, 2, srcs, NULL, &err);
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
  cl->clReleaseContext(ctx);
  return failed;
}
