"""The site-precision solver: G-KL for a dense prior with one site per latent variable (Gaussian processes).

With h_n = e_n (`Sites(None, ...)`) the stationary covariance of eq. 10 (Challis & Barber 2013) is

    S = (Sigma^{-1} + diag(W))^{-1},    W_n = Gamma_n = -E[(log phi_n)''(m_n + z s_n)] >= 0,

so the optimal Full factor is determined by n site precisions W (Opper & Archambeau 2009; the KL method of
Nickisch 2010, Section 4.5, uses the same parametrisation). For non-log-concave sites (Student-t, Cauchy) the
stationary S has the same form with Gamma_n of either sign (an outlier's Gamma_n < 0), so W is signed there and
the factorisation below is replaced by B = I + L_Sigma^T diag(W) L_Sigma with Sigma = L_Sigma L_Sigma^T (`_parts`;
about 3x the flops, and the bound is NaN, so a trial rejected, wherever S is not positive definite). The bound
is then not concave and the iteration finds a local optimum: which one depends on the start.

The solver iterates on (m, W) and never forms C: with B = I + W^{1/2} Sigma W^{1/2} = L L^T and
V = L^{-1} W^{1/2} Sigma,

    diag S = diag Sigma - colsum(V^2),         S v = Sigma v - V^T (V v),
    log det(Sigma^{-1} S) = -2 sum log diag L,  tr(Sigma^{-1} S) = n - sum_n W_n S_nn,

one Cholesky factorisation and one triangular solve with n right-hand sides per step (Nickisch 2010, eq. 3.9 is the
same factorisation for the Laplace approximation), against the fixed-point solver's dense precision, Cholesky,
triangular inverse and O(n^3) bound gradient.

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

`fit` reports log Z through `log_z(model, m, W, parts)`: the same bound from (m, W) and the solver's alpha and
quadrature (no further quadrature), whose derivative in the prior covariance is the closed form
1/2 (alpha alpha^T - W^{1/2} B^{-1} W^{1/2}) (App. F.2 at S = (Sigma^{-1} + W)^{-1}), so an ML-II gradient costs
one triangular solve instead of reverse mode through the prior's Cholesky factor and L^{-1} .
"""

import functools

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.scipy.linalg as jsl
from jax import lax

from ._linalg import diagonal, invert_lower, lower_gram, solve_lower, tdot
from ._optim import MAX_HALVINGS as _MAX_HALVINGS
from ._optim import MAX_STALLS as _MAX_STALLS
from ._optim import backtrack, no_decrease, scaled_gradient, stop_level
from .operators import Identity


def applies(model) -> bool:
    """Whether the model has the structure the solver needs: a prior with a dense covariance and only
    identity site projections (h_n = e_n), at least one group of them."""
    return has_dense_prior(model) and bool(model.sites) and all(isinstance(s.operator(model.dim), Identity)
                                                                for s in model.sites)


def has_dense_prior(model) -> bool:
    """Whether the prior has a dense covariance Sigma (`GP`, `Dense`)."""
    return model.prior is not None and hasattr(model.prior, "covariance")


def initial_point(model, q0):
    """(m, alpha, W) from a Full-factor Gaussian q0: its mean, alpha = Sigma^{-1} (m - mu) and the fixed-point
    precisions W = Gamma at its mean and marginal variances (of q0 nothing else is used)."""
    m0 = q0.mean
    b = jax.grad(functools.partial(_sites_value, model.sites), argnums=1)(m0, q0.factor.marginal_variances())
    return point(model, m0, jnp.maximum(-2 * b, 0.0))


def point(model, m, W):
    """The solver's start (m, alpha, W) at a given mean and site precisions: alpha = Sigma^{-1} (m - mu) by two
    triangular solves with the prior's Cholesky factor (the inverse factor is not formed)."""
    return m, jsl.cho_solve((model.prior.cholesky(), True), m - model.prior.mean), W


def site_precision(model, start, tol, max_steps, scale=1.0):
    """Iterate on (m, W) from `start` = (m0, alpha0, W0), alpha0 = Sigma^{-1} (m0 - mu) (module doc; `initial_point`
    gives it for a Gaussian q0).

    Returns (m, num_steps, converged, history) like the solvers of `gkl_jax.solvers`, (W, log det(Sigma^{-1} S),
    diag S, L, alpha, sum_n E[log phi_n]) at the returned m (W for `posterior`, which forms the Full factor of S,
    and the rest for `log_z`), and the estimated gap to the optimum there (`gap`). `scale` is sigma0 of the
    stopping test (module doc)."""
    prior = model.prior
    K = prior.covariance
    n = K.shape[0]
    signed = not model.log_concave
    LK = prior.cholesky() if signed else None

    parts = lambda W: _parts(K, W, LK)
    mean_terms = lambda x, s_diag: _mean_terms(prior, model.sites, x, s_diag)

    def residual(x, g, W, gamma, s_diag):
        sd = jnp.sqrt(s_diag)
        return jnp.maximum(scaled_gradient(g, x[0], scale),
                           jnp.max(sd * jnp.abs(W - gamma) * jnp.maximum(sd, scale)))

    def m_scale(x):
        """max_j max(|m_j|, sigma0): a raw max|g| below T / m_scale(x) meets the scaled test at T."""
        return jnp.maximum(jnp.max(jnp.abs(x[0])), scale)

    # The start is evaluated by the loop's first iteration (stalls = -1 marks it): a factor "step" to W0 itself
    # and no mean step, so the program holds one copy of the factorisation and two of the quadrature, not two and
    # three.
    def cond(state):
        x, W, f, g, gamma, s_diag, _, _, _, k, hist, stalls = state
        return (stalls < 0) | ((stalls < _MAX_STALLS) & (k < max_steps)
                               & (residual(x, g, W, gamma, s_diag) > stop_level(f, tol)))

    def body(state):
        x, W, f, g, gamma, s_diag, logdet, L, sites, k, hist, stalls = state
        fresh = stalls < 0
        # Signed W (non-log-concave sites): the start's W0 is reached from max(W0, 0), which is always valid, by
        # halving until S is positive definite (a warm start's W0 from another prior need not be).
        target = jnp.where(fresh, W, _target(gamma, signed))
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
            return _bound_value(W_t, logdet_t, s_diag_t, terms[0]), (W_t, logdet_t, s_diag_t, V_t, L_t, terms)

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
            functools.partial(_preconditioned, K, W_v, V_t, L_t, signed),
            jnp.where(fresh, jnp.inf, mean_tol), noise)
        f_new, gamma_new = _bound_value(W_t, logdet_t, s_diag_t, value_m), -2 * b_new
        ok = no_decrease(f_new, f, noise)
        r_old, r_new = residual(x, g, W, gamma, s_diag), residual(x_new, g_new, W_t, gamma_new, s_diag_t)
        progress = ok & ((f_new > f) | (r_new < r_old))
        new = (x_new, W_t, f_new, g_new, gamma_new, s_diag_t, logdet_t, L_t, sites_new)
        old = (x, W, f, g, gamma, s_diag, logdet, L, sites)
        kept = jax.tree.map(lambda a, b: jnp.where(ok | fresh, a, b), new, old)
        k_new = k + (~fresh).astype(k.dtype)
        return kept + (k_new, hist.at[k_new].set(kept[2]), jnp.where(progress | fresh, 0, stalls + 1))

    m0, alpha0, W0 = start
    dtype, n_sites = W0.dtype, W0.shape[0]
    zeros, scalar = jnp.zeros(n_sites, dtype), jnp.zeros((), dtype)    # placeholders until the first iteration
    hist0 = jnp.full((max_steps + 1,), jnp.nan, dtype=dtype)
    init = ((m0, alpha0), W0, scalar - jnp.inf, zeros, zeros, zeros, scalar, jnp.zeros((n_sites, n_sites), dtype),
            scalar, jnp.zeros((), jnp.int32), hist0, jnp.asarray(-1, jnp.int32))
    (m, alpha), W, f, g, gamma, s_diag, logdet, L, sites, k, hist, _ = lax.while_loop(cond, body, init)
    converged = (residual((m, alpha), g, W, gamma, s_diag) <= stop_level(f, tol)) & jnp.isfinite(f)
    return (m, k, converged, hist, (W, logdet, s_diag, L, alpha, sites),
            gap(K, W, L, g, _target(gamma, signed), s_diag, signed))


def _target(gamma, signed):
    """The site precisions W that the factor step moves to: Gamma itself for signed W (non-log-concave sites), else
    Gamma clamped at 0 (Gamma >= 0 for log-concave sites up to round-off)."""
    return gamma if signed else jnp.maximum(gamma, 0.0)


def _preconditioned(K, W, V, L, signed, g):
    """The mean step's direction S g in both coordinates of the mean: (S g, Sigma^{-1} S g) with
    S g = Sigma g - V^T (V g) and Sigma^{-1} S g = (I + diag(W) Sigma)^{-1} g = g - W^{1/2} L^{-T} (V g) (Woodbury;
    V g = L^{-1} W^{1/2} Sigma g), so alpha = Sigma^{-1} (m - mu) follows m without a solve with Sigma. `signed`
    (`_parts` with S = G G^T, G in V's place): S g = G (G^T g) and Sigma^{-1} S g = g - W S g."""
    if signed:
        s_g = V @ (V.T @ g)
        return s_g, g - W * s_g
    y = V @ g
    return K @ g - tdot(V, y), g - jnp.sqrt(W) * jsl.solve_triangular(L, y, lower=True, trans="T")


def gap(K, W, L, g, gamma, s_diag, signed=False):
    """To second order, how far the bound at (m, W) lies below its optimum: the mean's Newton decrement
    1/2 g^T S g (-d^2B/dm^2 = S^{-1} up to the change of Gamma; S = Sigma - Sigma W^{1/2} B^{-1} W^{1/2} Sigma, two
    matrix-vector products and one triangular solve with the factor L of B) plus the factor step's
    1/4 sum_j S_jj^2 (Gamma_j - W_j)^2 (dB/dW = 1/2 (S o S)(Gamma - W) with curvature -1/2 S o S, diagonal part).
    At inner tolerance tol the second term dominates: on sonar's ML-II ~1e-7, the size of the jitter in log Z
    between nearby hyperparameters, where the mean's decrement was 1e-13. `signed`: L is `_parts`' G (S = G G^T),
    and the decrement 1/2 |G^T g|^2."""
    if signed:
        return 0.5 * jnp.sum(jnp.square(L.T @ g)) + 0.25 * jnp.sum(jnp.square(s_diag * (gamma - W)))
    Kg = K @ g
    u = solve_lower(L, jnp.sqrt(W) * Kg)
    return 0.5 * jnp.maximum(g @ Kg - u @ u, 0.0) + 0.25 * jnp.sum(jnp.square(s_diag * (gamma - W)))


def posterior(prior, q0, m, W):
    """q = N(m, S), S = (Sigma^{-1} + diag W)^{-1}, with q0's Full factor type: C is the upper-triangular factor of
    the inverse of Sigma^{-1} + diag W (`Full.fixed_point`, 3.3 n^3 flops)."""
    factor = q0.factor.fixed_point(prior, [Identity(m.shape[0])], [W])
    return eqx.tree_at(lambda r: (r.mean, r.factor), q0, (m, factor))


def _parts(K, W, LK=None):
    """(log det(Sigma^{-1} S), diag S, V, L) for S = (Sigma^{-1} + diag W)^{-1}: B = I + W^{1/2} Sigma W^{1/2} = L L^T,
    V = L^{-1} W^{1/2} Sigma (module doc).

    Given the prior's Cholesky factor LK (Sigma = LK LK^T), W may have negative entries (the site precisions of
    non-log-concave sites, Opper & Archambeau 2009): B = I + LK^T diag(W) LK = R R^T, S = G G^T with G = LK R^{-T},
    log det(Sigma^{-1} S) = -2 sum log diag R, and G stands in both for V and L. Where S is not positive definite
    the Cholesky factorisation gives NaN, and so does the bound: the solver's line searches reject that W."""
    if LK is not None:
        R = jnp.linalg.cholesky(jnp.eye(K.shape[0], dtype=K.dtype) + tdot(LK, W[:, None] * LK))
        G = lax.linalg.triangular_solve(R, LK, left_side=False, lower=True, transpose_a=True)
        s_diag = jnp.sum(jnp.square(G), axis=1)
        return -2 * jnp.sum(jnp.log(diagonal(R))), jnp.maximum(s_diag, jnp.finfo(K.dtype).tiny), G, G
    sw = jnp.sqrt(W)
    eye = jnp.eye(K.shape[0], dtype=K.dtype)
    L = jnp.linalg.cholesky(eye + sw[:, None] * K * sw[None, :])
    V = solve_lower(L, sw[:, None] * K)
    diag_K = diagonal(K)
    s_diag = diag_K - jnp.sum(jnp.square(V), axis=0)
    # The difference cancels where W_n Sigma_nn is large (relative error ~ eps W_n Sigma_nn: a GP variance of
    # 1e20 made it 1e6). There W_n S_nn = 1 - (B^{-1})_nn gives S_nn without cancellation; its triangular
    # inverse is formed only when some site needs it.
    big = W * diag_K * jnp.finfo(K.dtype).eps > _CANCELLATION

    def stable(s):
        b_inv = jnp.sum(jnp.square(invert_lower(L)), axis=0)
        return jnp.where(big, (1 - b_inv) / jnp.where(big, W, 1), s)

    s_diag = lax.cond(jnp.any(big), stable, lambda s: s, s_diag)
    return -2 * jnp.sum(jnp.log(diagonal(L))), jnp.maximum(s_diag, jnp.finfo(K.dtype).tiny), V, L


_CANCELLATION = 1e-8
"""eps W_n Sigma_nn above which diag S is taken from diag B^{-1} (`_parts`)."""


def _sites_value(sites, m, s_diag):
    """sum_n E[log phi_n(m_n + z s_n)] with s_n^2 = S_nn (h_n = e_n)."""
    return sum(jnp.sum(s.potential.expected_log_phi(m + s.offset, s_diag + s.variance_offset)) for s in sites)


def _mean_terms(prior, sites, x, s_diag):
    """The terms of B that depend on the mean x = (m, alpha), alpha = Sigma^{-1} (m - mu), at fixed diag S:
    (sum_n E[log phi_n] - 1/2 (m - mu)^T alpha, its gradient rho - alpha in m, (the sites' gradient in diag S,
    sum_n E[log phi_n])), rho = dE[log phi]/dm; one quadrature of order 2 gives them all."""
    m, alpha = x
    value, (rho, b) = jax.value_and_grad(functools.partial(_sites_value, sites), argnums=(0, 1))(m, s_diag)
    return value - 0.5 * (m - prior.mean) @ alpha, rho - alpha, (b, value)


def _bound_value(W, logdet, s_diag, mean_value):
    """B = 1/2 log det(Sigma^{-1} S) + n/2 - 1/2 tr(Sigma^{-1} S) + mean_value, with tr(Sigma^{-1} S) =
    n - sum_n W_n S_nn."""
    return 0.5 * logdet + 0.5 * jnp.sum(W * s_diag) + mean_value


def optimum_parts(model, q):
    """(W, (log det(Sigma^{-1} S), diag S, L, alpha, sum_n E[log phi_n])) at the solver's optimum q, recomputed from q
    and the model: W = Gamma(m, diag S) and alpha = Sigma^{-1} (m - mu) = dE[log phi]/dm, the two stationarity
    conditions, so no solve with Sigma (`gkl_jax._fit` differentiates it for second derivatives of `log_z`)."""
    m = q.mean
    rho, b = jax.grad(functools.partial(_sites_value, model.sites), argnums=(0, 1))(m, q.factor.marginal_variances())
    signed = not model.log_concave
    W = _target(-2 * b, signed)
    logdet, s_diag, _, L = _parts(model.prior.covariance, W, model.prior.cholesky() if signed else None)
    return W, (logdet, s_diag, L, rho, _sites_value(model.sites, m, s_diag))


@eqx.filter_custom_jvp
def log_z(model, m, W, parts):
    """The bound at q = N(m, (Sigma^{-1} + diag W)^{-1}): the value of `bound(model, q)` for the q the solver
    returns, differentiable in the model at fixed q (the envelope theorem, App. F.2). Its derivative in the
    prior covariance has the closed form

        dB/dSigma = 1/2 (alpha alpha^T - R),   R = Sigma^{-1} - Sigma^{-1} S Sigma^{-1} = W^{1/2} B^{-1} W^{1/2},

    (Woodbury; R = W - W S W for signed W, `_parts`), one triangular solve with L instead of differentiating the
    prior's Cholesky factorisation and L^{-1}; dB/dmu = alpha, and the sites are differentiated at fixed
    (m, diag S). The prior enters through its `covariance` and `mean` only. m, W and `parts` =
    (log det(Sigma^{-1} S), diag S, L, alpha = Sigma^{-1} (m - mu), sum_n E[log phi_n] at (m, diag S)), as the
    solver returns them, are held fixed (pass them through `lax.stop_gradient`): the value needs no quadrature and
    no solve with Sigma, and the derivative a quadrature only where a likelihood parameter is differentiated."""
    return _log_z_value(model, m, W, parts)


def _log_z_value(model, m, W, parts):
    """B from the solver's parts: the prior terms from (log det, diag S, alpha), the sites' from their value."""
    logdet, s_diag, _, alpha, sites_value = parts
    return _bound_value(W, logdet, s_diag, sites_value - 0.5 * (m - model.prior.mean) @ alpha)


@log_z.def_jvp
def _log_z_jvp(primals, tangents):
    model, m, W, parts = primals
    _, s_diag, L, alpha, _ = parts
    t_model = tangents[0]
    if t_model is None:
        t_model = jax.tree.map(lambda _: None, model)
    f = _log_z_value(model, m, W, parts)
    tangent = 0.0
    if any(t is not None for t in jax.tree.leaves(t_model.sites, is_leaf=lambda x: x is None)):
        dynamic, static = eqx.partition(model.sites, eqx.is_inexact_array)
        t_sites = jax.tree.map(lambda x, t: x if x is None else (jnp.zeros_like(x) if t is None else t), dynamic,
                               t_model.sites, is_leaf=lambda x: x is None)
        tangent = jax.jvp(lambda dyn: _sites_value(eqx.combine(dyn, static), m, s_diag), (dynamic,), (t_sites,))[1]
    if t_model.prior is not None and t_model.prior.covariance is not None:
        if model.log_concave:
            R = lower_gram(invert_lower(L) * jnp.sqrt(W).astype(L.dtype))   # (L^{-1} W^{1/2})^T (L^{-1} W^{1/2})
        else:                                                                # L is G (S = G G^T): R = W - W S W
            WG = W[:, None] * L
            R = jnp.diag(W) - WG @ WG.T
        dK = t_model.prior.covariance
        tangent = tangent + 0.5 * (alpha @ dK @ alpha - jnp.sum(R * dK))
    if t_model.prior is not None and t_model.prior.mean is not None:
        tangent = tangent + alpha @ t_model.prior.mean
    return f, jnp.asarray(tangent, f.dtype)


_MAX_MEAN_STEPS = 20


def _mean_steps(terms, x0, start, precond, tol, noise):
    """Quasi-Newton ascent m <- m + t S g on m -> B(m) at a fixed factor (concave for log-concave sites), with the fixed
    preconditioner S (the inverse Hessian up to the change of Gamma) and halving until the value does not
    decrease by more than its round-off `noise`; stops at max|g| <= tol, when a step neither raises the value
    nor lowers max|g|, or after _MAX_MEAN_STEPS. The mean is a pytree x (here (m, alpha)) moving along
    precond(g) (here (S g, Sigma^{-1} S g)); `terms(x)` = (value, gradient in m, aux) and `start` = terms(x0);
    returns the last accepted x and its terms."""

    def cond(state):
        x, (f, g, _), k, go = state
        return go & (k < _MAX_MEAN_STEPS) & (jnp.max(jnp.abs(g)) > tol)

    def body(state):
        x, current, k, _ = state
        f, g, _ = current
        p = precond(g)
        step = lambda t: jax.tree.map(lambda a, b: a + t * b, x, p)

        # t = 1, 1/2, ...: the first trial is made inside the loop, so the quadrature has one call site here
        t, trial, ok = backtrack(lambda t: terms(step(t)), lambda t, out: no_decrease(out[0], f, noise), current,
                                 dtype=f.dtype, max_halvings=_MAX_HALVINGS)
        progress = ok & ((trial[0] > f) | (jnp.max(jnp.abs(trial[1])) < jnp.max(jnp.abs(g))))
        kept = jax.tree.map(lambda a, b: jnp.where(ok, a, b), (step(t), trial), (x, current))
        return *kept, k + 1, progress

    x, current, _, _ = lax.while_loop(cond, body, (x0, start, 0, jnp.array(True)))
    return x, current
