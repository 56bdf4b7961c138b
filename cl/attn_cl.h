/*
 * The OpenCL backend's private interface between its files:
 *   loader.c   dlopen()s the OpenCL ICD loader and fills attn__cl, the table
 *              of entry points (the library has no link-time dependency on
 *              libOpenCL, so it loads on a machine without one);
 *   program.c  builds programs from the embedded sources, through an on-disk
 *              cache of device binaries;
 *   opencl.c   devices, contexts, buffers, queues, self-test, and the
 *              forward/backward launches: the attn__backend table.
 */
#ifndef ATTN_CL_H
#define ATTN_CL_H

#ifndef CL_TARGET_OPENCL_VERSION
#define CL_TARGET_OPENCL_VERSION 120
#endif
#include <CL/cl.h>

#include "attn_internal.h"

/* X(name): every OpenCL entry point the backend calls. */
#define ATTN__CL_FUNCS(X)      \
  X(clGetPlatformIDs)          \
  X(clGetPlatformInfo)         \
  X(clGetDeviceIDs)            \
  X(clGetDeviceInfo)           \
  X(clCreateContext)           \
  X(clRetainContext)           \
  X(clReleaseContext)          \
  X(clCreateCommandQueue)      \
  X(clRetainCommandQueue)      \
  X(clReleaseCommandQueue)     \
  X(clGetCommandQueueInfo)     \
  X(clCreateBuffer)            \
  X(clReleaseMemObject)        \
  X(clGetMemObjectInfo)        \
  X(clEnqueueReadBuffer)       \
  X(clEnqueueWriteBuffer)      \
  X(clCreateProgramWithSource) \
  X(clCreateProgramWithBinary) \
  X(clBuildProgram)            \
  X(clGetProgramInfo)          \
  X(clGetProgramBuildInfo)     \
  X(clReleaseProgram)          \
  X(clCreateKernel)            \
  X(clReleaseKernel)           \
  X(clSetKernelArg)            \
  X(clGetKernelWorkGroupInfo)  \
  X(clEnqueueNDRangeKernel)    \
  X(clFlush)                   \
  X(clFinish)

typedef struct attn__cl_api {
#define ATTN__CL_MEMBER(name) __typeof__(&name) name;
  ATTN__CL_FUNCS(ATTN__CL_MEMBER)
#undef ATTN__CL_MEMBER
} attn__cl_api;

/* The table, or NULL with a sentence in why when no usable OpenCL library
 * was found. Thread-safe; the library is loaded once per process. */
const attn__cl_api *attn__cl_load(const char **why);

/* "CL_OUT_OF_RESOURCES" for -5, and so on. */
const char *attn__cl_errname(cl_int err);

/* The embedded kernel sources (generated at build time from cl/ *.cl). */
extern const char attn__cl_src_common[];
extern const char attn__cl_src_fwd[];
extern const char attn__cl_src_bwd[];
extern const char attn__cl_src_selftest[];

/* Builds a program for one device from sources concatenated in order, with
 * options, through the disk cache (ATTN_CL_CACHE_DIR, ATTN_CL_CACHE=0), and
 * creates its kernels names[0..nk) into kernels. A cached binary that fails
 * anywhere up to the kernels is rebuilt from source and replaced. On failure
 * reports on ctx (ATTN_EBUILD with the build log, ATTN_EDEVICE or
 * ATTN_ENOMEM) and returns the status, with nothing left to release. */
int attn__cl_build(attn_context *ctx, const attn__cl_api *cl, cl_context clctx, cl_device_id dev,
                   const char *const *srcs, int nsrc, const char *options, const char *const *names,
                   int nk, cl_program *out, cl_kernel *kernels);

#endif /* ATTN_CL_H */
