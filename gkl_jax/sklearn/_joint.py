"""ML-II of the linear estimators' G-KL models as one Newton-CG over (hyperparameters, m, C), compiled as one program.

For a location-scale likelihood phi(y | x) = f((y - x) / sigma) / sigma (Student-t), the sites are written as the
standardised potential f (scale 1) at the projections (h / sigma)^T w - y / sigma, minus n log sigma: the same
bound, in which the noise enters only through the sites' rows and offsets, which the site expectations
differentiate by Stein's lemma like the means (Challis & Barber 2013, App. B.2). No derivative goes through the
quadrature rule's node placement (as it would through the potential's own scale), and a Hessian-vector product
over (hyperparameters, m, C) costs what one over (m, C) does. The logistic model's only hyperparameter, the prior
variance, is outside the sites already.

Maximising the bound jointly over the log-hyperparameters (in the Fisher-scaled coordinates of `_ml2.scales`)
and q reaches the ML-II optimum max_theta max_q B (the same stationary point as the outer L-BFGS around inner
fits of `_ml2.run`) with one Newton-CG (`gkl_jax.solvers._newton.newton_cg`; CG stops at negative curvature, as
the joint objective is not concave). Its preconditioner is the identity on the scaled hyperparameters (unit
Fisher information) and the Full factor's inverse curvature (`Full.precondition_tangent`) on q. Diabetes with
outliers, Student-t: 3-7 Newton steps instead of 9-12 outer L-BFGS steps each around an inner fit, the same
learned hyperparameters (design-decisions page). Where it does not settle within `JOINT_MAX_STEPS` (tiny or
degenerate problems: n = 5, or p >= n where the Student-t noise runs to 0) the estimator runs the outer loop.

Rejected (design-decisions page): q over w / sigma (the prior variances / sigma^2, the design unchanged) was
faster on standardised inputs but crept along the valley m~ ~ 1 / sigma where the coefficients are large
against the noise (unscaled features); for the Laplace likelihood the joint Newton was slower than the outer
loop, which it keeps.
"""

import jax.numpy as jnp

from .._adjoint import solver_mask
from .._bound import bound_value
from .._linalg import full_precision
from .._model import Model, Sites
from .._program import program
from .._result import Result
from .._start import initial_variance
from ..solvers._base import Problem
from ..solvers._newton import newton_cg
from ._ml2 import laplace_start

JOINT = ("student-t", "logistic")
"""The likelihoods whose ML-II runs jointly with the fit (`joint_fit`)."""

JOINT_MAX_STEPS = 50
"""The joint Newton's step budget before the estimator falls back to the outer loop (diabetes: 3-7 steps)."""

KEYS = ("prior", "noise")


def scaled_model(build, u):
    """The estimator's model at the ML-II coordinates u = (prior, noise) of `_ml2.scales`, with the Student-t sites
    standardised (module doc).

    Args:
        build: the estimator's `_Build` (padded design, targets, row and column masks, scales, likelihood).
        u: (2,) float array.

    Returns:
        (Model, the constant subtracted from its bound: n log sigma over the real rows, 0 for the logistic model).
    """
    model = build(dict(zip(KEYS, u)))
    if build.likelihood == "logistic":
        return model, jnp.zeros((), build.H.dtype)
    sigma = jnp.exp(u[1] / build.scales[1])
    row_scale = jnp.where(build.rows, sigma, 1.0)        # padded rows: noise 1, as in the estimator's model
    potential = build.potential(jnp.zeros_like(build.y), 1.0)     # the estimator's Student-t, scale 1
    sites = Sites(build.H / row_scale[:, None], potential, offset=-build.y / row_scale)
    return Model(model.prior, sites), jnp.sum(build.rows) * jnp.log(sigma)


@full_precision
@program
def joint_fit(build, params, learn, forcing, tol, max_steps, finish, progress=None):
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
        progress: None, or a callable receiving each Newton step's `ProgressInfo` (static).

    Returns:
        (finish's outputs, converged: bool array, Newton steps: int array).
    """
    u0 = jnp.stack([jnp.asarray(params[k], build.H.dtype) for k in KEYS])
    index = jnp.asarray([i for i, k in enumerate(learn) if k])
    model0, _ = scaled_model(build, u0)
    q0 = laplace_start(model0)
    scale = jnp.sqrt(initial_variance(model0))     # sigma0 of the stopping test, as in `gkl_jax.fit`
    problem = Problem(model0, q0, solver_mask(q0), scale)
    k = int(index.shape[0])

    def split(x):
        return u0.at[index].set(x[:k]), problem.to_q(x[k:])

    def objective(x):
        u, q = split(x)
        model, constant = scaled_model(build, u)
        return bound_value(model, q) - constant

    def preconditioner(x):
        on_q = problem.preconditioner(x[k:])
        return lambda v: jnp.concatenate([v[:k], on_q(v[k:])])

    x0 = jnp.concatenate([u0[index], problem.x0])
    x, steps, converged, history = newton_cg(objective, x0, tol=tol, max_steps=max_steps, forcing=forcing,
                                             scale=scale, preconditioner=preconditioner, progress=progress)
    u, q = split(x)
    result = Result(q=q, log_z=history[steps], converged=converged, num_steps=steps, history=history)
    return finish(dict(zip(KEYS, u)), result), converged, steps
