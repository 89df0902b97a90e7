"""A GP estimator's first fit compiles one program (`gkl_jax.sklearn._gp_ml2`): the ML-II loop with the fitted
Result and prior, the same optimum as `gkl_jax.gp.fit_hyperparameters`; a second fit in the bucket compiles
nothing."""

import jax
import numpy as np
import pytest

from gkl_jax.gp import fit_hyperparameters
from gkl_jax.kernels import SquaredExponential
from gkl_jax.sklearn import GPClassifier, _gp_ml2
from gkl_jax.sklearn._gp_model import GPBuild, pad_rows, rows_bucket

jax.config.update("jax_enable_x64", True)

COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"


def _data(n, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.uniform(-3, 3, size=(n, 2))
    return X, (np.sin(1.5 * X[:, 0]) + 0.5 * X[:, 1] + 0.4 * rng.normal(size=n) > 0).astype(int)


class _Compiles:
    """Names of the programs XLA compiles inside the `with` block."""

    def __enter__(self):
        self.names = []
        self._listener = lambda event, duration, **kw: (self.names.append(kw.get("fun_name"))
                                                        if event == COMPILE_EVENT else None)
        jax.monitoring.register_event_duration_secs_listener(self._listener)
        return self

    def __exit__(self, *exc):
        jax.monitoring.unregister_event_duration_listener(self._listener)


@pytest.mark.filterwarnings("ignore:GPClassifier.*did not converge")
def test_first_fit_compiles_one_program_and_a_second_fit_none():
    """After a fit in another bucket (the process's shape-independent scalar operations compiled), a first fit
    in a new bucket compiles exactly one program, and a fit of another size in that bucket none."""
    X, y = _data(120)
    GPClassifier(max_steps=2).fit(X[:33], y[:33])                      # another bucket: rows_bucket(33) = 36
    assert rows_bucket(33) != rows_bucket(50) == rows_bucket(51)
    with _Compiles() as first:
        GPClassifier(max_steps=3).fit(X[:50], y[:50])
    with _Compiles() as second:
        GPClassifier(max_steps=3).fit(X[60:111], y[60:111])
    assert len(first.names) == 1, first.names
    assert second.names == []


@pytest.mark.parametrize("rows_limit", [1024, 0])
def test_one_program_reaches_fit_hyperparameters_optimum(monkeypatch, rows_limit):
    """The estimator's ML-II (either compiler setting) ends where `fit_hyperparameters` does on the same padded
    model: the same log Z and kernel to round-off, and the prior it returns is the model's at the optimum."""
    monkeypatch.setattr(_gp_ml2, "QUICK_COMPILE_MAX_ROWS", rows_limit)
    X, y = _data(45, seed=3)
    clf = GPClassifier().fit(X, y)
    n_pad = rows_bucket(45)
    build = GPBuild(pad_rows(X, n_pad), pad_rows(np.where(y == 1, 1.0, -1.0), n_pad, 1.0), np.arange(n_pad) < 45,
                    np.asarray(1.0), "logistic", 1e-6, False)
    params = {"kernel": SquaredExponential(1.0, 1.0), "log_noise": np.asarray(0.0)}
    hyper = fit_hyperparameters(build, params, filter_spec={"kernel": True, "log_noise": False})
    assert clf.converged_ and hyper.converged
    np.testing.assert_allclose(clf.log_evidence_, float(hyper.log_z), rtol=1e-12, atol=1e-9)
    np.testing.assert_allclose(clf.kernel_.variance, hyper.params["kernel"].variance, rtol=1e-7)
    np.testing.assert_allclose(clf.kernel_.lengthscale, hyper.params["kernel"].lengthscale, rtol=1e-7)
    result, prior = clf._fits[0]
    np.testing.assert_allclose(np.asarray(prior.covariance), np.asarray(hyper.model.prior.covariance), atol=1e-9)
    np.testing.assert_allclose(np.asarray(result.q.mean), np.asarray(hyper.result.q.mean), atol=1e-7)
