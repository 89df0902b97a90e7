"""Site-projection potentials phi_n(x), x = h_n^T w (Challis & Barber 2013, eq. 2).

Each potential holds its per-site data (scalars or length-N arrays) and provides log phi(x) and the Gaussian
expectation I_n = E_{z~N(0,1)}[log phi_n(m_n + z s_n)] (eq. 8): in closed form where one exists, otherwise by
quadrature, implemented once in `AbstractQuadraturePotential` (gkl_jax._quadrature): the feature-adapted
trapezoid rule for a potential that declares where its non-analytic behaviour sits (`feature()`), Gauss-Hermite
otherwise.
"""

import abc
import warnings
from typing import ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp

from .._quadrature import autodiff_jet, expectation, expectation_moments
from .._validate import check_int

DEFAULT_NUM_POINTS = 64


class AbstractPotential(eqx.Module):
    """A positive potential phi(x) applied elementwise to the projections x_n = h_n^T w (Challis & Barber 2013,
    eq. 2).

    Subclasses are equinox modules whose fields hold the per-site data (scalars or (N,) arrays) and set the class
    variable `log_concave` (True when log phi is concave, so that the G-KL bound is concave in (m, C)).

    Attributes:
        log_concave: bool class variable, whether log phi is concave.
        num_sites: the N implied by the per-site data (property), or None when every field is a scalar.
    """

    log_concave: ClassVar[bool]
    overflows: ClassVar[bool] = False
    """Whether E[log phi] can reach -inf or a huge negative value at moderate projections (an exponential link:
    Poisson), so that `fit` compares its start at the prior mean with one at w = 0."""

    @abc.abstractmethod
    def log_phi(self, x):
        """log phi_n(x_n), elementwise.

        Args:
            x: (N,) float array of projections h_n^T w (any shape that broadcasts against the per-site data).

        Returns:
            float array shaped like the broadcast of x and the per-site data.
        """

    @abc.abstractmethod
    def expected_log_phi(self, m, s2):
        """The site expectations I_n = E[log phi_n(x_n)] for x_n ~ N(m_n, s2_n), elementwise (Challis & Barber
        2013, eq. 8).

        Args:
            m: (N,) float array of projected means h_n^T m.
            s2: (N,) float array of projected variances ||C h_n||^2 (positive).

        Returns:
            (N,) float array.
        """

    def expected_log_phi_moments(self, m, s2):
        """(E[log phi_n], E[(log phi_n)'], E[(log phi_n)'']) for x_n ~ N(m_n, s2_n), stacked (3, N): the value, the
        derivative in m_n and twice the derivative in s2_n (Stein's lemma), what the fixed-point solver needs at
        each trial point. By automatic differentiation of `expected_log_phi` here (elementwise: the derivative
        along a vector of ones); quadrature potentials compute all three from one rule.

        Args:
            m: (N,) projected means; s2: (N,) projected variances.

        Returns:
            (3, N) array.
        """
        value = self.expected_log_phi(m, s2)
        grad = lambda m: jax.grad(lambda m: jnp.sum(self.expected_log_phi(m, s2)))(m)
        first, second = jax.jvp(grad, (m,), (jnp.ones_like(m),))
        return jnp.stack([value, first, second])

    def margins(self, x):
        """The margins y_n x_n of a binary-classification potential phi_n(x) = F(y_n x), F increasing to its
        supremum. (Prior-free fits check whether the mean separates the labels: `gkl_jax._model.separated`.)

        Args:
            x: (N,) float array of projections.

        Returns:
            (N,) float array y * x, or None for a potential that is not a binary classifier.
        """
        return None

    @property
    def num_sites(self):
        """N implied by the per-site data, or None if every field is a scalar."""
        sizes = {int(leaf.shape[0]) for leaf in _array_fields(self) if leaf.ndim == 1}
        return sizes.pop() if len(sizes) == 1 else None


class AbstractQuadraturePotential(AbstractPotential):
    """A potential whose expectation I_n = E[log phi_n(m_n + z s_n)] is computed by `num_points`-node quadrature:
    the feature-adapted trapezoid rule centred on `feature()` = (center, width) when the potential declares one
    (accurate for every s_n, see gkl_jax._quadrature), Gauss-Hermite when `feature()` is None. Derivatives in
    (m_n, s_n^2) are E[log phi'] and 1/2 E[log phi''] by the same rule (Stein's lemma).

    The bound is a lower bound on log Z only up to the quadrature error: the defaults reach 1e-10 relative
    (tests/test_quadrature.py); with few nodes the computed "bound" can exceed log Z (`check_num_points` warns).

    Attributes:
        num_points: int >= 2, the number of quadrature nodes per site (a static field of every subclass).
    """

    num_points: eqx.AbstractVar[int]

    def expected_log_phi(self, m, s2):
        return expectation(type(self)._log_phi_jet, self.num_points, self, m, s2, self.feature())

    def expected_log_phi_moments(self, m, s2):
        return expectation_moments(type(self)._log_phi_jet, self.num_points, self, m, s2, self.feature())

    def feature(self):
        """Where log phi's non-analytic behaviour sits in x (complex singularities at about center +- i width /
        0.75), for the feature-adapted trapezoid rule.

        Returns:
            (center, width): float arrays broadcasting against the sites (width > 0); or None, which selects
            Gauss-Hermite quadrature.
        """
        return None

    def log_phi_jet(self, x, order: int):
        """log phi and its first `order` derivatives at the quadrature nodes of each site, by automatic
        differentiation; a potential overrides it with a closed form that shares work between the orders
        (broadcasting its per-site data against the trailing node axis).

        Args:
            x: (..., K) float array, K nodes per site on the trailing axis.
            order: the highest derivative wanted (0, 1 or 2).

        Returns:
            list of `order + 1` float arrays, each shaped like x: [log phi, (log phi)', ...].
        """
        return autodiff_jet(type(self)._log_phi_fn)(self, x, order)

    @staticmethod
    def _log_phi_fn(potential, x):
        return potential.log_phi(x)

    @staticmethod
    def _log_phi_jet(potential, x, order):
        return potential.log_phi_jet(x, order)


def _array_fields(module):
    import dataclasses

    out = []
    for field in dataclasses.fields(module):
        value = getattr(module, field.name)
        if hasattr(value, "ndim") and hasattr(value, "shape"):
            out.append(value)
    return out


MIN_ACCURATE_POINTS = 16
"""Below this many nodes the feature-adapted rule can be far off. On a 2-D Student-t model (8 sites, grid log Z),
log_z - log Z was +26.3 with 3 nodes, +5.7 with 6, -0.057 with 8 (the optimum is -0.492), -0.494 with 12,
-0.493 with 16, and -0.492 with 24 and 64 nodes."""


def check_num_points(num_points, adapted: bool = True) -> int:
    """num_points as an int >= 2; a warning below MIN_ACCURATE_POINTS for the feature-adapted rule (`adapted`),
    whose error then can lift the computed bound above log Z."""
    num_points = check_int(num_points, "num_points", 2)
    if adapted and num_points < MIN_ACCURATE_POINTS:
        warnings.warn(f"num_points={num_points} < {MIN_ACCURATE_POINTS}: the quadrature error can make the computed "
                      "bound exceed log Z (the default reaches 1e-10 relative)",
                      stacklevel=5)     # past this function, the potential's __init__ and two equinox frames
    return num_points


def std_normal_logpdf(x):
    return -0.5 * jnp.square(x) - 0.5 * jnp.log(2 * jnp.pi)
