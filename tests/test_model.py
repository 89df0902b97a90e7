"""`Sites` and `Model`: projections against dense formulas, offsets, groups, and input validation."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import sparse as jsparse

import gkl_jax as gk


def _q(D, seed=0):
    rng = np.random.default_rng(seed)
    C = np.triu(rng.normal(size=(D, D))) + 2 * np.eye(D)
    return gk.Gaussian(jnp.asarray(rng.normal(size=D)), gk.factors.Full(jnp.asarray(C))), C


def test_project_matches_dense_moments_with_offsets():
    """(m_n, s_n^2) = (h_n^T m + offset_n, h_n^T C^T C h_n + variance_offset_n)."""
    rng = np.random.default_rng(1)
    H = rng.normal(size=(5, 3))
    off, voff = rng.normal(size=5), rng.uniform(size=5)
    q, C = _q(3)
    sites = gk.Sites(H, gk.potentials.Gaussian(jnp.zeros(5)), offset=off, variance_offset=voff)
    m_n, s2_n = sites.project(q)
    np.testing.assert_allclose(m_n, H @ np.asarray(q.mean) + off, rtol=1e-13)
    np.testing.assert_allclose(s2_n, np.einsum("nd,de,ne->n", H, C.T @ C, H) + voff, rtol=1e-12)
    # expected_log_phi sums the per-site expectations
    expected = np.sum(-0.5 * np.log(2 * np.pi) - 0.5 * (np.asarray(m_n) ** 2 + np.asarray(s2_n)))
    assert abs(float(sites.expected_log_phi(q)) - expected) < 1e-12


def test_identity_sparse_and_dense_sites_agree():
    rng = np.random.default_rng(2)
    q, C = _q(4)
    H = rng.normal(size=(6, 4)) * (rng.uniform(size=(6, 4)) < 0.5)
    pot = gk.potentials.Logistic(jnp.where(jnp.arange(6) % 2 == 0, 1.0, -1.0))
    project = jax.jit(lambda sites, q: sites.project(q))
    dense = project(gk.Sites(H, pot), q)
    sparse = project(gk.Sites(jsparse.BCOO.fromdense(jnp.asarray(H)), pot), q)
    for a, b in zip(dense, sparse):
        np.testing.assert_allclose(a, b, rtol=1e-12)
    ident = jax.jit(lambda q: gk.Sites(None, gk.potentials.Gaussian(jnp.zeros(4))).project(q))(q)
    np.testing.assert_allclose(ident[0], q.mean, rtol=1e-14)
    np.testing.assert_allclose(ident[1], np.sum(C ** 2, axis=0), rtol=1e-13)


def test_model_groups_dimension_and_log_concavity():
    rng = np.random.default_rng(3)
    a = gk.Sites(rng.normal(size=(4, 3)), gk.potentials.Logistic(jnp.ones(4)))
    b = gk.Sites(rng.normal(size=(2, 3)), gk.potentials.StudentT(jnp.zeros(2), 3.0))
    m1 = gk.Model(gk.priors.Isotropic(3), a)
    assert m1.dim == 3 and len(m1.sites) == 1 and m1.log_concave
    m2 = gk.Model(None, [a, b])
    assert m2.dim == 3 and not m2.log_concave
    q, _ = _q(3)
    groups = jax.jit(lambda m2, q: gk.bound(m2, q) - gk.bound(gk.Model(None, m2.sites[0]), q)
                     - m2.sites[1].expected_log_phi(q))
    assert abs(float(groups(m2, q))) < 1e-12


def test_models_are_pytrees_that_jit_and_differentiate():
    rng = np.random.default_rng(4)
    H = rng.normal(size=(4, 2))
    q, _ = _q(2)

    def value(scale):
        model = gk.Model(gk.priors.Isotropic(2, 1.0), gk.Sites(H, gk.potentials.Laplace(jnp.zeros(4), scale)))
        return gk.bound(model, q)

    g = jax.jit(jax.grad(value))(0.7)
    fd = (value(0.7 + 1e-6) - value(0.7 - 1e-6)) / 2e-6
    assert abs(float(g - fd)) < 1e-7


@pytest.mark.parametrize(
    "make, arg",
    [
        (lambda: gk.Sites(np.ones(3), gk.potentials.Gaussian(np.zeros(3))), "H"),
        (lambda: gk.Sites(np.ones((2, 2, 2)), gk.potentials.Gaussian(np.zeros(2))), "H"),
        (lambda: gk.Sites(np.ones((3, 2)), gk.potentials.Gaussian(np.zeros(4))), "rows"),
        (lambda: gk.Sites(np.ones((3, 2)), gk.potentials.Logistic(np.ones(2))), "rows"),
        (lambda: gk.Sites(np.array([[1.0, np.nan]]), gk.potentials.Gaussian(np.zeros(1))), "H"),
        (lambda: gk.Sites(np.array([[1.0, np.inf]]), gk.potentials.Gaussian(np.zeros(1))), "H"),
        (lambda: gk.Sites(np.ones((3, 2)), gk.potentials.Gaussian(np.zeros(3)), offset=np.zeros(2)), "offset"),
        (lambda: gk.Sites(np.ones((3, 2)), gk.potentials.Gaussian(np.zeros(3)), offset=[0.0, np.nan, 0.0]), "offset"),
        (lambda: gk.Sites(np.ones((3, 2)), gk.potentials.Gaussian(np.zeros(3)), variance_offset=np.ones(4)),
         "variance_offset"),
        (lambda: gk.Sites(np.ones((3, 2)), "logistic"), "potential"),
        (lambda: gk.Model(gk.priors.Isotropic(3), gk.Sites(np.ones((2, 2)), gk.potentials.Gaussian(np.zeros(2)))),
         "dimension"),
        (lambda: gk.Model(None, []), "prior"),
        (lambda: gk.Model("prior", gk.Sites(np.ones((2, 2)), gk.potentials.Gaussian(np.zeros(2)))), "prior"),
        (lambda: gk.Model(gk.priors.Isotropic(2), ["sites"]), "sites"),
        (lambda: gk.Model(None, [gk.Sites(np.ones((2, 2)), gk.potentials.Gaussian(np.zeros(2))),
                                 gk.Sites(np.ones((2, 3)), gk.potentials.Gaussian(np.zeros(2)))]), "columns"),
        (lambda: gk.Model(gk.priors.Isotropic(3), gk.Sites(None, gk.potentials.Gaussian(np.zeros(2)))), "dim"),
    ],
)
def test_bad_inputs_raise_value_error_naming_the_argument(make, arg):
    with pytest.raises(ValueError, match=arg):
        make()
