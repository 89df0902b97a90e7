"""`predict`: predictions of a fitted linear-Gaussian-site model at new site rows.

For a fitted q(w) = N(m, S) (any method's `Result`) and new rows h_* (the rows of `H_new`), the latent projection
x_* = h_*^T w + offset has the Gaussian predictive

    x_* ~ N(h_*^T m + offset, h_*^T S h_*),

computed by the factor itself (`Gaussian.project`), so every factor structure predicts through the same code.
Given a likelihood family phi(y | x) the observation predictive is the 1-D integral E_{N(x | mu_*, s2_*)}[phi(y | x)]
(the predictive integral; MacKay 1992 for logistic regression), evaluated as in `gkl_jax.gp.predict`: p(y = +1)
for the binary families (probit: Phi(mu / sqrt(1 + s2)); logistic: Gauss-Hermite quadrature over x, not the
plug-in sigmoid(mu)), the predictive mean and variance of y for the regression families (Gaussian, Laplace,
Student-t, Cauchy), E[count] = exp(mu + s2 / 2) for Poisson, and with test targets `y` the log predictive
density log p(y_* | x_*) per point.
"""

from typing import Optional

import jax.numpy as jnp
from jaxtyping import ArrayLike, Float, Real

from ._gaussian import Gaussian
from ._linalg import full_precision
from ._program import program
from ._result import Result
from ._tracing import top_level
from ._typing import Means
from ._validate import as_float_array, check_finite, check_ndim
from .gp._predict import (
    PREDICTIVE_NUM_POINTS,
    Prediction,
    class_probability,
    log_predictive_density,
    observation_moments,
    with_targets,
)
from .operators import AbstractOperator, as_operator
from .potentials import AbstractPotential


@full_precision
def predict(result: Result | Gaussian, H_new: Float[ArrayLike, "n d"] | Float[ArrayLike, " d"] | AbstractOperator,
            family: AbstractPotential | str | None = None, *, y: Real[ArrayLike, " n"] | None = None,
            offset: Means = 0.0, num_points: int = PREDICTIVE_NUM_POINTS) -> Prediction:
    """Predictive quantities of x_* = h_*^T w + offset at the rows h_* of `H_new` under a fitted q(w).

    Args:
        result: a `Result` (or a `Gaussian`) over w of dimension D, e.g. from `gk.fit`, `gk.laplace`, `gk.ep`.
        H_new: the new rows, an (n, D) array, BCOO matrix or `gkl_jax.operators` operator (a (D,) vector is one
            row).
        family: None (the latent predictive only), a `gkl_jax.potentials` potential (the training likelihood
            will do: its targets are ignored, its scalar parameters such as the noise variance used), or a name
            "logistic", "probit", "poisson".
        y: optional test targets, shape (n,) ({-1, +1} labels for binary families); needs `family` and adds
            `log_density`.
        offset: a scalar or (n,) offset added to the projections (e.g. an intercept kept outside w).
        num_points: Gauss-Hermite nodes for the predictive integrals without a closed form.

    Returns:
        A `gkl_jax.gp.Prediction` with `mean`, `variance` (n,) of the latent projection; `probability`
        p(y_* = +1) for Logistic/Probit; `y_mean`, `y_variance` for regression and Poisson families; and
        `log_density` (n,) when `y` was given. Arrays in the fit's dtype.

    Example:
        >>> import numpy as np, gkl_jax as gk
        >>> H = np.array([[1.0, 0.5], [-0.3, 1.0], [0.2, -1.0]])
        >>> model = gk.Model(gk.priors.Isotropic(2, 1.0), gk.Sites(H, gk.potentials.Logistic([1, -1, 1])))
        >>> pred = gk.predict(gk.fit(model), np.array([[1.0, 1.0], [0.0, 0.0]]), "logistic")
        >>> print(np.round(pred.probability, 3))
        [0.519 0.5  ]
    """
    q = result.q if isinstance(result, Result) else result
    if not isinstance(q, Gaussian):
        raise ValueError(f"result must be a gkl_jax.Result or Gaussian, got {type(result).__name__}")
    op = _rows(H_new, q.dim)
    n = op.shape[0]
    offset = as_float_array(offset, "offset")
    if offset.ndim > 1 or (offset.ndim == 1 and offset.shape[0] != n):
        raise ValueError(f"offset must be a scalar or have shape ({n},), got {offset.shape}")
    check_finite(offset, "offset")
    if y is not None and family is None:
        raise ValueError("y (test targets) needs a likelihood family")
    likelihood = None if family is None else with_targets(family, y, n)
    args = (q, op, offset, likelihood, y is not None, num_points)
    return _predict_program(*args) if top_level(args, {}) else _predict_value(*args)


def _predict_value(q, op, offset, likelihood, with_density, num_points):
    mean, variance = q.project(op)
    mean = mean + offset.astype(mean.dtype)
    variance = jnp.maximum(variance, 0.0)
    if likelihood is None:
        return Prediction(mean, variance)
    probability = class_probability(likelihood, mean, variance, num_points=num_points)
    y_mean, y_variance = observation_moments(likelihood, mean, variance)
    log_density: Optional[jnp.ndarray] = None
    if with_density:
        log_density = log_predictive_density(likelihood, mean, variance, num_points=num_points)
    return Prediction(mean, variance, log_density, probability, y_mean, y_variance)


_predict_program = program(_predict_value)
"""`predict` outside of every trace: one compiled program per structure and shape instead of its array
operations one at a time (each a small program of its own for every new shape)."""


def _rows(H_new, dim):
    if isinstance(H_new, AbstractOperator):
        op = H_new
    else:
        if not hasattr(H_new, "indices"):          # dense input: check it here (BCOO/scipy go to as_operator)
            H_new = as_float_array(H_new, "H_new")
            if H_new.ndim == 1:
                H_new = H_new[None, :]
            check_ndim(H_new, 2, "H_new")
            check_finite(H_new, "H_new")
        op = as_operator(H_new, "H_new")
    if op.shape[1] != dim or op.shape[0] == 0:
        raise ValueError(f"H_new must have shape (n, {dim}) with n >= 1 (the fitted dimension), got {op.shape}")
    return op
