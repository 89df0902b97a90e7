"""gk.multiclass's site bound (Chai 2012, Theorem 6) against Monte Carlo and quadrature, its special cases and
closed-form updates, and Theorems 9 and 10 against the paper's Table 3."""

import math

import _helpers_multiclass
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _helpers_multiclass import N_CLASSES, N_DATA, _problem

import gkl_jax as gk
from gkl_jax import multiclass as mc
from gkl_jax.multiclass import _full, _site, _theory

# fixtures shared with the other test_multiclass_* files (defined in _helpers_multiclass.py)
_single_threaded_blas = _helpers_multiclass._single_threaded_blas


def _random_site(rng, C):
    m = jnp.asarray(rng.normal(size=C))
    A = rng.normal(size=(C, C))
    V = jnp.asarray(A @ A.T / C + 0.3 * np.eye(C))
    return m, V


# ----------------------------------------------------------------------------------------------- Theorem 6 (site)

def test_site_bound_orderings_against_monte_carlo():
    """Jensen (9), (10) <= max h <= ell (MC) <= log softmax(m)_y (Lemma 7); any (b, S) gives h <= max h."""
    rng = np.random.default_rng(1)
    for C in (3, 3):
        m, V = _random_site(rng, C)
        y = jnp.eye(C)[0]
        best = mc.expected_log_softmax_bound(y, m, V)
        ell, se = _site.expected_log_softmax_mc(jax.random.PRNGKey(C), y, m, V, 400_000)
        assert best <= ell + 5 * se
        assert ell - best < 0.05  # the bound is tight (notes: 0.006-0.011 nats per site)
        assert _site.jensen_bound(y, m, V, variant=9) <= best
        assert _site.jensen_bound(y, m, V, variant=10) <= best
        assert ell <= _site.softmax_upper_bound(y, m) + 5 * se
        b = jnp.asarray(rng.normal(size=C))
        S = jnp.linalg.inv(V) + jnp.eye(C)
        assert _site.site_bound(y, m, V, b, S) <= best


def test_site_bound_below_exact_expectation_by_quadrature():
    """C = 3: ell = E[-log(1 + sum_{c != y} exp(f_c - f_y))] depends on the 2-D Gaussian of the differences;
    a 60 x 60 Gauss-Hermite product rule evaluates it to ~1e-10."""
    rng = np.random.default_rng(2)
    x, w = np.polynomial.hermite_e.hermegauss(60)
    z1, z2 = np.meshgrid(x, x, indexing="ij")
    ww = np.outer(w, w) / (2 * np.pi)
    for y_index in range(3):
        m, V = _random_site(rng, 3)
        y = jnp.eye(3)[y_index]
        D = np.eye(3)[[c for c in range(3) if c != y_index]] - np.eye(3)[y_index]  # u = D f
        mu, L = D @ np.asarray(m), np.linalg.cholesky(D @ np.asarray(V) @ D.T)
        u1 = mu[0] + L[0, 0] * z1
        u2 = mu[1] + L[1, 0] * z1 + L[1, 1] * z2
        ell = -np.sum(ww * np.log1p(np.exp(u1) + np.exp(u2)))
        best = float(mc.expected_log_softmax_bound(y, m, V))
        assert best <= ell + 1e-9
        assert ell - best < 0.05


def test_special_cases_of_h_are_the_jensen_and_knowles_minka_bounds():
    rng = np.random.default_rng(3)
    m, V = _random_site(rng, 4)
    y = jnp.eye(4)[2]
    Vinv = jnp.linalg.inv(V)
    np.testing.assert_allclose(_site.site_bound(y, m, V, y, Vinv), _site.jensen_bound(y, m, V, variant=9), rtol=1e-12)
    np.testing.assert_allclose(_site.site_bound(y, m, V, 0 * y, Vinv), _site.jensen_bound(y, m, V, variant=10),
                               rtol=1e-12)
    b = jnp.asarray(rng.normal(size=4))
    np.testing.assert_allclose(_site.site_bound(y, m, V, b, Vinv), _site.knowles_minka_bound(y, m, V, b), rtol=1e-12)


@pytest.mark.parametrize("C, variance, printed", [(3, 1.0, -1.392044), (7, 1.0, -2.348509),
                                                  (3, math.pi**2 / 6, -1.553772)])
def test_lemma29_equality_at_zero_mean(C, variance, printed):
    """max_{b,S} h for q = N(0, s2 I) equals Lemma 29's closed form; b* = 1/C, S* eigenvalues {1/s2, lambda/s2}."""
    closed = _theory.isotropic_site_maximum(C, variance)
    assert abs(float(closed) - printed) < 5e-7
    if C != 3:
        return  # one compiled site optimiser (C = 3) for the test suite's time budget
    opt = _site.optimise_site(jnp.zeros(C), variance * jnp.eye(C))
    np.testing.assert_allclose(opt.value, closed, atol=1e-10)
    np.testing.assert_allclose(opt.b, np.full(C, 1 / C), atol=1e-8)
    lam = math.sqrt(variance / C + 0.25) + 0.5
    expected = np.sort([1 / variance] + [lam / variance] * (C - 1))
    np.testing.assert_allclose(np.linalg.eigvalsh(np.asarray(opt.S)), expected, rtol=1e-7)


def test_closed_form_s_update_is_the_numerical_maximiser():
    """For fixed (b, A) eq. 61 solves -S V S + S + A = 0; at the optimum of h the gradient in S vanishes and
    h(S*) beats a numerical maximiser over the Cholesky factor of S (scipy)."""
    from scipy.optimize import minimize

    rng = np.random.default_rng(4)
    C = 3
    m, V = _random_site(rng, C)
    A = jnp.asarray(np.cov(rng.normal(size=(C, 10))))
    S = _site.s_fixed_point(V, A)
    np.testing.assert_allclose(-S @ V @ S + S + A, 0 * A, atol=1e-10)
    y = jnp.eye(C)[1]
    opt = _site.optimise_site(m, V)
    bound = jax.jit(lambda S: _site.site_bound(y, m, V, opt.b, S))
    grad_S = jax.jit(jax.grad(bound))(opt.S)
    assert float(jnp.max(jnp.abs(grad_S))) < 1e-6
    tril = np.tril_indices(C)

    def negative(theta):
        L = np.zeros((C, C))
        L[tril] = theta
        return -float(bound(jnp.asarray(L @ L.T + 1e-9 * np.eye(C))))

    L0 = np.linalg.cholesky(np.asarray(jnp.linalg.inv(V)))[tril]
    numerical = -minimize(negative, L0, method="BFGS", options={"gtol": 1e-10}).fun
    assert float(bound(opt.S)) >= numerical - 1e-8


# ------------------------------------------------------------------------------------- Theorems 9 and 10 (Table 3)

@pytest.mark.parametrize("n, C, printed, printed_probit", [(90, 3, -125.28, -139.84), (129, 3, -179.57, -200.44),
                                                           (106, 3, -147.56, -164.70), (128, 7, -300.61, -331.06)])
def test_theorem10_matches_table3(n, C, printed, printed_probit):
    assert round(float(mc.correlation_bound(n, C, 1.0)), 2) == printed
    assert round(float(mc.correlation_bound(n, C, math.pi**2 / 6)), 2) == printed_probit
    assert mc.correlation_bound(n, C, 1.0, weak=True) < mc.correlation_bound(n, C, 1.0)


def test_theorem9_is_below_theorem10_for_a_correlation_kernel():
    X, labels, Y, _ = _problem(variance=1.0)
    K = _full.prior_covariance(gk.kernels.SquaredExponential(1.0, 1.0), X, N_CLASSES, jitter=1e-3)
    t9 = _theory.gram_matrix_bound(K, N_CLASSES)
    assert t9 <= mc.correlation_bound(N_DATA, N_CLASSES, 1.0 + 1e-3)
    assert t9 >= _theory.gram_matrix_bound(K, N_CLASSES, variational_variance=0.5) - 1e-9


@pytest.mark.parametrize("bad", [dict(num_data=0, num_classes=3), dict(num_data=5, num_classes=1),
                                 dict(num_data=5, num_classes=3, variance=-1.0)])
def test_theorem10_rejects_bad_arguments(bad):
    with pytest.raises(ValueError, match=list(bad)[-1] if "variance" in bad else "num_"):
        mc.correlation_bound(**bad)
