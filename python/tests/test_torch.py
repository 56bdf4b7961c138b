"""attn.torch.attention, the autograd Function: its outputs and gradients
against torch autograd through float64 attention (SDPA, or a naive form for
what SDPA lacks), on CPU tensors and, where there is one, a CUDA device."""

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")

import attn  # noqa: E402
from attn.torch import attention  # noqa: E402

F = torch.nn.functional
HAS_CUDA = torch.cuda.is_available() and bool(attn.info()["backends"]["cuda"]["devices"])
needs_cuda = pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device for both torch and attn")


def tensors(shapes, dtype=torch.float32, device="cpu", seed=0):
    g = torch.Generator().manual_seed(seed)
    return [
        torch.randn(s, generator=g).to(device=device, dtype=dtype).requires_grad_() for s in shapes
    ]


def grads_of(fn, inputs, weight):
    """fn(*inputs) and the gradients of sum(fn(...) * weight)."""
    for x in inputs:
        x.grad = None
    out = fn(*inputs)
    (out * weight).sum().backward()
    return out.detach(), [x.grad.detach().clone() for x in inputs]


def expected(fn, inputs, weight):
    """The same in float64, on float64 copies of the inputs."""
    wide = [x.detach().double().requires_grad_() for x in inputs]
    return grads_of(fn, wide, weight.double())


def assert_close(actual, expect, tol, name=""):
    err = (actual.double() - expect.double()).abs().max().item()
    bound = tol * max(1.0, expect.abs().max().item())
    assert err <= bound, "%s: max error %.3g above %.3g" % (name, err, bound)


def check(fn_attn, fn_ref, inputs, tol=2e-5):
    weight = torch.randn(
        fn_ref(*[x.detach().double() for x in inputs]).shape,
        generator=torch.Generator().manual_seed(1),
    )
    weight = weight.to(inputs[0].device)
    o, g = grads_of(fn_attn, inputs, weight.to(inputs[0].dtype))
    o_ref, g_ref = expected(fn_ref, inputs, weight)
    assert o.dtype == inputs[0].dtype
    assert_close(o, o_ref, tol, "o")
    for i, (a, e) in enumerate(zip(g, g_ref)):
        assert_close(a, e, tol, "grad %d" % i)


def naive(q, k, v, bias=None, sinks=None, scale=None):
    """softmax(q k^T scale + bias) v over [B, H, N, d], sinks as one more key
    of value zero."""
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    s = q @ k.transpose(-1, -2) * scale
    if bias is not None:
        s = s + bias
    if sinks is None:
        return s.softmax(-1) @ v
    sink = sinks.view(1, -1, 1, 1).expand(s.shape[0], -1, s.shape[2], 1)
    return torch.cat([s, sink], -1).softmax(-1)[..., :-1] @ v


def test_matches_sdpa_with_gradients():
    inputs = tensors([(2, 4, 24, 32)] * 3)
    check(attention, F.scaled_dot_product_attention, inputs)


@pytest.mark.parametrize("nq,nk", [(24, 24), (32, 20), (12, 30)])
def test_is_causal_is_sdpas_top_left(nq, nk):
    inputs = tensors([(2, 2, nq, 32), (2, 2, nk, 32), (2, 2, nk, 32)])
    check(
        lambda q, k, v: attention(q, k, v, is_causal=True),
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
        inputs,
    )


def test_grouped_query_attention():
    inputs = tensors([(2, 8, 16, 32), (2, 2, 16, 32), (2, 2, 16, 32)])
    check(
        lambda q, k, v: attention(q, k, v, enable_gqa=True), lambda q, k, v: naive(q, k, v), inputs
    )
    with pytest.raises(ValueError, match="enable_gqa"):
        attention(*inputs)


def test_boolean_mask():
    inputs = tensors([(2, 2, 16, 32)] * 3)
    mask = torch.rand(16, 16, generator=torch.Generator().manual_seed(3)) > 0.3
    mask[:, 0] = True  # every row sees a key (SDPA gives NaN for one that does not)
    check(
        lambda q, k, v: attention(q, k, v, attn_mask=mask),
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=mask),
        inputs,
    )


def test_float_mask_gets_its_gradient():
    inputs = tensors([(2, 2, 16, 32)] * 3 + [(1, 2, 16, 16)])
    check(
        lambda q, k, v, m: attention(q, k, v, attn_mask=m),
        lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m),
        inputs,
    )


def test_sinks_get_their_gradient():
    inputs = tensors([(2, 4, 16, 32)] * 3 + [(4,)])
    check(
        lambda q, k, v, s: attention(q, k, v, sinks=s),
        lambda q, k, v, s: naive(q, k, v, sinks=s),
        inputs,
    )


def test_scale_and_unbatched_inputs():
    inputs = tensors([(4, 16, 32)] * 3)
    check(
        lambda q, k, v: attention(q, k, v, scale=0.3),
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, scale=0.3),
        inputs,
    )


def test_bshd_layout():
    inputs = tensors([(2, 16, 4, 32)] * 3)
    check(
        lambda q, k, v: attention(q, k, v, layout="bshd", is_causal=True),
        lambda q, k, v: F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
        ).transpose(1, 2),
        inputs,
    )


def test_window_softcap_and_alibi_against_the_reference():
    from reference import reference

    q, k, v = tensors([(1, 16, 2, 32)] * 3)
    do = torch.randn(q.shape, generator=torch.Generator().manual_seed(5))
    kw = dict(window=(4, 1), softcap=3.0, alibi_slopes=[0.5, 0.25])
    o = attention(q, k, v, layout="bshd", **kw)
    o.backward(do)
    ref = reference(*(x.detach().numpy() for x in (q, k, v, do)), **kw)
    for name, got in (("o", o), ("dq", q.grad), ("dk", k.grad), ("dv", v.grad)):
        assert_close(got.detach(), torch.from_numpy(ref[name]), 2e-5, name)


def test_gradcheck_through_float32():
    # attn has no float64: gradcheck holds its gradients to finite
    # differences of its float32 results, with tolerances to match.
    def fn(q, k, v, m, s):
        return attention(
            q.float(), k.float(), v.float(), attn_mask=m.float(), sinks=s.float()
        ).double()

    g = torch.Generator().manual_seed(7)
    inputs = [
        torch.randn(s, generator=g, dtype=torch.float64).requires_grad_()
        for s in [(1, 2, 5, 8), (1, 2, 6, 8), (1, 2, 6, 8), (1, 2, 5, 6), (2,)]
    ]
    assert torch.autograd.gradcheck(fn, inputs, eps=1e-2, atol=5e-4, rtol=2e-3)


def test_bf16_on_the_cpu():
    inputs = tensors([(1, 2, 32, 64)] * 3, dtype=torch.bfloat16)
    check(
        lambda q, k, v: attention(q, k, v, is_causal=True),
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
        inputs,
        tol=3e-2,
    )


def test_a_training_step_matches_sdpa():
    class Block(torch.nn.Module):
        def __init__(self, fn):
            super().__init__()
            torch.manual_seed(0)
            self.qkv = torch.nn.Linear(64, 3 * 64)
            self.out = torch.nn.Linear(64, 64)
            self.fn = fn

        def forward(self, x):
            b, n, _ = x.shape
            q, k, v = self.qkv(x).view(b, n, 3, 4, 16).permute(2, 0, 3, 1, 4)
            return self.out(self.fn(q, k, v, is_causal=True).transpose(1, 2).reshape(b, n, 64))

    x = torch.randn(2, 20, 64, generator=torch.Generator().manual_seed(2))
    params = []
    for fn in (attention, F.scaled_dot_product_attention):
        model = Block(fn)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        model(x).square().mean().backward()
        opt.step()
        params.append([p.detach().clone() for p in model.parameters()])
    for a, b in zip(*params):
        assert_close(a, b, 1e-5)


def test_core_api_allocates_torch_tensors():
    q, k, v = (x.detach() for x in tensors([(1, 8, 2, 16)] * 3))
    o, lse = attn.forward(q, k, v, context="cpu")
    assert isinstance(o, torch.Tensor) and o.shape == q.shape and lse.dtype == torch.float32
    ref = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
    assert_close(o, ref.transpose(1, 2), 2e-5)


def test_dropout_is_refused():
    q = torch.zeros(1, 1, 4, 8)
    with pytest.raises(ValueError, match="dropout"):
        attention(q, q, q, dropout_p=0.1)


def test_float64_tensors_raise_attn_error():
    q = torch.zeros(1, 1, 4, 8, dtype=torch.float64)
    with pytest.raises(attn.Error) as e:
        attention(q, q, q)
    assert e.value.status == attn.Status.EDTYPE


@needs_cuda
@pytest.mark.parametrize("causal", [False, True])
def test_cuda_bf16_against_sdpa(causal):
    inputs = tensors([(2, 8, 256, 64)] * 3, dtype=torch.bfloat16, device="cuda")
    weight = torch.randn(2, 8, 256, 64, device="cuda", dtype=torch.bfloat16)
    o, g = grads_of(lambda q, k, v: attention(q, k, v, is_causal=causal), inputs, weight)
    o_bf, g_bf = grads_of(
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal), inputs, weight
    )
    o_ref, g_ref = expected(
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal), inputs, weight
    )
    # attn's bf16 error is held to a small multiple of SDPA's own bf16 error.
    for name, a, b, e in [("o", o, o_bf, o_ref)] + [
        ("grad", x, y, z) for x, y, z in zip(g, g_bf, g_ref)
    ]:
        err = (a.double() - e).abs().max().item()
        peer = (b.double() - e).abs().max().item()
        assert err <= 4 * peer + 1e-3, "%s: attn's error %.3g, SDPA's %.3g" % (name, err, peer)


@needs_cuda
def test_cuda_runs_on_the_current_stream():
    q, k, v = (
        x.detach() for x in tensors([(4, 8, 512, 64)] * 3, dtype=torch.float16, device="cuda")
    )
    expect = F.scaled_dot_product_attention(q.double(), k.double(), v.double())
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        scaled = q * 1  # queued on the side stream; attn must run after it
        o = attention(scaled, k, v)
        got = o.double()
    torch.cuda.current_stream().wait_stream(side)
    assert_close(got, expect, 4e-3)
    assert np.isfinite(got.abs().max().item())
