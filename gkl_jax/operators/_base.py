"""Linear maps H: R^D -> R^N whose rows are the site projections h_n (Challis & Barber 2013, eq. 2).

The factors and solvers only talk to H through this interface, so a dense matrix, the identity (GP sites),
a sparse BCOO matrix and matrix-free operators (finite differences, wavelets) are interchangeable.
"""

import abc
from typing import Optional

import equinox as eqx
import jax
import jax.numpy as jnp
from jax.experimental import sparse as jsparse

from .._linalg import tdot
from .._validate import as_float_array, check_finite, check_int, check_ndim


def check_length(x, n: int, name: str):
    """`x` after checking that its leading axis has length n (a static shape: checked under tracing too)."""
    if jnp.ndim(x) < 1 or jnp.shape(x)[0] != n:
        raise ValueError(f"{name} must have length {n} along its first axis, got shape {jnp.shape(x)}")
    return x


class AbstractOperator(eqx.Module):
    """H with rows h_n. Concrete operators implement `shape`, `mv`, `rmv`, `sq_mv`, `sq_rmv`, `as_matrix`.

    `sq_mv(v)` is (H o H) v, i.e. sum_d H_nd^2 v_d: the projected variances of a diagonal covariance.

    Attributes:
        shape: (N, D), a property of every operator.
    """

    @property
    @abc.abstractmethod
    def shape(self) -> tuple[int, int]: ...

    @abc.abstractmethod
    def mv(self, x):
        """The projections H x.

        Args:
            x: (D,) float array.

        Returns:
            (N,) float array.
        """

    @abc.abstractmethod
    def rmv(self, y):
        """The transposed product H^T y.

        Args:
            y: (N,) float array.

        Returns:
            (D,) float array.
        """

    @abc.abstractmethod
    def sq_mv(self, v):
        """(H o H) v = sum_d H_nd^2 v_d: the projected variances of a diagonal covariance diag(v).

        Args:
            v: (D,) float array.

        Returns:
            (N,) float array.
        """

    @abc.abstractmethod
    def sq_rmv(self, y):
        """(H o H)^T y = sum_n H_nd^2 y_n.

        Args:
            y: (N,) float array.

        Returns:
            (D,) float array.
        """

    @abc.abstractmethod
    def as_matrix(self):
        """The dense matrix H (for tests, small problems and the dense fixed point).

        Returns:
            (N, D) float array.
        """

    def mm(self, X):
        """The product H X, column by column.

        Args:
            X: (D, K) float array.

        Returns:
            (N, K) float array.
        """
        return jax.vmap(self.mv, in_axes=1, out_axes=1)(X)

    def with_squares(self):
        """This operator with H o H stored for `sq_mv`/`sq_rmv`; itself where there is nothing to store. The
        solvers iterate on such a copy: otherwise a dense H is squared again at every bound evaluation, since XLA
        does not hoist the square out of the line search's conditional.

        Returns:
            an `AbstractOperator` equal to this one.
        """
        return self

    def rmm(self, Y):
        """The transposed product H^T Y, column by column.

        Args:
            Y: (N, K) float array.

        Returns:
            (D, K) float array.
        """
        return jax.vmap(self.rmv, in_axes=1, out_axes=1)(Y)

    def weighted_gram(self, g):
        """The weighted Gram matrix H^T diag(g) H, dense.

        Args:
            g: (N,) float array of site weights.

        Returns:
            (D, D) float array.
        """
        Hd = self.as_matrix()
        return tdot(Hd, check_length(g, self.shape[0], "g")[:, None] * Hd)


class Dense(AbstractOperator):
    """A dense (N, D) matrix. `squared` is H o H where `with_squares()` stored it, else None.

    Args:
        matrix: (N, D) finite float array.
        name: the argument name that error messages use (default "H").

    Raises:
        ValueError: matrix not 2-D or not finite.
    """

    matrix: jax.Array
    squared: Optional[jax.Array]

    def __init__(self, matrix, name: str = "H"):
        matrix = as_float_array(matrix, name)
        check_ndim(matrix, 2, name)
        check_finite(matrix, name)
        self.matrix = matrix
        self.squared = None

    def with_squares(self):
        return eqx.tree_at(lambda op: op.squared, self, jnp.square(self.matrix), is_leaf=lambda x: x is None)

    def _squares(self):
        return jnp.square(self.matrix) if self.squared is None else self.squared

    @property
    def shape(self):
        return tuple(self.matrix.shape)

    def mv(self, x):
        return self.matrix @ check_length(x, self.shape[1], "x")

    def rmv(self, y):
        return tdot(self.matrix, check_length(y, self.shape[0], "y"))

    def mm(self, X):
        return self.matrix @ check_length(X, self.shape[1], "X")

    def rmm(self, Y):
        return tdot(self.matrix, check_length(Y, self.shape[0], "Y"))

    def sq_mv(self, v):
        return self._squares() @ check_length(v, self.shape[1], "v")

    def sq_rmv(self, y):
        return tdot(self._squares(), check_length(y, self.shape[0], "y"))

    def as_matrix(self):
        return self.matrix


class Identity(AbstractOperator):
    """h_n = e_n: one site per latent variable (Gaussian processes); N = D.

    Args:
        dim: D, an int >= 1.

    Raises:
        ValueError: dim not an int >= 1.
    """

    dim: int = eqx.field(static=True)

    def __init__(self, dim: int):
        self.dim = check_int(dim, "Identity: dim", 1)

    @property
    def shape(self):
        return (self.dim, self.dim)

    def mv(self, x):
        return check_length(x, self.dim, "x")

    def rmv(self, y):
        return check_length(y, self.dim, "y")

    def mm(self, X):
        return check_length(X, self.dim, "X")

    def rmm(self, Y):
        return check_length(Y, self.dim, "Y")

    def sq_mv(self, v):
        return check_length(v, self.dim, "v")

    def sq_rmv(self, y):
        return check_length(y, self.dim, "y")

    def as_matrix(self):
        return jnp.eye(self.dim)

    def weighted_gram(self, g):
        return jnp.diag(check_length(g, self.dim, "g"))


class Sparse(AbstractOperator):
    """A sparse (N, D) matrix in `jax.experimental.sparse.BCOO` format; never densified on the hot path.

    Args:
        matrix: a 2-D `jax.experimental.sparse.BCOO` matrix with finite entries.
        name: the argument name that error messages use (default "H").

    Raises:
        ValueError: matrix not a 2-D BCOO matrix or with non-finite entries.
    """

    matrix: jsparse.BCOO

    def __init__(self, matrix, name: str = "H"):
        if not isinstance(matrix, jsparse.BCOO):
            raise ValueError(f"{name} must be a jax.experimental.sparse.BCOO matrix")
        if matrix.ndim != 2:
            raise ValueError(f"{name} must be 2-D, got shape {matrix.shape}")
        check_finite(matrix.data, name)
        self.matrix = matrix

    @property
    def shape(self):
        return tuple(self.matrix.shape)

    def _squared(self):
        return jsparse.BCOO((jnp.square(self.matrix.data), self.matrix.indices), shape=self.matrix.shape)

    def mv(self, x):
        return self.matrix @ check_length(x, self.shape[1], "x")

    def rmv(self, y):
        return self.matrix.T @ check_length(y, self.shape[0], "y")

    def mm(self, X):
        return self.matrix @ check_length(X, self.shape[1], "X")

    def rmm(self, Y):
        return self.matrix.T @ check_length(Y, self.shape[0], "Y")

    def sq_mv(self, v):
        return self._squared() @ check_length(v, self.shape[1], "v")

    def sq_rmv(self, y):
        return self._squared().T @ check_length(y, self.shape[0], "y")

    def as_matrix(self):
        return self.matrix.todense()

    def weighted_gram(self, g):
        g = check_length(g, self.shape[0], "g")
        weighted = jsparse.BCOO((self.matrix.data * g[self.matrix.indices[:, 0]], self.matrix.indices),
                                shape=self.matrix.shape)
        return (weighted.T @ self.matrix).todense()


def _is_scipy_sparse(H) -> bool:
    """A scipy.sparse matrix or array, recognised without importing scipy."""
    return type(H).__module__.startswith("scipy.sparse") and hasattr(H, "tocoo")


def as_operator(H, name: str = "H") -> AbstractOperator:
    """Wrap an array, a BCOO matrix, a scipy.sparse matrix (converted to BCOO) or an operator as an
    `AbstractOperator`.

    Args:
        H: an (N, D) array, BCOO or scipy.sparse matrix, or an `AbstractOperator` (returned as is).
        name: the argument name that error messages use (default "H").

    Returns:
        `AbstractOperator`: `Dense`, `Sparse` or H itself.

    Raises:
        ValueError: an array that is not 2-D or not finite.
    """
    if isinstance(H, AbstractOperator):
        return H
    if _is_scipy_sparse(H):
        H = jsparse.BCOO.from_scipy_sparse(H)
    if isinstance(H, jsparse.BCOO):
        return Sparse(H, name)
    return Dense(H, name)
