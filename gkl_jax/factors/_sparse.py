"""The sparse Cholesky factor with a fixed sparsity pattern (Challis & Barber 2013, Section 4.1.3, "Sparse
Cholesky")."""

from typing import ClassVar, Optional

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._validate import as_float_array, check_finite, check_ndim
from ._base import AbstractFactor, check_initialised, signed_log_abs_diag
from ._kernels import (
    broadcast_variances,
    column_slot_sq_norms,
    column_slots_from_pattern,
    operator_kind,
    pattern_sq_norms_dense,
)


def _pattern(mask):
    """Validated (rows, cols) of an upper-triangular pattern containing the diagonal, sorted row-major."""
    if hasattr(mask, "todense"):
        mask = mask.todense()
    arr = np.asarray(mask)
    if arr.ndim != 2 or arr.shape[0] != arr.shape[1]:
        raise ValueError(f"Sparse: mask must be a square 2-D array, got shape {arr.shape}")
    if arr.dtype.kind not in "biuf":
        raise ValueError(f"Sparse: mask must be boolean (or 0/1), got dtype {arr.dtype}")
    arr = arr != 0
    if np.any(np.tril(arr, -1)):
        i, j = np.nonzero(np.tril(arr, -1))
        raise ValueError(f"Sparse: mask must be upper triangular (C_ij = 0 for j < i); it has entries below the "
                         f"diagonal, e.g. ({int(i[0])}, {int(j[0])})")
    if not np.all(np.diagonal(arr)):
        missing = np.nonzero(~np.diagonal(arr))[0]
        raise ValueError(f"Sparse: mask must contain the diagonal (log det S = 2 sum log|C_ii|); missing "
                         f"{missing[:5].tolist()}")
    rows, cols = np.nonzero(arr)
    return rows.astype(np.int32), cols.astype(np.int32), arr.shape[0]


class Sparse(AbstractFactor):
    """C upper triangular with a fixed sparsity pattern `mask` (a (D, D) boolean array containing the diagonal),
    e.g. from domain knowledge of which variables are marginally dependent (Challis & Barber 2013, §4.1.3).

    Only the pattern's entries are stored: `values[e] = C[rows[e], cols[e]]` (nnz(C) parameters); the pattern's
    index tables are integer leaves computed once at construction.

    Cost of s_n^2 = ||C h_n||^2: O(N nnz(C)) for dense H (a gather of rows of H^T and a segment sum, in chunks of
    sites), O(nnz(H) T) for sparse BCOO H, T the largest number of entries in a column of C, and O(nnz(C)) for the
    identity. Matrix-free H is not supported (ValueError). Concave in (m, C) for log-concave sites.

    Args:
        mask: a (D, D) boolean (or 0/1) upper-triangular array containing the diagonal.
        values: a (nnz,) finite float array, one per mask entry in row-major order, or None for a template.

    Raises:
        ValueError: mask not square, not boolean, with entries below the diagonal or without the full diagonal;
            values of the wrong length or not finite.
    """

    rows: jax.Array
    cols: jax.Array
    slot_rows: jax.Array
    slot_entry: jax.Array
    diag_entry: jax.Array
    values: Optional[jax.Array]
    size: int = eqx.field(static=True)
    concave: ClassVar[bool] = True

    def __init__(self, mask, values=None):
        rows, cols, dim = _pattern(mask)
        slot_rows, slot_entry = column_slots_from_pattern(rows, cols, dim)
        self.size = int(dim)
        self.rows = jnp.asarray(rows)
        self.cols = jnp.asarray(cols)
        self.slot_rows = jnp.asarray(slot_rows.astype(np.int32))
        self.slot_entry = jnp.asarray(slot_entry.astype(np.int32))
        self.diag_entry = jnp.asarray(np.nonzero(rows == cols)[0].astype(np.int32))
        if values is not None:
            values = as_float_array(values, "values")
            check_ndim(values, 1, "values")
            if values.shape[0] != rows.shape[0]:
                raise ValueError(f"Sparse: values must have one entry per mask non-zero ({rows.shape[0]}), "
                                 f"got {values.shape[0]}")
            check_finite(values, "values")
        self.values = values

    @property
    def nnz(self) -> int:
        return int(self.rows.shape[0])

    @property
    def is_initialised(self):
        return self.values is not None

    @property
    def dim(self):
        return self.size

    def initialise(self, dim, variances):
        if dim != self.size:
            raise ValueError(f"Sparse: mask has shape ({self.size}, {self.size}) but the model has dim={dim}")
        v = broadcast_variances(variances, dim)
        values = jnp.zeros((self.nnz,), v.dtype).at[self.diag_entry].set(jnp.sqrt(v))
        return eqx.tree_at(lambda f: f.values, self, values, is_leaf=lambda x: x is None)

    def _slot_values(self):
        padded = jnp.concatenate([self.values, jnp.zeros((1,), self.values.dtype)])
        return padded[self.slot_entry]

    def logdet(self):
        check_initialised(self)
        return 2 * signed_log_abs_diag(self.values[self.diag_entry])

    def project_variances(self, op):
        check_initialised(self)
        kind = operator_kind(op)
        if kind == "identity":
            return self.marginal_variances()
        if kind == "dense":
            return pattern_sq_norms_dense(op.matrix, self.rows, self.cols, self.values, self.dim)
        if kind == "sparse":
            return column_slot_sq_norms(op, self.slot_rows, self._slot_values(), self.dim)
        raise ValueError(f"Sparse factors need a dense, sparse (BCOO) or identity H; got the matrix-free operator "
                         f"{type(op).__name__} (use Chevron, Subspace or FactorAnalysis, which need only H X products)")

    def marginal_variances(self):
        check_initialised(self)
        return jax.ops.segment_sum(jnp.square(self.values), self.cols, num_segments=self.dim)

    def dense(self):
        check_initialised(self)
        return jnp.zeros((self.dim, self.dim), self.values.dtype).at[self.rows, self.cols].set(self.values)

    def matvec(self, v):
        return jax.ops.segment_sum(self.values * v[self.cols], self.rows, num_segments=self.dim)

    def rmatvec(self, z):
        return jax.ops.segment_sum(self.values * z[self.rows], self.cols, num_segments=self.dim)
