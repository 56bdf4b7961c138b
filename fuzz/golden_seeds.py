#!/usr/bin/env python3
"""Writes the hand-made seeds of fuzz_golden (fuzz/corpus/fuzz_golden/seed_*):
small case folders packed as fuzz_golden.c reads them, case.json then the
.npy files joined by "@@@@\\n". The values are arbitrary; the reader checks
formats, shapes and the case.json fields, not the numbers. Run once with
NumPy from the repository root; the seeds are committed."""
import io
import json
import os

import numpy as np

SEP = b"@@@@\n"
ORDER = ["q", "k", "v", "o", "lse", "do", "dq", "dk", "dv"]


def npy(a, version=None):
    buf = io.BytesIO()
    if version is None:
        np.save(buf, a)
    else:
        np.lib.format.write_array(buf, a, version=version)
    return buf.getvalue()


def case(meta, arrays, version=None):
    parts = [json.dumps(meta).encode()]
    for name in ORDER:
        if name not in arrays:
            break
        parts.append(npy(arrays[name], version))
    return SEP.join(parts)


def main():
    out = "fuzz/corpus/fuzz_golden"
    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(1)
    seeds = {}

    # bshd f32 with every gradient: B 2, Nq 1, Nk 3, H 1, d 4.
    B, nq, nk, h, d = 2, 1, 3, 1, 4
    meta = {"layout": "bshd", "dtype": "f32", "batch": B, "seqlen_q": nq, "seqlen_k": nk,
            "heads_q": h, "heads_kv": h, "head_dim": d, "scale": 0.5, "causal": False,
            "window": [-1, -1], "softcap": 0.0, "alibi_slopes": None,
            "peer_max_err": {"o": 1e-7, "lse": 1e-7, "dq": 1e-7, "dk": 1e-7, "dv": 1e-7}}
    q = rng.standard_normal((B, nq, h, d)).astype(np.float32)
    k = rng.standard_normal((B, nk, h, d)).astype(np.float32)
    seeds["seed_bshd_f32_backward"] = case(meta, {
        "q": q, "k": k, "v": k, "o": q, "lse": np.zeros((B, h, nq), np.float32), "do": q,
        "dq": q, "dk": k, "dv": k})

    # varlen f16 (raw <u2 inputs, <f8 references) with GQA, ALiBi, a window
    # and softcap; forward only.
    cu_q, cu_k = [0, 1, 3], [0, 2, 2]
    hq, hkv, d = 2, 1, 2
    meta = {"layout": "varlen", "dtype": "f16", "batch": 2, "heads_q": hq, "heads_kv": hkv,
            "head_dim": d, "scale": 0.0, "causal": True, "window": [1, 0], "softcap": 30.0,
            "alibi_slopes": [0.5, 0.25], "cu_seqlens_q": cu_q, "cu_seqlens_k": cu_k,
            "peer_max_err": {"o": 1e-3, "lse": None}}
    qh = np.arange(3 * hq * d, dtype=np.uint16).reshape(3, hq, d)
    kh = np.arange(2 * hkv * d, dtype=np.uint16).reshape(2, hkv, d)
    seeds["seed_varlen_f16_forward"] = case(meta, {
        "q": qh, "k": kh, "v": kh, "o": np.zeros((3, hq, d)), "lse": np.zeros((hq, 3))})

    # bf16 bshd as float16 arrays in .npy version 2.0 headers.
    meta = {"layout": "bshd", "dtype": "bf16", "batch": 1, "seqlen_q": 2, "seqlen_k": 2,
            "heads_q": 1, "heads_kv": 1, "head_dim": 1, "scale": 1, "causal": True,
            "window": None, "softcap": None}
    x = np.ones((1, 2, 1, 1), np.float16)
    seeds["seed_bshd_bf16_npy_v2"] = case(meta, {
        "q": x, "k": x, "v": x, "o": np.ones((1, 2, 1, 1), np.float32),
        "lse": np.ones((1, 1, 2), np.float32)}, version=(2, 0))

    # case.json alone, with the escapes, numbers and words JSON allows.
    seeds["seed_json_only"] = (b'{"name": "a\\u0041\\n\\"\\\\\\/", "layout": "bshd", "x": [1e3, -0.5, '
                               b'NaN, Infinity, -Infinity, true, false, null, {}, []]}')

    for name, data in seeds.items():
        with open(os.path.join(out, name), "wb") as f:
            f.write(data)


if __name__ == "__main__":
    main()
