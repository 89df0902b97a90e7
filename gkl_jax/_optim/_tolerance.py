"""Tolerances and round-off levels of a floating dtype, shared by every solver."""

import functools

import jax
import jax.numpy as jnp

MAX_HALVINGS = 30
"""The most step halvings of the fixed-point and site-precision solvers' line searches."""
STOP_ROUNDOFF = 8.0
"""The stopping test's round-off floor, in eps(dtype) * max(|B|, 1) (`stop_level`)."""
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
    """max_i |x_i| of an array, or over all the entries of a pytree of arrays (the solvers' gradient norm)."""
    return functools.reduce(jnp.maximum, [jnp.max(jnp.abs(leaf)) for leaf in jax.tree.leaves(x)])


def scaled_gradient(g, x, scale):
    """The stopping statistic max_i |g_i| max(|x_i|, sigma0): the gradient of the objective with respect to the
    variables measured on their own scale (a relative change of x_i, or sigma0 where x_i is near 0).

    Invariant under a change of units of the variables: with h -> a h and prior variance -> variance / a^2 the
    bound is unchanged, g scales by a and x and sigma0 by 1 / a (a bare max|g| scales by a, so that at a = 1e-7 it
    met 1e-6 at the start, 6.6 nats short of the optimum).

    Args:
        g: (P,) the gradient of the objective, or a pytree of arrays (the maximum is over all their entries).
        x: (P,) the variables, or a pytree of the same structure as g.
        scale: scalar, sigma0 > 0, the variables' typical scale (the fit's starting standard deviation).

    Returns:
        Scalar array, in units of the objective (nats).
    """
    parts = [max_abs(a * jnp.maximum(jnp.abs(b), scale)) for a, b in zip(jax.tree.leaves(g), jax.tree.leaves(x))]
    return functools.reduce(jnp.maximum, parts)


def stop_level(value, tol):
    """The level the stopping statistic must reach: max(tol, STOP_ROUNDOFF eps |B|), B the objective.

    The second term is the resolution of a bound summed from many terms: in float32 the gradient of a sum of N
    rounded site terms carries round-off that grows with N (max|g| ~ 4e-3 at N = 1e6 in a logistic fit, above
    float32's default tol 1e-3), while the scaled statistic stays a fraction of eps |B| at every N.

    Args:
        value: the objective B (scalar; its dtype sets eps).
        tol: the tolerance (scalar).

    Returns:
        Scalar array (NaN where `value` is).
    """
    eps = jnp.finfo(value.dtype).eps
    return jnp.maximum(tol, STOP_ROUNDOFF * eps * jnp.maximum(jnp.abs(value), 1.0))


def stationary(g, x, value, tol, scale):
    """The solvers' stopping test: `scaled_gradient(g, x, scale) <= stop_level(value, tol)` at a finite value.

    Args:
        g: (P,) the gradient; x: (P,) the variables; value: the objective there.
        tol: the tolerance; scale: sigma0 (see `scaled_gradient`).

    Returns:
        bool scalar array.
    """
    return (scaled_gradient(g, x, scale) <= stop_level(value, tol)) & jnp.isfinite(value)
