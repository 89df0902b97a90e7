"""First-order solvers: L-BFGS (Nocedal 1980) with a zoom line search, and any Optax gradient transformation,
both driven by `optax_solver`."""

import jax
import jax.numpy as jnp
import optax
from jax import lax

from .._optim import max_abs, stationary
from ._base import AbstractSolver, Problem, Solution, check_setting, status

LINESEARCH_MAX_STALLS = 10
"""Consecutive steps without progress before a line-search solver gives up. L-BFGS recovers from a few failed
line searches near round-off: on Kuss & Rasmussen's slump Student-t ML-II, 3 stalls left 6 of 10 final fits short
of tol 1e-6, 10 stalls none (same bounds, same time)."""


def _history(max_steps, f0):
    return jnp.full((max_steps + 1,), jnp.nan, dtype=f0.dtype).at[0].set(f0)


def optax_solver(f, x0, optimizer, *, tol, max_steps, scale=1.0):
    """Maximise f with an `optax.GradientTransformation` minimising -f.

    Every update is given the value, the gradient and the value function (`value`, `grad`, `value_fn`: what
    optax's line searches, and so `optax.lbfgs()`, need). Returns the last iterate if it meets the tolerance,
    else the best one seen. An optimiser whose state holds a line search's `value` (a monotone method such as
    L-BFGS) also stops after `LINESEARCH_MAX_STALLS` steps in a row that neither raise f nor lower max|grad f|;
    the value and gradient at the accepted point are taken from its state where it stores both.

    Args:
        f: the objective, (P,) -> scalar.
        x0: (P,) the start.
        optimizer: an `optax.GradientTransformation`.
        tol: stop where `gkl_jax._optim.stationary(grad f, x, f, tol, scale)`: max_i |g_i| max(|x_i|, scale)
            <= max(tol, 8 eps |f|).
        max_steps: the most updates.
        scale: sigma0, the variables' typical scale (scalar).

    Returns:
        (x, num_steps, converged, history), history[k] the objective after step k (NaN past the last).
    """
    optimizer = optax.with_extra_args_support(optimizer)
    neg = lambda x: -f(x)
    v0, g0 = jax.value_and_grad(neg)(x0)
    state0 = optimizer.init(x0)
    linesearch = _state_leaf(state0, "value") is not None

    def cond(carry):
        (x, state, v, g), best, k, hist, stalls = carry
        going = (k < max_steps) & jnp.isfinite(v) & (stalls < LINESEARCH_MAX_STALLS)
        return going & ~stationary(g, x, v, tol, scale)

    def body(carry):
        (x, state, v, g), best, k, hist, stalls = carry
        updates, state = optimizer.update(g, state, x, value=v, grad=g, value_fn=neg)
        x_new = optax.apply_updates(x, updates)
        v_new, g_new = _stored_value_and_grad(neg, x_new, state)
        if linesearch:
            stalls = jnp.where((v_new < v) | (max_abs(g_new) < max_abs(g)), 0, stalls + 1)
        best = _select(v_new < best[1], (x_new, v_new, g_new), best)
        return (x_new, state, v_new, g_new), best, k + 1, hist.at[k + 1].set(-v_new), stalls

    init = ((x0, state0, v0, g0), (x0, v0, g0), 0, _history(max_steps, -v0), 0)
    (x, _, v, g), best, k, hist, _ = lax.while_loop(cond, body, init)
    converged = stationary(g, x, v, tol, scale)
    return _select(converged, x, best[0]), k, converged, hist


def lbfgs(f, x0, *, tol, max_steps, memory_size=10, scale=1.0):
    """L-BFGS (optax, zoom line search) maximising f; see `optax_solver` for the arguments and returns.

    Memory 10 (optax's and scipy's default): each step's two-loop recursion streams the 2 m stored vectors twice,
    which at FactorAnalysis sizes (10^4-10^5 parameters) costs more than the extra steps a longer memory saves."""
    return optax_solver(f, x0, optax.lbfgs(memory_size=memory_size), tol=tol, max_steps=max_steps,
                        scale=scale)


def _state_leaf(state, key):
    """The one leaf named `key` in an optax state, or None (absent, or more than one)."""
    try:
        return optax.tree.get(state, key)
    except KeyError:    # more than one of them in the state
        return None


def _stored_value_and_grad(neg, x, state):
    """The value and gradient of `neg` at x: those a line search stored in the optimiser state where it holds both
    (optax's zoom and backtracking searches), else evaluated."""
    if any(_state_leaf(state, key) is None for key in ("value", "grad")):
        return jax.value_and_grad(neg)(x)
    return optax.value_and_grad_from_state(neg)(x, state=state)


def _select(pred, a, b):
    return jax.tree.map(lambda u, w: jnp.where(pred, u, w), a, b)


def _finish(x, k, ok, hist, max_steps):
    value = jnp.nanmax(hist)      # the best iterate's value where short of tol, the last one where converged
    return Solution(x, k, ok, hist, status(ok, value, k, max_steps))


class LBFGS(AbstractSolver):
    """L-BFGS with optax's zoom line search (`lbfgs`): the default for non-concave factors (FactorAnalysis) and,
    outside GP and dense priors, for non-log-concave sites (Challis & Barber 2013 use it throughout). Under an
    ill-conditioned GP prior pass `fit(..., whiten=True)`.

    Attributes:
        tol: gradient tolerance (None: the dtype's default).
        max_steps: the most steps (None: 2000).
        memory: the number of stored curvature pairs.
    """

    memory: int = 10
    default_max_steps = 2000

    def __check_init__(self):
        check_setting(self.memory, "memory", self)

    def solve(self, problem: Problem, tol, max_steps: int) -> Solution:
        x, k, ok, hist = lbfgs(problem.objective, problem.x0, tol=tol, max_steps=max_steps,
                               memory_size=self.memory, scale=problem.scale)
        return _finish(x, k, ok, hist, max_steps)


class Optax(AbstractSolver):
    """Any `optax.GradientTransformation` (e.g. `optax.adam(0.05)`) minimising the negative bound
    (`optax_solver`).

    Attributes:
        optimizer: the optax gradient transformation.
        tol: gradient tolerance (None: the dtype's default).
        max_steps: the most updates (None: 5000).
    """

    optimizer: optax.GradientTransformation | None = None
    default_max_steps = 5000

    def __init__(self, optimizer, *, tol=None, max_steps=None):
        self.optimizer = optimizer
        self.tol = tol
        self.max_steps = max_steps

    def __check_init__(self):
        if not isinstance(self.optimizer, optax.GradientTransformation):
            raise ValueError("Optax: optimizer must be an optax.GradientTransformation, got "
                             f"{type(self.optimizer).__name__}")

    def solve(self, problem: Problem, tol, max_steps: int) -> Solution:
        x, k, ok, hist = optax_solver(problem.objective, problem.x0, self.optimizer, tol=tol, max_steps=max_steps,
                                      scale=problem.scale)
        return _finish(x, k, ok, hist, max_steps)
