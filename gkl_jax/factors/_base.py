"""Cholesky factors C of the G-KL covariance S = C^T C (Challis & Barber 2013, Section 4).

A factor is created as a template (`Full()`, `Diagonal()`, ...) and filled by `initialise(dim, variances)`
when the fit knows D. Every factor implements the same small interface, so the bound, the solvers,
prediction and design never branch on the factor type:

- `logdet()`                 log det S
- `project_variances(op)`    s_n^2 = ||C h_n||^2 for the rows h_n of an operator H (the hot path)
- `marginal_variances()`     diag(S)
- `trace()`                  tr S (the isotropic prior's tr(Sigma^{-1} S))
- `dense()`                  C as a dense matrix (users and tests only)
- `matvec(v)`, `rmatvec(z)`  C v and C^T z (sampling: w = m + C^T z)
- `covariance()`             S = C^T C as a dense matrix (users and tests only)

Factors with a closed-form stationary point of eq. 10 (S^{-1} = Sigma^{-1} + H^T Gamma H) implement
`AbstractFixedPointFactor.fixed_point`, used by the fixed-point solver.
"""

import abc

import equinox as eqx
import jax
import jax.numpy as jnp

from .._linalg import tdot


class AbstractFactor(eqx.Module):
    """A parametrisation C of the G-KL covariance S = C^T C (Challis & Barber 2013, Section 4), created as a
    template (no arrays) and filled by `initialise` when the fit knows D. The class variable `concave` says
    whether the bound is concave in this parametrisation for log-concave sites (Section 3.2);
    `gkl_jax.solvers.default_solver` reads it.

    Attributes:
        concave: bool class variable, whether the bound is concave in this parametrisation for log-concave sites.
        is_initialised: bool property, False for a template (its arrays are None).
        dim: int property, D (an initialised factor only).
    """

    concave: eqx.AbstractClassVar[bool]

    @abc.abstractmethod
    def initialise(self, dim: int, variances):
        """A filled factor of dimension `dim` with S = diag(variances) (or the nearest the structure allows).

        Args:
            dim: D, an int >= 1.
            variances: a positive scalar or a (D,) float array of starting marginal variances.

        Returns:
            a factor of the same type and structure, initialised.
        """

    @property
    @abc.abstractmethod
    def is_initialised(self) -> bool: ...

    @property
    @abc.abstractmethod
    def dim(self) -> int: ...

    @abc.abstractmethod
    def logdet(self):
        """log det S = 2 log |det C|.

        Returns:
            float scalar.
        """

    @abc.abstractmethod
    def project_variances(self, op):
        """The projected variances s_n^2 = h_n^T S h_n = ||C h_n||^2 for every row h_n of `op` (the hot path of the
        bound, Challis & Barber 2013, eq. 7).

        Args:
            op: a `gkl_jax.operators` operator of shape (N, D).

        Returns:
            (N,) float array.
        """

    def mean_field_start(self, model) -> bool:
        """Whether `fit`, given this template and `model`, starts from `from_mean_field` (after a Diagonal fit)
        instead of `initialise` (`gkl_jax._start`).

        Args:
            model: the `gkl_jax.Model` to be fitted.

        Returns:
            bool (False by default).
        """
        return False

    def from_mean_field(self, dim: int, mean_field, precision):
        """A factor to start fitting from, given the Diagonal optimum. By default `initialise` with the mean-field
        variances.

        Args:
            dim: D.
            mean_field: the `gkl_jax.Gaussian` of the Diagonal fit.
            precision: a callable returning the dense (D, D) precision A = Sigma^{-1} + sum H^T diag(Gamma) H at
                the mean-field optimum (Challis & Barber 2013, eq. 10).

        Returns:
            an initialised factor of this type.
        """
        return self.initialise(dim, mean_field.factor.marginal_variances())

    def project(self, op, mean):
        """(m_n, s_n^2) = (h_n^T m, h_n^T S h_n) for every row h_n of `op`; factors whose s_n^2 come from a product
        H X override it to take H m from the same product.

        Args:
            op: a `gkl_jax.operators` operator of shape (N, D).
            mean: (D,) float array m.

        Returns:
            (m, s2): two (N,) float arrays.
        """
        return op.mv(mean), self.project_variances(op)

    @abc.abstractmethod
    def marginal_variances(self):
        """The marginal variances diag(S).

        Returns:
            (D,) float array.
        """

    def trace(self):
        """tr S = sum diag(S); factors override it where a closed form is cheaper than diag(S).

        Returns:
            float scalar.
        """
        return jnp.sum(self.marginal_variances())

    @abc.abstractmethod
    def dense(self):
        """The factor as a dense matrix C with S = C^T C.

        Returns:
            (D, D) float array.
        """

    @abc.abstractmethod
    def matvec(self, v):
        """The product C v.

        Args:
            v: (D,) float array.

        Returns:
            (D,) float array.
        """

    @abc.abstractmethod
    def rmatvec(self, z):
        """The product C^T z (sampling: w = m + C^T z).

        Args:
            z: (D,) float array.

        Returns:
            (D,) float array.
        """

    def covariance_mv(self, v):
        """The covariance product S v = C^T (C v).

        Args:
            v: (D,) float array.

        Returns:
            (D,) float array.
        """
        return self.rmatvec(self.matvec(v))

    def covariance(self):
        """The covariance S = C^T C as a dense matrix.

        Returns:
            (D, D) float array.
        """
        C = self.dense()
        return tdot(C, C)

    def precondition_tangent(self, tangent):
        """An approximation of the inverse of -d^2 B / d(factor)^2 applied to a tangent of this factor, the
        preconditioner of Newton-CG (`gkl_jax.solvers.Newton`); None where the factor has none (CG then runs
        unpreconditioned in the factor's parameters).

        Args:
            tangent: a factor of this type holding a direction in its parameters.

        Returns:
            A factor of this type holding the preconditioned direction, or None.
        """
        return None


class AbstractFixedPointFactor(AbstractFactor):
    """A factor whose optimal value for fixed Gamma (Challis & Barber 2013, eq. 10) has a closed form.
    """

    def interpolate(self, target, rho):
        """The factor C + rho (C* - C) on the segment to `target` (the fixed-point solver's factor step).

        Args:
            target: an initialised factor of this type (C*).
            rho: float scalar.

        Returns:
            An initialised factor of this type.
        """
        return jax.tree.map(lambda a, b: a + rho * (b - a) if eqx.is_inexact_array(a) else a, self, target)

    def variance_path(self, op, target):
        """The site variances s_n^2 = h_n^T S h_n along the segment C + rho (C* - C), as a function of rho that
        is cheap to evaluate for many rho (the line search of the factor step). By default each evaluation projects
        the interpolated factor (`project_variances`); a factor whose projection costs more than O(N D) overrides
        it with a precomputed form.

        Args:
            op: the site group's operator (N_g, D).
            target: the other end of the segment (C*), an initialised factor of this type.

        Returns:
            A function rho -> (N_g,) float array.
        """
        return lambda rho: self.interpolate(target, rho).project_variances(op)

    @abc.abstractmethod
    def fixed_point(self, prior, sites_ops, gammas):
        """The factor of S = (Sigma^{-1} + sum_sites H^T diag(Gamma) H)^{-1} (Challis & Barber 2013, eq. 10), within
        this structure.

        Args:
            prior: the model's `gkl_jax.priors` prior, or None.
            sites_ops: a sequence of the site groups' operators, each (N_g, D).
            gammas: a sequence of (N_g,) float arrays, the site curvatures Gamma_nn = -E[(log phi_n)''] of each group.

        Returns:
            an initialised factor of this type.
        """


def check_initialised(factor):
    if not factor.is_initialised:
        raise ValueError(f"{type(factor).__name__} factor is a template; call initialise(dim, variances) first")


def signed_log_abs_diag(diag):
    """sum log|C_ii|: log det S / 2. C and -C give the same S, so the sign of a diagonal entry is irrelevant."""
    return jnp.sum(jnp.log(jnp.abs(diag)))
