"""Shared pieces of the baselines: model checks, the joint density, elementwise site derivatives, and the
Gaussian with Gaussian site terms that Laplace, EP and the local bound all produce.

Every baseline replaces site n by an (unnormalised) Gaussian site in the projection x_n = h_n^T w + o_n,

    t_n(x) = exp(-tau_n x^2 / 2 + nu_n x + c_n),

so that the approximation is q(w) = N(w | A^{-1} b, A^{-1}) with (Challis & Barber 2013, eq. 14)

    A = Sigma^{-1} + sum_n tau_n h_n h_n^T,      b = Sigma^{-1} mu + sum_n (nu_n - tau_n o_n) h_n,

and the Gaussian integral (Challis & Barber 2013, eq. 13, completing the square)

    log int N(w | mu, Sigma) prod_n t_n(h_n^T w + o_n) dw
        = sum_n (c_n - tau_n o_n^2 / 2 + nu_n o_n) - mu^T Sigma^{-1} mu / 2 - log det Sigma / 2
          + b^T A^{-1} b / 2 - log det A / 2.

Without a prior the two prior terms are replaced by (D/2) log 2 pi (the integral of prod_n t_n alone).
"""

import warnings
from typing import NamedTuple

import jax
import jax.numpy as jnp
import jax.scipy.linalg as jsl

from .._gaussian import Gaussian
from .._linalg import diagonal
from .._model import check_fittable
from .._optim import default_tol as _default_tol
from .._result import Result
from .._validate import is_concrete
from ..factors._full import Full, upper_factor_of_inverse


def check_model(model, method: str) -> None:
    """The checks every baseline shares: a gkl_jax.Model whose sites carry no `variance_offset`."""
    check_fittable(model, method)
    for i, s in enumerate(model.sites):
        v = s.variance_offset
        if is_concrete(v) and bool(jnp.any(v != 0)):  # (not checkable under tracing)
            raise ValueError(f"{method}: model.sites[{i}] has a variance_offset (a G-KL-specific term for sparse "
                             "GPs); the baselines need sites phi_n(h_n^T w + offset_n) without one")


def check_fraction(value, name: str, method: str) -> float:
    """A float in (0, 1] (EP's power and damping)."""
    try:
        value = float(value)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{method}: {name} must be a number in (0, 1], got {value!r}") from err
    if not 0.0 < value <= 1.0:
        raise ValueError(f"{method}: {name} must be in (0, 1], got {value}")
    return value


def default_tol(dtype) -> float:
    """The baselines' default tolerance: 1e-8 for float64, 1e-4 for float32."""
    return _default_tol(dtype, float64=1e-8, float32=1e-4)


def dtype_of(model):
    leaves = [x for x in jax.tree.leaves(model) if hasattr(x, "dtype") and jnp.issubdtype(x.dtype, jnp.floating)]
    return jnp.result_type(*leaves) if leaves else jnp.result_type(float)


def operators(model):
    """[(H as an operator, per-site offsets of shape (N,), potential)] for every Sites group."""
    out = []
    for s in model.sites:
        op = s.operator(model.dim)
        n = op.shape[0]
        out.append((op, jnp.broadcast_to(s.offset, (n,)), s.potential))
    return out


def projections(groups, w):
    """[x_n = h_n^T w + o_n] per group."""
    return [op.mv(w) + off for op, off, _ in groups]


def log_joint(model, w):
    """log N(w | mu, Sigma) + sum_n log phi_n(h_n^T w + o_n): the log of the unnormalised target (eq. 2)."""
    value = jnp.zeros((), w.dtype) if model.prior is None else model.prior.log_density(w)
    groups = operators(model)
    for x, (_, _, pot) in zip(projections(groups, w), groups):
        value = value + jnp.sum(pot.log_phi(x))
    return value


def site_derivatives(potential, x):
    """(d/dx log phi_n, d^2/dx^2 log phi_n) at x_n, elementwise (autodiff of the potential's own log_phi)."""
    d1 = jax.grad(lambda x: jnp.sum(potential.log_phi(x)))
    d2 = jax.grad(lambda x: jnp.sum(d1(x)))
    return d1(x), d2(x)


def prior_precision_mv(model, v):
    return jnp.zeros_like(v) if model.prior is None else model.prior.precision_mv(v)


def prior_constant(model, dtype):
    """-mu^T Sigma^{-1} mu / 2 - log det Sigma / 2, or (D/2) log 2 pi without a prior."""
    if model.prior is None:
        return 0.5 * model.dim * jnp.log(2 * jnp.pi).astype(dtype)
    mu = model.prior.mean
    return -0.5 * (mu @ model.prior.precision_mv(mu)) - 0.5 * model.prior.logdet()


class GaussianSites(NamedTuple):
    """The Gaussian of the module docstring, computed densely (O(D^3 + N D^2))."""

    precision: jax.Array      # A
    chol: jax.Array           # lower L, L L^T = A (NaN where A is not positive definite)
    mean: jax.Array           # A^{-1} b
    log_integral: jax.Array   # the Gaussian integral above
    site_means: list          # [h_n^T m + o_n] per group
    site_vars: list           # [h_n^T A^{-1} h_n] per group
    ok: jax.Array             # A positive definite (finite Cholesky)


def gaussian_sites(model, groups, taus, nus, consts=None) -> GaussianSites:
    """q(w) = N(A^{-1} b, A^{-1}) and the Gaussian integral for site parameters (tau, nu, c) per group."""
    dim = model.dim
    dtype = jnp.result_type(*taus) if taus else dtype_of(model)   # no taus: a prior-only model
    if model.prior is None:
        A = jnp.zeros((dim, dim), dtype)
        b = jnp.zeros((dim,), dtype)
    else:
        A = model.prior.precision_dense().astype(dtype)
        b = model.prior.precision_mv(model.prior.mean).astype(dtype)
    c = prior_constant(model, dtype)
    consts = [None] * len(groups) if consts is None else consts
    for (op, off, _), tau, nu, cn in zip(groups, taus, nus, consts):
        A = A + op.weighted_gram(tau)
        b = b + op.rmv(nu - tau * off)
        c = c + jnp.sum(nu * off - 0.5 * tau * off**2)
        if cn is not None:
            c = c + jnp.sum(cn)
    A = 0.5 * (A + A.T)
    L = jnp.linalg.cholesky(A)
    ok = jnp.all(jnp.isfinite(L))
    L_safe = jnp.where(ok, L, jnp.eye(dim, dtype=dtype))
    m = jsl.cho_solve((L_safe, True), b)
    log_integral = c + 0.5 * b @ m - jnp.sum(jnp.log(diagonal(L_safe)))
    means, variances = [], []
    for op, off, _ in groups:
        means.append(op.mv(m) + off)
        V = jsl.solve_triangular(L_safe, op.as_matrix().T.astype(dtype), lower=True)
        variances.append(jnp.sum(jnp.square(V), axis=0))
    nan = jnp.asarray(jnp.nan, dtype)
    return GaussianSites(A, jnp.where(ok, L, nan), m, jnp.where(ok, log_integral, nan), means, variances, ok)


def gaussian_of_precision(mean, precision):
    """gkl_jax.Gaussian N(mean, precision^{-1}) with the upper-triangular Full factor."""
    return Gaussian(mean, Full(upper_factor_of_inverse(precision)))


def prior_only_result(model, method: str, is_bound: bool) -> Result:
    """The answer for a model without sites: q is the prior and log Z = 0 (the prior is normalised)."""
    if model.prior is None:
        raise ValueError(f"{method}: the model has neither a prior nor sites (nothing to normalise)")
    dtype = dtype_of(model)
    q = gaussian_of_precision(model.prior.mean.astype(dtype), model.prior.precision_dense().astype(dtype))
    zero = jnp.zeros((), dtype)
    return Result(q=q, log_z=zero, converged=jnp.array(True), num_steps=jnp.zeros((), jnp.int32),
                  history=zero[None], method=method, is_bound=is_bound)


def warn_if_not_converged(converged, method: str, detail: str) -> None:
    """The baselines' honest failure report: converged=False plus a warning (outside of tracing)."""
    if is_concrete(converged) and not bool(converged):
        warnings.warn(f"gkl_jax.{method}: {detail}", stacklevel=3)
