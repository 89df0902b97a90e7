"""gkl_jax.sklearn's BayesianRegression against closed forms: the Gaussian evidence and predictive, the
plug-in intercept (scikit-learn's BayesianRidge) and its sd, robust likelihoods, ML-II and the joint model."""

import warnings

import jax.numpy as jnp
import numpy as np
import pytest
from sklearn.linear_model import BayesianRidge

import gkl_jax as gk
from gkl_jax.sklearn import BayesianRegression


def _gaussian_evidence(H, z, prior_var, noise):
    K = H @ np.diag(prior_var) @ H.T + noise * np.eye(len(z))
    sign, logdet = np.linalg.slogdet(K)
    return -0.5 * (logdet + z @ np.linalg.solve(K, z) + len(z) * np.log(2 * np.pi))


@pytest.mark.slow
def test_gaussian_regression_evidence_and_predictive_are_closed_form():
    """With intercept_variance given, the intercept is a weight with that prior, integrated: the evidence, the
    coefficients and the predictive are the conjugate closed forms."""
    rng = np.random.default_rng(2)
    X = rng.normal(size=(30, 2))
    y = 3.0 + X @ np.array([2.0, -1.0]) + 0.5 * rng.normal(size=30)
    reg = BayesianRegression(learn_prior_variance=False, learn_noise=False, prior_variance=0.5, noise=0.2,
                             intercept_variance=100.0).fit(X, y)
    shift, scale = np.median(y), np.std(y)
    H = np.hstack([X, np.ones((30, 1))])
    prior = np.array([0.5, 0.5, 100.0])
    expected = _gaussian_evidence(H, (y - shift) / scale, prior, 0.2) - 30 * np.log(scale)
    assert abs(reg.log_evidence_ - expected) < 1e-8
    A = H.T @ H / 0.2 + np.diag(1 / prior)
    S = np.linalg.inv(A)
    m = S @ H.T @ ((y - shift) / scale) / 0.2
    np.testing.assert_allclose(reg.coef_, m[:2] * scale, rtol=1e-8)
    Xt = rng.normal(size=(4, 2))
    Ht = np.hstack([Xt, np.ones((4, 1))])
    mean, sd = reg.predict(Xt, return_std=True)
    np.testing.assert_allclose(mean, (Ht @ m) * scale + shift, rtol=1e-8)
    np.testing.assert_allclose(sd, np.sqrt(np.einsum("nd,de,ne->n", Ht, S, Ht) + 0.2) * scale, rtol=1e-8)


def test_gaussian_regression_plug_in_intercept_is_bayesian_ridge():
    """The default Gaussian regression centres X and y, its intercept's mean is mean(y) - mean(x)^T E[w]: its
    evidence and coefficients are the closed forms on the centred data, its intercept's sd that of mean(x)^T w
    and the intercept's own noise / n (flat prior), and with ML-II it is scikit-learn's BayesianRidge (the same
    noise and prior variance; the predictive variance larger by noise / n)."""
    rng = np.random.default_rng(2)
    X = rng.normal(size=(30, 2)) + np.array([1.5, -2.0])
    y = 3.0 + X @ np.array([2.0, -1.0]) + 0.5 * rng.normal(size=30)
    reg = BayesianRegression(learn_prior_variance=False, learn_noise=False, prior_variance=0.5, noise=0.2).fit(X, y)
    x_mean, shift, scale = X.mean(0), y.mean(), np.std(y)
    Xc, z = X - x_mean, (y - y.mean()) / np.std(y)
    assert abs(reg.log_evidence_ - (_gaussian_evidence(Xc, z, np.array([0.5, 0.5]), 0.2) - 30 * np.log(scale))) < 1e-8
    S = np.linalg.inv(Xc.T @ Xc / 0.2 + np.eye(2) / 0.5)
    m = S @ Xc.T @ z / 0.2
    np.testing.assert_allclose(reg.coef_, m * scale, rtol=1e-8)
    assert abs(reg.intercept_ - (shift - x_mean @ m * scale)) < 1e-8
    assert abs(reg.intercept_std_ - np.sqrt(x_mean @ S @ x_mean + 0.2 / 30) * scale) < 1e-8
    Xt = rng.normal(size=(4, 2))
    mean, sd = reg.predict(Xt, return_std=True)
    np.testing.assert_allclose(mean, reg.intercept_ + Xt @ reg.coef_, rtol=1e-8)
    np.testing.assert_allclose(
        sd, np.sqrt(np.einsum("nd,de,ne->n", Xt - x_mean, S, Xt - x_mean) + 0.2 + 0.2 / 30) * scale, rtol=1e-8)
    # ML-II: a stationary point of the centred closed-form evidence, and BayesianRidge's optimum
    learned = BayesianRegression(tol=1e-8).fit(X, y)
    assert learned.log_evidence_ > reg.log_evidence_ and learned.converged_
    evidence = lambda a, b: _gaussian_evidence(Xc, z, np.array([np.exp(a), np.exp(a)]), np.exp(b))
    a, b, h = np.log(learned.prior_variance_), np.log(learned.noise_), 1e-4
    assert abs(evidence(a, b) - 30 * np.log(scale) - learned.log_evidence_) < 1e-8
    grad = [(evidence(a + h, b) - evidence(a - h, b)) / (2 * h), (evidence(a, b + h) - evidence(a, b - h)) / (2 * h)]
    curvature = abs(evidence(a + 0.5, b) - 2 * evidence(a, b) + evidence(a - 0.5, b)) / 0.25
    assert max(abs(g) for g in grad) < 1e-3 * max(curvature, 1.0), (grad, curvature)
    ridge = BayesianRidge(tol=1e-12, max_iter=10000).fit(X, y)
    np.testing.assert_allclose(learned.coef_, ridge.coef_, rtol=1e-4)
    assert abs(learned.intercept_ - ridge.intercept_) < 1e-4
    np.testing.assert_allclose(learned.noise_ * scale**2, 1 / ridge.alpha_, rtol=1e-4)
    ridge_mean, ridge_sd = ridge.predict(Xt, return_std=True)
    mean, sd = learned.predict(Xt, return_std=True)
    np.testing.assert_allclose(mean, ridge_mean, rtol=1e-4)
    np.testing.assert_allclose(sd**2, ridge_sd**2 + learned.noise_ * scale**2 / 30, rtol=1e-4)


@pytest.mark.parametrize("centred", [True, False])
def test_gaussian_regression_intercept_sd_is_the_flat_prior_closed_form(centred):
    """Issue 64: `intercept_std_` (and coef_, covariance_, the predictive and its log density) are those of the
    conjugate Gaussian linear regression with a flat prior on the intercept, computed on the uncentred design
    [X, 1] with zero prior precision on the intercept: on centred inputs the intercept's sd is sqrt(noise / n),
    not 0."""
    rng = np.random.default_rng(7)
    n, v, noise = 25, 0.7, 0.3
    X = rng.normal(size=(n, 3)) * np.array([1.0, 2.0, 0.5]) + np.array([3.0, -1.0, 10.0])
    X = X - X.mean(0) if centred else X
    y = 5.0 + X @ np.array([1.0, -0.5, 2.0]) + 0.4 * rng.normal(size=n)
    reg = BayesianRegression(prior_variance=v, noise=noise, learn_prior_variance=False, learn_noise=False).fit(X, y)
    s2 = np.std(y) ** 2       # prior and noise are in standardised units: in y's units they scale by sd(y)^2
    H = np.hstack([X, np.ones((n, 1))])
    precision = H.T @ H / (noise * s2) + np.diag([1 / (v * s2)] * 3 + [0.0])
    cov = np.linalg.inv(precision)
    mean = cov @ H.T @ y / (noise * s2)
    np.testing.assert_allclose(reg.coef_, mean[:3], rtol=1e-8, atol=1e-10)
    assert abs(reg.intercept_ - mean[3]) < 1e-8 * max(1.0, abs(mean[3]))
    assert abs(reg.intercept_std_ - np.sqrt(cov[3, 3])) < 1e-8 * np.sqrt(cov[3, 3])
    np.testing.assert_allclose(reg.covariance_, cov, rtol=1e-7, atol=1e-12)
    if centred:
        assert abs(reg.intercept_std_ - np.sqrt(noise * s2 / n)) < 1e-8
    Ht = np.hstack([rng.normal(size=(4, 3)) + X.mean(0), np.ones((4, 1))])
    pred_mean, pred_sd = reg.predict(Ht[:, :3], return_std=True)
    pred_var = np.einsum("nd,de,ne->n", Ht, cov, Ht) + noise * s2
    np.testing.assert_allclose(pred_mean, Ht @ mean, rtol=1e-8)
    np.testing.assert_allclose(pred_sd, np.sqrt(pred_var), rtol=1e-8)
    yt = Ht @ mean + 0.3
    np.testing.assert_allclose(reg.log_predictive_density(Ht[:, :3], yt),
                               -0.5 * np.log(2 * np.pi * pred_var) - 0.5 * (yt - Ht @ mean) ** 2 / pred_var, rtol=1e-8)


@pytest.mark.slow
def test_robust_regression_resists_outliers():
    rng = np.random.default_rng(3)
    X = rng.normal(size=(60, 1))
    y = 1.0 + 2.0 * X[:, 0] + 0.1 * rng.normal(size=60)
    y[:6] += 30.0                                                  # gross outliers
    gauss = BayesianRegression().fit(X, y)
    robust = BayesianRegression("student-t", dof=3.0).fit(X, y)
    assert abs(robust.coef_[0] - 2.0) < 0.1 < abs(gauss.coef_[0] - 2.0) or abs(robust.intercept_ - 1.0) < abs(
        gauss.intercept_ - 1.0)
    assert abs(robust.coef_[0] - 2.0) < 0.1
    # fixed hyperparameters: log_evidence_ is gk.fit's bound on the unpadded model in the original units
    fixed = BayesianRegression("student-t", dof=3.0, prior_variance=0.5, noise=0.3, learn_prior_variance=False,
                               learn_noise=False, tol=1e-6).fit(X, y)   # gk.fit's default tolerance
    shift, scale = np.median(y), np.std(y)
    model = gk.Model(gk.priors.Diagonal(np.array([0.5, 100.0])),
                     gk.Sites(np.hstack([X, np.ones((60, 1))]), gk.potentials.StudentT((y - shift) / scale, 3.0, 0.3)))
    ref = gk.fit(model)
    assert abs(fixed.log_evidence_ - (float(ref.log_z) - 60 * np.log(scale))) < 1e-6
    np.testing.assert_allclose(fixed.coef_, np.asarray(ref.q.mean[:1]) * scale, atol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("likelihood, learn_noise", [("student-t", True), ("student-t", False), ("laplace", True)])
def test_robust_ml2_matches_fit_hyperparameters(likelihood, learn_noise):
    """The estimator's Student-t ML-II is one Newton-CG over (hyperparameters, m, C) from the Laplace
    approximation (`_joint`), the Laplace likelihood's the outer L-BFGS loop; `gk.gp.fit_hyperparameters` runs
    L-BFGS around inner fits from the prior and from other hyperparameters: the same optimum of the bound, with
    the noise learned or fixed. The coefficients and their sds are those of `gk.fit` at the learned
    hyperparameters."""
    rng = np.random.default_rng(5)
    X = rng.normal(size=(50, 2))
    y = X @ np.array([1.0, -0.5]) + 0.3 * rng.standard_t(4.0, size=50)
    y[:5] += 6.0
    est = BayesianRegression(likelihood, noise=None if learn_noise else 0.4, learn_noise=learn_noise).fit(X, y)
    assert est.converged_
    shift, scale = np.median(y), np.std(y)
    H = np.hstack([X, np.ones((50, 1))])
    z = (y - shift) / scale
    potential = (lambda s: gk.potentials.StudentT(z, 4.0, s)) if likelihood == "student-t" else \
        (lambda s: gk.potentials.Laplace(z, s))

    def build(p):
        prior = gk.priors.Diagonal(jnp.array([1.0, 1.0, 0.0]) * jnp.exp(p["a"]) + jnp.array([0.0, 0.0, 100.0]))
        return gk.Model(prior, gk.Sites(H, potential(jnp.exp(p.get("b", np.log(0.4))))))

    start = {"a": jnp.asarray(np.log(est.prior_variance_) + 0.3)}
    if learn_noise:
        start["b"] = jnp.asarray(np.log(est.noise_) - 0.3)
    ref = gk.gp.fit_hyperparameters(build, start)
    assert bool(ref.converged)
    assert abs(est.log_evidence_ - (float(ref.result.log_z) - 50 * np.log(scale))) < 1e-6
    learned = [float(ref.params["a"])] + ([float(ref.params["b"])] if learn_noise else [np.log(0.4)])
    np.testing.assert_allclose([np.log(est.prior_variance_), np.log(est.noise_)], learned, atol=1e-2)
    at = gk.fit(build({"a": jnp.log(est.prior_variance_), "b": jnp.log(est.noise_)}), tol=1e-9)
    mean, sd = np.asarray(at.q.mean), np.sqrt(np.diag(np.asarray(at.q.covariance())))
    np.testing.assert_allclose(est.coef_, mean[:2] * scale, atol=1e-5 * scale)
    np.testing.assert_allclose(est.coef_std_, sd[:2] * scale, rtol=1e-4)
    assert abs(est.intercept_ - (mean[2] * scale + shift)) < 1e-5 * scale


@pytest.mark.parametrize("likelihood", ["student-t", "logistic"])
def test_joint_model_bound_is_the_estimators_bound(likelihood):
    """`_joint.scaled_model`: the Student-t sites written as the unit-scale potential at (h / sigma)^T w - y / sigma
    (rows and offsets carry the noise), minus n log sigma, give the bound of the estimator's model at any q
    (random mean and Cholesky factor), padded rows and columns included; the logistic model is the estimator's."""
    from gkl_jax.sklearn import _joint, _ml2
    from gkl_jax.sklearn._common import pad_design
    from gkl_jax.sklearn._linear_model import _Build

    rng = np.random.default_rng(3)
    H = np.hstack([rng.normal(size=(20, 3)), np.ones((20, 1))])
    z = np.sign(rng.normal(size=20)) if likelihood == "logistic" else rng.normal(size=20)
    Hp, rows, cols = pad_design(H)
    yp = np.full(Hp.shape[0], 1.0 if likelihood == "logistic" else 0.0)
    yp[:20] = z
    intercept = np.arange(Hp.shape[1]) == 3
    scales = _ml2.scales(20, 3, likelihood, 4.0)
    build = _Build(jnp.asarray(Hp), jnp.asarray(yp), jnp.asarray(rows), jnp.asarray(cols), jnp.asarray(intercept),
                   jnp.asarray(50.0), jnp.asarray(4.0), jnp.asarray(scales), likelihood)
    u = jnp.asarray([scales[0] * np.log(0.7), scales[1] * np.log(0.3)])
    D = Hp.shape[1]
    m, C = rng.normal(size=D), np.triu(rng.normal(size=(D, D)) * 0.2) + np.eye(D)
    q = gk.Gaussian(jnp.asarray(m), gk.factors.Full(jnp.asarray(C)))
    model, constant = _joint.scaled_model(build, u)
    expected = gk.bound(build({"prior": u[0], "noise": u[1]}), q)
    np.testing.assert_allclose(gk.bound(model, q) - constant, expected, rtol=1e-12)
    np.testing.assert_allclose(constant, 0.0 if likelihood == "logistic" else 20 * np.log(0.3), atol=1e-12)


def test_joint_ml2_falls_back_to_the_outer_loop(monkeypatch):
    """Where the joint Newton does not settle within its step budget (here 1 step), the estimator runs the outer
    L-BFGS loop from the start instead: exactly the result with the joint path switched off, converged; with the
    default budget the joint optimum agrees with it to the stopping tolerance."""
    from gkl_jax.sklearn import _linear

    rng = np.random.default_rng(7)
    X = rng.normal(size=(30, 2))
    y = X @ np.array([0.5, -1.0]) + 0.5 * rng.standard_t(3, size=30)
    joint = BayesianRegression("student-t").fit(X, y)
    monkeypatch.setattr(_linear, "JOINT_MAX_STEPS", 1)
    fallback = BayesianRegression("student-t").fit(X, y)
    monkeypatch.setattr(_linear, "JOINT", ())
    ref = BayesianRegression("student-t").fit(X, y)
    assert joint.converged_ and fallback.converged_ and ref.converged_
    assert fallback.log_evidence_ == ref.log_evidence_ and np.array_equal(fallback.coef_, ref.coef_)
    assert abs(joint.log_evidence_ - ref.log_evidence_) < 1e-6


def test_laplace_regression_ml2_converges_on_a_padded_design():
    """Default ML-II with the Laplace likelihood: the design is padded with zero rows, where the Laplace expectation
    is not differentiable in s^2; its inner Newton fits once stalled there (200 steps, converged_=False)."""
    rng = np.random.default_rng(4)
    X = rng.normal(size=(70, 3))
    y = X @ np.array([1.0, -2.0, 0.5]) + 0.3 * rng.laplace(size=70)
    y[:7] += 10.0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        est = BayesianRegression("laplace").fit(X, y)
    assert est.converged_
    np.testing.assert_allclose(est.coef_, [1.0, -2.0, 0.5], atol=0.2)
