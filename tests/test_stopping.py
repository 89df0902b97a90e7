"""The scale-aware stopping test shared by the solvers (`gkl_jax._optim.stationary`): invariant to a change of
units of the inputs, reachable in float32 where a bare max|grad| <= tol is not."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import gkl_jax as gk
from gkl_jax._optim import scaled_gradient, stationary, stop_level


def test_stationary_scales_the_gradient_by_the_variables_and_floors_at_round_off():
    g = jnp.array([1e-3, -2e-7])
    x = jnp.array([1e-4, 50.0])
    # |g_0| max(|x_0|, 0.1) = 1e-4 and |g_1| * 50 = 1e-5
    assert float(scaled_gradient(g, x, 0.1)) == pytest.approx(1e-4)
    assert bool(stationary(g, x, jnp.asarray(-3.0), 2e-4, 0.1))
    assert not bool(stationary(g, x, jnp.asarray(-3.0), 5e-5, 0.1))
    # the floor: 8 eps |B| (float64: 1.8e-15 |B|), so |B| = 1e12 lets 1e-4 pass at tol 1e-9
    assert float(stop_level(jnp.asarray(1e12), 1e-9)) == pytest.approx(8 * np.finfo(np.float64).eps * 1e12)
    assert bool(stationary(g, x, jnp.asarray(1e12), 1e-9, 0.1))
    assert not bool(stationary(g, x, jnp.asarray(jnp.nan), 1.0, 0.1))


def _logistic_data(N, D, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((N, D))
    y = np.where(X @ rng.standard_normal(D) + rng.logistic(size=N) > 0, 1.0, -1.0)
    return X, y


@pytest.mark.parametrize("factor", [gk.factors.Full(), gk.factors.Diagonal()], ids=["full", "diagonal"])
def test_rescaled_inputs_give_the_same_optimum(factor):
    """Model(Isotropic(1.5 / a^2), Sites(a H, Logistic(y))) has the same log Z for every a. With a bare
    max|grad| <= 1e-6 the fits at a = 1e-7 stopped at the start (max|grad| = 43 a), converged=True, 6.58 nats
    short; the scale-aware test is the same number at every a."""
    X, y = _logistic_data(60, 4)
    fits = [gk.fit(gk.Model(gk.priors.Isotropic(4, 1.5 / a**2), gk.Sites(a * X, gk.potentials.Logistic(y))), factor)
            for a in (1.0, 1e-7)]
    assert all(bool(r.converged) for r in fits)
    assert int(fits[1].num_steps) > 0
    assert abs(float(fits[1].log_z) - float(fits[0].log_z)) < 1e-8
    np.testing.assert_allclose(1e-7 * np.asarray(fits[1].q.mean), np.asarray(fits[0].q.mean), rtol=1e-5, atol=1e-7)


def test_float32_fit_with_many_sites_meets_the_stopping_test_where_float64_does():
    """In float32 the gradient of a sum of N rounded site terms carries round-off growing with N (max|grad| is
    5.5e-4 at the float32 optimum here), so a bare max|grad| <= 1e-6 is out of reach; the test's floor 8 eps |B| is
    not, and the float32 optimum is then the float64 one to float32's resolution of B."""
    X, y = _logistic_data(2000, 10, seed=1)

    def model(dtype):
        return gk.Model(gk.priors.Isotropic(10, jnp.asarray(1.0, dtype)),
                        gk.Sites(jnp.asarray(X, dtype), gk.potentials.Logistic(jnp.asarray(y, dtype))))

    ref = gk.fit(model(jnp.float64), tol=1e-6)
    single = gk.fit(model(jnp.float32), tol=1e-6)
    assert bool(ref.converged) and bool(single.converged)
    resolution = 8 * np.finfo(np.float32).eps * abs(float(ref.log_z))
    assert abs(float(single.log_z) - float(ref.log_z)) < resolution
    # and in float64's terms the float32 optimum is as good as float32 can represent
    q64 = jax.tree.map(lambda a: a.astype(jnp.float64) if eqx.is_inexact_array(a) else a, single.q)
    as64 = float(gk.bound(model(jnp.float64), q64))
    assert float(ref.log_z) - as64 < resolution
