"""Safeguarded step along a segment [0, 1] of a concave objective (Chai 2012, App. C and Fig. 7).

Every update of the variational parameters in this package is a move from the current value x (eta = 0) towards a
candidate x_new (eta = 1: a fixed point, eqs. 28, 61, or a Newton point, eq. 65). The candidate is taken when it
does not lower the objective; otherwise the maximiser in eta of the concave segment is found by the method of false
position with end-point down-weighting (the Illinois variant), using phi'(0) >= 0 (shown in App. C.1 / C.3 for the
fixed points) and phi'(1) < 0 (implied by concavity and phi(1) < phi(0)). A step is only ever accepted when it does
not lower the objective, so every block-coordinate sweep is monotone whatever round-off does.
"""

import jax
import jax.numpy as jnp
from jax import lax


def false_position(dphi, d0, d1, *, max_iters=30, rtol=1e-10):
    """The root in (0, 1) of a decreasing function dphi with dphi(0) = d0 >= 0 > d1 = dphi(1) (Illinois method)."""
    dtype = jnp.result_type(d0)

    def cond(state):
        lo, hi, dlo, dhi, x, dx, side, k = state
        scale = jnp.maximum(jnp.abs(d0), jnp.abs(d1))
        return (k < max_iters) & (jnp.abs(dx) > rtol * scale) & (hi - lo > 1e-12)

    def body(state):
        lo, hi, dlo, dhi, _, _, side, k = state
        x = (lo * dhi - hi * dlo) / (dhi - dlo)
        x = jnp.clip(x, lo + 1e-3 * (hi - lo), hi - 1e-3 * (hi - lo))
        dx = dphi(x)
        dx = jnp.where(jnp.isfinite(dx), dx, -jnp.abs(d0) - 1.0)  # an infeasible point lies past the maximum
        right = dx > 0  # the root lies to the right of x
        # Illinois: halve the function value kept at the end point that survives twice in a row
        dhi_new = jnp.where(right, jnp.where(side == 1, 0.5 * dhi, dhi), dx)
        dlo_new = jnp.where(right, dx, jnp.where(side == -1, 0.5 * dlo, dlo))
        lo_new = jnp.where(right, x, lo)
        hi_new = jnp.where(right, hi, x)
        return lo_new, hi_new, dlo_new, dhi_new, x, dx, jnp.where(right, 1, -1), k + 1

    zero, one = jnp.zeros((), dtype), jnp.ones((), dtype)
    init = (zero, one, d0, d1, 0.5 * one, jnp.asarray(jnp.inf, dtype), 0, 0)
    _, _, _, _, x, _, _, _ = lax.while_loop(cond, body, init)
    return x


def segment_search(phi, phi0, *, max_iters=30):
    """The false-position maximiser eta of a concave phi on [0, 1] (used when phi(1) < phi0), or 0 when no point
    of the search lies above phi0; returns (eta, phi(eta))."""
    dtype = jnp.result_type(phi0)
    dphi = lambda t: jax.jvp(phi, (t,), (jnp.ones_like(t),))[1]
    zero, one = jnp.zeros((), dtype), jnp.ones((), dtype)
    d0 = dphi(zero)
    d1 = dphi(one)
    d1 = jnp.where(jnp.isfinite(d1), d1, -jnp.abs(d0) - 1.0)
    ok = (d0 > 0) & (d1 < 0)
    eta = jnp.where(ok, false_position(dphi, jnp.where(ok, d0, 1.0), jnp.where(ok, d1, -1.0),
                                       max_iters=max_iters), 0.0)
    val = phi(eta)
    good = jnp.isfinite(val) & (val >= phi0)
    return jnp.where(good, eta, 0.0), jnp.where(good, val, phi0)


def safeguarded_step(phi, phi0, *, phi1=None, max_iters=30):
    """The step eta in [0, 1] taken along a segment with objective phi(eta), phi(0) = phi0.

    Returns (eta, phi(eta)): eta = 1 when phi(1) >= phi0 (phi1 may be passed when known); otherwise the
    false-position maximiser when it does not lower phi; otherwise 0 (no move). Works under `jax.vmap`.
    """
    one = jnp.ones((), jnp.result_type(phi0))
    phi1 = phi(one) if phi1 is None else phi1
    take_one = jnp.isfinite(phi1) & (phi1 >= phi0)
    return lax.cond(take_one, lambda _: (one, phi1), lambda _: segment_search(phi, phi0, max_iters=max_iters),
                    None)
