"""Minibatch sparse GP fits (`gk.gp.fit_sparse_minibatch`) and their streamed / minibatch bounds, against the
sparse model's `gk.bound`, Titsias' collapsed bound and the exhaustive batch average."""

import functools
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

import gkl_jax as gk
from gkl_jax import kernels as K
from gkl_jax.gp import _minibatch

N, M, NOISE = 60, 7, 0.1
KERNEL = K.SquaredExponential(0.9, 1.1)


def _data(n=N, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.uniform(-3, 3, size=(n, 2))
    f = np.sin(X[:, 0]) + 0.5 * np.cos(X[:, 1])
    return X, f + np.sqrt(NOISE) * rng.standard_normal(n), np.where(f + 0.3 * rng.standard_normal(n) > 0, 1, -1)


def _z():
    return np.random.default_rng(1).uniform(-2.5, 2.5, size=(M, 2))


def _random_q(seed=2, dim=M):
    rng = np.random.default_rng(seed)
    C = np.triu(0.3 * rng.standard_normal((dim, dim))) + np.diag(rng.uniform(0.2, 0.8, dim))
    return gk.Gaussian(rng.standard_normal(dim), gk.factors.Full(C))


def _to_u(q, Z, jitter=1e-6):
    """q over v taken to u = L v (zero mean): mean L m, factor C L^T."""
    L = np.linalg.cholesky(np.asarray(KERNEL.gram(Z)) + jitter * np.eye(len(Z)))
    C = np.asarray(q.factor.upper()) @ L.T
    return gk.Gaussian(L @ np.asarray(q.mean), gk.factors.Full(np.linalg.qr(C, mode="r")))


@pytest.mark.parametrize("which", ["gaussian", "logistic"])
def test_streamed_bound_is_the_sparse_models_bound_for_every_chunking(which):
    X, y, labels = _data()
    Z = _z()
    lik = gk.potentials.Gaussian(y, NOISE) if which == "gaussian" else gk.potentials.Logistic(labels)
    q = _random_q()
    reference = gk.bound(gk.gp.sparse_model(KERNEL, X, Z, lik), _to_u(q, Z))
    for chunk in (N, 16, 7, 1):   # one chunk, a masked tail (60 = 3 * 16 + 12; 60 = 8 * 7 + 4), one row each
        value = gk.gp.sparse_streamed_bound(KERNEL, X, Z, lik, q, chunk_size=chunk)
        np.testing.assert_allclose(value, reference, rtol=1e-10)


def test_streamed_bound_at_the_optimum_is_titsias_collapsed_bound():
    X, y, _ = _data()
    Z = _z()
    Kzz = np.asarray(KERNEL.gram(Z)) + 1e-6 * np.eye(M)
    Kxz = np.asarray(KERNEL.gram(X, Z))
    Q = Kxz @ np.linalg.solve(Kzz, Kxz.T)
    titsias = (stats.multivariate_normal(np.zeros(N), Q + NOISE * np.eye(N)).logpdf(y)
               - 0.5 * np.trace(np.asarray(KERNEL.gram(X)) - Q) / NOISE)
    A = np.linalg.solve(np.linalg.cholesky(Kzz), Kxz.T)           # whitened projections, M x N
    precision = np.eye(M) + A @ A.T / NOISE                        # the optimal q(v) in closed form
    S = np.linalg.inv(precision)
    q = gk.Gaussian(S @ A @ y / NOISE, gk.factors.Full(np.linalg.cholesky(S).T))
    value = gk.gp.sparse_streamed_bound(KERNEL, X, Z, gk.potentials.Gaussian(y, NOISE), q, chunk_size=16)
    np.testing.assert_allclose(value, titsias, rtol=1e-10)


def test_minibatch_estimate_is_unbiased_over_a_partition():
    X, _, labels = _data()
    Z = _z()
    lik = gk.potentials.Logistic(labels)
    q = _random_q()
    full = gk.gp.sparse_streamed_bound(KERNEL, X, Z, lik, q)
    for b in (1, 12, N):
        perm = np.random.default_rng(b).permutation(N)
        batches = perm.reshape(N // b, b)
        estimate = jax.jit(lambda idx: gk.gp.sparse_minibatch_bound(KERNEL, X, Z, lik, q, idx))
        values = np.array([estimate(idx) for idx in batches])
        np.testing.assert_allclose(values.mean(), full, rtol=1e-10)
        if b < N:
            assert values.std() > 1e-3 * abs(full)     # the batches do differ: the equality is not trivial


@pytest.mark.slow   # a compiled fit or gradient program: over 2 s on an idle 2-core machine
def test_fit_with_the_full_batch_reaches_titsias_optimum():
    X, y, _ = _data()
    Z = _z()
    lik = gk.potentials.Gaussian(y, NOISE)
    fit = gk.gp.fit_sparse_minibatch(KERNEL, X, lik, Z=Z, batch_size=N, num_steps=1500, learning_rate=3e-2,
                                     learn_kernel=False, learn_likelihood=False, tol=1e-4)
    exact = gk.gp.exact(gk.gp.sparse_model(KERNEL, X, Z, lik))
    assert bool(fit.result.converged)
    np.testing.assert_allclose(fit.result.log_z, exact.log_z, rtol=1e-6)
    np.testing.assert_allclose(fit.result.history[-1], fit.result.log_z)
    Xs = np.random.default_rng(5).uniform(-3, 3, size=(9, 2))
    pred = gk.gp.predict(fit.result, fit.prior, Xs)
    dense = gk.gp.predict(exact, gk.gp.sparse_model(KERNEL, X, Z, lik).prior, Xs)
    np.testing.assert_allclose(pred.mean, dense.mean, atol=1e-3)
    np.testing.assert_allclose(pred.variance, dense.variance, atol=1e-3)


@pytest.mark.slow   # a compiled fit or gradient program: over 2 s on an idle 2-core machine
def test_fit_learns_hyperparameters_towards_ml2_and_compiles_once():
    X, y, _ = _data()
    lik = gk.potentials.Gaussian(y, 1.0)
    start = K.SquaredExponential(0.3, 3.0)
    args = dict(num_inducing=M, batch_size=20, num_epochs=60, learning_rate=3e-2)
    before = _minibatch.TRACE_COUNT["fit_sparse_minibatch"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fit = gk.gp.fit_sparse_minibatch(start, X, lik, **args)
        again = gk.gp.fit_sparse_minibatch(start, X, gk.potentials.Gaussian(y + 0.1, 1.0), **args)
    assert _minibatch.TRACE_COUNT["fit_sparse_minibatch"] == before + 1      # same shapes: one compilation
    assert float(again.result.log_z) != float(fit.result.log_z)
    initial = gk.gp.sparse_streamed_bound(start, X, fit.Z, lik, gk.Gaussian(np.zeros(M), gk.factors.Full(np.eye(M))))
    assert float(fit.result.log_z) > float(initial) + 10                   # noise 1.0 -> ~0.1 is worth much more
    assert 0.03 < float(fit.likelihood.variance) < 0.3
    assert np.all(np.isin(np.asarray(fit.Z), X))                           # inducing inputs: rows of X


@pytest.mark.slow   # a compiled fit or gradient program: over 2 s on an idle 2-core machine
def test_unconverged_fit_says_so():
    X, _, labels = _data()
    with pytest.warns(UserWarning, match="fit_sparse_minibatch"):
        fit = gk.gp.fit_sparse_minibatch(KERNEL, X, gk.potentials.Logistic(labels), num_inducing=M, batch_size=5,
                                         num_steps=2)
    assert not bool(fit.result.converged)
    assert np.isfinite(float(fit.result.log_z))


@pytest.mark.parametrize("kwargs, match", [
    (dict(batch_size=0, num_inducing=M), "batch_size"),
    (dict(batch_size=N + 1, num_inducing=M), "batch_size"),
    (dict(batch_size=5, num_inducing=0), "num_inducing"),
    (dict(batch_size=5, num_inducing=N + 1), "num_inducing"),
    (dict(batch_size=5, Z=np.zeros((M, 3))), "Z"),
    (dict(batch_size=5), "num_inducing"),
    (dict(batch_size=5, num_inducing=M, num_epochs=1.0), "num_steps"),
    (dict(batch_size=5, num_inducing=M, optimizer="adam"), "optimizer"),
    (dict(batch_size=5, num_inducing=M, mean=np.zeros(N)), "mean"),
])
def test_bad_input_names_the_argument(kwargs, match):
    X, _, labels = _data()
    kwargs = {"num_steps": 3, **kwargs}
    with pytest.raises(ValueError, match=match):
        gk.gp.fit_sparse_minibatch(KERNEL, X, gk.potentials.Logistic(labels), **kwargs)
    with pytest.raises(ValueError, match="Z"):
        gk.gp.sparse_streamed_bound(KERNEL, X, np.zeros((M, 1)), gk.potentials.Logistic(labels), _random_q())
    with pytest.raises(ValueError, match="indices"):
        gk.gp.sparse_minibatch_bound(KERNEL, X, _z(), gk.potentials.Logistic(labels), _random_q(),
                                     jnp.zeros(0, jnp.int32))


@pytest.mark.slow   # a compiled fit or gradient program: over 2 s on an idle 2-core machine
def test_streamed_gradient_matches_unchunked_and_finite_differences():
    X, _, labels = _data()
    Z = _z()
    lik = gk.potentials.Logistic(labels)
    q = _random_q()

    @functools.partial(jax.jit, static_argnums=2)
    def value(log_lengthscale, Z, chunk):
        kernel = K.SquaredExponential(0.9, jnp.exp(log_lengthscale))
        return gk.gp.sparse_streamed_bound(kernel, X, Z, lik, q, chunk_size=chunk)

    x0 = jnp.log(1.1)
    grad = jax.jit(jax.grad(value, argnums=(0, 1)), static_argnums=2)
    g_chunked, g_whole = grad(x0, jnp.asarray(Z), 16), grad(x0, jnp.asarray(Z), N)
    np.testing.assert_allclose(g_chunked[0], g_whole[0], rtol=1e-9)
    np.testing.assert_allclose(g_chunked[1], g_whole[1], rtol=1e-8, atol=1e-10)
    eps = 1e-5
    fd = (value(x0 + eps, Z, 16) - value(x0 - eps, Z, 16)) / (2 * eps)
    np.testing.assert_allclose(g_chunked[0], fd, rtol=1e-6)
    dZ = np.zeros_like(Z)
    dZ[3, 1] = eps
    fd_z = (value(x0, Z + dZ, 16) - value(x0, Z - dZ, 16)) / (2 * eps)
    np.testing.assert_allclose(g_chunked[1][3, 1], fd_z, rtol=1e-6)


@pytest.mark.slow
def test_learned_inducing_inputs_move_and_the_bound_improves():
    X, _, labels = _data()
    lik = gk.potentials.Logistic(labels)
    Z0 = _z()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fixed = gk.gp.fit_sparse_minibatch(KERNEL, X, lik, Z=Z0, batch_size=N, num_steps=300, learn_kernel=False)
        moved = gk.gp.fit_sparse_minibatch(KERNEL, X, lik, Z=Z0, batch_size=N, num_steps=300, learn_kernel=False,
                                           learn_inducing=True)
    assert float(np.max(np.abs(np.asarray(moved.Z) - Z0))) > 1e-2
    np.testing.assert_array_equal(np.asarray(fixed.Z), Z0)
    assert float(moved.result.log_z) > float(fixed.result.log_z)
