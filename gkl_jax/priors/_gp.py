"""The Gaussian-process prior f ~ GP(mean, k) at training inputs X (Nickisch 2010, Ch. 2;
Challis & Barber 2013, Section 6.1):

    p(f) = N(f | mu, Sigma),   Sigma = K(X, X) + jitter I,

with the Cholesky factor L (Sigma = L L^T) and L^{-1} computed once per hyperparameter setting, here at
construction, so the bound's prior term (tr(Sigma^{-1} S) = sum_n ||C g_n||^2 over the rows g_n of L^{-1}) never
factorises inside the solver. Building the prior inside a function of the kernel makes log Z differentiable in
the kernel's (unconstrained) hyperparameters through L.
"""

from typing import Optional

import equinox as eqx
import jax
import jax.numpy as jnp

from .._linalg import full_precision, tdot
from .._validate import as_float_array, check_finite, check_ndim, check_nonnegative
from ..kernels import AbstractKernel
from ._priors import AbstractDensePrior, _mean, dense_cholesky


@eqx.filter_jit
def _jittered_gram(kernel, X, jitter):
    """K(X, X) + jitter I, compiled (built eagerly, the Gram matrix is otherwise a dozen dispatches)."""
    K = kernel.gram(X)
    return K + jitter * jnp.eye(X.shape[0], dtype=K.dtype)


class GP(AbstractDensePrior):
    """N(f | mean, K(X, X) + jitter I) over the latent function values at the n rows of X.

    `mean` is None (zero), a scalar (a constant mean function, also used at test inputs) or an (n,) array (then
    predictions need the mean at the test inputs). `jitter` (a float) stabilises the Cholesky factorisation.

    Args:
        kernel: a `gkl_jax.kernels` kernel k(x, x').
        X: (n, d) float array of training inputs (an (n,) array is read as d = 1).
        mean: None (zero mean), a scalar constant mean or an (n,) float array.
        jitter: a non-negative float added to the diagonal of K(X, X) (default 1e-6).

    Raises:
        ValueError: kernel not a gkl_jax kernel, X empty, more than 2-D or not finite, jitter negative, mean of
            the wrong shape, or K(X, X) + jitter I not positive definite.
    """

    kernel: AbstractKernel
    X: jax.Array
    mean: jax.Array
    covariance: jax.Array
    chol: jax.Array
    inv_chol: jax.Array
    constant_mean: Optional[jax.Array]
    jitter: float = eqx.field(static=True)

    @full_precision
    def __init__(self, kernel: AbstractKernel, X, mean=None, jitter: float = 1e-6):
        if not isinstance(kernel, AbstractKernel):
            raise ValueError(f"kernel must be a gkl_jax.kernels kernel, got {type(kernel).__name__}")
        X = as_float_array(X, "X")
        if X.ndim == 1:
            X = X[:, None]
        check_ndim(X, 2, "X")
        if 0 in X.shape:
            raise ValueError(f"X must have at least one point and one input dimension, got shape {X.shape}")
        check_finite(X, "X")
        jitter = check_nonnegative(jitter, "jitter")
        covariance = _jittered_gram(kernel, X, jitter)
        self.chol, self.inv_chol = dense_cholesky(covariance, "covariance (K(X, X) + jitter I)")
        self.kernel = kernel
        self.X = X
        self.jitter = jitter
        self.covariance = covariance
        self.mean = _mean(mean, X.shape[0], covariance)
        if mean is None:
            self.constant_mean = jnp.zeros((), covariance.dtype)
        elif jnp.ndim(mean) == 0:
            self.constant_mean = as_float_array(mean, "mean")
        else:
            self.constant_mean = None

    def cross_covariance(self, X_new):
        """The prior covariance between the training and new inputs.

        Args:
            X_new: (n_new, d) float array.

        Returns:
            (n, n_new) float array K(X, X_new).
        """
        return self.kernel.gram(self.X, X_new)

    def solve(self, B):
        """Sigma^{-1} B = L^{-T} (L^{-1} B) with the stored inverse factor.

        Args:
            B: (n,) or (n, k) float array.

        Returns:
            float array shaped like B.
        """
        return tdot(self.inv_chol, self.inv_chol @ B)
