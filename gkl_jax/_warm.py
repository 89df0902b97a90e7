"""Warm-started site-precision fits for ML-II (`gp.fit_hyperparameters`): each outer step needs log Z, its
gradient and a warm start, and the Full factor C only once, at the end."""

import equinox as eqx
import jax
import jax.numpy as jnp
from jax import lax

from ._adjoint import frozen, stop_gradients
from ._gaussian import Gaussian
from ._optim import default_tol
from ._program import program
from ._result import Result
from ._start import initial_q, initial_variance
from .factors import Full
from .solvers import SitePrecision, default_solver
from .solvers._default import robust_default_applies
from .solvers._site_precision import site_precision
from .solvers._site_precision_parts import applies as site_precision_applies
from .solvers._site_precision_parts import initial_point, point, posterior
from .solvers._site_precision_parts import log_z as _site_precision_log_z


class WarmPoint(eqx.Module):
    """Where the next `fit_warm` starts: the mean m and site precisions W of an earlier optimum (for the next
    ML-II step, a model with another prior). Starting from a Gaussian q0 instead costs one more quadrature, for
    W = Gamma at q0's marginals, which at an optimum is W again.

    Attributes:
        mean: (n,) the mean m.
        site_precisions: (n,) the site precisions W.
    """

    mean: jax.Array
    site_precisions: jax.Array


class WarmStart(eqx.Module):
    """What one ML-II evaluation by `fit_warm` returns.

    Attributes:
        q: N(m, diag S), the optimum's mean and marginal variances (a Full factor with diagonal C).
        site_precisions: (n,) W of S = (Sigma^{-1} + diag W)^{-1}.
        log_z, converged, num_steps, history: as in `Result`.
        gap: to second order how far `log_z` lies below the optimum (ML-II reads it as the resolution of its
            objective).
    """

    q: Gaussian
    site_precisions: jax.Array
    log_z: jax.Array
    converged: jax.Array
    num_steps: jax.Array
    history: jax.Array
    gap: jax.Array

    @property
    def point(self) -> WarmPoint:
        """Where the next evaluation starts."""
        return WarmPoint(self.q.mean, self.site_precisions)


def warm_fit_applies(model, solver=None) -> bool:
    """Whether `fit(model, solver=solver)` runs the site-precision solver at its default tolerance and step limit
    (None: `fit`'s default solver for the model), so that `fit_warm` can stand in for it inside ML-II.

    Args:
        model: the `Model`.
        solver: the solver passed to `fit`, or None.

    Returns:
        bool.
    """
    chosen = default_solver(model, Full()) if solver is None else solver
    return (isinstance(chosen, SitePrecision) and chosen.tol is None and chosen.max_steps is None
            and site_precision_applies(model))


def ml2_solver(model):
    """The inner solver of ML-II (`gp.fit_hyperparameters`) when none is given: `fit`'s default, except for
    non-log-concave sites under a GP or dense prior with h_n = e_n (robust GP regression), where it is
    `SitePrecision()` on signed site precisions, each inner fit started at the last optimum (`fit_warm`). A single
    cold fit keeps the robust default, which reached the best optimum on every case of
    `benchmarks/robust_defaults.py` where the site precisions twice stopped at a worse one; inside ML-II the site
    precisions reached the robust default's optima on every problem measured (design-decisions page).

    Args:
        model: the `Model` at the starting hyperparameters.

    Returns:
        An `AbstractSolver`.
    """
    if robust_default_applies(model, Full()) and site_precision_applies(model):
        return SitePrecision()
    return default_solver(model, Full())


def fit_warm(model, *, q0=None, tol=None) -> WarmStart:
    """`fit(model, q0=q0, tol=tol)` by the site-precision solver without forming the Full factor C.

    `log_z` is the same bound as `fit`'s, with the same closed-form derivative in the model.

    Args:
        model: a `Model` for which `warm_fit_applies`.
        q0: a `Gaussian` (as for `fit`), the `WarmPoint` of an earlier fit_warm, or None.
        tol: gradient tolerance (None: the dtype's default).

    Returns:
        A `WarmStart`.
    """
    work = frozen(model)
    if isinstance(q0, WarmPoint):
        start = point(work, *stop_gradients((q0.mean, q0.site_precisions)))
    else:
        start = initial_point(work, stop_gradients(initial_q(model, Full(), q0)))
    dtype = start[0].dtype
    tol = jnp.asarray(default_tol(dtype) if tol is None else tol, dtype)
    m, k, ok, hist, (W, *parts), gap = _site_precision_jit(work, start, tol, SitePrecision.default_max_steps)
    log_z = _site_precision_log_z(model, lax.stop_gradient(m), W, parts)
    return WarmStart(Gaussian(m, Full(jnp.diag(jnp.sqrt(parts[1])))), W, log_z, ok, k, hist, gap)


# Run eagerly (ML-II with jit=False), the solver's while loop closed over the model's arrays as constants of its
# jaxpr, so every evaluation compiled it again; jitted on its own, it compiles once per shape.
@program
def _site_precision_jit(model, start, tol, max_steps):
    """`site_precision` with sigma0 = sqrt(v0) of the stopping test, as in `fit`."""
    return site_precision(model, start, tol, max_steps, jnp.sqrt(initial_variance(model)))


def warm_result(model, warm: WarmStart) -> Result:
    """The `Result` of the fit that `warm` summarises: q = N(m, (Sigma^{-1} + diag W)^{-1}) with its Full factor.

    Args:
        model: the `Model`.
        warm: the `WarmStart`.

    Returns:
        A `Result`.
    """
    q = posterior(model.prior, warm.q, warm.q.mean, warm.site_precisions)
    return Result(q=q, log_z=warm.log_z, converged=warm.converged, num_steps=warm.num_steps, history=warm.history,
                  method="gkl")
