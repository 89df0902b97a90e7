"""GP prediction and exact regression against dense / closed-form / quadrature oracles, label regression, and
bad input. Sparse GPs: tests/test_gp_sparse.py; ML-II: tests/test_gp_hyper.py; PPA and the KL-corrected bound:
tests/test_gp_ppa.py."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _helpers_gp import NOISE, _data, _random_q
from scipy import integrate, special, stats

import gkl_jax as gk
from gkl_jax import kernels as K


def _dense_posterior_predictive(kernel, X, y, noise, Xs, jitter=1e-6):
    Kxx = np.asarray(kernel.gram(X)) + jitter * np.eye(len(X))
    Ksx = np.asarray(kernel.gram(Xs, X))
    Kss = np.asarray(kernel.diag(Xs))
    A = Kxx + noise * np.eye(len(X))
    mean = Ksx @ np.linalg.solve(A, y)
    var = Kss - np.sum(Ksx * np.linalg.solve(A, Ksx.T).T, axis=1)
    log_z = stats.multivariate_normal(np.zeros(len(X)), A).logpdf(y)
    return log_z, mean, var


def _methods():
    methods = [("gkl", gk.fit)]
    for name in ("laplace", "ep", "local"):
        fn = getattr(gk, name, None) or getattr(gk.baselines, name, None)
        if fn is not None:
            methods.append((name, fn))
    return methods


@pytest.mark.parametrize("name, method", _methods())
def test_gaussian_likelihood_every_method_equals_exact_regression(name, method):
    X, y = _data()
    kernel = K.SquaredExponential(1.3, 0.9)
    Xs = np.linspace(-3.5, 3.5, 7)[:, None]
    log_z, mean, var = _dense_posterior_predictive(kernel, X, y, NOISE, Xs)
    model = gk.gp.model(kernel, X, gk.potentials.Gaussian(y, NOISE))
    exact = gk.gp.exact(model)
    np.testing.assert_allclose(exact.log_z, log_z, rtol=1e-10)
    res = method(model)
    np.testing.assert_allclose(res.log_z, log_z, rtol=1e-6, atol=1e-6)
    pred = gk.gp.predict(res, model.prior, Xs, gk.potentials.Gaussian(np.zeros(7), NOISE))
    np.testing.assert_allclose(pred.mean, mean, atol=1e-6)
    np.testing.assert_allclose(pred.variance, var, atol=1e-6)
    np.testing.assert_allclose(pred.y_variance, var + NOISE, atol=1e-6)
    np.testing.assert_allclose(pred.log_density, stats.norm(mean, np.sqrt(var + NOISE)).logpdf(0.0), atol=1e-6)


def test_exact_matches_linear_gaussian_oracle_in_both_spaces(rng):
    from helpers import gaussian_log_evidence

    for num, dim in ((6, 4), (9, 3)):                                # N > D (Woodbury) and N <= D paths
        H = rng.normal(size=(num, dim))
        y = rng.normal(size=num)
        cov = np.cov(rng.normal(size=(dim, 3 * dim))) + 0.5 * np.eye(dim)
        model = gk.Model(gk.priors.Dense(cov), gk.Sites(H, gk.potentials.Gaussian(y, 0.3)))
        log_z, mean, post = gaussian_log_evidence(H, y, 0.3, cov)
        res = gk.gp.exact(model)
        np.testing.assert_allclose(res.log_z, log_z, rtol=1e-10)
        np.testing.assert_allclose(res.q.mean, mean, atol=1e-10)
        np.testing.assert_allclose(res.q.covariance(), post, atol=1e-10)
    with pytest.raises(ValueError, match="Gaussian potentials"):
        gk.gp.exact(gk.Model(gk.priors.Dense(cov), gk.Sites(H, gk.potentials.Probit(np.sign(y)))))


def test_latent_prediction_matches_dense_formula_for_any_q(rng):
    X, y = _data(10)
    kernel = K.Matern52(1.1, 1.4)
    model = gk.gp.model(kernel, X, gk.potentials.Probit(np.sign(y)), mean=0.2)
    q = _random_q(rng, 10)
    Xs = rng.uniform(-3, 3, size=(5, 1))
    Sigma = np.asarray(model.prior.covariance)
    Ks = np.asarray(kernel.gram(X, Xs))
    A = np.linalg.solve(Sigma, Ks)
    S = np.asarray(q.covariance())
    mean = 0.2 + A.T @ (np.asarray(q.mean) - 0.2)
    var = np.asarray(kernel.diag(Xs)) - np.sum(Ks * A, 0) + np.sum(A * (S @ A), 0)
    pred = gk.gp.predict(q, model.prior, Xs, gk.potentials.Probit(np.ones(5)))
    np.testing.assert_allclose(pred.mean, mean, atol=1e-8)
    np.testing.assert_allclose(pred.variance, var, atol=1e-8)
    np.testing.assert_allclose(pred.probability, stats.norm.cdf(mean / np.sqrt(1 + var)), atol=1e-8)
    np.testing.assert_allclose(pred.log_density, np.log(pred.probability), atol=1e-8)
    diag = gk.Gaussian(q.mean, gk.factors.Diagonal(np.sqrt(np.diag(S))))    # any factor structure predicts
    var_diag = np.asarray(kernel.diag(Xs)) - np.sum(Ks * A, 0) + np.sum(A * (np.diag(S)[:, None] * A), 0)
    np.testing.assert_allclose(gk.gp.predict(diag, model.prior, Xs).variance, var_diag, atol=1e-8)


@pytest.mark.parametrize("lik, pdf", [
    (gk.potentials.Laplace(np.array([0.3, -1.0, 2.0]), 0.4), lambda y, f: np.exp(-np.abs(y - f) / 0.4) / 0.8),
    (gk.potentials.StudentT(np.array([0.3, -1.0, 2.0]), 3.0, 0.5), lambda y, f: stats.t(3.0, f, 0.5).pdf(y)),
    (gk.potentials.Logistic(np.array([1.0, -1.0, 1.0])), lambda y, f: special.expit(y * f)),
])
def test_predictive_densities_match_numerical_integration(lik, pdf):
    mean = np.array([0.1, -0.5, 1.0])
    var = np.array([0.3, 0.05, 1.2])
    got = gk.gp.log_predictive_density(lik, jnp.asarray(mean), jnp.asarray(var))
    for i in range(3):
        y = float(np.asarray(lik.y)[i])
        val, _ = integrate.quad(lambda f: pdf(y, f) * stats.norm(mean[i], np.sqrt(var[i])).pdf(f), -np.inf, np.inf,
                                points=None, limit=200)
        np.testing.assert_allclose(got[i], np.log(val), rtol=1e-6)
    if isinstance(lik, gk.potentials.Logistic):
        p = gk.gp.class_probability(lik, jnp.asarray(mean), jnp.asarray(var))
        np.testing.assert_allclose(np.where(np.asarray(lik.y) > 0, p, 1 - p), np.exp(got), rtol=1e-8)


def test_robust_regression_default_fit_converges_on_an_ill_conditioned_prior():
    """Student-t sites (not log-concave) under an SE prior without a white term: Sigma's condition number is ~1e6
    (its smallest eigenvalues are the jitter). Newton-CG in (m, C) reaches tol 1e-6, where L-BFGS in (m, C) stalls
    (2000 steps, max|grad| ~1e-3), and it finds the optimum of L-BFGS in the whitened basis, as does the default
    (whitened L-BFGS, then whitened Newton-CG)."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(25, 1))
    y = np.sin(2 * X[:, 0]) + 0.1 * rng.standard_normal(25)
    y[3] = 5.0
    model = gk.gp.model(K.SquaredExponential(1.0, 1.0), X, gk.potentials.StudentT(y, 3.0, 0.1))
    assert np.linalg.eigvalsh(np.asarray(model.prior.covariance))[0] < 1e-5
    res = gk.fit(model, solver=gk.solvers.Newton(), whiten=False)
    assert bool(res.converged) and int(res.num_steps) < 200
    grads = jax.jit(jax.grad(lambda q: gk.bound(model, q)))(res.q)
    assert max(float(jnp.max(jnp.abs(g))) for g in jax.tree.leaves(grads)) <= 1e-6
    whitened = gk.fit(model, solver=gk.solvers.LBFGS(), whiten=True)
    default = gk.fit(model)
    assert bool(whitened.converged) and bool(default.converged)
    np.testing.assert_allclose(res.log_z, whitened.log_z, rtol=0, atol=1e-8)
    np.testing.assert_allclose(default.log_z, whitened.log_z, rtol=0, atol=1e-8)
    np.testing.assert_allclose(res.q.mean, whitened.q.mean, atol=1e-4)


def test_bad_inputs_name_the_argument():
    X, y = _data(8)
    k = K.SquaredExponential()
    with pytest.raises(ValueError, match="X"):
        gk.gp.model(k, np.where(X > 1, np.nan, X), gk.potentials.Gaussian(y))
    with pytest.raises(ValueError, match="y"):
        gk.gp.model(k, X, gk.potentials.Gaussian(y[:5]))
    with pytest.raises(ValueError, match="y"):
        gk.gp.sparse_model(k, X, X[:3], gk.potentials.Gaussian(y[:5]))
    with pytest.raises(ValueError, match="Z"):
        gk.gp.sparse_model(k, X, np.zeros((3, 2)), gk.potentials.Gaussian(y))
    with pytest.raises(ValueError, match="lengthscale"):
        K.Matern32(lengthscale=0.0)
    model = gk.gp.model(k, X, gk.potentials.Gaussian(y))
    res = gk.gp.exact(model)
    with pytest.raises(ValueError, match="X_new"):
        gk.gp.predict(res, model.prior, np.zeros((3, 2)))
    with pytest.raises(ValueError, match="X_new"):
        gk.gp.predict(res, model.prior, np.array([[np.nan]]))
    with pytest.raises(ValueError, match="likelihood"):
        gk.gp.predict(res, model.prior, np.zeros((3, 1)), gk.potentials.Gaussian(np.zeros(4)))
    with pytest.raises(ValueError, match="prior"):
        gk.gp.predict(res, gk.priors.Isotropic(8), np.zeros((3, 1)))
    with pytest.raises(ValueError, match="build"):
        gk.gp.fit_hyperparameters(None, k)
    with pytest.raises(ValueError, match="tol"):
        gk.gp.fit_hyperparameters(lambda kk: gk.gp.model(kk, X, gk.potentials.Gaussian(y)), k,
                                  method_kwargs={"tol": 0.0})


def test_label_regression_is_the_best_regression_posterior_and_its_jensen_bound():
    """LR (papers/003 Section 4.8): q is exact GP regression on the labels at the grid's best noise sd, and its
    log_z is the G-KL bound of the classification model at q, so it is below the optimised G-KL bound."""
    X, f = _data(10)
    y = np.where(f > 0, 1.0, -1.0)
    kernel = K.SquaredExponential(1.0, 1.0)
    model = gk.gp.model(kernel, X, gk.potentials.Probit(y))
    sds = (0.5, 1.0, 2.0)
    lr = gk.gp.label_regression(model, noise_sds=sds)
    evidences = [float(gk.gp.exact(gk.gp.model(kernel, X, gk.potentials.Gaussian(y, s ** 2))).log_z) for s in sds]
    best = gk.gp.exact(gk.gp.model(kernel, X, gk.potentials.Gaussian(y, sds[int(np.argmax(evidences))] ** 2)))
    np.testing.assert_allclose(lr.q.mean, best.q.mean, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(lr.q.covariance(), best.q.covariance(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(lr.log_z, gk.bound(model, lr.q), rtol=1e-12)
    assert float(lr.log_z) < float(gk.fit(model).log_z)
    assert lr.method == "label_regression" and lr.is_bound
    with pytest.raises(ValueError, match="Logistic or Probit"):
        gk.gp.label_regression(gk.gp.model(kernel, X, gk.potentials.Gaussian(f)))
    with pytest.raises(ValueError, match="noise_sds"):
        gk.gp.label_regression(model, noise_sds=(1.0, -0.5))
    # differentiable in the kernel (the best sd is picked by array operations): central differences (the values
    # and the gradient come from one compiled program)
    lr_z = jax.jit(jax.value_and_grad(lambda ell: gk.gp.label_regression(
        gk.gp.model(K.SquaredExponential(1.0, ell), X, gk.potentials.Probit(y)), noise_sds=sds).log_z))
    h = 1e-5
    np.testing.assert_allclose(lr_z(1.0)[1], (lr_z(1.0 + h)[0] - lr_z(1.0 - h)[0]) / (2 * h), rtol=1e-6)
