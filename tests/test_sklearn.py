"""gkl_jax.sklearn: scikit-learn's estimator checks, closed-form oracles and bad input.

check_estimator runs ~50 checks of many data shapes; each new shape compiles a fit (5-30 s on the shared 2-core
machine). The linear estimators pad their designs to bucket sizes (at least 256 x 8), so their checks share a few
compilations; the GP estimators compile per training size. The whole sweep of every estimator and configuration
(`FULL`) is the extended tier (`pytest --extended`); the default run checks every estimator class in a small
setting through a subset of the checks (`SMALL`, `SUBSET`) and the fit-free protocol checks of every
configuration; the bad-input tests run always.
"""

import contextlib
import itertools
import subprocess
import sys
import warnings

import equinox as eqx
import jax
import jax.flatten_util
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import special
from sklearn.base import clone
from sklearn.exceptions import NotFittedError
from sklearn.linear_model import BayesianRidge
from sklearn.utils import estimator_checks as checks
from sklearn.utils.estimator_checks import parametrize_with_checks

import gkl_jax as gk
from gkl_jax._buckets import bucket
from gkl_jax.sklearn import (
    BayesianLogisticRegression,
    BayesianRegression,
    GPClassifier,
    GPRegressor,
    MulticlassGPClassifier,
)
from gkl_jax.sklearn._outputs import combine_one_vs_rest

# Every estimator and configuration (ML-II on and off): the whole check_estimator sweep, extended tier (each new
# data shape compiles a fit: tens of minutes on 2 cores).
FULL = [BayesianLogisticRegression(), BayesianLogisticRegression(learn_prior_variance=True), BayesianRegression(),
        BayesianRegression(learn_prior_variance=False, learn_noise=False),
        BayesianRegression("laplace", learn_prior_variance=False, learn_noise=False), BayesianRegression("student-t"),
        GPClassifier(max_steps=5), GPClassifier(learn_hyperparameters=False), GPRegressor(max_steps=5),
        GPRegressor(learn_hyperparameters=False), GPRegressor(likelihood="student-t", learn_hyperparameters=False),
        GPRegressor(likelihood="student-t", max_steps=3), MulticlassGPClassifier(learn_hyperparameters=False),
        MulticlassGPClassifier(max_steps=3)]

# Default run: every estimator class in a small fixed setting (hyperparameters fixed, or two ML-II steps for the
# Gaussian GPRegressor, whose ML-II compiles in seconds) through the checks that exercise fitting, prediction and
# input handling on a few data shapes (each new shape compiles a fit; check_dtype_object and
# check_fit_score_takes_y took 55-86 s each on the shared machine and run in the extended tier); the protocol
# checks that need no fit run for every configuration in `test_protocol_checks_without_fitting`.
SMALL = [BayesianLogisticRegression(), BayesianRegression("student-t", learn_prior_variance=False, learn_noise=False),
         GPClassifier(learn_hyperparameters=False), GPRegressor(max_steps=2),
         MulticlassGPClassifier(learn_hyperparameters=False)]
SUBSET = {"check_estimators_dtypes", "check_estimators_fit_returns_self", "check_n_features_in_after_fitting",
          "check_fit2d_predict1d", "check_estimators_nan_inf", "check_estimators_empty_data_messages",
          "check_fit_check_is_fitted", "check_complex_data", "check_fit1d", "check_classifiers_one_label",
          "check_supervised_y_2d"}


def _subset(estimators):
    cases = []
    for est in estimators:
        for e, check in checks.estimator_checks_generator(est, legacy=True):
            name = getattr(check, "func", check).__name__
            if name in SUBSET:
                cases.append(pytest.param(e, check, id=f"{type(e).__name__}-{name}"))
    return cases


@pytest.mark.slow
@pytest.mark.parametrize("estimator, check", _subset(SMALL))
def test_sklearn_checks_subset(estimator, check):
    check(estimator)


@pytest.mark.extended
@parametrize_with_checks(FULL)
def test_sklearn_checks_full(estimator, check):
    check(estimator)


@pytest.fixture(scope="module")
def logistic_data():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(40, 3))
    y = np.where(X @ np.array([1.5, -1.0, 0.0]) + 0.5 + rng.normal(size=40) > 0, "yes", "no")
    return X, y


@pytest.mark.slow
def test_logistic_matches_the_unpadded_fit_and_the_predictive_integral(logistic_data):
    X, y = logistic_data
    clf = BayesianLogisticRegression(prior_variance=2.0, intercept_variance=10.0).fit(X, y)
    assert list(clf.classes_) == ["no", "yes"] and clf.converged_
    H = np.hstack([X, np.ones((40, 1))])
    model = gk.Model(gk.priors.Diagonal(np.array([2.0, 2.0, 2.0, 10.0])),
                     gk.Sites(H, gk.potentials.Logistic(np.where(y == "yes", 1.0, -1.0))))
    ref = gk.fit(model)
    assert abs(clf.log_evidence_ - float(ref.log_z)) < 1e-6       # zero-row / zero-column padding is exact
    np.testing.assert_allclose(clf.coef_[0], ref.q.mean[:3], atol=1e-5)
    np.testing.assert_allclose(clf.coef_std_[0], np.sqrt(np.diag(ref.q.covariance()))[:3], atol=1e-5)
    # predict_proba = E[sigmoid(f)], f ~ N(h^T m, h^T S h), by dense Gauss-Hermite here
    Xt = np.random.default_rng(1).normal(size=(5, 3))
    Ht = np.hstack([Xt, np.ones((5, 1))])
    mu = Ht @ np.r_[clf.coef_[0], clf.intercept_]
    sd = np.sqrt(np.einsum("nd,de,ne->n", Ht, clf.covariance_[0], Ht))
    z, w = np.polynomial.hermite_e.hermegauss(80)
    p = special.expit(mu[:, None] + sd[:, None] * z) @ w / np.sqrt(2 * np.pi)
    np.testing.assert_allclose(clf.predict_proba(Xt)[:, 1], p, atol=1e-8)
    assert np.array_equal(clf.decision_function(Xt) > 0, clf.predict(Xt) == "yes")


@pytest.mark.slow
def test_logistic_learned_prior_variance_maximises_the_bound(logistic_data):
    X, y = logistic_data
    """ML-II runs jointly with q (`_joint`): the learned variance beats its neighbours, and the posterior is the
    fixed-variance fit's at the learned value."""
    clf = BayesianLogisticRegression(learn_prior_variance=True).fit(X, y)
    v = clf.prior_variance_
    for factor in (0.7, 1.4):
        other = BayesianLogisticRegression(prior_variance=v * factor).fit(X, y)
        assert other.log_evidence_ < clf.log_evidence_
    same = BayesianLogisticRegression(prior_variance=v, tol=1e-6).fit(X, y)
    assert clf.converged_ and abs(same.log_evidence_ - clf.log_evidence_) < 1e-8
    np.testing.assert_allclose(clf.coef_, same.coef_, atol=1e-5)   # both stop at a gradient test (1e-5, 1e-6)
    np.testing.assert_allclose(clf.coef_std_, same.coef_std_, rtol=1e-5)
    np.testing.assert_allclose(clf.intercept_, same.intercept_, atol=1e-5)


def test_one_vs_rest_probabilities(logistic_data):
    X, _ = logistic_data
    y = np.argmax(X @ np.array([[3.0, -3.0, 0.0], [0.0, 3.0, -3.0], [0.0, 0.0, 0.0]]), axis=1)
    clf = BayesianLogisticRegression().fit(X, y)
    p = clf.predict_proba(X)
    assert p.shape == (40, 3) and clf.coef_.shape == (3, 3) and clf.log_evidence_.shape == (3,)
    np.testing.assert_allclose(p.sum(axis=1), 1.0, rtol=1e-12)
    assert clf.score(X, y) > 0.85


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


def test_estimators_compute_in_float64_without_global_x64(logistic_data):
    X, y = logistic_data
    with jax.enable_x64(False):
        clf = BayesianLogisticRegression().fit(X, y)
        p = clf.predict_proba(X)
        assert jnp.zeros(1).dtype == jnp.float32                   # the caller's setting is untouched
    ref = BayesianLogisticRegression().fit(X, y)
    assert p.dtype == np.float64 and clf.coef_.dtype == np.float64
    np.testing.assert_allclose(p, ref.predict_proba(X), rtol=1e-12)


@pytest.mark.parametrize("est", [BayesianLogisticRegression(),
                                 BayesianRegression(learn_prior_variance=False, learn_noise=False)])
def test_bad_input(est, logistic_data):
    X, y = logistic_data
    y = (y == "yes").astype(float)
    with pytest.raises(NotFittedError):
        est.predict(X)
    bad = X.copy()
    bad[0, 0] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        est.fit(bad, y)
    with pytest.raises(ValueError):
        est.fit(X, y[:-1])
    with pytest.raises(ValueError):
        est.fit(X[:, 0], y)
    est.fit(X, y)
    with pytest.raises(ValueError, match="features"):
        est.predict(X[:, :2])


def test_bad_parameters_and_one_class(logistic_data):
    X, _ = logistic_data
    with pytest.raises(ValueError, match="class"):
        BayesianLogisticRegression().fit(X, np.ones(40))
    with pytest.raises(ValueError, match="likelihood"):
        BayesianRegression("cauchy").fit(X, X[:, 0])
    with pytest.raises(ValueError, match="prior_variance"):
        BayesianLogisticRegression(prior_variance=-1.0).fit(X, X[:, 0] > 0)
    with pytest.raises(ValueError, match="factor"):
        BayesianLogisticRegression(factor="banded").fit(X, X[:, 0] > 0)


@pytest.mark.slow
def test_gp_classifier_and_regressor_small():
    rng = np.random.default_rng(4)
    X = rng.uniform(-2, 2, size=(24, 1))
    y = np.where(np.sin(2 * X[:, 0]) > 0, 1, 0)
    clf = GPClassifier().fit(X, y)
    assert clf.score(X, y) > 0.9 and np.isfinite(clf.log_evidence_)
    # predict_proba = E[sigmoid(f_*)] over the dense GP predictive of q(f) = N(m, S), by Gauss-Hermite here
    result, prior = clf._fits[0]
    Xt = np.linspace(-2, 2, 7)[:, None]
    K = np.asarray(clf.kernel_.gram(X)) + 1e-6 * np.eye(24)
    Ks = np.asarray(clf.kernel_.gram(X, Xt))
    A = np.linalg.solve(K, Ks)
    m, S = np.asarray(result.q.mean)[:24], np.asarray(result.q.covariance())[:24, :24]   # the real rows of q
    kss = np.asarray(clf.kernel_.diag(Xt))
    mu = A.T @ m
    s2 = kss - np.einsum("nt,nt->t", Ks, A) + np.einsum("nt,nm,mt->t", A, S, A)
    zz, ww = np.polynomial.hermite_e.hermegauss(80)
    p = special.expit(mu[:, None] + np.sqrt(s2)[:, None] * zz) @ ww / np.sqrt(2 * np.pi)
    # (K of 24 points on a line is ill-conditioned: numpy's LU solve and the library's Cholesky agree to ~1e-4)
    np.testing.assert_allclose(clf.predict_proba(Xt)[:, 1], p, atol=2e-4)
    assert np.max(np.abs(special.expit(mu) - p)) > 2e-3           # the plug-in sigmoid(mu) would fail
    fixed = GPClassifier(kernel=clf.kernel_, learn_hyperparameters=False).fit(X, y)
    assert abs(fixed.log_evidence_ - clf.log_evidence_) < 1e-6
    yr = np.sin(2 * X[:, 0]) + 0.1 * rng.normal(size=24)
    reg = GPRegressor().fit(X, yr)
    # Gaussian likelihood: the exact log marginal likelihood of the learned kernel (original units)
    z = (yr - yr.mean()) / yr.std()
    K = np.asarray(reg.kernel_.gram(X)) + (reg.noise_ + 1e-6) * np.eye(24)
    sign, logdet = np.linalg.slogdet(K)
    lml = -0.5 * (logdet + z @ np.linalg.solve(K, z) + 24 * np.log(2 * np.pi)) - 24 * np.log(yr.std())
    assert abs(reg.log_evidence_ - lml) < 1e-5
    mean, sd = reg.predict(X[:3], return_std=True)
    assert np.all(sd > np.sqrt(reg.noise_) * yr.std() - 1e-9)


@pytest.mark.slow
def test_student_t_gp_regression_start_and_coordinates():
    """ML-II of GPRegressor("student-t") starts at the 1.4826 MAD of the Gaussian fit's leave-one-out residuals
    (brute force: each point predicted from the others) and runs in Fisher-scaled coordinates (`_gp_start`);
    it reaches the optimum of the unscaled loop from the old start (SE(1, median distance), scale 0.1)."""
    from gkl_jax.kernels import SquaredExponential, median_distance
    from gkl_jax.sklearn._gp_model import GPBuild
    from gkl_jax.sklearn._gp_start import FALLBACK_SCALE, ScaledBuild, fisher_factor, robust_scale, scaled_start

    rng = np.random.default_rng(7)
    X = rng.uniform(-2, 2, size=(40, 1))
    y = np.sin(2 * X[:, 0]) + 0.1 * rng.normal(size=40)
    y[:4] += 3.0                                                     # outliers
    gauss = GPRegressor().fit(X, y)
    z = (y - y.mean()) / y.std()
    params = {"kernel": gauss.kernel_, "log_noise": np.log(gauss.noise_)}
    scale = robust_scale(params, X, z, 1e-6)
    Ky = np.asarray(gauss.kernel_.gram(X)) + (gauss.noise_ + 1e-6) * np.eye(40)
    loo = np.array([z[i] - Ky[i, np.arange(40) != i] @ np.linalg.solve(Ky[np.ix_(np.arange(40) != i,
                                                                                 np.arange(40) != i)],
                                                                        z[np.arange(40) != i]) for i in range(40)])
    assert abs(scale - 1.4826 * np.median(np.abs(loo - np.median(loo)))) < 1e-8
    # R^T R is the Fisher information: the kernel block 1/2 tr(Ky^-1 dK_i Ky^-1 dK_j) by finite differences
    kernel = SquaredExponential(1.0, median_distance(X))
    R = fisher_factor(kernel, X, scale**2, 1e-6, 4.0)
    info = R.T @ R
    Ky = np.asarray(kernel.gram(X)) + (scale**2 + 1e-6) * np.eye(40)
    h, ls = 1e-6, float(kernel.log_lengthscale)
    dK = [np.asarray(kernel.gram(X)), (np.asarray(SquaredExponential(1.0, np.exp(ls + h)).gram(X))
                                       - np.asarray(SquaredExponential(1.0, np.exp(ls - h)).gram(X))) / (2 * h)]
    A = [np.linalg.solve(Ky, d) for d in dK]
    np.testing.assert_allclose(info[:2, :2], [[0.5 * np.trace(a @ b) for b in A] for a in A], rtol=1e-4)
    assert abs(info[2, 2] - 2 * 40 * 4.0 / 7.0) < 1e-9
    # a Gaussian fit whose K_y cannot be inverted (here a NaN noise): the old start, not a NaN
    assert robust_scale({"kernel": kernel, "log_noise": np.nan}, X, z, 0.0) == FALLBACK_SCALE
    back = ScaledBuild(None, np.linalg.inv(R), kernel).params(scaled_start(kernel, np.log(scale), R)["u"])
    assert abs(float(back["log_noise"]) - np.log(scale)) < 1e-10
    robust = GPRegressor(likelihood="student-t").fit(X, y)
    build = GPBuild(X, z, np.ones(40, bool), np.asarray(4.0), "student-t", 1e-6, False)   # unscaled, old start
    ref = gk.gp.fit_hyperparameters(build, {"kernel": kernel, "log_noise": np.log(0.1)}, method=gk.fit)
    assert robust.converged_ and ref.converged
    assert abs(robust.log_evidence_ - (float(ref.log_z) - 40 * np.log(y.std()))) < 1e-4
    assert abs(np.log(robust.noise_) - float(ref.params["log_noise"])) < 1e-3


def test_pickled_estimators_predict_the_same_with_x64_off():
    """A float64 JAX array unpickles as float32 where x64 is off: the estimators pickle numpy arrays instead
    (`HostState`), so a model saved with pickle or joblib predicts exactly as before."""
    import pickle

    rng = np.random.default_rng(5)
    X = rng.normal(size=(30, 2))
    y = X[:, 0] - 0.5 * X[:, 1] + 0.1 * rng.normal(size=30)
    labels = np.where(y > 0, "a", "b")
    for est, target in ((BayesianRegression(), y), (GPRegressor(likelihood="laplace", max_steps=3), y),
                        (GPClassifier(max_steps=3), labels), (MulticlassGPClassifier(max_steps=2), labels)):
        est.fit(X, target)
        with jax.enable_x64(False):
            loaded = pickle.loads(pickle.dumps(est))
        predict = (lambda e: e.predict_proba(X)) if hasattr(est, "predict_proba") else (lambda e: e.predict(X))
        np.testing.assert_array_equal(predict(loaded), predict(est))


def test_import_without_sklearn_is_a_clear_error():
    code = ("import sys; sys.modules['sklearn'] = None\n"
            "try:\n    import gkl_jax.sklearn\nexcept ImportError as e:\n    print(e)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "pip install 'gkl-jax[sklearn]'" in out.stdout


def test_bucket():
    assert [bucket(n) for n in (1, 16, 17, 100, 128, 129)] == [16, 16, 32, 128, 128, 256]
    # quarter octaves: at most 25% padding (diabetes' 331 x 11 design -> 384 x 12)
    assert [bucket(n, 256, 4) for n in (10, 257, 331, 385, 512, 513)] == [256, 320, 384, 448, 512, 640]
    assert [bucket(n, 8, 4) for n in (1, 9, 11, 17, 31)] == [8, 10, 12, 20, 32]


ALL = [BayesianLogisticRegression(), BayesianLogisticRegression(learn_prior_variance=True), BayesianRegression(),
       BayesianRegression("student-t", learn_noise=False), GPClassifier(), GPClassifier(likelihood="probit"),
       GPRegressor(), GPRegressor(likelihood="laplace"), MulticlassGPClassifier()]
PROTOCOL = [checks.check_no_attributes_set_in_init, checks.check_parameters_default_constructible,
            checks.check_get_params_invariance, checks.check_set_params, checks.check_estimator_cloneable,
            checks.check_estimator_repr, checks.check_estimators_unfitted,
            checks.check_do_not_raise_errors_in_init_or_set_params]


@pytest.mark.parametrize("est, check", list(itertools.product(ALL, PROTOCOL)),
                         ids=lambda x: getattr(x, "__name__", repr(x)))
def test_protocol_checks_without_fitting(est, check):
    """The scikit-learn checks that need no fit, for every estimator and configuration (the full
    check_estimator sweep is `test_sklearn_checks_full`, extended tier)."""
    check(type(est).__name__, clone(est))


@pytest.mark.parametrize("est", ALL, ids=repr)
def test_bad_input_of_every_estimator_is_a_value_error(est, logistic_data):
    X, y = logistic_data
    y = (y == "yes").astype(float)
    with pytest.raises(NotFittedError):
        est.predict(X)
    bad = X.copy()
    bad[0, 0] = np.inf
    with pytest.raises(ValueError, match="infinity"):
        clone(est).fit(bad, y)
    with pytest.raises(ValueError, match="inconsistent numbers of samples"):
        clone(est).fit(X, y[:-1])
    with pytest.raises(ValueError, match="2D array"):
        clone(est).fit(X[:, 0], y)
    with pytest.raises(ValueError, match="(?i)complex"):
        clone(est).fit(X + 1j, y)
    if hasattr(est, "predict_proba"):
        with pytest.raises(ValueError, match="class"):
            clone(est).fit(X, np.zeros(len(y)))


@pytest.mark.parametrize("est, param, value", [
    (BayesianLogisticRegression(), "intercept_variance", 0.0), (BayesianLogisticRegression(), "max_steps", 0),
    (BayesianLogisticRegression(), "tol", 0.0), (BayesianRegression("student-t"), "tol", -1.0),
    (BayesianRegression(), "noise", np.nan), (BayesianRegression(), "dof", -1.0),
    (BayesianRegression(), "likelihood", "cauchy"), (GPClassifier(), "likelihood", "gaussian"),
    (GPClassifier(), "kernel", "rbf"), (GPRegressor(), "jitter", -1.0), (GPRegressor(), "likelihood", "probit")])
def test_bad_parameters_name_the_parameter(est, param, value, logistic_data):
    X, y = logistic_data
    y = X[:, 0] > 0 if hasattr(est, "predict_proba") else X[:, 0]
    with pytest.raises(ValueError, match=param):
        clone(est).set_params(**{param: value}).fit(X, y)


def test_default_tolerance_reaches_the_tight_fit(logistic_data):
    """The default tol (1e-4, the fixed-hyperparameter fit and ML-II alike) against tol = 1e-9: the same evidence
    to 1e-7 nats and the same coefficients to 1e-4 posterior sds."""
    X, y = logistic_data
    z = X @ np.array([1.0, -0.5, 0.2]) + np.random.default_rng(1).standard_t(3, size=len(X))
    for make, target in ((lambda **k: BayesianLogisticRegression(**k), y),
                         (lambda **k: BayesianLogisticRegression(learn_prior_variance=True, **k), y),
                         (lambda **k: BayesianRegression("student-t", **k), z)):
        loose, tight = make().fit(X, target), make(tol=1e-9).fit(X, target)
        assert loose.converged_ and tight.converged_
        assert abs(loose.log_evidence_ - tight.log_evidence_) < 1e-7
        np.testing.assert_array_less(np.abs(loose.coef_ - tight.coef_), 1e-4 * tight.coef_std_)


def test_one_vs_rest_combination_is_the_exactly_one_positive_conditional():
    """p(class k) = p_k prod_{j != k} (1 - p_j) / sum_k (same), by brute force over the 2^K outcomes of K
    independent binary events restricted to those with exactly one positive."""
    p = np.random.default_rng(5).uniform(0.001, 0.999, size=(6, 4))
    expected = np.zeros_like(p)
    for bits in itertools.product([0, 1], repeat=4):
        if sum(bits) == 1:
            k = bits.index(1)
            expected[:, k] = np.prod(np.where(np.array(bits) == 1, p, 1 - p), axis=1)
    expected /= expected.sum(axis=1, keepdims=True)
    np.testing.assert_allclose(combine_one_vs_rest(p), expected, rtol=1e-12)
    assert np.all(np.isfinite(combine_one_vs_rest(np.array([[0.0, 1.0, 0.5], [1.0, 1.0, 0.0]]))))


@contextlib.contextmanager
def compilations():
    """The XLA compilations inside the block (jax's backend-compile events)."""
    events = []

    def listener(event, duration, **kwargs):
        if event == "/jax/core/compile/backend_compile_duration":
            events.append(duration)

    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        yield events
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)


def _fit_twice_counting(make, X, y, X2, y2, predict):
    getattr(make().fit(X, y), predict)(X)
    with compilations() as events:
        getattr(make().fit(X2, y2), predict)(X2)
    return len(events)


def test_compilation_counter_counts():
    with compilations() as events:
        jax.jit(lambda x: x * 3.0 + 1.0)(np.arange(7.0))
    assert len(events) >= 1


def test_second_logistic_fit_of_a_similar_shape_compiles_nothing(logistic_data):
    X, y = logistic_data
    rng = np.random.default_rng(6)
    X2 = rng.normal(size=(37, 3))                   # another size in the same padded bucket
    y2 = np.where(X2[:, 1] + rng.normal(size=37) > 0, "yes", "no")
    assert _fit_twice_counting(BayesianLogisticRegression, X, y, X2, y2, "predict_proba") == 0


@pytest.mark.slow
@pytest.mark.parametrize("make", [lambda: BayesianLogisticRegression(learn_prior_variance=True),
                                  BayesianRegression, lambda: BayesianRegression("student-t"),
                                  GPClassifier, GPRegressor, lambda: GPRegressor(likelihood="laplace")],
                         ids=["logistic-ml2", "gaussian-ml2", "student-t-ml2", "gpc-ml2", "gpr-ml2",
                              "gpr-laplace-ml2"])
def test_second_fit_of_the_same_shape_compiles_nothing(make):
    rng = np.random.default_rng(7)
    X, X2 = rng.uniform(-2, 2, size=(2, 24, 1))
    classifier = hasattr(make(), "predict_proba")
    f = lambda Z: np.sin(2 * Z[:, 0]) + 0.3 * rng.normal(size=24)
    y, y2 = (f(X) > 0, f(X2) > 0) if classifier else (f(X), f(X2))
    assert _fit_twice_counting(make, X, y, X2, y2, "predict_proba" if classifier else "predict") == 0


@pytest.mark.slow
def test_gp_evidence_gradient_is_the_closed_form():
    """GPRegressor's ML-II objective: log N(z | 0, K + (noise + jitter) I) and its custom-VJP gradient against the
    dense log-density and central finite differences in every log-parameter."""
    from scipy import stats

    from gkl_jax.sklearn import _ml2

    rng = np.random.default_rng(8)
    X, z = rng.normal(size=(9, 2)), rng.normal(size=9)
    params = {"kernel": gk.kernels.SquaredExponential(1.3, 0.7), "log_noise": jnp.log(jnp.asarray(0.2))}
    params, static = eqx.partition(params, eqx.is_inexact_array)
    objective = _ml2.GPEvidence(jnp.asarray(X), jnp.asarray(z), static, 1e-6)

    def dense(p):
        p = eqx.combine(p, static)
        K = np.asarray(p["kernel"].gram(X)) + (float(jnp.exp(p["log_noise"])) + 1e-6) * np.eye(9)
        return stats.multivariate_normal(np.zeros(9), K).logpdf(z)

    value, grad, res = objective(params, None, {})
    assert abs(-float(value) - dense(params)) < 1e-10 and bool(res.converged)
    flat, unravel = jax.flatten_util.ravel_pytree(params)
    g = np.asarray(jax.flatten_util.ravel_pytree(grad)[0])
    for i in range(flat.size):
        e = np.zeros(flat.size)
        e[i] = 1e-5
        fd = (dense(unravel(flat + e)) - dense(unravel(flat - e))) / 2e-5
        assert abs(-g[i] - fd) < 1e-6 * max(1.0, abs(fd)), (i, g[i], fd)
