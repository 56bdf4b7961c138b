#!/usr/bin/env python3
"""PyTorch's attention timed over attn bench's problems, written in attn bench's schema.

  python3 bench/peer.py --like attn.jsonl [--output peer.jsonl]
      every problem of attn bench's JSON lines, once per peer: a row of a GPU
      device gets the CUDA peers, a row of a CPU device torch-cpu; FLOPs and
      bytes are copied from attn's row, so the rates compare as they stand
  python3 bench/peer.py [--device cuda|cpu] [attn bench's sweep options]
      the sweep attn bench would make (--dtypes, --dims, --seqlens, --masks,
      --passes, --seqlen-k, --tokens, --hidden, --batch, --heads, --heads-kv,
      the same defaults; the dtype default is f32 on the CPU, bf16 on CUDA)

The peers are torch.nn.functional.scaled_dot_product_attention in its own
[batch, heads, seqlen, d] layout: on CUDA "torch-flash" and "torch-cudnn"
(torch.nn.attention.sdpa_kernel with FLASH_ATTENTION, CUDNN_ATTENTION) for
f16 and bf16, and "torch-efficient" (EFFICIENT_ATTENTION) for f32, which the
other two do not take, with TF32 off; on the CPU "torch-cpu" (SDPA's CPU
kernel). --peers picks some of them.

Timing: one warm-up call, then calls until --repeat of them or, after the
first, --budget seconds (attn bench's defaults: 100, 0.5); each timed alone,
by CUDA events around it on the GPU, by time.perf_counter on the CPU; the
median. (attn bench times on the host clock around synchronous calls: the
launch and the wait are in its times, a few microseconds that only decoding
rows notice.) The backward pass is torch.autograd.grad of one forward's
output, dq, dk and dv, timed alone.

Masks: none, and causal where torch's top-left alignment is attn's
bottom-right one: seqlen_q = seqlen_k, or a single query row, which sees
every key (is_causal off). Sliding windows and other causal rows are not
SDPA's without a dense mask: they are skipped, said on stderr. A peer that
refuses a problem (a dtype, a head dim, memory) gets a row with its error
and no times, as attn bench writes one.

Rows go to --output (default stdout) as JSON lines, flushed one by one; on
a terminal stderr shows the row being timed.
"""
import argparse
import datetime
import json
import math
import os
import platform
import statistics
import sys
import time

import rows as R

DTYPES = ("f32", "f16", "bf16")
SIZES = {"f32": 4, "f16": 2, "bf16": 2}
KEYS = ("schema", "tool", "impl", "impl_version", "timestamp", "backend", "device", "device_kind",
        "compute_units", "timer", "dtype", "d", "mask", "causal", "window_left", "window_right",
        "seqlen_q", "seqlen_k", "batch", "heads", "heads_kv", "pass", "reps", "median_ms",
        "min_ms", "flops", "tflops", "gflops", "bytes", "gbps", "error")
CUDA_PEERS = {"torch-flash": "FLASH_ATTENTION", "torch-cudnn": "CUDNN_ATTENTION",
              "torch-efficient": "EFFICIENT_ATTENTION"}


# ---------------------------------------------------------------------------
# The problems: from attn bench's rows, or the sweep attn bench makes
# ---------------------------------------------------------------------------

def int_list(opt, s, lo=1, hi=2**31 - 1):
    out = []
    for x in s.split(","):
        if not x.isdigit() or not lo <= int(x) <= hi:
            raise SystemExit("peer.py: %s \"%s\": \"%s\" is not an integer from %d to %d" % (opt, s, x, lo, hi))
        out.append(int(x))
    return out


def parse_mask(m):
    """(causal, window_left) of a mask name of attn bench: none, causal, window:L."""
    if m == "none":
        return False, -1
    if m == "causal":
        return True, -1
    if m.startswith("window:") and m[7:].isdigit():
        return True, int(m[7:])
    raise SystemExit("peer.py: --masks \"%s\" is not none, causal or window:L" % m)


def visible_pairs(nq, nk, causal, window_left):
    """Query-key pairs one sequence's mask leaves visible, as attn counts them
    (src/rules.h: the diagonal of row i is i + nk - nq, bottom-right)."""
    if not causal and window_left < 0:
        return nq * nk
    total = 0
    for i in range(nq):
        diag = i + nk - nq
        lo = max(0, diag - window_left) if window_left >= 0 else 0
        hi = min(nk - 1, diag) if causal else nk - 1
        total += max(0, hi - lo + 1)
    return total


def problem_work(p):
    """FLOPs and bytes of a problem as attn bench counts them (tools/run_work.c,
    without a cache, bias or sinks)."""
    es = SIZES[p["dtype"]]
    pairs = p["batch"] * visible_pairs(p["seqlen_q"], p["seqlen_k"], p["causal"], p["window_left"])
    flops = 4.0 * p["heads"] * pairs * p["d"]
    eq = p["batch"] * p["seqlen_q"] * p["heads"] * p["d"]
    ek = p["batch"] * p["seqlen_k"] * p["heads_kv"] * p["d"]
    lse = 4.0 * p["batch"] * p["heads"] * p["seqlen_q"]
    if p["pass"] == "bwd":
        return 2.5 * flops, (4 * eq + 4 * ek) * es + lse
    # The keys some row sees: for none, causal and windows alike, one range
    # from the first row's lowest key to the last row's diagonal.
    diag_last = p["seqlen_k"] - 1
    hi = diag_last if p["causal"] else p["seqlen_k"] - 1
    lo = max(0, diag_last - p["seqlen_q"] + 1 - p["window_left"]) if p["window_left"] >= 0 else 0
    keys = p["batch"] * max(0, min(hi, p["seqlen_k"] - 1) - lo + 1)
    return flops, 2.0 * keys * p["heads_kv"] * p["d"] * es + 2.0 * eq * es + lse


def sweep(args, kind):
    """The problems attn bench makes of the same options, in its order."""
    dtypes = args.dtypes.split(",") if args.dtypes else ["bf16" if kind == "gpu" else "f32"]
    for dt in dtypes:
        if dt not in DTYPES:
            raise SystemExit("peer.py: --dtypes \"%s\" is not f32, f16 or bf16" % dt)
    dims = int_list("--dims", args.dims, 1, 256)
    # As attn bench: --seqlen-k alone asks for decoding rows alone.
    if args.seqlens:
        seqlens = int_list("--seqlens", args.seqlens)
    elif args.seqlen_k:
        seqlens = []
    else:
        seqlens = [512, 1024, 2048, 4096, 8192, 16384]
    decode = int_list("--seqlen-k", args.seqlen_k) if args.seqlen_k else []
    passes = args.passes.split(",")
    for ps in passes:
        if ps not in ("fwd", "bwd"):
            raise SystemExit("peer.py: --passes \"%s\" is not fwd or bwd" % ps)
    masks = args.masks.split(",")
    for m in masks:
        parse_mask(m)
    out = []
    for dt in dtypes:
        for d in dims:
            heads = args.heads or max(1, args.hidden // d)
            heads_kv = args.heads_kv or heads
            if heads_kv > heads or heads % heads_kv:
                raise SystemExit("peer.py: --heads-kv %d does not divide the %d heads of head dim %d"
                                 % (heads_kv, heads, d))
            for m in masks:
                causal, wl = parse_mask(m)
                base = {"dtype": dt, "d": d, "mask": m, "causal": causal, "window_left": wl,
                        "window_right": 0 if causal else -1, "heads": heads, "heads_kv": heads_kv,
                        "device_kind": kind}
                rows = [(n, n, ps) for n in seqlens for ps in ("fwd", "bwd") if ps in passes]
                if "fwd" in passes:
                    rows += [(1, n, "fwd") for n in decode]
                for nq, nk, ps in rows:
                    p = dict(base, seqlen_q=nq, seqlen_k=nk, batch=args.batch or max(1, args.tokens // nk),
                             **{"pass": ps})
                    p["flops"], p["bytes"] = problem_work(p)
                    out.append(p)
    return out


def like(path):
    """The problems of attn bench's JSON lines, each once, in their order."""
    fields = ("device_kind", "dtype", "d", "mask", "causal", "window_left", "window_right", "seqlen_q",
              "seqlen_k", "batch", "heads", "heads_kv", "pass", "flops", "bytes")
    seen, out = set(), []
    for n, r in R.lines(path, "peer.py: "):
        if r.get("impl") != "attn":
            continue
        missing = [k for k in fields if k not in r]
        if missing:
            raise SystemExit("peer.py: %s line %d lacks %s" % (path, n, ", ".join(missing)))
        p = {k: r[k] for k in fields}
        key = tuple(p[k] for k in fields[:13])
        if key not in seen:
            seen.add(key)
            out.append(p)
    return out


# ---------------------------------------------------------------------------
# Timing
# ---------------------------------------------------------------------------

def time_calls(torch, fn, cuda, repeat, budget):
    """Seconds of each timed call, sorted: a warm-up call, then calls until
    repeat of them or, after the first, budget seconds."""
    fn()
    if cuda:
        torch.cuda.synchronize()
    times, start = [], time.perf_counter()
    while len(times) < repeat and (not times or time.perf_counter() - start < budget):
        if cuda:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b) / 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return sorted(times)


def run_peer(torch, peer, p, args):
    """Times one problem on one peer: (times, None), or (None, why)."""
    import torch.nn.functional as F
    cuda = peer != "torch-cpu"
    if p["window_left"] >= 0:
        return None, "skip: a sliding window is not SDPA's without a dense mask"
    if p["causal"] and p["seqlen_q"] not in (1, p["seqlen_k"]):
        return None, "skip: SDPA's causal mask is top-left aligned, attn's bottom-right"
    causal = p["causal"] and p["seqlen_q"] == p["seqlen_k"]
    dt = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}[p["dtype"]]
    dev = "cuda" if cuda else "cpu"
    B, H, Hkv, d = p["batch"], p["heads"], p["heads_kv"], p["d"]
    kw = {"is_causal": causal}
    if Hkv != H:
        kw["enable_gqa"] = True
    ctx = None
    if cuda:
        from torch.nn.attention import SDPBackend, sdpa_kernel
        ctx = sdpa_kernel(getattr(SDPBackend, CUDA_PEERS[peer]))
    try:
        q = torch.randn(B, H, p["seqlen_q"], d, device=dev, dtype=dt)
        k = torch.randn(B, Hkv, p["seqlen_k"], d, device=dev, dtype=dt)
        v = torch.randn_like(k)
        if ctx is not None:
            ctx.__enter__()
        try:
            if p["pass"] == "fwd":
                with torch.no_grad():
                    times = time_calls(torch, lambda: F.scaled_dot_product_attention(q, k, v, **kw), cuda,
                                       args.repeat, args.budget)
            else:
                q.requires_grad_()
                k.requires_grad_()
                v.requires_grad_()
                out = F.scaled_dot_product_attention(q, k, v, **kw)
                do = torch.randn_like(out)
                times = time_calls(torch, lambda: torch.autograd.grad(out, (q, k, v), do, retain_graph=True),
                                   cuda, args.repeat, args.budget)
        finally:
            if ctx is not None:
                ctx.__exit__(None, None, None)
        return times, None
    except (RuntimeError, ValueError, TypeError) as e:  # a refused problem, memory
        lines = str(e).strip().splitlines()
        return None, "%s: %s" % (type(e).__name__, lines[0][:200] if lines else "")
    finally:
        q = k = v = None
        if cuda:
            torch.cuda.empty_cache()


# ---------------------------------------------------------------------------
# Rows
# ---------------------------------------------------------------------------

def cpu_name():
    """The CPU's name as attn's CPU backend gives it: /proc/cpuinfo's model name."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "cpu"


def make_row(torch, peer, p, times, error, device, units):
    med = statistics.median(times) if times else None

    def rate(x, scale):
        return x / med * scale if med else None
    r = {"schema": 1, "tool": "bench/peer.py", "impl": "torch", "impl_version": torch.__version__,
         "timestamp": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
         "backend": peer, "device": device, "device_kind": "cpu" if peer == "torch-cpu" else "gpu",
         "compute_units": units, "timer": "host" if peer == "torch-cpu" else "cuda-events",
         "reps": len(times) if times else 0,
         "median_ms": med * 1e3 if med else None, "min_ms": times[0] * 1e3 if times else None,
         "tflops": rate(p["flops"], 1e-12), "gflops": rate(p["flops"], 1e-9),
         "gbps": rate(p["bytes"], 1e-9), "error": error}
    for k in KEYS:
        if k not in r:
            r[k] = p[k]
    return {k: r[k] for k in KEYS}


def describe(peer, p):
    n = ("N=%d" % p["seqlen_k"] if p["seqlen_q"] == p["seqlen_k"]
         else "Nq=%d Nk=%d" % (p["seqlen_q"], p["seqlen_k"]))
    return "%s %s d=%d %s %s %s" % (peer, p["dtype"], p["d"], n, p["mask"], p["pass"])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--like", metavar="JSONL", help="time the problems of attn bench's rows in this file")
    ap.add_argument("--device", choices=["cuda", "cpu"], help="without --like (default: cuda if present)")
    ap.add_argument("--peers", help="comma-separated: torch-flash, torch-cudnn, torch-efficient, torch-cpu")
    ap.add_argument("--threads", type=int, help="torch.set_num_threads on the CPU (default: torch's own)")
    ap.add_argument("--output", help="write the rows here (default: stdout)")
    ap.add_argument("--budget", type=float, default=0.5, help="seconds of timed calls per row (0.5)")
    ap.add_argument("--repeat", type=int, default=100, help="timed calls per row at most (100)")
    ap.add_argument("--dtypes")
    ap.add_argument("--dims", default="64,128")
    ap.add_argument("--seqlens")
    ap.add_argument("--masks", default="none,causal")
    ap.add_argument("--passes", default="fwd,bwd")
    ap.add_argument("--seqlen-k", dest="seqlen_k")
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=0)
    ap.add_argument("--heads", type=int, default=0)
    ap.add_argument("--heads-kv", dest="heads_kv", type=int, default=0)
    args = ap.parse_args()
    if args.budget < 0 or args.repeat < 1:
        ap.error("--budget must be at least 0 and --repeat at least 1")
    if args.seqlen_k and "fwd" not in args.passes.split(","):
        ap.error("--seqlen-k makes forward rows, but --passes has no fwd")
    try:
        import torch
    except ImportError:
        sys.exit("peer.py: PyTorch is not installed here (pip install torch)")
    has_cuda = torch.cuda.is_available()
    if args.like:
        problems = like(args.like)
    else:
        kind = "gpu" if (args.device or ("cuda" if has_cuda else "cpu")) == "cuda" else "cpu"
        problems = sweep(args, kind)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    wanted = set(args.peers.split(",")) if args.peers else None
    if wanted:
        unknown = wanted - set(CUDA_PEERS) - {"torch-cpu"}
        if unknown:
            ap.error("--peers: unknown %s" % ", ".join(sorted(unknown)))

    # Each problem's peers, in order.
    jobs = []
    for p in problems:
        if p["device_kind"] == "gpu":
            peers = ["torch-efficient"] if p["dtype"] == "f32" else ["torch-flash", "torch-cudnn"]
        else:
            peers = ["torch-cpu"]
        jobs += [(peer, p) for peer in peers if wanted is None or peer in wanted]
    if any(peer != "torch-cpu" for peer, _ in jobs) and not has_cuda:
        skipped = sum(peer != "torch-cpu" for peer, _ in jobs)
        print("peer.py: no CUDA device for torch: %d GPU rows skipped" % skipped, file=sys.stderr)
        jobs = [(peer, p) for peer, p in jobs if peer == "torch-cpu"]
    gpu_name = torch.cuda.get_device_name(0) if has_cuda else None
    gpu_units = torch.cuda.get_device_properties(0).multi_processor_count if has_cuda else 0
    out = open(args.output, "w") if args.output else sys.stdout
    tty = sys.stderr.isatty()
    skipped = 0
    for i, (peer, p) in enumerate(jobs, 1):
        if tty:
            sys.stderr.write("\rpeer.py: row %d/%d: %s\033[K" % (i, len(jobs), describe(peer, p)))
            sys.stderr.flush()
        times, error = run_peer(torch, peer, p, args)
        if error and error.startswith("skip: "):
            skipped += 1
            if tty:
                sys.stderr.write("\r\033[K")
            print("peer.py: %s: %s" % (describe(peer, p), error[6:]), file=sys.stderr)
            continue
        if error:
            if tty:
                sys.stderr.write("\r\033[K")
            print("peer.py: %s: %s" % (describe(peer, p), error), file=sys.stderr)
        cpu = peer == "torch-cpu"
        row = make_row(torch, peer, p, times, error, cpu_name() if cpu else gpu_name,
                       torch.get_num_threads() if cpu else gpu_units)
        out.write(json.dumps(row, allow_nan=False) + "\n")
        out.flush()
    if tty:
        sys.stderr.write("\r\033[K")
    if out is not sys.stdout:
        out.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
