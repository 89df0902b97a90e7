"""First-order solvers: L-BFGS (Nocedal 1980) with a weak Wolfe line search (`lbfgs`), and any Optax gradient
transformation (`optax_solver`)."""

from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import optax

from .._optim import MAX_HALVINGS as _MAX_HALVINGS
from .._optim import LBFGSMemory, max_abs, no_decrease, roundoff, scaled_gradient, stationary, sufficient_increase
from ._base import AbstractIterativeSolver, ObjectiveProblem, Step, check_setting
from ._iterate import iterate

LINESEARCH_MAX_STALLS = 10
"""Consecutive steps without progress before a line-search solver gives up. L-BFGS recovers from a few failed
line searches near round-off: on Kuss & Rasmussen's slump Student-t ML-II, 3 stalls left 6 of 10 final fits short
of tol 1e-6, 10 stalls none (same bounds, same time)."""

NOISE_STEP_GRADIENT_DROP = 1e-3
"""An L-BFGS step accepted in round-off (its predicted gain g^T d below the round-off of f) counts as a stall unless
it raises f beyond the round-off or lowers max|grad f| by at least this fraction. Without it a prior-free Probit
fit of quasi-separated labels under FactorAnalysis (its mean's norm 5e9 after 100 steps, f constant to 13 digits)
ran all 2000 steps, each accepted after about a dozen trials: 17.6 s instead of 0.5 s (design-decisions page)."""


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
    solution = iterate(Optax(optimizer), ObjectiveProblem(f, x0, scale), tol, max_steps)[0]
    return solution.x, solution.num_steps, solution.converged, solution.history


class _OptaxState(eqx.Module):
    """The carry of `optax_solver`'s loop."""

    x: jax.Array
    opt_state: Any
    v: jax.Array        # -f(x)
    g: jax.Array        # its gradient
    stalls: jax.Array


CURVATURE = 0.9
"""c2 of the weak Wolfe curvature condition of `lbfgs`'s line search (Nocedal & Wright 2006, eq. 3.6; 0.9 for
quasi-Newton methods)."""


class _LBFGSState(eqx.Module):
    """The carry of `lbfgs`'s loop: the accepted point, the line search along d, and the counters."""

    x: jax.Array            # the last accepted point
    f: jax.Array            # f(x)
    g: jax.Array            # grad f(x)
    memory: LBFGSMemory     # the curvature pairs of -f
    d: jax.Array            # the ascent direction
    slope: jax.Array        # g^T d
    t: jax.Array            # the trial step
    lo: jax.Array           # the bracket [lo, hi] of the weak Wolfe search
    hi: jax.Array
    trials: jax.Array       # trials of the current line search
    stalls: jax.Array       # consecutive failed line searches or idle steps in round-off
    fresh: jax.Array        # before the first iteration (which evaluates the start)


def lbfgs(f, x0, *, tol, max_steps, memory_size=10, scale=1.0):
    """L-BFGS (Nocedal & Wright 2006, Alg. 7.5) maximising f, with one evaluation of (f, grad f) per iteration of
    one loop: the compiled program holds one copy of the objective.

    Directions come from the two-loop recursion over the last `memory_size` pairs (`gkl_jax._optim.LBFGSMemory`;
    without pairs the gradient scaled to length <= 1). The line search is a bisection for the weak Wolfe
    conditions (Nocedal & Wright 2006, eq. 3.6): the Armijo test `gkl_jax._optim.sufficient_increase` (or, where
    the predicted gain g^T d is below the round-off of f, `no_decrease`) and the curvature test
    grad f(x + t d)^T d <= `CURVATURE` g^T d, which keeps the curvature pairs positive (a pair that is not is not
    stored). t = 1 first; a trial failing Armijo halves the bracket, one passing Armijo but not the curvature test
    doubles t (or halves the bracket); after `MAX_HALVINGS` trials an Armijo point is taken. A search that finds
    none restarts from steepest ascent with the memory cleared, and the solver stops after
    `LINESEARCH_MAX_STALLS` such failures in a row (round-off), unconverged; a step accepted in round-off that
    moves neither f nor the gradient (`NOISE_STEP_GRADIENT_DROP`) counts as one. The start is the loop's first
    iteration.

    Args:
        f: the objective, (P,) -> scalar.
        x0: (P,) the start.
        tol: stop where `gkl_jax._optim.stationary(grad f, x, f, tol, scale)`.
        max_steps: the most accepted steps.
        memory_size: the number of stored curvature pairs.
        scale: sigma0, the variables' typical scale (scalar).

    Returns:
        (x, num_steps, converged, history, value): history[k] the objective after step k (NaN past the last),
        value = f(x).
    """
    solution = iterate(LBFGS(memory=memory_size), ObjectiveProblem(f, x0, scale), tol, max_steps)[0]
    return solution.x, solution.num_steps, solution.converged, solution.history, solution.value


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


class LBFGS(AbstractIterativeSolver):
    """L-BFGS with a weak Wolfe line search and one copy of the objective (`lbfgs`): the default for non-concave
    factors (FactorAnalysis) and, outside GP and dense priors, for non-log-concave sites (Challis & Barber 2013
    use L-BFGS throughout). Under an ill-conditioned GP prior pass `fit(..., whiten=True)`.

    Attributes:
        tol: gradient tolerance (None: the dtype's default).
        max_steps: the most steps (None: 2000).
        memory: the number of stored curvature pairs.
    """

    memory: int = 10
    default_max_steps = 2000

    def __check_init__(self):
        check_setting(self.memory, "memory", self)

    def init(self, problem, tol, max_steps):
        x0 = problem.x0
        dtype = x0.dtype
        one, zero, inf = jnp.ones((), dtype), jnp.zeros((), dtype), jnp.asarray(jnp.inf, dtype)
        state = _LBFGSState(x0, -inf, jnp.zeros_like(x0), LBFGSMemory.empty(x0, self.memory), jnp.zeros_like(x0),
                            zero, one, zero, inf, jnp.zeros((), jnp.int32), jnp.zeros((), jnp.int32), jnp.array(True))
        return state, -inf

    def step(self, problem, state, tol):
        """One trial of the line search (`lbfgs`); the first iteration evaluates the start."""
        s, dtype = state, state.x.dtype
        one, zero, inf = jnp.ones((), dtype), jnp.zeros((), dtype), jnp.asarray(jnp.inf, dtype)
        first = s.fresh
        trial = jnp.where(first, s.x, s.x + s.t * s.d)
        v, gv = jax.value_and_grad(problem.objective)(trial)
        noise = roundoff(s.f)
        in_noise = s.slope <= noise
        armijo = sufficient_increase(v, s.f, s.t, s.slope) | (in_noise & no_decrease(v, s.f, noise))
        curved = (gv @ s.d <= CURVATURE * s.slope) | in_noise
        out_of_trials = s.trials >= _MAX_HALVINGS
        accept = jnp.where(first, jnp.isfinite(v), armijo & (curved | out_of_trials))
        failed = ~first & ~armijo & out_of_trials
        # an accepted step in round-off that moves neither f nor the gradient (NOISE_STEP_GRADIENT_DROP) is a stall
        idle = ~first & accept & in_noise & ~(v > s.f + noise) \
            & ~(max_abs(gv) < (1 - NOISE_STEP_GRADIENT_DROP) * max_abs(s.g))
        renew = accept | failed
        # the pair of the minimised -f (y = -(change of grad f)), stored where s^T y > 0
        step, change = trial - s.x, s.g - gv
        memory = s.memory.push(step, change, ~first & accept & (step @ change > 0)).reset(failed)
        x = jnp.where(accept, trial, s.x)
        fx, g = jnp.where(accept, v, s.f), jnp.where(accept, gv, s.g)
        d = memory.direction(g)     # O(m P) on every trial: cheaper than a conditional that copies the memory
        slope = g @ d
        d, slope = jnp.where(slope > 0, d, g), jnp.where(slope > 0, slope, g @ g)
        # the bracket: shrink above a trial failing Armijo, grow below one failing the curvature test
        lo, hi = jnp.where(armijo, s.t, s.lo), jnp.where(armijo, s.hi, s.t)
        t_next = jnp.where(jnp.isinf(hi), 2 * s.t, 0.5 * (lo + hi))
        new = _LBFGSState(
            x, fx, g, memory, jnp.where(renew, d, s.d), jnp.where(renew, slope, s.slope),
            jnp.where(renew, one, t_next), jnp.where(renew, zero, lo), jnp.where(renew, inf, hi),
            jnp.where(renew, 0, s.trials + 1),
            jnp.where(failed | idle, s.stalls + 1, jnp.where(accept & ~first, 0, s.stalls)), jnp.array(False))
        return new, Step(fx, accept, accept & ~first, scaled_gradient(g, x, problem.scale))

    def terminate(self, problem, state, tol):
        return stationary(state.g, state.x, state.f, tol, problem.scale), state.stalls >= LINESEARCH_MAX_STALLS

    def point(self, state):
        return state.x


class Optax(AbstractIterativeSolver):
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

    monotone = False
    start_in_loop = False

    def _optimizer(self):
        return optax.with_extra_args_support(self.optimizer)

    def init(self, problem, tol, max_steps):
        x0 = problem.x0
        v0, g0 = jax.value_and_grad(lambda x: -problem.objective(x))(x0)
        return _OptaxState(x0, self._optimizer().init(x0), v0, g0, jnp.zeros((), jnp.int32)), -v0

    def step(self, problem, state, tol):
        """One update of the optimiser (`optax_solver`)."""
        neg = lambda x: -problem.objective(x)
        s, optimizer = state, self._optimizer()
        updates, opt_state = optimizer.update(s.g, s.opt_state, s.x, value=s.v, grad=s.g, value_fn=neg)
        x_new = optax.apply_updates(s.x, updates)
        v_new, g_new = _stored_value_and_grad(neg, x_new, opt_state)
        stalls = s.stalls
        if _state_leaf(opt_state, "value") is not None:     # a line search: a monotone method that may stall
            stalls = jnp.where((v_new < s.v) | (max_abs(g_new) < max_abs(s.g)), 0, stalls + 1)
        new = _OptaxState(x_new, opt_state, v_new, g_new, stalls)
        return new, Step(-v_new, jnp.array(True), jnp.array(True), scaled_gradient(g_new, x_new, problem.scale))

    def terminate(self, problem, state, tol):
        return stationary(state.g, state.x, state.v, tol, problem.scale), state.stalls >= LINESEARCH_MAX_STALLS

    def point(self, state):
        return state.x
