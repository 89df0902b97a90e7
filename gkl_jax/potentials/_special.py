"""Special functions of the potentials, accurate where the library versions lose digits: log Phi with stable
derivatives for the probit (the inverse Mills ratio from Laplace's continued fraction in the tail) and the log
normaliser of the Student-t for any degrees of freedom."""

import jax
import jax.numpy as jnp
from jax.scipy.special import gammaln, log_ndtr

from .._quadrature import continued_fraction

_MILLS_SWITCH = -6.0
_MILLS_TERMS = 24


def _mills_pair(u):
    """(lambda, g) = (N(u)/Phi(u), u + lambda) without cancellation: directly for u >= -6; for u < -6 from the
    continued fraction g = 1/(t + 2/(t + 3/(t + ...))), t = -u (Laplace's fraction for the Mills ratio; 24 terms
    give ~1e-16 at t = 6), and lambda = t + g."""
    direct_lam = jnp.exp(-0.5 * jnp.square(u) - 0.5 * jnp.log(2 * jnp.pi) - log_ndtr(u))
    t = jnp.maximum(-u, -_MILLS_SWITCH)
    gap = continued_fraction(lambda k: k, t, _MILLS_TERMS)
    tail = u < _MILLS_SWITCH
    return jnp.where(tail, t + gap, direct_lam), jnp.where(tail, gap, u + direct_lam)


def student_t_log_norm(nu):
    """log Gamma((nu + 1) / 2) - log Gamma(nu / 2) - log(nu pi) / 2, the log normaliser of a unit-scale Student-t.

    The difference of log-gammas cancels for large nu (1e-7 absolute at nu = 1e8, every digit lost at 1e16), and
    jax's betaln is off by up to 6e-7 near nu = 16; for nu >= 200 the asymptotic series in x = nu / 2,
    log Gamma(x + 1/2) - log Gamma(x) = log(x) / 2 - 1/(8x) + 1/(192x^3) + 1/(640x^5) - 17/(14336x^7) + O(x^-9),
    is exact to round-off (x^-9 < 1e-20); below it the log-gamma difference is (error < 3e-14 at nu = 100)."""
    large = nu >= 200
    x = jnp.where(large, 0.5 * nu, 100.0)
    series = 0.5 * jnp.log(x) - 1 / (8 * x) + 1 / (192 * x**3) + 1 / (640 * x**5) - 17 / (14336 * x**7)
    small = jnp.where(large, 1.0, nu)
    direct = gammaln(0.5 * (small + 1)) - gammaln(0.5 * small)
    return jnp.where(large, series, direct) - 0.5 * jnp.log(nu * jnp.pi)


@jax.custom_jvp
def _inverse_mills(u):
    return _mills_pair(u)[0]


@jax.custom_jvp
def _mills_gap(u):
    return _mills_pair(u)[1]


@_inverse_mills.defjvp
def _inverse_mills_jvp(primals, tangents):
    (u,), (du,) = primals, tangents
    lam = _inverse_mills(u)
    return lam, -lam * _mills_gap(u) * du          # lambda' = -lambda (u + lambda)


@_mills_gap.defjvp
def _mills_gap_jvp(primals, tangents):
    (u,), (du,) = primals, tangents
    return _mills_gap(u), (1 - _inverse_mills(u) * _mills_gap(u)) * du     # g' = 1 + lambda'


@jax.custom_jvp
def log_ndtr_stable(u):
    """log Phi(u) with derivatives lambda(u) = N(u)/Phi(u), -lambda (u + lambda), ... accurate for all u."""
    return log_ndtr(u)


@log_ndtr_stable.defjvp
def _log_ndtr_stable_jvp(primals, tangents):
    (u,), (du,) = primals, tangents
    return log_ndtr_stable(u), _inverse_mills(u) * du
