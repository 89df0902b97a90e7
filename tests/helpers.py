"""Shared oracles and problem generators for the tests."""

import jax.numpy as jnp
import numpy as np

import gkl_jax as gk


def tol(dtype) -> float:
    """Default comparison tolerance for a floating dtype."""
    return 1e-8 if jnp.finfo(dtype).bits >= 64 else 1e-4


def logistic_problem(dim=4, num=12, variance=2.0, seed=0):
    """A small Bayesian logistic regression model (prior N(0, variance I)) and its data."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(num, dim))
    y = np.where(rng.uniform(size=num) < 1 / (1 + np.exp(-X @ rng.normal(size=dim))), 1.0, -1.0)
    model = gk.Model(gk.priors.Isotropic(dim=dim, variance=variance), gk.Sites(X, gk.potentials.Logistic(y)))
    return model, X, y


def gaussian_log_evidence(H, y, noise_variance, prior_cov, prior_mean=None):
    """Exact log N(y | H mu, H Sigma H^T + v I) and the exact posterior (mean, covariance)."""
    H = np.asarray(H)
    mu = np.zeros(H.shape[1]) if prior_mean is None else np.asarray(prior_mean)
    K = H @ prior_cov @ H.T + np.diag(np.broadcast_to(noise_variance, (H.shape[0],)))
    r = y - H @ mu
    log_z = -0.5 * (r @ np.linalg.solve(K, r) + np.linalg.slogdet(2 * np.pi * K)[1])
    P = np.linalg.inv(prior_cov) + H.T @ (H / np.broadcast_to(noise_variance, (H.shape[0],))[:, None])
    cov = np.linalg.inv(P)
    mean = cov @ (np.linalg.solve(prior_cov, mu) + H.T @ (y / np.broadcast_to(noise_variance, (H.shape[0],))))
    return log_z, mean, cov
