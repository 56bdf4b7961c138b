"""Attention in float64 NumPy, the tests' reference: the semantics of attn.h
and tests/golden/README.md, written out one sequence at a time.

reference(q, k, v, ...) takes the arrays as attn does (bshd, varlen with
cu_seqlens, a KV cache with seqused_k, appended rows, pages) and returns a
dict with o, lse and, given do, dq, dk, dv, dbias and dsinks; with an append,
k_out and v_out are the cache after it.
"""

import numpy as np

F64 = np.float64


def _f64(x):
    return None if x is None else np.asarray(x).astype(F64)


def _sequence(q, k, v, do, *, scale, causal, window, softcap, slopes, bias, sinks):
    """One sequence: q [Nq, Hq, d], k, v [Nk, Hkv, d], bias [Hq, Nq, Nk] or
    None, sinks [Hq] or None. Returns o, lse and the gradients' parts."""
    nq, hq, d = q.shape
    nk, hkv = k.shape[:2]
    group = hq // hkv
    kk = np.repeat(k, group, axis=1)
    vv = np.repeat(v, group, axis=1)
    raw = scale * np.einsum("ihd,jhd->hij", q, kk)
    s = softcap * np.tanh(raw / softcap) if softcap > 0 else raw
    i = np.arange(nq)[:, None]
    j = np.arange(nk)[None, :]
    diag = i + nk - nq
    left, right = (-1 if x is None else x for x in window)
    if causal:
        right = 0 if right < 0 else min(right, 0)
    visible = np.ones((nq, nk), dtype=bool)
    if left >= 0:
        visible &= j >= diag - left
    if right >= 0:
        visible &= j <= diag + right
    if slopes is not None:
        s = s - slopes[:, None, None] * np.abs(diag - j)[None]
    if bias is not None:
        s = s + bias
    s = np.where(visible[None], s, -np.inf)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        if nk:
            lse = np.logaddexp.reduce(s, axis=-1)
        else:
            lse = np.full((hq, nq), -np.inf)
        if sinks is not None:
            lse = np.logaddexp(lse, sinks[:, None])
        p = np.exp(s - lse[..., None])
        # A row with no key (lse -inf) passes nothing, and is not NaN.
        p = np.where(np.isneginf(lse)[..., None], 0.0, p)
        o = np.einsum("hij,jhd->ihd", p, vv)
    out = {"o": o, "lse": lse}
    if do is None:
        return out
    with np.errstate(invalid="ignore", over="ignore"):
        delta = np.einsum("ihd,ihd->hi", do, o)
        dp = np.einsum("ihd,jhd->hij", do, vv)
        ds = p * (dp - delta[..., None])
        ds_raw = ds * (1 - np.tanh(raw / softcap) ** 2) if softcap > 0 else ds
        out["dq"] = scale * np.einsum("hij,jhd->ihd", ds_raw, kk)
        dk = scale * np.einsum("hij,ihd->jhd", ds_raw, q)
        dv = np.einsum("hij,ihd->jhd", p, do)
        out["dk"] = dk.reshape(nk, hkv, group, d).sum(axis=2)
        out["dv"] = dv.reshape(nk, hkv, group, d).sum(axis=2)
        out["dbias"] = ds
        if sinks is not None:
            psink = np.where(np.isneginf(lse), 0.0, np.exp(sinks[:, None] - lse))
            out["dsinks"] = -(psink * delta).sum(axis=1)
    return out


def reference(
    q,
    k,
    v,
    do=None,
    *,
    scale=None,
    causal=False,
    window=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    bias=None,
    sinks=None,
    cu_seqlens_q=None,
    cu_seqlens_k=None,
    seqused_k=None,
    k_new=None,
    v_new=None,
    block_table=None,
):
    q, k, v, do = _f64(q), _f64(k), _f64(v), _f64(do)
    slopes, sinks, bias = _f64(alibi_slopes), _f64(sinks), _f64(bias)
    varlen = q.ndim == 3
    hq, d = q.shape[-2:]
    scale = 1 / np.sqrt(d) if scale is None else scale
    paged = block_table is not None
    if varlen:
        cu_q = np.asarray(cu_seqlens_q)
        batch = len(cu_q) - 1
    else:
        batch = q.shape[0]
    # The cache after the append (and the source of every key row).
    k_out, v_out = k.copy(), v.copy()

    def key_rows(b, n):
        """Where key rows 0..n-1 of sequence b are: index arrays into k."""
        rows = np.arange(n)
        if paged:
            ps = k.shape[1]
            return (np.asarray(block_table)[b][rows // ps], rows % ps)
        if varlen:
            return (np.asarray(cu_seqlens_k)[b] + rows,)
        return (np.full(n, b), rows)

    def capacity(b):
        if paged:
            return np.asarray(block_table).shape[1] * k.shape[1]
        if varlen:
            return int(cu_seqlens_k[b + 1] - cu_seqlens_k[b])
        return k.shape[1]

    o = np.zeros(q.shape)
    lse = np.zeros((batch, hq, q.shape[1]) if not varlen else (hq, q.shape[0]))
    grads = {}
    if do is not None:
        grads = {"dq": np.zeros(q.shape), "dk": np.zeros(k.shape), "dv": np.zeros(v.shape)}
        if bias is not None:
            grads["dbias"] = np.zeros(bias.shape)
        if sinks is not None:
            grads["dsinks"] = np.zeros(hq)
    for b in range(batch):
        qs = slice(cu_q[b], cu_q[b + 1]) if varlen else slice(None)
        qb = q[qs] if varlen else q[b]
        nq = qb.shape[0]
        nk = capacity(b) if seqused_k is None else int(seqused_k[b])
        if k_new is not None:
            new = _f64(k_new)[b].shape[0]
            at = key_rows(b, nk + new)
            idx = tuple(a[nk:] for a in at)
            k_out[idx] = _f64(k_new)[b]
            v_out[idx] = _f64(v_new)[b]
            nk += new
        at = key_rows(b, nk)
        kb, vb = k_out[at], v_out[at]
        bb = None
        if bias is not None:
            bb = bias[0 if bias.shape[0] == 1 else b]
            bb = bb[:, :nq, :nk] if bias.shape[2] > 1 else bb[:, :, :nk]
            bb = np.broadcast_to(bb, (hq, nq, nk))
        dob = None if do is None else (do[qs] if varlen else do[b])
        r = _sequence(
            qb,
            kb,
            vb,
            dob,
            scale=scale,
            causal=causal,
            window=window,
            softcap=softcap,
            slopes=slopes,
            bias=bb,
            sinks=sinks,
        )
        if varlen:
            o[qs] = r["o"]
            lse[:, qs] = r["lse"]
        else:
            o[b] = r["o"]
            lse[b] = r["lse"]
        if do is None:
            continue
        if varlen:
            grads["dq"][qs] = r["dq"]
        else:
            grads["dq"][b] = r["dq"]
        np.add.at(grads["dk"], at, r["dk"])
        np.add.at(grads["dv"], at, r["dv"])
        if bias is not None:
            ds = r["dbias"]
            if bias.shape[1] == 1:
                ds = ds.sum(axis=0, keepdims=True)
            if bias.shape[2] == 1:
                ds = ds.sum(axis=1, keepdims=True)
            grads["dbias"][0 if bias.shape[0] == 1 else b][:, : ds.shape[1], :nk] += ds
        if sinks is not None:
            grads["dsinks"] += r["dsinks"]
    result = {"o": o, "lse": lse, **grads}
    if k_new is not None:
        result["k_out"], result["v_out"] = k_out, v_out
    return result
