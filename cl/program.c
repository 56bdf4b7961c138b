/*
 * Program builds through an on-disk cache of device binaries.
 *
 * Compiling the attention kernels takes seconds on some drivers (PoCL most of
 * all), so a built program's binary is kept in a folder: ATTN_CL_CACHE_DIR,
 * else $XDG_CACHE_HOME/attn, else ~/.cache/attn; ATTN_CL_CACHE=0 turns the
 * cache off. A file's name is a hash of everything that decides the binary:
 * platform, device, driver version, build options and source.
 *
 * The folder is not trusted: a file may be truncated, foreign, a FIFO, a
 * folder or enormous, and a driver handed a damaged binary may crash or
 * build a program that lacks the kernels. So a file carries a header that
 * says what it is (below), only a regular file under CACHE_MAX_BYTES is read,
 * and any failure from reading the file up to creating the kernels falls back
 * to building from source and replacing the file. Files are written under a
 * name unique to the call (mkstemp) and renamed, so a reader never sees half
 * a file and two threads or processes never write the same temporary. A cache
 * that cannot be read or written is never an error.
 */
#define _POSIX_C_SOURCE 200809L
#include "attn_cl.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

/* The file: a header of CACHE_HEADER bytes, then the driver's binary.
 *    0  magic "attnclb\n"
 *    8  format version (CACHE_VERSION), 32 bits
 *   12  zero, 32 bits
 *   16  the cache key the file was made for (its name's hash), 64 bits
 *   24  length of the binary, 64 bits
 *   32  FNV-1a 64 of the binary, 64 bits
 * Numbers are little-endian. */
#define CACHE_HEADER 40
#define CACHE_VERSION 1u
static const char cache_magic[8] = {'a', 't', 't', 'n', 'c', 'l', 'b', '\n'};

/* PoCL's attention program is 0.9 MB at head_dim 16, NVIDIA's a few MB:
 * anything above this is not a binary the library wrote. */
#define CACHE_MAX_BYTES ((size_t)64 << 20)

/* FNV-1a, 64 bits: a cache key and a check against damage, not a security
 * boundary. */
#define FNV_OFFSET 14695981039346656037ull
static uint64_t fnv1a(uint64_t h, const void *data, size_t n) {
  const unsigned char *p = (const unsigned char *)data;
  for (size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 1099511628211ull;
  }
  return h;
}

static uint64_t hash_str(uint64_t h, const char *s) {
  return fnv1a(h, s, strlen(s) + 1); /* the NUL separates fields */
}

static void put_le(unsigned char *p, uint64_t x, int n) {
  for (int i = 0; i < n; ++i)
    p[i] = (unsigned char)(x >> (8 * i));
}

static uint64_t get_le(const unsigned char *p, int n) {
  uint64_t x = 0;
  for (int i = n - 1; i >= 0; --i)
    x = x << 8 | p[i];
  return x;
}

void attn__cl_make_dirs(const char *dir) {
  char tmp[sizeof((attn__settings *)0)->cl_cache_dir];
  snprintf(tmp, sizeof tmp, "%s", dir);
  for (char *p = tmp + 1; *p; ++p) {
    if (*p != '/') continue;
    *p = 0;
    mkdir(tmp, 0755);
    *p = '/';
  }
  mkdir(tmp, 0755);
}

static int read_all(int fd, unsigned char *p, size_t n) {
  while (n > 0) {
    ssize_t r = read(fd, p, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return 0;
    p += r;
    n -= (size_t)r;
  }
  return 1;
}

static int write_all(int fd, const unsigned char *p, size_t n) {
  while (n > 0) {
    ssize_t w = write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return 0;
    p += w;
    n -= (size_t)w;
  }
  return 1;
}

/* The binary stored in path for key, or NULL. *why says what was wrong
 * with a file that exists (NULL when there is none). O_NONBLOCK: opening a
 * FIFO for reading would otherwise wait for a writer. */
static unsigned char *read_cached(const char *path, uint64_t key, size_t *size, const char **why) {
  *why = NULL;
  int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    if (errno != ENOENT) *why = "cannot be opened";
    return NULL;
  }
  struct stat st;
  unsigned char head[CACHE_HEADER], *bin = NULL;
  size_t n = 0;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))
    *why = "is not a regular file";
  else if (st.st_size < CACHE_HEADER || (uint64_t)st.st_size > CACHE_HEADER + CACHE_MAX_BYTES)
    *why = "has a size no cached program has";
  else if (!read_all(fd, head, CACHE_HEADER))
    *why = "cannot be read";
  else if (memcmp(head, cache_magic, 8) != 0 || get_le(head + 8, 4) != CACHE_VERSION)
    *why = "is not in this library's format";
  else if (get_le(head + 16, 8) != key)
    *why = "was made for another program";
  else if ((n = (size_t)get_le(head + 24, 8)) != (uint64_t)st.st_size - CACHE_HEADER || n == 0)
    *why = "is truncated or too long";
  else if (!(bin = (unsigned char *)malloc(n)))
    *why = "does not fit in memory";
  else if (!read_all(fd, bin, n) || fnv1a(FNV_OFFSET, bin, n) != get_le(head + 32, 8))
    *why = "is damaged (its hash differs)";
  close(fd);
  if (*why) {
    free(bin);
    return NULL;
  }
  *size = n;
  return bin;
}

static void write_cached(const char *path, uint64_t key, const unsigned char *bin, size_t n) {
  char tmp[1100];
  if (snprintf(tmp, sizeof tmp, "%s.XXXXXX", path) >= (int)sizeof tmp) return;
  int fd = mkstemp(tmp); /* a name no other thread or process is writing */
  if (fd < 0) return;
  unsigned char head[CACHE_HEADER] = {0};
  memcpy(head, cache_magic, 8);
  put_le(head + 8, CACHE_VERSION, 4);
  put_le(head + 16, key, 8);
  put_le(head + 24, n, 8);
  put_le(head + 32, fnv1a(FNV_OFFSET, bin, n), 8);
  int ok = fchmod(fd, 0644) == 0 && write_all(fd, head, CACHE_HEADER) && write_all(fd, bin, n);
  ok = close(fd) == 0 && ok;
  /* rename() replaces a file, a FIFO or a link; a folder of the same name
   * stays, and so does the old file when this fails. */
  if (!ok || rename(tmp, path) != 0) {
    unlink(tmp);
    return;
  }
  attn__debug("opencl: program cached in %s", path);
}

static void info_str(const attn__cl_api *cl, cl_device_id dev, cl_device_info what, char *buf,
                     size_t n) {
  buf[0] = 0;
  if (cl->clGetDeviceInfo(dev, what, n - 1, buf, NULL) != CL_SUCCESS) buf[0] = 0;
  buf[n - 1] = 0;
}

uint64_t attn__cl_device_key(const attn__cl_api *cl, cl_device_id dev) {
  char s[512];
  cl_platform_id plat = NULL;
  uint64_t key = FNV_OFFSET;
  cl->clGetDeviceInfo(dev, CL_DEVICE_PLATFORM, sizeof plat, &plat, NULL);
  s[0] = 0;
  if (plat) cl->clGetPlatformInfo(plat, CL_PLATFORM_NAME, sizeof s - 1, s, NULL);
  s[sizeof s - 1] = 0;
  key = hash_str(key, s);
  s[0] = 0;
  if (plat) cl->clGetPlatformInfo(plat, CL_PLATFORM_VERSION, sizeof s - 1, s, NULL);
  s[sizeof s - 1] = 0;
  key = hash_str(key, s);
  info_str(cl, dev, CL_DEVICE_NAME, s, sizeof s);
  key = hash_str(key, s);
  info_str(cl, dev, CL_DRIVER_VERSION, s, sizeof s);
  key = hash_str(key, s);
  info_str(cl, dev, CL_DEVICE_VERSION, s, sizeof s);
  return hash_str(key, s);
}

static int build_error(attn_context *ctx, const attn__cl_api *cl, cl_program prog, cl_device_id dev,
                       cl_int err) {
  char log[1600] = "";
  size_t len = 0;
  if (cl->clGetProgramBuildInfo(prog, dev, CL_PROGRAM_BUILD_LOG, sizeof log - 1, log, &len) !=
      CL_SUCCESS) {
    /* A log longer than the buffer: fetch it whole and keep its head. */
    char *all = len ? (char *)malloc(len + 1) : NULL;
    if (all &&
        cl->clGetProgramBuildInfo(prog, dev, CL_PROGRAM_BUILD_LOG, len, all, NULL) == CL_SUCCESS) {
      all[len] = 0;
      snprintf(log, sizeof log, "%s", all);
    }
    free(all);
  }
  log[sizeof log - 1] = 0;
  return attn__error(ctx, ATTN_EBUILD, "OpenCL program build failed (%s); build log: %s",
                     attn__cl_errname(err), log[0] ? log : "(empty)");
}

static void release_kernels(const attn__cl_api *cl, cl_kernel *kernels, int nk) {
  for (int i = 0; i < nk; ++i) {
    if (kernels[i]) cl->clReleaseKernel(kernels[i]);
    kernels[i] = NULL;
  }
}

/* The kernels of a built program; on failure none, *bad the one that failed. */
static cl_int create_kernels(const attn__cl_api *cl, cl_program prog, const char *const *names,
                             int nk, cl_kernel *kernels, int *bad) {
  cl_int err = CL_SUCCESS;
  for (int i = 0; i < nk; ++i)
    kernels[i] = NULL;
  for (int i = 0; i < nk; ++i) {
    kernels[i] = cl->clCreateKernel(prog, names[i], &err);
    if (!kernels[i] || err != CL_SUCCESS) {
      *bad = i;
      release_kernels(cl, kernels, nk);
      return err != CL_SUCCESS ? err : CL_INVALID_KERNEL;
    }
  }
  return CL_SUCCESS;
}

/* The program and its kernels from a cached binary, or 0 with *why. */
static int from_binary(const attn__cl_api *cl, cl_context clctx, cl_device_id dev,
                       const unsigned char *bin, size_t size, const char *options,
                       const char *const *names, int nk, cl_program *out, cl_kernel *kernels,
                       const char **why) {
  cl_int err = CL_SUCCESS, status = CL_SUCCESS;
  int bad = 0;
  cl_program prog = cl->clCreateProgramWithBinary(clctx, 1, &dev, &size, &bin, &status, &err);
  if (!prog || err != CL_SUCCESS || status != CL_SUCCESS)
    *why = "was refused by clCreateProgramWithBinary";
  else if (cl->clBuildProgram(prog, 1, &dev, options, NULL, NULL) != CL_SUCCESS)
    *why = "was refused by clBuildProgram";
  else if (create_kernels(cl, prog, names, nk, kernels, &bad) != CL_SUCCESS)
    *why = "lacks a kernel (clCreateKernel failed)";
  else {
    *out = prog;
    return 1;
  }
  if (prog) cl->clReleaseProgram(prog);
  return 0;
}

int attn__cl_build(attn_context *ctx, const attn__cl_api *cl, cl_context clctx, cl_device_id dev,
                   const char *const *srcs, int nsrc, const char *options, const char *const *names,
                   int nk, cl_program *out, cl_kernel *kernels) {
  cl_int err;
  *out = NULL;
  for (int i = 0; i < nk; ++i)
    kernels[i] = NULL;

  char path[sizeof ctx->settings.cl_cache_dir + 32] = "";
  uint64_t key = 0;
  if (ctx->settings.cl_cache) {
    key = attn__cl_device_key(cl, dev);
    key = hash_str(key, options);
    for (int i = 0; i < nsrc; ++i)
      key = hash_str(key, srcs[i]);
    for (int i = 0; i < nk; ++i)
      key = hash_str(key, names[i]);
    snprintf(path, sizeof path, "%s/cl-%016llx.bin", ctx->settings.cl_cache_dir,
             (unsigned long long)key);

    size_t size = 0;
    const char *why = NULL;
    unsigned char *bin = read_cached(path, key, &size, &why);
    if (bin) {
      int ok = from_binary(cl, clctx, dev, bin, size, options, names, nk, out, kernels, &why);
      free(bin);
      if (ok) {
        attn__debug("opencl: program loaded from %s", path);
        return ATTN_OK;
      }
    }
    if (why) attn__debug("opencl: cached program %s %s; rebuilding it", path, why);
  }

  size_t lens[8];
  for (int i = 0; i < nsrc; ++i)
    lens[i] = strlen(srcs[i]);
  cl_program prog =
      cl->clCreateProgramWithSource(clctx, (cl_uint)nsrc, (const char **)srcs, lens, &err);
  if (!prog || err != CL_SUCCESS)
    return attn__error(ctx, err == CL_OUT_OF_HOST_MEMORY ? ATTN_ENOMEM : ATTN_EDEVICE,
                       "clCreateProgramWithSource failed (%s)", attn__cl_errname(err));
  err = cl->clBuildProgram(prog, 1, &dev, options, NULL, NULL);
  if (err != CL_SUCCESS) {
    int st = build_error(ctx, cl, prog, dev, err);
    cl->clReleaseProgram(prog);
    return st;
  }
  int bad = 0;
  err = create_kernels(cl, prog, names, nk, kernels, &bad);
  if (err != CL_SUCCESS) {
    cl->clReleaseProgram(prog);
    return attn__error(
        ctx,
        err == CL_OUT_OF_HOST_MEMORY || err == CL_OUT_OF_RESOURCES ? ATTN_ENOMEM : ATTN_EDEVICE,
        "clCreateKernel(%s) failed (%s)", names[bad], attn__cl_errname(err));
  }
  attn__debug("opencl: program built from source (%s)", options);

  if (path[0]) {
    size_t size = 0;
    if (cl->clGetProgramInfo(prog, CL_PROGRAM_BINARY_SIZES, sizeof size, &size, NULL) ==
            CL_SUCCESS &&
        size > 0 && size <= CACHE_MAX_BYTES) {
      unsigned char *bin = (unsigned char *)malloc(size);
      unsigned char *bins[1] = {bin};
      if (bin &&
          cl->clGetProgramInfo(prog, CL_PROGRAM_BINARIES, sizeof bins, bins, NULL) == CL_SUCCESS) {
        attn__cl_make_dirs(ctx->settings.cl_cache_dir);
        write_cached(path, key, bin, size);
      }
      free(bin);
    }
  }
  *out = prog;
  return ATTN_OK;
}
