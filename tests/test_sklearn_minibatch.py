"""`batch_size=` in the GP estimators: the sparse GP fitted by minibatches (`gk.gp.fit_sparse_minibatch`) against
the full-data sparse fit with the same inducing inputs, the scikit-learn protocol with the new parameters, bad
input and the unconverged path."""

import warnings

import numpy as np
import pytest
from sklearn.base import clone
from sklearn.exceptions import ConvergenceWarning

import gkl_jax as gk
from gkl_jax.sklearn import GPClassifier, GPRegressor, MulticlassGPClassifier

KERNEL = gk.kernels.SquaredExponential(1.0, 1.0)


def _problem(n, seed=0, regression=False):
    rng = np.random.default_rng(seed)
    X = rng.uniform(-3, 3, size=(n, 2))
    f = np.sin(2 * X[:, 0]) + np.cos(1.5 * X[:, 1])
    if regression:
        return X, f + 0.3 * rng.normal(size=n)
    return X, (rng.uniform(size=n) < 1 / (1 + np.exp(-3 * f))).astype(int)


@pytest.fixture(scope="module")
def small():
    X, y = _problem(120)
    return X, y, X[np.arange(0, 120, 15)]      # 8 inducing inputs, rows of X


@pytest.mark.slow
def test_full_batch_gives_the_full_data_sparse_optimum(small):
    """Oracle: with batch_size = n and fixed hyperparameters the minibatch fit is deterministic gradient ascent
    on the full-data sparse bound, so it must reach the full-data sparse fit's optimum (same kernel, same Z; the
    bounds agreed to 1e-14 relative when written)."""
    X, y, Z = small
    common = dict(kernel=KERNEL, num_inducing=len(Z), inducing=Z, learn_hyperparameters=False)
    full = GPClassifier(**common).fit(X, y)
    mb = GPClassifier(**common, batch_size=len(y), num_epochs=1500).fit(X, y)
    assert mb.converged_ and full.converged_
    assert abs(mb.log_evidence_ - full.log_evidence_) <= 1e-8 * abs(full.log_evidence_)
    np.testing.assert_allclose(mb.predict_proba(X), full.predict_proba(X), atol=1e-6)
    np.testing.assert_array_equal(mb.inducing_inputs_, Z)


@pytest.mark.slow
def test_gaussian_full_batch_approaches_titsias_bound(small):
    """Oracle: the Gaussian regressor's sparse log_evidence_ is Titsias' collapsed bound, the maximum over q of the
    uncollapsed bound that the minibatch fit climbs: equal at the optimum (1e-13 relative when written)."""
    X, _, Z = small
    _, y = _problem(120, regression=True)
    common = dict(kernel=KERNEL, num_inducing=len(Z), inducing=Z, learn_hyperparameters=False, noise=0.1)
    full = GPRegressor(**common).fit(X, y)
    mb = GPRegressor(**common, batch_size=len(y), num_epochs=1500).fit(X, y)
    assert mb.log_evidence_ <= full.log_evidence_ + 1e-8 * abs(full.log_evidence_)
    assert full.log_evidence_ - mb.log_evidence_ <= 1e-8 * abs(full.log_evidence_)
    np.testing.assert_allclose(mb.predict(X), full.predict(X), atol=1e-6)
    assert mb.noise_ == pytest.approx(0.1)


@pytest.mark.slow
def test_minibatch_ml2_predicts_as_the_full_sparse_ml2():
    """Real minibatches (B = n / 6) with the kernel learned jointly: the test predictive is that of the full-data
    sparse ML-II fit with the same M and the same (k-means++) inducing inputs, within stochastic-optimisation
    tolerance."""
    X, y = _problem(600)
    Xt, yt = _problem(500, seed=1)
    full = GPClassifier(num_inducing=20).fit(X, y)
    mb = GPClassifier(num_inducing=20, batch_size=100, num_epochs=100).fit(X, y)
    np.testing.assert_array_equal(mb.inducing_inputs_, full.inducing_inputs_)

    def test_ll(est):
        p = est.predict_proba(Xt)[np.arange(len(yt)), yt]
        return float(np.mean(np.log(p)))

    assert abs(test_ll(mb) - test_ll(full)) < 0.01                  # 7e-4 when written
    assert np.max(np.abs(mb.predict_proba(Xt) - full.predict_proba(Xt))) < 0.05     # 0.016 when written
    assert mb.score(Xt, yt) >= full.score(Xt, yt) - 0.02


def test_clone_and_get_params_keep_the_new_parameters():
    for est in (GPClassifier(batch_size=64, num_epochs=2.5, verbose=1),
                GPRegressor(likelihood="laplace", batch_size=32, num_epochs=3, verbose=True)):
        params = clone(est).get_params()
        assert (params["batch_size"], params["num_epochs"], params["verbose"]) == \
            (est.batch_size, est.num_epochs, est.verbose)
        assert clone(est).set_params(batch_size=None).batch_size is None
    assert GPClassifier().get_params()["batch_size"] is None
    assert "batch_size" not in MulticlassGPClassifier().get_params()


@pytest.mark.parametrize("batch_size", [0, -3, 41, 2.5, True, "64"])
@pytest.mark.parametrize("cls", [GPClassifier, GPRegressor])
def test_bad_batch_size_is_a_value_error_naming_it(cls, batch_size):
    X, y = _problem(40, regression=cls is GPRegressor)
    with pytest.raises(ValueError, match="batch_size"):
        cls(batch_size=batch_size, learn_hyperparameters=False).fit(X, y)


def test_other_bad_minibatch_settings():
    X, y = _problem(40)
    with pytest.raises(ValueError, match="batch_size"):       # the minibatch route needs the sparse GP
        GPClassifier(batch_size=10, num_inducing="all").fit(X, y)
    for epochs in (0, -1.0, np.inf, "two", True):
        with pytest.raises(ValueError, match="num_epochs"):
            GPClassifier(batch_size=10, num_epochs=epochs).fit(X, y)
    with pytest.raises(ValueError, match="num_inducing"):
        GPClassifier(batch_size=10, num_inducing=41).fit(X, y)


@pytest.mark.slow
def test_an_unconverged_minibatch_fit_says_so(small):
    X, y, Z = small
    est = GPClassifier(KERNEL, num_inducing=len(Z), inducing=Z, batch_size=30, num_epochs=0.5)
    with pytest.warns(ConvergenceWarning, match="converged_=False"):
        est.fit(X, y)
    assert est.converged_ is False
    assert np.isfinite(est.log_evidence_)
    with warnings.catch_warnings():
        warnings.simplefilter("error")     # the library's own warning is folded into the estimator's one
        reg = GPRegressor(KERNEL, num_inducing=len(Z), inducing=Z, batch_size=30, num_epochs=0.5)
        with pytest.raises(ConvergenceWarning):
            reg.fit(X, _problem(120, regression=True)[1])
