"""The outer loop of the multiclass ML-II (`fit_hyperparameters`): `HostLBFGS`, L-BFGS ascent on the host whose
line-search trials are whole compiled inner fits, run by the one loop `gkl_jax.solvers.iterate` as its host loop
(`host=True`: the loop owns the step count, the history of the bound, the `RESULTS` status and the progress
callback, as for `gkl_jax.gp.fit_hyperparameters`).

Why a host loop and not gp's compiled `HyperSolver` step: a compiled outer loop around the multiclass inner fit
(`_hyper._solve`, its own `lax.while_loop` of (b, S) rounds) was slow to compile and held the inner fit twice (the
cold first fit and the line-search fits: design-decisions page), and the learned kernels of the paper's tables
come from this L-BFGS (its halving cap, settling rule and gain-following inner tolerance), which gp's step does not
reproduce to round-off.

Internal API of `gkl_jax.multiclass` (not part of the public interface).
"""

import dataclasses
from typing import Any, Callable, ClassVar

import equinox as eqx
import jax
import numpy as np

from .._optim import backtrack_host, lbfgs_direction, sufficient_increase
from .._validate import device_array
from ..solvers import Step

ADAPTIVE_INNER_TOL = True
LOOSEST_INNER_TOL = 3e-3
"""The loosest tolerance of a line-search inner fit (relative rise per sweep, `fit_core`): 1e-5 took 10-25% more
sweeps on iris, wine and glass ML-II for learned bounds equal to 1e-3 nats (design-decisions page)."""


def _flatten(tree):
    leaves = jax.tree.leaves(tree)
    return np.concatenate([np.ravel(np.asarray(leaf, np.float64)) for leaf in leaves])


def _unflatten(like, x):
    leaves, treedef = jax.tree.flatten(like)
    out, i = [], 0
    for leaf in leaves:
        size = int(np.size(leaf))
        out.append(device_array(x[i:i + size].reshape(np.shape(leaf)), leaf.dtype))
        i += size
    return jax.tree.unflatten(treedef, out)


class Learning(eqx.Module):
    """One learning run as `HostLBFGS` sees it: `solve(params, warm, cold, tol)` -> (value, flat gradient, inner
    state, aux), and the parameter pytree that the flat vectors unflatten into."""

    solve: Callable
    params0: Any

    def params_of(self, x):
        """The parameter pytree of the flat vector x."""
        return _unflatten(self.params0, x)


class HostState(eqx.Module):
    """The outer loop's carry (host values; the step count, history and status are `iterate`'s)."""

    x: np.ndarray
    f: float
    g: np.ndarray
    st: Any             # the inner fit's state at x (its warm start) and aux = (converged, stationarity, T)
    aux: Any
    pairs: tuple        # the L-BFGS curvature pairs of -f
    tol: float          # the next inner fits' tolerance (it follows the last gain)
    evaluations: int
    settled: bool
    stalled: bool


class HostLBFGS(eqx.Module):
    """L-BFGS ascent on the host over the flat parameters x, a solver of `gkl_jax.solvers.iterate` run as its host
    loop (`host=True`): each step is a line search whose trials are whole compiled inner fits (`backtrack_host`).

    The inner fits of a line search need the bound only to a fraction of the gain the step is expected to make:
    their tolerance is 1e-2 of the last accepted gain (relative to 1 + |f|), between `inner_tol` and
    `LOOSEST_INNER_TOL` (also the first fit's), so the early steps, whose gains are nats, do not pay for digits the
    later ones recompute (iris: 274 -> 180 sweeps with 1e-5 as the loosest; `GPClassifier` on six splits of iris,
    wine and glass, median sweeps 94 / 81 / 38.5 with 1e-5 and 76.5 / 70 / 35.5 with 3e-3).
    Settled (converged): an accepted step that raised the bound by <= ftol (1 + |f|), or a failed line search where
    the first-order gain of the full step is itself below that (round-off at the optimum); a failed line search with
    a larger predicted gain stalls the run. `postprocess` fits the optimum once more at `inner_tol` where the last
    fits were looser.

    Attributes:
        max_steps, ftol, max_step, memory, inner_tol: `fit_hyperparameters`' settings.
        dtype: the bound's dtype (of the history).
    """

    max_steps: int
    ftol: float
    max_step: float
    memory: int
    inner_tol: float
    dtype: Any

    monotone: ClassVar[bool] = True
    start_in_loop: ClassVar[bool] = False
    stop_on_nonfinite: ClassVar[bool] = True

    def init(self, problem: Learning, tol, max_steps):
        """The first (cold) inner fit at the starting parameters."""
        x0 = _flatten(problem.params0)
        inner = LOOSEST_INNER_TOL if ADAPTIVE_INNER_TOL else self.inner_tol
        f, g, st, aux = problem.solve(problem.params_of(x0), None, True, inner)  # rebuilt as every later point is
        state = HostState(x0, f, g, st, aux, (), inner, 1, self.max_steps == 0, False)
        return state, np.asarray(f, self.dtype)

    def step(self, problem: Learning, state: HostState, tol):
        """One outer step: the L-BFGS direction and its Armijo line search (the step is counted even where the
        search fails)."""
        x, f, g, tol = state.x, state.f, state.g, state.tol
        d = lbfgs_direction(g, list(state.pairs))
        if not d @ g > 0:
            d = g  # keep an ascent direction
        d = d * min(1.0, self.max_step / max(float(np.max(np.abs(d))), 1e-30))
        slope = float(g @ d)
        evaluations = state.evaluations

        def trial(t):
            nonlocal evaluations
            evaluations += 1
            return problem.solve(problem.params_of(x + t * d), state.st, False, tol)

        t, (f_t, g_t, st_t, aux_t), accepted = backtrack_host(
            trial, lambda t, out: sufficient_increase(out[0], f, t, slope), max_halvings=9)
        small = self.ftol * (1 + abs(f_t if accepted else f))
        if not accepted:
            new = dataclasses.replace(state, evaluations=evaluations, settled=slope <= small,
                                      stalled=not slope <= small)
        else:
            s_vec, y_vec = t * d, -(g_t - g)  # pairs for minimising -f
            pairs = (state.pairs + ((s_vec, y_vec),))[-self.memory:] if s_vec @ y_vec > 1e-12 else state.pairs
            if ADAPTIVE_INNER_TOL:
                tol = min(LOOSEST_INNER_TOL, max(self.inner_tol, 1e-2 * (f_t - f) / (1 + abs(f_t))))
            new = HostState(x + t * d, f_t, g_t, st_t, aux_t, pairs, tol, evaluations, f_t - f <= small, False)
        value = np.asarray(new.f, self.dtype)
        return new, Step(value, np.asarray(True), np.asarray(True), np.asarray(np.max(np.abs(new.g)), self.dtype))

    def terminate(self, problem, state: HostState, tol):
        """(settled, stalled)."""
        return np.asarray(state.settled), np.asarray(state.stalled)

    def point(self, state: HostState):
        """The flat parameters."""
        return state.x

    def postprocess(self, problem: Learning, state: HostState, point):
        """(x, (f, st, aux, evaluations)): the optimum fitted once more at `inner_tol` where the last fits were
        looser."""
        f, st, aux, evaluations = state.f, state.st, state.aux, state.evaluations
        if state.tol > self.inner_tol:  # the returned optimum at the requested tolerance
            f, _, st, aux = problem.solve(problem.params_of(point), st, False, self.inner_tol)
            evaluations += 1
        return point, (f, st, aux, evaluations)
