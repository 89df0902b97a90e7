"""Model = a Gaussian prior (or none) and groups of site-projection potentials (papers/000, eq. 2)."""

from typing import Optional, Sequence, Union

import equinox as eqx
import jax
import jax.numpy as jnp

from ._validate import is_concrete, site_vector
from .operators import AbstractOperator, Identity, as_operator
from .potentials import AbstractPotential
from .priors import AbstractPrior


class Sites(eqx.Module):
    """N sites phi_n(h_n^T w + offset_n) sharing one potential type; H is (N, D), None (h_n = e_n),
    a BCOO sparse matrix or a `gkl_jax.operators` operator.

    `offset` shifts the projections (whitening uses it for H mu); `variance_offset` adds a known per-site
    variance to s_n^2 (sparse GPs use it for k_nn - q_nn).
    """

    H: Optional[AbstractOperator]
    potential: AbstractPotential
    offset: jax.Array
    variance_offset: jax.Array

    def __init__(self, H, potential: AbstractPotential, *, offset=0.0, variance_offset=0.0):
        if not isinstance(potential, AbstractPotential):
            raise ValueError(f"potential must be a gkl_jax.potentials potential, got {type(potential).__name__}")
        self.H = None if H is None else as_operator(H, "H")
        self.potential = potential
        self.offset = site_vector(offset, "offset")
        self.variance_offset = site_vector(variance_offset, "variance_offset")
        if is_concrete(self.variance_offset) and not bool(jnp.all(self.variance_offset >= 0)):
            raise ValueError("variance_offset (a known variance added to s_n^2) must be >= 0")
        if self.H is not None and 0 in self.H.shape:
            raise ValueError(f"H must have at least one row and one column, got shape {self.H.shape}")
        n = potential.num_sites
        if self.H is not None and n is not None and n != self.H.shape[0]:
            raise ValueError(f"H has {self.H.shape[0]} rows but the potential's per-site data has length {n}")
        for name, arr in (("offset", self.offset), ("variance_offset", self.variance_offset)):
            if arr.ndim == 1 and self.H is not None and arr.shape[0] != self.H.shape[0]:
                raise ValueError(f"{name} has length {arr.shape[0]} but H has {self.H.shape[0]} rows")

    def operator(self, dim: int) -> AbstractOperator:
        """H as an operator for latent dimension `dim` (the identity when H is None)."""
        return Identity(dim) if self.H is None else self.H

    def project(self, q):
        """(m_n, s_n^2) of the site projections under q."""
        op = self.operator(q.dim)
        m, s2 = q.project(op)
        return m + self.offset, s2 + self.variance_offset

    def expected_log_phi(self, q):
        """sum_n E_q[log phi_n(h_n^T w)] (papers/000 eq. 7, third term)."""
        m, s2 = self.project(q)
        return jnp.sum(self.potential.expected_log_phi(m, s2))


class Model(eqx.Module):
    """p(w) = N(w | mu, Sigma) prod_groups prod_n phi_n(h_n^T w) / Z.

    Every floating array of the prior and the sites is cast to one dtype, the promotion of them all (Python
    floats take the data's dtype; float32 beside float64 data gives float64)."""

    prior: Optional[AbstractPrior]
    sites: tuple
    dim: int = eqx.field(static=True)

    def __init__(self, prior: Optional[AbstractPrior], sites: Union[Sites, Sequence[Sites]]):
        if isinstance(sites, Sites):
            sites = (sites,)
        if not isinstance(sites, (tuple, list)):
            raise ValueError(f"sites must be Sites or a list of Sites (possibly empty), got {type(sites).__name__}")
        sites = tuple(sites)
        if not sites and prior is None:
            raise ValueError("a Model needs a prior or at least one Sites group")
        for s in sites:
            if not isinstance(s, Sites):
                raise ValueError(f"sites must be Sites or a list of Sites, got {type(s).__name__}")
        if prior is not None and not isinstance(prior, AbstractPrior):
            raise ValueError(f"prior must be a gkl_jax.priors prior or None, got {type(prior).__name__}")
        dims = {s.H.shape[1] for s in sites if s.H is not None}
        if prior is not None:
            if dims and dims != {prior.dim}:
                raise ValueError(f"prior has dimension {prior.dim} but H has {sorted(dims)} columns")
            dim = prior.dim
        else:
            if len(dims) != 1:
                raise ValueError("without a prior, every Sites needs an H with the same number of columns")
            dim = dims.pop()
        for s in sites:
            n = s.potential.num_sites
            if s.H is None and n is not None and n != dim:
                raise ValueError(f"Sites(None, ...) needs per-site data of length dim={dim}, got {n}")
            for name, arr in (("offset", s.offset), ("variance_offset", s.variance_offset)):
                if s.H is None and arr.ndim == 1 and arr.shape[0] != dim:
                    raise ValueError(f"Sites(None, ...) needs {name} of length dim={dim} (one per latent), got "
                                     f"{arr.shape[0]}")
        prior, sites = _common_dtype((prior, sites))
        self.prior = prior
        self.sites = sites
        self.dim = int(dim)

    @property
    def log_concave(self) -> bool:
        """True when every potential is log-concave (the bound is then concave in (m, C); Section 3.2)."""
        return all(s.potential.log_concave for s in self.sites)


def _common_dtype(tree):
    """`tree` with every floating array cast to one dtype, the one JAX's promotion gives them all (Python scalars
    and other weakly typed values do not promote: a float32 H with a kernel's Python-float length scale stays
    float32; float32 with float64 data gives float64). The solvers carry q and the model's arrays through lax
    loops that need one dtype throughout."""
    floats = [x for x in jax.tree.leaves(tree) if eqx.is_inexact_array(x)]
    for x in floats:
        if not jnp.issubdtype(x.dtype, jnp.floating) or jnp.finfo(x.dtype).bits < 32:
            raise ValueError(f"gkl-jax computes in float32 or float64; the model holds {x.dtype} data")
    if not floats:
        return tree
    dtype = jnp.result_type(*floats)
    return jax.tree.map(lambda x: x.astype(dtype) if eqx.is_inexact_array(x) and x.dtype != dtype else x, tree)


def check_fittable(model, method: str) -> Model:
    """`model` after checking that it is a Model (ValueError naming `method`) whose target can be normalised.

    Without a prior, prod_n phi_n(h_n^T w) is constant along every w with H w = 0: fewer site rows in all than
    dim (a null space for certain) make log Z infinite, and a fit would only chase the bound upwards. Not
    detected: a rank-deficient H with enough rows, and potentials bounded above (Logistic, Probit) on separable
    labels, where prod_n phi_n tends to a positive constant along a cone; there the fits end at means of norm
    1e7 and more. A prior rules out both."""
    if not isinstance(model, Model):
        raise ValueError(f"{method}: model must be a gkl_jax.Model, got {type(model).__name__}")
    if model.prior is None:
        rows = sum(s.operator(model.dim).shape[0] for s in model.sites)
        if rows < model.dim:
            raise ValueError(f"{method}: without a prior the target is improper (log Z = inf): the sites have "
                             f"{rows} rows in all, fewer than dim = {model.dim}, so some direction of w is not "
                             "constrained; add a prior (e.g. gkl_jax.priors.Isotropic) or more sites")
    return model
