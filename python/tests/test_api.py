"""The package's surface: contexts, info(), and errors that carry the
library's status and sentence."""

import pickle
import threading

import numpy as np
import pytest

import attn
from helpers import randn


def test_info_reports_version_backends_and_devices():
    info = attn.info()
    assert info["version"] == attn.__version__ == "0.1.0"
    assert set(info["backends"]) == {"cpu", "opencl", "cuda"}
    cpu = info["backends"]["cpu"]
    assert cpu["compiled"] and len(cpu["devices"]) == 1
    assert cpu["devices"][0]["backend"] == "cpu" and cpu["devices"][0]["compute_units"] >= 1
    for entry in info["backends"].values():
        assert bool(entry["devices"]) != bool(entry["unavailable"])


def test_context_names_its_backend_and_device(ctx):
    assert ctx.backend in ("cpu", "opencl", "cuda")
    assert ctx.spec == "%s:%d" % (ctx.backend, ctx.device)
    assert ctx.device_name == ctx.device_info["name"] != ""
    assert ctx.spec in repr(ctx)
    ctx.selftest()


def test_unknown_backend_raises_with_the_valid_names():
    with pytest.raises(attn.Error) as e:
        attn.Context("nonsense")
    assert e.value.status == attn.Status.EBACKEND
    assert "nonsense" in e.value.message and "cpu" in e.value.message


def test_explicit_backend_that_is_missing_is_an_error():
    if attn.info()["backends"]["cuda"]["devices"]:
        pytest.skip("this machine has a CUDA device")
    with pytest.raises(attn.Error) as e:
        attn.Context("cuda")
    assert e.value.status == attn.Status.EUNAVAILABLE
    assert e.value.message


def test_closed_context_refuses_calls():
    c = attn.Context("cpu")
    with c:
        pass
    assert c.closed
    q = np.zeros((1, 4, 1, 8), np.float32)
    with pytest.raises(attn.Error) as e:
        attn.forward(q, q, q, context=c)
    assert "closed" in e.value.message


def test_cpu_takes_no_stream():
    c = attn.Context("cpu")
    c.stream = None
    with pytest.raises(attn.Error):
        c.stream = 1234


def test_error_carries_status_name_and_message(ctx, rng):
    q = randn(rng, (1, 8, 2, 64))
    k = randn(rng, (1, 8, 2, 96))
    with pytest.raises(attn.Error) as e:
        attn.forward(q, k, k, context=ctx)
    err = e.value
    assert isinstance(err, RuntimeError)
    assert err.status == attn.Status.ESHAPE == 5 and err.status.name == "ESHAPE"
    assert err.message == "k: head_dim 96 differs from q's 64"
    assert str(err) == "ATTN_ESHAPE: " + err.message
    again = pickle.loads(pickle.dumps(err))
    assert (again.status, again.message) == (err.status, err.message)


def test_heads_that_do_not_divide(ctx, rng):
    q, k = randn(rng, (1, 8, 3, 16)), randn(rng, (1, 8, 2, 16))
    with pytest.raises(attn.Error) as e:
        attn.forward(q, k, k, context=ctx)
    assert e.value.status == attn.Status.EHEADS


def test_float64_is_refused_naming_the_argument(ctx):
    q = np.zeros((1, 4, 1, 8), np.float32)
    with pytest.raises(attn.Error) as e:
        attn.forward(q, q.astype(np.float64), q, context=ctx)
    assert e.value.status == attn.Status.EDTYPE and e.value.message.startswith("k: dtype float64")


def test_mixed_dtypes_are_refused(ctx):
    q = np.zeros((1, 4, 1, 8), np.float32)
    with pytest.raises(attn.Error) as e:
        attn.forward(q, q.astype(np.float16), q, context=ctx)
    assert e.value.status == attn.Status.EDTYPE


def test_read_only_output_is_refused(ctx, rng):
    q = randn(rng, (1, 4, 1, 8))
    out = np.zeros_like(q)
    out.flags.writeable = False
    with pytest.raises(attn.Error) as e:
        attn.forward(q, q, q, out=out, context=ctx)
    assert e.value.status == attn.Status.EINVAL and e.value.message.startswith("o: ")
    assert np.all(out == 0)


def test_read_only_inputs_are_read(ctx, rng):
    q = randn(rng, (1, 4, 1, 8))
    q.flags.writeable = False
    o, _ = attn.forward(q, q, q, context=ctx)
    assert np.all(np.isfinite(o))


def test_output_overlapping_an_input_is_refused(ctx, rng):
    q, k = randn(rng, (1, 4, 1, 8)), randn(rng, (1, 4, 1, 8))
    with pytest.raises(attn.Error) as e:
        attn.forward(q, k, k, out=q, context=ctx)
    assert e.value.status == attn.Status.EALIAS


def test_negative_strides_are_refused(ctx, rng):
    q = randn(rng, (1, 4, 1, 8))
    with pytest.raises(attn.Error) as e:
        attn.forward(q[:, ::-1], q, q, context=ctx)
    assert e.value.status == attn.Status.ESTRIDE and e.value.message.startswith("q: ")


def test_bad_varlen_offsets(ctx, rng):
    q = randn(rng, (6, 1, 8))
    with pytest.raises(attn.Error) as e:
        attn.forward(q, q, q, cu_seqlens_q=[0, 4, 3], cu_seqlens_k=[0, 3, 6], context=ctx)
    assert e.value.status == attn.Status.ESEQLENS


def test_cache_lengths_out_of_range(ctx, rng):
    q, k = randn(rng, (1, 1, 1, 8)), randn(rng, (1, 4, 1, 8))
    with pytest.raises(attn.Error) as e:
        attn.forward(q, k, k, seqused_k=[9], context=ctx)
    assert e.value.status == attn.Status.ECACHE


def test_bad_window(ctx, rng):
    q = randn(rng, (1, 4, 1, 8))
    with pytest.raises(attn.Error) as e:
        attn.forward(q, q, q, window=(-3, 0), context=ctx)
    assert e.value.status == attn.Status.EWINDOW
    with pytest.raises(TypeError):
        attn.forward(q, q, q, window=5, context=ctx)


def test_dbias_without_bias(ctx, rng):
    q = randn(rng, (1, 4, 1, 8))
    o, lse = attn.forward(q, q, q, context=ctx)
    with pytest.raises(attn.Error) as e:
        attn.backward(q, q, q, q, o, lse, dbias=True, context=ctx)
    assert e.value.message.startswith("dbias: ")


def test_not_an_array_is_a_type_error(ctx):
    q = np.zeros((1, 4, 1, 8), np.float32)
    with pytest.raises(TypeError, match="k: expected an array"):
        attn.forward(q, "nonsense", q, context=ctx)


def test_unknown_keyword_is_a_type_error():
    q = np.zeros((1, 4, 1, 8), np.float32)
    with pytest.raises(TypeError):
        attn.forward(q, q, q, nonsense=1)


def test_status_table_matches_the_library():
    assert attn.Status.OK == 0 and attn.Status.EALIAS == 12
    assert attn.STATUS_MESSAGES[attn.Status.EBUSY] == "the context is in use by another call"


def test_threads_with_contexts_of_their_own(rng):
    q, k, v = randn(rng, (2, 64, 4, 32)), randn(rng, (2, 64, 4, 32)), randn(rng, (2, 64, 4, 32))
    expected = attn.forward(q, k, v, context=attn.Context("cpu"))[0]
    results, errors = [None] * 4, []

    def work(i):
        try:
            for _ in range(5):
                results[i] = attn.forward(q, k, v, context="cpu")[0]
        except Exception as e:  # reported below, in the main thread
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for r in results:
        np.testing.assert_array_equal(r, expected)


def test_one_context_in_two_threads_is_busy_not_blocked(rng):
    shared = attn.Context("cpu")
    big = [randn(rng, (4, 1024, 8, 64)) for _ in range(3)]
    small = randn(rng, (1, 4, 1, 8))
    errors, done = [], threading.Event()

    def long_call():
        try:
            for _ in range(3):
                attn.forward(*big, context=shared)
        except attn.Error as e:
            errors.append(e)
        done.set()

    worker = threading.Thread(target=long_call)
    worker.start()
    while not done.is_set():
        try:
            attn.forward(small, small, small, context=shared)
        except attn.Error as e:
            errors.append(e)
    worker.join()
    assert errors, "no call found the context busy"
    for e in errors:
        assert e.status == attn.Status.EBUSY and "another thread" in e.message
