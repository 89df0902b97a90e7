"""Tolerances and round-off levels of a floating dtype, shared by every solver."""

import jax.numpy as jnp

MAX_HALVINGS = 30
"""The most step halvings of the fixed-point and site-precision solvers' line searches."""
MAX_STALLS = 3
"""Consecutive outer steps without progress (the round-off regime) before an alternating solver gives up."""


def default_tol(dtype, *, float64: float = 1e-6, float32: float = 1e-3) -> float:
    """The default gradient tolerance for a dtype: `float64` for 64-bit floats, `float32` below.

    Args:
        dtype: a floating dtype.
        float64: the tolerance for 64-bit floats.
        float32: the tolerance for narrower floats.

    Returns:
        float: the tolerance.
    """
    return float64 if jnp.finfo(dtype).bits >= 64 else float32


def roundoff(value, magnitude=None, factor: float = 64.0):
    """The resolution of a computed objective: factor * eps * magnitude, magnitude 1 + |value| by default (a sum
    of many cancelling terms passes its own, larger magnitude).

    Args:
        value: the objective value (scalar array; its dtype sets eps).
        magnitude: the size of the terms the value was summed from (scalar), or None for 1 + |value|.
        factor: how many eps of that magnitude count as round-off.

    Returns:
        Scalar array: changes of the objective smaller than this are indistinguishable from round-off.
    """
    magnitude = 1 + jnp.abs(value) if magnitude is None else magnitude
    return factor * jnp.finfo(value.dtype).eps * magnitude


def max_abs(x):
    """max_i |x_i| of an array (the solvers' gradient norm)."""
    return jnp.max(jnp.abs(x))
