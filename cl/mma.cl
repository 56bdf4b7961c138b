/*
 * NVIDIA's tensor cores from OpenCL C, through inline PTX (sm_80 and
 * later), for the kernels that run on them (fwd_mma.cl, bwd_mma.cl, which
 * follow this file): mma.sync m16n8k16 on f16 or bf16 (DTYPE) with f32
 * accumulators, the pack of two floats into one 16-bit pair, the lane
 * exchange of a warp, and the staging of 16-bit tiles into local memory
 * laid out so that every fragment is one 32-bit read. Fragments follow
 * the PTX ISA: lane (g, t) = (lane / 4, lane % 4) holds rows g and g + 8,
 * and of each 8 columns the columns 2 t, 2 t + 1, of C and D.
 */
#ifndef HD
#define HD 64
#endif
#ifndef MMA_ITEMS
#define MMA_ITEMS 128 /* work-items of a work-group: 4 warps */
#endif

#if DTYPE == 1
#define MMA_TYPES "f32.f16.f16.f32"
#define CVT_PAIR "cvt.rn.f16x2.f32"
#else
#define MMA_TYPES "f32.bf16.bf16.f32"
#define CVT_PAIR "cvt.rn.bf16x2.f32"
#endif

/* d = a b + d for one m16n8k16 tile (fragments as the PTX ISA lays them). */
inline void mma_tile(float *d, const uint *a, uint b0, uint b1) {
  float e0, e1, e2, e3;
  __asm__ __volatile__("mma.sync.aligned.m16n8k16.row.col." MMA_TYPES
                       " {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%11,%12,%13};"
                       : "=f"(e0), "=f"(e1), "=f"(e2), "=f"(e3)
                       : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "f"(d[0]),
                         "f"(d[1]), "f"(d[2]), "f"(d[3]));
  d[0] = e0;
  d[1] = e1;
  d[2] = e2;
  d[3] = e3;
}

/* x and y rounded to the element type, x in the low half. */
inline uint pack_pair(float x, float y) {
  uint r;
  __asm__ __volatile__(CVT_PAIR " %0, %1, %2;" : "=r"(r) : "f"(y), "f"(x));
  return r;
}

/* x from the lane whose id differs from this one's by the bits of m. */
inline float lane_xor(float x, int m) {
  uint r;
  __asm__ __volatile__("shfl.sync.bfly.b32 %0, %1, %2, 0x1f, 0xffffffff;"
                       : "=r"(r)
                       : "r"(as_uint(x)), "r"(m));
  return as_float(r);
}

/* Over the 4 lanes that share a row. */
inline float quad_max(float x) {
  x = fmax(x, lane_xor(x, 1));
  return fmax(x, lane_xor(x, 2));
}

inline float quad_sum(float x) {
  x += lane_xor(x, 1);
  return x + lane_xor(x, 2);
}

/* Rows j0 .. j0 + rows - 1 of a [.., HD] operand (n rows, d columns) into
 * local memory, zero past the ends: key rows (keyed, through KEY_ROW) or
 * query rows; row-major (row j at j * ld) or transposed (column c's rows
 * at c * ld); ld a multiple of 8, so that rows are whole 16-byte units. An item moves 8 columns at
 * a time, one 16-byte read where the run is contiguous and aligned. Row-major: consecutive items
 * take consecutive runs of a row (whole 16-byte stores); transposed:
 * consecutive keys, so that a warp's 16-bit stores fill whole words. */
inline void stage_tile(__local ushort *dst, int ld, int rows, __global const ushort *p, long4 s,
                       int j0, int n, int d, int keyed, int transposed, int lid KEY_PAGES_PARAM) {
  for (int e = lid; e < rows * HD / 8; e += MMA_ITEMS) {
    const int j = transposed ? e % rows : e / (HD / 8),
              c = 8 * (transposed ? e / rows : e % (HD / 8));
    uint4 x = (uint4)(0u);
    if (j0 + j < n) {
      const long row = keyed ? KEY_ROW(j0 + j, s) : (long)(j0 + j) * s.s1;
      __global const ushort *src = p + row + c * s.s3;
      if (s.s3 == 1 && c + 8 <= d && ((ulong)src & 15u) == 0u) {
        x = *(__global const uint4 *)src;
      } else {
        uint w[4] = {0u, 0u, 0u, 0u};
        for (int u = 0; u < 8 && c + u < d; ++u)
          w[u / 2] |= (uint)src[u * s.s3] << (16 * (u % 2));
        x = (uint4)(w[0], w[1], w[2], w[3]);
      }
    }
    if (transposed) {
      const uint xs[4] = {x.s0, x.s1, x.s2, x.s3};
#pragma unroll
      for (int u = 0; u < 8; ++u)
        dst[(c + u) * ld + j] = (ushort)(xs[u / 2] >> (16 * (u % 2)));
    } else {
      *(__local uint4 *)(dst + j * ld + c) = x;
    }
  }
}

#if HAS_BIAS
/* A bias tile through local memory: rows r0 .. r0 + rows - 1, keys j0 ..
 * j0 + cols - 1 of the bias at bias_h (row i, key j: + i s2 + j s3; nq rows,
 * nk keys), as stored (BIAS_DTYPE), 0 past the ends. bias_fetch loads an
 * item's 16-byte units into registers before the barrier that frees local
 * memory, so that they are in flight while the last tile's products end;
 * bias_put stores them after it, row i at i * ld elements (ld a multiple
 * of 8: rows stay whole units). Consecutive items take consecutive units of
 * a row: whole 16-byte reads where the row is contiguous and aligned. */
#define BIAS_BYTES (BIAS_DTYPE ? 2 : 4)
#define BIAS_UNIT (16 / BIAS_BYTES) /* elements a unit */

inline uint bias_bits(__global const uchar *bias, long i) {
  return BIAS_DTYPE ? (uint)((__global const ushort *)bias)[i] : ((__global const uint *)bias)[i];
}

inline void bias_fetch(uint4 *x, int units, int cols, __global const uchar *bias, long bias_h,
                       long4 s, int r0, int nq, int j0, int nk, int lid) {
#pragma unroll
  for (int u = 0; u < units; ++u) {
    const int e = lid + u * MMA_ITEMS, i = e / (cols / BIAS_UNIT),
              c = BIAS_UNIT * (e % (cols / BIAS_UNIT));
    const long at = bias_h + (r0 + i) * s.s2 + (j0 + c) * s.s3;
    __global const uchar *src = bias + at * BIAS_BYTES;
    x[u] = (uint4)(0u);
    if (r0 + i >= nq || j0 + c >= nk) continue;
    if (s.s3 == 1 && j0 + c + BIAS_UNIT <= nk && ((ulong)src & 15u) == 0u) {
      x[u] = *(__global const uint4 *)src;
    } else {
      uint w[4] = {0u, 0u, 0u, 0u};
#pragma unroll
      for (int v = 0; v < BIAS_UNIT; ++v)
        if (j0 + c + v < nk)
          w[v * BIAS_BYTES / 4] |= bias_bits(bias, at + v * s.s3) << (8 * (v * BIAS_BYTES % 4));
      x[u] = (uint4)(w[0], w[1], w[2], w[3]);
    }
  }
}

inline void bias_put(__local uchar *dst, int ld, const uint4 *x, int units, int cols, int lid) {
#pragma unroll
  for (int u = 0; u < units; ++u) {
    const int e = lid + u * MMA_ITEMS, i = e / (cols / BIAS_UNIT),
              c = BIAS_UNIT * (e % (cols / BIAS_UNIT));
    *(__local uint4 *)(dst + (i * ld + c) * BIAS_BYTES) = x[u];
  }
}

/* The bias of (row, col) and (row, col + 1) of a staged tile, as floats. */
inline float2 bias_pair(__local const uchar *t, int ld, int row, int col) {
  __local const uchar *p = t + (row * ld + col) * BIAS_BYTES;
#if BIAS_DTYPE == 0
  return *(__local const float2 *)p;
#elif BIAS_DTYPE == 1
  return vload_half2(0, (__local const half *)p);
#else
  const uint w = *(__local const uint *)p;
  return (float2)(as_float(w << 16), as_float(w & 0xffff0000u));
#endif
}
#endif

/* The 32-bit word of two elements at (row, col) of a local tile. */
inline uint word_at(__local const ushort *t, int row, int stride, int col) {
  return *(__local const uint *)(t + row * stride + col);
}

/* acc += A B over k keys, for the nn 8-column tiles of acc: A the 16 x k
 * product whose accumulators s holds (S's or dS's: tiles 2 kk and 2 kk + 1
 * are k16 step kk's A fragment, packed to 16 bits), B a tile stored
 * transposed in local memory (column n's k values at n * ld). */
inline void acc_times_tile(float (*acc)[4], int nn, float (*s)[4], int k, __local const ushort *bt,
                           int ld, int g, int t) {
#pragma unroll
  for (int kk = 0; kk < k / 16; ++kk) {
    const uint a[4] = {pack_pair(s[2 * kk][0], s[2 * kk][1]), pack_pair(s[2 * kk][2], s[2 * kk][3]),
                       pack_pair(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                       pack_pair(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
    for (int n = 0; n < nn; ++n)
      mma_tile(acc[n], a, word_at(bt, 8 * n + g, ld, 16 * kk + 2 * t),
               word_at(bt, 8 * n + g, ld, 16 * kk + 8 + 2 * t));
  }
}
