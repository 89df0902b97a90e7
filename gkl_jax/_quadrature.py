"""Gaussian expectations E_{z~N(0,1)}[f(m + s z)] by Gauss-Hermite quadrature (papers/000, eq. 7-8).

The derivatives are defined by the identities (Stein's lemma, papers/000 App. B.2)

    d/dm  E[f(m + s z)] = E[f'(m + s z)],      d/d(s^2) E[f(m + s z)] = 1/2 E[f''(m + s z)],

each again a quadrature, so gradients and Hessian-vector products are smooth in s^2 down to s^2 = 0 (where
the chain rule through s = sqrt(s^2) would divide by zero).
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np


@functools.lru_cache(maxsize=None)
def hermite_rule(num_points: int):
    """Probabilists' Gauss-Hermite nodes z_k and weights w_k (sum w_k = 1) for E_{N(0,1)}."""
    if num_points < 1:
        raise ValueError(f"num_points must be >= 1, got {num_points}")
    z, w = np.polynomial.hermite_e.hermegauss(num_points)
    return z, w / w.sum()


@functools.lru_cache(maxsize=None)
def _derivative(fn):
    """x -> d fn(params, x) / dx for an elementwise fn (cached so traces see the same function object)."""

    def dfn(params, x):
        return jax.grad(lambda x: jnp.sum(fn(params, x)))(x)

    return dfn


@functools.lru_cache(maxsize=None)
def _param_tangent(fn):
    """(params, dparams), x -> directional derivative of fn in params (the tangent of a leaf change)."""

    def tfn(pair, x):
        params, dparams = pair
        return jax.jvp(lambda p: fn(p, x), (params,), (dparams,))[1]

    return tfn


def _nodes_values(fn, num_points, params, m, s2):
    z, w = hermite_rule(num_points)
    dtype = jnp.result_type(m, s2)
    z = jnp.asarray(z, dtype)
    w = jnp.asarray(w, dtype)
    s = jnp.sqrt(jnp.maximum(s2, 0.0))
    x = m[..., None] + s[..., None] * z
    vals = jax.vmap(lambda xk: fn(params, xk), in_axes=-1, out_axes=-1)(x)
    return vals @ w


@functools.partial(jax.custom_jvp, nondiff_argnums=(0, 1))
def gauss_hermite(fn, num_points, params, m, s2):
    """E_{z~N(0,1)}[fn(params, m + sqrt(s2) z)] elementwise over sites.

    `fn(params, x)` must be elementwise in x (x has the shape of m) and twice differentiable in x.
    """
    return _nodes_values(fn, num_points, params, m, s2)


@gauss_hermite.defjvp
def _gauss_hermite_jvp(fn, num_points, primals, tangents):
    params, m, s2 = primals
    dparams, dm, ds2 = tangents
    d1 = _derivative(fn)
    d2 = _derivative(d1)
    out = gauss_hermite(fn, num_points, params, m, s2)
    tangent = (gauss_hermite(d1, num_points, params, m, s2) * dm
               + 0.5 * gauss_hermite(d2, num_points, params, m, s2) * ds2
               + gauss_hermite(_param_tangent(fn), num_points, (params, dparams), m, s2))
    return out, tangent
