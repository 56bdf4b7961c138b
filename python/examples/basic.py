"""attn from Python: causal attention over NumPy arrays, forward and backward,
on the backend ATTN_BACKEND names (the CPU when unset and there is no GPU)."""

import numpy as np

import attn

rng = np.random.default_rng(0)
q, k, v = (rng.standard_normal((2, 256, 8, 64), dtype=np.float32) for _ in range(3))  # bshd

o, lse = attn.forward(q, k, v, causal=True)
dq, dk, dv = attn.backward(np.ones_like(o), q, k, v, o, lse, causal=True)
print(
    "%s: o %s, lse %s, |dq| %.3f" % (attn.default_context(), o.shape, lse.shape, np.abs(dq).max())
)

try:
    attn.forward(q, k[..., :32], v)
except attn.Error as e:
    print("%s: %s" % (e.status.name, e.message))
