/*
 * Program builds through an on-disk cache of device binaries.
 *
 * Compiling the attention kernels takes seconds on some drivers (PoCL most of
 * all), so a built program's binary is kept in a folder: ATTN_CL_CACHE_DIR,
 * else $XDG_CACHE_HOME/attn, else ~/.cache/attn; ATTN_CL_CACHE=0 turns the
 * cache off. A file's name is a hash of everything that decides the binary:
 * platform, device, driver version, build options and source. Files are
 * written to a temporary name and renamed, so a reader never sees half a
 * file, and a cache that cannot be read or written is never an error: the
 * program is then built from source.
 */
#define _POSIX_C_SOURCE 200809L
#include "attn_cl.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

/* FNV-1a, 64 bits: a cache key, not a security boundary. */
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

/* The cache folder, or 0 when caching is off. */
static int cache_dir(char *dir, size_t n) {
  const char *off = getenv("ATTN_CL_CACHE");
  if (off && strcmp(off, "0") == 0) return 0;
  const char *d = getenv("ATTN_CL_CACHE_DIR");
  const char *xdg = getenv("XDG_CACHE_HOME");
  const char *home = getenv("HOME");
  int w;
  if (d && d[0])
    w = snprintf(dir, n, "%s", d);
  else if (xdg && xdg[0])
    w = snprintf(dir, n, "%s/attn", xdg);
  else if (home && home[0])
    w = snprintf(dir, n, "%s/.cache/attn", home);
  else
    return 0;
  return w > 0 && (size_t)w < n;
}

/* mkdir -p; failures surface later as a failed write, which is ignored. */
static void make_dirs(const char *dir) {
  char tmp[1024];
  snprintf(tmp, sizeof tmp, "%s", dir);
  for (char *p = tmp + 1; *p; ++p) {
    if (*p != '/') continue;
    *p = 0;
    mkdir(tmp, 0755);
    *p = '/';
  }
  mkdir(tmp, 0755);
}

static unsigned char *read_file(const char *path, size_t *size) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  unsigned char *buf = NULL;
  long n = -1;
  if (fseek(f, 0, SEEK_END) == 0) n = ftell(f);
  if (n > 0 && fseek(f, 0, SEEK_SET) == 0) {
    buf = (unsigned char *)malloc((size_t)n);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
      free(buf);
      buf = NULL;
    }
  }
  fclose(f);
  *size = (size_t)n;
  return buf;
}

static void write_file_atomic(const char *path, const unsigned char *data, size_t n) {
  char tmp[1100];
  snprintf(tmp, sizeof tmp, "%s.%ld.tmp", path, (long)getpid());
  FILE *f = fopen(tmp, "wb");
  if (!f) return;
  int ok = fwrite(data, 1, n, f) == n;
  ok = (fclose(f) == 0) && ok;
  if (!ok || rename(tmp, path) != 0) remove(tmp);
}

static void info_str(const attn__cl_api *cl, cl_device_id dev, cl_device_info what, char *buf,
                     size_t n) {
  buf[0] = 0;
  if (cl->clGetDeviceInfo(dev, what, n - 1, buf, NULL) != CL_SUCCESS) buf[0] = 0;
  buf[n - 1] = 0;
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

int attn__cl_build(attn_context *ctx, const attn__cl_api *cl, cl_context clctx, cl_device_id dev,
                   const char *const *srcs, int nsrc, const char *options, cl_program *out) {
  cl_int err;
  *out = NULL;

  char dir[900], path[1024] = "";
  if (cache_dir(dir, sizeof dir)) {
    char s[512];
    cl_platform_id plat = NULL;
    uint64_t h = 14695981039346656037ull;
    cl->clGetDeviceInfo(dev, CL_DEVICE_PLATFORM, sizeof plat, &plat, NULL);
    s[0] = 0;
    if (plat) cl->clGetPlatformInfo(plat, CL_PLATFORM_NAME, sizeof s - 1, s, NULL);
    s[sizeof s - 1] = 0;
    h = hash_str(h, s);
    s[0] = 0;
    if (plat) cl->clGetPlatformInfo(plat, CL_PLATFORM_VERSION, sizeof s - 1, s, NULL);
    h = hash_str(h, s);
    info_str(cl, dev, CL_DEVICE_NAME, s, sizeof s);
    h = hash_str(h, s);
    info_str(cl, dev, CL_DRIVER_VERSION, s, sizeof s);
    h = hash_str(h, s);
    info_str(cl, dev, CL_DEVICE_VERSION, s, sizeof s);
    h = hash_str(h, s);
    h = hash_str(h, options);
    for (int i = 0; i < nsrc; ++i)
      h = hash_str(h, srcs[i]);
    snprintf(path, sizeof path, "%s/cl-%016llx.bin", dir, (unsigned long long)h);

    size_t size = 0;
    unsigned char *bin = read_file(path, &size);
    if (bin) {
      const unsigned char *bins[1] = {bin};
      cl_int status = CL_SUCCESS;
      cl_program prog = cl->clCreateProgramWithBinary(clctx, 1, &dev, &size, bins, &status, &err);
      free(bin);
      if (prog && err == CL_SUCCESS && status == CL_SUCCESS &&
          cl->clBuildProgram(prog, 1, &dev, options, NULL, NULL) == CL_SUCCESS) {
        attn__debug("opencl: program loaded from %s", path);
        *out = prog;
        return ATTN_OK;
      }
      /* A stale or foreign file: rebuild from source and overwrite it. */
      if (prog) cl->clReleaseProgram(prog);
      attn__debug("opencl: cached program %s unusable, rebuilding", path);
    }
  }

  size_t lens[8];
  for (int i = 0; i < nsrc; ++i)
    lens[i] = strlen(srcs[i]);
  cl_program prog =
      cl->clCreateProgramWithSource(clctx, (cl_uint)nsrc, (const char **)srcs, lens, &err);
  if (!prog || err != CL_SUCCESS)
    return attn__error(ctx, ATTN_EDEVICE, "clCreateProgramWithSource failed (%s)",
                       attn__cl_errname(err));
  err = cl->clBuildProgram(prog, 1, &dev, options, NULL, NULL);
  if (err != CL_SUCCESS) {
    int st = build_error(ctx, cl, prog, dev, err);
    cl->clReleaseProgram(prog);
    return st;
  }
  attn__debug("opencl: program built from source (%s)", options);

  if (path[0]) {
    size_t size = 0;
    if (cl->clGetProgramInfo(prog, CL_PROGRAM_BINARY_SIZES, sizeof size, &size, NULL) ==
            CL_SUCCESS &&
        size > 0) {
      unsigned char *bin = (unsigned char *)malloc(size);
      unsigned char *bins[1] = {bin};
      if (bin &&
          cl->clGetProgramInfo(prog, CL_PROGRAM_BINARIES, sizeof bins, bins, NULL) == CL_SUCCESS) {
        make_dirs(dir);
        write_file_atomic(path, bin, size);
      }
      free(bin);
    }
  }
  *out = prog;
  return ATTN_OK;
}
