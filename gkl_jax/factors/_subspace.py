"""The subspace Cholesky factor (Challis & Barber 2013, Section 4.1.3 "Subspace Cholesky" and App. B.4)."""

from typing import ClassVar, Optional

import equinox as eqx
import jax
import jax.numpy as jnp
from jax import lax

from .._linalg import diagonal, invert_lower, tdot
from .._optim import backtrack
from .._validate import as_float_array, check_finite, check_ndim, is_concrete
from ._base import check_initialised, signed_log_abs_diag
from ._full import upper_factor_of_inverse
from ._kernels import (
    broadcast_variances,
    check_count,
    check_shape,
    operator_kind,
    orthonormal,
    precision_mm,
    precision_trace,
    site_curvatures,
)
from ._krylov import _OVERSAMPLING, _extend_krylov, best_split, row_space_matrix
from ._refinable import AbstractRefinableFactor

BASIS_UPDATES = ("eigen", "gradient")
_DEFAULT_ITERATIONS = {"eigen": 2, "gradient": 4}
"""`basis_iterations` by default: Krylov steps of the eigen update, gradient steps of the gradient update."""


class Subspace(AbstractRefinableFactor):
    """S = E C_1^T C_1 E^T + c^2 (I - E E^T): a K-dimensional orthonormal basis E (D, K) (the paper's E_1^T), an
    upper-triangular K x K factor C_1 inside the subspace and one standard deviation c in every direction
    orthogonal to it (Challis & Barber 2013, §4.1.3 and App. B.4.1), K = `rank`.

    s_n^2 = ||C_1 E^T h_n||^2 + c^2 (||h_n||^2 - ||E^T h_n||^2) and log det S = 2 sum_k log|C_1kk| + (D - K) log c^2,
    so with the projections E^T h_n and the norms ||h_n||^2 computed once per basis (the solvers hold E fixed, and
    XLA hoists them out of the solver loops) a bound evaluation costs O(N K^2) (App. D). Every kind of H is
    supported (dense, sparse BCOO, matrix-free: the basis needs only H X and H^T Y products). The bound is exact for
    any prior; the paper's isotropic-prior assumption (under which E does not enter tr(Sigma^{-1} S)) is only what
    makes the cost independent of D.

    The basis is refined between solves (`num_refinements` alternations inside `gkl_jax.fit`, keeping the best
    bound), by `basis_update`:

    - "eigen" (default; the fixed point of eqs. 10/21, App. B.4.3): Ritz vectors of the optimal precision
      A = Sigma^{-1} + H^T Gamma H, Gamma_nn = -E[psi_n''] at the current q, from both ends of its spectrum, by
      Rayleigh-Ritz on the block Krylov space [X, A X, ..., A^b X], X = [current basis, 10 random columns],
      b = `basis_iterations` (default 2): b + 1 products with A, O(b (K + 10) nnz(H)), no D x D matrix, for
      dense, sparse and matrix-free H. Which split of the K columns between the two ends (the j largest and
      K - j smallest Ritz vectors) is decided by the KL for a Gaussian target, computed for every j from the Ritz
      values and tr A (`best_split`); (C_1, c) go to their fixed point for this Gamma, S_1 = (E^T A E)^{-1},
      c^2 = (D - K) / tr(A (I - E E^T)), and the new factor replaces the current one if its bound is not lower.
      Why both ends: App. B.4.3 asks for "the leading K eigenvectors of S" (the smallest eigenvalues of A), while
      its own approximation (the non-zero eigenvectors of H Gamma' H^T) returns the largest ones. For a Gaussian
      target the optimal (S_1, c) give KL = (D - K)/2 log(AM/GM) of the eigenvalues of A left outside the
      subspace, minimised by taking extreme eigenvalues from either end: with N < D (the smallest eigenvalues all
      1/v) the largest win by a wide margin, with N > D the smallest often do (the factor tests check both).
      One Krylov space serves both ends (see the docs' design-decisions page). With an `Isotropic` prior, one dense site
      group and N + K <= D (p > n regression) the same Krylov degree is reached in the row space of H, from N x N
      products (`_row_space_refine`; the D-space update where the best split takes any of the smallest eigenvalues).
    - "gradient" (App. B.4.2): `basis_iterations` (default 4) steps of projected gradient ascent
      E <- orth(E + alpha dB/dE), each with a backtracking step size so that the bound increases.

    Concave in (m, C_1, c) for log-concave sites (s_n is a norm of a linear function of (C_1, c)).

    Args:
        rank: K, the subspace dimension (int >= 1, at most D).
        basis: a (D, K) float array with orthonormal columns, or None (with C1 and c) for a template.
        C1: a (K, K) float array (its upper triangle is used), or None.
        c: a float scalar, the standard deviation outside the subspace, or None.
        num_refinements: basis updates inside `gkl_jax.fit` (int >= 0, default 5).
        basis_update: "eigen" (default) or "gradient".
        basis_iterations: Krylov steps (eigen, default 2) or gradient steps (gradient, default 4), int >= 1.
        free_basis: internal: True for the copy whose basis the gradient update differentiates (default False).

    Raises:
        ValueError: a bad rank, count or basis_update, only some of basis/C1/c, arrays of the wrong shape or not
            finite, or a basis whose columns are not orthonormal.
    """

    rank: int = eqx.field(static=True)
    num_refinements: int = eqx.field(static=True)
    basis_update: str = eqx.field(static=True)
    basis_iterations: int = eqx.field(static=True)
    free_basis: bool = eqx.field(static=True)
    basis: Optional[jax.Array]
    C1: Optional[jax.Array]
    scaled_c: Optional[jax.Array]
    concave: ClassVar[bool] = True

    def __init__(self, rank: int, basis=None, C1=None, c=None, *, num_refinements: int = 5,
                 basis_update: str = "eigen", basis_iterations: Optional[int] = None, free_basis: bool = False):
        self.rank = check_count(rank, "rank", "Subspace", minimum=1)
        self.num_refinements = check_count(num_refinements, "num_refinements", "Subspace")
        if basis_update not in BASIS_UPDATES:
            raise ValueError(f"Subspace(basis_update={basis_update!r}) must be one of {BASIS_UPDATES}")
        if basis_iterations is None:
            basis_iterations = _DEFAULT_ITERATIONS[basis_update]
        self.basis_iterations = check_count(basis_iterations, "basis_iterations", "Subspace", minimum=1)
        self.basis_update = basis_update
        self.free_basis = bool(free_basis)
        given = [x is not None for x in (basis, C1, c)]
        if any(given) and not all(given):
            raise ValueError("Subspace: give basis, C1 and c together, or none of them (a template)")
        if all(given):
            basis = as_float_array(basis, "basis")
            C1 = as_float_array(C1, "C1")
            c = as_float_array(c, "c")
            check_ndim(basis, 2, "basis")
            _check_rank(self.rank, basis.shape[0])
            owner = f"Subspace(rank={self.rank})"
            check_shape(basis, (basis.shape[0], self.rank), "basis", owner)
            check_shape(C1, (self.rank, self.rank), "C1", owner)
            check_shape(c, (), "c", owner)
            for x, name in ((basis, "basis"), (C1, "C1"), (c, "c")):
                check_finite(x, name)
            if is_concrete(basis):
                gram = basis.T @ basis
                if not bool(jnp.allclose(gram, jnp.eye(self.rank, dtype=gram.dtype), atol=1e-5)):
                    raise ValueError("Subspace: basis must have orthonormal columns (basis^T basis = I)")
            c = c * jnp.sqrt(jnp.asarray(max(basis.shape[0] - self.rank, 1), c.dtype))
        self.basis, self.C1, self.scaled_c = basis, C1, c

    @property
    def c(self):
        """The standard deviation c outside the subspace. It is stored as `scaled_c` = sqrt(D - K) c, which puts
        the (D - K)-fold weight of c in the bound (the entropy's (D - K) log c^2) on the same scale as one entry of
        C_1: a linear change of variable (concavity is kept) that makes the Newton systems well conditioned."""
        return self.scaled_c / jnp.sqrt(jnp.asarray(max(self.dim - self.rank, 1), self.scaled_c.dtype))

    @property
    def is_initialised(self):
        return self.basis is not None

    @property
    def dim(self):
        check_initialised(self)
        return int(self.basis.shape[0])

    def _options(self):
        return dict(num_refinements=self.num_refinements, basis_update=self.basis_update,
                    basis_iterations=self.basis_iterations)

    def _replace(self, basis, C1, c, free_basis=False):
        return Subspace(self.rank, basis, C1, c, free_basis=free_basis, **self._options())

    def initialise(self, dim, variances):
        _check_rank(self.rank, dim)
        v = jnp.mean(broadcast_variances(variances, dim))
        E = orthonormal(jax.random.normal(jax.random.PRNGKey(0), (dim, self.rank), v.dtype))
        return self._replace(E, jnp.sqrt(v) * jnp.eye(self.rank, dtype=v.dtype), jnp.sqrt(v))

    def mean_field_start(self, model):
        """Where the N sites number at most D: `fit` then starts from the Diagonal optimum's mean and `initialise`
        with the mean of its variances (`AbstractFactor.from_mean_field`), so that the first refinement sees site
        curvatures nearer the optimum's than those of the broad start. Where N > D `fit` starts as before (the
        measurements are on the docs' design-decisions page).

        Args:
            model: the `gkl_jax.Model` to be fitted.

        Returns:
            bool, whether the sites number at most D.
        """
        return sum(sites.operator(model.dim).shape[0] for sites in model.sites) <= model.dim

    def E(self):
        """The basis; held fixed (no gradient) unless this is the free-basis copy used by the gradient update.

        Returns:
            (D, K) float array E with orthonormal columns.
        """
        return self.basis if self.free_basis else lax.stop_gradient(self.basis)

    def upper(self):
        """The upper triangle of C1, the factor inside the subspace.

        Returns:
            (K, K) float array.
        """
        return jnp.triu(self.C1)

    @property
    def complement_dim(self) -> int:
        return self.dim - self.rank

    def logdet(self):
        check_initialised(self)
        return 2 * signed_log_abs_diag(diagonal(self.C1)) + self.complement_dim * jnp.log(jnp.square(self.c))

    def project_variances(self, op):
        if operator_kind(op) == "identity":
            return self.marginal_variances()
        P = op.mm(self.E())
        norms = op.sq_mv(jnp.ones((self.dim,), P.dtype))
        outside = jnp.maximum(norms - jnp.sum(jnp.square(P), axis=1), 0.0)
        return jnp.sum(jnp.square(P @ self.upper().T), axis=1) + jnp.square(self.c) * outside

    def marginal_variances(self):
        check_initialised(self)
        E = self.E()
        return (jnp.sum(jnp.square(E @ self.upper().T), axis=1)
                + jnp.square(self.c) * (1 - jnp.sum(jnp.square(E), axis=1)))

    def trace(self):
        """tr S = ||C_1||_F^2 + (D - K) c^2 (E has orthonormal columns): O(K^2), where sum diag(S) costs O(D K^2)
        (for an isotropic prior it was the costliest part of a Newton step's Hessian-vector products at
        D = 1000 / N = 500 / K = 50)."""
        return jnp.sum(jnp.square(self.upper())) + self.complement_dim * jnp.square(self.c)

    def dense(self):
        check_initialised(self)
        E = self.E()
        return E @ self.upper() @ E.T + self.c * (jnp.eye(self.dim, dtype=E.dtype) - E @ E.T)

    def matvec(self, v):
        E = self.E()
        p = tdot(E, v)
        return E @ (self.upper() @ p) + self.c * (v - E @ p)

    def rmatvec(self, z):
        E = self.E()
        p = tdot(E, z)
        return E @ tdot(self.upper(), p) + self.c * (z - E @ p)

    def solver_mask(self):
        mask = jax.tree.map(lambda _: True, self)
        return eqx.tree_at(lambda f: f.basis, mask, False)

    def refine(self, model, q, value=None):
        if self.basis_update == "gradient":
            return self._gradient_refine(model, q)
        return self._eigen_refine(model, q, value)

    def _eigen_refine(self, model, q, value=None):
        """The eq.-10 fixed point in the subspace family (App. B.4.3): Ritz vectors of A = Sigma^{-1} + H^T Gamma H
        from both ends of its spectrum, the split between the ends that `best_split` predicts, (C_1, c) at their
        fixed point; the current factor where that bound is lower than `value` (the bound at q) or not finite.
        Where `row_space_matrix` applies, the row-space update is tried first (see `_row_space_refine`)."""
        from .._bound import bound

        curvatures = site_curvatures(model, q)
        trace_A = precision_trace(model, curvatures)
        in_d = lambda: self._ritz_refine(lambda X: precision_mm(model, curvatures, X), trace_A)
        H = row_space_matrix(model, self.rank, self.basis_iterations)
        if H is None:
            new = in_d()
        else:
            new = self._row_space_refine(H, 1 / model.prior.variance, curvatures[0][1], trace_A, in_d)
        current = bound(model, q) if value is None else value
        candidate = bound(model, eqx.tree_at(lambda g: g.factor, q, new))
        new_wins = jnp.isfinite(candidate) & ~(current > candidate)
        return jax.tree.map(lambda a, b: jnp.where(new_wins, a, b), new, self)

    def _ritz_refine(self, A, trace_A):
        """Rayleigh-Ritz for A on the block Krylov space of the current basis (`_krylov`), the K Ritz vectors of the
        `best_split`, and (C_1, c) at their fixed point."""
        K = self.rank
        Q, AQ = self._krylov(A, lax.stop_gradient(self.basis), jax.random.PRNGKey(1))
        T = Q.T @ AQ
        w, U = jnp.linalg.eigh(0.5 * (T + T.T))                     # ascending
        j = best_split(w, trace_A, self.dim, K)
        i = jnp.arange(K)
        chosen = U[:, jnp.where(i < K - j, i, w.shape[0] - K + i)]  # the K - j smallest and the j largest
        E = Q @ chosen
        return self._fixed_point(E, E.T @ (AQ @ chosen), trace_A)

    def _row_space_refine(self, H, a, gamma, trace_A, otherwise):
        """The same update computed in the N-dimensional row space of H, for A = a I + B^T B, B = Gamma^{1/2} H
        (an isotropic prior, one dense site group, N + K <= D; `row_space_matrix`).

        The eigenvalues of A are a (multiplicity D - N >= K, the null space of H) and a + theta_k, theta_k those
        of G = B B^T (N x N; H H^T is a loop invariant of the fit, computed once), with eigenvectors
        B^T u_k / sqrt(theta_k). Rayleigh-Ritz for G on the block Krylov space [X, G X, ..., G^{b-1} X],
        X = [B E, 10 random columns], b = `basis_iterations`, gives Ritz pairs (theta_k, u_k) and the basis
        E' = B^T U Theta^{-1/2} (orthonormal: U^T G U = Theta), which lies in B^T [X, ..., G^{b-1} X] =
        [A - a I, ..., (A - a I)^b] E: the degree of the D-space update's Krylov space, at b products with the
        N x N matrix G instead of b + 1 products with H and H^T. E'^T A E' = a I + Theta^{-1/2} (G U)^T (G U)
        Theta^{-1/2}. Where `best_split` (with K copies of a at the low end) wants any of the smallest eigenvalues,
        or where theta_K <= sqrt(eps) theta_1 (E' would lose orthogonality), the factor is `otherwise()` (the
        D-space update) instead. Where N < D the N-space update is the cheaper one (benchmarks/README §2)."""
        K = self.rank
        g = jnp.sqrt(gamma)
        B = g[:, None] * H
        G = g[:, None] * (H @ H.T) * g[None, :]
        keys = jax.random.split(jax.random.PRNGKey(1), self.basis_iterations)
        X = B @ lax.stop_gradient(self.basis)
        Q = orthonormal(jnp.concatenate([X, jax.random.normal(keys[0], (X.shape[0], _OVERSAMPLING), X.dtype)], 1))
        Q, GQ = _extend_krylov(lambda Y: G @ Y, Q, G @ Q, keys[1:], K + _OVERSAMPLING)
        T = Q.T @ GQ
        theta, Y = jnp.linalg.eigh(0.5 * (T + T.T))                 # ascending
        w = jnp.concatenate([jnp.full((K,), a, theta.dtype), a + theta])
        theta, Y = theta[-K:], Y[:, -K:]
        ok = (best_split(w, trace_A, self.dim, K) == K) & (theta[0] > jnp.sqrt(jnp.finfo(theta.dtype).eps) * theta[-1])

        def basis():
            scale = 1 / jnp.sqrt(theta)
            E = (B.T @ (Q @ Y)) * scale
            GU = (GQ @ Y) * scale
            # one Cholesky QR pass restores orthonormality to round-off: E <- E L^{-T}, M <- L^{-1} M L^{-T}
            Linv = invert_lower(jnp.linalg.cholesky(E.T @ E))
            M = a * jnp.eye(K, dtype=E.dtype) + GU.T @ GU
            return self._fixed_point(E @ Linv.T, Linv @ M @ Linv.T, trace_A)

        return lax.cond(ok, basis, otherwise)

    def _krylov(self, A, E0, key):
        """(Q, A Q): an orthonormal basis Q of the block Krylov space [X, A X, ..., A^b X] from X = [E0, 10 random
        columns] (b = `basis_iterations`, fewer blocks where D is too small for them; `_extend_krylov`), and its
        image. Both ends of the spectrum of A converge in it (Rayleigh-Ritz on Q) from b + 1 products with A."""
        D, K = E0.shape
        width = K + min(_OVERSAMPLING, D - K)
        blocks = max(1, min(self.basis_iterations + 1, D // width))
        keys = jax.random.split(key, blocks)
        R = jax.random.normal(keys[0], (D, width - K), E0.dtype)
        if width > K:
            R = orthonormal(R - E0 @ (E0.T @ R))
        # E0 is orthonormal up to round-off (or the 1e-5 the constructor allows), R orthonormal and orthogonal to
        # it: one Cholesky QR pass makes [E0, R] orthonormal to round-off
        Q = orthonormal(jnp.concatenate([E0, R], axis=1), nearly_orthonormal=True)
        return _extend_krylov(A, Q, A(Q), keys[1:], width)

    def _fixed_point(self, E, M, trace_A):
        """(E, C_1, c) with S_1 = M^{-1}, M = E^T A E, c^2 = (D - K) / tr(A (I - E E^T)): the stationary point of the
        bound over (C_1, c) for fixed Gamma (dB/dS = (S^{-1} - A) / 2 restricted to the family); the current
        (C_1, c) where that is not finite."""
        M = 0.5 * (M + M.T)
        C1 = upper_factor_of_inverse(M)
        if self.complement_dim > 0:
            outside = trace_A - jnp.trace(M)
            c = jnp.sqrt(self.complement_dim / outside)
        else:
            c = self.c
        ok = jnp.all(jnp.isfinite(C1)) & jnp.isfinite(c) & (c > 0)
        return self._replace(E, jnp.where(ok, C1, self.C1), jnp.where(ok, c, self.c))

    def _gradient_refine(self, model, q):
        """Projected gradient ascent on E (App. B.4.2): E <- orth(E + alpha dB/dE), alpha halved until the bound
        increases (the step is skipped when no alpha >= 2^-30 alpha_0 does)."""
        from .._bound import bound

        def value(E):
            free = self._replace(E, self.C1, self.c, free_basis=True)
            return bound(model, eqx.tree_at(lambda g: g.factor, q, free))

        value_and_grad = jax.value_and_grad(value)
        scale = jnp.sqrt(jnp.asarray(self.rank, self.basis.dtype))

        def step(_, E):
            f0, g = value_and_grad(E)
            alpha0 = 0.5 * scale / jnp.maximum(jnp.linalg.norm(g), jnp.finfo(g.dtype).tiny)

            def trial(alpha):
                E_new = orthonormal(E + alpha * g)
                return value(E_new), E_new

            _, (_, E_new), up = backtrack(trial, lambda alpha, out: jnp.isfinite(out[0]) & (out[0] > f0), (f0, E),
                                          dtype=E.dtype, max_halvings=30, t0=alpha0)
            return jnp.where(up, E_new, E)

        E = lax.fori_loop(0, self.basis_iterations, step, lax.stop_gradient(self.basis))
        return self._replace(E, self.C1, self.c)


def _check_rank(rank, dim):
    if rank > dim:
        raise ValueError(f"Subspace(rank={rank}) must be <= dim={dim}")
