"""The factor conformance cases shared by the factor tests (tests/test_factors*.py): `CASES` (name -> template,
structural-zero masks, sparsity pattern of C), their patterns, a random factor of each, and small models."""

import equinox as eqx
import jax
import numpy as np
from jax.flatten_util import ravel_pytree

import gkl_jax as gk
from gkl_jax import _adjoint
from gkl_jax.factors import Banded, Chevron, Diagonal, FactorAnalysis, Full, Sparse, Subspace

D = 10


def sparse_mask(dim, seed=3):
    rng = np.random.default_rng(seed)
    return np.triu(rng.uniform(size=(dim, dim)) < 0.3) | np.eye(dim, dtype=bool)


def band_pattern(dim, B):
    i, j = np.indices((dim, dim))
    return (j >= i) & (j <= i + B)


def chevron_pattern(dim, K):
    i, j = np.indices((dim, dim))
    return ((i < K) & (j >= i)) | (i == j)


def _upper_zeros(shape):
    return np.tril(np.ones(shape, bool), -1)


# name -> (template(dim), {leaf name: structural-zero mask(dim)}, pattern of C (None: not a Cholesky-type factor))
CASES = {
    "full": (lambda d: Full(), {"C": lambda d: _upper_zeros((d, d))}, lambda d: np.triu(np.ones((d, d), bool))),
    "diagonal": (lambda d: Diagonal(), {}, lambda d: np.eye(d, dtype=bool)),
    "banded2": (lambda d: Banded(2), {"bands": lambda d: np.add.outer(np.arange(3), np.arange(d)) >= d},
                lambda d: band_pattern(d, 2)),
    "banded8": (lambda d: Banded(8), {"bands": lambda d: np.add.outer(np.arange(9), np.arange(d)) >= d},
                lambda d: band_pattern(d, 8)),
    "chevron": (lambda d: Chevron(3), {"theta": lambda d: _upper_zeros((3, d))}, lambda d: chevron_pattern(d, 3)),
    "sparse": (lambda d: Sparse(sparse_mask(d)), {}, lambda d: sparse_mask(d)),
    "subspace": (lambda d: Subspace(3), {"C1": lambda d: _upper_zeros((3, 3))}, None),
    "factor_analysis": (lambda d: FactorAnalysis(2), {}, None),
}


def logistic_model(dim=D, num=15, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(num, dim))
    y = np.where(rng.uniform(size=num) < 0.5, 1.0, -1.0)
    return gk.Model(gk.priors.Isotropic(dim, 1.5), gk.Sites(X, gk.potentials.Logistic(y))), X


def solver_vector(q):
    """The solvers' parameter vector of q (via fit's own filter) and the map back."""
    params, static = eqx.partition(q, _adjoint.solver_mask(q))
    flat, unravel = ravel_pytree(params)
    return flat, lambda f: eqx.combine(unravel(f), static)


def structural_vector(q, name):
    """Boolean vector over the solver parameters: True at the structural zeros of the factor."""
    params, _ = eqx.partition(q, _adjoint.solver_mask(q))
    marks = jax.tree.map(lambda x: np.zeros(x.shape, bool), params)
    for leaf, mask in CASES[name][1].items():
        marks = eqx.tree_at(lambda p: getattr(p.factor, leaf), marks, mask(q.dim))
    return np.concatenate([np.ravel(x) for x in jax.tree.leaves(marks)])
