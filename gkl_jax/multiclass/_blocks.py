"""Block-diagonal helpers for datum-major (nC, nC) matrices (the i-th C x C diagonal block belongs to datum i),
and `per_datum`, the map of a per-datum function over the data that keeps XLA's CPU runtime from hanging."""

import jax
import jax.numpy as jnp
import numpy as np

from .._validate import device_array

LAPACK_INLINE_WORK = 200_000
"""jaxlib 0.10's CPU LAPACK kernels (Cholesky, LU, eigh, triangular solves) split a batch of B matrices of order C
into parts on XLA's intra-op thread pool, and wait for them, when B times the per-matrix work (5 C^3 for eigh, C^3
/ 3 for Cholesky) reaches 200,000; a batch at most 200,000 / work runs inline. Two kernels that split at the same
time on a pool of two threads (a 2-core machine) each hold a thread while waiting for parts queued behind the other:
the process hangs at 0% CPU (gdb: both pool threads in `jax::ParallelBatchMap` -> `BlockingCounter::Wait`, the
README's known issue; jaxlib 0.11 builds without that path). `per_datum` keeps every batch below the limit."""


def datum_chunk(C: int) -> int:
    """The most data per batched LAPACK call for C x C blocks: 200,000 / (8 C^3) (eigh's 5 C^3 with a margin).

    Args:
        C: the block order (the number of classes).

    Returns:
        int >= 1 (C = 3: 925; C = 7: 72; C = 10: 25).
    """
    return max(1, LAPACK_INLINE_WORK // (8 * int(C) ** 3))


def placeholder_sites(n: int, C: int, dtype):
    """(b, S, W) = (0, I, 0) per datum: the `warm` argument of a cold start (the solvers then build their own start),
    made on the host so that no program is compiled for it per shape.

    Args:
        n: data; C: classes; dtype: float dtype.

    Returns:
        ((n, C), (n, C, C), (n, C, C)) arrays.
    """
    eye = np.broadcast_to(np.eye(C, dtype=dtype), (n, C, C))
    return tuple(device_array(a) for a in (np.zeros((n, C), dtype), eye, np.zeros((n, C, C), dtype)))


def per_datum(fn):
    """`jax.vmap(fn)` over the leading (datum) axis of every argument, run as `lax.map` over chunks of
    `datum_chunk(C)` data where there are more (C: the largest trailing axis of the arguments), so that each batched
    LAPACK call inside runs inline (`LAPACK_INLINE_WORK`). The same values as the vmap; differentiable.

    Args:
        fn: a function of one datum's arrays (leading axis removed) returning a pytree.

    Returns:
        The mapped function of the stacked arrays.
    """
    def mapped(*args):
        leaves = jax.tree.leaves(args)
        n = leaves[0].shape[0]
        C = max([a.shape[-1] for a in leaves if a.ndim >= 2] or [1])
        parts = -(-n // datum_chunk(C))
        if parts <= 1:
            return jax.vmap(fn)(*args)
        # equal parts (n = 128, C = 7: two of 64, not 72 + 56): no remainder, which lax.map would vmap separately
        return jax.lax.map(lambda xs: fn(*xs), args, batch_size=-(-n // parts))

    return mapped


def sym(X):
    """(X + X^T) / 2 over the last two axes."""
    return 0.5 * (X + jnp.swapaxes(X, -1, -2))


def _spd_inverse_one(A):
    L = jnp.linalg.cholesky(A)
    Li = jax.lax.linalg.triangular_solve(L, jnp.eye(A.shape[-1], dtype=A.dtype), left_side=True, lower=True)
    return sym(Li.T @ Li)


def spd_inverse(A):
    """The inverses of symmetric positive definite blocks (n, C, C) through their Cholesky factors (`per_datum`).

    Args:
        A: (n, C, C) symmetric positive definite blocks.

    Returns:
        (n, C, C) array.
    """
    return per_datum(_spd_inverse_one)(A)


def blocks(A, C):
    """The n diagonal C x C blocks of an (nC, nC) matrix, shape (n, C, C)."""
    n = A.shape[0] // C
    return jnp.einsum("iaib->iab", A.reshape(n, C, n, C))


def blockdiag_left(D, A):
    """blockdiag(D_1..D_n) @ A for D of shape (n, C, C) and A of shape (nC, M)."""
    n, C, _ = D.shape
    return jnp.einsum("iab,ibk->iak", D, A.reshape(n, C, -1)).reshape(n * C, -1)


def blockdiag_right(A, D):
    """A @ blockdiag(D_1..D_n) for A of shape (M, nC)."""
    n, C, _ = D.shape
    return jnp.einsum("kjb,jbc->kjc", A.reshape(A.shape[0], n, C), D).reshape(A.shape[0], n * C)


def blockdiag_dense(D):
    """The (nC, nC) dense matrix with the blocks D (n, C, C) on its diagonal."""
    n, C, _ = D.shape
    return jnp.einsum("ij,iab->iajb", jnp.eye(n, dtype=D.dtype), D).reshape(n * C, n * C)


def sandwich_blocks(V, D):
    """The diagonal blocks of V blockdiag(D) V for symmetric V (nC, nC): O(n^2 C^3)."""
    n, C, _ = D.shape
    N = n * C
    VD = blockdiag_right(V, D)
    return jnp.einsum("iak,kib->iab", VD.reshape(n, C, N), V.reshape(N, n, C))
