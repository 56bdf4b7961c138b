/*
 * Loading OpenCL at run time. The library never links libOpenCL: a machine
 * without an OpenCL loader or driver still runs the library, and this
 * backend then reports itself unavailable so that "auto" falls back.
 *
 * ATTN_CL_LIBRARY names another library to load instead (a specific ICD, or
 * a missing path to test the fallback).
 */
#include "attn_cl.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <pthread.h>

static attn__cl_api g_api;
static const attn__cl_api *g_loaded;
static char g_why[512];
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static void load_once(void) {
  if (attn__settings_process()->cl_library_too_long) {
    snprintf(g_why, sizeof g_why, "ATTN_CL_LIBRARY is longer than %zu characters",
             sizeof attn__settings_process()->cl_library - 1);
    return;
  }
  /* The ICD loader's names; macOS has its OpenCL as a system framework. */
  const char *names[] = {attn__settings_process()->cl_library,
#ifdef __APPLE__
                         "/System/Library/Frameworks/OpenCL.framework/OpenCL",
#endif
                         "libOpenCL.so.1", "libOpenCL.so"};
  const int n = (int)(sizeof names / sizeof names[0]);
  void *lib = NULL;
  int first = names[0] && names[0][0] ? 0 : 1;
  for (int i = first; i < n && !lib; ++i) {
    lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    if (first == 0) break; /* an explicit library is the only one tried */
  }
  if (!lib) {
    const char *err = dlerror();
    snprintf(g_why, sizeof g_why, "the OpenCL library could not be loaded (%s)",
             err ? err : "not found");
    return;
  }
#define ATTN__CL_RESOLVE(name)                                                             \
  do {                                                                                     \
    void *sym = dlsym(lib, #name);                                                         \
    if (!sym) {                                                                            \
      snprintf(g_why, sizeof g_why, "the OpenCL library lacks the entry point %s", #name); \
      dlclose(lib);                                                                        \
      return;                                                                              \
    }                                                                                      \
    memcpy(&g_api.name, &sym, sizeof sym);                                                 \
  } while (0);
  ATTN__CL_FUNCS(ATTN__CL_RESOLVE)
#undef ATTN__CL_RESOLVE
  g_loaded = &g_api; /* the library stays loaded for the process's life */
}

const attn__cl_api *attn__cl_load(const char **why) {
  pthread_once(&g_once, load_once);
  if (why) *why = g_loaded ? "" : g_why;
  return g_loaded;
}

const char *attn__cl_errname(cl_int err) {
  switch (err) {
#define E(x) \
  case x:    \
    return #x;
    E(CL_SUCCESS)
    E(CL_DEVICE_NOT_FOUND)
    E(CL_DEVICE_NOT_AVAILABLE)
    E(CL_COMPILER_NOT_AVAILABLE)
    E(CL_MEM_OBJECT_ALLOCATION_FAILURE)
    E(CL_OUT_OF_RESOURCES)
    E(CL_OUT_OF_HOST_MEMORY)
    E(CL_BUILD_PROGRAM_FAILURE)
    E(CL_MISALIGNED_SUB_BUFFER_OFFSET)
    E(CL_INVALID_VALUE)
    E(CL_INVALID_DEVICE)
    E(CL_INVALID_CONTEXT)
    E(CL_INVALID_COMMAND_QUEUE)
    E(CL_INVALID_MEM_OBJECT)
    E(CL_INVALID_BINARY)
    E(CL_INVALID_BUILD_OPTIONS)
    E(CL_INVALID_PROGRAM)
    E(CL_INVALID_PROGRAM_EXECUTABLE)
    E(CL_INVALID_KERNEL_NAME)
    E(CL_INVALID_KERNEL)
    E(CL_INVALID_ARG_INDEX)
    E(CL_INVALID_ARG_VALUE)
    E(CL_INVALID_ARG_SIZE)
    E(CL_INVALID_KERNEL_ARGS)
    E(CL_INVALID_WORK_DIMENSION)
    E(CL_INVALID_WORK_GROUP_SIZE)
    E(CL_INVALID_WORK_ITEM_SIZE)
    E(CL_INVALID_GLOBAL_OFFSET)
    E(CL_INVALID_EVENT_WAIT_LIST)
    E(CL_INVALID_OPERATION)
    E(CL_INVALID_BUFFER_SIZE)
    E(CL_INVALID_GLOBAL_WORK_SIZE)
#undef E
    case -1001: /* CL_PLATFORM_NOT_FOUND_KHR, the ICD loader's "no driver" */
      return "CL_PLATFORM_NOT_FOUND_KHR: no OpenCL driver is installed";
    default:
      return "an OpenCL error";
  }
}
