"""GP prediction, exact regression, sparse GPs and ML-II against dense / closed-form / quadrature oracles."""

import types
from dataclasses import replace

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import integrate, special, stats

import gkl_jax as gk
from gkl_jax import kernels as K
from gkl_jax.gp import _hyper_loop

NOISE = 0.05


def _data(n=12, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.uniform(-3, 3, size=(n, 1))
    y = np.sin(X[:, 0]) + np.sqrt(NOISE) * rng.standard_normal(n)
    return X, y


def _dense_posterior_predictive(kernel, X, y, noise, Xs, jitter=1e-6):
    Kxx = np.asarray(kernel.gram(X)) + jitter * np.eye(len(X))
    Ksx = np.asarray(kernel.gram(Xs, X))
    Kss = np.asarray(kernel.diag(Xs))
    A = Kxx + noise * np.eye(len(X))
    mean = Ksx @ np.linalg.solve(A, y)
    var = Kss - np.sum(Ksx * np.linalg.solve(A, Ksx.T).T, axis=1)
    log_z = stats.multivariate_normal(np.zeros(len(X)), A).logpdf(y)
    return log_z, mean, var


def _methods():
    methods = [("gkl", gk.fit)]
    for name in ("laplace", "ep", "local"):
        fn = getattr(gk, name, None) or getattr(gk.baselines, name, None)
        if fn is not None:
            methods.append((name, fn))
    return methods


@pytest.mark.parametrize("name, method", _methods())
def test_gaussian_likelihood_every_method_equals_exact_regression(name, method):
    X, y = _data()
    kernel = K.SquaredExponential(1.3, 0.9)
    Xs = np.linspace(-3.5, 3.5, 7)[:, None]
    log_z, mean, var = _dense_posterior_predictive(kernel, X, y, NOISE, Xs)
    model = gk.gp.model(kernel, X, gk.potentials.Gaussian(y, NOISE))
    exact = gk.gp.exact(model)
    np.testing.assert_allclose(exact.log_z, log_z, rtol=1e-10)
    res = method(model)
    np.testing.assert_allclose(res.log_z, log_z, rtol=1e-6, atol=1e-6)
    pred = gk.gp.predict(res, model.prior, Xs, gk.potentials.Gaussian(np.zeros(7), NOISE))
    np.testing.assert_allclose(pred.mean, mean, atol=1e-6)
    np.testing.assert_allclose(pred.variance, var, atol=1e-6)
    np.testing.assert_allclose(pred.y_variance, var + NOISE, atol=1e-6)
    np.testing.assert_allclose(pred.log_density, stats.norm(mean, np.sqrt(var + NOISE)).logpdf(0.0), atol=1e-6)


def test_exact_matches_linear_gaussian_oracle_in_both_spaces(rng):
    from helpers import gaussian_log_evidence

    for num, dim in ((6, 4), (9, 3)):                                # N > D (Woodbury) and N <= D paths
        H = rng.normal(size=(num, dim))
        y = rng.normal(size=num)
        cov = np.cov(rng.normal(size=(dim, 3 * dim))) + 0.5 * np.eye(dim)
        model = gk.Model(gk.priors.Dense(cov), gk.Sites(H, gk.potentials.Gaussian(y, 0.3)))
        log_z, mean, post = gaussian_log_evidence(H, y, 0.3, cov)
        res = gk.gp.exact(model)
        np.testing.assert_allclose(res.log_z, log_z, rtol=1e-10)
        np.testing.assert_allclose(res.q.mean, mean, atol=1e-10)
        np.testing.assert_allclose(res.q.covariance(), post, atol=1e-10)
    with pytest.raises(ValueError, match="Gaussian potentials"):
        gk.gp.exact(gk.Model(gk.priors.Dense(cov), gk.Sites(H, gk.potentials.Probit(np.sign(y)))))


def _random_q(rng, dim):
    C = np.triu(0.3 * rng.normal(size=(dim, dim))) + np.diag(rng.uniform(0.2, 0.6, size=dim))
    return gk.Gaussian(rng.normal(size=dim), gk.factors.Full(C))


def test_latent_prediction_matches_dense_formula_for_any_q(rng):
    X, y = _data(10)
    kernel = K.Matern52(1.1, 1.4)
    model = gk.gp.model(kernel, X, gk.potentials.Probit(np.sign(y)), mean=0.2)
    q = _random_q(rng, 10)
    Xs = rng.uniform(-3, 3, size=(5, 1))
    Sigma = np.asarray(model.prior.covariance)
    Ks = np.asarray(kernel.gram(X, Xs))
    A = np.linalg.solve(Sigma, Ks)
    S = np.asarray(q.covariance())
    mean = 0.2 + A.T @ (np.asarray(q.mean) - 0.2)
    var = np.asarray(kernel.diag(Xs)) - np.sum(Ks * A, 0) + np.sum(A * (S @ A), 0)
    pred = gk.gp.predict(q, model.prior, Xs, gk.potentials.Probit(np.ones(5)))
    np.testing.assert_allclose(pred.mean, mean, atol=1e-8)
    np.testing.assert_allclose(pred.variance, var, atol=1e-8)
    np.testing.assert_allclose(pred.probability, stats.norm.cdf(mean / np.sqrt(1 + var)), atol=1e-8)
    np.testing.assert_allclose(pred.log_density, np.log(pred.probability), atol=1e-8)
    diag = gk.Gaussian(q.mean, gk.factors.Diagonal(np.sqrt(np.diag(S))))    # any factor structure predicts
    var_diag = np.asarray(kernel.diag(Xs)) - np.sum(Ks * A, 0) + np.sum(A * (np.diag(S)[:, None] * A), 0)
    np.testing.assert_allclose(gk.gp.predict(diag, model.prior, Xs).variance, var_diag, atol=1e-8)


@pytest.mark.parametrize("lik, pdf", [
    (gk.potentials.Laplace(np.array([0.3, -1.0, 2.0]), 0.4), lambda y, f: np.exp(-np.abs(y - f) / 0.4) / 0.8),
    (gk.potentials.StudentT(np.array([0.3, -1.0, 2.0]), 3.0, 0.5), lambda y, f: stats.t(3.0, f, 0.5).pdf(y)),
    (gk.potentials.Logistic(np.array([1.0, -1.0, 1.0])), lambda y, f: special.expit(y * f)),
])
def test_predictive_densities_match_numerical_integration(lik, pdf):
    mean = np.array([0.1, -0.5, 1.0])
    var = np.array([0.3, 0.05, 1.2])
    got = gk.gp.log_predictive_density(lik, jnp.asarray(mean), jnp.asarray(var))
    for i in range(3):
        y = float(np.asarray(lik.y)[i])
        val, _ = integrate.quad(lambda f: pdf(y, f) * stats.norm(mean[i], np.sqrt(var[i])).pdf(f), -np.inf, np.inf,
                                points=None, limit=200)
        np.testing.assert_allclose(got[i], np.log(val), rtol=1e-6)
    if isinstance(lik, gk.potentials.Logistic):
        p = gk.gp.class_probability(lik, jnp.asarray(mean), jnp.asarray(var))
        np.testing.assert_allclose(np.where(np.asarray(lik.y) > 0, p, 1 - p), np.exp(got), rtol=1e-8)


def test_robust_regression_default_fit_converges_on_an_ill_conditioned_prior():
    """Student-t sites (not log-concave) under an SE prior without a white term: Sigma's condition number is ~1e6
    (its smallest eigenvalues are the jitter). Newton-CG in (m, C) reaches tol 1e-6, where L-BFGS in (m, C) stalls
    (2000 steps, max|grad| ~1e-3), and it finds the optimum of L-BFGS in the whitened basis, as does the default
    (whitened L-BFGS, then whitened Newton-CG)."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(25, 1))
    y = np.sin(2 * X[:, 0]) + 0.1 * rng.standard_normal(25)
    y[3] = 5.0
    model = gk.gp.model(K.SquaredExponential(1.0, 1.0), X, gk.potentials.StudentT(y, 3.0, 0.1))
    assert np.linalg.eigvalsh(np.asarray(model.prior.covariance))[0] < 1e-5
    res = gk.fit(model, solver=gk.solvers.Newton(), whiten=False)
    assert bool(res.converged) and int(res.num_steps) < 200
    grads = jax.jit(jax.grad(lambda q: gk.bound(model, q)))(res.q)
    assert max(float(jnp.max(jnp.abs(g))) for g in jax.tree.leaves(grads)) <= 1e-6
    whitened = gk.fit(model, solver=gk.solvers.LBFGS(), whiten=True)
    default = gk.fit(model)
    assert bool(whitened.converged) and bool(default.converged)
    np.testing.assert_allclose(res.log_z, whitened.log_z, rtol=0, atol=1e-8)
    np.testing.assert_allclose(default.log_z, whitened.log_z, rtol=0, atol=1e-8)
    np.testing.assert_allclose(res.q.mean, whitened.q.mean, atol=1e-4)


def test_sparse_gp_with_z_equal_x_equals_full(rng):
    X, y = _data(10)
    kernel = K.SquaredExponential(1.0, 1.2)
    Xs = rng.uniform(-3, 3, size=(6, 1))
    for lik in (gk.potentials.Laplace(y, 0.3), gk.potentials.Gaussian(y, NOISE)):
        full = gk.gp.model(kernel, X, lik, jitter=1e-9)
        sparse = gk.gp.sparse_model(kernel, X, X, lik, jitter=1e-9)
        q = _random_q(rng, 10)                                    # the bounds agree at every q ...
        np.testing.assert_allclose(gk.bound(sparse, q), gk.bound(full, q), rtol=1e-7)
    r_full, r_sparse = gk.gp.exact(full), gk.gp.exact(sparse)     # ... so the optima and predictions agree
    np.testing.assert_allclose(r_sparse.log_z, r_full.log_z, rtol=1e-7)
    p_full = gk.gp.predict(r_full, full.prior, Xs)
    p_sparse = gk.gp.predict(r_sparse, sparse.prior, Xs)
    np.testing.assert_allclose(p_sparse.mean, p_full.mean, atol=1e-6)
    np.testing.assert_allclose(p_sparse.variance, p_full.variance, atol=1e-6)


def test_sparse_gaussian_bound_is_titsias_collapsed_bound():
    X, y = _data(15)
    Z = np.linspace(-2.5, 2.5, 4)[:, None]
    kernel = K.SquaredExponential(0.9, 1.1)
    model = gk.gp.sparse_model(kernel, X, Z, gk.potentials.Gaussian(y, NOISE))
    Kzz = np.asarray(kernel.gram(Z)) + 1e-6 * np.eye(4)
    Kxz = np.asarray(kernel.gram(X, Z))
    Q = Kxz @ np.linalg.solve(Kzz, Kxz.T)
    titsias = (stats.multivariate_normal(np.zeros(15), Q + NOISE * np.eye(15)).logpdf(y)
               - 0.5 * np.trace(np.asarray(kernel.gram(X)) - Q) / NOISE)
    np.testing.assert_allclose(gk.gp.exact(model).log_z, titsias, rtol=1e-8)
    np.testing.assert_allclose(gk.fit(model).log_z, titsias, rtol=1e-7)
    exact_full = stats.multivariate_normal(np.zeros(15), np.asarray(kernel.gram(X)) + NOISE * np.eye(15)).logpdf(y)
    assert titsias <= exact_full


def test_hyperparameter_gradient_matches_reoptimised_bound():
    X, y = _data(10)
    lik = gk.potentials.Laplace(y, 0.3)
    build = lambda k: gk.gp.model(k, X, lik)
    kernel = K.SquaredExponential(1.2, 0.8)

    # one compiled program: the gradient at `kernel` and the refits' values for the differences
    @jax.jit
    @jax.value_and_grad
    def log_z(k):
        return gk.fit(build(k), tol=1e-10).log_z

    _, grad = log_z(kernel)
    eps = 1e-5
    for field in ("log_variance", "log_lengthscale"):
        up = eqx_set(kernel, field, getattr(kernel, field) + eps)
        dn = eqx_set(kernel, field, getattr(kernel, field) - eps)
        fd = (log_z(up)[0] - log_z(dn)[0]) / (2 * eps)
        np.testing.assert_allclose(getattr(grad, field), fd, rtol=1e-5, atol=1e-7)


def eqx_set(module, field, value):

    return eqx.tree_at(lambda m: getattr(m, field), module, value)


def test_ml2_gkl_equals_exact_with_gaussian_likelihood():
    X, y = _data(12)
    build = lambda k: gk.gp.model(k, X, gk.potentials.Gaussian(y, NOISE))
    k0 = K.SquaredExponential(1.0, 1.0)
    ex = gk.gp.fit_hyperparameters(build, k0, method="exact", gtol=1e-6)
    kl = gk.gp.fit_hyperparameters(build, k0, gtol=1e-6)
    assert ex.converged and kl.converged
    np.testing.assert_allclose(kl.log_z, ex.log_z, rtol=1e-7)
    np.testing.assert_allclose(kl.params.lengthscale, ex.params.lengthscale, rtol=1e-3)
    for hr in (ex, kl):   # the model at the learned parameters comes with the result
        rebuilt = build(hr.params).prior
        np.testing.assert_allclose(hr.model.prior.covariance, rebuilt.covariance, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(hr.model.prior.chol, rebuilt.chol, rtol=1e-12, atol=1e-12)
    # independent oracle: scikit-learn's own ML-II for the same model
    from sklearn.gaussian_process import GaussianProcessRegressor
    from sklearn.gaussian_process.kernels import RBF, ConstantKernel

    sk = GaussianProcessRegressor(ConstantKernel(1.0) * RBF(1.0), alpha=NOISE + 1e-6, n_restarts_optimizer=0).fit(X, y)
    np.testing.assert_allclose(ex.log_z, sk.log_marginal_likelihood_value_, rtol=1e-5)
    assert np.all(np.diff(ex.history) >= -1e-10)


def _logistic_ml2(n):
    """(build, starting SE kernel) for ML-II on n points of `_data` with logistic labels."""
    X, y = _data(n)
    labels = jnp.where(y > 0, 1.0, -1.0)
    return (lambda k: gk.gp.model(k, X, gk.potentials.Logistic(labels))), K.SquaredExponential(1.0, 1.0)


def test_ml2_inner_tolerance_follows_gtol_without_changing_the_result():
    """With gtol = 1e-3 the G-KL inner fits stop at max|grad| <= 1e-4 (gtol / 10): the learned hyperparameters
    and bound equal those of inner fits run to 1e-7 (an explicit method_kwargs tol). The inner tolerance is an
    argument of the compiled objective: the first run compiles it once (its weakly typed start included), the
    second run not at all."""
    build, k0 = _logistic_ml2(30)
    traces = _hyper_loop.TRACE_COUNT["objective"]
    loose = gk.gp.fit_hyperparameters(build, k0, gtol=1e-3)
    assert _hyper_loop.TRACE_COUNT["objective"] == traces + 1
    tight = gk.gp.fit_hyperparameters(build, k0, gtol=1e-3, method_kwargs={"tol": 1e-7})
    assert _hyper_loop.TRACE_COUNT["objective"] == traces + 1
    assert loose.converged and tight.converged
    np.testing.assert_allclose(loose.log_z, tight.log_z, rtol=1e-6)
    np.testing.assert_allclose(loose.params.lengthscale, tight.params.lengthscale, rtol=1e-2)
    np.testing.assert_allclose(loose.params.variance, tight.params.variance, rtol=1e-2)
    assert loose.num_inner_unconverged == 0 and tight.num_inner_unconverged == 0


@pytest.mark.extended   # two implementations of the same loop agree; each is exercised by default
def test_ml2_outer_loop_compiled_equals_host_loop():
    """The outer L-BFGS loop runs as one compiled `lax.while_loop` (one trace of the whole run and of the
    objective per build); with jit=False the same iterations run as a host loop. Both take the same steps to the
    same hyperparameters, and log_z never decreases along the accepted steps. Two steps (of the 10 to
    gtol = 1e-5). The host loop's evaluations cost 16 ms each after the first (they compiled the inner solver
    again every time, 2 s each, until `fit_warm` jitted it)."""
    build, k0 = _logistic_ml2(20)
    traces = _hyper_loop.TRACE_COUNT["objective"]
    with pytest.warns(UserWarning, match="without meeting gtol"):
        compiled = gk.gp.fit_hyperparameters(build, k0, gtol=1e-5, max_steps=2)
    assert _hyper_loop.TRACE_COUNT["objective"] == traces + 1
    with pytest.warns(UserWarning, match="without meeting gtol"):
        host = gk.gp.fit_hyperparameters(build, k0, gtol=1e-5, max_steps=2, jit=False)
    assert not compiled.converged and not host.converged
    assert compiled.num_steps == host.num_steps == 2
    np.testing.assert_allclose(compiled.history, host.history, rtol=1e-9)
    np.testing.assert_allclose(compiled.params.lengthscale, host.params.lengthscale, rtol=1e-7)
    assert np.all(np.diff(compiled.history) >= 0)


def test_ml2_stops_when_the_next_step_cannot_beat_ftol():
    """An accepted L-BFGS step whose next direction predicts a change of log_z below ftol (1 + |log_z|) ends the
    run as converged, although that step itself lowered -log_z by far more than ftol and max|g| > gtol: further
    trial points would sit at the objective's noise floor (sonar, split 8: 26 step halvings)."""
    x = {"a": jnp.asarray([0.3, -0.2])}
    settings = _hyper_loop.HyperSolver(_hyper_loop.OUTER_LBFGS, True, 50, jnp.asarray(1e-12), jnp.asarray(1e-9))
    state = _hyper_loop.HyperState(x=x, f=jnp.asarray(10.0), g=x, res=None, q=None,
                          opt_state=_hyper_loop.OUTER_LBFGS.init(x),
                          direction={"a": -x["a"]}, slope=jnp.asarray(-0.13), t=jnp.asarray(1.0), trial=x,
                          halvings=jnp.asarray(0), inner_bad=jnp.asarray(0), accepted=jnp.asarray(True),
                          converged=jnp.asarray(False), failed=jnp.asarray(False))
    for g, expected in ((1e-6, True), (1e-3, False)):
        grad = {"a": jnp.asarray([g, -g])}     # the first L-BFGS direction is -g: predicted change 2 g^2
        new = _hyper_loop._advance(state, jnp.asarray(9.9), grad, types.SimpleNamespace(converged=True), settings)
        assert bool(new.accepted) and bool(new.converged) == expected


def test_ml2_inner_tolerance_follows_the_outer_gradient():
    """The inner fits' tolerance is clip(1e-3 max|g|, tol, 1e-2) at the current point (the loosest for the first
    evaluation), and a point evaluated at a looser tolerance than `tol` cannot end the run, however small its
    gradient: the stopping tests need an inner optimum at `tol`."""
    x = {"a": jnp.asarray([0.3, -0.2])}
    tol = jnp.asarray(1e-4)
    state = _hyper_loop.HyperState(x=x, f=jnp.asarray(10.0), g={"a": jnp.asarray([2.0, -5.0])}, res=None, q=None,
                          opt_state=_hyper_loop.OUTER_LBFGS.init(x), direction={"a": -x["a"]}, slope=jnp.asarray(-0.13),
                          t=jnp.asarray(1.0), trial=x, halvings=jnp.asarray(0), inner_bad=jnp.asarray(0),
                          accepted=jnp.asarray(True), converged=jnp.asarray(False), failed=jnp.asarray(False))
    assert float(_hyper_loop._inner_tol(state, tol)) == pytest.approx(5e-3)
    assert float(_hyper_loop._inner_tol(replace(state, g={"a": jnp.asarray([0.01, 0.0])}), tol)) == pytest.approx(1e-4)
    assert float(_hyper_loop._inner_tol(replace(state, g={"a": jnp.asarray([50.0, 0.0])}), tol)) == pytest.approx(1e-2)
    assert float(_hyper_loop._inner_tol(replace(state, f=jnp.asarray(jnp.inf)), tol)) == pytest.approx(1e-2)
    assert float(_hyper_loop._inner_tol(state, jnp.asarray(0.1))) == pytest.approx(0.1)   # never below tol itself
    settings = _hyper_loop.HyperSolver(_hyper_loop.OUTER_LBFGS, True, 50, jnp.asarray(1e-3), jnp.asarray(1e-9), True)
    tiny = {"a": jnp.asarray([1e-5, 0.0])}
    for exact, expected in ((True, True), (False, False)):
        new = _hyper_loop._advance(state, jnp.asarray(9.9), tiny, types.SimpleNamespace(converged=True), settings,
                              exact=jnp.asarray(exact))
        assert bool(new.accepted) and bool(new.converged) == expected


def test_ml2_first_trial_of_a_line_search_moves_no_parameter_by_more_than_max_step():
    """After an accepted point the next trial is x + t d with t = min(1, max_step / max|d|); a rejected trial
    halves t; max_step=None (inf) leaves t = 1. A non-positive max_step is refused."""
    x = {"a": jnp.asarray([0.3, -0.2]), "b": jnp.asarray(1.0)}
    state = _hyper_loop.HyperState(x=x, f=jnp.asarray(10.0), g=x, res=None, q=None,
                          opt_state=_hyper_loop.OUTER_LBFGS.init(x),
                          direction=x, slope=jnp.asarray(-0.13), t=jnp.asarray(1.0), trial=x,
                          halvings=jnp.asarray(0), inner_bad=jnp.asarray(0), accepted=jnp.asarray(True),
                          converged=jnp.asarray(False), failed=jnp.asarray(False))
    grad = {"a": jnp.asarray([8.0, -2.0]), "b": jnp.asarray(0.5)}   # first L-BFGS direction: -grad / ||grad||
    d = np.array([-8.0, 2.0, -0.5]) / np.linalg.norm([8.0, 2.0, 0.5])
    r = types.SimpleNamespace(converged=True)
    for max_step, t in ((0.5, 0.5 / abs(d[0])), (np.inf, 1.0)):
        settings = _hyper_loop.HyperSolver(_hyper_loop.OUTER_LBFGS, True, 50, jnp.asarray(1e-12), jnp.asarray(1e-12),
                                           False, jnp.asarray(max_step))
        new = _hyper_loop._advance(state, jnp.asarray(9.9), grad, r, settings)
        assert bool(new.accepted) and float(new.t) == pytest.approx(t)
        step = np.concatenate([np.asarray(new.trial["a"] - x["a"]), [float(new.trial["b"] - x["b"])]])
        np.testing.assert_allclose(step, t * d, rtol=1e-6)
        rejected = _hyper_loop._advance(replace(new, res=None), jnp.asarray(20.0), grad, r, settings)  # worse: halve
        assert float(rejected.t) == pytest.approx(0.5 * t)
    build, k0 = _logistic_ml2(10)
    with pytest.raises(ValueError, match="max_step"):
        gk.gp.fit_hyperparameters(build, k0, max_step=0.0)


def test_ml2_optax_optimizer_restarts_and_step_limit():
    """An optax optimizer takes every finite update (no line search); restarts keep the best run; a run that
    hits max_steps is reported as not converged, with a warning."""
    import optax

    X, y = _data(12)
    build = lambda k: gk.gp.model(k, X, gk.potentials.Gaussian(y, NOISE))
    k0 = K.SquaredExponential(1.0, 1.0)
    with pytest.warns(UserWarning, match="without meeting"):
        adam = gk.gp.fit_hyperparameters(build, k0, method="exact", optimizer=optax.adam(0.05), max_steps=15)
    assert not adam.converged and adam.num_steps == 15 and len(adam.history) == 16
    assert adam.log_z > adam.history[0] + 1e-3
    best = gk.gp.fit_hyperparameters(build, k0, method="exact", restarts=2, key=jax.random.PRNGKey(3), gtol=1e-6)
    assert best.converged and len(best.restart_log_z) == 3
    np.testing.assert_allclose(best.log_z, np.max(best.restart_log_z), rtol=1e-12)
    exact = gk.gp.fit_hyperparameters(build, k0, method="exact", gtol=1e-6)
    assert best.log_z >= exact.log_z - 1e-6


def test_ml2_in_float32_with_python_float_hyperparameters():
    """float32 data and hyperparameters given as Python floats (weakly typed): ML-II runs in float32 (it used to
    fail on a float64 leak into the inner solver's loop) and lands where the float64 run does."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(30, 2))
    y = np.where(X[:, 0] + rng.normal(size=30) > 0, 1.0, -1.0)
    runs = [gk.gp.fit_hyperparameters(lambda k, d=d: gk.gp.model(k, X.astype(d), gk.potentials.Logistic(y.astype(d))),
                                      K.SquaredExponential(1.0, 1.0), gtol=1e-2) for d in (np.float32, np.float64)]
    single, double = runs
    assert single.converged and double.converged
    assert single.log_z.dtype == jnp.float32 and single.result.q.factor.C.dtype == jnp.float32
    assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(single.params))
    np.testing.assert_allclose(single.log_z, double.log_z, rtol=1e-4)


def test_bad_inputs_name_the_argument():
    X, y = _data(8)
    k = K.SquaredExponential()
    with pytest.raises(ValueError, match="X"):
        gk.gp.model(k, np.where(X > 1, np.nan, X), gk.potentials.Gaussian(y))
    with pytest.raises(ValueError, match="y"):
        gk.gp.model(k, X, gk.potentials.Gaussian(y[:5]))
    with pytest.raises(ValueError, match="y"):
        gk.gp.sparse_model(k, X, X[:3], gk.potentials.Gaussian(y[:5]))
    with pytest.raises(ValueError, match="Z"):
        gk.gp.sparse_model(k, X, np.zeros((3, 2)), gk.potentials.Gaussian(y))
    with pytest.raises(ValueError, match="lengthscale"):
        K.Matern32(lengthscale=0.0)
    model = gk.gp.model(k, X, gk.potentials.Gaussian(y))
    res = gk.gp.exact(model)
    with pytest.raises(ValueError, match="X_new"):
        gk.gp.predict(res, model.prior, np.zeros((3, 2)))
    with pytest.raises(ValueError, match="X_new"):
        gk.gp.predict(res, model.prior, np.array([[np.nan]]))
    with pytest.raises(ValueError, match="likelihood"):
        gk.gp.predict(res, model.prior, np.zeros((3, 1)), gk.potentials.Gaussian(np.zeros(4)))
    with pytest.raises(ValueError, match="prior"):
        gk.gp.predict(res, gk.priors.Isotropic(8), np.zeros((3, 1)))
    with pytest.raises(ValueError, match="build"):
        gk.gp.fit_hyperparameters(None, k)
    with pytest.raises(ValueError, match="tol"):
        gk.gp.fit_hyperparameters(lambda kk: gk.gp.model(kk, X, gk.potentials.Gaussian(y)), k,
                                  method_kwargs={"tol": 0.0})


# ---------------------------------------------------------------------------------------------------------------
# King & Lawrence PPA and the KL-corrected bound (papers/004, notes Part B)

def _orthant_log_prob(cov, y):
    """log p(y | X) for the probit GP with augmentation: log P(D_y (fbar + eps) > 0), eps ~ N(0, (1 + v) I)."""
    D = np.diag(y)
    mvn = stats.multivariate_normal(np.zeros(len(y)), D @ cov @ D)
    return np.log(mvn.cdf(np.full(len(y), 60.0), lower_limit=np.zeros(len(y))))


def test_ppa_moments_match_quadrature():
    from gkl_jax.gp._ppa import q_f

    y = np.array([1.0, -1.0, 1.0])
    mut = np.array([0.4, 0.9, -2.0])
    v = 0.7
    f_mean, f_var, _ = q_f(gk.potentials.Probit(y), jnp.asarray(mut), v)
    for i in range(3):
        dens = lambda f: stats.norm.cdf(y[i] * f) * stats.norm(mut[i], np.sqrt(v)).pdf(f)
        z = integrate.quad(dens, -np.inf, np.inf)[0]
        m1 = integrate.quad(lambda f: f * dens(f), -np.inf, np.inf)[0] / z
        m2 = integrate.quad(lambda f: f * f * dens(f), -np.inf, np.inf)[0] / z
        np.testing.assert_allclose(f_mean[i], m1, rtol=1e-8)
        np.testing.assert_allclose(f_var[i], m2 - m1**2, rtol=1e-7)


def test_kl_corrected_bound_sandwich_and_identities():
    from gkl_jax.gp import _ppa as P

    rng = np.random.default_rng(1)
    X = jnp.asarray(rng.normal(size=(5, 1)))
    y = np.array([1.0, -1.0, 1.0, 1.0, -1.0])
    v = 0.25
    params = P.PPAParams(K.SquaredExponential(2.0, 1.0), jnp.log(v))
    lik = gk.potentials.Probit(y)
    stats_ = P.e_step(params, jnp.zeros(5), lik, X, 1e-6)
    stats_ = P.e_step(params, stats_.f_mean, lik, X, 1e-6)
    mu, C = P.q_fbar(params, stats_.f_mean, X, 1e-6)               # q(fbar) just updated: L = L'
    fresh = eqx_set(eqx_set(stats_, "mu", mu), "C", C)
    np.testing.assert_allclose(P.standard_bound(params, fresh, X, 1e-6), P.corrected_bound(params, fresh, X, 1e-6),
                               rtol=1e-10)
    g_std = jax.grad(P.standard_bound)(params, fresh, X, 1e-6)
    g_cor = jax.grad(P.corrected_bound)(params, fresh, X, 1e-6)
    for a, b in zip(jax.tree.leaves(g_std), jax.tree.leaves(g_cor)):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-9)
    for ell, amp in ((1.5, 3.0), (0.5, 1.0), (3.0, 0.5)):                 # theta moved with q fixed: L <= L' <= log Z
        moved = P.PPAParams(K.SquaredExponential(amp, ell), jnp.log(v))
        cov = np.asarray(moved.kernel.gram(X)) + (1 + v) * np.eye(5)
        std = float(P.standard_bound(moved, fresh, X, 1e-6))
        cor = float(P.corrected_bound(moved, fresh, X, 1e-6))
        assert std < cor < _orthant_log_prob(cov, y)


def test_ppa_corrected_converges_in_fewer_iterations_to_the_same_bound():
    from sklearn.datasets import make_moons

    X, y = make_moons(40, noise=0.2, random_state=0)
    y = 2.0 * y - 1
    kw = dict(noise=1.0, tol=1e-5, m_steps=5, learn_noise=False)
    cor = gk.gp.ppa(K.SquaredExponential(1.0, 1.0), X, y, corrected=True, max_iters=200, **kw)
    std = gk.gp.ppa(K.SquaredExponential(1.0, 1.0), X, y, corrected=False, max_iters=4 * cor.num_iters, **kw)
    assert cor.converged and cor.num_iters < std.num_iters
    assert np.all(np.diff(cor.history) >= -1e-8)                           # L' is non-decreasing (notes B4)
    assert np.all(np.diff(std.history) >= -1e-8)                           # so is L under the standard scheme
    assert np.all(cor.history_standard <= cor.history_corrected + 1e-10)  # L <= L' at every E-step
    assert cor.history[-1] >= std.history[-1] - 1e-6                       # standard still below after 4x the work
    mean, var, p = gk.gp.ppa_predict(cor, X)
    assert np.mean(np.sign(mean) == y) >= 0.75 and np.all((p > 0) & (p < 1))


def test_ppa_compiles_its_steps_once():
    """The kernel's Python-float hyperparameters are weakly typed and the M-step returns strongly typed ones:
    `ppa` casts them first, so the E- and M-steps compile once (they compiled twice)."""
    from gkl_jax.gp import _ppa as P

    rng = np.random.default_rng(4)
    X = rng.normal(size=(23, 2))
    y = np.where(X[:, 0] + 0.3 * rng.normal(size=23) > 0, 1.0, -1.0)
    before = P.TRACE_COUNT["ppa"]
    res = gk.gp.ppa(K.SquaredExponential(1.0, 1.0), X, y, max_iters=3, m_steps=2)
    assert res.num_iters >= 2
    assert P.TRACE_COUNT["ppa"] == before + 1


def test_label_regression_is_the_best_regression_posterior_and_its_jensen_bound():
    """LR (papers/003 Section 4.8): q is exact GP regression on the labels at the grid's best noise sd, and its
    log_z is the G-KL bound of the classification model at q, so it is below the optimised G-KL bound."""
    X, f = _data(10)
    y = np.where(f > 0, 1.0, -1.0)
    kernel = K.SquaredExponential(1.0, 1.0)
    model = gk.gp.model(kernel, X, gk.potentials.Probit(y))
    sds = (0.5, 1.0, 2.0)
    lr = gk.gp.label_regression(model, noise_sds=sds)
    evidences = [float(gk.gp.exact(gk.gp.model(kernel, X, gk.potentials.Gaussian(y, s ** 2))).log_z) for s in sds]
    best = gk.gp.exact(gk.gp.model(kernel, X, gk.potentials.Gaussian(y, sds[int(np.argmax(evidences))] ** 2)))
    np.testing.assert_allclose(lr.q.mean, best.q.mean, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(lr.q.covariance(), best.q.covariance(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(lr.log_z, gk.bound(model, lr.q), rtol=1e-12)
    assert float(lr.log_z) < float(gk.fit(model).log_z)
    assert lr.method == "label_regression" and lr.is_bound
    with pytest.raises(ValueError, match="Logistic or Probit"):
        gk.gp.label_regression(gk.gp.model(kernel, X, gk.potentials.Gaussian(f)))
    with pytest.raises(ValueError, match="noise_sds"):
        gk.gp.label_regression(model, noise_sds=(1.0, -0.5))
    # differentiable in the kernel (the best sd is picked by array operations): central differences (the values
    # and the gradient come from one compiled program)
    lr_z = jax.jit(jax.value_and_grad(lambda ell: gk.gp.label_regression(
        gk.gp.model(K.SquaredExponential(1.0, ell), X, gk.potentials.Probit(y)), noise_sds=sds).log_z))
    h = 1e-5
    np.testing.assert_allclose(lr_z(1.0)[1], (lr_z(1.0 + h)[0] - lr_z(1.0 - h)[0]) / (2 * h), rtol=1e-6)


@pytest.mark.parametrize("method", ["laplace", "ep"])
def test_ml2_with_a_baseline_objective_is_the_same_call(method):
    """fit_hyperparameters picks eager forward-mode gradients for the baselines by itself; with a Gaussian
    likelihood their log Z is exact, so ML-II lands on exact GP regression's hyperparameters."""
    X, y = _data(8)
    build = lambda k: gk.gp.model(k, X, gk.potentials.Gaussian(y, NOISE))
    k0 = K.SquaredExponential(1.0, 1.0)
    ex = gk.gp.fit_hyperparameters(build, k0, method="exact", gtol=1e-5)
    base = gk.gp.fit_hyperparameters(build, k0, method=method, gtol=1e-5, max_steps=40)
    assert base.converged
    np.testing.assert_allclose(base.log_z, ex.log_z, rtol=1e-7)
    np.testing.assert_allclose(base.params.lengthscale, ex.params.lengthscale, rtol=1e-3)


def test_inducing_inputs_are_optimisable():
    """d log_z / dZ through the fitted sparse bound (envelope theorem) equals central differences of the
    re-optimised bound, and ML-II over (kernel, Z) raises the bound."""
    X, y = _data(12)
    lik = gk.potentials.Laplace(y, 0.3)
    kernel = K.SquaredExponential(1.0, 1.0)
    Z0 = jnp.asarray(X[::4] + 0.1)
    # one compiled program (the fit's tolerance is an argument): the gradient at tol 1e-8, the refits at 1e-10
    value_and_grad = jax.jit(jax.value_and_grad(
        lambda Z, tol: gk.fit(gk.gp.sparse_model(kernel, X, Z, lik), tol=tol).log_z))
    log_z = lambda Z, tol=1e-10: float(value_and_grad(Z, tol)[0])
    grad = np.asarray(value_and_grad(Z0, 1e-8)[1])
    eps = 1e-5
    for i in (0, 2):
        e = jnp.zeros_like(Z0).at[i, 0].set(eps)
        fd = (log_z(Z0 + e) - log_z(Z0 - e)) / (2 * eps)
        np.testing.assert_allclose(grad[i, 0], fd, rtol=1e-5, atol=1e-6)
    build = lambda p: gk.gp.sparse_model(p[0], X, p[1], lik)
    with pytest.warns(UserWarning, match="without meeting"):
        res = gk.gp.fit_hyperparameters(build, (kernel, Z0), max_steps=2)
    assert float(res.log_z) > log_z(Z0) + 1e-3
    assert not np.allclose(np.asarray(res.params[1]), np.asarray(Z0))
