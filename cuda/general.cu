/*
 * The general family's parameter block: an attn__cuda_launch turned into
 * what the kernels read. The kernels, their launchers and their rows of the
 * tuning table are in general.cuh (and general_fwd32.cuh), instantiated
 * once per dtype in general_f32.cu, general_f16.cu and general_bf16.cu
 * (three files so that a parallel build compiles them at once).
 */
#include "general.cuh"

#include <string.h>

namespace attn_general {

static gtensor make_tensor(const attn__tensor *t, const attn__problem *pb) {
  gtensor g;
  g.p = t->native ? (char *)t->native + t->offset : nullptr;
  g.sb = t->sb;
  g.ss = t->ss;
  g.sh = t->sh;
  g.sd = t->sd;
  g.vec = attn__cuda_rows4(t, pb);
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
  return P;
}

}  // namespace attn_general
