"""ML-II on the one loop `gkl_jax.solvers.iterate` (gp's compiled run and multiclass's host run): the `RESULTS`
status and message on `HyperResult`, `progress=` (printed lines, a callable's values, bad values, a raising
callable), one trace of the objective per shape, and the learned optimum of the loops they replaced."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import gkl_jax as gk
from gkl_jax.gp import _hyper_loop

jax.config.update("jax_enable_x64", True)

# The learned (log_z, variance, lengthscale, steps) of the loops this driver replaced (commit 4425525: gp's own
# `lax.while_loop` and multiclass's host loop), on the cases below.
GP_BEFORE = (-7.65201199209741, 135.86023976241907, 0.8517719807827974, 8)
MULTICLASS_BEFORE = (-21.280990519082977, 6.903248959535236, 2.0576916710064252, 8)


def _gp_case(n=30):
    """(build, start) of GP classification with a logistic likelihood on n points."""
    rng = np.random.default_rng(0)
    X = np.sort(rng.uniform(-3, 3, n))[:, None]
    y = np.where(np.sin(2 * X[:, 0]) + 0.3 * rng.standard_normal(n) > 0, 1.0, -1.0)
    build = lambda k: gk.gp.model(k, jnp.asarray(X), gk.potentials.Logistic(jnp.asarray(y)))
    return build, gk.kernels.SquaredExponential(1.0, 1.0)


def _multiclass_case(n=24, C=3):
    rng = np.random.default_rng(1)
    X = rng.standard_normal((n, 2))
    y = np.argmax(X @ rng.standard_normal((2, C)) + 0.5 * rng.standard_normal((n, C)), axis=1)
    return X, y


BUILD, START = _gp_case()


class Recorder:
    """A progress callable that keeps what it receives."""

    def __init__(self):
        self.infos = []

    def __call__(self, info):
        self.infos.append(info)


def test_gp_status_message_and_the_optimum_of_the_replaced_loop():
    """A converged run is `successful` (converged derived from it) and learns the optimum of the loop it replaced
    to round-off, in as many steps; a run cut at max_steps is `max_steps_reached`, with that message in the warning,
    and its history holds the start and each accepted step."""
    res = gk.gp.fit_hyperparameters(BUILD, START)
    assert res.status == gk.RESULTS.successful and res.converged
    assert res.message == gk.RESULTS.message(gk.RESULTS.successful)
    np.testing.assert_allclose([float(res.log_z), float(res.params.variance), float(res.params.lengthscale)],
                               GP_BEFORE[:3], rtol=1e-8)
    assert res.num_steps == GP_BEFORE[3] and len(res.history) == res.num_steps + 1
    assert float(res.history[-1]) == pytest.approx(float(res.log_z), rel=1e-10)
    with pytest.warns(UserWarning, match="max_steps_reached"):
        short = gk.gp.fit_hyperparameters(BUILD, START, max_steps=2)
    assert short.status == gk.RESULTS.max_steps_reached and not short.converged
    assert short.message.startswith("max_steps_reached") and short.num_steps == 2
    np.testing.assert_allclose(short.history, res.history[:3], rtol=1e-10)   # the same first steps
    assert "status=max_steps_reached" in repr(short)


def test_gp_progress_callable_receives_each_accepted_step_and_the_end():
    """A progress callable gets one `ProgressInfo` per accepted outer step (log_z as `bound`, the step number,
    the outer gradient) and a last one with done=True and the run's status; the values are the history's."""
    rec = Recorder()
    res = gk.gp.fit_hyperparameters(BUILD, START, progress=rec)
    jax.effects_barrier()
    steps, last = rec.infos[:-1], rec.infos[-1]
    assert [i.step for i in steps] == list(range(1, res.num_steps + 1))
    np.testing.assert_allclose([i.bound for i in steps], res.history[1:], rtol=1e-12)
    assert not any(i.done for i in steps) and all(i.solver == "HyperSolver" for i in rec.infos)
    assert last.done and last.status == res.status == gk.RESULTS.successful and last.step == res.num_steps
    assert last.bound == pytest.approx(float(res.log_z), rel=1e-12)
    assert np.isfinite(last.gradient) and last.gradient < steps[0].gradient


def test_gp_progress_true_prints_lines(capsys):
    """progress=True prints the step, log_z and gradient on stderr, and the status on the last line."""
    gk.gp.fit_hyperparameters(BUILD, START, progress=True)
    jax.effects_barrier()
    err = capsys.readouterr().err.strip().splitlines()
    assert err and all(line.startswith("gkl_jax.gp.fit_hyperparameters: HyperSolver step") for line in err)
    assert "bound -7.65201199" in err[-1] and err[-1].endswith("(successful)")


def test_bad_progress_values_are_refused_naming_progress():
    """An unknown string, a number or another non-callable is a ValueError naming `progress` (gp and
    multiclass), before any fit."""
    X, y = _multiclass_case()
    for bad in ("yes", 3, [print]):
        with pytest.raises(ValueError, match="progress"):
            gk.gp.fit_hyperparameters(BUILD, START, progress=bad)
        with pytest.raises(ValueError, match="progress"):
            gk.multiclass.fit_hyperparameters(gk.kernels.SquaredExponential(1.0, 1.0), X, y, progress=bad)


class Stop(Exception):
    pass


def _raise_at(step):
    def callback(info):
        if info.step >= step:
            raise Stop(f"stopped at {info.step}")
    return callback


def test_a_raising_callback_stops_the_run_with_its_own_error():
    """A progress callable that raises ends the run with its exception, compiled (gp) or on the host
    (multiclass), and a later run of the same program is unaffected."""
    with pytest.raises(Stop, match="stopped at 2"):
        gk.gp.fit_hyperparameters(BUILD, START, progress=_raise_at(2))
    X, y = _multiclass_case()
    with pytest.raises(Stop, match="stopped at 1"):
        gk.multiclass.fit_hyperparameters(gk.kernels.SquaredExponential(1.0, 1.0), X, y, progress=_raise_at(1))
    assert gk.gp.fit_hyperparameters(BUILD, START).converged


def test_the_objective_is_traced_once_per_shape_with_or_without_progress():
    """The compiled run holds one copy of the objective: a new shape traces it once, the same shape again not at
    all, and neither does a run with a progress callable (the outer loop is compiled again for a new callable, the
    objective's trace is reused); progress changes no value."""
    build, start = _gp_case(17)
    traces = _hyper_loop.TRACE_COUNT["objective"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        first = gk.gp.fit_hyperparameters(build, start, max_steps=3)
        assert _hyper_loop.TRACE_COUNT["objective"] == traces + 1
        gk.gp.fit_hyperparameters(build, start, max_steps=3)
        assert _hyper_loop.TRACE_COUNT["objective"] == traces + 1
        rec = Recorder()
        with_progress = gk.gp.fit_hyperparameters(build, start, max_steps=3, progress=rec)
        gk.gp.fit_hyperparameters(build, start, max_steps=3, progress=rec)
    assert _hyper_loop.TRACE_COUNT["objective"] == traces + 1
    assert len(rec.infos) == 2 * (3 + 1)
    np.testing.assert_array_equal(first.history, with_progress.history)   # progress changes no value


def test_multiclass_status_history_progress_and_the_optimum_of_the_replaced_loop():
    """Multiclass ML-II follows the same protocol (log_z, converged from status, num_steps, history, status,
    message) and learns the kernel of the host loop it replaced to round-off; a progress callable gets each outer
    step's bound (the history) and the end; a run cut at max_steps is `max_steps_reached`."""
    X, y = _multiclass_case()
    kernel = gk.kernels.SquaredExponential(1.0, 1.0)
    rec = Recorder()
    res = gk.multiclass.fit_hyperparameters(kernel, X, y, progress=rec)
    assert int(res.status) == gk.RESULTS.successful and bool(res.converged)
    assert res.message.startswith("successful")
    np.testing.assert_allclose([float(res.log_z), float(res.kernel.variance), float(res.kernel.lengthscale)],
                               MULTICLASS_BEFORE[:3], rtol=1e-8)
    k = int(res.num_steps)
    assert k == MULTICLASS_BEFORE[3] and np.all(np.isnan(np.asarray(res.history)[k + 1:]))
    assert float(res.history[k]) == float(res.log_z)
    steps, last = rec.infos[:-1], rec.infos[-1]
    assert [i.step for i in steps] == list(range(1, k + 1)) and all(i.solver == "HostLBFGS" for i in rec.infos)
    np.testing.assert_allclose([i.bound for i in steps[:-1]], np.asarray(res.history)[1:k], rtol=1e-12)
    assert last.done and last.status == gk.RESULTS.successful
    with pytest.warns(UserWarning, match="max_steps_reached"):
        short = gk.multiclass.fit_hyperparameters(kernel, X, y, max_steps=2)
    assert int(short.status) == gk.RESULTS.max_steps_reached and not bool(short.converged)
    assert int(short.num_steps) == 2 and short.history.shape == (3,)
    np.testing.assert_allclose(np.asarray(short.history)[:2], np.asarray(res.history)[:2], rtol=1e-6)
