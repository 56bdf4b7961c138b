/* The backend registry: which backends were built, which have devices, and
 * how a specification such as "cuda:1" or ATTN_BACKEND picks one. */
#include "attn_internal.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <pthread.h>

/* Preference order for "auto"; the CPU is last and always present. */
static const attn__backend *const registry[] = {
#ifdef ATTN_HAVE_CUDA
    &attn__backend_cuda,
#endif
#ifdef ATTN_HAVE_OPENCL
    &attn__backend_opencl,
#endif
    &attn__backend_cpu,
};
#define NREGISTRY (sizeof registry / sizeof registry[0])

static const char *const backend_names[] = {"auto", "cpu", "opencl", "cuda"};

const char *attn_backend_name(attn_backend backend) {
  if ((unsigned)backend < sizeof backend_names / sizeof backend_names[0])
    return backend_names[backend];
  return "unknown";
}

const attn__backend *attn__backend_find(attn_backend kind) {
  for (size_t i = 0; i < NREGISTRY; i++)
    if (registry[i]->kind == kind) return registry[i];
  return NULL;
}

int attn_backend_compiled(attn_backend backend) {
  return attn__backend_find(backend) != NULL;
}

/* Device counts and the reason a backend has none, per kind: each kind is
 * probed once for the process, when first asked about, under a lock, so
 * that threads asking at the same time read finished text. */
static int device_counts[4], probed[4];
static char unavailable_why[4][512];
static pthread_mutex_t probe_lock = PTHREAD_MUTEX_INITIALIZER;

static void probe_kind(attn_backend kind) {
  const attn__backend *b = attn__backend_find(kind);
  if (!b) {
    snprintf(unavailable_why[kind], sizeof unavailable_why[kind],
             "attn was built without the %s backend", attn_backend_name(kind));
    return;
  }
  char why[512] = "";
  int n = b->device_count(why, sizeof why);
  if (n < 0) n = 0;
  if (n == 0 && !why[0]) snprintf(why, sizeof why, "no %s device was found", b->name);
  snprintf(unavailable_why[kind], sizeof unavailable_why[kind], "%s", n > 0 ? "" : why);
  device_counts[kind] = n;
}

int attn_device_count(attn_backend backend) {
  if ((unsigned)backend >= 4) return 0;
  pthread_mutex_lock(&probe_lock);
  if (!probed[backend]) {
    probe_kind(backend);
    probed[backend] = 1;
  }
  const int n = device_counts[backend];
  pthread_mutex_unlock(&probe_lock);
  return n;
}

const char *attn_backend_unavailable_reason(attn_backend backend) {
  if ((unsigned)backend >= 4 || backend == ATTN_BACKEND_AUTO) return "";
  attn_device_count(backend);
  return unavailable_why[backend];
}

int attn_device_info_get(attn_backend backend, int index, attn_device_info *out) {
  if (!out) return ATTN_ENULL;
  const attn__backend *b = attn__backend_find(backend);
  if (!b) return ATTN_EUNAVAILABLE;
  int n = attn_device_count(backend);
  if (index < 0 || index >= n) return ATTN_EUNAVAILABLE;
  memset(out, 0, sizeof *out);
  out->backend = backend;
  out->index = index;
  int rc = b->device_info(index, out);
  out->backend = backend;
  out->index = index;
  return rc;
}

#define VALID_SPECS "auto, cpu, opencl, cuda, each optionally followed by :N (a device index)"

/* Parses "name" or "name:N". On success sets *kind and *index (-1 when no
 * index was given). */
static int parse_spec(attn_context *ctx, const char *spec, const char *source, attn_backend *kind,
                      int *index) {
  const char *colon = strchr(spec, ':');
  size_t len = colon ? (size_t)(colon - spec) : strlen(spec);
  int found = -1;
  for (int i = 0; i < 4; i++)
    if (strlen(backend_names[i]) == len && strncmp(spec, backend_names[i], len) == 0) found = i;
  if (found < 0)
    return attn__error(ctx, ATTN_EBACKEND,
                       "%s: unknown backend \"%s\"; valid values are " VALID_SPECS, source, spec);
  *kind = (attn_backend)found;
  *index = -1;
  if (colon) {
    const char *d = colon + 1;
    char *end = NULL;
    errno = 0;
    long v = strtol(d, &end, 10);
    if (!isdigit((unsigned char)*d) || *end != '\0' || errno || v > 1000000)
      return attn__error(ctx, ATTN_EBACKEND,
                         "%s: \"%s\" has a malformed device index; valid values are " VALID_SPECS,
                         source, spec);
    *index = (int)v;
  }
  return ATTN_OK;
}

/* Picks the backend for a specification and opens it on ctx. */
int attn__backend_open(attn_context *ctx, const char *spec) {
  const char *source = "backend";
  if (!spec || !*spec) {
    spec = ctx->settings.backend;
    source = "ATTN_BACKEND";
    if (ctx->settings.backend_nomem)
      return attn__error(ctx, ATTN_ENOMEM, "ATTN_BACKEND: out of memory copying its value");
    if (!spec || !*spec) {
      spec = "auto";
      source = "default";
    }
  }
  attn_backend kind = ATTN_BACKEND_AUTO;
  int index = -1;
  int rc = parse_spec(ctx, spec, source, &kind, &index);
  if (rc) return rc;

  const attn__backend *b = NULL;
  if (kind == ATTN_BACKEND_AUTO) {
    /* CUDA, then an OpenCL GPU, then the CPU. An OpenCL CPU device (PoCL)
     * is no better than the CPU backend, so auto skips it. */
    for (size_t i = 0; i < NREGISTRY && !b; i++) {
      int n = attn_device_count(registry[i]->kind);
      if (index >= 0 && index >= n) continue;
      if (n <= 0) continue;
      if (registry[i]->kind == ATTN_BACKEND_OPENCL) {
        int gpu = -1;
        for (int d = 0; d < n && gpu < 0; d++) {
          attn_device_info info;
          if (attn_device_info_get(ATTN_BACKEND_OPENCL, d, &info) == ATTN_OK && info.is_gpu)
            gpu = d;
        }
        if (gpu < 0) continue;
        if (index < 0) index = gpu;
      }
      b = registry[i];
    }
    if (!b)
      return attn__error(ctx, ATTN_EUNAVAILABLE, "%s: no backend has device %d", source, index);
  } else {
    b = attn__backend_find(kind);
    if (!b)
      return attn__error(ctx, ATTN_EUNAVAILABLE, "%s: \"%s\" asks for the %s backend, but %s",
                         source, spec, attn_backend_name(kind),
                         attn_backend_unavailable_reason(kind));
    int n = attn_device_count(kind);
    if (n <= 0)
      return attn__error(ctx, ATTN_EUNAVAILABLE, "%s: \"%s\" asks for the %s backend, but %s",
                         source, spec, attn_backend_name(kind),
                         attn_backend_unavailable_reason(kind));
    if (index < 0 && kind == ATTN_BACKEND_OPENCL) {
      /* Plain "opencl" prefers a GPU over a CPU device such as PoCL. */
      for (int d = 0; d < n && index < 0; d++) {
        attn_device_info info;
        if (attn_device_info_get(kind, d, &info) == ATTN_OK && info.is_gpu) index = d;
      }
    }
    if (index >= n)
      return attn__error(ctx, ATTN_EUNAVAILABLE,
                         "%s: \"%s\" asks for %s device %d, but there %s only %d (0..%d)", source,
                         spec, attn_backend_name(kind), index, n == 1 ? "is" : "are", n, n - 1);
  }
  if (index < 0) index = 0;
  rc = b->open(ctx, index);
  if (rc) return rc;
  ctx->backend = b;
  ctx->device = index;
  attn__debug("context on %s:%d (from %s \"%s\")", b->name, index, source, spec);
  return ATTN_OK;
}
