"""The variational Gaussian q(w) = N(m, S), S = C^T C."""

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import ArrayLike, Float

from ._repr import MAX_SHOWN, format_value
from ._validate import as_float_array, check_finite, check_int, check_key, check_ndim, is_concrete
from .factors._base import AbstractFactor


class Gaussian(eqx.Module):
    """q(w) = N(mean, C^T C) with C given by a structured `factor` (Challis & Barber 2013, Section 3).

    Args:
        mean: (D,) finite float array m.
        factor: a `gkl_jax.factors` factor; an uninitialised one is initialised for D variables (its default
            start, unit scale).

    Raises:
        ValueError: mean not 1-D or not finite, factor not a gkl_jax factor, or a factor of another dimension.
    """

    mean: jax.Array
    factor: AbstractFactor

    def __init__(self, mean: Float[ArrayLike, " d"], factor: AbstractFactor):
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

    def __repr__(self):
        items = f"dim={self.mean.shape[0]}, factor={type(self.factor).__name__}, mean={format_value(self.mean)}"
        if self.mean.shape[0] <= MAX_SHOWN and all(is_concrete(x) for x in jax.tree.leaves(self)):
            items += f", sd={format_value(jnp.sqrt(self.marginal_variances()))}"
        return f"Gaussian({items})"

    @property
    def dim(self) -> int:
        return int(self.mean.shape[0])

    def entropy(self):
        """The entropy H[q] = D/2 (1 + log 2 pi) + 1/2 log det S (the first term of Challis & Barber 2013, eq. 7).

        Returns:
            float scalar.
        """
        return 0.5 * self.dim * (1 + jnp.log(2 * jnp.pi)) + 0.5 * self.factor.logdet()

    def covariance(self):
        """The covariance S = C^T C as a dense matrix.

        Returns:
            (D, D) float array.
        """
        return self.factor.covariance()

    def marginal_variances(self):
        """The marginal variances diag(S).

        Returns:
            (D,) float array.
        """
        return self.factor.marginal_variances()

    def project(self, op):
        """The projected means and variances (m_n, s_n^2) = (h_n^T m, h_n^T S h_n) for the rows h_n of an operator.

        Args:
            op: a `gkl_jax.operators` operator of shape (N, D).

        Returns:
            (m, s2): two (N,) float arrays.
        """
        return self.factor.project(op, self.mean)

    def sample(self, key, num_samples: int):
        """Draws w = m + C^T z, z ~ N(0, I).

        Args:
            key: a `jax.random` key.
            num_samples: the number of draws (int >= 0).

        Returns:
            (num_samples, D) float array.

        Raises:
            ValueError: key not a JAX PRNG key, or num_samples not a non-negative int.
        """
        z = jax.random.normal(check_key(key), (check_int(num_samples, "num_samples"), self.dim),
                              dtype=self.mean.dtype)
        return self.mean + jax.vmap(self.factor.rmatvec)(z)

    def log_density(self, w):
        """log q(w) for one point w (D,) or a batch (n, D) (dense, O(D^3); for tests and small problems): with
        r = C^{-T} (w - m), log q = -(D log 2 pi + log det S + r^T r) / 2. C is square but not triangular for
        every factor (FactorAnalysis, Subspace), hence a general solve.

        Args:
            w: (D,) or (n, D) float array.

        Returns:
            float scalar array for one point, (n,) float array for a batch.

        Raises:
            ValueError: w not of shape (D,) or (n, D).
        """
        w = as_float_array(w, "w")
        if w.ndim not in (1, 2) or w.shape[-1] != self.dim:
            raise ValueError(f"w must have shape ({self.dim},) or (n, {self.dim}), got {w.shape}")
        r = jnp.linalg.solve(self.factor.dense().T, (w - self.mean).T)
        return -0.5 * (self.dim * jnp.log(2 * jnp.pi) + self.factor.logdet() + jnp.sum(r * r, axis=0))
