#!/usr/bin/env python3
"""Charts of attn bench's JSON lines (and bench/peer.py's), as FlashAttention's README draws them.

  python3 bench/plot.py attn.jsonl peer.jsonl [...] [--outdir DIR]

One figure (a PNG) per pass, dtype and device; in it one panel per head
dim and mask, and in each panel grouped bars per sequence length, a bar per
implementation (attn's backends, then the peers), its value on top: TFLOP/s
on a GPU, GFLOP/s on a CPU. Decoding rows (one query row over seqlen_k keys)
get figures of their own, in GB/s (the bytes attn counts for the step, for
every implementation alike) by the number of keys. Rows with an error are
left out. Files are named PASS-DTYPE-DEVICE.png (decode-DTYPE-DEVICE.png),
written into --outdir (default: the current folder), and listed on stdout.
Needs matplotlib.
"""
import argparse
import os
import sys

import rows as R

PASS_NAMES = {"fwd": "Forward", "bwd": "Backward"}


def figure(plt, rs, colors, title, unit_key, unit, xkey, xlabel):
    """A figure of panels per (d, mask), grouped bars per x value."""
    dims = sorted({r["d"] for r in rs})
    masks = sorted({r["mask"] for r in rs}, key=R.mask_order)
    labels = R.ordered(R.label(r) for r in rs)
    fig, axes = plt.subplots(len(dims), len(masks), squeeze=False, layout="constrained",
                             figsize=(max(6.0, 5.2 * len(masks)), 3.8 * len(dims) + 0.8))
    for i, d in enumerate(dims):
        for j, m in enumerate(masks):
            ax = axes[i][j]
            mine = [r for r in rs if r["d"] == d and r["mask"] == m]
            xs = sorted({r[xkey] for r in mine})
            width = 0.8 / max(1, len(labels))
            for n, lab in enumerate(labels):
                by = {r[xkey]: r[unit_key] for r in mine if R.label(r) == lab}
                pos = [x + (n - (len(labels) - 1) / 2) * width for x in range(len(xs))]
                vals = [by.get(x, 0.0) for x in xs]
                bars = ax.bar(pos, vals, width, label=lab, color=colors[lab])
                for b, x in zip(bars, xs):
                    if x in by:
                        v = by[x]
                        ax.annotate("%.0f" % v if v >= 100 else "%.1f" % v if v >= 1 else "%.2f" % v,
                                    (b.get_x() + b.get_width() / 2, b.get_height()), ha="center",
                                    va="bottom", fontsize=6, rotation=90 if len(labels) > 3 else 0)
            ax.set_xticks(range(len(xs)))
            ax.set_xticklabels(["%dk" % (x // 1024) if x >= 1024 and x % 1024 == 0 else str(x) for x in xs])
            ax.set_xlabel(xlabel)
            ax.set_ylabel(unit)
            ax.set_title("head dim %d, %s" % (d, "no mask" if m == "none" else m), fontsize=10)
            ax.margins(y=0.15)
            ax.grid(axis="y", alpha=0.3)
    handles, names = axes[0][0].get_legend_handles_labels()
    fig.suptitle(title, fontsize=11)
    fig.legend(handles, names, loc="outside lower center", ncol=min(len(names), 5), fontsize=9)
    return fig


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="+", help="JSON lines of attn bench and bench/peer.py")
    ap.add_argument("--outdir", default=".", help="where the PNG files go (default: here)")
    args = ap.parse_args()
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        sys.exit("plot.py: matplotlib is not installed here (pip install matplotlib)")
    rows = [r for r in R.read(args.files) if not r.get("error") and r.get("median_ms")]
    if not rows:
        sys.exit("plot.py: no row with times in %s" % ", ".join(args.files))
    os.makedirs(args.outdir, exist_ok=True)
    # One color per implementation across every figure.
    palette = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    colors = {lab: palette[i % len(palette)] for i, lab in enumerate(R.ordered(R.label(r) for r in rows))}
    groups = {}
    for r in rows:
        kind = "decode" if R.is_decode(r) else r["pass"]
        groups.setdefault((kind, r["dtype"], r["device"]), []).append(r)
    for (kind, dtype, dev), rs in sorted(groups.items()):
        note = R.shape_note(rs)
        if kind == "decode":
            title = "Decoding step (one query row per sequence), %s, %s%s" % (
                dtype, dev, ": " + note if note else "")
            fig = figure(plt, rs, colors, title, "gbps", "GB/s", "seqlen_k", "keys (seqlen_k)")
        else:
            key, unit = R.rate_unit(rs)
            title = "%s pass, %s, %s%s" % (PASS_NAMES[kind], dtype, dev, ": " + note if note else "")
            fig = figure(plt, rs, colors, title, key, unit, "seqlen_k", "sequence length")
        path = os.path.join(args.outdir, "%s-%s-%s.png" % (kind, dtype, R.slug(dev)))
        fig.savefig(path, dpi=120)
        plt.close(fig)
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
