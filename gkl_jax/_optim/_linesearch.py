"""The backtracking line search every solver uses (Nocedal & Wright 2006, Alg. 3.1): its acceptance tests
(`sufficient_increase`, the Armijo condition; `no_decrease`, "does not decrease beyond round-off"), its step rule
(t = t0, t0 / 2, t0 / 4, ..., at most `MAX_HALVINGS` halvings by default) and its two drivers: `backtrack`, a
compiled loop with one call site of the objective, and `backtrack_host`, the same search on the host for trials
that are whole compiled fits. The two state machines that interleave their line searches with other trials (the
fixed-point solver's trial loop, the ML-II outer loop) use the same tests and the same halving cap."""

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

ARMIJO_C = 1e-4
"""The Armijo constant c of `sufficient_increase` (Nocedal & Wright 2006, Section 3.1: c = 1e-4)."""


def sufficient_increase(value, base, t, slope, c=ARMIJO_C):
    """The Armijo condition of an ascent step (Nocedal & Wright 2006, eq. 3.4, for the maximised function).

    Args:
        value: f(x + t p), a float scalar.
        base: f(x).
        t: the step.
        slope: the directional derivative g^T p at x (> 0 for an ascent direction).
        c: the Armijo constant.

    Returns:
        bool scalar: value finite and value >= base + c t slope (a numpy bool for host floats, computed in their
        precision).
    """
    return _array_module(value, base, t, slope).isfinite(value) & (value >= base + c * t * slope)


def no_decrease(value, base, noise):
    """The acceptance test of a monotone step: the objective does not drop by more than its round-off.

    Args:
        value: f at the trial point, a float scalar.
        base: f at the current point.
        noise: the round-off of f (`roundoff`), >= 0.

    Returns:
        bool scalar: value finite and value >= base - noise (a numpy bool for host floats).
    """
    return _array_module(value, base, noise).isfinite(value) & (value >= base - noise)


def _array_module(*values):
    """jax.numpy where any value is a JAX array (or tracer), numpy for host scalars."""
    return jnp if any(isinstance(v, jax.Array) for v in values) else np


def backtrack(trial, accept, init, *, dtype, max_halvings, skip=False, t0=1.0):
    """The first step t in {t0, t0/2, t0/4, ...} (at most `max_halvings` halvings) that `accept`s.

    The trial at t0 is made inside the loop, so `trial` has a single call site in the compiled program (one
    copy of the objective, however large).

    Args:
        trial: t -> aux, the quantities at step t (a pytree, e.g. the objective value and what the caller reuses
            from that evaluation).
        accept: (t, aux) -> bool scalar, whether step t is acceptable.
        init: a pytree with the structure, shapes and dtypes of `trial`'s output (the loop's initial carry; it is
            returned as aux when `skip`).
        dtype: the floating dtype of t.
        max_halvings: the most halvings after the first trial (int).
        skip: a traced bool: when True nothing is evaluated and (t0, init, True) is returned.
        t0: the first step (a float scalar, traced or not).

    Returns:
        (t, aux, ok): the last step tried, `trial(t)` there, and whether it was accepted (True when skipped).
    """
    skip = jnp.asarray(skip, bool)

    def cond(state):
        t, aux, k = state
        return ~skip & ((k == 0) | (~accept(t, aux) & (k <= max_halvings)))

    def body(state):
        t, _, k = state
        t = jnp.where(k == 0, t, 0.5 * t)
        return t, trial(t), k + 1

    # separate loop: the one backtracking line search of the package, nested in solver steps
    t, aux, _ = lax.while_loop(cond, body, (jnp.asarray(t0, dtype), init, 0))
    return t, aux, skip | accept(t, aux)


def backtrack_host(trial, accept, *, max_halvings, t0=1.0):
    """`backtrack` on the host: for line searches whose trials are whole compiled fits (ML-II steps of the
    multi-class GP), which a compiled loop cannot call.

    Args:
        trial: t -> aux (any Python objects).
        accept: (t, aux) -> bool.
        max_halvings: the most halvings after the first trial.
        t0: the first step.

    Returns:
        (t, aux, ok): the last step tried, `trial(t)` there, and whether it was accepted.
    """
    t = float(t0)
    for k in range(int(max_halvings) + 1):
        if k:
            t *= 0.5
        aux = trial(t)
        if bool(accept(t, aux)):
            return t, aux, True
    return t, aux, False
