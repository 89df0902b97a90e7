"""Sparse GPs: inducing inputs at the data equal the full GP, the Gaussian bound is Titsias' collapsed bound,
and the inducing inputs are optimisable."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _helpers_gp import NOISE, _data, _random_q
from scipy import stats

import gkl_jax as gk
from gkl_jax import kernels as K


def test_sparse_gp_with_z_equal_x_equals_full(rng):
    X, y = _data(10)
    kernel = K.SquaredExponential(1.0, 1.2)
    Xs = rng.uniform(-3, 3, size=(6, 1))
    for lik in (gk.potentials.Laplace(y, 0.3), gk.potentials.Gaussian(y, NOISE)):
        full = gk.gp.model(kernel, X, lik, jitter=1e-9)
        sparse = gk.gp.sparse_model(kernel, X, X, lik, jitter=1e-9)
        q = _random_q(rng, 10)                                    # the bounds agree at every q ...
        np.testing.assert_allclose(gk.bound(sparse, q), gk.bound(full, q), rtol=1e-7)
    r_full, r_sparse = gk.gp.exact(full), gk.gp.exact(sparse)     # ... so the optima and predictions agree
    np.testing.assert_allclose(r_sparse.log_z, r_full.log_z, rtol=1e-7)
    p_full = gk.gp.predict(r_full, full.prior, Xs)
    p_sparse = gk.gp.predict(r_sparse, sparse.prior, Xs)
    np.testing.assert_allclose(p_sparse.mean, p_full.mean, atol=1e-6)
    np.testing.assert_allclose(p_sparse.variance, p_full.variance, atol=1e-6)


def test_sparse_gaussian_bound_is_titsias_collapsed_bound():
    X, y = _data(15)
    Z = np.linspace(-2.5, 2.5, 4)[:, None]
    kernel = K.SquaredExponential(0.9, 1.1)
    model = gk.gp.sparse_model(kernel, X, Z, gk.potentials.Gaussian(y, NOISE))
    Kzz = np.asarray(kernel.gram(Z)) + 1e-6 * np.eye(4)
    Kxz = np.asarray(kernel.gram(X, Z))
    Q = Kxz @ np.linalg.solve(Kzz, Kxz.T)
    titsias = (stats.multivariate_normal(np.zeros(15), Q + NOISE * np.eye(15)).logpdf(y)
               - 0.5 * np.trace(np.asarray(kernel.gram(X)) - Q) / NOISE)
    np.testing.assert_allclose(gk.gp.exact(model).log_z, titsias, rtol=1e-8)
    np.testing.assert_allclose(gk.fit(model).log_z, titsias, rtol=1e-7)
    exact_full = stats.multivariate_normal(np.zeros(15), np.asarray(kernel.gram(X)) + NOISE * np.eye(15)).logpdf(y)
    assert titsias <= exact_full


def test_inducing_inputs_are_optimisable():
    """d log_z / dZ through the fitted sparse bound (envelope theorem) equals central differences of the
    re-optimised bound, and ML-II over (kernel, Z) raises the bound."""
    X, y = _data(12)
    lik = gk.potentials.Laplace(y, 0.3)
    kernel = K.SquaredExponential(1.0, 1.0)
    Z0 = jnp.asarray(X[::4] + 0.1)
    # one compiled program (the fit's tolerance is an argument): the gradient at tol 1e-8, the refits at 1e-10
    value_and_grad = jax.jit(jax.value_and_grad(
        lambda Z, tol: gk.fit(gk.gp.sparse_model(kernel, X, Z, lik), tol=tol).log_z))
    log_z = lambda Z, tol=1e-10: float(value_and_grad(Z, tol)[0])
    grad = np.asarray(value_and_grad(Z0, 1e-8)[1])
    eps = 1e-5
    for i in (0, 2):
        e = jnp.zeros_like(Z0).at[i, 0].set(eps)
        fd = (log_z(Z0 + e) - log_z(Z0 - e)) / (2 * eps)
        np.testing.assert_allclose(grad[i, 0], fd, rtol=1e-5, atol=1e-6)
    build = lambda p: gk.gp.sparse_model(p[0], X, p[1], lik)
    with pytest.warns(UserWarning, match="without meeting"):
        res = gk.gp.fit_hyperparameters(build, (kernel, Z0), max_steps=2)
    assert float(res.log_z) > log_z(Z0) + 1e-3
    assert not np.allclose(np.asarray(res.params[1]), np.asarray(Z0))
