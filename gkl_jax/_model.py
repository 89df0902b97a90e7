"""Model = a Gaussian prior (or none) and groups of site-projection potentials (Challis & Barber 2013, eq. 2)."""

from typing import Optional, Sequence, TypeVar, Union

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jaxtyping import ArrayLike, Float

from ._processes import host_copy
from ._typing import Means
from ._validate import is_concrete, site_vector
from .operators import AbstractOperator, Identity, as_operator
from .potentials import AbstractPotential
from .priors import AbstractPrior


class Sites(eqx.Module):
    """N sites phi_n(h_n^T w + offset_n) sharing one potential type; H is (N, D), None (h_n = e_n),
    a BCOO sparse matrix or a `gkl_jax.operators` operator.

    `offset` shifts the projections (whitening uses it for H mu); `variance_offset` adds a known per-site
    variance to s_n^2 (sparse GPs use it for k_nn - q_nn). (Challis & Barber 2013, eq. 2.)

    Args:
        H: the (N, D) site projections: an array, a BCOO or scipy.sparse matrix, an operator, or None for
            h_n = e_n (one site per latent variable, N = D).
        potential: a `gkl_jax.potentials` potential holding the per-site data.
        offset: a scalar or (N,) float array added to each projection (default 0).
        variance_offset: a scalar or (N,) non-negative float array added to each s_n^2 (default 0).

    Raises:
        ValueError: potential not a gkl_jax potential, an empty H, offsets that are negative (variance_offset),
            not finite or of the wrong length, or per-site data whose length is not H's row count.
    """

    H: Optional[AbstractOperator]
    potential: AbstractPotential
    offset: jax.Array
    variance_offset: jax.Array

    def __init__(self, H: Float[ArrayLike, "n d"] | AbstractOperator | None, potential: AbstractPotential, *,
                 offset: Means = 0.0, variance_offset: Means = 0.0):
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
        """H as an operator for latent dimension `dim` (the identity when H is None).

        Args:
            dim: D, the model's dimension.

        Returns:
            `gkl_jax.operators.AbstractOperator` of shape (N, D).
        """
        return Identity(dim) if self.H is None else self.H

    def project(self, q):
        """The site projections' means and variances under q, offsets included.

        Args:
            q: a `gkl_jax.Gaussian` over D variables.

        Returns:
            (m, s2): two (N,) float arrays, m_n = h_n^T m + offset_n, s2_n = h_n^T S h_n + variance_offset_n.
        """
        op = self.operator(q.dim)
        m, s2 = q.project(op)
        return m + self.offset, s2 + self.variance_offset

    def expected_log_phi(self, q):
        """sum_n E_q[log phi_n(h_n^T w)] (Challis & Barber 2013, eq. 7, third term).

        Args:
            q: a `gkl_jax.Gaussian` over D variables.

        Returns:
            float scalar.
        """
        m, s2 = self.project(q)
        return jnp.sum(self.potential.expected_log_phi(m, s2))


class Model(eqx.Module):
    """p(w) = N(w | mu, Sigma) prod_groups prod_n phi_n(h_n^T w) / Z.

    Every floating array of the prior and the sites is cast to one dtype, the promotion of them all (Python
    floats take the data's dtype; float32 beside float64 data gives float64). (Challis & Barber 2013, eq. 1-2.)

    Args:
        prior: a `gkl_jax.priors` prior over D variables, or None (a prior-free model, e.g. a likelihood with
            enough sites to be proper).
        sites: one `Sites` group or a list of them (possibly empty when there is a prior).

    Raises:
        ValueError: neither a prior nor sites, a prior or sites of the wrong type, dimensions that disagree,
            or data in a dtype other than float32/float64.
    """

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


_Tree = TypeVar("_Tree")


def _common_dtype(tree: _Tree) -> _Tree:
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


_RANK_CHECK_MAX_FLOPS = 1e10
"""`check_fittable` computes the singular values of a prior-free model's stacked dense H (N, D) where
N D^2 <= 1e10 (about 0.1-0.5 s; D = 1000 with N = 10,000)."""


def check_fittable(model, method: str) -> Model:
    """`model` after checking that it is a Model (ValueError naming `method`) whose target can be normalised.

    Without a prior, prod_n phi_n(h_n^T w) is constant along every w with H w = 0, so a null space of the stacked
    site projections H makes log Z infinite, and a fit would only chase the bound upwards (a Full factor's
    variance along it grew to 7e13 while the fit reported convergence). Fewer site rows in all than dim is such a
    null space for certain; with enough rows, H's numerical rank (singular values above max(N, D) eps s_max) is
    checked where a site group has an identity operator (full rank) or every group a concrete dense one and
    N D^2 <= 1e10 (not for sparse or matrix-free operators, nor inside jit). Separable labels, the other
    prior-free improper case, are detected after the fit (`separated`). A prior rules out both."""
    if not isinstance(model, Model):
        raise ValueError(f"{method}: model must be a gkl_jax.Model, got {type(model).__name__}")
    if model.prior is None:
        ops = [s.operator(model.dim) for s in model.sites]
        rows = sum(op.shape[0] for op in ops)
        hint = "add a prior (e.g. gkl_jax.priors.Isotropic)"
        if rows < model.dim:
            raise ValueError(f"{method}: without a prior the target is improper (log Z = inf): the sites have "
                             f"{rows} rows in all, fewer than dim = {model.dim}, so some direction of w is not "
                             f"constrained; {hint} or more sites")
        if any(isinstance(op, Identity) for op in ops) or rows * model.dim**2 > _RANK_CHECK_MAX_FLOPS:
            return model
        matrices = [getattr(op, "matrix", None) for op in ops]
        if all(isinstance(H, (jax.Array, np.ndarray)) and is_concrete(H) for H in matrices):
            H = np.concatenate([host_copy(H).astype(np.float64) for H in matrices])  # gathers rows of other hosts
            sv = np.linalg.svd(H, compute_uv=False)
            rank = int(np.sum(sv > max(H.shape) * np.finfo(np.float64).eps * sv[0])) if sv[0] > 0 else 0
            if rank < model.dim:
                raise ValueError(f"{method}: without a prior the target is improper (log Z = inf): the site "
                                 f"projections H have rank {rank} < dim = {model.dim}, so w is not constrained "
                                 f"along H's null space; {hint} or drop the dependent columns")
    return model


SEPARATION_ROUNDS = 4
"""The most rounds of `separated`'s refinement of the direction (each adds the rows the direction does not yet
clear; a round runs only where the last one changed the rows)."""


def separated(model, mean):
    """Whether `mean` diverges along a direction in which a prior-free model's target does not decay, so that Z is
    infinite. The test: a direction d with y_n h_n^T d >= 0 for every binary-classification site (`margins` not
    None: Logistic, Probit), > 0 for at least one (complete or quasi-complete separation), and h_n^T d = 0 for the
    Gaussian sites, to a relative tolerance sqrt(eps) ||h_n|| ||m|| (offsets left out). Along w = t d + u (t -> inf,
    u bounded) the likelihood then stays bounded below, on a cylinder of infinite volume, and a fit's stationary
    point is an artefact of the tolerance (Full fits of such data ended at ||m|| = 1e7-4e7 with finite `log_z`).

    d is found from the mean, which a fit moves along the divergence: d = m minus its projection onto the row space
    of the Gaussian sites and of the binary rows that m does not clear (margin <= tolerance: the rows on the
    separating hyperplane, which pin the bounded part u; a Diagonal factor's fit stopped with ||m|| = 30-140 and
    those rows' margins of either sign), then, for `SEPARATION_ROUNDS` rounds, the rows d does not clear are added
    and d recomputed. A d that passes is a certificate of impropriety whatever the fit; one that fails after the
    rounds leaves the answer False. d must keep a fraction eps^(1/4) of ||m|| (not the projections' round-off).

    Args:
        model: the `Model`.
        mean: (D,) the fitted mean.

    Returns:
        A boolean scalar array, or None where the question does not arise (a prior, no binary-classification
        sites, or a site group of another potential).
    """
    if model.prior is not None or not model.sites:
        return None
    from .potentials import Gaussian

    kinds = [s.potential.margins(jnp.zeros(())) is not None or isinstance(s.potential, Gaussian)
             for s in model.sites]
    if not all(kinds) or all(isinstance(s.potential, Gaussian) for s in model.sites):
        return None
    gaussian = [s.operator(model.dim) for s in model.sites if isinstance(s.potential, Gaussian)]
    binary = [(s.operator(model.dim), s.potential) for s in model.sites if not isinstance(s.potential, Gaussian)]
    slack = jnp.sqrt(jnp.finfo(mean.dtype).eps) * jnp.linalg.norm(mean)
    ones = jnp.ones(model.dim, mean.dtype)
    tolerances = [slack * jnp.sqrt(op.sq_mv(ones)) for op, _ in binary]

    def uncleared(d):
        return tuple(pot.margins(op.mv(d)) <= tol for (op, pot), tol in zip(binary, tolerances))

    def direction(masks):
        def normal(v):
            out = sum((op.rmv(op.mv(v)) for op in gaussian), jnp.zeros_like(v))
            return out + sum(op.rmv(jnp.where(mask, op.mv(v), 0.0)) for (op, _), mask in zip(binary, masks))
        # CG converges within rank + 1 iterations: few where few rows are pinned (an improper target)
        rank = model.dim if gaussian else jnp.minimum(sum(jnp.sum(mask) for mask in masks), model.dim)
        return mean - _row_space_part(normal, mean, 2 * rank + 2)

    def collapsed(d):
        return jnp.linalg.norm(d) <= jnp.finfo(mean.dtype).eps ** 0.25 * jnp.linalg.norm(mean)

    def grown(masks, d):
        return tuple(a | b for a, b in zip(masks, uncleared(d)))

    def unsettled(state):
        i, masks, d, after = state
        changed = jnp.any(jnp.stack([jnp.any(a != b) for a, b in zip(masks, after)]))
        first = (i == 0) & bool(gaussian)     # d = m less its Gaussian row-space part, at least
        return first | ((i <= SEPARATION_ROUNDS) & changed & ~collapsed(d))

    def refine(state):
        i, _, _, masks = state
        d = direction(masks)
        return i + 1, masks, d, grown(masks, d)

    # from d = m and no rows pinned: a round wherever d leaves rows uncleared that are not yet pinned and has not
    # collapsed (a proper target: one round, a complete separation by m: none)
    nothing = tuple(jnp.zeros(op.shape[0], bool) for op, _ in binary)
    # separate loop: a bounded geometric refinement before the fit, not an iteration of a solver
    d = lax.while_loop(unsettled, refine, (0, nothing, mean, uncleared(mean)))[2]
    nonnegative = jnp.array(True)
    for op in gaussian:       # d is flat for the Gaussian sites (to the projection's accuracy)
        nonnegative = nonnegative & jnp.all(jnp.abs(op.mv(d)) <= slack * jnp.sqrt(op.sq_mv(ones)))
    positive = jnp.array(False)
    for (op, pot), tol in zip(binary, tolerances):
        margins = pot.margins(op.mv(d))
        nonnegative = nonnegative & jnp.all(margins >= -tol)
        positive = positive | jnp.any(margins > tol)
    positive = positive & ~collapsed(d)    # d must be the divergence, not the projection's round-off
    return nonnegative & positive


def _row_space_part(normal, m, max_iters):
    """The orthogonal projection of m onto the row space of a stacked operator A, given normal(v) = A^T A v: the
    minimum-norm solution of A^T A x = A^T A m by conjugate gradients from 0 (its Krylov space lies in the row
    space), in at most `max_iters` iterations."""
    from ._optim import conjugate_gradient

    return conjugate_gradient(normal, normal(m), max_iters=max_iters,
                              rtol=jnp.finfo(m.dtype).eps * m.shape[0])
