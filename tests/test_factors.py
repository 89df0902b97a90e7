"""Structured factors (papers/000 §4.1): one conformance suite over every factor, with dense oracles.

A new factor gets its tests by joining `CASES` (tests/_helpers_factors.py): a template constructor, the entries
of its leaves that are structural zeros, and (for Cholesky-type factors) the sparsity pattern of C. Fits at the
optimum: tests/test_factors_optimum.py; the subspace factor's basis updates and sparse H at scale:
tests/test_factors_subspace.py.
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _helpers_factors import CASES, D, logistic_model, solver_vector, sparse_mask, structural_vector
from jax.experimental import sparse as jsparse

import gkl_jax as gk
from gkl_jax.factors import Banded, Chevron, FactorAnalysis, Sparse, Subspace
from gkl_jax.operators import AbstractOperator

NAMES = list(CASES)


class MatrixFree(AbstractOperator):
    """A matrix-free H for the tests: only products with H and H o H are exposed (no `matrix` attribute)."""

    A: jax.Array

    @property
    def shape(self):
        return tuple(self.A.shape)

    def mv(self, x):
        return self.A @ x

    def rmv(self, y):
        return self.A.T @ y

    def sq_mv(self, v):
        return jnp.square(self.A) @ v

    def sq_rmv(self, y):
        return jnp.square(self.A).T @ y

    def as_matrix(self):
        return self.A


def random_factor(name, dim=D, seed=0):
    """The factor at a random point: every float leaf perturbed (structural zeros too: they must be inert)."""
    factor = CASES[name][0](dim).initialise(dim, jnp.asarray(0.7))
    leaves, treedef = jax.tree.flatten(factor)
    rng = np.random.default_rng(seed)
    leaves = [x + 0.3 * jnp.asarray(rng.normal(size=x.shape)) if eqx.is_inexact_array(x) else x for x in leaves]
    factor = jax.tree.unflatten(treedef, leaves)
    if isinstance(factor, Subspace):
        factor = eqx.tree_at(lambda f: f.basis, factor, jnp.linalg.qr(factor.basis)[0])
    return factor


def closed_form_model(dim=D, seed=0):
    """A dense prior and log-concave sites with closed-form expectations (exact derivatives, unlike quadrature):
    Gaussian sites on a dense H and Laplace sites on a sparse BCOO H. Also returns the dense site matrices."""
    rng = np.random.default_rng(seed)
    X1 = rng.normal(size=(12, dim))
    X2 = rng.normal(size=(9, dim)) * (rng.uniform(size=(9, dim)) < 0.4)
    X2[np.arange(9), rng.integers(0, dim, 9)] = 1.0  # no empty row (the Laplace site is not smooth at s_n = 0)
    L = np.tril(rng.normal(size=(dim, dim))) * 0.3 + np.eye(dim)
    sites = [gk.Sites(X1, gk.potentials.Gaussian(rng.normal(size=12), 0.7)),
             gk.Sites(jsparse.BCOO.fromdense(jnp.asarray(X2)), gk.potentials.Laplace(rng.normal(size=9), 0.5))]
    return gk.Model(gk.priors.Dense(L @ L.T), sites), (X1, X2)


# ---------------------------------------------------------------- conformance: structure against dense oracles


def _site_matrix():
    rng = np.random.default_rng(2)
    H = rng.normal(size=(13, D)) * (rng.uniform(size=(13, D)) < 0.4)
    H[3] = 0.0  # an empty row
    return H


NSE = int(np.sum(_site_matrix() != 0)) + 3  # padded BCOO
NSE_ROW = int(np.max(np.sum(_site_matrix() != 0, axis=1))) + 1
EPS = 1e-5


@eqx.filter_jit
def _evaluate(q, H, v, z, directions, model):
    """Everything the suite checks for one factor, in one compiled call (op-by-op dispatch is slow): the structure
    (C, S, log det, marginals, products, s_n^2 for five kinds of H), and the bound, its gradient, central
    differences and Hessian over the solvers' parameters."""
    f = q.factor
    ops = {"dense": gk.operators.Dense(H),
           "bcoo": gk.operators.Sparse(jsparse.BCOO.fromdense(H, nse=NSE)),
           "bcoo_batched": gk.operators.Sparse(jsparse.BCOO.fromdense(H, n_batch=1, nse=NSE_ROW)),
           "identity": gk.operators.Identity(D)}
    if not isinstance(f, (Banded, Sparse)):
        ops["matrix-free"] = MatrixFree(H)
    flat, to_q = solver_vector(q)
    objective = lambda x: gk.bound(model, to_q(x))
    differences = jax.vmap(lambda u: (objective(flat + EPS * u) - objective(flat - EPS * u)) / (2 * EPS))
    return dict(C=f.dense(), S=f.covariance(), logdet=f.logdet(), marginals=f.marginal_variances(),
                trace=f.trace(), Cv=f.matvec(v), Ctz=f.rmatvec(z), Sv=f.covariance_mv(v),
                s2={k: f.project_variances(op) for k, op in ops.items()},
                projected={k: f.project(op, q.mean) for k, op in ops.items()},
                bound=objective(flat), grad=jax.grad(objective)(flat),
                fd=differences(directions), hessian=jax.hessian(objective)(flat))


@pytest.fixture(scope="module", params=NAMES)
def evaluated(request):
    name = request.param
    q = gk.Gaussian(jnp.asarray(np.random.default_rng(4).normal(size=D) * 0.3), random_factor(name))
    rng = np.random.default_rng(1)
    H, v, z = _site_matrix(), rng.normal(size=D), rng.normal(size=D)
    flat, _ = solver_vector(q)
    directions = rng.normal(size=(3, flat.shape[0]))
    model, X = closed_form_model()
    out = _evaluate(q, jnp.asarray(H), jnp.asarray(v), jnp.asarray(z), jnp.asarray(directions), model)
    out = jax.tree.map(np.asarray, out)
    return dict(name=name, q=q, H=H, v=v, z=z, directions=directions, model=model, X=X, **out)


def test_structure_matches_dense_oracles(evaluated):
    """covariance = C^T C; log det, diag(S), tr S, C v, C^T z, S v and s_n^2 = h_n^T S h_n for dense, BCOO (padded,
    row-batched), identity and matrix-free H, all against numpy on the dense matrices."""
    e = evaluated
    C, S, H, v, z = e["C"], e["S"], e["H"], e["v"], e["z"]
    np.testing.assert_allclose(S, C.T @ C, atol=1e-10)
    np.testing.assert_allclose(S, S.T, atol=1e-12)
    np.testing.assert_allclose(e["logdet"], np.linalg.slogdet(S)[1], rtol=1e-9)
    np.testing.assert_allclose(e["marginals"], np.diag(S), atol=1e-10)
    np.testing.assert_allclose(e["trace"], np.trace(S), rtol=1e-12)
    np.testing.assert_allclose(e["Cv"], C @ v, atol=1e-10)
    np.testing.assert_allclose(e["Ctz"], C.T @ z, atol=1e-10)
    np.testing.assert_allclose(e["Sv"], S @ v, atol=1e-10)
    oracle = np.einsum("nd,de,ne->n", H, S, H)
    m = np.asarray(e["q"].mean)
    for kind, s2 in e["s2"].items():
        np.testing.assert_allclose(s2, np.diag(S) if kind == "identity" else oracle, atol=1e-10, err_msg=kind)
        m_n, s2_n = e["projected"][kind]   # (h_n^T m, s_n^2) together: FactorAnalysis and Chevron in one product
        np.testing.assert_allclose(m_n, m if kind == "identity" else H @ m, atol=1e-10, err_msg=kind)
        np.testing.assert_allclose(s2_n, s2, atol=1e-10, err_msg=kind)
    if isinstance(e["q"].factor, (Banded, Sparse)):
        with pytest.raises(ValueError, match="matrix-free"):
            e["q"].factor.project_variances(MatrixFree(jnp.asarray(H)))
    pattern = CASES[e["name"]][2]
    if pattern is not None:  # every leaf was perturbed, structural zeros included: C must still fit the pattern
        assert np.all(C[~pattern(D)] == 0)
        assert np.all(C[np.diag_indices(D)] != 0)


def test_bound_matches_dense_oracle_with_dense_prior(evaluated):
    """eq. 7 from the dense S: entropy, E_q[log N(w | 0, Sigma)] with a dense Sigma, and the sites at
    (m_n, s_n^2 = h_n^T S h_n) for a dense and a sparse H."""
    e = evaluated
    S, m, model = e["S"], np.asarray(e["q"].mean), e["model"]
    Sigma = np.asarray(model.prior.covariance)
    P = np.linalg.inv(Sigma)
    entropy = 0.5 * D * (1 + np.log(2 * np.pi)) + 0.5 * np.linalg.slogdet(S)[1]
    prior = -0.5 * (D * np.log(2 * np.pi) + np.linalg.slogdet(Sigma)[1] + np.trace(P @ S) + m @ P @ m)
    sites = sum(np.sum(np.asarray(group.potential.expected_log_phi(
        jnp.asarray(X @ m), jnp.asarray(np.einsum("nd,de,ne->n", X, S, X))))) for group, X in zip(model.sites, e["X"]))
    np.testing.assert_allclose(e["bound"], entropy + prior + sites, rtol=1e-10)


def test_gradient_matches_finite_differences_and_structural_zeros_are_inert(evaluated):
    e = evaluated
    g = e["grad"]
    assert np.all(g[structural_vector(e["q"], e["name"])] == 0.0)
    np.testing.assert_allclose(e["directions"] @ g, e["fd"], rtol=1e-6, atol=1e-7)


def test_hessian_negative_definite_for_concave_factors(evaluated):
    """Concave factors on log-concave sites (Section 3.2): negative definite over the free parameters, and
    identically zero in the structural zeros. (FactorAnalysis: see test_factor_analysis_is_not_concave.)"""
    e = evaluated
    Hm = e["hessian"]
    free = ~structural_vector(e["q"], e["name"])
    assert np.all(Hm[~free] == 0.0)
    np.testing.assert_allclose(Hm, Hm.T, atol=1e-8)
    if e["q"].factor.concave:
        assert np.linalg.eigvalsh(Hm[np.ix_(free, free)]).max() < -1e-6


# ---------------------------------------------------------------- configuration errors name the argument


def test_bad_configurations_raise_value_errors_naming_the_argument():
    model, _ = logistic_model()
    for factor, word in [(Banded(D), "bandwidth"), (Chevron(D + 1), "rows"), (Subspace(D + 1), "rank"),
                         (FactorAnalysis(D + 1), "rank"), (Sparse(sparse_mask(D + 2)), "mask")]:
        with pytest.raises(ValueError, match=word):
            gk.fit(model, factor=factor)
    lower = sparse_mask(D).T
    with pytest.raises(ValueError, match="mask must be upper triangular"):
        Sparse(lower)
    no_diag = sparse_mask(D) & ~np.eye(D, dtype=bool)
    with pytest.raises(ValueError, match="mask must contain the diagonal"):
        Sparse(no_diag)
    with pytest.raises(ValueError, match="mask must be a square"):
        Sparse(np.ones((3, 4), bool))
    for make, word in [(lambda: Banded(-1), "bandwidth"), (lambda: Chevron(1.5), "rows"),
                       (lambda: Subspace(0), "rank"), (lambda: Subspace(2, basis_update="pca"), "basis_update"),
                       (lambda: FactorAnalysis(-2), "rank"), (lambda: FactorAnalysis(2, floor=-1e-3), "floor"),
                       (lambda: FactorAnalysis(2, floor="small"), "floor"),
                       (lambda: FactorAnalysis(2, start="eigen"), "start"),
                       (lambda: Banded(1, jnp.ones((3, 5))), "bands"),
                       (lambda: Chevron(2, jnp.ones((2, 5)), jnp.ones(4)), "d"),
                       (lambda: Subspace(2, jnp.ones((5, 2)), jnp.eye(2), 1.0), "orthonormal")]:
        with pytest.raises(ValueError, match=word):
            make()


def test_float32_is_preserved():
    factors = [CASES[name][0](D).initialise(D, jnp.asarray(0.5, jnp.float32)) for name in NAMES]
    factors = [f for f in factors if isinstance(f, (Banded, Subspace, FactorAnalysis))]
    H = gk.operators.Dense(jnp.ones((4, D), jnp.float32))
    out = eqx.filter_jit(lambda fs, H: [(f.project_variances(H), f.logdet(), f.marginal_variances()) for f in fs])(
        factors, H)
    for f, arrays in zip(factors, out):
        assert all(a.dtype == jnp.float32 for a in arrays), type(f).__name__


@pytest.mark.extended   # the benchmark script end to end (one cell); the factors' oracles run by default
def test_logistic_tables_quick_cell():
    """benchmarks/logistic_tables.py --quick: one small Table 2 cell; every fit converges and Chevron's bound is
    above the diagonal one on every data set (Chevron contains the diagonal family)."""
    import importlib.util
    import pathlib

    path = pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / "logistic_tables.py"
    spec = importlib.util.spec_from_file_location("_bench_logistic_tables", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    cell = module.main(["--quick"])["cells"][0]
    assert (cell["D"], cell["N"], cell["K"]) == (100, 50, 5)
    chevron, diagonal = cell["factors"]["chevron"]["rows"], cell["factors"]["diagonal"]["rows"]
    assert all(r["converged"] for r in chevron + diagonal) and len(chevron) == 2
    assert all(c["bound"] >= d["bound"] - 1e-9 for c, d in zip(chevron, diagonal))
