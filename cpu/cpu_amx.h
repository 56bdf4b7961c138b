/*
 * What the CPU backend's two users of AMX's tiles share (cpu_bf16_amx.c,
 * cpu_few_amx.c): the target attribute, and one tile configuration. With
 * ATTN_CPU_BF16_EMULATED they build without either, against the tile
 * operations that the build includes first (the tests' amx_emulation.h).
 */
#ifndef ATTN_CPU_AMX_H
#define ATTN_CPU_AMX_H

#include <stdint.h>
#include <string.h>

#if defined(ATTN_CPU_BF16_EMULATED)
#define CPU_AMX_TARGET
#else
#include <immintrin.h>
#define CPU_AMX_TARGET __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl")))
#endif

/* Palette 1, all eight tiles 16 rows of 64 bytes. */
CPU_AMX_TARGET static inline void cpu_amx_tiles(void) {
  struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
  } cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.palette = 1;
  for (int t = 0; t < 8; t++) {
    cfg.rows[t] = 16;
    cfg.colsb[t] = 64;
  }
  _tile_loadconfig(&cfg);
}

#endif /* ATTN_CPU_AMX_H */
