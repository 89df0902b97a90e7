"""gkl_jax._predict.predict (the core predictive API), gp.predict(family=...) and reverse-mode EP log_z."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import integrate, special

import gkl_jax as gk
from gkl_jax import potentials as P
from gkl_jax._predict import predict


@pytest.fixture(scope="module")
def logistic_fit():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(25, 3))
    y = np.where(X[:, 0] + 0.5 * rng.normal(size=25) > 0, 1.0, -1.0)
    model = gk.Model(gk.priors.Isotropic(3, 2.0), gk.Sites(X, P.Logistic(y)))
    return gk.fit(model), rng.normal(size=(4, 3))


def test_latent_moments_equal_dense_projection(logistic_fit):
    res, Xn = logistic_fit
    pred = predict(res, Xn, offset=0.5)
    S = np.asarray(res.q.covariance())
    np.testing.assert_allclose(pred.mean, Xn @ np.asarray(res.q.mean) + 0.5, rtol=1e-12)
    np.testing.assert_allclose(pred.variance, np.einsum("nd,de,ne->n", Xn, S, Xn), rtol=1e-10)
    assert pred.probability is None and pred.log_density is None


def test_logistic_probability_is_the_predictive_integral(logistic_fit):
    res, Xn = logistic_fit
    pred = predict(res, Xn, "logistic", y=np.array([1.0, -1.0, 1.0, -1.0]))
    for mu, s2, p, ld, yy in zip(pred.mean, pred.variance, pred.probability, pred.log_density, [1, -1, 1, -1]):
        f = lambda x, mu=float(mu), s=float(np.sqrt(s2)): special.expit(x) * np.exp(-0.5 * ((x - mu) / s) ** 2) / (
            s * np.sqrt(2 * np.pi))
        exact = integrate.quad(f, mu - 12 * np.sqrt(s2), mu + 12 * np.sqrt(s2), epsabs=1e-13)[0]
        assert abs(float(p) - exact) < 1e-9
        assert abs(float(ld) - np.log(exact if yy == 1 else 1 - exact)) < 1e-8
    # not the plug-in sigmoid(mean): the predictive is pulled towards 1/2
    assert np.all(np.abs(np.asarray(pred.probability) - 0.5) < np.abs(special.expit(np.asarray(pred.mean)) - 0.5))


def test_regression_and_poisson_families(logistic_fit):
    res, Xn = logistic_fit
    lat = predict(res, Xn)
    g = predict(res, Xn, P.Gaussian(np.zeros(25), 0.3))            # the training likelihood: targets ignored
    np.testing.assert_allclose(g.y_variance, np.asarray(lat.variance) + 0.3, rtol=1e-12)
    np.testing.assert_allclose(g.y_mean, lat.mean, rtol=1e-12)
    t = predict(res, Xn, P.StudentT(np.zeros(25), 5.0, 0.5))
    np.testing.assert_allclose(t.y_variance, np.asarray(lat.variance) + 0.25 * 5 / 3, rtol=1e-12)
    p = predict(res, Xn, "poisson", y=np.array([0.0, 1.0, 2.0, 5.0]))
    mu, s2 = np.asarray(lat.mean), np.asarray(lat.variance)
    np.testing.assert_allclose(p.y_mean, np.exp(mu + s2 / 2), rtol=1e-12)
    # log p(y = 2) by quadrature of the Poisson pmf under the latent Gaussian
    f = lambda x: np.exp(2 * x - np.exp(x) - np.log(2.0)) * np.exp(-0.5 * (x - mu[2]) ** 2 / s2[2]) / np.sqrt(
        2 * np.pi * s2[2])
    exact = integrate.quad(f, mu[2] - 12 * np.sqrt(s2[2]), mu[2] + 12 * np.sqrt(s2[2]), epsabs=1e-14)[0]
    assert abs(float(p.log_density[2]) - np.log(exact)) < 1e-8


def test_predict_bad_input(logistic_fit):
    res, Xn = logistic_fit
    with pytest.raises(ValueError, match="H_new"):
        predict(res, np.ones((2, 4)))
    with pytest.raises(ValueError, match="H_new"):
        predict(res, np.array([[np.nan, 0.0, 0.0]]))
    with pytest.raises(ValueError, match="family"):
        predict(res, Xn, "gamma")
    with pytest.raises(ValueError, match="y"):
        predict(res, Xn, y=np.ones(4))
    with pytest.raises(ValueError, match=r"\{-1, \+1\}"):
        predict(res, Xn, "probit", y=np.array([0.0, 1.0, 1.0, 1.0]))
    with pytest.raises(ValueError, match="per site"):
        predict(res, Xn, P.Gaussian(np.zeros(25), np.ones(25)))


def test_gp_predict_family_gives_unlabelled_probabilities():
    rng = np.random.default_rng(1)
    X = rng.normal(size=(12, 1))
    y = np.where(X[:, 0] > 0, 1.0, -1.0)
    model = gk.gp.model(gk.kernels.SquaredExponential(1.0, 1.0), X, P.Probit(y))
    res = gk.fit(model)
    Xn = np.linspace(-2, 2, 5)[:, None]
    unlabelled = gk.gp.predict(res, model.prior, Xn, family="probit")
    labelled = gk.gp.predict(res, model.prior, Xn, P.Probit(np.ones(5)))
    np.testing.assert_allclose(unlabelled.probability, labelled.probability, rtol=1e-14)
    np.testing.assert_allclose(unlabelled.probability, special.ndtr(np.asarray(unlabelled.mean) / np.sqrt(
        1 + np.asarray(unlabelled.variance))), rtol=1e-12)
    assert unlabelled.log_density is None
    with pytest.raises(ValueError, match="not both"):
        gk.gp.predict(res, model.prior, Xn, P.Probit(np.ones(5)), family="probit")


@pytest.mark.parametrize("power", [1.0, 0.7])
def test_ep_log_z_reverse_mode_matches_central_differences(power):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(15, 3))
    y = np.sign(X[:, 0] + rng.normal(size=15))

    def log_z(lv):
        model = gk.Model(gk.priors.Isotropic(3, jnp.exp(lv)), gk.Sites(X, P.Logistic(y)))
        return gk.ep(model, power=power, tol=1e-12).log_z

    value_and_grad = jax.jit(jax.value_and_grad(log_z))   # one program: the derivative and the values
    grad = value_and_grad(0.3)[1]
    h = 1e-5
    fd = (value_and_grad(0.3 + h)[0] - value_and_grad(0.3 - h)[0]) / (2 * h)
    assert abs(float(grad) - float(fd)) < 1e-7
    if power == 1.0:    # forward mode through the iterations as well (a second program: ~half the test's time)
        assert abs(float(grad) - float(jax.jit(jax.jacfwd(log_z))(0.3))) < 1e-10


def _logistic_model(lv, n=15, d=3):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(n, d))
    y = np.sign(X[:, 0] + rng.normal(size=n))
    return gk.Model(gk.priors.Isotropic(d, jnp.exp(lv)), gk.Sites(X, P.Logistic(y)))


def test_laplace_reverse_mode_matches_central_differences_to_second_order():
    """The implicit rule for the mode: jax.grad of log Z_LA and of the mean, and jax.hessian of log Z_LA."""
    log_z = lambda lv: gk.laplace(_logistic_model(lv), tol=1e-12).log_z
    mean0 = lambda lv: gk.laplace(_logistic_model(lv), tol=1e-12).q.mean[0]
    h = 1e-5
    # one compiled program for each function gives its derivative and the values for the differences
    log_z_and_grad, mean0_and_grad = jax.jit(jax.value_and_grad(log_z)), jax.jit(jax.value_and_grad(mean0))
    for value_and_grad in (log_z_and_grad, mean0_and_grad):
        fd = (value_and_grad(0.3 + h)[0] - value_and_grad(0.3 - h)[0]) / (2 * h)
        assert abs(float(value_and_grad(0.3)[1]) - float(fd)) < 1e-8
    fd2 = (log_z_and_grad(0.3 + h)[1] - log_z_and_grad(0.3 - h)[1]) / (2 * h)
    assert abs(float(jax.jit(jax.hessian(log_z))(0.3)) - float(fd2)) < 1e-7


def test_local_reverse_mode_matches_central_differences():
    """The envelope rule at fixed tangent points (exact as the EM iteration converges)."""
    log_z = lambda lv: gk.local(_logistic_model(lv), tol=1e-14, max_steps=5000).log_z
    h = 1e-5
    fd = (log_z(0.3 + h) - log_z(0.3 - h)) / (2 * h)
    assert abs(float(jax.grad(log_z)(0.3)) - float(fd)) < 1e-7


def test_double_loop_reverse_mode_names_jacfwd():
    log_z = lambda lv: gk.double_loop(_logistic_model(lv), rank=3).log_z
    with pytest.raises(ValueError, match="jax.jacfwd"):
        jax.grad(log_z)(0.3)
    h = 1e-5
    # the values from the same program as the derivative (jacfwd's auxiliary output: log_z itself)
    derivative_and_value = jax.jacfwd(lambda lv: (lambda v: (v, v))(log_z(lv)), has_aux=True)
    fd = (derivative_and_value(0.3 + h)[1] - derivative_and_value(0.3 - h)[1]) / (2 * h)
    assert abs(float(derivative_and_value(0.3)[0]) - float(fd)) < 1e-6
