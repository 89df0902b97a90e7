"""The site-precision solver as a `gkl_jax.solvers` module (the algorithm: `gkl_jax._site_precision`)."""

from .. import _site_precision as sp
from ..factors import Full
from ._base import AbstractSolver, Problem, Solution, status
from ._fixed_point import _to_flat


class SitePrecision(AbstractSolver):
    """Alternating ascent on the n site precisions W of S = (Sigma^{-1} + diag W)^{-1} and the mean, for a GP or
    dense prior with one site per latent variable (`Sites(None, ...)`, h_n = e_n; Opper & Archambeau 2009): one
    Cholesky factorisation of I + W^{1/2} Sigma W^{1/2} per step, the Full factor C formed once at the end. The
    default for the Full factor on such log-concave models.

    Non-log-concave sites (Student-t, Cauchy: robust GP regression) have signed W and one factorisation of
    I + L^T diag(W) L (Sigma = L L^T) per step. There it is 3-20x faster than the default whitened L-BFGS then
    Newton-CG and reaches the same optimum on 23 of the 25 GP cases of `benchmarks/robust_defaults.py`, but on two
    (N = 200, site scale 0.01, lengthscale 10, 20% outliers) it ends 3 and 31 nats lower, at another local
    optimum, so it is not `fit`'s default there; `gp.fit_hyperparameters` runs it by default in ML-II's inner fits
    on such models, each warm-started from the last optimum (`gkl_jax._warm.ml2_solver`).

    Attributes:
        tol: gradient tolerance (None: the dtype's default).
        max_steps: the most outer steps (None: 500).
    """

    default_max_steps = 500

    def check(self, model, factor) -> None:
        if not isinstance(factor, Full):
            raise ValueError(f"solver SitePrecision() needs a Full factor, got {type(factor).__name__}")
        if not sp.applies(model):
            raise ValueError("solver SitePrecision() needs a GP or Dense prior and sites with H = None (h_n = e_n)")

    def solve(self, problem: Problem, tol, max_steps: int) -> Solution:
        model, q0 = problem.model, problem.to_q(problem.x0)
        m, k, ok, hist, parts, _ = sp.site_precision(model, sp.initial_point(model, q0), tol, max_steps,
                                                      problem.scale)
        x = _to_flat(sp.posterior(model.prior, q0, m, parts[0]))
        return Solution(x, k, ok, hist, status(ok, hist[k], k, max_steps), extras=parts)


