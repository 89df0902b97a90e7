"""The one solver loop (`gkl_jax.solvers.iterate`): a status for each stop reason, the history and the best point
seen, one compilation per shape, progress through a host callback, and readable reprs."""

import io
import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import gkl_jax as gk
from gkl_jax import _fit
from gkl_jax._progress import FitProgress
from gkl_jax.solvers import _quasi_newton

jax.config.update("jax_enable_x64", True)

H = np.array([[1.0, 0.5], [-0.3, 1.0], [0.2, -1.0], [0.7, 0.1]])
Y = np.array([1.0, -1.0, 1.0, -1.0])


def _model(y=Y):
    return gk.Model(gk.priors.Isotropic(2, 1.0), gk.Sites(H, gk.potentials.Logistic(y)))


def test_status_successful_and_max_steps_reached():
    """A converged fit is `successful` (converged derived from it); one L-BFGS step is `max_steps_reached`, with
    the status's message in the warning."""
    res = gk.fit(_model(), solver=gk.solvers.LBFGS())
    assert int(res.status) == gk.RESULTS.successful and bool(res.converged)
    assert res.message == "successful: the stopping test was met"
    with pytest.warns(UserWarning, match="max_steps_reached"):
        short = gk.fit(_model(), solver=gk.solvers.LBFGS(), max_steps=1)
    assert int(short.status) == gk.RESULTS.max_steps_reached and not bool(short.converged)
    assert int(short.num_steps) == 1 and short.message.startswith("max_steps_reached")


@jax.custom_jvp
def _wrong_way(x):
    return -jnp.sum(x**2)


@_wrong_way.defjvp
def _wrong_way_jvp(primals, tangents):
    (x,), (t,) = primals, tangents
    return _wrong_way(x), 2 * x @ t    # the negated derivative: every "ascent" direction descends


def test_status_stalled_and_nonfinite():
    """A gradient that points downhill leaves the line search no ascent: L-BFGS and Newton stall (`stalled`,
    after LINESEARCH_MAX_STALLS failed searches for L-BFGS, one for Newton); a start where f is NaN is
    `nonfinite` after one evaluation."""
    x0 = jnp.array([1.0, -2.0])
    lbfgs = gk.solvers.iterate(gk.solvers.LBFGS(), _problem(_wrong_way, x0), jnp.asarray(1e-8), 100)[0]
    assert int(lbfgs.status) == gk.RESULTS.stalled and int(lbfgs.num_steps) == 0
    np.testing.assert_array_equal(lbfgs.x, x0)
    newton = gk.solvers.iterate(gk.solvers.Newton(), _problem(_wrong_way, x0), jnp.asarray(1e-8), 100)[0]
    assert int(newton.status) == gk.RESULTS.stalled
    nan = gk.solvers.iterate(gk.solvers.LBFGS(), _problem(lambda x: jnp.sum(jnp.log(x)), -x0), jnp.asarray(1e-8),
                             100)[0]
    assert int(nan.status) == gk.RESULTS.nonfinite and int(nan.num_steps) == 0


def _problem(f, x0, progress=None):
    from gkl_jax.solvers._base import ObjectiveProblem

    return ObjectiveProblem(f, x0, 1.0, progress=progress)


def test_history_and_best_point():
    """history[k] is the objective after step k (NaN past num_steps, ascending for a monotone solver, its last
    entry the returned value); a non-monotone optax solver that diverges returns the best point it saw: with
    gradient descent at step 1.1 on -|x|^2 every step moves further out, so the best point is the start."""
    f = lambda x: -jnp.sum((x - jnp.array([1.0, 2.0])) ** 2) - 0.1 * jnp.sum(x**4)
    x, k, ok, hist, value = _quasi_newton.lbfgs(f, jnp.zeros(2), tol=jnp.asarray(1e-10), max_steps=50)
    k = int(k)
    assert bool(ok) and 0 < k < 50
    assert np.all(np.isnan(hist[k + 1:])) and not np.any(np.isnan(hist[: k + 1]))
    assert np.all(np.diff(hist[: k + 1]) >= -1e-12) and float(hist[k]) == float(value) == float(f(x))
    quadratic = lambda x: -jnp.sum(x**2)
    x0 = jnp.array([0.5, -0.25])
    x, k, ok, hist = _quasi_newton.optax_solver(quadratic, x0, optax.sgd(1.1), tol=jnp.asarray(1e-8), max_steps=5)
    assert int(k) == 5 and not bool(ok)
    np.testing.assert_allclose(hist, quadratic(x0) * 1.44 ** np.arange(6), rtol=1e-12)   # |1 - 2.2|^2 per step
    np.testing.assert_array_equal(x, x0)


def test_fit_compiles_once_per_shape_with_or_without_a_callback():
    """Two fits of models of one shape trace `fit` once; so do two with the same progress callable (on an already
    compiled shape, turning it on traces once more)."""
    calls = []
    callback = calls.append
    gk.fit(_model(), solver=gk.solvers.Newton())
    before = _fit.TRACE_COUNT["fit"]
    gk.fit(_model(-Y), solver=gk.solvers.Newton())
    assert _fit.TRACE_COUNT["fit"] == before
    gk.fit(_model(), solver=gk.solvers.Newton(), progress=callback)
    gk.fit(_model(-Y), solver=gk.solvers.Newton(), progress=callback)
    assert _fit.TRACE_COUNT["fit"] == before + 1 and calls


def test_progress_callback_sees_increasing_steps_and_the_final_status():
    """The callback gets each step's count, bound and gradient statistic, counts rising by one, then one last call
    with done=True and the status; its bounds are the history's; under jit too."""
    infos = []
    res = gk.fit(_model(), solver=gk.solvers.LBFGS(), progress=infos.append)
    steps = [i.step for i in infos if not i.done]
    assert steps == list(range(1, int(res.num_steps) + 1))
    last = infos[-1]
    assert last.done and last.status == gk.RESULTS.successful and last.solver == "LBFGS"
    np.testing.assert_allclose([i.bound for i in infos[:-1]], res.history[1: int(res.num_steps) + 1], rtol=1e-12)
    assert infos[-2].gradient >= 0 and np.isfinite(infos[-2].gradient)
    seen = []
    jax.jit(lambda m: gk.fit(m, solver=gk.solvers.LBFGS(), progress=seen.append).log_z)(_model())
    assert [i.step for i in seen] == [i.step for i in infos]


def test_progress_printer_and_off(capsys):
    """progress=True prints the solver's steps on stderr (the last with its status); False prints nothing."""
    gk.fit(_model(), solver=gk.solvers.Newton(), progress=False)
    assert capsys.readouterr().err == ""
    gk.fit(_model(), solver=gk.solvers.Newton(), progress=True)
    err = capsys.readouterr().err
    assert re.search(r"gkl_jax\.fit: Newton step \d+  bound -\d\.\d+  gradient .*\(successful\)", err)
    stream = io.StringIO()
    printer = FitProgress("x", stream)
    gk.fit(_model(), solver=gk.solvers.Newton(), progress=printer)
    assert stream.getvalue().splitlines()[-1].endswith("(successful)")


def test_progress_bad_input_and_a_callback_that_raises():
    """An unknown progress value or a non-callable is a ValueError naming `progress`; a callback that raises stops
    the fit at its first call with its own exception."""
    for bad in ("yes", 3, 1.0):
        with pytest.raises(ValueError, match="progress"):
            gk.fit(_model(), progress=bad)
    calls = []

    def stop(info):
        calls.append(info.step)
        raise RuntimeError("stop here")

    with pytest.raises(RuntimeError, match="stop here"):
        gk.fit(_model(), solver=gk.solvers.LBFGS(), progress=stop)
    assert calls == [1]


def test_reprs_show_values():
    """Result, Gaussian and kernels print values (log Z, status, steps, the learned hyperparameters), not `f64[]`;
    under tracing they fall back to shapes."""
    res = gk.fit(_model())
    text = repr(res)
    assert f"log_z={float(res.log_z):.10g}" in text and "status=successful" in text
    assert f"num_steps={int(res.num_steps)}" in text and "f64[]" not in text
    assert "Gaussian(dim=2, factor=Full, mean=[" in text and "sd=[" in text
    kernel = gk.kernels.SquaredExponential(2.5, [1.0, 3.0]) + gk.kernels.White(0.1)
    assert repr(kernel) == "Sum(k1=SquaredExponential(variance=2.5, lengthscale=[1, 3]), k2=White(variance=0.1))"
    seen = []
    jax.jit(lambda m: seen.append(repr(gk.fit(m))) or 0.0)(_model())
    assert "log_z=f64[]" in seen[0] and "status=?" in seen[0]


def test_baselines_report_a_status():
    """The baselines' results carry a `RESULTS` code too: Laplace and EP converge (`successful`); held to one
    iteration they report `max_steps_reached` (Laplace runs in `iterate`: its history is log p after each step)."""
    lap = gk.laplace(_model())
    assert int(lap.status) == gk.RESULTS.successful and bool(lap.converged)
    with pytest.warns(UserWarning):
        one = gk.laplace(_model(), max_steps=1)
    assert int(one.status) == gk.RESULTS.max_steps_reached and int(one.num_steps) == 1
    np.testing.assert_allclose(one.history, lap.history[:2], rtol=1e-14)
    assert int(gk.ep(_model()).status) == gk.RESULTS.successful
    with pytest.warns(UserWarning):
        short = gk.ep(_model(), max_steps=1)
    assert int(short.status) == gk.RESULTS.max_steps_reached and not bool(short.converged)
