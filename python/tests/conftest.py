"""Fixtures: every test that takes `ctx` runs once per backend of this machine
(cpu; opencl and cuda when the library has a device for them, skipped with
the library's reason otherwise)."""

import os
import sys

import numpy as np
import pytest

import attn

sys.path.insert(0, os.path.dirname(__file__))

BACKENDS = ("cpu", "opencl", "cuda")


@pytest.fixture(scope="session", params=BACKENDS)
def ctx(request):
    name = request.param
    entry = attn.info()["backends"][name]
    if not entry["devices"]:
        pytest.skip("%s: %s" % (name, entry["unavailable"] or "no device"))
    return attn.Context(name)


@pytest.fixture
def rng(request):
    # One seed per test, so a failure reproduces alone.
    return np.random.default_rng(abs(hash(request.node.name)) % (2**32))
