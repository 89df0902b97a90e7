"""`local`: the local variational lower bound with exponentiated-quadratic site bounds (papers/000 Section
5.1.1; thesis Ch. 3.3 and Table 4.1), optimised exactly (dense linear algebra).

Every site is replaced by a Gaussian lower bound t_n(x; xi_n) tangent at r_n^2 = xi_n (`_site_bounds`):
Jaakkola-Jordan for the logistic, the super-Gaussian tangent bounds (height functions of thesis Table 3.1)
for Laplace, Student-t and Cauchy sites, the fixed-curvature bound of Table 4.1 for the probit, and the exact
site for Gaussian potentials. The product is a Gaussian in w, so (papers/000 eq. 13-14)

    log Z >= B(xi) = log c(xi) - mu^T Sigma^{-1} mu / 2 + b^T A^{-1} b / 2 - log det Sigma / 2 - log det A / 2,
    A = Sigma^{-1} + F(xi),  b = Sigma^{-1} mu + f(xi),

with the Gaussian approximation q = N(A^{-1} b, A^{-1}). B is maximised over xi by the EM fixed point
xi_n <- E_q[(h_n^T w + o_n - center_n)^2] (s_n <- y_n E_q[h_n^T w + o_n] for the probit), which never
decreases B; each step costs one dense Cholesky of A, O(D^3 + N D^2). Papers/000 Section 5.1.2 proves

    B(xi) <= bound(model, q_xi) <= max G-KL bound <= log Z,

the ordering the tests check.
"""

import equinox as eqx
import jax
import jax.numpy as jnp
from jax import lax

from .. import potentials as P
from .._result import Result
from . import _common as C
from ._site_bounds import is_supported, probit_coefficients, super_gaussian, tangent_coefficients

TRACE_COUNT = {"local": 0}


def local(model, *, tol: float | None = None, max_steps: int = 1000) -> Result:
    """Maximise the local variational lower bound on log Z over the site-bound parameters xi.

    Returns a `Result` with q = N(A^{-1} b, A^{-1}) (a Full factor), `log_z` = B(xi) (a guaranteed lower bound,
    `is_bound=True`), `history` the bound after each EM step. Stops when the bound changes by less than
    tol * (1 + |B|) (default 1e-10 in float64) or after `max_steps`. Raises ValueError for potentials without a
    tight exponentiated-quadratic bound (Poisson, Custom).
    """
    C.check_model(model, "local")
    for s in model.sites:
        if not is_supported(s.potential, "local"):
            super_gaussian(s.potential, "local")  # raises the ValueError naming the potential
    max_steps = C.check_positive_int(max_steps, "max_steps", "local")
    dtype = C.dtype_of(model)
    tol = (1e-10 if jnp.finfo(dtype).bits >= 64 else 1e-5) if tol is None else float(tol)
    if tol <= 0:
        raise ValueError(f"local: tol must be positive, got {tol}")
    result = _local_jit(model, jnp.asarray(tol, dtype), max_steps)  # an array: no recompile per tol
    C.warn_if_not_converged(result.converged, "local", f"the EM iterations did not reach a relative bound change "
                            f"<= {tol:g} within max_steps={max_steps} (the result is still a valid lower bound)")
    return result


def _coefficients(groups, params):
    taus, nus, cs = [], [], []
    for (_, _, pot), xi in zip(groups, params):
        if isinstance(pot, P.Probit):
            tau, nu, c = probit_coefficients(pot.y, xi)
        else:
            tau, nu, c = tangent_coefficients(super_gaussian(pot, "local"), xi)
        taus.append(jnp.broadcast_to(tau, xi.shape))
        nus.append(jnp.broadcast_to(nu, xi.shape))
        cs.append(jnp.broadcast_to(c, xi.shape))
    return taus, nus, cs


def _update(groups, sol):
    """The EM update: the tangent point that maximises E_q[bound] (module docstring)."""
    out = []
    for (_, _, pot), m, v in zip(groups, sol.site_means, sol.site_vars):
        if isinstance(pot, P.Probit):
            out.append(pot.y * m)
        else:
            form = super_gaussian(pot, "local")
            out.append(jnp.square(m - form.center) + v)
    return out


def initial_parameters(model, groups, dtype):
    """Tangent points of the prior (or of an isotropic unit Gaussian without a prior)."""
    prior_mean = jnp.zeros(model.dim, dtype) if model.prior is None else model.prior.mean.astype(dtype)
    prior_var = jnp.ones(model.dim, dtype) if model.prior is None else model.prior.marginal_variances().astype(dtype)
    out = []
    for op, off, pot in groups:
        m = op.mv(prior_mean) + off
        if isinstance(pot, P.Probit):
            out.append(pot.y * m)
        else:
            form = super_gaussian(pot, "local")
            v = op.sq_mv(prior_var)
            out.append(jnp.broadcast_to(jnp.square(m - form.center) + v, m.shape).astype(dtype))
    return out


def solve(model, groups, params):
    """(GaussianSites at the bound tangent to `params`, B(params))."""
    taus, nus, cs = _coefficients(groups, params)
    sol = C.gaussian_sites(model, groups, taus, nus, cs)
    return sol, sol.log_integral


@eqx.filter_jit
def _local_jit(model, tol, max_steps):
    """One `lax.while_loop`; iteration k evaluates B(xi_k) (history[k]) and, unless the bound changed by less
    than tol (1 + |B|) or k = max_steps, takes the EM step to xi_{k+1}."""
    TRACE_COUNT["local"] += 1
    groups = C.operators(model)
    dtype = C.dtype_of(model)
    params0 = initial_parameters(model, groups, dtype)
    sol_dummy = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), jax.eval_shape(solve, model, groups, params0))[0]

    def cond(state):
        _, _, _, k, _, done, ok = state
        return ~done & ok & (k <= max_steps)

    def body(state):
        params, (old_sol, old_value), prev, k, hist, _, _ = state
        sol, value = solve(model, groups, params)
        ok = sol.ok & jnp.isfinite(value)
        done = jnp.abs(value - prev) <= tol * (1 + jnp.abs(value))
        move = ok & ~done & (k < max_steps)
        new_params = _update(groups, sol)
        params = [jnp.where(move, a, b) for a, b in zip(new_params, params)]
        # On failure keep the last good evaluation (EM never decreases B, so this is the best bound found).
        keep = jax.tree.map(lambda a, b: jnp.where(ok, a, b), (sol, value), (old_sol, old_value))
        return params, keep, value, k + 1, hist.at[k].set(value), done, ok

    nan = jnp.asarray(jnp.nan, dtype)
    state = (params0, (sol_dummy, nan), jnp.asarray(-jnp.inf, dtype), jnp.asarray(0),
             jnp.full((max_steps + 1,), jnp.nan, dtype), jnp.asarray(False), jnp.asarray(True))
    params, (sol, value), _, k, hist, done, ok = lax.while_loop(cond, body, state)
    q = C.gaussian_of_precision(sol.mean, sol.precision)
    return Result(q=q, log_z=value, converged=done & ok, num_steps=k - 1, history=hist, method="local",
                  is_bound=True)
