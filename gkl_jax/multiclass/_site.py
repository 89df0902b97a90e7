"""The per-datum bound of Theorem 6 on the expected log-softmax, its updates, and the comparison bounds.

For one datum with Gaussian marginal q(f) = N(m, V) over its C latent values (Chai 2012, Section 2.3.1):

    h(y; q, b, S) = C/2 + 1/2 log|S V| - 1/2 tr(S V) + m^T y - log sum_c g^c                      (eq. 19)
    g^c = exp[m^T e^c + 1/2 (b - e^c)^T S^{-1} (b - e^c)]                                         (eq. 16)

and ell(y; q) = E_q[log softmax(f)_y] >= h for every b in R^C and S > 0; h is jointly concave in (b, S) (Lemma 25).
The label y enters only through m^T y, so one optimisation in (b, S) serves every class (eq. 24).

Updates (Section 3.1-3.2, App. C.1): b^fx = gbar (Lemma 26) with a Newton fall-back, and the closed-form
S^fx = L^{-T} P (Lambda + I/4)^{1/2} + I/2) P^T L^{-1} with V = L L^T, P Lambda P^T = eig(L^T A L) (eq. 61), each
taken as a monotone step along the segment to the candidate (`monotone_step`: the first of t = 1, 1/2, 1/4, ...
that does not lower the bound).

Comparison bounds: the Jensen bounds (9) and (10), the Knowles-Minka bound h(b, S = V^{-1}) (Section 2.3.1, the
NCVMP bound when V is diagonal), the upper bound of Lemma 7, and a Monte Carlo estimate of ell itself.
"""

import functools

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.scipy.linalg as jsl

from .._linalg import diagonal
from .._optim import backtrack
from ..solvers import AbstractIterativeSolver, Step, iterate

STEP_HALVINGS = 10
"""The most halvings of a step (t >= 1/1024): near the optimum round-off makes every step fail, and each trial of
the V step re-forms V; the shared solvers' 30 halvings cost iris fits ~15% of their time in such searches."""


def _sym(X):
    return 0.5 * (X + jnp.swapaxes(X, -1, -2))


def _logdet_pd(X):
    return 2.0 * jnp.sum(jnp.log(diagonal(jnp.linalg.cholesky(X))), axis=-1)


def monotone_step(trial, value0, init, *, skip=False):
    """The first step t in {1, 1/2, 1/4, ...} along which the objective does not decrease (the shared
    `gkl_jax._optim.backtrack`), so that every block-coordinate update is monotone whatever round-off does.

    Args:
        trial: t -> (value, aux): the objective at step t and what the caller re-uses from that evaluation.
        value0: the objective at t = 0 (scalar array).
        init: (value0, aux at t = 0), returned when no step is accepted or when `skip`.
        skip: a traced bool: take no step and evaluate nothing.

    Returns:
        (t, (value, aux)): the accepted step and the evaluation there, or (0, init) when no step of at most
        `STEP_HALVINGS` halvings raised (or kept) the objective.
    """
    dtype = jnp.result_type(value0)
    accept = lambda t, out: jnp.isfinite(out[0]) & (out[0] >= value0)
    t, out, ok = backtrack(trial, accept, init, dtype=dtype, max_halvings=STEP_HALVINGS, skip=skip)
    keep = ok & ~jnp.asarray(skip, bool)
    out = jax.tree.map(lambda a, b: jnp.where(keep, a, b), out, init)
    return jnp.where(keep, t, 0.0), out


def log_g(m, b, S):
    """log g^c = m^c + 1/2 (b - e^c)^T S^{-1} (b - e^c) for c = 1..C (eq. 16); shape (C,)."""
    C = m.shape[-1]
    D = b[None, :] - jnp.eye(C, dtype=m.dtype)  # row c: (b - e^c)^T
    L = jnp.linalg.cholesky(S)
    Z = jsl.solve_triangular(L, D.T, lower=True)
    return m + 0.5 * jnp.sum(Z * Z, axis=0)


def site_statistics(m, b, S):
    """(gbar, A): the normalised g (eq. 17) and A = sum_c gbar^c (b - e^c)(b - e^c)^T (eq. 18)."""
    C = m.shape[-1]
    gbar = jax.nn.softmax(log_g(m, b, S))
    D = b[None, :] - jnp.eye(C, dtype=m.dtype)
    return gbar, D.T @ (gbar[:, None] * D)


def site_bound_free(m, V, b, S):
    """h(y; q, b, S) - m^T y: the label-free part of eq. 19 (identical for every probed class)."""
    C = m.shape[-1]
    return (0.5 * C + 0.5 * (_logdet_pd(S) + _logdet_pd(V)) - 0.5 * jnp.sum(S * V)
            - jax.nn.logsumexp(log_g(m, b, S)))


def site_bound(y, m, V, b, S):
    """The lower bound h(y; q, b, S) <= E_{N(f | m, V)}[log softmax(f)^T y] of Theorem 6 (eq. 19).

    y: (C,) one-hot (or any probed e^c); m: (C,); V, S: (C, C) positive definite; b: (C,)."""
    return site_bound_free(m, V, b, S) + m @ y


def s_fixed_point(V, A):
    """The maximiser in S of h for fixed A (Lemma 28, eq. 61): the solution of -S V S + S + A = 0."""
    L = jnp.linalg.cholesky(V)
    lam, P = jnp.linalg.eigh(_sym(L.T @ A @ L))
    lam_tilde = jnp.sqrt(jnp.maximum(lam, 0.0) + 0.25) + 0.5
    X = jsl.solve_triangular(L, P, lower=True, trans="T")  # L^{-T} P
    return _sym((X * lam_tilde) @ X.T)


def s_fixed_point_profile(V, A):
    """S^fx (eq. 61) with what is needed for its sensitivity to V at fixed A: (S^fx, G, phi), G = L^{-T} P.

    Differentiating -S V S + S + A = 0 gives the Sylvester equation (I/2 - S V) dS + dS (I/2 - V S) = S dV S; in
    the basis G its solution is elementwise, and the profiled W^* = S^fx(V) - V^{-1} moves by
    dW^* = G [(G^T dV G) o phi] G^T with phi_ab = (1 - l_a)(1 - l_b) / (1 - l_a - l_b), l = diag(Lambda tilde)."""
    L = jnp.linalg.cholesky(V)
    lam, P = jnp.linalg.eigh(_sym(L.T @ A @ L))
    lt = jnp.sqrt(jnp.maximum(lam, 0.0) + 0.25) + 0.5
    G = jsl.solve_triangular(L, P, lower=True, trans="T")
    phi = (1 - lt[:, None]) * (1 - lt[None, :]) / (1 - lt[:, None] - lt[None, :])
    return _sym((G * lt) @ G.T), G, phi


def profile_sensitivity(G, phi, dV):
    """dW^* = G [(G^T dV G) o phi] G^T: the change of S^fx(V) - V^{-1} for a change dV of V (A fixed)."""
    return G @ ((G.T @ dV @ G) * phi) @ G.T


def b_newton_direction(b, gbar, S_inv):
    """-[I + (Gbar - gbar gbar^T) S^{-1}]^{-1} (b - gbar): the Newton direction in b (Section 3.1)."""
    C = b.shape[-1]
    D = jnp.diag(gbar) - jnp.outer(gbar, gbar)
    return -jnp.linalg.solve(jnp.eye(C, dtype=b.dtype) + D @ S_inv, b - gbar)


class SiteOptimum(eqx.Module):
    """The maximiser (b, S) of h for one Gaussian marginal N(m, V), the maximum of the label-free part
    `value` = max h - m^T y, and the solver's bookkeeping (`status` a `gkl_jax.RESULTS` code)."""

    b: jax.Array
    S: jax.Array
    value: jax.Array
    converged: jax.Array
    num_steps: jax.Array
    status: jax.Array


class _SiteProblem(eqx.Module):
    m: jax.Array
    V: jax.Array
    b: jax.Array
    S: jax.Array


class _SiteState(eqx.Module):
    b: jax.Array
    S: jax.Array
    value: jax.Array
    prev: jax.Array     # h before the last step (inf before the first)


class SiteAscent(AbstractIterativeSolver):
    """Alternating b and S updates of one datum's site bound h (`b_step`, `s_step`; Section 3.1-3.2), run by
    `gkl_jax.solvers.iterate` until one step raises h by at most tol (1 + |h|)."""

    start_in_loop = False

    def init(self, problem, tol, max_steps):
        value = site_bound_free(problem.m, problem.V, problem.b, problem.S)
        return _SiteState(problem.b, problem.S, value, jnp.asarray(jnp.inf, value.dtype)), value

    def step(self, problem, state, tol):
        b, v1 = b_step(problem.m, problem.V, state.b, state.S, state.value)
        S, v2 = s_step(problem.m, problem.V, b, state.S, v1)
        rise = jnp.abs(v2 - state.value) / (1 + jnp.abs(v2))
        return _SiteState(b, S, v2, state.value), Step(v2, jnp.asarray(True), jnp.asarray(True), rise)

    def terminate(self, problem, state, tol):
        return jnp.abs(state.value - state.prev) <= tol * (1 + jnp.abs(state.value)), jnp.asarray(False)

    def point(self, state):
        return state


def initial_site_parameters(V):
    """b = 1/C (a point of the simplex, Section 3.1) and S = V^{-1} + (I/C - 11^T/C^2) (App. E.3.1, gamma = 1)."""
    C = V.shape[-1]
    eye = jnp.eye(C, dtype=V.dtype)
    W = eye / C - jnp.ones((C, C), V.dtype) / C**2
    return jnp.full((C,), 1.0 / C, V.dtype), _sym(jnp.linalg.inv(V) + W)


def b_step(m, V, b, S, val):
    """One safeguarded update of b: the fixed point b = gbar when it does not lower h, else Newton (Section 3.1)."""
    gbar, _ = site_statistics(m, b, S)
    f = lambda bb: site_bound_free(m, V, bb, S)
    val_fx = f(gbar)
    fx_ok = jnp.isfinite(val_fx) & (val_fx >= val)
    d = b_newton_direction(b, gbar, jnp.linalg.inv(S))
    eta, (val_nr, _) = monotone_step(lambda t: (f(b + t * d), ()), val, (val, ()))
    b_new = jnp.where(fx_ok, gbar, b + eta * d)
    return b_new, jnp.where(fx_ok, val_fx, val_nr)


def s_step(m, V, b, S, val):
    """One safeguarded update of S towards S^fx (eq. 61, App. C.1)."""
    _, A = site_statistics(m, b, S)
    S_fx = s_fixed_point(V, A)
    f = lambda t: (site_bound_free(m, V, b, (1 - t) * S + t * S_fx), ())
    eta, (val_new, _) = monotone_step(f, val, (val, ()))
    return _sym((1 - eta) * S + eta * S_fx), val_new


@functools.partial(jax.jit, static_argnames=("max_steps",))
def optimise_site(m, V, b=None, S=None, *, tol=1e-12, max_steps=500):
    """Maximise h over (b, S) for one marginal N(m, V) by alternating the b and S updates; vmap over data.

    Starts from (b, S) when given (warm start), else from `initial_site_parameters`. Stops when one sweep raises
    the bound by at most tol * (1 + |h|), after `max_steps` sweeps or at a non-finite h (`SiteAscent` in
    `gkl_jax.solvers.iterate`). Returns a `SiteOptimum`.
    """
    if b is None or S is None:
        b0, S0 = initial_site_parameters(V)
        b = b0 if b is None else b
        S = S0 if S is None else S
    sol, st = iterate(SiteAscent(), _SiteProblem(m, V, b, S), jnp.asarray(tol, V.dtype), max_steps,
                      postprocess=False)
    return SiteOptimum(b=st.b, S=st.S, value=st.value, converged=sol.converged, num_steps=sol.num_steps,
                       status=sol.status)


@functools.partial(jax.jit, static_argnames=("max_steps",))
def expected_log_softmax_bound(y, m, V, *, tol=1e-12, max_steps=500):
    """The lower bound max_{b, S} h(y; N(m, V), b, S) <= E_{N(f | m, V)}[log softmax(f)_y] (Chai 2012, Theorem 6,
    eq. 19, at its optimum over the site parameters).

    Args:
        y: (C,) float one-hot label (any e^c).
        m: (C,) float mean of the latent values.
        V: (C, C) float positive definite covariance.
        tol: the alternating updates stop when one raises h by at most tol (1 + |h|).
        max_steps: the most updates (static int).

    Returns:
        Float scalar array.
    """
    return optimise_site(m, V, tol=tol, max_steps=max_steps).value + m @ y


def jensen_bound(y, m, V, *, variant=9):
    """The Jensen bounds on ell: eq. (9) (h at b = y, S = V^{-1}) or eq. (10) (b = 0, S = V^{-1})."""
    if variant not in (9, 10):
        raise ValueError(f"variant must be 9 or 10 (the paper's equation numbers), got {variant!r}")
    b = y if variant == 9 else jnp.zeros_like(y)
    return knowles_minka_bound(y, m, V, b)


def knowles_minka_bound(y, m, V, b):
    """h(y; q, b, V^{-1}) = m^T y - log sum_c exp[m^c + 1/2 (b - e^c)^T V (b - e^c)] (Section 2.3.1); with diagonal
    V this is the bound of Knowles and Minka (2011, eq. 12)."""
    C = m.shape[-1]
    D = b[None, :] - jnp.eye(C, dtype=m.dtype)
    return m @ y - jax.nn.logsumexp(m + 0.5 * jnp.einsum("ca,ab,cb->c", D, V, D))


def softmax_upper_bound(y, m):
    """log p(y | m) = m^T y - log sum_c exp(m^c) >= ell(y; q) (Lemma 7)."""
    return m @ y - jax.nn.logsumexp(m)


@functools.partial(jax.jit, static_argnames=("num_samples",))
def expected_log_softmax_mc(key, y, m, V, num_samples=100_000):
    """Monte Carlo estimate (mean, standard error) of ell(y; q) = E_{N(f | m, V)}[log softmax(f)^T y] (eq. 8)."""
    L = jnp.linalg.cholesky(V)
    z = jax.random.normal(key, (num_samples, m.shape[-1]), dtype=m.dtype)
    f = m + z @ L.T
    vals = f @ y - jax.nn.logsumexp(f, axis=-1)
    return jnp.mean(vals), jnp.std(vals) / jnp.sqrt(num_samples)
