"""The variational Gaussian q(w) = N(m, S), S = C^T C."""

import equinox as eqx
import jax
import jax.numpy as jnp

from ._validate import as_float_array, check_finite, check_ndim
from .factors import AbstractFactor


class Gaussian(eqx.Module):
    """q(w) = N(mean, C^T C) with C given by a structured `factor`."""

    mean: jax.Array
    factor: AbstractFactor

    def __init__(self, mean, factor: AbstractFactor):
        mean = as_float_array(mean, "mean")
        check_ndim(mean, 1, "mean")
        check_finite(mean, "mean")
        if not isinstance(factor, AbstractFactor):
            raise ValueError(f"factor must be a gkl_jax.factors factor, got {type(factor).__name__}")
        if not factor.is_initialised:
            factor = factor.initialise(mean.shape[0], jnp.ones((), mean.dtype))
        if factor.dim != mean.shape[0]:
            raise ValueError(f"factor has dim {factor.dim} but mean has length {mean.shape[0]}")
        self.mean = mean
        self.factor = factor

    @property
    def dim(self) -> int:
        return int(self.mean.shape[0])

    def entropy(self):
        """H[q] = D/2 (1 + log 2 pi) + 1/2 log det S."""
        return 0.5 * self.dim * (1 + jnp.log(2 * jnp.pi)) + 0.5 * self.factor.logdet()

    def covariance(self):
        """S as a dense (D, D) matrix."""
        return self.factor.covariance()

    def marginal_variances(self):
        return self.factor.marginal_variances()

    def project(self, op):
        """(m_n, s_n^2) = (h_n^T m, h_n^T S h_n) for the rows of an operator."""
        return self.factor.project(op, self.mean)

    def sample(self, key, num_samples: int):
        """`num_samples` draws w = m + C^T z, z ~ N(0, I); shape (num_samples, D)."""
        z = jax.random.normal(key, (num_samples, self.dim), dtype=self.mean.dtype)
        return self.mean + jax.vmap(self.factor.rmatvec)(z)

    def log_density(self, w):
        """log q(w) (dense; for tests and small problems)."""
        C = self.factor.dense()
        r = jax.scipy.linalg.solve_triangular(C, w - self.mean, trans="T", lower=False)
        return -0.5 * (self.dim * jnp.log(2 * jnp.pi) + self.factor.logdet() + r @ r)
