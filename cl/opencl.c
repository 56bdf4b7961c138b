/*
 * The OpenCL backend: devices, contexts, buffers, queues, the self-test and
 * the launches of the attention kernels (fwd.cl, bwd.cl).
 *
 * Devices are numbered across all platforms, GPUs and accelerators first and
 * CPUs after, each group in platform order; so "opencl" (device 0) is a GPU
 * whenever one exists, and "opencl:N" is the N-th line of `attn info`.
 *
 * Each attn context owns a cl_context and an in-order queue on its device.
 * attn_context_set_stream() may hand it a caller's queue instead (same
 * device, possibly another cl_context, which then becomes the one whose
 * buffers the kernels take). Programs are built per (cl_context, dtype,
 * head-dim bucket) on first use and kept for the context's life.
 *
 * Backward is always deterministic here: dQ and dK/dV come from separate
 * kernels that each own their outputs (bwd.cl), with or without
 * ATTN_DETERMINISTIC.
 */
#include "attn_cl.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <threads.h>

/* ---------------------------------------------------------------------- */
/* Devices                                                                  */
/* ---------------------------------------------------------------------- */

#define MAX_DEVICES 64

typedef struct cl_dev {
  cl_device_id id;
  attn_device_info info;
  cl_ulong local_mem;
  cl_ulong max_alloc; /* CL_DEVICE_MAX_MEM_ALLOC_SIZE */
  size_t max_wg;
} cl_dev;

static cl_dev g_devs[MAX_DEVICES];
static int g_ndev;
static char g_why[512];
static once_flag g_probe_once = ONCE_FLAG_INIT;

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
  cl_dev all[MAX_DEVICES];
  int n = 0;
  for (cl_uint p = 0; p < np; ++p) {
    cl_device_id ids[MAX_DEVICES];
    cl_uint nd = 0;
    if (cl->clGetDeviceIDs(plats[p], CL_DEVICE_TYPE_ALL, MAX_DEVICES, ids, &nd) != CL_SUCCESS)
      continue;
    if (nd > MAX_DEVICES) nd = MAX_DEVICES;
    for (cl_uint i = 0; i < nd && n < MAX_DEVICES; ++i) {
      cl_dev *d = &all[n];
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
  call_once(&g_probe_once, probe);
  if (why && why_len) snprintf(why, why_len, "%s", g_ndev ? "" : g_why);
  return g_ndev;
}

static int ocl_device_info(int index, attn_device_info *out) {
  call_once(&g_probe_once, probe);
  if (index < 0 || index >= g_ndev) return ATTN_EUNAVAILABLE;
  *out = g_devs[index].info;
  return ATTN_OK;
}

/* ---------------------------------------------------------------------- */
/* Contexts                                                                 */
/* ---------------------------------------------------------------------- */

#define MAX_PROGRAMS 64

typedef struct attn_program {
  cl_context clctx;
  int dtype, hd;
  cl_program prog;
  cl_kernel fwd, pre, dkdv, dq;
  int br, bc, tm, dk, jk, bb; /* the tile sizes it was built with */
} attn_program;

typedef struct scratch {
  cl_mem mem;
  size_t bytes;
} scratch;

typedef struct cl_impl {
  const attn__cl_api *cl;
  const cl_dev *dev;
  cl_context own_ctx;
  cl_command_queue own_queue;
  cl_context ctx;         /* the one kernels and buffers use now */
  cl_command_queue queue; /* own_queue, or the caller's (retained) */
  attn_program progs[MAX_PROGRAMS];
  int nprog;
  scratch cu_q, cu_k, alibi, delta;
} cl_impl;

static cl_impl *impl_of(attn_context *ctx) {
  return (cl_impl *)ctx->impl;
}

static int cl_fail(attn_context *ctx, const char *what, cl_int err) {
  int st = (err == CL_OUT_OF_HOST_MEMORY || err == CL_MEM_OBJECT_ALLOCATION_FAILURE) ? ATTN_ENOMEM
                                                                                     : ATTN_EDEVICE;
  return attn__error(ctx, st, "%s failed (%s, %d)", what, attn__cl_errname(err), (int)err);
}

static void release_scratch(cl_impl *im) {
  scratch *all[4] = {&im->cu_q, &im->cu_k, &im->alibi, &im->delta};
  for (int i = 0; i < 4; ++i) {
    if (all[i]->mem) im->cl->clReleaseMemObject(all[i]->mem);
    all[i]->mem = NULL;
    all[i]->bytes = 0;
  }
}

static void release_one(cl_impl *im, attn_program *p) {
  cl_kernel ks[4] = {p->fwd, p->pre, p->dkdv, p->dq};
  for (int j = 0; j < 4; ++j)
    if (ks[j]) im->cl->clReleaseKernel(ks[j]);
  if (p->prog) im->cl->clReleaseProgram(p->prog);
  if (p->clctx) im->cl->clReleaseContext(p->clctx);
  memset(p, 0, sizeof *p);
}

static void release_programs(cl_impl *im) {
  for (int i = 0; i < im->nprog; ++i)
    release_one(im, &im->progs[i]);
  im->nprog = 0;
}

static void cl_close(attn_context *ctx) {
  cl_impl *im = impl_of(ctx);
  if (!im) return;
  const attn__cl_api *cl = im->cl;
  if (im->queue) cl->clFinish(im->queue);
  release_scratch(im);
  release_programs(im);
  if (im->queue && im->queue != im->own_queue) cl->clReleaseCommandQueue(im->queue);
  if (im->ctx && im->ctx != im->own_ctx) cl->clReleaseContext(im->ctx);
  if (im->own_queue) cl->clReleaseCommandQueue(im->own_queue);
  if (im->own_ctx) cl->clReleaseContext(im->own_ctx);
  free(im);
  ctx->impl = NULL;
}

static int cl_open(attn_context *ctx, int index) {
  call_once(&g_probe_once, probe);
  if (index < 0 || index >= g_ndev)
    return attn__error(ctx, ATTN_EUNAVAILABLE, "OpenCL device %d does not exist (%d present)",
                       index, g_ndev);
  cl_impl *im = (cl_impl *)calloc(1, sizeof *im);
  if (!im) return attn__error(ctx, ATTN_ENOMEM, "out of memory for the OpenCL context");
  im->cl = attn__cl_load(NULL);
  im->dev = &g_devs[index];
  ctx->impl = im;
  cl_int err;
  im->own_ctx = im->cl->clCreateContext(NULL, 1, &im->dev->id, NULL, NULL, &err);
  if (!im->own_ctx || err != CL_SUCCESS) {
    cl_close(ctx);
    return cl_fail(ctx, "clCreateContext", err);
  }
  im->own_queue = im->cl->clCreateCommandQueue(im->own_ctx, im->dev->id, 0, &err);
  if (!im->own_queue || err != CL_SUCCESS) {
    cl_close(ctx);
    return cl_fail(ctx, "clCreateCommandQueue", err);
  }
  im->ctx = im->own_ctx;
  im->queue = im->own_queue;
  attn__debug("opencl: context on device %d (%s)", index, im->dev->info.name);
  return ATTN_OK;
}

static int cl_set_stream(attn_context *ctx, void *stream) {
  cl_impl *im = impl_of(ctx);
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
    if (err != CL_SUCCESS) return cl_fail(ctx, "clGetCommandQueueInfo(CL_QUEUE_CONTEXT)", err);
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
  cl_impl *im = impl_of(ctx);
  cl_int err = im->cl->clFinish(im->queue);
  return err == CL_SUCCESS ? ATTN_OK : cl_fail(ctx, "clFinish", err);
}

/* ---------------------------------------------------------------------- */
/* Buffers                                                                  */
/* ---------------------------------------------------------------------- */

/* Allocation failures are out-of-memory: CL_OUT_OF_RESOURCES too, which
 * NVIDIA returns for a buffer the device cannot hold. (After a kernel it
 * means a fault on NVIDIA, so cl_fail() keeps it an EDEVICE elsewhere.) */
static int alloc_fail(attn_context *ctx, const char *what, cl_int err) {
  if (err == CL_OUT_OF_RESOURCES || err == CL_OUT_OF_HOST_MEMORY ||
      err == CL_MEM_OBJECT_ALLOCATION_FAILURE || err == CL_INVALID_BUFFER_SIZE)
    return attn__error(ctx, ATTN_ENOMEM, "%s failed: the device is out of memory (%s, %d)", what,
                       attn__cl_errname(err), (int)err);
  return cl_fail(ctx, what, err);
}

static int cl_buffer_alloc(attn_context *ctx, size_t bytes, void **native) {
  cl_impl *im = impl_of(ctx);
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
  cl_impl *im = impl_of(ctx);
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
  if (native) impl_of(ctx)->cl->clReleaseMemObject((cl_mem)native);
}

static int cl_buffer_write(attn_context *ctx, void *native, size_t offset, const void *src,
                           size_t bytes) {
  cl_impl *im = impl_of(ctx);
  if (!bytes) return ATTN_OK;
  cl_int err = im->cl->clEnqueueWriteBuffer(im->queue, (cl_mem)native, CL_TRUE, offset, bytes, src,
                                            0, NULL, NULL);
  /* NVIDIA allocates a buffer at its first use: this is where it runs out. */
  return err == CL_SUCCESS ? ATTN_OK : alloc_fail(ctx, "clEnqueueWriteBuffer", err);
}

static int cl_buffer_read(attn_context *ctx, void *native, size_t offset, void *dst, size_t bytes) {
  cl_impl *im = impl_of(ctx);
  if (!bytes) return ATTN_OK;
  cl_int err = im->cl->clEnqueueReadBuffer(im->queue, (cl_mem)native, CL_TRUE, offset, bytes, dst,
                                           0, NULL, NULL);
  return err == CL_SUCCESS ? ATTN_OK : alloc_fail(ctx, "clEnqueueReadBuffer", err);
}

/* A scratch buffer of at least `bytes`, holding `src` when given. The write
 * is blocking: src is the caller's host memory (cu_seqlens, slopes), which
 * need not outlive the call, and the in-order queue runs it after any work
 * still using the old contents. */
static int scratch_put(attn_context *ctx, scratch *s, size_t bytes, const void *src) {
  cl_impl *im = impl_of(ctx);
  if (s->bytes < bytes) {
    if (s->mem) im->cl->clReleaseMemObject(s->mem);
    s->mem = NULL;
    s->bytes = 0;
    int st = cl_buffer_alloc(ctx, bytes, (void **)&s->mem);
    if (st) return st;
    s->bytes = bytes;
  }
  return src ? cl_buffer_write(ctx, s->mem, 0, src, bytes) : ATTN_OK;
}

/* ---------------------------------------------------------------------- */
/* Programs and tile sizes                                                  */
/* ---------------------------------------------------------------------- */

/* The head dimension the kernels are built for: 16, 32, 64, then multiples
 * of 32, so that few programs cover every d and padding wastes little. */
/* The padded head dim a program is built for. 32 is the smallest: PoCL 5.0
 * (the H200 machine's CPU driver) aborts the process in its own compiler
 * (Kernel.cc:129, region_entry_barrier) on the HD = 16 forward, and a head
 * dim of 16 or less costs little padded to 32. */
static int hd_bucket(int64_t d) {
  if (d <= 32) return 32;
  if (d <= 64) return 64;
  return (int)((d + 31) / 32 * 32);
}

/* fwd.cl's local memory: the Q and K chunks share a buffer with P and the V
 * chunk, beside the row reductions. */
static size_t fwd_local_bytes(int hd, int br, int bc, int dk, int jk) {
  size_t qk = (size_t)dk * (br + 4) + (size_t)bc * (dk + 4);
  size_t pv = (size_t)bc * (br + 4) + (size_t)jk * hd;
  return 4u * ((qk > pv ? qk : pv) + (size_t)br * 16);
}

/* fwd.cl stages a Q/K chunk as whole rows of work-items: DK must divide
 * the work-group and DK*BR, DK*BC be multiples of it; K is read 4 columns
 * at a time. */
static int fwd_staging_fits(const attn_program *p) {
  int nt = 16 * (p->br / p->tm);
  return nt % p->dk == 0 && p->dk % 4 == 0 && (p->dk * p->br) % nt == 0 &&
         (p->dk * p->bc) % nt == 0;
}

static size_t bwd_local_bytes(int hd, int bb) {
  /* Q, dO, K, V tiles; P and dS; the rows' lse (hi, lo) and D. */
  return 4u * (4u * (size_t)bb * (hd + 4) + 2u * (size_t)bb * (bb + 1) + 3u * (size_t)bb);
}

/* Tile sizes from what the device reports. Defaults: 256 work-items of
 * TM x 4 scores and TM x HD/16 outputs each (BR = 128 query rows, BC = 64
 * keys), which keep the two products' inner loops at 10-16 FMAs per
 * local-memory instruction (see fwd.cl) and fit NVIDIA's 48 KiB of local
 * memory per work-group at HD = 128 (45 KiB, with V staged 8 rows at a
 * time); CPU devices and devices with smaller work-groups get 128
 * work-items (BR = 64: PoCL runs a work-group as loops over its items, and
 * PoCL 5.0's compiler aborts on the 256-item program), and
 * HD > 128 halves TM to stay within the register file. Measured on an H200
 * (bench/NOTES_opencl.md, run 3), BR = 128 beat BR = 64 by 14 % at HD = 64
 * and 19 % at HD = 128, and BC = 128 or DK = 32 at BR = 64 by 7-35 %.
 * Smaller local memories shrink the staging steps, then the key tile.
 *
 * wide = 0 asks for the 128-work-item tiles (get_program's second try, where
 * the compiled forward kernel cannot run 256 work-items).
 *
 * ATTN_CL_TILES=BR,TM,BC,DK,JK replaces the forward defaults, for tuning on
 * a new device (bench/opencl_h200.sh sweeps it); a value the kernel cannot
 * take is ignored. */
static int choose_tiles(const cl_dev *dev, const char *tiles_override, int hd, int wide,
                        attn_program *p) {
  size_t lmem = (size_t)dev->local_mem;
  wide = wide && hd <= 128 && dev->max_wg >= 256 && dev->info.is_gpu;
  p->tm = hd > 128 ? 4 : 8;
  p->br = (wide ? 16 : 8) * p->tm;
  p->bc = 64;
  p->dk = 16;
  p->jk = wide ? 8 : 16;
  const char *env = tiles_override;
  int br, tm, bc, dk, jk;
  if (env && sscanf(env, "%d,%d,%d,%d,%d", &br, &tm, &bc, &dk, &jk) == 5 && tm > 0 && tm % 4 == 0 &&
      br % tm == 0 && br / tm >= 1 && 16 * (br / tm) <= 1024 && bc % 16 == 0 && bc > 0 && dk > 0 &&
      jk > 0 && bc % jk == 0 && (size_t)(16 * (br / tm)) <= dev->max_wg) {
    p->br = br;
    p->tm = tm;
    p->bc = bc;
    p->dk = dk;
    p->jk = jk;
  }
  while (fwd_local_bytes(hd, p->br, p->bc, p->dk, p->jk) > lmem || !fwd_staging_fits(p)) {
    if (p->jk > 4)
      p->jk /= 2;
    else if (p->bc > 16)
      p->bc /= 2;
    else if (p->dk > 4)
      p->dk /= 2;
    else
      return 0;
  }
  /* Backward: the largest square tile whose four operand tiles fit, with at
   * least one output element per work-item. */
  p->bb = 0;
  for (int bb = 32; bb >= 4 && !p->bb; bb /= 2)
    if (bwd_local_bytes(hd, bb) <= lmem && (bb * hd) % 128 == 0) p->bb = bb;
  return p->bb != 0 && dev->max_wg >= 128 && dev->max_wg >= (size_t)(16 * (p->br / p->tm));
}

static int build_program(attn_context *ctx, int dtype, int hd, int wide, int *retry,
                         attn_program **out);

static int get_program(attn_context *ctx, int dtype, int hd, attn_program **out) {
  cl_impl *im = impl_of(ctx);
  for (int i = 0; i < im->nprog; ++i) {
    attn_program *p = &im->progs[i];
    if (p->clctx == im->ctx && p->dtype == dtype && p->hd == hd) {
      *out = p;
      return ATTN_OK;
    }
  }
  if (im->nprog == MAX_PROGRAMS)
    return attn__error(ctx, ATTN_EINTERNAL, "too many OpenCL program variants in one context");
  int retry = 0;
  int st = build_program(ctx, dtype, hd, 1, &retry, out);
  if (st && retry) st = build_program(ctx, dtype, hd, 0, &retry, out);
  return st;
}

/* get_program's build, with choose_tiles(wide). *retry is set when the
 * compiled forward kernel cannot run the wide tiles' 256 work-items. */
static int build_program(attn_context *ctx, int dtype, int hd, int wide, int *retry,
                         attn_program **out) {
  cl_impl *im = impl_of(ctx);
  const attn__cl_api *cl = im->cl;
  attn_program p;
  memset(&p, 0, sizeof p);
  p.dtype = dtype;
  p.hd = hd;
  *retry = 0;
  if (!choose_tiles(im->dev, ctx->settings.cl_tiles, hd, wide, &p))
    return attn__error(ctx, ATTN_EUNSUPPORTED,
                       "the OpenCL device %s has too little local memory (%llu bytes) or too "
                       "small work-groups (%zu) for head_dim bucket %d",
                       im->dev->info.name, (unsigned long long)im->dev->local_mem, im->dev->max_wg,
                       hd);
  char opts[256];
  snprintf(opts, sizeof opts,
           "-cl-std=CL1.2 -DDTYPE=%d -DHD=%d -DBR=%d -DBC=%d -DTM=%d -DDK=%d -DJK=%d -DBB=%d",
           dtype, hd, p.br, p.bc, p.tm, p.dk, p.jk, p.bb);
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
    const size_t need = i == 0 ? (size_t)(16 * (p.br / p.tm)) : i == 1 ? 64 : 128;
    if (wg < need && i == 0 && need > 128 && wide) {
      attn__debug("opencl: attn_fwd runs at most %zu work-items per group; retrying with 128", wg);
      *retry = 1;
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
  attn_program *pp = &im->progs[im->nprog++];
  attn__debug("opencl: %s", opts);
  *out = pp;
  return ATTN_OK;
}

/* ---------------------------------------------------------------------- */
/* Self-test                                                                */
/* ---------------------------------------------------------------------- */

static int cl_selftest(attn_context *ctx) {
  cl_impl *im = impl_of(ctx);
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
    st = cl_buffer_alloc(ctx, N * sizeof(float), (void **)&m[i]);
  for (int i = 0; i < 2 && !st; ++i)
    st = cl_buffer_write(ctx, m[i], 0, h + i * N, N * 4);
  if (!st) {
    cl_int n = N;
    err = cl->clSetKernelArg(k, 0, sizeof(cl_mem), &m[0]);
    if (!err) err = cl->clSetKernelArg(k, 1, sizeof(cl_mem), &m[1]);
    if (!err) err = cl->clSetKernelArg(k, 2, sizeof(cl_mem), &m[2]);
    if (!err) err = cl->clSetKernelArg(k, 3, sizeof n, &n);
    size_t local = 64, global = (N + 63) / 64 * 64;
    if (!err)
      err = cl->clEnqueueNDRangeKernel(im->queue, k, 1, NULL, &global, &local, 0, NULL, NULL);
    if (err) st = cl_fail(ctx, "self-test: kernel launch", err);
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
/* Attention                                                                */
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
  cl_impl *im = impl_of(ctx);
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

static int cl_plan(attn_context *ctx, const attn__problem *pb, int backward, attn__plan *out) {
  cl_impl *im = impl_of(ctx);
  const int64_t big = INT_MAX / 4;
  if (pb->seqlen_q > big || pb->seqlen_k > big || pb->total_q > big || pb->total_k > big)
    return attn__error(ctx, ATTN_EUNSUPPORTED,
                       "the OpenCL backend takes at most %lld rows per tensor", (long long)big);
  if (pb->batch > 65535 || pb->heads_q > 65535)
    return attn__error(ctx, ATTN_EUNSUPPORTED,
                       "the OpenCL backend takes at most 65535 sequences and heads");
  attn_program p;
  if (!choose_tiles(im->dev, ctx->settings.cl_tiles, hd_bucket(pb->head_dim), 0, &p))
    return attn__error(ctx, ATTN_EUNSUPPORTED,
                       "the OpenCL device %s has too little local memory or too small "
                       "work-groups for head_dim %lld",
                       im->dev->info.name, (long long)pb->head_dim);
  memset(out, 0, sizeof *out);
  out->backward = backward;
  out->name = backward ? "opencl attn_bwd" : "opencl attn_fwd";
  return ATTN_OK;
}

/* Uploads cu_seqlens and slopes; NULL handles for what the problem lacks. */
static int upload_params(attn_context *ctx, const attn__problem *pb, cl_mem *cu_q, cl_mem *cu_k,
                         cl_mem *alibi) {
  cl_impl *im = impl_of(ctx);
  size_t nb = (size_t)(pb->batch + 1) * sizeof(int32_t);
  int st = ATTN_OK;
  *cu_q = *cu_k = *alibi = NULL;
  if (pb->cu_q) {
    if ((st = scratch_put(ctx, &im->cu_q, nb, pb->cu_q))) return st;
    if ((st = scratch_put(ctx, &im->cu_k, nb, pb->cu_k))) return st;
    *cu_q = im->cu_q.mem;
    *cu_k = im->cu_k.mem;
  }
  if (pb->alibi) {
    if ((st = scratch_put(ctx, &im->alibi, (size_t)pb->heads_q * sizeof(float), pb->alibi)))
      return st;
    *alibi = im->alibi.mem;
  }
  return st;
}

static int launch(attn_context *ctx, cl_kernel k, const args *a, const char *name, size_t g0,
                  size_t g1, size_t g2, size_t l0) {
  cl_impl *im = impl_of(ctx);
  if (a->err != CL_SUCCESS) {
    char what[96];
    snprintf(what, sizeof what, "%s: clSetKernelArg(%u)", name, a->i - 1);
    return cl_fail(ctx, what, a->err);
  }
  if (g0 == 0 || g1 == 0 || g2 == 0) return ATTN_OK;
  size_t global[3] = {g0, g1, g2}, local[3] = {l0, 1, 1};
  cl_int err = im->cl->clEnqueueNDRangeKernel(im->queue, k, 3, NULL, global, local, 0, NULL, NULL);
  if (err != CL_SUCCESS) {
    char what[96];
    snprintf(what, sizeof what, "%s: clEnqueueNDRangeKernel", name);
    return cl_fail(ctx, what, err);
  }
  return ATTN_OK;
}

static int finish(attn_context *ctx, const attn__problem *pb) {
  cl_impl *im = impl_of(ctx);
  cl_int err = pb->async ? im->cl->clFlush(im->queue) : im->cl->clFinish(im->queue);
  return err == CL_SUCCESS ? ATTN_OK : cl_fail(ctx, pb->async ? "clFlush" : "clFinish", err);
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

static int cl_forward(attn_context *ctx, const attn__problem *pb, const attn__plan *plan) {
  cl_impl *im = impl_of(ctx);
  int st = check_tensors(ctx, pb, 0);
  attn_program *p = NULL;
  if (!st) st = get_program(ctx, (int)pb->dtype, hd_bucket(pb->head_dim), &p);
  cl_mem cu_q, cu_k, alibi;
  if (!st) st = upload_params(ctx, pb, &cu_q, &cu_k, &alibi);
  if (st) return st;
  const size_t es = esize_of(pb->dtype);
  args a = {im->cl, p->fwd, 0, CL_SUCCESS};
  arg_tensor(&a, &pb->q, es);
  arg_tensor(&a, &pb->k, es);
  arg_tensor(&a, &pb->v, es);
  arg_tensor(&a, &pb->o, es);
  attn__tensor no_lse;
  memset(&no_lse, 0, sizeof no_lse);
  arg_tensor(&a, pb->has_lse ? &pb->lse : &no_lse, 4);
  arg_common(&a, pb, cu_q, cu_k, alibi);
  const size_t nt = 16 * (size_t)(p->br / p->tm);
  const size_t blocks = (size_t)((pb->seqlen_q + p->br - 1) / p->br);
  st = launch(ctx, p->fwd, &a, "attn_fwd", blocks * nt, (size_t)pb->heads_q, (size_t)pb->batch, nt);
  return st ? st : finish(ctx, pb);
}

static int cl_backward(attn_context *ctx, const attn__problem *pb, const attn__plan *plan) {
  cl_impl *im = impl_of(ctx);
  int st = check_tensors(ctx, pb, 1);
  attn_program *p = NULL;
  if (!st) st = get_program(ctx, (int)pb->dtype, hd_bucket(pb->head_dim), &p);
  cl_mem cu_q, cu_k, alibi;
  if (!st) st = upload_params(ctx, pb, &cu_q, &cu_k, &alibi);
  const int64_t tq = pb->cu_q ? pb->total_q : pb->batch * pb->seqlen_q;
  if (!st) st = scratch_put(ctx, &im->delta, (size_t)(pb->heads_q * tq) * sizeof(float), NULL);
  if (st) return st;
  const size_t es = esize_of(pb->dtype);

  /* D = rowsum(dO * O) */
  args a = {im->cl, p->pre, 0, CL_SUCCESS};
  arg_tensor(&a, &pb->o, es);
  arg_tensor(&a, &pb->dout, es);
  arg_mem(&a, im->delta.mem);
  arg_mem(&a, cu_q);
  arg_int(&a, (cl_int)pb->seqlen_q);
  arg_int(&a, (cl_int)pb->head_dim);
  arg_int(&a, (cl_int)tq);
  st = launch(ctx, p->pre, &a, "attn_bwd_pre", (size_t)(pb->seqlen_q + 63) / 64 * 64,
              (size_t)pb->heads_q, (size_t)pb->batch, 64);
  if (st) return st;

  cl_kernel ks[2] = {p->dkdv, p->dq};
  for (int w = 0; w < 2; ++w) {
    args b = {im->cl, ks[w], 0, CL_SUCCESS};
    arg_tensor(&b, &pb->q, es);
    arg_tensor(&b, &pb->k, es);
    arg_tensor(&b, &pb->v, es);
    arg_tensor(&b, &pb->dout, es);
    arg_tensor(&b, &pb->lse, 4);
    arg_mem(&b, im->delta.mem);
    arg_common(&b, pb, cu_q, cu_k, alibi);
    arg_int(&b, (cl_int)tq);
    if (w == 0) {
      arg_tensor(&b, &pb->dk, es);
      arg_tensor(&b, &pb->dv, es);
      st = launch(ctx, ks[w], &b, "attn_bwd_dkdv",
                  (size_t)((pb->seqlen_k + p->bb - 1) / p->bb) * 128, (size_t)pb->heads_kv,
                  (size_t)pb->batch, 128);
    } else {
      arg_tensor(&b, &pb->dq, es);
      st = launch(ctx, ks[w], &b, "attn_bwd_dq", (size_t)((pb->seqlen_q + p->bb - 1) / p->bb) * 128,
                  (size_t)pb->heads_q, (size_t)pb->batch, 128);
    }
    if (st) return st;
  }
  return finish(ctx, pb);
}

const attn__backend attn__backend_opencl = {
    .kind = ATTN_BACKEND_OPENCL,
    .name = "opencl",
    .host_memory = 0,
    .device_count = ocl_device_count,
    .device_info = ocl_device_info,
    .open = cl_open,
    .close = cl_close,
    .buffer_alloc = cl_buffer_alloc,
    .buffer_release = cl_buffer_release,
    .buffer_write = cl_buffer_write,
    .buffer_read = cl_buffer_read,
    .buffer_check = cl_buffer_check,
    .set_stream = cl_set_stream,
    .synchronize = cl_synchronize,
    .selftest = cl_selftest,
    .plan = cl_plan,
    .forward = cl_forward,
    .backward = cl_backward,
};
