"""The factor-analysis covariance S = Theta Theta^T + diag(psi) (Challis & Barber 2013, Section 4.1.2 and
App. B.1-B.3)."""

from typing import ClassVar, Optional

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from .._linalg import diagonal, tdot
from .._validate import as_float_array, check_finite, check_ndim
from ._base import AbstractFactor, check_initialised
from ._kernels import broadcast_variances, check_count, check_shape, low_rank_projection, operator_kind

UNIQUENESS_FLOOR = 1e-6
"""The default `floor`: psi_i >= 1e-6 ||theta_i||^2 (`FactorAnalysis`)."""

STARTS = ("heywood", "random")

HEYWOOD_MAX_DIM = 4096
"""The largest D with a Heywood start: it needs the dense precision A (128 MiB in float64 here) and its inverse."""


class FactorAnalysis(AbstractFactor):
    """S = Theta Theta^T + diag(psi) with a (D, K) loading matrix Theta, K = `rank` (Challis & Barber 2013, §4.1.2), and
    the uniquenesses psi_i = d_i^2 + `floor` ||theta_i||^2 (theta_i: row i of Theta; `floor` = 1e-6 by default, 0
    gives the paper's family exactly).

    log det S = sum_i log psi_i + log det(I_K + Theta^T diag(1/psi) Theta) by the matrix determinant lemma
    (App. B.1), O(D K^2); s_n^2 = ||Theta^T h_n||^2 + sum_i psi_i H_ni^2 (App. B.2), O(N D K) for dense H,
    O(nnz(H) K) for sparse BCOO H, and K operator products for matrix-free operators (every kind of H is supported).
    The floor bounds the condition number of the capacitance matrix by about 1 + 1e6 D, so that `logdet` can use
    the lemma over all rows; with a smaller floor (0 included, or float32) it splits off the K most covered rows
    instead, exact where psi_i -> 0.

    Heywood optima: where N <= D the optima L-BFGS finds from a random start have K uniquenesses at the floor, so
    S is the Chevron(rows=K) family with those K coordinates first. `start="heywood"` (the default) therefore
    starts `fit` on such a point: a Diagonal fit gives the precision A of a Gaussian approximation,
    `from_precision` picks the K coordinates greedily and sets S to that Gaussian's optimum in the Heywood family,
    and L-BFGS takes it from there (`Result.num_steps` counts its steps, not the Diagonal fit's). Where
    D > 4096 (`HEYWOOD_MAX_DIM`; A is dense), A is singular or the start's bound is not finite, `fit` starts at
    random. `start="random"`: Theta a small deterministic random matrix, d^2 the initial variances (the start of
    Challis & Barber 2013; Theta = 0 is a saddle point of the bound). A factor given with `theta` and `d`, or a
    `q0`, is started from as given. The measurements behind these choices are on the docs' design-decisions page.

    The bound is NOT concave in (Theta, d) (log det S is not even unimodal, §4.1.2): `fit` uses L-BFGS and may stop
    at a local optimum, which depends on the start.

    `dense()` returns the square root C = (I + Q diag(sqrt(1 + sigma^2) - 1) Q^T) diag(sqrt(psi)), with
    diag(psi^{-1/2}) Theta = Q diag(sigma) V^T (thin SVD), so that C^T C = S; C is not triangular. It is formed in
    O(D K^2) by `matvec`/`rmatvec` (used for sampling) and densely only by `dense()`.

    Args:
        rank: K, the number of factors (int >= 0, at most D).
        theta: a (D, K) finite float array, or None (with d) for a template.
        d: a (D,) finite float array, or None (with theta) for a template.
        floor: the uniqueness floor, a finite float >= 0 (default 1e-6).
        start: "heywood" (default) or "random", the start `fit` uses for a template.

    Raises:
        ValueError: a bad rank, floor or start, only one of theta/d, or arrays of the wrong shape or not finite.
    """

    rank: int = eqx.field(static=True)
    floor: float = eqx.field(static=True)
    start: str = eqx.field(static=True)
    theta: Optional[jax.Array]
    d: Optional[jax.Array]
    concave: ClassVar[bool] = False

    def __init__(self, rank: int, theta=None, d=None, *, floor: float = UNIQUENESS_FLOOR, start: str = "heywood"):
        self.rank = check_count(rank, "rank", "FactorAnalysis")
        if start not in STARTS:
            raise ValueError(f"FactorAnalysis(start={start!r}) must be one of {STARTS}")
        self.start = start
        try:
            floor = float(floor)
        except (TypeError, ValueError):
            raise ValueError(f"FactorAnalysis(floor={floor!r}) must be a number") from None
        if not (floor >= 0 and np.isfinite(floor)):
            raise ValueError(f"FactorAnalysis(floor={floor}) must be finite and >= 0")
        self.floor = floor
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
        return FactorAnalysis(self.rank, theta, d, floor=self.floor, start=self.start)

    def mean_field_start(self, model):
        return self.start == "heywood" and 0 < self.rank <= model.dim <= HEYWOOD_MAX_DIM

    def from_mean_field(self, dim, mean_field, precision):
        return self.from_precision(precision())

    def from_precision(self, precision):
        """The Heywood start: the K coordinates H picked greedily, each the one of largest A_jj [(A_RR)^{-1}]_jj
        among those left (R), which removes the most mean-field loss 1/2 (sum_r log A_rr - log det A_RR) of the
        rest; then the optimum for the Gaussian N(., A^{-1}) within the Chevron family with H first, written as
        factor analysis: Theta = Sigma_{:,H} L^{-T} with L L^T = Sigma_HH (Sigma = A^{-1}; Theta Theta^T is the
        Nystrom approximation of Sigma on H), d_H = 0 and d_r = A_rr^{-1/2} (q(w_H) is the exact marginal, and
        q(w_R | w_H) has the exact conditional mean and the mean-field variances 1/A_rr). O(D^3 + K D^2).

        Args:
            precision: (D, D) symmetric positive-definite float array A.

        Returns:
            `FactorAnalysis` with this template's rank, floor and start, initialised.

        Raises:
            ValueError: rank > D.
        """
        A = precision
        dim = A.shape[0]
        _check_rank(self.rank, dim)
        Sigma = jax.scipy.linalg.cho_solve((jnp.linalg.cholesky(A), True), jnp.eye(dim, dtype=A.dtype))
        a = diagonal(A)

        def pick(k, carry):
            R, hubs = carry     # R: (A_RR)^{-1} on the rows and columns left, zeros on those picked
            j = jnp.argmax(jnp.where(diagonal(R) > 0, a * diagonal(R), -jnp.inf))
            return R - jnp.outer(R[:, j], R[j]) / R[j, j], hubs.at[k].set(j)

        _, hubs = lax.fori_loop(0, self.rank, pick, (Sigma, jnp.zeros(self.rank, int)))
        L = jnp.linalg.cholesky(Sigma[hubs][:, hubs])
        theta = jax.scipy.linalg.solve_triangular(L, Sigma[hubs], lower=True).T
        d = (1 / jnp.sqrt(a)).at[hubs].set(0.0)
        return FactorAnalysis(self.rank, theta, d, floor=self.floor, start=self.start)

    def uniquenesses(self):
        """The uniquenesses psi = d^2 + floor ||theta_i||^2, the diagonal of S - Theta Theta^T.

        Returns:
            (D,) float array.
        """
        return jnp.square(self.d) + self.floor * jnp.sum(jnp.square(self.theta), axis=1)

    def logdet(self):
        """log det S = sum_i log psi_i + log det(I_K + Theta^T diag(1/psi) Theta), the matrix determinant lemma
        (App. B.1), where `floor` >= sqrt(eps) of the dtype (the default 1e-6 in float64): psi_i >= floor
        ||theta_i||^2 bounds the condition number of the K x K capacitance matrix by 1 + D / floor.

        Below that (`floor=0`, the paper's family, or float32), `_split_logdet`: the lemma cancels -inf against
        +inf as psi_i -> 0 on rows Theta covers (a Heywood case, where the fits of Challis & Barber 2013,
        Tables 2-4 end up).
        With `floor=0` and two psi_i = 1e-22 it was 16 nats too high, so the bound exceeded log Z, and NaN from
        psi_i = 1e-18."""
        check_initialised(self)
        psi = self.uniquenesses()
        if self.rank == 0:
            return jnp.sum(jnp.log(psi))
        if self.floor < np.sqrt(np.finfo(psi.dtype).eps):
            return self._split_logdet(psi)
        U = self.theta / jnp.sqrt(psi)[:, None]
        L = jnp.linalg.cholesky(jnp.eye(self.rank, dtype=U.dtype) + U.T @ U)
        return jnp.sum(jnp.log(psi)) + 2 * jnp.sum(jnp.log(diagonal(L)))

    def _split_logdet(self, psi):
        """log det S with the K rows H of smallest psi_i / S_ii (those Theta covers most) split off, R the others:

            log det S = sum_{i in R} log psi_i + log det M + log det(diag(psi_H) + Theta_H M^{-1} Theta_H^T),
            M = I_K + Theta_R^T diag(1/psi_R) Theta_R

        (det S = det S_RR det(S_HH - S_HR S_RR^{-1} S_RH), and I - Theta_R^T S_RR^{-1} Theta_R = M^{-1}). At most K
        of the psi_i can vanish while S stays non-singular, so M and the K x K Schur complement stay well
        conditioned whatever psi_H is, 0 included. O(D K^2 + D log D)."""
        theta = self.theta
        hub = jnp.argsort(psi / (psi + jnp.sum(jnp.square(theta), axis=1)))[:self.rank]
        rest = jnp.ones(psi.shape, bool).at[hub].set(False)
        safe = jnp.where(rest, psi, 1.0)
        M = jnp.eye(self.rank, dtype=psi.dtype) + tdot(theta, jnp.where(rest, 1 / safe, 0.0)[:, None] * theta)
        L = jnp.linalg.cholesky(M)
        T = jax.scipy.linalg.solve_triangular(L, theta[hub].T, lower=True)
        schur = jnp.diag(psi[hub]) + tdot(T, T)
        diagonals = jnp.concatenate([diagonal(L), diagonal(jnp.linalg.cholesky(schur))])
        return jnp.sum(jnp.where(rest, jnp.log(safe), 0.0)) + 2 * jnp.sum(jnp.log(diagonals))

    def project(self, op, mean):
        if operator_kind(op) == "identity":
            return mean, self.marginal_variances()
        return low_rank_projection(op, self.theta, self.uniquenesses(), mean)

    def project_variances(self, op):
        if operator_kind(op) == "identity":
            return self.marginal_variances()
        return low_rank_projection(op, self.theta, self.uniquenesses())

    def marginal_variances(self):
        check_initialised(self)
        return jnp.sum(jnp.square(self.theta), axis=1) + self.uniquenesses()

    def covariance(self):
        check_initialised(self)
        return self.theta @ self.theta.T + jnp.diag(self.uniquenesses())

    def covariance_mv(self, v):
        return self.theta @ tdot(self.theta, v) + self.uniquenesses() * v

    def _root(self):
        """(sqrt(psi), Q, sqrt(1 + sigma^2) - 1) of the symmetric square root of I + U U^T,
        U = diag(psi^{-1/2}) Theta = Q diag(sigma) V^T. A psi_i below eps ||theta_i||^2 (a Heywood row, `floor=0`)
        is raised to it (or to the smallest normal number): that changes S_ii = ||theta_i||^2 + psi_i by round-off,
        and keeps the rows of U within 1/sqrt(eps) of each other in scale. A normwise backward-stable SVD of U
        (what GPU solvers give) then loses about sqrt(eps) in C^T C instead of O(1): emulated with an SVD error of
        eps ||U||, 1e-4 -> 5e-8 at psi_i = 1e-22 and 5.6 -> 8e-8 at psi_i = 0."""
        info = jnp.finfo(self.theta.dtype)
        least = jnp.maximum(info.eps * jnp.sum(jnp.square(self.theta), axis=1), info.tiny)
        r = jnp.sqrt(jnp.maximum(self.uniquenesses(), least))
        Q, sigma, _ = jnp.linalg.svd(self.theta / r[:, None], full_matrices=False)
        return r, Q, jnp.sqrt(1 + jnp.square(sigma)) - 1

    def matvec(self, v):
        r, Q, g = self._root()
        w = r * v
        return w + Q @ (g * tdot(Q, w))

    def rmatvec(self, z):
        r, Q, g = self._root()
        return r * (z + Q @ (g * tdot(Q, z)))

    def dense(self):
        check_initialised(self)
        return jax.vmap(self.matvec, in_axes=1, out_axes=1)(jnp.eye(self.dim, dtype=self.d.dtype))


def _check_rank(rank, dim):
    if rank > dim:
        raise ValueError(f"FactorAnalysis(rank={rank}) must be <= dim={dim}")
