"""The subspace Cholesky factor (papers/000, Section 4.1.3 "Subspace Cholesky" and App. B.4)."""

from typing import ClassVar, Optional

import equinox as eqx
import jax
import jax.numpy as jnp
from jax import lax

from .._validate import as_float_array, check_finite, check_ndim, is_concrete
from ._base import check_initialised, signed_log_abs_diag
from ._kernels import (broadcast_variances, check_count, check_shape, operator_kind, orthonormal, precision_mm,
                       precision_trace, site_curvatures)
from ._refinable import AbstractRefinableFactor

BASIS_UPDATES = ("eigen", "gradient")
_OVERSAMPLING = 10


class Subspace(AbstractRefinableFactor):
    """S = E C_1^T C_1 E^T + c^2 (I - E E^T): a K-dimensional orthonormal basis E (D, K) (the paper's E_1^T), an
    upper-triangular K x K factor C_1 inside the subspace and one standard deviation c in every direction
    orthogonal to it (papers/000 §4.1.3 and App. B.4.1), K = `rank`.

    s_n^2 = ||C_1 E^T h_n||^2 + c^2 (||h_n||^2 - ||E^T h_n||^2) and log det S = 2 sum_k log|C_1kk| + (D - K) log c^2,
    so with the projections E^T h_n and the norms ||h_n||^2 computed once per basis (the solvers hold E fixed, and
    XLA hoists them out of the solver loops) a bound evaluation costs O(N K^2) (App. D). Every kind of H is
    supported (dense, sparse BCOO, matrix-free: the basis needs only H X and H^T Y products). The bound is exact for
    any prior; the paper's isotropic-prior assumption (under which E does not enter tr(Sigma^{-1} S)) is only what
    makes the cost independent of D.

    The basis is refined between solves (`num_refinements` alternations inside `gkl_jax.fit`, keeping the best
    bound), by `basis_update`:

    - "eigen" (default; the fixed point of eqs. 10/21, App. B.4.3): E <- the K eigenvectors of the optimal
      precision A = Sigma^{-1} + H^T Gamma H with the LARGEST eigenvalues, Gamma_nn = -E[psi_n''] at the current q,
      by block subspace iteration warm-started from the current basis (`basis_iterations` products with A, then
      Rayleigh-Ritz): O(`basis_iterations` (K + 10) nnz(H)) and no D x D matrix, for dense, sparse and matrix-free
      H. (C_1, c) restart at their fixed point for that Gamma, S_1 = (E^T A E)^{-1}, c^2 = (D - K) / tr(A (I - E E^T)).
      Erratum: App. B.4.3 says "the leading K eigenvectors of S", i.e. the SMALLEST eigenvalues of A, but its own
      approximation (the non-zero eigenvectors of H Gamma' H^T) returns the largest ones, and the largest are the
      right choice: for a Gaussian target the optimal (S_1, c) give KL = (D - K)/2 log(AM/GM) of the precision
      eigenvalues left outside the subspace, which is smallest when the subspace takes the extreme large ones
      (with N < D the smallest eigenvalues are all 1/v, and a basis in the null space of H gains nothing).
    - "gradient" (App. B.4.2): `basis_iterations` steps of projected gradient ascent E <- orth(E + alpha dB/dE),
      each with a backtracking step size so that the bound increases.

    Concave in (m, C_1, c) for log-concave sites (s_n is a norm of a linear function of (C_1, c)).
    """

    rank: int = eqx.field(static=True)
    num_refinements: int = eqx.field(static=True)
    basis_update: str = eqx.field(static=True)
    basis_iterations: int = eqx.field(static=True)
    free_basis: bool = eqx.field(static=True)
    basis: Optional[jax.Array]
    C1: Optional[jax.Array]
    c: Optional[jax.Array]
    concave: ClassVar[bool] = True
    default_solver: ClassVar[str] = "newton"

    def __init__(self, rank: int, basis=None, C1=None, c=None, *, num_refinements: int = 5,
                 basis_update: str = "eigen", basis_iterations: int = 4, free_basis: bool = False):
        self.rank = check_count(rank, "rank", "Subspace", minimum=1)
        self.num_refinements = check_count(num_refinements, "num_refinements", "Subspace")
        self.basis_iterations = check_count(basis_iterations, "basis_iterations", "Subspace", minimum=1)
        if basis_update not in BASIS_UPDATES:
            raise ValueError(f"Subspace(basis_update={basis_update!r}) must be one of {BASIS_UPDATES}")
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
        self.basis, self.C1, self.c = basis, C1, c

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

    def E(self):
        """The basis; held fixed (no gradient) unless this is the free-basis copy used by the gradient update."""
        return self.basis if self.free_basis else lax.stop_gradient(self.basis)

    def upper(self):
        return jnp.triu(self.C1)

    @property
    def complement_dim(self) -> int:
        return self.dim - self.rank

    def logdet(self):
        return 2 * signed_log_abs_diag(jnp.diagonal(self.C1)) + self.complement_dim * jnp.log(jnp.square(self.c))

    def project_variances(self, op):
        if operator_kind(op) == "identity":
            return self.marginal_variances()
        P = op.mm(self.E())
        norms = op.sq_mv(jnp.ones((self.dim,), P.dtype))
        outside = jnp.maximum(norms - jnp.sum(jnp.square(P), axis=1), 0.0)
        return jnp.sum(jnp.square(P @ self.upper().T), axis=1) + jnp.square(self.c) * outside

    def marginal_variances(self):
        E = self.E()
        return (jnp.sum(jnp.square(E @ self.upper().T), axis=1)
                + jnp.square(self.c) * (1 - jnp.sum(jnp.square(E), axis=1)))

    def dense(self):
        E = self.E()
        return E @ self.upper() @ E.T + self.c * (jnp.eye(self.dim, dtype=E.dtype) - E @ E.T)

    def matvec(self, v):
        E = self.E()
        p = E.T @ v
        return E @ (self.upper() @ p) + self.c * (v - E @ p)

    def rmatvec(self, z):
        E = self.E()
        p = E.T @ z
        return E @ (self.upper().T @ p) + self.c * (z - E @ p)

    def solver_mask(self):
        mask = jax.tree.map(lambda _: True, self)
        return eqx.tree_at(lambda f: f.basis, mask, False)

    def refine(self, model, q):
        if self.basis_update == "gradient":
            return self._gradient_refine(model, q)
        return self._eigen_refine(model, q)

    def _eigen_refine(self, model, q):
        """E <- top-K eigenvectors of A = Sigma^{-1} + H^T Gamma H (block subspace iteration + Rayleigh-Ritz), and
        (C_1, c) <- their fixed point for this Gamma (App. B.4.3 with eqs. 10/11)."""
        curvatures = site_curvatures(model, q)
        A = lambda X: precision_mm(model, curvatures, X)
        D, K = self.dim, self.rank
        extra = min(_OVERSAMPLING, D - K)
        E0 = lax.stop_gradient(self.basis)
        noise = jax.random.normal(jax.random.PRNGKey(1), (D, extra), E0.dtype)
        X = orthonormal(jnp.concatenate([E0, noise], axis=1))
        X = lax.fori_loop(0, self.basis_iterations, lambda _, X: orthonormal(A(X)), X)
        T = X.T @ A(X)
        w, U = jnp.linalg.eigh(0.5 * (T + T.T))
        w_top, U_top = w[::-1][:K], U[:, ::-1][:, :K]
        E = orthonormal(X @ U_top)
        tiny = jnp.finfo(E.dtype).tiny ** 0.5
        w_top = jnp.maximum(w_top, tiny)
        C1 = jnp.diag(1 / jnp.sqrt(w_top))
        if D > K:
            outside = jnp.maximum(precision_trace(model, curvatures) - jnp.sum(w_top), tiny)
            c = jnp.sqrt((D - K) / outside)
        else:
            c = self.c
        ok = jnp.all(jnp.isfinite(E)) & jnp.all(jnp.isfinite(C1)) & jnp.isfinite(c)
        pick = lambda new, old: jnp.where(ok, new, old)
        return self._replace(pick(E, self.basis), pick(C1, self.C1), pick(c, self.c))

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

            def cond(state):
                alpha, f_new, _, j = state
                return ~(jnp.isfinite(f_new) & (f_new > f0)) & (j < 30)

            def body(state):
                alpha, _, _, j = state
                alpha = 0.5 * alpha
                E_new = orthonormal(E + alpha * g)
                return alpha, value(E_new), E_new, j + 1

            E1 = orthonormal(E + alpha0 * g)
            _, f_new, E_new, _ = lax.while_loop(cond, body, (alpha0, value(E1), E1, 0))
            return jnp.where(jnp.isfinite(f_new) & (f_new > f0), E_new, E)

        E = lax.fori_loop(0, self.basis_iterations, step, lax.stop_gradient(self.basis))
        return self._replace(E, self.C1, self.c)


def _check_rank(rank, dim):
    if rank > dim:
        raise ValueError(f"Subspace(rank={rank}) must be <= dim={dim}")
