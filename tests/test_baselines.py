"""Baselines (Laplace, local bound, double loop, AIS) against exact oracles: Gaussian closed forms, dense
grid quadrature in 2 D, and dense linear algebra for the Lanczos variances. EP and Laplace against quadrature
and scikit-learn: tests/test_baselines_ep.py."""

import warnings

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _helpers_baselines import grid_posterior
from helpers import gaussian_log_evidence

import gkl_jax as gk
from gkl_jax import _lanczos
from gkl_jax.baselines import _double_loop, _ep, _laplace, _local
from gkl_jax.operators import AbstractOperator

P = gk.potentials


# ----------------------------------------------------------------------------------------------------------
# 1. Gaussian-only models: every method is exact.

@pytest.fixture(scope="module")
def gaussian_model():
    rng = np.random.default_rng(0)
    D, N = 3, 7
    X = rng.normal(size=(N, D))
    y = rng.normal(size=N)
    offset = rng.normal(size=N)
    model = gk.Model(gk.priors.Isotropic(D, 1.5), gk.Sites(X, P.Gaussian(y, 0.4), offset=offset))
    log_z, mean, cov = gaussian_log_evidence(X, y - offset, 0.4, 1.5 * np.eye(D))
    return model, log_z, mean, cov


@pytest.mark.parametrize("method", ["laplace", "ep", "power-ep", "local", "double_loop"])
def test_gaussian_model_is_exact(gaussian_model, method):
    model, log_z, mean, cov = gaussian_model
    run = {"laplace": gk.laplace, "ep": gk.ep, "power-ep": lambda m: gk.ep(m, power=0.7, damping=1.0),
           "local": gk.local, "double_loop": lambda m: gk.double_loop(m, rank=model.dim)}[method]
    res = run(model)
    assert bool(res.converged)
    np.testing.assert_allclose(res.log_z, log_z, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(res.q.mean, mean, atol=1e-8)
    if method == "double_loop":  # q = N(u, W W^T + a 4e-11 relative ridge); with K = D, W W^T = A^{-1}
        np.testing.assert_allclose(res.q.marginal_variances(), np.diag(cov), rtol=1e-8)
        np.testing.assert_allclose(res.q.covariance(), cov, atol=1e-8 * np.max(np.abs(cov)))
    else:
        np.testing.assert_allclose(res.q.covariance(), cov, atol=1e-10)
    assert res.is_bound == (method == "local")
    assert res.history.shape[0] >= int(res.num_steps) + 1
    # jit once: a second call on a model of the same structure does not retrace.
    module = {"laplace": _laplace, "ep": _ep, "power-ep": _ep, "local": _local, "double_loop": _double_loop}[method]
    count = dict(module.TRACE_COUNT)
    run(eqx.tree_at(lambda m: m.sites[0].potential.y, model, model.sites[0].potential.y + 0.1))
    assert module.TRACE_COUNT == count


# ----------------------------------------------------------------------------------------------------------
# 2. Bound ordering on log-concave models (papers/000 Section 5.1.2) and AIS against quadrature.

def _two_d_sites(kind, rows=slice(None)):
    rng = np.random.default_rng(1)
    N = 9
    X = rng.normal(size=(N, 2))[rows]
    y = np.where(rng.uniform(size=N) < 0.5, 1.0, -1.0)[rows]
    potential = {"logistic": P.Logistic(y), "probit": P.Probit(y), "laplace": P.Laplace(2 * y, 0.5)}[kind]
    return gk.Sites(X, potential)


def _two_d_model(kind):
    return gk.Model(gk.priors.Isotropic(2, 2.0), _two_d_sites(kind))


@pytest.fixture(scope="module")
def mixed():
    """A 2-D model with logistic, probit and Laplace sites; its G-KL fit and grid quadrature (computed once:
    compiling gk.fit dominates the cost; L-BFGS compiles fastest and reaches the same optimum of the concave
    bound)."""
    model = gk.Model(gk.priors.Isotropic(2, 2.0), [_two_d_sites("logistic", slice(0, 3)),
                                                   _two_d_sites("probit", slice(3, 6)),
                                                   _two_d_sites("laplace", slice(6, 9))])
    return model, gk.fit(model, solver=gk.solvers.LBFGS()), grid_posterior(model)[0]


def test_local_bound_below_gkl_below_log_z(mixed):
    model, gkl, exact = mixed
    loc = gk.local(model)
    at_local = float(gk.bound(model, loc.q))
    assert bool(loc.converged) and loc.is_bound and bool(gkl.converged)
    assert float(loc.log_z) <= at_local + 1e-10
    assert at_local <= float(gkl.log_z) + 1e-10
    assert float(gkl.log_z) <= exact + 1e-6
    assert float(loc.log_z) < float(gkl.log_z) - 1e-3  # the dominance is strict here
    finite = loc.history[: int(loc.num_steps) + 1]
    assert np.all(np.diff(np.asarray(finite)) >= -1e-10)  # EM never decreases the bound


@pytest.mark.parametrize("kind", ["logistic", "probit", "laplace"])
def test_chain_holds_on_each_log_concave_model_alone(kind):
    """local.log_z <= bound(q_local) <= fit.log_z <= exact log Z (papers/000 Section 5.1.2) on a 2-D model
    whose nine sites are all of one kind."""
    model = _two_d_model(kind)
    loc, gkl, exact = gk.local(model), gk.fit(model, solver=gk.solvers.LBFGS()), grid_posterior(model)[0]
    at_local = float(gk.bound(model, loc.q))
    assert bool(loc.converged) and bool(gkl.converged)
    assert float(loc.log_z) <= at_local + 1e-10 <= float(gkl.log_z) + 2e-10
    assert float(gkl.log_z) <= exact + 1e-6


@pytest.mark.parametrize("potential", [P.Logistic(np.array([1.0, -1.0])), P.Probit(np.array([1.0, -1.0])),
                                       P.Laplace(np.array([0.3, -1.0]), 0.7),
                                       P.StudentT(np.array([0.5, 2.0]), 3.0, 0.4),
                                       P.Cauchy(np.array([0.0, 1.0]), 0.8), P.Gaussian(np.array([0.2, 1.0]), 0.5)],
                         ids=lambda p: type(p).__name__)
def test_site_bounds_are_tangent_lower_bounds(potential):
    """Each exponentiated-quadratic site bound lies below log phi everywhere and touches it at its tangent point."""
    from gkl_jax.baselines import _site_bounds as SB
    x = jnp.linspace(-15, 15, 3001)[:, None] * jnp.ones(2)
    for point in (0.05, 0.8, 3.0):
        if isinstance(potential, P.Probit):
            tau, nu, c = SB.probit_coefficients(potential.y, jnp.full(2, point))
            touch = potential.y * point
        else:
            form = SB.super_gaussian(potential, "local")
            tau, nu, c = SB.tangent_coefficients(form, jnp.full(2, point**2))
            touch = form.center + point
        gap = potential.log_phi(x) - (-0.5 * tau * x**2 + nu * x + c)
        assert float(jnp.min(gap)) >= -1e-10
        np.testing.assert_allclose(potential.log_phi(touch), -0.5 * tau * touch**2 + nu * touch + c, atol=1e-10)


def test_ais_agrees_with_quadrature(mixed):
    model, gkl, exact = mixed
    res = gk.ais(model, jax.random.PRNGKey(0), q=gkl, num_chains=128, num_temperatures=60)
    assert 0 < float(res.stderr) < 0.05 and 0.5 < float(res.acceptance) <= 1
    assert abs(float(res.log_z) - exact) <= 4 * float(res.stderr)


# ----------------------------------------------------------------------------------------------------------
# 4. The double loop: matrix-free at D = 4096, Lanczos variances underestimate and converge.

class _Differences(AbstractOperator):
    """First differences (x_{i+1} - x_i), matrix-free; densifying it is an error."""

    dim: int = eqx.field(static=True)

    @property
    def shape(self):
        return (self.dim - 1, self.dim)

    def mv(self, x):
        return x[1:] - x[:-1]

    def rmv(self, y):
        return jnp.concatenate([-y[:1], y[:-1] - y[1:], y[-1:]])

    def sq_mv(self, v):
        return v[1:] + v[:-1]

    def sq_rmv(self, y):
        return jnp.concatenate([y[:1], y[:-1] + y[1:], y[-1:]])

    def as_matrix(self):
        raise AssertionError("the double loop must not densify H")


def _sparse_linear_model(dim, seed=0, matrix_free=True):
    """Denoising a piecewise-constant signal: N(y | u, 0.09 I) times Laplace potentials on u_{i+1} - u_i."""
    rng = np.random.default_rng(seed)
    u = np.cumsum(rng.laplace(size=dim) * (rng.uniform(size=dim) < 0.05))
    y = u + 0.3 * rng.normal(size=dim)
    B = _Differences(dim) if matrix_free else np.diff(np.eye(dim), axis=0)
    return gk.Model(None, [gk.Sites(None, P.Gaussian(y, 0.09)), gk.Sites(B, P.Laplace(np.zeros(dim - 1), 0.5))]), u, y


def test_double_loop_runs_matrix_free_on_4096_variables():
    model, u, y = _sparse_linear_model(4096)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # three outer steps need not settle
        res = gk.double_loop(model, rank=16, max_outer=3, num_probes=2)
    assert np.isfinite(float(res.log_z)) and not res.is_bound
    assert int(res.num_steps) == 3
    assert np.mean(np.abs(res.q.mean - u)) < 0.7 * np.mean(np.abs(y - u))  # it denoises
    assert np.all(np.asarray(res.q.marginal_variances()) > 0)
    # q keeps the K Lanczos directions (glm-ie designs with them), matrix-free: S v = W (W^T v) + r v
    assert isinstance(res.q.factor, gk.factors.FactorAnalysis) and res.q.factor.theta.shape == (4096, 16)
    v = jax.random.normal(jax.random.PRNGKey(0), (4096,))
    W, r = np.asarray(res.q.factor.theta), np.asarray(res.q.factor.d) ** 2
    np.testing.assert_allclose(res.q.factor.covariance_mv(v), W @ (W.T @ np.asarray(v)) + r * v, rtol=1e-10)


def test_double_loop_variances_underestimate_and_converge_with_rank():
    dim = 120
    model, _, _ = _sparse_linear_model(dim, seed=1)
    key = jax.random.PRNGKey(3)
    forms = [gk.baselines._site_bounds.super_gaussian(s.potential, "test") for s in model.sites]
    groups = [(s.operator(dim), jnp.zeros(s.operator(dim).shape[0]), s.potential) for s in model.sites]

    ks = (5, 20, 60, dim)

    @jax.jit
    def at_fixed_point(key):
        _, xis, _, _, _ = _double_loop._run(model, key, 10, 3, 30, 200, 1e-4)
        taus, _, _ = _double_loop._coefficients(forms, xis)
        start = _double_loop._rademacher(key, dim, jnp.float64)
        Q, alpha, beta = _lanczos.lanczos(_double_loop._precision_mv(model, groups, taus), dim, dim, start)
        # The first k columns are the k-step Lanczos run.
        return taus, [_lanczos.variance_estimates(Q[:, :k], alpha[:k], beta[: k - 1]) for k in ks]

    taus, estimates = at_fixed_point(key)
    B = np.diff(np.eye(dim), axis=0)
    exact = np.diag(np.linalg.inv(np.diag(np.asarray(taus[0])) + B.T @ (np.asarray(taus[1])[:, None] * B)))
    errors = []
    for nu in estimates:
        assert np.all(np.asarray(nu) <= exact * (1 + 1e-9))
        errors.append(np.max(exact - np.asarray(nu)))
    assert all(a >= b for a, b in zip(errors, errors[1:])) and errors[-1] < 1e-9 * np.max(exact)
    assert errors[0] > 1e-3 * np.max(exact)  # few vectors: a real underestimate


def test_double_loop_with_full_rank_reaches_the_local_bound():
    model, _, _ = _sparse_linear_model(30, seed=2, matrix_free=False)
    res = gk.double_loop(model, rank=30, tol=1e-10, max_outer=300)
    loc = gk.local(model, tol=1e-13)
    assert bool(res.converged)
    np.testing.assert_allclose(res.q.mean, loc.q.mean, atol=1e-5)
    np.testing.assert_allclose(res.q.marginal_variances(), loc.q.marginal_variances(), rtol=1e-4)
    np.testing.assert_allclose(res.log_z, loc.log_z, rtol=1e-7)


# ----------------------------------------------------------------------------------------------------------
# 5. Input checks and honest failure reports.

def test_bad_inputs_raise_value_errors():
    model = _two_d_model("logistic")
    for power in (0.0, 1.5, -1):
        with pytest.raises(ValueError, match="power"):
            gk.ep(model, power=power)
    for damping in (0.0, 2.0):
        with pytest.raises(ValueError, match="damping"):
            gk.ep(model, damping=damping)
    for rank in (0, 3, 1.5):
        with pytest.raises(ValueError, match="rank"):
            gk.double_loop(model, rank=rank)
    poisson = gk.Model(gk.priors.Isotropic(2), gk.Sites(np.ones((3, 2)), P.Poisson(np.array([1.0, 0.0, 2.0]))))
    with pytest.raises(ValueError, match="Poisson.*super-Gaussian"):
        gk.local(poisson)
    with pytest.raises(ValueError, match="Probit.*super-Gaussian"):
        gk.double_loop(_two_d_model("probit"), rank=1)
    with pytest.raises(ValueError, match="Laplace.*twice differentiable"):
        gk.laplace(_two_d_model("laplace"))
    with pytest.raises(ValueError, match="variance_offset"):
        gk.ep(gk.Model(gk.priors.Isotropic(2), gk.Sites(np.ones((2, 2)), P.Logistic(np.ones(2)),
                                                         variance_offset=0.1)))
    with pytest.raises(ValueError, match="model"):
        gk.local("not a model")


def test_height_functions_match_thesis_table_3_1():
    """Table 3.1 with the corrections of the notes (seed003_part1 Section 11, check 3)."""
    from jax.scipy.special import gammaln
    nu, tau = 3.0, 2.0
    student = P.StudentT(0.0, nu, np.sqrt(1 / tau))
    log_norm = float(gammaln(2.0) - gammaln(1.5) - 0.5 * np.log(nu * np.pi) + 0.5 * np.log(tau))
    np.testing.assert_allclose(gk.baselines.height(student, jnp.array([0.2, 1.0, 5.0])) + 2 * log_norm,
                               [0.0, 1.423317, 6.661069], atol=2e-6)
    np.testing.assert_allclose(gk.baselines.height(P.Logistic(1.0), jnp.array([3.0, 5.0, 10.0, 50.0])),
                               [2 * np.log(2), 1.457999, 2.513911, 12.5], atol=2e-6)
