"""The factor-analysis covariance S = Theta Theta^T + diag(d^2) (papers/000, Section 4.1.2 and App. B.1-B.3)."""

from typing import ClassVar, Optional

import equinox as eqx
import jax
import jax.numpy as jnp

from .._linalg import tdot
from .._validate import as_float_array, check_finite, check_ndim
from ._base import AbstractFactor, check_initialised
from ._kernels import broadcast_variances, check_count, check_shape, operator_kind


class FactorAnalysis(AbstractFactor):
    """S = Theta Theta^T + diag(d^2) with a (D, K) loading matrix Theta, K = `rank` (papers/000 §4.1.2).

    log det S = sum_i log d_i^2 + log det(I_K + Theta^T diag(1/d^2) Theta) by the matrix determinant lemma
    (App. B.1), O(D K^2); s_n^2 = ||Theta^T h_n||^2 + sum_i d_i^2 H_ni^2 (App. B.2), O(N D K) for dense H,
    O(nnz(H) K) for sparse BCOO H, and K operator products for matrix-free operators (every kind of H is supported).

    The bound is NOT concave in (Theta, d) (log det S is not even unimodal, §4.1.2): `fit` uses L-BFGS and may stop
    at a local optimum. Theta is initialised to a small deterministic random matrix (Theta = 0 is a saddle point
    of the bound: its gradient in Theta vanishes there).

    Known weakness: the bound can keep rising as some d_i -> 0 while Theta covers e_i (a Heywood case of factor
    analysis). There log d_i^2 and the capacitance term cancel, so the gradient in d_i loses its precision
    (|dB/dd_i| ~ 1e8 at d_i ~ 1e-2 was seen). L-BFGS then stalls and reports converged=False. This happened in 3 of
    10 synthetic logistic problems at D = 1000, N = 500, K = 100 (786-1015 steps). The returned bound is still
    valid. Storing log d instead converged in 117-135 steps there, but stopped 0.1-0.7 nats lower, so it was not
    adopted.

    `dense()` returns the square root C = (I + Q diag(sqrt(1 + sigma^2) - 1) Q^T) diag(d), with
    diag(1/d) Theta = Q diag(sigma) V^T (thin SVD), so that C^T C = S; C is not triangular. It is formed in
    O(D K^2) by `matvec`/`rmatvec` (used for sampling) and densely only by `dense()`.
    """

    rank: int = eqx.field(static=True)
    theta: Optional[jax.Array]
    d: Optional[jax.Array]
    concave: ClassVar[bool] = False
    default_solver: ClassVar[str] = "lbfgs"

    def __init__(self, rank: int, theta=None, d=None):
        self.rank = check_count(rank, "rank", "FactorAnalysis")
        if (theta is None) != (d is None):
            raise ValueError("FactorAnalysis: give both theta and d, or neither (a template)")
        if theta is not None:
            theta = as_float_array(theta, "theta")
            d = as_float_array(d, "d")
            check_ndim(theta, 2, "theta")
            check_ndim(d, 1, "d")
            _check_rank(self.rank, d.shape[0])
            check_shape(theta, (d.shape[0], self.rank), "theta", f"FactorAnalysis(rank={self.rank})")
            check_finite(theta, "theta")
            check_finite(d, "d")
        self.theta = theta
        self.d = d

    @property
    def is_initialised(self):
        return self.theta is not None

    @property
    def dim(self):
        check_initialised(self)
        return int(self.d.shape[0])

    def initialise(self, dim, variances):
        _check_rank(self.rank, dim)
        v = broadcast_variances(variances, dim)
        z = jax.random.normal(jax.random.PRNGKey(0), (dim, self.rank), v.dtype)
        theta = 0.1 * jnp.sqrt(v / max(self.rank, 1))[:, None] * z
        d = jnp.sqrt(jnp.maximum(v - jnp.sum(jnp.square(theta), axis=1), 0.5 * v))
        return FactorAnalysis(self.rank, theta, d)

    def _capacitance_cholesky(self):
        """Cholesky factor of I_K + Theta^T diag(1/d^2) Theta."""
        U = self.theta / self.d[:, None]
        return jnp.linalg.cholesky(jnp.eye(self.rank, dtype=U.dtype) + U.T @ U)

    def logdet(self):
        logdet_d = jnp.sum(jnp.log(jnp.square(self.d)))
        if self.rank == 0:
            return logdet_d
        return logdet_d + 2 * jnp.sum(jnp.log(jnp.diagonal(self._capacitance_cholesky())))

    def project_variances(self, op):
        if operator_kind(op) == "identity":
            return self.marginal_variances()
        diag = op.sq_mv(jnp.square(self.d))
        if self.rank == 0:
            return diag
        return jnp.sum(jnp.square(op.mm(self.theta)), axis=1) + diag

    def marginal_variances(self):
        return jnp.sum(jnp.square(self.theta), axis=1) + jnp.square(self.d)

    def covariance(self):
        return self.theta @ self.theta.T + jnp.diag(jnp.square(self.d))

    def covariance_mv(self, v):
        return self.theta @ tdot(self.theta, v) + jnp.square(self.d) * v

    def _root(self):
        """(Q, sqrt(1 + sigma^2) - 1) of the symmetric square root of I + U U^T, U = diag(1/d) Theta."""
        Q, sigma, _ = jnp.linalg.svd(self.theta / self.d[:, None], full_matrices=False)
        return Q, jnp.sqrt(1 + jnp.square(sigma)) - 1

    def matvec(self, v):
        Q, g = self._root()
        w = self.d * v
        return w + Q @ (g * tdot(Q, w))

    def rmatvec(self, z):
        Q, g = self._root()
        return self.d * (z + Q @ (g * tdot(Q, z)))

    def dense(self):
        return jax.vmap(self.matvec, in_axes=1, out_axes=1)(jnp.eye(self.dim, dtype=self.d.dtype))


def _check_rank(rank, dim):
    if rank > dim:
        raise ValueError(f"FactorAnalysis(rank={rank}) must be <= dim={dim}")
