"""Structured factors (papers/000 §4.1): one conformance suite over every factor, with dense oracles.

A new factor gets its tests by joining `CASES`: a template constructor, the entries of its leaves that are
structural zeros, and (for Cholesky-type factors) the sparsity pattern of C.
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import gaussian_log_evidence
from jax.experimental import sparse as jsparse
from jax.flatten_util import ravel_pytree

import gkl_jax as gk
from gkl_jax import _adjoint
from gkl_jax.factors import Banded, Chevron, Diagonal, FactorAnalysis, Full, Sparse, Subspace
from gkl_jax.operators import AbstractOperator

D = 10


def sparse_mask(dim, seed=3):
    rng = np.random.default_rng(seed)
    return np.triu(rng.uniform(size=(dim, dim)) < 0.3) | np.eye(dim, dtype=bool)


def band_pattern(dim, B):
    i, j = np.indices((dim, dim))
    return (j >= i) & (j <= i + B)


def chevron_pattern(dim, K):
    i, j = np.indices((dim, dim))
    return ((i < K) & (j >= i)) | (i == j)


def _upper_zeros(shape):
    return np.tril(np.ones(shape, bool), -1)


# name -> (template(dim), {leaf name: structural-zero mask(dim)}, pattern of C (None: not a Cholesky-type factor))
CASES = {
    "full": (lambda d: Full(), {"C": lambda d: _upper_zeros((d, d))}, lambda d: np.triu(np.ones((d, d), bool))),
    "diagonal": (lambda d: Diagonal(), {}, lambda d: np.eye(d, dtype=bool)),
    "banded2": (lambda d: Banded(2), {"bands": lambda d: np.add.outer(np.arange(3), np.arange(d)) >= d},
                lambda d: band_pattern(d, 2)),
    "banded8": (lambda d: Banded(8), {"bands": lambda d: np.add.outer(np.arange(9), np.arange(d)) >= d},
                lambda d: band_pattern(d, 8)),
    "chevron": (lambda d: Chevron(3), {"theta": lambda d: _upper_zeros((3, d))}, lambda d: chevron_pattern(d, 3)),
    "sparse": (lambda d: Sparse(sparse_mask(d)), {}, lambda d: sparse_mask(d)),
    "subspace": (lambda d: Subspace(3), {"C1": lambda d: _upper_zeros((3, 3))}, None),
    "factor_analysis": (lambda d: FactorAnalysis(2), {}, None),
}
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


def logistic_model(dim=D, num=15, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(num, dim))
    y = np.where(rng.uniform(size=num) < 0.5, 1.0, -1.0)
    return gk.Model(gk.priors.Isotropic(dim, 1.5), gk.Sites(X, gk.potentials.Logistic(y))), X


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


def solver_vector(q):
    """The solvers' parameter vector of q (via fit's own filter) and the map back."""
    params, static = eqx.partition(q, _adjoint.solver_mask(q))
    flat, unravel = ravel_pytree(params)
    return flat, lambda f: eqx.combine(unravel(f), static)


def structural_vector(q, name):
    """Boolean vector over the solver parameters: True at the structural zeros of the factor."""
    params, _ = eqx.partition(q, _adjoint.solver_mask(q))
    marks = jax.tree.map(lambda x: np.zeros(x.shape, bool), params)
    for leaf, mask in CASES[name][1].items():
        marks = eqx.tree_at(lambda p: getattr(p.factor, leaf), marks, mask(q.dim))
    return np.concatenate([np.ravel(x) for x in jax.tree.leaves(marks)])


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


# ---------------------------------------------------------------- fits: orderings, exact log Z, patterns kept

FIT_D, FIT_N = 10, 14
FITTED = ["banded2", "chevron", "sparse", "subspace", "factor_analysis"]


@pytest.fixture(scope="module")
def gaussian_problem():
    """Gaussian sites: log Z, the Full optimum (q = the posterior: G-KL is exact) and the Diagonal optimum
    (m = the posterior mean, d_j^2 = 1 / A_jj) are known in closed form."""
    rng = np.random.default_rng(11)
    H = rng.normal(size=(FIT_N, FIT_D))
    y = H @ rng.normal(size=FIT_D) + 0.5 * rng.normal(size=FIT_N)
    model = gk.Model(gk.priors.Isotropic(FIT_D, 1.0), gk.Sites(H, gk.potentials.Gaussian(y, 0.5)))
    log_z, mean, cov = gaussian_log_evidence(H, y, 0.5, np.eye(FIT_D))
    mean_field = gk.Gaussian(jnp.asarray(mean), Diagonal(jnp.asarray(1 / np.sqrt(np.diag(np.linalg.inv(cov))))))
    return model, log_z, mean_field


@pytest.fixture(scope="module")
def fits(gaussian_problem):
    model = gaussian_problem[0]
    options = {"factor_analysis": dict(tol=1e-5, max_steps=3000)}
    return {name: gk.fit(model, factor=CASES[name][0](FIT_D), **options.get(name, {})) for name in FITTED}


def test_bound_orderings_and_structural_zeros_at_the_optimum(gaussian_problem, fits):
    """log Z = Full >= Banded, Chevron, Sparse >= Diagonal; Full >= Subspace, FactorAnalysis (Full and Diagonal at
    their closed-form optima for Gaussian sites); structural zeros stay zero under optimisation."""
    model, log_z, mean_field = gaussian_problem
    b = {k: float(r.log_z) for k, r in fits.items()}
    assert all(bool(r.converged) for r in fits.values())
    diagonal = float(eqx.filter_jit(gk.bound)(model, mean_field))
    eps = 1e-7
    for name in ("banded2", "chevron", "sparse"):
        assert diagonal - eps <= b[name] <= log_z + eps, name
    for name in ("subspace", "factor_analysis"):
        assert b[name] <= log_z + eps, name
    # strictly between for this correlated posterior
    assert diagonal < b["chevron"] - 1e-3 and b["chevron"] < log_z - 1e-3
    # the same optima keep their structural zeros (one test: two workers would each compute the fits)
    for name in FITTED:
        q = fits[name].q
        flat, _ = solver_vector(q)
        assert np.all(np.asarray(flat)[structural_vector(q, name)] == 0.0), name
        pattern = CASES[name][2]
        if pattern is not None:
            assert np.all(np.asarray(q.factor.dense())[~pattern(FIT_D)] == 0.0), name
    E = np.asarray(fits["subspace"].q.factor.basis)
    np.testing.assert_allclose(E.T @ E, np.eye(E.shape[1]), atol=1e-10)


def test_factor_analysis_is_not_concave(gaussian_problem):
    """Negative control (§4.1.2): at Theta = 0 and the mean-field optimum, dB/dS = (diag(A) - A)/2 has zero trace,
    so the Hessian in Theta has a positive eigenvalue."""
    model, _, mean_field = gaussian_problem
    q = gk.Gaussian(mean_field.mean, FactorAnalysis(1, jnp.zeros((FIT_D, 1)), mean_field.factor.d))
    flat, to_q = solver_vector(q)
    hessian = jax.jit(jax.hessian(lambda x: gk.bound(model, to_q(x))))(flat)
    assert np.linalg.eigvalsh(np.asarray(hessian)).max() > 1e-3


def test_factor_analysis_log_det_in_a_heywood_case():
    """Uniquenesses d_i -> 0 on rows that Theta covers (a Heywood case): log det S must still equal the dense
    determinant, with the default floor on psi (the matrix determinant lemma) and without it (the rows split off:
    the lemma gave NaN from psi_i = 1e-18 and was 16 nats too high at 1e-22, so the bound exceeded log Z)."""
    rng = np.random.default_rng(5)
    D, K = 40, 4
    theta = rng.normal(size=(D, K))
    for small in (1e-11, 0.0):
        d = np.abs(rng.normal(size=D)) + 0.1
        d[:2] = small     # two of the K directions (nearly) singular in diag(d^2)
        for floor in (1e-6, 0.0):
            factor = FactorAnalysis(K, jnp.asarray(theta), jnp.asarray(d), floor=floor)
            S = np.asarray(factor.covariance())
            np.testing.assert_allclose(S, theta @ theta.T + np.diag(np.asarray(factor.uniquenesses())), rtol=1e-12)
            assert np.all(np.asarray(factor.uniquenesses()) >= d ** 2)
            _, dense = np.linalg.slogdet(S)
            assert abs(float(factor.logdet()) - dense) < 1e-9, (small, floor)
            C = np.asarray(factor.dense())      # the square root too, psi_i = 0 included
            np.testing.assert_allclose(C.T @ C, S, atol=1e-9)


def test_factor_analysis_optimums_are_chevron_with_their_heywood_rows_first():
    """On a logistic problem with N = D the FactorAnalysis(rank=K, floor=0) optimum is a Heywood point: K
    uniquenesses vanish, and S = Theta Theta^T + diag(psi) with psi = 0 on K rows is the Chevron(rows=K) family
    with those coordinates first (w_R given w_H independent), so the bound equals Chevron's optimum there. From the
    random start this is where L-BFGS ends; the Heywood start (the default) begins on such a point, and here ends
    on a better one than the random start, in fewer steps."""
    D, K = 16, 3
    data = gk.datasets.synthetic_logistic(D, D, seed=1)
    X, y = data["X_train"], data["y_train"]
    model = lambda H: gk.Model(gk.priors.Isotropic(D, 1.0), gk.Sites(H, gk.potentials.Logistic(y)))
    fits = {start: gk.fit(model(X), factor=FactorAnalysis(K, floor=0.0, start=start), tol=1e-6)
            for start in ("random", "heywood")}
    for start, fa in fits.items():
        assert bool(fa.converged), start
        ratio = np.asarray(fa.q.factor.uniquenesses() / fa.q.factor.marginal_variances())
        # the K Heywood ratios approach 0 as the fit converges: at tol 1e-6 they end between 1e-12 and 2e-10
        # (depending on the line search's path), the next one at 0.75
        assert np.sort(ratio)[K - 1] < 1e-8 < 1e-2 < np.sort(ratio)[K], start
        _, dense = np.linalg.slogdet(np.asarray(fa.q.factor.covariance()))
        assert abs(float(fa.q.factor.logdet()) - dense) < 1e-8, start
        hubs = np.argsort(ratio)[:K]
        order = np.concatenate([hubs, np.setdiff1d(np.arange(D), hubs)])
        chevron = gk.fit(model(X[:, order]), factor=Chevron(K), tol=1e-6)
        assert abs(float(fa.log_z) - float(chevron.log_z)) < 1e-6, start
    assert float(fits["heywood"].log_z) > float(fits["random"].log_z) + 1e-3
    assert int(fits["heywood"].num_steps) < int(fits["random"].num_steps)


def test_mean_field_precision_is_the_negative_hessian_in_the_mean():
    """`gkl_jax._start.precision`: A = I + H^T diag(Gamma) H with Gamma_n = -2 dE/ds_n^2 equals -d^2 B / dm^2 at
    the same q (Bonnet and Price: d^2 E / d mu^2 = 2 dE / ds^2), for two site groups of different potentials."""
    from gkl_jax import _start
    rng = np.random.default_rng(8)
    D = 5
    H1, H2 = rng.normal(size=(7, D)), rng.normal(size=(4, D))
    model = gk.Model(gk.priors.Isotropic(D, 2.0), [gk.Sites(H1, gk.potentials.Logistic(np.sign(rng.normal(size=7)))),
                                                  gk.Sites(H2, gk.potentials.Probit(np.sign(rng.normal(size=4))))])
    q = gk.Gaussian(jnp.asarray(rng.normal(size=D)), Diagonal(jnp.asarray(rng.uniform(0.3, 1.0, size=D))))
    A = np.asarray(eqx.filter_jit(_start.precision)(model, q))
    hessian = jax.jit(jax.hessian(lambda m: gk.bound(model, gk.Gaussian(m, q.factor))))(q.mean)
    np.testing.assert_allclose(A, -np.asarray(hessian), rtol=1e-7, atol=1e-9)


def test_full_preconditioner_is_the_inverse_curvature_at_a_gaussian_optimum():
    """Gaussian sites: B = -1/2 tr(A C^T C) + sum_i log|C_ii| + terms free of C, so -d^2 B/dC^2 is exactly
    row-wise A restricted to j >= i plus e_i e_i^T / C_ii^2, and at the optimum (C^T C = A^{-1})
    `Full.precondition_tangent` must be its inverse on the upper triangle (and symmetric positive definite
    elsewhere)."""
    rng = np.random.default_rng(12)
    D, N = 5, 9
    H = rng.normal(size=(N, D))
    y = H @ rng.normal(size=D) + 0.3 * rng.normal(size=N)
    model = gk.Model(gk.priors.Isotropic(D, 2.0), gk.Sites(H, gk.potentials.Gaussian(y, 0.4)))
    A = np.eye(D) / 2.0 + H.T @ H / 0.4
    C = np.linalg.cholesky(np.linalg.inv(A)).T          # upper, C^T C = A^{-1}
    np.testing.assert_allclose(C.T @ C, np.linalg.inv(A), rtol=1e-10)
    mean = np.linalg.solve(A, H.T @ y / 0.4)
    upper = np.triu(np.ones((D, D), bool))
    idx = np.flatnonzero(upper.ravel())

    def bound_of(c):
        Cf = jnp.zeros((D, D)).at[np.unravel_index(idx, (D, D))].set(c)
        return gk.bound(model, gk.Gaussian(jnp.asarray(mean), Full(Cf)))

    hessian = np.asarray(jax.jit(jax.hessian(bound_of))(jnp.asarray(C.ravel()[idx])))
    factor = Full(jnp.asarray(C))
    apply = jax.jit(lambda v: factor.precondition_tangent(Full(v)).C)
    P = np.stack([np.asarray(apply(jnp.zeros((D, D)).at[np.unravel_index(k, (D, D))].set(1.0))).ravel()[idx]
                  for k in idx], axis=1)
    np.testing.assert_allclose(P @ -hessian, np.eye(len(idx)), atol=1e-9)
    # away from the optimum: still symmetric positive definite on the upper triangle
    factor = Full(jnp.asarray(np.triu(rng.normal(size=(D, D))) + 2 * np.eye(D)))
    P = np.stack([np.asarray(jax.jit(lambda v: factor.precondition_tangent(Full(v)).C)(
        jnp.zeros((D, D)).at[np.unravel_index(k, (D, D))].set(1.0))).ravel()[idx] for k in idx], axis=1)
    np.testing.assert_allclose(P, P.T, atol=1e-12)
    assert np.linalg.eigvalsh(P).min() > 0


def test_factor_analysis_heywood_start_is_the_chevron_optimum_of_a_gaussian():
    """`from_precision(A)`: hubs picked greedily by A_jj [(A_RR)^{-1}]_jj, Theta Theta^T the Nystrom form of
    Sigma = A^{-1} on them, d_r^2 = 1 / A_rr. For Gaussian sites (A the exact posterior precision) that is the
    optimum of the Heywood family: the bound's gradient vanishes at it with the exact mean."""
    rng = np.random.default_rng(3)
    D, N, K = 9, 12, 2
    H = rng.normal(size=(N, D)) * np.where(rng.uniform(size=D) < 0.5, 3.0, 0.5)
    y = H @ rng.normal(size=D) + 0.5 * rng.normal(size=N)
    model = gk.Model(gk.priors.Isotropic(D, 1.0), gk.Sites(H, gk.potentials.Gaussian(y, 0.5)))
    _, mean, cov = gaussian_log_evidence(H, y, 0.5, np.eye(D))
    A = np.linalg.inv(cov)
    factor = FactorAnalysis(K, floor=0.0).from_precision(jnp.asarray(A))
    hubs = np.flatnonzero(np.asarray(factor.d) == 0)
    first = np.argmax(np.diag(A) * np.diag(cov))
    second = max(set(range(D)) - {first}, key=lambda j: A[j, j] * np.linalg.inv(np.delete(np.delete(
        A, first, 0), first, 1))[j - (j > first), j - (j > first)])
    assert set(hubs) == {first, second}
    S = np.asarray(factor.covariance())
    nystrom = cov[:, hubs] @ np.linalg.solve(cov[np.ix_(hubs, hubs)], cov[hubs, :])
    np.testing.assert_allclose(S - np.diag(np.asarray(factor.uniquenesses())), nystrom, atol=1e-10)
    np.testing.assert_allclose(S[np.ix_(hubs, hubs)], cov[np.ix_(hubs, hubs)], atol=1e-10)
    grad = jax.jit(jax.grad(lambda q: gk.bound(model, q)))(gk.Gaussian(jnp.asarray(mean), factor))
    assert max(float(jnp.max(jnp.abs(g))) for g in jax.tree.leaves(grad)) < 1e-9


# ---------------------------------------------------------------- subspace basis updates


def _gaussian_target(N, dim=12, rows=40, seed=12):
    """Gaussian sites with N informative rows (padded with zero rows to a fixed shape: one compile)."""
    rng = np.random.default_rng(seed)
    H = np.zeros((rows, dim))
    H[:N] = rng.normal(size=(N, dim))
    model = gk.Model(gk.priors.Isotropic(dim, 1.0), gk.Sites(H, gk.potentials.Gaussian(rng.normal(size=rows), 0.3)))
    return model, np.eye(dim) + H.T @ H / 0.3


@eqx.filter_jit
def _refined_basis(model, q):
    return q.factor.refine(model, q).basis


def test_subspace_eigen_update_is_the_best_end_of_the_spectrum():
    """Gaussian sites: Gamma is constant and A the exact posterior precision. With optimal (S_1, c) the KL of a
    basis of eigenvectors is (D - K)/2 log(AM/GM) of the eigenvalues outside it; the update must pick the best
    split between the two ends of the spectrum: the largest eigenvalues when N < D (the paper's App. B.4.3
    wording, "leading eigenvectors of S", would pick the smallest), a different split when N > D."""
    K, dim = 3, 12
    splits = []
    for N in (5, 40):
        model, A = _gaussian_target(N)
        w, U = np.linalg.eigh(A)
        # at dim = 12 the first Krylov block (K + 9 columns) already spans R^D: exact Ritz pairs
        q = gk.Gaussian(jnp.zeros(dim), Subspace(K).initialise(dim, 1.0))
        E = np.asarray(_refined_basis(model, q))
        gap = lambda out: np.log(np.mean(out)) - np.mean(np.log(out))
        scores = {j: gap(w[K - j:dim - j]) for j in range(K + 1)}
        j = min(scores, key=scores.get)
        chosen = np.concatenate([U[:, dim - j:], U[:, :K - j]], axis=1)
        np.testing.assert_allclose(E @ E.T, chosen @ chosen.T, atol=1e-6)
        splits.append(j)
    assert splits[0] == K and splits[1] < K


def test_best_split_minimises_the_gaussian_kl():
    """`best_split` against the KL of every split computed from the eigenvalues left outside the basis."""
    from gkl_jax.factors._subspace import best_split

    rng = np.random.default_rng(3)
    for dim, K in [(9, 3), (20, 5), (30, 1), (6, 6)]:
        for _ in range(5):
            w = np.sort(np.exp(rng.normal(scale=2.0, size=dim)))
            kl = {j: (np.log(np.mean(o)) - np.mean(np.log(o))) * (dim - K) if dim > K else 0.0
                  for j in range(K + 1) for o in [w[K - j:dim - j]]}
            j = int(best_split(jnp.asarray(w), jnp.sum(jnp.asarray(w)), dim, K))
            assert kl[j] <= min(kl.values()) + 1e-12


def test_subspace_krylov_basis_with_an_invariant_krylov_space():
    """dim = 60 with 0 or 5 informative Gaussian sites: A - I has rank 0 or 5, so the Krylov space from [E, 10
    columns] is invariant after one product (the next blocks are filled from the round-off perturbation). Q must
    still be orthonormal to round-off, A Q its image, and the refined basis the 3 leading eigenvectors (N < D)."""
    from gkl_jax.factors._kernels import precision_mm, site_curvatures

    K, dim = 3, 60
    # compiled, as the refinement runs it (op by op, each of its primitives was compiled on its own)
    krylov = eqx.filter_jit(lambda model, q, key: q.factor._krylov(
        lambda X: precision_mm(model, site_curvatures(model, q), X), q.factor.basis, key))
    for N in (0, 5):
        model, A = _gaussian_target(N, dim=dim)
        q = gk.Gaussian(jnp.zeros(dim), Subspace(K).initialise(dim, 1.0))
        Q, AQ = krylov(model, q, jax.random.PRNGKey(1))
        Q, AQ = np.asarray(Q), np.asarray(AQ)
        assert Q.shape == (dim, 3 * (K + 10))
        np.testing.assert_allclose(Q.T @ Q, np.eye(Q.shape[1]), atol=1e-13)
        np.testing.assert_allclose(AQ, A @ Q, atol=1e-8)
        if N:
            U = np.linalg.eigh(A)[1][:, -K:]
            E = np.asarray(_refined_basis(model, q))
            np.testing.assert_allclose(E @ E.T, U @ U.T, atol=1e-6)
    # a basis orthonormal only to 1e-6 (the constructor accepts 1e-5): the first block is orthonormalised by one
    # Cholesky QR pass, which must still leave Q orthonormal to round-off and spanning the given basis
    E0 = q.factor.basis + 1e-6 * jax.random.normal(jax.random.PRNGKey(3), q.factor.basis.shape)
    Q, _ = eqx.filter_jit(lambda E0, key: q.factor._krylov(lambda X: X, E0, key))(E0, jax.random.PRNGKey(1))
    Q, E0 = np.asarray(Q), np.asarray(E0)
    np.testing.assert_allclose(Q.T @ Q, np.eye(Q.shape[1]), atol=1e-13)
    np.testing.assert_allclose(Q @ (Q.T @ E0), E0, atol=1e-13)


def test_subspace_row_space_update_is_the_exact_fixed_point():
    """Isotropic prior, one dense site group, N + K <= D: the update runs in the row space of H. With
    basis_iterations (K + 10) = N its Krylov space is all of R^N, so the Ritz pairs are exact: at D = 200 the
    basis must span the K leading eigenvectors of A and (C_1, c) be the fixed point S_1 = (E^T A E)^{-1},
    c^2 = (D - K) / tr(A (I - E E^T)). At D = 36 the K smallest eigenvalues (the prior's, in the null space of H)
    make the better split, which the row space cannot give: the D-space update (exact too: 3 (K + 10) = D) must
    take over. Where N + K > D, or the prior is not isotropic, the row-space update does not apply."""
    from gkl_jax.factors._subspace import row_space_matrix

    K, N = 2, 24
    refine = eqx.filter_jit(lambda m, q: q.factor.refine(m, q))
    for dim, low in ((200, 0), (36, K)):
        model, A = _gaussian_target(N, dim=dim, rows=N)
        assert row_space_matrix(model, K, 2) is not None
        new = refine(model, gk.Gaussian(jnp.zeros(dim), Subspace(K).initialise(dim, 1.0)))
        E = np.asarray(new.basis)
        w = np.linalg.eigvalsh(A)
        np.testing.assert_allclose(E.T @ E, np.eye(K), atol=1e-13)
        # E spans an invariant subspace of A (the smallest eigenvalue, the prior's, has multiplicity D - N) with
        # the chosen eigenvalues
        np.testing.assert_allclose(A @ E, E @ (E.T @ A @ E), atol=1e-8 * w[-1])
        np.testing.assert_allclose(np.linalg.eigvalsh(E.T @ A @ E), np.concatenate([w[:low], w[dim - K + low:]]),
                                   rtol=1e-10)
        S1 = np.asarray(new.upper().T @ new.upper())
        np.testing.assert_allclose(S1, np.linalg.inv(E.T @ A @ E), rtol=1e-8, atol=1e-14 * np.abs(S1).max())
        np.testing.assert_allclose(float(new.c) ** 2, (dim - K) / np.trace(A @ (np.eye(dim) - E @ E.T)), rtol=1e-10)
    assert row_space_matrix(model, K, 3) is None                                    # 3 (K + 10) > N
    assert row_space_matrix(_gaussian_target(N, dim=N + 1, rows=N)[0], K, 2) is None  # N + K > D
    assert row_space_matrix(gk.Model(gk.priors.Diagonal(jnp.ones(dim)), model.sites), K, 2) is None


def test_subspace_gradient_update_increases_the_bound():
    model, _ = logistic_model()
    start = Subspace(3, basis_update="gradient", basis_iterations=3).initialise(D, 0.5)
    start = Subspace(3, start.basis, jnp.diag(jnp.array([1.0, 0.8, 0.6])), 0.3, basis_update="gradient",
                     basis_iterations=3)
    q = gk.Gaussian(jnp.zeros(D), start)  # (at S = v I the bound does not depend on the basis)

    @eqx.filter_jit
    def before_after(model, q):
        refined = eqx.tree_at(lambda g: g.factor, q, q.factor.refine(model, q))
        return gk.bound(model, q), gk.bound(model, refined), refined.factor.basis

    before, after, E = before_after(model, q)
    np.testing.assert_allclose(np.asarray(E).T @ np.asarray(E), np.eye(3), atol=1e-10)
    assert float(after) > float(before) + 1e-6


def test_subspace_without_refinements_solves_with_the_given_basis():
    """num_refinements = 0: one solve over (m, C_1, c) with the basis held fixed; the result is stationary in
    those leaves and at least as good as any other refinement-free start with the same basis."""
    model, _ = logistic_model()
    start = Subspace(3, num_refinements=0).initialise(D, 0.5)
    res = gk.fit(model, factor=start, tol=1e-8)
    assert bool(res.converged)
    np.testing.assert_array_equal(np.asarray(res.q.factor.basis), np.asarray(start.basis))
    grads = jax.jit(jax.grad(lambda q: gk.bound(model, q)))(res.q)
    assert max(float(jnp.max(jnp.abs(g))) for g in (grads.mean, grads.factor.C1, grads.factor.scaled_c)) <= 1e-8
    refined = gk.fit(model, factor=Subspace(3), tol=1e-8)
    assert float(refined.log_z) >= float(res.log_z) - 1e-10


# ---------------------------------------------------------------- sparse H at scale (tiny version of the benchmark)


def test_chevron_fit_on_sparse_h_matches_dense_and_stays_linear_in_memory():
    rng = np.random.default_rng(13)
    dim, num, per_row, K = 60, 90, 4, 5
    H = np.zeros((num, dim))
    for n in range(num):
        H[n, rng.choice(dim, per_row, replace=False)] = rng.normal(size=per_row)
    y = np.where(rng.uniform(size=num) < 0.5, 1.0, -1.0)
    prior = gk.priors.Isotropic(dim, 1.0)
    sparse = gk.Model(prior, gk.Sites(jsparse.BCOO.fromdense(jnp.asarray(H)), gk.potentials.Logistic(y)))
    # (Newton-CG on BCOO compiles twice as long)
    res = gk.fit(sparse, factor=Chevron(K), solver=gk.solvers.LBFGS(), tol=1e-7)
    assert bool(res.converged)
    dense = gk.Model(prior, gk.Sites(H, gk.potentials.Logistic(y)))
    value, g = jax.jit(jax.value_and_grad(lambda m: gk.bound(dense, gk.Gaussian(m, res.q.factor))))(res.q.mean)
    np.testing.assert_allclose(float(value), float(res.log_z), rtol=1e-12)
    assert float(jnp.max(jnp.abs(g))) < 1e-5
    # compiled memory of one bound + gradient at a larger size is O(N K + nnz + D K), far below D^2
    dim, num, per_row = 20000, 6000, 20
    rows = np.repeat(np.arange(num), per_row)
    cols = rng.integers(0, dim, size=num * per_row)
    Hs = jsparse.BCOO((jnp.asarray(rng.normal(size=num * per_row)), jnp.asarray(np.stack([rows, cols], 1))),
                      shape=(num, dim))
    model = gk.Model(gk.priors.Isotropic(dim, 1.0), gk.Sites(Hs, gk.potentials.Logistic(jnp.ones(num))))
    q = gk.Gaussian(jnp.zeros(dim), Chevron(20).initialise(dim, 0.1))
    stats = jax.jit(jax.value_and_grad(lambda q: gk.bound(model, q))).lower(q).compile().memory_analysis()
    if stats is not None:
        assert stats.temp_size_in_bytes < 8 * 40 * (num * 20 + num * per_row + dim * 20)
        assert stats.temp_size_in_bytes < 8 * dim * dim / 100


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
