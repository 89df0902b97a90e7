"""Problems shared by the `gk.fit` tests (tests/test_fit*.py): Gaussian data and a small logistic model."""

import numpy as np

import gkl_jax as gk


def _gaussian_data(seed, D, N):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(N, D)), rng.normal(size=N), rng.uniform(0.3, 1.5, size=N), rng


def _logistic(seed=0, D=2, N=8, variance=2.0):
    """The same shapes as tests/test_bound.py's 2-D logistic model, so the compiled fit is shared."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(N, D)) * 1.5
    w = rng.normal(size=D)
    y = np.where(rng.uniform(size=N) < 1 / (1 + np.exp(-X @ w)), 1.0, -1.0)
    return X, y


def _logistic_model(X, y, variance=2.0):
    return gk.Model(gk.priors.Isotropic(X.shape[1], variance), gk.Sites(X, gk.potentials.Logistic(y)))
