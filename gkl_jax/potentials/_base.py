"""Site-projection potentials phi_n(x), x = h_n^T w (papers/000, eq. 2).

Each potential holds its per-site data (scalars or length-N arrays) and provides log phi(x) and the Gaussian
expectation I_n = E_{z~N(0,1)}[log phi_n(m_n + z s_n)] (eq. 8): in closed form where one exists, otherwise by
Gauss-Hermite quadrature, implemented once in `AbstractQuadraturePotential`.
"""

import abc
from typing import ClassVar

import equinox as eqx
import jax.numpy as jnp

from .._quadrature import gauss_hermite

DEFAULT_NUM_POINTS = 64


class AbstractPotential(eqx.Module):
    """A positive potential phi(x) applied elementwise to the projections x_n = h_n^T w."""

    log_concave: ClassVar[bool]

    @abc.abstractmethod
    def log_phi(self, x):
        """log phi_n(x_n), elementwise; x has shape (N,) (or broadcasts against the per-site data)."""

    @abc.abstractmethod
    def expected_log_phi(self, m, s2):
        """E[log phi_n(x_n)] for x_n ~ N(m_n, s2_n), elementwise."""

    @property
    def num_sites(self):
        """N implied by the per-site data, or None if every field is a scalar."""
        sizes = {int(leaf.shape[0]) for leaf in _array_fields(self) if leaf.ndim == 1}
        return sizes.pop() if len(sizes) == 1 else None


class AbstractQuadraturePotential(AbstractPotential):
    """A potential whose expectation is computed by `num_points`-node Gauss-Hermite quadrature."""

    num_points: eqx.AbstractVar[int]

    def expected_log_phi(self, m, s2):
        return gauss_hermite(type(self)._log_phi_fn, self.num_points, self, m, s2)

    @staticmethod
    def _log_phi_fn(potential, x):
        return potential.log_phi(x)


def _array_fields(module):
    import dataclasses

    out = []
    for field in dataclasses.fields(module):
        value = getattr(module, field.name)
        if hasattr(value, "ndim") and hasattr(value, "shape"):
            out.append(value)
    return out


def check_num_points(num_points) -> int:
    num_points = int(num_points)
    if num_points < 2:
        raise ValueError(f"num_points must be >= 2, got {num_points}")
    return num_points


def std_normal_logpdf(x):
    return -0.5 * jnp.square(x) - 0.5 * jnp.log(2 * jnp.pi)
