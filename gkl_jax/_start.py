"""Starting points of a fit.

- `initial_q`: q0 as given (checked and cast to the model's dtype), or the prior mean with the factor template
  initialised to an isotropic variance (`initial_variance`); w = 0 instead where the prior mean's bound overflows
  (`safe_start`).
- The mean-field start, for factor templates whose `mean_field_start(model)` is true: `fit` solves the Diagonal
  factor first, and the template builds its start from that optimum (`from_mean_field`), where it needs one from
  the dense precision A = Sigma^{-1} + sum_groups H^T diag(Gamma) H at it (Challis & Barber 2013, eq. 10 at the
  mean-field q; FactorAnalysis's Heywood start). The mean is the mean-field one.
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from ._bound import bound
from ._gaussian import Gaussian
from ._validate import is_concrete
from .factors._full import dense_precision


def initial_q(model, factor, q0):
    """The start of a fit: `q0` (checked against the model and `factor`, cast to the model's dtype), else the
    prior mean (zeros without a prior) with `factor` initialised (templates) to `initial_variance`.

    Args:
        model: the `Model`.
        factor: a factor template or initialised factor.
        q0: a `Gaussian` or None.

    Returns:
        The starting `Gaussian`.
    """
    if q0 is not None:
        if not isinstance(q0, Gaussian):
            raise ValueError(f"q0 must be a gkl_jax.Gaussian, got {type(q0).__name__}")
        if q0.dim != model.dim:
            raise ValueError(f"q0 has dimension {q0.dim} but the model has {model.dim}")
        if type(q0.factor) is not type(factor):
            raise ValueError(f"q0 has a {type(q0.factor).__name__} factor but factor={type(factor).__name__}")
        dtype = model_dtype(model)    # a warm start in another precision is cast to the model's
        return check_start(jax.tree.map(lambda x: x.astype(dtype) if eqx.is_inexact_array(x) else x, q0), "q0")
    if factor.is_initialised:
        if factor.dim != model.dim:
            raise ValueError(f"factor has dimension {factor.dim} but the model has {model.dim}")
        start = factor
    else:
        start = factor.initialise(model.dim, initial_variance(model))
    mean = model.prior.mean if model.prior is not None else jnp.zeros(model.dim, model_dtype(model))
    return check_start(safe_start(model, Gaussian(mean, start)), "factor")


def safe_start(model, q):
    """q, or q with mean 0 where that start's bound is larger, for a model with a prior and sites whose
    expectations can overflow (`overflows`: Poisson). A prior mean that puts the projections at hundreds (inputs
    of order 400, prior mean 0.5-1.5) gives rates exp(h_n^T mu) past float64's range: a bound of -inf or -1e231
    at the start, where no solver moves; w = 0 gives rates of 1. Other models start at the prior mean unchanged
    (and compile no second bound)."""
    if model.prior is None or not any(s.potential.overflows for s in model.sites):
        return q
    zero = Gaussian(jnp.zeros_like(q.mean), q.factor)
    at_mean, at_zero = bound(model, q), bound(model, zero)
    better = jnp.isfinite(at_zero) & ~(at_mean >= at_zero)     # also where the bound at the prior mean is NaN
    return jax.tree.map(lambda a, b: jnp.where(better, a, b), zero, q)


def check_start(q, name):
    """q, refused (ValueError naming `name`) where its covariance is concretely singular or not finite: the bound
    there is -inf or NaN and no solver can move from it. Under tracing nothing is checked (`fit` checks the
    start's log det after its compiled call, `start_error`)."""
    logdet = q.factor.logdet()
    if is_concrete(logdet):
        start_error(logdet, name)
    return q


def start_error(logdet, name):
    """Raise the ValueError of `check_start` where the concrete log det S of a start is not finite."""
    if not np.isfinite(float(logdet)):
        raise ValueError(f"{name} gives a singular or non-finite starting covariance (log det S = {float(logdet)}); "
                         "every diagonal entry of its factor must be non-zero and finite")


def model_dtype(model):
    """The floating dtype of the model's data (the prior mean's, else the sites' arrays'), so that the starting
    q of a float32 model stays float32 when x64 is enabled."""
    if model.prior is not None:
        return model.prior.mean.dtype
    leaves = [x for x in jax.tree.leaves(model.sites) if eqx.is_inexact_array(x)]
    return jnp.result_type(*leaves) if leaves else jnp.result_type(float)


def initial_variance(model):
    """Isotropic starting variance v0 = min(prior variances, 1 / max_n ||h_n||^2), so that every starting s_n is
    at most ~1: the scale on which the quadrature is accurate, and roughly where the posterior shrinks to."""
    dtype = model_dtype(model)
    ones = jnp.ones(model.dim, dtype)
    variances = model.prior.marginal_variances() if model.prior is not None else ones
    row_norms = [jnp.max(s.operator(model.dim).sq_mv(ones)) for s in model.sites]
    v0 = jnp.min(variances)
    for r in row_norms:
        v0 = jnp.minimum(v0, 1.0 / jnp.maximum(r, jnp.finfo(r.dtype).tiny))
    return v0.astype(dtype)


def applies(model, q_init, from_template: bool) -> bool:
    """A fit from a factor template with a mean-field start, on a model with sites."""
    return from_template and len(model.sites) > 0 and q_init.factor.mean_field_start(model)


def site_curvatures(model, q):
    """Gamma_n = -2 dE_q[log phi_n] / d s_n^2 per site group (>= 0 for log-concave potentials)."""
    out = []
    for sites in model.sites:
        op = sites.operator(model.dim)
        m_n = op.mv(q.mean) + sites.offset
        s2 = q.factor.project_variances(op) + sites.variance_offset
        out.append(-2 * jax.grad(lambda v: jnp.sum(sites.potential.expected_log_phi(m_n, v)))(s2))
    return out


def precision(model, q):
    """A at q, with Gamma clipped at 0 (non-log-concave sites), as a dense (D, D) matrix."""
    gammas = [jnp.maximum(g, 0.0) for g in site_curvatures(model, q)]
    ops = [sites.operator(model.dim) for sites in model.sites]
    return dense_precision(model.prior, ops, gammas, model.dim, q.mean.dtype)


def mean_field_start(model, q, mean_field):
    """q with the mean-field mean and the factor `from_mean_field` builds; q itself where that start or its bound
    is not finite (e.g. a prior-free model with a singular A)."""
    factor = q.factor.from_mean_field(model.dim, mean_field, lambda: precision(model, mean_field))
    candidate = Gaussian(mean_field.mean, factor)
    finite = [jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(candidate)]
    ok = jnp.all(jnp.stack(finite)) & jnp.isfinite(bound(model, candidate))
    return jax.tree.map(lambda a, b: jnp.where(ok, a, b), candidate, q)
