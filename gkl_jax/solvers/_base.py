"""The solver interface: every solver of the G-KL bound is an Equinox module whose fields are its settings,
with one `solve` path that returns a `Solution`."""

import abc
from typing import Any, ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
from jax.flatten_util import ravel_pytree

from .._bound import bound
from .._validate import check_int, check_max_steps, check_tol
from ..factors import AbstractFactor


class RESULTS:
    """Why a solver stopped (the `status` of a `Solution`)."""

    successful = 0
    """The stopping test was met."""
    max_steps_reached = 1
    """`max_steps` steps were taken without meeting the stopping test."""
    stalled = 2
    """No step could raise the objective any further (round-off, or a line search that found no ascent)."""
    nonfinite = 3
    """The objective or its gradient is NaN or infinite at the last point."""

    names = ("successful", "max_steps_reached", "stalled", "nonfinite")


def status(converged, value, num_steps, max_steps):
    """The `RESULTS` code of a finished solve.

    Args:
        converged: bool scalar, the stopping test at the returned point.
        value: the objective there (scalar).
        num_steps: steps taken (int scalar).
        max_steps: the step limit (int).

    Returns:
        int32 scalar, one of the `RESULTS` codes.
    """
    code = jnp.where(num_steps >= max_steps, RESULTS.max_steps_reached, RESULTS.stalled)
    code = jnp.where(jnp.isfinite(value), code, RESULTS.nonfinite)
    return jnp.where(converged, RESULTS.successful, code).astype(jnp.int32)


class Solution(eqx.Module):
    """What a solver returns.

    Attributes:
        x: (P,) the optimum found, as the flat vector of the solver leaves of q (`Problem.to_q` maps it back).
        num_steps: int32 scalar, outer steps taken.
        converged: bool scalar, whether the stopping test was met.
        history: (max_steps + 1,) the objective after each step (NaN past `num_steps`).
        status: int32 scalar, a `RESULTS` code.
        extras: solver-specific quantities at the optimum (the site-precision solver's (W, parts)), or None.
        value: the objective at x, where the solver has it (`fit` then takes the bound from it instead of
            evaluating it once more), or None.
    """

    x: jax.Array
    num_steps: jax.Array
    converged: jax.Array
    history: jax.Array
    status: jax.Array
    extras: Any = None
    value: Any = None


class Problem(eqx.Module):
    """A G-KL maximisation as the solvers see it: the (gradient-free) model and the starting q, split into the
    flat vector of its solver leaves `x0` and the rest.

    Attributes:
        model: the `Model` (its arrays behind `lax.stop_gradient`).
        q0: the starting `Gaussian`.
        mask: a pytree of bools over q0, True at the leaves the solver optimises.
        scale: sigma0, the variables' typical scale for the stopping test (`gkl_jax._optim.stationary`): the
            fit's starting standard deviation sqrt(v0) (scalar array, or 1.0).
    """

    model: Any
    q0: Any
    mask: Any
    scale: Any = 1.0

    @property
    def x0(self):
        """(P,) the solver leaves of q0, flattened."""
        return ravel_pytree(eqx.filter(self.q0, self.mask))[0]

    def to_q(self, x):
        """The Gaussian whose solver leaves are the flat vector x and whose other leaves are q0's.

        Args:
            x: (P,) float array, the solver leaves flattened as in `x0`.

        Returns:
            `gkl_jax.Gaussian`.
        """
        params, static = eqx.partition(self.q0, self.mask)
        unravel = ravel_pytree(params)[1]
        return eqx.combine(unravel(x), static)

    def preconditioner(self, x):
        """The Newton-CG preconditioner at x: v -> P v approximating the inverse of -d^2 B/dx^2, with
        S = C^T C on the mean (the inverse curvature in m up to the change of Gamma) and the factor's
        `precondition_tangent` on its leaves; None where the factor has none or some of its leaves are held fixed.

        Args:
            x: (P,) float array, the current point.

        Returns:
            A callable (P,) -> (P,), or None.
        """
        factor = self.q0.factor
        if type(factor).precondition_tangent is AbstractFactor.precondition_tangent:
            return None
        if not all(jax.tree.leaves(self.mask)):
            return None
        q = self.to_q(x)
        unravel = ravel_pytree(eqx.filter(self.q0, self.mask))[1]

        def apply(v):
            t = unravel(v)
            t = eqx.tree_at(lambda g: (g.mean, g.factor), t,
                            (q.factor.covariance_mv(t.mean), q.factor.precondition_tangent(t.factor)))
            return ravel_pytree(t)[0]

        return apply

    def objective(self, x):
        """B(model, to_q(x)), the G-KL bound (Challis & Barber 2013, eq. 7) at a flat vector of solver leaves.

        Args:
            x: (P,) float array.

        Returns:
            float scalar array.
        """
        return bound(self.model, self.to_q(x))


class AbstractSolver(eqx.Module):
    """A maximiser of the G-KL bound over q = N(m, C^T C).

    Every solver has a tolerance `tol` (None: `default_tol` of the model's dtype) on the scale-aware stopping
    statistic max_i |dB/dx_i| max(|x_i|, sigma0) <= max(tol, 8 eps |B|) (`gkl_jax._optim.stationary`) and a step limit
    `max_steps` (None: the solver's `default_max_steps`); subclasses add their own settings as fields.
    `check(model, factor)` raises a ValueError where the solver cannot apply, `solve(problem, tol, max_steps)`
    runs it. Adding a solver is one new subclass (and one export in `gkl_jax.solvers`).

    Args:
        tol: the gradient tolerance (positive float), or None for the dtype's default.
        max_steps: the step limit (int >= 1), or None for the solver's `default_max_steps`.

    Raises:
        ValueError: a tol that is not a positive float, or a max_steps that is not an int >= 1.
    """

    tol: float | None = None
    max_steps: int | None = None
    default_max_steps: ClassVar[int] = 500

    def __check_init__(self):
        if self.tol is not None and not isinstance(self.tol, jax.core.Tracer):
            check_tol(self.tol, f"{type(self).__name__}: tol")
        if self.max_steps is not None:
            check_max_steps(self.max_steps, f"{type(self).__name__}: max_steps")

    def check(self, model, factor) -> None:
        """Raise a ValueError (naming the solver) where it cannot apply to `model` with `factor`.

        Args:
            model: the `Model` to fit.
            factor: the factor (template or initialised) of q.
        """

    @abc.abstractmethod
    def solve(self, problem: Problem, tol, max_steps: int) -> Solution:
        """Maximise the bound from `problem.q0`.

        Args:
            problem: the `Problem` (model and start).
            tol: the gradient tolerance (a scalar array of the model's dtype).
            max_steps: the step limit (int).

        Returns:
            The `Solution`.
        """


def check_setting(value, name, solver, minimum=1):
    """`value` checked as an int >= minimum (ValueError naming `solver`'s setting `name`)."""
    return check_int(value, f"{type(solver).__name__}: {name}", minimum)
