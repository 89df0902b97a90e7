"""The baselines, the glm-ie double loop and King & Lawrence's PPA on the one loop (`gkl_jax.solvers.iterate`):
a `RESULTS` status with its message on every result, `progress=` on the long fits (double loop, PPA), exact log Z
on Gaussian sites, one compilation per shape, and the history buffers built only by the driver."""

import pathlib
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

import gkl_jax as gk
from gkl_jax.baselines import _double_loop
from gkl_jax.gp import _ppa
from gkl_jax.solvers._iterate import append_history, new_history

jax.config.update("jax_enable_x64", True)

H = np.array([[1.0, 0.5, 0.0], [-0.3, 1.0, 0.4], [0.2, -1.0, 0.3], [0.7, 0.1, -0.5], [0.1, 0.2, 1.0]])
Y = np.array([1.0, -1.0, 1.0, -1.0, 1.0])
PACKAGE = pathlib.Path(gk.__file__).parent


def _logistic(y=Y):
    return gk.Model(gk.priors.Isotropic(3, 1.0), gk.Sites(H, gk.potentials.Logistic(y)))


def _gaussian(y, noise=0.3, prior_var=2.0):
    return gk.Model(gk.priors.Isotropic(3, prior_var), gk.Sites(H, gk.potentials.Gaussian(y, noise)))


def _moons(n=30):
    from sklearn.datasets import make_moons

    X, y = make_moons(n, noise=0.2, random_state=0)
    return X, 2.0 * y - 1


BASELINES = {
    "laplace": lambda m, **kw: gk.laplace(m, max_steps=kw.get("steps", 100)),
    "ep": lambda m, **kw: gk.ep(m, max_steps=kw.get("steps", 500)),
    "local": lambda m, **kw: gk.local(m, max_steps=kw.get("steps", 1000)),
    "double_loop": lambda m, **kw: gk.double_loop(m, rank=3, max_outer=kw.get("steps", 100), tol=1e-8),
}


@pytest.mark.parametrize("method", sorted(BASELINES))
def test_baseline_status_message_converged_and_short(method):
    """Each baseline's result is `successful` (converged derived from it, the message says so); held to one
    step it is `max_steps_reached`, warns, and says so in its message."""
    res = BASELINES[method](_logistic())
    assert int(res.status) == gk.RESULTS.successful and bool(res.converged) and res.method == method
    assert res.message == gk.RESULTS.message(gk.RESULTS.successful)
    with pytest.warns(UserWarning):
        short = BASELINES[method](_logistic(), steps=1)
    assert int(short.status) == gk.RESULTS.max_steps_reached and not bool(short.converged)
    assert short.message.startswith("max_steps_reached") and int(short.num_steps) == 1
    hist = np.asarray(short.history)
    assert hist.shape == (2,) and np.all(np.isfinite(hist))


def test_gaussian_sites_give_the_exact_log_z():
    """On Gaussian sites every baseline is exact: log Z = log N(y | H mu, s2 H H^T + v I) (the double loop with
    K = D: exact variances and log det), the closed form computed here independently."""
    rng = np.random.default_rng(0)
    y = H @ rng.normal(size=3) + 0.5 * rng.normal(size=5)
    exact = stats.multivariate_normal(np.zeros(5), 2.0 * H @ H.T + 0.3 * np.eye(5)).logpdf(y)
    for method, run in BASELINES.items():
        res = run(_gaussian(y))
        assert bool(res.converged), method
        np.testing.assert_allclose(float(res.log_z), exact, rtol=1e-9, err_msg=method)


def test_double_loop_progress_reports_each_outer_step_and_the_status():
    """The callback sees outer steps 1..num_steps with the history's evidence estimates, then one call with done
    and the status; a second run of the same shape with the same callable compiles nothing."""
    infos = []
    res = gk.double_loop(_logistic(), rank=3, progress=infos.append)
    k = int(res.num_steps)
    assert [i.step for i in infos if not i.done] == list(range(1, k + 1))
    assert infos[-1].done and infos[-1].status == gk.RESULTS.successful and infos[-1].solver == "DoubleLoop"
    np.testing.assert_allclose([i.bound for i in infos[:-1]], np.asarray(res.history)[1: k + 1], rtol=1e-12)
    assert all(i.gradient >= 0 for i in infos[:-1]) and infos[-2].gradient <= 1e-4    # the tangent points' change
    before = _double_loop.TRACE_COUNT["double_loop"]
    gk.double_loop(_logistic(-Y), rank=3, progress=infos.append)
    assert _double_loop.TRACE_COUNT["double_loop"] == before


def test_double_loop_compiles_once_per_shape():
    BASELINES["double_loop"](_logistic())
    before = _double_loop.TRACE_COUNT["double_loop"]
    res = BASELINES["double_loop"](_logistic(-Y))
    assert _double_loop.TRACE_COUNT["double_loop"] == before and np.isfinite(float(res.log_z))


def test_double_loop_progress_printer_bad_value_and_a_callback_that_raises(capsys):
    gk.double_loop(_logistic(), rank=3, progress=True)
    err = capsys.readouterr().err
    assert re.search(r"gkl_jax\.double_loop: DoubleLoop step \d+  bound -\d+\.\d+ .*\(successful\)", err)
    for bad in ("loud", 2, 0.5):
        with pytest.raises(ValueError, match="progress"):
            gk.double_loop(_logistic(), rank=3, progress=bad)

    def stop(info):
        raise RuntimeError("halt the double loop")

    with pytest.raises(RuntimeError, match="halt the double loop"):
        gk.double_loop(_logistic(), rank=3, progress=stop)


def test_ppa_status_converged_and_max_iters():
    """A PPA fit that settles is `successful` (converged from the status, histories of num_iters entries with
    L <= L'); one held to two iterations is `max_steps_reached` and warns with that message."""
    X, y = _moons()
    kernel = gk.kernels.SquaredExponential(1.0, 1.0)
    res = gk.gp.ppa(kernel, X, y, tol=1e-5, m_steps=5, learn_noise=False)
    assert int(res.status) == gk.RESULTS.successful and bool(res.converged) and res.message.startswith("successful")
    n = res.num_iters
    assert res.history.shape == res.history_standard.shape == res.history_corrected.shape == (n,)
    assert abs(res.history[-1] - res.history[-2]) < 1e-5 <= abs(res.history[-2] - res.history[-3])
    assert np.all(res.history_standard <= res.history_corrected + 1e-10)
    with pytest.warns(UserWarning, match="max_steps_reached"):
        short = gk.gp.ppa(kernel, X, y, max_iters=2, m_steps=5, learn_noise=False)
    assert int(short.status) == gk.RESULTS.max_steps_reached and not bool(short.converged)
    assert short.num_iters == 2
    np.testing.assert_allclose(short.history, res.history[:2], rtol=1e-12)   # the same first two E-steps


def test_ppa_progress_and_compiles_once_per_shape():
    """The PPA callback sees iterations 1..num_iters-1 with the monitored bound (history), then the final
    status; refitting other labels of the same shape with the same callable compiles nothing."""
    X, y = _moons()
    infos = []
    kw = dict(tol=1e-5, m_steps=5, learn_noise=False, progress=infos.append)
    res = gk.gp.ppa(gk.kernels.SquaredExponential(1.0, 1.0), X, y, **kw)
    steps = [i.step for i in infos if not i.done]
    assert steps == list(range(1, res.num_iters))
    np.testing.assert_allclose([i.bound for i in infos[:-1]], res.history[1:], rtol=1e-12)
    assert infos[-1].done and infos[-1].status == gk.RESULTS.successful and infos[-1].solver == "PPA"
    before = _ppa.TRACE_COUNT["ppa"]
    gk.gp.ppa(gk.kernels.SquaredExponential(1.0, 1.0), X, np.where(X[:, 0] > 0.5, 1.0, -1.0), **kw)
    assert _ppa.TRACE_COUNT["ppa"] == before


def test_ppa_bad_progress():
    X, y = _moons(10)
    for bad in ("verbose", 1, object()):
        with pytest.raises(ValueError, match="progress"):
            gk.gp.ppa(gk.kernels.SquaredExponential(1.0, 1.0), X, y, progress=bad)


def test_history_helpers():
    """`new_history` is value0 then NaN; `append_history` continues it with a later run's steps (its start
    skipped, its NaN tail and anything past the buffer dropped)."""
    h = new_history(5, jnp.asarray(-3.0))
    np.testing.assert_array_equal(h, [-3.0] + [np.nan] * 5)
    h = append_history(h, jnp.array([-3.0, -2.0, -1.5, np.nan]), 0)     # a run of two steps
    np.testing.assert_array_equal(h, [-3.0, -2.0, -1.5, np.nan, np.nan, np.nan])
    h = append_history(h, jnp.array([-1.5, -1.2, -1.1, -1.0, -0.9]), jnp.asarray(2))   # four more: one is cut
    np.testing.assert_array_equal(h, [-3.0, -2.0, -1.5, -1.2, -1.1, -1.0])


def test_chain_and_refinement_histories_concatenate_their_solves():
    """A Chain's history is its stages' histories end to end (num_steps + 1 finite, non-decreasing values, NaN
    after); so is a refined Subspace fit's across its rounds."""
    model = _logistic()
    chain = gk.fit(model, solver=gk.solvers.Chain((gk.solvers.LBFGS(tol=1e-2), gk.solvers.Newton())))
    sub = gk.fit(model, gk.factors.Subspace(2, num_refinements=2))
    for res in (chain, sub):
        hist, k = np.asarray(res.history), int(res.num_steps)
        assert np.all(np.isfinite(hist[: k + 1])) and np.all(np.isnan(hist[k + 1:]))
        assert np.all(np.diff(hist[: k + 1]) >= -1e-9 * (1 + np.abs(hist[1: k + 1])))


def test_nan_history_buffers_and_while_loops_only_in_the_driver():
    """The files moved onto the driver build no NaN history buffer and run no `lax.while_loop` of their own."""
    files = ["_fit.py", "solvers/_chain.py", "gp/_ppa.py", "gp/_ppa_steps.py", *[
        f"baselines/{p.name}" for p in (PACKAGE / "baselines").glob("*.py")]]
    for name in files:
        text = (PACKAGE / name).read_text()
        assert not re.search(r"jnp\.full\(.*jnp\.nan", text), name
        assert "while_loop(" not in text, name
    assert re.search(r"jnp\.full\(.*jnp\.nan", (PACKAGE / "solvers/_iterate.py").read_text())


def test_ais_result_status():
    """AIS has no stopping test: its result is `successful` where log Z is finite (converged derived from it)."""
    res = gk.ais(_logistic(), jax.random.PRNGKey(0), num_chains=16, num_temperatures=10)
    assert np.isfinite(float(res.log_z)) and int(res.status) == gk.RESULTS.successful and bool(res.converged)
    assert res.message.startswith("successful")
