"""Kernels shared by the structured factors (Challis & Barber 2013, Section 4.1.3 and App. D).

The bottleneck of every bound evaluation is the projected variances s_n^2 = ||C h_n||^2 (App. D, last column).
The structured factors compute them without ever forming a dense D x D matrix:

- `operator_kind` dispatches on the operator H: the identity (s_n^2 = S_nn, the marginal variances), a dense
  matrix, a BCOO sparse matrix, or a matrix-free operator (only `mv`, `rmv`, `mm`, `rmm`, `sq_mv`, `sq_rmv`).
- `pattern_sq_norms_dense`: dense H and a C given by its non-zero entries; O(N nnz(C)) time, memory bounded by
  chunking over the sites.
- `column_slot_sq_norms`: sparse H and a C given column-wise (column j holds at most T entries);
  O(nnz(H) T) time and memory.
- `site_curvatures`: Gamma_nn = -E[psi_n''] = -2 dI_n/ds_n^2 (Challis & Barber 2013, eq. 11, signed so that
  Gamma >= 0 for log-concave sites), the weights of the optimal precision Sigma^{-1} + H^T Gamma H (eq. 10) that
  the subspace basis uses.
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import sparse as jsparse

from .._linalg import invert_lower
from .._validate import as_float_array, as_int, check_finite, check_int, check_positive
from ..operators import Dense as DenseOperator
from ..operators import Identity as IdentityOperator
from ..operators import Sparse as SparseOperator

_CHUNK_ELEMENTS = 1 << 22


def operator_kind(op) -> str:
    """'identity', 'dense', 'sparse' (BCOO) or 'matrix-free'."""
    if isinstance(op, IdentityOperator):
        return "identity"
    if isinstance(op, DenseOperator):
        return "dense"
    if isinstance(op, SparseOperator):
        return "sparse"
    return "matrix-free"


def low_rank_projection(op, loadings, diagonal, mean=None):
    """s_n^2 = ||L^T h_n||^2 + sum_i diagonal_i H_ni^2, the projected variances of S = L L^T + diag(diagonal)
    (FactorAnalysis: L = Theta; Chevron: L = its first K rows, transposed), and with `mean`, (h_n^T m, s_n^2) from
    the one product H [L, m]. Computing H m on its own takes another pass over a dense H and one more in the
    adjoint. Chevron does not take the mean path: its L is a transpose, which the concatenation copies, and its
    Newton fits were slower with it (design-decisions page)."""
    diag = op.sq_mv(diagonal)
    if mean is None:
        if loadings.shape[1] == 0:
            return diag
        return jnp.sum(jnp.square(op.mm(loadings)), axis=1) + diag
    P = op.mm(jnp.concatenate([loadings, mean[:, None]], axis=1))
    return P[:, -1], jnp.sum(jnp.square(P[:, :-1]), axis=1) + diag


def check_count(value, name: str, owner: str, *, minimum: int = 0) -> int:
    """A non-negative integer shape option (`bandwidth`, `rows`, `rank`), with a ValueError naming it."""
    count = as_int(value)
    if count is None:
        raise ValueError(f"{owner}({name}={value!r}) must be an integer")
    if count < minimum:
        raise ValueError(f"{owner}({name}={count}) must be >= {minimum}")
    return count


def check_shape(x, shape, name: str, owner: str):
    if tuple(x.shape) != tuple(shape):
        raise ValueError(f"{owner}: {name} must have shape {tuple(shape)}, got {tuple(x.shape)}")


def broadcast_variances(variances, dim):
    """`variances` (a scalar or (dim,)) as a float array of shape (dim,), after checking it is positive and finite
    (the starting variances of a factor's `initialise`; an integer 2 would otherwise truncate sqrt(2) to 1)."""
    dim = check_int(dim, "dim", 1)
    v = as_float_array(variances, "variances")
    check_finite(v, "variances")
    check_positive(v, "variances")
    if v.ndim > 1 or (v.ndim == 1 and v.shape[0] != dim):
        raise ValueError(f"variances must be a scalar or have shape ({dim},), got {v.shape}")
    return jnp.broadcast_to(v, (dim,))


def bcoo_triplets(op):
    """(rows, cols, values) of a BCOO operator in the unbatched layout; padding entries (indices out of range, the
    BCOO convention) get value 0 and in-range indices."""
    mat = op.matrix
    if mat.n_batch or mat.n_dense:
        mat = jsparse.bcoo_update_layout(mat, n_batch=0, n_dense=0)
    rows, cols = mat.indices[:, 0], mat.indices[:, 1]
    valid = (rows < mat.shape[0]) & (cols < mat.shape[1])
    return jnp.where(valid, rows, 0), jnp.where(valid, cols, 0), jnp.where(valid, mat.data, 0)


def pattern_sq_norms_dense(H, rows, cols, values, dim):
    """s_n^2 = ||C h_n||^2 for a dense H (N, D) and C with entries C[rows[e], cols[e]] = values[e].

    (C h_n)_i = sum_{e: rows[e] = i} values[e] H[n, cols[e]]: a gather of rows of H^T and a segment sum, O(N nnz(C))
    time; the sites are processed in chunks (`lax.map`, rematerialised under differentiation) so the working memory
    stays at O(nnz(C) x chunk) instead of O(nnz(C) x N).
    """
    num_sites = H.shape[0]
    nnz = max(int(rows.shape[0]), 1)
    chunk = int(max(1, min(num_sites, _CHUNK_ELEMENTS // nnz)))
    num_chunks = -(-num_sites // chunk)
    Ht = jnp.pad(H, ((0, num_chunks * chunk - num_sites), (0, 0))).T.reshape(dim, num_chunks, chunk)

    @jax.checkpoint
    def one_chunk(Hc):  # Hc: (D, chunk)
        Y = jax.ops.segment_sum(Hc[cols] * values[:, None], rows, num_segments=dim)
        return jnp.sum(jnp.square(Y), axis=0)

    s2 = lax.map(one_chunk, jnp.moveaxis(Ht, 1, 0))
    return s2.reshape(-1)[:num_sites]


def column_slot_sq_norms(op, col_rows, col_values, dim):
    """s_n^2 = ||C h_n||^2 for a BCOO H and C given column-wise: column j of C holds col_values[j, t] at row
    col_rows[j, t] (t < T; padding slots have row `dim` and value 0).

    Each non-zero H[n, j] contributes H[n, j] C[i, j] to (C h_n)_i for the T slots of column j. The contributions
    are sorted by (n, i) (the order depends on the indices only, so XLA hoists the sort out of the solver loops),
    summed per (n, i) and squared: O(nnz(H) T) time and memory, no D x D matrix.
    """
    rows, cols, vals = bcoo_triplets(op)
    num_sites = op.shape[0]
    slots = col_rows.shape[1]
    n = jnp.repeat(rows, slots)
    i = jnp.asarray(col_rows)[cols].reshape(-1)
    contrib = (vals[:, None] * col_values[cols]).reshape(-1)
    order = jnp.lexsort((i, n))
    n_sorted, i_sorted = n[order], i[order]
    new = jnp.concatenate([jnp.ones((1,), bool), (n_sorted[1:] != n_sorted[:-1]) | (i_sorted[1:] != i_sorted[:-1])])
    segment = jnp.cumsum(new) - 1
    total = contrib.shape[0]
    y = jax.ops.segment_sum(contrib[order], segment, num_segments=total, indices_are_sorted=True)
    segment_site = jnp.zeros((total,), n.dtype).at[segment].max(n_sorted)
    return jax.ops.segment_sum(jnp.square(y), segment_site, num_segments=num_sites)


def column_slots_from_pattern(r, c, dim: int):
    """(D, T) slot tables of a sparsity pattern (numpy, at construction): for column j, the rows of its entries and
    their entry indices (padding: row `dim`, entry index nnz)."""
    r = np.asarray(r, dtype=np.int64)
    c = np.asarray(c, dtype=np.int64)
    nnz = r.shape[0]
    counts = np.bincount(c, minlength=dim)
    slots = max(int(counts.max(initial=0)), 1)
    order = np.lexsort((r, c))
    start = np.concatenate([[0], np.cumsum(counts)[:-1]])
    position = np.arange(nnz) - start[c[order]]
    slot_rows = np.full((dim, slots), dim, dtype=np.int64)
    slot_entry = np.full((dim, slots), nnz, dtype=np.int64)
    slot_rows[c[order], position] = r[order]
    slot_entry[c[order], position] = order
    return slot_rows, slot_entry


def site_curvatures(model, q):
    """[(H_g, Gamma_g)] per site group: Gamma_nn = -2 dI_n/ds_n^2 = -E[psi_n''(m_n + z s_n)] (eq. 11, sign
    corrected), clipped at 0 so that Sigma^{-1} + H^T Gamma H is positive semi-definite for any potential."""
    out = []
    for sites in model.sites:
        m_n, s2_n = sites.project(q)
        dI_ds2 = jax.grad(lambda v: jnp.sum(sites.potential.expected_log_phi(m_n, v)))(s2_n)
        out.append((sites.operator(model.dim), jnp.maximum(-2 * dI_ds2, 0.0)))
    return out


def precision_mm(model, curvatures, X):
    """(Sigma^{-1} + sum_g H_g^T Gamma_g H_g) X for X of shape (D, M), matrix-free (eq. 10)."""
    out = jnp.zeros_like(X)
    for op, gamma in curvatures:
        out = out + op.rmm(gamma[:, None] * op.mm(X))
    if model.prior is not None:
        out = out + jax.vmap(model.prior.precision_mv, in_axes=1, out_axes=1)(X)
    return out


def precision_trace(model, curvatures):
    """tr(Sigma^{-1} + sum_g H_g^T Gamma_g H_g) = tr(Sigma^{-1}) + sum_g sum_n Gamma_n ||h_n||^2."""
    total = jnp.zeros((), curvatures[0][1].dtype if curvatures else jnp.result_type(float))
    for op, gamma in curvatures:
        total = total + jnp.sum(op.sq_rmv(gamma))
    if model.prior is not None:
        total = total + jnp.sum(model.prior.precision_diagonal())
    return total


def orthonormal(X, nearly_orthonormal=False):
    """Q with orthonormal columns spanning X (D, M): shifted Cholesky QR followed by two Cholesky QR passes
    (shiftedCholeskyQR3, Fukaya et al. 2020): matrix products and M x M Cholesky factors only, stable for any
    numerically full-rank X (faster than jaxlib's LAPACK QR on the CPU). diag(R) > 0, so Q is continuous in X.
    Each pass applies R^{-1} as a product with the M x M inverse, which XLA's CPU backend runs faster than a
    triangular solve with D right-hand sides, to the same result up to round-off.

    With `nearly_orthonormal` (X^T X = I + E with ||E|| << 1, as in the second pass of a block Gram-Schmidt) one
    Cholesky QR pass, whose loss of orthogonality is O(eps cond(X)^2) = O(eps)."""
    D, M = X.shape
    eye = jnp.eye(M, dtype=X.dtype)

    def cholesky_qr(X, shift):
        L = jnp.linalg.cholesky(X.T @ X + shift * eye)                  # X^T X = R^T R, R = L^T
        return X @ invert_lower(L).T

    if nearly_orthonormal:
        return cholesky_qr(X, 0.0)
    shift = 11 * (D * M + M * (M + 1)) * jnp.finfo(X.dtype).eps * jnp.sum(jnp.square(X))
    return cholesky_qr(cholesky_qr(cholesky_qr(X, shift), 0.0), 0.0)
