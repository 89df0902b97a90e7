"""The site-precision solver (Opper & Archambeau 2009; `SitePrecision`): G-KL for a GP or dense prior with one site
per latent variable, iterating on (m, W), S = (Sigma^{-1} + diag W)^{-1}, without forming C (the factorisations:
`gkl_jax.solvers._site_precision_parts`). For log-concave sites W >= 0; for non-log-concave ones W is signed, the
bound is not concave and the iteration finds a local optimum, which one depending on the start.

One step from (m, W), with Gamma at the current (m, diag S), alternates as the fixed-point solver does:

1. **Factor step.** W moves along W + t (Gamma - W), t = 1, 1/2, ..., to the first point where the bound does
   not decrease (an ascent direction: dB/dW . (Gamma - W) = 1/2 (Gamma - W)^T (S o S) (Gamma - W) >= 0).
2. **Mean step.** At the new factor, m <- m + t S g, g = dB/dm = E[log phi'] - alpha, with the fixed
   preconditioner S (the inverse Hessian up to the change of Gamma; O(n^2) per iteration) and halving, to
   max |g| <= max(tol, residual) / 10: loose while the factor is far from its fixed point.

The solver carries alpha = Sigma^{-1} (m - mu) beside m (as the thesis' code does, Nickisch 2010, Section 4.11, "to
avoid multiplications with K^{-1}"): each mean step moves it by Sigma^{-1} S g = g - W^{1/2} L^{-T} (V g), so
neither the steps nor `log_z` solve with Sigma, and the prior's Cholesky factor is used once per fit (alpha at the
start) and its inverse never.
In ML-II, where the prior is rebuilt at every outer step, this and `log_z` reusing the solver's quadrature made a
warm evaluation cheaper (design-decisions page).

Stops when max_j |dB/dm_j| max(|m_j|, sigma0) and max_j sqrt(S_jj) |W_j - Gamma_j| max(sqrt(S_jj), sigma0) are
both <= max(tol, 8 eps |B|). The second is an upper bound on max |dB/dC_ij| max(|C_ij|, sigma0) for the Full
factor C of S (dB/dC = C diag(W - Gamma), |C_ij| <= sqrt(S_jj)), so the returned factor C = chol-factor of
(Sigma^{-1} + diag W)^{-1} meets the scale-aware test of every other solver (`gkl_jax._optim.stationary`).

`SitePrecision.log_z` reports the bound through `_site_precision_parts.log_z` (its closed-form derivative in the
prior covariance; second derivatives through the implicit q, `site_precision_envelope`).
"""

import functools
from typing import Callable

import equinox as eqx
import jax
import jax.numpy as jnp
from jax import lax
from jax.flatten_util import ravel_pytree

from .._adjoint import solver_value, stop_gradients
from .._bound import bound
from .._optim import MAX_HALVINGS as _MAX_HALVINGS
from .._optim import MAX_STALLS as _MAX_STALLS
from .._optim import backtrack, no_decrease, scaled_gradient, stop_level
from ..factors import Full
from . import _site_precision_parts as sp
from ._base import AbstractIterativeSolver, Problem, Step
from ._iterate import iterate


class _State(eqx.Module):
    """The carry of the site-precision iteration: the mean (m, alpha), the site precisions and what the stopping
    test and the next step need at them."""

    x: tuple            # (m, alpha), alpha = Sigma^{-1} (m - mu)
    W: jax.Array
    f: jax.Array        # the bound
    g: jax.Array        # dB/dm
    gamma: jax.Array    # Gamma at (m, diag S)
    s_diag: jax.Array
    logdet: jax.Array   # log det(Sigma^{-1} S)
    L: jax.Array        # the factor of B (G for signed W)
    sites: jax.Array    # sum_n E[log phi_n]
    stalls: jax.Array   # -1 before the first iteration (which evaluates the start)


class SitePrecision(AbstractIterativeSolver):
    """Alternating ascent on the n site precisions W of S = (Sigma^{-1} + diag W)^{-1} and the mean, for a GP or
    dense prior with one site per latent variable (`Sites(None, ...)`, h_n = e_n; Opper & Archambeau 2009): one
    Cholesky factorisation of I + W^{1/2} Sigma W^{1/2} per step, the Full factor C formed once at the end. The
    default for the Full factor on such log-concave models.

    Non-log-concave sites (Student-t, Cauchy: robust GP regression) have signed W and one factorisation of
    I + L^T diag(W) L (Sigma = L L^T) per step. There it is 3-20x faster than the default whitened L-BFGS then
    Newton-CG and reaches the same optimum on 23 of the 25 GP cases of `benchmarks/robust_defaults.py`, but on two
    (N = 200, site scale 0.01, lengthscale 10, 20% outliers) it ends 3 and 31 nats lower, at another local
    optimum, so it is not `fit`'s default there; `gp.fit_hyperparameters` runs it by default in ML-II's inner fits
    on such models, each warm-started from the last optimum (`gkl_jax._warm.ml2_solver`).

    Attributes:
        tol: gradient tolerance (None: the dtype's default).
        max_steps: the most outer steps (None: 500).
    """

    default_max_steps = 500

    def check(self, model, factor) -> None:
        if not isinstance(factor, Full):
            raise ValueError(f"solver SitePrecision() needs a Full factor, got {type(factor).__name__}")
        if not sp.applies(model):
            raise ValueError("solver SitePrecision() needs a GP or Dense prior and sites with H = None (h_n = e_n)")

    def init(self, problem, tol, max_steps):
        return start_state(sp.initial_point(problem.model, problem.to_q(problem.x0)))

    def step(self, problem, state, tol):
        return _step(problem.model, state, tol, problem.scale)

    def terminate(self, problem, state, tol):
        s = state
        converged = (_residual(s.x, s.g, s.W, s.gamma, s.s_diag, problem.scale) <= stop_level(s.f, tol)) \
            & jnp.isfinite(s.f)
        return converged, s.stalls >= _MAX_STALLS

    def point(self, state):
        return state.x[0]

    def postprocess(self, problem, state, point):
        q0 = problem.to_q(problem.x0)
        flat = ravel_pytree(eqx.filter(sp.posterior(problem.model.prior, q0, point, state.W),
                                                        eqx.is_inexact_array))[0]
        return flat, (state.W, state.logdet, state.s_diag, state.L, state.x[1], state.sites)

    def log_z(self, model, q, solution):
        """The closed-form envelope of `site_precision_envelope` (its derivatives), with the value of the bound
        at q itself."""
        W, *parts = solution.extras
        value = site_precision_envelope(model, q, W, tuple(parts))
        return value + lax.stop_gradient(bound(stop_gradients(model), lax.stop_gradient(q)) - value)


def start_state(start):
    """The initial (state, placeholder value) of the iteration from `start` = (m0, alpha0, W0) (`initial_point`
    gives it for a Gaussian q0, `point` for a mean and site precisions)."""
    m0, alpha0, W0 = start
    dtype, n_sites = W0.dtype, W0.shape[0]
    zeros, scalar = jnp.zeros(n_sites, dtype), jnp.zeros((), dtype)    # placeholders until the first iteration
    state = _State((m0, alpha0), W0, scalar - jnp.inf, zeros, zeros, zeros, scalar,
                   jnp.zeros((n_sites, n_sites), dtype), scalar, jnp.asarray(-1, jnp.int32))
    return state, scalar - jnp.inf


def site_precision(model, start, tol, max_steps, scale=1.0):
    """The iteration (module doc) from `start` = (m0, alpha0, W0), alpha0 = Sigma^{-1} (m0 - mu), without forming C.

    Returns (m, num_steps, converged, history) like the solvers of `gkl_jax.solvers`, (W, log det(Sigma^{-1} S),
    diag S, L, alpha, sum_n E[log phi_n]) at the returned m (W for `posterior`, which forms the Full factor of S,
    and the rest for `log_z`), and the estimated gap to the optimum there (`gap`). `scale` is sigma0 of the
    stopping test (module doc)."""
    problem = Problem(model, None, None, scale)
    solution, s = iterate(SitePrecision(), problem, tol, max_steps, init=start_state(start), postprocess=False)
    gap = sp.gap(model.prior.covariance, s.W, s.L, s.g, sp.target(s.gamma, not model.log_concave), s.s_diag,
                 not model.log_concave)
    return (s.x[0], solution.num_steps, solution.converged, solution.history,
            (s.W, s.logdet, s.s_diag, s.L, s.x[1], s.sites), gap)


def site_precision_envelope(model, q, W, parts):
    """The site-precision solver's bound at its (m, W, parts), taken as functions of the implicit q: first
    derivatives are the closed form's, second ones are exact (the envelope rule differentiated through dq*/dtheta).

    Args:
        model: the `Model`.
        q: the optimum `Gaussian` (with its implicit derivative).
        W: (n,) the site precisions; parts: the solver's factorisation at the optimum.

    Returns:
        Scalar: the bound.
    """
    W, parts = solver_value((W, parts), model, q, recompute=sp.optimum_parts)
    return sp.log_z(model, q.mean, W, parts)


def _residual(x, g, W, gamma, s_diag, scale):
    """The stopping statistic (module doc): the scaled gradient in m and the factor's bound on it in C."""
    sd = jnp.sqrt(s_diag)
    return jnp.maximum(scaled_gradient(g, x[0], scale), jnp.max(sd * jnp.abs(W - gamma) * jnp.maximum(sd, scale)))


def _step(model, state, tol, scale):
    """One outer step (module doc) of `SitePrecision`; the first (stalls = -1) evaluates the start: a factor
    "step" to W0 itself and no mean step, so the program holds one copy of the factorisation and two of the
    quadrature, not two and three."""
    prior = model.prior
    K = prior.covariance
    n = K.shape[0]
    signed = not model.log_concave
    LK = prior.cholesky() if signed else None
    parts = lambda W: sp.parts(K, W, LK)
    mean_terms = lambda x, s_diag: sp.mean_terms(prior, model.sites, x, s_diag)
    residual = functools.partial(_residual, scale=scale)

    def m_scale(x):
        """max_j max(|m_j|, sigma0): a raw max|g| below T / m_scale(x) meets the scaled test at T."""
        return jnp.maximum(jnp.max(jnp.abs(x[0])), scale)

    x, W, f, g, gamma, s_diag, logdet, L, sites, stalls = (state.x, state.W, state.f, state.g, state.gamma,
                                                           state.s_diag, state.logdet, state.L, state.sites,
                                                           state.stalls)
    fresh = stalls < 0
    # Signed W (non-log-concave sites): the start's W0 is reached from max(W0, 0), which is always valid, by
    # halving until S is positive definite (a warm start's W0 from another prior need not be).
    target = jnp.where(fresh, W, sp.target(gamma, signed))
    W = jnp.where(fresh, jnp.maximum(W, 0.0), W) if signed else W
    # Round-off of B: f sums O(n + sum W S_nn) terms (entropy, trace, sites) that largely cancel, and the
    # prior's quadratic form carries the condition number of Sigma (Table 1's Laplace fits: +-1e-11 at f = -106).
    noise = 1024 * jnp.finfo(f.dtype).eps * (1 + jnp.abs(f) + n + jnp.sum(W * s_diag))

    # Factor step: W + t (Gamma - W), t = 1, 1/2, ..., until the bound does not decrease. Each trial also
    # gives the m-terms (value, gradient, d/d diag S) at the new factor, where the mean step starts.
    def factor_trial(t):
        W_t = W + t * (target - W)
        logdet_t, s_diag_t, V_t, L_t = parts(W_t)
        terms = mean_terms(x, s_diag_t)
        return sp.bound_value(W_t, logdet_t, s_diag_t, terms[0]), (W_t, logdet_t, s_diag_t, V_t, L_t, terms)

    def accept(t, out):
        start_ok = (fresh & jnp.isfinite(out[0])) if signed else fresh
        return start_ok | no_decrease(out[0], f, noise)

    dummy = (W, logdet, s_diag, L, L, (f, g, (-0.5 * gamma, sites)))
    t, (f_t, (W_v, logdet_t, s_diag_t, V_t, L_t, terms_t)), accepted = backtrack(
        factor_trial, accept, (f, dummy), dtype=f.dtype, max_halvings=_MAX_HALVINGS)
    t = jnp.where(accepted, t, 0.0)
    W_t = W + t * (target - W)
    # Mean step at S = (Sigma^{-1} + diag W_t)^{-1}, preconditioned by S (O(n^2) per iteration), to
    # max |g| <= max(tol, residual) / 10: loose while the factor is far from its fixed point. (After a failed
    # factor step the parts are those of its last trial W_v = W + 2^-30 (Gamma - W); the direction uses W_v
    # with them, so that m and alpha move together exactly.)
    mean_tol = 0.1 * jnp.maximum(stop_level(f, tol), residual(x, g, W, gamma, s_diag)) / m_scale(x)
    x_new, (value_m, g_new, (b_new, sites_new)) = _mean_steps(
        lambda xx: mean_terms(xx, s_diag_t), x, terms_t,
        functools.partial(sp.preconditioned, K, W_v, V_t, L_t, signed),
        jnp.where(fresh, jnp.inf, mean_tol), noise)
    f_new, gamma_new = sp.bound_value(W_t, logdet_t, s_diag_t, value_m), -2 * b_new
    ok = no_decrease(f_new, f, noise)
    r_old, r_new = residual(x, g, W, gamma, s_diag), residual(x_new, g_new, W_t, gamma_new, s_diag_t)
    progress = ok & ((f_new > f) | (r_new < r_old))
    new = (x_new, W_t, f_new, g_new, gamma_new, s_diag_t, logdet_t, L_t, sites_new)
    old = (x, W, f, g, gamma, s_diag, logdet, L, sites)
    kept = jax.tree.map(lambda a, b: jnp.where(ok | fresh, a, b), new, old)
    state = _State(*kept, jnp.where(progress | fresh, 0, stalls + 1))
    return state, Step(state.f, jnp.array(True), ~fresh, residual(state.x, state.g, state.W, state.gamma,
                                                                   state.s_diag))


_MAX_MEAN_STEPS = 20


class _MeanState(eqx.Module):
    """The carry of `_MeanSteps`: the mean x, its terms (value, gradient in m, aux) and whether the last step made
    progress."""

    x: tuple
    current: tuple
    go: jax.Array


class _MeanSteps(AbstractIterativeSolver):
    """The mean step of one outer step (module doc) as a nested `iterate` loop: quasi-Newton ascent m <- m + t S g
    on m -> B(m) at a fixed factor (concave for log-concave sites), with the fixed preconditioner S (the inverse
    Hessian up to the change of Gamma) and halving until the value does not decrease by more than its round-off
    `noise`. Stops at max|g| <= tol, when a step neither raises the value nor lowers max|g|, or at the step
    limit. The mean is a pytree x (here (m, alpha)) moving along precond(g) (here (S g, Sigma^{-1} S g)).

    Attributes:
        terms: x -> (value, gradient in m, aux).
        precond: g -> the direction (a pytree like x).
        noise: the round-off of the value (scalar).
    """

    terms: Callable = eqx.field(kw_only=True)     # keyword-only: after the solver fields tol, max_steps
    precond: Callable = eqx.field(kw_only=True)
    noise: jax.Array = eqx.field(kw_only=True)
    start_in_loop = False
    stop_on_nonfinite = False   # a non-finite trial fails the halving (no progress), which stops the loop

    def init(self, problem, tol, max_steps):
        """From `problem` = (x0, terms(x0))."""
        x0, start = problem
        return _MeanState(x0, start, jnp.array(True)), start[0]

    def step(self, problem, state, tol):
        x, current = state.x, state.current
        f, g, _ = current
        p = self.precond(g)
        step = lambda t: jax.tree.map(lambda a, b: a + t * b, x, p)

        # t = 1, 1/2, ...: the first trial is made inside the loop, so the quadrature has one call site here
        t, trial, ok = backtrack(lambda t: self.terms(step(t)), lambda t, out: no_decrease(out[0], f, self.noise),
                                 current, dtype=f.dtype, max_halvings=_MAX_HALVINGS)
        progress = ok & ((trial[0] > f) | (jnp.max(jnp.abs(trial[1])) < jnp.max(jnp.abs(g))))
        x_new, current_new = jax.tree.map(lambda a, b: jnp.where(ok, a, b), (step(t), trial), (x, current))
        return _MeanState(x_new, current_new, progress), Step(current_new[0], jnp.asarray(True),
                                                              jnp.asarray(True), jnp.max(jnp.abs(current_new[1])))

    def terminate(self, problem, state, tol):
        # not (max|g| > tol): a NaN gradient stops the loop
        return ~(jnp.max(jnp.abs(state.current[1])) > tol), ~state.go

    def point(self, state):
        return state.x


def _mean_steps(terms, x0, start, precond, tol, noise):
    """Up to _MAX_MEAN_STEPS steps of `_MeanSteps` from x0 (`terms(x)` = (value, gradient in m, aux), `start` =
    terms(x0)); returns the last accepted x and its terms."""
    solver = _MeanSteps(terms=terms, precond=precond, noise=noise)
    # a nested `iterate` (inside the outer one's step), as `gkl_jax.baselines`' double loop runs its inner Newton
    _, state = iterate(solver, (x0, start), tol, _MAX_MEAN_STEPS, postprocess=False)
    return state.x, state.current
