"""Row subsets of a `Sites` group: minibatches (gathered rows) and chunks (contiguous slices).

The bound (Challis & Barber 2013, eq. 7) is a sum over sites, so any subset of rows of H with the matching per-site data
(labels, scales, offsets) is again a `Sites` group; `take_sites` and `slice_sites` build it inside `jit`
without copying the rest of the data. Per-site data are the potential's array fields whose leading axis has
length N (scalars are shared by every site and kept as they are).
"""

import equinox as eqx
import jax
import jax.numpy as jnp
from jax import lax

from .._model import Sites
from .._validate import check_indices, check_int
from ..operators import AbstractOperator, Dense, Identity


class SelectRows(AbstractOperator):
    """The rows `indices` of the D x D identity: h_k = e_{indices[k]}.

    A minibatch or chunk of `Sites(None, ...)` (one site per latent variable, e.g. Gaussian-process sites)
    without forming the identity: projections are gathers and transposed products are scatter-adds.

    Args:
        indices: (k,) integer array of rows in [0, dim).
        dim: D, an int >= 1.

    Raises:
        ValueError: dim not an int >= 1, or indices not a 1-D integer array within [0, dim).
    """

    indices: jax.Array
    dim: int = eqx.field(static=True)

    def __init__(self, indices, dim: int):
        self.dim = check_int(dim, "dim", 1)
        self.indices = check_indices(indices, self.dim)

    @property
    def shape(self):
        return (int(self.indices.shape[0]), self.dim)

    def mv(self, x):
        return x[self.indices]

    def rmv(self, y):
        return jnp.zeros(self.dim, y.dtype).at[self.indices].add(y)

    def mm(self, X):
        return X[self.indices]

    def rmm(self, Y):
        return jnp.zeros((self.dim, Y.shape[1]), Y.dtype).at[self.indices].add(Y)

    def sq_mv(self, v):
        return v[self.indices]

    def sq_rmv(self, y):
        return self.rmv(y)

    def as_matrix(self):
        return jnp.eye(self.dim)[self.indices]

    def weighted_gram(self, g):
        return jnp.diag(self.rmv(g))


def num_sites(sites: Sites, dim: int) -> int:
    """N, the number of rows of the group's projection."""
    return int(sites.operator(dim).shape[0])


def _is_site_array(x, n):
    return eqx.is_array(x) and x.ndim >= 1 and x.shape[0] == n


def _subset(sites: Sites, dim: int, rows_of_array, rows_of_operator) -> Sites:
    n = num_sites(sites, dim)
    op = sites.operator(dim)
    potential = jax.tree.map(lambda x: rows_of_array(x) if _is_site_array(x, n) else x, sites.potential)
    offset, var_offset = (rows_of_array(a) if a.ndim == 1 else a for a in (sites.offset, sites.variance_offset))
    # tree_at, not the constructor: the data were validated when the group was built, and the constructor's
    # value checks cannot run inside `jax.checkpoint` (the chunked bound rematerialises chunks).
    return eqx.tree_at(lambda s: (s.H, s.potential, s.offset, s.variance_offset), sites,
                       (rows_of_operator(op), potential, offset, var_offset), is_leaf=lambda x: x is None)


def _unsupported(op):
    return ValueError(f"subsampling sites needs a dense H or H=None (identity), got {type(op).__name__}; "
                      "densify it (gkl_jax.operators.Dense(H.as_matrix())) or fit without minibatches")


def take_sites(sites: Sites, indices, dim: int) -> Sites:
    """The group restricted to the rows `indices` (rows may repeat).

    Args:
        sites: a `gkl_jax.Sites` group with a dense H, H=None or a `SelectRows` H.
        indices: (k,) integer array of rows in [0, N).
        dim: D, the model's dimension.

    Returns:
        `gkl_jax.Sites` with k rows (per-site data of length N subset alike).

    Raises:
        ValueError: indices not 1-D integers in [0, N), or an H that cannot be subsampled.
    """
    indices = check_indices(indices, num_sites(sites, dim))

    def rows_of_operator(op):
        if isinstance(op, Dense):
            return eqx.tree_at(lambda o: o.matrix, op, op.matrix[indices])
        if isinstance(op, Identity):
            return SelectRows(indices, dim)
        if isinstance(op, SelectRows):
            return SelectRows(op.indices[indices], dim)
        raise _unsupported(op)

    return _subset(sites, dim, lambda x: x[indices], rows_of_operator)


def slice_sites(sites: Sites, start, size: int, dim: int) -> Sites:
    """The group restricted to rows start, ..., start + size - 1 (like `lax.dynamic_slice`, a start past
    N - size is clamped to N - size).

    Args:
        sites: a `gkl_jax.Sites` group with a dense H, H=None or a `SelectRows` H.
        start: the first row, an int or an int scalar array (may be traced).
        size: the number of rows, a static int in [1, N].
        dim: D, the model's dimension.

    Returns:
        `gkl_jax.Sites` with `size` rows.

    Raises:
        ValueError: size not an int in [1, N], or an H that cannot be sliced.
    """
    n = num_sites(sites, dim)
    size = check_int(size, "size", 1)
    if size > n:
        raise ValueError(f"size must be at most N = {n} (the group's rows), got {size}")
    start = jnp.clip(start, 0, n - size)

    def rows_of_operator(op):
        if isinstance(op, Dense):
            return eqx.tree_at(lambda o: o.matrix, op, lax.dynamic_slice_in_dim(op.matrix, start, size, axis=0))
        if isinstance(op, Identity):
            return SelectRows(start + jnp.arange(size), dim)
        if isinstance(op, SelectRows):
            return SelectRows(lax.dynamic_slice_in_dim(op.indices, start, size), dim)
        raise _unsupported(op)

    return _subset(sites, dim, lambda x: lax.dynamic_slice_in_dim(x, start, size, axis=0), rows_of_operator)


def check_subsampling(sites: Sites, dim: int, name: str = "model") -> None:
    """Raise ValueError (naming `name`) when the group's H cannot be subsampled."""
    op = sites.operator(dim)
    if not isinstance(op, (Dense, Identity, SelectRows)):
        raise ValueError(f"{name}: " + str(_unsupported(op)))
