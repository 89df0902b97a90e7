"""Lanczos with full reorthogonalisation (gkl_jax._lanczos) against dense linear algebra."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gkl_jax import _lanczos as L
from gkl_jax.operators import Dense


def _spd(dim, seed=0, shift=0.1):
    rng = np.random.default_rng(seed)
    M = rng.normal(size=(dim, dim))
    return jnp.asarray(M @ M.T / dim + shift * np.eye(dim))


@pytest.fixture(scope="module")
def problem():
    A = _spd(40)
    return A, lambda v: A @ v


def test_orthonormal_and_tridiagonal_under_jit(problem):
    A, mv = problem
    run = jax.jit(lambda key: L.lanczos(mv, 40, 25, key))
    Q, alpha, beta = run(jax.random.PRNGKey(1))
    assert Q.shape == (40, 25) and alpha.shape == (25,) and beta.shape == (24,)
    np.testing.assert_allclose(Q.T @ Q, np.eye(25), atol=1e-12)
    np.testing.assert_allclose(Q.T @ A @ Q, L.tridiagonal(alpha, beta), atol=1e-12)


def test_variance_estimates_underestimate_grow_and_become_exact(problem):
    A, mv = problem
    rng = np.random.default_rng(3)
    H = Dense(rng.normal(size=(15, 40)))
    exact_w = np.diag(np.linalg.inv(A))
    exact_h = np.diag(H.matrix @ np.linalg.solve(A, H.matrix.T))
    start = jnp.asarray(rng.normal(size=40))
    Q_all, alpha_all, beta_all = L.lanczos(mv, 40, 40, start)
    # Lanczos is incremental: the first k columns are the k-step run.
    Q5, alpha5, beta5 = L.lanczos(mv, 40, 5, start)
    np.testing.assert_allclose(Q5, Q_all[:, :5], atol=1e-12)
    np.testing.assert_allclose(alpha5, alpha_all[:5], atol=1e-12)
    previous = np.zeros(15)
    for k in (1, 10, 40):
        Q, alpha, beta = Q_all[:, :k], alpha_all[:k], beta_all[: k - 1]
        nu_h = np.asarray(L.variance_estimates(Q, alpha, beta, H))
        nu_w = np.asarray(L.variance_estimates(Q, alpha, beta))
        assert np.all(nu_h <= exact_h + 1e-10) and np.all(nu_w <= exact_w + 1e-10)
        assert np.all(nu_h >= previous - 1e-10)  # nested Krylov spaces: monotone in k
        previous = nu_h
    np.testing.assert_allclose(nu_h, exact_h, rtol=1e-9)
    np.testing.assert_allclose(nu_w, exact_w, rtol=1e-9)
    W = L.inverse_factor(Q, alpha, beta)
    np.testing.assert_allclose(W @ W.T, np.linalg.inv(A), atol=1e-9)


def test_extreme_ritz_pairs_converge_first(problem):
    A, mv = problem
    evals, evecs = np.linalg.eigh(A)
    Q, alpha, beta = L.lanczos(mv, 40, 30, jax.random.PRNGKey(0))
    theta, V = L.ritz_pairs(Q, alpha, beta, 2, "largest")
    np.testing.assert_allclose(theta, evals[::-1][:2], rtol=1e-6)
    assert abs(float(V[:, 0] @ evecs[:, -1])) > 1 - 1e-6
    theta_small, _ = L.ritz_pairs(Q, alpha, beta, 1, "smallest")
    assert float(theta_small[0]) >= evals[0] - 1e-12  # Ritz values interlace: never below the spectrum


def test_invariant_subspace_restarts_keep_q_orthonormal():
    A = jnp.diag(jnp.array([1.0, 1, 1, 2, 2, 2, 3, 3, 3, 3]))  # Krylov spaces have dimension <= 3
    Q, alpha, beta = L.lanczos(lambda v: A @ v, 10, 10, jax.random.PRNGKey(0))
    np.testing.assert_allclose(Q.T @ Q, np.eye(10), atol=1e-12)
    np.testing.assert_allclose(Q.T @ A @ Q, L.tridiagonal(alpha, beta), atol=1e-12)
    assert int(jnp.sum(beta == 0)) >= 2
    np.testing.assert_allclose(L.variance_estimates(Q, alpha, beta), 1 / np.diag(A), rtol=1e-10)


def test_slq_logdet_is_the_probe_quadratic_form_and_unbiased(problem):
    A, mv = problem
    evals, evecs = np.linalg.eigh(A)
    logA = (evecs * np.log(evals)) @ evecs.T
    v = jnp.asarray(np.random.default_rng(5).choice([-1.0, 1.0], size=40))
    Q, alpha, beta = L.lanczos(mv, 40, 40, v)
    np.testing.assert_allclose(L.slq_logdet(alpha, beta, v @ v), v @ logA @ v, rtol=1e-9)
    probes = jnp.where(jax.random.bernoulli(jax.random.PRNGKey(2), 0.5, (200, 40)), 1.0, -1.0)
    estimates = jax.vmap(lambda p: L.slq_logdet(*L.lanczos(mv, 40, 12, p)[1:], p @ p))(probes)
    exact = np.sum(np.log(evals))
    assert abs(float(jnp.mean(estimates)) - exact) < 4 * float(jnp.std(estimates)) / np.sqrt(200) + 1e-3


def test_estimate_variances_one_call_and_bad_sizes(problem):
    A, mv = problem
    nu, (Q, alpha, beta) = L.estimate_variances(mv, 40, 40, jax.random.PRNGKey(4))
    np.testing.assert_allclose(nu, np.diag(np.linalg.inv(A)), rtol=1e-9)
    for k in (0, 41):
        with pytest.raises(ValueError, match="num_vectors"):
            L.lanczos(mv, 40, k, jax.random.PRNGKey(0))
    with pytest.raises(ValueError, match="key_or_start"):
        L.lanczos(mv, 40, 3, jnp.ones(7))
    with pytest.raises(ValueError, match="which"):
        L.ritz_pairs(Q, alpha, beta, 1, "middle")
