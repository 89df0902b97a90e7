"""The linear algebra of the site-precision solver (`gkl_jax.solvers._site_precision`): G-KL for a dense prior
with one site per latent variable (Gaussian processes), parametrised by site precisions W.

With h_n = e_n (`Sites(None, ...)`) the stationary covariance of eq. 10 (Challis & Barber 2013) is

    S = (Sigma^{-1} + diag(W))^{-1},    W_n = Gamma_n = -E[(log phi_n)''(m_n + z s_n)] >= 0,

so the optimal Full factor is determined by n site precisions W (Opper & Archambeau 2009; the KL method of
Nickisch 2010, Section 4.5, uses the same parametrisation). For non-log-concave sites (Student-t, Cauchy) the
stationary S has the same form with Gamma_n of either sign (an outlier's Gamma_n < 0), so W is signed there and
the factorisation below is replaced by B = I + L_Sigma^T diag(W) L_Sigma with Sigma = L_Sigma L_Sigma^T (`parts`;
about 3x the flops, and the bound is NaN, so a trial rejected, wherever S is not positive definite).

With B = I + W^{1/2} Sigma W^{1/2} = L L^T and V = L^{-1} W^{1/2} Sigma,

    diag S = diag Sigma - colsum(V^2),         S v = Sigma v - V^T (V v),
    log det(Sigma^{-1} S) = -2 sum log diag L,  tr(Sigma^{-1} S) = n - sum_n W_n S_nn,

one Cholesky factorisation and one triangular solve with n right-hand sides per step (Nickisch 2010, eq. 3.9 is the
same factorisation for the Laplace approximation).

`log_z(model, m, W, parts)` is the bound from (m, W) and the solver's alpha = Sigma^{-1} (m - mu) and quadrature (no
further quadrature), whose derivative in the prior covariance is the closed form
1/2 (alpha alpha^T - W^{1/2} B^{-1} W^{1/2}) (App. F.2 at S = (Sigma^{-1} + W)^{-1}), so an ML-II gradient costs
one triangular solve instead of reverse mode through the prior's Cholesky factor and L^{-1}.
"""

import functools

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.scipy.linalg as jsl
from jax import lax

from .._linalg import diagonal, invert_lower, lower_gram, solve_lower, tdot
from ..operators import Identity


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
    b = jax.grad(functools.partial(sites_value, model.sites), argnums=1)(m0, q0.factor.marginal_variances())
    return point(model, m0, jnp.maximum(-2 * b, 0.0))


def point(model, m, W):
    """The solver's start (m, alpha, W) at a given mean and site precisions: alpha = Sigma^{-1} (m - mu) by two
    triangular solves with the prior's Cholesky factor (the inverse factor is not formed)."""
    return m, jsl.cho_solve((model.prior.cholesky(), True), m - model.prior.mean), W


def target(gamma, signed):
    """The site precisions W that the factor step moves to: Gamma itself for signed W (non-log-concave sites), else
    Gamma clamped at 0 (Gamma >= 0 for log-concave sites up to round-off)."""
    return gamma if signed else jnp.maximum(gamma, 0.0)


def preconditioned(K, W, V, L, signed, g):
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


def parts(K, W, LK=None):
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


def sites_value(sites, m, s_diag):
    """sum_n E[log phi_n(m_n + z s_n)] with s_n^2 = S_nn (h_n = e_n)."""
    return sum(jnp.sum(s.potential.expected_log_phi(m + s.offset, s_diag + s.variance_offset)) for s in sites)


def mean_terms(prior, sites, x, s_diag):
    """The terms of B that depend on the mean x = (m, alpha), alpha = Sigma^{-1} (m - mu), at fixed diag S:
    (sum_n E[log phi_n] - 1/2 (m - mu)^T alpha, its gradient rho - alpha in m, (the sites' gradient in diag S,
    sum_n E[log phi_n])), rho = dE[log phi]/dm; one quadrature of order 2 gives them all."""
    m, alpha = x
    value, (rho, b) = jax.value_and_grad(functools.partial(sites_value, sites), argnums=(0, 1))(m, s_diag)
    return value - 0.5 * (m - prior.mean) @ alpha, rho - alpha, (b, value)


def bound_value(W, logdet, s_diag, mean_value):
    """B = 1/2 log det(Sigma^{-1} S) + n/2 - 1/2 tr(Sigma^{-1} S) + mean_value, with tr(Sigma^{-1} S) =
    n - sum_n W_n S_nn."""
    return 0.5 * logdet + 0.5 * jnp.sum(W * s_diag) + mean_value


def optimum_parts(model, q):
    """(W, (log det(Sigma^{-1} S), diag S, L, alpha, sum_n E[log phi_n])) at the solver's optimum q, recomputed from q
    and the model: W = Gamma(m, diag S) and alpha = Sigma^{-1} (m - mu) = dE[log phi]/dm, the two stationarity
    conditions, so no solve with Sigma (`site_precision_envelope` differentiates it for second derivatives of
    `log_z`)."""
    m = q.mean
    rho, b = jax.grad(functools.partial(sites_value, model.sites), argnums=(0, 1))(m, q.factor.marginal_variances())
    signed = not model.log_concave
    W = target(-2 * b, signed)
    logdet, s_diag, _, L = parts(model.prior.covariance, W, model.prior.cholesky() if signed else None)
    return W, (logdet, s_diag, L, rho, sites_value(model.sites, m, s_diag))


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
    return log_z_value(model, m, W, parts)


def log_z_value(model, m, W, parts):
    """B from the solver's parts: the prior terms from (log det, diag S, alpha), the sites' from their value."""
    logdet, s_diag, _, alpha, sites_value = parts
    return bound_value(W, logdet, s_diag, sites_value - 0.5 * (m - model.prior.mean) @ alpha)


@log_z.def_jvp
def _log_z_jvp(primals, tangents):
    model, m, W, parts = primals
    _, s_diag, L, alpha, _ = parts
    t_model = tangents[0]
    if t_model is None:
        t_model = jax.tree.map(lambda _: None, model)
    f = log_z_value(model, m, W, parts)
    tangent = 0.0
    if any(t is not None for t in jax.tree.leaves(t_model.sites, is_leaf=lambda x: x is None)):
        dynamic, static = eqx.partition(model.sites, eqx.is_inexact_array)
        t_sites = jax.tree.map(lambda x, t: x if x is None else (jnp.zeros_like(x) if t is None else t), dynamic,
                               t_model.sites, is_leaf=lambda x: x is None)
        tangent = jax.jvp(lambda dyn: sites_value(eqx.combine(dyn, static), m, s_diag), (dynamic,), (t_sites,))[1]
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
