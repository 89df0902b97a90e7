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

import jax
import jax.flatten_util
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import special
from sklearn.base import clone
from sklearn.exceptions import NotFittedError
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
