"""attn for PyTorch: attention() is a torch.autograd.Function that runs attn's
forward and backward passes, a drop-in for
torch.nn.functional.scaled_dot_product_attention in a training step.

    from attn.torch import attention
    o = attention(q, k, v, is_causal=True)     # q, k, v: [batch, heads, seqlen, head_dim]

No copy is made: SDPA's [batch, heads, seqlen, head_dim] tensors go to attn as
transposed views (attn takes any strides). CUDA tensors run on their device's
context, on torch's current stream, without waiting; CPU tensors on the
default context (ATTN_BACKEND). Outputs and gradients are allocated by torch.
"""

import torch

import attn

__all__ = ["attention"]


def _context(t, context):
    if isinstance(context, attn.Context):
        return context
    if context is not None:
        return attn.default_context(str(context))
    if t.is_cuda:
        return attn.default_context("cuda:%d" % t.device.index)
    return attn.default_context(None)


def _run(context, t, call):
    """call(asynchronous) on torch's current stream for CUDA tensors, the
    context's own stream restored afterwards."""
    if not t.is_cuda or context.backend != "cuda":
        return call(False)
    context.stream = torch.cuda.current_stream(t.device).cuda_stream
    try:
        return call(True)
    finally:
        context.stream = None


class _Attention(torch.autograd.Function):
    """q, k, v in bshd views; bias and sinks may be None; opts: attn's
    keywords for the score."""

    @staticmethod
    def forward(ctx, q, k, v, bias, sinks, opts, context):
        context = _context(q, context)
        # The lse pair keeps float32 gradients as exact as naive attention's
        # at any logit size; 16-bit backward kernels read its first half.
        o, lse = _run(
            context,
            q,
            lambda asynchronous: attn.forward(
                q,
                k,
                v,
                bias=bias,
                sinks=sinks,
                context=context,
                lse_hilo=q.dtype == torch.float32,
                asynchronous=asynchronous,
                **opts,
            ),
        )
        ctx.save_for_backward(q, k, v, o, lse, bias, sinks)
        ctx.opts = opts
        ctx.context = context
        return o

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, do):
        q, k, v, o, lse, bias, sinks = ctx.saved_tensors
        want_dbias = bias is not None and ctx.needs_input_grad[3]
        want_dsinks = sinks is not None and ctx.needs_input_grad[4]
        grads = _run(
            ctx.context,
            q,
            lambda asynchronous: attn.backward(
                do,
                q,
                k,
                v,
                o,
                lse,
                bias=bias,
                sinks=sinks,
                dbias=want_dbias,
                dsinks=want_dsinks,
                deterministic=torch.are_deterministic_algorithms_enabled(),
                context=ctx.context,
                asynchronous=asynchronous,
                **ctx.opts,
            ),
        )
        dq, dk, dv = grads[:3]
        rest = list(grads[3:])
        dbias = rest.pop(0).to(bias.dtype) if want_dbias else None
        dsinks = rest.pop(0) if want_dsinks else None
        return dq, dk, dv, dbias, dsinks, None, None


def _causal_top_left(nq, nk, like):
    """SDPA's is_causal for fewer query rows than keys, where its top-left
    alignment hides more than any window of attn's (bottom-right) can: an
    additive mask, -inf above the diagonal j = i."""
    keep = torch.ones(nq, nk, dtype=torch.bool, device=like.device).tril()
    bias = torch.zeros(nq, nk, dtype=like.dtype, device=like.device)
    return bias.masked_fill(~keep, float("-inf"))[None, None]


def attention(
    query,
    key,
    value,
    attn_mask=None,
    dropout_p=0.0,
    is_causal=False,
    scale=None,
    enable_gqa=False,
    *,
    window=None,
    softcap=0.0,
    alibi_slopes=None,
    sinks=None,
    layout="bhsd",
    context=None,
):
    """softmax(query key^T * scale + mask) value, with gradients for query,
    key, value, a float attn_mask and sinks.

    The positional arguments are scaled_dot_product_attention's: tensors
    [batch, heads, seqlen, head_dim] (or [heads, seqlen, head_dim]); attn_mask
    boolean (True: attend) or additive float, broadcastable to [batch, heads,
    seqlen_q, seqlen_k]; is_causal aligned to the top-left corner as SDPA's
    (key j visible to row i when j <= i); enable_gqa to allow fewer key/value
    heads than query heads. dropout_p must be 0: attn has no dropout. A row
    that the mask leaves with no key gets 0 (SDPA gives NaN there).

    attn's own terms: window=(left, right) aligned to the bottom-right corner
    (diag = i + seqlen_k - seqlen_q; key j visible when diag - left <= j <=
    diag + right, -1 for no bound), softcap, alibi_slopes (float32
    [heads_q]), sinks (float32 [heads_q], a logit per head in every row's
    denominator, with a gradient). layout="bshd" takes and returns
    [batch, seqlen, heads, head_dim] tensors instead. context: an
    attn.Context or spec; None picks the tensors' device.
    """
    if dropout_p != 0.0:
        raise ValueError("attn has no dropout: dropout_p must be 0, got %r" % (dropout_p,))
    if layout not in ("bhsd", "bshd"):
        raise ValueError("layout must be 'bhsd' or 'bshd', got %r" % (layout,))
    if is_causal and attn_mask is not None:
        raise ValueError(
            "give attn_mask or is_causal, not both (as for scaled_dot_product_attention)"
        )
    if is_causal and window is not None:
        raise ValueError(
            "is_causal (top-left, SDPA's) and window (bottom-right, attn's) do not combine; "
            "window=(left, 0) is attn's causal window"
        )
    unbatched = query.dim() == 3
    if unbatched:
        query, key, value = query.unsqueeze(0), key.unsqueeze(0), value.unsqueeze(0)
    heads = 1 if layout == "bhsd" else 2
    seq = 3 - heads
    if layout == "bhsd" and query.shape[heads] != key.shape[heads] and not enable_gqa:
        raise ValueError(
            "query has %d heads and key %d: pass enable_gqa=True for grouped-query attention"
            % (query.shape[heads], key.shape[heads])
        )
    nq, nk = query.shape[seq], key.shape[seq]
    opts = dict(scale=scale, softcap=softcap, alibi_slopes=alibi_slopes)
    if window is not None:
        opts["window"] = tuple(window)
    bias = None
    if is_causal:
        if nq == nk:
            opts["causal"] = True
        elif nq > nk:
            opts["window"] = (-1, nq - nk)  # diag + (nq - nk) = i
        else:
            bias = _causal_top_left(nq, nk, query)
    if attn_mask is not None:
        bias = attn_mask
        if bias.dtype == torch.bool:
            bias = torch.zeros(bias.shape, dtype=query.dtype, device=bias.device).masked_fill(
                ~bias, float("-inf")
            )
        while bias.dim() < 4:
            bias = bias.unsqueeze(0)
        if bias.shape[3] != nk:  # attn broadcasts the first three dimensions only
            bias = bias.expand(*bias.shape[:3], nk).contiguous()
    if layout == "bhsd":
        q, k, v = query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2)
    else:
        q, k, v = query, key, value
    o = _Attention.apply(q, k, v, bias, sinks, opts, context)
    if layout == "bhsd":
        o = o.transpose(1, 2)
    return o.squeeze(0) if unbatched else o
