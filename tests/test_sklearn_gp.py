"""gkl_jax.sklearn's GP estimators against closed forms: GPClassifier and GPRegressor on small data, the
Student-t GP regressor's start and coordinates, pickled estimators with x64 off, and the evidence gradient."""

import equinox as eqx
import jax
import jax.flatten_util
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import special

import gkl_jax as gk
from gkl_jax.sklearn import BayesianRegression, GPClassifier, GPRegressor, MulticlassGPClassifier


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
