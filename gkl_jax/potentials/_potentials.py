"""The concrete site potentials: closed-form expectations (Gaussian, Laplace, Poisson) and quadrature ones."""

from typing import Callable, ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.special import gammaln, log_ndtr, ndtr

from .._validate import is_concrete, site_count, site_vector
from ._base import (DEFAULT_NUM_POINTS, AbstractPotential, AbstractQuadraturePotential, check_num_points,
                    std_normal_logpdf)


def _labels(y, name="y"):
    y = site_vector(y, name)
    if is_concrete(y) and not bool(jnp.all((y == 1) | (y == -1))):
        bad = np.unique(np.asarray(y)[(np.asarray(y) != 1) & (np.asarray(y) != -1)])[:5]
        raise ValueError(f"{name} must contain labels in {{-1, +1}}, got {bad.tolist()}")
    return y


class Gaussian(AbstractPotential):
    """phi(x) = N(y | x, variance).  E[log phi] = -1/2 log(2 pi v) - ((y - m)^2 + s^2) / (2 v)."""

    y: jax.Array
    variance: jax.Array
    log_concave: ClassVar[bool] = True

    def __init__(self, y, variance=1.0):
        self.y = site_vector(y, "y")
        self.variance = site_vector(variance, "variance", positive=True)
        site_count(self.y, self.variance)

    def log_phi(self, x):
        return -0.5 * jnp.log(2 * jnp.pi * self.variance) - 0.5 * jnp.square(self.y - x) / self.variance

    def expected_log_phi(self, m, s2):
        return (-0.5 * jnp.log(2 * jnp.pi * self.variance)
                - 0.5 * (jnp.square(self.y - m) + s2) / self.variance)


class Laplace(AbstractPotential):
    """phi(x) = exp(-|y - x| / scale) / (2 scale)  (papers/000 App. B.2.1).

    With r = (m - y)/s:  E|x - y| = 2 s N(r) + (m - y)(2 Phi(r) - 1), smooth in (m, s) although phi is not
    differentiable (Section 3.1).
    """

    y: jax.Array
    scale: jax.Array
    log_concave: ClassVar[bool] = True

    def __init__(self, y, scale=1.0):
        self.y = site_vector(y, "y")
        self.scale = site_vector(scale, "scale", positive=True)
        site_count(self.y, self.scale)

    def log_phi(self, x):
        return -jnp.abs(self.y - x) / self.scale - jnp.log(2 * self.scale)

    def expected_log_phi(self, m, s2):
        tiny = jnp.finfo(jnp.result_type(s2)).tiny
        s = jnp.sqrt(jnp.maximum(s2, tiny))
        d = m - self.y
        r = d / s
        mean_abs = 2 * s * jnp.exp(std_normal_logpdf(r)) + d * (2 * ndtr(r) - 1)
        return -mean_abs / self.scale - jnp.log(2 * self.scale)


class Poisson(AbstractPotential):
    """phi(x) = Poisson(y | exp(x)).  E[log phi] = y m - exp(m + s^2/2) - log y!."""

    y: jax.Array
    log_concave: ClassVar[bool] = True

    def __init__(self, y):
        y = site_vector(y, "y")
        if is_concrete(y) and not bool(jnp.all((y >= 0) & (y == jnp.round(y)))):
            raise ValueError("y must contain non-negative integer counts")
        self.y = y

    def log_phi(self, x):
        return self.y * x - jnp.exp(x) - gammaln(self.y + 1)

    def expected_log_phi(self, m, s2):
        return self.y * m - jnp.exp(m + 0.5 * s2) - gammaln(self.y + 1)


class Logistic(AbstractQuadraturePotential):
    """phi(x) = sigmoid(y x) with y in {-1, +1}."""

    y: jax.Array
    num_points: int = eqx.field(static=True)
    log_concave: ClassVar[bool] = True

    def __init__(self, y, *, num_points=DEFAULT_NUM_POINTS):
        self.y = _labels(y)
        self.num_points = check_num_points(num_points)

    def log_phi(self, x):
        return jax.nn.log_sigmoid(self.y * x)


class Probit(AbstractQuadraturePotential):
    """phi(x) = Phi(y x) with y in {-1, +1} (Phi: standard normal cdf)."""

    y: jax.Array
    num_points: int = eqx.field(static=True)
    log_concave: ClassVar[bool] = True

    def __init__(self, y, *, num_points=DEFAULT_NUM_POINTS):
        self.y = _labels(y)
        self.num_points = check_num_points(num_points)

    def log_phi(self, x):
        return log_ndtr(self.y * x)


class StudentT(AbstractQuadraturePotential):
    """phi(x) = Student-t(y | x, dof, scale); not log-concave."""

    y: jax.Array
    dof: jax.Array
    scale: jax.Array
    num_points: int = eqx.field(static=True)
    log_concave: ClassVar[bool] = False

    def __init__(self, y, dof, scale=1.0, *, num_points=DEFAULT_NUM_POINTS):
        self.y = site_vector(y, "y")
        self.dof = site_vector(dof, "dof", positive=True)
        self.scale = site_vector(scale, "scale", positive=True)
        site_count(self.y, self.dof, self.scale)
        self.num_points = check_num_points(num_points)

    def log_phi(self, x):
        nu = self.dof
        r = (self.y - x) / self.scale
        return (gammaln(0.5 * (nu + 1)) - gammaln(0.5 * nu) - 0.5 * jnp.log(nu * jnp.pi) - jnp.log(self.scale)
                - 0.5 * (nu + 1) * jnp.log1p(jnp.square(r) / nu))


class Cauchy(AbstractQuadraturePotential):
    """phi(x) = Cauchy(y | x, scale) (Student-t with one degree of freedom); not log-concave."""

    y: jax.Array
    scale: jax.Array
    num_points: int = eqx.field(static=True)
    log_concave: ClassVar[bool] = False

    def __init__(self, y, scale=1.0, *, num_points=DEFAULT_NUM_POINTS):
        self.y = site_vector(y, "y")
        self.scale = site_vector(scale, "scale", positive=True)
        site_count(self.y, self.scale)
        self.num_points = check_num_points(num_points)

    def log_phi(self, x):
        r = (self.y - x) / self.scale
        return -jnp.log(jnp.pi * self.scale) - jnp.log1p(jnp.square(r))


class Custom(AbstractQuadraturePotential):
    """Any elementwise, twice-differentiable JAX function `log_phi(x)` of the projection.

    Pass `log_concave=True` only if it is (it selects the Newton solver and promises a concave bound).
    """

    fn: Callable = eqx.field(static=True)
    num_points: int = eqx.field(static=True)
    concave: bool = eqx.field(static=True)

    def __init__(self, log_phi, *, log_concave=False, num_points=DEFAULT_NUM_POINTS):
        if not callable(log_phi):
            raise ValueError("log_phi must be a callable mapping projections to log potentials")
        self.fn = log_phi
        self.concave = bool(log_concave)
        self.num_points = check_num_points(num_points)

    @property
    def log_concave(self):  # type: ignore[override]
        return self.concave

    def log_phi(self, x):
        return self.fn(x)
