"""The chevron Cholesky factor (Challis & Barber 2013, Section 4.1.3, "Chevron Cholesky"; Challis & Barber 2011,
Section 4.1)."""

from typing import ClassVar, Optional

import equinox as eqx
import jax
import jax.numpy as jnp

from .._linalg import diagonal, tdot
from .._validate import as_float_array, as_int, check_finite, check_ndim
from ._base import AbstractFactor, check_initialised, signed_log_abs_diag
from ._kernels import broadcast_variances, check_count, check_shape, low_rank_projection, operator_kind


class Chevron(AbstractFactor):
    """C_ij = Theta_ij for j >= i and i < K (the first K rows, upper triangular), C_ii = d_i for i >= K, 0 otherwise
    (Challis & Barber 2013, §4.1.3 with K = `rows`, the number of non-diagonal rows).

    `rows` is at least 1 (`Diagonal()` is the factor without dense rows) and `rows=D` (or D - 1) gives the full
    one. S = C^T C is in general dense while the precision is sparse; the first K variables carry the
    correlations, so the variable order matters (put the variables whose correlations you care about first).

    Storage: `theta` (K, D), whose entries left of the diagonal (j < i) are structural zeros (masked, zero gradient),
    and `d` (D - K,). O(D K) storage.

    Cost of s_n^2 = ||Theta h_n||^2 + sum_{i >= K} d_i^2 h_ni^2 (App. D): O(N D K) for dense H, O(nnz(H) K) for
    sparse BCOO H, and K operator products H X plus one (H o H) v for matrix-free operators; every kind of H is
    supported. Concave in (m, C) for log-concave sites.

    Args:
        rows: K, the number of dense rows (int >= 1, at most D).
        theta: a (K, D) finite float array (its upper triangle is used), or None (with d) for a template.
        d: a (D - K,) finite float array, the diagonal of the remaining rows, or None.

    Raises:
        ValueError: rows < 1 or > D, only one of theta/d, or arrays of the wrong shape or not finite.
    """

    rows: int = eqx.field(static=True)
    theta: Optional[jax.Array]
    d: Optional[jax.Array]
    concave: ClassVar[bool] = True

    def __init__(self, rows: int, theta=None, d=None):
        if as_int(rows) == 0:
            raise ValueError("Chevron(rows=0): rows must be >= 1 (a Chevron factor without dense rows is the "
                             "diagonal one: use gk.factors.Diagonal())")
        self.rows = check_count(rows, "rows", "Chevron", minimum=1)
        if (theta is None) != (d is None):
            raise ValueError("Chevron: give both theta and d, or neither (a template)")
        if theta is not None:
            theta = as_float_array(theta, "theta")
            d = as_float_array(d, "d")
            check_ndim(theta, 2, "theta")
            check_ndim(d, 1, "d")
            dim = theta.shape[1]
            _check_rows(self.rows, dim)
            check_shape(theta, (self.rows, dim), "theta", f"Chevron(rows={self.rows})")
            check_shape(d, (dim - self.rows,), "d", f"Chevron(rows={self.rows})")
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
        return int(self.theta.shape[1])

    def initialise(self, dim, variances):
        _check_rows(self.rows, dim)
        v = broadcast_variances(variances, dim)
        K = self.rows
        theta = jnp.zeros((K, dim), v.dtype).at[jnp.arange(K), jnp.arange(K)].set(jnp.sqrt(v[:K]))
        return Chevron(K, theta, jnp.sqrt(v[K:]))

    def upper_rows(self):
        """Theta with its structural zeros (j < i) masked: the first K rows of C.

        Returns:
            (K, D) float array.
        """
        return jnp.triu(self.theta)

    def _tail(self, values):
        """A length-D vector with zeros at the first K entries and `values` after them."""
        return jnp.concatenate([jnp.zeros((self.rows,), values.dtype), values])

    def logdet(self):
        check_initialised(self)
        head = diagonal(self.theta[:, :self.rows]) if self.rows else jnp.zeros((0,), self.d.dtype)
        return 2 * (signed_log_abs_diag(head) + signed_log_abs_diag(self.d))

    def project_variances(self, op):
        if operator_kind(op) == "identity":
            return self.marginal_variances()
        return low_rank_projection(op, self.upper_rows().T, self._tail(jnp.square(self.d)))

    def marginal_variances(self):
        check_initialised(self)
        return jnp.sum(jnp.square(self.upper_rows()), axis=0) + self._tail(jnp.square(self.d))

    def dense(self):
        check_initialised(self)
        return jnp.concatenate([self.upper_rows(), self._lower_block()], axis=0)

    def _lower_block(self):
        D, K = self.dim, self.rows
        return jnp.zeros((D - K, D), self.d.dtype).at[jnp.arange(D - K), K + jnp.arange(D - K)].set(self.d)

    def matvec(self, v):
        return jnp.concatenate([self.upper_rows() @ v, self.d * v[self.rows:]])

    def rmatvec(self, z):
        return tdot(self.upper_rows(), z[:self.rows]) + self._tail(self.d * z[self.rows:])


def _check_rows(rows, dim):
    if rows > dim:
        raise ValueError(f"Chevron(rows={rows}) must be <= dim={dim} (rows={dim} is the full factor)")
