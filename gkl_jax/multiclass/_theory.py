"""Data-independent lower bounds on the log marginal likelihood (Chai 2012, Section 2.3.2, App. B.6).

Lemma 29: for q = N(0, sigma_v^2 I_C),

    max_{b, S} h = -(C - 1)/2 [2 r - log(r + 1/2) - 1] - log C,    r = sqrt(sigma_v^2 / C + 1/4),

attained at b* = 1/C and S* with eigenvalues sigma_v^{-2} (eigenvector 1/sqrt(C)) and sigma_v^{-2} (r + 1/2).

Theorem 10 (covariance sigma^2 delta_cc' k^x with k^x a correlation function):  log p(y) >= n * lemma29(C, sigma^2)
> -n (sigma^2 / 2 + log C). Theorem 9 (any Gram matrix K, any sigma_v^2 > 0):
log p(y) >= nC/2 + (nC/2) log sigma_v^2 - 1/2 log|K| - sigma_v^2/2 tr K^{-1} + n * lemma29(C, sigma_v^2).
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from .._linalg import diagonal, invert_lower
from .._validate import is_concrete


def _check_counts(num_data, num_classes):
    if int(num_data) != num_data or int(num_data) < 1:
        raise ValueError(f"num_data must be a positive integer, got {num_data!r}")
    if int(num_classes) != num_classes or int(num_classes) < 2:
        raise ValueError(f"num_classes must be an integer >= 2, got {num_classes!r}")


def _check_variance(variance, name):
    if is_concrete(variance) and not np.all(np.asarray(variance) > 0):
        raise ValueError(f"{name} must be positive, got {variance!r}")


def isotropic_site_maximum(num_classes, variance):
    """max_{b, S} h(y; N(0, variance I_C), b, S) in closed form (Chai 2012, Lemma 29, equality at m = 0).

    Args:
        num_classes: C (int >= 2).
        variance: positive float (or float array) sigma_v^2.

    Returns:
        Float array of the shape of `variance`.
    """
    if int(num_classes) < 2:
        raise ValueError(f"num_classes must be an integer >= 2, got {num_classes!r}")
    _check_variance(variance, "variance")
    C = num_classes
    r = jnp.sqrt(jnp.asarray(variance) / C + 0.25)
    return -(C - 1) / 2 * (2 * r - jnp.log(r + 0.5) - 1) - jnp.log(C)


def correlation_bound(num_data, num_classes, variance=1.0, *, weak=False):
    """A lower bound on log p(y) for every labelling of any n inputs (Chai 2012, Theorem 10; Table 3 lists it).

    Valid for the covariance sigma^2 delta(c, c') k^x(x, x') with k^x a correlation function (k^x(x, x) = 1, e.g.
    the usqexpard kernel of eq. 44 with sigma^2 = 1): n times the closed form of Lemma 29 at sigma^2.

    Args:
        num_data: n (int >= 1).
        num_classes: C (int >= 2).
        variance: positive float sigma^2.
        weak: the looser closed form -n (sigma^2 / 2 + log C) instead.

    Returns:
        Float scalar array.

    Raises:
        ValueError: a bad count or a non-positive variance.
    """
    _check_counts(num_data, num_classes)
    _check_variance(variance, "variance")
    if weak:
        return -num_data * (jnp.asarray(variance) / 2 + jnp.log(num_classes))
    return num_data * isotropic_site_maximum(num_classes, variance)


def gram_matrix_bound(K, num_classes, variational_variance=None):
    """The bound of Theorem 9 (Chai 2012) on log p(y) for a zero-mean GP with (nC, nC) Gram matrix K (`gram_bound`
    builds K from a kernel).

    With `variational_variance` = sigma_v^2 > 0 given, the bound at that value; with None, its maximum over
    sigma_v^2 (a concave function of log sigma_v^2 is not guaranteed, so a log-spaced grid is refined by golden
    section). Returns a scalar."""
    K = jnp.asarray(K)
    if K.ndim != 2 or K.shape[0] != K.shape[1] or K.shape[0] % int(num_classes):
        raise ValueError(f"K must be a square (nC, nC) matrix with C = {num_classes}, got shape {K.shape}")
    C = int(num_classes)
    N = K.shape[0]
    n = N // C
    L = jnp.linalg.cholesky(K)
    logdet = 2 * jnp.sum(jnp.log(diagonal(L)))
    tr_inv = jnp.sum(jnp.square(invert_lower(L)))
    value = lambda s2: (N / 2 + N / 2 * jnp.log(s2) - 0.5 * logdet - 0.5 * s2 * tr_inv
                        + n * isotropic_site_maximum(C, s2) * jnp.ones_like(s2))
    if variational_variance is not None:
        _check_variance(variational_variance, "variational_variance")
        return value(jnp.asarray(variational_variance, K.dtype))
    grid = jnp.logspace(-12, 4, 321, dtype=K.dtype)
    vals = jax.vmap(lambda s: value(s))(grid)
    i = jnp.argmax(vals)
    lo = jnp.log(grid[jnp.maximum(i - 1, 0)])
    hi = jnp.log(grid[jnp.minimum(i + 1, grid.shape[0] - 1)])
    g = (jnp.sqrt(5.0) - 1) / 2
    f = lambda t: value(jnp.exp(t))

    def body(_, ab):
        a, b = ab
        c, d = b - g * (b - a), a + g * (b - a)
        return lax.cond(f(c) > f(d), lambda _: (a, d), lambda _: (c, b), None)

    a, b = lax.fori_loop(0, 80, body, (lo, hi))
    return jnp.maximum(f(0.5 * (a + b)), vals[i])
