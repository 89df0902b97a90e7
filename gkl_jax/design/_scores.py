"""Bayesian experimental design scores under a fitted Gaussian q(w) = N(m, S), S = C^T C
(Challis & Barber 2013, eq. 16).

Information gain of a block of measurements y* = M* w + e, e ~ N(0, v^2 I), M* in R^{d x D}. Conditioning q on
y* gives the Gaussian posterior with covariance S' = (S^{-1} + M*^T M* / v^2)^{-1}, whatever y* turns out to be,
so the expected entropy reduction is the entropy reduction itself:

    IG(M*) = H[q] - H[q | y*] = 1/2 log det S - 1/2 log det S'
           = 1/2 log det(I + S M*^T M* / v^2)            (S' ^{-1} = S^{-1} (I + S M*^T M* / v^2))
           = 1/2 log det(I + M* S M*^T / v^2)            (Sylvester's determinant identity)
           = 1/2 log det(M* S M*^T + v^2 I) - d/2 log v^2.

The paper writes the fourth form up to the constant c = -d/2 log v^2; `information_gain` returns the exact
entropy difference (zero for M* = 0). For one unit-norm row x it is 1/2 log(1 + x^T S x / v^2), maximised over
the unit sphere by the leading eigenvector of S (the Rayleigh quotient), so the free design directions come
from Lanczos on v -> S v = C^T (C v), products with the structured factor only.

Greedy selection of k rows conditions q on each chosen row before picking the next (the chain rule of
entropy: the joint gain is the sum of the conditional single-row gains). Among eigenvectors u_i of S this only
shrinks the chosen eigenvalue, lambda_i -> lambda_i v^2 / (v^2 + lambda_i), so the greedy free design is
"repeatedly take the eigenvector with the largest current eigenvalue". Over a finite candidate pool it is a
pivoted Cholesky factorisation of the candidate covariance H S H^T, built one column (one product with S) per pick.

Every function takes a `Result` or a `Gaussian`; only `q.factor` (its products C v, C^T z and
project_variances) is used, so the score never depends on which inference method produced q.
"""

import functools

import jax
import jax.numpy as jnp
from jax import lax

from .. import _lanczos
from .._gaussian import Gaussian
from .._result import Result
from .._validate import as_float_array, check_finite, check_int, check_key, is_concrete
from ..operators import AbstractOperator, as_operator


def as_gaussian(result_or_q) -> Gaussian:
    """The Gaussian of a `Result`, or the `Gaussian` itself.

    Args:
        result_or_q: a fitted `gkl_jax.Result` or a `gkl_jax.Gaussian` q = N(m, S) over D variables.

    Returns:
        `gkl_jax.Gaussian`.

    Raises:
        ValueError: neither a Result nor a Gaussian.
    """
    if isinstance(result_or_q, Result):
        return result_or_q.q
    if isinstance(result_or_q, Gaussian):
        return result_or_q
    raise ValueError(f"result_or_q must be a gkl_jax.Result or gkl_jax.Gaussian, got {type(result_or_q).__name__}")


def check_noise_variance(noise_variance):
    v2 = as_float_array(noise_variance, "noise_variance")
    if v2.ndim != 0:
        raise ValueError(f"noise_variance must be a scalar, got shape {v2.shape}")
    if is_concrete(v2) and not bool((v2 > 0) & jnp.isfinite(v2)):
        raise ValueError(f"noise_variance must be positive and finite, got {float(v2)}")
    return v2


def _rows(M, dim, name):
    M = as_float_array(M, name)
    if M.ndim not in (1, 2):
        raise ValueError(f"{name} must be a (D,) row or a (d, D) matrix, got shape {M.shape}")
    M2 = M[None, :] if M.ndim == 1 else M
    if M2.shape[1] != dim:
        raise ValueError(f"{name} rows must have length D={dim} (the latent dimension), got {M2.shape[1]}")
    check_finite(M2, name)
    return M2


def _candidate_operator(candidates, dim, name="candidates"):
    if isinstance(candidates, AbstractOperator):
        op = candidates
    else:
        op = as_operator(_rows(candidates, dim, name), name)
    if op.shape[1] != dim:
        raise ValueError(f"{name} rows must have length D={dim} (the latent dimension), got {op.shape[1]}")
    if op.shape[0] == 0:
        raise ValueError(f"{name} has no rows (an empty candidate pool)")
    return op


def information_gain(result_or_q, M_star, noise_variance):
    """IG(M*) = 1/2 log det(I + M* S M*^T / v^2): the joint entropy reduction of q from measuring the rows of
    `M_star` with noise variance v^2 = `noise_variance` (Challis & Barber 2013, Section 6.3; module doc).

    Args:
        result_or_q: a fitted `gkl_jax.Result` or a `gkl_jax.Gaussian` q = N(m, S) over D variables.
        M_star: (D,) float array for one row, or (d, D) for a block of measurements.
        noise_variance: v^2, a positive finite float scalar.

    Returns:
        float scalar array (nats).

    Raises:
        ValueError: M_star not (D,) or (d, D) or not finite, or a bad noise_variance.
    """
    q = as_gaussian(result_or_q)
    v2 = check_noise_variance(noise_variance)
    M = _rows(M_star, q.dim, "M_star")
    Z = jax.vmap(q.factor.matvec)(M)                 # rows C x_i, so Z Z^T = M* S M*^T
    K = jnp.eye(M.shape[0], dtype=Z.dtype) + (Z @ Z.T) / v2
    return 0.5 * jnp.linalg.slogdet(K)[1]


def candidate_gains(result_or_q, candidates, noise_variance):
    """IG of each candidate row alone, 1/2 log(1 + x_n^T S x_n / v^2), for a (P, D) array or an operator whose
    rows are the candidates (e.g. a wavelet transform: "measure one coefficient"); O(cost of s_n^2).

    Args:
        result_or_q: a fitted `gkl_jax.Result` or a `gkl_jax.Gaussian` q = N(m, S) over D variables.
        candidates: (P, D) float array (or one (D,) row), or a `gkl_jax.operators` operator with P rows.
        noise_variance: v^2, a positive finite float scalar.

    Returns:
        (P,) float array of gains (nats).

    Raises:
        ValueError: candidates empty, with rows of the wrong length or not finite, or a bad noise_variance.
    """
    q = as_gaussian(result_or_q)
    v2 = check_noise_variance(noise_variance)
    op = _candidate_operator(candidates, q.dim)
    return 0.5 * jnp.log1p(q.factor.project_variances(op) / v2)


def greedy_selection(result_or_q, candidates, num: int, noise_variance):
    """Greedily pick `num` rows from a candidate pool, conditioning q on each pick before the next.

    A candidate may be picked again (a repeated measurement) when that is still the most informative. Cost: one
    product with S and one with H, H^T per pick; the candidate matrix H S H^T is never formed.

    Args:
        result_or_q: a fitted `gkl_jax.Result` or a `gkl_jax.Gaussian` q = N(m, S) over D variables.
        candidates: (P, D) float array (or one (D,) row), or a `gkl_jax.operators` operator with P rows.
        num: the number of picks (int >= 1).
        noise_variance: v^2, a positive finite float scalar.

    Returns:
        (indices, gains): (num,) int32 array of candidate rows and (num,) float array, gains[t] =
        1/2 log(1 + d_t / v^2) with d_t the variance of the picked candidate given the earlier picks;
        sum(gains) = IG of the chosen block.

    Raises:
        ValueError: bad candidates, num not an int >= 1, or a bad noise_variance.
    """
    q = as_gaussian(result_or_q)
    v2 = check_noise_variance(noise_variance)
    op = _candidate_operator(candidates, q.dim)
    num = check_int(num, "num", 1)
    return _greedy_pool(q, op, num, v2)


@functools.partial(jax.jit, static_argnums=(2,))
def _greedy_pool(q, op, num, v2):
    d = q.factor.project_variances(op)
    P = d.shape[0]

    def body(t, state):
        d, L, idx, gains = state
        j = jnp.argmax(d)
        e = jnp.zeros(P, d.dtype).at[j].set(1.0)
        col = op.mv(q.factor.covariance_mv(op.rmv(e))) - L @ L[j]
        dj = d[j]
        lt = col / jnp.sqrt(v2 + dj)
        return (jnp.maximum(d - jnp.square(lt), 0.0), L.at[:, t].set(lt), idx.at[t].set(j.astype(idx.dtype)),
                gains.at[t].set(0.5 * jnp.log1p(dj / v2)))

    init = (d, jnp.zeros((P, num), d.dtype), jnp.zeros(num, jnp.int32), jnp.zeros(num, d.dtype))
    _, _, idx, gains = lax.fori_loop(0, num, body, init)
    return idx, gains


def leading_directions(result_or_q, num: int, *, num_vectors=None, key=None):
    """The `num` leading eigenpairs (lambda (num,), U (num, D) unit rows) of S, by Lanczos with full
    reorthogonalisation on v -> S v = C^T (C v) with `num_vectors` (default min(D, max(3 num, num + 20)))
    Krylov vectors (Nickisch 2010, Alg. 3.2). Only products with the factor are used; the Ritz pairs are exact
    when num_vectors = D.

    Args:
        result_or_q: a fitted `gkl_jax.Result` or a `gkl_jax.Gaussian` q = N(m, S) over D variables.
        num: the number of eigenpairs (int in [1, D]).
        num_vectors: Krylov vectors (int in [num, D]), or None for the default.
        key: a `jax.random` key for the Lanczos start (default `jax.random.PRNGKey(0)`).

    Returns:
        (lam, U): (num,) float array of eigenvalues, largest first, and (num, D) float array of unit rows.

    Raises:
        ValueError: num or num_vectors out of range, or a bad key.
    """
    q = as_gaussian(result_or_q)
    num = check_int(num, "num", 1)
    if num > q.dim:
        raise ValueError(f"num must be in [1, D={q.dim}], got {num}")
    k = min(q.dim, max(3 * num, num + 20)) if num_vectors is None else check_int(num_vectors, "num_vectors", 1)
    if k < num or k > q.dim:
        raise ValueError(f"num_vectors must be in [num={num}, D={q.dim}], got {num_vectors}")
    key = jax.random.PRNGKey(0) if key is None else check_key(key)
    return _leading(q, num, k, key)


@functools.partial(jax.jit, static_argnums=(1, 2))
def _leading(q, num, k, key):
    Q, alpha, beta = _lanczos.lanczos(q.factor.covariance_mv, q.dim, k, key, dtype=q.mean.dtype)
    lam, U = _lanczos.ritz_pairs(Q, alpha, beta, num, which="largest")
    return lam, U.T


def optimal_directions(result_or_q, num: int, noise_variance, *, num_vectors=None, key=None):
    """The greedy free design: `num` unit-norm measurement rows maximising the information gain one after the
    other, each an eigenvector of the covariance conditioned on the earlier rows (module doc).

    The first row maximises the single-row gain over the unit sphere.

    Args:
        result_or_q: a fitted `gkl_jax.Result` or a `gkl_jax.Gaussian` q = N(m, S) over D variables.
        num: the number of rows (int >= 1; beyond D, eigenvectors are measured again).
        noise_variance: v^2, a positive finite float scalar.
        num_vectors: Lanczos vectors, as in `leading_directions`.
        key: a `jax.random` key for the Lanczos start.

    Returns:
        (rows, gains): (num, D) float array of unit rows and (num,) float array, sum(gains) =
        information_gain(q, rows, noise_variance) up to the accuracy of the Lanczos eigenvectors.

    Raises:
        ValueError: num not an int >= 1, a bad noise_variance, num_vectors or key.
    """
    q = as_gaussian(result_or_q)
    v2 = check_noise_variance(noise_variance)
    num = check_int(num, "num", 1)
    pool = min(num, q.dim)
    lam, U = leading_directions(q, pool, num_vectors=num_vectors, key=key)
    return _allocate(lam, U, v2, num)


@functools.partial(jax.jit, static_argnums=(3,))
def _allocate(lam, U, v2, num):
    lam = jnp.maximum(lam, 0.0)

    def body(t, state):
        lam, idx, gains = state
        i = jnp.argmax(lam)
        li = lam[i]
        return (lam.at[i].set(li * v2 / (v2 + li)), idx.at[t].set(i.astype(idx.dtype)),
                gains.at[t].set(0.5 * jnp.log1p(li / v2)))

    _, idx, gains = lax.fori_loop(0, num, body, (lam, jnp.zeros(num, jnp.int32), jnp.zeros(num, lam.dtype)))
    return U[idx], gains
