"""The one place where the default solver is chosen, from what the model and the factor declare."""

from .._site_precision import applies as site_precision_applies, has_dense_prior
from ..factors import Full
from ._base import AbstractSolver
from ._fixed_point import FixedPoint
from ._newton import Newton
from ._quasi_newton import LBFGS
from ._site_precision import SitePrecision


def default_solver(model, factor) -> AbstractSolver:
    """The solver `fit(model, factor)` runs when none is given.

    - Non-log-concave sites (Student-t, Cauchy, a non-concave `Custom`): `Newton()` under a GP or dense prior with
      a concave factor (CG's negative-curvature stop keeps each step an ascent step, and Newton is unaffected by
      the conditioning of Sigma), else `LBFGS()`.
    - Log-concave sites: `SitePrecision()` for the Full factor under a GP or dense prior with identity sites;
      `FixedPoint()` for the Full factor otherwise (its closed-form stationary factor replaces the O(D^2)
      parameters' Newton solve); `Newton()` for the other concave factors (Diagonal, Chevron, Banded, Sparse,
      Subspace; Diagonal's fixed point is available as `FixedPoint()` but Newton is faster there); `LBFGS()` for
      non-concave ones (FactorAnalysis).

    Args:
        model: the `Model` to fit.
        factor: the factor template or initialised factor of q.

    Returns:
        An `AbstractSolver` with default settings.
    """
    if not model.log_concave:
        return Newton() if has_dense_prior(model) and factor.concave else LBFGS()
    if isinstance(factor, Full) and site_precision_applies(model):
        return SitePrecision()
    if isinstance(factor, Full):
        return FixedPoint()
    return Newton() if factor.concave else LBFGS()
