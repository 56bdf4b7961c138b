/* The library's one reader of the environment. Every variable attn looks at
 * is read here, into an attn__settings: once per process for what the
 * process shares (the debug log, the OpenCL library to load, both needed
 * before any context exists), and once per context, at
 * attn_context_create(), for the rest, so that a call never reads the
 * environment and a context keeps the settings it was created with. */
#include "attn_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <pthread.h>

static const char *var(const char *name) {
  return getenv(name);
}

/* 0 when the value does not fit in n bytes (dst then holds its start). */
static int copy_var(char *dst, size_t n, const char *name) {
  const char *v = var(name);
  return snprintf(dst, n, "%s", v ? v : "") < (int)n;
}

void attn__settings_read(attn__settings *out) {
  memset(out, 0, sizeof *out);
  char debug[16];
  copy_var(debug, sizeof debug, "ATTN_DEBUG");
  out->debug = debug[0] && strcmp(debug, "0") != 0;
  /* A library path cut short would name another library: the flag turns it
   * into an error where it is used. A tile override cut short is dropped, as
   * one the kernels cannot take is. */
  /* ATTN_BACKEND has no length limit ("cpu:000...0" is device 0): a copy. */
  const char *spec = var("ATTN_BACKEND");
  if (spec) {
    size_t n = strlen(spec) + 1;
    out->backend = malloc(n);
    if (out->backend)
      memcpy(out->backend, spec, n);
    else
      out->backend_nomem = 1;
  }
  out->cl_library_too_long = !copy_var(out->cl_library, sizeof out->cl_library, "ATTN_CL_LIBRARY");

  char cache[16];
  copy_var(cache, sizeof cache, "ATTN_CL_CACHE");
  out->cl_cache = strcmp(cache, "0") != 0;
  /* ATTN_CL_CACHE_DIR, else the XDG cache folder, else ~/.cache. */
  char d[sizeof out->cl_cache_dir], xdg[sizeof out->cl_cache_dir], home[sizeof out->cl_cache_dir];
  copy_var(d, sizeof d, "ATTN_CL_CACHE_DIR");
  copy_var(xdg, sizeof xdg, "XDG_CACHE_HOME");
  copy_var(home, sizeof home, "HOME");
  int w = 0;
  if (d[0])
    w = snprintf(out->cl_cache_dir, sizeof out->cl_cache_dir, "%s", d);
  else if (xdg[0])
    w = snprintf(out->cl_cache_dir, sizeof out->cl_cache_dir, "%s/attn", xdg);
  else if (home[0])
    w = snprintf(out->cl_cache_dir, sizeof out->cl_cache_dir, "%s/.cache/attn", home);
  /* No folder, or one too long to hold: no cache rather than another one. */
  if (w <= 0 || (size_t)w >= sizeof out->cl_cache_dir) {
    out->cl_cache_dir[0] = '\0';
    out->cl_cache = 0;
  }
}

void attn__settings_free(attn__settings *s) {
  free(s->backend);
  s->backend = NULL;
}

static attn__settings process_settings;
static pthread_once_t process_once = PTHREAD_ONCE_INIT;

static void read_process_settings(void) {
  attn__settings_read(&process_settings);
}

const attn__settings *attn__settings_process(void) {
  pthread_once(&process_once, read_process_settings);
  return &process_settings;
}
