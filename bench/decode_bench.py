#!/usr/bin/env python3
"""Decoding over a KV cache: attn beside torch SDPA and beside the memory's bandwidth.

  --gpu   (the H200, torch on CUDA; one process): the decode rows -- bf16, 32
          query heads over 8 KV heads, d = 128, seqlen_q 1, 2 and 4, batch 1 x
          8k / 32k / 128k keys, 8 x 32k, 32 x 4k -- on attn's CUDA backend
          (`attn run --splits auto`), torch SDPA's flash and cuDNN kernels, and
          attn's paged cache (pages of 16 and 256) against torch's unpaged time
          (torch has no paged kernel); the device copy rate (torch, 2 GiB); the
          decode rows on attn's OpenCL backend (NVIDIA's OpenCL) against that
          rate, synchronous and queued (`attn run --async`: a call's device
          time, its launch overlapped by the calls before it); and a
          full-bias prefill row (B = 2, H = 16, N = 4096, d = 128, bf16) with
          and without --bias on CUDA and OpenCL.
  --cpu   (this machine, no torch): the decode rows on attn's CPU backend
          against `attn bandwidth` measured just before each row (the rate
          moves on a shared machine), and the full-bias prefill ratio.

attn's times are `attn run`'s: the median of --repeat synchronous calls on
device buffers after an untimed one, each measured on the host from the call
to its return (launch and synchronization included). torch is timed the same
way (host clock around the call and torch.cuda.synchronize()), so a few
microseconds of launch cost sit in both columns alike; the CUDA-event times
go to --json as well. Decode rows are not causal on either side (torch's
is_causal is top-left aligned; with 1 to 4 rows over thousands of keys the
mask changes nothing measurable).

GB/s is attn's: the bytes a call must move at the least (the K and V rows of
every sequence once, q, o, lse, the bias) over the median time, to hold
against the copy rate (torch: 2 x 2 GiB moved, read and written, over the
median copy time) or `attn bandwidth` (the CPU's read rate).

  python3 bench/decode_bench.py --gpu --attn build-h200/tools/attn [--opencl] [--json F]
  python3 bench/decode_bench.py --cpu --attn build/tools/attn [--quick]
"""
import argparse
import json
import re
import statistics
import subprocess
import sys
import time

HQ, HKV, D = 32, 8, 128
# (batch, keys): the shapes of a serving step, one long sequence to many short ones.
DECODE = [(1, 8192), (1, 32768), (1, 131072), (8, 32768), (32, 4096)]
NQS = (1, 2, 4)
PAGES = (16, 256)
# The full-bias prefill row: a [B, H, N, N] bias is N / 4d = 8x the bytes of q, k, v and o at N = 4096.
PREFILL_GPU = dict(batch=2, heads=16, n=4096, dim=128)
PREFILL_CPU = dict(batch=1, heads=16, n=2048, dim=128)

FWD = re.compile(r"forward\s+([\d.]+) ms median of (\d+)[^,]*, ([\d.]+) GFLOP/s, ([\d.]+) GB/s")
READ = re.compile(r"read\s+([\d.]+) GB/s")


class Log:
    def __init__(self, path):
        self.f = open(path, "w") if path else None

    def write(self, text):
        if self.f:
            self.f.write(text)
            self.f.flush()


def attn_run(exe, backend, args, repeat, log, timeout=600):
    """One `attn run`: {'us', 'gbs', 'gflops'} or {'err': the reason}."""
    cmd = [exe, "run", "--backend", backend, "--repeat", str(repeat), "--no-check"] + [str(a) for a in args]
    log.write("$ " + " ".join(cmd) + "\n")
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        log.write("timed out\n")
        return {"err": "timed out after %d s" % timeout}
    log.write(p.stdout + p.stderr + "\n")
    m = FWD.search(p.stdout)
    if p.returncode != 0 or not m:
        last = (p.stderr.strip().splitlines() or ["exit %d" % p.returncode])[-1]
        return {"err": last.replace("attn run: ", "")}
    return {"us": float(m.group(1)) * 1e3, "gflops": float(m.group(3)), "gbs": float(m.group(4))}


def best_run(exe, backend, args, repeat, log, rounds):
    """The fastest of `rounds` processes' medians: a process whose threads share their cores with
    another task's has every call a scheduler slice long (12 ms where others took 0.3-1.6 on the
    host: OpenBLAS's pthreads pool spinning at start, CMakeLists.txt; any other busy task alike)."""
    runs = [attn_run(exe, backend, args, repeat, log) for _ in range(max(1, rounds))]
    ok = [r for r in runs if "us" in r]
    return min(ok, key=lambda r: r["us"]) if ok else runs[-1]


def attn_bandwidth(exe, log):
    cmd = [exe, "bandwidth", "--backend", "cpu"]
    log.write("$ " + " ".join(cmd) + "\n")
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    log.write(p.stdout + p.stderr + "\n")
    m = READ.search(p.stdout)
    return float(m.group(1)) if m else None


def decode_args(b, nk, nq, dtype, page=None):
    a = ["--batch", b, "--seqlen-q", nq, "--seqlen-k", nk, "--heads", HQ, "--heads-kv", HKV,
         "--dim", D, "--dtype", dtype, "--splits", "auto"]
    return a + (["--page-size", page] if page else [])


def row_name(b, nk, nq, page=None):
    k = "%dk" % (nk // 1024) if nk % 1024 == 0 else str(nk)
    return "%d x %s, q %d%s" % (b, k, nq, ", pages of %d" % page if page else "")


def fmt(x, p=1):
    return "-" if x is None else "%.*f" % (p, x)


def cell(r, key="us", p=1):
    if r is None:
        return "-"
    if "err" in r:
        return "n/a"
    return fmt(r.get(key), p)


def table(hdr, rows):
    print("| " + " | ".join(hdr) + " |")
    print("|" + " --- |" * len(hdr))
    for r in rows:
        print("| " + " | ".join(r) + " |")


def errors(results):
    """What failed, once per distinct reason, under the tables."""
    seen = {}
    for name, r in results:
        if r and "err" in r:
            seen.setdefault(r["err"], []).append(name)
    for err, names in seen.items():
        print("n/a (%s): %s" % (", ".join(names[:3]) + (" ..." if len(names) > 3 else ""), err))


# ---------------------------------------------------------------------------
# torch (--gpu only)
# ---------------------------------------------------------------------------

def torch_times(fn, repeat):
    """Median host-clock time of a synchronous call, and the median CUDA-event time, in µs."""
    import torch
    fn()
    torch.cuda.synchronize()
    host, ev = [], []
    for _ in range(repeat):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0 = time.perf_counter()
        s.record()
        fn()
        e.record()
        torch.cuda.synchronize()
        host.append((time.perf_counter() - t0) * 1e6)
        ev.append(s.elapsed_time(e) * 1e3)
    return statistics.median(host), statistics.median(ev)


def torch_copy_gbs(repeat=10):
    """Bytes moved (read and written) per second by a device-to-device copy of 2 GiB."""
    import torch
    n = 2 << 30
    x = torch.empty(n, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    _, t = torch_times(lambda: y.copy_(x), repeat)
    del x, y
    torch.cuda.empty_cache()
    return 2.0 * n / (t * 1e-6) / 1e9


def torch_sdpa(b, nk, nq, backend, repeat):
    """SDPA over GQA heads: {'us', 'us_event', 'gqa'} or {'err'}. A kernel that
    refuses enable_gqa runs on k and v expanded to every query head ('gqa':
    False), which reads 4x the bytes."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import sdpa_kernel
    q = torch.randn(b, HQ, nq, D, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(b, HKV, nk, D, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    out = {}
    try:
        with sdpa_kernel(backend):
            try:
                out["us"], out["us_event"] = torch_times(
                    lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True), repeat)
                out["gqa"] = True
            except (RuntimeError, TypeError):
                ke, ve = (x.repeat_interleave(HQ // HKV, dim=1) for x in (k, v))
                out["us"], out["us_event"] = torch_times(
                    lambda: F.scaled_dot_product_attention(q, ke, ve), repeat)
                out["gqa"] = False
                del ke, ve
    except Exception as e:  # the kernel refuses the shape altogether
        out = {"err": str(e).splitlines()[0][:100]}
    del q, k, v
    torch.cuda.empty_cache()
    return out


def torch_bias_prefill(pf, backend, with_bias, repeat):
    """The prefill row in torch: SDPA with a [B, H, N, N] bf16 mask (cuDNN and
    memory-efficient kernels take one; flash does not), or without."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import sdpa_kernel
    b, h, n, d = pf["batch"], pf["heads"], pf["n"], pf["dim"]
    q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    mask = torch.randn(b, h, n, n, device="cuda", dtype=torch.bfloat16) if with_bias else None
    try:
        with sdpa_kernel(backend):
            us, _ = torch_times(lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask), repeat)
        r = {"us": us}
    except Exception as e:
        r = {"err": str(e).splitlines()[0][:100]}
    del q, k, v, mask
    torch.cuda.empty_cache()
    return r


# ---------------------------------------------------------------------------
# The two modes
# ---------------------------------------------------------------------------

def gpu(a, log):
    import torch
    from torch.nn.attention import SDPBackend
    out = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__}
    out["copy_gbs"] = copy = torch_copy_gbs()
    print("device %s, torch %s: copy %.0f GB/s (2 x 2 GiB, read and written, over the median time)"
          % (out["device"], out["torch"], copy), flush=True)
    shapes = [(b, nk) for b, nk in DECODE if (b, nk) in a.shapes] if a.shapes else DECODE
    rows, res = [], []
    for b, nk in shapes:
        for nq in NQS:
            name = row_name(b, nk, nq)
            r = {"name": name, "batch": b, "keys": nk, "nq": nq}
            r["attn"] = attn_run(a.attn, "cuda", decode_args(b, nk, nq, "bf16"), a.repeat, log)
            r["flash"] = torch_sdpa(b, nk, nq, SDPBackend.FLASH_ATTENTION, a.repeat)
            r["cudnn"] = torch_sdpa(b, nk, nq, SDPBackend.CUDNN_ATTENTION, a.repeat)
            res.append(r)
            print(json.dumps(r), flush=True)
        for page in PAGES:
            name = row_name(b, nk, 1, page)
            base = next(x for x in res if x["batch"] == b and x["keys"] == nk and x["nq"] == 1)
            r = {"name": name, "batch": b, "keys": nk, "nq": 1, "page": page,
                 "attn": attn_run(a.attn, "cuda", decode_args(b, nk, 1, "bf16", page), a.repeat, log),
                 "flash": base["flash"], "cudnn": base["cudnn"], "unpaged_torch": True}
            res.append(r)
            print(json.dumps(r), flush=True)
    out["decode"] = res

    def torch_cell(t):
        if t is None or "err" in t:
            return "n/a"
        return fmt(t["us"]) + ("" if t.get("gqa", True) else " *")

    for r in res:
        ts = [t["us"] for t in (r["flash"], r["cudnn"]) if t and "us" in t]
        au = r["attn"].get("us")
        r["ratio"] = min(ts) / au if ts and au else None
        rows.append([r["name"], cell(r["attn"]), torch_cell(r["flash"]), torch_cell(r["cudnn"]),
                     fmt(r["ratio"], 2), cell(r["attn"], "gbs", 0),
                     fmt(r["attn"]["gbs"] / copy if "gbs" in r["attn"] else None, 2)])
    print("\nDecode, CUDA, bf16, %d query heads over %d KV heads, d = %d; µs per call (synchronous, median)."
          % (HQ, HKV, D))
    print("ratio = the faster torch time / attn's (above 1: attn is faster); paged rows against torch's "
          "unpaged time; * = k, v expanded to every query head (the kernel refused enable_gqa).")
    print("device copy %.0f GB/s.\n" % copy)
    table(["rows", "attn µs", "flash µs", "cuDNN µs", "ratio", "attn GB/s", "of copy"], rows)
    errors([(r["name"], r["attn"]) for r in res])

    if a.opencl:
        cl = []
        for b, nk in shapes:
            for page in (None,) + PAGES:
                args = decode_args(b, nk, 1, "bf16", page)
                r = attn_run(a.attn, "opencl", args, a.repeat, log)
                q = attn_run(a.attn, "opencl", args + ["--async"], a.repeat, log)
                cl.append({"name": row_name(b, nk, 1, page), "attn": r, "queued": q})
                print(json.dumps(cl[-1]), flush=True)
        out["opencl_decode"] = cl
        print("\nDecode, OpenCL (NVIDIA), bf16, q 1; against the device copy rate %.0f GB/s.\n" % copy)
        table(["rows", "attn µs", "attn GB/s", "of copy", "queued µs", "queued of copy"],
              [[r["name"], cell(r["attn"]), cell(r["attn"], "gbs", 0),
                fmt(r["attn"]["gbs"] / copy if "gbs" in r["attn"] else None, 2), cell(r["queued"]),
                fmt(r["queued"]["gbs"] / copy if "gbs" in r["queued"] else None, 2)] for r in cl])
        errors([(r["name"], r["attn"]) for r in cl] + [(r["name"] + " queued", r["queued"]) for r in cl])

    prefill(a, log, out, ["cuda"] + (["opencl"] if a.opencl else []), PREFILL_GPU, "bf16", torch_rows=True)
    return out


def prefill(a, log, out, backends, pf, dtype, torch_rows=False):
    args = ["--batch", pf["batch"], "--seqlen", pf["n"], "--heads", pf["heads"], "--dim", pf["dim"],
            "--dtype", dtype]
    rows, res = [], []
    for be in backends:
        plain = attn_run(a.attn, be, args, a.prefill_repeat, log)
        bias = attn_run(a.attn, be, args + ["--bias"], a.prefill_repeat, log)
        res.append({"backend": "attn " + be, "plain": plain, "bias": bias})
    if torch_rows:
        from torch.nn.attention import SDPBackend
        for name, be in (("cuDNN", SDPBackend.CUDNN_ATTENTION), ("mem-efficient", SDPBackend.EFFICIENT_ATTENTION)):
            res.append({"backend": "torch " + name,
                        "plain": torch_bias_prefill(pf, be, False, a.prefill_repeat),
                        "bias": torch_bias_prefill(pf, be, True, a.prefill_repeat)})
    for r in res:
        p, b = r["plain"].get("us"), r["bias"].get("us")
        r["ratio"] = b / p if p and b else None
        rows.append([r["backend"], cell(r["plain"], "us", 0), cell(r["bias"], "us", 0), fmt(r["ratio"], 2),
                     cell(r["bias"], "gbs", 0)])
        print(json.dumps(r), flush=True)
    out["prefill_bias"] = res
    print("\nFull-bias prefill: B = %d, H = %d, N = %d, d = %d, %s, bias [B, H, N, N] in %s; µs per call."
          % (pf["batch"], pf["heads"], pf["n"], pf["dim"], dtype, dtype))
    print("ratio = with the bias / without (the bias's bytes are %.1fx those of q, k, v, o).\n"
          % (pf["n"] / (4.0 * pf["dim"])))
    table(["", "no bias µs", "bias µs", "ratio", "bias GB/s"], rows)
    errors([(r["backend"], r["bias"]) for r in res] + [(r["backend"], r["plain"]) for r in res])


def cpu(a, log):
    """Each row beside the read rate measured just before it: on a shared machine the rate moves
    by half between minutes, so one rate for the whole table would decide the ratios."""
    out = {}
    div = 16 if a.quick else 1
    shapes = a.shapes or [(1, 8192), (1, 32768), (4, 8192)]
    rows, res = [], []
    for dtype in a.dtypes.split(","):
        for b, nk in shapes:
            nk //= div
            for nq, page in [(1, None), (4, None)] + [(1, p) for p in PAGES]:
                name = "%s, %s" % (row_name(b, nk, nq, page), dtype)
                bw = attn_bandwidth(a.attn, log)
                r = best_run(a.attn, "cpu", decode_args(b, nk, nq, dtype, page), a.repeat, log,
                             a.rounds)
                res.append({"name": name, "attn": r, "bandwidth_gbs": bw})
                rows.append([name, cell(r), cell(r, "gbs"), fmt(bw, 1),
                             fmt(r["gbs"] / bw if "gbs" in r and bw else None, 2)])
                print(json.dumps(res[-1]), flush=True)
    out["decode"] = res
    print("\nDecode, CPU, %d query heads over %d KV heads, d = %d; µs per call (median); against the"
          " read rate of `attn bandwidth` just before the row; the faster of %d processes a row.\n"
          % (HQ, HKV, D, a.rounds))
    table(["rows", "attn µs", "attn GB/s", "read GB/s", "of read rate"], rows)
    errors([(r["name"], r["attn"]) for r in res])
    pf = dict(PREFILL_CPU)
    if a.quick:
        pf["n"] //= 4
    prefill(a, log, out, ["cpu"], pf, "f32")
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--gpu", action="store_true", help="CUDA (and --opencl) beside torch on the GPU")
    mode.add_argument("--cpu", action="store_true", help="the CPU backend beside attn bandwidth")
    ap.add_argument("--attn", default="build/tools/attn", help="the attn program")
    ap.add_argument("--opencl", action="store_true", help="--gpu: also the OpenCL backend's rows")
    ap.add_argument("--shapes", default="", help="BxKEYS,... (e.g. 1x8192,8x32768): these rows only")
    ap.add_argument("--dtypes", default="bf16,f32", help="--cpu: the dtypes of the decode rows")
    ap.add_argument("--repeat", type=int, default=0, help="timed calls per row (gpu 50, cpu 5)")
    ap.add_argument("--rounds", type=int, default=2,
                    help="cpu: processes per row, the fastest median kept (2)")
    ap.add_argument("--prefill-repeat", type=int, default=0, help="timed calls per prefill row (gpu 10, cpu 2)")
    ap.add_argument("--quick", action="store_true", help="--cpu: keys and prefill length cut 16x / 4x")
    ap.add_argument("--json", help="write every figure here")
    ap.add_argument("--log", help="every attn run's command and output")
    a = ap.parse_args()
    a.shapes = [tuple(int(x) for x in s.split("x")) for s in a.shapes.split(",") if s]
    a.repeat = a.repeat or (50 if a.gpu else 5)
    a.prefill_repeat = a.prefill_repeat or (10 if a.gpu else 2)
    log = Log(a.log)
    out = gpu(a, log) if a.gpu else cpu(a, log)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
