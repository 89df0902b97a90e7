"""A second start for robust regression: the conjugate Gaussian posterior under inflated noise.

Student-t or Cauchy sites under a GP prior give a bound that is not concave in (m, C): with 20-30% outliers and a
small noise scale a fit from the prior can stop at a local optimum that treats a cluster of good points as
outliers (issue 63: up to 43 nats below the best). The Gaussian-likelihood posterior with the noise inflated well
above the site scale lies on the smooth side of the bound and often leads to the other optimum, and neither start
alone finds the best on every case (benchmarks/RESULTS_robust.md, section 5). `TwoStarts` runs a solver from both
and keeps the better.
"""

import equinox as eqx
import jax
import jax.numpy as jnp
from jax import lax
from jax.flatten_util import ravel_pytree

from .._gaussian import Gaussian
from ..factors import Full
from ..factors._full import upper_factor_of_inverse
from ..potentials import Cauchy, StudentT
from ..potentials import Gaussian as GaussianSites
from ..potentials._masked import unmasked
from ._base import AbstractSolver, Problem, Solution

INFLATION = 100.0
"""The inflated noise variance of a Student-t or Cauchy site group: max(var(y) / 4, INFLATION scale^2)."""

ROBUST_SITES = (StudentT, Cauchy)
"""The non-log-concave potentials with a location y and a scale that the inflated-noise start replaces."""


def two_starts_apply(model) -> bool:
    """Whether `inflated_noise_start` is defined for `model`: a prior, every site group Gaussian, Student-t or
    Cauchy (also restricted to some sites by a mask: the estimators' padded rows), and at least one group Student-t
    or Cauchy.

    Args:
        model: a `Model`.

    Returns:
        bool.
    """
    kinds = [type(unmasked(s.potential)[0]) for s in model.sites]
    return (model.prior is not None and all(k in ROBUST_SITES + (GaussianSites,) for k in kinds)
            and any(k in ROBUST_SITES for k in kinds))


def inflated_noise_start(model) -> Gaussian:
    """The exact posterior N(m, C^T C) of `model` with every Student-t or Cauchy site replaced by a Gaussian site
    N(y_n | h_n^T w + offset_n, v) of inflated variance v = max(var(y - offset) / 4, `INFLATION` scale_n^2)
    (Gaussian sites kept; the sites a mask leaves out, none): precision A = Sigma^{-1} + sum_n h_n h_n^T / v_n,
    mean A^{-1} (Sigma^{-1} mu + sum_n h_n (y_n - offset_n) / v_n) (Rasmussen & Williams 2006, eq. 2.23-2.24 in
    weight space), C the upper-triangular factor of A^{-1}. One O(D^3) factorisation.

    Args:
        model: a `Model` for which `two_starts_apply` holds.

    Returns:
        A `Gaussian` with a Full factor.
    """
    prior = model.prior
    lam = prior.precision_dense()
    rhs = prior.precision_mv(prior.mean)
    for sites in model.sites:
        op = sites.operator(model.dim)
        pot, mask = unmasked(sites.potential)
        n = op.shape[0]
        real = jnp.ones((n,), bool) if mask is None else jnp.broadcast_to(mask, (n,))
        target = jnp.where(real, jnp.broadcast_to(pot.y, (n,)) - sites.offset, 0.0)
        if isinstance(pot, GaussianSites):
            variance = jnp.broadcast_to(pot.variance, (n,))
        else:
            count = jnp.maximum(jnp.sum(real), 1)
            centred = jnp.where(real, target - jnp.sum(target) / count, 0.0)
            spread = 0.25 * jnp.sum(centred ** 2) / count
            variance = jnp.maximum(spread, INFLATION * jnp.broadcast_to(jnp.square(pot.scale), (n,)))
        precision = jnp.where(real, 1.0 / variance, 0.0)     # a masked site: no likelihood
        lam = lam + op.weighted_gram(precision)
        rhs = rhs + op.rmv(precision * target)
    C = upper_factor_of_inverse(lam)
    mean = C.T @ (C @ rhs)
    return Gaussian(mean.astype(rhs.dtype), Full(C))


class TwoStarts(AbstractSolver):
    """Run `solver` from the fit's start and from `inflated_noise_start` (the Gaussian-likelihood posterior with
    inflated noise, in closed form), one after the other in one compiled loop (`lax.scan` over the two starts),
    and return the solution with the larger bound. The first stage of the default for Student-t or Cauchy sites
    under a GP or dense prior with the Full factor: `Chain((TwoStarts(LBFGS(tol=1e-2)), Newton()))`, whitened.

    `num_steps` and `history` are those of the run kept.

    Attributes:
        solver: the solver run from both starts.
        tol: the tolerance (None: `solver.tol`, else the dtype's default).
        max_steps: the step limit of each run (None: `solver`'s).

    Raises:
        ValueError: `solver` not a solver; (`check`) a factor other than Full, or a model without a prior or with
            sites other than Gaussian, Student-t and Cauchy.
    """

    solver: AbstractSolver = None

    def __init__(self, solver, *, tol=None, max_steps=None):
        if not isinstance(solver, AbstractSolver):
            raise ValueError(f"TwoStarts: solver must be a gkl_jax.solvers solver, got {solver!r}")
        self.solver = solver
        self.tol = solver.tol if tol is None else tol
        self.max_steps = (solver.max_steps or type(solver).default_max_steps) if max_steps is None else max_steps

    def check(self, model, factor) -> None:
        self.solver.check(model, factor)
        if not isinstance(factor, Full):
            raise ValueError(f"TwoStarts needs the Full factor, got {type(factor).__name__}")
        if not two_starts_apply(model):
            raise ValueError("TwoStarts needs a prior and Gaussian, StudentT or Cauchy sites (at least one "
                             "StudentT or Cauchy group)")

    def solve(self, problem: Problem, tol, max_steps: int) -> Solution:
        x0 = problem.x0
        second = inflated_noise_start(problem.model)
        x1 = ravel_pytree(eqx.filter(second, problem.mask))[0].astype(x0.dtype)

        def run(carry, x):
            start = eqx.tree_at(lambda p: p.q0, problem, problem.to_q(x))
            return carry, self.solver.solve(start, tol, max_steps)

        _, both = lax.scan(run, None, jnp.stack([x0, x1]))
        value = jax.vmap(problem.objective)(both.x) if both.value is None else both.value
        # the second start where its bound is finite and larger (also where the first is NaN)
        take = jnp.isfinite(value[1]) & ~(value[0] >= value[1])
        return jax.tree.map(lambda a: jnp.where(take, a[1], a[0]), both)
