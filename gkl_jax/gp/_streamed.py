"""The sparse GP bound in the whitened basis, over a minibatch of the data (an unbiased estimate) or over all of it
streamed in fixed-size chunks, never holding more than one chunk's projections.

With inducing inputs Z (M x d), L L^T = K_zz + jitter I and u = mu_Z + L v (whitened inducing values, prior
N(0, I); Hensman et al. 2015), each latent value is f_n | v ~ N(c + a_n^T v, k_nn - ||a_n||^2) with
a_n = L^{-1} k_zn and c the constant prior mean. Under q(v) = N(m, C^T C) the G-KL bound (Challis & Barber 2013,
eq. 7) is

    B = H[q] + E_q[log N(v | 0, I)] + sum_{n=1}^N E_{N(f_n | c + a_n^T m, ||C a_n||^2 + k_nn - ||a_n||^2)}[log phi_n],

the sparse variational bound of Titsias (2009) and Hensman et al. (2015), equal to `gkl_jax.bound` of
`gp.sparse_model(kernel, X, Z, likelihood)` at the same q taken back to u. Its site sum has the unbiased estimate
(N / B) sum_{n in b} I_n from a batch b of B rows drawn uniformly without replacement (`sparse_minibatch_bound`).
"""

import math
import typing

import jax
import jax.numpy as jnp
from jax import lax
from jaxtyping import ArrayLike, Float

from .._bound import bound
from .._gaussian import Gaussian
from .._linalg import full_precision
from .._model import Model, Sites
from .._typing import Indices, Inputs, Scalar, ScalarLike
from .._validate import check_indices, check_int
from ..kernels import AbstractKernel
from ..operators import Dense as DenseOperator
from ..potentials import AbstractPotential
from ..priors import GP, Isotropic
from ..stochastic import slice_sites, take_sites
from ._models import check_likelihood, inputs, whitened_projection

DEFAULT_CHUNK = 4096
"""Rows per chunk of the streamed full-data bound (memory about 3 M * chunk floats)."""


def inducing_prior(kernel, Z, mean, jitter: float) -> GP:
    """The GP prior over u = f(Z) with a constant mean (its Cholesky factor L and L^{-1} computed once).

    Args:
        kernel: a `gkl_jax.kernels` kernel.
        Z: (M, d) float array of inducing inputs.
        mean: float scalar, the constant prior mean c.
        jitter: float added to K_zz's diagonal.

    Returns:
        `gkl_jax.priors.GP`.
    """
    return GP(kernel, Z, mean=mean, jitter=jitter)


def batch_sites(kernel, prior_u: GP, X, likelihood) -> Sites:
    """The whitened sites of the rows X (B x d) with their likelihood: H = A^T, A = L^{-1} K(Z, X), offset the
    constant mean, variance_offset k_nn - ||a_n||^2.

    Args:
        kernel: the kernel of `prior_u`.
        prior_u: `inducing_prior(...)`.
        X: (B, d) float array.
        likelihood: a `gkl_jax.potentials` potential with B sites (or scalar data).

    Returns:
        `gkl_jax.Sites` over the M whitened inducing values.
    """
    A, extra = whitened_projection(kernel, prior_u, X)
    offset = typing.cast(jax.Array, prior_u.constant_mean)     # set: the inducing prior's mean is a constant
    return Sites(DenseOperator(A.T), likelihood, offset=offset, variance_offset=extra)


def site_rows(likelihood) -> Sites:
    """The likelihood as a `Sites(None, ...)` group (one site per data row), so that its per-site data are
    subset with `gkl_jax.stochastic.take_sites` / `slice_sites`."""
    return Sites(None, likelihood)


def check_data(kernel, X, Z, likelihood) -> tuple[jax.Array, jax.Array]:
    """(X, Z) as 2-D float arrays after checking them, the kernel and the likelihood (ValueError naming each).

    Args:
        kernel: must be a `gkl_jax.kernels` kernel.
        X: (N, d) inputs (an (N,) array is read as d = 1), finite where concrete.
        Z: (M, d) inducing inputs with M <= N.
        likelihood: a `gkl_jax.potentials` potential with N sites (or scalar data).

    Returns:
        (X, Z).
    """
    if not isinstance(kernel, AbstractKernel):
        raise ValueError(f"kernel must be a gkl_jax.kernels kernel, got {type(kernel).__name__}")
    X = inputs(X, "X")
    Z = inputs(Z, "Z")
    if Z.shape[1] != X.shape[1]:
        raise ValueError(f"Z must have {X.shape[1]} columns (the input dimension of X), got shape {Z.shape}")
    if not 1 <= Z.shape[0] <= X.shape[0]:
        raise ValueError(f"Z must have between 1 and N = {X.shape[0]} rows (inducing inputs), got {Z.shape[0]}")
    check_likelihood(likelihood, X.shape[0])
    return X, Z


def _check_q(q, dim):
    if not isinstance(q, Gaussian):
        raise ValueError(f"q must be a gkl_jax.Gaussian over the whitened inducing values, got {type(q).__name__}")
    if q.dim != dim:
        raise ValueError(f"q has dimension {q.dim} but there are {dim} inducing inputs (rows of Z)")
    return q


def _global(q: Gaussian, dim: int):
    """H[q] + E_q[log N(v | 0, I)], the sites-free part of the whitened bound."""
    return bound(Model(Isotropic(dim, jnp.ones((), q.mean.dtype)), []), q)


@full_precision
def sparse_minibatch_bound(kernel: AbstractKernel, X: Inputs, Z: Float[ArrayLike, "m d"],
                           likelihood: AbstractPotential, q: Gaussian, indices: Indices, *, mean: ScalarLike = 0.0,
                           jitter: float = 1e-6) -> Scalar:
    """The unbiased estimate of the whitened sparse bound from the data rows `indices`:
    H[q] + E_q[log N(v | 0, I)] + (N / B) sum_{n in indices} E[log phi_n(f_n)].

    Args:
        kernel: a `gkl_jax.kernels` kernel.
        X: (N, d) float array of inputs.
        Z: (M, d) float array of inducing inputs.
        likelihood: a `gkl_jax.potentials` potential with N sites (or scalar data).
        q: a `gkl_jax.Gaussian` over the M whitened inducing values v.
        indices: (B,) integer array of rows in [0, N), B >= 1.
        mean: the constant prior mean c (default 0).
        jitter: added to K_zz's diagonal (default 1e-6).

    Returns:
        float scalar array; averaged over all batches of a partition of the rows it equals
        `sparse_streamed_bound`.
    """
    X, Z = check_data(kernel, X, Z, likelihood)
    n = X.shape[0]
    indices = check_indices(indices, n)
    if indices.shape[0] == 0:
        raise ValueError("indices is empty: a minibatch needs at least one row")
    q = _check_q(q, Z.shape[0])
    prior_u = inducing_prior(kernel, Z, mean, jitter)
    part = take_sites(site_rows(likelihood), indices, n).potential
    sites = batch_sites(kernel, prior_u, X[indices], part)
    return _global(q, Z.shape[0]) + (n / indices.shape[0]) * sites.expected_log_phi(q)


@full_precision
def sparse_streamed_bound(kernel: AbstractKernel, X: Inputs, Z: Float[ArrayLike, "m d"],
                          likelihood: AbstractPotential, q: Gaussian, *, mean: ScalarLike = 0.0,
                          jitter: float = 1e-6, chunk_size: int | None = None) -> Scalar:
    """The whitened sparse GP bound over all N rows, the site sum streamed as a `lax.scan` over chunks of
    `chunk_size` rows (the last chunk clamped to end at row N, its rows already counted masked), each chunk
    rematerialised in the backward pass (`jax.checkpoint`): memory O(chunk_size * M) for the value and the
    gradient (in q and in the kernel, Z and likelihood parameters). Jit-able.

    Args:
        kernel: a `gkl_jax.kernels` kernel.
        X: (N, d) float array of inputs.
        Z: (M, d) float array of inducing inputs.
        likelihood: a `gkl_jax.potentials` potential with N sites (or scalar data).
        q: a `gkl_jax.Gaussian` over the M whitened inducing values v.
        mean: the constant prior mean c (default 0).
        jitter: added to K_zz's diagonal (default 1e-6).
        chunk_size: rows per chunk, a static int >= 1 (default 4096, at most N).

    Returns:
        float scalar array, the bound (Challis & Barber 2013, eq. 7; Titsias 2009 for a Gaussian likelihood
        at the optimal q).
    """
    X, Z = check_data(kernel, X, Z, likelihood)
    n = X.shape[0]
    q = _check_q(q, Z.shape[0])
    size = min(n, DEFAULT_CHUNK if chunk_size is None else check_int(chunk_size, "chunk_size", 1))
    prior_u = inducing_prior(kernel, Z, mean, jitter)
    rows = site_rows(likelihood)

    @jax.checkpoint
    def chunk_sum(c):
        first = c * size
        start = jnp.minimum(first, n - size)
        part = slice_sites(rows, start, size, n).potential
        sites = batch_sites(kernel, prior_u, lax.dynamic_slice_in_dim(X, start, size, axis=0), part)
        m, s2 = sites.project(q)
        terms = sites.potential.expected_log_phi(m, s2)
        return jnp.sum(jnp.where(start + jnp.arange(size) >= first, terms, 0.0))

    def body(total, c):
        return total + chunk_sum(c), None

    value = _global(q, Z.shape[0])
    total, _ = lax.scan(body, jnp.zeros((), value.dtype), jnp.arange(math.ceil(n / size)))
    return value + total
