"""`progress=` on the minibatch fits (`gk.gp.fit_sparse_minibatch`, `gk.stochastic.fit_minibatch`),
`learn_likelihood` by name, and `verbose=` on the five scikit-learn estimators."""

import warnings

import numpy as np
import pytest

import gkl_jax as gk
from gkl_jax.sklearn import (
    BayesianLogisticRegression,
    BayesianRegression,
    GPClassifier,
    GPRegressor,
    MulticlassGPClassifier,
)

KERNEL = gk.kernels.SquaredExponential(1.0, 1.0)


def _data(n=80, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.uniform(-3, 3, size=(n, 2))
    f = np.sin(2 * X[:, 0]) + np.cos(1.5 * X[:, 1])
    return X, f, np.where(f + 0.5 * rng.normal(size=n) > 0, 1.0, -1.0)


def test_sparse_minibatch_progress_reports_the_estimates_and_the_final_bound():
    X, f, _ = _data()
    infos = []
    fit = gk.gp.fit_sparse_minibatch(KERNEL, X, gk.potentials.Gaussian(f, 0.1), num_inducing=8, batch_size=20,
                                     num_steps=250, progress=infos.append)
    steps = [i.step for i in infos if not i.done]
    assert steps == list(range(3, 250, 3)) + [250]        # every ceil(250 / 100) = 3 steps, and the last
    history = np.asarray(fit.result.history)
    np.testing.assert_allclose([i.bound for i in infos if not i.done], history[np.asarray(steps) - 1], rtol=1e-12)
    last = infos[-1]
    assert last.done and last.solver == "minibatch" and last.step == 250
    assert last.bound == pytest.approx(float(fit.result.log_z), rel=1e-12)
    assert last.status == int(fit.result.status)
    assert last.gradient == pytest.approx(float(fit.grad_max) / len(f), rel=1e-12)


def test_progress_errors_and_a_raising_callable():
    X, f, y = _data()
    lik = gk.potentials.Gaussian(f, 0.1)
    model = gk.Model(gk.priors.Isotropic(2, 1.0), gk.Sites(X, gk.potentials.Logistic(y)))
    for bad in ("yes", 1, object()):
        with pytest.raises(ValueError, match="progress"):
            gk.gp.fit_sparse_minibatch(KERNEL, X, lik, num_inducing=8, batch_size=20, num_steps=2, progress=bad)
        with pytest.raises(ValueError, match="progress"):
            gk.stochastic.fit_minibatch(model, batch_size=20, num_steps=2, progress=bad)

    class Stop(Exception):
        pass

    def stop(info):
        raise Stop(info.step)

    with pytest.raises(Stop):
        gk.gp.fit_sparse_minibatch(KERNEL, X, lik, num_inducing=8, batch_size=20, num_steps=4, progress=stop)
    with pytest.raises(Stop):
        gk.stochastic.fit_minibatch(model, batch_size=20, num_steps=4, progress=stop)


def test_glm_minibatch_progress(capsys):
    X, _, y = _data(200)
    model = gk.Model(gk.priors.Isotropic(2, 1.0), gk.Sites(X, gk.potentials.Logistic(y)))
    infos = []
    result = gk.stochastic.fit_minibatch(model, batch_size=50, num_steps=40, progress=infos.append)
    assert [i.step for i in infos] == list(range(1, 41)) + [40]
    assert infos[-1].done and infos[-1].bound == pytest.approx(float(result.log_z), rel=1e-12)
    np.testing.assert_allclose([i.bound for i in infos[:-1]], np.asarray(result.history)[:40], rtol=1e-12)
    gk.stochastic.fit_minibatch(model, batch_size=50, num_steps=40, progress=True)
    err = capsys.readouterr().err
    assert "gkl_jax.stochastic.fit_minibatch: minibatch step 40" in err and "bound" in err
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        silent = gk.stochastic.fit_minibatch(model, batch_size=50, num_steps=40)
    assert capsys.readouterr().err == ""
    assert float(silent.log_z) == float(result.log_z)     # progress changes nothing in the fit


def test_learn_likelihood_by_name_keeps_the_others_fixed():
    X, f, _ = _data()
    lik = gk.potentials.StudentT(f, 4.0, 0.5)
    fit = gk.gp.fit_sparse_minibatch(KERNEL, X, lik, num_inducing=8, batch_size=20, num_steps=50,
                                     learn_likelihood=("scale",))
    assert float(fit.likelihood.dof) == 4.0 and float(fit.likelihood.scale) != 0.5
    both = gk.gp.fit_sparse_minibatch(KERNEL, X, lik, num_inducing=8, batch_size=20, num_steps=50)
    assert float(both.likelihood.dof) != 4.0
    for bad in (("dof", "nu"), ("y",), 3):
        with pytest.raises(ValueError, match="learn_likelihood"):
            gk.gp.fit_sparse_minibatch(KERNEL, X, lik, num_inducing=8, batch_size=20, num_steps=2,
                                       learn_likelihood=bad)


FIVE = [BayesianLogisticRegression(), BayesianRegression(), GPClassifier(), GPRegressor(), MulticlassGPClassifier()]


@pytest.mark.parametrize("est", FIVE, ids=lambda e: type(e).__name__)
@pytest.mark.parametrize("verbose", [-1, 0.5, "yes", None])
def test_bad_verbose_is_a_value_error_at_fit(est, verbose):
    X, f, y = _data(20)
    target = f if "Regress" in type(est).__name__ else y
    est = est.set_params(verbose=verbose)      # accepted at construction (scikit-learn), refused at fit
    with pytest.raises(ValueError, match="verbose"):
        est.fit(X, target)


@pytest.mark.slow
def test_verbose_prints_the_estimator_and_the_fit_lines(capsys):
    X, f, y = _data(60)
    GPClassifier(KERNEL, learn_hyperparameters=False, verbose=1).fit(X, y)
    err = capsys.readouterr().err
    assert "GPClassifier: 1 binary problem(s), dense GP on n = 60 rows" in err
    assert "GPClassifier: fit done in" in err and "gkl_jax.fit:" in err
    GPRegressor(KERNEL, learn_hyperparameters=False, num_inducing=6, batch_size=20, num_epochs=2,
                verbose=True).fit(X, f)
    err = capsys.readouterr().err
    assert "minibatches of 20" in err and "gkl_jax.gp.fit_sparse_minibatch: minibatch step 6" in err
    BayesianLogisticRegression(verbose=2).fit(X, y)
    err = capsys.readouterr().err
    assert "BayesianLogisticRegression: fit done in" in err and "gkl_jax.fit:" in err
    MulticlassGPClassifier(learn_hyperparameters=False, verbose=1).fit(X, (f > 0.5).astype(int) + (f > -0.5))
    assert "MulticlassGPClassifier: 3 classes" in capsys.readouterr().err
    BayesianRegression(verbose=True).fit(X, f)
    assert "BayesianRegression: fit done in" in capsys.readouterr().err
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        GPClassifier(KERNEL, learn_hyperparameters=False).fit(X, y)
    assert capsys.readouterr().err == ""


def _quiet_and_loud(capsys, make, X, y):
    """(log evidence of make(verbose=0).fit, that of make(verbose=1).fit, what the loud fit wrote on stderr)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        quiet = make(verbose=0).fit(X, y).log_evidence_
        capsys.readouterr()
        loud = make(verbose=1).fit(X, y).log_evidence_
    return quiet, loud, capsys.readouterr().err


@pytest.mark.slow
def test_verbose_shows_the_ml2_steps_of_the_gp_estimators(capsys):
    """With ML-II (the default) the outer steps are shown, and the fit equals the silent one."""
    X, f, y = _data(60)
    quiet, loud, err = _quiet_and_loud(capsys, lambda verbose: GPClassifier(max_steps=5, verbose=verbose), X, y)
    assert "gkl_jax.sklearn ML-II: HyperSolver step 1 " in err and "(max_steps_reached)" in err
    assert loud == quiet
    X3 = np.c_[X[:30], X[:30] ** 2]
    y3 = (f[:30] > 0.5).astype(int) + (f[:30] > -0.5)
    quiet, loud, err = _quiet_and_loud(capsys, lambda verbose: MulticlassGPClassifier(max_steps=2, verbose=verbose),
                                       X3, y3)
    assert "gkl_jax.multiclass.fit_hyperparameters: " in err
    assert loud == quiet
    for est, target in ((BayesianLogisticRegression(learn_prior_variance=True), y),
                        (BayesianRegression(likelihood="student-t"), f), (BayesianRegression(), f)):
        quiet, loud, err = _quiet_and_loud(capsys, lambda verbose: est.set_params(verbose=verbose), X, target)
        assert "gkl_jax.sklearn ML-II:" in err and "(successful)" in err     # off a terminal: <= a line a second
        assert loud == pytest.approx(quiet, abs=1e-9)     # another compiled program: round-off apart
