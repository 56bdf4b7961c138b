#!/usr/bin/env python3
"""Makes attn's golden cases (tests/golden/cases/<name>/): inputs, exact answers
computed in float64 with NumPy, and the error a naive peer makes on the same
inputs (README.md beside this file gives the semantics, the file format and
the tolerance rule).

    python3 tests/golden/gen.py            rewrite tests/golden/cases
    python3 tests/golden/gen.py --check    regenerate into a temporary folder and
                                           compare: arrays byte for byte, case.json
                                           field by field, error figures within
                                           1e-6 relative (exit 1 if any differs,
                                           77 without NumPy)
    python3 tests/golden/gen.py --torch --out DIR
                                           also cross-check every case against
                                           PyTorch float64 SDPA + autograd and
                                           measure the f16/bf16 peer with SDPA
                                           on a CUDA device (needs torch)

Every case is drawn from a seed. Figures that only --torch measures are kept by
later regenerations while a case's parameters and input bytes do not change.
Every sum runs in a fixed order through elementwise NumPy operations (never a
BLAS call, whose blocking differs between machines), and float32 transcendental
functions are evaluated in float64 and rounded once, so that regeneration is
byte-identical from machine to machine (and from NumPy 1.24 to 2.4: compared).
"""

import argparse
import json
import os
import shutil
import sys
import tempfile

try:
    import numpy as np
except ImportError:  # the ctest entry reports "skipped"
    print("gen.py: NumPy is not installed", file=sys.stderr)
    sys.exit(77)

HERE = os.path.dirname(os.path.abspath(__file__))
CASES_DIR = os.path.join(HERE, "cases")
# The cache after appending: copies of the inputs' values, in their dtype
# (the other files: input_names, output_names).
CACHE_OUTPUTS = ("k_out", "v_out")
F64 = np.float64
F32 = np.float32

REFERENCE = "numpy float64 (tests/golden/gen.py)"
PEER_F32 = ("numpy float32 naive attention (tests/golden/gen.py: scores materialized, "
            "max-subtracted softmax, sums in index order, exp/log/tanh rounded once to float32)")
PEER_EMU = ("numpy emulation of %s attention (inputs in %s, float32 arithmetic as the "
            "float32 peer, o/dq/dk/dv rounded to %s, the backward reading the rounded o); "
            "gen.py --torch replaces it with SDPA's figure")


# ---------------------------------------------------------------------------
# 16-bit formats
# ---------------------------------------------------------------------------

def bf16_bits(x):
    """float32 values to bf16 bit patterns, rounding to nearest even."""
    u = np.ascontiguousarray(x, dtype=F32).view(np.uint32).astype(np.uint64)
    u = u + 0x7FFF + ((u >> 16) & 1)
    return (u >> 16).astype(np.uint16)


def bf16_values(bits):
    return (bits.astype(np.uint32) << 16).view(F32)


def to_bits(x, dtype):
    """float32 values to what a case stores for dtype."""
    if dtype == "f32":
        return np.asarray(x, dtype=F32)
    if dtype == "f16":
        return np.asarray(x, dtype=F32).astype(np.float16).view(np.uint16)
    return bf16_bits(x)


def from_bits(a, dtype):
    """A stored input to its exact values, as float32."""
    if dtype == "f32":
        return a.astype(F32)
    if dtype == "f16":
        return a.view(np.float16).astype(F32)
    return bf16_values(a)


def round_to(x, dtype):
    """float32 values rounded to dtype and back (what a dtype output holds)."""
    return from_bits(to_bits(x, dtype), dtype)


# ---------------------------------------------------------------------------
# Attention in one precision, sums in a fixed order
# ---------------------------------------------------------------------------

def fexp(x, t):
    return np.exp(x) if t is F64 else np.exp(x.astype(F64)).astype(F32)


def flog(x, t):
    return np.log(x) if t is F64 else np.log(x.astype(F64)).astype(F32)


def ftanh(x, t):
    return np.tanh(x) if t is F64 else np.tanh(x.astype(F64)).astype(F32)


def mm(a, b):
    """a[..., M, K] @ b[..., K, N], summing over K from index 0 upward. In
    float32 each step is a fused multiply-add, as in a BLAS kernel: the product
    of two floats is exact in float64, and the sum is rounded to float32."""
    if a.dtype == F64:
        out = a[..., :, 0, None] * b[..., None, 0, :]
        for t in range(1, a.shape[-1]):
            out += a[..., :, t, None] * b[..., None, t, :]
        return out
    a, b = a.astype(F64), b.astype(F64)
    out = (a[..., :, 0, None] * b[..., None, 0, :]).astype(F32)
    for t in range(1, a.shape[-1]):
        out = (out + a[..., :, t, None] * b[..., None, t, :]).astype(F32)
    return out


def rowsum(a):
    """Sum over the last axis: NumPy's pairwise summation (plain C, the same
    order on every machine)."""
    return np.ascontiguousarray(a).sum(axis=-1)


def visible(nq, nk, causal, window):
    """Which keys each row sees: bool [nq, nk]."""
    left, right = window
    if causal:
        right = 0
    i = np.arange(nq)[:, None]
    j = np.arange(nk)[None, :]
    diag = i + nk - nq
    ok = np.ones((nq, nk), dtype=bool)
    if left >= 0:
        ok &= j >= diag - left
    if right >= 0:
        ok &= j <= diag + right
    return ok


def attention(q, k, v, do, c, t, out_dtype=None, bias=None, sinks=None):
    """One sequence. q, do [Nq, Hq, d]; k, v [Nk, Hkv, d], exact values; bias
    [Hq, Nq, Nk] (broadcast) or None; sinks [Hq] or None. Returns a dict: o
    [Nq, Hq, d], lse [Hq, Nq], and with do (None: forward only) dq, dk, dv,
    ds [Hq, Nq, Nk] (the gradient of the scores, which is dbias's) and
    dsinks [Hq], in precision t. With out_dtype (f16, bf16) the backward pass
    reads o rounded to that dtype, as a backward pass given the forward's
    stored output does."""
    nq, hq, d = q.shape
    nk, hkv = k.shape[0], k.shape[1]
    if nq == 0 or nk == 0:
        lse = np.full((hq, nq), -np.inf, dtype=t)
        if sinks is not None:
            lse[:] = sinks.astype(t)[:, None]
        return {"o": np.zeros(q.shape, t), "lse": lse, "dq": np.zeros(q.shape, t),
                "dk": np.zeros(k.shape, t), "dv": np.zeros(k.shape, t),
                "ds": np.zeros((hq, nq, nk), t), "dsinks": np.zeros(hq, t)}
    g = hq // hkv
    Q = q.astype(t).transpose(1, 0, 2)                       # [Hq, Nq, d]
    K = np.repeat(k.astype(t).transpose(1, 0, 2), g, axis=0)  # [Hq, Nk, d]
    V = np.repeat(v.astype(t).transpose(1, 0, 2), g, axis=0)
    scale = t(c["scale"])
    s = mm(Q, K.transpose(0, 2, 1)) * scale
    cap = c["softcap"]
    if cap > 0:
        th = ftanh(s / t(cap), t)
        s = t(cap) * th
    diag = np.arange(nq)[:, None] + nk - nq
    dist = np.abs(diag - np.arange(nk)[None, :]).astype(t)
    if c["alibi_slopes"] is not None:
        slopes = np.asarray(c["alibi_slopes"], dtype=t)
        s = s - slopes[:, None, None] * dist[None]
    ok = np.broadcast_to(visible(nq, nk, c["causal"], c["window"])[None], s.shape)
    if bias is not None:
        s = s + bias.astype(t)
    s = np.where(ok, s, t(-np.inf))
    # With a bias, a key whose score is -inf is hidden, and a row all of
    # whose visible scores are -inf sees no key. Without one, the mask alone
    # says which keys a row sees.
    live = ok if bias is None else ok & (s > t(-np.inf))
    seen = live.any(axis=-1)                                   # [Hq, Nq]
    m = np.where(seen, s.max(axis=-1, initial=-np.inf), t(0))
    has = seen
    if sinks is not None:
        # The sink's logit joins every row's denominator: a row with no key
        # has the sink alone (lse = sink, o = 0).
        sk = np.broadcast_to(sinks.astype(t)[:, None], m.shape)
        m = np.where(seen, np.maximum(m, sk), sk)
        has = np.ones(seen.shape, dtype=bool)
    p = np.where(live, fexp(np.where(live, s - m[..., None], t(0)), t), t(0))
    l = rowsum(p)
    if sinks is not None:
        psink = fexp(sk - m, t)
        l = l + psink
    P = p / np.where(has, l, t(1))[..., None]
    o = mm(P, V)
    lse = np.where(has, m + flog(np.where(has, l, t(1)), t), t(-np.inf))
    out = {"o": o.transpose(1, 0, 2), "lse": lse}
    if do is None:
        return out
    # Backward of sum(o * do): dP = dO V^T, dS = P (dP - rowsum(dO o)).
    dO = do.astype(t).transpose(1, 0, 2)
    dP = mm(dO, V.transpose(0, 2, 1))
    D = rowsum(dO * (o if out_dtype is None else round_to(o, out_dtype)))
    dS = P * (dP - D[..., None])
    out["ds"] = dS
    if sinks is not None:
        # The sink has no value: its dP is 0, so its dS is P_sink (0 - D).
        out["dsinks"] = rowsum(-(psink / np.where(has, l, t(1))) * D)
    if cap > 0:
        dS = dS * (t(1) - th * th)
    dQ = mm(dS, K) * scale
    dK = mm(dS.transpose(0, 2, 1), Q) * scale
    dV = mm(P.transpose(0, 2, 1), dO)
    # Query heads of one group add into their key/value head, in head order.
    dK = dK.reshape(hkv, g, nk, d)
    dV = dV.reshape(hkv, g, nk, d)
    dKs, dVs = dK[:, 0].copy(), dV[:, 0].copy()
    for h in range(1, g):
        dKs += dK[:, h]
        dVs += dV[:, h]
    out.update(dq=dQ.transpose(1, 0, 2), dk=dKs.transpose(1, 0, 2), dv=dVs.transpose(1, 0, 2))
    return out


# ---------------------------------------------------------------------------
# Cases: sequences, the KV cache, the score terms
# ---------------------------------------------------------------------------

def paged(c):
    return bool(c.get("page_size"))


def has_cache(c):
    """Whether the case uses the KV cache (used lengths, pages, appended
    rows): a forward-only problem."""
    return c.get("seqused_k") is not None or paged(c)


def backward(c):
    return not has_cache(c)


def input_names(c):
    names = ["q", "k", "v"]
    if backward(c):
        names.append("do")
    if c.get("seqlen_new"):
        names += ["k_new", "v_new"]
    if c.get("bias_shape") is not None:
        names.append("bias")
    return names


def output_names(c):
    names = ["o", "lse"]
    if backward(c):
        names += ["dq", "dk", "dv"]
        if c.get("bias_shape") is not None:
            names.append("dbias")
        if c.get("sinks") is not None:
            names.append("dsinks")
    return names


def input_dtype(c, name):
    return c["bias_dtype"] if name == "bias" else c["dtype"]


def sequences(c):
    """(q rows, k rows) slices of each sequence, in the stored layout flattened
    to rows; k rows are None for a paged cache (cache_row says where its rows
    are)."""
    nq, nk = c["seqlen_q"], c["seqlen_k"]
    if c["layout"] == "varlen":
        cq = c["cu_seqlens_q"]
        qs = [slice(cq[b], cq[b + 1]) for b in range(c["batch"])]
    else:
        qs = [slice(b * nq, (b + 1) * nq) for b in range(c["batch"])]
    if paged(c):
        return [(sq, None) for sq in qs]
    if c["layout"] == "varlen":
        ck = c["cu_seqlens_k"]
        return [(sq, slice(ck[b], ck[b + 1])) for b, sq in enumerate(qs)]
    return [(sq, slice(b * nk, (b + 1) * nk)) for b, sq in enumerate(qs)]


def capacity(c, b):
    """Key rows the cache holds for sequence b."""
    if paged(c):
        return len(c["block_table"][b]) * c["page_size"]
    if c["layout"] == "varlen":
        return c["cu_seqlens_k"][b + 1] - c["cu_seqlens_k"][b]
    return c["seqlen_k"]


def used(c, b):
    """The cache rows sequence b holds before the call's appended rows."""
    return c["seqused_k"][b] if c.get("seqused_k") is not None else capacity(c, b)


def cache_row(c, b, j):
    """Where key row j of sequence b lies in the stored k (an index tuple):
    through the block table when paged."""
    if paged(c):
        ps = c["page_size"]
        return (c["block_table"][b][j // ps], j % ps)
    if c["layout"] == "varlen":
        return (c["cu_seqlens_k"][b] + j,)
    return (b, j)


def sequence_keys(c, x, b, name):
    """Sequence b's keys (name "k") or values ("v") as the call sees them,
    [Nk, Hkv, d]: the used cache rows, then the appended ones."""
    hkv, d = c["heads_kv"], c["head_dim"]
    rows = [x[name][cache_row(c, b, j)] for j in range(used(c, b))]
    out = np.stack(rows) if rows else np.zeros((0, hkv, d), x[name].dtype)
    if c.get("seqlen_new"):
        out = np.concatenate([out, x[name + "_new"][b]])
    return out


def cache_after(c, stored, name):
    """The stored k or v after the call: the appended rows copied into the
    cache at rows used .. used + seqlen_new - 1 of each sequence."""
    out = stored[name].copy()
    for b in range(c["batch"]):
        for r in range(c["seqlen_new"]):
            out[cache_row(c, b, used(c, b) + r)] = stored[name + "_new"][b, r]
    return out


def bias_of(c, x, b, nq, nk):
    """Sequence b's bias [H|1, Nq|1, Nk] (broadcast dimensions of size 1), or
    None."""
    if c.get("bias_shape") is None:
        return None
    bias = x["bias"]
    bb = bias[b if bias.shape[0] > 1 else 0]
    return bb[:, :nq if bb.shape[1] > 1 else 1, :nk]


def add_dbias(dbias, c, b, ds):
    """Adds sequence b's dS [Hq, Nq, Nk] into dbias, summed over the bias's
    broadcast dimensions in index order."""
    hb, qb = dbias.shape[1], dbias.shape[2]
    nq, nk = ds.shape[1], ds.shape[2]
    if hb == 1:
        acc = ds[0:1].copy()
        for h in range(1, ds.shape[0]):
            acc += ds[h:h + 1]
        ds = acc
    if qb == 1 and nq > 0:
        acc = ds[:, 0:1].copy()
        for i in range(1, nq):
            acc += ds[:, i:i + 1]
        ds = acc
    dbias[b if dbias.shape[0] > 1 else 0, :, :ds.shape[1], :nk] += ds


def run_case(c, x, t, out_dtype=None):
    """x: dict of input values (float32 arrays, stored shapes). Returns the
    outputs in the stored shapes, precision t."""
    hq, hkv, d = c["heads_q"], c["heads_kv"], c["head_dim"]
    q = x["q"].reshape(-1, hq, d)
    do = x["do"].reshape(-1, hq, d) if backward(c) else None
    k, v = x["k"].reshape(-1, hkv, d), x["v"].reshape(-1, hkv, d)
    sinks = np.asarray(c["sinks"], dtype=F64) if c.get("sinks") is not None else None
    o, dq = np.zeros(q.shape, t), np.zeros(q.shape, t)
    dk, dv = np.zeros(k.shape, t), np.zeros(k.shape, t)
    lse = np.zeros((hq, q.shape[0]), t)
    dbias = np.zeros(c["bias_shape"], t) if c.get("bias_shape") is not None else None
    dsinks = np.zeros(hq, t)
    for b, (sq, sk) in enumerate(sequences(c)):
        if has_cache(c):
            kb, vb = sequence_keys(c, x, b, "k"), sequence_keys(c, x, b, "v")
        else:
            kb, vb = k[sk], v[sk]
        nq = sq.stop - sq.start
        r = attention(q[sq], kb, vb, None if do is None else do[sq], c, t, out_dtype,
                      bias_of(c, x, b, nq, kb.shape[0]), sinks)
        o[sq], lse[:, sq] = r["o"], r["lse"]
        if do is not None:
            dq[sq], dk[sk], dv[sk] = r["dq"], r["dk"], r["dv"]
            if dbias is not None:
                add_dbias(dbias, c, b, r["ds"])
            if sinks is not None:
                dsinks += r["dsinks"]
    if c["layout"] == "bshd":
        b, nq = c["batch"], c["seqlen_q"]
        lse = lse.reshape(hq, b, nq).transpose(1, 0, 2)
    out = {"o": o.reshape(x["q"].shape), "lse": np.ascontiguousarray(lse)}
    if do is not None:
        out.update(dq=dq.reshape(x["q"].shape), dk=dk.reshape(x["k"].shape),
                   dv=dv.reshape(x["k"].shape))
        if dbias is not None:
            out["dbias"] = dbias
        if sinks is not None:
            out["dsinks"] = dsinks
    return out


def max_err(got, ref):
    fin = np.isfinite(ref)
    if not fin.any():
        return 0.0
    return float(np.max(np.abs(got[fin].astype(F64) - ref[fin])))


def peer_figures(c, x, ref):
    """The naive float32 peer (f32 cases) or its emulation in the case's dtype."""
    out = run_case(c, x, F32, None if c["dtype"] == "f32" else c["dtype"])
    if c["dtype"] == "f32":
        fig = {n: max_err(out[n], ref[n]) for n in output_names(c)}
        fig["peer"] = PEER_F32
        return fig
    # o, dq, dk, dv are outputs in the dtype; dbias and dsinks are float32
    # whatever the inputs are.
    dt = c["dtype"]
    fig = {n: max_err(round_to(out[n], dt) if n in ("o", "dq", "dk", "dv") else out[n], ref[n])
           for n in output_names(c) if n != "lse"}
    fig["peer"] = PEER_EMU % (dt, dt, dt)
    return fig


# ---------------------------------------------------------------------------
# The cases made here
# ---------------------------------------------------------------------------

def f32exact(x):
    return float(F32(x))


def shapes(c):
    """The stored shapes of q and of k: a paged k is [pages, page_size, Hkv, d]
    whatever q's layout."""
    hq, hkv, d = c["heads_q"], c["heads_kv"], c["head_dim"]
    b = c["batch"]
    if c["layout"] == "varlen":
        qs = (c["cu_seqlens_q"][-1], hq, d)
    else:
        qs = (b, c["seqlen_q"], hq, d)
    if paged(c):
        return qs, (c["num_pages"], c["page_size"], hkv, d)
    if c["layout"] == "varlen":
        return qs, (c["cu_seqlens_k"][-1], hkv, d)
    return qs, (b, c["seqlen_k"], hkv, d)


def normal_inputs(c, rng):
    qs, ks = shapes(c)
    return {"q": rng.standard_normal(qs), "k": rng.standard_normal(ks),
            "v": rng.standard_normal(ks), "do": rng.standard_normal(qs)}


def scaled_inputs(f):
    """Normal inputs with q and k multiplied by f: scores spread over
    about f * f * sqrt(d) * scale."""
    def make(c, rng):
        x = normal_inputs(c, rng)
        x["q"], x["k"] = x["q"] * f, x["k"] * f
        return x
    return make


def large_logit_inputs(target, ties=False):
    """Scores reaching |s| ~ target. Most rows are random, their top two
    keys at least 6 apart (at this size their softmax is one key); rows 1 and 3 of every 8 put a second key
    6..20 below the first (near one-hot: a naive float32 softmax gets these
    right to float32 precision, a rounded lse shifts every probability of the
    row); row 5 of every 8 has small scores (|s| ~ target/100). With ties, row
    7 of every 8 puts two keys within 0..1 of each other at the top: there
    every float32 implementation errs by about ulp(s), which hides the near
    one-hot rows' error behind a larger peer figure, so ties get cases of
    their own."""
    def make(c, rng):
        qs, ks = shapes(c)
        q, k = rng.standard_normal(qs), rng.standard_normal(ks)
        b, nq, h, d = qs
        nk = ks[1]
        kinds = {}
        for i in range(nq):
            if i % 8 in (1, 3):
                kinds[i] = float(rng.uniform(6.0, 20.0))
            elif i % 8 == 5:
                q[:, i] *= 0.01
            elif i % 8 == 7 and ties:
                kinds[i] = float(rng.uniform(0.0, 1.0))
        # The rows that pair keys aim at a key; the scale follows from the
        # largest score, then each partner key is placed at the chosen gap.
        plans = []
        for bb in range(b):
            for hh in range(h):
                free = list(range(nk))
                rng.shuffle(free)
                for i, gap in kinds.items():
                    lim = i + nk - nq if c["causal"] else nk - 1
                    pick = [j for j in free if j <= lim][:2]
                    if len(pick) < 2:
                        continue
                    a, p = pick
                    free.remove(a)
                    free.remove(p)
                    ka = k[bb, a, hh]
                    q[bb, i, hh] = 3.0 * ka / np.linalg.norm(ka) + 0.3 * rng.standard_normal(d)
                    plans.append((bb, hh, i, a, p, gap))
        q, k = q.astype(F32).astype(F64), k.astype(F32).astype(F64)
        dots = mm(q.transpose(0, 2, 1, 3), k.transpose(0, 2, 3, 1))
        scale = f32exact(target / np.abs(dots).max())
        for bb, hh, i, a, p, gap in plans:
            qi = q[bb, i, hh]
            k[bb, p, hh] = k[bb, a, hh] - (gap / scale) * qi / np.dot(qi, qi)
        # A random row whose top two keys happen to lie within 6 of each other
        # is a tie: draw it again.
        ok = visible(nq, nk, c["causal"], c["window"])
        for _ in range(100):
            sc = mm(q.transpose(0, 2, 1, 3), k.transpose(0, 2, 3, 1)) * scale
            top2 = -np.sort(-np.where(ok, sc, -np.inf), axis=-1)[..., :2]
            bad = [(bb, hh, i) for bb in range(b) for hh in range(h) for i in range(nq)
                   if i not in kinds and i % 8 != 5 and top2[bb, hh, i, 0] - top2[bb, hh, i, 1] < 6.0]
            if not bad:
                break
            for bb, hh, i in bad:
                q[bb, i, hh] = rng.standard_normal(d).astype(F32)
        c["scale"] = scale
        return {"q": q, "k": k, "v": rng.standard_normal(ks), "do": rng.standard_normal(qs)}
    return make


def block_table(c, rng):
    """A shuffled block table: each sequence's pages are drawn without repeats
    from a permutation of the pages, leaving some that no sequence uses; the
    columns past a sequence's last page name random pages (never read)."""
    ps, npg = c["page_size"], c["num_pages"]
    order = [int(p) for p in rng.permutation(npg)]
    table = []
    for b in range(c["batch"]):
        n = c["max_pages"]
        if c.get("seqused_k") is not None:
            n = -(-(c["seqused_k"][b] + c.get("seqlen_new", 0)) // ps)
        if n > len(order):
            raise SystemExit("gen.py: %s has too few pages" % c["name"])
        row, order = order[:n], order[n:]
        table.append(row + [int(p) for p in rng.integers(0, npg, c["max_pages"] - n)])
    if not order:
        raise SystemExit("gen.py: %s should keep pages that no sequence uses" % c["name"])
    return table


def normal_bias(c, rng, shape):
    return rng.standard_normal(shape)


def bias_hiding(fraction, rows_hidden=(), rows_seeing_none=()):
    """A normal bias with about `fraction` of its entries -inf; each row of
    rows_hidden is -inf at every key, and each row i of rows_seeing_none at
    keys 0..i (those a causal row of a square problem sees) but finite past
    them: a row is empty by its visible keys alone."""
    def make(c, rng, shape):
        bias = rng.standard_normal(shape)
        bias[rng.random(shape) < fraction] = -np.inf
        for i in rows_seeing_none:
            bias[..., i, :i + 1] = -np.inf
            bias[..., i, i + 1:] = np.where(np.isinf(bias[..., i, i + 1:]), 1.0,
                                            bias[..., i, i + 1:])
        for i in rows_hidden:
            bias[..., i, :] = -np.inf
        return bias
    return make


def feature_inputs(bias=normal_bias):
    """Normal inputs for a case with a KV cache or score terms: q, k and v
    (a cache's rows past the used ones and its unused pages hold normal
    values too, which a wrong read would mix in), do for a backward case,
    the appended rows, and the bias drawn by bias(c, rng, shape)."""
    def make(c, rng):
        if paged(c):
            c["block_table"] = block_table(c, rng)
        qs, ks = shapes(c)
        x = {"q": rng.standard_normal(qs), "k": rng.standard_normal(ks),
             "v": rng.standard_normal(ks)}
        if backward(c):
            x["do"] = rng.standard_normal(qs)
        if c.get("seqlen_new"):
            ns = (c["batch"], c["seqlen_new"], c["heads_kv"], c["head_dim"])
            x["k_new"], x["v_new"] = rng.standard_normal(ns), rng.standard_normal(ns)
        if c.get("bias_shape") is not None:
            x["bias"] = bias(c, rng, tuple(c["bias_shape"]))
        return x
    return make


def case(name, seed, make=normal_inputs, dtype="f32", layout="bshd", batch=1, seqlen_q=None,
         seqlen_k=None, heads_q=2, heads_kv=None, head_dim=64, scale=None, causal=False,
         window=(-1, -1), softcap=0.0, alibi_slopes=None, seqlens=None, seqused_k=None,
         seqlen_new=0, pages=None, bias_shape=None, bias_dtype="f32", sinks=None):
    """seqlens: for varlen, [(Nq, Nk), ...] per sequence ([Nq, ...] when
    paged). pages: (page_size, max_pages, num_pages); the block table is
    drawn from the seed. bias_shape: [B|1, Hq|1, Nq|1, Nk]."""
    cq = ck = None
    if layout == "varlen":
        cq, ck = [0], [0]
        for sl in seqlens:
            a, b = (sl, 0) if pages else sl
            cq.append(cq[-1] + a)
            ck.append(ck[-1] + b)
        batch = len(seqlens)
        if pages:
            ck = None
    if pages and layout == "bshd":
        seqlen_k = pages[0] * pages[1]
    c = {"name": name, "layout": layout, "dtype": dtype, "batch": batch,
         "seqlen_q": seqlen_q, "seqlen_k": seqlen_k, "heads_q": heads_q,
         "heads_kv": heads_kv or heads_q, "head_dim": head_dim,
         "scale": scale if scale is not None else f32exact(1.0 / np.sqrt(head_dim)),
         "causal": causal, "window": list(window), "softcap": softcap,
         "alibi_slopes": alibi_slopes, "cu_seqlens_q": cq, "cu_seqlens_k": ck, "seed": seed}
    # The features below are written to case.json only when they are on.
    if seqused_k is not None:
        c["seqused_k"] = list(seqused_k)
    if seqlen_new:
        c["seqlen_new"] = seqlen_new
    if pages:
        c["page_size"], c["max_pages"], c["num_pages"] = pages
        c["block_table"] = None  # drawn by the case's make
    if bias_shape is not None:
        c["bias_dtype"], c["bias_shape"] = bias_dtype, list(bias_shape)
    if sinks is not None:
        c["sinks"] = [f32exact(v) for v in sinks]
    return c, make


GENERATED = [
    # Each case is small (issue 9: a few MB in all; large shapes belong in the
    # randomized tests) but keeps what it exercises: the layout, dtype, mask,
    # head dimension and how Nq relates to Nk. vit_b16, varlen_causal and the
    # large-logit cases span more than one 64-row tile.
    case("tiny", 10, batch=3, seqlen_q=1, seqlen_k=3, heads_q=1, head_dim=8),
    # ViT-B/16's 197 tokens (not a multiple of any tile) at d 64.
    case("vit_b16", 1, seqlen_q=197, seqlen_k=197, heads_q=1, head_dim=64),
    case("causal_square", 2, batch=2, seqlen_q=40, seqlen_k=40, heads_q=1, head_dim=32,
         causal=True),
    # Nq < Nk without a mask, causal with Nq < Nk (every row sees a prefix
    # that ends past its index) and with Nq > Nk (the first Nq - Nk rows see
    # no key).
    case("cross_rect", 3, batch=2, seqlen_q=9, seqlen_k=40, heads_q=1, head_dim=64),
    case("causal_rect", 4, seqlen_q=20, seqlen_k=48, heads_q=1, head_dim=64, causal=True),
    case("causal_more_q", 5, seqlen_q=48, seqlen_k=20, heads_q=1, head_dim=64, causal=True),
    case("gqa_causal", 6, seqlen_q=12, seqlen_k=12, heads_q=4, heads_kv=1, head_dim=128,
         causal=True),
    case("window_left", 7, seqlen_q=48, seqlen_k=48, heads_q=1, head_dim=64, window=(20, 0)),
    case("window_both", 8, seqlen_q=48, seqlen_k=48, heads_q=1, head_dim=48, window=(12, 6)),
    case("d256", 9, seqlen_q=12, seqlen_k=12, heads_q=1, head_dim=256),
    # Scores of several hundred: q and k drawn 20 times larger.
    case("big_logits", 11, scaled_inputs(20.0), seqlen_q=40, seqlen_k=40, heads_q=1,
         head_dim=64),
    case("softcap", 12, seqlen_q=40, seqlen_k=40, heads_q=1, head_dim=64, softcap=30.0),
    case("alibi_causal", 13, seqlen_q=12, seqlen_k=12, heads_q=4, head_dim=64, causal=True,
         alibi_slopes=[0.25, 0.0625, 0.015625, 0.00390625]),
    # Sequences of 5, 66 (two tiles) and 3 rows.
    case("varlen_causal", 14, layout="varlen", heads_q=1, head_dim=64, causal=True,
         seqlens=[(5, 5), (66, 66), (3, 3)]),
    # Decoding: one query over many keys, one key/value head.
    case("decode_mqa", 15, seqlen_q=1, seqlen_k=48, heads_q=4, heads_kv=1, head_dim=128),
    case("bf16_mha", 16, dtype="bf16", seqlen_q=16, seqlen_k=16, heads_q=2, head_dim=128),
    case("f16_causal", 17, dtype="f16", seqlen_q=48, seqlen_k=48, heads_q=1, head_dim=64,
         causal=True),
    # Large logits: the float32 rounding of lse (ulp(1e3) = 6e-5, ulp(1e4) =
    # 1e-3) enters every exp(s - lse) of the backward pass.
    case("logits_1e3_ties", 114, large_logit_inputs(1e3, ties=True), seqlen_q=128,
         seqlen_k=128, head_dim=32),
    case("logits_1e4_ties", 115, large_logit_inputs(1e4, ties=True), seqlen_q=128,
         seqlen_k=128, head_dim=32),
    case("logits_1e3", 101, large_logit_inputs(1e3), seqlen_q=128, seqlen_k=128, head_dim=32),
    case("logits_1e3_causal", 102, large_logit_inputs(1e3), seqlen_q=128, seqlen_k=128,
         head_dim=32, causal=True),
    case("logits_1e4", 103, large_logit_inputs(1e4), seqlen_q=128, seqlen_k=128, head_dim=32),
    case("logits_1e4_causal", 104, large_logit_inputs(1e4), seqlen_q=128, seqlen_k=128,
         head_dim=32, causal=True),
    # An empty query sequence, an empty key sequence (its rows see no key),
    # causal with more queries than keys (the first rows see no key), length 1.
    case("varlen_empty", 105, layout="varlen", heads_q=2, heads_kv=1, head_dim=32, causal=True,
         seqlens=[(0, 10), (7, 0), (16, 24), (20, 12), (1, 1)]),
    # A window with keys fewer than queries: rows 0..54 see no key.
    case("window_no_key", 106, seqlen_q=100, seqlen_k=40, heads_q=1, head_dim=32, window=(5, 5)),
    case("window_causal_gqa", 107, batch=2, seqlen_q=24, seqlen_k=24, heads_q=3, heads_kv=1,
         head_dim=32, causal=True, window=(8, -1)),
    case("softcap_alibi", 108, seqlen_q=20, seqlen_k=36, heads_q=4, head_dim=32, softcap=20.0,
         alibi_slopes=[0.5, 0.125, 0.03125, 0.0078125]),
    # bf16 at the head dimensions the kernels special-case least.
    case("bf16_d1", 109, dtype="bf16", batch=2, seqlen_q=64, seqlen_k=64, head_dim=1),
    case("bf16_d80", 110, dtype="bf16", seqlen_q=48, seqlen_k=48, heads_q=1, head_dim=80,
         causal=True),
    case("bf16_d96", 111, dtype="bf16", seqlen_q=20, seqlen_k=48, heads_q=1, head_dim=96),
    case("bf16_d256", 112, dtype="bf16", seqlen_q=16, seqlen_k=16, heads_q=1, head_dim=256,
         causal=True),
    # Decoding: one query over many keys, one key/value head.
    case("decode_mqa_f16", 113, dtype="f16", seqlen_q=1, seqlen_k=100, heads_q=8, heads_kv=1,
         head_dim=64),
    # The inference path (issue 11): KV caches (forward only), the bias and
    # sinks (forward and backward).
    # Decoding over caches of 40 rows of which 17, 40, 0 (the row sees no
    # key) and 33 are used; GQA 4 on 2.
    case("kvcache_decode", 201, feature_inputs(), batch=4, seqlen_q=1, seqlen_k=40, heads_q=4,
         heads_kv=2, head_dim=32, seqused_k=[17, 40, 0, 33]),
    # Three rows appended to caches of 5 and 21 used rows out of 24 (the
    # second ends full), causal against 8 and 24 keys.
    case("kvcache_append_causal", 202, feature_inputs(), batch=2, seqlen_q=3, seqlen_k=24,
         heads_q=4, heads_kv=1, head_dim=32, causal=True, seqused_k=[5, 21], seqlen_new=3),
    # Pages of one row, 20 per sequence, every one used (no seqused_k), from
    # 48 shuffled pages.
    case("paged_p1", 203, feature_inputs(), batch=2, seqlen_q=4, heads_q=2, head_dim=32,
         causal=True, pages=(1, 20, 48)),
    # Pages of 3 rows, two rows appended through the table: across a page
    # boundary (5 used), into an empty cache, into a fresh page (15 used);
    # a sliding window.
    case("paged_p3_append", 204, feature_inputs(), batch=3, seqlen_q=2, heads_q=2, heads_kv=1,
         head_dim=16, window=(5, 0), seqused_k=[5, 0, 15], seqlen_new=2, pages=(3, 6, 14)),
    # Pages of 16 rows under varlen queries of 5, 0, 9 and 1 rows over 40,
    # 12, 3 and 48 keys, causal: the third sequence's rows 0..5 see no key.
    case("paged_p16_varlen_q", 205, feature_inputs(), layout="varlen", seqlens=[5, 0, 9, 1],
         heads_q=2, head_dim=32, causal=True, seqused_k=[40, 12, 3, 48], pages=(16, 3, 11)),
    # f16 decoding over pages of 64 rows, 8 query heads on 2.
    case("paged_p64_gqa_decode", 206, feature_inputs(), dtype="f16", batch=2, seqlen_q=1,
         heads_q=8, heads_kv=2, head_dim=32, seqused_k=[130, 64], pages=(64, 3, 6)),
    # A bias of every dimension; one broadcast over heads, in bf16.
    case("bias_full_f32", 207, feature_inputs(), batch=2, seqlen_q=12, seqlen_k=20, heads_q=2,
         head_dim=32, bias_shape=[2, 2, 12, 20]),
    case("bias_broadcast_heads_bf16", 208, feature_inputs(), dtype="bf16", batch=2, seqlen_q=16,
         seqlen_k=24, heads_q=4, heads_kv=2, head_dim=32, bias_shape=[2, 1, 16, 24],
         bias_dtype="bf16"),
    # -inf in a quarter of a bias shared by batch and heads, with causal:
    # rows 0 and 5 hide every key they see (not those past the diagonal),
    # row 9 every key; they see no key.
    case("bias_neg_inf_rows", 209, feature_inputs(bias_hiding(0.25, (9,), (0, 5))), batch=2,
         seqlen_q=16, seqlen_k=16, heads_q=2, head_dim=32, causal=True,
         bias_shape=[1, 1, 16, 16]),
    # The bias after softcap and ALiBi, one row of it per head.
    case("bias_alibi_softcap", 210, feature_inputs(), seqlen_q=10, seqlen_k=24, heads_q=4,
         head_dim=32, softcap=20.0, alibi_slopes=[0.5, 0.125, 0.03125, 0.0078125],
         bias_shape=[1, 4, 1, 24]),
    case("sinks_causal", 211, feature_inputs(), seqlen_q=16, seqlen_k=16, heads_q=4,
         heads_kv=2, head_dim=32, causal=True, sinks=[-1.0, 0.5, 2.0, 4.0]),
    # A window (3, 3) with Nq = 24 > Nk = 12: rows 0..8 see no key, their lse
    # is the sink.
    case("sinks_no_key_rows", 212, feature_inputs(), seqlen_q=24, seqlen_k=12, heads_q=2,
         head_dim=32, window=(3, 3), sinks=[0.25, -2.0]),
    # Sinks and a bf16 bias (f32 inputs) broadcast over heads and rows, a
    # few keys hidden; GQA 4 on 1.
    case("sinks_bias_gqa_backward", 213, feature_inputs(bias_hiding(0.15)), batch=2,
         seqlen_q=12, seqlen_k=20, heads_q=4, heads_kv=1, head_dim=32, bias_shape=[2, 1, 1, 20],
         bias_dtype="bf16", sinks=[1.5, -0.5, 0.0, 3.0]),
    # A bias over a cache's capacity (32 keys) and sinks, with 10, 32 and 0
    # used rows: the empty cache's rows have lse = sink.
    case("kvcache_bias_sinks", 214, feature_inputs(), batch=3, seqlen_q=2, seqlen_k=32,
         heads_q=2, head_dim=32, causal=True, seqused_k=[10, 32, 0], bias_shape=[3, 1, 1, 32],
         sinks=[0.5, -1.0]),
    # A bias of the data's dtype in 16-byte rows at head dims of the Hopper
    # forward, which brings it in by TMA: over varlen sequences of 9, 66 and
    # 1 query rows, causal, a tenth of it -inf (bf16, d 64); over the keys
    # alone, a row of one (f16, d 128).
    case("bias_varlen_bf16_d64", 215, feature_inputs(bias_hiding(0.1)), dtype="bf16",
         layout="varlen", heads_q=2, heads_kv=1, head_dim=64, causal=True,
         seqlens=[(9, 24), (66, 72), (1, 8)], bias_shape=[3, 2, 66, 72], bias_dtype="bf16"),
    case("bias_keys_f16_d128", 216, feature_inputs(), dtype="f16", batch=2, seqlen_q=40,
         seqlen_k=48, heads_q=1, head_dim=128, causal=True, bias_shape=[2, 1, 1, 48],
         bias_dtype="f16"),
]


# ---------------------------------------------------------------------------
# Reading and writing case folders
# ---------------------------------------------------------------------------

PARAMS = ("name", "layout", "dtype", "batch", "seqlen_q", "seqlen_k", "heads_q", "heads_kv",
          "head_dim", "scale", "causal", "window", "softcap", "alibi_slopes", "cu_seqlens_q",
          "cu_seqlens_k", "seed")
# Written only when on: a case without them is what it was before them.
FEATURES = ("seqused_k", "seqlen_new", "page_size", "max_pages", "num_pages", "block_table",
            "bias_dtype", "bias_shape", "sinks")


def case_params(c):
    meta = {key: c[key] for key in PARAMS}
    meta.update((key, c[key]) for key in FEATURES if key in c)
    return meta


def write_case(folder, c, stored, ref, peer, carried):
    os.makedirs(folder, exist_ok=True)
    for n in input_names(c):
        np.save(os.path.join(folder, n + ".npy"), stored[n])
    for n in output_names(c):
        np.save(os.path.join(folder, n + ".npy"), ref[n].astype(F32))
    for n in CACHE_OUTPUTS:
        if n in ref:
            np.save(os.path.join(folder, n + ".npy"), ref[n])
    meta = case_params(c)
    meta["sdpa_fp64_max_diff"] = carried.get("sdpa_fp64_max_diff")
    meta["reference"] = REFERENCE
    meta["peer_max_err"] = carried.get("peer_max_err", peer)
    with open(os.path.join(folder, "case.json"), "w") as f:
        json.dump(meta, f, indent=1)


def gpu_measured(folder, c, stored):
    """What only a GPU run of --torch measured (the SDPA float64 difference,
    the f16/bf16 peer), from the case.json in folder, when that case has the
    same parameters and the same input bytes: those figures still hold."""
    path = os.path.join(folder, "case.json")
    if not os.path.exists(path):
        return {}
    with open(path) as f:
        meta = json.load(f)
    want = json.loads(json.dumps(case_params(c)))
    if any(meta.get(key) != want.get(key) for key in PARAMS + FEATURES):
        return {}
    for n in input_names(c):
        npy = os.path.join(folder, n + ".npy")
        if not os.path.exists(npy) or not np.array_equal(np.load(npy), stored[n]):
            return {}
    keep = {}
    if meta.get("sdpa_fp64_max_diff") is not None:
        keep["sdpa_fp64_max_diff"] = meta["sdpa_fp64_max_diff"]
    peer = meta.get("peer_max_err") or {}
    if c["dtype"] != "f32" and str(peer.get("peer", "")).startswith("torch"):
        keep["peer_max_err"] = peer
    return keep


def generate(out_dir, committed_dir, quiet=False):
    """Writes every case under out_dir, keeping the GPU-measured figures of
    committed_dir's cases whose inputs have not changed."""
    for gc, mk in GENERATED:
        c = dict(gc)
        x64 = mk(c, np.random.default_rng(c["seed"]))
        stored = {n: to_bits(x64[n].astype(F32), input_dtype(c, n)) for n in input_names(c)}
        carried = gpu_measured(os.path.join(committed_dir, c["name"]), c, stored)
        x = {n: from_bits(stored[n], input_dtype(c, n)) for n in input_names(c)}
        ref = run_case(c, x, F64)
        peer = peer_figures(c, x, ref)
        if c.get("seqlen_new"):
            ref["k_out"], ref["v_out"] = cache_after(c, stored, "k"), cache_after(c, stored, "v")
        write_case(os.path.join(out_dir, c["name"]), c, stored, ref, peer, carried)
        if not quiet:
            fin = np.isfinite(ref["lse"])
            smax = float(np.abs(ref["lse"][fin]).max()) if fin.any() else 0.0
            print("%-26s max|lse| %-9.4g%s" % (c["name"], smax,
                                               "  (GPU figures kept)" if carried else ""))


# ---------------------------------------------------------------------------
# PyTorch: the float64 cross-check and the f16/bf16 peer
# ---------------------------------------------------------------------------

def torch_pass(cases_dir):
    import torch
    import torch.nn.functional as Fn

    if not torch.cuda.is_available():
        raise SystemExit("gen.py --torch: no CUDA device")
    tdt = {"f16": torch.float16, "bf16": torch.bfloat16}

    def sdpa(c, x, dtype, device):
        """SDPA per sequence with the visibility mask and ALiBi as an additive
        float mask; returns outputs in the stored shapes (float64)."""
        hq, hkv, d = c["heads_q"], c["heads_kv"], c["head_dim"]
        q = torch.tensor(x["q"].reshape(-1, hq, d), dtype=torch.float64)
        do = torch.tensor(x["do"].reshape(-1, hq, d), dtype=torch.float64)
        k = torch.tensor(x["k"].reshape(-1, hkv, d), dtype=torch.float64)
        v = torch.tensor(x["v"].reshape(-1, hkv, d), dtype=torch.float64)
        out = {n: torch.zeros_like(a) for n, a in (("o", q), ("dq", q), ("dk", k), ("dv", k))}
        for sq, sk in sequences(c):
            nq, nk = sq.stop - sq.start, sk.stop - sk.start
            if nq == 0 or nk == 0:
                continue
            ok = torch.tensor(visible(nq, nk, c["causal"], c["window"]))
            bias = torch.zeros(hq, nq, nk, dtype=torch.float64)
            if c["alibi_slopes"] is not None:
                diag = torch.arange(nq)[:, None] + nk - nq
                dist = (diag - torch.arange(nk)[None, :]).abs().to(torch.float64)
                bias = bias - torch.tensor(c["alibi_slopes"], dtype=torch.float64)[:, None,
                                                                                   None] * dist
            bias = bias.masked_fill(~ok, float("-inf"))
            seen = ok.any(dim=1)
            # Rows that see no key are the library's own rule; SDPA is held
            # to the others (its value there is not part of the contract).
            bias[:, ~seen, :] = 0
            args = [a[s].transpose(0, 1).unsqueeze(0).to(device=device, dtype=dtype)
                    .requires_grad_(True) for a, s in ((q, sq), (k, sk), (v, sk))]
            # As a user would call it: no mask where every key is visible,
            # is_causal where the causal mask is SDPA's own (square).
            plain = c["alibi_slopes"] is None and list(c["window"]) == [-1, -1]
            mask, is_causal = bias.to(device, dtype), False
            if plain and not c["causal"]:
                mask = None
            elif plain and nq == nk:
                mask, is_causal = None, True
            o = Fn.scaled_dot_product_attention(*args, attn_mask=mask, is_causal=is_causal,
                                                scale=c["scale"], enable_gqa=hq != hkv)
            keep = seen.to(device)[None, None, :, None]
            g = do[sq].transpose(0, 1).unsqueeze(0).to(device=device, dtype=dtype)
            o.backward(g * keep)
            out["o"][sq] = (o * keep).detach()[0].transpose(0, 1).double().cpu()
            out["dq"][sq] = (args[0].grad * keep)[0].transpose(0, 1).double().cpu()
            out["dk"][sk] = args[1].grad[0].transpose(0, 1).double().cpu()
            out["dv"][sk] = args[2].grad[0].transpose(0, 1).double().cpu()
        like = {"o": "q", "dq": "q", "dk": "k", "dv": "k"}
        return {n: out[n].reshape(x[like[n]].shape).numpy() for n in out}

    for name in sorted(os.listdir(cases_dir)):
        folder = os.path.join(cases_dir, name)
        path = os.path.join(folder, "case.json")
        if not os.path.exists(path):
            continue
        with open(path) as f:
            meta = json.load(f)
        if any(key in meta for key in FEATURES):
            # Not cross-checked yet: SDPA would need the cache gathered, the
            # bias added to its mask and the sink as an extra key.
            print(name + "  sdpa: not measured (KV cache, bias or sinks)")
            continue
        x = {n: from_bits(np.load(os.path.join(folder, n + ".npy")), meta["dtype"]).astype(F64)
             for n in ("q", "k", "v", "do")}
        ref = {n: np.load(os.path.join(folder, n + ".npy")).astype(F64)
               for n in ("o", "lse", "dq", "dk", "dv")}
        line = name
        if meta["softcap"] > 0:
            meta["sdpa_fp64_max_diff"] = None
            line += "  sdpa: no softcap"
        else:
            got = sdpa(meta, x, torch.float64, "cuda")
            diff = 0.0
            for n in ("o", "dq", "dk", "dv"):
                big = max(1.0, float(np.abs(ref[n]).max()))
                # The stored answer is rounded to float32: compare beyond that.
                half = 0.5 * np.spacing(np.abs(ref[n].astype(F32))).astype(F64)
                diff = max(diff, float(np.max(np.maximum(np.abs(got[n] - ref[n]) - half, 0)))
                           / big)
            meta["sdpa_fp64_max_diff"] = diff
            line += "  sdpa float64 differs by %.3g beyond float32 rounding" % diff
            if diff > 1e-9:
                print(line + "  MISMATCH", file=sys.stderr)
                raise SystemExit(1)
        peer = meta.get("peer_max_err") or {}
        if meta["dtype"] != "f32" and not str(peer.get("peer", "")).startswith("torch"):
            if meta["softcap"] > 0:
                line += "  (no torch peer: softcap)"
            else:
                got = sdpa(meta, x, tdt[meta["dtype"]], "cuda")
                fig = {n: max_err(got[n], ref[n]) for n in ("o", "dq", "dk", "dv")}
                fig["peer"] = "torch %s scaled_dot_product_attention in %s" % (
                    torch.__version__, meta["dtype"])
                meta["peer_max_err"] = fig
                line += "  peer %s" % fig
        with open(path, "w") as f:
            json.dump(meta, f, indent=1)
        print(line)


# ---------------------------------------------------------------------------

# Error figures: the f32 peer's last digits follow NumPy's float64 exp and
# log, which differ between versions; SDPA's follow the GPU's arithmetic.
FIGURE_RTOL = 1e-6


def close(a, b):
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not (
            isinstance(a, bool) or isinstance(b, bool)):
        return abs(a - b) <= FIGURE_RTOL * max(abs(a), abs(b))
    return a == b


def json_differs(fa, fb):
    """How two case.json files differ, or None: every field exactly, except
    the error figures (sdpa_fp64_max_diff, peer_max_err's numbers), which may
    differ by FIGURE_RTOL relative."""
    with open(fa) as x, open(fb) as y:
        try:
            ma, mb = json.load(x), json.load(y)
        except ValueError as e:
            return "not JSON (%s)" % e
    for key in sorted(set(ma) | set(mb)):
        if key not in ma or key not in mb:
            return "%s only in one" % key
        va, vb = ma[key], mb[key]
        if key == "sdpa_fp64_max_diff":
            ok = close(va, vb)
        elif key == "peer_max_err" and isinstance(va, dict) and isinstance(vb, dict):
            ok = set(va) == set(vb) and all(close(va[n], vb[n]) for n in va)
        else:
            ok = va == vb
        if not ok:
            return "%s: %s vs %s" % (key, json.dumps(va), json.dumps(vb))
    return None


def compare_trees(a, b):
    """What differs between the committed cases (a) and a regeneration (b):
    .npy files byte for byte, case.json field by field; missing files count."""
    bad = []
    for n in sorted(set(os.listdir(a)) | set(os.listdir(b))):
        da, db = os.path.join(a, n), os.path.join(b, n)
        if not (os.path.isdir(da) and os.path.isdir(db)):
            bad.append(n + " (only in one)")
            continue
        for f in sorted(set(os.listdir(da)) | set(os.listdir(db))):
            fa, fb = os.path.join(da, f), os.path.join(db, f)
            if not (os.path.isfile(fa) and os.path.isfile(fb)):
                bad.append(n + "/" + f + " (only in one)")
            elif f == "case.json":
                why = json_differs(fa, fb)
                if why:
                    bad.append(n + "/" + f + " (" + why + ")")
            else:
                with open(fa, "rb") as x, open(fb, "rb") as y:
                    if x.read() != y.read():
                        bad.append(n + "/" + f)
    return bad


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true",
                    help="regenerate into a temporary folder and compare with the committed cases")
    ap.add_argument("--torch", action="store_true",
                    help="after generating, cross-check with PyTorch on CUDA and measure the "
                         "f16/bf16 peer")
    ap.add_argument("--out", metavar="DIR", default=CASES_DIR, help="where to write the cases")
    a = ap.parse_args()
    if a.check:
        with tempfile.TemporaryDirectory(prefix="attn-golden-") as tmp:
            generate(tmp, CASES_DIR, quiet=True)
            bad = compare_trees(CASES_DIR, tmp)
        if bad:
            print("gen.py --check: %d file(s) differ from a regeneration:" % len(bad))
            for b in bad:
                print("  " + b)
            return 1
        print("gen.py --check: every case regenerates (arrays byte for byte, case.json field by "
              "field, error figures within %g relative)" % FIGURE_RTOL)
        return 0
    # The GPU figures are read from the committed cases before out is
    # rewritten: stage through a temporary folder, then replace out's cases
    # (a case no longer made does not linger).
    with tempfile.TemporaryDirectory(prefix="attn-golden-") as tmp:
        generate(tmp, CASES_DIR)
        os.makedirs(a.out, exist_ok=True)
        for n in os.listdir(a.out):
            if os.path.exists(os.path.join(a.out, n, "case.json")):
                shutil.rmtree(os.path.join(a.out, n))
        for n in os.listdir(tmp):
            shutil.copytree(os.path.join(tmp, n), os.path.join(a.out, n))
    if a.torch:
        torch_pass(a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
