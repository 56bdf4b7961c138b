/*
 * Standalone check and benchmark of the tensor-core kernels (cuda/mma_*.cu),
 * running their rows of the tuning table directly, without the core:
 *   mma_check check   randomized cases against a float64 reference on the CPU
 *                     (every option: causal, windows, softcap, ALiBi, GQA/MQA,
 *                     varlen with empty sequences, strided fused-qkv layout,
 *                     rows with no key, deterministic vs atomic dq);
 *   mma_check san     a few small cases, for compute-sanitizer;
 *   mma_check bench   forward and backward TFLOP/s, batch * seqlen = 16k,
 *                     heads * d = 2048 (FlashAttention's benchmark shape).
 * Built by bench/mma_h200.sh on the GPU machine.
 */
#include "attn_cuda.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

extern "C" void attn__debug(const char *fmt, ...) {
  if (!getenv("ATTN_DEBUG")) return;
  va_list ap;
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fputc('\n', stderr);
}

#define CK(x)                                                                            \
  do {                                                                                   \
    cudaError_t e_ = (x);                                                                \
    if (e_ != cudaSuccess) {                                                             \
      fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      exit(2);                                                                           \
    }                                                                                    \
  } while (0)

static uint16_t to16(float f, attn_dtype dt) {
  if (dt == ATTN_BF16) return attn__f32_to_bf16(f);
  __half_raw r = __float2half_rn(f);
  return r.x;
}
static float from16(uint16_t u, attn_dtype dt) {
  if (dt == ATTN_BF16) return attn__bf16_to_f32(u);
  __half_raw r;
  r.x = u;
  return __half2float(__half(r));
}

struct Case {
  std::string name;
  attn_dtype dt = ATTN_BF16;
  int B = 1, nq = 128, nk = 128, hq = 2, hkv = 2, d = 64;
  bool causal = false;
  int wl = -1, wr = -1;
  float softcap = 0.f;
  bool alibi = false;
  std::vector<int> cuq, cuk; /* varlen when non-empty */
  bool fused = false;        /* q, k, v slices of one [B][N][Hq+2Hkv][d] buffer */
  float mag = 1.f;           /* input magnitude (big logits) */
  bool bwd = true;
  bool expect_unsupported = false;
};

/* A tensor: logical values [rows][heads][d] (float, already rounded), device
 * storage by strides. */
struct Tensor {
  int rows, heads, d;
  int64_t sb, ss, sh;
  int seqlen; /* bshd rows per sequence; 0 for varlen */
  size_t elems;
  void *dev = nullptr;
  size_t off_elems = 0; /* within a shared allocation */
  std::vector<float> v;
  int64_t offset_of(int64_t grow, int h, int c) const {
    if (seqlen) return (grow / seqlen) * sb + (grow % seqlen) * ss + h * sh + c;
    return grow * ss + h * sh + c;
  }
};

static std::mt19937_64 rng(1234);

static void fill_random(Tensor &t, attn_dtype dt, float mag) {
  std::normal_distribution<float> nd(0.f, mag);
  t.v.resize((size_t)t.rows * t.heads * t.d);
  for (auto &x : t.v)
    x = from16(to16(nd(rng), dt), dt);
}

/* Writes t's values into the device storage at base (a 16-bit buffer). */
static void upload(const Tensor &t, attn_dtype dt, std::vector<uint16_t> &host) {
  for (int64_t r = 0; r < t.rows; ++r)
    for (int h = 0; h < t.heads; ++h)
      for (int c = 0; c < t.d; ++c)
        host[t.off_elems + t.offset_of(r, h, c)] =
            to16(t.v[((size_t)r * t.heads + h) * t.d + c], dt);
}
static void download(Tensor &t, attn_dtype dt, const std::vector<uint16_t> &host) {
  t.v.resize((size_t)t.rows * t.heads * t.d);
  for (int64_t r = 0; r < t.rows; ++r)
    for (int h = 0; h < t.heads; ++h)
      for (int c = 0; c < t.d; ++c)
        t.v[((size_t)r * t.heads + h) * t.d + c] =
            from16(host[t.off_elems + t.offset_of(r, h, c)], dt);
}

struct Ref {
  std::vector<double> o, lse, dq, dk, dv;
};

static void reference(const Case &cs, const Tensor &q, const Tensor &k, const Tensor &v,
                      const Tensor &dout, const std::vector<float> &slopes, float scale, Ref &ref,
                      bool bwd) {
  const int B = cs.B, hq = cs.hq, hkv = cs.hkv, d = cs.d, grp = hq / hkv;
  ref.o.assign(q.v.size(), 0.0);
  ref.lse.assign((size_t)q.rows * hq, -INFINITY);
  ref.dq.assign(q.v.size(), 0.0);
  ref.dk.assign(k.v.size(), 0.0);
  ref.dv.assign(v.v.size(), 0.0);
#pragma omp parallel for collapse(2) schedule(dynamic)
  for (int b = 0; b < B; ++b)
    for (int hk = 0; hk < hkv; ++hk) {
      const bool vl = !cs.cuq.empty();
      const int q0 = vl ? cs.cuq[b] : b * cs.nq, nq = vl ? cs.cuq[b + 1] - cs.cuq[b] : cs.nq;
      const int k0 = vl ? cs.cuk[b] : b * cs.nk, nk = vl ? cs.cuk[b + 1] - cs.cuk[b] : cs.nk;
      std::vector<double> s(nk), p(nk), th(nk), dp(nk);
      std::vector<char> vis(nk);
      for (int h = hk * grp; h < (hk + 1) * grp; ++h)
        for (int i = 0; i < nq; ++i) {
          const float *qi = &q.v[((size_t)(q0 + i) * hq + h) * d];
          const long diag = (long)i + nk - nq;
          double mx = -INFINITY;
          for (int j = 0; j < nk; ++j) {
            vis[j] = (cs.wl < 0 || j >= diag - cs.wl) && (cs.wr < 0 || j <= diag + cs.wr);
            if (!vis[j]) continue;
            const float *kj = &k.v[((size_t)(k0 + j) * hkv + hk) * d];
            double acc = 0;
            for (int c = 0; c < d; ++c)
              acc += (double)qi[c] * kj[c];
            double x = scale * acc;
            th[j] = 0;
            if (cs.softcap > 0) {
              th[j] = tanh(x / cs.softcap);
              x = cs.softcap * th[j];
            }
            if (cs.alibi) x -= slopes[h] * fabs((double)(diag - j));
            s[j] = x;
            mx = std::max(mx, x);
          }
          if (mx == -INFINITY) continue; /* no key: o = 0, lse = -inf */
          double sum = 0;
          for (int j = 0; j < nk; ++j)
            if (vis[j]) sum += exp(s[j] - mx);
          const double lse = mx + log(sum);
          ref.lse[(size_t)h * q.rows + q0 + i] = lse;
          double *oi = &ref.o[((size_t)(q0 + i) * hq + h) * d];
          for (int j = 0; j < nk; ++j) {
            p[j] = vis[j] ? exp(s[j] - lse) : 0;
            if (!vis[j]) continue;
            const float *vj = &v.v[((size_t)(k0 + j) * hkv + hk) * d];
            for (int c = 0; c < d; ++c)
              oi[c] += p[j] * vj[c];
          }
          if (!bwd) continue;
          const float *doi = &dout.v[((size_t)(q0 + i) * hq + h) * d];
          double Dd = 0;
          for (int c = 0; c < d; ++c)
            Dd += doi[c] * oi[c];
          double *dqi = &ref.dq[((size_t)(q0 + i) * hq + h) * d];
          for (int j = 0; j < nk; ++j) {
            if (!vis[j]) continue;
            const float *vj = &v.v[((size_t)(k0 + j) * hkv + hk) * d];
            const float *kj = &k.v[((size_t)(k0 + j) * hkv + hk) * d];
            double a = 0;
            for (int c = 0; c < d; ++c)
              a += (double)doi[c] * vj[c];
            double ds = p[j] * (a - Dd) * scale;
            if (cs.softcap > 0) ds *= 1 - th[j] * th[j];
            double *dkj = &ref.dk[((size_t)(k0 + j) * hkv + hk) * d];
            double *dvj = &ref.dv[((size_t)(k0 + j) * hkv + hk) * d];
            for (int c = 0; c < d; ++c) {
              dqi[c] += ds * kj[c];
              dkj[c] += ds * qi[c];
              dvj[c] += p[j] * doi[c];
            }
          }
        }
    }
}

struct Err {
  double max_err = 0, max_ref = 0;
  long nan = 0;
  double rel() const {
    return max_err / std::max(max_ref, 1e-6);
  }
};
static Err compare(const std::vector<float> &x, const std::vector<double> &r) {
  Err e;
  for (size_t i = 0; i < x.size(); ++i) {
    if (std::isnan(x[i])) {
      e.nan++;
      continue;
    }
    if (std::isinf(r[i]) || std::isinf(x[i])) {
      if (x[i] != r[i]) e.nan++;
      continue;
    }
    e.max_err = std::max(e.max_err, fabs(x[i] - r[i]));
    e.max_ref = std::max(e.max_ref, fabs(r[i]));
  }
  return e;
}

struct Setup {
  Case cs;
  Tensor q, k, v, o, dout, dq, dk, dv;
  std::vector<float> lse; /* [hq][rows] */
  float *lse_dev = nullptr;
  int32_t *cuq_dev = nullptr, *cuk_dev = nullptr;
  float *alibi_dev = nullptr;
  std::vector<float> slopes;
  void *buf_in = nullptr, *buf_out = nullptr, *ws = nullptr;
  size_t in_elems = 0, out_elems = 0, ws_bytes = 0;
  attn__problem pb;
  attn__cuda_device dev;
  attn__cuda_launch L;
  float scale;
};

static attn__cuda_device device_of(const cudaDeviceProp &prop) {
  attn__cuda_device dev;
  dev.sm_count = prop.multiProcessorCount;
  dev.cc = 10 * prop.major + prop.minor;
  dev.smem_optin = prop.sharedMemPerBlockOptin;
  return dev;
}

/* The tensor-core row for the problem (its dtype and head dim on this
 * device) launched, or ATTN_EUNSUPPORTED where there is none. */
static int run_mma(const attn__cuda_launch *L, int backward) {
  const attn__cuda_rows *t =
      backward ? &attn__cuda_mma_backward_rows : &attn__cuda_mma_forward_rows;
  for (int i = 0; i < t->n; i++) {
    const attn__cuda_config *c = &t->row[i];
    size_t smem = c->smem;
    if (L->pb->deterministic && c->smem_det > smem) smem = c->smem_det;
    if (c->dtype == L->pb->dtype && c->dim == L->pb->head_dim && L->dev->cc >= c->cc &&
        smem <= L->dev->smem_optin)
      return c->launch(L, c);
  }
  return ATTN_EUNSUPPORTED;
}

static void layout(Tensor &t, int rows, int heads, int d, int seqlen) {
  t.rows = rows;
  t.heads = heads;
  t.d = d;
  t.seqlen = seqlen;
  t.sh = d;
  t.ss = (int64_t)heads * d;
  t.sb = seqlen ? (int64_t)seqlen * t.ss : 0;
  t.elems = (size_t)rows * heads * d;
}

static attn__tensor native_of(const Tensor &t, void *base, attn_dtype dt) {
  attn__tensor n;
  n.native = base;
  n.offset = t.off_elems * 2;
  n.dtype = dt;
  n.sb = t.sb;
  n.ss = t.ss;
  n.sh = t.sh;
  n.sd = 1;
  return n;
}

static void setup(Setup &S, const Case &cs, const cudaDeviceProp &prop) {
  S.cs = cs;
  const bool vl = !cs.cuq.empty();
  const int rq = vl ? cs.cuq.back() : cs.B * cs.nq;
  const int rk = vl ? cs.cuk.back() : cs.B * cs.nk;
  const int sq = vl ? 0 : cs.nq, sk = vl ? 0 : cs.nk;
  int maxq = cs.nq, maxk = cs.nk;
  if (vl) {
    maxq = maxk = 0;
    for (int b = 0; b < cs.B; ++b) {
      maxq = std::max(maxq, cs.cuq[b + 1] - cs.cuq[b]);
      maxk = std::max(maxk, cs.cuk[b + 1] - cs.cuk[b]);
    }
  }
  layout(S.q, rq, cs.hq, cs.d, sq);
  layout(S.k, rk, cs.hkv, cs.d, sk);
  layout(S.v, rk, cs.hkv, cs.d, sk);
  if (cs.fused) { /* [B][N][Hq + 2 Hkv][d], N shared */
    const int64_t ss = (int64_t)(cs.hq + 2 * cs.hkv) * cs.d;
    for (Tensor *t : {&S.q, &S.k, &S.v}) {
      t->ss = ss;
      t->sb = sq ? sq * ss : 0;
    }
    S.q.off_elems = 0;
    S.k.off_elems = (size_t)cs.hq * cs.d;
    S.v.off_elems = (size_t)(cs.hq + cs.hkv) * cs.d;
    S.in_elems = (size_t)rq * ss;
  } else {
    S.q.off_elems = 0;
    S.k.off_elems = S.q.elems;
    S.v.off_elems = S.k.off_elems + S.k.elems;
    S.in_elems = S.v.off_elems + S.v.elems;
  }
  layout(S.dout, rq, cs.hq, cs.d, sq);
  S.dout.off_elems = S.in_elems;
  S.in_elems += S.dout.elems;
  layout(S.o, rq, cs.hq, cs.d, sq);
  layout(S.dq, rq, cs.hq, cs.d, sq);
  layout(S.dk, rk, cs.hkv, cs.d, sk);
  layout(S.dv, rk, cs.hkv, cs.d, sk);
  /* o first in the output buffer; a padding of 8 elements keeps 16-byte
   * alignment and catches overruns into the neighbour. */
  S.o.off_elems = 0;
  S.dq.off_elems = S.o.elems + 8;
  S.dk.off_elems = S.dq.off_elems + S.dq.elems + 8;
  S.dv.off_elems = S.dk.off_elems + S.dk.elems + 8;
  S.out_elems = S.dv.off_elems + S.dv.elems + 8;

  fill_random(S.q, cs.dt, cs.mag);
  fill_random(S.k, cs.dt, cs.mag);
  fill_random(S.v, cs.dt, 1.f);
  fill_random(S.dout, cs.dt, 1.f);
  std::vector<uint16_t> host(S.in_elems, 0xFFFF);
  upload(S.q, cs.dt, host);
  upload(S.k, cs.dt, host);
  upload(S.v, cs.dt, host);
  upload(S.dout, cs.dt, host);
  CK(cudaMalloc(&S.buf_in, S.in_elems * 2));
  CK(cudaMemcpy(S.buf_in, host.data(), S.in_elems * 2, cudaMemcpyHostToDevice));
  CK(cudaMalloc(&S.buf_out, S.out_elems * 2));
  CK(cudaMalloc(&S.lse_dev, (size_t)cs.hq * rq * 4));
  if (vl) {
    CK(cudaMalloc(&S.cuq_dev, cs.cuq.size() * 4));
    CK(cudaMalloc(&S.cuk_dev, cs.cuk.size() * 4));
    CK(cudaMemcpy(S.cuq_dev, cs.cuq.data(), cs.cuq.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(S.cuk_dev, cs.cuk.data(), cs.cuk.size() * 4, cudaMemcpyHostToDevice));
  }
  if (cs.alibi) {
    for (int h = 0; h < cs.hq; ++h)
      S.slopes.push_back(std::pow(2.f, -8.f * (h + 1) / cs.hq));
    CK(cudaMalloc(&S.alibi_dev, cs.hq * 4));
    CK(cudaMemcpy(S.alibi_dev, S.slopes.data(), cs.hq * 4, cudaMemcpyHostToDevice));
  }
  S.scale = 1.f / std::sqrt((float)cs.d);

  attn__problem &pb = S.pb;
  memset(&pb, 0, sizeof pb);
  pb.dtype = cs.dt;
  pb.batch = cs.B;
  pb.heads_q = cs.hq;
  pb.heads_kv = cs.hkv;
  pb.head_dim = cs.d;
  pb.seqlen_q = maxq;
  pb.seqlen_k = maxk;
  pb.total_q = rq;
  pb.total_k = rk;
  pb.cu_q = vl ? cs.cuq.data() : nullptr;
  pb.cu_k = vl ? cs.cuk.data() : nullptr;
  pb.scale = S.scale;
  pb.softcap = cs.softcap;
  pb.window_left = cs.wl;
  pb.window_right = cs.causal ? (cs.wr < 0 ? 0 : std::min(cs.wr, 0)) : cs.wr;
  S.cs.wr = (int)pb.window_right;
  pb.causal = cs.causal;
  pb.alibi = cs.alibi ? S.slopes.data() : nullptr;
  pb.has_lse = 1;
  pb.q = native_of(S.q, S.buf_in, cs.dt);
  pb.k = native_of(S.k, S.buf_in, cs.dt);
  pb.v = native_of(S.v, S.buf_in, cs.dt);
  pb.dout = native_of(S.dout, S.buf_in, cs.dt);
  pb.o = native_of(S.o, S.buf_out, cs.dt);
  pb.dq = native_of(S.dq, S.buf_out, cs.dt);
  pb.dk = native_of(S.dk, S.buf_out, cs.dt);
  pb.dv = native_of(S.dv, S.buf_out, cs.dt);
  pb.lse.native = S.lse_dev;
  pb.lse.offset = 0;
  pb.lse.dtype = ATTN_F32;
  pb.lse.sh = rq;
  pb.lse.ss = 1;
  pb.lse.sb = vl ? 0 : cs.nq;
  pb.lse.sd = 0;

  memset(&S.L, 0, sizeof S.L);
  S.L.pb = &S.pb;
  S.L.stream = 0;
  S.L.cu_q = S.cuq_dev;
  S.L.cu_k = S.cuk_dev;
  S.L.alibi = S.alibi_dev;
  S.dev = device_of(prop);
  S.L.dev = &S.dev;
}

static void teardown(Setup &S) {
  cudaFree(S.buf_in);
  cudaFree(S.buf_out);
  cudaFree(S.lse_dev);
  cudaFree(S.cuq_dev);
  cudaFree(S.cuk_dev);
  cudaFree(S.alibi_dev);
  cudaFree(S.ws);
}

static int run_fwd(Setup &S) {
  CK(cudaMemset(S.buf_out, 0xFF, S.out_elems * 2));
  CK(cudaMemset(S.lse_dev, 0xFF, (size_t)S.cs.hq * S.q.rows * 4));
  int rc = run_mma(&S.L, 0);
  if (rc != ATTN_OK) return rc;
  CK(cudaDeviceSynchronize());
  std::vector<uint16_t> host(S.out_elems);
  CK(cudaMemcpy(host.data(), S.buf_out, S.out_elems * 2, cudaMemcpyDeviceToHost));
  download(S.o, S.cs.dt, host);
  S.lse.resize((size_t)S.cs.hq * S.q.rows);
  CK(cudaMemcpy(S.lse.data(), S.lse_dev, S.lse.size() * 4, cudaMemcpyDeviceToHost));
  return ATTN_OK;
}

/* Backward needs o in the input buffer's sense: point pb.o at the output
 * buffer (already holding the forward's o) and keep it. */
static int run_bwd(Setup &S, int deterministic, std::vector<uint16_t> *raw = nullptr) {
  S.pb.deterministic = deterministic;
  size_t need = attn__cuda_workspace(ATTN__CUDA_MMA_BACKWARD, &S.pb);
  if (need > S.ws_bytes) {
    cudaFree(S.ws);
    CK(cudaMalloc(&S.ws, need));
    S.ws_bytes = need;
  }
  S.L.workspace = S.ws;
  /* Poison dq, dk, dv (not o). */
  const size_t o_end = S.o.elems + 8;
  CK(cudaMemset((uint16_t *)S.buf_out + o_end, 0xFF, (S.out_elems - o_end) * 2));
  int rc = run_mma(&S.L, 1);
  if (rc != ATTN_OK) return rc;
  CK(cudaDeviceSynchronize());
  std::vector<uint16_t> host(S.out_elems);
  CK(cudaMemcpy(host.data(), S.buf_out, S.out_elems * 2, cudaMemcpyDeviceToHost));
  download(S.dq, S.cs.dt, host);
  download(S.dk, S.cs.dt, host);
  download(S.dv, S.cs.dt, host);
  if (raw) *raw = host;
  return ATTN_OK;
}

static int g_fail = 0;

static void check_case(const Case &cs, const cudaDeviceProp &prop, bool quiet_ref = false) {
  Setup S;
  setup(S, cs, prop);
  int rc = run_fwd(S);
  if (cs.expect_unsupported) {
    bool ok = rc == ATTN_EUNSUPPORTED;
    printf("%-26s %-4s d=%-3d forward declined: %s\n", cs.name.c_str(),
           cs.dt == ATTN_BF16 ? "bf16" : "f16", cs.d, ok ? "ok" : "FAIL");
    if (!ok) g_fail++;
    teardown(S);
    return;
  }
  if (rc != ATTN_OK) {
    printf("%-26s forward returned %d  FAIL\n", cs.name.c_str(), rc);
    g_fail++;
    teardown(S);
    return;
  }
  int brc[2] = {-1, -1};
  Tensor dq2, dk2, dv2;
  std::vector<uint16_t> raw1, raw2;
  bool bitwise = true;
  if (cs.bwd) {
    brc[0] = run_bwd(S, 0);
    dq2 = S.dq;
    dk2 = S.dk;
    dv2 = S.dv;
    brc[1] = run_bwd(S, 1, &raw1);
    if (brc[1] == ATTN_OK) {
      run_bwd(S, 1, &raw2);
      bitwise = raw1 == raw2;
    }
  }
  Ref ref;
  reference(S.cs, S.q, S.k, S.v, S.dout, S.slopes, S.scale, ref, cs.bwd);
  (void)quiet_ref;

  const bool bf = cs.dt == ATTN_BF16;
  const double tol_o = bf ? 2e-2 : 5e-3, tol_g = bf ? 5e-2 : 1.5e-2;
  Err eo = compare(S.o.v, ref.o);
  Err el = compare(S.lse, ref.lse);
  /* rows with no key: exact zeros and -inf */
  long bad_empty = 0;
  for (size_t r = 0; r < (size_t)S.q.rows; ++r)
    for (int h = 0; h < cs.hq; ++h)
      if (ref.lse[(size_t)h * S.q.rows + r] == -INFINITY) {
        if (S.lse[(size_t)h * S.q.rows + r] != -INFINITY) bad_empty++;
        for (int c = 0; c < cs.d; ++c)
          if (S.o.v[(r * cs.hq + h) * cs.d + c] != 0.f) bad_empty++;
      }
  const double lse_tol = 1e-4 * std::max(1.0, el.max_ref);
  bool ok = eo.nan == 0 && el.nan == 0 && eo.rel() < tol_o && el.max_err < lse_tol && !bad_empty;
  printf("%-26s %-4s d=%-3d o %.2e lse %.2e", cs.name.c_str(), bf ? "bf16" : "f16", cs.d, eo.rel(),
         el.max_err);
  if (eo.nan || el.nan || bad_empty) printf(" [nan %ld/%ld empty %ld]", eo.nan, el.nan, bad_empty);
  if (cs.bwd) {
    for (int m = 0; m < 2; ++m) {
      if (brc[m] != ATTN_OK) {
        printf(" | bwd%s rc %d", m ? "-det" : "", brc[m]);
        ok = false;
        continue;
      }
      const Tensor &a = m ? S.dq : dq2, &bk = m ? S.dk : dk2, &c = m ? S.dv : dv2;
      Err gq = compare(a.v, ref.dq), gk = compare(bk.v, ref.dk), gv = compare(c.v, ref.dv);
      printf(" | %s dq %.2e dk %.2e dv %.2e", m ? "det" : "atm", gq.rel(), gk.rel(), gv.rel());
      if (gq.nan || gk.nan || gv.nan) printf(" [nan %ld %ld %ld]", gq.nan, gk.nan, gv.nan);
      ok = ok && !gq.nan && !gk.nan && !gv.nan && gq.rel() < tol_g && gk.rel() < tol_g &&
           gv.rel() < tol_g;
    }
    if (!bitwise) printf(" [det not bitwise]");
    ok = ok && bitwise;
  }
  printf("  %s\n", ok ? "ok" : "FAIL");
  if (!ok) g_fail++;
  teardown(S);
}

static std::vector<Case> cases() {
  std::vector<Case> v;
  auto add = [&](Case c) {
    for (attn_dtype dt : {ATTN_BF16, ATTN_F16}) {
      c.dt = dt;
      v.push_back(c);
    }
  };
  Case c;
  c = Case{};
  c.name = "basic";
  c.B = 2, c.nq = c.nk = 200, c.hq = c.hkv = 3, c.d = 64;
  add(c);
  c.name = "basic_d128", c.d = 128;
  add(c);
  c.name = "basic_d96", c.d = 96;
  add(c);
  c.name = "basic_d256", c.d = 256, c.nq = 130, c.nk = 70, c.bwd = false;
  add(c);
  c = Case{};
  c.name = "gqa_window_d96", c.nq = 190, c.nk = 230, c.hq = 6, c.hkv = 2, c.d = 96, c.wl = 40;
  c.wr = 7;
  add(c);
  c = Case{};
  c.name = "causal_d256_fwd", c.nq = c.nk = 300, c.d = 256, c.causal = true, c.bwd = false;
  add(c);
  c = Case{};
  c.name = "causal_square_d128", c.nq = c.nk = 257, c.d = 128, c.causal = true;
  add(c);
  c = Case{};
  c.name = "causal_more_k", c.nq = 100, c.nk = 257, c.causal = true;
  add(c);
  c = Case{};
  c.name = "causal_more_q_empty_rows", c.nq = 257, c.nk = 100, c.causal = true;
  add(c);
  c.name = "causal_more_q_d128", c.d = 128;
  add(c);
  c = Case{};
  c.name = "cross_rect", c.B = 2, c.nq = 77, c.nk = 300, c.hq = c.hkv = 4;
  add(c);
  c = Case{};
  c.name = "window_both", c.nq = c.nk = 300, c.wl = 32, c.wr = 16;
  add(c);
  c = Case{};
  c.name = "window_left_d128", c.nq = c.nk = 300, c.d = 128, c.wl = 64, c.wr = 0;
  add(c);
  c = Case{};
  c.name = "window_tiny_empty", c.nq = 300, c.nk = 150, c.wl = 3, c.wr = 2;
  add(c);
  c = Case{};
  c.name = "softcap", c.nq = c.nk = 200, c.softcap = 5.f, c.mag = 2.f;
  add(c);
  c.name = "softcap_causal_d128", c.d = 128, c.causal = true;
  add(c);
  c = Case{};
  c.name = "alibi_causal", c.nq = c.nk = 200, c.hq = c.hkv = 4, c.alibi = true, c.causal = true;
  add(c);
  c = Case{};
  c.name = "gqa_causal_d128", c.nq = c.nk = 192, c.hq = 8, c.hkv = 2, c.d = 128, c.causal = true;
  add(c);
  c = Case{};
  c.name = "mqa_decode_d128", c.B = 2, c.nq = 1, c.nk = 1537, c.hq = 8, c.hkv = 1, c.d = 128;
  add(c);
  c = Case{};
  c.name = "big_logits", c.nq = c.nk = 128, c.mag = 4.f;
  add(c);
  c = Case{};
  c.name = "varlen_causal", c.B = 3, c.hq = 4, c.hkv = 2, c.causal = true;
  c.cuq = {0, 50, 180, 300}, c.cuk = {0, 70, 200, 333};
  c.nq = c.nk = 0;
  add(c);
  c.name = "varlen_empty_k", c.causal = false, c.cuq = {0, 40, 90, 91}, c.cuk = {0, 0, 130, 200};
  add(c);
  c = Case{};
  c.name = "fused_qkv_causal", c.B = 2, c.nq = c.nk = 150, c.hq = 4, c.hkv = 2, c.causal = true;
  c.fused = true;
  add(c);
  c.name = "fused_qkv_d128", c.d = 128, c.causal = false;
  add(c);
  c = Case{};
  c.name = "long_causal_d128", c.nq = c.nk = 1000, c.d = 128, c.causal = true, c.hq = c.hkv = 2;
  add(c);
  c = Case{};
  c.name = "d80_declined", c.d = 80, c.expect_unsupported = true;
  add(c);
  return v;
}

/* ---------------------------------------------------------------------- */
/* Benchmark                                                                */
/* ---------------------------------------------------------------------- */

__global__ void fill_kernel(uint16_t *p, size_t n, uint64_t seed, int bf) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x) {
    uint64_t x = (i + 1) * 0x9E3779B97F4A7C15ull ^ seed;
    x ^= x >> 31;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 29;
    float f = ((x >> 40) * (1.f / 16777216.f)) * 2.f - 1.f; /* uniform(-1, 1) */
    if (bf) {
      __nv_bfloat16 h = __float2bfloat16(f);
      p[i] = *(uint16_t *)&h;
    } else {
      __half h = __float2half(f);
      p[i] = *(uint16_t *)&h;
    }
  }
}

static double median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

/* quick: bf16 only, at 4k and 16k tokens (comparing build variants). */
static void bench(const cudaDeviceProp &prop, bool quick) {
  printf("%-5s %-4s %-6s %-6s %9s %9s\n", "dtype", "d", "causal", "N", "fwd_TF", "bwd_TF");
  std::vector<int> Ns =
      quick ? std::vector<int>{4096, 16384} : std::vector<int>{1024, 2048, 4096, 8192, 16384};
  std::vector<attn_dtype> dts =
      quick ? std::vector<attn_dtype>{ATTN_BF16} : std::vector<attn_dtype>{ATTN_BF16, ATTN_F16};
  for (attn_dtype dt : dts)
    for (int d : {64, 128})
      for (int causal = 0; causal < 2; ++causal)
        for (int N : Ns) {
          const int B = 16384 / N, H = 2048 / d;
          const size_t n = (size_t)B * N * H * d;
          uint16_t *buf;
          CK(cudaMalloc(&buf, n * 2 * 8));
          float *lse;
          CK(cudaMalloc(&lse, (size_t)B * H * N * 4));
          for (int i = 0; i < 4; ++i)
            fill_kernel<<<1024, 256>>>(buf + i * n, n, 77 + i, dt == ATTN_BF16);
          attn__problem pb;
          memset(&pb, 0, sizeof pb);
          pb.dtype = dt;
          pb.batch = B;
          pb.heads_q = pb.heads_kv = H;
          pb.head_dim = d;
          pb.seqlen_q = pb.seqlen_k = N;
          pb.total_q = pb.total_k = (int64_t)B * N;
          pb.scale = 1.f / std::sqrt((float)d);
          pb.window_left = -1;
          pb.window_right = causal ? 0 : -1;
          pb.causal = causal;
          pb.has_lse = 1;
          attn__tensor t;
          t.offset = 0;
          t.dtype = dt;
          t.sd = 1;
          t.sh = d;
          t.ss = (int64_t)H * d;
          t.sb = (int64_t)N * t.ss;
          attn__tensor *ts[] = {&pb.q, &pb.k, &pb.v, &pb.dout, &pb.o, &pb.dq, &pb.dk, &pb.dv};
          for (int i = 0; i < 8; ++i) {
            *ts[i] = t;
            ts[i]->native = buf + i * n;
          }
          pb.lse.native = lse;
          pb.lse.offset = 0;
          pb.lse.dtype = ATTN_F32;
          pb.lse.sb = (int64_t)H * N;
          pb.lse.sh = N;
          pb.lse.ss = 1;
          pb.lse.sd = 0;
          size_t wsb = attn__cuda_workspace(ATTN__CUDA_MMA_BACKWARD, &pb);
          void *ws;
          CK(cudaMalloc(&ws, wsb));
          attn__cuda_launch L;
          memset(&L, 0, sizeof L);
          L.pb = &pb;
          L.workspace = ws;
          const attn__cuda_device dev = device_of(prop);
          L.dev = &dev;
          cudaEvent_t e0, e1;
          CK(cudaEventCreate(&e0));
          CK(cudaEventCreate(&e1));
          double tf[2];
          tf[1] = 0;
          for (int pass = 0; pass < 2; ++pass) {
            std::vector<float> ms;
            for (int rep = 0; rep < 13; ++rep) {
              CK(cudaEventRecord(e0));
              int rc = run_mma(&L, pass);
              CK(cudaEventRecord(e1));
              CK(cudaEventSynchronize(e1));
              if (rc != ATTN_OK) {
                printf("rc %d\n", rc);
                exit(1);
              }
              float m;
              CK(cudaEventElapsedTime(&m, e0, e1));
              if (rep >= 3) ms.push_back(m);
            }
            double flops = 4.0 * B * H * (double)N * N * d / (causal ? 2 : 1) * (pass ? 2.5 : 1);
            tf[pass] = flops / (median(ms) * 1e-3) / 1e12;
          }
          CK(cudaGetLastError());
          printf("%-5s %-4d %-6d %-6d %9.1f %9.1f\n", dt == ATTN_BF16 ? "bf16" : "f16", d, causal,
                 N, tf[0], tf[1]);
          fflush(stdout);
          cudaEventDestroy(e0);
          cudaEventDestroy(e1);
          cudaFree(ws);
          cudaFree(lse);
          cudaFree(buf);
        }
}

int main(int argc, char **argv) {
  const char *mode = argc > 1 ? argv[1] : "check";
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  printf("device: %s, cc %d.%d, %d SMs, smem opt-in %zu\n", prop.name, prop.major, prop.minor,
         prop.multiProcessorCount, (size_t)prop.sharedMemPerBlockOptin);
  if (!strcmp(mode, "bench") || !strcmp(mode, "fwdbench")) {
    bench(prop, !strcmp(mode, "fwdbench"));
    return 0;
  }
  std::vector<Case> cs = cases();
  if (!strcmp(mode, "san")) {
    /* small, every kernel path once */
    std::vector<Case> s;
    for (const Case &c : cs)
      if (c.name == "causal_more_q_empty_rows" || c.name == "varlen_empty_k" ||
          c.name == "softcap_causal_d128" || c.name == "basic_d256" || c.name == "gqa_causal_d128")
        if (c.dt == ATTN_BF16) s.push_back(c);
    cs = s;
  }
  for (const Case &c : cs)
    check_case(c, prop);
  printf("%s: %d failing case(s)\n", g_fail ? "FAIL" : "PASS", g_fail);
  return g_fail ? 1 : 0;
}
