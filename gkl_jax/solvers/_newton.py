"""Truncated Newton-CG (Nocedal & Wright 2006, Alg. 7.1) on the G-KL bound: concave in (m, C) for log-concave
sites (Challis & Barber 2013, Section 3.2)."""

import numbers

import equinox as eqx
import jax
import jax.numpy as jnp
from jax import lax

from .._optim import (
    ARMIJO_C,
    backtrack,
    conjugate_gradient,
    no_decrease,
    roundoff,
    scaled_gradient,
    stationary,
    sufficient_increase,
)
from ._base import AbstractIterativeSolver, ObjectiveProblem, Step, check_setting
from ._iterate import iterate


def ascent_accepted(fnew, fx, t, slope, c=ARMIJO_C):
    """The acceptance test of Newton's backtracking: the Armijo test f(x + t p) >= f(x) + c t g.p, finite and
    strictly above f(x); in the round-off regime (predicted gain g.p below the resolution of f) a step is accepted
    when f does not drop by more than that resolution (quadratically convergent Newton steps are then the only way
    to tighten the gradient).

    Args:
        fnew: f(x + t p); fx: f(x); t: the step; slope: g.p, the directional derivative at x.
        c: the Armijo constant.

    Returns:
        bool scalar.
    """
    noise = roundoff(fx)
    armijo = sufficient_increase(fnew, fx, t, slope, c) & (fnew > fx)
    return armijo | ((slope <= noise) & no_decrease(fnew, fx, noise))


def armijo_search(f, x, fx, g, p, *, max_halvings=40, c=ARMIJO_C, skip=False):
    """Backtracking along p from x until `ascent_accepted`.

    Args:
        f: the objective, (P,) -> scalar.
        x: (P,) the current point; fx: f(x); g: (P,) the gradient there; p: (P,) the ascent direction.
        max_halvings: the most halvings of t = 1.
        c: the Armijo constant.
        skip: traced bool: evaluate nothing and return (1, fx, True).

    Returns:
        (t, f(x + t p), ok): ok is False when no step qualifies (so that stalled solvers stop).
    """
    slope = g @ p
    return backtrack(lambda t: f(x + t * p), lambda t, fnew: ascent_accepted(fnew, fx, t, slope, c), fx,
                     dtype=x.dtype, max_halvings=max_halvings, skip=skip)


def newton_cg(f, x0, *, tol, max_steps, max_cg=100, scale=1.0, preconditioner=None, forcing=None,
              max_halvings=40, progress=None):
    """Maximise f by truncated Newton-CG with Hessian-vector products and a backtracking (Armijo) line search.

    One loop, one evaluation per iteration: each iteration linearises the value and gradient at a trial point
    x + t p (`jax.linearize`, forward-over-reverse, so the CG iterations reuse its primal computation) and
    tests it (`ascent_accepted`). Accepted: the trial becomes the current point, the stopping test and CG's
    right-hand side use the gradient just computed, and CG gives the next direction (t = 1). Rejected: t is
    halved. An accepted Newton step therefore costs one gradient evaluation (the line search's trial is the next
    step's linearisation), and the compiled program holds one copy of f. The first iteration evaluates x0
    (t = 0). CG stops at negative curvature (Steihaug), so every step is an ascent step also where f is not
    concave.

    Args:
        f: the objective, (P,) -> scalar.
        x0: (P,) the start.
        tol: stop where `gkl_jax._optim.stationary(grad f, x, f, tol, scale)`: max_i |g_i| max(|x_i|, scale)
            <= max(tol, 8 eps |f|).
        max_steps: the most Newton steps.
        max_cg: the most CG iterations per step.
        scale: sigma0, the variables' typical scale (scalar).
        preconditioner: x -> (v -> P v), CG's preconditioner at the step's point (an approximation of the inverse
            of -d^2 f/dx^2, symmetric positive definite), or None.
        forcing: CG's relative residual per step (a float in (0, 1)), or None for min(0.5, sqrt(|grad f|))
            (Nocedal & Wright 2006, Section 7.1).
        max_halvings: the most halvings of t = 1 in a step's line search.
        progress: None, or a callable receiving a `ProgressInfo` after each step (`iterate`'s `progress`).

    Returns:
        (x, num_steps, converged, history), history[k] the objective after step k (NaN past the last).
    """
    solution = iterate(Newton(max_cg=max_cg, forcing=forcing, max_halvings=max_halvings),
                       ObjectiveProblem(f, x0, scale, preconditioner), tol, max_steps, progress=progress)[0]
    return solution.x, solution.num_steps, solution.converged, solution.history


class _NewtonState(eqx.Module):
    """The carry of `newton_cg`'s loop: the accepted point, the direction, the trial step."""

    x: jax.Array
    fx: jax.Array
    g: jax.Array
    p: jax.Array
    slope: jax.Array
    t: jax.Array
    halvings: jax.Array     # halvings of the current line search; -1 before the first iteration (the start)
    failed: jax.Array       # the last line search found no acceptable step


class Newton(AbstractIterativeSolver):
    """Truncated Newton-CG in (m, C) with Hessian-vector products and an Armijo line search (`newton_cg`).

    The default for concave factors (Chevron, Banded, Sparse, Subspace) on log-concave models, and for
    non-log-concave sites under a GP or dense prior, where CG's negative-curvature stop keeps every step an
    ascent step and Newton is unaffected by the conditioning of Sigma.

    Attributes:
        tol: gradient tolerance (None: the dtype's default).
        max_steps: the most Newton steps (None: 200).
        max_cg: the most CG iterations per Newton step.
        forcing: CG's relative residual per Newton step, a float in (0, 1), or None (default) for
            min(0.5, sqrt(|grad B|)) (Nocedal & Wright 2006, Section 7.1). A small constant (1e-2) takes fewer,
            more exact Newton steps: worth it where a gradient evaluation costs much more than a Hessian-vector
            product and CG is well preconditioned (the Full factor on a few hundred sites).
    """

    max_cg: int = 100
    forcing: float | None = None
    max_halvings: int = 40
    default_max_steps = 200

    def __check_init__(self):
        check_setting(self.max_cg, "max_cg", self)
        f = self.forcing
        if f is not None and (isinstance(f, bool) or not isinstance(f, numbers.Real) or not 0 < f < 1):
            raise ValueError(f"forcing must be None or a float in (0, 1), got {f!r}")

    def init(self, problem, tol, max_steps):
        x0 = problem.x0
        zero = jnp.zeros((), x0.dtype)
        return _NewtonState(x0, zero, jnp.zeros_like(x0), jnp.zeros_like(x0), zero, zero, jnp.array(-1, jnp.int32),
                            jnp.array(False)), zero

    def step(self, problem, state, tol):
        """One trial x + t p: linearised value and gradient, the acceptance test, and (accepted) CG's next
        direction; the first iteration (halvings = -1) evaluates the start."""
        s, scale, dtype = state, problem.scale, state.x.dtype
        trial = s.x + s.t * s.p
        (f_trial, g_trial), linear = jax.linearize(jax.value_and_grad(problem.objective), trial)
        start = s.halvings < 0
        accepted = start | ascent_accepted(f_trial, s.fx, s.t, s.slope)
        x, fx, g = (jnp.where(accepted, a, b) for a, b in ((trial, s.x), (f_trial, s.fx), (g_trial, s.g)))
        done = accepted & (stationary(g, x, fx, tol, scale) | ~jnp.isfinite(fx))
        failed = ~accepted & (s.halvings >= self.max_halvings)
        step = accepted & ~done
        rtol = jnp.minimum(0.5, jnp.sqrt(jnp.linalg.norm(g))) if self.forcing is None else \
            jnp.asarray(self.forcing, dtype)
        precond = problem.preconditioner(trial)
        p = lax.cond(step, lambda: conjugate_gradient(lambda v: -linear(v)[1], g_trial, max_iters=self.max_cg,
                                                      rtol=rtol, precond=precond), lambda: s.p)
        new = _NewtonState(x, fx, g, p, jnp.where(step, g @ p, s.slope), jnp.where(step, 1.0, 0.5 * s.t).astype(dtype),
                           jnp.where(step, 0, s.halvings + 1), failed)
        return new, Step(fx, accepted, accepted & ~start, scaled_gradient(g, x, scale))

    def terminate(self, problem, state, tol):
        return stationary(state.g, state.x, state.fx, tol, problem.scale), state.failed

    def point(self, state):
        return state.x
