"""Whitening (Challis & Barber 2013, App. E): the fit in the basis w = mu + L v, L L^T = Sigma, where the prior
is N(0, I); what makes L-BFGS converge on ill-conditioned GP priors."""

import jax
import jax.numpy as jnp
import numpy as np

from ._gaussian import Gaussian
from ._model import Model, Sites
from .factors import Full
from .factors._full import upper_factor
from .operators import Dense as DenseOperator
from .priors import Isotropic


def check_whiten(whiten, model, method):
    """`whiten` checked as a bool that a prior allows (ValueError naming `method`).

    Args:
        whiten: the user's flag.
        model: the `Model`.
        method: the calling function's name, for the message.

    Returns:
        bool.
    """
    if not isinstance(whiten, (bool, np.bool_)):
        raise ValueError(f"{method}: whiten must be True or False, got {whiten!r}")
    if whiten and model.prior is None:
        raise ValueError(f"{method}: whiten=True needs a prior")
    return bool(whiten)


def whitening(model, q0, whiten, method):
    """(model, q0, back): with `whiten`, the model and the start q0 (or None) in the basis w = mu + L v and `back`,
    which takes a solution there back to w; otherwise all three unchanged (`back` the identity).

    Args:
        model: the `Model`.
        q0: a starting `Gaussian` or None.
        whiten: bool.
        method: the calling function's name, for messages.

    Returns:
        (model, q0, back).
    """
    if not check_whiten(whiten, model, method):
        return model, q0, lambda q: q
    work, L, mu = whitened(model)
    return work, (None if q0 is None else whitened_q(q0, L, mu)), lambda q: unwhitened_q(q, L, mu)


def whitened(model):
    """The model in the basis w = mu + L v with L L^T = Sigma: prior N(0, I), sites H L, offset H mu.

    Args:
        model: a `Model` with a prior.

    Returns:
        (whitened model, L (D, D), mu (D,)).
    """
    prior = model.prior
    L = prior.cholesky()
    mu = prior.mean
    sites = []
    for s in model.sites:
        op = s.operator(model.dim)
        sites.append(Sites(DenseOperator(op.mm(L)), s.potential, offset=s.offset + op.mv(mu),
                           variance_offset=s.variance_offset))
    return Model(Isotropic(model.dim, jnp.ones((), L.dtype)), sites), L, mu


def whitened_structure(model):
    """The whitened model as shapes only (`jax.eval_shape`): what the default solver is chosen from."""
    return jax.eval_shape(lambda m: whitened(m)[0], model)


def unwhitened_q(q, L, mu):
    """q_v in the basis w = mu + L v taken back to w: mean mu + L m_v, S = L S_v L^T = (C_v L^T)^T (C_v L^T) as a
    Full factor (C_v L^T is upper triangular unless C_v is not, and Full keeps only an upper triangle)."""
    return Gaussian(mu + L @ q.mean, Full(upper_factor(q.factor.dense() @ L.T)))


def whitened_q(q, L, mu):
    """q in the basis v = L^{-1} (w - mu): mean L^{-1} (m - mu), factor C L^{-T} (upper triangular, as C and
    L^{-T} are), so that S_v = L^{-1} S L^{-T}."""
    if not isinstance(q.factor, Full) or not q.factor.is_initialised:
        raise ValueError(f"q0 with whiten=True needs an initialised Full factor, got {q.factor!r}")
    if q.mean.shape != mu.shape:
        raise ValueError(f"q0.mean must have shape {mu.shape}, got {q.mean.shape}")
    mean = jax.scipy.linalg.solve_triangular(L, q.mean - mu, lower=True)
    C = jax.scipy.linalg.solve_triangular(L, q.factor.upper().T, lower=True).T
    return Gaussian(mean, Full(C))
