"""Kernels against hand-written formulas, PSD Gram matrices, gradients, composition and bad inputs."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import gkl_jax as gk
from gkl_jax import kernels as K


def _r2(x1, x2, ell):
    return np.sum(((np.asarray(x1) - np.asarray(x2)) / ell) ** 2)


FORMULAS = [
    (lambda: K.SquaredExponential(1.7, [0.5, 2.0, 1.3]), lambda a, b: 1.7 * np.exp(-0.5 * _r2(a, b, [0.5, 2.0, 1.3]))),
    (lambda: K.Matern12(0.8, 1.5), lambda a, b: 0.8 * np.exp(-np.sqrt(_r2(a, b, 1.5)))),
    (lambda: K.Matern32(0.8, 1.5),
     lambda a, b: 0.8 * (1 + np.sqrt(3 * _r2(a, b, 1.5))) * np.exp(-np.sqrt(3 * _r2(a, b, 1.5)))),
    (lambda: K.Matern52(2.0, 0.7),
     lambda a, b: 2.0 * (1 + np.sqrt(5 * _r2(a, b, 0.7)) + 5 * _r2(a, b, 0.7) / 3)
     * np.exp(-np.sqrt(5 * _r2(a, b, 0.7)))),
    (lambda: K.RationalQuadratic(1.2, 0.9, 2.5), lambda a, b: 1.2 * (1 + _r2(a, b, 0.9) / 5.0) ** -2.5),
    (lambda: K.Linear(0.3), lambda a, b: 0.3 * np.dot(a, b)),
    (lambda: K.Constant(0.6), lambda a, b: 0.6),
    (lambda: K.SquaredExponential(1.1, 0.8) + K.Linear(0.2),
     lambda a, b: 1.1 * np.exp(-0.5 * _r2(a, b, 0.8)) + 0.2 * np.dot(a, b)),
    (lambda: K.Matern32(1.0, 2.0) * K.Constant(3.0),
     lambda a, b: 3.0 * (1 + np.sqrt(3 * _r2(a, b, 2.0))) * np.exp(-np.sqrt(3 * _r2(a, b, 2.0)))),
]


@pytest.mark.parametrize("make, formula", FORMULAS)
def test_gram_matches_formula_and_is_psd(make, formula, rng):
    k = make()
    X1 = rng.normal(size=(6, 3))
    X2 = rng.normal(size=(4, 3))
    expected = np.array([[formula(a, b) for b in X2] for a in X1])
    np.testing.assert_allclose(k.gram(X1, X2), expected, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(k(X1[0], X2[1]), expected[0, 1], rtol=1e-12, atol=1e-14)
    G = np.asarray(k.gram(X1))
    np.testing.assert_allclose(G, G.T, atol=1e-14)
    np.testing.assert_allclose(k.diag(X1), np.diag(G), rtol=1e-12, atol=1e-14)
    assert np.linalg.eigvalsh(G).min() > -1e-10


def test_white_kernel():
    k = K.White(0.4)
    X = np.array([[0.0], [1.0], [1.0]])
    np.testing.assert_allclose(k.gram(X), 0.4 * np.eye(3))       # duplicates still get independent noise
    np.testing.assert_allclose(k.gram(X, X[:2]), [[0.4, 0], [0, 0.4], [0, 0.4]])
    np.testing.assert_allclose((K.SquaredExponential() + k).diag(X), 1.4)


def test_parameters_are_unconstrained_with_properties():
    k = K.SquaredExponential(2.0, [1.0, 3.0])
    np.testing.assert_allclose(k.log_variance, np.log(2.0))
    np.testing.assert_allclose(k.lengthscale, [1.0, 3.0])
    assert float(K.RationalQuadratic(alpha=4.0).alpha) == pytest.approx(4.0)


def test_gradients_match_finite_differences(rng):
    X = rng.normal(size=(5, 2))
    k = K.Matern52(1.3, [0.7, 1.9]) + K.RationalQuadratic(0.5, 1.1, 1.5)
    f = jax.jit(lambda kk: jnp.sum(jnp.sin(kk.gram(X))))
    grad = jax.grad(f)(k)
    leaves, treedef = jax.tree.flatten(k)
    gleaves = jax.tree.leaves(grad)
    eps = 1e-6
    for i, leaf in enumerate(leaves):
        for j in np.ndindex(np.shape(leaf)):
            bump = np.zeros(np.shape(leaf))
            bump[j] = eps
            up = list(leaves)
            dn = list(leaves)
            up[i] = leaf + bump
            dn[i] = leaf - bump
            fd = (f(jax.tree.unflatten(treedef, up)) - f(jax.tree.unflatten(treedef, dn))) / (2 * eps)
            np.testing.assert_allclose(np.asarray(gleaves[i])[j], fd, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("dim", [K._kernels.DIRECT_MAX_DIM, K._kernels.DIRECT_MAX_DIM + 2])
def test_both_gram_paths_equal_the_pointwise_kernel(dim, rng):
    """r^2 from differences (dim <= DIRECT_MAX_DIM) and from the product (above) against k(x, x') per pair, with
    scalar and ARD lengthscales."""
    X1, X2 = rng.normal(size=(7, dim)), rng.normal(size=(5, dim))
    for k in (K.SquaredExponential(1.3, 0.7), K.Matern12(0.8, rng.uniform(0.5, 2, dim)), K.Matern52(2.0, 1.1),
              K.RationalQuadratic(1.2, rng.uniform(0.5, 2, dim), 2.5)):
        pointwise = np.array([[float(k(a, b)) for b in X2] for a in X1])
        np.testing.assert_allclose(k.gram(X1, X2), pointwise, rtol=1e-12, atol=1e-14)


def test_low_dimensional_gram_is_exact_far_from_the_origin():
    """Timestamps: points 1 apart at 1e8 (the product form's cancellation, eps * 1e16, would give r^2 = 0), and
    points 1e155 apart (|x|^2 overflows there)."""
    X = np.array([0.0, 1e8, 1e8 + 1.0])
    for k in (K.SquaredExponential(1.0, 1.0), K.Matern32(1.0, 1.0)):
        np.testing.assert_allclose(k.gram(X)[1, 2], k(X[1:2], X[2:3]), rtol=1e-14)
    np.testing.assert_allclose(K.SquaredExponential(1.0, 1.0).gram(X)[1, 2], np.exp(-0.5), rtol=1e-14)
    assert np.all(K.SquaredExponential(1.0, 1.0).gram(np.array([0.0, 1.0]), np.array([1e155])) == 0.0)


def test_gradient_at_coincident_points_is_finite():
    X = np.array([[0.0], [0.0]])
    for k in (K.Matern12(), K.Matern32(), K.Matern52()):
        g = jax.grad(lambda kk: jnp.sum(kk.gram(X)))(k)
        assert all(np.all(np.isfinite(x)) for x in jax.tree.leaves(g))


@pytest.mark.parametrize("make, name", [
    (lambda: K.SquaredExponential(lengthscale=-1.0), "lengthscale"),
    (lambda: K.Matern32(lengthscale=[1.0, 0.0]), "lengthscale"),
    (lambda: K.Matern52(variance=0.0), "variance"),
    (lambda: K.RationalQuadratic(alpha=-2.0), "alpha"),
    (lambda: K.Linear(variance=-1.0), "variance"),
    (lambda: K.White(variance=np.nan), "variance"),
])
def test_non_positive_parameters_raise(make, name):
    with pytest.raises(ValueError, match=name):
        make()


def test_bad_inputs_raise():
    k = K.SquaredExponential(1.0, [1.0, 2.0])
    with pytest.raises(ValueError, match="lengthscale"):
        k.gram(np.ones((3, 3)))
    with pytest.raises(ValueError, match="X1"):
        k.gram(np.array([[0.0, np.nan]]))
    with pytest.raises(ValueError, match="X2"):
        K.SquaredExponential().gram(np.ones((2, 2)), np.ones((2, 3)))
    with pytest.raises(ValueError, match="k2"):
        K.Sum(K.Constant(), "not a kernel")


def test_gp_prior_matches_dense_prior(rng):
    X = rng.normal(size=(7, 2))
    k = K.SquaredExponential(1.5, 0.8)
    gp = gk.priors.GP(k, X, mean=0.3, jitter=1e-6)
    dense = gk.priors.Dense(np.asarray(k.gram(X)) + 1e-6 * np.eye(7), mean=0.3)
    q = gk.Gaussian(rng.normal(size=7), gk.factors.Full(np.triu(rng.normal(size=(7, 7))) + 3 * np.eye(7)))
    np.testing.assert_allclose(gp.expected_log_density(q), dense.expected_log_density(q), rtol=1e-10)
    np.testing.assert_allclose(gp.logdet(), dense.logdet(), rtol=1e-12)
    np.testing.assert_allclose(gp.precision_dense(), dense.precision_dense(), rtol=1e-8)
    np.testing.assert_allclose(gp.marginal_variances(), 1.5 + 1e-6)


def test_gp_prior_bad_inputs():
    k = K.SquaredExponential()
    with pytest.raises(ValueError, match="X"):
        gk.priors.GP(k, np.array([[0.0], [np.nan]]))
    with pytest.raises(ValueError, match="kernel"):
        gk.priors.GP(np.eye(2), np.zeros((2, 1)))
    with pytest.raises(ValueError, match="mean"):
        gk.priors.GP(k, np.zeros((3, 1)), mean=np.zeros(2))
    with pytest.raises(ValueError, match="jitter"):
        gk.priors.GP(k, np.zeros((3, 1)), jitter=-1.0)


def test_building_a_kernel_compiles_nothing_and_keeps_dtypes():
    """Kernel parameters are logged on the host (no small XLA program per new shape on a first fit), with the
    value's dtype, weak type for Python scalars, and the same numbers as jnp.log."""
    events = []

    def listener(event, duration, **kwargs):
        if event == "/jax/core/compile/backend_compile_duration":
            events.append(kwargs.get("fun_name"))

    lengthscales = np.linspace(0.5, 3.0, 23)        # a shape no other test gives a kernel
    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        k = K.SquaredExponential(2.5, lengthscales)
        m = K.Matern32(np.float32(0.7), 1.5)
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)
    assert events == []
    assert k.log_variance.weak_type and k.log_variance.shape == ()
    np.testing.assert_allclose(k.log_variance, np.log(2.5), rtol=1e-6)
    np.testing.assert_allclose(k.log_lengthscale, np.log(lengthscales), rtol=1e-6)
    assert k.log_lengthscale.dtype == jnp.asarray(lengthscales).dtype and not k.log_lengthscale.weak_type
    assert m.log_variance.dtype == np.float32 and not m.log_variance.weak_type
    # traced: the same values through jnp.log, differentiable
    g = jax.grad(lambda v: K.SquaredExponential(v, 1.0).log_variance)(2.0)
    np.testing.assert_allclose(g, 0.5, rtol=1e-6)
