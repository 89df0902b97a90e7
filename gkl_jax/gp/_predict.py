"""GP predictions from any fitted Gaussian q(f) = N(m, C^T C) over the latent values at the prior's inputs
(Challis & Barber 2013, App. F.1; Nickisch 2010, eq. 4.10):

    mu_*  = mu(x_*) + k_*^T Sigma^{-1} (m - mu)
    s2_*  = k_** - k_*^T Sigma^{-1} k_* + k_*^T Sigma^{-1} S Sigma^{-1} k_*,

where k_* = K(X, x_*), Sigma = K(X, X) + jitter I is the prior covariance (its Cholesky factor is reused) and
the last term is ||C a_*||^2 with a_* = Sigma^{-1} k_*, computed by the factor itself, so every factor structure
and every method (G-KL, Laplace, EP, local, exact) predicts through the same code. For a sparse GP the prior is
the one over the inducing values u = f(Z) and the same formulas give p(f_* | q(u)).

With a likelihood phi(y | f) holding the test targets, the predictive density of y_* is

    p(y_* | x_*) = E_{N(f | mu_*, s2_*)}[phi(y_* | f)],

in closed form for the Gaussian (N(y_* | mu_*, s2_* + v)), probit (Phi(y_* mu_* / sqrt(1 + s2_*))) and Laplace
likelihoods, and by Gauss-Hermite quadrature (log-sum-exp over the nodes) otherwise. For binary likelihoods the
class probability p(y_* = +1 | x_*) is reported as well (probit: closed form; logistic: quadrature).
"""

from typing import Optional

import equinox as eqx
import jax
import jax.numpy as jnp
from jax.scipy.special import log_ndtr, logsumexp, ndtr
from jaxtyping import Array, ArrayLike, Float

from .._gaussian import Gaussian
from .._linalg import full_precision, tdot
from .._program import program
from .._quadrature import hermite_rule
from .._result import Result
from .._typing import Inputs, Means
from .._validate import as_float_array, check_finite, check_ndim, is_concrete
from ..operators import Dense as DenseOperator
from ..potentials import AbstractPotential, Cauchy, Laplace, Logistic, Poisson, Probit, StudentT
from ..potentials import Gaussian as GaussianLik
from ..priors import GP
from ._models import check_likelihood

PREDICTIVE_NUM_POINTS = 128


class Prediction(eqx.Module):
    """Predictive quantities at the n_new test inputs (Challis & Barber 2013, App. F.1).

    Attributes:
        mean: (n_new,) float array, the latent predictive mean.
        variance: (n_new,) float array, the latent predictive variance: N(f_* | mean, variance).
        log_density: (n_new,) float array of log p(y_* | x_*), when a likelihood with test targets was given,
            else None.
        probability: (n_new,) float array of p(y_* = +1 | x_*) for binary (probit, logistic) likelihoods, else
            None.
        y_mean: (n_new,) float array, the predictive mean of y_* for regression likelihoods (Gaussian, Laplace,
            Student-t: the latent mean; Cauchy: the location) and E[count] = exp(mean + variance / 2) for
            Poisson, else None.
        y_variance: (n_new,) float array, the predictive variance of y_* (the latent variance plus the noise
            variance, inf for Student-t with dof <= 2 and for Cauchy; the log-normal variance for Poisson), else
            None.
    """

    mean: jax.Array
    variance: jax.Array
    log_density: Optional[jax.Array] = None
    probability: Optional[jax.Array] = None
    y_mean: Optional[jax.Array] = None
    y_variance: Optional[jax.Array] = None


def latent(q: Gaussian | Result, prior: GP, X_new: Inputs,
           mean_new: Means | None = None) -> tuple[Float[Array, " n"], Float[Array, " n"]]:
    """The latent predictive mean and variance at the rows of X_new (Challis & Barber 2013, App. F.1).

    Args:
        q: the fitted `gkl_jax.Gaussian` (or a `Result`) over the prior's n training inputs.
        prior: the `gkl_jax.priors.GP` the fit used.
        X_new: (n_new, d) float array (an (n_new,) array is one column when d = 1, else one point).
        mean_new: the prior mean at X_new (scalar or (n_new,)); needed when the prior's mean is per input.

    Returns:
        (mu, s2): two (n_new,) float arrays.

    Raises:
        ValueError: q not a Gaussian or Result, prior not a GP or of another size, X_new of the wrong shape or
            not finite, or a missing mean_new.
    """
    q = q.q if isinstance(q, Result) else q
    if not isinstance(q, Gaussian):
        raise ValueError(f"q must be a gkl_jax.Gaussian or Result, got {type(q).__name__}")
    X_new = _check_inputs(q, prior, X_new)
    return _latent(q, prior, X_new, _mean_at(prior, X_new.shape[0], mean_new, X_new.dtype))


def _check_inputs(q, prior, X_new) -> jax.Array:
    if not isinstance(prior, GP):
        raise ValueError(f"prior must be a gkl_jax.priors.GP, got {type(prior).__name__}")
    if q.dim != prior.dim:
        raise ValueError(f"q has dimension {q.dim} but the GP prior has {prior.dim} inputs")
    X_new = as_float_array(X_new, "X_new")
    if X_new.ndim == 1:
        X_new = X_new[:, None] if prior.X.shape[1] == 1 else X_new[None, :]
    if X_new.ndim != 2 or X_new.shape[1] != prior.X.shape[1]:
        raise ValueError(f"X_new must have shape (n, {prior.X.shape[1]}), got {X_new.shape}")
    check_finite(X_new, "X_new")
    return X_new


def _latent(q, prior, X_new, mu_new):
    K_xs = prior.cross_covariance(X_new)                          # (n, n_new)
    A = prior.solve(K_xs)                                         # Sigma^{-1} k_*, columns
    mean = mu_new + tdot(A, q.mean - prior.mean)
    explained = jnp.sum(K_xs * A, axis=0)                         # k_*^T Sigma^{-1} k_*
    posterior = q.factor.project_variances(DenseOperator(A.T, "X_new"))  # ||C a_*||^2
    variance = prior.kernel.diag(X_new) - explained + posterior
    return mean, jnp.maximum(variance, 0.0)


def _mean_at(prior, n_new, mean_new, dtype):
    if mean_new is not None:
        mean_new = as_float_array(mean_new, "mean_new")
        return jnp.broadcast_to(mean_new, (n_new,))
    if prior.constant_mean is None:
        raise ValueError("the GP prior has a per-input mean; pass mean_new, the prior mean at X_new")
    return jnp.full((n_new,), prior.constant_mean, dtype=dtype)


@full_precision
def predict(result: Result | Gaussian, prior: GP, X_new: Inputs, likelihood: Optional[AbstractPotential] = None,
            *, mean_new: Means | None = None, num_points: int = PREDICTIVE_NUM_POINTS,
            family: AbstractPotential | str | None = None) -> Prediction:
    """Predictions at the rows of `X_new` from a fitted `Result` (or a `Gaussian`) on `prior`'s inputs.

    `likelihood` (optional) is a potential holding the test targets, e.g. `potentials.StudentT(y_test, 3,
    scale)` or `potentials.Probit(y_test)`; it adds `log_density` (and `probability` for binary likelihoods,
    `y_mean`/`y_variance` for regression ones). For unlabelled test points pass `family` instead: the training
    likelihood (its targets are ignored, its parameters used) or a name ("logistic", "probit", "poisson"); it
    gives `probability` / `y_mean` / `y_variance` without `log_density`. (Challis & Barber 2013, App. F.1;
    Rasmussen & Williams 2006, eq. 3.21-3.25.)

    Args:
        result: the fitted `gkl_jax.Result` (or a `Gaussian`) over the prior's n training inputs.
        prior: the `gkl_jax.priors.GP` the fit used.
        X_new: (n_new, d) float array of test inputs.
        likelihood: a `gkl_jax.potentials` potential holding n_new test targets, or None.
        mean_new: the prior mean at X_new when the prior's mean is not a constant.
        num_points: Gauss-Hermite nodes for predictive integrals without a closed form (default 128).
        family: for unlabelled test points, the training likelihood or "logistic", "probit" or "poisson".

    Returns:
        `Prediction` with (n_new,) arrays.

    Raises:
        ValueError: result not a Result or Gaussian, a bad prior or X_new, both likelihood and family, a
            likelihood with another number of targets, or a missing mean_new.

    Example:
        >>> import numpy as np, gkl_jax as gk
        >>> X = np.linspace(-2.0, 2.0, 8)[:, None]
        >>> y = np.where(np.sin(2.0 * X[:, 0]) > 0, 1, -1)
        >>> build = lambda kernel: gk.gp.model(kernel, X, gk.potentials.Logistic(y))
        >>> model = build(gk.kernels.SquaredExponential(1.0, 1.0))
        >>> pred = gk.gp.predict(gk.fit(model), model.prior, np.array([[-1.0], [1.0]]), family="logistic")
        >>> print(np.round(pred.probability, 2))
        [0.39 0.61]
    """
    q = result.q if isinstance(result, Result) else result
    if not isinstance(q, Gaussian):
        raise ValueError(f"result must be a gkl_jax.Result or Gaussian, got {type(result).__name__}")
    X_new = _check_inputs(q, prior, X_new)
    mu_new = _mean_at(prior, X_new.shape[0], mean_new, X_new.dtype)
    if likelihood is not None and family is not None:
        raise ValueError("pass either likelihood (with test targets) or family (without), not both")
    if family is not None:
        likelihood, labelled = with_targets(family, None, X_new.shape[0]), False
    else:
        labelled = True
    if likelihood is not None:
        check_likelihood(likelihood, X_new.shape[0], "X_new")
    out = _predict_jit(q, prior, X_new, mu_new, likelihood, int(num_points))
    return out if labelled else eqx.tree_at(lambda p: p.log_density, out, None, is_leaf=lambda x: x is None)


@program
def _predict_jit(q, prior, X_new, mu_new, likelihood, num_points):
    mean, variance = _latent(q, prior, X_new, mu_new)
    if likelihood is None:
        return Prediction(mean, variance)
    log_density = log_predictive_density(likelihood, mean, variance, num_points=num_points)
    probability = class_probability(likelihood, mean, variance, num_points=num_points)
    y_mean, y_variance = observation_moments(likelihood, mean, variance)
    return Prediction(mean, variance, log_density, probability, y_mean, y_variance)


FAMILIES = {"logistic": Logistic, "probit": Probit, "poisson": Poisson}
"""Likelihood families without parameters, by name (`with_targets`)."""


def with_targets(family, y, num: int):
    """The likelihood `family` holding the targets `y` (None: placeholder targets, +1 or 0, for predictions that do
    not use them) for `num` test points.

    Args:
        family: a `gkl_jax.potentials` potential with a `y` field (its other parameters, scalars or per-site
            arrays of length `num`, are kept) or a name in `FAMILIES`.
        y: test targets of shape (num,) or None.
        num: the number of test points.
    Returns:
        The potential with `y` replaced; ValueError for an unknown family or per-site parameters of another length.
    """
    if isinstance(family, str):
        if family not in FAMILIES:
            raise ValueError(f"family must be a potential or one of {sorted(FAMILIES)}, got {family!r}")
        family = FAMILIES[family](jnp.ones((num,)) if family != "poisson" else jnp.zeros((num,)))
    if not isinstance(family, AbstractPotential) or not hasattr(family, "y"):
        raise ValueError(f"family must be a gkl_jax.potentials potential with targets y (Gaussian, Laplace, StudentT, "
                         f"Cauchy, Logistic, Probit, Poisson) or a name, got {type(family).__name__}")
    if y is None:
        y = jnp.ones((num,), family.y.dtype) if isinstance(family, (Logistic, Probit)) else jnp.zeros((num,),
                                                                                                   family.y.dtype)
    else:
        y = as_float_array(y, "y")
        check_ndim(y, 1, "y")
        if y.shape[0] != num:
            raise ValueError(f"y has {y.shape[0]} targets but there are {num} test points")
        check_finite(y, "y")
        if isinstance(family, (Logistic, Probit)) and is_concrete(y) and not bool(jnp.all(jnp.abs(y) == 1)):
            raise ValueError("y must hold labels in {-1, +1} for a binary likelihood")
        if isinstance(family, Poisson) and is_concrete(y) and not bool(jnp.all((y >= 0) & (y == jnp.round(y)))):
            raise ValueError("y must hold non-negative integer counts for a Poisson likelihood")
    for name in ("variance", "scale", "dof"):
        value = getattr(family, name, None)
        if value is not None and jnp.ndim(value) == 1 and value.shape[0] != num:
            raise ValueError(f"the family's {name} is per site (length {value.shape[0]}); predictions at {num} "
                             "points need a scalar or one value per test point")
    return eqx.tree_at(lambda p: p.y, family, jnp.asarray(y, family.y.dtype))


def observation_moments(likelihood, mean, variance):
    """(E[y_*], Var[y_*]) under the latent predictive N(mean, variance) for regression and count likelihoods
    (see `Prediction`); (None, None) for binary ones."""
    if isinstance(likelihood, Poisson):
        y_mean = jnp.exp(mean + 0.5 * variance)
        return y_mean, y_mean + jnp.square(y_mean) * jnp.expm1(variance)
    if isinstance(likelihood, Cauchy):
        return mean, jnp.full_like(variance, jnp.inf)
    y_variance = _y_variance(likelihood, variance)
    return (None, None) if y_variance is None else (mean, y_variance)


def _check_moments(likelihood, mean, variance) -> tuple[jax.Array, jax.Array]:
    """(mean, variance) as float arrays after checking them against each other and the likelihood's data."""
    mean, variance = as_float_array(mean, "mean"), as_float_array(variance, "variance")
    check_ndim(mean, 1, "mean")
    if variance.shape != mean.shape:
        raise ValueError(f"variance must have the shape of mean, {mean.shape}, got {variance.shape}")
    check_likelihood(likelihood, mean.shape[0], "mean")
    if is_concrete(variance) and not bool(jnp.all(variance >= 0)):
        raise ValueError("variance must be >= 0")
    return mean, variance


def log_predictive_density(likelihood: AbstractPotential, mean: Float[ArrayLike, " n"],
                           variance: Float[ArrayLike, " n"], *,
                           num_points: int = PREDICTIVE_NUM_POINTS) -> Float[Array, " n"]:
    """log E_{N(f | mean, variance)}[phi(f)] elementwise (closed form for Gaussian, probit and Laplace
    likelihoods, else Gauss-Hermite).

    Args:
        likelihood: a `gkl_jax.potentials` potential holding the n targets.
        mean: (n,) float array of latent predictive means.
        variance: (n,) non-negative float array of latent predictive variances.
        num_points: Gauss-Hermite nodes (default 128).

    Returns:
        (n,) float array.

    Raises:
        ValueError: mean not 1-D, variance of another shape or negative, or a likelihood with another number
            of targets.
    """
    mean, variance = _check_moments(likelihood, mean, variance)
    if isinstance(likelihood, GaussianLik):
        v = variance + likelihood.variance
        return -0.5 * (jnp.log(2 * jnp.pi * v) + jnp.square(likelihood.y - mean) / v)
    if isinstance(likelihood, Probit):
        return log_ndtr(likelihood.y * mean / jnp.sqrt(1 + variance))
    if isinstance(likelihood, Laplace):
        return _laplace_log_predictive(likelihood.y, likelihood.scale, mean, variance)
    z, w = hermite_rule(int(num_points))
    z = jnp.asarray(z, mean.dtype)
    log_w = jnp.log(jnp.asarray(w, mean.dtype))
    x = mean[:, None] + jnp.sqrt(variance)[:, None] * z
    vals = jax.vmap(likelihood.log_phi, in_axes=1, out_axes=1)(x)
    return logsumexp(vals + log_w, axis=1)


def _laplace_log_predictive(y, tau, m, s2):
    """log int exp(-|y - f| / tau) / (2 tau) N(f | m, s2) df

        = log(1 / (4 tau)) + s2 / (2 tau^2) + log[e^{-d/tau} erfc(a_-) + e^{d/tau} erfc(a_+)],
    d = y - m, s = sqrt(s2), a_-+ = (s2/tau -+ d) / (sqrt(2) s), evaluated with log erfc for stability."""
    s = jnp.sqrt(jnp.maximum(s2, jnp.finfo(jnp.result_type(s2)).tiny))
    d = y - m
    # erfc(a) = 2 Phi(-sqrt(2) a)
    t1 = -d / tau + jnp.log(2.0) + log_ndtr(-(s / tau - d / s))
    t2 = d / tau + jnp.log(2.0) + log_ndtr(-(s / tau + d / s))
    return -jnp.log(4 * tau) + s2 / (2 * tau**2) + jnp.logaddexp(t1, t2)


def class_probability(likelihood: AbstractPotential, mean: Float[ArrayLike, " n"], variance: Float[ArrayLike, " n"],
                      *, num_points: int = PREDICTIVE_NUM_POINTS) -> Float[Array, " n"] | None:
    """p(y = +1 | x_*) for probit (Phi(mean / sqrt(1 + variance))) and logistic (quadrature) likelihoods.

    Args:
        likelihood: a `gkl_jax.potentials` potential (its per-site data, if any, of length n).
        mean: (n,) float array of latent predictive means.
        variance: (n,) non-negative float array of latent predictive variances.
        num_points: Gauss-Hermite nodes for the logistic (default 128).

    Returns:
        (n,) float array, or None for likelihoods other than Probit and Logistic.

    Raises:
        ValueError: as `log_predictive_density`.
    """
    mean, variance = _check_moments(likelihood, mean, variance)
    if isinstance(likelihood, Probit):
        return ndtr(mean / jnp.sqrt(1 + variance))
    if isinstance(likelihood, Logistic):
        z, w = hermite_rule(int(num_points))
        x = mean[:, None] + jnp.sqrt(variance)[:, None] * jnp.asarray(z, mean.dtype)
        return jax.nn.sigmoid(x) @ jnp.asarray(w, mean.dtype)
    return None


def _y_variance(likelihood, variance):
    if isinstance(likelihood, GaussianLik):
        return variance + likelihood.variance
    if isinstance(likelihood, Laplace):
        return variance + 2 * jnp.square(likelihood.scale)
    if isinstance(likelihood, StudentT):
        nu = likelihood.dof
        noise = jnp.where(nu > 2, jnp.square(likelihood.scale) * nu / jnp.where(nu > 2, nu - 2, 1.0), jnp.inf)
        return variance + noise
    return None
