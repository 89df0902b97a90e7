"""A potential restricted to some of its sites (internal API): the scikit-learn estimators pad their training rows
to a bucket size with sites that must contribute exactly nothing (`gkl_jax.sklearn._gp_model`), and the default
robust solver's second start reads the real sites through the mask (`gkl_jax.solvers._two_starts`)."""

from typing import ClassVar

import jax
import jax.numpy as jnp

from ._base import AbstractPotential


class MaskedConcave(AbstractPotential):
    """phi_n = inner phi_n on the rows where `mask` is True, phi_n = 1 (log phi_n = 0) elsewhere."""

    inner: AbstractPotential
    mask: jax.Array
    log_concave: ClassVar[bool] = True

    def log_phi(self, x):
        return jnp.where(self.mask, self.inner.log_phi(x), 0.0)

    def expected_log_phi(self, m, s2):
        return jnp.where(self.mask, self.inner.expected_log_phi(m, s2), 0.0)

    def expected_log_phi_moments(self, m, s2):
        return jnp.where(self.mask[None], self.inner.expected_log_phi_moments(m, s2), 0.0)


class MaskedNonConcave(MaskedConcave):
    log_concave: ClassVar[bool] = False


def masked(potential: AbstractPotential, mask) -> AbstractPotential:
    """`potential` on the sites where `mask` is True and the constant phi_n = 1 on the others (exactly zero in the
    bound and its derivatives), log-concave when `potential` is.

    Args:
        potential: a `gkl_jax.potentials` potential with N sites; mask: (N,) bool array.

    Returns:
        An `AbstractPotential` with N sites.
    """
    return (MaskedConcave if potential.log_concave else MaskedNonConcave)(potential, jnp.asarray(mask))


def unmasked(potential: AbstractPotential):
    """The potential inside a `masked` one and its mask, or (potential, None) for any other potential.

    Args:
        potential: a `gkl_jax.potentials` potential.

    Returns:
        (potential, (N,) bool array or None).
    """
    if isinstance(potential, MaskedConcave):
        return potential.inner, potential.mask
    return potential, None
