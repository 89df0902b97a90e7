"""2-D finite differences of an image, the total-variation filters of the sparse linear model.

An image of shape (height, width) is the latent vector w = image.reshape(-1) (row-major: pixel (i, j) is
w[i * width + j]). The horizontal difference filters are

    (D_h w)_{i, j} = w_{i, j+1} - w_{i, j},     0 <= i < height, 0 <= j < width - 1   ("valid" boundary)

and the vertical ones (D_v w)_{i, j} = w_{i+1, j} - w_{i, j}. With boundary="valid" (Nickisch 2010, Ch. 5:
D in {-1, 0, 1}^{2(n - sqrt n) x n} for a square image of n pixels) there is no wrap-around; with
boundary="periodic" the last column (row) is differenced against the first, giving exactly one row per pixel.

Every row is e_a - e_b, so ||d_n||^2 = 2, (D o D) v = v_a + v_b and D^T diag(g) D is a graph Laplacian with
edge weights g, assembled by scatter-adds without forming D.
"""

from functools import lru_cache

import equinox as eqx
import jax.numpy as jnp
import numpy as np
from jax import lax

from .._validate import as_int
from ._base import AbstractOperator, check_length

DIRECTIONS = ("horizontal", "vertical", "both")
BOUNDARIES = ("valid", "periodic")


def check_image_shape(height, width, owner: str):
    for name, value in (("height", height), ("width", width)):
        if as_int(value) is None or as_int(value) < 1:
            raise ValueError(f"{owner}({name}={value!r}) must be a positive integer")
    return as_int(height), as_int(width)


def _diff(X, axis, periodic, sign):
    """X[k+1] + sign * X[k] along `axis` (sign=-1: the difference; +1: the squared-row sum)."""
    if periodic:
        return jnp.roll(X, -1, axis=axis) + sign * X
    n = X.shape[axis]
    return lax.slice_in_dim(X, 1, n, axis=axis) + sign * lax.slice_in_dim(X, 0, n - 1, axis=axis)


def _diff_adjoint(Y, axis, periodic, sign):
    """The adjoint of `_diff`: (y_{k-1} + sign * y_k) with zero padding (valid) or wrap-around (periodic)."""
    if periodic:
        return jnp.roll(Y, 1, axis=axis) + sign * Y
    pad_before = [(0, 0)] * Y.ndim
    pad_after = [(0, 0)] * Y.ndim
    pad_before[axis] = (1, 0)
    pad_after[axis] = (0, 1)
    return jnp.pad(Y, pad_before) + sign * jnp.pad(Y, pad_after)


@lru_cache(maxsize=32)
def _pairs(height, width, direction, periodic):
    """(plus, minus) pixel indices of every row: row n is e_plus[n] - e_minus[n] (numpy, for the Gram matrix)."""
    idx = np.arange(height * width).reshape(height, width)
    out_plus, out_minus = [], []
    for axis in ((1,) if direction == "horizontal" else (0,) if direction == "vertical" else (1, 0)):
        if periodic:
            plus, minus = np.roll(idx, -1, axis=axis), idx
        else:
            n = idx.shape[axis]
            plus, minus = np.take(idx, np.arange(1, n), axis=axis), np.take(idx, np.arange(n - 1), axis=axis)
        out_plus.append(plus.ravel())
        out_minus.append(minus.ravel())
    return np.concatenate(out_plus), np.concatenate(out_minus)


class FiniteDifference2D(AbstractOperator):
    """Horizontal and/or vertical finite differences of a (height, width) image (see the module docstring).

    direction="both" stacks [D_h; D_v] (the TV filters), so B = Stack([FiniteDifference2D(h, w), Wavelet2D(...)])
    is the sparse-linear-model filter bank of Challis & Barber 2013, Section 6.3.4.

    Args:
        height: image height (int >= 1; >= 2 for vertical differences with boundary "valid").
        width: image width (int >= 1; >= 2 for horizontal differences with boundary "valid").
        direction: "horizontal", "vertical" or "both" (default, [D_h; D_v]).
        boundary: "valid" (differences inside the image, default) or "periodic" (wrap-around, D rows each).

    Raises:
        ValueError: a size that is not a positive integer or too small, or an unknown direction or boundary.
    """

    height: int = eqx.field(static=True)
    width: int = eqx.field(static=True)
    direction: str = eqx.field(static=True)
    boundary: str = eqx.field(static=True)

    def __init__(self, height: int, width: int, direction: str = "both", boundary: str = "valid"):
        height, width = check_image_shape(height, width, "FiniteDifference2D")
        if direction not in DIRECTIONS:
            raise ValueError(f"FiniteDifference2D(direction={direction!r}) must be one of {DIRECTIONS}")
        if boundary not in BOUNDARIES:
            raise ValueError(f"FiniteDifference2D(boundary={boundary!r}) must be one of {BOUNDARIES}")
        if boundary == "valid":
            if direction in ("horizontal", "both") and width < 2:
                raise ValueError(f"FiniteDifference2D(width={width}) must be >= 2 for horizontal differences")
            if direction in ("vertical", "both") and height < 2:
                raise ValueError(f"FiniteDifference2D(height={height}) must be >= 2 for vertical differences")
        self.height, self.width = height, width
        self.direction, self.boundary = direction, boundary

    @property
    def _periodic(self):
        return self.boundary == "periodic"

    def _axes(self):
        return {"horizontal": (1,), "vertical": (0,), "both": (1, 0)}[self.direction]

    def _block_shape(self, axis):
        if self._periodic:
            return (self.height, self.width)
        return (self.height, self.width - 1) if axis == 1 else (self.height - 1, self.width)

    @property
    def shape(self):
        rows = sum(int(np.prod(self._block_shape(a))) for a in self._axes())
        return (rows, self.height * self.width)

    def _forward(self, X, sign):
        """X: (height*width, K) -> (rows, K)."""
        image = X.reshape(self.height, self.width, -1)
        parts = [_diff(image, a, self._periodic, sign).reshape(-1, X.shape[1]) for a in self._axes()]
        return parts[0] if len(parts) == 1 else jnp.concatenate(parts, axis=0)

    def _adjoint(self, Y, sign):
        """Y: (rows, K) -> (height*width, K)."""
        out, start = 0.0, 0
        for a in self._axes():
            bh, bw = self._block_shape(a)
            block = Y[start:start + bh * bw].reshape(bh, bw, -1)
            out = out + _diff_adjoint(block, a, self._periodic, sign)
            start += bh * bw
        return out.reshape(self.height * self.width, -1)

    def mv(self, x):
        return self._forward(check_length(x, self.shape[1], "x")[:, None], -1.0)[:, 0]

    def rmv(self, y):
        return self._adjoint(check_length(y, self.shape[0], "y")[:, None], -1.0)[:, 0]

    def mm(self, X):
        return self._forward(check_length(X, self.shape[1], "X"), -1.0)

    def rmm(self, Y):
        return self._adjoint(check_length(Y, self.shape[0], "Y"), -1.0)

    def sq_mv(self, v):
        return self._forward(check_length(v, self.shape[1], "v")[:, None], 1.0)[:, 0]

    def sq_rmv(self, y):
        return self._adjoint(check_length(y, self.shape[0], "y")[:, None], 1.0)[:, 0]

    def as_matrix(self):
        return self.mm(jnp.eye(self.shape[1], dtype=jnp.result_type(float)))

    def weighted_gram(self, g):
        """D^T diag(g) D = sum_n g_n (e_plus - e_minus)(e_plus - e_minus)^T, by scatter-adds (O(D^2) memory)."""
        check_length(g, self.shape[0], "g")
        plus, minus = _pairs(self.height, self.width, self.direction, self._periodic)
        dim = self.shape[1]
        G = jnp.zeros((dim, dim), dtype=g.dtype)
        G = G.at[plus, plus].add(g).at[minus, minus].add(g)
        return G.at[plus, minus].add(-g).at[minus, plus].add(-g)
