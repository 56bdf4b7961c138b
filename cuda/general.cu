/*
 * The general family's entry points: turns an attn__cuda_launch into the
 * kernels' parameter block and dispatches on the dtype. The kernels and the
 * choice of tile configuration are in general.cuh, instantiated once per dtype
 * in general_f32.cu, general_f16.cu and general_bf16.cu (three files so that
 * a parallel build compiles them at once).
 */
#include "general.cuh"

#include <stdlib.h>
#include <string.h>

namespace attn_general {
extern template int launch_forward<float>(const attn__cuda_launch *, const gparams &, int);
extern template int launch_forward<__half>(const attn__cuda_launch *, const gparams &, int);
extern template int launch_forward<__nv_bfloat16>(const attn__cuda_launch *, const gparams &, int);
extern template int launch_backward<float>(const attn__cuda_launch *, const gparams &);
extern template int launch_backward<__half>(const attn__cuda_launch *, const gparams &);
extern template int launch_backward<__nv_bfloat16>(const attn__cuda_launch *, const gparams &);
}  // namespace attn_general

using namespace attn_general;

static size_t align256(size_t n) {
  return (n + 255) & ~(size_t)255;
}

static gtensor make_tensor(const attn__tensor *t, const attn__problem *pb) {
  gtensor g;
  g.p = t->native ? (char *)t->native + t->offset : nullptr;
  g.sb = t->sb;
  g.ss = t->ss;
  g.sh = t->sh;
  g.sd = t->sd;
  /* Rows load as groups of 4 elements when every row start is aligned to
   * a group (16 bytes for f32, 8 for f16/bf16) and the group is contiguous. */
  const size_t esz = attn_dtype_size(pb->dtype);
  g.vec = g.p && t->sd == 1 && pb->head_dim % 4 == 0 && t->ss % 4 == 0 && t->sh % 4 == 0 &&
          t->sb % 4 == 0 && (uintptr_t)g.p % (4 * esz) == 0;
  return g;
}

static gparams make_params(const attn__cuda_launch *L, int backward) {
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
    char *ws = (char *)L->workspace;
    P.ws_D = (float *)ws;
    if (!pb->deterministic)
      P.ws_dq = (float *)(ws + align256(sizeof(float) * (size_t)pb->total_q * pb->heads_q));
  }
  return P;
}

/* ATTN_CUDA_GENERAL_MR=4|8 picks the forward's rows per thread where both
 * configurations exist (a benchmarking knob; 0 = the default choice). */
static int want_mr(void) {
  const char *e = getenv("ATTN_CUDA_GENERAL_MR");
  return e ? atoi(e) : 0;
}

/* ATTN_CUDA_GENERAL_VARIANT=base runs the f32 forward on fwd_kernel instead
 * of the wide kernel (general_fwd32.cuh), for benchmarking; unset, or any
 * other value, is the wide kernel where it applies (padded d 64 or 128,
 * float4 rows): the faster on the H200 (bench/NOTES_cuda.md: 0.80-0.89x
 * float32 SDPA, against 0.67-0.74x for base). Read on each call, not once,
 * so that a benchmark can switch it between calls. */
static int want_base(void) {
  const char *e = getenv("ATTN_CUDA_GENERAL_VARIANT");
  return e && !strcmp(e, "base");
}

extern "C" size_t attn__cuda_general_workspace(const attn__problem *pb, int backward) {
  if (!backward) return 0;
  size_t n = align256(sizeof(float) * (size_t)pb->total_q * pb->heads_q);
  if (!pb->deterministic)
    n += align256(sizeof(float) * (size_t)pb->total_q * pb->heads_q * pb->head_dim);
  return n;
}

extern "C" int attn__cuda_general_forward(const attn__cuda_launch *L) {
  const attn__problem *pb = L->pb;
  if (pb->batch == 0 || pb->seqlen_q == 0 || pb->heads_q == 0) return ATTN_OK;
  const gparams P = make_params(L, 0);
  const int mr = want_mr();
  switch (pb->dtype) {
    case ATTN_F32: {
      if (!want_base()) {
        const int st = launch_forward_f32_wide(L, P);
        if (st != ATTN_EUNSUPPORTED) return st;
      }
      return launch_forward<float>(L, P, mr);
    }
    case ATTN_F16:
      return launch_forward<__half>(L, P, mr);
    case ATTN_BF16:
      return launch_forward<__nv_bfloat16>(L, P, mr);
  }
  return ATTN_EUNSUPPORTED;
}

extern "C" int attn__cuda_general_backward(const attn__cuda_launch *L) {
  const attn__problem *pb = L->pb;
  if (pb->batch == 0 || pb->heads_q == 0) return ATTN_OK;
  if (L->workspace_bytes < attn__cuda_general_workspace(pb, 1)) return ATTN_EINTERNAL;
  const gparams P = make_params(L, 1);
  if (!pb->deterministic && P.ws_dq) {
    const size_t n = sizeof(float) * (size_t)pb->total_q * pb->heads_q * pb->head_dim;
    if (n && cudaMemsetAsync(P.ws_dq, 0, n, L->stream) != cudaSuccess) return ATTN_EDEVICE;
  }
  switch (pb->dtype) {
    case ATTN_F32:
      return launch_backward<float>(L, P);
    case ATTN_F16:
      return launch_backward<__half>(L, P);
    case ATTN_BF16:
      return launch_backward<__nv_bfloat16>(L, P);
  }
  return ATTN_EUNSUPPORTED;
}
