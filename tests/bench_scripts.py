#!/usr/bin/env python3
"""bench/table.py, bench/plot.py and bench/peer.py over a small attn bench sweep on the CPU,
bench/cl_ptx_report.sh over a program cache of one PTX file, one that ptxas rejects and one that
is not PTX, and bench/ab_run.sh over two builds (the same attn twice) on the CPU.

  bench_scripts.py ATTN_PROGRAM BENCH_DIR

table.py needs nothing beyond Python: it always runs. A peer twice as slow
as attn, made from attn's own rows, must give a ratio of 2.00 in every cell;
a row with an error shows "err". peer.py's reading of attn's rows always
runs too. plot.py runs where matplotlib is installed and peer.py's timing
where PyTorch is; each says when it is skipped. Exit status 0 when every
part that ran passed, 1 otherwise. cl_ptx_report.sh runs where ptxas is
found (on PATH or in /usr/local/cuda/bin).
"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

ATTN, BENCH = sys.argv[1], sys.argv[2]
SWEEP = ["--seqlens", "32,48", "--dims", "16", "--seqlen-k", "64", "--tokens", "96", "--hidden", "32",
         "--budget", "0", "--repeat", "2"]
failed = []


def check(cond, what):
    print("%s: %s" % ("ok" if cond else "FAIL", what))
    if not cond:
        failed.append(what)


def run(cmd):
    env = dict(os.environ, ATTN_BACKEND="cpu")
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)


def table_rows(text, header_start):
    """The body lines of the markdown table whose header starts so."""
    lines = text.splitlines()
    at = next((i for i, l in enumerate(lines) if l.startswith(header_start)), None)
    if at is None:
        return None, []
    body = []
    for l in lines[at + 2:]:
        if not l.startswith("|"):
            break
        body.append([c.strip() for c in l.strip("|").split("|")])
    return [c.strip() for c in lines[at].strip("|").split("|")], body


def main():
    tmp = tempfile.mkdtemp(prefix="attn-bench-scripts-")
    attn_rows = os.path.join(tmp, "attn.jsonl")
    r = run([ATTN, "bench"] + SWEEP + ["--format", "json", "--output", attn_rows])
    check(r.returncode == 0, "attn bench exits 0 (stderr: %s)" % r.stderr.strip())
    rows = [json.loads(l) for l in open(attn_rows)]
    check(len(rows) == 10, "attn bench wrote 10 rows (%d)" % len(rows))

    # A peer twice as slow, and attn's row N=48 causal bwd turned into an error.
    peer_rows = os.path.join(tmp, "peer.jsonl")
    with open(peer_rows, "w") as f:
        for x in rows:
            p = dict(x, impl="torch", backend="torch-cpu", tool="test", median_ms=x["median_ms"] * 2,
                     tflops=x["tflops"] / 2, gflops=x["gflops"] / 2, gbps=x["gbps"] / 2)
            f.write(json.dumps(p) + "\n")
    broken = os.path.join(tmp, "broken.jsonl")
    with open(broken, "w") as f:
        for x in rows:
            if (x["seqlen_q"], x["mask"], x["pass"]) == (48, "causal", "bwd"):
                x = dict(x, error="ATTN_ENOMEM: out of memory", median_ms=None, min_ms=None, tflops=None,
                         gflops=None, gbps=None, reps=0)
            f.write(json.dumps(x) + "\n")

    r = run([sys.executable, os.path.join(BENCH, "table.py"), attn_rows, peer_rows])
    check(r.returncode == 0, "table.py exits 0 (stderr: %s)" % r.stderr.strip())
    head, body = table_rows(r.stdout, "| dtype | d | mask | N |")
    check(head == ["dtype", "d", "mask", "N", "fwd cpu:0", "fwd torch-cpu", "fwd cpu:0/best", "bwd cpu:0",
                   "bwd torch-cpu", "bwd cpu:0/best"], "the sweep's table has its columns: %s" % head)
    check([b[:4] for b in body] == [["f32", "16", "none", "32"], ["f32", "16", "none", "48"],
                                    ["f32", "16", "causal", "32"], ["f32", "16", "causal", "48"]],
          "a table row per dtype, d, mask and N: %s" % [b[:4] for b in body])
    check(all(b[6] == "2.00" and b[9] == "2.00" for b in body),
          "attn over a peer twice as slow is 2.00 in every ratio cell: %s" % [(b[6], b[9]) for b in body])
    head, body = table_rows(r.stdout, "| dtype | d | mask | batch × keys |")
    check(len(body) == 2 and all(b[3] == "1 × 64" and b[-1] == "2.00" for b in body),
          "a decoding table with a row per mask, ratio 2.00: %s" % body)
    check("B·N = 96, H·d = 32" in r.stdout, "the header states B·N and H·d")

    r = run([sys.executable, os.path.join(BENCH, "table.py"), broken, peer_rows])
    head, body = table_rows(r.stdout, "| dtype | d | mask | N |")
    check(r.returncode == 0 and body and body[3][7:] == ["err", body[3][8], "-"],
          "an error row shows err and no ratio: %s" % (body[3] if body else r.stderr))

    try:
        import matplotlib  # noqa: F401
        have_mpl = True
    except ImportError:
        have_mpl = False
    if have_mpl:
        out = os.path.join(tmp, "png")
        r = run([sys.executable, os.path.join(BENCH, "plot.py"), attn_rows, peer_rows, "--outdir", out])
        check(r.returncode == 0, "plot.py exits 0 (stderr: %s)" % r.stderr.strip())
        names = sorted(os.listdir(out)) if os.path.isdir(out) else []
        dev = re.sub(r"[^A-Za-z0-9]+", "_", rows[0]["device"]).strip("_")
        want = sorted("%s-f32-%s.png" % (k, dev) for k in ("fwd", "bwd", "decode"))
        check(names == want, "plot.py draws a figure per pass and one of decoding: %s" % names)
        check(all(open(os.path.join(out, n), "rb").read(8) == b"\x89PNG\r\n\x1a\n" for n in names),
              "each figure is a PNG file")
    else:
        print("skipped: plot.py (matplotlib is not installed)")

    # peer.py --like's reading of the rows needs no PyTorch: a problem per attn row, each once.
    sys.path.insert(0, BENCH)
    import peer
    twice = os.path.join(tmp, "twice.jsonl")
    with open(twice, "w") as f:
        f.write(open(attn_rows).read() + "\n" + open(peer_rows).read() + open(attn_rows).read())
    got = peer.like(twice)
    check(len(got) == len(rows) and
          all((g["seqlen_q"], g["seqlen_k"], g["mask"], g["pass"], g["flops"], g["bytes"]) ==
              (a["seqlen_q"], a["seqlen_k"], a["mask"], a["pass"], a["flops"], a["bytes"])
              for g, a in zip(got, rows)),
          "peer.py --like reads each attn problem once, with its FLOPs, from a file that repeats them")
    not_json = os.path.join(tmp, "not_json.jsonl")
    with open(not_json, "w") as f:
        f.write(json.dumps(rows[0]) + "\n{\n")
    try:
        peer.like(not_json)
        said = "nothing"
    except SystemExit as e:
        said = str(e)
    check(said.startswith("peer.py: %s line 2 is not JSON" % not_json),
          "peer.py --like names the file and line that is not JSON: %s" % said)

    try:
        import torch  # noqa: F401
        have_torch = True
    except ImportError:
        have_torch = False
    if have_torch:
        r = run([sys.executable, os.path.join(BENCH, "peer.py"), "--like", attn_rows, "--budget", "0",
                 "--repeat", "1"])
        check(r.returncode == 0, "peer.py exits 0 (stderr: %s)" % r.stderr.strip())
        got = [json.loads(l) for l in r.stdout.splitlines()]
        same = all(g["backend"] == "torch-cpu" and g["error"] is None and g["reps"] == 1 and
                   (g["seqlen_q"], g["seqlen_k"], g["mask"], g["pass"], g["flops"], g["bytes"]) ==
                   (a["seqlen_q"], a["seqlen_k"], a["mask"], a["pass"], a["flops"], a["bytes"])
                   for g, a in zip(got, rows))
        check(len(got) == len(rows) and same, "peer.py --like times every row of attn's with its FLOPs")
    else:
        print("skipped: peer.py (PyTorch is not installed)")

    ptxas = shutil.which("ptxas") or "/usr/local/cuda/bin/ptxas"
    if os.access(ptxas, os.X_OK):
        # A cache file is a 40-byte header and the driver's binary: NVIDIA's
        # is PTX ending in a NUL, PoCL's is not PTX (it is left out). PTX that
        # ptxas rejects is reported with ptxas's message whole.
        cache = os.path.join(tmp, "cache")
        os.mkdir(cache)
        ptx = (".version 7.0\n.target sm_80\n.address_size 64\n"
               ".visible .entry attn_probe(.param .u64 p)\n{\n  .reg .b64 %rd<3>;\n"
               "  .reg .b32 %r<2>;\n  ld.param.u64 %rd1, [p];\n  cvta.to.global.u64 %rd2, %rd1;\n"
               "  mov.u32 %r1, 7;\n  st.global.u32 [%rd2], %r1;\n  ret;\n}\n")
        with open(os.path.join(cache, "ptx"), "wb") as f:
            f.write(b"\0" * 40 + ptx.encode() + b"\0")
        with open(os.path.join(cache, "broken"), "wb") as f:
            f.write(b"\0" * 40 + ptx.replace("st.global", "st.nowhere").encode() + b"\0")
        with open(os.path.join(cache, "other"), "wb") as f:
            f.write(b"\0" * 40 + b"\x7fELF not PTX")
        r = subprocess.run(["bash", os.path.join(BENCH, "cl_ptx_report.sh"), cache, "sm_80"],
                           env=dict(os.environ, PTXAS=ptxas), capture_output=True, text=True,
                           timeout=120)
        lines = r.stdout.splitlines()
        probe = [l.split() for l in lines if "attn_probe" in l]
        broken = [l for l in lines if l.startswith("broken: ptxas failed: ")]
        check(r.returncode == 0 and len(lines) == 3 and len(probe) == 1 and probe[0][0] == "ptx" and
              probe[0][2].isdigit() and probe[0][3:] == ["0", "0", "0"],
              "cl_ptx_report.sh reports the PTX file's kernel (%s)" % r.stdout.strip())
        check(len(broken) == 1 and "nowhere" in broken[0],
              "cl_ptx_report.sh keeps ptxas's message on PTX it rejects whole (%s)" % broken)
    else:
        print("skipped: cl_ptx_report.sh (no ptxas)")

    # ab_run.sh: two builds (attn twice) alternated on the CPU, a problem attn refuses, the budget.
    ab = os.path.join(BENCH, "ab_run.sh")
    env = dict(os.environ, BINS="%s %s" % (ATTN, ATTN), BACKEND="cpu", REPEAT="2", ROUNDS="2",
               BACKWARD="1", CACHE=os.path.join(tmp, "ab-cache"))
    r = subprocess.run(["bash", ab, "--dtype f32 --batch 1 --seqlen 40 --heads 2 --dim 16",
                        "--dim 1000"], env=env, capture_output=True, text=True, timeout=120)
    lines = r.stdout.splitlines()
    timed = re.compile(r"^r[12] --dtype f32 .* --dim 16 :: A [0-9.]+/[0-9.]+ \| B [0-9.]+/[0-9.]+ "
                       r"\([0-9]+ s\)$")
    check(r.returncode == 0 and len(lines) == 4 and all(timed.match(l) for l in lines[0::2]),
          "ab_run.sh gives both builds' forward/backward medians a problem and round (%s)" % lines)
    check(all(l.startswith("r") and ":: A - (" in l and "| B - (" in l and "--dim 1000" in l
              for l in lines[1::2]),
          "ab_run.sh marks a problem attn refuses with '-' and attn's message (%s)" % lines[1::2])
    r = subprocess.run(["bash", ab, "--dim 16"], env=dict(env, BUDGET_S="0"), capture_output=True,
                       text=True, timeout=60)
    check(r.returncode == 0 and r.stdout.startswith("stopped: 0 s spent before r1 --dim 16"),
          "ab_run.sh starts no problem past its budget (%s)" % r.stdout.strip())
    r = subprocess.run(["bash", ab, "--dim 16"], env=dict(env, BINS="/nonexistent/attn"),
                       capture_output=True, text=True, timeout=60)
    check(r.returncode == 2 and "/nonexistent/attn" in r.stderr,
          "ab_run.sh refuses a build that is not there (%s)" % r.stderr.strip())

    shutil.rmtree(tmp)
    print("%d failed" % len(failed) if failed else "all passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
