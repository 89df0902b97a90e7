"""ML-II of the linear estimators' G-KL models as one Newton-CG over (hyperparameters, m, C), compiled as one program.

The bound is invariant under a change of variables w = a * w~ (a > 0 per column; q and the prior mapped
together), and for these models a choice of a makes the hyperparameters leave the quadrature:

- location-scale likelihoods phi(y | x) = f((y - x) / sigma) / sigma (Student-t, Laplace): a = sigma, so the
  model over w~ has prior variances v / sigma^2 and the standardised potential f (scale 1) at the shifted
  projections h^T w~ - y / sigma, and the bound is that model's minus n log sigma;
- the logistic likelihood: a = 1; its only hyperparameter, the prior variance, is already outside the sites.
  (With a = sqrt(v) on the coefficients the prior is fixed and v scales the design's columns: breast cancer's
  ML-II was slower, CG working harder on the stronger coupling of v and q; design-decisions page.)

The hyperparameters then enter only through the prior variances and the site offsets, which the site
expectations differentiate by Stein's lemma like the means (Challis & Barber 2013, App. B.2): no derivative
goes through the quadrature rule's node placement, and a Hessian-vector product over (hyperparameters, m, C)
costs what one over (m, C) does.

Maximising the bound jointly over the log-hyperparameters (in the Fisher-scaled coordinates of `_ml2.scales`)
and q reaches the ML-II optimum max_theta max_q B (the same stationary point as the outer L-BFGS around inner
fits of `_ml2.run`) with one Newton-CG (`gkl_jax.solvers._newton.newton_cg`; CG stops at negative curvature, as
the joint objective is not concave). Its preconditioner is the identity on the scaled hyperparameters (unit
Fisher information) and the Full factor's inverse curvature (`Full.precondition_tangent`) on q. Diabetes with
outliers, Student-t: 3-5 Newton steps instead of 9-12 outer L-BFGS steps each around an inner fit, the same
learned hyperparameters (design-decisions page).
"""

import equinox as eqx
import jax.numpy as jnp

from .. import potentials as P
from .._adjoint import solver_mask
from .._bound import _bound_value
from .._linalg import full_precision
from .._model import Model, Sites
from .._result import Result
from .._xla import program
from ..priors import Diagonal
from ..solvers._base import Problem
from ..solvers._newton import newton_cg
from ._ml2 import laplace_start

JOINT = ("student-t", "laplace", "logistic")
"""The likelihoods whose ML-II runs jointly with the fit (`joint_fit`)."""

KEYS = ("prior", "noise")


def scaled_model(build, u):
    """The model over w~ = w / a at the ML-II coordinates u = (prior, noise) of `_ml2.scales` (module doc).

    Args:
        build: the estimator's `_Build` (padded design, targets, row and column masks, scales, likelihood).
        u: (2,) float array.

    Returns:
        (Model over w~, the constant log-Jacobian term subtracted from its bound (n log sigma over the real rows;
        0 for the logistic model), a: (D,) the column scales).
    """
    v = jnp.exp(u[0] / build.scales[0])
    variance = jnp.where(build.cols, jnp.where(build.intercept, build.intercept_variance, v), 1.0)
    if build.likelihood == "logistic":
        model = Model(Diagonal(variance), Sites(build.H, P.Logistic(build.y)))
        return model, jnp.zeros((), build.H.dtype), jnp.ones(build.H.shape[1], build.H.dtype)
    sigma = jnp.exp(u[1] / build.scales[1])
    offset = -build.y / jnp.where(build.rows, sigma, 1.0)     # padded rows: y = 0, a zero shift
    zeros = jnp.zeros_like(build.y)
    potential = P.StudentT(zeros, build.dof, 1.0) if build.likelihood == "student-t" else P.Laplace(zeros, 1.0)
    model = Model(Diagonal(variance / sigma ** 2), Sites(build.H, potential, offset=offset))
    return model, jnp.sum(build.rows) * jnp.log(sigma), jnp.full(build.H.shape[1], sigma)


@full_precision
@program
def joint_fit(build, params, learn, forcing, tol, max_steps, finish):
    """ML-II over the learned hyperparameters jointly with the Full-factor G-KL posterior (see the module doc),
    from the Laplace approximation at the starting hyperparameters.

    Args:
        build: the estimator's `_Build` with a likelihood in `JOINT`.
        params: {"prior", "noise"}: the starting ML-II coordinates (float scalars).
        learn: (bool, bool), static: which of ("prior", "noise") are learned (at least one).
        forcing: Newton-CG's forcing (float or None), static.
        tol: the stopping tolerance of the joint scale-aware gradient test.
        max_steps: the most Newton steps, static.
        finish: (params at the optimum, Result over the original weights w) -> any pytree of outputs, as for
            `_ml2.run`.

    Returns:
        (finish's outputs, converged: bool array, Newton steps: int array).
    """
    u0 = jnp.stack([jnp.asarray(params[k], build.H.dtype) for k in KEYS])
    index = jnp.asarray([i for i, k in enumerate(learn) if k])
    model0, _, _ = scaled_model(build, u0)
    q0 = laplace_start(model0)
    problem = Problem(model0, q0, solver_mask(q0), 1.0)
    k = int(index.shape[0])

    def split(x):
        return u0.at[index].set(x[:k]), problem.to_q(x[k:])

    def objective(x):
        u, q = split(x)
        model, log_jacobian, _ = scaled_model(build, u)
        return _bound_value(model, q) - log_jacobian

    def preconditioner(x):
        on_q = problem.preconditioner(x[k:])
        return lambda v: jnp.concatenate([v[:k], on_q(v[k:])])

    x0 = jnp.concatenate([u0[index], problem.x0])
    x, steps, converged, history = newton_cg(objective, x0, tol=tol, max_steps=max_steps, forcing=forcing,
                                             preconditioner=preconditioner)
    u, q = split(x)
    a = scaled_model(build, u)[2]      # w = a * w~: C = C~ diag(a), still upper triangular
    q = eqx.tree_at(lambda g: (g.mean, g.factor.C), q, (a * q.mean, q.factor.C * a))
    result = Result(q=q, log_z=history[steps], converged=converged, num_steps=steps, history=history)
    return finish(dict(zip(KEYS, u)), result), converged, steps
