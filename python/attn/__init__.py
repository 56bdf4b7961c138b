"""attn: transformer attention, softmax(Q K^T * scale) V, computed blockwise
with the online softmax (FlashAttention) on CUDA, OpenCL or the CPU.

    import numpy as np, attn
    q = k = v = np.random.rand(2, 128, 8, 64).astype(np.float32)  # [batch, seqlen, heads, head_dim]
    o, lse = attn.forward(q, k, v, causal=True)
    dq, dk, dv = attn.backward(np.ones_like(o), q, k, v, o, lse, causal=True)

Arrays come from any framework that speaks DLPack or the buffer protocol
(NumPy, PyTorch, CuPy, JAX) with no copy, with any strides, in host memory or
on the context's device; float32, float16 or bfloat16 (ml_dtypes.bfloat16 in
NumPy). q, k, v and o are [batch, seqlen, heads, head_dim] (bshd), or
[total_rows, heads, head_dim] with cu_seqlens_q/cu_seqlens_k (varlen); a
bhsd tensor goes in as its transposed view (x.transpose(0, 2, 1, 3) in NumPy,
x.transpose(1, 2) in torch). The exact semantics (causal alignment, windows,
GQA, softcap, ALiBi, bias, sinks, KV caches) are those of attn.h and the golden
cases' README. attn.torch is the autograd Function for PyTorch.

Outputs are allocated when not given: NumPy arrays for host inputs, arrays of
the input's framework on its device otherwise (torch, or any framework with
__array_namespace__); pass out= (and lse_out=, dq=, ...) to write in place.
Every failure raises attn.Error with the status and the library's sentence.
"""

import threading

import numpy as np

from . import _attn
from ._error import STATUS_MESSAGES, Error, Status

__all__ = [
    "Context",
    "Error",
    "Status",
    "STATUS_MESSAGES",
    "backward",
    "default_context",
    "forward",
    "info",
    "merge",
    "supports",
]

__version__ = _attn.info()["version"]

# DLPack's device types: host memory of either kind, and CUDA memory.
_DL_CPU, _DL_CUDA, _DL_CUDA_HOST = 1, 2, 3


def info():
    """What the library reports: its version, the largest head dimension, and
    for each backend ("cpu", "opencl", "cuda") whether it was compiled in, its
    devices (name, version, memory, compute units, ...) and, when it has none,
    why."""
    return _attn.info()


class Context:
    """A backend and one device of it, for one thread at a time.

    spec: "auto", "cpu", "opencl", "cuda", each optionally with ":N" for a
    device ("cuda:1"); None reads the environment variable ATTN_BACKEND (auto
    when unset). An explicit choice that cannot be met raises attn.Error
    (EUNAVAILABLE): there is no silent fallback. A context serves one call at
    a time; a call from a second thread meanwhile raises attn.Error (EBUSY).
    """

    def __init__(self, spec=None):
        self._native = _attn.Context(spec)

    @property
    def backend(self):
        """ "cpu", "opencl" or "cuda"."""
        return self._native.backend

    @property
    def device(self):
        """The device's index N, as in "backend:N"."""
        return self._native.device

    @property
    def spec(self):
        """ "backend:N", the specification that names this device."""
        return "%s:%d" % (self.backend, self.device)

    @property
    def device_info(self):
        """The device as the library reports it (a dict, as in info())."""
        return self._native.device_info

    @property
    def device_name(self):
        """The device's own name."""
        return self._native.device_info["name"]

    @property
    def stream(self):
        """The GPU queue the context's work runs on: a cudaStream_t (CUDA) or
        cl_command_queue (OpenCL) as an int, or None for the context's own.
        The CPU takes only None."""
        return self._native.stream

    @stream.setter
    def stream(self, handle):
        self._native.stream = None if handle is None else int(handle)

    @property
    def closed(self):
        return self._native.closed

    def synchronize(self):
        """Waits for the work the context queued (asynchronous=True calls)."""
        self._native.synchronize()

    def selftest(self):
        """Runs a tiny element-wise kernel on the device and checks it;
        raises attn.Error when the device does not work."""
        self._native.selftest()

    def tune(self, dtype, head_dim, seqlen=0):
        """Measures the backend's kernel configurations for dtype ("f32",
        "f16", "bf16") and head_dim and keeps the fastest (OpenCL; the other
        backends raise EUNSUPPORTED)."""
        self._native.tune(dtype, head_dim, seqlen)

    def close(self):
        """Frees the context now rather than when it is collected."""
        self._native.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        if self.closed:
            return "attn.Context(closed)"
        return "attn.Context(%r: %s)" % (self.spec, self.device_name)


_local = threading.local()


def default_context(spec=None):
    """This thread's context for spec (None: ATTN_BACKEND), made on first use
    and kept."""
    contexts = getattr(_local, "contexts", None)
    if contexts is None:
        contexts = _local.contexts = {}
    ctx = contexts.get(spec)
    if ctx is None or ctx.closed:
        ctx = contexts[spec] = Context(spec)
    return ctx


def _device_of(x):
    """(DLPack device type, id) of an array; host memory when it cannot say."""
    get = getattr(x, "__dlpack_device__", None)
    if get is None:
        return (_DL_CPU, 0)
    kind, index = get()
    return (int(kind), int(index))


def _context_for(context, q):
    """The context a call runs on: the one given, a spec's default, or for
    context=None the default for q's memory (CUDA memory: that device; host
    memory: ATTN_BACKEND)."""
    if isinstance(context, Context):
        return context
    if context is not None:
        return default_context(str(context))
    kind, index = _device_of(q)
    if kind == _DL_CUDA:
        return default_context("cuda:%d" % index)
    return default_context(None)


def _is_torch(x):
    return type(x).__module__.split(".")[0] == "torch"


def _input(x):
    """An array as the binding takes it: torch tensors detached (DLPack
    refuses one that requires grad; attn computes no autograd graph)."""
    if x is not None and _is_torch(x) and x.requires_grad:
        return x.detach()
    return x


def _array(x, name):
    """A required array argument, as _input gives it."""
    if not hasattr(x, "shape") or not hasattr(x, "dtype"):
        raise TypeError(
            "%s: expected an array (NumPy, PyTorch, CuPy, JAX: anything with __dlpack__ "
            "or the buffer protocol), got %s" % (name, type(x).__name__)
        )
    return _input(x)


def _host_array(x, dtype):
    """Lists and tuples (offsets, lengths, slopes, sinks) as NumPy arrays."""
    if isinstance(x, (list, tuple)):
        return np.asarray(x, dtype=dtype)
    return _input(x)


def _empty(like, shape, dtype=None):
    """A new array of shape in like's framework and memory; dtype None means
    like's dtype, else "float32"."""
    if isinstance(like, np.ndarray):
        return np.empty(shape, dtype=like.dtype if dtype is None else np.float32)
    if _is_torch(like):
        import torch

        return like.new_empty(shape, dtype=like.dtype if dtype is None else torch.float32)
    if type(like).__module__.split(".")[0] == "cupy":
        import cupy

        with cupy.cuda.Device(like.device.id):
            return cupy.empty(shape, dtype=like.dtype if dtype is None else cupy.float32)
    if _device_of(like)[0] in (_DL_CPU, _DL_CUDA_HOST):
        # NumPy for host memory of any other framework: it is writable, which
        # a JAX array is not.
        return np.empty(shape, dtype=np.dtype(like.dtype) if dtype is None else np.float32)
    namespace = getattr(like, "__array_namespace__", None)
    if namespace is not None:
        xp = namespace()
        return xp.empty(
            shape, dtype=like.dtype if dtype is None else xp.float32, device=like.device
        )
    raise TypeError(
        "cannot allocate an output beside a %s; pass the output arrays (out=, ...)"
        % type(like).__name__
    )


def _lse_shape(q, hilo):
    """lse's shape for q: [batch, heads, seqlen] (bshd) or [heads, total]
    (varlen), with a last dimension of 2 for the (hi, lo) pair."""
    shape = tuple(q.shape)
    if len(shape) == 4:
        rows = (shape[0], shape[2], shape[1])
    elif len(shape) == 3:
        rows = (shape[1], shape[0])
    else:
        rows = shape[:-1]  # the library names the wrong rank
    return rows + ((2,) if hilo else ())


def _window(window):
    if window is None:
        return -1, -1
    try:
        left, right = window
    except (TypeError, ValueError):
        raise TypeError("window: expected (left, right), got %r" % (window,)) from None
    return (-1 if left is None else int(left)), (-1 if right is None else int(right))


def _score_terms(
    causal, window, softcap, alibi_slopes, scale, cu_seqlens_q, cu_seqlens_k, bias, sinks
):
    """The keywords forward and backward share, as the binding takes them."""
    left, right = _window(window)
    return dict(
        causal=bool(causal),
        window_left=left,
        window_right=right,
        softcap=float(softcap),
        scale=0.0 if scale is None else float(scale),
        alibi_slopes=_host_array(alibi_slopes, np.float32),
        cu_seqlens_q=_host_array(cu_seqlens_q, np.int32),
        cu_seqlens_k=_host_array(cu_seqlens_k, np.int32),
        bias=_input(bias),
        sinks=_host_array(sinks, np.float32),
    )


def forward(
    q,
    k,
    v,
    *,
    causal=False,
    window=None,
    softcap=0.0,
    alibi_slopes=None,
    scale=None,
    cu_seqlens_q=None,
    cu_seqlens_k=None,
    seqused_k=None,
    k_new=None,
    v_new=None,
    block_table=None,
    num_splits=0,
    bias=None,
    sinks=None,
    allow_tf32=False,
    asynchronous=False,
    context=None,
    out=None,
    lse_out=None,
    return_lse=True,
    lse_hilo=False,
):
    """o = softmax(mask(q k^T * scale)) v; returns (o, lse), or o alone with
    return_lse=False.

    q: [batch, seqlen_q, heads_q, d]; k, v: [batch, seqlen_k, heads_kv, d]
    (heads_kv dividing heads_q: GQA, MQA); or 3-d [total_rows, heads, d] with
    cu_seqlens_q and cu_seqlens_k (int32 [batch + 1]: sequence b is rows
    cu[b] .. cu[b+1]-1). o is written in q's dtype; lse (float32 [batch,
    heads_q, seqlen_q], varlen [heads_q, total_q]) is each row's natural-log
    sum of exp of its scores, which backward() needs. lse_hilo=True gives each
    row's lse as a float32 pair (a last dimension of 2), which keeps float32
    gradients exact at large logits.

    causal: keys after the bottom-right-aligned diagonal are hidden
    (diag = i + seqlen_k - seqlen_q). window: (left, right), key j visible to
    row i when diag - left <= j <= diag + right, None or -1 for no bound.
    softcap > 0: s = softcap * tanh(s / softcap). alibi_slopes: float32
    [heads_q], s -= slope[h] * |diag - j|. scale: None for 1/sqrt(d). bias:
    additive, [batch, heads_q, seqlen_q, seqlen_k], any of the first three
    dimensions 1 to broadcast, added last. sinks: float32 [heads_q], a logit
    per head in every row's denominator.

    KV cache (forward only): seqused_k, int32 [batch], the rows of k and v in
    use per sequence (k and v then hold a capacity); k_new and v_new, [batch,
    seqlen_new, heads_kv, d], written into k and v at row seqused_k[b] first
    (k and v are updated in place; seqused_k is not: the caller advances it);
    block_table, int32 [batch, max_pages], for a paged cache whose k and v are
    [pages, page_size, heads_kv, d]. num_splits: 0 lets the backend split the
    keys across the device (flash-decoding), 1 never, N asks for N.

    allow_tf32: an f32 forward may run on TF32 tensor cores (CUDA).
    asynchronous: on a GPU, return once the work is queued on the context's
    stream (every array on the device). context: an attn.Context, a spec
    ("cpu", "cuda:0"), or None for the default of q's memory (see
    default_context). out, lse_out: arrays to write o and lse into.
    """
    q, k, v = _array(q, "q"), _array(k, "k"), _array(v, "v")
    ctx = _context_for(context, q)
    if out is None:
        out = _empty(q, tuple(q.shape))
    if return_lse and lse_out is None:
        lse_out = _empty(q, _lse_shape(q, lse_hilo), "float32")
    terms = _score_terms(
        causal, window, softcap, alibi_slopes, scale, cu_seqlens_q, cu_seqlens_k, bias, sinks
    )
    _attn.forward(
        ctx._native,
        q,
        k,
        v,
        out,
        lse_out if return_lse else None,
        seqused_k=_host_array(seqused_k, np.int32),
        k_new=_input(k_new),
        v_new=_input(v_new),
        block_table=_host_array(block_table, np.int32),
        num_splits=int(num_splits),
        allow_tf32=bool(allow_tf32),
        asynchronous=bool(asynchronous),
        **terms,
    )
    return (out, lse_out) if return_lse else out


def backward(
    do,
    q,
    k,
    v,
    o,
    lse,
    *,
    causal=False,
    window=None,
    softcap=0.0,
    alibi_slopes=None,
    scale=None,
    cu_seqlens_q=None,
    cu_seqlens_k=None,
    bias=None,
    dbias=None,
    sinks=None,
    dsinks=None,
    deterministic=False,
    asynchronous=False,
    context=None,
    dq=None,
    dk=None,
    dv=None,
):
    """Gradients of sum(o * do) with respect to q, k and v, from forward()'s o
    and lse (plain or hilo), with the same score keywords as the forward
    call. Returns (dq, dk, dv), in q's dtype and the shapes of q, k, v; with
    GQA, dk and dv sum over the query heads sharing a key/value head.

    dbias: True (or a float32 array of bias's shape to write) adds
    d(loss)/d(bias), summed over the dimensions that broadcast, to the
    returned tuple; dsinks: True (or a float32 [heads_q] array) adds
    d(loss)/d(sinks) after it. deterministic: bit-identical gradients from run
    to run. dq, dk, dv: arrays to write into.
    """
    names = ("do", "q", "k", "v", "o", "lse")
    do, q, k, v, o, lse = (_array(x, n) for x, n in zip((do, q, k, v, o, lse), names))
    ctx = _context_for(context, q)
    dq = _empty(q, tuple(q.shape)) if dq is None else dq
    dk = _empty(q, tuple(k.shape)) if dk is None else dk
    dv = _empty(q, tuple(v.shape)) if dv is None else dv
    if dbias is True:
        if bias is None:
            raise Error(Status.ENULL, "dbias: asked for, but bias is None")
        dbias = _empty(q, tuple(bias.shape), "float32")
    if dsinks is True:
        if sinks is None:
            raise Error(Status.ENULL, "dsinks: asked for, but sinks is None")
        dsinks = _empty(q, (len(sinks),), "float32")
    extra = [x for x in (dbias, dsinks) if x is not None and x is not False]
    terms = _score_terms(
        causal, window, softcap, alibi_slopes, scale, cu_seqlens_q, cu_seqlens_k, bias, sinks
    )
    _attn.backward(
        ctx._native,
        q,
        k,
        v,
        o,
        lse,
        do,
        dq,
        dk,
        dv,
        dbias=None if dbias is False else dbias,
        dsinks=None if dsinks is False else dsinks,
        deterministic=bool(deterministic),
        asynchronous=bool(asynchronous),
        **terms,
    )
    return (dq, dk, dv, *extra)


def supports(
    q,
    k,
    v,
    *,
    backward=False,
    causal=False,
    window=None,
    softcap=0.0,
    alibi_slopes=None,
    scale=None,
    cu_seqlens_q=None,
    cu_seqlens_k=None,
    seqused_k=None,
    k_new=None,
    v_new=None,
    block_table=None,
    bias=None,
    sinks=None,
    allow_tf32=False,
    context=None,
):
    """Whether the context's backend runs this problem (the backward pass
    when backward=True): True or False, decided as the call itself decides.
    An invalid problem raises attn.Error as the call would."""
    ctx = _context_for(context, q)
    terms = _score_terms(
        causal, window, softcap, alibi_slopes, scale, cu_seqlens_q, cu_seqlens_k, bias, sinks
    )
    status, message = _attn.supports(
        ctx._native,
        _array(q, "q"),
        _array(k, "k"),
        _array(v, "v"),
        bool(backward),
        seqused_k=_host_array(seqused_k, np.int32),
        k_new=_input(k_new),
        v_new=_input(v_new),
        block_table=_host_array(block_table, np.int32),
        allow_tf32=bool(allow_tf32),
        **terms,
    )
    if status == Status.OK:
        return True
    if status == Status.EUNSUPPORTED:
        return False
    raise Error(status, message)


def merge(o_parts, lse_parts, *, context=None, out=None, lse_out=None, return_lse=True):
    """Combines results of the same rows computed over parts of the keys
    (forward() with lse, plain form) into the result over all of them:
    lse = log(sum_s exp(lse_s)), o = sum_s exp(lse_s - lse) o_s. Returns
    (o, lse), or o alone with return_lse=False."""
    o_parts = [_array(x, "o_parts[%d]" % i) for i, x in enumerate(o_parts)]
    lse_parts = [_array(x, "lse_parts[%d]" % i) for i, x in enumerate(lse_parts)]
    if not o_parts:
        raise Error(Status.ESIZE, "o_parts is empty; merge takes 1 to 256 parts")
    ctx = _context_for(context, o_parts[0])
    if out is None:
        out = _empty(o_parts[0], tuple(o_parts[0].shape))
    if return_lse and lse_out is None:
        lse_out = _empty(o_parts[0], tuple(lse_parts[0].shape), "float32")
    _attn.merge(ctx._native, o_parts, lse_parts, out, lse_out if return_lse else None)
    return (out, lse_out) if return_lse else out
