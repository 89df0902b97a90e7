"""Oracles shared by the baseline tests (tests/test_baselines*.py): dense grid quadrature in 2 D."""

import jax
import jax.numpy as jnp
import numpy as np

from gkl_jax.baselines._common import log_joint


def grid_posterior(model, lim=8.0, num=401):
    """log Z, mean and covariance of a 2-D target by the trapezoid rule on [-lim, lim]^2."""
    g = np.linspace(-lim, lim, num)
    W = np.stack(np.meshgrid(g, g, indexing="ij"), -1).reshape(-1, 2)
    lj = np.asarray(jax.jit(jax.vmap(lambda w: log_joint(model, w)))(jnp.asarray(W)))
    h = g[1] - g[0]
    log_z = float(np.log(np.sum(np.exp(lj - lj.max()))) + lj.max() + 2 * np.log(h))
    p = np.exp(lj - lj.max())
    p /= p.sum()
    mean = p @ W
    cov = (W - mean).T @ ((W - mean) * p[:, None])
    return log_z, mean, cov
