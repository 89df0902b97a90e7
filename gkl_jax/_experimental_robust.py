"""Experimental: the default fit for non-log-concave sites under a dense (GP or `Dense`) prior (issue 35, item 5).

Student-t, Cauchy and other non-log-concave sites make the G-KL bound non-concave in (m, C). Under a GP prior
without a white-noise term Sigma is ill-conditioned (its smallest eigenvalues are the jitter), and Newton-CG in
(m, C), whose truncated CG (Steihaug) runs at most `max_cg` products per step, then cannot resolve the prior's
directions: on the robust GP regression of issue 35 it stopped after 200 steps 110-160 nats below the optimum.
In the whitened basis w = mu + L v, L L^T = Sigma (Challis & Barber 2013, App. E), the prior is N(0, I), the
Hessian of the bound is I minus a site term, and the same Newton-CG converges in 10-110 steps. The bound has
several optima, and whitened L-BFGS from the prior found the best one where Newton-CG did not: the recommended
default runs whitened L-BFGS to a loose tolerance, then whitened Newton-CG (benchmarks/robust_defaults.py).

`robust_fit` is the rule recommended for `fit`'s default, written with the public API; `strategies` holds every
candidate the benchmark compares. Once `fit`'s default follows the rule, `robust_fit(model)` is `fit(model)`.
"""

import warnings

import equinox as eqx
import jax
import jax.numpy as jnp
from jax import lax
from jax.flatten_util import ravel_pytree

from ._bound import bound
from ._fit import _initial_q, default_tol, fit, model_dtype, whitening
from ._gaussian import Gaussian
from ._result import Result
from ._site_precision import has_dense_prior
from .baselines import local
from .factors import Full


def robust_rule(model) -> bool:
    """Whether the recommended default for `model` (Full factor) is `robust_fit`'s two-phase fit.

    Non-log-concave sites under a dense prior (GP or `Dense`, any site projections): yes. Everything else keeps
    `fit`'s current default.

    Args:
        model: a `gkl_jax.Model`.

    Returns:
        bool.
    """
    return not model.log_concave and has_dense_prior(model)


def robust_fit(model, *, tol=None, **kwargs):
    """`fit(model)` with the recommended default (`robust_rule`): whitened L-BFGS from the prior to the loose
    tolerance sqrt(tol), then whitened Newton-CG from there to `tol`; elsewhere `fit(model)` itself.

    On the 25 cases of benchmarks/robust_defaults.py (benchmarks/RESULTS_robust.md) this was the one candidate
    that converged on every case and ended within 1e-3 nat of the best of {whitened L-BFGS, fits from
    `gkl_jax.local`'s q}: whitened Newton-CG from the prior converged everywhere but twice (N = 200, noise scale
    0.01, lengthscale 10) at an optimum 31.5 and 1.7 nats lower, where the local-started fits ended lower too;
    whitened L-BFGS alone stalled short of tol 1e-6 at noise scale 0.01 (2000 steps); Newton-CG in (m, C),
    today's default, ended 0.04-336 nats short on 12 of 16 cases.

    Args:
        model: a `gkl_jax.Model`.
        tol: the final gradient tolerance (default: `fit`'s, 1e-6 in float64, 1e-3 in float32).
        **kwargs: passed on to both `fit` calls (e.g. `max_steps`).

    Returns:
        Result: the Newton phase's (q with a Full factor, in the original basis), `num_steps` the steps of both
        phases.
    """
    if not robust_rule(model):
        return fit(model, tol=tol, **kwargs)
    final = default_tol(model_dtype(model)) if tol is None else tol
    with warnings.catch_warnings():       # the loose phase need not converge: the Newton phase reports
        warnings.simplefilter("ignore")
        first = fit(model, solver="lbfgs", whiten=True, tol=float(final) ** 0.5, **kwargs)
    res = fit(model, solver="newton", whiten=True, q0=first.q, tol=final, **kwargs)
    return eqx.tree_at(lambda r: r.num_steps, res, res.num_steps + first.num_steps)


def local_start(model) -> Gaussian:
    """The q of `gkl_jax.local` (a Full factor), the start of the local-started fits.

    Args:
        model: a model whose potentials have tangent bounds (`local`'s requirement).

    Returns:
        Gaussian: q = N(A^{-1} b, A^{-1}) of the local variational bound's optimum.
    """
    q = local(model).q
    if not isinstance(q.factor, Full):
        raise ValueError(f"local returned a {type(q.factor).__name__} factor; a Full one is needed")
    return q


def strategies():
    """name -> (needs_local, fn(model, q_local) -> Result): the candidate defaults the benchmark compares.

    Returns:
        dict: each fn takes the model and the local start (None where `needs_local` is False).
    """
    return {
        "default": (False, lambda m, q: fit(m)),
        "newton-w": (False, lambda m, q: fit(m, solver="newton", whiten=True)),
        "lbfgs-w": (False, lambda m, q: fit(m, solver="lbfgs", whiten=True)),
        "lbfgs-w+newton-w": (False, lambda m, q: robust_fit(m)),
        "local>newton": (True, lambda m, q: fit(m, q0=q)),
        "local>newton-w": (True, lambda m, q: fit(m, q0=q, solver="newton", whiten=True)),
        "local>lbfgs-w": (True, lambda m, q: fit(m, q0=q, solver="lbfgs", whiten=True)),
    }


# --- Prototype (not recommended by the data; kept for the benchmark): a trust-region Newton-CG -----------------


def steihaug(hvp, g, radius, max_iters, forcing):
    """Approximately maximise g.p - p^T A p / 2, A = -Hess, over ||p|| <= radius by CG (Steihaug 1983; Toint
    1981): at negative curvature or at the boundary the step goes to the boundary along the current direction.

    Args:
        hvp: v -> Hess v (the objective's Hessian, so A v = -hvp(v)).
        g: (P,) gradient.
        radius: scalar trust radius.
        max_iters: int, CG iterations at most.
        forcing: scalar, stop where ||r|| <= forcing ||g||.

    Returns:
        (P,) step p.
    """
    gnorm = jnp.linalg.norm(g)

    def to_boundary(p, d):
        pd, dd, pp = p @ d, d @ d, p @ p
        tau = (-pd + jnp.sqrt(jnp.maximum(pd * pd + dd * (radius * radius - pp), 0.0))) / jnp.maximum(dd, 1e-300)
        return p + tau * d

    def cond(s):
        return (s[4] < max_iters) & ~s[5]

    def body(s):
        p, r, d, rr, i, _ = s
        Ad = -hvp(d)
        curv = d @ Ad
        alpha = rr / jnp.where(curv > 0, curv, 1.0)
        p_try = p + alpha * d
        out = ~(curv > 0) | (jnp.linalg.norm(p_try) >= radius)
        p_new = jnp.where(out, to_boundary(p, d), p_try)
        r_new = r - alpha * Ad
        rr_new = r_new @ r_new
        done = out | (jnp.sqrt(rr_new) <= forcing * gnorm)
        return p_new, r_new, r_new + (rr_new / rr) * d, rr_new, i + 1, done

    p, *_ = lax.while_loop(cond, body, (jnp.zeros_like(g), g, g, g @ g, 0, gnorm == 0))
    return p


def trust_region_newton(f, x0, *, tol, max_steps, max_cg=100, radius0=1.0):
    """Maximise f by trust-region Newton-CG (`steihaug` steps; radius x1/4 where the gain ratio rho < 1/4, x2
    where rho > 3/4 at the boundary; a step is taken where rho > 1e-4, or in the round-off regime where f does not
    drop by more than its resolution).

    Args:
        f: objective R^P -> R.
        x0: (P,) start.
        tol: stop where max |grad| <= tol.
        max_steps: int.
        max_cg: int, CG iterations per step.
        radius0: the first trust radius.

    Returns:
        (x, num_steps, converged, history) as `gkl_jax._solvers.newton_cg` returns them.
    """
    grad = jax.grad(f)
    f0 = f(x0)
    hist0 = jnp.full((max_steps + 1,), jnp.nan, f0.dtype).at[0].set(f0)

    def cond(s):
        return s[-1]

    def body(s):
        x, fx, _, k, hist, radius, _ = s
        g, hvp = jax.linearize(grad, x)
        done = (jnp.max(jnp.abs(g)) <= tol) | (k >= max_steps)
        forcing = jnp.minimum(0.5, jnp.sqrt(jnp.linalg.norm(g)))
        p = lax.cond(done, lambda: jnp.zeros_like(x), lambda: steihaug(hvp, g, radius, max_cg, forcing))
        pred = g @ p + 0.5 * p @ hvp(p)
        f_new = lax.cond(done, lambda: fx, lambda: f(x + p))
        noise = 64 * jnp.finfo(fx.dtype).eps * (1 + jnp.abs(fx))
        rho = (f_new - fx) / jnp.where(pred > 0, pred, 1.0)
        ok = jnp.isfinite(f_new) & ((rho > 1e-4) | ((pred <= noise) & (f_new >= fx - noise)))
        pnorm = jnp.linalg.norm(p)
        radius = jnp.where(~jnp.isfinite(f_new) | (rho < 0.25), 0.25 * pnorm,
                           jnp.where((rho > 0.75) & (pnorm >= 0.99 * radius), 2 * radius, radius))
        x_new, f_keep = jnp.where(ok & ~done, x + p, x), jnp.where(ok & ~done, f_new, fx)
        hist = jnp.where(done, hist, hist.at[k + 1].set(f_keep))
        alive = ~done & (radius > 64 * jnp.finfo(fx.dtype).eps * (1 + jnp.linalg.norm(x)))
        return x_new, f_keep, g, k + (~done).astype(k.dtype), hist, radius, alive

    init = (x0, f0, jnp.zeros_like(x0), jnp.zeros((), jnp.int32), hist0, jnp.asarray(radius0, f0.dtype),
            jnp.array(True))
    x, fx, g, k, hist, _, _ = lax.while_loop(cond, body, init)
    return x, k, (jnp.max(jnp.abs(g)) <= tol) & jnp.isfinite(fx), hist


@eqx.filter_jit
def _trust_jit(work, q_init, tol, max_steps, radius0):
    params, static = eqx.partition(q_init, eqx.is_inexact_array)
    flat0, unravel = ravel_pytree(params)
    to_q = lambda x: eqx.combine(unravel(x), static)
    x, k, ok, hist = trust_region_newton(lambda x: bound(work, to_q(x)), flat0, tol=tol, max_steps=max_steps,
                                         radius0=radius0)
    return to_q(x), k, ok, hist


def fit_trust_region(model, *, q0=None, tol=1e-6, max_steps=200, radius0=None):
    """Whitened trust-region Newton-CG from the prior (or `q0`, a Full-factor Gaussian): the prototype.

    Args:
        model: a model with a dense prior.
        q0: optional start (Full factor).
        tol: gradient tolerance.
        max_steps: int.
        radius0: first trust radius (default sqrt(dim), the norm of a whitened prior sample).

    Returns:
        Result: q in the original basis, log_z = bound(model, q) (no implicit derivative: a prototype).
    """
    work, q0w, back = whitening(model, q0, True, "fit_trust_region")
    q_init = _initial_q(work, Full(), q0w)
    dtype = q_init.mean.dtype
    radius0 = jnp.sqrt(jnp.asarray(model.dim, dtype)) if radius0 is None else radius0
    q, k, ok, hist = _trust_jit(work, q_init, jnp.asarray(tol, dtype), max_steps, jnp.asarray(radius0, dtype))
    q = back(q)
    return Result(q=q, log_z=eqx.filter_jit(bound)(model, q), converged=ok, num_steps=k, history=hist)
