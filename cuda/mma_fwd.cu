/*
 * Tensor-core forward pass (FlashAttention-2, forward): one thread block per
 * (block of Br query rows, query head, sequence); each warp owns 16 query rows
 * (one m16 slab). Q is loaded once; K and V blocks of Bc keys stream through
 * shared memory with cp.async, V(j) in flight while S = Q K(j)^T and the
 * softmax run, K(j+1) in flight while O += P V(j). S lives in fp32 registers,
 * the online softmax (m_i, l_i) runs in registers in the exp2 domain, P is
 * packed to 16 bits in registers as the A operand of P V, and the final
 * O / l_i and lse = m_i ln 2 + ln l_i are written once.
 *
 * Also here: the parameter block and the checks shared with the backward pass
 * (what this family declines goes to the general kernels).
 */
#include "mma_common.cuh"

#include <math.h>

namespace attn_mma {

static bool aligned16(const attn__tensor &t) {
  uintptr_t base = (uintptr_t)t.native + t.offset;
  return t.native && base % 16 == 0 && t.sd == 1 && t.ss % 8 == 0 && t.sh % 8 == 0 && t.sb % 8 == 0;
}

static tensor_ref ref_of(const attn__tensor &t) {
  tensor_ref r;
  r.ptr = (char *)t.native + t.offset;
  r.sb = t.sb;
  r.ss = t.ss;
  r.sh = t.sh;
  return r;
}

/* Fills p from the launch, or says (debug log) why this family declines. */
int make_params(const attn__cuda_launch *L, int backward, params *p) {
  const attn__problem *pb = L->pb;
  memset(p, 0, sizeof *p);
  if (pb->dtype != ATTN_F16 && pb->dtype != ATTN_BF16) {
    attn__debug("cuda mma: %s declined (f32 runs on the general kernels)",
                backward ? "backward" : "forward");
    return ATTN_EUNSUPPORTED;
  }
  if (L->cc_major < 8) {
    attn__debug("cuda mma: compute capability %d.%d below 8.0", L->cc_major, L->cc_minor);
    return ATTN_EUNSUPPORTED;
  }
  const int64_t lim = (int64_t)1 << 30;
  if (pb->seqlen_q >= lim || pb->seqlen_k >= lim || pb->total_q >= lim || pb->total_k >= lim ||
      pb->heads_q > 65535 || pb->batch > 65535) {
    attn__debug("cuda mma: sizes beyond the kernels' int indexing");
    return ATTN_EUNSUPPORTED;
  }
  bool ok = aligned16(pb->q) && aligned16(pb->k) && aligned16(pb->v) && aligned16(pb->o);
  if (backward)
    ok = ok && aligned16(pb->dout) && aligned16(pb->dq) && aligned16(pb->dk) && aligned16(pb->dv) &&
         pb->lse.native;
  if (!ok) {
    attn__debug("cuda mma: a tensor is not 16-byte aligned with unit head-dim stride");
    return ATTN_EUNSUPPORTED;
  }
  p->q = ref_of(pb->q);
  p->k = ref_of(pb->k);
  p->v = ref_of(pb->v);
  p->o = ref_of(pb->o);
  if (pb->lse.native) p->lse = ref_of(pb->lse);
  if (backward) {
    p->dout = ref_of(pb->dout);
    p->dq = ref_of(pb->dq);
    p->dk = ref_of(pb->dk);
    p->dv = ref_of(pb->dv);
  }
  p->cu_q = L->cu_q;
  p->cu_k = L->cu_k;
  p->alibi = L->alibi;
  p->batch = (int)pb->batch;
  p->heads_q = (int)pb->heads_q;
  p->heads_kv = (int)pb->heads_kv;
  p->group = (int)(pb->heads_q / pb->heads_kv);
  p->seqlen_q = (int)pb->seqlen_q;
  p->seqlen_k = (int)pb->seqlen_k;
  /* A bound at least as wide as the sequences is no bound; clamping keeps
   * the kernels' window arithmetic in int. */
  p->window_left =
      pb->window_left < 0 || pb->window_left >= pb->seqlen_k ? -1 : (int)pb->window_left;
  p->window_right =
      pb->window_right < 0 || pb->window_right >= pb->seqlen_q ? -1 : (int)pb->window_right;
  p->scale = pb->scale;
  p->scale_log2 = pb->scale * kLog2e;
  p->softcap = pb->softcap;
  p->softcap_inv = pb->softcap > 0.f ? pb->scale / pb->softcap : 0.f;
  p->softcap_log2 = pb->softcap * kLog2e;
  p->has_lse = pb->has_lse && pb->lse.native;
  p->rows = pb->cu_q ? pb->total_q : pb->batch * pb->seqlen_q;
  return ATTN_OK;
}

template <typename T, int D, int BR, int BC, int NW, bool Q_IN_REGS>
__global__ void __launch_bounds__(NW * 32, 1) fwd_kernel(const params p) {
  constexpr int NT = NW * 32;
  constexpr int LD = D + kPad;
  constexpr int KD = D / 16; /* k-steps of Q K^T */
  constexpr int NS = BC / 8; /* n-tiles of S */
  constexpr int NO = D / 8;  /* n-tiles of O */
  static_assert(BR == 16 * NW, "one m16 slab per warp");
  static_assert(BC % 16 == 0 && D % 16 == 0, "tiles are multiples of 16");

  extern __shared__ __align__(16) unsigned char smem_raw[];
  T *sQ = (T *)smem_raw;
  T *sK = sQ + BR * LD;
  T *sV = sK + BC * LD;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t = lane & 3;
  /* Heaviest blocks (most keys under a causal mask) start first. */
  const int m_block = gridDim.x - 1 - blockIdx.x;
  const int h = blockIdx.y, b = blockIdx.z, hk = h / p.group;
  const seq sq = seq_of(p, b);
  const int nq = sq.nq, nk = sq.nk;
  const int m0 = m_block * BR;
  if (m0 >= nq) return;
  const int m_last = min(m0 + BR, nq) - 1;

  /* Keys any row of this block sees; blocks outside are skipped. */
  const int j_lo = max(0, key_lo(p, m0, nq, nk));
  const int j_hi = min(nk, key_hi(p, m_last, nq, nk));
  const int nb_min = j_lo / BC;
  const int nb_max = j_hi > j_lo ? (j_hi + BC - 1) / BC : nb_min;

  const T *gq = row_ptr<T>(p.q, b, sq.q0, h);
  const T *gk = row_ptr<T>(p.k, b, sq.k0, hk);
  const T *gv = row_ptr<T>(p.v, b, sq.k0, hk);
  const float slope_log2 = p.alibi ? p.alibi[h] * kLog2e : 0.f;
  const bool transform = p.softcap > 0.f || slope_log2 != 0.f;

  float acc_o[NO][4];
#pragma unroll
  for (int n = 0; n < NO; ++n)
    acc_o[n][0] = acc_o[n][1] = acc_o[n][2] = acc_o[n][3] = 0.f;
  float m_i[2] = {-INFINITY, -INFINITY}, l_i[2] = {0.f, 0.f};

  if (nb_min < nb_max) {
    uint32_t qf[Q_IN_REGS ? KD : 1][4];
    load_tile<BR, D, NT>(sQ, gq, p.q.ss, m0, nq, tid);
    load_tile<BC, D, NT>(sK, gk, p.k.ss, nb_min * BC, nk, tid);
    cp_async_commit();
    if (Q_IN_REGS) {
      cp_async_wait_all();
      __syncthreads();
#pragma unroll
      for (int kk = 0; kk < (Q_IN_REGS ? KD : 0); ++kk)
        load_a<LD>(qf[kk], sQ, warp * 16, kk * 16, lane);
    }

    for (int nb = nb_min; nb < nb_max; ++nb) {
      /* K(nb) has landed, and every warp is done with V(nb-1). */
      cp_async_wait_all();
      __syncthreads();
      load_tile<BC, D, NT>(sV, gv, p.v.ss, nb * BC, nk, tid);
      cp_async_commit();

      float s[NS][4];
#pragma unroll
      for (int n = 0; n < NS; ++n)
        s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
#pragma unroll
      for (int kk = 0; kk < KD; ++kk) {
        uint32_t a[4];
        if (Q_IN_REGS) {
#pragma unroll
          for (int x = 0; x < 4; ++x)
            a[x] = qf[Q_IN_REGS ? kk : 0][x];
        } else {
          load_a<LD>(a, sQ, warp * 16, kk * 16, lane);
        }
#pragma unroll
        for (int np = 0; np < NS / 2; ++np) {
          uint32_t bb[4];
          load_b_nk<LD>(bb, sK, np * 16, kk * 16, lane);
          elem<T>::mma(s[2 * np], a, bb[0], bb[1]);
          elem<T>::mma(s[2 * np + 1], a, bb[2], bb[3]);
        }
      }

      /* Scores in the log2 domain; the mask only on blocks that straddle a
       * boundary (sequence end, causal diagonal, window edge). */
      const int n0 = nb * BC;
      const bool full =
          n0 + BC <= nk && n0 >= key_lo(p, m_last, nq, nk) && n0 + BC <= key_hi(p, m0, nq, nk);
#pragma unroll
      for (int n = 0; n < NS; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int i = m0 + warp * 16 + g + (e >> 1) * 8;
          const int j = n0 + n * 8 + 2 * t + (e & 1);
          float v =
              transform ? score_log2(p, s[n][e], slope_log2, i, j, nq, nk) : s[n][e] * p.scale_log2;
          if (!full && !visible(p, i, j, nq, nk)) v = -INFINITY;
          s[n][e] = v;
        }
      }

      /* Online softmax: the row max over the quad that shares a row. */
      float mx[2] = {m_i[0], m_i[1]};
#pragma unroll
      for (int n = 0; n < NS; ++n) {
        mx[0] = fmaxf(mx[0], fmaxf(s[n][0], s[n][1]));
        mx[1] = fmaxf(mx[1], fmaxf(s[n][2], s[n][3]));
      }
      float mu[2], alpha[2], rs[2] = {0.f, 0.f};
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
        /* A row with no visible key yet keeps max -inf; subtracting 0 then
         * gives exp2(-inf) = 0 instead of NaN. */
        mu[r] = mx[r] == -INFINITY ? 0.f : mx[r];
        alpha[r] = ex2(m_i[r] - mu[r]);
        m_i[r] = mx[r];
      }
#pragma unroll
      for (int n = 0; n < NS; ++n) {
        s[n][0] = ex2(s[n][0] - mu[0]);
        s[n][1] = ex2(s[n][1] - mu[0]);
        s[n][2] = ex2(s[n][2] - mu[1]);
        s[n][3] = ex2(s[n][3] - mu[1]);
        rs[0] += s[n][0] + s[n][1];
        rs[1] += s[n][2] + s[n][3];
      }
      /* l_i stays a per-thread partial sum until the end. */
      l_i[0] = l_i[0] * alpha[0] + rs[0];
      l_i[1] = l_i[1] * alpha[1] + rs[1];
#pragma unroll
      for (int n = 0; n < NO; ++n) {
        acc_o[n][0] *= alpha[0];
        acc_o[n][1] *= alpha[0];
        acc_o[n][2] *= alpha[1];
        acc_o[n][3] *= alpha[1];
      }

      /* V(nb) has landed, and every warp is done with K(nb). */
      cp_async_wait_all();
      __syncthreads();
      if (nb + 1 < nb_max) {
        load_tile<BC, D, NT>(sK, gk, p.k.ss, (nb + 1) * BC, nk, tid);
        cp_async_commit();
      }

#pragma unroll
      for (int kk = 0; kk < BC / 16; ++kk) {
        uint32_t a[4];
        a[0] = elem<T>::pack(s[2 * kk][0], s[2 * kk][1]);
        a[1] = elem<T>::pack(s[2 * kk][2], s[2 * kk][3]);
        a[2] = elem<T>::pack(s[2 * kk + 1][0], s[2 * kk + 1][1]);
        a[3] = elem<T>::pack(s[2 * kk + 1][2], s[2 * kk + 1][3]);
#pragma unroll
        for (int np = 0; np < D / 16; ++np) {
          uint32_t bb[4];
          load_b_kn<LD>(bb, sV, np * 16, kk * 16, lane);
          elem<T>::mma(acc_o[2 * np], a, bb[0], bb[1]);
          elem<T>::mma(acc_o[2 * np + 1], a, bb[2], bb[3]);
        }
      }
    }
  }

  /* O = acc / l, lse = m ln 2 + ln l; rows with no key: 0 and -inf. */
  T *go = row_ptr<T>(p.o, b, sq.q0, h);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float l = l_i[r];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    const float inv = l > 0.f ? 1.f / l : 0.f;
    const int i = m0 + warp * 16 + g + r * 8;
    if (i < nq) {
      T *orow = go + (int64_t)i * p.o.ss;
#pragma unroll
      for (int n = 0; n < NO; ++n)
        *(uint32_t *)(orow + n * 8 + 2 * t) =
            elem<T>::pack(acc_o[n][2 * r] * inv, acc_o[n][2 * r + 1] * inv);
      if (p.has_lse && t == 0) {
        float *gl = row_ptr<float>(p.lse, b, sq.q0 + i, h);
        *gl = l > 0.f ? m_i[r] * kLn2 + logf(l) : -INFINITY;
      }
    }
  }
}

template <typename T, int D, int BR, int BC, int NW, bool QR>
static int launch_fwd(const params &p, const attn__cuda_launch *L) {
  const size_t smem = (size_t)(BR + 2 * BC) * (D + kPad) * sizeof(T);
  if (smem > L->smem_optin) {
    attn__debug("cuda mma: forward needs %zu bytes of shared memory", smem);
    return ATTN_EUNSUPPORTED;
  }
  auto kern = fwd_kernel<T, D, BR, BC, NW, QR>;
  if (cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) !=
      cudaSuccess)
    return ATTN_EDEVICE;
  dim3 grid((unsigned)((p.seqlen_q + BR - 1) / BR), (unsigned)p.heads_q, (unsigned)p.batch);
  kern<<<grid, NW * 32, smem, L->stream>>>(p);
  return cudaGetLastError() == cudaSuccess ? ATTN_OK : ATTN_EDEVICE;
}

/* Tile shapes: Br = 128 (8 warps) halves the K/V traffic per query row
 * against Br = 64 and keeps 1 block of 8 warps per SM within 255 registers;
 * d = 256 keeps Q in shared memory (its 64 registers would not fit beside
 * the 128 of O) and uses Bc = 32. */
template <typename T>
static int forward_dtype(const params &p, const attn__cuda_launch *L, int d) {
  switch (d) {
    case 64:
      return launch_fwd<T, 64, 128, 64, 8, true>(p, L);
    case 96:
      return launch_fwd<T, 96, 128, 64, 8, true>(p, L);
    case 128:
      return launch_fwd<T, 128, 128, 64, 8, true>(p, L);
    case 256:
      return launch_fwd<T, 256, 64, 32, 4, false>(p, L);
    default:
      attn__debug("cuda mma: head dim %d has no tensor-core forward", d);
      return ATTN_EUNSUPPORTED;
  }
}

}  // namespace attn_mma

using namespace attn_mma;

extern "C" size_t attn__cuda_mma_workspace(const attn__problem *pb, int backward) {
  if (!backward) return 0;
  int64_t rows = pb->cu_q ? pb->total_q : pb->batch * pb->seqlen_q;
  size_t per = (size_t)pb->heads_q * (size_t)rows * sizeof(float);
  size_t r256 = (per + 255) / 256 * 256;
  /* dsum and lse2, then the fp32 dq accumulator (atomic mode only). */
  size_t bytes = 2 * r256;
  if (!pb->deterministic) bytes += r256 * (size_t)pb->head_dim;
  return bytes;
}

extern "C" int attn__cuda_mma_forward(const attn__cuda_launch *L) {
  params p;
  int rc = make_params(L, 0, &p);
  if (rc != ATTN_OK) return rc;
  if (L->pb->dtype == ATTN_BF16) return forward_dtype<__nv_bfloat16>(p, L, (int)L->pb->head_dim);
  return forward_dtype<__half>(p, L, (int)L->pb->head_dim);
}
