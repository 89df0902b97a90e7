"""Gaussian priors: their structured expected log density against the dense formula and Monte Carlo, log
densities against scipy, precision products, and validation."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

import gkl_jax as gk


def _priors(D=4, seed=0):
    rng = np.random.default_rng(seed)
    A = rng.normal(size=(D, D))
    Sigma = A @ A.T / D + 0.4 * np.eye(D)
    return {
        "isotropic": (gk.priors.Isotropic(D, 1.7, mean=0.3), 1.7 * np.eye(D), np.full(D, 0.3)),
        "diagonal": (gk.priors.Diagonal(rng.uniform(0.5, 2, D), mean=rng.normal(size=D)), None, None),
        "dense": (gk.priors.Dense(Sigma, mean=rng.normal(size=D)), Sigma, None),
    }


def _dense(prior):
    cov = np.asarray(prior.cholesky() @ prior.cholesky().T)
    return cov, np.asarray(prior.mean)


def _q(D, factor, seed=1):
    rng = np.random.default_rng(seed)
    m = jnp.asarray(rng.normal(size=D))
    if factor == "full":
        return gk.Gaussian(m, gk.factors.Full(jnp.asarray(np.triu(rng.normal(size=(D, D))) + np.eye(D))))
    return gk.Gaussian(m, gk.factors.Diagonal(jnp.asarray(rng.uniform(0.3, 1.5, D))))


@pytest.mark.parametrize("name", ["isotropic", "diagonal", "dense"])
@pytest.mark.parametrize("factor", ["full", "diagonal"])
def test_expected_log_density_matches_dense_formula_and_monte_carlo(name, factor):
    """E_q[log N(w | mu, Sigma)] = -1/2 [D log 2 pi + log det Sigma + tr(Sigma^-1 S) + (m - mu)^T Sigma^-1 (m - mu)]
    with dense matrices, and within 5 standard errors of 100 000 samples of q."""
    prior = _priors()[name][0]
    q = _q(4, factor)
    cov, mu = _dense(prior)
    S = np.asarray(q.covariance())
    d = np.asarray(q.mean) - mu
    P = np.linalg.inv(cov)
    exact = -0.5 * (4 * np.log(2 * np.pi) + np.linalg.slogdet(cov)[1] + np.trace(P @ S) + d @ P @ d)
    assert abs(float(prior.expected_log_density(q)) - exact) < 1e-11
    w = q.sample(jax.random.PRNGKey(0), 100_000)
    lp = np.asarray(jax.jit(jax.vmap(prior.log_density))(w))
    assert abs(lp.mean() - exact) < 5 * lp.std() / np.sqrt(lp.size)


@pytest.mark.parametrize("name", ["isotropic", "diagonal", "dense"])
def test_log_density_and_precision_products(name):
    prior = _priors()[name][0]
    cov, mu = _dense(prior)
    rng = np.random.default_rng(2)
    w = rng.normal(size=4)
    assert abs(float(prior.log_density(jnp.asarray(w))) - stats.multivariate_normal(mu, cov).logpdf(w)) < 1e-11
    P = np.linalg.inv(cov)
    np.testing.assert_allclose(prior.precision_mv(jnp.asarray(w)), P @ w, rtol=1e-10)
    np.testing.assert_allclose(prior.precision_dense(), P, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(prior.precision_diagonal(), np.diag(P), rtol=1e-10)
    np.testing.assert_allclose(prior.marginal_variances(), np.diag(cov), rtol=1e-12)
    assert abs(float(prior.logdet()) - np.linalg.slogdet(cov)[1]) < 1e-11
    L = np.asarray(prior.cholesky())
    np.testing.assert_allclose(np.triu(L, 1), 0)
    assert prior.dim == 4


def test_dense_prior_matches_the_same_covariance_given_as_isotropic():
    iso = gk.priors.Isotropic(3, 2.5, mean=jnp.array([0.1, -0.2, 0.3]))
    dense = gk.priors.Dense(2.5 * np.eye(3), mean=jnp.array([0.1, -0.2, 0.3]))
    diag = gk.priors.Diagonal(np.full(3, 2.5), mean=jnp.array([0.1, -0.2, 0.3]))
    q = _q(3, "full")
    values = [float(p.expected_log_density(q)) for p in (iso, dense, diag)]
    np.testing.assert_allclose(values, values[0], rtol=1e-13)


def test_prior_hyperparameter_gradient_matches_finite_differences():
    q = _q(4, "full")
    rng = np.random.default_rng(3)
    A = rng.normal(size=(4, 4))

    def value(t):
        return gk.priors.Dense(A @ A.T / 4 + t * jnp.eye(4), mean=jnp.zeros(4)).expected_log_density(q)

    g = jax.jit(jax.grad(value))(0.5)
    fd = (value(0.5 + 1e-6) - value(0.5 - 1e-6)) / 2e-6
    assert abs(float(g - fd)) < 1e-7


@pytest.mark.parametrize(
    "make, arg",
    [
        (lambda: gk.priors.Isotropic(3, 0.0), "variance"),
        (lambda: gk.priors.Isotropic(3, -1.0), "variance"),
        (lambda: gk.priors.Isotropic(3, np.ones(3)), "variance"),
        (lambda: gk.priors.Isotropic(0), "dim"),
        (lambda: gk.priors.Isotropic(2.5), "dim"),
        (lambda: gk.priors.Isotropic(3, 1.0, mean=np.ones(2)), "mean"),
        (lambda: gk.priors.Isotropic(2, 1.0, mean=[0.0, np.nan]), "mean"),
        (lambda: gk.priors.Diagonal(np.array([1.0, 0.0])), "variance"),
        (lambda: gk.priors.Diagonal(np.ones((2, 2))), "variance"),
        (lambda: gk.priors.Dense(np.array([[1.0, 2.0], [2.0, 1.0]])), "covariance"),
        (lambda: gk.priors.Dense(np.array([[1.0, 0.5], [0.0, 1.0]])), "covariance"),
        (lambda: gk.priors.Dense(np.ones((2, 3))), "covariance"),
        (lambda: gk.priors.Dense(np.array([[1.0, np.nan], [np.nan, 1.0]])), "covariance"),
        (lambda: gk.priors.Dense(np.eye(2), mean=np.ones(3)), "mean"),
    ],
)
def test_bad_inputs_raise_value_error_naming_the_argument(make, arg):
    with pytest.raises(ValueError, match=arg):
        make()


def test_dense_prior_symmetry_and_definiteness_checks_follow_the_dtype():
    """A float32 covariance off symmetric by round-off of its largest entry (2 eps(float32) max|Sigma|, far above
    1e-6 of its small entries) is accepted; one off by 1e-3 is refused; a float32 covariance whose Cholesky
    factorisation fails says to add jitter or enable float64."""
    A = np.array([[4.0, 1e-4, 0.0], [1e-4, 1.0, 1e-5], [0.0, 1e-5, 2.0]])
    skew = np.array([[0.0, 1.0, -1.0], [-1.0, 0.0, 1.0], [1.0, -1.0, 0.0]])
    nudged = jnp.asarray(A + 2 * np.finfo(np.float32).eps * 4.0 * skew, jnp.float32)
    assert not np.allclose(nudged, nudged.T, rtol=1e-6, atol=1e-10)
    np.testing.assert_allclose(gk.priors.Dense(nudged).cholesky() @ gk.priors.Dense(nudged).cholesky().T, nudged,
                               rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="must be symmetric"):
        gk.priors.Dense(jnp.asarray(A + 1e-3 * skew, jnp.float32))
    with pytest.raises(ValueError, match="positive definite.*jitter.*jax_enable_x64"):
        gk.priors.Dense(jnp.ones((3, 3), jnp.float32))
