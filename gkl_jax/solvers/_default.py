"""The one place where the default solver is chosen, from what the model and the factor declare."""

import jax.numpy as jnp

from .._optim import default_tol
from .._start import model_dtype
from ..factors import Full
from ._base import AbstractSolver
from ._chain import Chain
from ._fixed_point import FixedPoint
from ._newton import Newton
from ._quasi_newton import LBFGS
from ._site_precision import SitePrecision
from ._site_precision_parts import applies as site_precision_applies
from ._site_precision_parts import has_dense_prior
from ._two_starts import TwoStarts, two_starts_apply

ROBUST_HANDOFF = 1e-2
"""Where the robust default hands over from L-BFGS to Newton-CG (the L-BFGS stage's tolerance; `Chain`'s own rule
would be sqrt(tol), 1e-3 in float64). With the Full factor's preconditioned Newton the earlier hand-over kept 27 of
27 cases of the robust grid within 1e-3 nat of the best, converged, at a median 0.08 s against 0.10 s (1e-1: also
27 of 27, 0.06 s; design-decisions page)."""


def default_solver(model, factor) -> AbstractSolver:
    """The solver `fit(model, factor)` runs when none is given.

    - Non-log-concave sites (Student-t, Cauchy, a non-concave `Custom`) under a GP or dense prior with the Full
      factor (robust GP regression): `Chain((LBFGS(tol=ROBUST_HANDOFF), Newton()))`, which `fit` runs in the
      whitened basis (`default_whiten`): L-BFGS to the scale-aware gradient 1e-2 crosses the non-concave region,
      preconditioned Newton-CG (stopped at negative curvature) finishes. Where every site group is Gaussian,
      Student-t or Cauchy, the L-BFGS stage is `TwoStarts(LBFGS(tol=ROBUST_HANDOFF))`: also from the
      Gaussian-likelihood posterior with inflated noise (closed form), keeping the better (the bound has local
      optima there: on the hard robust-GP tier, Student-t sites with 20-30% outliers, one start alone stopped
      0.6-43 nats short on 7 of 40 cases, the pair on none; `benchmarks/robust_defaults.py --hard`).
      Otherwise (another factor under such a prior, or no GP or dense prior) `Newton()` for a concave factor: on a
      regression with Gaussian sites, one Student-t site on the intercept and no prior (26 coefficients,
      cond(X^T X) = 4e5), L-BFGS spent its 2000 steps unconverged on 11 of 11 cases (even to tol 1e-2), Newton-CG
      converged in 12-18 (`benchmarks/robust_defaults.py --linear`); `LBFGS()` for non-concave factors (FactorAnalysis).
    - Log-concave sites: `SitePrecision()` for the Full factor under a GP or dense prior with identity sites;
      `FixedPoint()` for the Full factor otherwise (its closed-form stationary factor replaces the O(D^2)
      parameters' Newton solve); in float32 `Chain((FixedPoint(tol=1e-3), LBFGS()))`, where L-BFGS takes over if
      the fixed point stalls at float32's resolution (separable logistic sets, prior variance 1e8: the fixed
      point alone converged on 8 of 16, the chain on 16 of 16, with the fixed point's steps where it converged);
      `Newton()` for the other concave factors (Diagonal, Chevron, Banded, Sparse, Subspace; Diagonal's fixed
      point is available as `FixedPoint()` but Newton is faster there); `LBFGS()` for non-concave ones
      (FactorAnalysis).

    Args:
        model: the `Model` to fit.
        factor: the factor template or initialised factor of q.

    Returns:
        An `AbstractSolver` with default settings.
    """
    if not model.log_concave:
        if robust_default_applies(model, factor):
            explore = LBFGS(tol=ROBUST_HANDOFF)
            return Chain((TwoStarts(explore) if two_starts_apply(model) else explore, Newton()))
        return Newton() if factor.concave else LBFGS()
    if isinstance(factor, Full) and site_precision_applies(model):
        return SitePrecision()
    if isinstance(factor, Full):
        dtype = model_dtype(model)
        if jnp.finfo(dtype).bits >= 64:
            return FixedPoint()
        return Chain((FixedPoint(tol=default_tol(dtype)), LBFGS()))
    return Newton() if factor.concave else LBFGS()


def robust_default_applies(model, factor) -> bool:
    """Non-log-concave sites under a GP or dense prior, with the Full factor: where the default runs
    `Chain((LBFGS(tol=ROBUST_HANDOFF), Newton()))` in the whitened basis."""
    return (not model.log_concave) and has_dense_prior(model) and isinstance(factor, Full)


def default_whiten(model, factor, solver) -> bool:
    """Whether `fit` whitens when its `whiten` is left at None: for the default solver where
    `robust_default_applies` (Newton-CG and L-BFGS in (m, C) stall on an ill-conditioned Sigma; in the whitened
    basis, with prior N(0, I), they converge), never otherwise.

    Args:
        model: the `Model`.
        factor: the factor template or initialised factor.
        solver: the solver the user passed, or None.

    Returns:
        bool.
    """
    return solver is None and robust_default_applies(model, factor)
