/*
 * Which CUDA devices this build has code for. The kernels carry machine code
 * (SASS) and PTX for the architectures CMake compiled them for; a device
 * outside them fails at its first launch. Deciding from the list and the
 * device's compute capability needs no context on the device, so probing
 * stays cheap, and a device with no code is not counted: `auto` then moves
 * on to OpenCL or the CPU.
 *
 * The list is CMake's CUDA_ARCHITECTURES: entries such as 80, 90a-real or
 * 90-virtual. SASS for X.Y runs on X.Z for Z >= Y (an "a" target: on X.Y
 * only); PTX for X.Y is compiled by the driver for any later device (an "a"
 * target: X.Y only; "f": the same major). all, all-major and native cover
 * what CMake built them to cover, so they are trusted.
 */
#include "attn_cuda.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>

/* One entry: whether it covers compute capability cc (10 * major + minor). */
static int entry_covers(const char *e, size_t n, int cc) {
  char buf[32];
  if (n == 0 || n >= sizeof buf) return 0;
  memcpy(buf, e, n);
  buf[n] = '\0';
  if (!strcmp(buf, "all") || !strcmp(buf, "all-major") || !strcmp(buf, "native")) return 1;
  char *p = buf;
  if (!isdigit((unsigned char)*p)) return 0;
  const long arch = strtol(p, &p, 10);
  char variant = 0; /* 'a': this architecture only; 'f': its family */
  if (*p == 'a' || *p == 'f') variant = *p++;
  int sass = 1, ptx = 1;
  if (!strcmp(p, "-real")) {
    ptx = 0;
  } else if (!strcmp(p, "-virtual")) {
    sass = 0;
  } else if (*p) {
    return 0;
  }
  const int same_major = cc / 10 == arch / 10 && cc >= arch;
  if (variant == 'a') return cc == arch;
  if (sass && same_major) return 1;
  if (ptx) return variant == 'f' ? same_major : cc >= arch;
  return 0;
}

int attn__cuda_arch_covers(const char *archs, int cc) {
  if (!archs) return 0;
  const char *s = archs;
  while (*s) {
    while (*s == ' ' || *s == ';' || *s == ',')
      s++;
    const char *e = s;
    while (*e && *e != ' ' && *e != ';' && *e != ',')
      e++;
    if (e > s && entry_covers(s, (size_t)(e - s), cc)) return 1;
    s = e;
  }
  return 0;
}

const char *attn__cuda_archs(void) {
#ifdef ATTN_CUDA_ARCHS
  return ATTN_CUDA_ARCHS;
#else
  return "";
#endif
}
