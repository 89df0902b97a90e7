"""Importance-sampling reference values for the multinomial-logit GP (Chai 2012, Section 9 and App. F).

Proposal: the multivariate t with nu = 4 degrees of freedom, centred at the optimised variational mean m* and with
scale matrix Sigma = K (covariance nu/(nu - 2) Sigma = 2K, as the paper states; the density exponent is
-(nu + p)/2, that of the multivariate t), or Sigma = V (the paper's choice for glass, Section 9.2.2). With
f^(s) ~ t, w^(s) = p(y | f^(s)) N(f^(s) | 0, K) / t(f^(s)) and p^(y) = mean(w). The reported value is the
99.9% upper confidence bound p^(y) + 3.09 sigma^/sqrt(n_s) (Section 9), in logs; predictive probabilities use the
self-normalised weights and f_* ~ p(f_* | f) (App. F.1).
"""

import functools

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.scipy.linalg as jsl
from jax.scipy.special import gammaln

from .._linalg import diagonal


class ImportanceEstimate(eqx.Module):
    """log p^(y) (`log_z`), its 99.9% upper confidence value (`log_z_upper`), the effective sample size, and the
    normalised log weights (for predictions)."""

    log_z: jax.Array
    log_z_upper: jax.Array
    ess: jax.Array
    log_weights: jax.Array


def _t_samples(key, mean, L, nu, num):
    kz, ku = jax.random.split(key)
    z = jax.random.normal(kz, (num, mean.shape[0]), dtype=mean.dtype)
    u = 2.0 * jax.random.gamma(ku, nu / 2.0, (num,), dtype=mean.dtype)  # chi^2_nu
    scale = jnp.sqrt(nu / u)
    return mean + (z @ L.T) * scale[:, None], jnp.sum(z * z, axis=1) * nu / u


@functools.partial(jax.jit, static_argnames=("num_samples", "batch_size"))
def importance_sampling(key, K, Y, mean, *, scale=None, num_samples=100_000, nu=4.0, batch_size=5000):
    """Estimate log p(y) for the prior N(0, K) (datum-major (nC, nC)) and one-hot labels Y (n, C).

    `mean`: the proposal centre (nC,), normally the variational mean; `scale`: the t scale matrix (default K;
    pass V for the posterior-scaled proposal). Returns an `ImportanceEstimate` and the samples' latent draws are
    not kept (memory); `importance_predictive` redraws them from the same key."""
    n, C = Y.shape
    N = n * C
    batch_size = min(int(batch_size), int(num_samples))
    num_batches = -(-int(num_samples) // batch_size)
    LK = jnp.linalg.cholesky(K)
    LS = LK if scale is None else jnp.linalg.cholesky(scale)
    logdet_K = 2 * jnp.sum(jnp.log(diagonal(LK)))
    logdet_S = 2 * jnp.sum(jnp.log(diagonal(LS)))
    log_t_const = (gammaln((nu + N) / 2) - gammaln(nu / 2) - N / 2 * jnp.log(nu * jnp.pi) - 0.5 * logdet_S)
    y = Y.reshape(-1)

    def batch(k):
        f, delta = _t_samples(k, mean, LS, nu, batch_size)
        log_lik = f @ y - jnp.sum(jax.nn.logsumexp(f.reshape(-1, n, C), axis=-1), axis=-1)
        a = jsl.solve_triangular(LK, f.T, lower=True)
        log_prior = -0.5 * jnp.sum(a * a, axis=0) - 0.5 * logdet_K - N / 2 * jnp.log(2 * jnp.pi)
        log_t = log_t_const - (nu + N) / 2 * jnp.log1p(delta / nu)
        return log_lik + log_prior - log_t

    keys = jax.random.split(key, num_batches)
    logw = jax.lax.map(batch, keys).reshape(-1)[: int(num_samples)]
    return _summarise(logw)


def _summarise(logw):
    ns = logw.shape[0]
    mx = jnp.max(logw)
    w = jnp.exp(logw - mx)
    mean_w = jnp.mean(w)
    sd_w = jnp.std(w, ddof=1)
    log_z = mx + jnp.log(mean_w)
    log_upper = mx + jnp.log(mean_w + 3.09 * sd_w / jnp.sqrt(ns))
    ess = jnp.sum(w) ** 2 / jnp.sum(w * w)
    return ImportanceEstimate(log_z=log_z, log_z_upper=log_upper, ess=ess, log_weights=logw - jax.nn.logsumexp(logw))


@functools.partial(jax.jit, static_argnames=("num_samples", "batch_size"))
def importance_predictive(key, K, Y, mean, K_cross, K_star_blocks, *, scale=None, num_samples=100_000, nu=4.0,
                          batch_size=2000):
    """Self-normalised importance estimate of p(y_* = c | y) for every test point and class, shape (n_*, C)
    (App. F.1), using the same proposal as `importance_sampling`. For each draw f ~ t, f_*j ~ p(f_*j | f), a
    C-variate Gaussian with mean K_*j^T K^{-1} f and covariance K_**,j - K_*j^T K^{-1} K_*j."""
    n, C = Y.shape
    N = n * C
    n_star = K_star_blocks.shape[0]
    batch_size = min(int(batch_size), int(num_samples))
    num_batches = -(-int(num_samples) // batch_size)
    LK = jnp.linalg.cholesky(K)
    LS = LK if scale is None else jnp.linalg.cholesky(scale)
    logdet_K = 2 * jnp.sum(jnp.log(diagonal(LK)))
    logdet_S = 2 * jnp.sum(jnp.log(diagonal(LS)))
    log_t_const = (gammaln((nu + N) / 2) - gammaln(nu / 2) - N / 2 * jnp.log(nu * jnp.pi) - 0.5 * logdet_S)
    A = jsl.cho_solve((LK, True), K_cross)  # K^{-1} K_*
    cond = K_star_blocks - jnp.einsum("kja,kjb->jab", K_cross.reshape(N, n_star, C), A.reshape(N, n_star, C))
    Lc = jnp.linalg.cholesky(0.5 * (cond + jnp.swapaxes(cond, -1, -2)) + 1e-10 * jnp.eye(C, dtype=K.dtype))
    y = Y.reshape(-1)

    def batch(k):
        k1, k2 = jax.random.split(k)
        f, delta = _t_samples(k1, mean, LS, nu, batch_size)
        log_lik = f @ y - jnp.sum(jax.nn.logsumexp(f.reshape(-1, n, C), axis=-1), axis=-1)
        a = jsl.solve_triangular(LK, f.T, lower=True)
        log_prior = -0.5 * jnp.sum(a * a, axis=0) - 0.5 * logdet_K - N / 2 * jnp.log(2 * jnp.pi)
        logw = log_lik + log_prior - (log_t_const - (nu + N) / 2 * jnp.log1p(delta / nu))
        mu = (f @ A).reshape(-1, n_star, C)
        z = jax.random.normal(k2, mu.shape, dtype=mu.dtype)
        fs = mu + jnp.einsum("jab,sjb->sja", Lc, z)
        return logw, jax.nn.log_softmax(fs, axis=-1)

    keys = jax.random.split(key, num_batches)
    logw, logp = jax.lax.map(batch, keys)
    logw = logw.reshape(-1)[: int(num_samples)]
    logp = logp.reshape(-1, n_star, C)[: int(num_samples)]
    lw = logw - jax.nn.logsumexp(logw)
    return jnp.exp(jax.nn.logsumexp(lw[:, None, None] + logp, axis=0))
