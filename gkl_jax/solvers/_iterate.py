"""The one loop every solver of the G-KL bound runs in: `iterate` owns the `lax.while_loop`, the step count, the
history, the best point seen, the status and the progress callback; a solver supplies `init`, `step`,
`terminate` and `postprocess` (the split of optimistix's `iterative_solve`, Kidger 2023).

A loop iteration of a solver need not be an outer step: L-BFGS and Newton-CG make one trial of a line search per
iteration (so that the compiled program holds one copy of the objective), and only an accepted trial concludes a
step. `step` says so through its `Step`: `advance` (a step concluded: the count goes up) and `record` (the value
at the current point is new: the history is written). The stopping rules shared by every solver (the step limit,
a non-finite objective) are the driver's; the solver's `terminate` adds its own (its stopping test, a stall).
"""

import functools
from typing import Any, NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from .._status import RESULTS, status


class Solution(eqx.Module):
    """What a solver returns.

    Attributes:
        x: (P,) the optimum found, as the flat vector of the solver leaves of q (`Problem.to_q` maps it back).
        num_steps: int32 scalar, outer steps taken.
        converged: bool scalar, whether the stopping test was met.
        history: (max_steps + 1,) the objective after each step (NaN past `num_steps`).
        status: int32 scalar, a `RESULTS` code.
        extras: solver-specific quantities at the optimum (the site-precision solver's (W, parts)), or None.
        value: the objective at x, where the solver has it (`fit` then takes the bound from it instead of
            evaluating it once more), or None.
    """

    x: jax.Array
    num_steps: jax.Array
    converged: jax.Array
    history: jax.Array
    status: jax.Array
    extras: Any = None
    value: Any = None


class Step(eqx.Module):
    """What one iteration of a solver reports to `iterate`.

    Attributes:
        value: the objective at the current (accepted) point after the iteration (scalar).
        record: bool scalar, whether `value` is new (history[num_steps] is written).
        advance: bool scalar, whether an outer step concluded (num_steps goes up by one, before the write).
        statistic: the stopping statistic at the current point (scalar; shown by the progress callback and
            otherwise unused, so compiled away when progress is off).
    """

    value: jax.Array
    record: jax.Array
    advance: jax.Array
    statistic: jax.Array


class ProgressInfo(NamedTuple):
    """What a progress callback receives, after each step and once at the end.

    Attributes:
        step: int, the steps taken so far.
        bound: float, the objective at the current point (for a G-KL fit the bound B of Challis & Barber 2013,
            eq. 7).
        gradient: float, the solver's stopping statistic there (for the G-KL solvers the scale-aware gradient
            max_i |dB/dx_i| max(|x_i|, sigma0), which the fit drives below tol).
        solver: str, the solver's class name.
        done: bool, True for the last call of a run (after the loop), False before.
        status: int, the `RESULTS` code where `done`, else -1.
    """

    step: int
    bound: float
    gradient: float
    solver: str
    done: bool
    status: int


class _Carry(eqx.Module):
    state: Any
    num_steps: jax.Array
    iteration: jax.Array
    history: jax.Array
    value: jax.Array
    statistic: jax.Array
    best_value: Any
    best_point: Any


def _write(history, k, value, record):
    """The history with entry k set to `value` where `record`: in place in a host (NumPy) buffer, which only the
    host loop's carry holds."""
    if isinstance(history, np.ndarray):
        if bool(record):
            history[int(k)] = value
        return history
    if record is True:
        return history.at[k].set(value)
    return history.at[k].set(jnp.where(record, value.astype(history.dtype), history[k]))


def new_history(max_steps, value0):
    """A history buffer: `value0` first, NaN after (the one place such a buffer is built; `iterate`'s own, a
    chain's or a refinement's across its solves, a loop's second series).

    Args:
        max_steps: the step limit (int); the buffer holds max_steps + 1 values.
        value0: the objective at the start (scalar; its dtype is the buffer's).

    Returns:
        (max_steps + 1,) float array.
    """
    value0 = jnp.asarray(value0)
    return jnp.full((max_steps + 1,), jnp.nan, value0.dtype).at[0].set(value0)


def append_history(history, part, start):
    """`history` continued by a later run's history `part` (whose part[0], that run's start, is history[start]):
    part[j] is written at start + j for j >= 1, inside `history` and where part[j] is not NaN (past that run's
    steps).

    Args:
        history: (M,) the history so far, filled up to index `start`.
        part: (P,) the next run's history.
        start: int scalar, the steps taken before that run.

    Returns:
        (M,) float array.
    """
    j = jnp.arange(history.shape[0]) - start
    source = part[jnp.clip(j, 0, part.shape[0] - 1)]
    take = (j >= 1) & (j < part.shape[0]) & ~jnp.isnan(source)
    return jnp.where(take, source, history)


def _report(callback, name, step, value, statistic, done, code):
    callback(ProgressInfo(int(step), float(value), float(statistic), name, bool(done), int(code)))


def iterate(solver, problem, tol, max_steps, *, init=None, progress=None, postprocess=True, host=False):
    """Run `solver` on `problem` in one `lax.while_loop` to its stopping test, `max_steps` steps, a non-finite
    objective or the solver's own stop.

    The solver's protocol (`AbstractSolver`):

    - `init(problem, tol, max_steps) -> (state, value)`: the loop's initial carry and the objective at the start
      (where `start_in_loop`, a placeholder of its dtype: the first iteration evaluates the start, and the loop
      then runs at least once).
    - `step(problem, state, tol) -> (state, Step)`: one iteration.
    - `terminate(problem, state, tol) -> (converged, stop)`: the stopping test at the current point, and the
      solver's own reason to stop short of it (a stalled line search).
    - `point(state)`: the current point (a pytree); `postprocess(problem, state, point) -> (x, extras)`: the flat
      x of `Solution` and the solver's quantities at the optimum.
    - `monotone` (class attribute): False for a solver whose iterates may lose ground (optax's); the driver then
      keeps the best point seen and returns it where the stopping test was not met.
    - `stop_on_nonfinite` (class attribute, default True): False for an iteration that goes on through a
      non-finite objective (EP, whose skipped sites may leave log Z_EP infinite for a while).

    Args:
        solver: an `AbstractSolver`.
        problem: what the solver's methods take (a `Problem`, or any object with the attributes they read).
        tol: the tolerance (scalar array).
        max_steps: the step limit (int).
        init: a (state, value) pair to start from instead of `solver.init` (a warm start), or None.
        progress: None, or a callable receiving a `ProgressInfo` after each step and once at the end, through
            `jax.debug.callback` (so also under `jit`). Static: a different callable compiles the program again;
            None compiles no callback.
        postprocess: False to skip `solver.postprocess` (x is then the point itself, extras None: for callers that
            read the final state instead).
        host: run the same iterations as a Python loop, outside any trace (for a step that must see concrete
            values: ML-II of the baselines, `gkl_jax.gp.fit_hyperparameters(jit=False)`).

    Returns:
        (`Solution`, state): the solution (with `value`, the objective at x) and the solver's final state.
    """
    state, value0 = solver.init(problem, tol, max_steps) if init is None else init
    forced = solver.start_in_loop
    xp = np if host else jnp    # on the host the driver's own bookkeeping is NumPy: no dispatch per step
    value0 = xp.asarray(value0)
    dtype = value0.dtype
    history = _write(xp.full((max_steps + 1,), xp.nan, dtype), 0, value0, True)
    keep_best = not solver.monotone
    best_point = solver.point(state) if keep_best else None
    best_value = value0 if keep_best else None
    zero = xp.zeros((), xp.int32)
    name = type(solver).__name__

    finite_only = getattr(solver, "stop_on_nonfinite", True)

    def done(c):
        converged, stop = solver.terminate(problem, c.state, tol)
        stop = stop | (c.num_steps >= max_steps)
        return converged | (stop | ~xp.isfinite(c.value) if finite_only else stop)

    def cond(c):
        return (c.iteration == 0) | ~done(c) if forced else ~done(c)

    def body(c):
        state, info = solver.step(problem, c.state, tol)
        k = c.num_steps + xp.asarray(info.advance).astype(xp.int32)
        history = _write(c.history, k, info.value, info.record)
        value = xp.where(info.record, info.value, c.value).astype(dtype)
        best_value, best_point = c.best_value, c.best_point
        if keep_best:
            better = value > best_value
            best_value = jnp.where(better, value, best_value)
            best_point = jax.tree.map(lambda a, b: jnp.where(better, a, b), solver.point(state), best_point)
        if progress is not None and host:
            if bool(info.advance):
                _report(progress, name, k, value, info.statistic, False, -1)
        elif progress is not None:
            lax.cond(info.advance, lambda: jax.debug.callback(_report, progress, name, k, value, info.statistic,
                                                              False, -1), lambda: None)
        statistic = None if progress is None else xp.asarray(info.statistic).astype(dtype)
        return _Carry(state, k, c.iteration + 1, history, value, statistic, best_value, best_point)

    statistic0 = None if progress is None else xp.asarray(xp.nan, dtype)     # carried only to report it
    carry = _Carry(state, zero, zero, history, value0, statistic0, best_value, best_point)
    if host:
        while bool(cond(carry)):
            carry = body(carry)
    else:
        carry = lax.while_loop(cond, body, carry)
    converged, _ = solver.terminate(problem, carry.state, tol)
    point, value = solver.point(carry.state), carry.value
    if keep_best:
        point = jax.tree.map(lambda a, b: jnp.where(converged, a, b), point, carry.best_point)
        value = jnp.where(converged, value, carry.best_value)
    code = status(converged, value, carry.num_steps, max_steps)
    if progress is not None:
        report = _report if host else functools.partial(jax.debug.callback, _report)
        report(progress, name, carry.num_steps, value, carry.statistic, True, code)
    x, extras = solver.postprocess(problem, carry.state, point) if postprocess else (point, None)
    return Solution(x, carry.num_steps, code == RESULTS.successful, carry.history, code, extras, value), carry.state
