"""Truncated Newton-CG (Nocedal & Wright 2006, Alg. 7.1) on the G-KL bound: concave in (m, C) for log-concave
sites (Challis & Barber 2013, Section 3.2)."""

import numbers

import jax
import jax.numpy as jnp
from jax import lax

from .._optim import ARMIJO_C, backtrack, conjugate_gradient, no_decrease, roundoff, stationary, sufficient_increase
from ._base import AbstractSolver, Problem, Solution, check_setting, status


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
              max_halvings=40):
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

    Returns:
        (x, num_steps, converged, history), history[k] the objective after step k (NaN past the last).
    """
    value_and_grad = jax.value_and_grad(f)
    dtype = x0.dtype

    def body(state):
        x, fx, g, p, slope, t, halvings, k, hist, _ = state
        trial = x + t * p
        (f_trial, g_trial), linear = jax.linearize(value_and_grad, trial)
        start = halvings < 0
        accepted = start | ascent_accepted(f_trial, fx, t, slope)
        k = k + (accepted & ~start).astype(k.dtype)
        x, fx, g = (jnp.where(accepted, a, b) for a, b in ((trial, x), (f_trial, fx), (g_trial, g)))
        hist = jnp.where(accepted, hist.at[k].set(fx), hist)
        done = accepted & (stationary(g, x, fx, tol, scale) | (k >= max_steps) | ~jnp.isfinite(fx))
        failed = ~accepted & (halvings >= max_halvings)
        step = accepted & ~done
        rtol = jnp.minimum(0.5, jnp.sqrt(jnp.linalg.norm(g))) if forcing is None else jnp.asarray(forcing, dtype)
        precond = None if preconditioner is None else preconditioner(trial)
        p = lax.cond(step, lambda: conjugate_gradient(lambda v: -linear(v)[1], g_trial, max_iters=max_cg,
                                                      rtol=rtol, precond=precond), lambda: p)
        slope = jnp.where(step, g @ p, slope)
        t = jnp.where(step, 1.0, 0.5 * t).astype(dtype)
        halvings = jnp.where(step, 0, halvings + 1)
        return x, fx, g, p, slope, t, halvings, k, hist, ~done & ~failed

    zero = jnp.zeros((), dtype)
    hist0 = jnp.full((max_steps + 1,), jnp.nan, dtype=dtype)
    init = (x0, zero, jnp.zeros_like(x0), jnp.zeros_like(x0), zero, zero, jnp.array(-1, jnp.int32),
            jnp.zeros((), jnp.int32), hist0, jnp.array(True))
    x, fx, g, _, _, _, _, k, hist, _ = lax.while_loop(lambda state: state[-1], body, init)
    converged = stationary(g, x, fx, tol, scale)
    return x, k, converged, hist


class Newton(AbstractSolver):
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
    default_max_steps = 200

    def __check_init__(self):
        check_setting(self.max_cg, "max_cg", self)
        f = self.forcing
        if f is not None and (isinstance(f, bool) or not isinstance(f, numbers.Real) or not 0 < f < 1):
            raise ValueError(f"forcing must be None or a float in (0, 1), got {f!r}")

    def solve(self, problem: Problem, tol, max_steps: int) -> Solution:
        x, k, ok, hist = newton_cg(problem.objective, problem.x0, tol=tol, max_steps=max_steps,
                                   max_cg=self.max_cg, scale=problem.scale, preconditioner=problem.preconditioner,
                                   forcing=self.forcing)
        value = hist[k]     # the objective at x (the fit's bound without another evaluation)
        return Solution(x, k, ok, hist, status(ok, value, k, max_steps), value=value)
