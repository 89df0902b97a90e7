"""gkl_jax.to_inference_data on the GP estimators: joint draws of the latent function at given inputs."""

import numpy as np
import pytest

import gkl_jax as gk
from gkl_jax._arviz_gp import latent_moments

pytestmark = pytest.mark.slow


def _data(n=40, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.uniform(-2.0, 2.0, (n, 1))
    return X, np.sin(2.0 * X[:, 0]) + 0.2 * rng.standard_normal(n)


@pytest.mark.parametrize("num_inducing", [None, 8], ids=["dense", "sparse"])
def test_latent_moments_match_the_marginal_predictions(num_inducing):
    """The joint covariance's diagonal and the mean are gkl_jax.gp.predict's marginals (an independent code path)."""
    from gkl_jax.sklearn import GPRegressor

    X, y = _data()
    reg = GPRegressor(likelihood="student-t", num_inducing=num_inducing, max_steps=20).fit(X, y)
    result, prior = reg._fit
    X_new = np.linspace(-2.5, 2.5, 7)[:, None]
    mean, cov = latent_moments(result, prior, X_new)
    pred = gk.gp.predict(result, prior, X_new)
    np.testing.assert_allclose(mean, np.asarray(pred.mean), atol=1e-10)
    np.testing.assert_allclose(np.diag(cov), np.asarray(pred.variance), atol=1e-10)
    assert np.all(np.linalg.eigvalsh(cov) > -1e-8)


def test_regressor_draws_in_the_targets_units():
    """Draw moments agree with latent_moments scaled to y's units; neighbouring inputs are correlated (joint)."""
    pytest.importorskip("arviz")
    from gkl_jax.sklearn import GPRegressor

    X, y = _data()
    y = 100.0 + 10.0 * y
    reg = GPRegressor(max_steps=20).fit(X, y)
    X_new = np.array([[0.0], [0.05], [1.5]])
    idata = gk.to_inference_data(reg, X=X_new, num_draws=2000, num_chains=2, seed=3, names=["a", "b", "c"])
    f = idata.posterior["f"]
    assert f.dims == ("chain", "draw", "input") and list(f.coords["input"].values) == ["a", "b", "c"]
    draws = f.values.reshape(-1, 3)
    mean, cov = latent_moments(*reg._fit, X_new)
    mean, cov = reg._y_shift + reg._y_scale * mean, reg._y_scale ** 2 * cov
    sd = np.sqrt(np.diag(cov))
    assert np.all(np.abs(draws.mean(0) - mean) < 5 * sd / np.sqrt(4000))
    np.testing.assert_allclose(draws.std(0), sd, rtol=0.08)
    assert np.corrcoef(draws[:, 0], draws[:, 1])[0, 1] > 0.9        # joint, not independent marginals
    # the latent mean is the Gaussian regressor's predictive mean
    np.testing.assert_allclose(mean, reg.predict(X_new), rtol=1e-8)
    assert idata.posterior.attrs["estimator"] == "GPRegressor"


def test_one_vs_rest_classifier_has_a_class_dimension():
    pytest.importorskip("arviz")
    from gkl_jax.sklearn import GPClassifier

    rng = np.random.default_rng(1)
    X = rng.normal(size=(60, 2))
    y = np.where(X[:, 0] > 0.5, "a", np.where(X[:, 1] > 0, "b", "c"))
    clf = GPClassifier(max_steps=10, learn_hyperparameters=False).fit(X, y)
    f = gk.to_inference_data(clf, X=X[:5], num_draws=10, num_chains=2).posterior["f"]
    assert f.dims == ("chain", "draw", "class", "input") and list(f.coords["class"].values) == ["a", "b", "c"]


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
def test_gp_bad_input():
    pytest.importorskip("arviz")
    from gkl_jax.sklearn import GPRegressor

    X, y = _data(20)
    with pytest.raises(ValueError, match="not fitted"):
        gk.to_inference_data(GPRegressor(), X=X)
    reg = GPRegressor(max_steps=5).fit(X, y)
    with pytest.raises(ValueError, match="X is required"):
        gk.to_inference_data(reg)
    with pytest.raises(ValueError, match=r"X must have shape \(n, 1\)"):
        gk.to_inference_data(reg, X=np.ones((3, 2)))
    with pytest.raises(ValueError, match="more than 5000"):
        gk.to_inference_data(reg, X=np.zeros((5001, 1)))
    with pytest.raises(ValueError, match="one name per row of X"):
        gk.to_inference_data(reg, X=X[:3], names=["a"])
    result = gk.fit(gk.Model(gk.priors.Isotropic(1, 1.0), gk.Sites(np.ones((2, 1)), gk.potentials.Logistic([1, -1]))))
    with pytest.raises(ValueError, match="X is for GP estimators only"):
        gk.to_inference_data(result, X=X)
