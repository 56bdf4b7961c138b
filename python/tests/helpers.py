"""Inputs and comparisons shared by the tests."""

import numpy as np

try:
    import ml_dtypes
except ImportError:  # the bf16 tests skip
    ml_dtypes = None

# The largest error each dtype is held to, relative to the largest value of
# the expected array (at least 1): float32 rounding over sums of a few hundred
# terms, and the 16-bit formats' own rounding (f16: 2^-11, bf16: 2^-8) of
# inputs to the kernels' products.
TOLERANCE = {"f32": 2e-5, "f16": 4e-3, "bf16": 3e-2}


def dtype_of(name):
    if name == "bf16":
        return ml_dtypes.bfloat16
    return {"f32": np.float32, "f16": np.float16}[name]


def randn(rng, shape, dtype="f32", scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32).astype(dtype_of(dtype))


def assert_close(actual, expected, dtype="f32", name="", tol=None):
    """actual within the dtype's tolerance of expected (float64), with NaN and
    infinities where expected has them."""
    a = np.asarray(actual).astype(np.float64)
    e = np.asarray(expected, dtype=np.float64)
    assert a.shape == e.shape, "%s: shape %s, expected %s" % (name, a.shape, e.shape)
    special = ~np.isfinite(e)
    np.testing.assert_array_equal(a[special], e[special], err_msg=name + ": NaN or inf entries")
    assert np.all(np.isfinite(a[~special])), name + ": non-finite where the reference is finite"
    if not np.any(~special):
        return
    bound = (TOLERANCE[dtype] if tol is None else tol) * max(1.0, np.max(np.abs(e[~special])))
    err = np.max(np.abs(a[~special] - e[~special]))
    assert err <= bound, "%s: max error %.3g above %.3g" % (name, err, bound)
