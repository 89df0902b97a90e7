"""`local`: the local variational lower bound with exponentiated-quadratic site bounds (Challis & Barber 2013, Section
5.1.1; thesis Ch. 3.3 and Table 4.1), optimised exactly (dense linear algebra).

Every site is replaced by a Gaussian lower bound t_n(x; xi_n) tangent at r_n^2 = xi_n (`_site_bounds`):
Jaakkola-Jordan for the logistic, the super-Gaussian tangent bounds (height functions of thesis Table 3.1)
for Laplace, Student-t and Cauchy sites, the fixed-curvature bound of Table 4.1 for the probit, and the exact
site for Gaussian potentials. The product is a Gaussian in w, so (Challis & Barber 2013, eq. 13-14)

    log Z >= B(xi) = log c(xi) - mu^T Sigma^{-1} mu / 2 + b^T A^{-1} b / 2 - log det Sigma / 2 - log det A / 2,
    A = Sigma^{-1} + F(xi),  b = Sigma^{-1} mu + f(xi),

with the Gaussian approximation q = N(A^{-1} b, A^{-1}). B is maximised over xi by the EM fixed point
xi_n <- E_q[(h_n^T w + o_n - center_n)^2] (s_n <- y_n E_q[h_n^T w + o_n] for the probit), which never
decreases B, over-relaxed with a safeguard (`_local_jit`); each step costs one dense Cholesky of A,
O(D^3 + N D^2). Challis & Barber (2013), Section 5.1.2, prove

    B(xi) <= bound(model, q_xi) <= max G-KL bound <= log Z,

the ordering the tests check.
"""

import equinox as eqx
import jax
import jax.numpy as jnp

from .. import potentials as P
from .._adjoint import envelope_value
from .._linalg import full_precision
from .._model import Model
from .._optim import default_tol
from .._program import program
from .._result import Result
from .._status import RESULTS
from .._validate import check_max_steps, check_tol
from ..solvers._iterate import Step, iterate
from . import _common as C
from ._site_bounds import is_supported, probit_coefficients, super_gaussian, tangent_coefficients

TRACE_COUNT = {"local": 0}


@full_precision
def local(model: Model, *, tol: float | None = None, max_steps: int = 1000) -> Result:
    """Maximise the local variational lower bound on log Z over the site-bound parameters xi (Challis & Barber
    2013, Section 5.1.1; Nickisch 2010, Ch. 3.3; module docstring). Stops when a plain EM step changes the bound
    by less than tol * (1 + |B|) or after `max_steps` evaluations; warns when it did not converge.

    Args:
        model: a `gkl_jax.Model` (sites without `variance_offset`).
        tol: relative bound change (default 1e-10 in float64, 1e-5 in float32).
        max_steps: bound evaluations (int >= 1, default 1000).

    Returns:
        `gkl_jax.Result` with q = N(A^{-1} b, A^{-1}) (a Full factor), `log_z` = B(xi) (a guaranteed lower bound,
        `is_bound=True`) and `history` the best bound after each evaluation. `log_z` has first derivatives in the
        model in forward and reverse mode (jax.grad; the envelope rule at fixed xi, exact as the iteration
        converges; second derivatives would miss dxi*/dtheta); q is differentiable in forward mode only (through
        the iterations).

    Raises:
        ValueError: potentials without a tight exponentiated-quadratic bound (Poisson, Custom), a model that
            cannot be fitted, or a bad tol or max_steps.

    Example:
        >>> import numpy as np, gkl_jax as gk
        >>> H = np.array([[1.0, 0.5], [-0.3, 1.0], [0.2, -1.0]])
        >>> model = gk.Model(gk.priors.Isotropic(2, 1.0), gk.Sites(H, gk.potentials.Logistic([1, -1, 1])))
        >>> approx = gk.local(model)
        >>> approx.is_bound, round(float(approx.log_z), 3)
        (True, -2.01)
        >>> bool(approx.log_z <= gk.fit(model).log_z)
        True
    """
    C.check_model(model, "local")
    for s in model.sites:
        if not is_supported(s.potential, "local"):
            super_gaussian(s.potential, "local")  # raises the ValueError naming the potential
    max_steps = check_max_steps(max_steps, "local: max_steps")
    dtype = C.dtype_of(model)
    tol = default_tol(dtype, float64=1e-10, float32=1e-5) if tol is None else check_tol(tol, "local: tol")
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


@program
def _local_jit(model, tol, max_steps):
    """One loop (`gkl_jax.solvers.iterate` over `_EM`) of over-relaxed EM (Salakhutdinov & Roweis 2003): from
    the best point xi_g found so far, xi <- xi_g + omega (EM(xi_g) - xi_g). A step that raises the bound is
    accepted and omega grows by 1.5 (up to 10); one that does not is rejected and the next step is the plain EM
    step (omega = 1), which never decreases B. history[k] is the best bound after evaluation k; the loop stops
    when a plain EM step changes B by at most tol (1 + |B|) (an over-relaxed step that gains so little is followed
    by a plain one), or after max_steps + 1 evaluations."""
    TRACE_COUNT["local"] += 1
    groups = C.operators(model)
    dtype = C.dtype_of(model)
    params0 = initial_parameters(model, groups, dtype)
    sol_dummy = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), jax.eval_shape(solve, model, groups, params0))[0]
    probit = [isinstance(pot, P.Probit) for _, _, pot in groups]

    start = _State(params0, params0, sol_dummy, jnp.asarray(-jnp.inf, dtype), jnp.ones((), dtype),
                   jnp.asarray(False), jnp.asarray(True), jnp.asarray(True))
    solution, state = iterate(_EM(model, groups, tuple(probit)), None, tol, max_steps,
                              init=(start, start.best_value))
    params, sol, value, hist = state.best_params, state.best_sol, state.best_value, solution.history
    # B is stationary in xi at the fixed point: its derivative in the model is the partial one at fixed xi (the
    # envelope rule, first derivatives only), evaluated outside the loop; q has the loop's (forward mode only).
    value = envelope_value(value, model, params, lambda m, p: solve(m, C.operators(m), p)[1])
    q = C.gaussian_of_precision(sol.mean, sol.precision)
    code = jnp.where(state.ok, solution.status, RESULTS.breakdown).astype(jnp.int32)
    return Result(q=q, log_z=value, status=code, num_steps=solution.num_steps, history=hist, method="local",
                  is_bound=True)


class _State(eqx.Module):
    """The carry of over-relaxed EM: the next tangent points, the best ones so far with their solution and bound,
    the relaxation omega."""

    params: list
    best_params: list
    best_sol: object
    best_value: jax.Array
    omega: jax.Array
    done: jax.Array     # a plain EM step changed B by at most tol (1 + |B|)
    ok: jax.Array       # the first evaluation succeeded (afterwards a failed one is only rejected)
    fresh: jax.Array    # before the first evaluation (of the start)


class _EM(eqx.Module):
    """Over-relaxed EM as a `gkl_jax.solvers.iterate` loop: an iteration evaluates the tangent points `params`
    (the first, the start) and proposes the next (`_local_jit`)."""

    model: object
    groups: list
    probit: tuple = eqx.field(static=True)
    monotone = True
    start_in_loop = True

    def step(self, problem, s, tol):
        sol, value = solve(self.model, self.groups, s.params)
        ok = sol.ok & jnp.isfinite(value)
        slack = tol * (1 + jnp.abs(value))
        accept = ok & (value >= s.best_value - slack)  # (equal up to round-off counts as no decrease)
        small = accept & (value - s.best_value <= slack)
        # only a plain EM step's small gain says the fixed point is reached; an over-relaxed step's may not
        done = small & (s.omega == 1)
        pick = lambda new, old: jax.tree.map(lambda a, b: jnp.where(accept, a, b), new, old)
        best_params, best_sol, best_value = pick((s.params, sol, value), (s.best_params, s.best_sol, s.best_value))
        omega = jnp.where(accept & ~small, jnp.minimum(1.5 * s.omega, 10.0), 1.0)
        em = _update(self.groups, best_sol)
        # Tangent points xi = E[r^2] must stay positive; the over-relaxed step is clipped at half the EM value.
        params = [jnp.where(is_probit, b + omega * (e - b), jnp.maximum(b + omega * (e - b), 0.5 * e))
                  for is_probit, b, e in zip(self.probit, best_params, em)]
        # The first evaluation fails only if the prior-tangent model is improper: then nothing is recoverable.
        new = _State(params, best_params, best_sol, best_value, omega, done, ok | ~s.fresh, jnp.asarray(False))
        return new, Step(best_value, jnp.asarray(True), ~s.fresh, jnp.abs(value - s.best_value))

    def terminate(self, problem, s, tol):
        return s.done & s.ok & jnp.isfinite(s.best_value), ~s.ok

    def point(self, s):
        return None

    def postprocess(self, problem, s, point):
        return point, None

