"""Covariance functions k(x, x') for Gaussian-process priors (Nickisch 2010, Ch. 2 and 4).

Every kernel is an Equinox module with its positive parameters stored unconstrained (log_variance,
log_lengthscale, ...) and exposed through properties (`variance`, `lengthscale`). A kernel evaluates on single
points, `k(x1, x2)` with x of shape (d,), and `gram` / `diag` vectorise that with `jax.vmap` (stationary
kernels form r^2 for all pairs with one matrix product instead).

With r^2 = sum_d (x_d - x'_d)^2 / l_d^2 (l scalar or ARD of shape (d,)):

    SquaredExponential   k = s2 exp(-r^2 / 2)
    Matern12             k = s2 exp(-r)
    Matern32             k = s2 (1 + sqrt3 r) exp(-sqrt3 r)
    Matern52             k = s2 (1 + sqrt5 r + 5 r^2 / 3) exp(-sqrt5 r)
    RationalQuadratic    k = s2 (1 + r^2 / (2 alpha))^(-alpha)
    Linear               k = s2 x^T x'
    White                k = s2 [x == x']        (gram(X) = s2 I; gram(X1, X2) compares points)
    Constant             k = s2
    Sum, Product         k1 + k2, k1 * k2 (built by `+` and `*`)
"""

import abc

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._repr import module_repr, natural_fields
from .._validate import as_float_array, check_finite, check_ndim, check_positive, host_view, is_concrete


def _log_positive(value, name):
    """log(value) of a positive finite parameter, on the host for a concrete value on the CPU (`jnp.log` compiles a
    small program on its first call in a process, paid by a first fit), with `value`'s dtype and weak type."""
    value = as_float_array(value, name)
    check_finite(value, name)
    check_positive(value, name)
    if not is_concrete(value) or not isinstance(host_view(value), np.ndarray):
        return jnp.log(value)
    log = np.log(np.asarray(value))
    return jax.device_put(float(log)) if value.weak_type else jax.device_put(log.astype(value.dtype))


def _points(X, name):
    X = as_float_array(X, name)
    if X.ndim == 1:
        X = X[:, None]
    check_ndim(X, 2, name)
    check_finite(X, name)
    return X


def _safe_sqrt(r2):
    """sqrt(r^2) with a finite derivative at r^2 = 0 (where the kernels below are smooth in r^2 anyway)."""
    positive = r2 > 0
    return jnp.where(positive, jnp.sqrt(jnp.where(positive, r2, 1.0)), 0.0)


@eqx.filter_jit
def _gram(kernel, X1, X2):
    """K[i, j] = k(X1[i], X2[j]) by a double vmap, compiled once per kernel structure and shapes."""
    return jax.vmap(lambda a: jax.vmap(lambda b: kernel(a, b))(X2))(X1)


# Up to this many input dimensions r^2 is summed from differences (exact to rounding), above it comes from the
# product. In 1-D the differences cost no more (a Matern32 Gram value and gradient: 0.75-0.95x the product's time
# at n = 300-3000); at d = 2 and 3 they took 1.05-1.41x longer, so there the product stays
# (benchmarks/kernel_gram.py, benchmarks/README §4).
DIRECT_MAX_DIM = 1


@eqx.filter_jit
def _stationary_gram(kernel, X1, X2, same: bool):
    d = X1.shape[1]
    if d <= DIRECT_MAX_DIM:         # the raw differences: no centring, whose rounding would enter them
        inv2 = jnp.broadcast_to(1 / jnp.square(kernel.lengthscale), (d,))
        r2 = sum(jnp.square(X1[:, k, None] - X2[None, :, k]) * inv2[k] for k in range(d))
        return kernel.variance * kernel.profile(r2)
    centre = jnp.mean(X1, axis=0)
    a, b, scale = X1 - centre, X2 - centre, kernel.lengthscale
    if jnp.ndim(scale) == 1:        # ARD: each dimension scaled before the product
        a, b, scale = a / scale, b / scale, jnp.ones((), a.dtype)
    norms = jnp.sum(jnp.square(a), axis=1)[:, None] + jnp.sum(jnp.square(b), axis=1)[None, :]
    r2 = norms - 2 * a @ b.T
    # round-off of duplicate points -> 0 (written so that a NaN, from a NaN input, stays NaN)
    r2 = jnp.where(r2 <= 8 * jnp.finfo(r2.dtype).eps * norms, 0.0, r2)
    if same:
        r2 = r2 * (1 - jnp.eye(r2.shape[0], dtype=r2.dtype))
    return kernel.variance * kernel.profile(r2 / jnp.square(scale))


@eqx.filter_jit
def _diag(kernel, X):
    return jax.vmap(lambda a: kernel(a, a))(X)


class AbstractKernel(eqx.Module):
    """k(x, x') on single points of shape (d,); `gram` and `diag` vectorise it (Rasmussen & Williams 2006, Ch. 4;
    Nickisch 2010, Ch. 2). Kernels add and multiply with `+` and `*` (`Sum`, `Product`).
    """

    @abc.abstractmethod
    def __call__(self, x1, x2):
        """k(x1, x2) for points of shape (d,); returns a scalar."""

    def __repr__(self):
        """The hyperparameters' values (`variance=2.5`, not the stored `log_variance=f64[]`)."""
        return module_repr(self, natural_fields(self))

    def gram(self, X1, X2=None):
        """The Gram matrix K[i, j] = k(X1[i], X2[j]).

        Args:
            X1: (n1, d) float array (an (n1,) array is read as (n1, 1)).
            X2: (n2, d) float array, or None for X1.

        Returns:
            (n1, n2) float array.

        Raises:
            ValueError: inputs not finite, more than 2-D, with different d, or a d the ARD lengthscale does not fit.
        """
        return _gram(self, *self._pair(X1, X2))

    def _pair(self, X1, X2):
        """The validated inputs of `gram`: (X1, X2), with X2 = X1 when it is None."""
        X1 = _points(X1, "X1")
        X2 = X1 if X2 is None else _points(X2, "X2")
        if X1.shape[1] != X2.shape[1]:
            raise ValueError(f"X1 has {X1.shape[1]} input dimensions but X2 has {X2.shape[1]}")
        self.check_dim(X1.shape[1])
        return X1, X2

    def diag(self, X):
        """The prior variances k(x_n, x_n) at every row of X.

        Args:
            X: (n, d) float array (an (n,) array is read as (n, 1)).

        Returns:
            (n,) float array.

        Raises:
            ValueError: X not finite, more than 2-D, or a d the ARD lengthscale does not fit.
        """
        X = _points(X, "X")
        self.check_dim(X.shape[1])
        return _diag(self, X)

    def check_dim(self, d: int) -> None:
        """Check that the kernel's ARD parameters fit inputs of dimension d.

        Args:
            d: the input dimension.

        Raises:
            ValueError: an ARD lengthscale whose length is not d.
        """

    def __add__(self, other):
        if not isinstance(other, AbstractKernel):
            return NotImplemented
        return Sum(self, other)

    def __mul__(self, other):
        if not isinstance(other, AbstractKernel):
            return NotImplemented
        return Product(self, other)


class AbstractStationary(AbstractKernel):
    """k(x, x') = variance * f(r^2), r^2 = sum_d (x_d - x'_d)^2 / lengthscale_d^2.

    Attributes:
        log_variance: float scalar array, log of the signal variance (the `variance` property).
        log_lengthscale: float scalar or (d,) array (ARD), log of the lengthscale(s) (the `lengthscale` property).
    """

    log_variance: eqx.AbstractVar[jax.Array]
    log_lengthscale: eqx.AbstractVar[jax.Array]

    @property
    def variance(self):
        return jnp.exp(self.log_variance)

    @property
    def lengthscale(self):
        return jnp.exp(self.log_lengthscale)

    @abc.abstractmethod
    def profile(self, r2):
        """The profile f(r^2) of the stationary kernel, with f(0) = 1.

        Args:
            r2: float array of scaled squared distances r^2 >= 0.

        Returns:
            float array shaped like r2.
        """

    def __call__(self, x1, x2):
        x1, x2 = _point_pair(x1, x2)
        d = (x1 - x2) / self.lengthscale
        return self.variance * self.profile(jnp.sum(jnp.square(d)))

    def gram(self, X1, X2=None):
        """As `AbstractKernel.gram`, from r^2 = |a|^2 + |b|^2 - 2 a^T b on the centred inputs: one matrix product
        instead of n1 n2 d differences. With a scalar lengthscale the inputs are scaled after the product
        (r^2 / l^2), so the product does not depend on the hyperparameters: inside a compiled ML-II loop XLA
        computes it once; an ARD lengthscale scales each dimension before it. The cancellation
        error of r^2 is eps (|a|^2 + |b|^2); r^2 below 8 times that is set to 0 (duplicate points), and the diagonal
        of gram(X) is exactly 0. For 1-D inputs (`DIRECT_MAX_DIM`: time series, whose timestamps can sit far
        from the origin relative to their spacing) r^2 comes from the differences instead, exact to rounding and
        as fast there.

        Args:
            X1: (n1, d) float array (an (n1,) array is read as (n1, 1)).
            X2: (n2, d) float array, or None for X1.

        Returns:
            (n1, n2) float array.
        """
        return _stationary_gram(self, *self._pair(X1, X2), X2 is None)

    def diag(self, X):
        X = _points(X, "X")
        self.check_dim(X.shape[1])
        return jnp.full(X.shape[0], self.variance, dtype=X.dtype)

    def check_dim(self, d):
        if self.log_lengthscale.ndim == 1 and self.log_lengthscale.shape[0] != d:
            raise ValueError(f"lengthscale has {self.log_lengthscale.shape[0]} entries (ARD) but the inputs have "
                             f"{d} dimensions")


def _scalar_variance(variance):
    log_variance = _log_positive(variance, "variance")
    if log_variance.ndim != 0:
        raise ValueError(f"variance must be a scalar, got shape {log_variance.shape}")
    return log_variance


class Linear(AbstractKernel):
    """k = variance * x^T x' (Bayesian linear regression through the origin).

    Args:
        variance: a positive finite scalar (default 1).

    Raises:
        ValueError: variance not a positive finite scalar.
    """

    log_variance: jax.Array

    def __init__(self, variance=1.0):
        self.log_variance = _scalar_variance(variance)

    @property
    def variance(self):
        return jnp.exp(self.log_variance)

    def __call__(self, x1, x2):
        return self.variance * jnp.dot(*_point_pair(x1, x2))


class White(AbstractKernel):
    """k = variance * [x == x']: independent noise. `gram(X)` (one argument) is exactly variance * I, so
    duplicate inputs still get independent noise; `gram(X1, X2)` compares points.

    Args:
        variance: a positive finite scalar (default 1).

    Raises:
        ValueError: variance not a positive finite scalar.
    """

    log_variance: jax.Array

    def __init__(self, variance=1.0):
        self.log_variance = _scalar_variance(variance)

    @property
    def variance(self):
        return jnp.exp(self.log_variance)

    def __call__(self, x1, x2):
        x1, x2 = _point_pair(x1, x2)
        same = jnp.all(x1 == x2)
        return jnp.where(same, self.variance, 0.0)

    def gram(self, X1, X2=None):
        if X2 is None:
            X1 = _points(X1, "X1")
            return self.variance * jnp.eye(X1.shape[0], dtype=X1.dtype)
        return AbstractKernel.gram(self, X1, X2)


class Constant(AbstractKernel):
    """k = variance (a random constant offset of the latent function).

    Args:
        variance: a positive finite scalar (default 1).

    Raises:
        ValueError: variance not a positive finite scalar.
    """

    log_variance: jax.Array

    def __init__(self, variance=1.0):
        self.log_variance = _scalar_variance(variance)

    @property
    def variance(self):
        return jnp.exp(self.log_variance)

    def __call__(self, x1, x2):
        return self.variance * jnp.ones((), jnp.result_type(jnp.asarray(x1), self.log_variance))


def _point_pair(x1, x2):
    """(x1, x2) as arrays after checking that they are points of one shape (a static check, free under jit)."""
    x1, x2 = jnp.asarray(x1), jnp.asarray(x2)
    if x1.shape != x2.shape:
        raise ValueError(f"x1 and x2 must be points of the same shape, got {x1.shape} and {x2.shape}")
    return x1, x2


def _check_kernel(k, name):
    if not isinstance(k, AbstractKernel):
        raise ValueError(f"{name} must be a gkl_jax.kernels kernel, got {type(k).__name__}")


class Sum(AbstractKernel):
    """k = k1 + k2 (what `k1 + k2` builds).

    Args:
        k1: a `gkl_jax.kernels` kernel.
        k2: a `gkl_jax.kernels` kernel.

    Raises:
        ValueError: either argument not a gkl_jax kernel.
    """

    k1: AbstractKernel
    k2: AbstractKernel

    def __init__(self, k1, k2):
        _check_kernel(k1, "k1")
        _check_kernel(k2, "k2")
        self.k1, self.k2 = k1, k2

    def __call__(self, x1, x2):
        return self.k1(x1, x2) + self.k2(x1, x2)

    def gram(self, X1, X2=None):
        return self.k1.gram(X1, X2) + self.k2.gram(X1, X2)

    def diag(self, X):
        return self.k1.diag(X) + self.k2.diag(X)

    def check_dim(self, d):
        self.k1.check_dim(d)
        self.k2.check_dim(d)


class Product(AbstractKernel):
    """k = k1 * k2 (what `k1 * k2` builds).

    Args:
        k1: a `gkl_jax.kernels` kernel.
        k2: a `gkl_jax.kernels` kernel.

    Raises:
        ValueError: either argument not a gkl_jax kernel.
    """

    k1: AbstractKernel
    k2: AbstractKernel

    def __init__(self, k1, k2):
        _check_kernel(k1, "k1")
        _check_kernel(k2, "k2")
        self.k1, self.k2 = k1, k2

    def __call__(self, x1, x2):
        return self.k1(x1, x2) * self.k2(x1, x2)

    def gram(self, X1, X2=None):
        return self.k1.gram(X1, X2) * self.k2.gram(X1, X2)

    def diag(self, X):
        return self.k1.diag(X) * self.k2.diag(X)

    def check_dim(self, d):
        self.k1.check_dim(d)
        self.k2.check_dim(d)
