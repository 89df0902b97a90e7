"""Starting points from a Gaussian approximation's precision, for factor templates with `precision_start`
(FactorAnalysis's Heywood start): the Diagonal optimum's site curvatures Gamma give the dense precision
A = Sigma^{-1} + sum_groups H^T diag(Gamma) H (eq. 10 at the mean-field q), and the factor builds its start from A."""

import jax
import jax.numpy as jnp

from ._bound import bound
from ._gaussian import Gaussian
from .factors._full import _precision

MAX_DIM = 4096
"""The largest D for which `fit` starts from A: it is dense (128 MiB in float64 here) and inverted, O(D^3)."""


def applies(model, q_init, from_template: bool) -> bool:
    """A fit from a factor template that has a precision start, on a model of at most `MAX_DIM` dimensions."""
    return from_template and q_init.factor.precision_start and model.dim <= MAX_DIM and len(model.sites) > 0


def site_curvatures(model, q):
    """Gamma_n = -2 dE_q[log phi_n] / d s_n^2 per site group (>= 0 for log-concave potentials)."""
    out = []
    for sites in model.sites:
        op = sites.operator(model.dim)
        m_n = op.mv(q.mean) + sites.offset
        s2 = q.factor.project_variances(op) + sites.variance_offset
        out.append(-2 * jax.grad(lambda v: jnp.sum(sites.potential.expected_log_phi(m_n, v)))(s2))
    return out


def precision_start(model, q, mean_field):
    """q's factor replaced by `from_precision(A)` and its mean by the mean-field one, A from `mean_field` (a
    Gaussian with a Diagonal factor) with Gamma clipped at 0 (non-log-concave sites); q itself where the start or
    its bound is not finite (e.g. a prior-free model with a singular A)."""
    gammas = [jnp.maximum(g, 0.0) for g in site_curvatures(model, mean_field)]
    ops = [sites.operator(model.dim) for sites in model.sites]
    A = _precision(model.prior, ops, gammas, model.dim, q.mean.dtype)
    candidate = Gaussian(mean_field.mean, q.factor.from_precision(A))
    finite = [jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(candidate)]
    ok = jnp.all(jnp.stack(finite)) & jnp.isfinite(bound(model, candidate))
    return jax.tree.map(lambda a, b: jnp.where(ok, a, b), candidate, q)
