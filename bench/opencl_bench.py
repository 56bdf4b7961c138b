#!/usr/bin/env python3
"""OpenCL benchmark: attn's OpenCL backend beside a reference in the same run.

  --gpu   (the H200): attn through OpenCL vs torch float32
          scaled_dot_product_attention (and torch f16 for context), forward
          and backward, f32 and f16, N = 1k/4k/16k, d = 64/128, non-causal.
          Shapes keep batch * N = 16384 tokens and heads * d = 2048.
  --cpu   (this machine): attn through PoCL vs attn's CPU backend, smaller.

attn is timed by `attn run` (median of --repeat synchronous calls, device
buffers, one untimed warm-up call); torch by CUDA events around the same
call. FLOPs: forward 4 * B * H * N^2 * d, backward 2.5x that.
Prints one table last; logs go to --log.
"""
import argparse
import os
import re
import subprocess
import sys


def attn_run(exe, backend, b, n, h, d, dtype, backward, repeat, log, env=None):
    cmd = [exe, "run", "--backend", backend, "--batch", str(b), "--seqlen", str(n),
           "--heads", str(h), "--dim", str(d), "--dtype", dtype, "--repeat", str(repeat),
           "--no-check"] + (["--backward"] if backward else [])
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=90)
    except subprocess.TimeoutExpired:
        log.write("$ " + " ".join(cmd) + "\ntimed out\n")
        return None, None
    log.write("$ " + " ".join(cmd) + "\n" + p.stdout + p.stderr + "\n")
    log.flush()
    fw = re.search(r"forward\s+[\d.]+ ms median of \d+, ([\d.]+) GFLOP/s", p.stdout)
    bw = re.search(r"backward\s+[\d.]+ ms median of \d+, ([\d.]+) GFLOP/s", p.stdout)
    return (float(fw.group(1)) / 1e3 if fw else None,
            float(bw.group(1)) / 1e3 if bw else None)


def torch_sdpa(b, n, h, d, dtype, repeat):
    import torch
    import torch.nn.functional as F
    dt = {"f32": torch.float32, "f16": torch.float16}[dtype]
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=dt, requires_grad=True)
               for _ in range(3))
    g = torch.randn(b, h, n, d, device="cuda", dtype=dt)

    def med(fn):
        fn()
        torch.cuda.synchronize()
        ts = []
        for _ in range(repeat):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            fn()
            e.record()
            torch.cuda.synchronize()
            ts.append(s.elapsed_time(e) / 1e3)
        return sorted(ts)[len(ts) // 2]

    flops = 4.0 * b * h * n * n * d
    tf = med(lambda: F.scaled_dot_product_attention(q, k, v))
    o = F.scaled_dot_product_attention(q, k, v)
    tb = med(lambda: torch.autograd.grad(o, (q, k, v), g, retain_graph=True))
    return flops / tf / 1e12, 2.5 * flops / tb / 1e12


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--attn", default="build/tools/attn")
    ap.add_argument("--gpu", action="store_true")
    ap.add_argument("--cpu", action="store_true")
    ap.add_argument("--log", default="opencl_bench.log")
    ap.add_argument("--sizes", default=None, help="comma-separated N values")
    a = ap.parse_args()
    log = open(a.log, "w")
    rows = []
    if a.gpu:
        sizes = [int(x) for x in (a.sizes or "1024,4096,16384").split(",")]
        for dtype in ("f32", "f16"):
            for d in (64, 128):
                for n in sizes:
                    b, h = max(1, 16384 // n), 2048 // d
                    rep = 2 if n >= 16384 else 5
                    env = dict(os.environ)
                    fw, bw = attn_run(a.attn, "opencl", b, n, h, d, dtype, True, rep, log, env)
                    try:
                        tfw, tbw = torch_sdpa(b, n, h, d, "f32", rep)
                        hfw, hbw = torch_sdpa(b, n, h, d, "f16", rep) if dtype == "f16" else (None, None)
                    except Exception as ex:  # no torch or no CUDA: the attn column alone
                        log.write("torch: %s\n" % ex)
                        tfw = tbw = hfw = hbw = None
                    rows.append((dtype, d, n, b, h, fw, bw, tfw, tbw, hfw, hbw))
                    print("done", rows[-1], flush=True)
        hdr = ("dtype", "d", "N", "B", "H", "cl fwd", "cl bwd", "sdpa32 fwd", "sdpa32 bwd",
               "fwd ratio", "sdpa16 fwd", "sdpa16 bwd")
    else:
        sizes = [int(x) for x in (a.sizes or "1024,4096").split(",")]
        for dtype in ("f32", "f16"):
            for d in (64, 128):
                for n in sizes:
                    b, h = 1, 4 if n <= 1024 else 1
                    fw, bw = attn_run(a.attn, "opencl", b, n, h, d, dtype, True, 3, log)
                    cfw, cbw = attn_run(a.attn, "cpu", b, n, h, d, dtype, True, 3, log)
                    rows.append((dtype, d, n, b, h, fw, bw, cfw, cbw, None, None))
                    print("done", rows[-1], flush=True)
        hdr = ("dtype", "d", "N", "B", "H", "pocl fwd", "pocl bwd", "cpu fwd", "cpu bwd",
               "fwd ratio", "-", "-")

    def f(x, p=2):
        return "-" if x is None else ("%.*f" % (p, x))

    print("\nTFLOP/s (fwd 4*B*H*N^2*d, bwd 2.5x)" + ("" if a.gpu else " -- here GFLOP/s x 1e-3"))
    print("| " + " | ".join(hdr) + " |")
    print("|" + "---|" * len(hdr))
    for (dtype, d, n, b, h, fw, bw, rf, rb, hf, hb) in rows:
        ratio = fw / rf if fw and rf else None
        print("| %s | %d | %d | %d | %d | %s | %s | %s | %s | %s | %s | %s |" % (
            dtype, d, n, b, h, f(fw, 3 if not a.gpu else 2), f(bw, 3 if not a.gpu else 2),
            f(rf, 3 if not a.gpu else 2), f(rb, 3 if not a.gpu else 2), f(ratio), f(hf), f(hb)))


if __name__ == "__main__":
    sys.exit(main())
