"""Moments of the (power-)tilted distributions of EP: p_hat(x) ~ N(x | mu_c, v_c) phi(x)^eta.

Returns (log Z_hat, mean, variance) elementwise over sites, with Z_hat = int N(x | mu_c, v_c) phi(x)^eta dx.
Closed forms (Nickisch 2010, Ch. 4.4 and 5.3.2; Rasmussen & Williams 2006, eq. 3.58):

- Gaussian phi = N(y | x, s2): phi^eta ~ N(x | y, s2 / eta), a product of Gaussians.
- Probit phi = Phi(y x), eta = 1: z = y mu_c / sqrt(1 + v_c), Z_hat = Phi(z),
  mean = mu_c + y v_c lam / sqrt(1 + v_c), var = v_c - v_c^2 lam (z + lam) / (1 + v_c), lam = N(z) / Phi(z).
- Laplace phi = exp(-|x - y| / b) / 2b, a = eta / b: a mixture of two truncated Gaussians N(m_+-, v_c),
  m_+ = mu - a v_c on [0, inf) and m_- = mu + a v_c on (-inf, 0] (mu = mu_c - y), with weights
  Z_+ = exp(-a mu + a^2 v / 2) Phi(m_+ / sqrt v), Z_- = exp(a mu + a^2 v / 2) Phi(-m_- / sqrt v).

Everything else (logistic, probit with eta < 1, Student-t, Cauchy, Poisson, Custom) by quadrature: the trapezoid
rule on a uniform grid of `GRID_POINTS` nodes covering +-10 standard deviations of the cavity and of the
tilted distribution's Laplace approximation (its mode found by safeguarded Newton steps). For integrands that
are smooth and decay like Gaussians the uniform trapezoid rule converges geometrically in the node spacing,
so the moments are accurate to round-off while the tilted width exceeds ~1/50 of the cavity width.
"""

import math

import jax
import jax.numpy as jnp
from jax.scipy.special import log_ndtr, logsumexp

from .. import potentials as P

GRID_POINTS = 1024
_LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)


def _lam(z):
    """N(z) / Phi(z), stable for large negative z."""
    return jnp.exp(-0.5 * z**2 - _LOG_SQRT_2PI - log_ndtr(z))


def tilted_moments(potential, mu_c, v_c, power: float):
    """(log Z_hat, mean, variance) of N(x | mu_c, v_c) phi(x)^power, elementwise (module docstring)."""
    if isinstance(potential, P.Gaussian):
        return _gaussian(potential.y, potential.variance, mu_c, v_c, power)
    if isinstance(potential, P.Probit) and power == 1.0:
        return _probit(potential.y, mu_c, v_c)
    if isinstance(potential, P.Laplace):
        return _laplace(potential.y, potential.scale, mu_c, v_c, power)
    return quadrature_moments(potential.log_phi, mu_c, v_c, power)


def _gaussian(y, s2, mu_c, v_c, power):
    w = s2 / power  # phi^eta = (2 pi s2)^{-eta/2} exp(-(x - y)^2 / (2 w))
    log_z = (-0.5 * power * jnp.log(2 * jnp.pi * s2) + 0.5 * jnp.log(2 * jnp.pi * w)
             - 0.5 * jnp.log(2 * jnp.pi * (v_c + w)) - 0.5 * jnp.square(y - mu_c) / (v_c + w))
    prec = 1 / v_c + 1 / w
    mean = (mu_c / v_c + y / w) / prec
    return log_z, mean, 1 / prec


def _probit(y, mu_c, v_c):
    denom = jnp.sqrt(1 + v_c)
    z = y * mu_c / denom
    lam = _lam(z)
    mean = mu_c + y * v_c * lam / denom
    var = v_c - jnp.square(v_c) * lam * (z + lam) / (1 + v_c)
    return log_ndtr(z), mean, var


def _laplace(y, b, mu_c, v_c, power):
    a = power / b
    mu = mu_c - y
    s = jnp.sqrt(v_c)
    m_plus, m_minus = mu - a * v_c, mu + a * v_c
    x_plus, x_minus = m_plus / s, -m_minus / s
    log_zp = -a * mu + 0.5 * a**2 * v_c + log_ndtr(x_plus)
    log_zm = a * mu + 0.5 * a**2 * v_c + log_ndtr(x_minus)
    log_z = jnp.logaddexp(log_zp, log_zm)
    wp = jnp.exp(log_zp - log_z)
    wm = jnp.exp(log_zm - log_z)
    lp, lm = _lam(x_plus), _lam(x_minus)
    mean_p, var_p = m_plus + s * lp, v_c * (1 - lp * (lp + x_plus))
    mean_m, var_m = m_minus - s * lm, v_c * (1 - lm * (lm + x_minus))
    mean = wp * mean_p + wm * mean_m
    var = wp * var_p + wm * var_m + wp * wm * jnp.square(mean_p - mean_m)
    return log_z - power * jnp.log(2 * b), mean + y, var


def quadrature_moments(log_phi, mu_c, v_c, power, num_points: int = GRID_POINTS, newton_steps: int = 30):
    """Tilted moments of N(x | mu_c, v_c) exp(power * log_phi(x)) by the trapezoid rule (module docstring).

    `log_phi` is elementwise over sites (x of the shape of mu_c)."""
    s = jnp.sqrt(v_c)
    log_f = lambda x: -0.5 * jnp.square(x - mu_c) / v_c + power * log_phi(x)
    d1 = jax.grad(lambda x: jnp.sum(log_f(x)))
    d2 = jax.grad(lambda x: jnp.sum(d1(x)))

    def newton(_, x):
        curvature = jnp.maximum(-d2(x), 0.5 / v_c)  # a safeguarded (majorising) Newton step
        step = jnp.clip(d1(x) / curvature, -3 * s, 3 * s)
        return jnp.where(jnp.isfinite(step), x + step, x)

    mode = jax.lax.fori_loop(0, newton_steps, newton, mu_c)
    c = -d2(mode)
    sd = jnp.where(c > 0, 1 / jnp.sqrt(jnp.where(c > 0, c, 1.0)), s)
    sd = jnp.minimum(sd, s)
    lo = jnp.minimum(mu_c - 10 * s, mode - 10 * sd)
    hi = jnp.maximum(mu_c + 10 * s, mode + 10 * sd)
    t = jnp.linspace(0.0, 1.0, num_points, dtype=jnp.result_type(mu_c))
    x = lo[..., None] + (hi - lo)[..., None] * t                       # (..., num_points)
    h = (hi - lo) / (num_points - 1)
    logf = jax.vmap(log_f, in_axes=-1, out_axes=-1)(x)
    logf = jnp.where(jnp.isfinite(logf), logf, -jnp.inf)
    log_int = logsumexp(logf, axis=-1) + jnp.log(h)
    p = jnp.exp(logf - logsumexp(logf, axis=-1, keepdims=True))
    mean = jnp.sum(p * x, axis=-1)
    var = jnp.sum(p * jnp.square(x - mean[..., None]), axis=-1)
    log_z = log_int - 0.5 * jnp.log(2 * jnp.pi * v_c)
    return log_z, mean, var
