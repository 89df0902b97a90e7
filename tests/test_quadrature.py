"""The quadrature of the site expectations I = E[f(m + s z)] (gkl_jax._quadrature) against scipy.integrate.quad.

f = log phi and its first two derivatives (through the custom JVP: dI/dm = E[f'], dI/ds^2 = E[f'']/2) for the
four quadrature potentials, over m - center up to 1e3 and s from 0 to 100, to 1e-10 relative to max(1, |I|).
"""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import reference_expectation

import gkl_jax as gk
from gkl_jax import _quadrature

SCALES = [0.0, 1e-6, 0.3, 3.0, 30.0, 100.0]
OFFSETS = [0.0, 0.5, -2.0, 6.0, -25.0, 1e3]

# potential, feature center and width used to place the reference's breakpoints
POTENTIALS = {
    "logistic": (lambda: gk.potentials.Logistic(jnp.array([-1.0])), 0.0, 1.0),
    "probit": (lambda: gk.potentials.Probit(jnp.array([1.0])), 0.0, 1.0),
    "student_t": (lambda: gk.potentials.StudentT(jnp.array([0.7]), 4.0, 0.5), 0.7, 1.0),
    "cauchy": (lambda: gk.potentials.Cauchy(jnp.array([0.7]), 0.1), 0.7, 0.1),
}


def _log_phi_derivatives(pot):
    f = lambda x: pot.log_phi(x)
    d1 = jax.grad(lambda x: jnp.sum(f(x)))
    d2 = jax.grad(lambda x: jnp.sum(d1(x)))
    return [jax.jit(g) for g in (f, d1, d2)]


def _library(pot, m, s2):
    """(I, dI/dm, 2 dI/ds2) elementwise, through the custom JVP."""

    @jax.jit
    def run(m, s2):
        value = lambda m, s2: jnp.sum(pot.expected_log_phi(m, s2))
        return pot.expected_log_phi(m, s2), *jax.grad(value, argnums=(0, 1))(m, s2)

    I, dm, ds2 = run(m, s2)  # noqa: E741 (I: the Gaussian integral of the papers)
    return np.asarray(I), np.asarray(dm), 2 * np.asarray(ds2)


def _relative_errors(pot, center, width):
    """[(|library - quad| / max(1, |quad|), which, m, s)] for E[f], E[f'], E[f''] over the grid of SCALES x
    OFFSETS (m = center + offset * max(s, 0.05))."""
    cases = [(center + off * max(s, 0.05), s) for s in SCALES for off in OFFSETS]
    got = _library(pot, jnp.array([c[0] for c in cases]), jnp.array([c[1] ** 2 for c in cases]))
    errors = []
    for i, g in enumerate(_log_phi_derivatives(pot)):
        # the jitted function takes the float64 numpy point as it is (a jnp.asarray of each of the ~10^4 points
        # the reference integrates over was most of this test's time; the values are the same)
        f = lambda x, g=g: np.asarray(g(x))
        for j, (mj, sj) in enumerate(cases):
            ref = reference_expectation(f, mj, sj, center, width)
            errors.append((abs(got[i][j] - ref) / max(1.0, abs(ref)), ["E[f]", "E[f']", "E[f'']"][i], mj, sj))
    return errors


@pytest.mark.parametrize("name", list(POTENTIALS))
def test_expectation_and_derivatives_match_scipy_quad(name):
    make, center, width = POTENTIALS[name]
    errors = _relative_errors(make(), center, width)
    for err, *where in errors:
        assert err < 1e-10, (name, *where, err)
    assert max(e[0] for e in errors) > 0  # the comparison is not vacuous


def test_gauss_hermite_loses_accuracy_where_the_feature_rule_does_not():
    """The weakness the feature rule fixes: 64-node Gauss-Hermite on log sigmoid at s = 10 errs by ~1e-3."""
    y = jnp.array([1.0])
    f = lambda x, g=jax.jit(jax.nn.log_sigmoid): np.asarray(g(x))
    ref = reference_expectation(f, 0.0, 10.0)
    hermite = gk.potentials.Custom(lambda x: jax.nn.log_sigmoid(x))
    feature = gk.potentials.Custom(lambda x: jax.nn.log_sigmoid(x), center=0.0, width=0.75 * np.pi)
    logistic = gk.potentials.Logistic(y)
    m, s2 = jnp.zeros(1), jnp.full(1, 100.0)
    run = jax.jit(lambda p, m, s2: p.expected_log_phi(m, s2)[0])
    assert abs(float(run(hermite, m, s2)) - ref) > 1e-4
    assert abs(float(run(feature, m, s2)) - ref) < 1e-12
    assert abs(float(run(logistic, m, s2)) - ref) < 1e-12


def test_accuracy_improves_with_num_points():
    """num_points is honoured: the worst error over hard cases (large s, Cauchy) decreases with the node count."""
    m = jnp.array([0.7, 5.0, -30.0])
    s2 = jnp.array([100.0, 900.0, 1e4])
    f = lambda x: np.asarray(-np.log1p(((0.7 - x) / 0.1) ** 2) - np.log(np.pi * 0.1))
    ref = np.array([reference_expectation(f, float(a), float(np.sqrt(b)), 0.7, 0.1) for a, b in zip(m, s2)])
    errs = []
    for k in (24, 40, 64):
        pot = gk.potentials.Cauchy(jnp.full(3, 0.7), 0.1, num_points=k)
        got = np.asarray(jax.jit(lambda a, b: pot.expected_log_phi(a, b))(m, s2))
        errs.append(np.max(np.abs(got - ref) / np.maximum(1, np.abs(ref))))
    assert errs[0] > errs[1] > errs[2]
    assert errs[2] < 1e-10 and errs[0] > 1e-8


def test_gauss_hermite_is_exact_for_polynomials():
    """E[x^4] = m^4 + 6 m^2 s^2 + 3 s^4 and E[x^3] = m^3 + 3 m s^2, by the 8-node rule (degree < 16)."""
    pot = gk.potentials.Custom(lambda x: x ** 4 - 2 * x ** 3, num_points=8)
    m = jnp.array([-1.3, 0.0, 2.0])
    s2 = jnp.array([0.5, 2.0, 0.0])
    exact = (m ** 4 + 6 * m ** 2 * s2 + 3 * s2 ** 2) - 2 * (m ** 3 + 3 * m * s2)
    np.testing.assert_allclose(jax.jit(lambda m, s2: pot.expected_log_phi(m, s2))(m, s2), exact, rtol=1e-13, atol=1e-13)
    # Stein identities on the same rule: dI/dm = E[f'], dI/ds2 = E[f'']/2
    dm, ds2 = jax.jit(jax.grad(lambda a, b: jnp.sum(pot.expected_log_phi(a, b)), argnums=(0, 1)))(m, s2)
    np.testing.assert_allclose(dm, 4 * (m ** 3 + 3 * m * s2) - 6 * (m ** 2 + s2), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(ds2, 0.5 * (12 * (m ** 2 + s2) - 12 * m), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", ["logistic", "student_t"])
def test_smooth_down_to_zero_variance(name):
    """At s^2 = 0 the value is f(m), dI/dm = f'(m) and dI/ds^2 = f''(m)/2 (finite: no 1/s from the chain rule);
    second derivatives exist there too, and I is continuous as s^2 -> 0."""
    pot = POTENTIALS[name][0]()
    f, d1, d2 = _log_phi_derivatives(pot)
    value = lambda m, s2: jnp.sum(pot.expected_log_phi(m, s2))

    @jax.jit
    def everything(m, s2):
        return value(m, s2), jax.grad(value, argnums=(0, 1))(m, s2), jax.hessian(value, argnums=(0, 1))(m, s2)

    m = jnp.array([0.3])
    v0, (dm, ds2), hess = everything(m, jnp.zeros(1))
    np.testing.assert_allclose(v0, f(m)[0], rtol=1e-14)
    np.testing.assert_allclose(dm, d1(m), rtol=1e-12)
    np.testing.assert_allclose(ds2, 0.5 * d2(m), rtol=1e-12)
    assert all(np.all(np.isfinite(np.asarray(h))) for row in hess for h in row)
    for s2 in (1e-12, 1e-8, 1e-4):
        approx = float(f(m)[0]) + 0.5 * s2 * float(d2(m)[0])
        assert abs(float(everything(m, jnp.array([s2]))[0]) - approx) < 1e-14 + s2 ** 2


def test_feature_rule_derivatives_are_consistent_with_its_values():
    """The rule is smooth in (m, s^2): central differences of I agree with the custom-JVP derivatives."""
    pot = gk.potentials.Probit(jnp.ones(4))
    m = jnp.array([-3.0, 0.2, 2.5, 40.0])
    s2 = jnp.array([0.04, 9.0, 400.0, 100.0])
    value = jax.jit(lambda m, s2: jnp.sum(pot.expected_log_phi(m, s2)))
    dm, ds2 = jax.jit(jax.grad(value, argnums=(0, 1)))(m, s2)
    h = 1e-5
    for i in range(4):
        e = jnp.zeros(4).at[i].set(h)
        fd_m = (value(m + e, s2) - value(m - e, s2)) / (2 * h)
        fd_s = (value(m, s2 + e * s2[i]) - value(m, s2 - e * s2[i])) / (2 * h * s2[i])
        assert abs(fd_m - dm[i]) < 1e-7 * max(1, abs(dm[i]))
        assert abs(fd_s - ds2[i]) < 1e-6 * max(1, abs(ds2[i]))


def test_feature_rule_weights_are_a_normalised_rule_for_the_gaussian():
    """Nodes and weights integrate 1, x and x^2 against N(m, s^2) for every regime (near, far, s = 0)."""
    m = jnp.array([0.0, 3.0, -50.0, 1e3, 0.1])
    s2 = jnp.array([1.0, 1e4, 4.0, 1.0, 0.0])
    x, w = jax.jit(lambda m, s2: _quadrature.feature_rule(m, s2, 0.0, 1.0, 64))(m, s2)
    assert x.shape == (5, 64) and w.shape == (5, 64)
    assert np.all(np.asarray(w) >= 0)
    np.testing.assert_allclose(jnp.sum(w, -1), 1.0, rtol=1e-14)
    np.testing.assert_allclose(jnp.sum(w * x, -1), m, rtol=1e-12, atol=1e-9)
    np.testing.assert_allclose(jnp.sum(w * (x - m[:, None]) ** 2, -1), s2, rtol=1e-10, atol=1e-12)


def test_float32_rule_is_finite_and_accurate_to_float32():
    pot = gk.potentials.Logistic(jnp.ones(3, jnp.float32))
    m = jnp.array([0.0, 5.0, -2.0], jnp.float32)
    s2 = jnp.array([100.0, 1.0, 0.0], jnp.float32)
    out = jax.jit(lambda m, s2: pot.expected_log_phi(m, s2))(m, s2)
    assert out.dtype == jnp.float32
    f = lambda x, g=jax.jit(jax.nn.log_sigmoid): np.asarray(g(np.asarray(x, np.float64)))
    ref = [reference_expectation(f, float(a), float(np.sqrt(b))) for a, b in zip(m, s2)]
    np.testing.assert_allclose(np.asarray(out), ref, rtol=1e-5)


def test_num_points_validated():
    with pytest.raises(ValueError, match="num_points"):
        gk.potentials.Logistic(jnp.ones(2), num_points=1)
    with pytest.raises(ValueError, match="num_points"):
        _quadrature.hermite_rule(0)
    # few nodes of the feature-adapted rule: a warning at the caller's line (Gauss-Hermite on a Custom
    # polynomial is exact with few nodes, so no warning there)
    with pytest.warns(UserWarning, match="num_points=8 < 16") as record:
        gk.potentials.StudentT(jnp.ones(2), 3.0, 0.5, num_points=8)
    assert record[0].filename == __file__
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        gk.potentials.Custom(lambda x: x ** 4, num_points=8)
        gk.potentials.Logistic(jnp.ones(2), num_points=16)
    with pytest.raises(ValueError, match="center and width"):
        gk.potentials.Custom(lambda x: -x ** 2, center=0.0)
    with pytest.raises(ValueError, match="width"):
        gk.potentials.Custom(lambda x: -x ** 2, center=0.0, width=-1.0)


def test_logistic_closed_form_jet_matches_automatic_differentiation():
    """Logistic.log_phi_jet (one exponential for every order) = repeated autodiff of log_phi, orders 0-4, at
    nodes from |u| = 0 to 700, both labels; and the fused moments give the same gradient and Hessian."""
    y = jnp.array([1.0, -1.0, 1.0, -1.0])
    pot = gk.potentials.Logistic(y)
    x = jnp.array([0.0, 1e-3, -2.5, 30.0, -700.0, 700.0, 5.0])[None, :] * jnp.ones((4, 1))
    closed = jnp.stack(pot.log_phi_jet(x, 4))
    auto = jax.jit(jax.vmap(lambda xk: jnp.stack(_quadrature.autodiff_jet(type(pot)._log_phi_fn)(pot, xk[:, None], 4))[
        ..., 0], in_axes=1, out_axes=-1))(x)     # jit: one program instead of op-by-op dispatch
    assert closed.shape == (5, 4, 7)
    np.testing.assert_allclose(closed, auto, rtol=1e-12, atol=1e-14)   # autodiff's 1 - sigmoid cancels at |u| >> 1
    u = y[:, None] * x
    np.testing.assert_allclose(closed[2], -jax.nn.sigmoid(u) * jax.nn.sigmoid(-u), rtol=1e-13)   # relative, all u
    custom = gk.potentials.Custom(jax.nn.log_sigmoid, center=0.0, width=0.75 * np.pi)
    m, s2 = jnp.array([0.3, -1.0, 4.0, 0.0]), jnp.array([0.5, 2.0, 100.0, 0.0])
    value = lambda p: (lambda m, s2: jnp.sum(p.expected_log_phi(m, s2)))
    # the Hessian in (m, s2) together (its four blocks, the mixed ones too): one program for each rule
    h_closed = jax.jit(jax.hessian(value(gk.potentials.Logistic(jnp.ones(4))), (0, 1)))(m, s2)
    h_auto = jax.jit(jax.hessian(value(custom), (0, 1)))(m, s2)
    for i in (0, 1):
        for j in (0, 1):
            np.testing.assert_allclose(h_closed[i][j], h_auto[i][j], rtol=1e-10, atol=1e-14, err_msg=f"{i}{j}")


@pytest.mark.parametrize("name", ["logistic", "student-t"])
def test_linear_estimators_node_counts_are_accurate(name):
    """The scikit-learn linear estimators' cheaper rules (`NUM_POINTS`: fewer nodes than the potentials'
    defaults) still match scipy.integrate.quad to 1e-7 relative to max(1, |I|) in E[f], E[f'] and E[f''], on the
    grid of the test above (m - center up to 1e3, s up to 100): far below the estimators' tolerance of 1e-4."""
    from gkl_jax.sklearn._linear_model import NUM_POINTS

    key = name.replace("-", "_")
    make, center, width = POTENTIALS[key]
    k = NUM_POINTS[name]
    pot = make()
    pot = gk.potentials.Logistic(pot.y, num_points=k) if key == "logistic" else \
        gk.potentials.StudentT(pot.y, pot.dof, pot.scale, num_points=k)
    worst = max(e[0] for e in _relative_errors(pot, center, width))
    assert 0 < worst < 1e-7, (name, k, worst)
