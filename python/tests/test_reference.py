"""The tests' float64 reference agrees with the golden cases
(tests/golden/cases), the project's ground truth, on every case."""

import json
import os

import numpy as np
import pytest

from helpers import assert_close
from reference import reference

CASES = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "golden", "cases")
NAMES = sorted(os.listdir(CASES)) if os.path.isdir(CASES) else []


def load(folder, name, dtype):
    path = os.path.join(folder, name + ".npy")
    if not os.path.exists(path):
        return None
    a = np.load(path)
    if a.dtype != np.uint16:
        return a
    if dtype == "f16":
        return a.view(np.float16)
    return (a.astype(np.uint32) << 16).view(np.float32)  # bf16 bits


@pytest.mark.skipif(
    not NAMES, reason="the golden cases (tests/golden/cases) are not beside the tests"
)
@pytest.mark.parametrize("name", NAMES)
def test_reference_agrees_with_golden_case(name):
    folder = os.path.join(CASES, name)
    with open(os.path.join(folder, "case.json")) as f:
        case = json.load(f)
    dt = case["dtype"]
    inputs = {n: load(folder, n, dt) for n in ("q", "k", "v", "do", "k_new", "v_new")}
    bias = load(folder, "bias", case.get("bias_dtype", dt))
    r = reference(
        inputs["q"],
        inputs["k"],
        inputs["v"],
        inputs["do"],
        scale=case["scale"],
        causal=case["causal"],
        window=tuple(case["window"]),
        softcap=case["softcap"],
        alibi_slopes=case["alibi_slopes"],
        bias=bias,
        sinks=case.get("sinks"),
        cu_seqlens_q=case["cu_seqlens_q"],
        cu_seqlens_k=case["cu_seqlens_k"],
        seqused_k=case.get("seqused_k"),
        k_new=inputs["k_new"],
        v_new=inputs["v_new"],
        block_table=case.get("block_table"),
    )
    for out in ("o", "lse", "dq", "dk", "dv", "dbias", "dsinks", "k_out", "v_out"):
        expected = load(folder, out, dt)
        if expected is not None:
            assert_close(r[out], expected, name=out, tol=1e-5)
