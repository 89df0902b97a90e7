"""Exponentiated-quadratic lower bounds on the site potentials (Challis & Barber 2013, Section 5.1.1; thesis Ch. 3.3).

Super-Gaussian sites (Palmer et al. 2006). A potential is written as

    log phi(x) = beta x + g(r^2),    r = x - center,    g convex and non-increasing in xi = r^2,

and bounded by the tangent of g at xi (Fenchel duality in x = s^2, thesis Ch. 3.3):

    log phi(x) >= beta x + g(xi) + g'(xi) (r^2 - xi)  =  -tau x^2 / 2 + nu x + c,
    tau = -2 g'(xi) = 1 / gamma,   nu = beta + tau * center,   c = g(xi) + g'(xi) (center^2 - xi),

tight at r^2 = xi. In the thesis' notation the bound is exp(beta s - s^2 / (2 gamma) - h(gamma) / 2) with the
height function h(gamma) = -2 [g(xi) - xi g'(xi)], gamma = -1 / (2 g'(xi)) (and h = -2 g(0) below the
threshold gamma <= -1 / (2 g'(0))); `height` evaluates it, reproducing Nickisch (2010) Table 3.1 with a
correction for the cumulative logistic (g_gamma = f^{-1}(gamma / 4), threshold gamma <= 4, h = 2 ln 2 below it).

| potential                 | beta  | center | g(xi)                                              |
|---------------------------|-------|--------|----------------------------------------------------|
| Logistic sig(y x)         | y / 2 | 0      | -log(2 cosh(sqrt(xi) / 2))   (Jaakkola-Jordan)     |
| Laplace(y, b)             | 0     | y      | -sqrt(xi) / b - log 2b                             |
| StudentT(y, nu, s)        | 0     | y      | C - (nu + 1) / 2 log(1 + xi / (nu s^2))            |
| Cauchy(y, s)              | 0     | y      | -log(pi s) - log(1 + xi / s^2)                     |
| Gaussian(y, v)            | 0     | y      | -log(2 pi v) / 2 - xi / (2 v)   (linear: exact)    |

The optimal xi for a Gaussian q (the EM / outer-loop update) is xi_n = E_q[r_n^2] = (m_n - center)^2 + v_n.

Probit sites are not strongly super-Gaussian; they get the fixed-curvature bound of thesis Table 4.1
(Gibbs & MacKay 2000), valid because (log Phi)'' lies in (-1, 0):

    log Phi(t) >= log Phi(s) + lambda(s) (t - s) - (t - s)^2 / 2,   t = y x,   lambda = N(s) / Phi(s),

tight at t = s, maximised in expectation by s = E_q[t] = y m_n.
"""

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
from jax.scipy.special import log_ndtr
from jaxtyping import Array, ArrayLike, Float

from .. import potentials as P
from .._validate import as_float_array, check_finite, check_int, check_positive
from ..potentials._potentials import student_t_log_norm


class SuperGaussian(NamedTuple):
    """log phi(x) = beta x + g((x - center)^2); g1, g2 are g' and g'' in xi."""

    beta: jax.Array
    center: jax.Array
    g: Callable
    g1: Callable
    g2: Callable
    xi0: jax.Array  # a typical xi (the scale of the potential), used to initialise


def _where_small(a, small, series, exact):
    """Branch-free evaluation safe under autodiff (the double-where trick)."""
    a_safe = jnp.where(small, jnp.ones_like(a), a)
    return jnp.where(small, series(a), exact(a_safe))


def _logistic_g(xi):
    a = 0.5 * jnp.sqrt(jnp.maximum(xi, 0.0))
    return -(a + jax.nn.softplus(-2 * a))


def _logistic_g1(xi):
    a = 0.5 * jnp.sqrt(jnp.maximum(xi, 0.0))
    tanhc = _where_small(a, a < 0.02, lambda a: 1 - a**2 / 3 + 2 * a**4 / 15, lambda a: jnp.tanh(a) / a)
    return -tanhc / 8


def _logistic_g2(xi):
    a = 0.5 * jnp.sqrt(jnp.maximum(xi, 0.0))
    # (a sech^2 a - tanh a) / a^3 = d/da (tanh a / a) / a
    tc1 = _where_small(a, a < 0.02, lambda a: -2 / 3 + 8 * a**2 / 15 - 34 * a**4 / 105,
                       lambda a: (a / jnp.cosh(a) ** 2 - jnp.tanh(a)) / a**3)
    return -tc1 / 64


def _tiny(x):
    return jnp.finfo(jnp.result_type(x)).tiny


def super_gaussian(potential, method: str) -> SuperGaussian:
    """The (beta, center, g) form of a super-Gaussian potential; a ValueError for any other potential."""
    if isinstance(potential, P.Logistic):
        y = potential.y
        return SuperGaussian(0.5 * y, jnp.zeros_like(y), _logistic_g, _logistic_g1, _logistic_g2, jnp.ones_like(y))
    if isinstance(potential, P.Laplace):
        y, b = potential.y, potential.scale
        sq = lambda xi: jnp.sqrt(jnp.maximum(xi, _tiny(xi)))
        return SuperGaussian(jnp.zeros_like(y), y, lambda xi: -sq(xi) / b - jnp.log(2 * b),
                             lambda xi: -0.5 / (b * sq(xi)), lambda xi: 0.25 / (b * sq(xi) ** 3),
                             jnp.broadcast_to(b**2, jnp.broadcast_shapes(jnp.shape(y), jnp.shape(b))))
    if isinstance(potential, P.StudentT):
        y, nu, s = potential.y, potential.dof, potential.scale
        C = student_t_log_norm(nu) - jnp.log(s)
        k = nu * s**2
        return SuperGaussian(jnp.zeros_like(y), y, lambda xi: C - 0.5 * (nu + 1) * jnp.log1p(xi / k),
                             lambda xi: -0.5 * (nu + 1) / (k + xi), lambda xi: 0.5 * (nu + 1) / (k + xi) ** 2,
                             jnp.broadcast_to(s**2, jnp.broadcast_shapes(jnp.shape(y), jnp.shape(s))))
    if isinstance(potential, P.Cauchy):
        y, s = potential.y, potential.scale
        k = s**2
        return SuperGaussian(jnp.zeros_like(y), y, lambda xi: -jnp.log(jnp.pi * s) - jnp.log1p(xi / k),
                             lambda xi: -1 / (k + xi), lambda xi: 1 / (k + xi) ** 2,
                             jnp.broadcast_to(k, jnp.broadcast_shapes(jnp.shape(y), jnp.shape(s))))
    if isinstance(potential, P.Gaussian):
        y, v = potential.y, potential.variance
        return SuperGaussian(jnp.zeros_like(y), y, lambda xi: -0.5 * jnp.log(2 * jnp.pi * v) - 0.5 * xi / v,
                             lambda xi: -0.5 / v + 0 * xi, lambda xi: 0 * xi,
                             jnp.broadcast_to(v, jnp.broadcast_shapes(jnp.shape(y), jnp.shape(v))))
    raise ValueError(f"{method}: the {type(potential).__name__} potential is not super-Gaussian (no tight "
                     "exponentiated-quadratic lower bound exists); supported: Logistic, Laplace, StudentT, Cauchy, "
                     "Gaussian" + (", Probit" if method == "local" else ""))


def is_supported(potential, method: str) -> bool:
    if method == "local" and isinstance(potential, P.Probit):
        return True
    return isinstance(potential, (P.Logistic, P.Laplace, P.StudentT, P.Cauchy, P.Gaussian))


def tangent_coefficients(form: SuperGaussian, xi):
    """(tau, nu, c) of the bound -tau x^2 / 2 + nu x + c tangent at r^2 = xi (module docstring)."""
    g1 = form.g1(xi)
    tau = -2 * g1
    return tau, form.beta + tau * form.center, form.g(xi) + g1 * (form.center**2 - xi)


def probit_coefficients(y, s):
    """(tau, nu, c) of the Table 4.1 probit bound tangent at t = y x = s."""
    lam = jnp.exp(-0.5 * s**2 - 0.5 * jnp.log(2 * jnp.pi) - log_ndtr(s))
    return jnp.ones_like(s), y * (lam + s), log_ndtr(s) - lam * s - 0.5 * s**2


def height(potential: P.AbstractPotential, gamma: Float[ArrayLike, "*shape"], *,
           iterations: int = 200) -> Float[Array, "*shape"]:
    """The height function h(gamma) of Nickisch (2010) Table 3.1 for a super-Gaussian potential (module docstring),

        h(gamma) = max_{xi >= 0} -xi / gamma - 2 g(xi),

    by bisection on g'(xi) = -1 / (2 gamma) (g' is increasing because g is convex). The potential's
    normalising constant is part of g, so h differs from the table's (unnormalised) entries by -2 log(norm).
    h = +inf where no tangent of that curvature exists (g' below -1 / (2 gamma) up to xi = 1e30: a Gaussian
    potential with gamma above its variance). (Nickisch 2010, Table 3.1.)

    Args:
        potential: a super-Gaussian `gkl_jax.potentials` potential (Logistic, Laplace, StudentT, Cauchy,
            Gaussian).
        gamma: positive finite float array of variances gamma (any shape broadcasting against the potential's
            per-site data).
        iterations: bisection steps (int >= 1, default 200).

    Returns:
        float array of h(gamma) (+inf where no tangent exists).

    Raises:
        ValueError: a potential without a super-Gaussian bound, gamma not positive or not finite, or a bad
            iterations.
    """
    form = super_gaussian(potential, "height")
    gamma = as_float_array(gamma, "gamma")
    check_finite(gamma, "gamma")
    check_positive(gamma, "gamma")
    iterations = check_int(iterations, "iterations", 1)
    target = -0.5 / gamma
    below = form.g1(jnp.zeros_like(gamma)) >= target  # the tangent at xi = 0 is already flatter

    def body(_, bracket):
        lo, hi = bracket
        mid = jnp.sqrt(lo * hi)
        go_up = form.g1(mid) < target
        return jnp.where(go_up, mid, lo), jnp.where(go_up, hi, mid)

    lo0 = jnp.full_like(gamma, 1e-30)
    hi0 = jnp.full_like(gamma, 1e30)
    lo, hi = jax.lax.fori_loop(0, iterations, body, (lo0, hi0))
    xi = jnp.where(below, 0.0, jnp.sqrt(lo * hi))
    unbounded = form.g1(hi0) < target
    return jnp.where(unbounded, jnp.inf, -xi / gamma - 2 * form.g(xi))
