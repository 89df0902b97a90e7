"""`gk.fit`: exactness on Gaussian models, agreement of the solvers, jit/vmap behaviour, float32, and input
validation. Envelope and implicit derivatives: tests/test_fit_derivatives.py."""

import warnings

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from _helpers_fit import _gaussian_data, _logistic, _logistic_model
from helpers import gaussian_log_evidence
from jax import lax

import gkl_jax as gk
from gkl_jax import _fit
from gkl_jax._optim import default_tol


def test_exact_on_gaussian_model_with_isotropic_prior():
    H, y, noise, _ = _gaussian_data(0, 4, 7)
    model = gk.Model(gk.priors.Isotropic(4, 1.7), gk.Sites(H, gk.potentials.Gaussian(y, noise)))
    log_z, mean, cov = gaussian_log_evidence(H, y, noise, 1.7 * np.eye(4))
    res = gk.fit(model)
    assert bool(res.converged)
    assert abs(float(res.log_z) - log_z) < 1e-8
    np.testing.assert_allclose(res.q.mean, mean, atol=1e-8)
    np.testing.assert_allclose(res.q.covariance(), cov, atol=1e-8)
    np.testing.assert_allclose(res.q.marginal_variances(), np.diag(cov), atol=1e-8)
    assert abs(float(gk.bound(model, res.q)) - float(res.log_z)) < 1e-10


def test_exact_on_gaussian_model_with_diagonal_prior_offsets_and_mean():
    """Diagonal prior with a mean; one group with per-site offsets (y - offset is what the data sees)."""
    H, y, noise, rng = _gaussian_data(1, 4, 7)
    v = rng.uniform(0.5, 2.0, size=4)
    mu = rng.normal(size=4)
    off = rng.normal(size=7)
    model = gk.Model(gk.priors.Diagonal(v, mean=mu), gk.Sites(H, gk.potentials.Gaussian(y, noise), offset=off))
    log_z, mean, cov = gaussian_log_evidence(H, y - off, noise, np.diag(v), mu)
    res = gk.fit(model)
    assert abs(float(res.log_z) - log_z) < 1e-8
    np.testing.assert_allclose(res.q.mean, mean, atol=1e-8)
    np.testing.assert_allclose(res.q.covariance(), cov, atol=1e-8)


@pytest.mark.parametrize("whiten", [False, True])
def test_exact_on_gaussian_model_with_dense_prior_and_several_groups(whiten):
    """Dense prior N(mu, Sigma) and two Sites groups (one with offsets, one with its own noise levels)."""
    H, y, noise, rng = _gaussian_data(2, 4, 9)
    A = rng.normal(size=(4, 4))
    Sigma = A @ A.T / 4 + 0.3 * np.eye(4)
    mu = rng.normal(size=4)
    off = rng.normal(size=5)
    model = gk.Model(gk.priors.Dense(Sigma, mu), [
        gk.Sites(H[:5], gk.potentials.Gaussian(y[:5], noise[:5]), offset=off),
        gk.Sites(H[5:], gk.potentials.Gaussian(y[5:], noise[5:])),
    ])
    log_z, mean, cov = gaussian_log_evidence(H, y - np.concatenate([off, np.zeros(4)]), noise, Sigma, mu)
    res = gk.fit(model, whiten=whiten)
    assert bool(res.converged)
    assert abs(float(res.log_z) - log_z) < 1e-8
    np.testing.assert_allclose(res.q.mean, mean, atol=1e-8)
    np.testing.assert_allclose(res.q.covariance(), cov, atol=1e-8)


def test_whiten_takes_q0_to_the_whitened_basis():
    """q0 = the exact posterior: in the whitened basis it is already the optimum (zero steps, same q); a Student-t
    model warm-started from a perturbed q reaches the cold whitened fit's bound."""
    H, y, noise, rng = _gaussian_data(2, 4, 9)
    A = rng.normal(size=(4, 4))
    Sigma = A @ A.T / 4 + 0.3 * np.eye(4)
    mu = rng.normal(size=4)
    model = gk.Model(gk.priors.Dense(Sigma, mu), gk.Sites(H, gk.potentials.Gaussian(y, noise)))
    exact = gk.fit(model)
    res = gk.fit(model, q0=exact.q, whiten=True)
    assert bool(res.converged) and int(res.num_steps) == 0
    np.testing.assert_allclose(res.q.mean, exact.q.mean, atol=1e-10)
    np.testing.assert_allclose(res.q.covariance(), exact.q.covariance(), atol=1e-10)
    t_model = gk.Model(gk.priors.Dense(Sigma, mu), gk.Sites(H, gk.potentials.StudentT(y, 3.0, 0.5)))
    cold = gk.fit(t_model, whiten=True)
    q0 = gk.Gaussian(exact.q.mean + 0.3, gk.factors.Full(1.5 * exact.q.factor.upper()))
    warm = gk.fit(t_model, q0=q0, whiten=True)
    assert bool(cold.converged) and bool(warm.converged)
    assert abs(float(warm.log_z) - float(cold.log_z)) < 1e-8
    with pytest.raises(ValueError, match="Full"):
        gk.fit(model, q0=gk.Gaussian(exact.q.mean, gk.factors.Diagonal(jnp.ones(4))), whiten=True)


def test_prior_free_model_with_an_identity_sites_group_is_exact():
    """prior None: a Sites(None, Gaussian) group over w itself plays the prior's role (h_n = e_n)."""
    H, y, noise, _ = _gaussian_data(3, 3, 6)
    model = gk.Model(None, [gk.Sites(None, gk.potentials.Gaussian(jnp.zeros(3), 2.0)),
                            gk.Sites(H, gk.potentials.Gaussian(y, noise))])
    log_z, mean, cov = gaussian_log_evidence(H, y, noise, 2.0 * np.eye(3))
    res = gk.fit(model)
    assert abs(float(res.log_z) - log_z) < 1e-8
    np.testing.assert_allclose(res.q.covariance(), cov, atol=1e-8)


def test_solvers_agree_on_a_logistic_model():
    X, y = _logistic()
    model = _logistic_model(X, y)
    solvers = (("fixed-point", gk.solvers.FixedPoint()), ("newton", gk.solvers.Newton()), ("lbfgs", gk.solvers.LBFGS()))
    results = {name: gk.fit(model, solver=s) for name, s in solvers}
    results["optax"] = gk.fit(model, solver=optax.adam(0.05), tol=1e-5)
    # an optax optimiser with a line search: its updates need value, grad and value_fn (a TypeError before)
    results["optax-lbfgs"] = gk.fit(model, solver=optax.lbfgs())
    ref = results["fixed-point"]
    assert bool(ref.converged)
    for name, res in results.items():
        assert bool(res.converged), name
        tol = 1e-8 if name != "optax" else 1e-7
        assert abs(float(res.log_z) - float(ref.log_z)) < tol, name
        np.testing.assert_allclose(res.q.mean, ref.q.mean, atol=1e-5 if name != "optax" else 1e-4)
    # the fixed point never lets the bound decrease; history is NaN after the last step
    hist = np.asarray(ref.history)
    k = int(ref.num_steps)
    assert np.all(np.diff(hist[: k + 1]) >= -1e-12) and np.all(np.isnan(hist[k + 1:]))
    assert abs(hist[k] - float(ref.log_z)) < 1e-10


def test_full_factor_beats_diagonal_and_warm_start_is_faster():
    X, y = _logistic()
    model = _logistic_model(X, y)
    full = gk.fit(model)
    diag = gk.fit(model, gk.factors.Diagonal())
    assert bool(diag.converged)
    assert float(full.log_z) > float(diag.log_z)
    again = gk.fit(model, q0=full.q)
    assert int(again.num_steps) <= 1 and abs(float(again.log_z) - float(full.log_z)) < 1e-10
    # a float32 warm start (e.g. from a float32 fit) starts the float64 fit in float64
    single = gk.fit(model, q0=jax.tree.map(lambda x: x.astype(jnp.float32), full.q))
    assert single.q.mean.dtype == jnp.float64 and bool(single.converged)
    assert abs(float(single.log_z) - float(full.log_z)) < 1e-10


def test_refitting_new_data_of_the_same_shapes_does_not_retrace():
    X, y = _logistic(seed=10)
    gk.fit(_logistic_model(X, y))
    before = _fit.TRACE_COUNT["fit"]
    for seed in (11, 12):
        X2, y2 = _logistic(seed=seed)
        res = gk.fit(_logistic_model(X2, y2, variance=1.5))
        assert bool(res.converged)
    assert _fit.TRACE_COUNT["fit"] == before


def test_fits_at_different_tolerances_share_one_compilation():
    X, y = _logistic(seed=13)
    model = _logistic_model(X, y)
    gk.fit(model, tol=1e-4)
    before = _fit.TRACE_COUNT["fit"]
    loose, tight = gk.fit(model, tol=1e-3), gk.fit(model, tol=1e-8)
    assert _fit.TRACE_COUNT["fit"] == before
    assert bool(loose.converged) and bool(tight.converged)
    assert int(loose.num_steps) <= int(tight.num_steps)
    assert float(tight.log_z) >= float(loose.log_z) - 1e-12


def test_vmap_over_fit_matches_separate_fits():
    X, _ = _logistic()
    labels = np.stack([_logistic(seed=s)[1] for s in (20, 21, 22)])
    batched = jax.vmap(lambda y: gk.fit(_logistic_model(X, y)).log_z)(jnp.asarray(labels))
    single = [float(gk.fit(_logistic_model(X, y)).log_z) for y in labels]
    np.testing.assert_allclose(batched, single, rtol=1e-10)


def test_float32_fit_converges_with_the_default_float32_tolerance():
    X, y = _logistic()
    X32, y32 = jnp.asarray(X, jnp.float32), jnp.asarray(y, jnp.float32)
    model = gk.Model(gk.priors.Isotropic(2, jnp.float32(2.0)), gk.Sites(X32, gk.potentials.Logistic(y32)))
    for factor in (gk.factors.Full(), gk.factors.Diagonal()):
        res = gk.fit(model, factor)
        assert res.log_z.dtype == jnp.float32 and res.q.mean.dtype == jnp.float32
        assert bool(res.converged)
        ref = gk.fit(_logistic_model(X, y), factor)
        assert abs(float(res.log_z) - float(ref.log_z)) < 1e-4 * abs(float(ref.log_z))
    assert default_tol(jnp.float32) == 1e-3


def test_a_model_holds_one_dtype_the_promotion_of_its_data():
    """Python floats (a prior variance, kernel parameters) take the data's dtype; float32 data with float64 data
    promote to float64. Mixed models used to crash inside the solvers' loops (whiten=True on a float32 GP with
    Python-float kernel parameters; float32 H with float64 labels)."""
    X, y = _logistic()
    X32, y32 = jnp.asarray(X, jnp.float32), jnp.asarray(y, jnp.float32)
    dtypes = lambda m: {x.dtype for x in jax.tree.leaves(m) if eqx.is_inexact_array(x)}
    model32 = gk.Model(gk.priors.Isotropic(2, 2.0), gk.Sites(X32, gk.potentials.Logistic(y32)))
    mixed = gk.Model(gk.priors.Isotropic(2, 2.0), gk.Sites(X32, gk.potentials.Logistic(jnp.asarray(y))))
    assert dtypes(model32) == {jnp.dtype(jnp.float32)} and dtypes(mixed) == {jnp.dtype(jnp.float64)}
    ref = float(gk.fit(_logistic_model(X, y)).log_z)
    res = gk.fit(model32)
    assert res.log_z.dtype == jnp.float32 and bool(res.converged)
    assert abs(float(res.log_z) - ref) < 1e-4 * abs(ref)
    assert abs(float(gk.fit(mixed).log_z) - ref) < 1e-8 * abs(ref)
    gp32 = gk.gp.model(gk.kernels.SquaredExponential(1.0, 1.0), X32[:12], gk.potentials.Logistic(y32[:12]))
    gp64 = gk.gp.model(gk.kernels.SquaredExponential(1.0, 1.0), jnp.asarray(X[:12]), gk.potentials.Logistic(y[:12]))
    res = gk.fit(gp32, whiten=True)
    assert res.log_z.dtype == jnp.float32 and bool(res.converged)
    assert abs(float(res.log_z) - float(gk.fit(gp64).log_z)) < 1e-4 * abs(float(res.log_z))


def _dot_precisions(jaxpr):
    """The precision of every dot_general in a jaxpr, its sub-jaxprs (loops, conds, jit, custom rules) included."""
    found = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "dot_general":
            found.append(eqn.params["precision"])
        for value in eqn.params.values():
            for sub in value if isinstance(value, (tuple, list)) else (value,):
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    found += _dot_precisions(inner)
    return found


def test_float32_products_run_in_full_precision_on_accelerators(monkeypatch):
    """On GPU/TPU JAX's default float32 products are TF32/bfloat16 (1e-3 relative; on an H200 float32 fits then
    stalled short of tol). fit, bound and the GP prior run theirs at HIGHEST unless the user set a precision; a
    user's reduced setting makes fit warn and a failed Cholesky say why. (The backend is faked for the warnings:
    the check reads jax.default_backend().)"""
    X, y = _logistic()
    model32 = gk.Model(gk.priors.Isotropic(2, jnp.float32(2.0)),
                       gk.Sites(jnp.asarray(X, jnp.float32), gk.potentials.Logistic(jnp.asarray(y, jnp.float32))))
    precisions = _dot_precisions(jax.make_jaxpr(lambda m: gk.fit(m, gk.factors.Full()).log_z)(model32).jaxpr)
    assert len(precisions) > 10 and all(p == (lax.Precision.HIGHEST,) * 2 for p in precisions)
    q = gk.fit(model32, gk.factors.Full()).q
    assert all(p == (lax.Precision.HIGHEST,) * 2 for p in _dot_precisions(jax.make_jaxpr(gk.bound)(model32, q).jaxpr))
    with jax.default_matmul_precision("bfloat16"):   # the user's choice is kept
        assert {p for p in _dot_precisions(jax.make_jaxpr(gk.bound)(model32, q).jaxpr)} == {
            (lax.Precision.DEFAULT,) * 2}

    def precision_warnings(model):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            gk.fit(model, gk.factors.Diagonal())
        return [w for w in caught if "TF32" in str(w.message)]

    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    assert not precision_warnings(model32)
    with jax.default_matmul_precision("tensorfloat32"):
        assert len(precision_warnings(model32)) == 1
        assert not precision_warnings(_logistic_model(X, y))    # float64
        with pytest.raises(ValueError, match="positive definite.*TF32"):
            gk.priors.Dense(np.diag([1.0, -1.0]).astype(np.float32))


@pytest.mark.parametrize("verb", ["laplace", "ep", "local", "bound_chunked"])
def test_other_verbs_run_float32_products_in_full_precision(verb):
    """The baselines and the streamed bound take the same `full_precision` as fit (every public verb that runs
    matrix products does): each dot_general of their traced programs carries HIGHEST."""
    X, y = _logistic()
    model = gk.Model(gk.priors.Isotropic(2, jnp.float32(2.0)),
                     gk.Sites(jnp.asarray(X, jnp.float32), gk.potentials.Logistic(jnp.asarray(y, jnp.float32))))
    q = gk.fit(model, gk.factors.Full()).q
    run = {"laplace": lambda m: gk.laplace(m).log_z, "ep": lambda m: gk.ep(m).log_z,
           "local": lambda m: gk.local(m).log_z,
           "bound_chunked": lambda m: gk.stochastic.bound_chunked(m, q, chunk_size=5)}[verb]
    precisions = _dot_precisions(jax.make_jaxpr(run)(model).jaxpr)
    assert precisions and all(p == (lax.Precision.HIGHEST,) * 2 for p in precisions)


def test_too_few_steps_reports_not_converged_with_a_warning_and_no_nan():
    X, y = _logistic()
    model = _logistic_model(X, y)
    with pytest.warns(UserWarning, match="without meeting its stopping test"):
        res = gk.fit(model, max_steps=1)
    assert not bool(res.converged) and int(res.num_steps) == 1
    assert np.isfinite(float(res.log_z)) and np.all(np.isfinite(np.asarray(res.q.mean)))
    assert np.all(np.isfinite(np.asarray(res.q.covariance())))
    assert float(res.log_z) < float(gk.fit(model).log_z)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        gk.fit(model)           # converged: no warning


def test_bad_arguments_raise_value_error():
    X, y = _logistic()
    model = _logistic_model(X, y)
    with pytest.raises(ValueError, match="solver"):
        gk.fit(model, solver="gradient-descent")
    with pytest.raises(ValueError, match="solver"):
        gk.fit(model, solver=3)
    t_model = gk.Model(gk.priors.Isotropic(2, 1.0), gk.Sites(X, gk.potentials.StudentT(y, 3.0)))
    with pytest.raises(ValueError, match="log-concave"):
        gk.fit(t_model, solver=gk.solvers.FixedPoint())
    with pytest.raises(ValueError, match="tol"):
        gk.fit(model, tol=0.0)
    with pytest.raises(ValueError, match="max_steps"):
        gk.fit(model, max_steps=0)
    with pytest.raises(ValueError, match="model"):
        gk.fit("not a model")
    with pytest.raises(ValueError, match="factor"):
        gk.fit(model, factor="full")
    with pytest.raises(ValueError, match="whiten"):
        gk.fit(gk.Model(None, gk.Sites(X, gk.potentials.Logistic(y))), whiten=True)
    q0 = gk.Gaussian(jnp.zeros(2), gk.factors.Full())
    with pytest.raises(ValueError, match="q0"):
        gk.fit(model, q0=gk.Gaussian(jnp.zeros(3), gk.factors.Full()), whiten=True)
    with pytest.raises(ValueError, match="q0"):
        gk.fit(model, gk.factors.Diagonal(), q0=q0)
    with pytest.raises(ValueError, match="q0"):
        gk.fit(model, q0=gk.Gaussian(jnp.zeros(3), gk.factors.Full()))


def test_lbfgs_returns_its_best_iterate_and_stops_when_no_step_makes_progress():
    """f = -1e12 sum w (x^2 - 2)^2: x = sqrt(2) is not representable and x^2 - 2 != 0 for every double x (with or
    without fused multiply-add), so max|grad| stays above tol = 1e-8 and the line searches stop making progress;
    L-BFGS must report converged=False and return the best point it visited. A solver whose steps never move
    stops after LINESEARCH_MAX_STALLS steps."""
    from gkl_jax.solvers import _quasi_newton as _solvers

    w = jnp.array([1.0, 3.0, 10.0], dtype=jnp.float64)
    f = lambda x: -1e12 * jnp.sum(w * (x * x - 2) ** 2)
    x, k, ok, hist, value = jax.jit(lambda x0: _solvers.lbfgs(f, x0, tol=1e-8, max_steps=500))(
        jnp.ones(3, jnp.float64))
    assert not bool(ok) and float(jnp.max(jnp.abs(jax.grad(f)(x)))) > 1e-8
    visited = np.asarray(hist[: int(k) + 1])
    best = float(np.max(visited))
    assert -1e-10 < best < 0 and abs(float(jax.jit(f)(x)) - best) < 1e-12 and float(value) == float(jax.jit(f)(x))
    frozen = optax.chain(optax.scale(0.0), optax.scale_by_backtracking_linesearch(5))   # a line search's state
    x, k, ok, _ = _solvers.optax_solver(f, jnp.ones(3, jnp.float64), frozen, tol=1e-8, max_steps=500)
    assert not bool(ok) and int(k) == _solvers.LINESEARCH_MAX_STALLS
