"""attn.forward and attn.backward on NumPy arrays, held to the float64
reference on every backend present."""

import numpy as np
import pytest

import attn
from helpers import assert_close, ml_dtypes, randn
from reference import reference


def problem(rng, b=2, nq=24, nk=24, hq=4, hkv=4, d=32, dtype="f32"):
    q = randn(rng, (b, nq, hq, d), dtype)
    k = randn(rng, (b, nk, hkv, d), dtype)
    v = randn(rng, (b, nk, hkv, d), dtype)
    do = randn(rng, (b, nq, hq, d), dtype)
    return q, k, v, do


def check_both(ctx, q, k, v, do, dtype="f32", **kw):
    """Forward and backward against the reference, with the same keywords."""
    ref = reference(q, k, v, do, **kw)
    fwd = dict(kw)
    if "window" in fwd and fwd["window"] == (-1, -1):
        del fwd["window"]
    o, lse = attn.forward(q, k, v, context=ctx, **fwd)
    assert o.dtype == q.dtype and lse.dtype == np.float32
    assert_close(o, ref["o"], dtype, "o")
    assert_close(lse, ref["lse"], dtype, "lse")
    dq, dk, dv = attn.backward(do, q, k, v, o, lse, context=ctx, **fwd)
    for name, got in (("dq", dq), ("dk", dk), ("dv", dv)):
        assert_close(got, ref[name], dtype, name)


def test_forward_and_backward_match_reference(ctx, rng):
    check_both(ctx, *problem(rng))


@pytest.mark.parametrize("nq,nk", [(24, 24), (8, 40), (40, 8)])
def test_causal_is_aligned_bottom_right(ctx, rng, nq, nk):
    check_both(ctx, *problem(rng, nq=nq, nk=nk), causal=True)


def test_causal_row_with_no_key_gives_zero_and_minus_inf(ctx, rng):
    q, k, v, _ = problem(rng, nq=16, nk=4)
    o, lse = attn.forward(q, k, v, causal=True, context=ctx)
    # diag = i + 4 - 16 < 0 for the first 12 rows: they see no key.
    assert np.all(o[:, :12] == 0)
    assert np.all(np.isneginf(lse[:, :, :12]))
    assert np.all(np.isfinite(lse[:, :, 12:]))


def test_sliding_window(ctx, rng):
    check_both(ctx, *problem(rng, nq=32, nk=32), window=(5, 2))


def test_window_with_one_bound(ctx, rng):
    check_both(ctx, *problem(rng, nq=20, nk=28), window=(None, 3))


def test_softcap(ctx, rng):
    q, k, v, do = problem(rng)
    check_both(ctx, q * 4, k * 4, v, do, softcap=5.0)


def test_alibi(ctx, rng):
    slopes = np.array([0.5, 0.25, 0.125, 0.0625], np.float32)
    check_both(ctx, *problem(rng), alibi_slopes=slopes, causal=True)


def test_alibi_slopes_as_a_list(ctx, rng):
    q, k, v, _ = problem(rng)
    slopes = [0.5, 0.25, 0.125, 0.0625]
    o, _ = attn.forward(q, k, v, alibi_slopes=slopes, context=ctx)
    assert_close(o, reference(q, k, v, alibi_slopes=slopes)["o"])


def test_scale(ctx, rng):
    check_both(ctx, *problem(rng), scale=0.5)


@pytest.mark.parametrize("hkv", [2, 1])
def test_grouped_and_multi_query(ctx, rng, hkv):
    check_both(ctx, *problem(rng, hq=4, hkv=hkv), causal=True)


@pytest.mark.parametrize("d", [16, 64, 80, 128])
def test_head_dims(ctx, rng, d):
    check_both(ctx, *problem(rng, b=1, nq=20, nk=20, hq=2, hkv=2, d=d))


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_16_bit_dtypes(ctx, rng, dtype):
    if dtype == "bf16" and ml_dtypes is None:
        pytest.skip("ml_dtypes is not installed (NumPy's bfloat16)")
    q, k, v, do = problem(rng, dtype=dtype)
    check_both(ctx, q, k, v, do, dtype=dtype, causal=True)


def test_varlen(ctx, rng):
    cu_q = np.array([0, 5, 5, 17], np.int32)  # the second sequence is empty
    cu_k = np.array([0, 9, 12, 30], np.int32)
    q = randn(rng, (17, 4, 32))
    k = randn(rng, (30, 2, 32))
    v = randn(rng, (30, 2, 32))
    do = randn(rng, (17, 4, 32))
    kw = dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, causal=True)
    ref = reference(q, k, v, do, **kw)
    o, lse = attn.forward(q, k, v, context=ctx, **kw)
    assert lse.shape == (4, 17)
    assert_close(o, ref["o"], name="o")
    assert_close(lse, ref["lse"], name="lse")
    dq, dk, dv = attn.backward(do, q, k, v, o, lse, context=ctx, **kw)
    assert_close(dq, ref["dq"], name="dq")
    assert_close(dk, ref["dk"], name="dk")
    assert_close(dv, ref["dv"], name="dv")


def test_varlen_offsets_as_lists(ctx, rng):
    q, k, v = randn(rng, (10, 2, 16)), randn(rng, (12, 2, 16)), randn(rng, (12, 2, 16))
    o, _ = attn.forward(q, k, v, cu_seqlens_q=[0, 4, 10], cu_seqlens_k=[0, 6, 12], context=ctx)
    ref = reference(q, k, v, cu_seqlens_q=[0, 4, 10], cu_seqlens_k=[0, 6, 12])
    assert_close(o, ref["o"])


def test_kv_cache_with_used_lengths(ctx, rng):
    q = randn(rng, (3, 1, 4, 32))
    k = randn(rng, (3, 40, 2, 32))
    v = randn(rng, (3, 40, 2, 32))
    used = np.array([7, 40, 1], np.int32)
    o, lse = attn.forward(q, k, v, seqused_k=used, causal=True, context=ctx)
    ref = reference(q, k, v, seqused_k=used, causal=True)
    assert_close(o, ref["o"], name="o")
    assert_close(lse, ref["lse"], name="lse")


def test_kv_cache_append_writes_the_cache_in_place(ctx, rng):
    k = randn(rng, (2, 24, 2, 32))
    v = randn(rng, (2, 24, 2, 32))
    q = randn(rng, (2, 3, 4, 32))
    k_new, v_new = randn(rng, (2, 3, 2, 32)), randn(rng, (2, 3, 2, 32))
    used = np.array([5, 20], np.int32)
    ref = reference(q, k, v, seqused_k=used, k_new=k_new, v_new=v_new, causal=True)
    o, _ = attn.forward(q, k, v, seqused_k=used, k_new=k_new, v_new=v_new, causal=True, context=ctx)
    assert_close(o, ref["o"], name="o")
    np.testing.assert_array_equal(k, ref["k_out"].astype(np.float32))
    np.testing.assert_array_equal(v, ref["v_out"].astype(np.float32))
    np.testing.assert_array_equal(used, [5, 20])  # the caller advances it


def test_paged_kv_cache_with_block_table(ctx, rng):
    page, pages = 4, 12
    k = randn(rng, (pages, page, 2, 32))
    v = randn(rng, (pages, page, 2, 32))
    q = randn(rng, (2, 2, 4, 32))
    table = np.array([[3, 7, 0, 9], [11, 2, 5, 1]], np.int32)
    used = np.array([10, 13], np.int32)
    k_new, v_new = randn(rng, (2, 2, 2, 32)), randn(rng, (2, 2, 2, 32))
    kw = dict(seqused_k=used, block_table=table, causal=True)
    ref = reference(q, k, v, k_new=k_new, v_new=v_new, **kw)
    o, lse = attn.forward(q, k, v, k_new=k_new, v_new=v_new, context=ctx, **kw)
    assert_close(o, ref["o"], name="o")
    assert_close(lse, ref["lse"], name="lse")
    np.testing.assert_array_equal(k, ref["k_out"].astype(np.float32))


@pytest.mark.parametrize("splits", [1, 2, 5])
def test_key_splits_agree(ctx, rng, splits):
    q = randn(rng, (1, 1, 4, 64))
    k, v = randn(rng, (1, 300, 4, 64)), randn(rng, (1, 300, 4, 64))
    o, lse = attn.forward(q, k, v, num_splits=splits, context=ctx)
    ref = reference(q, k, v)
    assert_close(o, ref["o"], name="o")
    assert_close(lse, ref["lse"], name="lse")


@pytest.mark.parametrize("shape", [(2, 4, 24, 24), (1, 4, 24, 24), (2, 1, 1, 24)])
def test_bias_and_its_gradient(ctx, rng, shape):
    q, k, v, do = problem(rng)
    bias = randn(rng, shape)
    bias[..., 3] = -np.inf  # hides key 3, as a mask does
    ref = reference(q, k, v, do, bias=bias)
    o, lse = attn.forward(q, k, v, bias=bias, context=ctx)
    assert_close(o, ref["o"], name="o")
    dq, dk, dv, dbias = attn.backward(do, q, k, v, o, lse, bias=bias, dbias=True, context=ctx)
    assert dbias.shape == shape and dbias.dtype == np.float32
    for name, got in (("dq", dq), ("dk", dk), ("dv", dv), ("dbias", dbias)):
        assert_close(got, ref[name], name=name)


def test_sinks_and_their_gradient(ctx, rng):
    q, k, v, do = problem(rng)
    sinks = np.array([0.5, -1.0, 2.0, 0.0], np.float32)
    ref = reference(q, k, v, do, sinks=sinks, causal=True)
    o, lse = attn.forward(q, k, v, sinks=sinks, causal=True, context=ctx)
    assert_close(o, ref["o"], name="o")
    assert_close(lse, ref["lse"], name="lse")
    dq, dk, dv, dsinks = attn.backward(
        do, q, k, v, o, lse, sinks=sinks, dsinks=True, causal=True, context=ctx
    )
    for name, got in (("dq", dq), ("dk", dk), ("dv", dv), ("dsinks", dsinks)):
        assert_close(got, ref[name], name=name)


def test_bias_and_sinks_gradients_together(ctx, rng):
    q, k, v, do = problem(rng)
    bias, sinks = randn(rng, (1, 4, 24, 24)), np.array([1, 0, -1, 2], np.float32)
    ref = reference(q, k, v, do, bias=bias, sinks=sinks)
    o, lse = attn.forward(q, k, v, bias=bias, sinks=sinks, context=ctx)
    grads = attn.backward(
        do, q, k, v, o, lse, bias=bias, sinks=sinks, dbias=True, dsinks=True, context=ctx
    )
    assert len(grads) == 5
    assert_close(grads[3], ref["dbias"], name="dbias")
    assert_close(grads[4], ref["dsinks"], name="dsinks")


def test_bhsd_views_need_no_copy(ctx, rng):
    # [batch, heads, seqlen, d] memory, given as its bshd view.
    q, k, v, do = (np.ascontiguousarray(x.transpose(0, 2, 1, 3)) for x in problem(rng, hkv=2))
    qv, kv, vv, dov = (x.transpose(0, 2, 1, 3) for x in (q, k, v, do))
    assert not qv.flags.c_contiguous
    ref = reference(qv, kv, vv, dov, causal=True)
    out = np.empty_like(q).transpose(0, 2, 1, 3)
    o, lse = attn.forward(qv, kv, vv, causal=True, out=out, context=ctx)
    assert o is out
    assert_close(o, ref["o"], name="o")
    dq, dk, dv = attn.backward(dov, qv, kv, vv, o, lse, causal=True, context=ctx)
    assert_close(dq, ref["dq"], name="dq")
    assert_close(dk, ref["dk"], name="dk")


def test_slices_of_a_fused_qkv_tensor(ctx, rng):
    qkv = randn(rng, (2, 24, 3, 4, 32))
    q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    o, _ = attn.forward(q, k, v, context=ctx)
    assert_close(o, reference(q, k, v)["o"])


def test_outputs_written_in_place(ctx, rng):
    q, k, v, do = problem(rng)
    out = np.full(q.shape, np.nan, np.float32)
    lse_out = np.full((2, 4, 24), np.nan, np.float32)
    o, lse = attn.forward(q, k, v, out=out, lse_out=lse_out, context=ctx)
    assert o is out and lse is lse_out
    assert_close(out, reference(q, k, v)["o"])
    dq = np.empty_like(q)
    assert attn.backward(do, q, k, v, o, lse, dq=dq, context=ctx)[0] is dq


def test_forward_without_lse(ctx, rng):
    q, k, v, _ = problem(rng)
    o = attn.forward(q, k, v, return_lse=False, context=ctx)
    assert isinstance(o, np.ndarray)
    assert_close(o, reference(q, k, v)["o"])


def test_lse_pair_hi_is_the_lse(ctx, rng):
    q, k, v, do = problem(rng)
    o, pair = attn.forward(q * 30, k, v, lse_hilo=True, context=ctx)
    assert pair.shape == (2, 4, 24, 2)
    ref = reference(q * 30, k, v, do)
    assert_close(pair[..., 0], ref["lse"], name="lse hi")
    # lo is what rounding the row's lse to float32 dropped: within half an
    # ulp of hi, and hi is the plain lse.
    assert np.all(np.abs(pair[..., 1]) <= np.spacing(np.abs(pair[..., 0])) / 2)
    _, plain = attn.forward(q * 30, k, v, context=ctx)
    np.testing.assert_array_equal(pair[..., 0], plain)
    dq, _, _ = attn.backward(do, q * 30, k, v, o, pair, context=ctx)
    assert_close(dq, ref["dq"], name="dq")


def test_nan_in_gives_nan_out(ctx, rng):
    q, k, v, _ = problem(rng, b=1, nq=8, nk=8)
    k[0, 5, 0, 3] = np.nan  # key 5 of head 0: the rows that see it are NaN
    o, lse = attn.forward(q, k, v, causal=True, context=ctx)
    assert np.all(np.isnan(o[0, 5:, 0])) and np.all(np.isnan(lse[0, 0, 5:]))
    assert np.all(np.isfinite(o[0, :5, 0])) and np.all(np.isfinite(o[0, :, 1:]))


def test_merge_of_two_key_halves(ctx, rng):
    q, k, v, _ = problem(rng)
    parts = [attn.forward(q, k[:, s], v[:, s], context=ctx) for s in (slice(0, 10), slice(10, 24))]
    o, lse = attn.merge([p[0] for p in parts], [p[1] for p in parts], context=ctx)
    ref = reference(q, k, v)
    assert_close(o, ref["o"], name="o")
    assert_close(lse, ref["lse"], name="lse")


def test_supports(ctx, rng):
    q, k, v, _ = problem(rng)
    assert attn.supports(q, k, v, causal=True, context=ctx) is True
    assert attn.supports(q, k, v, backward=True, context=ctx) is True
    with pytest.raises(attn.Error) as e:
        attn.supports(q, k[..., :16], v, context=ctx)
    assert e.value.status == attn.Status.ESHAPE


def test_deterministic_backward_is_bit_identical(ctx, rng):
    q, k, v, do = problem(rng)
    o, lse = attn.forward(q, k, v, context=ctx)
    a = attn.backward(do, q, k, v, o, lse, deterministic=True, context=ctx)
    b = attn.backward(do, q, k, v, o, lse, deterministic=True, context=ctx)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)


def test_default_context_follows_attn_backend(rng):
    q, k, v, _ = problem(rng)
    o, _ = attn.forward(q, k, v)
    assert_close(o, reference(q, k, v)["o"])
    assert attn.default_context() is attn.default_context()


def test_context_by_name(rng):
    q, k, v, _ = problem(rng)
    o, _ = attn.forward(q, k, v, context="cpu")
    assert_close(o, reference(q, k, v)["o"])
    assert attn.default_context("cpu").backend == "cpu"
