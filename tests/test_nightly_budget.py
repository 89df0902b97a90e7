"""The nightly reliability budget (issue 63): GKL_NIGHTLY_CASES (default 1000) cases cycling through five
families, each case drawn from its own seed, each small and of a fixed shape so that one process compiles each
program once:

- `fit`: `gk.fit` on the issue's generators (`tests.test_reliability._reliability_case`: rotated quasi-separable
  targets under every factor, Poisson with prior means, Gaussian sites, estimator inputs);
- `gp`: `gk.gp` models (Gaussian sites against `gk.gp.exact`, sparse Gaussian sites against Titsias' collapsed
  bound, logistic sites against an independent solver and the local bound, Student-t sites against whitened
  L-BFGS) and bad `gk.gp` inputs;
- `baselines`: `gk.laplace`, `gk.ep`, `gk.local` (Gaussian sites: the exact evidence; logistic sites: finite, the
  local bound below G-KL's, Full >= Diagonal) and bad baseline settings;
- `multiclass`: `gk.multiclass.fit` (finite, at least Chai's Theorem 9 bound, invariant to relabelling the
  classes) and bad multiclass inputs;
- `estimators`: the scikit-learn estimators (finite outputs, probabilities summing to 1, linear evidences invariant
  to the order of the rows) and bad estimator inputs.

Invariants (the issue's list): no NaN on a valid model; `converged` implies optimal (an independent solver's
optimum, or a closed form); `log_z` equals `gk.bound` at q; all-Gaussian models equal the exact evidence; Full >=
Diagonal; bad input gets a ValueError naming the argument. GKL_PROPERTY_TALLY=path appends one JSON line per case.
"""

import json
import os
import warnings

import numpy as np
import pytest
from scipy import stats

import gkl_jax as gk
from tests.test_properties import Case, exact_gaussian_evidence
from tests.test_reliability import _reliability_case

NIGHTLY_CASES = int(os.environ.get("GKL_NIGHTLY_CASES", "1000"))
FAMILIES = ("fit", "gp", "baselines", "multiclass", "estimators")
GP_N, GP_Z = 16, 5          # the GP family's shape: N inputs in 1-D, Z inducing inputs
BASE_D, BASE_N = 3, 20      # the baselines' shape
MC_N, MC_C = 12, 3          # the multiclass shape


def _quiet(fn, *args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn(*args, **kwargs)


def _close(a, b, rtol):
    return abs(float(a) - float(b)) <= rtol * max(1.0, abs(float(b)))


def _check_result(model, res, what):
    """No NaN, and log_z == gk.bound(model, q) (a G-KL fit)."""
    log_z = float(res.log_z)
    assert np.isfinite(log_z), (what, log_z)
    assert np.all(np.isfinite(np.asarray(res.q.mean))), what
    assert _close(gk.bound(model, res.q), log_z, 1e-9), (what, float(gk.bound(model, res.q)), log_z)


def _raises_naming(name, fn, *args, **kwargs):
    """fn(*args) raises a ValueError whose message names `name`."""
    with pytest.raises(ValueError) as err:
        _quiet(fn, *args, **kwargs)
    assert name in str(err.value), (name, str(err.value))


# ------------------------------------------------------------------------------------------ gk.gp


def _gp_data(rng):
    X = np.sort(rng.uniform(-3, 3, GP_N))[:, None]
    f = np.sin(X[:, 0] * rng.uniform(0.5, 2.0))
    kernel = gk.kernels.SquaredExponential(float(10 ** rng.uniform(-1, 1)), float(10 ** rng.uniform(-0.5, 0.5)))
    return X, f, kernel


def _gp_case(rng, index, tally):
    kind = ("gaussian", "sparse", "logistic", "student_t", "bad")[(index // len(FAMILIES)) % 5]
    tally.update(kind=kind)
    X, f, kernel = _gp_data(rng)
    noise = float(10 ** rng.uniform(-2, 0))
    if kind == "gaussian":
        model = gk.gp.model(kernel, X, gk.potentials.Gaussian(f + noise * rng.standard_normal(GP_N), noise**2))
        res = _quiet(gk.fit, model)
        _check_result(model, res, kind)
        assert bool(res.converged) and _close(res.log_z, gk.gp.exact(model).log_z, 1e-8), kind
        tally.update(finite=1, bound_matches=1, exact_evidence=1)
    elif kind == "sparse":
        y = f + noise * rng.standard_normal(GP_N)
        Z = np.linspace(-3, 3, GP_Z)[:, None] + 0.1 * rng.standard_normal((GP_Z, 1))
        model = gk.gp.sparse_model(kernel, X, Z, gk.potentials.Gaussian(y, noise**2))
        res = _quiet(gk.fit, model)
        _check_result(model, res, kind)
        Kzz = np.asarray(kernel.gram(Z)) + 1e-6 * np.eye(GP_Z)
        Kxz = np.asarray(kernel.gram(X, Z))
        Q = Kxz @ np.linalg.solve(Kzz, Kxz.T)
        titsias = (stats.multivariate_normal(np.zeros(GP_N), Q + noise**2 * np.eye(GP_N)).logpdf(y)
                   - 0.5 * np.trace(np.asarray(kernel.gram(X)) - Q) / noise**2)
        assert bool(res.converged) and _close(res.log_z, titsias, 1e-6), (kind, float(res.log_z), titsias)
        tally.update(finite=1, bound_matches=1, exact_evidence=1)
    elif kind == "logistic":
        labels = np.where(f + rng.logistic(size=GP_N) > 0, 1.0, -1.0)
        model = gk.gp.model(kernel, X, gk.potentials.Logistic(labels))
        res = _quiet(gk.fit, model)
        _check_result(model, res, kind)
        ref = _quiet(gk.fit, model, solver=gk.solvers.Newton(), whiten=True, tol=1e-9)
        if bool(res.converged) and bool(ref.converged):
            assert _close(res.log_z, ref.log_z, 1e-7), (kind, float(res.log_z), float(ref.log_z))
            tally.update(converged_optimal=1)
        local = _quiet(gk.local, model)
        assert float(local.log_z) <= float(res.log_z) + 1e-7 * max(1.0, abs(float(res.log_z))), kind
        tally.update(finite=1, bound_matches=1, above_local=1)
    elif kind == "student_t":
        y = f + noise * rng.standard_t(3.0, GP_N)
        out = rng.choice(GP_N, int(rng.integers(0, 4)), replace=False)
        y[out] += rng.choice([-4.0, 4.0], len(out))
        model = gk.gp.model(kernel, X, gk.potentials.StudentT(y, 3.0, noise))
        res = _quiet(gk.fit, model)
        _check_result(model, res, kind)
        ref = _quiet(gk.fit, model, solver=gk.solvers.LBFGS(), whiten=True)
        if bool(res.converged):
            assert float(res.log_z) >= float(ref.log_z) - 1e-3, (kind, float(res.log_z), float(ref.log_z))
            tally.update(converged_optimal=1)
        tally.update(finite=1, bound_matches=1)
    else:
        lik = gk.potentials.Gaussian(f, noise**2)
        bad = X.copy()
        bad[int(rng.integers(GP_N))] = np.nan
        which = int(rng.integers(3))
        if which == 0:
            _raises_naming("X", gk.gp.model, kernel, bad, lik)
        elif which == 1:
            _raises_naming("jitter", gk.gp.model, kernel, X, lik, jitter=-float(10 ** rng.uniform(-8, 0)))
        else:
            _raises_naming("Z", gk.gp.sparse_model, kernel, X, np.c_[X[:GP_Z], X[:GP_Z]], lik)
        tally.update(value_error_names_argument=1)


# ------------------------------------------------------------------------------------------ the baselines


def _base_case(rng, index, tally):
    kind = ("gaussian", "logistic", "bad")[(index // len(FAMILIES)) % 3]
    tally.update(kind=kind)
    seed = int(rng.integers(1 << 30))
    if kind == "gaussian":
        case = Case(seed, BASE_D, BASE_N, "gaussian", str(rng.choice(["isotropic", "diagonal", "dense"])))
        model, exact = case.model(), exact_gaussian_evidence(case)
        for name, method in (("fit", gk.fit), ("laplace", gk.laplace), ("ep", gk.ep)):
            res = _quiet(method, model)
            assert np.isfinite(float(res.log_z)), name
            if bool(res.converged):
                assert _close(res.log_z, exact, 1e-7), (name, float(res.log_z), exact)
        tally.update(finite=1, exact_evidence=1)
    elif kind == "logistic":
        case = Case(seed, BASE_D, BASE_N, "logistic", "isotropic", str(rng.choice(["noisy", "separable"])))
        model = case.model()
        full = _quiet(gk.fit, model)
        diagonal = _quiet(gk.fit, model, gk.factors.Diagonal())
        for res, what in ((full, "full"), (diagonal, "diagonal")):
            _check_result(model, res, what)
        if bool(full.converged) and bool(diagonal.converged):
            assert float(full.log_z) >= float(diagonal.log_z) - 1e-8 * max(1.0, abs(float(full.log_z)))
            tally.update(full_ge_diagonal=1)
        local = _quiet(gk.local, model)
        assert float(local.log_z) <= float(full.log_z) + 1e-7 * max(1.0, abs(float(full.log_z)))
        for name, method in (("laplace", gk.laplace), ("ep", gk.ep)):
            res = _quiet(method, model)
            assert np.isfinite(float(res.log_z)) and np.all(np.isfinite(np.asarray(res.q.mean))), name
        tally.update(finite=1, bound_matches=1, above_local=1)
    else:
        model = Case(seed, BASE_D, BASE_N, "logistic").model()
        which = int(rng.integers(4))
        if which == 0:
            _raises_naming("damping", gk.ep, model, damping=float(rng.uniform(1.01, 5.0)))
        elif which == 1:
            _raises_naming("power", gk.ep, model, power=-float(rng.uniform(0.0, 1.0)))
        elif which == 2:
            _raises_naming("max_steps", gk.laplace, model, max_steps=0)
        else:
            _raises_naming("tol", gk.local, model, tol=-float(10 ** rng.uniform(-8, 0)))
        tally.update(value_error_names_argument=1)


# ------------------------------------------------------------------------------------------ multiclass


def _multiclass_case(rng, index, tally):
    kind = ("fit", "fit", "bad")[(index // len(FAMILIES)) % 3]
    tally.update(kind=kind)
    X = rng.standard_normal((MC_N, 2))
    labels = rng.permutation(np.arange(MC_N) % MC_C)
    kernel = gk.kernels.SquaredExponential(float(10 ** rng.uniform(-0.5, 1)), float(10 ** rng.uniform(-0.5, 0.5)))
    if kind == "fit":
        post = _quiet(gk.multiclass.fit, kernel, X, labels)
        log_z = float(post.log_z)
        assert np.isfinite(log_z) and np.all(np.isfinite(np.asarray(post.b))), log_z
        floor = float(gk.multiclass.gram_bound(kernel, X, MC_C))
        assert log_z >= floor - 1e-8 * max(1.0, abs(floor)), (log_z, floor)
        relabelled = _quiet(gk.multiclass.fit, kernel, X, rng.permutation(MC_C)[labels])
        if bool(post.converged) and bool(relabelled.converged):
            assert _close(relabelled.log_z, log_z, 1e-7), (float(relabelled.log_z), log_z)
            tally.update(relabel_invariant=1)
        tally.update(finite=1, above_gram_bound=1)
    else:
        which = int(rng.integers(3))
        if which == 0:
            bad = X.copy()
            bad[int(rng.integers(MC_N))] = np.inf
            _raises_naming("X", gk.multiclass.fit, kernel, bad, labels)
        elif which == 1:
            _raises_naming("y", gk.multiclass.fit, kernel, X, labels[:-1])
        else:
            _raises_naming("jitter", gk.multiclass.fit, kernel, X, labels, jitter=-1.0)
        tally.update(value_error_names_argument=1)


# ------------------------------------------------------------------------------------------ estimators


def _estimator_case(rng, index, tally):
    from gkl_jax.sklearn import BayesianLogisticRegression, BayesianRegression, GPClassifier, GPRegressor

    kind = ("regression", "logistic", "gp", "bad")[(index // len(FAMILIES)) % 4]
    tally.update(kind=kind)
    n, d = 24, 3
    X = rng.standard_normal((n, d)) * 10 ** rng.uniform(-3, 3)
    y = X @ rng.standard_normal(d) + 0.3 * np.std(X) * rng.standard_normal(n)
    labels = (y > np.median(y)).astype(int)
    order = rng.permutation(n)
    if kind == "regression":
        likelihood = str(rng.choice(["gaussian", "student-t", "laplace"]))
        a = _quiet(BayesianRegression(likelihood=likelihood).fit, X, y)
        b = _quiet(BayesianRegression(likelihood=likelihood).fit, X[order], y[order])
        assert np.all(np.isfinite(a.predict(X))) and np.isfinite(a.log_evidence_), likelihood
        if a.converged_ and b.converged_:
            assert _close(a.log_evidence_, b.log_evidence_, 1e-6), (likelihood, a.log_evidence_, b.log_evidence_)
            tally.update(order_invariant=1)
        tally.update(finite=1)
    elif kind == "logistic":
        a = _quiet(BayesianLogisticRegression().fit, X, labels)
        b = _quiet(BayesianLogisticRegression().fit, X[order], labels[order])
        p = a.predict_proba(X)
        assert np.all(np.isfinite(p)) and np.allclose(p.sum(axis=1), 1.0) and np.all((p >= 0) & (p <= 1))
        assert _close(np.ravel(a.log_evidence_)[0], np.ravel(b.log_evidence_)[0], 1e-6)
        tally.update(finite=1, probabilities=1, order_invariant=1)
    elif kind == "gp":
        if rng.random() < 0.5:
            p = _quiet(GPClassifier(learn_hyperparameters=False).fit, X, labels).predict_proba(X)
            assert np.all(np.isfinite(p)) and np.allclose(p.sum(axis=1), 1.0) and np.all((p >= 0) & (p <= 1))
            tally.update(probabilities=1)
        else:
            out = _quiet(GPRegressor(learn_hyperparameters=False).fit, X, y).predict(X)
            assert np.all(np.isfinite(out))
        tally.update(finite=1)
    else:
        which = int(rng.integers(4))
        bad = X.copy()
        bad[int(rng.integers(n)), int(rng.integers(d))] = np.nan
        if which == 0:
            _raises_naming("X", BayesianRegression().fit, bad, y)
        elif which == 1:
            _raises_naming("X", BayesianLogisticRegression().fit, bad, labels)
        elif which == 2:
            _raises_naming("likelihood", BayesianRegression(likelihood="cauchy-ish").fit, X, y)
        else:
            _raises_naming("y", GPRegressor().fit, X, y[:-1])
        tally.update(value_error_names_argument=1)


# ------------------------------------------------------------------------------------------ the budget

CASES = {"gp": _gp_case, "baselines": _base_case, "multiclass": _multiclass_case, "estimators": _estimator_case}


def nightly_case(index, tally):
    """Case `index`: its family is FAMILIES[index % 5], its data from the generator seeded 63_100_000 + index."""
    family = FAMILIES[index % len(FAMILIES)]
    tally.update(family=family)
    if family == "fit":
        _reliability_case(index // len(FAMILIES), tally)
        return
    CASES[family](np.random.default_rng(63_100_000 + index), index, tally)


@pytest.mark.extended
@pytest.mark.parametrize("index", range(NIGHTLY_CASES))
def test_extended_nightly_case(index):
    tally = {"index": index}
    nightly_case(index, tally)
    path = os.environ.get("GKL_PROPERTY_TALLY")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(tally) + "\n")


@pytest.mark.slow
def test_one_case_of_each_family():
    """The default run: the first case of the gp, baselines, multiclass and estimators families (indices 1-4), so
    that the generators stay runnable."""
    for index in range(1, len(FAMILIES)):
        tally = {}
        nightly_case(index, tally)
        assert tally["family"] == FAMILIES[index]
