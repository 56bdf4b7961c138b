/*
 * The products of few query rows (decoding: attn__cpu_qk_few and
 * attn__cpu_pv_few in cpu_tile.c) on AMX's tiles, for bf16 problems whose
 * head dimension is a multiple of 32. A kv head's key rows meet its
 * columns (the query rows of the heads that read it), 16 columns a tile:
 *
 *   S^T = scale K Q^T  A: 16 key rows x 32 elements, loaded where the cache
 *                      holds them; B: Q^T in pairs (16 pairs x 16 columns).
 *   O += P V           A: 16 columns' P, 32 keys in pairs (the softmax's
 *                      pairs, transposed); B: V's rows interleaved in pairs
 *                      of keys (16 pairs x 16 elements); C: O's rows.
 *
 * With the GQA group packed, a decoding step's key row meets 16 columns
 * (4 query rows of 4 heads), which AVX-512's multiply-adds cannot take at
 * memory speed; a tile product takes 16 of them at once. Every score is
 * the same chain of tile products, d / 32 of them in order, whatever
 * columns and rows sit beside it, so the forward (many heads a tile) and
 * the backward (one) still agree to the bit.
 *
 * Built like cpu_bf16_amx.c: with ATTN_CPU_BF16_EMULATED, on the tile
 * operations that the build includes first (the tests' amx_emulation.h,
 * which also renames the two functions), on any CPU.
 */
#include "cpu_amx.h"
#include "cpu_internal.h"

#ifndef ATTN_CPU_QK_FEW_AMX_NAME
#define ATTN_CPU_QK_FEW_AMX_NAME attn__cpu_qk_few_amx
#define ATTN_CPU_PV_FEW_AMX_NAME attn__cpu_pv_few_amx
#endif

/* Tiles (cpu_amx_tiles): 0-1 accumulators, 2-3 A, 4 B for S^T; 0-1
 * accumulators, 2 A, 3-4 B for O. */

/* 16 key rows k[i] + off (i < rows) as a tile source: where they are,
 * when the 16 are evenly spaced (*stride bytes apart), else copied into
 * buf (d apart, zeros past rows). */
static const uint16_t *cpu_few_rows16(const uint16_t *const *k, ptrdiff_t off, int rows, int d,
                                      uint16_t *buf, size_t *stride) {
  if (rows == 16) {
    const uintptr_t s = (uintptr_t)k[1] - (uintptr_t)k[0];
    int even = (uintptr_t)k[1] > (uintptr_t)k[0];
    for (int i = 2; even && i < 16; i++)
      even = (uintptr_t)k[i] - (uintptr_t)k[i - 1] == s;
    if (even) {
      *stride = (size_t)s;
      return k[0] + off;
    }
  }
  for (int i = 0; i < 16; i++)
    if (i < rows)
      memcpy(buf + (size_t)i * d, k[i] + off, (size_t)d * sizeof *buf);
    else
      memset(buf + (size_t)i * d, 0, (size_t)d * sizeof *buf);
  *stride = (size_t)d * sizeof *buf;
  return buf;
}

/* The d elements of rows x[a] + i hstep, a in [a0, a1), i < nkv, fetched
 * ahead of the products that read them, into L2: they wait there without
 * holding L1's few miss buffers (as attn__cpu_qk_few's rows do). */
static void cpu_few_fetch(const uint16_t *const *x, int a0, int a1, int nkv, ptrdiff_t hstep,
                          int d) {
  for (int a = a0; a < a1; a++)
    for (int i = 0; i < nkv; i++)
      for (int e = 0; e < d; e += 32)
        __builtin_prefetch(x[a] + i * hstep + e, 0, 2);
}

CPU_AMX_TARGET void ATTN_CPU_QK_FEW_AMX_NAME(const uint16_t *const *k, const uint16_t *const *v,
                                             ptrdiff_t hstep, int nkv, const int *cols, int bc,
                                             int kn, int d, const uint32_t *qp, int ldq,
                                             float scale, float *st, int ld) {
  uint16_t buf[2][16 * ATTN_MAX_HEAD_DIM];
  float c[2][16 * 16];
  cpu_amx_tiles();
  /* 32 keys a step, every kv head's before the next keys, so that the
   * cache is read in address order; the next step's keys (past the
   * block's end too: the stream does not stop at every block) and this
   * one's values fetched meanwhile (attn__cpu_pv_few reads them next).
   * Two blocks of 16 keys: their chains of products run side by side. */
  cpu_few_fetch(k, 0, kn < 32 ? kn : 32, nkv, hstep, d);
  for (int a0 = 0; a0 < bc; a0 += 32) {
    const int left = bc - a0, a1 = a0 + 32 < bc ? a0 + 32 : bc;
    const int rows[2] = {left < 16 ? left : 16, left <= 16 ? 0 : left < 32 ? left - 16 : 16};
    cpu_few_fetch(k, a1, a1 + 32 < kn ? a1 + 32 : kn, nkv, hstep, d);
    if (v) cpu_few_fetch(v, a0, a1, nkv, hstep, d);
    for (int h = 0; h < nkv; h++) {
      const uint16_t *src[2] = {NULL, NULL};
      size_t ss[2] = {0, 0};
      for (int i = 0; i < 2; i++)
        if (rows[i])
          src[i] = cpu_few_rows16(k + a0 + 16 * i, h * hstep, rows[i], d, buf[i], &ss[i]);
      for (int c0 = cols[h]; c0 < cols[h + 1]; c0 += 16) {
        _tile_zero(0);
        _tile_zero(1);
        for (int x = 0; x < d; x += 32) {
          _tile_loadd(4, qp + (size_t)(x / 2) * ldq + c0, (size_t)ldq * sizeof *qp);
          _tile_loadd(2, src[0] + x, ss[0]);
          _tile_dpbf16ps(0, 2, 4);
          if (rows[1]) {
            _tile_loadd(3, src[1] + x, ss[1]);
            _tile_dpbf16ps(1, 3, 4);
          }
        }
        _tile_stored(0, c[0], 64);
        if (rows[1]) _tile_stored(1, c[1], 64);
        const int w = cols[h + 1] - c0 < 16 ? cols[h + 1] - c0 : 16;
        for (int i = 0; i < 2; i++)
          for (int r = 0; r < rows[i]; r++) {
            float *srow = st + (size_t)(a0 + 16 * i + r) * ld + c0;
            for (int y = 0; y < w; y++)
              srow[y] = scale * c[i][r * 16 + y];
          }
      }
    }
  }
  _tile_release();
}

/* V's rows (v[0..bc)) in pairs of keys, np16 pair rows of d (zeros past
 * the keys): vp[p d + x] = v[2p][x] | v[2p + 1][x] << 16. */
CPU_AMX_TARGET static void cpu_few_v_pairs(const uint16_t *const *v, int bc, int d, int np16,
                                           uint32_t *vp) {
  typedef uint16_t u16x32 __attribute__((vector_size(64)));
  for (int p = 0; p < np16; p++) {
    uint32_t *out = vp + (size_t)p * d;
    const int a = 2 * p;
    if (a >= bc) {
      memset(out, 0, (size_t)d * sizeof *out);
      continue;
    }
    for (int x = 0; x < d; x += 32) {
      u16x32 lo, hi = {0};
      memcpy(&lo, v[a] + x, sizeof lo);
      if (a + 1 < bc) memcpy(&hi, v[a + 1] + x, sizeof hi);
      const u16x32 e0 =
          __builtin_shufflevector(lo, hi, 0, 32, 1, 33, 2, 34, 3, 35, 4, 36, 5, 37, 6, 38, 7, 39, 8,
                                  40, 9, 41, 10, 42, 11, 43, 12, 44, 13, 45, 14, 46, 15, 47);
      const u16x32 e1 = __builtin_shufflevector(lo, hi, 16, 48, 17, 49, 18, 50, 19, 51, 20, 52, 21,
                                                53, 22, 54, 23, 55, 24, 56, 25, 57, 26, 58, 27, 59,
                                                28, 60, 29, 61, 30, 62, 31, 63);
      memcpy(out + x, &e0, sizeof e0);
      memcpy(out + x + 16, &e1, sizeof e1);
    }
  }
}

CPU_AMX_TARGET void ATTN_CPU_PV_FEW_AMX_NAME(const uint16_t *const *v, int bc, int d,
                                             const uint32_t *pairs, int ldp, int n, float *o) {
  enum { KC = ATTN__CPU_TILE_MAX / 32 };
  static _Thread_local uint32_t vp[ATTN__CPU_TILE_MAX / 2 * ATTN_MAX_HEAD_DIM];
  static _Thread_local float ob[16 * ATTN_MAX_HEAD_DIM];
  uint32_t pa[KC][16 * 16];
  const int np = (bc + 1) / 2, np16 = (np + 15) / 16 * 16;
  cpu_few_v_pairs(v, bc, d, np16, vp);
  cpu_amx_tiles();
  for (int c0 = 0; c0 < n; c0 += 16) {
    const int w = n - c0 < 16 ? n - c0 : 16;
    /* A: column c's pairs of keys as a row; zeros past the columns. */
    for (int kc = 0; kc < np16 / 16; kc++)
      for (int c = 0; c < 16; c++)
        for (int j = 0; j < 16; j++) {
          const int p = kc * 16 + j;
          pa[kc][c * 16 + j] = c < w && p < np ? pairs[(size_t)p * ldp + c0 + c] : 0;
        }
    /* C: O's rows where all 16 are the tile's, else a copy of the w rows
     * (the rows past them gain A's zero rows and are not copied back). */
    float *cb = o + (size_t)c0 * d;
    if (w < 16) {
      memcpy(ob, cb, sizeof(float) * (size_t)w * (size_t)d);
      cb = ob;
    }
    const size_t sc = (size_t)d * sizeof(float), sv = (size_t)d * sizeof(uint32_t);
    for (int x = 0; x < d; x += 32) {
      _tile_loadd(0, cb + x, sc);
      _tile_loadd(1, cb + x + 16, sc);
      for (int kc = 0; kc < np16 / 16; kc++) {
        const uint32_t *b = vp + (size_t)kc * 16 * d + x;
        _tile_loadd(2, pa[kc], 64);
        _tile_loadd(3, b, sv);
        _tile_loadd(4, b + 16, sv);
        _tile_dpbf16ps(0, 2, 3);
        _tile_dpbf16ps(1, 2, 4);
      }
      _tile_stored(0, cb + x, sc);
      _tile_stored(1, cb + x + 16, sc);
    }
    if (w < 16) memcpy(o + (size_t)c0 * d, ob, sizeof(float) * (size_t)w * (size_t)d);
  }
  _tile_release();
}
