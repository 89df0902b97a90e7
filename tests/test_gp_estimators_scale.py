"""The GP estimators at scale: padded fits with masked sites (one compile per size bucket) and the sparse GP
behind `num_inducing` (`gkl_jax.sklearn._gp_model`)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import gkl_jax as gk
from gkl_jax.sklearn import GPClassifier, GPRegressor
from gkl_jax.sklearn import _gp as gp_estimators
from gkl_jax.sklearn._gp_model import GPBuild, inducing_inputs, pad_rows, rows_bucket

jax.config.update("jax_enable_x64", True)


def _data(n, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 2))
    labels = (X[:, 0] + 0.5 * rng.normal(size=n) > 0).astype(int)
    return X, labels, np.sin(X[:, 0]) + 0.3 * rng.normal(size=n)


def _builds(X, y, likelihood, sparse):
    """(unpadded build, padded build) of the same problem."""
    n = X.shape[0]
    n_pad = rows_bucket(n) + 8       # more padding than any bucket gives
    fill = 1.0 if likelihood == "logistic" else 0.0
    plain = GPBuild(jnp.asarray(X), jnp.asarray(y), jnp.ones(n, bool), jnp.asarray(4.0), likelihood, 1e-6, sparse)
    padded = GPBuild(jnp.asarray(pad_rows(X, n_pad)), jnp.asarray(pad_rows(y, n_pad, fill)),
                     jnp.asarray(np.arange(n_pad) < n), jnp.asarray(4.0), likelihood, 1e-6, sparse)
    return plain, padded


@pytest.mark.parametrize("likelihood,sparse", [
    ("gaussian", False), ("gaussian", True), pytest.param("logistic", False, marks=pytest.mark.slow),
    pytest.param("logistic", True, marks=pytest.mark.slow), pytest.param("student-t", False, marks=pytest.mark.slow)])
def test_masked_sites_contribute_nothing(likelihood, sparse):
    """The padded model's log Z (less the Gaussian padding's closed-form constant) and its gradient in the
    kernel, the noise and the inducing inputs equal the unpadded model's to round-off."""
    X, labels, z = _data(23)
    y = np.where(labels == 1, 1.0, -1.0) if likelihood == "logistic" else z
    plain, padded = _builds(X, y, likelihood, sparse)
    params = {"kernel": gk.kernels.SquaredExponential(1.3, 0.8), "log_noise": jnp.asarray(np.log(0.3))}
    if sparse:
        params["Z"] = jnp.asarray(X[::3] + 0.1)
    method = gk.gp.exact if likelihood == "gaussian" else (lambda m: gk.fit(m, tol=1e-10))

    def value_and_grad(build):
        f = lambda p: method(build(p)).log_z - build.padding_log_z()
        return jax.jit(jax.value_and_grad(f))(params)

    (v0, g0), (v1, g1) = value_and_grad(plain), value_and_grad(padded)
    assert abs(float(v0) - float(v1)) < 1e-9 * max(1.0, abs(float(v0)))
    for a, b in zip(jax.tree.leaves(g0), jax.tree.leaves(g1)):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-6, atol=1e-8)


def test_padded_estimator_matches_the_unpadded_fit():
    """GPClassifier at fixed kernel: the bound of the unpadded `gk.gp.model` fit, predictions of `gk.gp.predict`."""
    X, labels, _ = _data(37)
    kernel = gk.kernels.SquaredExponential(1.0, 1.0)
    clf = GPClassifier(kernel, learn_hyperparameters=False).fit(X, labels)
    result = gk.fit(gk.gp.model(kernel, X, gk.potentials.Logistic(np.where(labels == 1, 1.0, -1.0))))
    assert abs(clf.log_evidence_ - float(result.log_z)) < 1e-6
    Xt = X[:5] + 0.25
    ref = gk.gp.predict(result, gk.priors.GP(kernel, X), Xt, family="logistic").probability
    np.testing.assert_allclose(clf.predict_proba(Xt)[:, 1], np.asarray(ref), atol=1e-6)


@pytest.mark.slow
def test_sparse_with_all_inducing_inputs_gives_the_dense_bound():
    """num_inducing = n (the inducing inputs the training rows): the sparse bound equals the dense one (to the
    jitter's effect, 1e-8 here); classifier and Student-t regressor at fixed hyperparameters."""
    X, labels, z = _data(37)
    kernel = gk.kernels.SquaredExponential(1.0, 1.0)
    for make in (lambda **kw: GPClassifier(kernel, learn_hyperparameters=False, jitter=1e-8, **kw),
                 lambda **kw: GPRegressor(kernel, likelihood="student-t", noise=0.4, learn_hyperparameters=False,
                                          jitter=1e-8, **kw)):
        target = labels if "Classifier" in type(make()).__name__ else z
        dense = make().fit(X, target)
        sparse = make(num_inducing=37, inducing="random").fit(X, target)
        assert dense.inducing_inputs_ is None and sparse.inducing_inputs_.shape == (37, 2)
        assert abs(dense.log_evidence_ - sparse.log_evidence_) < 1e-6
        np.testing.assert_allclose(sparse.predict(X[:4]), dense.predict(X[:4]), atol=1e-5)


def test_one_compile_per_bucket_for_fits_and_predictions():
    """A second training set and a second test set of other sizes in the same buckets compile nothing."""
    X, labels, _ = _data(40)
    assert rows_bucket(37) == rows_bucket(39)
    compiles = []

    def listener(event, duration, **kwargs):
        if event == "/jax/core/compile/backend_compile_duration":
            compiles.append(kwargs.get("fun_name"))

    GPClassifier(max_steps=3).fit(X[:37], labels[:37]).predict_proba(X[:5])
    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        GPClassifier(max_steps=3).fit(X[:39], labels[:39]).predict_proba(X[:7])
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)
    assert compiles == []


def test_default_switches_to_the_sparse_gp_above_the_dense_limit(monkeypatch):
    """num_inducing=None: dense up to DENSE_MAX rows, the sparse GP with DEFAULT_INDUCING k-means++ inducing
    inputs above (limits lowered here); the k-means++ start is reproducible under random_state."""
    X, _, z = _data(37)
    monkeypatch.setattr(gp_estimators, "DENSE_MAX", 30)
    monkeypatch.setattr(gp_estimators, "DEFAULT_INDUCING", 6)
    reg = GPRegressor(max_steps=3).fit(X, z)
    assert reg.inducing_inputs_.shape == (6, 2)
    np.testing.assert_array_equal(reg.inducing_inputs_, inducing_inputs(X, 6, "kmeans++", 0))
    assert not np.array_equal(inducing_inputs(X, 6, "kmeans++", 1), reg.inducing_inputs_)
    assert GPRegressor(max_steps=3, num_inducing="all").fit(X, z).inducing_inputs_ is None


def test_learned_inducing_inputs_raise_the_bound():
    """learn_inducing=True moves Z and gives a higher collapsed bound than the same start held fixed."""
    X, _, z = _data(37)
    fixed = GPRegressor(num_inducing=4, max_steps=20).fit(X, z)
    learned = GPRegressor(num_inducing=4, learn_inducing=True, max_steps=20).fit(X, z)
    assert learned.log_evidence_ > fixed.log_evidence_ + 1e-3
    assert np.max(np.abs(learned.inducing_inputs_ - fixed.inducing_inputs_)) > 1e-3


@pytest.mark.parametrize("kwargs,name", [
    ({"num_inducing": 0}, "num_inducing"), ({"num_inducing": 38}, "num_inducing"),
    ({"num_inducing": 2.5}, "num_inducing"), ({"num_inducing": "many"}, "num_inducing"),
    ({"inducing": np.zeros((4, 3))}, "inducing"), ({"inducing": "grid"}, "inducing"),
    ({"num_inducing": 5, "inducing": np.zeros((4, 2))}, "num_inducing"),
    ({"inducing": np.full((4, 2), np.nan)}, "inducing")])
def test_bad_sparse_settings_name_the_argument(kwargs, name):
    X, labels, _ = _data(37)
    with pytest.raises(ValueError, match=name):
        GPClassifier(**kwargs).fit(X, labels)


def test_pad_rows_refuses_a_bucket_too_small():
    with pytest.raises(ValueError, match="bucket"):
        pad_rows(np.zeros((5, 2)), 4)


def test_kmeans_plus_plus_rows_spread_over_the_clusters():
    """k-means++ seeding picks one row in each of three far-apart clusters (D^2 sampling: a second row from an
    already chosen cluster has probability ~1e-8 here); "random" rows are distinct; both seeded."""
    from gkl_jax._inducing import inducing_rows

    rng = np.random.default_rng(3)
    X = np.concatenate([rng.normal(c, 0.01, size=(50, 2)) for c in (-10.0, 0.0, 10.0)])
    for seed in range(5):
        rows = inducing_rows(X, 3, "kmeans++", seed)
        assert sorted(rows // 50) == [0, 1, 2]
        np.testing.assert_array_equal(rows, inducing_rows(X, 3, "kmeans++", seed))
    random_rows = inducing_rows(X, 40, "random", 0)
    assert len(np.unique(random_rows)) == 40
    with pytest.raises(ValueError, match="num_inducing"):
        inducing_rows(X, 151, "random", 0)


def test_multiclass_default_switches_to_the_sparse_bound(monkeypatch):
    """gkl_jax.multiclass.GPClassifier: the full bound up to DENSE_MAX_LATENTS latents n C, the sparse bound with
    DEFAULT_INDUCING_LATENTS inducing latents above (limits lowered here); "kmeans++" takes all C latents at
    k-means++ rows; "all" keeps the full bound; a bad `inducing` is refused."""
    from gkl_jax.multiclass import _classifier as mc

    X, _, _ = _data(12)
    clf = gk.multiclass.GPClassifier()
    assert clf._inducing_latents(X, 3) is None
    monkeypatch.setattr(mc, "DENSE_MAX_LATENTS", 20)
    monkeypatch.setattr(mc, "DEFAULT_INDUCING_LATENTS", 9)
    latents = clf._inducing_latents(X, 3)
    assert latents.shape == (9,) and len(np.unique(latents)) == 9 and latents.max() < 36
    rows = gk.multiclass.GPClassifier(inducing="kmeans++")._inducing_latents(X, 3)
    assert rows.shape == (9,) and len(np.unique(rows // 3)) == 3 and sorted(rows % 3) == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert gk.multiclass.GPClassifier(num_inducing="all")._inducing_latents(X, 3) is None
    with pytest.raises(ValueError, match="inducing"):
        gk.multiclass.GPClassifier(inducing="grid")
    with pytest.raises(ValueError, match="num_inducing"):
        gk.multiclass.GPClassifier(num_inducing=0)
