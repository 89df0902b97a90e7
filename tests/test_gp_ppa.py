"""King & Lawrence's PPA and the KL-corrected bound: moments against quadrature, the bound sandwich and its
identities, convergence of the corrected iteration, and one compilation per step shape."""

import jax
import jax.numpy as jnp
import numpy as np
from _helpers_gp import eqx_set
from scipy import integrate, stats

import gkl_jax as gk
from gkl_jax import kernels as K

# ---------------------------------------------------------------------------------------------------------------
# King & Lawrence PPA and the KL-corrected bound (papers/004, notes Part B)

def _orthant_log_prob(cov, y):
    """log p(y | X) for the probit GP with augmentation: log P(D_y (fbar + eps) > 0), eps ~ N(0, (1 + v) I)."""
    D = np.diag(y)
    mvn = stats.multivariate_normal(np.zeros(len(y)), D @ cov @ D)
    return np.log(mvn.cdf(np.full(len(y), 60.0), lower_limit=np.zeros(len(y))))


def test_ppa_moments_match_quadrature():
    from gkl_jax.gp._ppa import q_f

    y = np.array([1.0, -1.0, 1.0])
    mut = np.array([0.4, 0.9, -2.0])
    v = 0.7
    f_mean, f_var, _ = q_f(gk.potentials.Probit(y), jnp.asarray(mut), v)
    for i in range(3):
        dens = lambda f: stats.norm.cdf(y[i] * f) * stats.norm(mut[i], np.sqrt(v)).pdf(f)
        z = integrate.quad(dens, -np.inf, np.inf)[0]
        m1 = integrate.quad(lambda f: f * dens(f), -np.inf, np.inf)[0] / z
        m2 = integrate.quad(lambda f: f * f * dens(f), -np.inf, np.inf)[0] / z
        np.testing.assert_allclose(f_mean[i], m1, rtol=1e-8)
        np.testing.assert_allclose(f_var[i], m2 - m1**2, rtol=1e-7)


def test_kl_corrected_bound_sandwich_and_identities():
    from gkl_jax.gp import _ppa as P

    rng = np.random.default_rng(1)
    X = jnp.asarray(rng.normal(size=(5, 1)))
    y = np.array([1.0, -1.0, 1.0, 1.0, -1.0])
    v = 0.25
    params = P.PPAParams(K.SquaredExponential(2.0, 1.0), jnp.log(v))
    lik = gk.potentials.Probit(y)
    stats_ = P.e_step(params, jnp.zeros(5), lik, X, 1e-6)
    stats_ = P.e_step(params, stats_.f_mean, lik, X, 1e-6)
    mu, C = P.q_fbar(params, stats_.f_mean, X, 1e-6)               # q(fbar) just updated: L = L'
    fresh = eqx_set(eqx_set(stats_, "mu", mu), "C", C)
    np.testing.assert_allclose(P.standard_bound(params, fresh, X, 1e-6), P.corrected_bound(params, fresh, X, 1e-6),
                               rtol=1e-10)
    g_std = jax.grad(P.standard_bound)(params, fresh, X, 1e-6)
    g_cor = jax.grad(P.corrected_bound)(params, fresh, X, 1e-6)
    for a, b in zip(jax.tree.leaves(g_std), jax.tree.leaves(g_cor)):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-9)
    for ell, amp in ((1.5, 3.0), (0.5, 1.0), (3.0, 0.5)):                 # theta moved with q fixed: L <= L' <= log Z
        moved = P.PPAParams(K.SquaredExponential(amp, ell), jnp.log(v))
        cov = np.asarray(moved.kernel.gram(X)) + (1 + v) * np.eye(5)
        std = float(P.standard_bound(moved, fresh, X, 1e-6))
        cor = float(P.corrected_bound(moved, fresh, X, 1e-6))
        assert std < cor < _orthant_log_prob(cov, y)


def test_ppa_corrected_converges_in_fewer_iterations_to_the_same_bound():
    from sklearn.datasets import make_moons

    X, y = make_moons(40, noise=0.2, random_state=0)
    y = 2.0 * y - 1
    kw = dict(noise=1.0, tol=1e-5, m_steps=5, learn_noise=False)
    cor = gk.gp.ppa(K.SquaredExponential(1.0, 1.0), X, y, corrected=True, max_iters=200, **kw)
    std = gk.gp.ppa(K.SquaredExponential(1.0, 1.0), X, y, corrected=False, max_iters=4 * cor.num_iters, **kw)
    assert cor.converged and cor.num_iters < std.num_iters
    assert np.all(np.diff(cor.history) >= -1e-8)                           # L' is non-decreasing (notes B4)
    assert np.all(np.diff(std.history) >= -1e-8)                           # so is L under the standard scheme
    assert np.all(cor.history_standard <= cor.history_corrected + 1e-10)  # L <= L' at every E-step
    assert cor.history[-1] >= std.history[-1] - 1e-6                       # standard still below after 4x the work
    mean, var, p = gk.gp.ppa_predict(cor, X)
    assert np.mean(np.sign(mean) == y) >= 0.75 and np.all((p > 0) & (p < 1))


def test_ppa_compiles_its_steps_once():
    """The kernel's Python-float hyperparameters are weakly typed and the M-step returns strongly typed ones:
    `ppa` casts them first, so the E- and M-steps compile once (they compiled twice)."""
    from gkl_jax.gp import _ppa as P

    rng = np.random.default_rng(4)
    X = rng.normal(size=(23, 2))
    y = np.where(X[:, 0] + 0.3 * rng.normal(size=23) > 0, 1.0, -1.0)
    before = P.TRACE_COUNT["ppa"]
    res = gk.gp.ppa(K.SquaredExponential(1.0, 1.0), X, y, max_iters=3, m_steps=2)
    assert res.num_iters >= 2
    assert P.TRACE_COUNT["ppa"] == before + 1
