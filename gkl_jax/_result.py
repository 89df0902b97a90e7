"""The one result currency of every inference method."""

import equinox as eqx
import jax

from ._gaussian import Gaussian


class Result(eqx.Module):
    """A fitted Gaussian and its evidence estimate.

    An L-BFGS or optax G-KL fit that stops short of `tol` returns the best iterate it saw, so `log_z` is then
    the largest entry of `history`, not necessarily its last.

    Attributes:
        q: the Gaussian approximation N(m, C^T C), a `gkl_jax.Gaussian`.
        log_z: float scalar array, the objective at `q` (for G-KL the lower bound of Challis & Barber 2013,
            eq. 7; see `is_bound`); for a G-KL `fit`, exact derivatives of every order in the model (envelope
            theorem at the implicitly differentiated q).
        converged: bool scalar array, whether the stopping rule (max |gradient| <= tol, or the method's own)
            was met.
        num_steps: int scalar array, outer iterations taken. With a refined factor (`Subspace`,
            `num_refinements` > 0) `max_steps` bounds each round's solve, and `num_steps` counts the steps of all
            rounds, so it can exceed `max_steps`.
        history: (max_steps + 1,) float array, the objective after each step; entries past num_steps are NaN
            (for a refined factor, the first max_steps + 1 values across the rounds).
        method: str, the method's name (static).
        is_bound: bool, whether `log_z` is a guaranteed lower bound on log Z (static).
    """

    q: Gaussian
    log_z: jax.Array
    converged: jax.Array
    num_steps: jax.Array
    history: jax.Array
    method: str = eqx.field(static=True, default="gkl")
    is_bound: bool = eqx.field(static=True, default=True)
