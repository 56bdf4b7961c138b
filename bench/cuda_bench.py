#!/usr/bin/env python3
"""The CUDA backend beside PyTorch, through the library's public API.

Calls libattn through ctypes on torch-allocated device memory
(attn_buffer_wrap + tensors on the buffers), on torch's current stream, with
ATTN_ASYNC, so both sides are timed the same way: CUDA events around each call,
warmed up, the median of repeats.

  cuda_bench.py check  LIB   randomized problems (every option, odd strides,
                             varlen, GQA, rows with no key) against a float64
                             reference; deterministic mode bit-for-bit twice
  cuda_bench.py bench  LIB   forward and backward TFLOP/s, bf16/f16 beside SDPA's
                             flash and cuDNN backends, f32 beside float32 SDPA

Forward FLOPs 4*B*H*Nq*Nk*d, halved when causal; backward 2.5x that.
"""
import argparse
import ctypes as C
import json
import math
import sys
import time

import torch

ATTN_F32, ATTN_F16, ATTN_BF16 = 0, 1, 2
CAUSAL, DETERMINISTIC, ASYNC = 0x1, 0x2, 0x10
DT = {torch.float32: ATTN_F32, torch.float16: ATTN_F16, torch.bfloat16: ATTN_BF16}


class Tensor(C.Structure):
    _fields_ = [("data", C.c_void_p), ("buffer", C.c_void_p), ("offset", C.c_size_t),
                ("dtype", C.c_int), ("ndim", C.c_int), ("shape", C.c_int64 * 4),
                ("stride", C.c_int64 * 4)]


class Params(C.Structure):
    _fields_ = [("size", C.c_size_t), ("scale", C.c_double), ("flags", C.c_uint), ("window_left", C.c_int64),
                ("window_right", C.c_int64), ("softcap", C.c_double),
                ("alibi_slopes", C.POINTER(C.c_float)), ("alibi_count", C.c_int64),
                ("cu_seqlens_q", C.POINTER(C.c_int32)), ("cu_seqlens_k", C.POINTER(C.c_int32)),
                ("batch", C.c_int64)]
# The fields above are the first attn.h's attn_params (its size is accepted with
# later fields at their defaults); the size is set from this struct.


class Attn:
    def __init__(self, lib, spec="cuda"):
        self.lib = L = C.CDLL(lib)
        L.attn_errmsg.restype = C.c_char_p
        L.attn_status_name.restype = C.c_char_p
        self.ctx = C.c_void_p()
        st = L.attn_context_create(spec.encode(), C.byref(self.ctx))
        self.ok(st, "attn_context_create")
        self.bufs = {}
        self.ok(L.attn_context_set_stream(self.ctx, C.c_void_p(torch.cuda.current_stream().cuda_stream)),
                "attn_context_set_stream")

    def ok(self, st, what):
        if st != 0:
            raise RuntimeError("%s: %s: %s" % (what, self.lib.attn_status_name(st).decode(),
                                               self.lib.attn_errmsg(self.ctx).decode()))

    def tensor(self, t):
        """A library tensor over torch tensor t (any strides), wrapping its storage once."""
        if t is None:
            return None
        base = t.untyped_storage().data_ptr()
        nbytes = t.untyped_storage().nbytes()
        key = (base, nbytes)
        if key not in self.bufs:
            b = C.c_void_p()
            self.ok(self.lib.attn_buffer_wrap(self.ctx, C.c_void_p(base), C.c_size_t(nbytes), C.byref(b)),
                    "attn_buffer_wrap")
            self.bufs[key] = b
        x = Tensor()
        x.data = None
        x.buffer = self.bufs[key]
        x.offset = t.data_ptr() - base
        x.dtype = DT[t.dtype]
        x.ndim = t.dim()
        for i in range(t.dim()):
            x.shape[i] = t.shape[i]
            x.stride[i] = t.stride(i)
        return x

    def release(self):
        for b in self.bufs.values():
            self.lib.attn_buffer_free(b)
        self.bufs = {}

    @staticmethod
    def params(scale=0.0, flags=0, window=(-1, -1), softcap=0.0, alibi=None, cu_q=None, cu_k=None):
        p = Params()
        p.size = C.sizeof(Params)
        p.scale = scale
        p.flags = flags
        p.window_left, p.window_right = window
        p.softcap = softcap
        p._keep = []
        if alibi is not None:
            a = (C.c_float * len(alibi))(*alibi)
            p._keep.append(a)
            p.alibi_slopes = C.cast(a, C.POINTER(C.c_float))
            p.alibi_count = len(alibi)
        if cu_q is not None:
            cq = (C.c_int32 * len(cu_q))(*cu_q)
            ck = (C.c_int32 * len(cu_k))(*cu_k)
            p._keep += [cq, ck]
            p.cu_seqlens_q = C.cast(cq, C.POINTER(C.c_int32))
            p.cu_seqlens_k = C.cast(ck, C.POINTER(C.c_int32))
            p.batch = len(cu_q) - 1
        return p

    def prep_forward(self, p, q, k, v, o, lse):
        """A call with its arguments built once, so that timing sees little Python."""
        T = [self.tensor(t) for t in (q, k, v, o, lse)]
        args = [self.ctx, C.byref(p)] + [C.byref(t) if t is not None else None for t in T]
        f = self.lib.attn_forward

        def call():
            st = f(*args)
            if st:
                self.ok(st, "attn_forward")
        call._keep = (T, p)
        return call

    def prep_backward(self, p, q, k, v, o, lse, do, dq, dk, dv):
        T = [self.tensor(t) for t in (q, k, v, o, lse, do, dq, dk, dv)]
        args = [self.ctx, C.byref(p)] + [C.byref(t) for t in T]
        f = self.lib.attn_backward

        def call():
            st = f(*args)
            if st:
                self.ok(st, "attn_backward")
        call._keep = (T, p)
        return call

    def forward(self, p, q, k, v, o, lse):
        self.prep_forward(p, q, k, v, o, lse)()

    def backward(self, p, q, k, v, o, lse, do, dq, dk, dv):
        self.prep_backward(p, q, k, v, o, lse, do, dq, dk, dv)()


# ---------------------------------------------------------------------------
# Reference (float64, scores materialized) for one sequence
# ---------------------------------------------------------------------------

def ref_seq(q, k, v, do, scale, window, softcap, alibi):
    """q [Nq,Hq,d], k/v [Nk,Hkv,d] float64 -> o, lse [Hq,Nq], dq, dk, dv."""
    Nq, Hq, d = q.shape
    Nk, Hkv, _ = k.shape
    g = Hq // Hkv
    kk = k.repeat_interleave(g, dim=1)
    vv = v.repeat_interleave(g, dim=1)
    qh, kh, vh, doh = (x.permute(1, 0, 2) for x in (q, kk, vv, do))
    raw = scale * qh @ kh.transpose(1, 2)  # [Hq, Nq, Nk]
    s = raw
    dcap = torch.ones_like(raw)
    if softcap > 0:
        t = torch.tanh(raw / softcap)
        s = softcap * t
        dcap = 1 - t * t
    i = torch.arange(Nq, device=q.device, dtype=torch.float64)[:, None]
    j = torch.arange(Nk, device=q.device, dtype=torch.float64)[None, :]
    diag = i + Nk - Nq
    if alibi is not None:
        sl = torch.tensor(alibi, dtype=torch.float64, device=q.device)[:, None, None]
        s = s - sl * (diag - j).abs()[None]
    vis = torch.ones(Nq, Nk, dtype=torch.bool, device=q.device)
    if window[0] >= 0:
        vis &= j >= diag - window[0]
    if window[1] >= 0:
        vis &= j <= diag + window[1]
    s = s.masked_fill(~vis[None], -math.inf)
    lse = torch.logsumexp(s, dim=-1)  # -inf for rows with no key
    p = torch.exp(s - lse[..., None].masked_fill(torch.isinf(lse)[..., None], 0))
    p = p.masked_fill(~vis[None], 0)
    o = p @ vh
    D = (doh * o).sum(-1, keepdim=True)
    dp = doh @ vh.transpose(1, 2)
    ds = p * (dp - D) * dcap
    dq = scale * ds @ kh
    dk = scale * ds.transpose(1, 2) @ qh
    dv = p.transpose(1, 2) @ doh
    dk = dk.reshape(Hkv, g, Nk, d).sum(1)
    dv = dv.reshape(Hkv, g, Nk, d).sum(1)
    return (o.permute(1, 0, 2), lse, dq.permute(1, 0, 2), dk.permute(1, 0, 2), dv.permute(1, 0, 2))


def strided(shape, dtype, kind, gen):
    """A random tensor of `shape` [rows..., H, d] laid out as `kind`:
    contiguous, 'bhsd' (heads outer), 'fused' (a slice of a fused qkv tensor)
    or 'dstride' (every other element along d)."""
    dev = "cuda"
    full = lambda s: (torch.randn(s, generator=gen, device=dev, dtype=torch.float32)).to(dtype)
    if kind == "contig":
        return full(shape)
    if kind == "bhsd" and len(shape) == 4:
        B, N, H, d = shape
        return full((B, H, N, d)).permute(0, 2, 1, 3)
    if kind == "fused":
        *lead, H, d = shape
        return full((*lead, 3, H, d)).select(len(lead), 1)
    if kind == "dstride":
        *lead, d = shape
        return full((*lead, 2 * d))[..., ::2]
    return full(shape)


def check(args):
    torch.manual_seed(0)
    A = Attn(args.lib)
    gen = torch.Generator(device="cuda")
    gen.manual_seed(1234)
    # name, dtype, B, Nq, Nk, Hq, Hkv, d, window, softcap, alibi, layout, varlen (cu_q, cu_k)
    cases = [
        ("f32_causal_d64", torch.float32, 2, 200, 200, 4, 4, 64, (-1, 0), 0, False, "contig", None),
        ("f32_odd_d37_gqa_window", torch.float32, 2, 77, 130, 6, 2, 37, (16, 8), 0, False, "contig", None),
        ("f32_softcap_alibi_d128", torch.float32, 1, 257, 257, 4, 4, 128, (-1, -1), 20.0, True, "contig", None),
        ("f32_d256_nokey_rows", torch.float32, 1, 300, 65, 2, 1, 256, (-1, 0), 0, False, "contig", None),
        ("f32_bhsd_d96", torch.float32, 2, 130, 190, 4, 2, 96, (-1, -1), 0, False, "bhsd", None),
        ("f32_fused_d64_causal", torch.float32, 2, 190, 190, 4, 4, 64, (-1, 0), 0, False, "fused", None),
        ("f32_dstride_d32", torch.float32, 1, 100, 150, 2, 2, 32, (40, -1), 0, False, "dstride", None),
        ("f32_varlen_d96_causal", torch.float32, 4, 0, 0, 4, 2, 96, (-1, 0), 0, False, "contig",
         ([0, 5, 5, 200, 260], [0, 0, 40, 300, 333])),
        ("f32_d1", torch.float32, 1, 70, 70, 2, 2, 1, (-1, -1), 0, False, "contig", None),
        ("f32_d200_alibi_window", torch.float32, 1, 150, 150, 3, 3, 200, (30, 30), 0, True, "contig", None),
        # The f32 wide forward's head dims (64, 128) with every option:
        # partial tiles, an empty key sequence, windows, softcap, GQA/MQA.
        ("f32_d128_varlen_gqa_window", torch.float32, 3, 0, 0, 4, 2, 128, (50, 10), 0, False, "contig",
         ([0, 1, 130, 400], [0, 70, 70, 350])),
        ("f32_d64_bhsd_nokey_rows", torch.float32, 2, 190, 60, 4, 4, 64, (-1, 0), 0, False, "bhsd", None),
        ("f32_d128_mqa_causal", torch.float32, 1, 333, 333, 4, 1, 128, (-1, 0), 0, False, "contig", None),
        ("f32_d64_softcap_window", torch.float32, 1, 300, 280, 2, 2, 64, (40, 40), 15.0, False, "contig", None),
        ("f32_d128_alibi_causal", torch.float32, 2, 270, 300, 2, 2, 128, (-1, 0), 0, True, "contig", None),
        ("f16_d80_causal", torch.float16, 2, 150, 150, 4, 4, 80, (-1, 0), 0, False, "contig", None),
        ("bf16_d160_mqa_window", torch.bfloat16, 1, 140, 140, 4, 1, 160, (20, 0), 0, False, "contig", None),
        ("f16_d64_causal", torch.float16, 2, 300, 300, 4, 4, 64, (-1, 0), 0, False, "contig", None),
        ("bf16_d128", torch.bfloat16, 2, 260, 260, 4, 2, 128, (-1, -1), 0, False, "contig", None),
        ("bf16_d96_softcap", torch.bfloat16, 1, 200, 200, 2, 2, 96, (-1, 0), 30.0, False, "contig", None),
        ("f16_d256_varlen", torch.float16, 3, 0, 0, 2, 2, 256, (-1, 0), 0, False, "contig",
         ([0, 100, 100, 250], [0, 120, 130, 250])),
        ("bf16_d64_bhsd_nokey", torch.bfloat16, 1, 200, 70, 4, 4, 64, (-1, 0), 0, False, "bhsd", None),
    ]
    # Bounds on max|x - ref| / max(1, max|ref|): true fp32 lands near 1e-6;
    # f16/bf16 are rounded on output (2^-11, 2^-8 relative).
    bound = {torch.float32: 2e-4, torch.float16: 1e-2, torch.bfloat16: 6e-2}
    fails = 0
    rows = []
    ncases = len(cases)
    for name, dt, B, Nq, Nk, Hq, Hkv, d, window, softcap, use_alibi, layout, vl in cases:
        alibi = [2.0 ** (-8.0 * (h + 1) / Hq) for h in range(Hq)] if use_alibi else None
        scale = 1.0 / math.sqrt(d)
        if vl:
            cu_q, cu_k = vl
            tq, tk = cu_q[-1], cu_k[-1]
            q = strided((tq, Hq, d), dt, layout, gen)
            k = strided((tk, Hkv, d), dt, layout, gen)
            v = strided((tk, Hkv, d), dt, layout, gen)
            do = strided((tq, Hq, d), dt, layout, gen)
            lse = torch.empty(Hq, tq, device="cuda", dtype=torch.float32)
        else:
            cu_q = cu_k = None
            q = strided((B, Nq, Hq, d), dt, layout, gen)
            k = strided((B, Nk, Hkv, d), dt, layout, gen)
            v = strided((B, Nk, Hkv, d), dt, layout, gen)
            do = strided((B, Nq, Hq, d), dt, layout, gen)
            lse = torch.empty(B, Hq, Nq, device="cuda", dtype=torch.float32)
        o = torch.full(q.shape, float("nan"), device="cuda", dtype=dt)
        lse.fill_(float("nan"))
        p = Attn.params(scale, 0, window, softcap, alibi, cu_q, cu_k)
        # Reference per sequence.
        seqs = []
        if vl:
            for b in range(len(cu_q) - 1):
                seqs.append((slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])))
        else:
            seqs = [(b, b) for b in range(B)]
        R = {n: [] for n in ("o", "lse", "dq", "dk", "dv")}
        for sq, sk in seqs:
            r = ref_seq(q[sq].double(), k[sk].double(), v[sk].double(), do[sq].double(), scale,
                        window, softcap, alibi)
            for n, x in zip(("o", "lse", "dq", "dk", "dv"), r):
                R[n].append(x)
        cat = (lambda xs, dim=0: torch.cat(xs, dim)) if vl else (lambda xs, dim=0: torch.stack(xs, 0))
        ref = {"o": cat(R["o"]), "dq": cat(R["dq"]), "dk": cat(R["dk"]), "dv": cat(R["dv"]),
               "lse": cat(R["lse"], 1) if vl else torch.stack(R["lse"], 0)}
        try:
            A.forward(p, q, k, v, o, lse)
            outs = {}
            for mode, fl in (("atomic", 0), ("det", DETERMINISTIC), ("det2", DETERMINISTIC)):
                dq = torch.full(q.shape, float("nan"), device="cuda", dtype=dt)
                dk = torch.full(k.shape, float("nan"), device="cuda", dtype=dt)
                dv = torch.full(v.shape, float("nan"), device="cuda", dtype=dt)
                pb = Attn.params(scale, fl, window, softcap, alibi, cu_q, cu_k)
                A.backward(pb, q, k, v, o, lse, do, dq, dk, dv)
                outs[mode] = (dq, dk, dv)
            torch.cuda.synchronize()
        except RuntimeError as e:
            print("%-32s FAIL %s" % (name, e))
            fails += 1
            A.release()
            continue
        errs = {}
        got = {"o": o, "lse": lse, "dq": outs["atomic"][0], "dk": outs["atomic"][1],
               "dv": outs["atomic"][2], "dq_det": outs["det"][0], "dk_det": outs["det"][1],
               "dv_det": outs["det"][2]}
        bad = []
        for n, x in got.items():
            r = ref[n.split("_")[0]]
            x = x.double()
            if torch.isnan(x).any():
                bad.append(n + ":NaN")
                errs[n] = float("nan")
                continue
            if n == "lse":
                inf = torch.isinf(r)
                if not torch.equal(torch.isinf(x) & (x < 0), inf):
                    bad.append("lse:-inf rows")
                e = (x[~inf] - r[~inf]).abs().max().item() if (~inf).any() else 0.0
                m = r[~inf].abs().max().item() if (~inf).any() else 1.0
                errs[n] = e / max(1.0, m)
                if errs[n] > 1e-5 * (1 if dt == torch.float32 else 10):
                    bad.append(n)
                continue
            e = (x - r).abs().max().item() if x.numel() else 0.0
            m = r.abs().max().item() if x.numel() else 1.0
            errs[n] = e / max(1.0, m)
            if errs[n] > bound[dt]:
                bad.append(n)
        same = all(torch.equal(a.view(torch.int16 if a.element_size() == 2 else torch.int32),
                               b.view(torch.int16 if b.element_size() == 2 else torch.int32))
                   for a, b in zip(outs["det"], outs["det2"]))
        if not same:
            bad.append("deterministic differs run to run")
        fails += bool(bad)
        print("%-32s %-4s o %.1e lse %.1e dq %.1e dk %.1e dv %.1e det(dq %.1e) %s" % (
            name, {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16"}[dt], errs["o"], errs["lse"], errs["dq"], errs["dk"], errs["dv"],
            errs["dq_det"], "ok" if not bad else "FAIL " + ",".join(bad)), flush=True)
        rows.append({"case": name, "errs": errs, "bad": bad})
        A.release()
    print("check: %d of %d cases failed" % (fails, ncases))
    if args.json:
        json.dump(rows, open(args.json, "w"), indent=1)
    return 1 if fails else 0


# ---------------------------------------------------------------------------
# Benchmark
# ---------------------------------------------------------------------------

def timeit(fn, target_s=0.1, max_reps=20):
    """Median seconds per call; calls shorter than 2 ms are timed `inner` at
    a time between two events so that launch gaps do not count. The first
    timed call is also timed on the host clock: if the events missed the work
    (another stream), the host time still bounds the repeats."""
    fn()
    fn()
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    h0 = time.perf_counter()
    e0.record()
    fn()
    e1.record()
    torch.cuda.synchronize()
    wall = time.perf_counter() - h0
    t1 = max(e0.elapsed_time(e1) / 1e3, 1e-6)
    if wall > 3 * t1 + 1e-3:
        print("timeit: events saw %.3g s, the host %.3g s: work outside the stream?" % (t1, wall))
        t1 = wall
    inner = int(max(1, min(20, 2e-3 / t1)))
    reps = int(max(3, min(max_reps, target_s / (t1 * inner))))
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(inner):
            fn()
        b.record()
        ts.append((a, b))
    torch.cuda.synchronize()
    v = sorted(a.elapsed_time(b) / 1e3 / inner for a, b in ts)
    return v[len(v) // 2]


def bench(args):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    import torch.nn.functional as F
    A = Attn(args.lib)
    results = []
    dtypes = [d for d in args.dtypes.split(",")]
    seqs = [int(x) for x in args.seqlens.split(",")]
    dims = [int(x) for x in args.dims.split(",")]
    tdt = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}
    t_start = time.time()
    for dn in dtypes:
        dt = tdt[dn]
        for d in dims:
            for causal in (False, True):
                for N in seqs:
                    if time.time() - t_start > args.budget_s:
                        print("bench: over --budget-s %d, skipping %s d=%d causal=%d N=%d" % (
                            args.budget_s, dn, d, causal, N))
                        continue
                    H = 2048 // d  # the FlashAttention papers' hidden size 2048
                    B = max(1, args.tokens // N)
                    fl = 4.0 * B * H * N * N * d / (2 if causal else 1)
                    q = torch.randn(B, N, H, d, device="cuda", dtype=dt)
                    k, v, do = (torch.randn_like(q) for _ in range(3))
                    o = torch.empty_like(q)
                    lse = torch.empty(B, H, N, device="cuda", dtype=torch.float32)
                    dq, dk, dv = (torch.empty_like(q) for _ in range(3))
                    flags = (CAUSAL if causal else 0) | ASYNC
                    p = Attn.params(0.0, flags)
                    row = {"dtype": dn, "d": d, "causal": causal, "N": N, "B": B, "H": H}
                    try:
                        row["ours_fwd"] = fl / timeit(A.prep_forward(p, q, k, v, o, lse)) / 1e12
                        if not args.forward_only:
                            row["ours_bwd"] = 2.5 * fl / timeit(
                                A.prep_backward(p, q, k, v, o, lse, do, dq, dk, dv)) / 1e12
                    except RuntimeError as e:
                        row["ours_err"] = str(e)
                    A.release()
                    # PyTorch, in its own [B, H, N, d] layout.
                    tq, tk, tv, tdo = (x.transpose(1, 2).contiguous() for x in (q, k, v, do))
                    backends = ([("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION)]
                                if dt != torch.float32 else [("sdpa", None)])
                    for bn, be in backends:
                        try:
                            ctxm = sdpa_kernel(be) if be is not None else torch.autocast("cuda", enabled=False)
                            with ctxm:
                                row[bn + "_fwd"] = fl / timeit(
                                    lambda: F.scaled_dot_product_attention(tq, tk, tv, is_causal=causal)) / 1e12
                                if not args.forward_only:
                                    xq, xk, xv = (x.detach().requires_grad_() for x in (tq, tk, tv))
                                    out = F.scaled_dot_product_attention(xq, xk, xv, is_causal=causal)
                                    row[bn + "_bwd"] = 2.5 * fl / timeit(
                                        lambda: torch.autograd.grad(out, (xq, xk, xv), tdo, retain_graph=True)) / 1e12
                                    del out, xq, xk, xv
                        except Exception as e:  # a backend that refuses the shape
                            row[bn + "_err"] = str(e).splitlines()[0][:80]
                    del tq, tk, tv, tdo, q, k, v, do, o, dq, dk, dv
                    torch.cuda.empty_cache()
                    results.append(row)
                    print(json.dumps(row), flush=True)
    if args.json:
        json.dump(results, open(args.json, "w"), indent=1)
    # The table.
    f = lambda r, key: ("%6.1f" % r[key]) if key in r else "     -"
    print()
    print("TFLOP/s (fwd 4*B*H*N^2*d, /2 causal; bwd 2.5x), B*N = %d tokens, H = 2048/d" % args.tokens)
    print("dtype  d  causal      N |   ours  flash  cudnn  f32sdpa  ratio |   ours  flash  cudnn  f32sdpa  ratio  (bwd)")
    for r in results:
        ref_f = r.get("flash_fwd", r.get("sdpa_fwd"))
        ref_b = r.get("flash_bwd", r.get("sdpa_bwd"))
        rf = ("%5.2f" % (r["ours_fwd"] / ref_f)) if ref_f and "ours_fwd" in r else "    -"
        rb = ("%5.2f" % (r["ours_bwd"] / ref_b)) if ref_b and "ours_bwd" in r else "    -"
        print("%-5s %3d %6s %6d | %s %s %s   %s  %s | %s %s %s   %s  %s" % (
            r["dtype"], r["d"], "yes" if r["causal"] else "no", r["N"],
            f(r, "ours_fwd"), f(r, "flash_fwd"), f(r, "cudnn_fwd"), f(r, "sdpa_fwd"), rf,
            f(r, "ours_bwd"), f(r, "flash_bwd"), f(r, "cudnn_bwd"), f(r, "sdpa_bwd"), rb)
            + ("  ERR " + r["ours_err"][:60] if "ours_err" in r else ""))
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", choices=["check", "bench"])
    ap.add_argument("lib", help="path to libattn.so")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--dtypes", default="bf16,f32,f16", help="in this order (the budget cuts the last)")
    ap.add_argument("--budget-s", type=int, default=240, help="skip what would start after this")
    ap.add_argument("--seqlens", default="1024,2048,4096,8192,16384")
    ap.add_argument("--dims", default="64,128")
    ap.add_argument("--tokens", type=int, default=16384, help="B*N per problem")
    ap.add_argument("--forward-only", action="store_true")
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    # A stream of our own (not the legacy default one, whose handle is 0 and
    # would give the library its own stream): both sides run and are timed on it.
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        return check(args) if args.mode == "check" else bench(args)


if __name__ == "__main__":
    sys.exit(main())
