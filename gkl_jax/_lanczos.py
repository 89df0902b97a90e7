"""Lanczos tridiagonalisation with full reorthogonalisation (thesis Alg. 3.2, Nickisch 2010, Ch. 3.5.4).

For a symmetric operator A (given only through `matvec(v) = A v`), k Lanczos steps from a start vector q_1 give
an orthonormal Q = [q_1 .. q_k] (D, k) and a tridiagonal T = Q^T A Q with diagonal `alpha` (k,) and
off-diagonal `beta` (k-1,). Every new vector is Gram-Schmidt reorthogonalised twice against all previous ones
("twice is enough"), so Q stays orthonormal to round-off even after Ritz values converge (Paige 1976); cost k
matvecs plus O(D k^2), storage O(D k). If the Krylov space is exhausted (an invariant subspace; beta ~ 0) the
iteration restarts from a fresh random vector orthogonal to Q and records beta = 0, so Q always has k
orthonormal columns and Q^T A Q = T still holds (T is then block tridiagonal with a zero coupling).

Public API (all jit-able; `dim` and `num_vectors` are static Python ints):

- `lanczos(matvec, dim, num_vectors, key_or_start) -> (Q, alpha, beta)`
    `key_or_start` is a `jax.random` key (start vector ~ N(0, I), normalised) or a (dim,) float start vector.
- `tridiagonal(alpha, beta) -> T` the dense (k, k) tridiagonal matrix.
- `ritz_pairs(Q, alpha, beta, num=None, which="largest"|"smallest") -> (theta (num,), vectors (dim, num))`
    the extreme Ritz values (ascending for "smallest", descending for "largest") and unit Ritz vectors Q y.
- `inverse_factor(Q, alpha, beta) -> W (dim, k)` with W W^T = Q T^{-1} Q^T, the low-rank approximation of
    A^{-1} (A symmetric positive definite).
- `variance_estimates(Q, alpha, beta, op=None) -> (N,)` nu_hat_n = h_n^T Q T^{-1} Q^T h_n for the rows of
    an operator H (`gkl_jax.operators`; None: the identity, i.e. diag(Q T^{-1} Q^T)).
- `estimate_variances(matvec, dim, num_vectors, key_or_start, op=None)` the two steps in one call.
- `slq_logdet(alpha, beta, start_norm_sq)` one stochastic-Lanczos-quadrature probe of log det A.

Variance estimates (thesis Ch. 3.5.4): for SPD A, nu_hat_n = max_{u in span Q} 2 h_n^T u - u^T A u, so they
never exceed the exact h_n^T A^{-1} h_n, grow monotonically with k (the Krylov spaces are nested) and are
exact when k = D. The extreme eigenvalues (largest variances of A^{-1} are the smallest eigenvalues of A)
converge first, which is why the estimates capture the leading posterior directions.
"""

from typing import Optional

import equinox as eqx
import jax
import jax.numpy as jnp
from jax import lax

from ._linalg import tdot
from ._validate import check_int

__all__ = ["lanczos", "tridiagonal", "ritz_pairs", "inverse_factor", "variance_estimates", "estimate_variances",
           "slq_logdet"]


def _is_key(x) -> bool:
    dtype = getattr(x, "dtype", None)
    if dtype is None:
        return False
    if jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
        return True
    return dtype == jnp.uint32 and getattr(x, "shape", None) == (2,)


def _check_sizes(dim, num_vectors):
    dim, k = check_int(dim, "dim", 1), check_int(num_vectors, "num_vectors", 1)
    if k > dim:
        raise ValueError(f"num_vectors must be in [1, dim={dim}], got {num_vectors}")
    return dim, k


def _start(key_or_start, dim, dtype):
    """(unit start vector, key for restart vectors)."""
    if _is_key(key_or_start):
        key, sub = jax.random.split(key_or_start)
        dtype = jnp.result_type(float) if dtype is None else dtype
        v = jax.random.normal(sub, (dim,), dtype)
    else:
        v = jnp.asarray(key_or_start)
        if v.shape != (dim,):
            raise ValueError(f"key_or_start must be a jax.random key or a ({dim},) start vector, got shape {v.shape}")
        if not jnp.issubdtype(v.dtype, jnp.floating):
            v = v.astype(jnp.result_type(float))
        if dtype is not None:
            v = v.astype(dtype)
        key = jax.random.PRNGKey(0)
    return v / jnp.linalg.norm(v), key


def _orthogonalise(Q, r):
    """r minus its projection on the columns of Q, twice (classical Gram-Schmidt with reorthogonalisation)."""
    r = r - Q @ tdot(Q, r)
    return r - Q @ tdot(Q, r)


def lanczos(matvec, dim: int, num_vectors: int, key_or_start, *, dtype=None):
    """k = `num_vectors` Lanczos steps on the symmetric operator `matvec` (v -> A v) of size `dim`.

    Returns (Q (dim, k) orthonormal, alpha (k,), beta (k-1,)) with Q^T A Q = tridiag(beta, alpha, beta).
    Jit-able (one `lax.fori_loop`); `dim` and `num_vectors` must be static. Raises ValueError unless
    1 <= num_vectors <= dim.
    """
    dim, k = _check_sizes(dim, num_vectors)
    q0, key = _start(key_or_start, dim, dtype)
    dtype = q0.dtype
    eps = jnp.finfo(dtype).eps
    # Restart directions for (rare) exact breakdowns: drawn once, used only where beta ~ 0.
    restarts = jax.random.normal(key, (k, dim), dtype)

    Q = jnp.zeros((dim, k), dtype).at[:, 0].set(q0)
    alpha = jnp.zeros((k,), dtype)
    beta = jnp.zeros((k,), dtype)  # beta[j] couples q_j and q_{j+1}; beta[k-1] is the final residual norm

    def body(j, state):
        Q, alpha, beta, anorm = state
        q = Q[:, j]
        v = matvec(q)
        prev = jnp.where(j > 0, beta[jnp.maximum(j - 1, 0)], 0.0) * Q[:, jnp.maximum(j - 1, 0)]
        v = v - prev
        a = q @ v
        r = _orthogonalise(Q, v - a * q)
        b = jnp.linalg.norm(r)
        anorm = jnp.maximum(anorm, jnp.abs(a) + b + jnp.where(j > 0, beta[jnp.maximum(j - 1, 0)], 0.0))
        breakdown = b <= 10 * jnp.sqrt(dim) * eps * anorm
        fresh = _orthogonalise(Q, restarts[j])
        fresh = fresh / jnp.linalg.norm(fresh)
        q_next = jnp.where(breakdown, fresh, r / jnp.where(breakdown, 1.0, b))
        b = jnp.where(breakdown, 0.0, b)
        has_next = j + 1 < k
        Q = jnp.where(has_next, Q.at[:, jnp.minimum(j + 1, k - 1)].set(q_next), Q)
        return Q, alpha.at[j].set(a), beta.at[j].set(b), anorm

    Q, alpha, beta, _ = lax.fori_loop(0, k, body, (Q, alpha, beta, jnp.zeros((), dtype)))
    return Q, alpha, beta[: k - 1]


def tridiagonal(alpha, beta):
    """The dense symmetric tridiagonal T with diagonal alpha and off-diagonal beta."""
    return jnp.diag(alpha) + jnp.diag(beta, 1) + jnp.diag(beta, -1)


def ritz_pairs(Q, alpha, beta, num: Optional[int] = None, which: str = "largest"):
    """The `num` extreme Ritz pairs (theta_i, Q y_i) of T = Q^T A Q: "largest" (descending) or "smallest"
    (ascending). The extreme ones converge first; they approximate eigenpairs of A."""
    k = alpha.shape[0]
    num = k if num is None else check_int(num, "num", 1)
    if num > k:
        raise ValueError(f"num must be in [1, {k}], got {num}")
    if which not in ("largest", "smallest"):
        raise ValueError(f"which must be 'largest' or 'smallest', got {which!r}")
    theta, Y = jnp.linalg.eigh(tridiagonal(alpha, beta))
    if which == "largest":
        theta, Y = theta[::-1], Y[:, ::-1]
    return theta[:num], Q @ Y[:, :num]


@jax.jit
def inverse_factor(Q, alpha, beta):
    """W (dim, k) with W W^T = Q T^{-1} Q^T, the rank-k Lanczos approximation of A^{-1} (A SPD).

    Uses T = U diag(theta) U^T, W = Q U diag(theta^{-1/2}); Ritz values <= 0 (A not positive definite, or
    round-off) contribute nothing."""
    theta, U = jnp.linalg.eigh(tridiagonal(alpha, beta))
    scale = jnp.where(theta > 0, 1 / jnp.sqrt(jnp.where(theta > 0, theta, 1.0)), 0.0)
    return Q @ (U * scale)


@eqx.filter_jit
def variance_estimates(Q, alpha, beta, op=None):
    """nu_hat_n = h_n^T Q T^{-1} Q^T h_n for the rows h_n of `op` (None: diag(Q T^{-1} Q^T)).

    Underestimates the exact h_n^T A^{-1} h_n, increases with k and is exact at k = D (module docstring)."""
    W = inverse_factor(Q, alpha, beta)
    HW = W if op is None else op.mm(W)
    return jnp.sum(jnp.square(HW), axis=1)


def estimate_variances(matvec, dim: int, num_vectors: int, key_or_start, op=None):
    """`variance_estimates` after `lanczos`: (nu_hat, (Q, alpha, beta))."""
    Q, alpha, beta = lanczos(matvec, dim, num_vectors, key_or_start)
    return variance_estimates(Q, alpha, beta, op), (Q, alpha, beta)


@jax.jit
def slq_logdet(alpha, beta, start_norm_sq):
    """One stochastic Lanczos quadrature probe of log det A (Ubaru, Chen & Saad 2017):

        v^T log(A) v ~= ||v||^2 e_1^T log(T) e_1,  T from Lanczos started at v / ||v||,

    an unbiased estimate of tr log A = log det A when E[v v^T] = I (||v||^2 = dim for a Rademacher probe).
    Exact in v for k = D; the Hutchinson variance across probes remains."""
    theta, U = jnp.linalg.eigh(tridiagonal(alpha, beta))
    return start_norm_sq * jnp.sum(jnp.square(U[0]) * jnp.log(jnp.maximum(theta, jnp.finfo(theta.dtype).tiny)))
