"""Starting points from the mean-field fit, for factor templates whose `mean_field_start(model)` is true: `fit`
solves the Diagonal factor first, and the template builds its start from that optimum (`from_mean_field`), where
it needs one from the dense precision A = Sigma^{-1} + sum_groups H^T diag(Gamma) H at it (eq. 10 at the mean-field
q; FactorAnalysis's Heywood start). The mean is the mean-field one."""

import jax
import jax.numpy as jnp

from ._bound import bound
from ._gaussian import Gaussian
from .factors._full import _precision


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
    return _precision(model.prior, ops, gammas, model.dim, q.mean.dtype)


def mean_field_start(model, q, mean_field):
    """q with the mean-field mean and the factor `from_mean_field` builds; q itself where that start or its bound
    is not finite (e.g. a prior-free model with a singular A)."""
    factor = q.factor.from_mean_field(model.dim, mean_field, lambda: precision(model, mean_field))
    candidate = Gaussian(mean_field.mean, factor)
    finite = [jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(candidate)]
    ok = jnp.all(jnp.stack(finite)) & jnp.isfinite(bound(model, candidate))
    return jax.tree.map(lambda a, b: jnp.where(ok, a, b), candidate, q)
