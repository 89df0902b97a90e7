"""The one result currency of every inference method."""

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Bool, Float, Int

from ._gaussian import Gaussian
from ._repr import format_value
from ._status import RESULTS, HasStatus
from ._typing import ScalarLike


class Result(HasStatus):
    """A fitted Gaussian and its evidence estimate.

    An L-BFGS or optax G-KL fit that stops short of `tol` returns the best iterate it saw, so `log_z` is then
    the largest entry of `history`, not necessarily its last.

    Attributes:
        q: the Gaussian approximation N(m, C^T C), a `gkl_jax.Gaussian`.
        log_z: float scalar array, the objective at `q` (for G-KL the lower bound of Challis & Barber 2013,
            eq. 7; see `is_bound`); for a G-KL `fit`, exact derivatives of every order in the model (envelope
            theorem at the implicitly differentiated q).
        status: int32 scalar array, why the method stopped: a `gkl_jax.RESULTS` code (`message` says it in words).
        num_steps: int scalar array, outer iterations taken. With a refined factor (`Subspace`,
            `num_refinements` > 0) `max_steps` bounds each round's solve, and `num_steps` counts the steps of all
            rounds, so it can exceed `max_steps`.
        history: (max_steps + 1,) float array, the objective after each step; entries past num_steps are NaN
            (for a refined factor, the first max_steps + 1 values across the rounds).
        method: str, the method's name (static).
        is_bound: bool, whether `log_z` is a guaranteed lower bound on log Z (static).

    Args:
        q, log_z, num_steps, history, method, is_bound: as the attributes.
        status: the `RESULTS` code; or None with `converged` given (then successful where converged, else
            max_steps_reached where num_steps reached the history's last index, else stalled).
        converged: bool scalar, for methods that report no status of their own (ignored where `status` is given).
    """

    q: Gaussian
    log_z: jax.Array
    status: jax.Array
    num_steps: jax.Array
    history: jax.Array
    method: str = eqx.field(static=True, default="gkl")
    is_bound: bool = eqx.field(static=True, default=True)

    def __init__(self, q: Gaussian, log_z: ScalarLike, converged: bool | Bool[Array, ""] | None = None,
                 num_steps: int | Int[Array, ""] | None = None, history: Float[ArrayLike, " steps"] | None = None,
                 method: str = "gkl", is_bound: bool = True, *, status: int | Int[ArrayLike, ""] | None = None):
        if status is None:
            if converged is None:
                raise ValueError("Result needs status (a gkl_jax.RESULTS code) or converged")
            short: int | jax.Array = RESULTS.stalled
            if history is not None and num_steps is not None and jnp.ndim(history) == 1:
                short = jnp.where(num_steps >= jnp.shape(history)[0] - 1, RESULTS.max_steps_reached, short)
            status = jnp.where(converged, RESULTS.successful, short)
        self.q = q
        # stored as given: arrays from the methods (a caller may pass numbers)
        self.log_z, self.num_steps, self.history = log_z, num_steps, history  # type: ignore[assignment]
        self.status = jnp.asarray(status, jnp.int32)
        self.method, self.is_bound = method, is_bound

    def __repr__(self):
        return (f"Result(method={self.method!r}, log_z={format_value(self.log_z)}, "
                f"status={RESULTS.name(self.status)}, num_steps={format_value(self.num_steps)}, "
                f"is_bound={self.is_bound}, q={self.q!r})")
