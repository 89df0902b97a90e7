"""Oracle tests for gk.multiclass (Chai 2012, variational multinomial-logit GP): log Z_h and its fit, the
Kronecker path, hyperparameter gradients, and the predictions (Theorem 12) against importance sampling. The site
bound and Theorems 9-10: tests/test_multiclass_site.py; the classifier: tests/test_multiclass_classifier.py; the
sparse approximation: tests/test_multiclass_sparse.py."""

import math

import _helpers_multiclass
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _helpers_multiclass import N_CLASSES, N_DATA, _problem

import gkl_jax as gk
from gkl_jax import multiclass as mc
from gkl_jax._linalg import invert_lower
from gkl_jax.multiclass import (
    _blocks,
    _full,
    _hyper,
    _predict,
    _qcg,
    _sampling,
    _site,
    _sweep,
)

# fixtures shared with the other test_multiclass_* files (defined in _helpers_multiclass.py)
_single_threaded_blas = _helpers_multiclass._single_threaded_blas
fitted = _helpers_multiclass.fitted
public_fits = _helpers_multiclass.public_fits


# ------------------------------------------------------------------------------------------ log Z_h and its fit

def test_fit_is_monotone_stationary_and_matches_the_reference_formula(fitted):
    X, labels, Y, K, post = fitted
    assert bool(post.converged)
    hist = np.asarray(post.history)
    hist = hist[np.isfinite(hist)]
    assert np.all(np.diff(hist) >= -1e-12 * np.abs(hist[1:]))
    assert float(post.stationarity) < 1e-5  # b = gbar (Lemma 26)
    m, V = post.mean(K), post.covariance(K)
    np.testing.assert_allclose(_full.log_z_h(K, Y, m, V, post.b, post.S), post.log_z, rtol=1e-10)
    alpha = np.asarray(post.alpha).reshape(N_DATA, N_CLASSES)
    np.testing.assert_allclose(alpha.sum(axis=1), 0.0, atol=1e-10)  # sum-to-zero (Section 5)
    W = np.asarray(post.W)
    np.testing.assert_allclose(W @ np.ones(N_CLASSES), 0.0, atol=1e-5)  # null(W*) = span(1)
    assert np.min(np.linalg.eigvalsh(W)) > -1e-8


def test_paper_fixed_point_and_newton_reach_the_same_optimum_monotonically(fitted):
    X, labels, Y, K, post = fitted
    paper = _full.fit_full(K, Y, v_update="fixed_point", max_steps=200)
    hist = np.asarray(paper.history)
    hist = hist[np.isfinite(hist)]
    assert np.all(np.diff(hist) >= -1e-12 * np.abs(hist[1:]))
    np.testing.assert_allclose(paper.log_z, post.log_z, rtol=1e-7)
    assert int(post.num_steps) < int(paper.num_steps)


@pytest.mark.slow
def test_v_step_cg_solves_the_newton_system_in_few_iterations(fitted):
    """The Q-inner-product CG returns the solution of (Q + Q D Q) x = Q R (dense oracle over the symmetric blocks)
    and needs far fewer iterations than unknowns, because its rate does not depend on cond(Q)."""
    X, labels, Y, K, post = fitted
    n, C = Y.shape
    st = _sweep.initial_state(K, Y)
    _, A = _sweep.site_moments(K, Y, st.b, st.S, st.Vb, False)
    S_fx, G, phi = jax.vmap(_site.s_fixed_point_profile)(st.Vb, A)
    R = _blocks.sym(S_fx - jnp.linalg.inv(st.Vb) - st.W)
    V = st.G @ st.G.T
    Q = lambda X: _blocks.sandwich_blocks(V, X)
    D = lambda X: jax.vmap(_site.profile_sensitivity)(G, phi, X)
    iu = np.triu_indices(C)
    to_blocks = lambda v: _blocks.sym(jnp.zeros((n, C, C)).at[:, iu[0], iu[1]].set(v.reshape(n, -1)))
    to_vec = lambda B: B[:, iu[0], iu[1]].reshape(-1)
    hess = jax.jacfwd(lambda v: to_vec(Q(to_blocks(v)) + Q(D(Q(to_blocks(v))))))(jnp.zeros(n * len(iu[0])))
    x_dense = to_blocks(jnp.linalg.solve(hess, to_vec(Q(R))))
    x_cg = _qcg.q_conjugate_gradient(Q, D, R, max_iters=12, rtol=1e-12)
    np.testing.assert_allclose(x_cg, x_dense, rtol=1e-6, atol=1e-8 * float(jnp.max(jnp.abs(x_dense))))


def test_public_fit_takes_the_kronecker_path_and_equals_the_dense_fit(fitted, public_fits):
    """With K = K^x (x) I_C, L^T W L from L^x alone (O(n^3 C^2)) equals the dense product, and `fit` on a kernel
    (which takes that path) and on a class covariance I_C (the dense path) reach the dense fit of the same K."""
    X, labels, Y, K, post = fitted
    kernel, kron, dense = public_fits
    n, C = Y.shape
    Kx = kernel.gram(jnp.asarray(X)) + 1e-8 * jnp.eye(n)
    np.testing.assert_allclose(jnp.kron(Kx, jnp.eye(C)), K, atol=1e-14)
    np.testing.assert_allclose(kron.prior_covariance(), K, atol=1e-14)
    Lx = jnp.linalg.cholesky(Kx)
    LK = _sweep.prior_factor(K, Lx)
    np.testing.assert_allclose(LK @ LK.T, K, atol=1e-12)
    rng = np.random.default_rng(0)
    W = rng.normal(size=(n, C, C))
    W = jnp.asarray(W + W.transpose(0, 2, 1))
    np.testing.assert_allclose(_sweep._lwl(LK, W, Lx), _sweep._lwl(LK, W), atol=1e-12)
    np.testing.assert_allclose(kron.log_z, post.log_z, rtol=1e-10)
    np.testing.assert_allclose(kron.W, post.W, atol=1e-6)
    np.testing.assert_allclose(dense.log_z, post.log_z, rtol=1e-12)
    np.testing.assert_allclose(kron.mean(), post.mean(K), atol=1e-6)
    assert kron.kernel is kernel and dense.class_covariance.shape == (C, C) and bool(kron.converged)
    with pytest.raises(ValueError, match="class index 3"):
        mc.fit(kernel, X, np.where(labels == 0, 3, labels), num_classes=3)
    with pytest.raises(ValueError, match="y has 7 labels"):
        mc.fit(kernel, X, labels[:7])
    with pytest.raises(ValueError, match="kernel"):
        mc.fit("rbf", X, labels)
    with pytest.raises(ValueError, match="class_covariance"):
        mc.fit(kernel, X, labels, class_covariance=np.eye(2))


def test_kronecker_covariance_and_triangular_inverse_equal_their_dense_versions():
    """V's pieces from L^x (x) I_C with the block-recursive R^{-1} (n C = 150 > the recursion's base, uneven halves)
    equal the dense triangular-solve path; R^{-1} R = I for a size that splits unevenly."""
    _, _, Y, K = _problem(seed=4, n=50)
    n, C = Y.shape
    Lx = jnp.linalg.cholesky(K[::C, ::C])
    rng = np.random.default_rng(1)
    W = rng.normal(size=(n, C, C))
    W = jnp.asarray(0.3 * (W @ W.transpose(0, 2, 1)))
    dense = _sweep._covariance(K, jnp.linalg.cholesky(K), W)
    kron = _sweep._covariance(K, _sweep.prior_factor(K, Lx), W, Lx)
    for a, b in zip(dense[:3], kron[:3]):
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-11)
    np.testing.assert_allclose(kron[3] @ kron[3].T, dense[3] @ dense[3].T, atol=1e-10)
    A = rng.normal(size=(301, 301))
    R = jnp.linalg.cholesky(jnp.asarray(A @ A.T / 301 + np.eye(301)))
    Rinv = invert_lower(R, base=32)
    np.testing.assert_allclose(Rinv @ R, np.eye(301), atol=1e-12)
    assert float(jnp.max(jnp.abs(jnp.triu(Rinv, 1)))) == 0.0


def test_v_step_slope_equals_the_finite_difference_and_a_skipped_step_keeps_the_optimum():
    """The slope 1/2 <R, Q(delta)> that lets `_v_step` skip a step is the derivative of log Z_h along delta, at a
    point away from the optimum: exactly with S_i held (the fixed-point direction), and to first order along the
    Newton direction with S_i = S^fx(V_i) profiled (exact only where S_i = S^fx, i.e. at the optimum); fits that may
    skip their last V step reach the optimum of the fixed-point fits, which never skip."""
    _, _, Y, K = _problem(seed=5)
    km, mf = False, False
    LK = jnp.linalg.cholesky(K)
    st = _sweep.initial_state(K, Y)
    st = _sweep.b_step(K, Y, st, km)
    st = _sweep.s_sweeps(_sweep._means(K, Y, st.b), st, km, 1)
    h = 1e-5
    for newton, rtol in ((False, 1e-7), (True, 2e-3)):
        delta, slope, A, _ = _sweep.v_direction(K, Y, st, km, mf, newton, 50)

        def value(t):
            Vb, ld, tr, _ = _sweep._covariance(K, LK, st.W + t * delta)
            S = jax.vmap(lambda V, a: _site.s_fixed_point_profile(V, a)[0])(Vb, A) if newton else st.S
            return _sweep.value(K, Y, st.b, S, Vb, ld, tr, km)

        assert float(slope) > 1e-3
        np.testing.assert_allclose((value(h) - value(-h)) / (2 * h), slope, rtol=rtol)
    gain = float(value(1.0) - value(0.0))
    assert 0.2 * float(slope) < gain <= float(slope)  # Newton's model: about half the slope
    newton = _full.fit_full(K, Y, tol=1e-9)
    never_skips = _full.fit_full(K, Y, tol=1e-9, v_update="fixed_point", max_steps=200)
    np.testing.assert_allclose(newton.log_z, never_skips.log_z, atol=1e-5)
    assert bool(newton.converged)


@pytest.mark.slow
@pytest.mark.parametrize("seed, variance, expected", [
    (0, 2.0, {"theorem6": -9.439982320444011, "knowles_minka": -9.696789192577821,
              "class_factorised": -9.705984044400553, "fixed_point": -9.439982320444788}),
    (11, 30.0, {"theorem6": -12.282529797404196, "knowles_minka": -13.391256564885648,
                "class_factorised": -14.286490791981103, "fixed_point": -12.28252979740476})])
def test_fit_reaches_the_previous_implementations_optimum(seed, variance, expected):
    """The optima of the four variants equal those of the previous solver (false-position segment searches and
    traced variant flags, gkl_jax before issue 36) to 1e-9, at tol 1e-13; the second prior is strongly correlated."""
    _, _, Y, K = _problem(seed=seed, variance=variance)
    variants = {"theorem6": {}, "knowles_minka": dict(site="knowles_minka"),
                "class_factorised": dict(covariance="class_factorised"),
                "fixed_point": dict(v_update="fixed_point", max_steps=200)}
    for name, kwargs in variants.items():
        post = _full.fit_full(K, Y, tol=1e-13, **kwargs)
        np.testing.assert_allclose(float(post.log_z), expected[name], rtol=0, atol=1e-9, err_msg=name)


def test_log_z_h_is_not_jointly_concave_in_v_and_s():
    """Erratum to Proposition 8: -tr(S_i V_i)/2 is bilinear, so a midpoint can fall below the chord."""
    K, Y, m, b = 100.0 * jnp.eye(2), jnp.array([[1.0, 0.0]]), jnp.zeros(2), jnp.array([[0.5, 0.5]])
    f = lambda v, s: float(_full.log_z_h(K, Y, m, v * jnp.eye(2), b, (s * jnp.eye(2))[None]))
    assert f(2.0, 2.0) < 0.5 * (f(1.0, 3.0) + f(3.0, 1.0)) - 0.5


def test_fit_traces_once_per_variant():
    """Another prior, labels or tolerance reuse the compiled fit; each variant (site, covariance) is its own
    program, so that a program holds one variant only."""
    X, labels, Y, K = _problem(seed=5)
    before = _full.TRACE_COUNT["fit_full"]
    _full.fit_full(K, Y)
    after_first = _full.TRACE_COUNT["fit_full"]
    X2, labels2, Y2, K2 = _problem(seed=6, variance=1.5)
    _full.fit_full(K2, Y2, tol=1e-9)
    assert _full.TRACE_COUNT["fit_full"] == after_first <= before + 1
    _full.fit_full(K2, Y2, site="knowles_minka")
    _full.fit_full(K, Y, site="knowles_minka")
    assert _full.TRACE_COUNT["fit_full"] <= after_first + 1


@pytest.mark.slow
def test_restricted_bounds_are_below_ours_and_all_below_importance_sampling(fitted):
    """Knowles-Minka (S = V^{-1}) and the class-factorised (mean-field) family are restrictions of our family, so
    their optima are lower; every bound sits below the importance-sampling estimate of log p(y) (App. F)."""
    X, labels, Y, K, post = fitted
    km = _full.fit_full(K, Y, site="knowles_minka")
    mf = _full.fit_full(K, Y, covariance="class_factorised")
    assert km.log_z < post.log_z and mf.log_z < post.log_z
    est = _sampling.importance_sampling(jax.random.PRNGKey(0), K, Y, post.mean(K), num_samples=200_000)
    assert post.log_z <= est.log_z_upper
    assert est.log_z - post.log_z < 0.5
    K1 = _full.prior_covariance(gk.kernels.SquaredExponential(1.0, 1.0), X, N_CLASSES, jitter=1e-8)
    assert mc.correlation_bound(N_DATA, N_CLASSES, 1.0) <= _full.fit_full(K1, Y).log_z


def test_hyperparameter_gradient_matches_finite_differences():
    """d log Z_h*/d log(lengthscale), d/d log(variance): the envelope gradient (Section 6) against central
    differences of the re-optimised bound."""
    X, labels, Y, _ = _problem(seed=7)
    kernel = gk.kernels.SquaredExponential(2.0, 1.0)

    def optimum(log_var, log_len):
        k = gk.kernels.SquaredExponential(math.exp(log_var), math.exp(log_len))
        K = _full.prior_covariance(k, X, N_CLASSES, jitter=1e-8)
        return K, _full.fit_full(K, Y, tol=1e-14, max_steps=200)  # the default: the compiled program of the fixture

    K, post = optimum(math.log(2.0), 0.0)
    T = post.t_matrix(K)
    surrogate = lambda k: _hyper.envelope_surrogate(_full.prior_covariance(k, X, N_CLASSES, jitter=1e-8), post.alpha, T)
    grad = eqx.filter_jit(jax.grad(surrogate))(kernel)
    eps = 1e-4
    for name, base, analytic in (("var", math.log(2.0), grad.log_variance), ("len", 0.0, grad.log_lengthscale)):
        args = lambda d: (base + d, 0.0) if name == "var" else (math.log(2.0), base + d)
        fd = (float(optimum(*args(eps))[1].log_z) - float(optimum(*args(-eps))[1].log_z)) / (2 * eps)
        np.testing.assert_allclose(float(analytic), fd, rtol=1e-4, atol=1e-6)


def test_fit_input_errors():
    X, labels, Y, K = _problem()
    with pytest.raises(ValueError, match="site"):
        _full.fit_full(K, Y, site="probit")
    with pytest.raises(ValueError, match="K"):
        _full.fit_full(K[:-1], Y)
    with pytest.raises(ValueError, match="Y"):
        _full.fit_full(K, 2 * Y)
    with pytest.raises(ValueError, match="K contains NaN"):
        _full.fit_full(K.at[0, 0].set(jnp.nan), Y)


# ------------------------------------------------------------------------------------------- prediction, IS, Thm 12

def _predictions(fitted):
    X, labels, Y, K, post = fitted
    kernel = gk.kernels.SquaredExponential(2.0, 1.0)
    Xs = np.random.default_rng(9).normal(size=(4, 2))
    K_cross = jnp.kron(kernel.gram(X, Xs), jnp.eye(N_CLASSES))
    K_star = kernel.diag(Xs)[:, None, None] * jnp.eye(N_CLASSES) + 1e-8 * jnp.eye(N_CLASSES)
    pred = _predict.predictive_moments(post.alpha, post.t_matrix(K), K_cross, K_star)
    return K_cross, K_star, pred, pred.log_lower_bounds()


@pytest.mark.slow
def test_predictions_bounds_and_sum_to_zero(fitted):
    """Sum-to-zero predictive means (eq. 35); eq. 24 <= ell (Monte Carlo) <= log p~ (Lemma 7); the eq. 7 upper
    bounds; Theorem 12's bound with log p(y) replaced by log Z_h is the sum of eq. 24 bounds, below the sum of ell."""
    X, labels, Y, K, post = fitted
    _, _, pred, lower = _predictions(fitted)
    np.testing.assert_allclose(jnp.sum(pred.mean, axis=1), 0.0, atol=1e-10)  # eq. 35
    p = pred.renormalised_probabilities()
    np.testing.assert_allclose(jnp.sum(p, axis=1), 1.0, rtol=1e-12)
    assert np.all(np.asarray(lower) <= np.log(np.asarray(p)) + 1e-10)  # eq. 24 <= ell <= log p~ (Lemma 7)
    ells = []
    for c in range(N_CLASSES):
        ell, se = _site.expected_log_softmax_mc(jax.random.PRNGKey(c), jnp.eye(N_CLASSES)[c], pred.mean[0],
                                                pred.covariance[0], 400_000)
        assert lower[0, c] <= ell + 5 * se
        ells.append(float(ell))
    assert np.all(np.asarray(pred.upper_bounds(lower)) >= np.exp(np.asarray(lower)))
    joint = mc.joint_predictive_bound(lower[:1], [1], post.log_z, post.log_z)
    np.testing.assert_allclose(joint, lower[0, 1], rtol=1e-12)
    assert joint <= ells[1] + 0.01


@pytest.mark.extended
def test_theorem12_bound_is_below_importance_sampling(fitted):
    """Theorem 12 against importance sampling (App. F), one test point at a time (joint = marginal)."""
    X, labels, Y, K, post = fitted
    K_cross, K_star, pred, lower = _predictions(fitted)
    est = _sampling.importance_sampling(jax.random.PRNGKey(1), K, Y, post.mean(K), num_samples=200_000)
    probs = _sampling.importance_predictive(jax.random.PRNGKey(1), K, Y, post.mean(K), K_cross, K_star,
                                            num_samples=50_000)
    for j in range(4):
        c = int(np.argmax(probs[j]))
        bound = mc.joint_predictive_bound(lower[j:j + 1], [c], post.log_z, est.log_z_upper)
        assert bound <= math.log(float(probs[j, c])) + 0.02


def test_kronecker_predictive_and_integrated_probabilities(fitted, public_fits):
    """`predict` (the Kronecker-structured predictive, and the general one for a class covariance) equals the dense
    eq.-25 moments; the Monte Carlo integrated probabilities equal a 24^3-point Gauss-Hermite product rule for
    E[softmax(f)] to Monte Carlo accuracy."""
    X, labels, Y, K, post = fitted
    kernel, kron_post, dense_post = public_fits
    Xs = np.random.default_rng(10).normal(size=(3, 2))
    T = post.t_matrix(K)
    K_cross = jnp.kron(kernel.gram(X, Xs), jnp.eye(N_CLASSES))
    K_star = kernel.diag(Xs)[:, None, None] * jnp.eye(N_CLASSES)
    dense = _predict.predictive_moments(post.alpha, T, K_cross, K_star)
    kron = mc.predict(kron_post, Xs)
    general = mc.predict(dense_post, Xs)
    for pred in (kron, general):
        np.testing.assert_allclose(pred.mean, dense.mean, atol=1e-6)
        np.testing.assert_allclose(pred.covariance, dense.covariance, atol=1e-6)
    with pytest.raises(ValueError, match="X_new has 3 columns"):
        mc.predict(kron_post, np.ones((2, 3)))
    with pytest.raises(ValueError, match="given covariances"):
        mc.predict(post, Xs)
    mc_p = np.asarray(kron.integrated_probabilities(jax.random.PRNGKey(0), 20000))
    x, w = np.polynomial.hermite_e.hermegauss(24)
    grid = np.stack(np.meshgrid(x, x, x, indexing="ij"), -1).reshape(-1, 3)
    weights = np.prod(np.stack(np.meshgrid(w, w, w, indexing="ij"), -1).reshape(-1, 3), axis=1) / (2 * np.pi)**1.5
    for j in range(3):
        f = np.asarray(kron.mean[j]) + grid @ np.linalg.cholesky(np.asarray(kron.covariance[j])).T
        e = np.exp(f - f.max(axis=1, keepdims=True))
        quad = weights @ (e / e.sum(axis=1, keepdims=True))
        np.testing.assert_allclose(mc_p[j], quad, atol=4e-3)
    np.testing.assert_allclose(mc_p.sum(axis=1), 1.0, atol=1e-12)
    assert np.max(np.abs(mc_p - np.asarray(kron.renormalised_probabilities()))) > 1e-2  # the two rules differ


def test_float32_prior_with_round_off_asymmetry_fits():
    """A float32 K differing from K^T by round-off of its largest entries (4 eps(float32) max|K|, as a Gram matrix
    from ||x||^2 + ||x'||^2 - 2 x^T x' can) passes the symmetry check, whose tolerance scales with the dtype's eps
    and max|K|, and fits to the float64 bound; an asymmetry of 1e-3 max|K| is still refused."""
    rng = np.random.default_rng(3)
    X = 1.5 * rng.normal(size=(N_DATA, 2))
    Kx = np.exp(-0.5 * np.sum((X[:, None] - X[None]) ** 2, axis=-1))     # entries from 1 down to ~1e-5
    K64 = np.kron(Kx, np.eye(N_CLASSES)) + 1e-2 * np.eye(N_DATA * N_CLASSES)
    skew = rng.normal(size=K64.shape)
    skew = (skew - skew.T) / np.abs(skew - skew.T).max()
    K32 = (K64 + 4 * np.finfo(np.float32).eps * skew).astype(np.float32)
    assert not np.allclose(K32, K32.T, rtol=1e-6, atol=1e-10)  # what a tolerance blind to dtype and magnitude refused
    Y = np.eye(N_CLASSES)[np.arange(N_DATA) % N_CLASSES]
    post32 = _full.fit_full(jnp.asarray(K32), jnp.asarray(Y, jnp.float32))
    post64 = _full.fit_full(jnp.asarray(K64), jnp.asarray(Y))
    assert post32.log_z.dtype == jnp.float32 and bool(post32.converged)
    np.testing.assert_allclose(float(post32.log_z), float(post64.log_z), rtol=1e-4)
    with pytest.raises(ValueError, match="K must be symmetric"):
        _full.fit_full(jnp.asarray((K64 + 1e-3 * skew).astype(np.float32)), jnp.asarray(Y, jnp.float32))
