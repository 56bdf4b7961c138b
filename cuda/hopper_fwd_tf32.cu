/*
 * The Hopper forward's f32 rows, through TF32 (ATTN_ALLOW_TF32): the
 * warp-specialized kernel of hopper_fwd.cuh on wgmma m64nNk8 .tf32, which
 * takes 32-bit operands K-major only, and as they are (the tensor cores
 * ignore the low mantissa bits rather than round them). A pre-pass on the
 * stream therefore stages into the workspace (attn__cuda_tf32_staged):
 *   - q and k rounded to TF32 (cvt.rna, the golden cases' TF32 rule),
 *     dense [batch][heads][rows][d];
 *   - v^T rounded, [batch][heads_kv][d][keys rounded up to 8, zeros past
 *     the keys], each group of 8 keys stored in the order 0, 2, 4, 6, 1, 3,
 *     5, 7: S's accumulator holds keys 2t and 2t + 1 of an n8 tile in
 *     thread t, which P V takes as A's columns t and t + 4 (rows64::pack),
 *     so B's k-rows t and t + 4 must hold those keys' values.
 * The staging reads q, k and v once and writes as many bytes. It covers
 * dense problems only (plan.c: no varlen, KV cache or bias), which the
 * mma.sync rows (mma_fwd.cu) take otherwise.
 */
#include "hopper_fwd.cuh"

namespace attn_hopper {

__device__ __forceinline__ float to_tf32(float x) {
  return __uint_as_float(elem<float>::tf32(x));
}

/* Rows of q or k rounded into a dense copy: a block per 32 rows of a head
 * of a sequence, 16 bytes a thread a step. */
template <int D>
__global__ void __launch_bounds__(256)
    stage_rows(const tensor_ref src, float *dst, int rows, int heads) {
  constexpr int kChunks = D / 4;
  const int r0 = blockIdx.x * 32, h = blockIdx.y, b = blockIdx.z;
  const float *g = row_ptr<const float>(src, b, 0, h);
  float *o = dst + ((int64_t)b * heads + h) * rows * D;
  for (int i = threadIdx.x; i < 32 * kChunks; i += blockDim.x) {
    const int r = r0 + i / kChunks, c = i % kChunks * 4;
    if (r >= rows) break;
    const float4 v = *reinterpret_cast<const float4 *>(g + (int64_t)r * src.ss + c);
    *reinterpret_cast<float4 *>(o + (int64_t)r * D + c) =
        make_float4(to_tf32(v.x), to_tf32(v.y), to_tf32(v.z), to_tf32(v.w));
  }
}

/* v^T rounded and permuted (the top): a block per 32 keys of a head of a
 * sequence, through shared memory so that v's rows are read and v^T's
 * written a whole line at a time (rows of D + 1 floats: a column's 32
 * keys in 32 banks). */
template <int D>
__global__ void __launch_bounds__(256)
    stage_vt(const tensor_ref v, float *dst, int keys, int keys8, int heads) {
  __shared__ float tile[32][D + 1];
  const int n0 = blockIdx.x * 32, h = blockIdx.y, b = blockIdx.z;
  const float *g = row_ptr<const float>(v, b, 0, h);
  for (int i = threadIdx.x; i < 32 * D; i += blockDim.x) {
    const int r = i / D, c = i % D;
    tile[r][c] = n0 + r < keys ? to_tf32(g[(int64_t)(n0 + r) * v.ss + c]) : 0.f;
  }
  __syncthreads();
  float *o = dst + ((int64_t)b * heads + h) * D * keys8;
  for (int i = threadIdx.x; i < 32 * D; i += blockDim.x) {
    const int c = i / 32, j = i % 32, e = j & 7;
    if (n0 + j < keys8)
      o[(int64_t)c * keys8 + n0 + j] = tile[(j & ~7) + (e < 4 ? 2 * e : 2 * e - 7)][c];
  }
}

/* The mma.sync row of this problem, in this row's place where a tensor map
 * cannot describe the staged operands (or the driver has no encoder). */
static int fall_back(const attn__cuda_launch *L) {
  const attn__cuda_config *c = attn__cuda_plan_unstaged(L->dev, L->pb);
  return c ? c->launch(L, c) : ATTN_EINTERNAL;
}

template <int D, int BC, int STAGES, int QS, int NC, bool SCORED>
int launch_tf32(const attn__cuda_launch *L, params p) {
  const attn__problem *pb = L->pb;
  size_t k_at, v_at;
  attn__cuda_tf32_staged(pb, &k_at, &v_at);
  float *sq = (float *)L->workspace;
  float *sk = (float *)((char *)L->workspace + k_at), *svt = (float *)((char *)L->workspace + v_at);
  const int nq = p.seqlen_q, nk = p.seqlen_k, nk8 = (nk + 7) & ~7;
  const int64_t hq = p.heads_q, hk = p.heads_kv;
  CUtensorMap tq, tk, tv, tb = {};
  if (!wg::encode_rows<float>(&tq, sq, D, nq, hq, p.batch, D, (int64_t)nq * D, hq * nq * D,
                              tile_rows(NC)) ||
      !wg::encode_rows<float>(&tk, sk, D, nk, hk, p.batch, D, (int64_t)nk * D, hk * nk * D, BC) ||
      !wg::encode_rows<float>(&tv, svt, nk8, D, hk, p.batch, nk8, (int64_t)D * nk8, hk * D * nk8,
                              padded(D)))
    return fall_back(L);
  stage_rows<D><<<dim3((nq + 31) / 32, hq, p.batch), 256, 0, L->stream>>>(p.q, sq, nq, hq);
  stage_rows<D><<<dim3((nk + 31) / 32, hk, p.batch), 256, 0, L->stream>>>(p.k, sk, nk, hk);
  stage_vt<D><<<dim3((nk8 + 31) / 32, hk, p.batch), 256, 0, L->stream>>>(p.v, svt, nk, nk8, hk);
  if (cudaGetLastError() != cudaSuccess) return ATTN_EDEVICE;
  return launch_ws<float, D, BC, STAGES, QS, NC, SCORED, false>(L, p, tq, tk, tv, tb);
}

/* The rows: d = 64 as the 16-bit rows' 128 x 128 tiles (192 KB: 32 KB a
 * K or V slot), d = 96 and 128 on 64-key blocks (192 KB: Q alone takes 64;
 * d = 96 in d = 128's tiles, the last 32 columns zeros from the maps).
 * At d = 256 a 128-row Q tile alone would take 128 KB, and beside two
 * slots of K and V^T even 32 keys wide it passes the 227 KB a block may
 * have: one consumer warpgroup of 64 rows instead (192 KB with 32-key
 * slots), which runs without ping-pong; at this head dim the products,
 * not the softmax, take the time. */
constexpr attn__cuda_config fwd_rows_tf32[] = {
    fwd_row<float, 64, 128, 2, 2, 2>(
        "Hopper forward (wgmma), f32 as TF32, d = 64, 128 x 128 tiles, 2 K/V + 2 Q slots"),
    fwd_row<float, 96, 64, 2, 1, 2>(
        "Hopper forward (wgmma), f32 as TF32, d = 96, 128 x 64 tiles, 2 K/V + 1 Q slot"),
    fwd_row<float, 128, 64, 2, 1, 2>(
        "Hopper forward (wgmma), f32 as TF32, d = 128, 128 x 64 tiles, 2 K/V + 1 Q slot"),
    fwd_row<float, 256, 32, 2, 1, 1>(
        "Hopper forward (wgmma), f32 as TF32, d = 256, 64 x 32 tiles, 2 K/V + 1 Q slot"),
};

}  // namespace attn_hopper

extern "C" const attn__cuda_rows attn__cuda_hopper_forward_rows_tf32 = {
    attn_hopper::fwd_rows_tf32,
    (int)(sizeof attn_hopper::fwd_rows_tf32 / sizeof attn_hopper::fwd_rows_tf32[0])};
