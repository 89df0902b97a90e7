"""The concrete site potentials: closed-form expectations (Gaussian, Laplace, Poisson) and quadrature ones.

The quadrature potentials declare their `feature()` (where log phi is non-analytic: complex singularities at
about center +- i width / 0.75), so their expectations use the feature-adapted rule of gkl_jax._quadrature.
Accuracy with the default 64 nodes, measured against scipy.integrate.quad in float64 over m - center in
[-1e3, 1e3] and s from 0 to 100 (tests/test_quadrature.py): |error| / max(1, |E|) below 1e-10 for E[log phi],
E[(log phi)'] and E[(log phi)''] (about 1e-13 for logistic and Student-t; the Cauchy potential with
s / scale ~ 1e3 is the hardest case, ~1e-10). 48 nodes give ~1e-7, 32 nodes ~1e-4 in the worst case.
"""

from typing import Callable, ClassVar, Optional

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.special import gammaln, ndtr

from .._traps import CodeKey, note_trace
from .._validate import as_float_array, check_finite, check_positive, host_view, is_concrete, site_count, site_vector
from ._base import (
    DEFAULT_NUM_POINTS,
    AbstractPotential,
    AbstractQuadraturePotential,
    check_num_points,
    std_normal_logpdf,
)
from ._special import log_ndtr_stable, student_t_log_norm


def _labels(y, name="y"):
    y = site_vector(y, name)
    h = host_view(y) if is_concrete(y) else None
    if h is not None and not bool(((h == 1) | (h == -1)).all()):
        a = np.asarray(h)   # this process's rows when y spans several processes
        bad = np.unique(a[(a != 1) & (a != -1)])[:5]
        raise ValueError(f"{name} must contain labels in {{-1, +1}}, got {bad.tolist()}")
    return y


class Gaussian(AbstractPotential):
    """phi(x) = N(y | x, variance).  E[log phi] = -1/2 log(2 pi v) - ((y - m)^2 + s^2) / (2 v).

    Args:
        y: the observations, a scalar or an (N,) float array.
        variance: the noise variance v > 0, a scalar or an (N,) array (default 1).

    Raises:
        ValueError: y or variance not finite, not a scalar or 1-D, variance not positive, or lengths that differ.
    """

    y: jax.Array
    variance: jax.Array
    log_concave: ClassVar[bool] = True

    def __init__(self, y, variance=1.0):
        self.y = site_vector(y, "y")
        self.variance = site_vector(variance, "variance", positive=True)
        site_count(y=self.y, variance=self.variance)

    def log_phi(self, x):
        return -0.5 * jnp.log(2 * jnp.pi * self.variance) - 0.5 * jnp.square(self.y - x) / self.variance

    def expected_log_phi(self, m, s2):
        return (-0.5 * jnp.log(2 * jnp.pi * self.variance)
                - 0.5 * (jnp.square(self.y - m) + s2) / self.variance)


class Laplace(AbstractPotential):
    """phi(x) = exp(-|y - x| / scale) / (2 scale)  (Challis & Barber 2013, App. B.2.1).

    With r = (m - y)/s:  E|x - y| = 2 s N(r) + (m - y)(2 Phi(r) - 1), smooth in (m, s) although phi is not
    differentiable (Section 3.1).

    Args:
        y: the observations, a scalar or an (N,) float array.
        scale: the scale > 0, a scalar or an (N,) array (default 1).

    Raises:
        ValueError: y or scale not finite, not a scalar or 1-D, scale not positive, or lengths that differ.
    """

    y: jax.Array
    scale: jax.Array
    log_concave: ClassVar[bool] = True

    def __init__(self, y, scale=1.0):
        self.y = site_vector(y, "y")
        self.scale = site_vector(scale, "scale", positive=True)
        site_count(y=self.y, scale=self.scale)

    def log_phi(self, x):
        return -jnp.abs(self.y - x) / self.scale - jnp.log(2 * self.scale)

    def expected_log_phi(self, m, s2):
        # s floored at eps * scale (the value moves by at most 0.8 eps): at s2 = 0 (a zero row h_n) the true
        # derivatives in s2 are infinite, and a floor at `tiny` made Newton's Hessian-vector products 0 * inf = NaN
        # (CG then fell back to gradient ascent: 200 steps without converging)
        s_min = jnp.finfo(jnp.result_type(s2)).eps * self.scale
        s = jnp.sqrt(jnp.maximum(s2, jnp.square(s_min)))
        d = m - self.y
        r = d / s
        mean_abs = 2 * s * jnp.exp(std_normal_logpdf(r)) + d * (2 * ndtr(r) - 1)
        return -mean_abs / self.scale - jnp.log(2 * self.scale)


class Poisson(AbstractPotential):
    """phi(x) = Poisson(y | exp(x)).  E[log phi] = y m - exp(m + s^2/2) - log y!.

    Args:
        y: the counts, a scalar or an (N,) array of non-negative integers (stored as floats).

    Raises:
        ValueError: y not finite, not a scalar or 1-D, or not non-negative integers.
    """

    y: jax.Array
    log_concave: ClassVar[bool] = True
    overflows: ClassVar[bool] = True

    def __init__(self, y):
        y = site_vector(y, "y")
        h = host_view(y) if is_concrete(y) else None
        if h is not None and not bool(((h >= 0) & (h == h.round())).all()):
            raise ValueError("y must contain non-negative integer counts")
        self.y = y

    def log_phi(self, x):
        return self.y * x - jnp.exp(x) - gammaln(self.y + 1)

    def expected_log_phi(self, m, s2):
        return self.y * m - jnp.exp(m + 0.5 * s2) - gammaln(self.y + 1)


class Logistic(AbstractQuadraturePotential):
    """phi(x) = sigmoid(y x) with y in {-1, +1}; log phi = -log(1 + exp(-y x)), log-concave.

    Feature: the kink of log phi at x = 0 (poles at +- i pi): center 0, width 0.75 pi. 48 nodes by default (64 for
    the other potentials): E[log phi] and its first two derivatives in m and s^2 agree with a 256-node rule to
    6e-14 relative to max(1, |E|) for |m| <= 30, s^2 in [1e-6, 1e3] (40 nodes: 1e-11; 32: 4e-8), and each
    quadrature costs 3/4 of the 64-node one.

    Args:
        y: the labels, a scalar or an (N,) array with entries in {-1, +1}.
        num_points: quadrature nodes per site (int >= 2, default 48; fewer than 16 warns).

    Raises:
        ValueError: a label other than -1 or +1, or num_points not an int >= 2.
    """

    y: jax.Array
    num_points: int = eqx.field(static=True)
    log_concave: ClassVar[bool] = True

    def __init__(self, y, *, num_points=48):
        self.y = _labels(y)
        self.num_points = check_num_points(num_points)

    def log_phi(self, x):
        return jax.nn.log_sigmoid(self.y * x)

    def margins(self, x):
        return self.y * x

    def log_phi_jet(self, x, order):
        """With u = y x, p = sigmoid(-u) = d log sigmoid(u) / du and q = 1 - p: log phi = min(u, 0) - log1p(e^-|u|),
        d/dx log phi = y p and, for k >= 2, d^k/dx^k log phi = y^k p q R_k(p), with P_1 = p,
        P_k = -p q P_{k-1}'(p) (as dp/du = -p q) and R_k = -P_{k-1}': every order from one exponential, and p, q
        each without cancellation. x: (..., K) nodes per site."""
        y = self.y[..., None]
        u = y * x
        e = jnp.exp(-jnp.abs(u))
        p = jnp.where(u >= 0, e, 1.0) / (1 + e)
        q = jnp.where(u >= 0, 1.0, e) / (1 + e)
        out = [jnp.minimum(u, 0) - jnp.log1p(e), y * p][: order + 1]
        for k, coefficients in enumerate(_sigmoid_jet_polynomials(order), start=2):
            R = float(coefficients[0])
            for c in coefficients[1:]:  # Horner; Python floats keep p's dtype
                R = R * p + float(c)
            out.append(y ** k * p * q * R)
        return out

    def feature(self):
        return 0.0, 0.75 * np.pi


def _sigmoid_jet_polynomials(order):
    """Coefficients (highest power first) of R_2..R_order in p: P_1 = p, R_k = -P_{k-1}', P_k = p (1 - p) R_k."""
    polys, P, pq = [], np.polynomial.Polynomial([0.0, 1.0]), np.polynomial.Polynomial([0.0, 1.0, -1.0])
    for _ in range(2, order + 1):
        R = -P.deriv()
        polys.append(R.coef[::-1])
        P = pq * R
    return polys


class Probit(AbstractQuadraturePotential):
    """phi(x) = Phi(y x) with y in {-1, +1} (Phi: standard normal cdf); log-concave.

    log Phi and its derivatives are evaluated stably for all x (`log_ndtr`): the first derivative is the inverse
    Mills ratio lambda(u) = N(u)/Phi(u) and the second -lambda (u + lambda), with u + lambda from a continued
    fraction for u < -6 (no cancellation as u -> -inf, where jax's own second derivative of log_ndtr errs).
    Feature: the first complex zeros of Phi(u) at u = 1.92 +- 2.82 i: center 1.9 y, width 2.

    Args:
        y: the labels, a scalar or an (N,) array with entries in {-1, +1}.
        num_points: quadrature nodes per site (int >= 2, default 64; fewer than 16 warns).

    Raises:
        ValueError: a label other than -1 or +1, or num_points not an int >= 2.
    """

    y: jax.Array
    num_points: int = eqx.field(static=True)
    log_concave: ClassVar[bool] = True

    def __init__(self, y, *, num_points=DEFAULT_NUM_POINTS):
        self.y = _labels(y)
        self.num_points = check_num_points(num_points)

    def log_phi(self, x):
        return log_ndtr_stable(self.y * x)

    def margins(self, x):
        return self.y * x

    def feature(self):
        return 1.9 * self.y, 2.0


class StudentT(AbstractQuadraturePotential):
    """phi(x) = Student-t(y | x, dof, scale); not log-concave.

    log phi = log Gamma((nu+1)/2) - log Gamma(nu/2) - 1/2 log(nu pi) - log scale - (nu+1)/2 log(1 + r^2/nu),
    r = (y - x)/scale. Feature: the logarithmic branch points at x = y +- i scale sqrt(nu): center y,
    width 0.75 scale sqrt(nu).

    Args:
        y: the observations, a scalar or an (N,) float array.
        dof: the degrees of freedom nu > 0, a scalar or an (N,) array.
        scale: the scale > 0, a scalar or an (N,) array (default 1).
        num_points: quadrature nodes per site (int >= 2, default 64; fewer than 16 warns).

    Raises:
        ValueError: non-finite or non-positive dof/scale, data not a scalar or 1-D, lengths that differ, or
            num_points not an int >= 2.
    """

    y: jax.Array
    dof: jax.Array
    scale: jax.Array
    num_points: int = eqx.field(static=True)
    log_concave: ClassVar[bool] = False

    def __init__(self, y, dof, scale=1.0, *, num_points=DEFAULT_NUM_POINTS):
        self.y = site_vector(y, "y")
        self.dof = site_vector(dof, "dof", positive=True)
        self.scale = site_vector(scale, "scale", positive=True)
        site_count(y=self.y, dof=self.dof, scale=self.scale)
        self.num_points = check_num_points(num_points)

    def log_phi(self, x):
        nu = self.dof
        r = (self.y - x) / self.scale
        return (student_t_log_norm(nu) - jnp.log(self.scale) - 0.5 * (nu + 1) * jnp.log1p(jnp.square(r) / nu))

    def feature(self):
        return self.y, 0.75 * self.scale * jnp.sqrt(self.dof)


class Cauchy(AbstractQuadraturePotential):
    """phi(x) = Cauchy(y | x, scale) = 1 / (pi scale (1 + r^2)), r = (y - x)/scale (Student-t with one degree of
    freedom); not log-concave. Feature: branch points at x = y +- i scale: center y, width 0.75 scale.

    Args:
        y: the observations, a scalar or an (N,) float array.
        scale: the scale > 0, a scalar or an (N,) array (default 1).
        num_points: quadrature nodes per site (int >= 2, default 64; fewer than 16 warns).

    Raises:
        ValueError: non-finite y or scale, scale not positive, lengths that differ, or num_points not an int >= 2.
    """

    y: jax.Array
    scale: jax.Array
    num_points: int = eqx.field(static=True)
    log_concave: ClassVar[bool] = False

    def __init__(self, y, scale=1.0, *, num_points=DEFAULT_NUM_POINTS):
        self.y = site_vector(y, "y")
        self.scale = site_vector(scale, "scale", positive=True)
        site_count(y=self.y, scale=self.scale)
        self.num_points = check_num_points(num_points)

    def log_phi(self, x):
        r = (self.y - x) / self.scale
        return -jnp.log(jnp.pi * self.scale) - jnp.log1p(jnp.square(r))

    def feature(self):
        return self.y, 0.75 * self.scale


class Custom(AbstractQuadraturePotential):
    """Any elementwise, twice-differentiable JAX function `log_phi(x)` of the projection.

    Pass `log_concave=True` only if it is (it selects the Newton solver and promises a concave bound).
    Expectations use Gauss-Hermite, accurate while s_n is below the distance of log_phi's complex singularities
    from the real axis; pass `center` and `width` (where log_phi bends, and over what scale) to use the
    feature-adapted rule instead, accurate for every s_n.

    Args:
        log_phi: a JAX function mapping an array of projections to log phi elementwise (same shape out).
        log_concave: whether log_phi is concave (default False).
        num_points: quadrature nodes per site (int >= 2, default 64).
        center: where log_phi bends, a scalar or one value per site (with `width`), or None for Gauss-Hermite.
        width: the scale of that bend (> 0), a scalar or one value per site, or None.

    Raises:
        ValueError: log_phi not callable, only one of center/width given, center not finite, width not
            positive, either of them more than 1-D, or num_points not an int >= 2. Calling `log_phi` raises it
            too when the function is not a JAX elementwise function.
    """

    fn: Callable = eqx.field(static=True)
    num_points: int = eqx.field(static=True)
    concave: bool = eqx.field(static=True)
    center: Optional[jax.Array]
    width: Optional[jax.Array]

    def __init__(self, log_phi, *, log_concave=False, num_points=DEFAULT_NUM_POINTS, center=None, width=None):
        if not callable(log_phi):
            raise ValueError("log_phi must be a callable mapping projections to log potentials")
        if (center is None) != (width is None):
            raise ValueError("center and width must be given together (or neither)")
        self.fn = CodeKey(log_phi)     # compared by code and captured values: one compilation per code object
        self.concave = bool(log_concave)
        self.num_points = check_num_points(num_points, adapted=center is not None)
        if center is not None:
            center = as_float_array(center, "center")
            check_finite(center, "center")
            width = as_float_array(width, "width")
            check_positive(width, "width")
            for name, arr in (("center", center), ("width", width)):
                if arr.ndim > 1:
                    raise ValueError(f"{name} must be a scalar or one value per site (1-D), got shape {arr.shape}")
        self.center = center
        self.width = width

    def feature(self):
        return None if self.center is None else (self.center, self.width)

    @property
    def log_concave(self):  # type: ignore[override]
        return self.concave

    def log_phi(self, x):
        """log_phi(x), checked (at trace time) to be a JAX function returning an array shaped like x."""
        if isinstance(x, jax.core.Tracer):
            note_trace(self.fn)
        try:
            out = self.fn(x)
        except (TypeError, jax.errors.ConcretizationTypeError, jax.errors.TracerArrayConversionError) as err:
            raise ValueError("Custom: log_phi must be a JAX function of an array (jax.numpy, not math or numpy), "
                             f"applied elementwise; calling it on an array of shape {jnp.shape(x)} failed: "
                             f"{type(err).__name__}: {str(err).splitlines()[0]}") from err
        if jnp.shape(out) != jnp.shape(x):
            raise ValueError(f"Custom: log_phi must be elementwise, returning an array shaped like its input; it "
                             f"mapped shape {jnp.shape(x)} to {jnp.shape(out)}")
        return out
