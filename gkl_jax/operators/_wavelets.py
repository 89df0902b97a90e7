"""Orthonormal multi-level 2-D wavelet transforms (Haar and Daubechies-4), matrix-free.

The 1-D single-level analysis of a length-n signal x (n even) with the periodised quadrature-mirror filter pair

    lowpass  a_k = sum_j h_j x_{(2k + j) mod n},      highpass  d_k = sum_j g_j x_{(2k + j) mod n},
    g_j = (-1)^j h_{L-1-j},

is orthonormal (papers/003 Ch. 5.4.1, the FWTN package): Haar h = [1, 1]/sqrt 2, Daubechies-4
h = [1 + sqrt 3, 3 + sqrt 3, 3 - sqrt 3, 1 - sqrt 3]/sqrt 32. The 2-D transform W of a (height, width) image
(w = image.reshape(-1), row-major) is Mallat's pyramid: one level filters the columns (vertical) and then the
rows (horizontal), storing

    [[LL, LH],
     [HL, HH]]           (L/H: low/high pass; first letter vertical, second horizontal)

in place, and recurses on the LL block `levels` times; the coefficient vector is the (height, width) result
flattened row-major. W is orthonormal (W^T W = W W^T = I), so W^{-1} = W^T is the synthesis.

mv/rmv run the fast O(D) filter bank. A 2-D basis function is a tensor product a(i) b(j) of 1-D level
functions, so its square is a(i)^2 b(j)^2: the squared-row products (W o W) v and (W o W)^T y are the same
pyramid with the 1-D level matrices A_l (scaling rows) and B_l (wavelet rows) squared elementwise, computed in
O(D sqrt D) from small (n / 2^l, n) matrices built once per shape in numpy.
"""

import math
from functools import lru_cache

import equinox as eqx
import jax.numpy as jnp
import numpy as np

from ._base import AbstractOperator
from ._finite_difference import check_image_shape

_S3 = math.sqrt(3.0)
FILTERS = {
    "haar": (1 / math.sqrt(2.0), 1 / math.sqrt(2.0)),
    "db4": ((1 + _S3) / math.sqrt(32.0), (3 + _S3) / math.sqrt(32.0), (3 - _S3) / math.sqrt(32.0),
            (1 - _S3) / math.sqrt(32.0)),
}


def _highpass(h):
    n = len(h)
    return tuple((-1) ** j * h[n - 1 - j] for j in range(n))


def default_levels(height: int, width: int) -> int:
    """The most levels for which both sides stay divisible and the coarsest block is at least 4 x 4 (>= 1)."""
    levels = 0
    while (height % 2 ** (levels + 1) == 0 and width % 2 ** (levels + 1) == 0
           and min(height, width) // 2 ** (levels + 1) >= 4):
        levels += 1
    return max(levels, 1)


# ---- the fast filter bank (jax), along axis 0 of an (n, ...) array ----

def _analysis(X, h, g):
    """(lowpass, highpass) halves along axis 0."""
    lo, hi = 0.0, 0.0
    for j in range(len(h)):
        shifted = jnp.roll(X, -j, axis=0)[::2]
        lo = lo + h[j] * shifted
        hi = hi + g[j] * shifted
    return lo, hi


def _upsample(a):
    """a_k placed at index 2k of a length-2n array (zeros at odd indices), along axis 0."""
    both = jnp.stack([a, jnp.zeros_like(a)], axis=1)
    return both.reshape((2 * a.shape[0],) + a.shape[1:])


def _synthesis(lo, hi, h, g):
    """The adjoint (= inverse) of `_analysis`: x_n = sum_k a_k h_{n-2k} + d_k g_{n-2k} (indices mod n)."""
    up_lo, up_hi = _upsample(lo), _upsample(hi)
    out = 0.0
    for j in range(len(h)):
        out = out + jnp.roll(h[j] * up_lo + g[j] * up_hi, j, axis=0)
    return out


def _forward_2d(X, levels, h, g):
    """Mallat pyramid of X: (height, width, K) -> (height, width, K)."""
    if levels == 0:
        return X
    lo, hi = _analysis(X, h, g)                                   # vertical
    ll, lh = (jnp.swapaxes(t, 0, 1) for t in _analysis(jnp.swapaxes(lo, 0, 1), h, g))
    hl, hh = (jnp.swapaxes(t, 0, 1) for t in _analysis(jnp.swapaxes(hi, 0, 1), h, g))
    ll = _forward_2d(ll, levels - 1, h, g)
    return jnp.concatenate([jnp.concatenate([ll, lh], axis=1), jnp.concatenate([hl, hh], axis=1)], axis=0)


def _inverse_2d(Y, levels, h, g):
    """The adjoint (= inverse) of `_forward_2d`."""
    if levels == 0:
        return Y
    h2, w2 = Y.shape[0] // 2, Y.shape[1] // 2
    ll = _inverse_2d(Y[:h2, :w2], levels - 1, h, g)
    lh, hl, hh = Y[:h2, w2:], Y[h2:, :w2], Y[h2:, w2:]
    horizontal = lambda a, d: jnp.swapaxes(_synthesis(jnp.swapaxes(a, 0, 1), jnp.swapaxes(d, 0, 1), h, g), 0, 1)
    lo, hi = horizontal(ll, lh), horizontal(hl, hh)
    return _synthesis(lo, hi, h, g)


# ---- the 1-D level matrices (numpy, cached) for the squared operator ----

@lru_cache(maxsize=64)
def _level_matrices(n: int, levels: int, h: tuple):
    """[(A_l, B_l) for l = 1..levels]: the scaling and wavelet rows of level l as (n / 2^l, n) matrices."""
    g = _highpass(h)
    out, A = [], np.eye(n)
    for _ in range(levels):
        m = A.shape[0]
        lo, hi = np.zeros((m // 2, m)), np.zeros((m // 2, m))
        k = np.arange(m // 2)
        for j in range(len(h)):
            np.add.at(lo, (k, (2 * k + j) % m), h[j])
            np.add.at(hi, (k, (2 * k + j) % m), g[j])
        out.append((lo @ A, hi @ A))
        A = lo @ A
    return tuple(out)


class Wavelet2D(AbstractOperator):
    """The orthonormal `levels`-level 2-D wavelet transform W (D x D) of a (height, width) image.

    `wavelet` is "db4" (Daubechies-4, the default of papers/003 Ch. 5) or "haar". Both sides must be divisible by
    2**levels; `levels=None` picks the most levels that keep the coarsest block at least 4 x 4.
    """

    height: int = eqx.field(static=True)
    width: int = eqx.field(static=True)
    levels: int = eqx.field(static=True)
    wavelet: str = eqx.field(static=True)

    def __init__(self, height: int, width: int, levels=None, wavelet: str = "db4"):
        height, width = check_image_shape(height, width, "Wavelet2D")
        if wavelet not in FILTERS:
            raise ValueError(f"Wavelet2D(wavelet={wavelet!r}) must be one of {tuple(FILTERS)}")
        levels = default_levels(height, width) if levels is None else levels
        if int(levels) != levels or int(levels) < 1:
            raise ValueError(f"Wavelet2D(levels={levels}) must be a positive integer")
        levels = int(levels)
        for name, side in (("height", height), ("width", width)):
            if side % 2 ** levels:
                raise ValueError(f"Wavelet2D(levels={levels}) needs {name}={side} divisible by 2**levels = "
                                 f"{2 ** levels}; reduce levels or crop the image")
        self.height, self.width, self.levels, self.wavelet = height, width, levels, wavelet

    @property
    def shape(self):
        dim = self.height * self.width
        return (dim, dim)

    @property
    def _filters(self):
        h = FILTERS[self.wavelet]
        return h, _highpass(h)

    def _image(self, X):
        return X.reshape(self.height, self.width, -1)

    def mm(self, X):
        Y = _forward_2d(self._image(X), self.levels, *self._filters)
        return Y.reshape(self.shape[0], -1)

    def rmm(self, Y):
        X = _inverse_2d(self._image(Y), self.levels, *self._filters)
        return X.reshape(self.shape[1], -1)

    def mv(self, x):
        return self.mm(x[:, None])[:, 0]

    def rmv(self, y):
        return self.rmm(y[:, None])[:, 0]

    def _squared_levels(self, dtype):
        h = FILTERS[self.wavelet]
        rows = _level_matrices(self.height, self.levels, h)
        cols = _level_matrices(self.width, self.levels, h)
        sq = lambda M: jnp.asarray(np.square(M), dtype=dtype)
        return [(sq(Ar), sq(Br), sq(Ac), sq(Bc)) for (Ar, Br), (Ac, Bc) in zip(rows, cols)]

    def sq_mv(self, v):
        """(W o W) v: the pyramid with squared 1-D level matrices, block by block."""
        V = v.reshape(self.height, self.width)
        Y = jnp.zeros_like(V)
        mats = self._squared_levels(v.dtype)
        for level, (Ar, Br, Ac, Bc) in enumerate(mats, start=1):
            hl, wl = self.height >> level, self.width >> level
            low_rows, high_rows = Ar @ V, Br @ V
            Y = Y.at[:hl, wl:2 * wl].set(low_rows @ Bc.T)
            Y = Y.at[hl:2 * hl, :wl].set(high_rows @ Ac.T)
            Y = Y.at[hl:2 * hl, wl:2 * wl].set(high_rows @ Bc.T)
        Ar, _, Ac, _ = mats[-1]
        hl, wl = self.height >> self.levels, self.width >> self.levels
        Y = Y.at[:hl, :wl].set(Ar @ V @ Ac.T)
        return Y.reshape(-1)

    def sq_rmv(self, y):
        """(W o W)^T y: the transpose of `sq_mv`."""
        Y = y.reshape(self.height, self.width)
        mats = self._squared_levels(y.dtype)
        out = 0.0
        for level, (Ar, Br, Ac, Bc) in enumerate(mats, start=1):
            hl, wl = self.height >> level, self.width >> level
            out = out + Ar.T @ Y[:hl, wl:2 * wl] @ Bc
            out = out + Br.T @ Y[hl:2 * hl, :wl] @ Ac
            out = out + Br.T @ Y[hl:2 * hl, wl:2 * wl] @ Bc
        Ar, _, Ac, _ = mats[-1]
        hl, wl = self.height >> self.levels, self.width >> self.levels
        out = out + Ar.T @ Y[:hl, :wl] @ Ac
        return out.reshape(-1)

    def as_matrix(self):
        return self.mm(jnp.eye(self.shape[1], dtype=jnp.result_type(float)))

    def weighted_gram(self, g):
        """W^T diag(g) W (dense D x D, for the Full factor's fixed point on small images)."""
        W = self.as_matrix().astype(g.dtype)
        return W.T @ (g[:, None] * W)
