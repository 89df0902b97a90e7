"""One status vocabulary for every result: `RESULTS`, the codes of why an iteration stopped, each with a message."""

import equinox as eqx
import jax.numpy as jnp

from ._validate import is_concrete


class RESULTS:
    """Why a fit, a baseline or an ML-II run stopped: the `status` of a `Result` (an int32 array), with
    `RESULTS.message(status)` its sentence. `converged` is `status == RESULTS.successful`.

        >>> import gkl_jax as gk
        >>> gk.RESULTS.message(gk.RESULTS.max_steps_reached)
        'max_steps_reached: the step limit was reached before the stopping test was met'
    """

    successful = 0
    """The stopping test was met."""
    max_steps_reached = 1
    """`max_steps` steps were taken without meeting the stopping test."""
    stalled = 2
    """No step could raise the objective any further (round-off, or a line search that found no ascent)."""
    nonfinite = 3
    """The objective or its gradient is NaN or infinite at the last point."""
    improper_target = 4
    """The target is improper (log Z = inf): without a prior, the mean separates the labels of binary sites."""
    breakdown = 5
    """The method's own update failed (for EP, a site update that no damping keeps positive definite)."""
    invalid_argument = 6
    """An argument passed as a traced value was invalid (a tolerance that is not positive and finite)."""

    names = ("successful", "max_steps_reached", "stalled", "nonfinite", "improper_target", "breakdown",
             "invalid_argument")
    messages = (
        "the stopping test was met",
        "the step limit was reached before the stopping test was met",
        "no step could raise the objective further (round-off or a failed line search) before the stopping test "
        "was met",
        "the objective or its gradient is not finite at the last point",
        "the target is improper (the mean separates the labels and no prior bounds it: log Z = inf)",
        "the method's update broke down (no damped update kept the approximation positive definite)",
        "an argument passed as a traced value was invalid (a tolerance that is not positive and finite)",
    )

    @classmethod
    def name(cls, code) -> str:
        """The name of a status code (a Python int or a concrete int array); '?' for a traced one.

        Args:
            code: a `RESULTS` code.

        Returns:
            str.
        """
        if not is_concrete(code):
            return "?"
        code = int(code)
        return cls.names[code] if 0 <= code < len(cls.names) else f"unknown({code})"

    @classmethod
    def message(cls, code) -> str:
        """'name: sentence' of a status code (a Python int or a concrete int array); '?' for a traced one.

        Args:
            code: a `RESULTS` code.

        Returns:
            str.
        """
        name = cls.name(code)
        if name == "?" or name.startswith("unknown"):
            return name
        return f"{name}: {cls.messages[int(code)]}"


def status(converged, value, num_steps, max_steps):
    """The `RESULTS` code of a finished iteration: successful where `converged`, else nonfinite where the value is
    not finite, else max_steps_reached where the steps ran out, else stalled.

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


def status_from(converged, *, max_steps_reached=None, nonfinite=None, breakdown=None):
    """A `RESULTS` code from a method's own flags (the baselines): successful where `converged`, else the first
    of breakdown, nonfinite, max_steps_reached that holds, else stalled.

    Args:
        converged: bool scalar.
        max_steps_reached, nonfinite, breakdown: bool scalars, or None (never).

    Returns:
        int32 scalar.
    """
    code = jnp.asarray(RESULTS.stalled)
    for flag, value in ((max_steps_reached, RESULTS.max_steps_reached), (nonfinite, RESULTS.nonfinite),
                        (breakdown, RESULTS.breakdown)):
        if flag is not None:
            code = jnp.where(flag, value, code)
    return jnp.where(converged, RESULTS.successful, code).astype(jnp.int32)


class HasStatus(eqx.Module):
    """The status properties every result shares: `converged` and `message`, derived from its `status` field (a
    `RESULTS` code; the class says which stopping test it records)."""

    @property
    def converged(self):
        """bool (scalar array where `status` is an array): whether the stopping test was met
        (`status == RESULTS.successful`)."""
        return self.status == RESULTS.successful

    @property
    def message(self) -> str:
        """Why the run stopped, in words (`RESULTS.message(status)`; '?' under tracing)."""
        return RESULTS.message(self.status)
