/*
 * The general family's parameter block: an attn__cuda_launch turned into
 * what the kernels read; and the backward's dtype-free passes for the score
 * terms (dbias zeroed, dsinks summed). The kernels, their launchers and their rows of the
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

/* dbias = 0 over its elements (a broadcast dimension has one), through its
 * strides: the span may hold the caller's other data. */
static __global__ void dbias_zero_kernel(const gparams P) {
  const long long nb = P.dbias.sb ? P.batch : 1, nh = P.dbias.sh ? P.hq : 1;
  const long long nr = P.dbias.ss ? P.nq : 1, n = nb * nh * nr * P.nk;
  for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < n;
       e += (long long)gridDim.x * blockDim.x) {
    long long r = e / P.nk;
    const long long j = e - r * P.nk;
    const long long i = r % nr;
    r /= nr;
    const long long h = r % nh, b = r / nh;
    ((float *)P.dbias.p)[b * P.dbias.sb + h * P.dbias.sh + i * P.dbias.ss + j * P.dbias.sd] = 0.f;
  }
}

int launch_dbias_zero(const gparams &P, cudaStream_t stream) {
  const long long n =
      (P.dbias.sb ? P.batch : 1) * (P.dbias.sh ? P.hq : 1) * (P.dbias.ss ? P.nq : 1) * P.nk;
  if (n == 0) return ATTN_OK;
  long long blocks = (n + 255) / 256;
  if (blocks > 65535LL * 16) blocks = 65535LL * 16;
  dbias_zero_kernel<<<(unsigned)blocks, 256, 0, stream>>>(P);
  return cudaPeekAtLastError() == cudaSuccess ? ATTN_OK : ATTN_EDEVICE;
}

/* dsinks[h] = the sum over every query row of sink_grad(sink, lse, D): a
 * block per head, its threads' sums added in a fixed order. */
constexpr int kSinkThreads = 256;
static __global__ void __launch_bounds__(kSinkThreads) dsinks_kernel(const gparams P) {
  __shared__ float part[kSinkThreads];
  const int h = blockIdx.x, tid = threadIdx.x;
  const float sink = ((const float *)P.sinks.p)[h * P.sinks.sh];
  const float *lse = (const float *)P.lse.p;
  float acc = 0.f;
  for (long long row = tid; row < P.total_q; row += kSinkThreads) {
    long long b = 0, r = row;
    if (!P.cu_q) {
      b = row / P.nq;
      r = row - b * P.nq;
    }
    acc += sink_grad(sink, lse[b * P.lse.sb + r * P.lse.ss + h * P.lse.sh], P.ws_D[row * P.hq + h]);
  }
  part[tid] = acc;
  __syncthreads();
  for (int half = kSinkThreads / 2; half > 0; half >>= 1) {
    if (tid < half) part[tid] += part[tid + half];
    __syncthreads();
  }
  if (tid == 0) ((float *)P.dsinks.p)[h * P.dsinks.sh] = part[0];
}

int launch_dsinks(const gparams &P, cudaStream_t stream) {
  dsinks_kernel<<<(unsigned)P.hq, kSinkThreads, 0, stream>>>(P);
  return cudaPeekAtLastError() == cudaSuccess ? ATTN_OK : ATTN_EDEVICE;
}

}  // namespace attn_general
