"""Structured factors at the optimum: bound orderings and structural zeros kept, exact log Z, factor analysis
(not concave; Heywood cases and their chevron optimum), the mean-field precision and the Full preconditioner."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _helpers_factors import CASES, solver_vector, structural_vector
from helpers import gaussian_log_evidence

import gkl_jax as gk
from gkl_jax.factors import Chevron, Diagonal, FactorAnalysis, Full

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
