"""GP models as ordinary G-KL models: the full GP (`model`) and the sparse, inducing-point GP (`sparse_model`).

The full GP is N(f | mu, K(X, X) + jitter I) prod_n phi_n(f_n): `Model(GP(kernel, X), Sites(None, likelihood))`.

With inducing inputs Z (M x d) and inducing values u = f(Z) ~ N(mu_Z, K_zz + jitter I), each latent value is
f_n | u ~ N(mu_n + h_n^T (u - mu_Z), k_nn - q_nn) with

    h_n = K_zz^{-1} k_zn,        q_nn = k_zn^T K_zz^{-1} k_zn,

so under q(u) = N(m, C^T C) the site projection f_n has mean h_n^T m + (mu_n - h_n^T mu_Z) and variance
||C h_n||^2 + (k_nn - q_nn). That is exactly `Sites(H, likelihood, offset=mu_X - H mu_Z, variance_offset=k_nn -
q_nn)` under the GP prior on u, so the G-KL bound of the returned model is the sparse variational bound
(Titsias 2009; Hensman et al. 2015):

    B = E_q[log N(u | mu_Z, K_zz)] + H[q] + sum_n E_{N(f_n | ., ||C h_n||^2 + k_nn - q_nn)}[log phi_n(f_n)],

and every factor, solver, baseline and `gp.predict` (with the prior over Z) is reused unchanged. With Z = X,
h_n = e_n and k_nn - q_nn = 0 up to the jitter, so the bound equals the full GP bound. The model is a function
of (kernel, Z), so Z is optimised like any other hyperparameter by `fit_hyperparameters`.
"""

import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Float

from .._model import Model, Sites
from .._typing import Inputs, Means
from .._validate import as_float_array, check_finite, check_ndim
from ..kernels import AbstractKernel
from ..potentials import AbstractPotential
from ..priors import GP


def inputs(X, name: str) -> jax.Array:
    """X as a finite 2-D float array (an (n,) array read as one column); ValueError naming `name`."""
    X = as_float_array(X, name)
    if X.ndim == 1:
        X = X[:, None]
    check_ndim(X, 2, name)
    check_finite(X, name)
    return X


def check_likelihood(likelihood, num, what: str = "X"):
    """A potential whose per-site data (if any) has `num` entries, the length of `what`; else ValueError."""
    if not isinstance(likelihood, AbstractPotential):
        raise ValueError(f"likelihood must be a gkl_jax.potentials potential, got {type(likelihood).__name__}")
    n = likelihood.num_sites
    if n is not None and n != num:
        raise ValueError(f"{what} has {num} rows but the likelihood's per-site data (y) has {n} entries")


def model(kernel: AbstractKernel, X: Inputs, likelihood: AbstractPotential, *, mean: Means | None = None,
          jitter: float = 1e-6) -> Model:
    """The full GP model `Model(GP(kernel, X, mean, jitter), Sites(None, likelihood))`, with the inputs and the
    likelihood's targets checked against each other (Challis & Barber 2013, Section 6.1).

    Args:
        kernel: a `gkl_jax.kernels` kernel.
        X: (n, d) float array of inputs (an (n,) array is read as d = 1).
        likelihood: a `gkl_jax.potentials` potential with n sites (or scalar data).
        mean: None (zero), a scalar or an (n,) float array, the prior mean at X.
        jitter: a non-negative float added to the Gram matrix's diagonal (default 1e-6).

    Returns:
        `gkl_jax.Model` over the n latent function values.

    Raises:
        ValueError: X not finite or more than 2-D, a likelihood that is not a potential or has another number of
            sites, or a bad kernel, mean or jitter (see `gkl_jax.priors.GP`).
    """
    X = inputs(X, "X")
    check_likelihood(likelihood, X.shape[0])
    return Model(GP(kernel, X, mean=mean, jitter=jitter), Sites(None, likelihood))


def whitened_projection(kernel: AbstractKernel, prior_u: GP, X):
    """The sparse GP's whitened site projections a_n = L^{-1} k_zn (L L^T = K_zz + jitter I) and extra variances
    k_nn - q_nn = k_nn - ||a_n||^2 (clipped at 0): with u = mu_Z + L v, f_n | v ~ N(mu_n + a_n^T v, k_nn - q_nn)
    (Hensman et al. 2015, whitened inducing values).

    Args:
        kernel: the `gkl_jax.kernels` kernel.
        prior_u: the `gkl_jax.priors.GP` over the M inducing values u = f(Z).
        X: (N, d) float array of data inputs (validated by the caller).

    Returns:
        (A, extra): (M, N) float array L^{-1} K(Z, X) and (N,) float array.
    """
    A = prior_u.inv_chol @ kernel.gram(prior_u.X, X)
    return A, jnp.maximum(kernel.diag(X) - jnp.sum(A * A, axis=0), 0.0)


def sparse_projection(kernel: AbstractKernel, prior_u: GP,
                      X: Float[ArrayLike, "n d"]) -> tuple[Float[Array, "n m"], Float[Array, " n"]]:
    """The sparse GP's site projections h_n = K_zz^{-1} k_zn and extra variances k_nn - q_nn (clipped at 0).

    Args:
        kernel: the `gkl_jax.kernels` kernel.
        prior_u: the `gkl_jax.priors.GP` over the M inducing values u = f(Z).
        X: (N, d) float array of data inputs.

    Returns:
        (H, extra): (N, M) float array and (N,) float array.

    Raises:
        ValueError: kernel not a kernel, prior_u not a GP prior, or X not finite or more than 2-D.
    """
    if not isinstance(kernel, AbstractKernel):
        raise ValueError(f"kernel must be a gkl_jax.kernels kernel, got {type(kernel).__name__}")
    if not isinstance(prior_u, GP):
        raise ValueError(f"prior_u must be the gkl_jax.priors.GP over the inducing values, got "
                         f"{type(prior_u).__name__}")
    A, extra = whitened_projection(kernel, prior_u, inputs(X, "X"))
    return (prior_u.inv_chol.T @ A).T, extra


def sparse_model(kernel: AbstractKernel, X: Inputs, Z: Float[ArrayLike, "m d"] | Float[ArrayLike, " m"],
                 likelihood: AbstractPotential, *, mean: Means | None = None, jitter: float = 1e-6) -> Model:
    """The sparse GP model over u = f(Z) for data inputs X (N x d) and a likelihood with N sites.

    `mean` is None (zero), a constant, or an (N,) array of prior means at X (then the inducing mean is zero
    unless a constant is given). Predict with `gp.predict(result, model.prior, X_new)`. Its G-KL optimum with a
    Gaussian likelihood is Titsias' collapsed bound.

    Args:
        kernel: a `gkl_jax.kernels` kernel.
        X: (N, d) float array of data inputs (an (N,) array is read as d = 1).
        Z: (M, d) float array of inducing inputs.
        likelihood: a `gkl_jax.potentials` potential with N sites (or scalar data).
        mean: None (zero), a scalar, or an (N,) float array of prior means at X.
        jitter: a non-negative float added to K_zz's diagonal (default 1e-6).

    Returns:
        `gkl_jax.Model` whose prior is `GP(kernel, Z, ...)` over the M inducing values.

    Raises:
        ValueError: kernel not a kernel, inputs not finite or with different d, a likelihood with another number
            of sites, or a mean of the wrong shape.
    """
    if not isinstance(kernel, AbstractKernel):
        raise ValueError(f"kernel must be a gkl_jax.kernels kernel, got {type(kernel).__name__}")
    X = inputs(X, "X")
    Z = inputs(Z, "Z")
    if Z.shape[1] != X.shape[1]:
        raise ValueError(f"Z must have {X.shape[1]} columns (the input dimension of X), got shape {Z.shape}")
    check_likelihood(likelihood, X.shape[0])
    constant = mean is None or jnp.ndim(mean) == 0
    prior_u = GP(kernel, Z, mean=mean if constant else None, jitter=jitter)
    H, extra = sparse_projection(kernel, prior_u, X)
    if constant:
        c = 0.0 if mean is None else as_float_array(mean, "mean")
        offset = c - H @ prior_u.mean
    else:
        mean = as_float_array(mean, "mean")
        if mean.shape != (X.shape[0],):
            raise ValueError(f"mean must be a scalar or have shape ({X.shape[0]},), got {mean.shape}")
        offset = mean
    return Model(prior_u, Sites(H, likelihood, offset=offset, variance_offset=extra))
