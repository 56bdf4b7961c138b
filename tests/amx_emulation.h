/*
 * AMX's tile operations in portable C, for building cpu/cpu_bf16_amx.c and
 * cpu/cpu_few_amx.c on CPUs without AMX (test_products; forced in with
 * -include, with the kernels' names). Per thread, as the tile registers are: eight tiles of up
 * to 16 rows x 64 bytes, shaped by the last configuration loaded. The
 * arithmetic is TDPBF16PS's: each f32 element of C gains the two products
 * of a bf16 pair of A's row by the pair of B's row at its column.
 */
#ifndef AT_AMX_EMULATION_H
#define AT_AMX_EMULATION_H

#include <stdint.h>
#include <string.h>

#define ATTN_CPU_BF16_EMULATED 1
#define ATTN_CPU_AMX_KERNEL_NAME at_amx_kernel_emulated
#define ATTN_CPU_BF16_KERNEL_NAME at_bf16_kernel_simde
#define ATTN_CPU_QK_FEW_AMX_NAME at_qk_few_amx_emulated
#define ATTN_CPU_PV_FEW_AMX_NAME at_pv_few_amx_emulated

typedef struct at_amx_tiles {
  int configured;
  uint8_t rows[8];
  uint16_t colsb[8];
  unsigned char t[8][16][64];
} at_amx_tiles;

/* The emulation fails loudly on misuse the hardware would fault on. */
extern _Thread_local at_amx_tiles at_amx;
void at_amx_fault(const char *what);

static inline float at_amx_bf16(const unsigned char *p) {
  uint32_t u = (uint32_t)(p[0] | p[1] << 8) << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

static inline void _tile_loadconfig(const void *cfg) {
  const unsigned char *c = cfg;
  if (c[0] != 1) at_amx_fault("palette other than 1");
  for (int t = 0; t < 8; t++) {
    at_amx.colsb[t] = (uint16_t)(c[16 + 2 * t] | c[17 + 2 * t] << 8);
    at_amx.rows[t] = c[48 + t];
    if (at_amx.rows[t] > 16 || at_amx.colsb[t] > 64) at_amx_fault("a tile over 16 x 64 bytes");
  }
  at_amx.configured = 1;
}
static inline void _tile_release(void) {
  at_amx.configured = 0;
}
static inline void at_amx_check(int t) {
  if (!at_amx.configured) at_amx_fault("a tile used without a configuration");
  if (t < 0 || t > 7) at_amx_fault("a tile number outside 0..7");
}
static inline void _tile_zero(int t) {
  at_amx_check(t);
  memset(at_amx.t[t], 0, sizeof at_amx.t[t]);
}
static inline void _tile_loadd(int t, const void *base, size_t stride) {
  at_amx_check(t);
  for (int r = 0; r < at_amx.rows[t]; r++)
    memcpy(at_amx.t[t][r], (const unsigned char *)base + r * stride, at_amx.colsb[t]);
}
static inline void _tile_stored(int t, void *base, size_t stride) {
  at_amx_check(t);
  for (int r = 0; r < at_amx.rows[t]; r++)
    memcpy((unsigned char *)base + r * stride, at_amx.t[t][r], at_amx.colsb[t]);
}
static inline void _tile_dpbf16ps(int c, int a, int b) {
  at_amx_check(c);
  at_amx_check(a);
  at_amx_check(b);
  const int m = at_amx.rows[c], n = at_amx.colsb[c] / 4, k = at_amx.colsb[a] / 4;
  if (at_amx.rows[a] != m || at_amx.rows[b] != k || at_amx.colsb[b] != at_amx.colsb[c])
    at_amx_fault("tile shapes that do not chain");
  for (int i = 0; i < m; i++)
    for (int j = 0; j < n; j++) {
      float acc;
      memcpy(&acc, &at_amx.t[c][i][4 * j], 4);
      for (int p = 0; p < k; p++) {
        acc += at_amx_bf16(&at_amx.t[a][i][4 * p + 2]) * at_amx_bf16(&at_amx.t[b][p][4 * j + 2]);
        acc += at_amx_bf16(&at_amx.t[a][i][4 * p]) * at_amx_bf16(&at_amx.t[b][p][4 * j]);
      }
      memcpy(&at_amx.t[c][i][4 * j], &acc, 4);
    }
}

#endif /* AT_AMX_EMULATION_H */
