"""Shared by the GP tests (tests/test_gp*.py): a small 1-D regression data set, a random Gaussian q, and
setting a field of an Equinox module."""

import equinox as eqx
import numpy as np

import gkl_jax as gk

NOISE = 0.05


def _data(n=12, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.uniform(-3, 3, size=(n, 1))
    y = np.sin(X[:, 0]) + np.sqrt(NOISE) * rng.standard_normal(n)
    return X, y


def _random_q(rng, dim):
    C = np.triu(0.3 * rng.normal(size=(dim, dim))) + np.diag(rng.uniform(0.2, 0.6, size=dim))
    return gk.Gaussian(rng.normal(size=dim), gk.factors.Full(C))


def eqx_set(module, field, value):

    return eqx.tree_at(lambda m: getattr(m, field), module, value)
