"""Maximisers of a smooth objective f: R^P -> R over flat parameter vectors, all in `lax` control flow.

Each returns (x, num_steps, converged, history) with `history[k]` the objective after step k (NaN after the
last step). They stop when max |grad f| <= tol, after `max_steps`, or when no ascent step can be found
(then `converged` is False).
"""

import jax
import jax.numpy as jnp
import optax
from jax import lax


def _max_abs(g):
    return jnp.max(jnp.abs(g))


def _history(max_steps, f0):
    return jnp.full((max_steps + 1,), jnp.nan, dtype=f0.dtype).at[0].set(f0)


def truncated_cg(hvp, g, max_iters, forcing):
    """Approximately solve (-Hess) p = g by conjugate gradients, stopping at negative curvature (Steihaug)
    or when ||r|| <= forcing * ||g||. Returns the steepest-ascent direction g if the first curvature is <= 0."""
    gnorm = jnp.linalg.norm(g)

    def cond(state):
        _, _, _, _, i, done = state
        return (i < max_iters) & ~done

    def body(state):
        p, r, d, rr, i, _ = state
        Ad = -hvp(d)
        curv = d @ Ad
        bad = ~(curv > 0)
        alpha = rr / jnp.where(bad, 1.0, curv)
        p_new = jnp.where(bad, jnp.where(i == 0, g, p), p + alpha * d)
        r_new = r - alpha * Ad
        rr_new = r_new @ r_new
        small = jnp.sqrt(rr_new) <= forcing * gnorm
        d_new = r_new + (rr_new / rr) * d
        return (p_new, jnp.where(bad, r, r_new), jnp.where(bad, d, d_new), jnp.where(bad, rr, rr_new), i + 1,
                bad | small)

    init = (jnp.zeros_like(g), g, g, g @ g, 0, gnorm == 0)
    p, *_ = lax.while_loop(cond, body, init)
    return p


def conjugate_gradient(matvec, b, *, max_iters, rtol=1e-10):
    """Solve A x = b for symmetric positive definite A by plain CG (lax control flow, no custom_linear_solve,
    so it can sit inside `lax.custom_root` tangent solves)."""
    bnorm = jnp.linalg.norm(b)

    def cond(state):
        _, r, _, rr, i = state
        return (i < max_iters) & (jnp.sqrt(rr) > rtol * bnorm)

    def body(state):
        x, r, d, rr, i = state
        Ad = matvec(d)
        alpha = rr / (d @ Ad)
        x = x + alpha * d
        r = r - alpha * Ad
        rr_new = r @ r
        return x, r, r + (rr_new / rr) * d, rr_new, i + 1

    x, *_ = lax.while_loop(cond, body, (jnp.zeros_like(b), b, b, b @ b, 0))
    return x


def backtracking(f, x, fx, g, p, max_halvings=40, c=1e-4, skip=False):
    """Largest t in {1, 1/2, ...} with f(x + t p) >= f(x) + c t g.p (Armijo), finite, and strictly above f(x).

    In the round-off regime, where the predicted gain g.p is below the resolution of f, a step is accepted when
    f does not drop by more than that resolution (quadratically convergent Newton steps are then the only way to
    tighten the gradient). Returns (t, f_new, ok); ok is False when no step qualifies, so stalled solvers stop.
    With `skip` (a traced flag) f is not evaluated and (1, f(x), True) is returned.
    """
    skip = jnp.asarray(skip, bool)
    slope = g @ p
    noise = 64 * jnp.finfo(fx.dtype).eps * (1 + jnp.abs(fx))
    in_noise = slope <= noise

    def accept(t, fnew):
        armijo = (fnew >= fx + c * t * slope) & (fnew > fx)
        return jnp.isfinite(fnew) & (armijo | (in_noise & (fnew >= fx - noise)))

    # t = 1, 1/2, ...: the first trial is made inside the loop, so that f has one call site (one copy of the
    # bound in the compiled program instead of two)
    def cond(state):
        t, fnew, k = state
        return ~skip & ((k == 0) | (~accept(t, fnew) & (k <= max_halvings)))

    def body(state):
        t, _, k = state
        t = jnp.where(k == 0, t, 0.5 * t)
        return t, f(x + t * p), k + 1

    t0 = jnp.ones((), x.dtype)
    t, fnew, _ = lax.while_loop(cond, body, (t0, fx, 0))
    return t, fnew, skip | accept(t, fnew)


def newton_cg(f, x0, *, tol, max_steps, max_cg=100):
    """Truncated Newton-CG with Hessian-vector products (forward-over-reverse, linearised once per Newton step so
    the CG iterations reuse the primal computation: quadrature nodes, site derivatives) and a backtracking line
    search.

    Each step starts with `jax.linearize` of the gradient at x, whose primal output is the gradient itself: the
    stopping test and the CG right-hand side take it from there, so a step costs one gradient evaluation, not two
    (a separate value-and-gradient at the new point was the same gradient again).

    For a concave objective (log-concave sites, Section 3.2) the CG system is positive definite."""
    grad = jax.grad(f)
    f0 = f(x0)

    def body(state):
        x, fx, _, k, hist, _ = state
        g, hvp = jax.linearize(grad, x)  # the gradient at x, and the primal pass every CG product reuses
        done = (_max_abs(g) <= tol) | (k >= max_steps)
        forcing = jnp.minimum(0.5, jnp.sqrt(jnp.linalg.norm(g)))
        p = lax.cond(done, lambda: jnp.zeros_like(x), lambda: truncated_cg(hvp, g, max_cg, forcing))
        # The line search is skipped by its own loop condition, not inside the conditional: the parts of f that do
        # not depend on x (the projections H E_1 of a subspace basis) stay invariants of the Newton loop, which XLA
        # computes once per solve (inside a conditional branch they were computed once per Newton step).
        t, f_new, ok = backtracking(f, x, fx, g, p, skip=done)
        x_new, f_new = jnp.where(ok, x + t * p, x), jnp.where(ok, f_new, fx)
        hist = jnp.where(done, hist, hist.at[k + 1].set(f_new))
        return x_new, f_new, g, k + (~done).astype(k.dtype), hist, ~done & ok

    init = (x0, f0, jnp.zeros_like(x0), jnp.zeros((), jnp.int32), _history(max_steps, f0), jnp.array(True))
    x, fx, g, k, hist, _ = lax.while_loop(lambda state: state[-1], body, init)
    converged = (_max_abs(g) <= tol) & jnp.isfinite(fx)
    return x, k, converged, hist


def lbfgs(f, x0, *, tol, max_steps, memory_size=10):
    """L-BFGS (optax) with a zoom line search, on -f.

    Memory 10 (optax's and scipy's default): each step's two-loop recursion streams the 2 m stored vectors twice,
    which at FactorAnalysis sizes (10^4-10^5 parameters) costs more than the extra steps a longer memory saves.
    Memory 20 -> 10 on papers/000 Tables 2-4 (FactorAnalysis): the same bounds, 0-4 more steps, 1.07-1.44x faster
    where N <= D, within 1% at N = 5 D; Student-t GP fits on Boston (n = 100, whitened or not): 3-11% more steps,
    14-21% faster."""
    return optax_solver(f, x0, optax.lbfgs(memory_size=memory_size), tol=tol, max_steps=max_steps)


# Consecutive steps without progress before a line-search solver gives up. L-BFGS recovers from a few failed
# line searches near round-off: on Table 1's slump Student-t ML-II, 3 stalls left 6 of 10 final fits short of
# tol 1e-6, 10 stalls none (same bounds, same time). Counting stalls against the best point instead left all 10
# short: near tol 1e-6 these fits are at the round-off floor.
LINESEARCH_MAX_STALLS = 10


def optax_solver(f, x0, optimizer, *, tol, max_steps):
    """Any `optax.GradientTransformation` minimising -f. Every update is given the value, the gradient and the
    value function (`value`, `grad`, `value_fn`: what optax's line searches, and so `optax.lbfgs()`, need;
    transformations without extra arguments are wrapped by `optax.with_extra_args_support`).

    Returns the last iterate if it meets the tolerance, else the best one seen (any optimiser). An optimiser whose
    state holds a line search's `value` (a monotone method such as L-BFGS) also stops after
    `LINESEARCH_MAX_STALLS` steps in a row that neither raise f nor lower max|grad f| (the line search finds no
    ascent) instead of repeating the failed step until `max_steps`; the value and gradient at the point it accepts
    are taken from its state where it stores both (optax's zoom search does) instead of being evaluated again."""
    optimizer = optax.with_extra_args_support(optimizer)
    neg = lambda x: -f(x)
    v0, g0 = jax.value_and_grad(neg)(x0)
    state0 = optimizer.init(x0)
    linesearch = _state_leaf(state0, "value") is not None

    def cond(carry):
        (x, state, v, g), best, k, hist, stalls = carry
        return (k < max_steps) & (_max_abs(g) > tol) & jnp.isfinite(v) & (stalls < LINESEARCH_MAX_STALLS)

    def body(carry):
        (x, state, v, g), best, k, hist, stalls = carry
        updates, state = optimizer.update(g, state, x, value=v, grad=g, value_fn=neg)
        x_new = optax.apply_updates(x, updates)
        v_new, g_new = _stored_value_and_grad(neg, x_new, state)
        if linesearch:
            stalls = jnp.where((v_new < v) | (_max_abs(g_new) < _max_abs(g)), 0, stalls + 1)
        best = _select(v_new < best[1], (x_new, v_new, g_new), best)
        return (x_new, state, v_new, g_new), best, k + 1, hist.at[k + 1].set(-v_new), stalls

    init = ((x0, state0, v0, g0), (x0, v0, g0), 0, _history(max_steps, -v0), 0)
    (x, _, v, g), best, k, hist, _ = lax.while_loop(cond, body, init)
    converged = (_max_abs(g) <= tol) & jnp.isfinite(v)
    return _select(converged, x, best[0]), k, converged, hist


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
