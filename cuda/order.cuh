/*
 * Which (query block, query head, sequence) a forward block computes: the
 * order in which the blocks of a launch take their work. Shared by the
 * general and the tensor-core forward kernels.
 *
 * Under a causal mask (a right bound without a left one) query block qb sees
 * about qb + 1 key tiles, so blocks differ in length by up to the number of
 * query blocks. The GPU starts blocks in linear order (x fastest); the
 * natural order, qb descending within each head, is heaviest first per head
 * only, and the last heads' long blocks start late and run alone at the end:
 * a model of 132 SMs, one block each, finishes 5-7 % after the ideal at
 * 4k-8k tokens. Heaviest first over the whole grid (longest processing time
 * first) finishes within 0.5 % of it, but then the blocks running at once
 * belong to every head and read every head's K and V from memory instead of
 * sharing them in L2.
 *
 * So the heads (query head x sequence pairs) go in groups of G: the blocks of
 * a group run heaviest first across its G heads, groups one after the other.
 * G makes each group about four waves of resident blocks (slots = SMs x
 * blocks per SM): enough to balance the tail (the same model: within 1 % at
 * 1k-32k tokens) while the blocks running at once cover a few heads. G = 0
 * is the natural order, used where blocks are equally long.
 */
#ifndef ATTN_CUDA_ORDER_CUH
#define ATTN_CUDA_ORDER_CUH

#include <cuda_runtime.h>

/* Tile `lin` of the (query blocks, query heads, sequences) grid, numbered
 * as blockIdx over a grid of those dimensions (query block fastest) -> its
 * query block, head and sequence under group size G. */
__device__ __forceinline__ void attn_tile_coords(int G, long long lin, long long nqb,
                                                 long long heads, long long seqs, int *qb, int *h,
                                                 int *b) {
  if (G <= 0) {
    *qb = (int)(nqb - 1 - lin % nqb);
    *h = (int)(lin / nqb % heads);
    *b = (int)(lin / (nqb * heads));
    return;
  }
  const long long pairs = heads * seqs;
  const long long per = (long long)G * nqb;
  const long long g = lin / per, w = lin - g * per;
  const long long n = min((long long)G, pairs - g * G); /* the last group may be smaller */
  const long long pair = g * G + w % n;
  *qb = (int)(nqb - 1 - w / n);
  *h = (int)(pair % heads);
  *b = (int)(pair / heads);
}

/* Block (blockIdx) of a grid of (query blocks, query heads, sequences) ->
 * its query block, head and sequence under group size G. The natural order
 * reads blockIdx directly: attn_tile_coords's 64-bit divisions would be the
 * only cost of every general and tensor-core forward block. */
__device__ __forceinline__ void attn_block_coords(int G, int *qb, int *h, int *b) {
  if (G <= 0) {
    *qb = (int)(gridDim.x - 1 - blockIdx.x);
    *h = (int)blockIdx.y;
    *b = (int)blockIdx.z;
    return;
  }
  const long long lin = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * (long long)blockIdx.z);
  attn_tile_coords(G, lin, gridDim.x, gridDim.y, gridDim.z, qb, h, b);
}

/* The backward's dK/dV blocks, (key block, kv head, sequence). Under a
 * causal mask key block kb is seen by the query blocks from its diagonal
 * on, so low key blocks are the long ones: the grid (attn_key_block_grid)
 * takes the kv heads of a sequence in groups of 2^order, x running over a
 * group's heads within each key block, so that each group's blocks start
 * heaviest first and the blocks running at once share a few heads' Q and
 * dO in L2. Shifts of blockIdx only, where the forward's order divides:
 * the values stay in uniform registers, as blockIdx itself did in the
 * natural order (order 0), and the backward kernels' loops keep every
 * other register. A head past the last (a group's place not filled) has
 * no work. */
__device__ __forceinline__ void attn_key_block_coords(int order, int *kb, int *hk, int *b) {
  *kb = (int)(blockIdx.x >> order);
  *hk = (int)((blockIdx.y << order) | (blockIdx.x & ((1u << order) - 1u)));
  *b = (int)blockIdx.z;
}

/* Blocks of `kernel` resident at once on the device: SMs x blocks per SM. */
template <typename K>
static long long attn_resident_blocks(K kernel, int threads, size_t smem, int sm_count) {
  int per_sm = 1;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem) !=
          cudaSuccess ||
      per_sm < 1) {
    (void)cudaGetLastError();
    per_sm = 1;
  }
  return (long long)(sm_count > 0 ? sm_count : 1) * per_sm;
}

/* G for a launch of `kernel` over `grid` (see above); 0 when the blocks are
 * equally long (no right bound, or a left one too). */
template <typename K>
static int attn_order_group(K kernel, int threads, size_t smem, dim3 grid, int sm_count,
                            long long wl, long long wr) {
  if (wr < 0 || wl >= 0 || grid.x < 2) return 0;
  const long long slots = attn_resident_blocks(kernel, threads, smem, sm_count);
  const long long pairs = (long long)grid.y * grid.z;
  long long ng = pairs * grid.x / (4 * slots);
  if (ng < 1) ng = 1;
  return (int)((pairs + ng - 1) / ng);
}

/* The dK/dV grid of nkb key blocks, heads_kv heads and batch sequences for
 * attn_key_block_coords, and its order: the forward's group size for the
 * same blocks, rounded down to a power of two and to the heads there are. */
template <typename K>
static dim3 attn_key_block_grid(K kernel, int threads, size_t smem, unsigned nkb, int heads_kv,
                                int batch, int sm_count, long long wl, long long wr, int *order) {
  const int g = attn_order_group(kernel, threads, smem,
                                 dim3(nkb, (unsigned)heads_kv, (unsigned)batch), sm_count, wl, wr);
  int o = 0;
  while ((2 << o) <= g && (2 << o) <= heads_kv)
    o++;
  *order = o;
  const unsigned per = 1u << o;
  return dim3(nkb * per, ((unsigned)heads_kv + per - 1) / per, (unsigned)batch);
}

#endif /* ATTN_CUDA_ORDER_CUH */
