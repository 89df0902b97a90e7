"""The compiled pieces of the Bayesian linear estimators (`_linear`): the model on a padded design as a function of
the ML-II coordinates (`_Build`), the fit at fixed hyperparameters in one program (`_fit_fixed`), and the choice of
inference method and factor per likelihood (Challis & Barber 2013; exact inference for the Gaussian likelihood)."""

import equinox as eqx
import jax.numpy as jnp

from .. import factors as F
from .. import potentials as P
from .. import solvers
from .._fit import fit as gk_fit
from .._linalg import full_precision
from .._model import Model, Sites
from .._program import program
from ..gp import exact as gp_exact
from ..priors import Diagonal
from . import _ml2 as ml2
from ._common import check_choice

FULL_FORCING = {"logistic": 1e-2, "student-t": 1e-2}
"""CG's relative residual in the Full-factor fits' Newton steps, per likelihood (`gkl_jax.solvers.Newton(forcing=
...)`; absent: Newton's default). A Hessian-vector product costs a tenth of a gradient evaluation there and the
factor's preconditioner is close to the inverse Hessian, so near-exact steps are cheap (breast cancer: 7 -> 4
steps); the Laplace likelihood's kink makes them dearer, so it keeps the default (design-decisions page)."""


NUM_POINTS = {"logistic": 40, "student-t": 48}
"""Quadrature nodes per site of the linear estimators' likelihoods (the potentials' defaults are 48 and 64): against
scipy.integrate.quad over m - center up to 1e3 and s up to 100, E[f], E[f'] and E[f''] to 8.5e-9 (logistic) and
1.9e-10 (Student-t) relative to max(1, |E|) (tests/test_quadrature.py), far below the estimators' tolerance (1e-4
on the scaled gradient). The quadrature is most of a linear fit's arithmetic: warm fits about 10% faster, the
evidence unchanged to 1e-13 (design-decisions page). 32 logistic nodes were faster still but err by 2e-6 at
s = 100 (a separable set under a broad prior)."""


class _Build(eqx.Module):
    """params {"prior", "noise"} -> the `Model` on the padded design (a module, so that ML-II reuses its compiled
    loop across fits of one padded shape). The parameters are the ML-II coordinates u = c log(hyperparameter) of
    `_ml2.scales` (c the square root of the hyperparameter's Fisher information)."""

    H: jnp.ndarray
    y: jnp.ndarray
    rows: jnp.ndarray           # True on real rows
    cols: jnp.ndarray           # True on real columns
    intercept: jnp.ndarray      # True on the intercept column
    intercept_variance: jnp.ndarray
    dof: jnp.ndarray
    scales: jnp.ndarray         # (2,) c of the prior variance and the noise (`_ml2.scales`)
    likelihood: str = eqx.field(static=True)

    def __call__(self, params):
        """The model at `params` (ML-II coordinates, scalars): Diagonal prior, one site per (padded) row."""
        v = jnp.exp(params["prior"] / self.scales[0])
        variance = jnp.where(self.cols, jnp.where(self.intercept, self.intercept_variance, v), 1.0)
        noise = jnp.where(self.rows, jnp.exp(params["noise"] / self.scales[1]), 1.0)   # padded rows: constant
        return Model(Diagonal(variance), Sites(self.H, self.potential(self.y, noise)))

    def potential(self, y, noise):
        """The likelihood with targets y and variance/scale `noise` (ignored by the logistic one)."""
        if self.likelihood == "logistic":
            return P.Logistic(y, num_points=NUM_POINTS["logistic"])
        if self.likelihood == "gaussian":
            return P.Gaussian(y, noise)
        if self.likelihood == "laplace":
            return P.Laplace(y, noise)
        return P.StudentT(y, self.dof, noise, num_points=NUM_POINTS["student-t"])

    def padding_log_phi(self):
        """The constant log phi_n(0) that each padded row adds to log Z."""
        fill = 1.0 if self.likelihood == "logistic" else 0.0
        y = jnp.full(1, fill, self.H.dtype)
        return jnp.sum(~self.rows) * self.potential(y, jnp.ones(1, self.H.dtype)).log_phi(jnp.zeros(1, self.H.dtype))[0]


class _Finish(eqx.Module):
    """(learned leaves, inner Result) -> `_outputs`, inside the compiled fit."""

    build: _Build
    static: dict

    def __call__(self, dyn, result):
        return _outputs(self.build, result, eqx.combine(dyn, self.static))


def _outputs(build, result, params):
    """(Result, params, log Z of the unpadded problem, covariance of q), inside the compiled fit."""
    return result, params, result.log_z - build.padding_log_phi(), result.q.covariance()


@full_precision
@program
def _fit_fixed(build, params, method, kwargs, start_at_laplace=False):
    """The fit at fixed hyperparameters and its outputs, as `_ml2.run` gives them, in one compiled call; with
    `start_at_laplace` (G-KL with the Full factor) from the Laplace approximation (`_ml2.laplace_start`)."""
    model = build(params)
    result = method(model, q0=ml2.laplace_start(model), **kwargs) if start_at_laplace else method(model, **kwargs)
    return _outputs(build, result, params), result.converged, jnp.zeros((), int)


def _factor(factor):
    if isinstance(factor, str):
        return {"full": F.Full(), "diagonal": F.Diagonal()}[check_choice(factor, "factor", ("full", "diagonal"))]
    if isinstance(factor, F.AbstractFactor):
        return factor
    raise ValueError(f"factor must be 'full', 'diagonal' or a gkl_jax.factors factor, got {factor!r}")


def _method(likelihood, factor):
    """(inference function, its static options). The Gaussian likelihood has a Gaussian posterior: exact
    inference and the exact evidence. Otherwise G-KL with Newton-CG for concave factors: on the padded designs
    it was several times faster than the Full factor's default fixed point (design-decisions page); with the
    Full factor CG is solved to the likelihood's `FULL_FORCING`."""
    if likelihood == "gaussian":
        return gp_exact, {}
    forcing = FULL_FORCING.get(likelihood) if isinstance(factor, F.Full) else None
    kwargs = {"solver": solvers.Newton(forcing=forcing)} if factor.concave else {}
    if not isinstance(factor, F.Full):
        kwargs["factor"] = factor
    return gk_fit, kwargs
