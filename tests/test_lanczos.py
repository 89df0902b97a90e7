"""Lanczos with full reorthogonalisation (gkl_jax._lanczos) against dense linear algebra.

Lanczos is incremental: the first k columns of Q (and alpha[:k], beta[:k-1]) are the k-step run, so one jitted
full run serves every k (checked against a fresh 5-step run)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gkl_jax import _lanczos as L
from gkl_jax.operators import Dense

DIM = 40


@pytest.fixture(scope="module")
def problem():
    rng = np.random.default_rng(0)
    M = rng.normal(size=(DIM, DIM))
    A = jnp.asarray(M @ M.T / DIM + 0.1 * np.eye(DIM))
    mv = lambda v: A @ v
    start = jnp.asarray(rng.normal(size=DIM))
    run = jax.jit(lambda s: L.lanczos(mv, DIM, DIM, s))(start)
    return A, mv, start, run


def _steps(run, k):
    Q, alpha, beta = run
    return Q[:, :k], alpha[:k], beta[: k - 1]


def test_orthonormal_tridiagonal_and_incremental(problem):
    A, mv, start, run = problem
    for k in (25, DIM):
        Q, alpha, beta = _steps(run, k)
        np.testing.assert_allclose(Q.T @ Q, np.eye(k), atol=1e-12)
        np.testing.assert_allclose(Q.T @ A @ Q, L.tridiagonal(alpha, beta), atol=1e-12)
    Q5, alpha5, beta5 = L.lanczos(mv, DIM, 5, start)
    assert Q5.shape == (DIM, 5) and alpha5.shape == (5,) and beta5.shape == (4,)
    for fresh, truncated in zip((Q5, alpha5, beta5), _steps(run, 5)):
        np.testing.assert_allclose(fresh, truncated, atol=1e-12)


def test_variance_estimates_underestimate_grow_and_become_exact(problem):
    A, _, _, run = problem
    H = Dense(np.random.default_rng(3).normal(size=(15, DIM)))
    exact_w = np.diag(np.linalg.inv(A))
    exact_h = np.diag(H.matrix @ np.linalg.solve(A, H.matrix.T))
    previous = np.zeros(15)
    for k in (1, 10, DIM):
        nu_h = np.asarray(L.variance_estimates(*_steps(run, k), H))
        nu_w = np.asarray(L.variance_estimates(*_steps(run, k)))
        assert np.all(nu_h <= exact_h + 1e-10) and np.all(nu_w <= exact_w + 1e-10)
        assert np.all(nu_h >= previous - 1e-10)  # nested Krylov spaces: monotone in k
        previous = nu_h
    np.testing.assert_allclose(nu_h, exact_h, rtol=1e-9)
    np.testing.assert_allclose(nu_w, exact_w, rtol=1e-9)
    W = L.inverse_factor(*run)
    np.testing.assert_allclose(W @ W.T, np.linalg.inv(A), atol=1e-9)


def test_extreme_ritz_pairs_converge_first(problem):
    A, _, _, run = problem
    evals, evecs = np.linalg.eigh(A)
    Q, alpha, beta = _steps(run, 30)
    theta, V = L.ritz_pairs(Q, alpha, beta, 2, "largest")
    np.testing.assert_allclose(theta, evals[::-1][:2], rtol=1e-6)
    assert abs(float(V[:, 0] @ evecs[:, -1])) > 1 - 1e-6
    theta_small, _ = L.ritz_pairs(Q, alpha, beta, 1, "smallest")
    assert float(theta_small[0]) >= evals[0] - 1e-12  # Ritz values interlace: never below the spectrum
    with pytest.raises(ValueError, match="which"):
        L.ritz_pairs(Q, alpha, beta, 1, "middle")


def test_invariant_subspace_restarts_keep_q_orthonormal():
    A = jnp.diag(jnp.array([1.0, 1, 1, 2, 2, 2, 3, 3, 3, 3]))  # Krylov spaces have dimension <= 3
    Q, alpha, beta = L.lanczos(lambda v: A @ v, 10, 10, jax.random.PRNGKey(0))
    np.testing.assert_allclose(Q.T @ Q, np.eye(10), atol=1e-12)
    np.testing.assert_allclose(Q.T @ A @ Q, L.tridiagonal(alpha, beta), atol=1e-12)
    assert int(jnp.sum(beta == 0)) >= 2
    np.testing.assert_allclose(L.variance_estimates(Q, alpha, beta), 1 / np.diag(A), rtol=1e-10)


def test_slq_logdet_is_the_probe_quadratic_form_and_unbiased(problem):
    A, mv, start, run = problem
    evals, evecs = np.linalg.eigh(A)
    logA = (evecs * np.log(evals)) @ evecs.T
    np.testing.assert_allclose(L.slq_logdet(run[1], run[2], start @ start), start @ logA @ start, rtol=1e-9)
    probes = jnp.where(jax.random.bernoulli(jax.random.PRNGKey(2), 0.5, (200, DIM)), 1.0, -1.0)
    estimates = jax.vmap(lambda p: L.slq_logdet(*L.lanczos(mv, DIM, 12, p)[1:], p @ p))(probes)
    exact = np.sum(np.log(evals))
    assert abs(float(jnp.mean(estimates)) - exact) < 4 * float(jnp.std(estimates)) / np.sqrt(200) + 1e-3


def test_estimate_variances_from_a_key_and_bad_sizes(problem):
    A, mv, _, _ = problem
    nu, (Q, alpha, beta) = L.estimate_variances(mv, DIM, DIM, jax.random.PRNGKey(4))
    np.testing.assert_allclose(nu, np.diag(np.linalg.inv(A)), rtol=1e-9)
    for k in (0, DIM + 1):
        with pytest.raises(ValueError, match="num_vectors"):
            L.lanczos(mv, DIM, k, jax.random.PRNGKey(0))
    with pytest.raises(ValueError, match="key_or_start"):
        L.lanczos(mv, DIM, 3, jnp.ones(7))
