/*
 * NVIDIA's tensor cores from OpenCL C, through inline PTX (sm_80 and
 * later), for the kernels that run on them (fwd_mma.cl, bwd_mma.cl,
 * decode_mma.cl, which follow this file): mma.sync on f16 or bf16 (DTYPE)
 * m16n8k16 tiles, or on f32 as three TF32 m16n8k8 products (below), with
 * f32 accumulators; the lane exchange of a warp; the staging of tiles
 * row-major into local memory as stored (RAW elements); and the products'
 * fragments read from there. Fragments follow the PTX ISA: lane (g, t) =
 * (lane / 4, lane % 4) holds rows g and g + 8, and of each 8 columns the
 * columns 2 t, 2 t + 1, of C and D, in both shapes.
 *
 * f32 ("3xTF32"): TF32 keeps 10 of float32's 23 mantissa bits, so each
 * operand x is split into hi, x rounded to TF32, and lo = x - hi
 * (split_tf32), and a b is taken as a_lo b_hi + a_hi b_lo + a_hi b_hi:
 * what it drops, a_lo b_lo and lo's bits past TF32's, is about 2^-21 of
 * |a b|, within the accuracy rule's bar once S's small terms are summed
 * apart (tile_times_rows), at three TF32 products for one.
 */
#ifndef HD
#define HD 64
#endif
#ifndef MMA_ITEMS
#define MMA_ITEMS 128 /* work-items of a work-group: 4 warps */
#endif

/* EB: bytes an element in local memory; UNIT: elements a 16-byte unit;
 * KSTEP: the products' k a step; PAD: what local rows add to HD, so that
 * the fragments' reads fall in distinct banks (ldmatrix's 8 rows of a
 * 16-byte column for 16-bit tiles; for f32, rows 4 words apart: lane (g,
 * t)'s word g * PAD + t, and the transposed read's 2 t * PAD + g). */
#if DTYPE == 0
#define EB 4
#define KSTEP 8
#define PAD 4
#define MAX_NN 8 /* the most 8-column tiles of S a product takes (tile_times_rows) */
#else
#define EB 2
#define KSTEP 16
#define PAD 8
#endif
#define UNIT (16 / EB)
/* f32 rows above HD 64 (HD 96, 128), of which NVIDIA's 48 KiB of local
 * memory holds 64 fewer than the kernels' other tiles take: the forward's
 * key tiles are 16 keys (Q's fragments half in registers, half read from
 * local memory), dQ's key blocks 8 (Q and dO staged one after the other,
 * both their fragments halved likewise), and dK/dV takes KR = 32 keys, K
 * halved likewise, two warps a 16-key slab (bwd_mma.cl). */
#define WIDE_F32 (DTYPE == 0 && HD > 64)

#if DTYPE == 1
#define MMA_TYPES "f32.f16.f16.f32"
#define CVT_PAIR "cvt.rn.f16x2.f32"
#elif DTYPE == 2
#define MMA_TYPES "f32.bf16.bf16.f32"
#define CVT_PAIR "cvt.rn.bf16x2.f32"
#endif

#if DTYPE != 0
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
#else
/* d = a b + d for one m16n8k8 TF32 tile. */
inline void mma_tf32(float *d, const uint *a, uint b0, uint b1) {
  float e0, e1, e2, e3;
  __asm__ __volatile__(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32"
      " {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%11,%12,%13};"
      : "=f"(e0), "=f"(e1), "=f"(e2), "=f"(e3)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "f"(d[0]), "f"(d[1]),
        "f"(d[2]), "f"(d[3]));
  d[0] = e0;
  d[1] = e1;
  d[2] = e2;
  d[3] = e3;
}

/* x (a float's bits) as hi + lo: hi rounded to TF32 (to nearest, ties
 * away, as cvt.rna.tf32.f32, by integer arithmetic: the cvt is five
 * instructions with its NaN and infinity tests, and a split per element of
 * every fragment made it the kernels' largest cost); lo = x - hi exactly,
 * whose top 19 bits the tensor cores read as TF32: 2^-21 |x| at most is
 * lost. No test on x: an infinite x keeps hi infinite and has a NaN lo
 * (inf - inf), which tile_times_rows sets aside; a NaN x has a NaN lo, and
 * a NaN hi where it is the quiet NaN that quiet_nans makes of a staged
 * one. A finite |x| of 3.40265e38 or more rounds to an infinite hi and
 * gives NaN products (float32's are finite where the other operand is
 * small). */
inline void split_tf32(uint x, uint *hi, uint *lo) {
  *hi = (x + 0x1000u) & 0xffffe000u;
  *lo = as_uint(as_float(x) - as_float(*hi));
}

/* d = a b + d, a and b float32 fragments of an m16n8k8 tile (a split
 * already: ah, al as split_tf32's hi, lo; b as floats' bits), by three TF32
 * products, the small terms first. */
inline void mma_tile(float *d, const uint *ah, const uint *al, uint b0, uint b1) {
  uint h0, l0, h1, l1;
  split_tf32(b0, &h0, &l0);
  split_tf32(b1, &h1, &l1);
  mma_tf32(d, al, h0, h1);
  mma_tf32(d, ah, l0, l1);
  mma_tf32(d, ah, h0, h1);
}

/* A fragment split into its parts (split_tf32). */
inline void split_fragment(const uint *a, uint *ah, uint *al) {
#pragma unroll
  for (int i = 0; i < 4; ++i)
    split_tf32(a[i], &ah[i], &al[i]);
}
#endif

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

/* A local address as the shared state space's 32-bit one, which ldmatrix
 * and cp.async take. */
inline uint local_addr(__local const void *p) {
  return (uint)(ulong)p;
}

/* 16 bytes from global to local memory by cp.async: no register holds them
 * in flight. They land by the next copies_wait (every copy of the item's so
 * far), copies_wait_but_last (all but the last group: copies_commit
 * closes a group) or copies_wait_but_two; a barrier then shows them to the
 * work-group. */
inline void copy16(__local void *dst, __global const void *src) {
  __asm__ __volatile__("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(local_addr(dst)),
                       "l"((ulong)src)
                       : "memory");
}

inline void copies_commit(void) {
  __asm__ __volatile__("cp.async.commit_group;" ::: "memory");
}

inline void copies_wait(void) {
  __asm__ __volatile__("cp.async.wait_all;" ::: "memory");
}

inline void copies_wait_but_last(void) {
  __asm__ __volatile__("cp.async.wait_group 1;" ::: "memory");
}

/* All but the last two groups. */
inline void copies_wait_but_two(void) {
  __asm__ __volatile__("cp.async.wait_group 2;" ::: "memory");
}

/* Rows j0 .. j0 + rows - 1 of a [.., HD] operand (n rows, d columns) into
 * local memory as stored, row j at j * ld, zero past the ends: key rows
 * (keyed, through KEY_ROW) or query rows; ld HD + PAD, so that rows are
 * whole 16-byte units. An item moves a unit (UNIT columns) at a time: one
 * copy16 where the run is contiguous and aligned, which lands later
 * (copies_wait), else element by element, stored at once; consecutive
 * items take consecutive units of a row. */
inline void stage_tile(__local RAW *dst, int ld, int rows, __global const RAW *p, long4 s, int j0,
                       int n, int d, int keyed, int lid KEY_PAGES_PARAM) {
  for (int e = lid; e < rows * HD / UNIT; e += MMA_ITEMS) {
    const int j = e / (HD / UNIT), c = UNIT * (e % (HD / UNIT));
    __local RAW *at = dst + j * ld + c;
    uint w[4] = {0u, 0u, 0u, 0u};
    if (j0 + j < n) {
      const long row = keyed ? KEY_ROW(j0 + j, s) : (long)(j0 + j) * s.s1;
      __global const RAW *src = p + row + c * s.s3;
      if (s.s3 == 1 && c + UNIT <= d && ((ulong)src & 15u) == 0u) {
        copy16(at, src);
        continue;
      }
      for (int u = 0; u < UNIT && c + u < d; ++u)
        w[u * EB / 4] |= (uint)src[u * s.s3] << (8 * (u * EB % 4));
    }
    *(__local uint4 *)at = (uint4)(w[0], w[1], w[2], w[3]);
  }
}

/* stage_tile's rows where none needs a test: HD contiguous elements each,
 * 16-byte aligned, all inside the tensor, the usual layout. Whole units at
 * fixed steps, with no bound, alignment or page test and no 64-bit product
 * a unit: at d = 128, where the tensor-core kernels keep two warps a
 * scheduler, stage_tile's per-unit work lengthened every step. Key rows
 * through pages (keyed and PAGED) take their offsets from the block table
 * first, an item's rows at once, so that those reads are in flight
 * together rather than one before each copy (at most 64 rows). 1 when it
 * staged the rows, 0 when stage_tile must. */
#define WHOLE_ROWS_AN_ITEM (64 * (HD / UNIT) / MMA_ITEMS)
inline int stage_whole_rows(__local RAW *dst, int ld, int rows, __global const RAW *p, long4 s,
                            int j0, int n, int d, int keyed, int lid KEY_PAGES_PARAM) {
  const int upr = HD / UNIT, paged = PAGED && keyed; /* units a row */
  if (s.s3 != 1 || d != HD || j0 + rows > n || (paged && rows > 64) || MMA_ITEMS % upr != 0 ||
      ((s.s1 * EB) & 15) != 0 ||
      (paged ? (((ulong)p & 15u) != 0u || ((s.s0 * EB) & 15) != 0)
             : (((ulong)(p + j0 * s.s1)) & 15u) != 0u))
    return 0;
  const int i = lid / upr, c = UNIT * (lid % upr), step = MMA_ITEMS / upr;
#if PAGED
  if (paged) {
    long off[WHOLE_ROWS_AN_ITEM];
#pragma unroll
    for (int k = 0; k < WHOLE_ROWS_AN_ITEM; ++k)
      off[k] = i + k * step < rows ? KEY_ROW(j0 + i + k * step, s) : 0;
#pragma unroll
    for (int k = 0; k < WHOLE_ROWS_AN_ITEM; ++k)
      if (i + k * step < rows) copy16(dst + (i + k * step) * ld + c, p + off[k] + c);
    return 1;
  }
#endif
  __global const RAW *src = p + (j0 + i) * s.s1 + c;
  __local RAW *at = dst + i * ld + c;
  for (int e = lid; e < rows * upr; e += MMA_ITEMS, src += step * s.s1, at += step * ld)
    copy16(at, src);
  return 1;
}

/* The rows by stage_whole_rows where they allow it, else by stage_tile. */
inline void stage_rows(__local RAW *dst, int ld, int rows, __global const RAW *p, long4 s, int j0,
                       int n, int d, int keyed, int lid KEY_PAGES_PARAM) {
  if (!stage_whole_rows(dst, ld, rows, p, s, j0, n, d, keyed, lid KEY_PAGES))
    stage_tile(dst, ld, rows, p, s, j0, n, d, keyed, lid KEY_PAGES);
}

/* A staged f32 tile's NaNs made the quiet NaN 0x7fc00000, whose TF32 hi
 * is NaN too (split_tf32's rounding carries a NaN of low payload to an
 * infinite hi, of high payload to a zero one), so that a NaN operand
 * makes S's large terms NaN, which tile_times_rows keeps. Each item reads
 * back the units it staged (stage_tile's and stage_whole_rows' units lid,
 * lid + MMA_ITEMS, ..., landed: after its copies_wait or
 * copies_wait_but_last), before the barrier that shows the tile, and
 * rewrites a unit only where it holds a NaN. The pass reads every staged
 * unit again, 7 % of the forward's time and 11 % of the backward's at
 * d = 128, so it runs only where attn_nan_scan found a NaN in the call's
 * operands (seen: NANS_SEEN, the same in every item). 16-bit tiles are
 * not split. */
inline void quiet_nans(__local RAW *dst, int ld, int rows, int lid, int seen) {
#if DTYPE == 0
  if (!seen) return;
  for (int e = lid; e < rows * HD / UNIT; e += MMA_ITEMS) {
    __local uint4 *at = (__local uint4 *)(dst + e / (HD / UNIT) * ld + UNIT * (e % (HD / UNIT)));
    const uint4 x = *at, m = x & 0x7fffffffu;
    if (max(max(m.x, m.y), max(m.z, m.w)) > 0x7f800000u)
      *at = select(x, (uint4)0x7fc00000u, m > 0x7f800000u);
  }
#endif
}

#if NAN_FLAG
/* Whether the call's f32 operands hold a NaN: attn_nan_scan's flag,
 * cleared before the scans, read once a work-group. */
#define NANS_SEEN (*nans != 0)

/* Sets *nans where the f32 tensor (n0, n1, n2, n3) at p + o, strides s,
 * holds a NaN: the rows of item (x, y, z) as attn_bwd_zero's. */
__kernel void attn_nan_scan(__global const uint *p, long o, long4 s, int n0, int n1, int n2, int n3,
                            __global int *nans) {
  const int x = 4 * get_global_id(0);
  if (x >= n3) return;
  uint most = 0;
  for (long z = get_global_id(2); z < (long)n0 * n1; z += get_global_size(2)) {
    __global const uint *row = p + o + (z / n1) * s.s0 + (z % n1) * s.s1 + x * s.s3;
    for (int y = get_global_id(1); y < n2; y += get_global_size(1)) {
      __global const uint *at = row + y * s.s2;
      if (s.s3 == 1 && x + 4 <= n3 && ((ulong)at & 15u) == 0u) {
        const uint4 m = *(__global const uint4 *)at & 0x7fffffffu;
        most = max(most, max(max(m.x, m.y), max(m.z, m.w)));
      } else {
        for (int u = 0; u < 4 && x + u < n3; ++u)
          most = max(most, at[u * s.s3] & 0x7fffffffu);
      }
    }
  }
  if (most > 0x7f800000u) atomic_or(nans, 1);
}
#else
#define NANS_SEEN 0
#endif

#if DTYPE != 0
/* Four 8 x 8 matrices of 16-bit elements from local memory: lane l gives
 * the address of row l % 8 of matrix l / 8 (16 bytes, aligned); r[m] is
 * matrix m's fragment, lane (g, t) holding its row g, columns 2 t and
 * 2 t + 1 (ldsm4) or its column g, rows 2 t and 2 t + 1 (ldsm4_trans). */
inline void ldsm4(uint *r, __local const ushort *p) {
  __asm__ __volatile__("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                       : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                       : "r"(local_addr(p)));
}

inline void ldsm4_trans(uint *r, __local const ushort *p) {
  __asm__ __volatile__("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                       : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                       : "r"(local_addr(p)));
}

/* The A fragments of the warp's 16 rows of a row-major local tile (rows
 * at rows, row i at i * ld) as kd k16 steps: lanes 0-15 give rows 0-15 of
 * a step's first 8 columns, lanes 16-31 of its last 8, so that ldsm4's
 * four matrices are the fragment's a0 .. a3. */
inline void rows_fragments(uint (*a)[4], int kd, __local const ushort *rows, int ld, int lane) {
#pragma unroll
  for (int kk = 0; kk < kd; ++kk)
    ldsm4(a[kk], rows + (lane % 16) * ld + 16 * kk + 8 * (lane / 16));
}

/* s = A B^T for the nn 8-column tiles of s: A the warp's 16 rows as kd k16
 * steps of fragments (kd even), B's rows (the keys) row-major in local
 * memory, row c at c * ld: one ldsm4 gives tile n's fragments of two k16
 * steps. */
inline void tile_times_rows(float (*s)[4], int nn, const uint (*a)[4], int kd,
                            __local const ushort *rows, int ld, int lane) {
#pragma unroll
  for (int n = 0; n < nn; ++n) {
    s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < kd; kk += 2) {
      uint b[4];
      ldsm4(b, rows + (8 * n + lane % 8) * ld + 16 * kk + 8 * (lane / 8));
      mma_tile(s[n], a[kk], b[0], b[1]);
      mma_tile(s[n], a[kk + 1], b[2], b[3]);
    }
  }
}
#else
/* Step kk's A fragment of the warp's 16 rows of a row-major local tile
 * (rows at rows, row i at i * ld), as stored (split at use): lane (g, t)
 * reads words g * ld + t (+ 4, + 8 ld), distinct banks for ld = HD + PAD. */
inline void fragment_at(uint *a, __local const RAW *rows, int ld, int kk, int lane) {
  __local const RAW *r = rows + lane / 4 * ld + 8 * kk + lane % 4;
  a[0] = r[0];
  a[1] = r[8 * ld];
  a[2] = r[4];
  a[3] = r[8 * ld + 4];
}
/* Those fragments as kd k8 steps. */
inline void rows_fragments(uint (*a)[4], int kd, __local const RAW *rows, int ld, int lane) {
#pragma unroll
  for (int kk = 0; kk < kd; ++kk)
    fragment_at(a[kk], rows, ld, kk, lane);
}
/* s = A B^T for the nn 8-column tiles of s: A the warp's 16 rows as kd k8
 * steps of fragments, B's rows (the keys) row-major in local memory, row c
 * at c * ld: tile n's fragment of step kk is row 8 n + g's words 8 kk + t
 * and + 4, the A fragment's columns. Each step's A is split once for all
 * nn tiles. The small terms (a_lo b_hi + a_hi b_lo) are summed apart from
 * the large and added at the end: the tensor cores' f32 sums align a
 * small addend to a large accumulator without rounding it, and added to
 * it step by step they cost large scores (hundreds and more) most of what
 * the split buys: 9.3x float32's error on o in the golden case big_logits,
 * against 1.9x summed apart. An S element that meets an infinity (or the
 * sum of whose large terms overflows) is its large terms' sum alone: the
 * infinity's hi gives it as float32 would (inf, or NaN for inf - inf or
 * inf * 0), where its NaN lo would make the small terms NaN. A NaN
 * operand makes the large terms NaN (quiet_nans). The steps are
 * step_times_rows, between sums_begin and sums_end. */
inline void sums_begin(float (*s)[4], float (*sm)[4], int nn) {
#pragma unroll
  for (int n = 0; n < nn; ++n)
    s[n][0] = s[n][1] = s[n][2] = s[n][3] = sm[n][0] = sm[n][1] = sm[n][2] = sm[n][3] = 0.0f;
}
inline void step_times_rows(float (*s)[4], float (*sm)[4], int nn, const uint *a,
                            __local const RAW *rows, int ld, int kk, int lane) {
  const int g = lane / 4, t = lane % 4;
  uint ah[4], al[4];
  split_fragment(a, ah, al);
#pragma unroll
  for (int n = 0; n < nn; ++n) {
    __local const RAW *r = rows + (8 * n + g) * ld + 8 * kk + t;
    uint h0, l0, h1, l1;
    split_tf32(r[0], &h0, &l0);
    split_tf32(r[4], &h1, &l1);
    mma_tf32(sm[n], al, h0, h1);
    mma_tf32(sm[n], ah, l0, l1);
    mma_tf32(s[n], ah, h0, h1);
  }
}
inline void sums_end(float (*s)[4], float (*sm)[4], int nn) {
#pragma unroll
  for (int n = 0; n < nn; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      s[n][e] = isinf(s[n][e]) ? s[n][e] : s[n][e] + sm[n][e];
}
inline void tile_times_rows(float (*s)[4], int nn, const uint (*a)[4], int kd,
                            __local const RAW *rows, int ld, int lane) {
  float sm[MAX_NN][4];
  sums_begin(s, sm, nn);
#pragma unroll
  for (int kk = 0; kk < kd; ++kk)
    step_times_rows(s, sm, nn, a[kk], rows, ld, kk, lane);
  sums_end(s, sm, nn);
}
/* tile_times_rows with A's fragments read a step at a time from its
 * row-major local tile (arows, row i at i * lda): for a product whose A
 * serves few tiles, where holding all its steps would cost HD / 2
 * registers. */
inline void rows_times_rows(float (*s)[4], int nn, __local const RAW *arows, int lda, int kd,
                            __local const RAW *rows, int ld, int lane) {
  float sm[MAX_NN][4];
  sums_begin(s, sm, nn);
#pragma unroll
  for (int kk = 0; kk < kd; ++kk) {
    uint a[4];
    fragment_at(a, arows, lda, kk, lane);
    step_times_rows(s, sm, nn, a, rows, ld, kk, lane);
  }
  sums_end(s, sm, nn);
}
/* The last HD / 2 columns of a staged tile's rows (64 at most) into a
 * tile of their own (dst, row i at i * ldd, ldd HD / 2 + PAD), for
 * halves_times_rows: every unit read before any is written, so dst may
 * overlap the staged rows. Ends with the barrier between the reads and
 * the writes; the writes need one more before they are read. */
#define HALF_UNITS (HD / 2 / UNIT) /* units of a half row */
inline void keep_last_half(__local RAW *dst, int ldd, __local const RAW *src, int lds, int rows,
                           int lid) {
  uint4 x[(64 * HALF_UNITS + MMA_ITEMS - 1) / MMA_ITEMS];
#pragma unroll
  for (int i = 0; i < (64 * HALF_UNITS + MMA_ITEMS - 1) / MMA_ITEMS; ++i) {
    const int e = lid + i * MMA_ITEMS;
    if (e < rows * HALF_UNITS)
      x[i] =
          *(__local const uint4 *)(src + e / HALF_UNITS * lds + HD / 2 + UNIT * (e % HALF_UNITS));
  }
  barrier(CLK_LOCAL_MEM_FENCE);
#pragma unroll
  for (int i = 0; i < (64 * HALF_UNITS + MMA_ITEMS - 1) / MMA_ITEMS; ++i) {
    const int e = lid + i * MMA_ITEMS;
    if (e < rows * HALF_UNITS)
      *(__local uint4 *)(dst + e / HALF_UNITS * ldd + UNIT * (e % HALF_UNITS)) = x[i];
  }
}
/* tile_times_rows with A's first kd / 2 steps of fragments held (a) and
 * its last kd / 2 read a step at a time from a local tile of those
 * columns (arows, row i at i * lda): an A that serves the whole pass in
 * half the registers, where local memory holds only its other half. */
inline void halves_times_rows(float (*s)[4], int nn, const uint (*a)[4], __local const RAW *arows,
                              int lda, int kd, __local const RAW *rows, int ld, int lane) {
  float sm[MAX_NN][4];
  sums_begin(s, sm, nn);
#pragma unroll
  for (int kk = 0; kk < kd / 2; ++kk)
    step_times_rows(s, sm, nn, a[kk], rows, ld, kk, lane);
#pragma unroll
  for (int kk = kd / 2; kk < kd; ++kk) {
    uint f[4];
    fragment_at(f, arows, lda, kk - kd / 2, lane);
    step_times_rows(s, sm, nn, f, rows, ld, kk, lane);
  }
  sums_end(s, sm, nn);
}
#endif
/* Whether the forward's and dQ's bias tiles go through local memory
 * (bias_copy, with K's copies): where they fit beside K and V in the 48 KB
 * that NVIDIA's OpenCL gives a work-group (fwd_mma.cl's 64 x 64 tile,
 * attn_bwd_dq_mma's two slots of 64 x 32), every case but an f32 bias at
 * HD above 96 (16-bit data) or above 32 (f32 data), whose lanes load their
 * own elements instead. attn_bwd_dkdv_mma stages its block's always: the
 * plan sizes MQ for it. */
#if HAS_BIAS && (BIAS_DTYPE != 0 || (DTYPE == 0 ? HD <= 32 : HD <= 96))
#define BIAS_STAGED 1
#else
#define BIAS_STAGED 0
#endif

#if HAS_BIAS
/* A bias tile through local memory, as stage_tile stages K: bias_copy
 * brings rows r0 .. r0 + rows - 1, keys j0 .. j0 + cols - 1 of the bias at
 * bias_h (row i, key j: + i s2 + j s3; nq rows, nk keys), as stored
 * (BIAS_DTYPE), 0 past the ends, row i at i * ld elements of dst (ld a
 * multiple of 8: rows stay whole units); whole 16-byte units where the row
 * is contiguous and aligned by copy16, the others element by element. */
#define BIAS_BYTES (BIAS_DTYPE ? 2 : 4)
#define BIAS_UNIT (16 / BIAS_BYTES) /* elements a unit */

inline uint bias_bits(__global const uchar *bias, long i) {
  return BIAS_DTYPE ? (uint)((__global const ushort *)bias)[i] : ((__global const uint *)bias)[i];
}

inline void bias_copy(__local uchar *dst, int ld, int rows, int cols, __global const uchar *bias,
                      long bias_h, long4 s, int r0, int nq, int j0, int nk, int lid) {
  for (int e = lid; e < rows * cols / BIAS_UNIT; e += MMA_ITEMS) {
    const int i = e / (cols / BIAS_UNIT), c = BIAS_UNIT * (e % (cols / BIAS_UNIT));
    const long at = bias_h + (r0 + i) * s.s2 + (j0 + c) * s.s3;
    __global const uchar *src = bias + at * BIAS_BYTES;
    __local uchar *d = dst + (i * ld + c) * BIAS_BYTES;
    if (r0 + i < nq && j0 + c < nk && s.s3 == 1 && j0 + c + BIAS_UNIT <= nk &&
        ((ulong)src & 15u) == 0u) {
      copy16(d, src);
      continue;
    }
    uint w[4] = {0u, 0u, 0u, 0u};
    if (r0 + i < nq)
#pragma unroll
      for (int v = 0; v < BIAS_UNIT; ++v)
        if (j0 + c + v < nk)
          w[v * BIAS_BYTES / 4] |= bias_bits(bias, at + v * s.s3) << (8 * (v * BIAS_BYTES % 4));
    *(__local uint4 *)d = (uint4)(w[0], w[1], w[2], w[3]);
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

/* The bias of (row, col) of a staged tile, as a float. */
inline float bias_one(__local const uchar *t, int ld, int row, int col) {
  __local const uchar *p = t + (row * ld + col) * BIAS_BYTES;
#if BIAS_DTYPE == 0
  return *(__local const float *)p;
#elif BIAS_DTYPE == 1
  return vload_half(0, (__local const half *)p);
#else
  return as_float((uint) * (__local const ushort *)p << 16);
#endif
}
#endif

/* The 32-bit word of two elements at (row, col) of a local tile. */
inline uint word_at(__local const ushort *t, int row, int stride, int col) {
  return *(__local const uint *)(t + row * stride + col);
}

/* The online softmax's step for the lane's rows a (s[n][0], s[n][1]) and b
 * (s[n][2], s[n][3]) over nn 8-key tiles of masked scores s (-inf where a
 * key is hidden), given their maxima mx_a, mx_b over the tile and the
 * running max across the row's 4 lanes: m, l and O's non 8-column tiles
 * rescaled to them, s replaced by P = exp(s - m) and added into l. A row
 * with no visible key so far keeps m = -inf and subtracts 0, so that exp()
 * gives 0 rather than NaN. */
inline void softmax_step(float (*s)[4], int nn, float mx_a, float mx_b, float *m_a, float *m_b,
                         float *l_a, float *l_b, float (*acc)[4], int non) {
  const float mu_a = mx_a == -INFINITY ? 0.0f : mx_a, mu_b = mx_b == -INFINITY ? 0.0f : mx_b;
  const float al_a = EXP_FROM(*m_a, mu_a), al_b = EXP_FROM(*m_b, mu_b);
  *m_a = mx_a;
  *m_b = mx_b;
  *l_a *= al_a;
  *l_b *= al_b;
#pragma unroll
  for (int n = 0; n < non; ++n) {
    acc[n][0] *= al_a;
    acc[n][1] *= al_a;
    acc[n][2] *= al_b;
    acc[n][3] *= al_b;
  }
#pragma unroll
  for (int n = 0; n < nn; ++n) {
    s[n][0] = EXP_FROM(s[n][0], mu_a);
    s[n][1] = EXP_FROM(s[n][1], mu_a);
    s[n][2] = EXP_FROM(s[n][2], mu_b);
    s[n][3] = EXP_FROM(s[n][3], mu_b);
    *l_a += s[n][0] + s[n][1];
    *l_b += s[n][2] + s[n][3];
  }
}

#if DTYPE != 0
/* acc += A B over k keys, for the nn 8-column tiles of acc (nn even): A
 * the 16 x k product whose accumulators s holds (S's or dS's: tiles 2 kk
 * and 2 kk + 1 are k16 step kk's A fragment, packed to 16 bits), B's k
 * rows (the keys) row-major in local memory, row c at c * ld: one
 * ldsm4_trans gives a k16 step's fragments of two tiles. */
inline void acc_times_tile(float (*acc)[4], int nn, float (*s)[4], int k, __local const ushort *b,
                           int ld, int lane) {
#pragma unroll
  for (int kk = 0; kk < k / 16; ++kk) {
    const uint a[4] = {pack_pair(s[2 * kk][0], s[2 * kk][1]), pack_pair(s[2 * kk][2], s[2 * kk][3]),
                       pack_pair(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                       pack_pair(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
    for (int n = 0; n < nn; n += 2) {
      uint f[4];
      ldsm4_trans(f, b + (16 * kk + lane % 8 + 8 * (lane / 8 % 2)) * ld + 8 * n + 8 * (lane / 16));
      mma_tile(acc[n], a, f[0], f[1]);
      mma_tile(acc[n + 1], a, f[2], f[3]);
    }
  }
}
#else
/* acc += A B over k keys, for the nn 8-column tiles of acc: A the 16 x k
 * product whose accumulators s holds (S's or dS's), B's k rows (the keys)
 * row-major in local memory, row c at c * ld. Tile kk of s is k8 step
 * kk's A fragment with its keys in the order 0, 2, 4, 6, 1, 3, 5, 7 (lane
 * t holds keys 2 t and 2 t + 1 of the accumulator, a fragment's columns t
 * and t + 4): B's fragment takes the same order, rows 2 t and 2 t + 1,
 * column g. The sums keep no small terms apart, so an infinity in B (V,
 * dO, Q, K) gives NaN where float32 may give inf: non-finite either way.
 * NaN stays NaN through lo. */
inline void acc_times_tile(float (*acc)[4], int nn, float (*s)[4], int k, __local const RAW *b,
                           int ld, int lane) {
  const int g = lane / 4, t = lane % 4;
#pragma unroll
  for (int kk = 0; kk < k / 8; ++kk) {
    const uint a[4] = {as_uint(s[kk][0]), as_uint(s[kk][2]), as_uint(s[kk][1]), as_uint(s[kk][3])};
    uint ah[4], al[4];
    split_fragment(a, ah, al);
#pragma unroll
    for (int n = 0; n < nn; ++n) {
      __local const RAW *r = b + (8 * kk + 2 * t) * ld + 8 * n + g;
      mma_tile(acc[n], ah, al, r[0], r[ld]);
    }
  }
}
#endif
