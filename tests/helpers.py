"""Shared oracles and problem generators for the tests."""

import jax.numpy as jnp
import numpy as np

import gkl_jax as gk


def tol(dtype) -> float:
    """Default comparison tolerance for a floating dtype."""
    return 1e-8 if jnp.finfo(dtype).bits >= 64 else 1e-4


def logistic_problem(dim=4, num=12, variance=2.0, seed=0):
    """A small Bayesian logistic regression model (prior N(0, variance I)) and its data."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(num, dim))
    y = np.where(rng.uniform(size=num) < 1 / (1 + np.exp(-X @ rng.normal(size=dim))), 1.0, -1.0)
    model = gk.Model(gk.priors.Isotropic(dim=dim, variance=variance), gk.Sites(X, gk.potentials.Logistic(y)))
    return model, X, y


def gaussian_log_evidence(H, y, noise_variance, prior_cov, prior_mean=None):
    """Exact log N(y | H mu, H Sigma H^T + v I) and the exact posterior (mean, covariance)."""
    H = np.asarray(H)
    mu = np.zeros(H.shape[1]) if prior_mean is None else np.asarray(prior_mean)
    K = H @ prior_cov @ H.T + np.diag(np.broadcast_to(noise_variance, (H.shape[0],)))
    r = y - H @ mu
    log_z = -0.5 * (r @ np.linalg.solve(K, r) + np.linalg.slogdet(2 * np.pi * K)[1])
    P = np.linalg.inv(prior_cov) + H.T @ (H / np.broadcast_to(noise_variance, (H.shape[0],))[:, None])
    cov = np.linalg.inv(P)
    mean = cov @ (np.linalg.solve(prior_cov, mu) + H.T @ (y / np.broadcast_to(noise_variance, (H.shape[0],))))
    return log_z, mean, cov


# ---------------------------------------------------------------------------------------------------------------
# Oracles for the core tests (test_bound, test_fit, test_potentials, test_quadrature)
# ---------------------------------------------------------------------------------------------------------------


def reference_expectation(f, m, s, center=0.0, width=1.0, zmax=9.0):
    """E[f(m + s z)], z ~ N(0, 1), by scipy.integrate.quad over z in [-zmax, zmax], split at z = 0 and at the
    geometric breakpoints x = center +- width 2^k (k = -4..39) where f may bend. `f` maps a float64 numpy
    array to an array of the same shape. s = 0 returns f(m)."""
    import warnings

    from scipy import integrate

    if s == 0:
        return float(np.asarray(f(np.array([m])))[0])
    points = {0.0}
    for k in range(-4, 40):
        for sign in (-1.0, 1.0):
            zk = (center + sign * width * 2.0 ** k - m) / s
            if abs(zk) < zmax:
                points.add(zk)
    zc = (center - m) / s
    if abs(zc) < zmax:
        points.add(zc)
    edges = [-zmax] + sorted(points) + [zmax]
    integrand = lambda z: float(np.asarray(f(np.atleast_1d(m + s * z)))[0]) * np.exp(-0.5 * z * z) / np.sqrt(2 * np.pi)
    total = 0.0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for a, b in zip(edges[:-1], edges[1:]):
            total += integrate.quad(integrand, a, b, epsabs=1e-15, epsrel=1e-13, limit=200)[0]
    return total


def log_z_grid(model, lo, hi, num=2001):
    """log Z = log int N(w | mu, Sigma) prod_n phi_n(h_n^T w) dw for a 1-D or 2-D model, by the trapezoid rule
    on a (num,) or (num, num) grid over the box [lo, hi]^D (the integrand must be negligible outside)."""
    import jax
    import jax.numpy as jnp

    D = model.dim
    axes = [np.linspace(lo[d], hi[d], num) for d in range(D)]
    grid = np.stack(np.meshgrid(*axes, indexing="ij"), axis=-1).reshape(-1, D)

    def log_joint(w):
        value = 0.0 if model.prior is None else model.prior.log_density(w)
        for s in model.sites:
            x = s.operator(D).mv(w) + s.offset
            value = value + jnp.sum(s.potential.log_phi(x))
        return value

    lj = np.asarray(jax.jit(jax.vmap(log_joint))(jnp.asarray(grid))).reshape([num] * D)
    top = lj.max()
    vals = np.exp(lj - top)
    for d in reversed(range(D)):
        vals = np.trapezoid(vals, axes[d], axis=d)
    return float(np.log(vals) + top)


def jaakkola_jordan(X, y, prior_cov, num_iters=200):
    """The Jaakkola-Jordan local bound for Bayesian logistic regression (notes A9.1, eq. 5.3), prior N(0, Sigma),
    p(y_n | w) = sigmoid(y_n x_n^T w):

        log Z >= B(xi) = 1/2 log det(S Sigma^{-1}) + 1/2 m^T S^{-1} m + sum_n [log sigmoid(xi_n) - xi_n/2
                         + lambda(xi_n) xi_n^2],   lambda(xi) = tanh(xi/2) / (4 xi),
        S^{-1} = Sigma^{-1} + 2 sum_n lambda(xi_n) x_n x_n^T,   m = S sum_n y_n x_n / 2,

    with the monotone fixed-point update xi_n^2 = x_n^T (S + m m^T) x_n. Returns (B(xi), m_xi, S_xi) at the
    last iterate."""
    X = np.asarray(X, float)
    y = np.asarray(y, float)
    P0 = np.linalg.inv(prior_cov)
    xi = np.ones(X.shape[0])
    lam = lambda xi: np.tanh(xi / 2) / (4 * xi)
    for _ in range(num_iters):
        P = P0 + 2 * (X.T * lam(xi)) @ X
        S = np.linalg.inv(P)
        m = S @ (X.T @ y) / 2
        xi = np.sqrt(np.einsum("nd,de,ne->n", X, S + np.outer(m, m), X))
    P = P0 + 2 * (X.T * lam(xi)) @ X
    S = np.linalg.inv(P)
    m = S @ (X.T @ y) / 2
    log_sig = -np.logaddexp(0, -xi)
    value = (0.5 * np.linalg.slogdet(S @ P0)[1] + 0.5 * m @ P @ m
             + np.sum(log_sig - xi / 2 + lam(xi) * xi ** 2))
    return float(value), m, S


def upper_params(q):
    """(m, upper-triangular entries of C) of a Full-factor q as one flat vector, and its inverse map."""
    import jax.numpy as jnp

    import gkl_jax as gk

    D = q.dim
    iu = np.triu_indices(D)

    def pack(q):
        return jnp.concatenate([q.mean, q.factor.dense()[iu]])

    def unpack(theta):
        C = jnp.zeros((D, D), theta.dtype).at[iu].set(theta[D:])
        return gk.Gaussian(theta[:D], gk.factors.Full(C))

    return pack, unpack


def central_difference(f, x, eps=1e-6):
    """Central finite-difference gradient of a scalar f at a float64 numpy vector x."""
    x = np.asarray(x, float)
    g = np.zeros_like(x)
    for i in range(x.size):
        e = np.zeros_like(x)
        e[i] = eps
        g[i] = (float(f(x + e)) - float(f(x - e))) / (2 * eps)
    return g
