"""The robust-GP default's second start (issue 63, item 2): Student-t sites under a GP prior with 20-30% outliers
and a small noise scale have local optima; the default also starts from the Gaussian-likelihood posterior with
inflated noise (`gk.solvers.inflated_noise_start`, closed form) and keeps the better (`gk.solvers.TwoStarts`).

The hard cases come from this file's own generator (N = 30, the hard tier's other settings), the oracle is the
best of the alternatives computed here: the one-start default before, the same chain from a separate Gaussian fit
with inflated noise, and whitened L-BFGS.
"""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import gkl_jax as gk
from gkl_jax import _fit

S = gk.solvers
HARD_N = 30


def hard_model(seed, n=HARD_N):
    """Student-t (dof 3) sites under SE(1, lengthscale 3-10) at n inputs on [-4, 4], y = sin x + s e with s in
    0.01-0.05 (log-uniform) and 20-30% of the targets moved by +-4, jitter 1e-8."""
    rng = np.random.default_rng(seed)
    scale, lengthscale = 10 ** rng.uniform(-2, np.log10(0.05)), rng.uniform(3, 10)
    X = np.sort(rng.uniform(-4, 4, n))
    y = np.sin(X) + scale * rng.standard_normal(n)
    k = int(round(rng.uniform(0.2, 0.3) * n))
    y[rng.choice(n, k, replace=False)] += rng.choice([-4.0, 4.0], k)
    kernel = gk.kernels.SquaredExponential(1.0, lengthscale)
    return gk.gp.model(kernel, X[:, None], gk.potentials.StudentT(y, 3.0, scale), jitter=1e-8)


def _quiet(fn, *args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn(*args, **kwargs)


def _alternatives(model):
    """log Z of the one-start default before, of that chain from a separate Gaussian-likelihood fit with the noise
    variance inflated to max(var(y) / 4, 100 s^2), and of whitened L-BFGS."""
    before = S.Chain((S.LBFGS(tol=S._default.ROBUST_HANDOFF), S.Newton()))
    lik = model.sites[0].potential
    y = np.asarray(lik.y)
    noise = max(0.25 * float(np.var(y)), 100.0 * float(lik.scale) ** 2)
    gaussian = gk.fit(gk.Model(model.prior, gk.Sites(None, gk.potentials.Gaussian(y, noise))))
    return {"before": float(_quiet(gk.fit, model, solver=before, whiten=True).log_z),
            "inflated": float(_quiet(gk.fit, model, solver=before, whiten=True, q0=gaussian.q).log_z),
            "lbfgs-w": float(_quiet(gk.fit, model, solver=S.LBFGS(), whiten=True).log_z)}


@pytest.mark.slow
def test_default_reaches_the_best_of_the_alternatives_on_hard_robust_gps():
    # 6338, 6340 and 6357: the one-start default stopped 17.5, 32.4 and 2.0 nats short; 6330-6332 agree
    short = 0
    for seed in (6330, 6331, 6332, 6338, 6340, 6357):
        model = hard_model(seed)
        res = gk.fit(model)
        others = _alternatives(model)
        best = max(others.values())
        assert bool(res.converged), seed
        assert float(res.log_z) >= best - 1e-3, (seed, float(res.log_z), others)
        np.testing.assert_allclose(float(gk.bound(model, res.q)), float(res.log_z), rtol=1e-10)
        short += others["before"] < best - 1e-3
    assert short >= 2      # the cases do exercise the local optima


def test_inflated_noise_start_is_the_conjugate_posterior():
    rng = np.random.default_rng(6371)
    model = hard_model(6371, n=12)
    lik = model.sites[0].potential
    y, s = np.asarray(lik.y), float(lik.scale)
    K = np.asarray(model.prior.covariance)
    v = max(0.25 * float(np.var(y)), 100.0 * s**2)
    G = np.linalg.solve(K + v * np.eye(12), np.c_[K, y])
    q = gk.solvers.inflated_noise_start(model)
    np.testing.assert_allclose(np.asarray(q.mean), K @ G[:, -1], rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(np.asarray(q.covariance()), K - K @ G[:, :-1], rtol=1e-6, atol=1e-9)
    # in the whitened basis (prior N(0, I), sites H L): the same posterior, mapped by w = L v
    from gkl_jax._whiten import whitened
    work, L, _ = whitened(model)
    qv = gk.solvers.inflated_noise_start(work)
    L = np.asarray(L)
    np.testing.assert_allclose(L @ np.asarray(qv.mean), K @ G[:, -1], rtol=1e-7, atol=1e-9)
    np.testing.assert_allclose(L @ np.asarray(qv.covariance()) @ L.T, K - K @ G[:, :-1], rtol=1e-6, atol=1e-9)
    # Gaussian sites keep their own variance: a Gaussian-only model is its exact posterior
    exact_model = gk.gp.model(gk.kernels.SquaredExponential(1.0, 2.0), rng.uniform(-2, 2, (8, 1)),
                              gk.potentials.Gaussian(rng.standard_normal(8), 0.1))
    qg = gk.solvers.inflated_noise_start(
        gk.Model(exact_model.prior, [exact_model.sites[0], gk.Sites(np.eye(8)[:1], gk.potentials.Cauchy(0.0, 1e6))]))
    ref = gk.gp.exact(exact_model)
    np.testing.assert_allclose(np.asarray(qg.mean), np.asarray(ref.q.mean), rtol=1e-6, atol=1e-8)


def test_default_chooses_two_starts_only_where_the_start_is_defined():
    model = hard_model(6372, n=8)
    chosen = S.default_solver(model, gk.factors.Full())
    assert isinstance(chosen, S.Chain) and isinstance(chosen.stages[0], S.TwoStarts)
    custom = gk.Model(model.prior, gk.Sites(None, gk.potentials.Custom(lambda x: -jnp.log1p(x**2))))
    assert isinstance(S.default_solver(custom, gk.factors.Full()).stages[0], S.LBFGS)
    with pytest.raises(ValueError, match="TwoStarts needs the Full factor"):
        gk.fit(model, gk.factors.Diagonal(), solver=S.TwoStarts(S.LBFGS()))
    logistic = gk.gp.model(gk.kernels.SquaredExponential(1.0, 1.0), np.linspace(0, 1, 8)[:, None],
                           gk.potentials.Logistic(np.sign(np.linspace(-1, 1, 8)) + 0.0))
    with pytest.raises(ValueError, match="TwoStarts needs a prior and Gaussian, StudentT or Cauchy"):
        gk.fit(logistic, solver=S.TwoStarts(S.LBFGS()))
    with pytest.raises(ValueError, match="solver must be"):
        S.TwoStarts("lbfgs")


@pytest.mark.slow
def test_two_starts_compile_once_per_shape_and_keep_derivatives():
    models = [hard_model(seed, n=10) for seed in (6373, 6374)]
    _quiet(gk.fit, models[0])
    before = _fit.TRACE_COUNT["fit"]
    res = _quiet(gk.fit, models[1])
    assert _fit.TRACE_COUNT["fit"] == before
    # d log Z / d (lengthscale) by the envelope theorem, against central differences of tight fits
    X = np.asarray(models[1].prior.X)
    lik = models[1].sites[0].potential

    def log_z(log_ls):
        kernel = gk.kernels.SquaredExponential(1.0, jnp.exp(log_ls))
        return gk.fit(gk.gp.model(kernel, X, lik, jitter=1e-8), tol=1e-10).log_z

    t = float(jnp.log(models[1].prior.kernel.lengthscale))
    h = 1e-4
    fd = (float(_quiet(log_z, t + h)) - float(_quiet(log_z, t - h))) / (2 * h)
    grad = float(_quiet(jax.grad(log_z), t))
    assert abs(grad - fd) <= 1e-4 * max(1.0, abs(fd)), (grad, fd)
    assert np.isfinite(float(res.log_z))
