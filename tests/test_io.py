"""gkl_jax.save / gkl_jax.load (and the file format of gkl_jax._serialise), and gkl_jax.to_inference_data."""

import json
import re

import jax
import numpy as np
import pytest

import gkl_jax as gk
from gkl_jax._serialise import MAGIC

H = np.array([[1.0, 0.5], [-0.3, 1.0], [0.2, -1.0]])
MODEL = gk.Model(gk.priors.Isotropic(2, 1.0), gk.Sites(H, gk.potentials.Logistic([1.0, -1.0, 1.0])))


@pytest.fixture(scope="module")
def results():
    return {"full": gk.fit(MODEL), "banded": gk.fit(MODEL, factor=gk.factors.Banded(bandwidth=1))}


@pytest.fixture(scope="module")
def estimators():
    from gkl_jax.sklearn import BayesianLogisticRegression, BayesianRegression

    rng = np.random.default_rng(0)
    X = rng.normal(size=(30, 3))
    y = X @ np.array([1.0, 2.0, -1.0]) + 0.5 + rng.normal(size=30)
    return {"regression": BayesianRegression().fit(X, y),
            "classifier": BayesianLogisticRegression().fit(X, np.where(y > 0, "up", "down")), "X": X}


def _same(a, b):
    la, ta = jax.tree.flatten(a)
    lb, tb = jax.tree.flatten(b)
    assert ta == tb
    for x, y in zip(la, lb):
        assert np.asarray(x).dtype == np.asarray(y).dtype
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.mark.parametrize("name", ["full", "banded"])
def test_result_round_trip(tmp_path, results, name):
    """A saved and loaded Result is the same pytree (structure, static fields, arrays bit for bit), with JAX
    arrays, and predicts the same."""
    result = results[name]
    path = tmp_path / "fit.gkl"
    gk.save(path, result)
    loaded = gk.load(path, gk.Result)
    _same(result, loaded)
    assert isinstance(loaded.q.mean, jax.Array) and loaded.method == result.method
    np.testing.assert_array_equal(gk.predict(loaded, H, "logistic").probability,
                                  gk.predict(result, H, "logistic").probability)


@pytest.mark.slow       # the estimators' fixture compiles two fits
@pytest.mark.parametrize("name", ["regression", "classifier"])
def test_estimator_round_trip(tmp_path, estimators, name):
    """A fitted estimator comes back with its parameters, fitted attributes and predictions."""
    est, X = estimators[name], estimators["X"]
    path = tmp_path / "est.gkl"
    gk.save(path, est)
    loaded = gk.load(path, type(est).__name__)
    assert type(loaded) is type(est) and loaded.get_params() == est.get_params()
    for attr in ("coef_", "coef_std_", "intercept_", "intercept_std_", "covariance_", "log_evidence_"):
        np.testing.assert_array_equal(getattr(loaded, attr), getattr(est, attr))
    if name == "classifier":
        np.testing.assert_array_equal(loaded.classes_, est.classes_)
        np.testing.assert_array_equal(loaded.predict_proba(X), est.predict_proba(X))
        assert list(loaded.predict(X[:4])) == list(est.predict(X[:4]))
    else:
        np.testing.assert_array_equal(loaded.predict(X, return_std=True), est.predict(X, return_std=True))


def _rewrite_header(path, change):
    data = path.read_bytes()
    end = data.index(b"\n", len(MAGIC))
    header = json.loads(data[len(MAGIC):end])
    change(header)
    path.write_bytes(MAGIC + json.dumps(header).encode() + data[end:])


def test_bad_files_raise_value_errors_naming_the_file(tmp_path, results):
    """Corrupt, truncated, foreign, other-version and other-type files: ValueError naming the file."""
    good = tmp_path / "good.gkl"
    gk.save(good, results["full"])
    data = good.read_bytes()
    cases = {}
    flipped = bytearray(data)
    flipped[-5] ^= 0xFF
    cases["corrupt: its arrays do not match the header's checksum"] = bytes(flipped)
    cases["corrupt: its arrays do not match"] = data[:-40]
    cases["is not a file written by gkl_jax.save"] = b"PK\x03\x04" + data[4:]
    cases["corrupt: its header is not valid JSON"] = data[:len(MAGIC) + 20] + b"\n" + data[-100:]
    for i, (fragment, content) in enumerate(cases.items()):
        path = tmp_path / f"bad{i}.gkl"
        path.write_bytes(content)
        with pytest.raises(ValueError, match=re.escape(str(path)) + ".*" + re.escape(fragment)):
            gk.load(path)
    version = tmp_path / "version.gkl"
    version.write_bytes(data)
    _rewrite_header(version, lambda h: h.update(format_version=99, library_version="9.9"))
    with pytest.raises(ValueError, match=re.escape(str(version)) + " was saved in gkl-jax file format 99 .*9.9"):
        gk.load(version)
    foreign = tmp_path / "foreign.gkl"
    foreign.write_bytes(data)
    _rewrite_header(foreign, lambda h: h["structure"].update(module="os.system"))
    with pytest.raises(ValueError, match="names the class os.system, which is not part of gkl-jax"):
        gk.load(foreign)
    _rewrite_header(foreign, lambda h: h["structure"].update(module="gkl_jax.sklearn._linear.BaseEstimator"))
    with pytest.raises(ValueError, match="BaseEstimator, which is not part of gkl-jax"):
        gk.load(foreign)     # a class only imported into a gkl-jax module is refused too
    with pytest.raises(ValueError, match=re.escape(str(good)) + " holds a Result, not a BayesianRegression"):
        gk.load(good, "BayesianRegression")
    with pytest.raises(ValueError, match="cannot read .*missing.gkl"):
        gk.load(tmp_path / "missing.gkl")


def test_what_cannot_be_saved():
    with pytest.raises(ValueError, match="obj must be a gkl_jax.Result or a gkl_jax.sklearn estimator, got dict"):
        gk.save("unused.gkl", {"a": 1})
    with pytest.raises(ValueError, match="model_type must be None, a class or a class name"):
        gk.load("unused.gkl", 3)


def test_inference_data_from_a_result(results):
    """Draws from q with named coordinates: their moments match q's (5 standard errors), and the fit's scalars
    are the posterior group's attributes."""
    pytest.importorskip("arviz")
    result = results["full"]
    idata = gk.to_inference_data(result, num_draws=1000, num_chains=4, seed=1, names=["slope", "offset"])
    w = idata.posterior["w"]
    assert w.dims == ("chain", "draw", "weight") and w.shape == (4, 1000, 2)
    assert list(w.coords["weight"].values) == ["slope", "offset"]
    draws = w.values.reshape(-1, 2)
    sd = np.sqrt(np.asarray(result.q.marginal_variances()))
    assert np.all(np.abs(draws.mean(0) - np.asarray(result.q.mean)) < 5 * sd / np.sqrt(4000))
    # the standard error of a sample covariance entry is at most sqrt(2 / n) max_i S_ii
    np.testing.assert_allclose(np.cov(draws.T), np.asarray(result.q.covariance()),
                               atol=5 * np.sqrt(2 / 4000) * sd.max() ** 2)
    assert idata.posterior.attrs["log_z"] == float(result.log_z) and idata.posterior.attrs["method"] == "gkl"
    with pytest.raises(ValueError, match="one name per weight"):
        gk.to_inference_data(result, names=["a"])
    with pytest.raises(ValueError, match="num_draws must be an integer >= 1"):
        gk.to_inference_data(result, num_draws=0)


@pytest.mark.slow
def test_inference_data_from_estimators(estimators):
    """Coefficients over named features (and classes for one-vs-rest), intercept, moments of the estimator."""
    pytest.importorskip("arviz")
    reg = estimators["regression"]
    idata = gk.to_inference_data(reg, names=["a", "b", "c"], num_draws=1000)
    coef = idata.posterior["coef"]
    assert coef.dims == ("chain", "draw", "feature") and list(coef.coords["feature"].values) == ["a", "b", "c"]
    draws = coef.values.reshape(-1, 3)
    assert np.all(np.abs(draws.mean(0) - reg.coef_) < 5 * reg.coef_std_ / np.sqrt(4000))
    np.testing.assert_allclose(draws.std(0), reg.coef_std_, rtol=0.1)
    b = idata.posterior["intercept"].values.ravel()
    assert abs(b.mean() - reg.intercept_) < 5 * reg.intercept_std_ / np.sqrt(4000)
    assert idata.posterior.attrs["noise"] == reg.noise_
    clf = estimators["classifier"]
    coef = gk.to_inference_data(clf, num_draws=10, num_chains=2).posterior["coef"]
    assert coef.dims == ("chain", "draw", "feature") and list(coef.coords["feature"].values) == ["x0", "x1", "x2"]
    with pytest.raises(ValueError, match="takes a gkl_jax.Result or a fitted"):
        gk.to_inference_data(object())


@pytest.mark.parametrize("template", [
    gk.factors.Diagonal(), gk.factors.Chevron(rows=1), gk.factors.Sparse(np.triu(np.ones((4, 4))) - np.eye(4, k=3)),
    gk.factors.Subspace(rank=2, num_refinements=2), gk.factors.FactorAnalysis(rank=1, start="random"),
], ids=lambda t: type(t).__name__)
def test_every_factor_round_trips(tmp_path, template):
    """Every factor type (static fields such as `rows`, `rank` and `num_refinements`, integer pattern arrays)
    comes back as the same pytree and the same covariance."""
    q = gk.Gaussian(np.arange(4.0), template.initialise(4, np.array([1.0, 2.0, 0.5, 3.0])))
    result = gk.Result(q=q, log_z=np.float64(-1.5), converged=np.bool_(True), num_steps=np.int32(3),
                       history=np.array([-2.0, -1.5, np.nan]), method="laplace", is_bound=False)
    path = tmp_path / "factor.gkl"
    gk.save(path, result)
    loaded = gk.load(path)
    _same(result, loaded)
    np.testing.assert_array_equal(loaded.q.covariance(), q.covariance())
