"""Site potentials: closed forms = quadrature = Monte Carlo, normalisation, stable derivatives, extreme inputs,
input validation. (The quadrature potentials against scipy.integrate.quad: tests/test_quadrature.py.)"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import reference_expectation
from scipy import integrate, special

import gkl_jax as gk

M = jnp.array([-1.7, 0.0, 0.4, 2.5])
S2 = jnp.array([0.3, 1.0, 0.05, 2.0])


def _closed_forms():
    y = jnp.array([0.5, -1.0, 0.4, 3.0])
    return {
        "gaussian": gk.potentials.Gaussian(y, jnp.array([0.5, 1.0, 2.0, 0.7])),
        "laplace": gk.potentials.Laplace(y, jnp.array([0.3, 1.0, 0.5, 2.0])),
        "poisson": gk.potentials.Poisson(jnp.array([0.0, 1.0, 3.0, 7.0])),
    }


@jax.jit
def _values_and_grads(pot, m, s2):
    value = lambda m, s2: jnp.sum(pot.expected_log_phi(m, s2))
    return pot.expected_log_phi(m, s2), *jax.grad(value, argnums=(0, 1))(m, s2)


@pytest.mark.parametrize("name", ["gaussian", "poisson"])
def test_closed_form_equals_gauss_hermite(name):
    """Smooth closed forms against 64-node Gauss-Hermite of the same log phi (a Custom potential): values and the
    Stein-identity derivatives dI/dm = E[f'], dI/ds^2 = E[f'']/2."""
    pot = _closed_forms()[name]
    quad = gk.potentials.Custom(lambda x: pot.log_phi(x))
    closed = _values_and_grads(pot, M, S2)
    hermite = _values_and_grads(quad, M, S2)
    for a, b in zip(closed, hermite):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)


def test_laplace_closed_form_equals_quad_and_its_derivatives():
    """E|x - y| = 2 s N(r) + (m - y)(2 Phi(r) - 1) against scipy quad split at the kink; dI/dm = E[f'] =
    -(2 Phi(r) - 1)/scale and dI/ds^2 = N(r)/(s scale) (the kink's delta function in f'')."""
    pot = _closed_forms()["laplace"]
    value, dm, ds2 = _values_and_grads(pot, M, S2)
    for i in range(4):
        yi, bi, mi, si = float(pot.y[i]), float(pot.scale[i]), float(M[i]), float(np.sqrt(S2[i]))
        f = lambda x: -np.abs(yi - x) / bi - np.log(2 * bi)
        ref = reference_expectation(f, mi, si, yi, si)
        assert abs(float(value[i]) - ref) < 1e-12
        r = (mi - yi) / si
        np.testing.assert_allclose(dm[i], -(2 * special.ndtr(r) - 1) / bi, rtol=1e-12)
        np.testing.assert_allclose(ds2[i], -np.exp(-0.5 * r * r) / np.sqrt(2 * np.pi) / (si * bi), rtol=1e-12)


@pytest.mark.parametrize("name", ["gaussian", "laplace", "poisson"])
def test_closed_form_equals_monte_carlo(name):
    """Within 5 standard errors of a 200 000-sample Monte Carlo estimate (the standard error is computed from the
    samples: 3e-4 to 3e-3 of |I| here, so the check has teeth)."""
    pot = _closed_forms()[name]
    z = jax.random.normal(jax.random.PRNGKey(0), (200_000, 4), dtype=jnp.float64)
    samples = np.asarray(jax.jit(lambda z: pot.log_phi(M + jnp.sqrt(S2) * z))(z))
    mc = samples.mean(0)
    se = samples.std(0) / np.sqrt(samples.shape[0])
    closed = np.asarray(_values_and_grads(pot, M, S2)[0])
    assert np.all(np.abs(closed - mc) < 5 * se), (closed, mc, se)
    assert np.all(se < 1e-2 * np.maximum(1, np.abs(closed)))


def test_laplace_gauss_hermite_is_only_as_good_as_the_kink_allows():
    """Gauss-Hermite on the non-differentiable Laplace potential converges slowly (the reason for the closed
    form): 64 nodes are ~1e-3 off where the kink sits inside the Gaussian, yet within 1e-2."""
    pot = gk.potentials.Laplace(jnp.zeros(1), 1.0)
    quad = gk.potentials.Custom(lambda x: pot.log_phi(x))
    m, s2 = jnp.array([0.1]), jnp.array([1.0])
    err = abs(float(_values_and_grads(pot, m, s2)[0][0]) - float(_values_and_grads(quad, m, s2)[0][0]))
    assert 1e-6 < err < 1e-2


def test_laplace_bound_is_smooth_across_the_kink():
    """log phi = -|y - x|/b is not differentiable at x = y, but I(m, s^2) is smooth in m (papers/000 Sec. 3.1):
    the gradient is continuous through m = y, matches central differences there, and the Hessian is finite
    and negative (log-concave)."""
    pot = gk.potentials.Laplace(jnp.array([0.3]), 0.5)
    value = lambda m, s2: jnp.sum(pot.expected_log_phi(m, s2))
    run = jax.jit(lambda m, s2: (jax.grad(value, argnums=(0, 1))(m, s2), jax.hessian(value)(m, s2)))
    s2 = jnp.array([0.2])
    eps = 1e-6
    (g_lo, _), _ = run(jnp.array([0.3 - eps]), s2)
    (g_hi, _), _ = run(jnp.array([0.3 + eps]), s2)
    (g_at, _), hess = run(jnp.array([0.3]), s2)
    assert abs(float(g_hi[0] - g_lo[0])) < 1e-5          # continuous (no jump of 2/b = 4)
    vj = jax.jit(value)
    fd = (vj(jnp.array([0.3 + 1e-5]), s2) - vj(jnp.array([0.3 - 1e-5]), s2)) / 2e-5
    assert abs(float(fd - g_at[0])) < 1e-8
    assert np.isfinite(float(hess[0, 0])) and float(hess[0, 0]) < 0


def test_sites_with_zero_rows_fit_to_the_optimum():
    """A zero row h_n = 0 (s_n^2 = 0 exactly: the estimators' padded designs, sparse data) has the constant
    potential log phi_n(0). The Laplace expectation is not differentiable in s^2 there, and its floor at `tiny`
    once made Newton's Hessian-vector products 0 * inf = NaN, so CG fell back to gradient ascent (40 steps instead
    of 12, or 200 without converging). Oracle, for every potential at once (one site group each): the fit without
    the zero rows, with their constants added, in the same number of Newton steps."""
    rng = np.random.default_rng(0)
    H = rng.normal(size=(40, 4))
    f = H @ np.array([1.0, -0.5, 0.0, 2.0])
    P = gk.potentials
    groups = [  # (potential of targets y, targets, the zero rows' targets)
        (lambda y: P.Logistic(y), np.sign(f + rng.normal(size=40)), [1.0, -1.0]),
        (lambda y: P.Probit(y), np.sign(f + rng.normal(size=40)), [-1.0, 1.0]),
        (lambda y: P.StudentT(y, 4.0, 0.7), f + rng.laplace(size=40), [0.0, 1.0]),
        (lambda y: P.Cauchy(y, 0.7), f + rng.laplace(size=40), [0.5, -2.0]),
        (lambda y: P.Laplace(y, 0.7), f + rng.laplace(size=40), [0.0, 1.0]),
        (lambda y: P.Poisson(y), rng.poisson(np.exp(0.3 * f)).astype(float), [0.0, 2.0]),
        (lambda y: P.Gaussian(y, 0.5), f + rng.normal(size=40), [0.0, -1.0]),
    ]
    prior = gk.priors.Isotropic(4, 1.0)
    Hz = np.vstack([H, np.zeros((2, 4))])
    plain = gk.Model(prior, [gk.Sites(H, make(y)) for make, y, _ in groups])
    padded = gk.Model(prior, [gk.Sites(Hz, make(np.concatenate([y, fill]))) for make, y, fill in groups])
    constant = sum(float(jnp.sum(make(jnp.asarray(fill)).log_phi(jnp.zeros(2)))) for make, _, fill in groups)
    a = gk.fit(plain, solver=gk.solvers.Newton())
    b = gk.fit(padded, solver=gk.solvers.Newton())
    assert bool(a.converged) and bool(b.converged)
    assert int(b.num_steps) == int(a.num_steps)
    assert abs(float(b.log_z) - float(a.log_z) - constant) < 1e-9


@pytest.mark.parametrize("name", ["gaussian", "laplace", "student_t", "cauchy"])
def test_density_potentials_are_normalised_in_y(name):
    """exp(log phi(x; y)) integrates to one over y (the constants in the bound are right)."""
    make = {
        "gaussian": lambda y: gk.potentials.Gaussian(y, 0.7),
        "laplace": lambda y: gk.potentials.Laplace(y, 0.4),
        "student_t": lambda y: gk.potentials.StudentT(y, 3.5, 0.6),
        "cauchy": lambda y: gk.potentials.Cauchy(y, 0.8),
    }[name]
    x = 0.3
    density = lambda y: float(np.exp(make(jnp.array([y])).log_phi(jnp.array([x]))[0]))
    total = integrate.quad(density, -np.inf, x)[0] + integrate.quad(density, x, np.inf)[0]
    assert abs(total - 1) < 1e-8


def test_label_and_count_potentials_are_normalised():
    x = jnp.array([-2.0, 0.3, 4.0])
    for cls in (gk.potentials.Logistic, gk.potentials.Probit):
        p = jnp.exp(cls(jnp.ones(3)).log_phi(x)) + jnp.exp(cls(-jnp.ones(3)).log_phi(x))
        np.testing.assert_allclose(p, 1.0, rtol=1e-14)
    counts = gk.potentials.Poisson(jnp.arange(200.0))
    for xv in np.asarray(x):
        total = jnp.sum(jnp.exp(counts.log_phi(jnp.full(200, xv))))
        np.testing.assert_allclose(total, 1.0, rtol=1e-12)


def test_probit_derivatives_are_accurate_in_the_far_tail():
    """log Phi'(u) = lambda(u) = N(u)/Phi(u) and log Phi''(u) = -lambda (u + lambda), against scipy's erfcx and
    Laplace's continued fraction for u + lambda (200 terms), to 1e-13, out to u = -1e4 (where the autodiff of
    jax's log_ndtr errs by 13% in the second derivative)."""
    u = jnp.array([-1e4, -1e3, -50.0, -8.0, -6.0, -5.9, -2.0, 0.0, 3.0, 8.0])
    pot = gk.potentials.Probit(jnp.ones(10))
    d1 = jax.jit(jax.grad(lambda x: jnp.sum(pot.log_phi(x))))
    d2 = jax.jit(jax.grad(lambda x: jnp.sum(d1(x))))
    un = np.asarray(u)
    lam = np.sqrt(2 / np.pi) / special.erfcx(-un / np.sqrt(2))
    t = np.maximum(-un, 1.0)
    acc = np.zeros_like(t)
    for k in range(200, 1, -1):
        acc = k / (t + acc)
    gap = np.where(un < -3, 1 / (t + acc), un + lam)
    np.testing.assert_allclose(d1(u), lam, rtol=1e-13)
    np.testing.assert_allclose(d2(u), -lam * gap, rtol=2e-13)
    np.testing.assert_allclose(pot.log_phi(u), special.log_ndtr(un), rtol=1e-13, atol=1e-15)


def _all_potentials(n):
    y = jnp.linspace(-1.0, 1.0, n)
    labels = jnp.where(jnp.arange(n) % 2 == 0, 1.0, -1.0)
    return {
        "gaussian": gk.potentials.Gaussian(y, 0.5),
        "laplace": gk.potentials.Laplace(y, 0.5),
        "poisson": gk.potentials.Poisson(jnp.arange(n, dtype=jnp.float64) % 4),
        "logistic": gk.potentials.Logistic(labels),
        "probit": gk.potentials.Probit(labels),
        "student_t": gk.potentials.StudentT(y, 3.0, 0.5),
        "cauchy": gk.potentials.Cauchy(y, 0.5),
        "custom": gk.potentials.Custom(lambda x: -jnp.logaddexp(0.0, x) - 0.1 * x ** 2, log_concave=True),
    }


@pytest.mark.parametrize("name", list(_all_potentials(2)))
def test_no_nan_for_extreme_valid_inputs(name):
    """|m| up to 1e3 and s from 0 through 1e-8 to 1e2: values and gradients are never NaN (and finite, except
    Poisson's E[exp(x)] = exp(m + s^2/2), which overflows to -inf past m + s^2/2 ~ 709 in float64)."""
    ms = jnp.array([-1e3, -30.0, 0.0, 1e-3, 30.0, 1e3])
    ss = jnp.array([0.0, 1e-8, 1e-3, 1.0, 1e2])
    m = jnp.repeat(ms, ss.size)
    s2 = jnp.tile(ss, ms.size) ** 2
    pot = _all_potentials(m.size)[name]
    value, dm, ds2 = _values_and_grads(pot, m, s2)
    for arr in (value, dm, ds2):
        arr = np.asarray(arr)
        assert not np.any(np.isnan(arr))
        if name == "poisson":
            assert np.all(np.isfinite(arr[np.asarray(m + s2 / 2) < 700]))
        else:
            assert np.all(np.isfinite(arr))


def test_parameter_gradients_through_the_quadrature():
    """d I / d(scale) and d I / d y of Student-t (the parameter tangent of the custom JVP) match central
    differences of I."""

    def value(y, scale, dof):
        pot = gk.potentials.StudentT(y, dof, scale)
        return jnp.sum(pot.expected_log_phi(jnp.array([0.2, -1.0]), jnp.array([0.5, 4.0])))

    args = (jnp.array([0.4, 1.5]), jnp.array([0.7, 2.0]), jnp.array([3.0, 5.0]))
    grads = jax.jit(jax.grad(value, argnums=(0, 1, 2)))(*args)
    f = jax.jit(value)
    h = 1e-6
    for a in range(3):
        for i in range(2):
            up = list(args)
            dn = list(args)
            up[a] = up[a].at[i].add(h)
            dn[a] = dn[a].at[i].add(-h)
            fd = (f(*up) - f(*dn)) / (2 * h)
            assert abs(float(fd - grads[a][i])) < 1e-8


def test_log_concavity_flags():
    pots = _all_potentials(2)
    for name in ("gaussian", "laplace", "poisson", "logistic", "probit", "custom"):
        assert pots[name].log_concave
    for name in ("student_t", "cauchy"):
        assert not pots[name].log_concave
    assert not gk.potentials.Custom(lambda x: -x ** 2).log_concave


@pytest.mark.parametrize(
    "make, arg",
    [
        (lambda: gk.potentials.Logistic(jnp.array([1.0, 0.0])), "y"),
        (lambda: gk.potentials.Probit(jnp.array([1.0, 2.0])), "y"),
        (lambda: gk.potentials.Poisson(jnp.array([1.0, -1.0])), "y"),
        (lambda: gk.potentials.Poisson(jnp.array([1.0, 0.5])), "y"),
        (lambda: gk.potentials.Gaussian(jnp.zeros(2), 0.0), "variance"),
        (lambda: gk.potentials.Gaussian(jnp.zeros(2), jnp.array([1.0, -2.0])), "variance"),
        (lambda: gk.potentials.Laplace(jnp.zeros(2), -1.0), "scale"),
        (lambda: gk.potentials.StudentT(jnp.zeros(2), 0.0), "dof"),
        (lambda: gk.potentials.StudentT(jnp.zeros(2), 3.0, -0.5), "scale"),
        (lambda: gk.potentials.Cauchy(jnp.zeros(2), 0.0), "scale"),
        (lambda: gk.potentials.Gaussian(jnp.array([0.0, np.nan])), "y"),
        (lambda: gk.potentials.Logistic(jnp.array([1.0, np.inf])), "y"),
        (lambda: gk.potentials.StudentT(jnp.array([0.0, np.inf]), 3.0), "y"),
        (lambda: gk.potentials.Laplace(jnp.zeros((2, 2))), "y"),
        (lambda: gk.potentials.Gaussian(jnp.zeros(3), jnp.ones(2)), "variance has 2 entries but y has 3"),
        (lambda: gk.potentials.Custom("not callable"), "log_phi"),
    ],
)
def test_bad_inputs_raise_value_error_naming_the_argument(make, arg):
    with pytest.raises(ValueError, match=arg):
        make()


@pytest.mark.parametrize("name", ["gaussian", "laplace", "poisson", "logistic", "probit", "custom"])
def test_expected_log_phi_is_concave_in_m_and_s_for_log_concave_potentials(name):
    """I(m, s) = E[log phi(m + s z)] is an average of concave functions of the affine map (m, s) -> m + s z, so
    its Hessian in (m, s) (s, not s^2) is negative semi-definite: the one-site core of papers/000 Sec. 3.2."""
    pot = _all_potentials(1)[name]
    value = lambda th: jnp.sum(pot.expected_log_phi(th[:1], th[1:] ** 2))
    hessian = jax.jit(jax.hessian(value))
    rng = np.random.default_rng(7)
    for m, s in zip(rng.normal(scale=3, size=6), rng.uniform(0.05, 4, size=6)):
        eig = np.linalg.eigvalsh(np.asarray(hessian(jnp.array([m, s]))))
        assert eig.max() <= 1e-10 * max(1.0, np.abs(eig).max()), (name, m, s, eig)
