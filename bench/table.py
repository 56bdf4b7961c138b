#!/usr/bin/env python3
"""Markdown tables of attn bench's JSON lines (and bench/peer.py's), as bench/NOTES.md keeps them.

  python3 bench/table.py attn.jsonl peer.jsonl [...] [--output tables.md]

One table per device for the sweep's rows (seqlen_q = seqlen_k): a row per
dtype, head dim, mask and N; for each pass, each implementation's rate
(TFLOP/s on a GPU, GFLOP/s on a CPU) and, where a peer was timed, each attn
backend's ratio to the fastest peer of that row (above 1: attn is faster).
One table per device for the decoding rows (one query row over seqlen_k
keys): each implementation's median time in µs, attn's GB/s, and the
fastest peer's time over attn's (above 1: attn is faster). A row with an
error shows "err", one not timed "-". Where a file holds the same problem
and implementation twice, the later row counts.
"""
import argparse
import sys

import rows as R


def fmt_rate(x):
    return "%.0f" % x if x >= 1000 else "%.1f" % x if x >= 10 else "%.2f" % x


def cell(r, key, fmt):
    if r is None:
        return "-"
    if r.get("error") or r.get(key) is None:
        return "err"
    return fmt(r[key])


def header_line(rs, what):
    dev = rs[0]["device"]
    attn = sorted({r["impl_version"] for r in rs if r["impl"] == "attn"})
    peers = sorted({"%s %s" % (r["impl"], r["impl_version"]) for r in rs if r["impl"] != "attn"})
    days = sorted({r["timestamp"][:10] for r in rs})
    parts = ["attn " + "/".join(attn)] if attn else []
    parts += peers
    parts.append(days[0] if len(days) == 1 else "%s to %s" % (days[0], days[-1]))
    note = R.shape_note(rs)
    if note:
        parts.append(note)
    return "**%s** (%s), %s: %s." % (dev, rs[0]["device_kind"], what, "; ".join(parts))


def prefill_table(rs):
    key, unit = R.rate_unit(rs)
    labels = R.ordered(R.label(r) for r in rs)
    attn = [x for x in labels if R.is_attn(x)]
    peers = [x for x in labels if not R.is_attn(x)]
    passes = [p for p in ("fwd", "bwd") if any(r["pass"] == p for r in rs)]
    by = {(R.label(r), R.problem(r)): r for r in rs}
    # The columns: per pass, every implementation, then attn over the best peer.
    cols = []
    for p in passes:
        cols += [(p, x) for x in labels]
        if peers:
            cols += [(p, "ratio " + x) for x in attn]
    head = ["dtype", "d", "mask", "N"]
    uniform = bool(R.shape_note(rs))
    if not uniform:
        head.append("B × H")
    head += ["%s %s" % (p, x[11:] + "/best" if x.startswith("ratio ") else
                        x[5:] if R.is_attn(x) else x) for p, x in cols]
    out = [header_line(rs, "%s, attn's ratio to the fastest peer" % unit), "",
           "| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    keys = sorted({R.problem(r)[:-1] for r in rs},
                  key=lambda k: (k[1], k[2], R.mask_order(k[3]), k[5], k[6], k[7]))
    for k in keys:
        line = [k[1], str(k[2]), k[3], str(k[5])]
        if not uniform:
            line.append("%d × %d" % (k[6], k[7]))
        for p, x in cols:
            if x.startswith("ratio "):
                mine = by.get((x[6:], k + (p,)))
                best = [by[(y, k + (p,))][key] for y in peers
                        if (y, k + (p,)) in by and by[(y, k + (p,))].get(key)]
                ok = mine is not None and mine.get(key) and best
                line.append("%.2f" % (mine[key] / max(best)) if ok else "-")
            else:
                line.append(cell(by.get((x, k + (p,))), key, fmt_rate))
        out.append("| " + " | ".join(line) + " |")
    return out


def decode_table(rs):
    labels = R.ordered(R.label(r) for r in rs)
    attn = [x for x in labels if R.is_attn(x)]
    peers = [x for x in labels if not R.is_attn(x)]
    by = {(R.label(r), R.problem(r)): r for r in rs}
    head = ["dtype", "d", "mask", "batch × keys", "heads"]
    head += ["%s µs" % (x[5:] if R.is_attn(x) else x) for x in labels]
    head += ["%s GB/s" % x[5:] for x in attn]
    if peers:
        head += ["%s best/attn" % x[5:] for x in attn]
    out = [header_line(rs, "decoding steps (one query row per sequence), µs per call, attn's GB/s, "
                           "the fastest peer's time over attn's"), "",
           "| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    keys = sorted({R.problem(r) for r in rs},
                  key=lambda k: (k[1], k[2], R.mask_order(k[3]), k[6], k[5], k[7]))
    for k in keys:
        line = [k[1], str(k[2]), k[3], "%d × %d" % (k[6], k[5]),
                "%d/%d" % (k[7], k[8]) if k[7] != k[8] else str(k[7])]
        line += [cell(by.get((x, k)), "median_ms", lambda v: "%.1f" % (v * 1e3)) for x in labels]
        line += [cell(by.get((x, k)), "gbps", fmt_rate) for x in attn]
        if peers:
            for x in attn:
                mine = by.get((x, k))
                best = [by[(y, k)]["median_ms"] for y in peers
                        if (y, k) in by and by[(y, k)].get("median_ms")]
                ok = mine is not None and mine.get("median_ms") and best
                line.append("%.2f" % (min(best) / mine["median_ms"]) if ok else "-")
        out.append("| " + " | ".join(line) + " |")
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="+", help="JSON lines of attn bench and bench/peer.py")
    ap.add_argument("--output", help="write the tables here (default: stdout)")
    args = ap.parse_args()
    rows = R.read(args.files)
    if not rows:
        sys.exit("table.py: no rows in %s" % ", ".join(args.files))
    devices = sorted({r["device"] for r in rows}, key=lambda d: (not any(
        r["device_kind"] == "gpu" for r in rows if r["device"] == d), d))
    out = []
    for dev in devices:
        mine = [r for r in rows if r["device"] == dev]
        for pick, make in ((lambda r: not R.is_decode(r), prefill_table), (R.is_decode, decode_table)):
            rs = [r for r in mine if pick(r)]
            if rs:
                out += make(rs) + [""]
    text = "\n".join(out)
    if args.output:
        with open(args.output, "w") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
