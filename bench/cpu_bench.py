#!/usr/bin/env python3
"""attn's CPU backend beside PyTorch's CPU SDPA, in GFLOP/s, at chosen thread counts.

  scaling   the thread-scaling table (bench/cpu_scaling.sh): ViT-B/16 batch 64 and
            B = 1, H = 12, N = 4096, d = 64, forward and backward, f32 and bf16, at
            OMP_NUM_THREADS = 1, 2, 4, 8, 16 (up to nproc): GFLOP/s, speedup over one
            thread, ratio to torch.
  targets   the target rows (bench/cpu_h200.sh): f32 forward and backward at ViT-B/16
            batch 64, N = 4096 d = 64 (causal and not), N = 2048 d = 128; bf16 forward
            on the same rows; one thread count (all cores), ratio to torch.

Both sides are timed the same way: one untimed call, then the median of --repeat
calls, each measured on the host from the call to its return. attn's times are
`attn run`'s own (bshd tensors); torch's come from a child process per thread
count (torch.set_num_threads, and OMP_NUM_THREADS for both), its tensors
[B, H, N, d] contiguous, the backward timed as torch.autograd.grad of the output
alone, after an untimed forward per call. Causal is bottom-right aligned in attn
and top-left in torch's is_causal, the same mask for Nq = Nk. FLOPs: forward
4 B H (visible pairs) d, backward 2.5x that, for both.

  python3 bench/cpu_bench.py scaling --attn build/tools/attn [--threads 1,2] [--quick]
    python3 bench/cpu_bench.py targets --attn build-cpu/tools/attn [--json F] [--small]
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time

FWD = re.compile(r"forward\s+([\d.]+) ms median of (\d+), ([\d.]+) GFLOP/s")
BWD = re.compile(r"backward\s+([\d.]+) ms median of (\d+), ([\d.]+) GFLOP/s")

VIT = dict(name="ViT-B/16 b64", batch=64, n=197, heads=12, dim=64, causal=False)
N4K = dict(name="N4096 H12 d64", batch=1, n=4096, heads=12, dim=64, causal=False)
N4KC = dict(name="N4096 H12 d64 causal", batch=1, n=4096, heads=12, dim=64, causal=True)
N2K128 = dict(name="N2048 H16 d128", batch=1, n=2048, heads=16, dim=128, causal=False)


def flops(row):
    pairs = row["n"] * (row["n"] + 1) // 2 if row["causal"] else row["n"] * row["n"]
    return 4.0 * row["batch"] * row["heads"] * pairs * row["dim"]


def env_threads(t):
    e = dict(os.environ)
    e["OMP_NUM_THREADS"] = str(t)
    e["ATTN_BACKEND"] = "cpu"
    return e


def attn_row(attn, row, dtype, backward, threads, repeat, log):
    cmd = [attn, "run", "--backend", "cpu", "--batch", str(row["batch"]), "--seqlen", str(row["n"]),
           "--heads", str(row["heads"]), "--dim", str(row["dim"]), "--dtype", dtype,
           "--repeat", str(repeat), "--no-check"]
    if row["causal"]:
        cmd.append("--causal")
    if backward:
        cmd.append("--backward")
    r = subprocess.run(cmd, env=env_threads(threads), capture_output=True, text=True)
    log.write("$ OMP_NUM_THREADS=%d %s\n%s%s\n" % (threads, " ".join(cmd), r.stdout, r.stderr))
    if r.returncode != 0:
        return None, None
    f, b = FWD.search(r.stdout), BWD.search(r.stdout)
    return (float(f.group(3)) if f else None), (float(b.group(3)) if b else None)


def torch_child(args):
    """Runs in the child: prints {"fwd": GFLOP/s, "bwd": GFLOP/s or null} or {"error": ...}."""
    try:
        import torch
        import torch.nn.functional as F
    except Exception as e:  # torch absent: the tables say so
        print(json.dumps({"error": "torch not importable: %s" % e}))
        return 0
    torch.set_num_threads(args.threads)
    row = json.loads(args.row)
    dt = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}[args.dtype]
    g = torch.Generator().manual_seed(1)
    shape = (row["batch"], row["heads"], row["n"], row["dim"])
    q, k, v = (torch.randn(shape, generator=g).to(dt).requires_grad_(args.backward)
               for _ in range(3))
    do = torch.randn(shape, generator=g).to(dt)

    def fwd():
        return F.scaled_dot_product_attention(q, k, v, is_causal=row["causal"])

    def median(fn):
        _, warm = fn()  # untimed, as attn run's first call
        # A pass that takes seconds (torch's bf16 backward on a CPU without
        # bf16 instructions: 3 GFLOP/s) is timed fewer times, so that a
        # table stays within minutes.
        repeat = args.repeat if warm < 1 else min(args.repeat, 3) if warm < 5 else 1
        ts = []
        for _ in range(repeat):
            t, dt_ = fn()
            ts.append(dt_)
        return statistics.median(ts)

    def timed_fwd():
        with torch.no_grad():
            t0 = time.perf_counter()
            o = fwd()
            return o, time.perf_counter() - t0

    out = {"fwd": flops(row) / median(timed_fwd) * 1e-9, "bwd": None,
           "torch": torch.__version__, "threads": torch.get_num_threads()}
    if args.backward:
        def timed_bwd():
            o = fwd()
            t0 = time.perf_counter()
            torch.autograd.grad(o, (q, k, v), do)
            return o, time.perf_counter() - t0
        out["bwd"] = 2.5 * flops(row) / median(timed_bwd) * 1e-9
    print(json.dumps(out))
    return 0


def torch_row(row, dtype, backward, threads, repeat, log):
    cmd = [sys.executable, os.path.abspath(__file__), "torch-child", "--row", json.dumps(row),
           "--dtype", dtype, "--threads", str(threads), "--repeat", str(repeat)]
    if backward:
        cmd.append("--backward")
    r = subprocess.run(cmd, env=env_threads(threads), capture_output=True, text=True)
    log.write("$ OMP_NUM_THREADS=%d torch %s %s%s\n%s%s\n" % (
        threads, row["name"], dtype, " backward" if backward else "", r.stdout, r.stderr))
    try:
        res = json.loads(r.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return None, None, "torch child failed (see the log)"
    if "error" in res:
        return None, None, res["error"]
    return res["fwd"], res["bwd"], None


def fmt(x, spec="%.1f"):
    return spec % x if x is not None else "-"


def ratio(a, b):
    return a / b if a is not None and b else None


def scaling(args, log):
    nproc = os.cpu_count() or 1
    threads = [int(t) for t in args.threads.split(",")] if args.threads else \
        [t for t in (1, 2, 4, 8, 16) if t <= nproc]
    rows = [VIT, N4K]
    if args.quick:
        rows = [dict(VIT, name="ViT-B/16 b8", batch=8), dict(N4K, name="N1024 H12 d64", n=1024)]
    results = []
    note = None
    for row in rows:
        for dtype in ("f32", "bf16"):
            base = {}
            for t in threads:
                af, ab = attn_row(args.attn, row, dtype, True, t, args.repeat, log)
                tf, tb, why = torch_row(row, dtype, True, t, args.repeat, log)
                note = note or why
                for pas, a, to in (("fwd", af, tf), ("bwd", ab, tb)):
                    base.setdefault((pas, "attn"), a)
                    base.setdefault((pas, "torch"), to)
                    results.append(dict(row=row["name"], dtype=dtype, pas=pas, threads=t, attn=a,
                                        torch=to, speedup=ratio(a, base[(pas, "attn")]),
                                        torch_speedup=ratio(to, base[(pas, "torch")]),
                                        ratio=ratio(a, to)))
                print("  %s %s %d threads: attn %s / %s, torch %s / %s GFLOP/s (fwd / bwd)" % (
                    row["name"], dtype, t, fmt(af), fmt(ab), fmt(tf), fmt(tb)), file=sys.stderr)
    print("\n| problem | dtype | pass | threads | attn GFLOP/s | speedup | torch GFLOP/s | "
          "torch speedup | attn/torch |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in results:
        print("| %s | %s | %s | %d | %s | %s | %s | %s | %s |" % (
            r["row"], r["dtype"], r["pas"], r["threads"], fmt(r["attn"]),
            fmt(r["speedup"], "%.2f"), fmt(r["torch"]), fmt(r["torch_speedup"], "%.2f"),
            fmt(r["ratio"], "%.2f")))
    if note:
        print("\ntorch: %s" % note)
    return results


def targets(args, log):
    t = int(args.threads) if args.threads else (os.cpu_count() or 1)
    rows = [VIT, N4K, N4KC, N2K128]
    if args.small:
        # The same shapes cut to what 2 cores run in minutes: batch 16, N / 2.
        rows = [dict(VIT, name="ViT-B/16 b16", batch=16),
                dict(N4K, name="N2048 H12 d64", n=2048),
                dict(N4KC, name="N2048 H12 d64 causal", n=2048),
                dict(N2K128, name="N1024 H16 d128", n=1024)]
    # (row, dtype, backward, the target ratio of each pass)
    plan = [(r, "f32", True, (1.3, 1.2)) for r in rows] + \
           [(r, "bf16", False, (1.0, None)) for r in rows]
    results = []
    note = None
    for row, dtype, backward, goal in plan:
        af, ab = attn_row(args.attn, row, dtype, backward, t, args.repeat, log)
        tf, tb, why = torch_row(row, dtype, backward, t, args.repeat, log)
        note = note or why
        for pas, a, to, g in (("fwd", af, tf, goal[0]), ("bwd", ab, tb, goal[1])):
            if pas == "bwd" and not backward:
                continue
            results.append(dict(row=row["name"], dtype=dtype, pas=pas, threads=t, attn=a,
                                torch=to, ratio=ratio(a, to), target=g))
        print("  %s %s: attn %s / %s, torch %s / %s GFLOP/s" % (
            row["name"], dtype, fmt(af), fmt(ab), fmt(tf), fmt(tb)), file=sys.stderr)
    print("\n%d threads\n" % t)
    print("| problem | dtype | pass | attn GFLOP/s | torch GFLOP/s | attn/torch | target | met |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in results:
        met = "-" if r["ratio"] is None else ("yes" if r["ratio"] >= r["target"] else "no")
        print("| %s | %s | %s | %s | %s | %s | %.1f | %s |" % (
            r["row"], r["dtype"], r["pas"], fmt(r["attn"]), fmt(r["torch"]),
            fmt(r["ratio"], "%.2f"), r["target"], met))
    if note:
        print("\ntorch: %s" % note)
    return results


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("mode", choices=("scaling", "targets", "torch-child"))
    ap.add_argument("--attn", default="build/tools/attn")
    ap.add_argument("--threads", help="scaling: a comma list; targets: one count (default nproc)")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="scaling: smaller problems")
    ap.add_argument("--small", action="store_true", help="targets: the rows cut for 2 cores")
    ap.add_argument("--json", help="write the results here too")
    ap.add_argument("--log", default="/tmp/cpu_bench.log")
    # torch-child
    ap.add_argument("--row")
    ap.add_argument("--dtype")
    ap.add_argument("--backward", action="store_true")
    args = ap.parse_args()
    if args.mode == "torch-child":
        args.threads = int(args.threads)
        return torch_child(args)
    if not os.access(args.attn, os.X_OK):
        print("cpu_bench.py: no %s; build first" % args.attn, file=sys.stderr)
        return 2
    with open(args.log, "w") as log:
        res = scaling(args, log) if args.mode == "scaling" else targets(args, log)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
