"""Truncated Newton-CG (Nocedal & Wright 2006, Alg. 7.1) on the G-KL bound: concave in (m, C) for log-concave
sites (Challis & Barber 2013, Section 3.2)."""

import jax
import jax.numpy as jnp
from jax import lax

from .._optim import ARMIJO_C, backtrack, conjugate_gradient, no_decrease, roundoff, stationary, sufficient_increase
from ._base import AbstractSolver, Problem, Solution, check_setting, status


def armijo_search(f, x, fx, g, p, *, max_halvings=40, c=ARMIJO_C, skip=False):
    """Backtracking along p from x with the Armijo test f(x + t p) >= f(x) + c t g.p, finite and strictly above
    f(x); in the round-off regime (predicted gain g.p below the resolution of f) a step is accepted when f does
    not drop by more than that resolution (quadratically convergent Newton steps are then the only way to
    tighten the gradient).

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
    noise = roundoff(fx)
    in_noise = slope <= noise

    def accept(t, fnew):
        armijo = sufficient_increase(fnew, fx, t, slope, c) & (fnew > fx)
        return armijo | (in_noise & no_decrease(fnew, fx, noise))

    return backtrack(lambda t: f(x + t * p), accept, fx, dtype=x.dtype, max_halvings=max_halvings, skip=skip)


def newton_cg(f, x0, *, tol, max_steps, max_cg=100, scale=1.0, preconditioner=None):
    """Maximise f by truncated Newton-CG with Hessian-vector products (forward-over-reverse, linearised once per
    step so the CG iterations reuse the primal computation) and an Armijo line search.

    Each step starts with `jax.linearize` of the value and gradient at x, whose primal output is (f(x), grad f(x))
    itself: the stopping test, the CG right-hand side and the history take them from there, so a step costs one
    gradient evaluation, and the compiled program holds two copies of f (that linearisation and the line
    search's trials), the start included. CG stops at negative curvature (Steihaug), so every step is an ascent
    step also where f is not concave.

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

    Returns:
        (x, num_steps, converged, history), history[k] the objective after step k (NaN past the last).
    """
    value_and_grad = jax.value_and_grad(f)
    dtype = x0.dtype

    def body(state):
        x, _, _, k, hist, _ = state
        (fx, g), linear = jax.linearize(value_and_grad, x)
        hist = hist.at[k].set(fx)
        done = stationary(g, x, fx, tol, scale) | (k >= max_steps)
        forcing = jnp.minimum(0.5, jnp.sqrt(jnp.linalg.norm(g)))
        precond = None if preconditioner is None else preconditioner(x)
        p = lax.cond(done, lambda: jnp.zeros_like(x),
                     lambda: conjugate_gradient(lambda v: -linear(v)[1], g, max_iters=max_cg, rtol=forcing,
                                                precond=precond))
        # The line search is skipped by its own loop condition, not inside the conditional: the parts of f that do
        # not depend on x (the projections H E_1 of a subspace basis) stay invariants of the Newton loop, which XLA
        # computes once per solve (inside a conditional branch they were computed once per Newton step).
        t, f_new, ok = armijo_search(f, x, fx, g, p, skip=done)
        x_new, f_new = jnp.where(ok, x + t * p, x), jnp.where(ok, f_new, fx)
        hist = jnp.where(done, hist, hist.at[k + 1].set(f_new))
        return x_new, fx, g, k + (~done).astype(k.dtype), hist, ~done & ok

    hist0 = jnp.full((max_steps + 1,), jnp.nan, dtype=dtype)
    init = (x0, jnp.zeros((), dtype), jnp.zeros_like(x0), jnp.zeros((), jnp.int32), hist0, jnp.array(True))
    x, fx, g, k, hist, _ = lax.while_loop(lambda state: state[-1], body, init)
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
    """

    max_cg: int = 100
    default_max_steps = 200

    def __check_init__(self):
        check_setting(self.max_cg, "max_cg", self)

    def solve(self, problem: Problem, tol, max_steps: int) -> Solution:
        x, k, ok, hist = newton_cg(problem.objective, problem.x0, tol=tol, max_steps=max_steps,
                                   max_cg=self.max_cg, scale=problem.scale, preconditioner=problem.preconditioner)
        value = hist[k]     # the objective at x (the fit's bound without another evaluation)
        return Solution(x, k, ok, hist, status(ok, value, k, max_steps), value=value)
