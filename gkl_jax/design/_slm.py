"""The sparse linear model (Challis & Barber 2013, Section 6.3.1; Nickisch 2010, Ch. 5) and its MAP estimate.

    p(w | y) ∝ N(y | M w, v^2 I) prod_n phi_n(b_n^T w),      s = B w,

with the Gaussian likelihood as one group of sites (h_n = rows of the measurement matrix M) and sparsity
potentials (Laplace(0, tau): exp(-|s|/tau) / (2 tau), or Student-t) on the filter responses s = B w (B the
identity for sparse signals; finite differences and wavelets for images, `gkl_jax.operators`).

The model has no Gaussian prior (`Model(None, ...)`). The potentials are normalised densities of s, not of w,
so the product is an unnormalised density of w (Section 6.3.1). We keep every potential's normaliser
(-log 2 tau per Laplace site): it is constant in (m, C), so the fitted Gaussian is unaffected, and the G-KL
value is still a lower bound (Jensen) on log of the integral of the unnormalised product, which is finite
whenever [M; B] has full column rank (always for B = I or B containing an orthonormal wavelet transform).
It is not the log marginal likelihood of a normalised prior, which is why designs compare posteriors, never
bound values.

The MAP estimate argmax_w log N(y | M w, v^2 I) + sum_n log phi_n(b_n^T w) is the random-design reference of
Figures 8 and 10. Laplace potentials are not differentiable at 0, so `map_estimate` maximises the Gaussian-
smoothed objective sum_n E_{x ~ N(b_n^T w, eps^2)}[log phi_n(x)] (the potentials' own closed-form or quadrature
expectations; exact up to a constant for Gaussian sites) for a decreasing sequence of eps (continuation, each
stage warm-started), which converges to the MAP as eps -> 0 (for Laplace the smoothed |x| is within
eps sqrt(2/pi) of |x|).
"""

import warnings
from typing import Sequence, Union

import jax
import jax.numpy as jnp

from .._linalg import full_precision
from .._model import Model, Sites, check_fittable
from .._optim import default_tol
from .._program import program
from .._validate import as_float_array, check_finite, check_int, check_ndim, check_tol, is_concrete
from ..operators import AbstractOperator, as_operator
from ..potentials import AbstractPotential
from ..potentials import Gaussian as GaussianPotential
from ..solvers._newton import newton_cg
from ..solvers._quasi_newton import lbfgs
from ._scores import check_noise_variance


def _as_list(x) -> list:
    if isinstance(x, (list, tuple)):
        return list(x)
    return [x]


def sparse_linear_model(measurements, y, noise_variance, filters: Union[AbstractOperator, Sequence],
                        potentials: Union[AbstractPotential, Sequence[AbstractPotential]]) -> Model:
    """`Model(None, [Sites(M, Gaussian(y, v^2)), Sites(B_1, phi_1), ...])`: the sparse linear model (Challis &
    Barber 2013, Section 6.3.1; Nickisch 2010, Ch. 5).

    Args:
        measurements: M, an (N, D) float array or operator (N may be 0: the filters alone).
        y: (N,) float array of observations.
        noise_variance: v^2 > 0, a float scalar.
        filters: one operator B (or (M_k, D) array) or a list of them, all with D columns.
        potentials: one potential per filter group (e.g. `gk.potentials.Laplace(0.0, tau)` or
            `gk.potentials.StudentT(0.0, dof, scale)`).

    Returns:
        `gkl_jax.Model` without a prior over D variables.

    Raises:
        ValueError: filters and potentials that do not pair up, no filter, column counts that differ,
            measurements not 2-D or not finite, y of the wrong length, or a bad noise_variance.
    """
    v2 = check_noise_variance(noise_variance)
    filters, potentials = _as_list(filters), _as_list(potentials)
    if len(filters) != len(potentials):
        raise ValueError(f"filters and potentials must pair up, got {len(filters)} filters and "
                         f"{len(potentials)} potentials")
    if not filters:
        raise ValueError("filters must hold at least one operator B")
    ops = [as_operator(B, f"filters[{i}]") for i, B in enumerate(filters)]
    dim = ops[0].shape[1]
    for i, op in enumerate(ops):
        if op.shape[1] != dim:
            raise ValueError(f"filters[{i}] has {op.shape[1]} columns, filters[0] has {dim}")
    M = measurements if isinstance(measurements, AbstractOperator) else as_float_array(measurements,
                                                                                       "measurements")
    if not isinstance(M, AbstractOperator):
        check_ndim(M, 2, "measurements")
        check_finite(M, "measurements")
    if M.shape[1] != dim:
        raise ValueError(f"measurements rows must have length D={dim} (the filters' columns), got {M.shape[1]}")
    y = as_float_array(y, "y")
    check_ndim(y, 1, "y")
    if y.shape[0] != M.shape[0]:
        raise ValueError(f"y has length {y.shape[0]} but measurements has {M.shape[0]} rows")
    sites = [Sites(op, pot) for op, pot in zip(ops, potentials)]
    if M.shape[0] > 0:
        sites.insert(0, Sites(M, GaussianPotential(y, v2)))
    return Model(None, sites)


@full_precision
def map_estimate(model: Model, *, w0=None, smoothing=(1e-1, 1e-2, 1e-3, 1e-4), tol=None, max_steps=200):
    """The MAP estimate of `model` by Gaussian-smoothed continuation (module doc).

    Newton-CG for log-concave models, L-BFGS otherwise: a stationary point, usually a local optimum, but a
    saddle when w0 is one (w0 = 0 for a potential symmetric about 0; pass another w0 there). Warns when the
    last stage did not converge.

    Args:
        model: a `gkl_jax.Model` that can be fitted.
        w0: the (D,) float starting point (default zeros).
        smoothing: the positive smoothing widths eps of the stages, largest first (default 1e-1 ... 1e-4).
        tol: the gradient tolerance of each stage (default 1e-6 in float64, 1e-3 in float32).
        max_steps: steps per stage (int >= 1, default 200).

    Returns:
        (w, converged): the (D,) float array and a bool scalar array, False when the last stage did not reach
        max|grad| <= tol.

    Raises:
        ValueError: a model that cannot be fitted, empty or non-positive smoothing, a bad w0, tol or max_steps.
    """
    check_fittable(model, "map_estimate")
    eps = [check_tol(e, "smoothing") for e in _as_list(smoothing)]
    if not eps:
        raise ValueError(f"smoothing must be positive smoothing widths, got {smoothing}")
    dtype = jnp.result_type(float)
    w = jnp.zeros(model.dim, dtype) if w0 is None else as_float_array(w0, "w0")
    if w.shape != (model.dim,):
        raise ValueError(f"w0 must have shape ({model.dim},), got {w.shape}")
    check_finite(w, "w0")
    tol = default_tol(w.dtype) if tol is None else check_tol(tol)
    max_steps = check_int(max_steps, "max_steps", 1)
    ok = jnp.array(False)
    for e in eps:
        w, ok = _map_stage(model, w, jnp.asarray(e * e, w.dtype), tol, max_steps, model.log_concave)
    if is_concrete(ok) and not bool(ok):
        warnings.warn(f"gkl_jax.design.map_estimate: the last smoothing stage (eps={eps[-1]:g}) stopped without "
                      f"reaching max|grad| <= {tol:g} in max_steps={max_steps}", stacklevel=2)
    return w, ok


def smoothed_log_density(model: Model, w, eps2):
    """log prior(w) + sum_n E_{x ~ N(h_n^T w + offset_n, eps2 + variance_offset_n)}[log phi_n(x)], the objective
    of one stage of `map_estimate`.

    Args:
        model: a `gkl_jax.Model` over D variables.
        w: (D,) float array.
        eps2: the smoothing variance, a finite float >= 0 (scalar, or broadcasting against the sites).

    Returns:
        float scalar array.

    Raises:
        ValueError: eps2 negative or not finite, or w not of shape (D,).
    """
    eps2 = as_float_array(eps2, "eps2")
    if is_concrete(eps2) and not bool(jnp.all(eps2 >= 0) & jnp.all(jnp.isfinite(eps2))):
        raise ValueError(f"eps2 (a variance) must be finite and >= 0, got {eps2}")
    w = as_float_array(w, "w")
    if w.shape != (model.dim,):
        raise ValueError(f"w must have shape ({model.dim},), got {w.shape}")
    value = 0.0 if model.prior is None else model.prior.log_density(w)
    for s in model.sites:
        op = s.operator(model.dim)
        m = op.mv(w) + s.offset
        value = value + jnp.sum(s.potential.expected_log_phi(m, eps2 + s.variance_offset + jnp.zeros_like(m)))
    return value


@program
def _map_stage(model, w, eps2, tol, max_steps, concave):
    f = lambda x: smoothed_log_density(model, x, eps2)
    if concave:
        x, _, ok, _ = newton_cg(f, w, tol=tol, max_steps=max_steps)
    else:
        x, _, ok, _, _ = lbfgs(f, w, tol=tol, max_steps=max_steps)
    return jax.lax.stop_gradient(x), ok
