"""Reading attn bench's JSON lines (and bench/peer.py's, in the same schema), for
bench/table.py and bench/plot.py: the rows, how they group, and their labels."""
import json
import re

SCHEMA = 1


def lines(path, prog=""):
    """(line number, value) of each line of a JSON lines file that is not
    blank; a line that is not JSON ends the program, saying where (after prog,
    the program's name where it prefixes its messages)."""
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                r = json.loads(line)
            except ValueError as e:
                raise SystemExit("%s%s line %d is not JSON: %s" % (prog, path, n, e))
            yield n, r


def read(paths):
    """Every row of the files, in order; a row of the same implementation and
    problem as an earlier one replaces it (a later run of the same sweep)."""
    rows = {}
    for path in paths:
        for n, r in lines(path):
            if not isinstance(r, dict) or r.get("schema") != SCHEMA:
                raise SystemExit("%s line %d is not a row of schema %d" % (path, n, SCHEMA))
            rows[(label(r), problem(r))] = r
    return list(rows.values())


def problem(r):
    """What was timed, whoever timed it."""
    return (r["device"], r["dtype"], r["d"], r["mask"], r["seqlen_q"], r["seqlen_k"], r["batch"],
            r["heads"], r["heads_kv"], r["pass"])


def label(r):
    """An implementation's name: attn's backend ("attn cuda:0"), or the peer's
    own ("torch-flash")."""
    return "attn " + r["backend"] if r["impl"] == "attn" else r["backend"]


def is_attn(name):
    return name.startswith("attn ")


def is_decode(r):
    """A decoding row: fewer query rows than keys (attn bench's --seqlen-k)."""
    return r["seqlen_q"] != r["seqlen_k"]


def ordered(labels):
    """attn's backends first, then the peers, each sorted."""
    return sorted(set(labels), key=lambda s: (not is_attn(s), s))


def rate_unit(rows):
    """TFLOP/s on a GPU, GFLOP/s on a CPU: (key of the row, unit's name)."""
    gpu = any(r["device_kind"] == "gpu" for r in rows)
    return ("tflops", "TFLOP/s") if gpu else ("gflops", "GFLOP/s")


def shape_note(rows):
    """"B·N = 16384, H·d = 2048" where every row keeps both, else ""."""
    tokens = {r["batch"] * r["seqlen_k"] for r in rows}
    hidden = {r["heads"] * r["d"] for r in rows}
    kv = {(r["heads"], r["heads_kv"]) for r in rows if r["heads"] != r["heads_kv"]}
    parts = []
    if len(tokens) == 1:
        parts.append("B·N = %d" % tokens.pop())
    if len(hidden) == 1:
        parts.append("H·d = %d" % hidden.pop())
    if kv:
        parts.append("GQA " + ", ".join("%d/%d heads" % x for x in sorted(kv)))
    return ", ".join(parts)


def slug(s):
    return re.sub(r"[^A-Za-z0-9]+", "_", s).strip("_")


def mask_order(m):
    return (m != "none", m != "causal", m)
