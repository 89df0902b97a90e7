"""The site-precision solver (GP prior, h_n = e_n): same optimum as the fixed-point solver, exact on Gaussian
sites, chosen by default, validated, with hyperparameter gradients matching finite differences."""

import warnings

import jax
import jax.flatten_util
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import central_difference, gaussian_log_evidence

import gkl_jax as gk
from gkl_jax import _fit, _warm
from gkl_jax._linalg import invert_lower, lower_gram, solve_lower
from gkl_jax.solvers import _site_precision_parts as _site_precision


def _gp_problem(n=20, seed=0):
    """n = 20 and the SE kernel throughout, so that the tests share compiled fits."""
    rng = np.random.default_rng(seed)
    X = rng.uniform(-3, 3, size=(n, 2))
    f = np.sin(X[:, 0]) * np.cos(X[:, 1]) * 3
    y = np.where(rng.uniform(size=n) < 1 / (1 + np.exp(-f)), 1.0, -1.0)
    return X, y, rng


def test_same_optimum_as_the_fixed_point_solver_and_chosen_by_default():
    X, y, _ = _gp_problem()
    model = gk.gp.model(gk.kernels.SquaredExponential(4.0, 1.2), X, gk.potentials.Logistic(y))
    assert isinstance(gk.solvers.default_solver(model, gk.factors.Full()), gk.solvers.SitePrecision)
    ref = gk.fit(model, solver=gk.solvers.FixedPoint(), tol=1e-9)
    res = gk.fit(model, tol=1e-9)
    assert bool(ref.converged) and bool(res.converged)
    assert abs(float(res.log_z) - float(ref.log_z)) < 1e-10
    np.testing.assert_allclose(res.q.mean, ref.q.mean, atol=1e-7)
    np.testing.assert_allclose(res.q.covariance(), ref.q.covariance(), atol=1e-7)
    # the returned factor meets the library-wide stopping rule max |dB/d(m, C)| <= tol
    grad = jax.jit(jax.grad(lambda q: gk.bound(model, q)))(res.q)
    assert float(jnp.max(jnp.abs(grad.mean))) <= 1e-9
    assert float(jnp.max(jnp.abs(jnp.triu(grad.factor.C)))) <= 1e-9
    hist = np.asarray(res.history)[: int(res.num_steps) + 1]
    assert np.all(np.diff(hist) >= -1e-12)


def test_exact_on_gaussian_sites_with_offsets_and_two_groups():
    """Two identity groups (W sums over them) with offsets and a Dense prior with a mean: the bound is log Z."""
    rng = np.random.default_rng(3)
    n = 6
    A = rng.normal(size=(n, n))
    cov = A @ A.T / n + 0.5 * np.eye(n)
    mu = rng.normal(size=n)
    y1, y2, off = rng.normal(size=n), rng.normal(size=n), rng.normal(size=n)
    model = gk.Model(gk.priors.Dense(cov, mean=mu), [gk.Sites(None, gk.potentials.Gaussian(y1, 0.7), offset=off),
                                                     gk.Sites(None, gk.potentials.Gaussian(y2, 1.3))])
    assert isinstance(gk.solvers.default_solver(model, gk.factors.Full()), gk.solvers.SitePrecision)
    # y1 - off and y2 observe w with noise 0.7 and 1.3: stack them as 2n observations of H = [I; I]
    H = np.vstack([np.eye(n), np.eye(n)])
    log_z, mean, post = gaussian_log_evidence(H, np.concatenate([y1 - off, y2]), np.repeat([0.7, 1.3], n), cov, mu)
    res = gk.fit(model)
    assert bool(res.converged)
    assert abs(float(res.log_z) - log_z) < 1e-8
    np.testing.assert_allclose(res.q.mean, mean, atol=1e-8)
    np.testing.assert_allclose(res.q.covariance(), post, atol=1e-8)


def test_warm_start_and_too_few_steps():
    X, y, _ = _gp_problem(seed=1)
    model = gk.gp.model(gk.kernels.SquaredExponential(2.0, 1.0), X, gk.potentials.Logistic(y))
    full = gk.fit(model)
    again = gk.fit(model, q0=full.q)
    assert int(again.num_steps) <= 1 and abs(float(again.log_z) - float(full.log_z)) < 1e-10
    with pytest.warns(UserWarning, match="SitePrecision"):
        short = gk.fit(model, max_steps=1)
    assert not bool(short.converged) and np.isfinite(float(short.log_z))
    assert float(short.log_z) < float(full.log_z)


def test_hyperparameter_gradient_matches_finite_differences_of_refits():
    X, y, _ = _gp_problem(seed=2)

    def log_z(theta, tol):
        kernel = gk.kernels.SquaredExponential(jnp.exp(theta[0]), jnp.exp(theta[1]))
        return gk.fit(gk.gp.model(kernel, X, gk.potentials.Logistic(y)), tol=tol).log_z

    # one compiled program (the tolerance is an argument): the gradient at tol 1e-7, the refits at 1e-10
    value_and_grad = jax.jit(jax.value_and_grad(log_z))
    theta = np.array([0.8, 0.1])
    grad = np.asarray(value_and_grad(jnp.asarray(theta), 1e-7)[1])
    fd = central_difference(lambda t: value_and_grad(jnp.asarray(t), 1e-10)[0], theta, eps=1e-5)
    np.testing.assert_allclose(grad, fd, rtol=1e-5, atol=1e-7)


def test_log_z_derivative_is_the_bound_derivative_at_the_returned_q():
    """The site-precision log_z equals `bound` at q = N(m, (Sigma^{-1} + diag W)^{-1}), and its closed-form
    covariance derivative (1/2 (alpha alpha^T - R)) equals autodiff of `bound` at that fixed q, in reverse and
    forward mode, through a Dense
    prior's covariance and mean, a Laplace likelihood's scale and the sites' offsets."""
    X, y, rng = _gp_problem(seed=5)
    off = rng.normal(size=20)

    def build(theta):
        kernel = gk.kernels.SquaredExponential(jnp.exp(theta[0]), jnp.exp(theta[1]))
        prior = gk.priors.Dense(kernel.gram(jnp.asarray(X)) + 1e-6 * jnp.eye(20), mean=theta[2] * jnp.ones(20))
        return gk.Model(prior, gk.Sites(None, gk.potentials.Laplace(y, jnp.exp(theta[3])), offset=theta[4] * off))

    theta = jnp.asarray([0.8, 0.1, 0.3, -0.5, 0.2])
    # the identity holds at any (m, W), not only at the optimum
    m, W = jnp.asarray(rng.normal(size=20)), jnp.asarray(rng.uniform(0.0, 3.0, size=20))
    covariance = jnp.linalg.inv(jnp.diag(W) + jnp.linalg.inv(build(theta).prior.covariance))
    q = gk.Gaussian(m, gk.factors.Full(jnp.linalg.cholesky(covariance).T))
    logdet, s_diag, _, L = _site_precision.parts(build(theta).prior.covariance, W)
    # the parts the solver hands over: alpha = Sigma^{-1} (m - mu) and the sites' value at (m, diag S), both held
    # fixed (stop-gradient), as the solver returns them
    alpha = jnp.linalg.solve(build(theta).prior.covariance, m - build(theta).prior.mean)
    sites = _site_precision.sites_value(build(theta).sites, m, s_diag)
    closed_form = lambda t: _site_precision.log_z(build(t), m, W, (logdet, s_diag, L, alpha, sites))
    reference = lambda t: gk.bound(build(t), q)
    assert abs(float(jax.jit(closed_form)(theta)) - float(jax.jit(reference)(theta))) < 1e-9
    expected = np.asarray(jax.jit(jax.grad(reference))(theta))
    np.testing.assert_allclose(jax.jit(jax.grad(closed_form))(theta), expected, rtol=1e-7, atol=1e-9)
    np.testing.assert_allclose(jax.jit(jax.jacfwd(closed_form))(theta), expected, rtol=1e-7, atol=1e-9)


@pytest.mark.parametrize("scale", [1.0, 1e20])
def test_factorisation_parts_match_the_dense_posterior_without_cancellation(scale):
    """diag S, log det(Sigma^{-1} S) and L for S = (Sigma^{-1} + diag W)^{-1} against dense linear algebra, at a
    prior variance of 1 and of 1e20 (where diag Sigma - colsum V^2 would cancel to garbage; an ML-II run once
    drove a GP variance there and read a bound of +6e7), and fit's log_z is the bound at its q there too."""
    rng = np.random.default_rng(7)
    n = 12
    A = rng.normal(size=(n, n))
    K = scale * (A @ A.T / n + 0.1 * np.eye(n))
    W = rng.uniform(0.0, 4.0, size=n)
    logdet, s_diag, _, L = _site_precision.parts(jnp.asarray(K), jnp.asarray(W))
    S = np.linalg.inv(np.linalg.inv(K) + np.diag(W))
    np.testing.assert_allclose(s_diag, np.diag(S), rtol=1e-8)
    np.testing.assert_allclose(logdet, np.linalg.slogdet(S)[1] - np.linalg.slogdet(K)[1], rtol=1e-8, atol=1e-8)
    sw = np.sqrt(W)
    np.testing.assert_allclose(L @ L.T, np.eye(n) + sw[:, None] * K * sw[None, :], rtol=1e-10)
    model = gk.Model(gk.priors.Dense(K), gk.Sites(None, gk.potentials.Laplace(rng.normal(size=n), 0.2)))
    with warnings.catch_warnings():     # at 1e20 the solver stalls at the round-off floor (converged=False)
        warnings.simplefilter("ignore")
        res = gk.fit(model)
    assert bool(res.converged) or scale > 1
    np.testing.assert_allclose(res.log_z, gk.bound(model, res.q), rtol=1e-10)


def test_warm_fit_is_fit_without_the_factor():
    """fit_warm (the ML-II inner fit) has fit's log Z and gradient in the kernel, and the mean and marginal
    variances of fit's q; warm_result rebuilds fit's Result; fit_hyperparameters returns that Result."""
    X, y, _ = _gp_problem()
    build = lambda k: gk.gp.model(k, X, gk.potentials.Logistic(y))
    # strongly typed, as the learned parameters are: the refit below reuses the compiled `ref` fit
    kernel = gk.kernels.SquaredExponential(jnp.asarray(4.0, X.dtype), jnp.asarray(1.2, X.dtype))
    model = build(kernel)
    assert _warm.warm_fit_applies(model)
    assert not _warm.warm_fit_applies(gk.gp.model(kernel, X, gk.potentials.StudentT(y, 3.0)))
    ref = gk.fit(model, tol=1e-8)
    warm = jax.jit(lambda m: _warm.fit_warm(m, tol=1e-8))(model)
    assert bool(warm.converged) and int(warm.num_steps) == int(ref.num_steps)
    assert abs(float(warm.log_z) - float(ref.log_z)) < 1e-12
    np.testing.assert_allclose(warm.q.mean, ref.q.mean, atol=1e-12)
    np.testing.assert_allclose(warm.q.factor.marginal_variances(), ref.q.factor.marginal_variances(), atol=1e-12)
    grad = lambda f: jax.jit(jax.grad(lambda k: f(build(k)).log_z))(kernel)
    g_ref, g_warm = grad(lambda m: gk.fit(m, tol=1e-8)), grad(lambda m: _warm.fit_warm(m, tol=1e-8))
    np.testing.assert_allclose(jax.flatten_util.ravel_pytree(g_warm)[0], jax.flatten_util.ravel_pytree(g_ref)[0],
                               rtol=1e-10)
    res = _warm.warm_result(model, warm)
    np.testing.assert_allclose(res.q.factor.C, ref.q.factor.C, atol=1e-12)
    np.testing.assert_allclose(res.history, ref.history, atol=1e-12)
    assert float(res.log_z) == float(warm.log_z)
    # the ML-II result is the Result of a fit at the learned parameters, started from the warm start
    hr = gk.gp.fit_hyperparameters(build, kernel, gtol=1e-4)
    assert hr.converged and isinstance(hr.result, gk.Result)
    np.testing.assert_allclose(hr.model.prior.inv_chol, build(hr.params).prior.inv_chol, rtol=1e-12, atol=1e-12)
    refit = gk.fit(build(hr.params), tol=1e-8)
    assert abs(float(hr.log_z) - float(refit.log_z)) < 1e-8
    np.testing.assert_allclose(hr.result.q.covariance(), refit.q.covariance(), atol=1e-5)


def test_warm_fit_from_an_earlier_optimum_of_another_kernel():
    """fit_warm started from the WarmPoint (m, W) of an optimum under another kernel reaches the cold fit's
    optimum in fewer steps; started from its own WarmPoint it is already converged (0 steps)."""
    X, y, _ = _gp_problem()
    build = lambda k: gk.gp.model(k, X, gk.potentials.Logistic(y))
    fit = jax.jit(lambda m, q0: _warm.fit_warm(m, q0=q0, tol=1e-8))
    cold = jax.jit(lambda m: _warm.fit_warm(m, tol=1e-8))
    before = cold(build(gk.kernels.SquaredExponential(4.0, 1.2)))
    model = build(gk.kernels.SquaredExponential(3.0, 1.5))
    ref, warm = cold(model), fit(model, before.point)
    assert bool(warm.converged) and int(warm.num_steps) < int(ref.num_steps)
    assert abs(float(warm.log_z) - float(ref.log_z)) < 1e-10
    np.testing.assert_allclose(warm.q.mean, ref.q.mean, atol=1e-7)
    again = fit(model, warm.point)
    # the same point; alpha = Sigma^{-1} (m - mu) is solved for again, not carried, so log Z agrees to round-off
    assert int(again.num_steps) == 0 and abs(float(again.log_z) - float(warm.log_z)) < 1e-12


def test_explicit_solver_on_a_model_it_does_not_fit_raises():
    X, y, rng = _gp_problem(n=8)
    gp = gk.gp.model(gk.kernels.SquaredExponential(), X, gk.potentials.Logistic(y))
    with pytest.raises(ValueError, match="Full factor"):
        gk.fit(gp, gk.factors.Diagonal(), solver=gk.solvers.SitePrecision())
    glm = gk.Model(gk.priors.Isotropic(2, 1.0), gk.Sites(X, gk.potentials.Logistic(y)))
    with pytest.raises(ValueError, match="h_n = e_n"):
        gk.fit(glm, solver=gk.solvers.SitePrecision())
    assert isinstance(gk.solvers.default_solver(glm, gk.factors.Full()), gk.solvers.FixedPoint)


def test_refits_do_not_retrace_and_vmap_over_labels_matches_separate_fits():
    X, y, rng = _gp_problem(seed=4)
    kernel = gk.kernels.SquaredExponential(3.0, 1.0)
    gk.fit(gk.gp.model(kernel, X, gk.potentials.Logistic(y)))
    before = _fit.TRACE_COUNT["fit"]
    labels = np.stack([np.where(rng.uniform(size=20) < 0.5, 1.0, -1.0) for _ in range(3)])
    single = [gk.fit(gk.gp.model(kernel, X, gk.potentials.Logistic(lab))) for lab in labels]
    assert _fit.TRACE_COUNT["fit"] == before
    assert all(bool(r.converged) for r in single)
    batched = jax.vmap(lambda lab: gk.fit(gk.gp.model(kernel, X, gk.potentials.Logistic(lab))).log_z)(
        jnp.asarray(labels))
    np.testing.assert_allclose(batched, [float(r.log_z) for r in single], rtol=1e-10)


@pytest.mark.parametrize("n, levels", [(7, 3), (130, 1), (301, 3)])
def test_blocked_lower_solve_matches_the_triangular_solve(n, levels):
    rng = np.random.default_rng(n)
    A = rng.normal(size=(n, n))
    L = np.linalg.cholesky(A @ A.T / n + np.eye(n))
    for B in (rng.normal(size=(n, 5)), rng.normal(size=n)):
        np.testing.assert_allclose(solve_lower(jnp.asarray(L), jnp.asarray(B), levels), np.linalg.solve(L, B),
                                   rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("n, base, levels", [(7, 128, 3), (130, 64, 1), (301, 32, 3)])
def test_blocked_triangular_inverse_and_gram(n, base, levels):
    """invert_lower and lower_gram against numpy's dense inverse and product, with odd block sizes (301 splits
    into 150 + 151, then 75 + 75 and 75 + 76)."""
    rng = np.random.default_rng(n)
    A = rng.normal(size=(n, n))
    L = np.linalg.cholesky(A @ A.T / n + np.eye(n))
    Linv = np.asarray(invert_lower(jnp.asarray(L), base))
    np.testing.assert_allclose(Linv, np.linalg.inv(L), rtol=1e-10, atol=1e-12)
    assert np.all(np.triu(Linv, 1) == 0)
    G = np.tril(rng.normal(size=(n, n)))
    np.testing.assert_allclose(lower_gram(jnp.asarray(G), levels), G.T @ G, rtol=1e-10, atol=1e-10)


def test_gap_estimates_the_distance_to_the_optimum():
    """`WarmStart.gap` (the mean's Newton decrement plus the factor step's diagonal term) is within a factor 10 of
    the true distance of an early-stopped fit's log Z below the optimum, from a 1e-3-nat gap down to 1e-8: ML-II
    reads it as the resolution of its objective."""
    X, y, _ = _gp_problem(40, seed=1)
    model = gk.gp.model(gk.kernels.SquaredExponential(2.0, 1.0), X, gk.potentials.Logistic(y))
    fit_warm = jax.jit(lambda m, tol: _warm.fit_warm(m, tol=tol))   # one compilation for every tolerance
    optimum = float(fit_warm(model, 1e-10).log_z)
    gaps = []
    for tol in (3e-2, 3e-3, 1e-4):
        warm = fit_warm(model, tol)
        true_gap, estimate = optimum - float(warm.log_z), float(warm.gap)
        gaps.append(true_gap)
        assert true_gap > 0 and 0.1 * true_gap <= estimate <= 10 * true_gap, (tol, true_gap, estimate)
    assert gaps[0] > 1e-5 and gaps[-1] < 1e-6      # the three fits stopped at different distances


def test_diagonal_is_numpys_diagonal_as_one_gather():
    """`_linalg.diagonal` (the library's diagonal of a matrix) against numpy, square, rectangular and batched; its
    jaxpr holds no cond (jnp.diagonal's platform-dependent branch) and no nested jit."""
    from gkl_jax._linalg import diagonal

    rng = np.random.default_rng(0)
    for shape in [(4, 4), (5, 3), (3, 5), (2, 4, 4), (1, 1)]:
        A = rng.normal(size=shape)
        np.testing.assert_array_equal(np.asarray(diagonal(jnp.asarray(A))), np.diagonal(A, axis1=-2, axis2=-1))
    names = {e.primitive.name for e in jax.make_jaxpr(diagonal)(jnp.ones((4, 4))).jaxpr.eqns}
    assert "cond" not in names and "jit" not in names and "pjit" not in names


def _robust_problem(n=20, seed=6):
    """Student-t GP regression with four outliers: some site precisions at the optimum are negative."""
    rng = np.random.default_rng(seed)
    X = np.sort(rng.uniform(-3, 3, n))[:, None]
    y = np.sin(X[:, 0]) + 0.1 * rng.normal(size=n)
    y[rng.choice(n, 4, replace=False)] += np.array([3.0, -3.0, 4.0, -4.0])
    return X, y, rng


def _student_t_gp(X, y, variance=1.0, lengthscale=1.0, scale=0.1):
    return gk.gp.model(gk.kernels.SquaredExponential(variance, lengthscale), X,
                       gk.potentials.StudentT(y, 3.0, scale))


def test_signed_site_precisions_reach_the_robust_defaults_optimum():
    """Non-log-concave sites: the solver iterates on signed W (S = (Sigma^{-1} + diag W)^{-1} stays positive
    definite) to the optimum that the default whitened L-BFGS + Newton-CG finds, and the returned Full factor meets
    the library's stopping rule."""
    X, y, _ = _robust_problem()
    model = _student_t_gp(X, y)
    assert not isinstance(gk.solvers.default_solver(model, gk.factors.Full()), gk.solvers.SitePrecision)
    ref = gk.fit(model, tol=1e-9)
    res = gk.fit(model, solver=gk.solvers.SitePrecision(), tol=1e-9)
    assert bool(ref.converged) and bool(res.converged)
    assert abs(float(res.log_z) - float(ref.log_z)) < 1e-8
    np.testing.assert_allclose(res.q.mean, ref.q.mean, atol=1e-6)
    np.testing.assert_allclose(res.q.covariance(), ref.q.covariance(), atol=1e-6)
    # as stationary as the default's q: both at the round-off floor of dB/dm (2e-8, cond(Sigma) ~ 1e8)
    gradient = jax.jit(jax.grad(lambda q: gk.bound(model, q)))
    for part in (lambda g: g.mean, lambda g: jnp.triu(g.factor.C)):
        reached = float(jnp.max(jnp.abs(part(gradient(res.q)))))
        assert reached <= max(2 * float(jnp.max(jnp.abs(part(gradient(ref.q))))), 1e-9)
    hist = np.asarray(res.history)[: int(res.num_steps) + 1]
    assert np.all(np.diff(hist) >= -1e-10)
    W = np.asarray(_warm.fit_warm(model, tol=1e-9).site_precisions)
    assert W.min() < 0 < W.max()                 # the outliers' precisions are negative


def test_signed_parts_and_log_z_derivative_match_the_dense_bound():
    """With negative W the factorisation through the prior's Cholesky factor gives the dense posterior's
    log det and diagonal, and the closed-form derivative R = W - W S W of log_z matches autodiff of `bound`."""
    X, y, rng = _robust_problem(seed=7)

    def build(theta):
        return _student_t_gp(X, y, jnp.exp(theta[0]), jnp.exp(theta[1]), jnp.exp(theta[2]))

    theta = jnp.asarray([0.2, 0.1, -1.5])
    model = build(theta)
    K = model.prior.covariance
    m = K @ jnp.asarray(0.3 * rng.normal(size=20))        # a smooth mean: alpha = Sigma^{-1} m of order 1
    W = jnp.asarray(np.where(np.arange(20) % 5 == 0, -0.01, rng.uniform(0.0, 3.0, size=20)))
    covariance = jnp.linalg.inv(jnp.diag(W) + jnp.linalg.inv(K))
    assert np.all(np.linalg.eigvalsh(np.asarray(covariance)) > 0)
    logdet, s_diag, _, G = _site_precision.parts(K, W, model.prior.cholesky())
    np.testing.assert_allclose(s_diag, jnp.diag(covariance), rtol=1e-8)
    assert abs(float(logdet) - float(jnp.linalg.slogdet(jnp.linalg.solve(K, covariance))[1])) < 1e-8
    q = gk.Gaussian(m, gk.factors.Full(jnp.linalg.cholesky(covariance).T))
    alpha = jnp.linalg.solve(K, m)
    sites = _site_precision.sites_value(model.sites, m, s_diag)
    closed_form = lambda t: _site_precision.log_z(build(t), m, W, (logdet, s_diag, G, alpha, sites))
    reference = lambda t: gk.bound(build(t), q)
    np.testing.assert_allclose(jax.jit(closed_form)(theta), jax.jit(reference)(theta), rtol=1e-10)
    expected = np.asarray(jax.jit(jax.grad(reference))(theta))
    np.testing.assert_allclose(jax.jit(jax.grad(closed_form))(theta), expected, rtol=1e-7, atol=1e-8)


def test_ml2_on_student_t_sites_with_the_site_precision_solver():
    """ML-II of a robust GP model runs, by default as with `method_kwargs={"solver": SitePrecision()}`, the warm
    site-precision fits (started from the last optimum's signed W, valid or not under the next kernel), and ends
    where ML-II with `fit`'s robust default (whitened L-BFGS then Newton-CG) in every inner fit ends."""
    X, y, _ = _robust_problem()
    model = _student_t_gp(X, y)
    assert _warm.warm_fit_applies(model, gk.solvers.SitePrecision()) and not _warm.warm_fit_applies(model)
    assert not _warm.warm_fit_applies(model, gk.solvers.SitePrecision(tol=1e-3))
    assert isinstance(_warm.ml2_solver(model), gk.solvers.SitePrecision)
    build = lambda k: _student_t_gp(X, y, k.variance, k.lengthscale)
    start = gk.kernels.SquaredExponential(1.0, 1.0)
    S = gk.solvers
    robust = {"solver": S.Chain((S.LBFGS(tol=S._default.ROBUST_HANDOFF), S.Newton())), "whiten": True}
    ref = gk.gp.fit_hyperparameters(build, start, gtol=1e-6, method_kwargs=robust)
    res = gk.gp.fit_hyperparameters(build, start, gtol=1e-6, method_kwargs={"solver": gk.solvers.SitePrecision()})
    default = gk.gp.fit_hyperparameters(build, start, gtol=1e-6)
    assert abs(float(default.log_z) - float(res.log_z)) < 1e-12 and default.num_steps == res.num_steps
    assert ref.converged and res.converged
    assert abs(float(res.log_z) - float(ref.log_z)) < 1e-7
    np.testing.assert_allclose([res.params.variance, res.params.lengthscale],
                               [ref.params.variance, ref.params.lengthscale], rtol=1e-4)
    np.testing.assert_allclose(res.result.q.covariance(), ref.result.q.covariance(), atol=1e-5)
    # a warm start whose W (negative at the outliers) came from another kernel
    before = _warm.fit_warm(build(gk.kernels.SquaredExponential(0.3, 3.0)), tol=1e-9)
    assert float(jnp.min(before.site_precisions)) < 0
    cold = _warm.fit_warm(model, tol=1e-9)
    warm = _warm.fit_warm(model, q0=before.point, tol=1e-9)
    assert bool(warm.converged) and abs(float(warm.log_z) - float(cold.log_z)) < 1e-9
