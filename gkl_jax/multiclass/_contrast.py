"""The covariance of the class contrasts: the full bound of Chai (2012) on n (C - 1) latents instead of n C.

The softmax is unchanged when the same value is added to every class, and so is the site bound h of Theorem 6:
its g^c (eq. 16) all gain that value. With K^c = I the prior K = K^x (x) I_C is unchanged by any rotation of each
datum's C classes. Rotate them to f_i = P g_i + 1 s_i / sqrt(C), with P (C, C - 1) orthonormal and P^T 1 = 0 (the
Helmert contrasts of `contrast_basis`): the prior makes the contrasts g = (g_1..g_n) and the class sums
s = (s_1..s_n) independent, g ~ N(0, K^x (x) I_{C-1}) and s ~ N(0, K^x), and the likelihood depends on g only.

At every stationary point of log Z_h the site precisions W_i of V = (K^{-1} + W)^{-1} (eq. 28) have 1 in their
null space: there b_i = gbar_i sums to one, so A_i = diag(gbar_i) - gbar_i gbar_i^T has A_i 1 = 0, and the fixed
point W_i + W_i V_i W_i = A_i (eq. 61 with W_i = S_i - V_i^{-1}) gives (I + W_i V_i) W_i 1 = 0, hence W_i 1 = 0 as
I + W_i V_i is invertible. The solver therefore holds W_i = P W^g_i P^T, which contains the optimum. Then V is the
prior over s (exactly) and V^g = ((K^x)^{-1} (x) I_{C-1} + blockdiag(W^g_i))^{-1} over g, so the O((nC)^3)
factorisations of a sweep become O((n (C - 1))^3): 3.4 times fewer flops for three classes. The b step keeps
sum_c b_i^c = 1 (its Newton direction d has 1^T d_i = 1 - 1^T b_i and the start has sum one), so A_i 1 = 0 along
the whole ascent, and the V step's Newton direction, which maps that subspace to itself, is solved in it.
"""

import jax.numpy as jnp
import numpy as np

from .._linalg import tdot


def contrast_basis(C: int, dtype) -> jnp.ndarray:
    """The Helmert contrasts: an orthonormal (C, C - 1) basis P of the vectors whose entries sum to zero.

    Column k (k = 1..C-1) is (1, ..., 1, -k, 0, ..., 0) / sqrt(k (k + 1)) with k ones.

    Args:
        C: the number of classes (>= 2).
        dtype: float dtype.

    Returns:
        (C, C - 1) array with P^T P = I and P^T 1 = 0.
    """
    P = np.zeros((C, C - 1))
    for k in range(1, C):
        P[:k, k - 1] = 1.0
        P[k, k - 1] = -k
        P[:, k - 1] /= np.sqrt(k * (k + 1.0))
    return jnp.asarray(P, dtype)


def to_contrasts(X, P):
    """P^T X_i P for every block.

    Args:
        X: (n, C, C) blocks.
        P: (C, C - 1) `contrast_basis`.

    Returns:
        (n, C - 1, C - 1) array.
    """
    return jnp.einsum("ac,iab,bd->icd", P, X, P)


def from_contrasts(Xg, P):
    """P X^g_i P^T for every block (blocks whose rows and columns sum to zero).

    Args:
        Xg: (n, C - 1, C - 1) blocks.
        P: (C, C - 1) `contrast_basis`.

    Returns:
        (n, C, C) array.
    """
    return jnp.einsum("ac,icd,bd->iab", P, Xg, P)


def contrast_covariance_times(G, Lx, P, u):
    """V u for the covariance that `_sweep._covariance` forms on the contrasts: the contrasts' part G G^T and the
    class sums' prior K^x / C.

    Args:
        G: (n (C-1), n (C-1)) factor of the contrasts' covariance (`_sweep._covariance` with P).
        Lx: (n, n) Cholesky factor of K^x (+ jitter).
        P: (C, C - 1) `contrast_basis`.
        u: (n C,) datum-major vector.

    Returns:
        (n C,) array.
    """
    n = Lx.shape[0]
    C = P.shape[0]
    U = u.reshape(n, C)
    ug = (U @ P).reshape(-1)
    vg = (G @ tdot(G, ug)).reshape(n, -1) @ P.T
    vs = (Lx @ tdot(Lx, U.sum(axis=1)))[:, None] / C
    return (vg + vs).reshape(-1)


def lift_contrasts(Tg, P):
    """(I_n (x) P) T^g (I_n (x) P)^T: a datum-major matrix over the contrasts lifted to the n C latents.

    Args:
        Tg: (n (C-1), n (C-1)) datum-major matrix.
        P: (C, C - 1) `contrast_basis`.

    Returns:
        (n C, n C) array, datum-major.
    """
    C, c = P.shape
    n = Tg.shape[0] // c
    return jnp.einsum("ac,icjd,bd->iajb", P, Tg.reshape(n, c, n, c), P).reshape(n * C, n * C)
