"""The class-contrast reduction of the multiclass solver (`gkl_jax.multiclass._contrast`) against dense oracles."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import gkl_jax as gk
from gkl_jax.multiclass import _blocks, _contrast, _full, _hyper, _sweep


def _prior(n, C, seed=0, variance=3.0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 2))
    K = _full.prior_covariance(gk.kernels.SquaredExponential(variance, 1.2), X, C, jitter=1e-6)
    return rng, K, jnp.linalg.cholesky(K[::C, ::C])


def _contrast_precisions(rng, n, C, P):
    """Random positive semi-definite W_i = P M_i M_i^T P^T (W_i 1 = 0)."""
    M = rng.normal(size=(n, C - 1, C - 1))
    return _contrast.from_contrasts(jnp.asarray(0.4 * M @ M.transpose(0, 2, 1)), P)


@pytest.mark.parametrize("C", [2, 3, 4, 7])
def test_contrast_basis_is_orthonormal_and_orthogonal_to_the_class_sum(C):
    P = np.asarray(_contrast.contrast_basis(C, jnp.float64))
    assert P.shape == (C, C - 1)
    np.testing.assert_allclose(P.T @ P, np.eye(C - 1), atol=1e-15)
    np.testing.assert_allclose(P.T @ np.ones(C), 0.0, atol=1e-15)
    np.testing.assert_allclose(P @ P.T, np.eye(C) - 1.0 / C, atol=1e-15)


@pytest.mark.parametrize("C", [3, 5])
def test_contrast_covariance_equals_the_dense_covariance(C):
    """V's blocks, log|K^{-1} V|, tr(K^{-1} V), V u and T = W - W V W from the n (C - 1) contrasts equal the dense
    (K^{-1} + W)^{-1} of the full n C latents when W_i 1 = 0."""
    n = 24
    rng, K, Lx = _prior(n, C)
    P = _contrast.contrast_basis(C, K.dtype)
    W = _contrast_precisions(rng, n, C, P)
    Vb, logdet, trace, G = _sweep._covariance(K, _sweep.prior_factor(K, Lx, P), W, Lx, P)
    assert G.shape == (n * (C - 1), n * (C - 1))
    V = jnp.linalg.inv(jnp.linalg.inv(K) + _blocks.blockdiag_dense(W))
    Kinv_V = jnp.linalg.solve(K, V)
    np.testing.assert_allclose(Vb, _blocks.blocks(V, C), rtol=1e-9, atol=1e-11)
    np.testing.assert_allclose(logdet, jnp.linalg.slogdet(Kinv_V)[1], rtol=1e-9)
    np.testing.assert_allclose(trace, jnp.trace(Kinv_V), rtol=1e-9)
    u = jnp.asarray(rng.normal(size=n * C))
    np.testing.assert_allclose(_contrast.contrast_covariance_times(G, Lx, P, u), V @ u, rtol=1e-9, atol=1e-10)
    Wd = _blocks.blockdiag_dense(W)
    T = _hyper._t_matrix(_sweep.State(b=None, S=None, W=W, Vb=Vb, G=G, logdet_kv=logdet, trace_kv=trace, value=None,
                                      v_gain=None), P)
    np.testing.assert_allclose(T, Wd - Wd @ V @ Wd, atol=1e-10)
    dense = _sweep._covariance(K, jnp.linalg.cholesky(K), W)
    np.testing.assert_allclose(dense[1], logdet, rtol=1e-9)


def test_b_direction_solves_the_dense_newton_system():
    """The (C - 1)-per-datum Woodbury solve of `b_direction` equals the dense solution of
    (I + D M) d = -(b - gbar), M = K + blockdiag(S_i^{-1}), D_i = diag(gbar_i) - gbar_i gbar_i^T (eq. 65), also where
    some gbar_i^c are tiny and where the b_i do not sum to one; with K^x given (K = K^x (x) I_C) as well."""
    n, C = 12, 4
    rng, K, Lx = _prior(n, C, seed=3, variance=30.0)
    Y = jnp.eye(C)[np.arange(n) % C]
    st = _sweep.initial_state(K, Y)
    b = jnp.asarray(rng.normal(size=(n, C)) * 2.0)
    A = rng.normal(size=(n, C, C))
    S = jnp.asarray(A @ A.transpose(0, 2, 1) + 0.5 * np.eye(C))
    st = st.__class__(**{**{f: getattr(st, f) for f in st.__dataclass_fields__}, "b": b, "S": S})
    d = _sweep.b_direction(K, Y, st, False)
    gbar, _ = _sweep.site_moments(K, Y, b, S, st.Vb, False)
    assert float(jnp.min(gbar)) < 1e-6      # some near-zero probabilities: the QR factor needs no positive gbar
    D = _blocks.blockdiag_dense(jax.vmap(lambda g: jnp.diag(g) - jnp.outer(g, g))(gbar))
    M = K + _blocks.blockdiag_dense(jnp.linalg.inv(S))
    dense = jnp.linalg.solve(jnp.eye(n * C) + D @ M, -(b - gbar).reshape(-1))
    np.testing.assert_allclose(d.reshape(-1), dense, rtol=1e-8, atol=1e-10)
    d_kx = _sweep.b_direction(K, Y, st, False, Kx=K[::C, ::C])
    np.testing.assert_allclose(d_kx.reshape(-1), dense, rtol=1e-8, atol=1e-10)


def test_contrast_v_direction_equals_the_full_direction():
    """The V step's Newton direction and slope solved on the contrasts equal those of the full n C system from the
    same state (the App. E.3 start, whose W_i annihilate 1)."""
    n, C = 20, 3
    rng, K, Lx = _prior(n, C, seed=5)
    Y = jnp.eye(C)[rng.permutation(np.arange(n) % C)]
    full = _sweep.initial_state(K, Y)
    red = _sweep.initial_state(K, Y, Lx=Lx)
    np.testing.assert_allclose(red.value, full.value, rtol=1e-12)
    np.testing.assert_allclose(red.b, full.b, atol=1e-10)
    P = _sweep.contrasts_of(Lx, False, C, K.dtype)
    d_full, slope_full, *_ = _sweep.v_direction(K, Y, full, False, False, True, 50)
    d_red, slope_red, *_ = _sweep.v_direction(K, Y, red, False, False, True, 50, P)
    np.testing.assert_allclose(slope_red, slope_full, rtol=1e-8)
    np.testing.assert_allclose(d_red, d_full, rtol=1e-7, atol=1e-9 * float(jnp.max(jnp.abs(d_full))))


def test_the_optimum_keeps_the_class_sums_at_their_prior():
    """At the optimum of the full (dense) solver every W_i annihilates 1 and every b_i sums to one, the facts the
    contrast solver rests on; the contrast solver (the Kronecker path) reaches the same bound and W."""
    n, C = 30, 3
    rng, K, Lx = _prior(n, C, seed=7, variance=20.0)
    Y = jnp.eye(C)[rng.permutation(np.arange(n) % C)]
    dense = _full.fit_full(K, Y, tol=1e-12)
    red = _full.fit_full(K, Y, tol=1e-12, kron=True)
    assert bool(dense.converged) and bool(red.converged)
    np.testing.assert_allclose(jnp.sum(dense.W, axis=-1), 0.0, atol=1e-8)
    np.testing.assert_allclose(jnp.sum(dense.b, axis=-1), 1.0, atol=1e-12)
    np.testing.assert_allclose(red.log_z, dense.log_z, rtol=1e-11)
    np.testing.assert_allclose(red.W, dense.W, atol=1e-5)
