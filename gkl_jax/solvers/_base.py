"""The solver interface: every solver of the G-KL bound is an Equinox module whose fields are its settings and
whose `init` / `step` / `terminate` / `postprocess` run in the one loop of `gkl_jax.solvers._iterate.iterate`,
which returns a `Solution`."""

import abc
from typing import Any, Callable, ClassVar

import equinox as eqx
import jax
from jax.flatten_util import ravel_pytree

from .._adjoint import envelope_bound, envelope_bound_at
from .._bound import bound
from .._status import RESULTS as RESULTS
from .._status import status as status
from .._validate import check_int, check_max_steps, check_tol
from ..factors import AbstractFactor
from ._iterate import Solution as Solution
from ._iterate import Step as Step
from ._iterate import iterate


class Problem(eqx.Module):
    """A G-KL maximisation as the solvers see it: the (gradient-free) model and the starting q, split into the
    flat vector of its solver leaves `x0` and the rest.

    Attributes:
        model: the `Model` (its arrays behind `lax.stop_gradient`).
        q0: the starting `Gaussian`.
        mask: a pytree of bools over q0, True at the leaves the solver optimises.
        scale: sigma0, the variables' typical scale for the stopping test (`gkl_jax._optim.stationary`): the
            fit's starting standard deviation sqrt(v0) (scalar array, or 1.0).
        progress: None, or the callable that receives a `ProgressInfo` after each step (static).
    """

    model: Any
    q0: Any
    mask: Any
    scale: Any = 1.0
    progress: Callable | None = eqx.field(static=True, default=None)

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


class ObjectiveProblem(eqx.Module):
    """A maximisation of a plain function of a flat vector, as the first-order and Newton solvers see it (the
    functional forms `lbfgs`, `newton_cg`, `optax_solver` run their solver on one).

    Attributes:
        objective: (P,) -> scalar, the function to maximise (static).
        x0: (P,) the start.
        scale: sigma0 of the stopping test (scalar).
        precondition: x -> (v -> P v), Newton-CG's preconditioner at x, or None (static).
        progress: None, or a progress callable (static).
    """

    objective: Callable = eqx.field(static=True)
    x0: jax.Array
    scale: Any = 1.0
    precondition: Callable | None = eqx.field(static=True, default=None)
    progress: Callable | None = eqx.field(static=True, default=None)

    def preconditioner(self, x):
        """`precondition(x)`, or None."""
        return None if self.precondition is None else self.precondition(x)


class AbstractSolver(eqx.Module):
    """A maximiser of the G-KL bound over q = N(m, C^T C).

    Every solver has a tolerance `tol` (None: `default_tol` of the model's dtype) on the scale-aware stopping
    statistic max_i |dB/dx_i| max(|x_i|, sigma0) <= max(tol, 8 eps |B|) (`gkl_jax._optim.stationary`) and a step limit
    `max_steps` (None: the solver's `default_max_steps`); subclasses add their own settings as fields.
    `check(model, factor)` raises a ValueError where the solver cannot apply, `solve(problem, tol, max_steps)`
    runs it (for an `AbstractIterativeSolver`, in the one loop `iterate`); `log_z` gives the bound at the
    solution with its derivatives in the model. Adding a solver is one new subclass (and one export in
    `gkl_jax.solvers`).

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

    def log_z(self, model, q, solution: Solution):
        """The bound at the solution's q with its derivatives in the model (the envelope rule, Challis & Barber
        2013, App. F.2): from the solver's own value where it has one (no further quadrature).

        Args:
            model: the `Model` (with its derivatives); q: the optimum (with its implicit derivative);
            solution: the `Solution`.

        Returns:
            Scalar.
        """
        if solution.value is None:
            return envelope_bound(model, q)
        return envelope_bound_at(model, q, jax.lax.stop_gradient(solution.value))


class AbstractIterativeSolver(AbstractSolver):
    """A solver that runs in `iterate`, the one loop of `gkl_jax.solvers`: it supplies `init`, `step`, `terminate`,
    `point` and `postprocess` (the protocol is `iterate`'s doc), and `solve` is `iterate`. The loop owns the step
    count, the history, the best point (for a solver that is not `monotone`), the status and the progress callback.
    """

    monotone: ClassVar[bool] = True
    """False where the iterates may lose ground: `iterate` then returns the best point seen short of tol."""
    start_in_loop: ClassVar[bool] = True
    """Whether the loop's first iteration evaluates the start (`init`'s value is then a placeholder)."""

    def solve(self, problem: Problem, tol, max_steps: int) -> Solution:
        """Maximise the bound from `problem.q0` (`iterate` over this solver's protocol).

        Args:
            problem: the `Problem` (model and start).
            tol: the gradient tolerance (a scalar array of the model's dtype).
            max_steps: the step limit (int).

        Returns:
            The `Solution`.
        """
        return iterate(self, problem, tol, max_steps, progress=problem.progress)[0]

    @abc.abstractmethod
    def init(self, problem, tol, max_steps: int):
        """The loop's initial state and the objective at the start (a placeholder where `start_in_loop`).

        Args:
            problem: the `Problem`; tol: the tolerance; max_steps: the step limit.

        Returns:
            (state, value).
        """

    @abc.abstractmethod
    def step(self, problem, state, tol):
        """One iteration of the loop.

        Args:
            problem: the `Problem`; state: the current state; tol: the tolerance.

        Returns:
            (state, `Step`).
        """

    @abc.abstractmethod
    def terminate(self, problem, state, tol):
        """The stopping test at the current point and the solver's own reason to stop short of it.

        Args:
            problem: the `Problem`; state: the current state; tol: the tolerance.

        Returns:
            (converged, stop): bool scalars.
        """

    @abc.abstractmethod
    def point(self, state):
        """The current point (the best one seen is kept of it for a solver that is not `monotone`).

        Args:
            state: the loop's state.

        Returns:
            A pytree of arrays.
        """

    def postprocess(self, problem, state, point):
        """The flat solver leaves of the returned point, and the solver's quantities at the optimum.

        Args:
            problem: the `Problem`; state: the final state; point: the point returned (`point(state)` or the best
                one seen).

        Returns:
            (x, extras): x the (P,) flat vector, extras a pytree or None.
        """
        return point, None



def check_setting(value, name, solver, minimum=1):
    """`value` checked as an int >= minimum (ValueError naming `solver`'s setting `name`)."""
    return check_int(value, f"{type(solver).__name__}: {name}", minimum)
