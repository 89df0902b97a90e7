"""Exact inference for a Gaussian prior with Gaussian sites (GP regression, Nickisch 2010, Ch. 2):

    p(w) = N(w | mu, Sigma) prod_n N(y_n | h_n^T w + o_n, v_n) / Z,
    log Z = log N(r | 0, H Sigma H^T + V),   r = y - o - H mu,   V = diag(v),
    q(w) = N(m, S),  S^{-1} = Sigma^{-1} + H^T V^{-1} H,   m = mu + S H^T V^{-1} r.

The G-KL bound is tight here (q is the posterior), so `exact` is the oracle every method must match with a
Gaussian likelihood. When the sites carry a `variance_offset` e_n (the sparse GP's k_nn - q_nn), the optimum of
the G-KL bound is this value minus sum_n e_n / (2 v_n): Titsias' collapsed bound, which `exact` then returns.

log Z is computed in the smaller of the two spaces: with the N x N matrix H Sigma H^T + V when N <= D (GP
regression, H = I) and through the D x D posterior precision (Woodbury, the matrix determinant lemma) when N > D
(sparse GPs, linear models). The posterior factor is the upper-triangular C with C^T C = S^{-1}^{-1}, as the
G-KL fixed point produces it.
"""

import jax.numpy as jnp
import jax.scipy.linalg as jsl

from .._gaussian import Gaussian
from .._linalg import diagonal, full_precision, tdot
from .._model import Model
from .._program import program
from .._result import Result
from ..factors import Full
from ..factors._full import upper_factor_of_inverse
from ..potentials import Gaussian as GaussianLik


def _stacked(model):
    rows, ys, offsets, noise, extra = [], [], [], [], []
    for i, s in enumerate(model.sites):
        if not isinstance(s.potential, GaussianLik):
            raise ValueError(f"exact inference needs Gaussian potentials; sites[{i}] has "
                             f"{type(s.potential).__name__}")
        op = s.operator(model.dim)
        n = op.shape[0]
        rows.append(op.as_matrix())
        ys.append(jnp.broadcast_to(s.potential.y, (n,)))
        offsets.append(jnp.broadcast_to(s.offset, (n,)))
        noise.append(jnp.broadcast_to(s.potential.variance, (n,)))
        extra.append(jnp.broadcast_to(s.variance_offset, (n,)))
    cat = lambda xs: jnp.concatenate(xs, axis=0)
    return cat(rows), cat(ys), cat(offsets), cat(noise), cat(extra)


@full_precision
def exact(model: Model) -> Result:
    """Exact posterior and log evidence of a model with a prior and Gaussian sites (Rasmussen & Williams 2006,
    Ch. 2; Nickisch 2010, Ch. 2; module doc).

    Args:
        model: a `gkl_jax.Model` with a prior and only `gkl_jax.potentials.Gaussian` sites.

    Returns:
        `gkl_jax.Result` with `method="exact"`, q the posterior (a Full factor) and `log_z` the log evidence
        (Titsias' collapsed bound where the sites carry a variance_offset); differentiable in every leaf of the
        model (hyperparameters, noise variances, targets).

    Raises:
        ValueError: model not a Model, without a prior or sites, or with a non-Gaussian potential.
    """
    if not isinstance(model, Model):
        raise ValueError(f"model must be a gkl_jax.Model, got {type(model).__name__}")
    if model.prior is None:
        raise ValueError("exact inference needs a Gaussian prior (model.prior is None)")
    if not model.sites:
        raise ValueError("exact inference needs at least one Sites group")
    for i, s in enumerate(model.sites):
        if not isinstance(s.potential, GaussianLik):
            raise ValueError(f"exact inference needs Gaussian potentials; sites[{i}] has "
                             f"{type(s.potential).__name__}")
    return _exact_jit(model)


@program
def _exact_jit(model):
    prior = model.prior
    H, y, offset, v, extra = _stacked(model)
    N, D = H.shape
    r = y - offset - H @ prior.mean
    precision = prior.precision_dense() + tdot(H, H / v[:, None])
    if N <= D:
        L = prior.cholesky()
        HL = H @ L
        Ky = HL @ HL.T + jnp.diag(v)
        Ly = jnp.linalg.cholesky(Ky)
        alpha = jsl.cho_solve((Ly, True), r)
        log_z = -0.5 * (r @ alpha + 2 * jnp.sum(jnp.log(diagonal(Ly))) + N * jnp.log(2 * jnp.pi))
        mean = prior.mean + L @ tdot(HL, alpha)
    else:
        Lp = jnp.linalg.cholesky(precision)
        b = tdot(H, r / v)
        post = jsl.cho_solve((Lp, True), b)
        logdet = jnp.sum(jnp.log(v)) + prior.logdet() + 2 * jnp.sum(jnp.log(diagonal(Lp)))
        quad = jnp.sum(jnp.square(r) / v) - b @ post
        log_z = -0.5 * (quad + logdet + N * jnp.log(2 * jnp.pi))
        mean = prior.mean + post
    log_z = log_z - 0.5 * jnp.sum(extra / v)
    q = Gaussian(mean, Full(upper_factor_of_inverse(precision)))
    # exact, unless a factorisation failed (a singular covariance under jit, where the prior's checks are skipped)
    return Result(q=q, log_z=log_z, converged=jnp.isfinite(log_z), num_steps=jnp.array(0),
                  history=jnp.reshape(log_z, (1,)), method="exact", is_bound=True)
