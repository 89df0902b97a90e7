"""Vertical stacks of operators, B = [B_1; B_2; ...], and the image filter bank of the sparse linear model."""

import equinox as eqx
import jax.numpy as jnp

from ._base import AbstractOperator, as_operator, check_length
from ._finite_difference import FiniteDifference2D
from ._wavelets import Wavelet2D


class Stack(AbstractOperator):
    """B = [B_1; ...; B_k]: rows of every block in order. Each product is the blocks' own products, concatenated
    (forward) or summed (adjoint): B x = [B_i x]_i, B^T y = sum_i B_i^T y_i, (B o B) v = [(B_i o B_i) v]_i.

    Args:
        operators: a non-empty list of operators or arrays (each wrapped by `as_operator`), all with D columns.

    Raises:
        ValueError: not a list, empty, or blocks with different numbers of columns.
    """

    operators: tuple
    row_splits: tuple = eqx.field(static=True)

    def __init__(self, operators):
        if isinstance(operators, AbstractOperator) or not hasattr(operators, "__iter__"):
            raise ValueError("Stack(operators=...) takes a list of operators or arrays")
        ops = tuple(as_operator(op, f"operators[{i}]") for i, op in enumerate(operators))
        if not ops:
            raise ValueError("Stack(operators=[]) needs at least one operator")
        cols = {op.shape[1] for op in ops}
        if len(cols) != 1:
            raise ValueError(f"Stack(operators=...) blocks must have the same number of columns, got "
                             f"{[op.shape[1] for op in ops]}")
        self.operators = ops
        splits, start = [], 0
        for op in ops:
            start += op.shape[0]
            splits.append(start)
        self.row_splits = tuple(splits)

    @property
    def shape(self):
        return (self.row_splits[-1], self.operators[0].shape[1])

    def _blocks(self, y, name):
        """y (or Y) split into the row blocks of the stacked operators, after checking its length."""
        check_length(y, self.shape[0], name)
        starts = (0,) + self.row_splits[:-1]
        return [y[a:b] for a, b in zip(starts, self.row_splits)]

    def mv(self, x):
        return jnp.concatenate([op.mv(x) for op in self.operators])

    def rmv(self, y):
        return sum(op.rmv(b) for op, b in zip(self.operators, self._blocks(y, "y")))

    def mm(self, X):
        return jnp.concatenate([op.mm(X) for op in self.operators], axis=0)

    def rmm(self, Y):
        return sum(op.rmm(b) for op, b in zip(self.operators, self._blocks(Y, "Y")))

    def with_squares(self):
        return eqx.tree_at(lambda s: s.operators, self, tuple(op.with_squares() for op in self.operators))

    def sq_mv(self, v):
        return jnp.concatenate([op.sq_mv(v) for op in self.operators])

    def sq_rmv(self, y):
        return sum(op.sq_rmv(b) for op, b in zip(self.operators, self._blocks(y, "y")))

    def as_matrix(self):
        return jnp.concatenate([op.as_matrix() for op in self.operators], axis=0)

    def weighted_gram(self, g):
        return sum(op.weighted_gram(b) for op, b in zip(self.operators, self._blocks(g, "g")))


def image_filters(height: int, width: int, *, levels=None, wavelet: str = "db4", boundary: str = "valid"):
    """B = [D_h; D_v; W]: horizontal and vertical finite differences and an orthonormal wavelet transform of a
    (height, width) image (Challis & Barber 2013, Section 6.3.4, M ~ 3D rows), as a `Stack` of matrix-free
    operators.

    Args:
        height: image height (an int >= 2, divisible by 2**levels).
        width: image width (an int >= 2, divisible by 2**levels).
        levels: wavelet levels (int >= 1), or None for the most that keep the coarsest block at least 4 x 4.
        wavelet: "db4" (default) or "haar".
        boundary: the finite differences' boundary, "valid" (default) or "periodic".

    Returns:
        `Stack` over D = height * width columns.

    Raises:
        ValueError: from `FiniteDifference2D` or `Wavelet2D` (sizes, levels, wavelet or boundary).
    """
    return Stack([FiniteDifference2D(height, width, "both", boundary), Wavelet2D(height, width, levels, wavelet)])
