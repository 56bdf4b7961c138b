/* Status names and messages, dtypes, and half-precision conversions. */
#include "attn_internal.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

const char *attn_status_name(int status) {
  switch (status) {
#define ATTN__STATUS_NAME(name, value, msg) \
  case value:                               \
    return "ATTN_" #name;
    ATTN_STATUS_MAP(ATTN__STATUS_NAME)
#undef ATTN__STATUS_NAME
  }
  return "ATTN_UNKNOWN";
}

const char *attn_strerror(int status) {
  switch (status) {
#define ATTN__STATUS_MSG(name, value, msg) \
  case value:                              \
    return msg;
    ATTN_STATUS_MAP(ATTN__STATUS_MSG)
#undef ATTN__STATUS_MSG
  }
  return "unknown status code";
}

const char *attn_dtype_name(attn_dtype dtype) {
  switch (dtype) {
    case ATTN_F32:
      return "f32";
    case ATTN_F16:
      return "f16";
    case ATTN_BF16:
      return "bf16";
    case ATTN_I32:
      return "i32";
  }
  return "unknown";
}

size_t attn_dtype_size(attn_dtype dtype) {
  switch (dtype) {
    case ATTN_F32:
    case ATTN_I32:
      return 4;
    case ATTN_F16:
    case ATTN_BF16:
      return 2;
  }
  return 0;
}

/* IEEE 754 binary16 <-> binary32, round to nearest even, subnormals kept. */
float attn__f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t man = h & 0x3ffu;
  uint32_t u;
  if (exp == 0x1f) {
    u = sign | 0x7f800000u | (man << 13);
  } else if (exp != 0) {
    u = sign | ((exp + 112u) << 23) | (man << 13);
  } else if (man == 0) {
    u = sign;
  } else {
    /* Subnormal: value = man * 2^-24. */
    float f = (float)man * 5.9604644775390625e-8f;
    memcpy(&u, &f, 4);
    u |= sign;
  }
  float f;
  memcpy(&f, &u, 4);
  return f;
}

uint16_t attn__f32_to_f16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);  /* NaN */
  if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* rounds to inf */
  if (a < 0x38800000u) {
    /* Result is subnormal (or zero): scale to units of 2^-24 and round. */
    float af;
    memcpy(&af, &a, 4);
    float scaled = af * 16777216.0f; /* exact: power of two */
    uint32_t m = (uint32_t)scaled;
    float rem = scaled - (float)m;
    if (rem > 0.5f || (rem == 0.5f && (m & 1u))) m++;
    return (uint16_t)(sign | m);
  }
  uint32_t r = a + 0xfffu + ((a >> 13) & 1u); /* round mantissa to 10 bits */
  return (uint16_t)(sign | (uint16_t)((r - 0x38000000u) >> 13));
}

int attn__error(attn_context *ctx, int status, const char *fmt, ...) {
  if (ctx) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ctx->errmsg, sizeof ctx->errmsg, fmt, ap);
    va_end(ap);
    attn__debug("%s: %s", attn_status_name(status), ctx->errmsg);
  }
  return status;
}

void attn__debug(const char *fmt, ...) {
  if (!attn__settings_process()->debug) return;
  va_list ap;
  va_start(ap, fmt);
  fputs("attn: ", stderr);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
}
