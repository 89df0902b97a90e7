"""Factors with parameters that the gradient solvers hold fixed and that a separate update refines.

The subspace factor (Challis & Barber 2013, §4.1.3 and App. B.4) optimises the bound over (m, C_1, c) for a fixed
orthonormal basis E_1 and updates E_1 in between ("we iterated between optimising the subspace parameters {m, C, c} and
updating the subspace basis vectors E each five times", §6.2.1). `gkl_jax.fit` implements that alternation for every
`AbstractRefinableFactor`, inside its jitted function:

    q <- q with factor.refine(model, q, B(q));  q <- argmax over the solver leaves (Newton-CG / L-BFGS / optax)

`num_refinements` times (a `lax.fori_loop`), keeping the q with the best bound, because the basis update is not
guaranteed to increase it (App. B.4.3). The leaves that `solver_mask` marks False (the basis) are not part of
the solvers' parameter vector, so the projections H E_1 are loop invariants of each solve (XLA hoists them out of
the solver loops: O(N K^2) per bound evaluation instead of O(N D K)).
"""

import abc

import equinox as eqx

from ._base import AbstractFactor


class AbstractRefinableFactor(AbstractFactor):
    """A factor whose `solver_mask()` False leaves are held fixed by the solvers and updated by `refine`
    (Challis & Barber 2013, App. B.4).

    Attributes:
        num_refinements: int, the refinements `gkl_jax.fit` runs (a static field of every subclass).
    """

    num_refinements: eqx.AbstractVar[int]

    @abc.abstractmethod
    def solver_mask(self):
        """Which leaves the solvers optimise.

        Returns:
            a pytree of bools with this factor's structure: True for the leaves the solvers optimise.
        """

    @abc.abstractmethod
    def refine(self, model, q, value=None):
        """An updated factor for the model and the current q.

        Args:
            model: the `gkl_jax.Model` being fitted.
            q: the current `gkl_jax.Gaussian`, whose factor is this one.
            value: the bound at q where the caller has it (a float scalar), else None (it is evaluated).

        Returns:
            a factor of the same structure and shapes (this one where the update does not raise the bound).
        """
