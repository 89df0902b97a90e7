"""Gaussian priors N(w | mu, Sigma) in structured form.

Each prior gives the expected log density under q = N(m, S) (the second term of Challis & Barber 2013, eq. 7),

    E_q[log N(w | mu, Sigma)] = -1/2 [D log 2 pi + log det Sigma + tr(Sigma^{-1} S) + (m - mu)^T Sigma^{-1} (m - mu)],

using its own structure (isotropic and diagonal: the factor's marginal variances; dense: tr(Sigma^{-1} S) =
sum_n ||C g_n||^2 over the rows g_n of L^{-1}, Sigma = L L^T, with L computed once at construction), plus the
precision products the fixed-point solver needs.
"""

import abc

import equinox as eqx
import jax
import jax.numpy as jnp

from .._linalg import diagonal, invert_lower, lower_gram, reduced_matmul_precision, reduced_precision_hint, tdot
from .._optim import roundoff
from .._validate import as_float_array, check_finite, check_int, check_ndim, check_positive, is_concrete
from ..operators import Dense as DenseOperator


class AbstractPrior(eqx.Module):
    """N(w | mean, Sigma) over w in R^D, the prior p(w) of Challis & Barber (2013), eq. 1.

    Attributes:
        mean: (D,) float array, the prior mean.
        dim: int property, D.
    """

    mean: eqx.AbstractVar[jax.Array]

    @property
    def dim(self) -> int:
        return int(self.mean.shape[0])

    @abc.abstractmethod
    def logdet(self):
        """log det Sigma.

        Returns:
            float scalar.
        """

    @abc.abstractmethod
    def trace_precision(self, factor):
        """tr(Sigma^{-1} S) for S = C^T C.

        Args:
            factor: an initialised `gkl_jax.factors.AbstractFactor` over D variables, giving S.

        Returns:
            float scalar.
        """

    @abc.abstractmethod
    def precision_mv(self, v):
        """The precision product Sigma^{-1} v.

        Args:
            v: (D,) float array.

        Returns:
            (D,) float array.
        """

    @abc.abstractmethod
    def precision_dense(self):
        """Sigma^{-1} as a dense matrix.

        Returns:
            (D, D) float array.
        """

    @abc.abstractmethod
    def precision_diagonal(self):
        """The diagonal of Sigma^{-1}.

        Returns:
            (D,) float array.
        """

    @abc.abstractmethod
    def cholesky(self):
        """The lower-triangular Cholesky factor of Sigma (dense; used for whitening and sampling).

        Returns:
            (D, D) float array L with L L^T = Sigma.
        """

    @abc.abstractmethod
    def marginal_variances(self):
        """The prior marginal variances diag(Sigma).

        Returns:
            (D,) float array.
        """

    def expected_log_density(self, q):
        """E_q[log N(w | mu, Sigma)] under q = N(m, C^T C) (Challis & Barber 2013, eq. 7, second term).

        Args:
            q: a `gkl_jax.Gaussian` over the same D variables.

        Returns:
            float scalar.
        """
        d = q.mean - self.mean
        return -0.5 * (self.dim * jnp.log(2 * jnp.pi) + self.logdet() + self.trace_precision(q.factor)
                       + d @ self.precision_mv(d))

    def log_density(self, w):
        """The prior log density log N(w | mu, Sigma).

        Args:
            w: (D,) float array.

        Returns:
            float scalar.
        """
        d = w - self.mean
        return -0.5 * (self.dim * jnp.log(2 * jnp.pi) + self.logdet() + d @ self.precision_mv(d))


def _mean(mean, dim, like):
    """The prior mean (dim,): zeros of `like`'s dtype (weakly typed where `like` is, so that a Python-float
    variance leaves the model's dtype to its data) or the given mean."""
    if mean is None:
        return jnp.zeros_like(like, shape=(dim,))
    mean = as_float_array(mean, "mean")
    check_finite(mean, "mean")
    if mean.ndim == 0:
        return jnp.full(dim, mean, dtype=mean.dtype)
    if mean.shape != (dim,):
        raise ValueError(f"mean must have shape ({dim},), got {mean.shape}")
    return mean


class Isotropic(AbstractPrior):
    """N(w | mean, variance * I).

    Args:
        dim: the dimension D, an int >= 1.
        variance: the prior variance, a positive finite scalar (default 1).
        mean: the prior mean, None (zeros), a scalar or a (D,) float array.

    Raises:
        ValueError: dim not an int >= 1, variance not a positive finite scalar, or mean of the wrong shape or
            not finite.
    """

    mean: jax.Array
    variance: jax.Array

    def __init__(self, dim: int, variance=1.0, mean=None):
        dim = check_int(dim, "dim", 1)
        variance = as_float_array(variance, "variance")
        if variance.ndim != 0:
            raise ValueError(f"variance must be a scalar for Isotropic, got shape {variance.shape}")
        check_positive(variance, "variance")
        check_finite(variance, "variance")
        self.variance = variance
        self.mean = _mean(mean, int(dim), variance)

    def logdet(self):
        return self.dim * jnp.log(self.variance)

    def trace_precision(self, factor):
        return factor.trace() / self.variance

    def precision_mv(self, v):
        return v / self.variance

    def precision_dense(self):
        return jnp.eye(self.dim, dtype=self.mean.dtype) / self.variance

    def precision_diagonal(self):
        return jnp.full(self.dim, 1 / self.variance)

    def cholesky(self):
        return jnp.sqrt(self.variance) * jnp.eye(self.dim, dtype=self.mean.dtype)

    def marginal_variances(self):
        return jnp.full(self.dim, self.variance)


class Diagonal(AbstractPrior):
    """N(w | mean, diag(variance)).

    Args:
        variance: the (D,) positive finite prior variances.
        mean: the prior mean, None (zeros), a scalar or a (D,) float array.

    Raises:
        ValueError: variance not 1-D, empty, not positive or not finite, or mean of the wrong shape.
    """

    mean: jax.Array
    variance: jax.Array

    def __init__(self, variance, mean=None):
        variance = as_float_array(variance, "variance")
        check_ndim(variance, 1, "variance")
        if variance.shape[0] == 0:
            raise ValueError("variance must have at least one entry")
        check_positive(variance, "variance")
        check_finite(variance, "variance")
        self.variance = variance
        self.mean = _mean(mean, variance.shape[0], variance)

    def logdet(self):
        return jnp.sum(jnp.log(self.variance))

    def trace_precision(self, factor):
        return jnp.sum(factor.marginal_variances() / self.variance)

    def precision_mv(self, v):
        return v / self.variance

    def precision_dense(self):
        return jnp.diag(1 / self.variance)

    def precision_diagonal(self):
        return 1 / self.variance

    def cholesky(self):
        return jnp.diag(jnp.sqrt(self.variance))

    def marginal_variances(self):
        return self.variance


SYMMETRY_ROUNDOFF = 64.0
"""The symmetry check's round-off allowance, in eps(dtype) * max|Sigma| (`_checked_cholesky`)."""


@jax.jit
def _checked_cholesky(covariance):
    """(L, L^{-1}, finite, symmetric, positive definite) in one compiled call: built eagerly, a prior otherwise
    dispatches its checks and its blocked inverse op by op, most of an eager model build.

    Symmetric means |Sigma_ij - Sigma_ji| <= 1e-6 |Sigma_ji| + max(1e-10, SYMMETRY_ROUNDOFF eps max|Sigma|) (eps
    of Sigma's dtype): a matrix computed in float32 (a Gram matrix from ||x||^2 + ||x'||^2 - 2 x^T x', a product)
    differs from its transpose by the round-off of its largest entries, which on its small entries is far above
    1e-6 of their size."""
    L = jnp.linalg.cholesky(covariance)
    level = roundoff(covariance, jnp.max(jnp.abs(covariance)), SYMMETRY_ROUNDOFF)
    allowed = 1e-6 * jnp.abs(covariance.T) + jnp.maximum(level, 1e-10)
    symmetric = jnp.all(jnp.abs(covariance - covariance.T) <= allowed)
    return L, invert_lower(L), jnp.all(jnp.isfinite(covariance)), symmetric, jnp.all(jnp.isfinite(L))


def dense_cholesky(covariance, name="covariance"):
    """Validated lower Cholesky factor L of a symmetric positive-definite matrix and its inverse L^{-1}."""
    check_ndim(covariance, 2, name)
    if covariance.shape[0] != covariance.shape[1] or covariance.shape[0] == 0:
        raise ValueError(f"{name} must be square and non-empty, got shape {covariance.shape}")
    L, inv, finite, symmetric, positive = _checked_cholesky(covariance)
    if is_concrete(covariance):
        if not bool(finite):
            raise ValueError(f"{name} contains NaN or inf")
        if not bool(symmetric):
            raise ValueError(f"{name} must be symmetric")
        if not bool(positive):
            hint = f" ({reduced_precision_hint()})" if reduced_matmul_precision(covariance.dtype) else ""
            if not hint and jnp.finfo(covariance.dtype).bits < 64:
                hint = (f" (in {jnp.dtype(covariance.dtype).name} its smallest eigenvalues are below round-off: "
                        "add more jitter to its diagonal, or enable float64 with "
                        "jax.config.update(\"jax_enable_x64\", True))")
            raise ValueError(f"{name} must be positive definite (its Cholesky factorisation failed){hint}")
    return L, inv


class AbstractDensePrior(AbstractPrior):
    """A prior with a dense covariance Sigma = L L^T whose factor L and L^{-1} are stored (`dense_cholesky`):
    tr(Sigma^{-1} S) = sum_n ||C g_n||^2 over the rows g_n of L^{-1}, Sigma^{-1} v = L^{-T} L^{-1} v."""

    covariance: eqx.AbstractVar[jax.Array]
    chol: eqx.AbstractVar[jax.Array]
    inv_chol: eqx.AbstractVar[jax.Array]

    def logdet(self):
        return 2 * jnp.sum(jnp.log(diagonal(self.chol)))

    def trace_precision(self, factor):
        return jnp.sum(factor.project_variances(DenseOperator(self.inv_chol)))

    def precision_mv(self, v):
        return tdot(self.inv_chol, self.inv_chol @ v)

    def precision_dense(self):
        return lower_gram(self.inv_chol)

    def precision_diagonal(self):
        return jnp.sum(jnp.square(self.inv_chol), axis=0)

    def cholesky(self):
        return self.chol

    def marginal_variances(self):
        return diagonal(self.covariance)


class Dense(AbstractDensePrior):
    """N(w | mean, covariance) with a dense covariance; its Cholesky factor is computed once here.

    Args:
        covariance: (D, D) symmetric positive-definite float array.
        mean: the prior mean, None (zeros), a scalar or a (D,) float array.

    Raises:
        ValueError: covariance not square, empty, not finite, not symmetric or not positive definite, or mean of
            the wrong shape.
    """

    mean: jax.Array
    covariance: jax.Array
    chol: jax.Array
    inv_chol: jax.Array

    def __init__(self, covariance, mean=None):
        covariance = as_float_array(covariance, "covariance")
        self.chol, self.inv_chol = dense_cholesky(covariance)
        self.covariance = covariance
        self.mean = _mean(mean, covariance.shape[0], covariance)
