"""GP hyperparameters (ML-II): the gradient of the re-optimised bound, the exact evidence with a Gaussian
likelihood, the compiled outer loop against the host loop, its tolerances, step limits and optax optimisers."""

import types
from dataclasses import replace

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _helpers_gp import NOISE, _data, eqx_set

import gkl_jax as gk
from gkl_jax import kernels as K
from gkl_jax.gp import _hyper_loop


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
