/*
 * Reading a fuzz input as a stream of choices. Past the end every read gives
 * 0, so a short input is still a complete (mostly default) description: the
 * fuzzer's mutations then change one choice at a time.
 */
#ifndef ATTN_FUZZ_BYTES_H
#define ATTN_FUZZ_BYTES_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef struct fz_bytes {
  const uint8_t *p;
  size_t n;
} fz_bytes;

static inline uint8_t fz_u8(fz_bytes *b) {
  if (b->n == 0) return 0;
  b->n--;
  return *b->p++;
}

static inline uint64_t fz_u64(fz_bytes *b) {
  uint64_t v = 0;
  for (int i = 0; i < 8; i++)
    v = v << 8 | fz_u8(b);
  return v;
}

static inline uint32_t fz_u32(fz_bytes *b) {
  uint32_t v = 0;
  for (int i = 0; i < 4; i++)
    v = v << 8 | fz_u8(b);
  return v;
}

static inline double fz_f64(fz_bytes *b) {
  uint64_t u = fz_u64(b);
  double x;
  memcpy(&x, &u, sizeof x);
  return x;
}

static inline float fz_f32(fz_bytes *b) {
  uint32_t u = fz_u32(b);
  float x;
  memcpy(&x, &u, sizeof x);
  return x;
}

#endif /* ATTN_FUZZ_BYTES_H */
