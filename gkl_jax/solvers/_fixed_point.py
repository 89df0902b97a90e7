"""The fixed-point solver for factors with a closed-form optimal covariance (`AbstractFixedPointFactor`).

Alternating maximisation of the G-KL bound B(m, C) (Challis & Barber 2013, eq. 7), one outer step:

1. **Factor step.** With Gamma_nn = -E[(log phi_n)''(m_n + z s_n)] = -2 dI_n/d(s_n^2) at the current (m, C), the
   stationary covariance of eq. 10 (Challis & Barber 2013, with Gamma >= 0 for log-concave sites) is

       S* = (Sigma^{-1} + sum_groups H^T diag(Gamma) H)^{-1},     C* = factor.fixed_point(prior, H, Gamma),

   the exact optimum of C for frozen Gamma. The factor moves along C + rho (C* - C), rho in {1, 1/2, ...}, to
   the first point where the bound does not decrease.
2. **Mean step.** With the factor fixed the s_n^2 are fixed, and B is a concave (log-concave sites) function of m
   alone, B(m) = -1/2 (m - mu)^T Sigma^{-1} (m - mu) + sum_n I_n(h_n^T m, s_n^2) + const, evaluated in O(N D).
   It is maximised by Newton-CG with Hessian-vector products -Sigma^{-1} v + H^T (E[log phi''] . H v) and the
   preconditioner S = C^T C of the new factor (the inverse Hessian up to the change of Gamma), with Armijo
   backtracking, to the stopping test at tol / 10.

Stops at the scale-aware test max_i |dB/dx_i| max(|x_i|, sigma0) <= max(tol, 8 eps |B|) over x = (m, C)
(`gkl_jax._optim.stationary`), or after three consecutive steps that neither raise the bound nor lower
the gradient (round-off), reporting converged=False then.

Optimising m to convergence for each factor (cheap: no O(N D^2) products) is what makes the outer iteration
fast: the factor fixed point then contracts at the rate of d Gamma / d S alone, about 0.3 per step on the
logistic benchmark (9 outer steps to max|grad| <= 1e-4 at D = 500, N = 2500), where the previous joint damped
step contracted by about 0.6 (31 steps). Each outer step costs five products of the size of H C^T: the two of
the factor's `variance_path` (H C^T and H C*^T, after which every trial factor's s_n^2 costs O(N D)), the
weighted Gram matrix of the fixed point, and the forward and adjoint products of the value-and-gradient pass at
the new point (plus O(D^3) for the factor's Cholesky and triangular inverse); every trial point, of the factor
step or of a mean step, costs one O(N D) projection and one quadrature.

The compiled program has one copy of the quadrature: the trials of an outer step (factor step, then mean steps)
are the iterations of one trial loop, which also evaluates the start (`fixed_point`): the first fit compiles in
about two thirds of the time of the nested loops it replaced (docs: design decisions). Its line searches are
`gkl_jax._optim`'s backtracking rule (the tests `no_decrease` and `sufficient_increase`, at most `MAX_HALVINGS`
halvings), interleaved in that loop's state instead of called as `backtrack`, which would hold a second copy.
"""

import equinox as eqx
import jax
import jax.numpy as jnp
from jax import lax
from jax.flatten_util import ravel_pytree

from .._optim import MAX_HALVINGS as _MAX_HALVINGS
from .._optim import MAX_STALLS as _MAX_STALLS
from .._optim import (
    conjugate_gradient,
    max_abs,
    no_decrease,
    roundoff,
    scaled_gradient,
    stationary,
    sufficient_increase,
)
from ..factors import AbstractFixedPointFactor
from ._base import AbstractIterativeSolver, Step, check_setting

_MAX_MEAN_STEPS = 50


def _to_flat(q):
    return ravel_pytree(eqx.filter(q, eqx.is_inexact_array))[0]


def _prior_mean_terms(prior, m):
    """(-1/2 (m - mu)^T Sigma^{-1} (m - mu), its gradient -Sigma^{-1} (m - mu)); zeros without a prior."""
    if prior is None:
        return jnp.zeros((), m.dtype), jnp.zeros_like(m)
    p = prior.precision_mv(m - prior.mean)
    return -0.5 * (m - prior.mean) @ p, -p


class _Trials(eqx.Module):
    """The carry of the trial loop of one outer step (`fixed_point`)."""

    phase: jax.Array        # 0: factor step, 1: mean Newton step, 2: done
    step: jax.Array         # the trial step: rho in the factor phase, t in the mean phase
    halvings: jax.Array     # halvings of the current line search so far
    rho: jax.Array          # the factor step taken (after the factor phase)
    s2s: list               # the site variances at that factor (fixed in the mean phase)
    mean: jax.Array         # the mean phase's last accepted m
    moms: list              # the site moments there
    value: jax.Array        # the mean objective there
    direction: jax.Array    # the Newton direction p
    slope: jax.Array        # g^T p
    mean_steps: jax.Array   # mean Newton steps concluded


class _Outer(eqx.Module):
    """The carry of the outer loop: q as (m, C), the bound and its gradient in the same structure, the site
    moments and variances there."""

    mean: jax.Array
    factor: object
    f: jax.Array
    g: object
    moms: list
    s2s: list
    stalls: jax.Array
    fresh: jax.Array        # before the first iteration (which evaluates the start)


def fixed_point(model, to_q, flat0, tol, max_cg=100, scale=1.0):
    """Alternating factor fixed point / mean Newton-CG (module doc) from the flat parameters `flat0`: the
    (init, step, converged) functions of its outer loop, which `FixedPoint` runs in `iterate`.

    Every site quantity comes from `expected_log_phi_moments` (E[log phi], E[log phi'], E[log phi''] from one
    quadrature): the gradient in m is H^T E[log phi'] - Sigma^{-1} (m - mu), the Hessian-vector product in m is
    H^T (E[log phi''] . H v) - Sigma^{-1} v, Gamma = -E[log phi''] and dB/ds_n^2 = E[log phi''] / 2.

    The compiled program is small: one outer loop whose body runs one trial loop, and every trial of the outer
    step (the factor step's rho = 1, 1/2, ..., then each mean Newton step's t = 1, 1/2, ...) is one iteration of
    that loop, with the program's only copy of the quadrature. The start is the outer loop's first iteration (its
    trial loop evaluates the site moments at the start and stops). Along the factor step the site variances come
    from the factor's `variance_path` (O(N D) per trial for the Full factor).

    Args:
        model: the (gradient-free) `Model`.
        to_q: the map from flat parameters (P,) to the Gaussian q.
        flat0: (P,) the start.
        tol: the tolerance of the stopping test (`gkl_jax._optim.stationary`).
        max_cg: the most CG iterations per mean Newton step.
        scale: sigma0, the variables' typical scale (scalar).

    Returns:
        (init, step, converged): init() -> the `_Outer` state at the start (not yet evaluated); step(state) ->
        (state, `Step`); converged(state) -> the stopping test there.
    """
    ops = [s.operator(model.dim) for s in model.sites]
    q_template = to_q(flat0)
    gaussian = lambda mean, factor: eqx.tree_at(lambda r: (r.mean, r.factor), q_template, (mean, factor))
    dtype = flat0.dtype
    zero = jnp.zeros((), dtype)

    def variances(factor):
        """s_n^2 per group for a factor (the O(N D^2) products for a full factor)."""
        return [factor.project_variances(op) + s.variance_offset for s, op in zip(model.sites, ops)]

    def moments(mean, s2s):
        """(3, N_g) per group: E[log phi], E[log phi'], E[log phi''] at m_n = h_n^T m + offset, s_n^2."""
        return [s.potential.expected_log_phi_moments(op.mv(mean) + s.offset, s2)
                for s, op, s2 in zip(model.sites, ops, s2s)]

    def sites_value(moms):
        return sum((jnp.sum(mo[0]) for mo in moms), zero)     # a float zero: a prior-only model has no sites

    def sites_grad(moms, mean):
        return sum((op.rmv(mo[1]) for op, mo in zip(ops, moms)), jnp.zeros_like(mean))

    def rest(mean, factor):
        """Entropy and prior term of eq. 7."""
        q = gaussian(mean, factor)
        value = q.entropy()
        return value if model.prior is None else value + model.prior.expected_log_density(q)

    def evaluate(mean, factor, moms):
        """B and its gradient (in m, in the factor's arrays) at (mean, factor) from the site moments there (no
        quadrature)."""
        _, pullback = jax.vjp(variances, factor)
        value, (g_mean, g_factor) = jax.value_and_grad(rest, argnums=(0, 1))(mean, factor)
        g_mean = g_mean + sites_grad(moms, mean)
        (g_sites,) = pullback([0.5 * mo[2] for mo in moms])
        g_factor = jax.tree.map(lambda a, b: a + b, g_factor, g_sites)
        return value + sites_value(moms), (g_mean, eqx.filter(g_factor, eqx.is_inexact_array))

    def mean_terms(m, moms):
        """The terms of B that depend on m at fixed s_n^2, and their gradient."""
        prior_value, prior_grad = _prior_mean_terms(model.prior, m)
        return prior_value + sites_value(moms), prior_grad + sites_grad(moms, m)

    def trials(q, target, f, moms_x, s2s_x, is_init):
        """The factor step C + rho (C* - C), rho = 1, 1/2, ... until the bound does not decrease (none: the factor
        stays), then Newton-CG on the concave m -> B(m) at the fixed s_n^2 with the preconditioner S of the new
        factor and Armijo backtracking, until the stopping test at tol / 10 holds or a step fails to raise B. At
        the start (`is_init`) only the first trial, which is the start itself (target = C)."""
        paths = [q.factor.variance_path(op, target) for op in ops]
        noise = roundoff(f)
        mean_tol = 0.1 * tol

        def body(st):
            in_factor = st.phase == 0
            along = lambda: [path(st.step) + s.variance_offset for path, s in zip(paths, model.sites)]
            s2s = lax.cond(in_factor, along, lambda: st.s2s)    # the factor step's s_n^2; fixed in the mean phase
            mean = jnp.where(in_factor, q.mean, st.mean + st.step * st.direction)
            moms = moments(mean, s2s)
            value = mean_terms(mean, moms)[0]
            # the factor step's test: B does not decrease (beyond round-off); at the start anything goes
            factor_value = lax.cond(in_factor, lambda: rest(q.mean, q.factor.interpolate(target, st.step)),
                                    lambda: zero) + sites_value(moms)
            factor_ok = is_init | no_decrease(factor_value, f, noise)
            # the mean step's test: Armijo (or no decrease where the predicted gain is round-off)
            mean_ok = sufficient_increase(value, st.value, st.step, st.slope) | (
                (st.slope <= roundoff(st.value)) & no_decrease(value, st.value, 0.0))
            concluded = jnp.where(in_factor, factor_ok, mean_ok) | (st.halvings >= _MAX_HALVINGS)
            # a concluded factor step: a failed one keeps the factor and the site moments at x
            factor_done = in_factor & concluded
            rho = jnp.where(factor_done, jnp.where(factor_ok, st.step, 0.0), st.rho)
            # a concluded mean step moves where B does not decrease; the next one follows where it rose
            mean_done = ~in_factor & concluded
            moved = mean_done & jnp.isfinite(value) & (value >= st.value)
            mean_steps = st.mean_steps + mean_done
            # (m, site moments, s2s) after the trial: the trial's (an accepted factor step, a mean step that moved),
            # x's (a failed factor step) or the carried ones; one conditional picks the buffers
            source = jnp.where(factor_done, jnp.where(factor_ok, 1, 2), jnp.where(moved, 1, 0))
            m_new, moms_new, s2s_new = lax.switch(source, [lambda: (st.mean, st.moms, st.s2s),
                                                           lambda: (mean, moms, s2s),
                                                           lambda: (q.mean, moms_x, s2s_x)])
            again = (factor_done & ~is_init) | (moved & (value > st.value) & (mean_steps < _MAX_MEAN_STEPS))
            # the next Newton direction (CG does nothing where its right-hand side is zero)
            f_m, g_m = mean_terms(m_new, moms_new)
            newton = again & ~stationary(g_m, m_new, f_m, mean_tol, scale)
            curvatures = [mo[2] for mo in moms_new]

            def neg_hvp(v):
                out = sum((op.rmv(c * op.mv(v)) for op, c in zip(ops, curvatures)), jnp.zeros_like(v))
                prior_v = jnp.zeros_like(v) if model.prior is None else model.prior.precision_mv(v)
                return prior_v - out

            forcing = jnp.minimum(0.1, jnp.sqrt(jnp.linalg.norm(g_m)))
            precond = q.factor.interpolate(target, rho).covariance_mv
            p = conjugate_gradient(neg_hvp, jnp.where(newton, g_m, 0.0), max_iters=max_cg, rtol=forcing,
                                   precond=precond)
            phase = jnp.where(concluded, jnp.where(newton, 1, 2), st.phase)
            return _Trials(phase, jnp.where(concluded, 1.0, 0.5 * st.step).astype(dtype),
                           jnp.where(concluded, 0, st.halvings + 1), rho, s2s_new, m_new, moms_new,
                           jnp.where(newton, f_m, st.value), jnp.where(newton, p, st.direction),
                           jnp.where(newton, g_m @ p, st.slope), mean_steps)

        init = _Trials(jnp.zeros((), jnp.int32), jnp.ones((), dtype), jnp.zeros((), jnp.int32), zero, s2s_x,
                       q.mean, moms_x, zero, jnp.zeros_like(q.mean), zero, jnp.zeros((), jnp.int32))
        # separate loop: the trials of one outer step, an inner loop of `iterate`'s iteration, not a solver of its own
        st = lax.while_loop(lambda st: st.phase < 2, body, init)
        return st.mean, q.factor.interpolate(target, st.rho), st.moms, st.s2s

    # The outer loop carries q as (m, C) and the gradient in the same structure (flattened once, at the end).
    arrays = lambda factor: eqx.filter(factor, eqx.is_inexact_array)

    def converged(st):
        return stationary(st.g, (st.mean, arrays(st.factor)), st.f, tol, scale)

    def step(st):
        mean_x, factor_x, f, g, moms, s2s = st.mean, st.factor, st.f, st.g, st.moms, st.s2s
        q = gaussian(mean_x, factor_x)
        is_init = st.fresh
        # C*: the stationary factor for the site curvatures at x; at the start the start itself
        target = lax.cond(is_init, lambda: q.factor,
                          lambda: q.factor.fixed_point(model.prior, ops, [-mo[2] for mo in moms]))
        mean, factor, moms_new, s2s_new = trials(q, target, f, moms, s2s, is_init)
        f_new, g_new = evaluate(mean, factor, moms_new)
        ok = is_init | no_decrease(f_new, f, roundoff(f))
        progress = ok & ((f_new > f) | (max_abs(g_new) < max_abs(g)))
        mean, factor, f_kept, g_new, moms_new, s2s_new = lax.cond(
            ok, lambda: (mean, factor, f_new, g_new, moms_new, s2s_new), lambda: (mean_x, factor_x, f, g, moms, s2s))
        new = _Outer(mean, factor, f_kept, g_new, moms_new, s2s_new, jnp.where(progress | is_init, 0, st.stalls + 1),
                     jnp.array(False))
        statistic = scaled_gradient(g_new, (mean, arrays(factor)), scale)
        return new, Step(f_kept, jnp.array(True), ~is_init, statistic)

    def init():
        q0 = to_q(flat0)
        s2s0 = jax.eval_shape(variances, q0.factor)
        moms0 = jax.eval_shape(moments, q0.mean, s2s0)
        zeros = lambda tree: jax.tree.map(lambda a: jnp.zeros(a.shape, a.dtype), tree)
        g0 = zeros((q0.mean, arrays(q0.factor)))
        return _Outer(q0.mean, q0.factor, jnp.array(-jnp.inf, dtype), g0, zeros(moms0), zeros(s2s0),
                      jnp.zeros((), jnp.int32), jnp.array(True))

    return init, step, converged


class FixedPoint(AbstractIterativeSolver):
    """Alternating factor fixed point (eq. 10) and mean Newton-CG (`fixed_point`): the default for the Full and
    Diagonal factors (those with a closed-form stationary factor, `AbstractFixedPointFactor`) on log-concave
    models.

    Attributes:
        tol: gradient tolerance (None: the dtype's default).
        max_steps: the most outer steps (None: 500).
        max_cg: the most CG iterations per mean Newton step.
    """

    max_cg: int = 100
    default_max_steps = 500

    def __check_init__(self):
        check_setting(self.max_cg, "max_cg", self)

    def check(self, model, factor) -> None:
        if not isinstance(factor, AbstractFixedPointFactor):
            raise ValueError(f"solver FixedPoint() needs a Full or Diagonal factor, got {type(factor).__name__}")
        if not model.log_concave:
            raise ValueError("solver FixedPoint() needs log-concave potentials (Gamma_nn >= 0)")

    def _loop(self, problem, tol):
        return fixed_point(problem.model, problem.to_q, problem.x0, tol, max_cg=self.max_cg, scale=problem.scale)

    def init(self, problem, tol, max_steps):
        state = self._loop(problem, tol)[0]()
        return state, state.f

    def step(self, problem, state, tol):
        return self._loop(problem, tol)[1](state)

    def terminate(self, problem, state, tol):
        return self._loop(problem, tol)[2](state), state.stalls >= _MAX_STALLS

    def point(self, state):
        return state.mean, state.factor

    def postprocess(self, problem, state, point):
        q = eqx.tree_at(lambda r: (r.mean, r.factor), problem.to_q(problem.x0), point)
        return _to_flat(q), None
