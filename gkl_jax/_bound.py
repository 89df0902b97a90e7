"""The G-KL lower bound (Challis & Barber 2013, eq. 7):

    B(m, C) = H[q] + E_q[log N(w | mu, Sigma)] + sum_n E_{z~N(0,1)}[log phi_n(m_n + z s_n)] <= log Z,

with m_n = h_n^T m and s_n^2 = ||C h_n||^2.

`bound` is public (`gkl_jax.bound`); `bound_value` is internal API for the library's own objectives.
"""

import jax.numpy as jnp

from ._gaussian import Gaussian
from ._linalg import full_precision
from ._model import Model
from ._program import program
from ._result import Result
from ._tracing import top_level
from ._typing import Scalar


def check_model_and_q(model, q) -> Gaussian:
    """The Gaussian of `q` (a Gaussian or a Result) after checking it and `model` (ValueError)."""
    if not isinstance(model, Model):
        raise ValueError(f"model must be a gkl_jax.Model, got {type(model).__name__}")
    q = q.q if isinstance(q, Result) else q
    if not isinstance(q, Gaussian):
        raise ValueError(f"q must be a gkl_jax.Gaussian or Result, got {type(q).__name__}")
    if q.dim != model.dim:
        raise ValueError(f"q has dimension {q.dim} but the model has {model.dim}")
    return q


@full_precision
def bound(model: Model, q: Gaussian | Result) -> Scalar:
    """The G-KL bound B(m, C) on log Z at q (Challis & Barber 2013, eq. 7). Jit-able and differentiable in
    both the model and q.

    Args:
        model: a `gkl_jax.Model` over D variables.
        q: a `gkl_jax.Gaussian` over D variables, or a `gkl_jax.Result` (its q).

    Returns:
        float scalar array, B(m, C) <= log Z (up to quadrature error for quadrature potentials).

    Raises:
        ValueError: model not a Model, q not a Gaussian or Result, or dimensions that differ.

    Example:
        >>> import numpy as np, gkl_jax as gk
        >>> H = np.array([[1.0, 0.5], [-0.3, 1.0], [0.2, -1.0]])
        >>> model = gk.Model(gk.priors.Isotropic(2, 1.0), gk.Sites(H, gk.potentials.Logistic([1, -1, 1])))
        >>> result = gk.fit(model)
        >>> bool(gk.bound(model, result.q) == result.log_z)
        True
        >>> prior_q = gk.Gaussian(np.zeros(2), gk.factors.Full(np.eye(2)))
        >>> bool(gk.bound(model, prior_q) < result.log_z)
        True
    """
    q = check_model_and_q(model, q)
    if top_level((model, q), {}):
        return _bound_program(model, q)
    return bound_value(model, q)


def bound_value(model: Model, q: Gaussian) -> Scalar:
    """B(m, C) without the input checks or a compiled program of its own (internal API, not part of the public
    interface: `bound` and the scikit-learn joint ML-II objective, `gkl_jax.sklearn._joint`, call it inside
    their traces).

    Args:
        model: a `gkl_jax.Model`.
        q: a `gkl_jax.Gaussian` of the model's dimension.

    Returns:
        float scalar array, the bound.
    """
    value = q.entropy()
    if model.prior is not None:
        value = value + model.prior.expected_log_density(q)
    for sites in model.sites:
        value = value + sites.expected_log_phi(q)
    return jnp.asarray(value)


_bound_program = program(bound_value)
"""`bound` called outside of every trace: one compiled program per model structure and shape (its ~50-150 array
operations one at a time would each compile a small program of their own on the first call with a new shape,
and dispatch one by one on every later call)."""
