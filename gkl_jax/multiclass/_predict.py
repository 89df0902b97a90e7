"""Predictive distribution and the bounds on predictive probabilities (Chai 2012, Section 2.3.3, App. B.7).

For test inputs with prior cross-covariance K_* = k_*^x (x) K^c (an (nC, n_* C) matrix) and prior blocks
K_**,j = k^x(x_*j, x_*j) K^c, the approximate posterior of f_*j is N(m_*j, V_*j) with

    m_* = K_*^T K^{-1} m = K_*^T alpha,        V_*j = K_**,j - K_*j^T T K_*j,   T = W - W V W     (Section 2.3.3)

(alpha = y - b at the optimum, so no K^{-1} is needed). Three quantities per test point and class c:

- the re-normalised probability p~(y_* = c) = softmax(m_*)_c (eq. 25), used for decisions;
- the approximate lower bound  log p(y_* = c | y) >~ m_*^c + max_{b_*, S_*} [h - m_*^T e^c]  (eq. 24): one
  optimisation of (b_*, S_*) serves all classes;
- the upper bound q(y_* = c) <= 1 - sum_{c' != c} exp(l_*^{c'}) (eq. 7), here with the eq. 24 lower bounds in place
  of l_*, which keeps it an upper bound.

Theorem 12 turns eq. 24 into a proper bound: log p({y_*j = c_j} | y) >= sum_j max h(e^{c_j}) + log Z_h - log p(y).
"""

import functools

import equinox as eqx
import jax
import jax.numpy as jnp

from .._linalg import tdot
from ._blocks import per_datum
from ._site import optimise_site


class Predictive(eqx.Module):
    """The Gaussian predictive N(m_*j, V_*j) of the C latent values at n_* test points (`gk.multiclass.predict`).

    Attributes:
        mean: (n_*, C) float array m_*.
        covariance: (n_*, C, C) float array V_*.
    """

    mean: jax.Array
    covariance: jax.Array

    def renormalised_probabilities(self):
        """p~(y_* = c | y) = softmax(m_*)_c, the re-normalised probabilities of eq. 25 (Chai 2012).

        Returns:
            (n_*, C) float array (rows sum to one).
        """
        return _softmax(self.mean)

    def integrated_probabilities(self, key, num_pairs=1000):
        """E[softmax(f_*)] under N(m_*, V_*) by Monte Carlo with `num_pairs` antithetic pairs of draws per test
        point (the predictive probability of the Gaussian approximation, eq. 5 with q in place of the posterior).

        Args:
            key: a `jax.random` key.
            num_pairs: antithetic pairs per test point (static int).

        Returns:
            (n_*, C) array of probabilities.
        """
        return _integrated(key, self.mean, self.covariance, int(num_pairs))

    def log_lower_bounds(self, tol=1e-10, max_steps=300):
        """m_*^c + max_{b, S}(h - m_*^T e^c) for every class (eq. 24): an approximate lower bound on
        log p(y_* = c | y) (a lower bound on log q(y_* = c | y), eq. 23); one site optimisation serves all classes.

        Args:
            tol: the site optimisation's tolerance.
            max_steps: its most steps (static int).

        Returns:
            (n_*, C) float array.
        """
        opt = per_datum(lambda m, V: optimise_site(m, V, tol=tol, max_steps=max_steps))(self.mean, self.covariance)
        return self.mean + opt.value[:, None]

    def upper_bounds(self, log_lower=None):
        """Upper bounds 1 - sum_{c' != c} exp(lower_c') on the predictive probabilities (eq. 7).

        Args:
            log_lower: (n_*, C) float eq. 24 lower bounds, or None to compute them (`log_lower_bounds`).

        Returns:
            (n_*, C) float array.
        """
        lower = self.log_lower_bounds() if log_lower is None else log_lower
        e = jnp.exp(lower)
        return 1.0 - (jnp.sum(e, axis=-1, keepdims=True) - e)


@jax.jit
def _softmax(mean):
    """softmax over the last axis as one compiled program (op by op it compiles five small ones per new shape)."""
    return jax.nn.softmax(mean, axis=-1)


@functools.partial(jax.jit, static_argnums=3)
def _integrated(key, mean, cov, num_pairs):
    n_star, C = mean.shape
    L = per_datum(jnp.linalg.cholesky)(cov + 1e-12 * jnp.eye(C, dtype=cov.dtype))
    z = jax.random.normal(key, (num_pairs, n_star, C), dtype=mean.dtype)
    f = jnp.einsum("jab,sjb->sja", L, z)
    p = 0.5 * (jax.nn.softmax(mean + f, axis=-1) + jax.nn.softmax(mean - f, axis=-1))
    return jnp.mean(p, axis=0)


@eqx.filter_jit
def kronecker_predictive(kernel, X, X_new, alpha, T):
    """`predictive_moments` for the prior K = K^x (x) I_C without forming the Kronecker products: with
    k = K^x(X, X_new) (n, n_*), m_*j = sum_i k_ij alpha_i and V_*j = k(x_*j, x_*j) I - sum_{i,l} k_ij k_lj T_il.

    Args:
        kernel: the (learned) `gk.kernels` kernel.
        X: (n, d) training inputs; X_new: (n_*, d) test inputs.
        alpha: (nC,) datum-major K^{-1} m = y - b.
        T: (nC, nC) datum-major W - W V W (eq. 75).

    Returns:
        A `Predictive` with mean (n_*, C) and covariance (n_*, C, C).
    """
    n = X.shape[0]
    C = alpha.shape[0] // n
    k = kernel.gram(X, X_new)
    mean = tdot(k, alpha.reshape(n, C))
    P = jnp.einsum("iakb,kj->iajb", T.reshape(n, C, n, C), k)
    quad = jnp.einsum("ij,iajb->jab", k, P)
    cov = kernel.diag(X_new)[:, None, None] * jnp.eye(C, dtype=T.dtype) - quad
    return Predictive(mean=mean, covariance=0.5 * (cov + jnp.swapaxes(cov, -1, -2)))


def predictive_moments(alpha, T, K_cross, K_star_blocks):
    """N(m_*j, V_*j) for every test point: m_* = K_*^T alpha, V_*j = K_**,j - K_*j^T T K_*j.

    alpha: (nC,); T: (nC, nC); K_cross: (nC, n_* C) datum-major on both sides; K_star_blocks: (n_*, C, C)."""
    n_star, C, _ = K_star_blocks.shape
    mean = tdot(K_cross, alpha).reshape(n_star, C)
    TK = (T @ K_cross).reshape(-1, n_star, C)
    quad = jnp.einsum("kja,kjb->jab", K_cross.reshape(-1, n_star, C), TK)
    cov = K_star_blocks - quad
    return Predictive(mean=mean, covariance=0.5 * (cov + jnp.swapaxes(cov, -1, -2)))


def joint_predictive_bound(log_lower, labels, log_z, log_marginal):
    """A lower bound on the joint log predictive probability of test labels (Chai 2012, Theorem 12):
    sum_j log_lower[j, c_j] + log Z_h - log p(y).

    Args:
        log_lower: (n_*, C) float eq. 24 lower bounds (`Predictive.log_lower_bounds`).
        labels: (n_*,) int test class indices c_j.
        log_z: float scalar, the fitted bound log Z_h (`Posterior.log_z`).
        log_marginal: float scalar, an upper estimate of log p(y) (e.g. the 99.9% upper confidence value of
            importance sampling, App. F), for the result to stay a bound.

    Returns:
        Float scalar array.
    """
    labels = jnp.asarray(labels)
    picked = jnp.take_along_axis(log_lower, labels[:, None], axis=1)[:, 0]
    return jnp.sum(picked) + log_z - log_marginal
