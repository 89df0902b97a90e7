"""The Krylov and spectrum helpers of `Subspace`'s eigen basis update (Challis & Barber 2013, App. B.4.3): block
Krylov extension, the row-space shortcut's applicability, and the split of the basis between the two ends of the
spectrum."""

import jax
import jax.numpy as jnp

from ._kernels import operator_kind, orthonormal

_OVERSAMPLING = 10
"""Random columns added to the current basis in the eigen update's Krylov space."""


def _extend_krylov(A, Q, AQ, keys, width):
    """len(keys) more blocks of a block Krylov space: each the image of the last `width` columns of Q, orthogonalised
    against the earlier blocks twice (BCGS2, the second time by one Cholesky QR pass). Returns (Q, A Q)."""
    for k in keys:   # unrolled: a static number of blocks
        AX = AQ[:, -width:]
        # a perturbation at round-off level keeps the block full rank where the Krylov space is (nearly)
        # invariant; there it only lets random directions join Q
        scale = jnp.sqrt(jnp.finfo(AX.dtype).eps) * jnp.linalg.norm(AX) / jnp.sqrt(AX.size)
        Y = AX + scale * jax.random.normal(k, AX.shape, AX.dtype)
        Y = orthonormal(Y - Q @ (Q.T @ Y))
        Y = orthonormal(Y - Q @ (Q.T @ Y), nearly_orthonormal=True)
        Q = jnp.concatenate([Q, Y], axis=1)
        AQ = jnp.concatenate([AQ, A(Y)], axis=1)
    return Q, AQ


def row_space_matrix(model, rank, basis_iterations):
    """The dense H for which `Subspace` refines its basis in the row space of H (`Subspace._row_space_refine`): one
    site group with a dense operator, an `Isotropic` prior, N + rank <= D and basis_iterations (rank + 10) <= N;
    else None."""
    from ..priors import Isotropic

    if len(model.sites) != 1 or not isinstance(model.prior, Isotropic):
        return None
    op = model.sites[0].operator(model.dim)
    if operator_kind(op) != "dense":
        return None
    N = op.shape[0]
    if N + rank > model.dim or basis_iterations * (rank + _OVERSAMPLING) > N:
        return None
    return op.matrix


def best_split(w, trace_A, dim, rank):
    """The j in 0..K whose basis of the j largest and K - j smallest of the ascending Ritz values w of A has the
    least KL for a Gaussian target with precision A: with optimal (S_1, c), KL = (D - K)/2 log(AM/GM) of the
    eigenvalues outside the basis, which up to the constant log det A is

        (D - K) log(tr A - sum_sel w) + sum_sel log w    (tr A exact; the unknown outside eigenvalues only
                                                           through their sum)."""
    if dim == rank:
        return jnp.zeros((), int)
    j = jnp.arange(rank + 1)
    logs = jnp.log(jnp.maximum(w, jnp.finfo(w.dtype).tiny))
    low, low_log = (jnp.concatenate([jnp.zeros(1, w.dtype), jnp.cumsum(v[:rank])]) for v in (w, logs))
    high, high_log = (jnp.concatenate([jnp.zeros(1, w.dtype), jnp.cumsum(v[::-1][:rank])]) for v in (w, logs))
    kept, kept_log = low[rank - j] + high[j], low_log[rank - j] + high_log[j]
    outside = jnp.maximum(trace_A - kept, jnp.finfo(w.dtype).tiny)
    return jnp.argmin((dim - rank) * jnp.log(outside) + kept_log)
