"""Orthonormal multi-level 2-D wavelet transforms (Haar and Daubechies-4), matrix-free.

The 1-D single-level analysis of a length-n signal x (n even) with the periodised quadrature-mirror filter pair

    lowpass  a_k = sum_j h_j x_{(2k + j) mod n},      highpass  d_k = sum_j g_j x_{(2k + j) mod n},
    g_j = (-1)^j h_{L-1-j},

is orthonormal (Nickisch 2010, Ch. 5.4.1, the FWTN package): Haar h = [1, 1]/sqrt 2, Daubechies-4
h = [1 + sqrt 3, 3 + sqrt 3, 3 - sqrt 3, 1 - sqrt 3]/sqrt 32. The 2-D transform W of a (height, width) image
(w = image.reshape(-1), row-major) is Mallat's pyramid: one level filters the columns (vertical) and then the
rows (horizontal), storing

    [[LL, LH],
     [HL, HH]]           (L/H: low/high pass; first letter vertical, second horizontal)

in place, and recurses on the LL block `levels` times; the coefficient vector is the (height, width) result
flattened row-major. W is orthonormal (W^T W = W W^T = I), so W^{-1} = W^T is the synthesis.

Implementation. The level-l block of the pyramid is G_l X G_l^T, with G_l = [A_l; B_l] the scaling (A_l)
and wavelet (B_l) rows of level l of the 1-D multi-level transform, an (n / 2^(l-1), n) matrix built once per
shape in numpy (`level_matrices`). Every product is therefore a handful of small matrix products per level:
O(D^1.5) flops (2 n^3 at level 1 for an n x n image) instead of the O(D) filter bank (FWTN), but a few
matmul-friendly XLA operations, which compile fast and run well on CPUs and accelerators at the image sizes of
the papers (64 x 64 to 256 x 256). A 2-D basis function is a tensor product a(i) b(j) of 1-D level functions, so
its square is a(i)^2 b(j)^2: the squared-row products (W o W) v and (W o W)^T y are the same pyramid with G_l
squared elementwise.
"""

import math
from functools import lru_cache

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._linalg import tdot
from .._validate import as_int
from ._base import AbstractOperator, check_length
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


@lru_cache(maxsize=64)
def level_matrices(n: int, levels: int, h: tuple):
    """[G_l for l = 1..levels]: G_l = [A_l; B_l] (n / 2^(l-1), n), the scaling rows A_l and wavelet rows B_l of
    level l of the 1-D periodic multi-level transform of a length-n signal (numpy, float64, cached)."""
    g = _highpass(h)
    out, A = [], np.eye(n)
    for _ in range(levels):
        m = A.shape[0]
        step = np.zeros((m, m))
        k = np.arange(m // 2)
        for j in range(len(h)):
            np.add.at(step, (k, (2 * k + j) % m), h[j])
            np.add.at(step, (m // 2 + k, (2 * k + j) % m), g[j])
        G = step @ A
        out.append(G)
        A = G[: m // 2]
    return tuple(out)


def _pyramid(X, rows, cols):
    """Mallat's layout from the level matrices: Y = G_1 X G_1^T with its top-left (LL) quadrant replaced by
    G_2 X G_2^T, whose LL quadrant is replaced by G_3 X G_3^T, ... . X: (height, width, K)."""
    Y = None
    for Gr, Gc in zip(reversed(rows), reversed(cols)):
        block = jnp.einsum("ai,ijk,bj->abk", Gr, X, Gc)
        if Y is not None:
            block = jax.lax.dynamic_update_slice(block, Y, (0, 0, 0))
        Y = block
    return Y


def _pyramid_transpose(Y, rows, cols):
    """The transpose of `_pyramid`: sum_l G_l^T Y_l G_l over the level blocks Y_l (their LL quadrant zeroed for
    every level but the coarsest)."""
    out = 0.0
    levels = len(rows)
    for level, (Gr, Gc) in enumerate(zip(rows, cols), start=1):
        block = Y[:Gr.shape[0], :Gc.shape[0]]
        if level < levels:
            mask = np.ones((Gr.shape[0], Gc.shape[0], 1))
            mask[:Gr.shape[0] // 2, :Gc.shape[0] // 2] = 0
            block = block * jnp.asarray(mask, block.dtype)
        out = out + jnp.einsum("ai,abk,bj->ijk", Gr, block, Gc)
    return out


class Wavelet2D(AbstractOperator):
    """The orthonormal `levels`-level 2-D wavelet transform W (D x D) of a (height, width) image.

    `wavelet` is "db4" (Daubechies-4, the default of Nickisch 2010, Ch. 5) or "haar". Both sides must be divisible by
    2**levels; `levels=None` picks the most levels that keep the coarsest block at least 4 x 4.

    Args:
        height: image height (int >= 1, divisible by 2**levels).
        width: image width (int >= 1, divisible by 2**levels).
        levels: the number of levels (int >= 1), or None (the default choice above).
        wavelet: "db4" (default) or "haar".

    Raises:
        ValueError: sizes not positive integers or not divisible by 2**levels, levels < 1, or an unknown wavelet.
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
        if as_int(levels) is None or as_int(levels) < 1:
            raise ValueError(f"Wavelet2D(levels={levels!r}) must be a positive integer")
        levels = as_int(levels)
        for name, side in (("height", height), ("width", width)):
            if side % 2 ** levels:
                raise ValueError(f"Wavelet2D(levels={levels}) needs {name}={side} divisible by 2**levels = "
                                 f"{2 ** levels}; reduce levels or crop the image")
        self.height, self.width, self.levels, self.wavelet = height, width, levels, wavelet

    @property
    def shape(self):
        dim = self.height * self.width
        return (dim, dim)

    def _mats(self, dtype, squared=False):
        h = FILTERS[self.wavelet]
        conv = (lambda G: jnp.asarray(np.square(G) if squared else G, dtype=dtype))
        rows = [conv(G) for G in level_matrices(self.height, self.levels, h)]
        cols = [conv(G) for G in level_matrices(self.width, self.levels, h)]
        return rows, cols

    def _image(self, X, name):
        return check_length(X, self.height * self.width, name).reshape(self.height, self.width, -1)

    def mm(self, X):
        return _pyramid(self._image(X, "X"), *self._mats(X.dtype)).reshape(self.shape[0], -1)

    def rmm(self, Y):
        return _pyramid_transpose(self._image(Y, "Y"), *self._mats(Y.dtype)).reshape(self.shape[1], -1)

    def mv(self, x):
        return self.mm(check_length(x, self.shape[1], "x")[:, None])[:, 0]

    def rmv(self, y):
        return self.rmm(check_length(y, self.shape[0], "y")[:, None])[:, 0]

    def sq_mv(self, v):
        """(W o W) v: the same pyramid with the level matrices squared elementwise (module doc)."""
        return _pyramid(self._image(v[:, None], "v"), *self._mats(v.dtype, True)).reshape(-1)

    def sq_rmv(self, y):
        return _pyramid_transpose(self._image(y[:, None], "y"), *self._mats(y.dtype, True)).reshape(-1)

    def as_matrix(self):
        return self.mm(jnp.eye(self.shape[1], dtype=jnp.result_type(float)))

    def weighted_gram(self, g):
        """W^T diag(g) W (dense D x D, for the Full factor's fixed point on small images)."""
        W = self.as_matrix().astype(g.dtype)
        return tdot(W, check_length(g, self.shape[0], "g")[:, None] * W)
