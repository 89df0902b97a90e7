"""The banded upper-triangular Cholesky factor (Challis & Barber 2013, Section 4.1.3, "Banded Cholesky")."""

from typing import ClassVar, Optional

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._validate import as_float_array, check_finite, check_ndim
from ._base import AbstractFactor, check_initialised, signed_log_abs_diag
from ._kernels import broadcast_variances, check_count, column_slot_sq_norms, operator_kind

_SHIFT_SUM_MAX_BANDWIDTH = 8


def _block_tables(dim: int, bandwidth: int):
    """A gather table that lays the bands out as b x 2b blocks, b = bandwidth: row block I of C (rows
    Ib .. Ib + b - 1) is zero outside columns Ib .. Ib + 2b - 1, and table[I] = C[Ib:(I+1)b, Ib:(I+2)b] as
    indices into the flattened bands; structural zeros point at a trailing zero."""
    b = bandwidth
    nb = -(-dim // b)
    r = np.arange(b)[None, :, None]
    c = np.arange(2 * b)[None, None, :]
    start = (np.arange(nb) * b)[:, None, None]
    k = c - r
    return nb, np.where((k >= 0) & (k <= b) & (start + c < dim), k * dim + start + r, (b + 1) * dim)


class Banded(AbstractFactor):
    """C upper triangular with C_ij = 0 for j > i + B (Challis & Barber 2013, §4.1.3): B = `bandwidth`
    super-diagonals.

    Convention: `bandwidth=0` is the diagonal factor and `bandwidth=D-1` the full one. (Challis & Barber 2011, Table 2
    calls the diagonal factor "bandwidth 1", i.e. it counts the main diagonal; here the bandwidth counts the
    super-diagonals, as in the definition C_ij = 0 for j > i + B.) S = C^T C is banded with the same bandwidth: the
    covariance of variables more than B indices apart is zero, while the precision is in general dense.

    Band storage: `bands[k, i] = C[i, i + k]`, shape (B + 1, D); the entries with i + k >= D are structural zeros,
    kept at zero and masked out of every computation (zero gradient). O(D B) storage.

    Cost of s_n^2 = ||C h_n||^2 (App. D): O(N D B) for dense H (as batched B x 2B block products, or as B + 1
    shifted products for B < 8), O(nnz(H) B) for sparse BCOO H, O(D B) for the identity. Matrix-free H is not
    supported (it would need D operator products); `project_variances` raises a ValueError for it.
    Concave in (m, C) for log-concave sites (a linear restriction of the full Cholesky factor).

    Args:
        bandwidth: B, the number of super-diagonals (int >= 0, less than D).
        bands: a (B + 1, D) finite float array, or None for a template.

    Raises:
        ValueError: bandwidth not a non-negative int or >= D, or bands of the wrong shape or not finite.
    """

    bandwidth: int = eqx.field(static=True)
    bands: Optional[jax.Array]
    concave: ClassVar[bool] = True

    def __init__(self, bandwidth: int, bands=None):
        self.bandwidth = check_count(bandwidth, "bandwidth", "Banded")
        if bands is not None:
            bands = as_float_array(bands, "bands")
            check_ndim(bands, 2, "bands")
            if bands.shape[0] != self.bandwidth + 1:
                raise ValueError(f"Banded(bandwidth={self.bandwidth}): bands must have {self.bandwidth + 1} rows, "
                                 f"got shape {tuple(bands.shape)}")
            _check_bandwidth(self.bandwidth, bands.shape[1])
            check_finite(bands, "bands")
        self.bands = bands

    @property
    def is_initialised(self):
        return self.bands is not None

    @property
    def dim(self):
        check_initialised(self)
        return int(self.bands.shape[1])

    def initialise(self, dim, variances):
        _check_bandwidth(self.bandwidth, dim)
        v = broadcast_variances(variances, dim)
        return Banded(self.bandwidth, jnp.zeros((self.bandwidth + 1, dim), v.dtype).at[0].set(jnp.sqrt(v)))

    def _valid(self):
        """(B + 1, D) mask of the entries inside the matrix (i + k < D)."""
        k = np.arange(self.bandwidth + 1)[:, None]
        i = np.arange(self.dim)[None, :]
        return i + k < self.dim

    def masked_bands(self):
        """The band storage with its structural zeros (i + k >= D) set to 0.

        Returns:
            (B + 1, D) float array, `[k, i] = C[i, i + k]`.
        """
        return jnp.where(self._valid(), self.bands, 0.0)

    def _diagonal_gather(self, values):
        """out[k, j] = values[k, j - k] (0 where j < k): column j of C is out[:, j] at rows j - k."""
        B, D = self.bandwidth, self.dim
        padded = jnp.pad(values, ((0, 0), (B, 0)))
        k = np.arange(B + 1)[:, None]
        return padded[k, np.arange(D)[None, :] - k + B]

    def logdet(self):
        check_initialised(self)
        return 2 * signed_log_abs_diag(self.bands[0])

    def project_variances(self, op):
        kind = operator_kind(op)
        if kind == "identity":
            return self.marginal_variances()
        if kind == "dense":
            return self._dense_sq_norms(op.matrix)
        if kind == "sparse":
            rows = np.arange(self.dim)[:, None] - np.arange(self.bandwidth + 1)[None, :]
            col_rows = np.where(rows >= 0, rows, self.dim)
            col_values = self._diagonal_gather(self.masked_bands()).T
            return column_slot_sq_norms(op, col_rows, col_values, self.dim)
        raise ValueError(f"Banded factors need a dense, sparse (BCOO) or identity H; got the matrix-free operator "
                         f"{type(op).__name__} (use Chevron, Subspace or FactorAnalysis, which need only H X products)")

    def _dense_sq_norms(self, H):
        B, D = self.bandwidth, self.dim
        bands = self.masked_bands()
        if B < _SHIFT_SUM_MAX_BANDWIDTH:
            Hp = jnp.pad(H, ((0, 0), (0, B)))
            Y = bands[0] * H
            for k in range(1, B + 1):
                Y = Y + bands[k] * Hp[:, k:k + D]
            return jnp.sum(jnp.square(Y), axis=1)
        nb, table = _block_tables(D, B)
        flat = jnp.concatenate([bands.reshape(-1), jnp.zeros((1,), bands.dtype)])
        # Row block I of C meets rows Ib .. Ib + 2B - 1 of H^T: one batched GEMM (nb, B, 2B) x (nb, 2B, N), the
        # batch axis leading. (Taking H as (N, nb + 1, B) made XLA transpose H at every product: 2x the fit time
        # at D = 500, N = 2500.) The windows of H^T are loop-invariant, so XLA forms them once per fit (2 N D
        # memory).
        Ht = jnp.pad(H.T, ((0, (nb + 1) * B - D), (0, 0))).reshape(nb + 1, B, H.shape[0])
        windows = jnp.concatenate([Ht[:nb], Ht[1:]], axis=1)
        return jnp.sum(jnp.square(jnp.einsum("Ijn,Iij->Iin", windows, flat[table])), axis=(0, 1))

    def marginal_variances(self):
        check_initialised(self)
        return jnp.sum(self._diagonal_gather(jnp.square(self.masked_bands())), axis=0)

    def dense(self):
        check_initialised(self)
        D = self.dim
        k, i = np.nonzero(self._valid())
        return jnp.zeros((D, D), self.bands.dtype).at[i, i + k].set(self.bands[k, i])

    def matvec(self, v):
        B, D = self.bandwidth, self.dim
        vp = jnp.pad(v, (0, B))
        idx = np.arange(D)[None, :] + np.arange(B + 1)[:, None]
        return jnp.sum(self.masked_bands() * vp[idx], axis=0)

    def rmatvec(self, z):
        return jnp.sum(self._diagonal_gather(self.masked_bands() * z[None, :]), axis=0)


def _check_bandwidth(bandwidth, dim):
    if bandwidth >= dim:
        raise ValueError(f"Banded(bandwidth={bandwidth}) must be < dim={dim} (bandwidth={dim - 1} is the full factor)")
