/*
 * The OpenCL backend's devices, contexts, queues, buffers and self-test, and
 * its attn__backend table (plan.c decides what runs, launch.c runs it).
 *
 * Devices are numbered across all platforms, GPUs and accelerators first and
 * CPUs after, each group in platform order; so "opencl" (device 0) is a GPU
 * whenever one exists, and "opencl:N" is the N-th line of `attn info`.
 *
 * Each attn context owns a cl_context and an in-order queue on its device.
 * attn_context_set_stream() may hand it a caller's queue instead (same
 * device, possibly another cl_context, which then becomes the one whose
 * buffers the kernels take).
 */
#include "attn_cl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>

/* ---------------------------------------------------------------------- */
/* Devices                                                                  */
/* ---------------------------------------------------------------------- */

#define MAX_DEVICES 64

static attn__cl_device g_devs[MAX_DEVICES];
static int g_ndev;
static char g_why[512];
static pthread_once_t g_probe_once = PTHREAD_ONCE_INIT;

/* cl_nv_device_attribute_query's CL_DEVICE_COMPUTE_CAPABILITY_{MAJOR,MINOR}_NV
 * (cl_ext.h's values, not every header has them): the tensor-core forward
 * (fwd_mma.cl) needs sm_80's mma.sync shapes. 0 where the extension is
 * absent. */
static int nv_compute_capability(const attn__cl_api *cl, cl_device_id id) {
  char ext[4096] = "";
  cl->clGetDeviceInfo(id, CL_DEVICE_EXTENSIONS, sizeof ext - 1, ext, NULL);
  if (!strstr(ext, "cl_nv_device_attribute_query")) return 0;
  cl_uint major = 0, minor = 0;
  if (cl->clGetDeviceInfo(id, 0x4000, sizeof major, &major, NULL) != CL_SUCCESS ||
      cl->clGetDeviceInfo(id, 0x4001, sizeof minor, &minor, NULL) != CL_SUCCESS)
    return 0;
  return (int)(major * 10 + minor);
}

static void probe(void) {
  const char *why = "";
  const attn__cl_api *cl = attn__cl_load(&why);
  if (!cl) {
    snprintf(g_why, sizeof g_why, "%s", why);
    return;
  }
  cl_platform_id plats[16];
  cl_uint np = 0;
  cl_int err = cl->clGetPlatformIDs(16, plats, &np);
  if (err != CL_SUCCESS || np == 0) {
    snprintf(g_why, sizeof g_why, "no OpenCL platform is installed (clGetPlatformIDs: %s)",
             err == CL_SUCCESS ? "0 platforms" : attn__cl_errname(err));
    return;
  }
  if (np > 16) np = 16;
  attn__cl_device all[MAX_DEVICES];
  int n = 0;
  for (cl_uint p = 0; p < np; ++p) {
    cl_device_id ids[MAX_DEVICES];
    cl_uint nd = 0;
    if (cl->clGetDeviceIDs(plats[p], CL_DEVICE_TYPE_ALL, MAX_DEVICES, ids, &nd) != CL_SUCCESS)
      continue;
    if (nd > MAX_DEVICES) nd = MAX_DEVICES;
    for (cl_uint i = 0; i < nd && n < MAX_DEVICES; ++i) {
      attn__cl_device *d = &all[n];
      memset(d, 0, sizeof *d);
      d->id = ids[i];
      cl_device_type type = 0;
      cl_ulong mem = 0;
      cl_uint cus = 0;
      char ver[256] = "", drv[256] = "";
      cl->clGetDeviceInfo(ids[i], CL_DEVICE_TYPE, sizeof type, &type, NULL);
      cl->clGetDeviceInfo(ids[i], CL_DEVICE_GLOBAL_MEM_SIZE, sizeof mem, &mem, NULL);
      cl->clGetDeviceInfo(ids[i], CL_DEVICE_MAX_COMPUTE_UNITS, sizeof cus, &cus, NULL);
      cl->clGetDeviceInfo(ids[i], CL_DEVICE_LOCAL_MEM_SIZE, sizeof d->local_mem, &d->local_mem,
                          NULL);
      cl->clGetDeviceInfo(ids[i], CL_DEVICE_MAX_MEM_ALLOC_SIZE, sizeof d->max_alloc, &d->max_alloc,
                          NULL);
      cl->clGetDeviceInfo(ids[i], CL_DEVICE_MAX_WORK_GROUP_SIZE, sizeof d->max_wg, &d->max_wg,
                          NULL);
      cl->clGetDeviceInfo(ids[i], CL_DEVICE_NAME, sizeof d->info.name - 1, d->info.name, NULL);
      cl->clGetDeviceInfo(ids[i], CL_DEVICE_VERSION, sizeof ver - 1, ver, NULL);
      cl->clGetDeviceInfo(ids[i], CL_DRIVER_VERSION, sizeof drv - 1, drv, NULL);
      /* "OpenCL 3.0 CUDA, driver 570.1": the version's first words are enough. */
      char *cut = strstr(ver, " HSTR");
      if (cut) *cut = 0;
      snprintf(d->info.version, sizeof d->info.version, "%.70s, driver %.40s", ver, drv);
      d->info.backend = ATTN_BACKEND_OPENCL;
      d->info.is_gpu = (type & (CL_DEVICE_TYPE_GPU | CL_DEVICE_TYPE_ACCELERATOR)) != 0;
      d->info.memory_bytes = mem;
      d->info.compute_units = (int)cus;
      d->nv_cc = nv_compute_capability(cl, ids[i]);
      cl_uint simd = 0;
      cl->clGetDeviceInfo(ids[i], CL_DEVICE_NATIVE_VECTOR_WIDTH_FLOAT, sizeof simd, &simd, NULL);
      d->simd_floats = (int)simd;
      ++n;
    }
  }
  /* GPUs first, so that plain "opencl" gets one. */
  for (int pass = 1; pass >= 0; --pass)
    for (int i = 0; i < n; ++i)
      if (all[i].info.is_gpu == pass) {
        g_devs[g_ndev] = all[i];
        g_devs[g_ndev].info.index = g_ndev;
        ++g_ndev;
      }
  if (g_ndev == 0) snprintf(g_why, sizeof g_why, "the OpenCL platforms list no device");
}

static int ocl_device_count(char *why, size_t why_len) {
  pthread_once(&g_probe_once, probe);
  if (why && why_len) snprintf(why, why_len, "%s", g_ndev ? "" : g_why);
  return g_ndev;
}

static int ocl_device_info(int index, attn_device_info *out) {
  pthread_once(&g_probe_once, probe);
  if (index < 0 || index >= g_ndev) return ATTN_EUNAVAILABLE;
  *out = g_devs[index].info;
  return ATTN_OK;
}

/* ---------------------------------------------------------------------- */
/* Contexts                                                                 */
/* ---------------------------------------------------------------------- */

int attn__cl_fail(attn_context *ctx, const char *what, cl_int err) {
  int st = (err == CL_OUT_OF_HOST_MEMORY || err == CL_MEM_OBJECT_ALLOCATION_FAILURE) ? ATTN_ENOMEM
                                                                                     : ATTN_EDEVICE;
  return attn__error(ctx, st, "%s failed (%s, %d)", what, attn__cl_errname(err), (int)err);
}

static void release_scratch(attn__cl_impl *im) {
  attn__cl_scratch *all[7] = {&im->cu_q, &im->cu_k, &im->alibi, &im->delta,
                              &im->nans, &im->work, &im->work2};
  for (int i = 0; i < 7; ++i) {
    if (all[i]->mem) im->cl->clReleaseMemObject(all[i]->mem);
    all[i]->mem = NULL;
    all[i]->bytes = 0;
  }
}

static void cl_close(attn_context *ctx) {
  attn__cl_impl *im = attn__cl_impl_of(ctx);
  if (!im) return;
  const attn__cl_api *cl = im->cl;
  if (im->queue) cl->clFinish(im->queue);
  release_scratch(im);
  attn__cl_release_programs(im);
  if (im->queue && im->queue != im->own_queue) cl->clReleaseCommandQueue(im->queue);
  if (im->ctx && im->ctx != im->own_ctx) cl->clReleaseContext(im->ctx);
  if (im->own_queue) cl->clReleaseCommandQueue(im->own_queue);
  if (im->own_ctx) cl->clReleaseContext(im->own_ctx);
  free(im);
  ctx->impl = NULL;
}

static int cl_open(attn_context *ctx, int index) {
  pthread_once(&g_probe_once, probe);
  if (index < 0 || index >= g_ndev)
    return attn__error(ctx, ATTN_EUNAVAILABLE, "OpenCL device %d does not exist (%d present)",
                       index, g_ndev);
  attn__cl_impl *im = (attn__cl_impl *)calloc(1, sizeof *im);
  if (!im) return attn__error(ctx, ATTN_ENOMEM, "out of memory for the OpenCL context");
  im->cl = attn__cl_load(NULL);
  im->dev = &g_devs[index];
  ctx->impl = im;
  cl_int err;
  im->own_ctx = im->cl->clCreateContext(NULL, 1, &im->dev->id, NULL, NULL, &err);
  if (!im->own_ctx || err != CL_SUCCESS) {
    cl_close(ctx);
    return attn__cl_fail(ctx, "clCreateContext", err);
  }
  im->own_queue = im->cl->clCreateCommandQueue(im->own_ctx, im->dev->id, 0, &err);
  if (!im->own_queue || err != CL_SUCCESS) {
    cl_close(ctx);
    return attn__cl_fail(ctx, "clCreateCommandQueue", err);
  }
  im->ctx = im->own_ctx;
  im->queue = im->own_queue;
  attn__debug("opencl: context on device %d (%s)", index, im->dev->info.name);
  return ATTN_OK;
}

static int cl_set_stream(attn_context *ctx, void *stream) {
  attn__cl_impl *im = attn__cl_impl_of(ctx);
  const attn__cl_api *cl = im->cl;
  cl_command_queue q = stream ? (cl_command_queue)stream : im->own_queue;
  cl_context qctx = im->own_ctx;
  if (stream) {
    cl_device_id qdev = NULL;
    cl_int err = cl->clGetCommandQueueInfo(q, CL_QUEUE_DEVICE, sizeof qdev, &qdev, NULL);
    if (err != CL_SUCCESS)
      return attn__error(ctx, ATTN_EINVAL, "stream: not a valid cl_command_queue (%s)",
                         attn__cl_errname(err));
    if (qdev != im->dev->id)
      return attn__error(ctx, ATTN_EINVAL,
                         "stream: the cl_command_queue is on another device than the "
                         "context's (%s)",
                         im->dev->info.name);
    cl_command_queue_properties props = 0;
    cl->clGetCommandQueueInfo(q, CL_QUEUE_PROPERTIES, sizeof props, &props, NULL);
    if (props & CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE)
      return attn__error(ctx, ATTN_EINVAL,
                         "stream: the cl_command_queue executes out of order; the backward "
                         "pass's kernels need an in-order queue");
    err = cl->clGetCommandQueueInfo(q, CL_QUEUE_CONTEXT, sizeof qctx, &qctx, NULL);
    if (err != CL_SUCCESS)
      return attn__cl_fail(ctx, "clGetCommandQueueInfo(CL_QUEUE_CONTEXT)", err);
  }
  if (q == im->queue) return ATTN_OK;
  /* Work queued on the old queue finishes before the new one is used, so
   * that the order of the caller's calls holds across the switch. */
  cl->clFinish(im->queue);
  if (stream) cl->clRetainCommandQueue(q);
  if (im->queue != im->own_queue) cl->clReleaseCommandQueue(im->queue);
  im->queue = q;
  if (qctx != im->ctx) {
    release_scratch(im); /* scratch lives in the old cl_context */
    if (qctx != im->own_ctx) cl->clRetainContext(qctx);
    if (im->ctx != im->own_ctx) cl->clReleaseContext(im->ctx);
    im->ctx = qctx;
  }
  return ATTN_OK;
}

static int cl_synchronize(attn_context *ctx) {
  attn__cl_impl *im = attn__cl_impl_of(ctx);
  cl_int err = im->cl->clFinish(im->queue);
  return err == CL_SUCCESS ? ATTN_OK : attn__cl_fail(ctx, "clFinish", err);
}

/* ---------------------------------------------------------------------- */
/* Buffers                                                                  */
/* ---------------------------------------------------------------------- */

/* Allocation failures are out-of-memory: CL_OUT_OF_RESOURCES too, which
 * NVIDIA returns for a buffer the device cannot hold. (After a kernel it
 * means a fault on NVIDIA, so attn__cl_fail() keeps it an EDEVICE elsewhere.) */
static int alloc_fail(attn_context *ctx, const char *what, cl_int err) {
  if (err == CL_OUT_OF_RESOURCES || err == CL_OUT_OF_HOST_MEMORY ||
      err == CL_MEM_OBJECT_ALLOCATION_FAILURE || err == CL_INVALID_BUFFER_SIZE)
    return attn__error(ctx, ATTN_ENOMEM, "%s failed: the device is out of memory (%s, %d)", what,
                       attn__cl_errname(err), (int)err);
  return attn__cl_fail(ctx, what, err);
}

int attn__cl_buffer_alloc(attn_context *ctx, size_t bytes, void **native) {
  attn__cl_impl *im = attn__cl_impl_of(ctx);
  /* Asked first, so that a request no allocation can meet is ENOMEM with
   * the limit named, whatever the driver would make of it. */
  if (im->dev->max_alloc && (uint64_t)bytes > im->dev->max_alloc)
    return attn__error(ctx, ATTN_ENOMEM,
                       "%zu bytes is more than the largest buffer the OpenCL device %s "
                       "allocates (CL_DEVICE_MAX_MEM_ALLOC_SIZE %llu bytes, of %llu in all)",
                       bytes, im->dev->info.name, (unsigned long long)im->dev->max_alloc,
                       (unsigned long long)im->dev->info.memory_bytes);
  cl_int err;
  cl_mem m = im->cl->clCreateBuffer(im->ctx, CL_MEM_READ_WRITE, bytes ? bytes : 1, NULL, &err);
  if (!m || err != CL_SUCCESS) return alloc_fail(ctx, "clCreateBuffer", err);
  *native = m;
  return ATTN_OK;
}

static int cl_buffer_check(attn_context *ctx, void *native, size_t bytes) {
  attn__cl_impl *im = attn__cl_impl_of(ctx);
  size_t size = 0;
  cl_context c = NULL;
  cl_int err = im->cl->clGetMemObjectInfo((cl_mem)native, CL_MEM_SIZE, sizeof size, &size, NULL);
  if (err == CL_SUCCESS)
    err = im->cl->clGetMemObjectInfo((cl_mem)native, CL_MEM_CONTEXT, sizeof c, &c, NULL);
  if (err != CL_SUCCESS)
    return attn__error(ctx, ATTN_EBUFFER, "native: not a valid cl_mem (%s)", attn__cl_errname(err));
  if (bytes > size)
    return attn__error(ctx, ATTN_EBUFFER,
                       "bytes: %zu is more than the cl_mem holds (CL_MEM_SIZE %zu)", bytes, size);
  if (c != im->ctx)
    return attn__error(ctx, ATTN_EBUFFER,
                       "native: the cl_mem belongs to another cl_context than the context's; "
                       "pass a queue of that cl_context to attn_context_set_stream() first");
  return ATTN_OK;
}

static void cl_buffer_release(attn_context *ctx, void *native) {
  if (native) attn__cl_impl_of(ctx)->cl->clReleaseMemObject((cl_mem)native);
}

int attn__cl_buffer_write(attn_context *ctx, void *native, size_t offset, const void *src,
                          size_t bytes) {
  attn__cl_impl *im = attn__cl_impl_of(ctx);
  if (!bytes) return ATTN_OK;
  cl_int err = im->cl->clEnqueueWriteBuffer(im->queue, (cl_mem)native, CL_TRUE, offset, bytes, src,
                                            0, NULL, NULL);
  /* NVIDIA allocates a buffer at its first use: this is where it runs out. */
  return err == CL_SUCCESS ? ATTN_OK : alloc_fail(ctx, "clEnqueueWriteBuffer", err);
}

static int cl_buffer_read(attn_context *ctx, void *native, size_t offset, void *dst, size_t bytes) {
  attn__cl_impl *im = attn__cl_impl_of(ctx);
  if (!bytes) return ATTN_OK;
  cl_int err = im->cl->clEnqueueReadBuffer(im->queue, (cl_mem)native, CL_TRUE, offset, bytes, dst,
                                           0, NULL, NULL);
  return err == CL_SUCCESS ? ATTN_OK : alloc_fail(ctx, "clEnqueueReadBuffer", err);
}

/* A scratch buffer of at least `bytes`, holding `src` when given. The write
 * is blocking: src is the caller's host memory (cu_seqlens, slopes), which
 * need not outlive the call, and the in-order queue runs it after any work
 * still using the old contents. */
int attn__cl_scratch_put(attn_context *ctx, attn__cl_scratch *s, size_t bytes, const void *src) {
  attn__cl_impl *im = attn__cl_impl_of(ctx);
  if (s->bytes < bytes) {
    if (s->mem) im->cl->clReleaseMemObject(s->mem);
    s->mem = NULL;
    s->bytes = 0;
    int st = attn__cl_buffer_alloc(ctx, bytes, (void **)&s->mem);
    if (st) return st;
    s->bytes = bytes;
  }
  return src ? attn__cl_buffer_write(ctx, s->mem, 0, src, bytes) : ATTN_OK;
}

/* ---------------------------------------------------------------------- */
/* Self-test                                                                */
/* ---------------------------------------------------------------------- */

static int cl_selftest(attn_context *ctx) {
  attn__cl_impl *im = attn__cl_impl_of(ctx);
  const attn__cl_api *cl = im->cl;
  enum { N = 1000 };
  float *h = (float *)malloc(3 * N * sizeof(float));
  if (!h) return attn__error(ctx, ATTN_ENOMEM, "out of memory for the self-test");
  for (int i = 0; i < N; ++i) {
    h[i] = (float)i;
    h[N + i] = 0.5f * (float)(N - i);
    h[2 * N + i] = -1.0f;
  }
  cl_program prog = NULL;
  cl_kernel k = NULL;
  cl_mem m[3] = {NULL, NULL, NULL};
  cl_int err = CL_SUCCESS;
  const char *srcs[1] = {attn__cl_src_selftest};
  const char *names[1] = {"attn_selftest_add"};
  int st =
      attn__cl_build(ctx, cl, im->ctx, im->dev->id, srcs, 1, "-cl-std=CL1.2", names, 1, &prog, &k);
  for (int i = 0; i < 3 && !st; ++i)
    st = attn__cl_buffer_alloc(ctx, N * sizeof(float), (void **)&m[i]);
  for (int i = 0; i < 2 && !st; ++i)
    st = attn__cl_buffer_write(ctx, m[i], 0, h + i * N, N * 4);
  if (!st) {
    cl_int n = N;
    err = cl->clSetKernelArg(k, 0, sizeof(cl_mem), &m[0]);
    if (!err) err = cl->clSetKernelArg(k, 1, sizeof(cl_mem), &m[1]);
    if (!err) err = cl->clSetKernelArg(k, 2, sizeof(cl_mem), &m[2]);
    if (!err) err = cl->clSetKernelArg(k, 3, sizeof n, &n);
    size_t local = 64, global = (N + 63) / 64 * 64;
    if (!err)
      err = cl->clEnqueueNDRangeKernel(im->queue, k, 1, NULL, &global, &local, 0, NULL, NULL);
    if (err) st = attn__cl_fail(ctx, "self-test: kernel launch", err);
  }
  if (!st) st = cl_buffer_read(ctx, m[2], 0, h + 2 * N, N * 4);
  if (!st)
    for (int i = 0; i < N; ++i)
      if (h[2 * N + i] != h[i] + h[N + i]) {
        st = attn__error(ctx, ATTN_EDEVICE,
                         "self-test on %s: C[%d] = %g, expected %g: the device computes wrongly",
                         im->dev->info.name, i, h[2 * N + i], h[i] + h[N + i]);
        break;
      }
  for (int i = 0; i < 3; ++i)
    if (m[i]) cl->clReleaseMemObject(m[i]);
  if (k) cl->clReleaseKernel(k);
  if (prog) cl->clReleaseProgram(prog);
  free(h);
  return st;
}

/* ---------------------------------------------------------------------- */
/* The backend                                                              */
/* ---------------------------------------------------------------------- */

/* plan is plan.c's; forward, backward, append and merge launch.c's. */
const attn__backend attn__backend_opencl = {
    .kind = ATTN_BACKEND_OPENCL,
    .name = "opencl",
    .host_memory = 0,
    .device_count = ocl_device_count,
    .device_info = ocl_device_info,
    .open = cl_open,
    .close = cl_close,
    .buffer_alloc = attn__cl_buffer_alloc,
    .buffer_release = cl_buffer_release,
    .buffer_write = attn__cl_buffer_write,
    .buffer_read = cl_buffer_read,
    .buffer_check = cl_buffer_check,
    .set_stream = cl_set_stream,
    .synchronize = cl_synchronize,
    .selftest = cl_selftest,
    .plan = attn__cl_plan,
    .forward = attn__cl_forward,
    .backward = attn__cl_backward,
    .append = attn__cl_append,
    .merge = attn__cl_merge,
    .tune_count = attn__cl_tune_count,
    .tune_use = attn__cl_tune_use,
    .tune_keep = attn__cl_tune_keep,
};
