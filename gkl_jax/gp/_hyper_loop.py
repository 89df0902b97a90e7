"""The ML-II outer loop of `fit_hyperparameters` (Challis & Barber 2013, Section 6.1.3) as a solver of the one
loop `gkl_jax.solvers.iterate`: `HyperSolver` evaluates the inner method at one trial point per iteration and
accepts the trial or halves the step (`_advance`); `iterate` owns the loop, the step count, the history of log_z,
the `RESULTS` status and the progress callback. `run` is one run, compiled whole through `run_jit` or, for methods
that need concrete values, run by `iterate` as a host loop (the same iterations).

The line search is a state of this loop rather than a call of `gkl_jax._optim.backtrack` (with that search's
acceptance test and halving cap, `sufficient_increase` and `MAX_HALVINGS`): every trial is a whole inner fit, so
the loop has one call site of the objective (one trace) whether a step is accepted or halved.

Internal API: `Objective`, `HyperSolver`, `HyperProblem`, `OUTER_LBFGS`, `run` and `run_jit` are shared with
`gkl_jax.sklearn` (its one-program estimator fits) and are not part of the public interface."""

from typing import Any, Callable, ClassVar, Union

import equinox as eqx
import jax
import jax.flatten_util
import jax.numpy as jnp
import numpy as np
import optax

from .._optim import MAX_HALVINGS, max_abs, scale_by_lbfgs, sufficient_increase
from .._program import program
from .._start import initial_q as _initial_q
from .._warm import WarmPoint, WarmStart, fit_warm
from ..factors import Full
from ..solvers import Step, iterate
from ..solvers._site_precision_parts import initial_point as site_precision_start

OUTER_LBFGS = scale_by_lbfgs(memory_size=10)
"""The outer L-BFGS directions (optax state; ten curvature pairs)."""


_POSITIVE = ("variance", "scale", "dof")


def _likelihoods_valid(model):
    """Whether every likelihood parameter that must be positive is (the constructors' checks skip traced values)."""
    ok = jnp.array(True)
    for s in model.sites:
        for name in _POSITIVE:
            value = getattr(s.potential, name, None)
            if eqx.is_inexact_array(value):
                ok = ok & jnp.all(value > 0)
    return ok


def _run_method(build, fn, kwargs, use_q0, static, dyn, q0):
    model = build(eqx.combine(dyn, static))
    res = fn(model, q0=q0, **kwargs) if use_q0 else fn(model, **kwargs)
    return eqx.tree_at(lambda r: r.log_z, res, jnp.where(_likelihoods_valid(model), res.log_z, jnp.nan))


TRACE_COUNT = {"objective": 0}
"""Traces of the ML-II objective (calls, when it runs eagerly with jit=False); the tests read it."""


def _value_and_grad_eager(build, fn, kwargs, use_q0, static, dyn, q0, dynamic_kwargs, forward=False):
    """(-log_z, its gradient in dyn, the inner Result). `dynamic_kwargs` (arrays, not differentiated) join the
    static `kwargs` of the method."""
    TRACE_COUNT["objective"] += 1

    def objective(d):
        res = _run_method(build, fn, {**kwargs, **dynamic_kwargs}, use_q0, static, d, q0)
        return -res.log_z, res

    if forward:
        flat, unravel = jax.flatten_util.ravel_pytree(dyn)

        def with_aux(f):
            value, res = objective(unravel(f))
            return value, (value, res)

        jac, (value, res) = jax.jacfwd(with_aux, has_aux=True)(flat)
        return value, unravel(jac), res
    (value, res), grad = jax.value_and_grad(objective, has_aux=True)(dyn)
    return value, grad, res


# Jitted on its own so that the outer loop's shape query (`filter_eval_shape`) and its one call site share a trace.
_value_and_grad = program(_value_and_grad_eager)


class Objective(eqx.Module):
    """theta -> (-log_z, d(-log_z)/dtheta, the inner result) of `fn` on `build(theta)`, warm-started at q. Arrays
    in `build` (the data) are traced by the compiled loop, everything else is part of its key."""

    build: Any
    fn: Callable
    kwargs: dict
    use_q0: bool
    static: Any
    forward: bool
    jit: bool

    def start(self, dyn):
        """The first inner fit's warm start (None without warm starts): the method's own initial q, or for
        `fit_warm` its `WarmPoint` (the initial q's mean and W = Gamma there)."""
        if not self.use_q0:
            return None
        model = self.build(eqx.combine(dyn, self.static))
        q = _initial_q(model, self.kwargs.get("factor") or Full(), None)
        if self.fn is fit_warm:
            m, _, W = site_precision_start(model, q)
            return WarmPoint(m, W)
        return q

    def __call__(self, dyn, q, dynamic_kwargs):
        vg = _value_and_grad if self.jit else _value_and_grad_eager
        return vg(self.build, self.fn, self.kwargs, self.use_q0, self.static, dyn, q, dynamic_kwargs, self.forward)


class HyperProblem(eqx.Module):
    """One ML-II run as `HyperSolver` sees it.

    Attributes:
        objective: an `Objective` (or a module like it: `start`, `__call__`, `jit`).
        dyn: the starting values of the learned parameters (a pytree).
        dynamic_kwargs: array options of the inner method (its `tol`), not differentiated.
    """

    objective: Any
    dyn: Any
    dynamic_kwargs: dict


class HyperState(eqx.Module):
    """The carry of the ML-II loop (the step count, history and status are `iterate`'s)."""

    x: Any              # the accepted parameters, their -log_z, gradient and inner result
    f: jax.Array
    g: Any
    res: Any
    q: Any              # the next inner fit's warm start
    opt_state: Any
    direction: Any      # the line search's direction, its slope <g, d> and current step t
    slope: jax.Array
    t: jax.Array
    trial: Any          # the parameters the next iteration evaluates
    halvings: jax.Array
    inner_bad: jax.Array
    accepted: jax.Array     # the last trial was accepted
    converged: jax.Array    # the stopping test holds at x
    failed: jax.Array       # the last trial failed with nothing left to try (a line search or optimiser step)


class HyperSolver(eqx.Module):
    """The ML-II outer optimiser, a solver of `gkl_jax.solvers.iterate` (`init`, `step`, `terminate`, `point`,
    `postprocess`; `_advance` has the rules).

    Attributes:
        opt: the optax transformation giving the directions (`OUTER_LBFGS`) or the updates.
        linesearch: whether `opt`'s updates are directions of an Armijo line search (L-BFGS) or taken as they are.
        max_steps: accepted outer steps per run.
        gtol: the outer gradient tolerance (a float array, the loop's dtype).
        ftol: the relative change of log_z that settles the loop.
        adaptive: the inner tolerance follows the outer gradient (`_inner_tol`).
        max_step: the largest |change| of a parameter at a line search's first trial.
    """

    opt: optax.GradientTransformation
    linesearch: bool
    max_steps: int
    gtol: Union[jax.Array, np.ndarray]
    ftol: Union[jax.Array, np.ndarray]
    adaptive: bool = False
    max_step: Any = np.inf

    monotone: ClassVar[bool] = True
    start_in_loop: ClassVar[bool] = True     # the first iteration evaluates the start
    stop_on_nonfinite: ClassVar[bool] = True

    def init(self, problem: HyperProblem, tol, max_steps):
        """The state before the first evaluation, and a placeholder log_z (-inf).

        Args:
            problem: the `HyperProblem`; tol, max_steps: the loop's (unused: the settings are the solver's).

        Returns:
            (`HyperState`, -inf).
        """
        dyn, objective = problem.dyn, problem.objective
        q = objective.start(dyn)
        dtype = self.gtol.dtype
        g0 = jax.tree.map(jnp.zeros_like, dyn)
        res0 = None
        if objective.jit:
            shapes = eqx.filter_eval_shape(objective, dyn, q, problem.dynamic_kwargs)[2]
            res0 = jax.tree.map(lambda a: jnp.zeros(a.shape, a.dtype) if isinstance(a, jax.ShapeDtypeStruct) else a,
                                shapes)
        zero, int0, false = jnp.zeros((), dtype), jnp.zeros((), int), jnp.asarray(False)
        state = HyperState(x=dyn, f=jnp.asarray(jnp.inf, dtype), g=g0, res=res0, q=q,
                           opt_state=_strong(self.opt.init(dyn)), direction=g0, slope=zero, t=jnp.ones((), dtype),
                           trial=dyn, halvings=int0, inner_bad=int0, accepted=false, converged=false, failed=false)
        return state, jnp.asarray(-jnp.inf, dtype)

    def step(self, problem: HyperProblem, state: HyperState, tol):
        """Evaluate the objective at `state.trial` (the one call site) and accept or halve (`_advance`).

        Args:
            problem: the `HyperProblem`; state: the current `HyperState`; tol: unused.

        Returns:
            (`HyperState`, `gkl_jax.solvers.Step`): the value is log_z at the accepted point, the statistic the
            outer max |d log_z / d theta| there.
        """
        kwargs, first = problem.dynamic_kwargs, jnp.isinf(state.f)
        if self.adaptive:
            inner = _inner_tol(state, kwargs["tol"])
            new = _advance(state, *problem.objective(state.trial, state.q, {**kwargs, "tol": inner}), self,
                           exact=inner <= kwargs["tol"])
        else:
            new = _advance(state, *problem.objective(state.trial, state.q, kwargs), self)
        return new, Step(-new.f, new.accepted, new.accepted & ~first, _max_abs(new.g))

    def terminate(self, problem, state: HyperState, tol):
        """(the stopping test at the accepted point, a failed search or update)."""
        return state.converged, state.failed

    def point(self, state: HyperState):
        """The accepted parameters."""
        return state.x

    def postprocess(self, problem, state, point):
        """The learned parameters as they are (a pytree), no extras."""
        return point, None


def _select(p, new, old):
    if old is None:     # the eager loop's first result has no placeholder
        return new
    return jax.tree.map(lambda a, b: jnp.where(p, a, b), new, old)


def _max_abs(tree):
    """max |x| over every leaf of a pytree (0 for none)."""
    return jnp.max(jnp.stack([max_abs(leaf) for leaf in jax.tree.leaves(tree)] or [jnp.zeros(())]))


def _dot(a, b):
    return sum(jnp.vdot(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def _advance(s: HyperState, v, g, r, settings: HyperSolver, exact=True) -> HyperState:
    """One outer iteration after evaluating the objective at `s.trial`: (v, g, r) = (-log_z, gradient, result).

    The first evaluation (the starting point) is accepted if finite. After that, with `linesearch` (L-BFGS) a
    trial x + t d, first t = min(1, max_step / max|d|), is accepted on the Armijo condition
    v <= f + c t <g, d> (`gkl_jax._optim.sufficient_increase`, c = 1e-4) and otherwise the step is halved; a
    non-finite objective (a failed inner fit at an extreme hyperparameter) counts as a rejected step. Without it
    every finite optimiser update is taken. After an acceptance the next direction is d = -H g from the
    optimiser (steepest descent where that is not a descent direction). Stops when max |g| <= gtol, when an
    accepted step changes log_z by at most the resolution or the next direction predicts no larger change
    (|<g, d>| <= resolution), or when a rejected trial's predicted change t |<g, d>| was within it (line search
    only; resolution = max(ftol (1 + |log_z|), the inner fits' estimated gaps at both points)), after
    `max_steps` accepted steps (`iterate`'s limit), or when a line search has halved MAX_HALVINGS times (`failed`).
    The stopping rules apply only to an evaluation whose inner fit ran at the given tolerance (`exact`; see
    `_inner_tol`)."""
    first = jnp.isinf(s.f)  # f starts at +inf; the starting point is accepted only if finite
    finite = jnp.isfinite(v)
    # the Armijo test of the minimised -log_z (`gkl_jax._optim.sufficient_increase` of log_z)
    sufficient = sufficient_increase(-v, -s.f, s.t, -s.slope) if settings.linesearch else True
    accept = finite & (first | sufficient)
    step = accept & ~first
    pick = lambda new, old: _select(accept, new, old)
    x, f, g, res = pick(s.trial, s.x), jnp.where(accept, v, s.f), pick(g, s.g), pick(r, s.res)
    q = None if s.q is None else pick(r.point if isinstance(r, WarmStart) else r.q, s.q)
    inner_bad = s.inner_bad + (accept & ~jnp.asarray(r.converged)).astype(s.inner_bad.dtype)

    updates, opt_state = settings.opt.update(g, s.opt_state, x)
    opt_state = pick(opt_state, s.opt_state)
    if settings.linesearch:
        d = jax.tree.map(jnp.negative, updates)
        slope = _dot(g, d)
        descent = slope < 0
        d = _select(descent, d, jax.tree.map(jnp.negative, g))
        slope = jnp.where(descent, slope, -_dot(g, g))
        direction, slope = pick(d, s.direction), jnp.where(accept, slope, s.slope)
        first_t = jnp.minimum(1.0, settings.max_step / jnp.maximum(_max_abs(direction), jnp.finfo(s.t.dtype).tiny))
        t = jnp.where(accept, first_t, 0.5 * s.t).astype(s.t.dtype)
        trial = jax.tree.map(lambda a, b: a + t * b, x, direction)
        halvings = jnp.where(accept, 0, s.halvings + 1)
    else:
        direction, slope, t, halvings = s.direction, s.slope, s.t, s.halvings
        trial = optax.apply_updates(x, updates)

    max_grad = _max_abs(g)
    if settings.linesearch:
        # an accepted step changed log_z by at most the resolution, or the next step cannot change it by more:
        # its predicted change <g, d> is below that (sonar split 8: 26 halvings at the objective's noise floor);
        # or a rejected trial's predicted change t <g, d> was (a line search cannot resolve it). The resolution
        # is ftol (1 + |log_z|) or, if larger, the inner fits' own accuracy (`_gap`) at both points.
        resolution = jnp.maximum(settings.ftol * (1 + jnp.abs(v)), _gap(r) + _gap(s.res))
        settled = (step & ((jnp.abs(s.f - v) <= resolution) | (-slope <= resolution))
                   | (~accept & ~first & (-s.t * s.slope <= resolution)))
        failed = ~accept & ~settled & (first | (s.halvings + 1 >= MAX_HALVINGS))
    else:
        settled, failed = jnp.asarray(False), ~accept
    converged = exact & ((accept & (max_grad <= settings.gtol)) | settled)
    return HyperState(x, f, g, res, q, opt_state, direction, slope, t, trial, halvings, inner_bad,
                      jnp.asarray(accept), jnp.asarray(converged), jnp.asarray(failed))


def _gap(r):
    """How far below its optimum an evaluation's log_z may lie: the estimated gap of a `fit_warm` inner fit
    (`WarmStart.gap`), 0 for other methods (and for the eager loop's missing first result)."""
    return r.gap if isinstance(r, WarmStart) else 0.0


def run(objective: Objective, solver: HyperSolver, dyn, dynamic_kwargs, progress=None):
    """One ML-II run from `dyn`: `gkl_jax.solvers.iterate` over `solver`, as one `lax.while_loop` when
    `objective.jit` (this function is then called through `run_jit`, so the whole run is one compiled program with
    one call site of the objective), else the same iterations as a host loop (methods that must see concrete model
    values).

    Args:
        objective: an `Objective` (or a module like it).
        solver: the `HyperSolver` (its settings).
        dyn: the starting values of the learned parameters.
        dynamic_kwargs: array options of the inner method.
        progress: None, or a callable receiving a `gkl_jax.solvers.ProgressInfo` after each accepted step (log_z
            as `bound`, the outer max |d log_z / d theta| as `gradient`) and at the end (static).

    Returns:
        (`gkl_jax.solvers.Solution`: x the learned `dyn`, value the log_z there, history, num_steps, status;
        the final `HyperState`: the inner result `res` there and the count of unconverged inner fits).
    """
    problem = HyperProblem(objective, dyn, dynamic_kwargs)
    return iterate(solver, problem, solver.gtol, solver.max_steps, progress=progress, host=not objective.jit)


run_jit = program(run)

INNER_TOL_SCALE, INNER_TOL_MAX = 1e-3, 1e-2
"""The inner tolerance of a G-KL ML-II evaluation: clip(INNER_TOL_SCALE max|g|, tol, max(tol, INNER_TOL_MAX))."""


def _inner_tol(s: HyperState, tol):
    """The inner fits' tolerance for the next evaluation: loose while the outer gradient g at the current point
    is large, `tol` (gtol / 10) from max|g| <= tol / INNER_TOL_SCALE = 100 gtol on; the first evaluation at the
    loosest. An inexact inner optimum perturbs the envelope gradient at first order, so the outer direction
    needs the inner residual small only relative to g (on sonar the gradient moved ~50x the inner residual).
    Sonar's ML-II, 10 splits: inner steps 383 -> 277 (outer evaluations 105 -> 108), median time 27.9 -> 23.3
    ms, the learned log Z equal to 1e-6 and the mean test log-likelihood to 1e-5. The stopping tests only count
    evaluations at `tol` itself."""
    cap = jnp.maximum(tol, INNER_TOL_MAX)
    return jnp.where(jnp.isinf(s.f), cap, jnp.clip(INNER_TOL_SCALE * _max_abs(s.g), tol, cap)).astype(tol.dtype)


def _strong(tree):
    """Drop weak types from an optimiser state, so that the loop carry keeps one type."""
    return jax.tree.map(lambda x: jnp.array(x, dtype=jnp.result_type(x)) if eqx.is_array_like(x) else x, tree)
