"""Block-diagonal helpers for datum-major (nC, nC) matrices (the i-th C x C diagonal block belongs to datum i)."""

import jax.numpy as jnp


def sym(X):
    """(X + X^T) / 2 over the last two axes."""
    return 0.5 * (X + jnp.swapaxes(X, -1, -2))


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
