"""Solvers of the G-KL bound: Equinox modules whose fields are their settings, one interface (`AbstractSolver`:
`check`, `solve` -> `Solution` with a `RESULTS` status), one loop (`AbstractIterativeSolver`'s `init`, `step`,
`terminate`, `postprocess`, run by `iterate`), and the default chosen in one function (`default_solver`).

    import gkl_jax as gk
    gk.fit(model, factor, solver=gk.solvers.LBFGS(memory=20, tol=1e-8))
    gk.fit(model, solver=gk.solvers.Optax(optax.adam(0.05), max_steps=10_000))
"""

from ._base import RESULTS as RESULTS
from ._base import AbstractIterativeSolver as AbstractIterativeSolver
from ._base import AbstractSolver as AbstractSolver
from ._base import Problem as Problem
from ._base import Solution as Solution
from ._chain import Chain as Chain
from ._default import default_solver as default_solver
from ._default import default_whiten as default_whiten
from ._fixed_point import FixedPoint as FixedPoint
from ._iterate import ProgressInfo as ProgressInfo
from ._iterate import Step as Step
from ._iterate import iterate as iterate
from ._newton import Newton as Newton
from ._quasi_newton import LBFGS as LBFGS
from ._quasi_newton import Optax as Optax
from ._site_precision import SitePrecision as SitePrecision
from ._two_starts import TwoStarts as TwoStarts
from ._two_starts import inflated_noise_start as inflated_noise_start
