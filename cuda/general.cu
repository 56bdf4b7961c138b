/*
 * The general family's parameter block: an attn__cuda_launch turned into
 * what the kernels read; and the backward's dtype-free passes for the score
 * terms that every family with dbias and dsinks runs (dbias zeroed, dsinks
 * summed: attn_cuda.h). The kernels, their launchers and their rows of the
 * tuning table are in general.cuh (and general_fwd32.cuh), instantiated
 * once per dtype in general_f32.cu, general_f16.cu and general_bf16.cu
 * (three files so that a parallel build compiles them at once).
 */
#include "general.cuh"

#include <string.h>

namespace attn_general {

static gtensor make_tensor(const attn__tensor *t, const attn__problem *pb) {
  gtensor g;
  static_cast<attn__cuda_view &>(g) = attn__cuda_view_of(t);
  g.vec = attn__cuda_rows4(t, pb);
  return g;
}

/* A metadata or score-term tensor: its memory and strides, NULL when the
 * problem has none (present). */
static gtensor make_term(const attn__tensor *t, int present) {
  gtensor g;
  memset(&g, 0, sizeof g);
  if (!present) return g;
  static_cast<attn__cuda_view &>(g) = attn__cuda_view_of(t);
  return g;
}

gparams make_params(const attn__cuda_launch *L, int backward) {
  const attn__problem *pb = L->pb;
  gparams P;
  memset(&P, 0, sizeof(P));
  P.q = make_tensor(&pb->q, pb);
  P.k = make_tensor(&pb->k, pb);
  P.v = make_tensor(&pb->v, pb);
  P.o = make_tensor(&pb->o, pb);
  P.lse = make_tensor(&pb->lse, pb);
  if (backward) {
    P.dout = make_tensor(&pb->dout, pb);
    P.dq = make_tensor(&pb->dq, pb);
    P.dk = make_tensor(&pb->dk, pb);
    P.dv = make_tensor(&pb->dv, pb);
  }
  P.batch = (int)pb->batch;
  P.hq = (int)pb->heads_q;
  P.hkv = (int)pb->heads_kv;
  P.group = (int)(pb->heads_q / pb->heads_kv);
  P.d = (int)pb->head_dim;
  P.nq = pb->seqlen_q;
  P.nk = pb->seqlen_k;
  P.cu_q = L->cu_q;
  P.cu_k = L->cu_k;
  P.scale = pb->scale;
  P.softcap = pb->softcap > 0.f ? pb->softcap : 0.f;
  P.inv_softcap = P.softcap > 0.f ? 1.f / P.softcap : 0.f;
  P.wl = pb->window_left;
  P.wr = pb->window_right;
  P.alibi = L->alibi;
  P.total_q = pb->total_q;
  if (backward) {
    /* attn__cuda_workspace's layout. */
    char *ws = (char *)L->workspace;
    P.ws_D = (float *)ws;
    if (!pb->deterministic) P.ws_dq = (float *)(ws + attn__cuda_ws_rows(pb));
  }
  P.seqused = make_term(&pb->seqused_k, pb->has_seqused);
  P.nnew = pb->seqlen_new;
  P.bt = make_term(&pb->block_table, pb->page_size > 0);
  P.page_size = pb->page_size;
  P.pages = pb->num_pages;
  P.bias = make_term(&pb->bias, pb->has_bias);
  P.bias_dt = (int)pb->bias.dtype;
  P.sinks = make_term(&pb->sinks, pb->has_sinks);
  if (backward) {
    P.dbias = make_term(&pb->dbias, pb->has_dbias);
    P.dbias_atomic = attn__cuda_dbias_sums(pb) && !pb->deterministic;
    P.dsinks = make_term(&pb->dsinks, pb->has_dsinks);
  }
  return P;
}

/* dbias = 0 over its elements (one along a broadcast dimension), through
 * its strides (the span may hold the caller's other data): a block a row
 * (sequence, head, query row), its threads over the keys, so that a row's
 * offset is found once rather than per element; 16-byte stores where the
 * row's keys are contiguous and aligned. */
static __global__ void dbias_zero_kernel(float *p, long long sb, long long sh, long long ss,
                                         long long sd, long long rows, long long nh, long long nr,
                                         long long nk) {
  for (long long r = blockIdx.x; r < rows; r += gridDim.x) {
    const long long i = r % nr, h = r / nr % nh, b = r / nr / nh;
    float *row = p + b * sb + h * sh + i * ss;
    long long j = threadIdx.x;
    if (sd == 1 && ((uintptr_t)row & 15) == 0) {
      for (long long j4 = 4 * j; j4 + 3 < nk; j4 += 4 * (long long)blockDim.x)
        *(float4 *)(row + j4) = make_float4(0.f, 0.f, 0.f, 0.f);
      j += nk & ~3LL;
    }
    for (; j < nk; j += blockDim.x)
      row[j * sd] = 0.f;
  }
}

/* dsinks[h] = the sum over every query row of sink_grad(sink, lse, D): a
 * block per head, its threads' sums added in a fixed order. D of row w
 * (over the batch) and head h at D[w * d_row + h * d_head]. */
struct dsinks_args {
  const float *sinks, *lse, *D;
  float *dsinks;
  long long sinks_sh, dsinks_sh, lse_sb, lse_ss, lse_sh, d_row, d_head, rows, nq;
  int varlen;
};

constexpr int kSinkThreads = 256;
static __global__ void __launch_bounds__(kSinkThreads) dsinks_kernel(const dsinks_args a) {
  __shared__ float part[kSinkThreads];
  const int h = blockIdx.x, tid = threadIdx.x;
  const float sink = a.sinks[h * a.sinks_sh];
  float acc = 0.f;
  for (long long w = tid; w < a.rows; w += kSinkThreads) {
    /* A varlen lse is [heads, total_q]: sb = 0, and w is its row. */
    const long long b = a.varlen ? 0 : w / a.nq, r = w - b * a.nq;
    acc += sink_grad(sink, a.lse[b * a.lse_sb + r * a.lse_ss + h * a.lse_sh],
                     a.D[w * a.d_row + h * a.d_head]);
  }
  part[tid] = acc;
  __syncthreads();
  for (int half = kSinkThreads / 2; half > 0; half >>= 1) {
    if (tid < half) part[tid] += part[tid + half];
    __syncthreads();
  }
  if (tid == 0) a.dsinks[h * a.dsinks_sh] = part[0];
}

}  // namespace attn_general

int attn__cuda_dsinks(const attn__problem *pb, const float *D, long long d_row, long long d_head,
                      cudaStream_t stream) {
  if (!pb->has_dsinks || pb->heads_q == 0) return ATTN_OK;
  attn_general::dsinks_args a;
  a.sinks = (const float *)attn__cuda_at(&pb->sinks);
  a.lse = (const float *)attn__cuda_at(&pb->lse);
  a.D = D;
  a.dsinks = (float *)attn__cuda_at(&pb->dsinks);
  a.sinks_sh = pb->sinks.sh;
  a.dsinks_sh = pb->dsinks.sh;
  a.lse_sb = pb->lse.sb;
  a.lse_ss = pb->lse.ss;
  a.lse_sh = pb->lse.sh;
  a.d_row = d_row;
  a.d_head = d_head;
  a.rows = pb->total_q;
  a.nq = pb->seqlen_q;
  a.varlen = pb->varlen;
  attn_general::dsinks_kernel<<<(unsigned)pb->heads_q, attn_general::kSinkThreads, 0, stream>>>(a);
  return cudaPeekAtLastError() == cudaSuccess ? ATTN_OK : ATTN_EDEVICE;
}

/* Whether the passes store every element of dbias: where it sums over
 * nothing and every row sees every key (no window, no per-sequence
 * lengths), each (b, h, i, j) is one dS element the dK/dV pass stores. */
static int dbias_stored_whole(const attn__problem *pb) {
  return !attn__cuda_dbias_sums(pb) && pb->window_left < 0 && pb->window_right < 0 && !pb->varlen &&
         !pb->has_seqused;
}

int attn__cuda_dbias_zero(const attn__problem *pb, cudaStream_t stream) {
  const attn__tensor *t = &pb->dbias;
  if (!pb->has_dbias || dbias_stored_whole(pb)) return ATTN_OK;
  const long long nh = t->sh ? pb->heads_q : 1, nr = t->ss ? pb->seqlen_q : 1;
  const long long rows = (t->sb ? pb->batch : 1) * nh * nr;
  if (rows == 0 || pb->seqlen_k == 0) return ATTN_OK;
  const unsigned blocks = (unsigned)(rows < (1LL << 20) ? rows : (1LL << 20));
  attn_general::dbias_zero_kernel<<<blocks, 256, 0, stream>>>(
      (float *)attn__cuda_at(t), t->sb, t->sh, t->ss, t->sd, rows, nh, nr, pb->seqlen_k);
  return cudaPeekAtLastError() == cudaSuccess ? ATTN_OK : ATTN_EDEVICE;
}
