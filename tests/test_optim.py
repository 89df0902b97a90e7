"""The shared numerical building blocks (`gkl_jax._optim`): the backtracking search in its compiled and host forms,
its acceptance tests, the L-BFGS two-loop recursion (host list and compiled ring buffer) and the compiled L-BFGS
and Newton-CG solver loops built on them."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gkl_jax._optim import (
    LBFGSMemory,
    backtrack,
    backtrack_host,
    lbfgs_direction,
    no_decrease,
    sufficient_increase,
)
from gkl_jax.solvers._newton import newton_cg
from gkl_jax.solvers._quasi_newton import lbfgs


def test_acceptance_tests_on_host_floats_and_traced_values():
    """Host floats stay numpy (their own precision); JAX values give JAX booleans; non-finite values fail."""
    assert isinstance(sufficient_increase(1.0, 0.0, 1.0, 2.0), np.bool_)
    assert bool(sufficient_increase(1.0, 0.0, 0.5, 2.0)) and not bool(sufficient_increase(1e-5, 0.0, 0.5, 2.0))
    assert not bool(sufficient_increase(np.nan, 0.0, 1.0, 1.0)) and not bool(no_decrease(np.inf, 0.0, 1.0))
    assert bool(no_decrease(-0.5, 0.0, 1.0)) and not bool(no_decrease(-1.5, 0.0, 1.0))
    traced = jax.jit(lambda v: sufficient_increase(v, 0.0, 1.0, 1.0))(jnp.asarray(1.0))
    assert isinstance(traced, jax.Array) and bool(traced)


@pytest.mark.parametrize("first_ok", [0.3, 0.05, 1e-12])
def test_compiled_and_host_backtracking_try_the_same_steps(first_ok):
    """The first t in t0 {1, 1/2, ...} at or below `first_ok` is taken by both drivers, with the trial there; none
    within the halvings: the last one tried, not accepted."""
    trial = lambda t: 2.0 * t
    accept = lambda t, aux: t <= first_ok
    t, aux, ok = jax.jit(lambda: backtrack(trial, accept, jnp.zeros(()), dtype=jnp.float64, max_halvings=10,
                                           t0=0.8))()
    t_host, aux_host, ok_host = backtrack_host(trial, accept, max_halvings=10, t0=0.8)
    expected = next((0.8 * 0.5**k for k in range(11) if 0.8 * 0.5**k <= first_ok), None)
    assert bool(ok) == ok_host == (expected is not None)
    np.testing.assert_allclose([float(t), float(aux)], [t_host, aux_host])
    np.testing.assert_allclose(t_host, 0.8 * 0.5**10 if expected is None else expected)


def test_ring_buffer_two_loop_equals_the_host_recursion():
    """The compiled memory keeps the newest m pairs (wrapping around), skips pairs not kept, and after a reset
    gives the scaled gradient; each direction equals the host recursion on the same pairs; H y_newest = s_newest
    (the secant equation)."""
    rng = np.random.default_rng(0)
    A = rng.normal(size=(6, 6))
    A = A @ A.T + 6 * np.eye(6)
    pairs = [(s, A @ s) for s in rng.normal(size=(5, 6))]
    g = rng.normal(size=6)
    direction = jax.jit(lambda mem, g: mem.direction(g))
    mem = LBFGSMemory.empty(jnp.zeros(6), 3)
    np.testing.assert_allclose(direction(mem, g), lbfgs_direction(g, []), rtol=1e-14)
    for i, (s, y) in enumerate(pairs):
        mem = mem.push(jnp.asarray(s), jnp.asarray(y), jnp.asarray(True))
        np.testing.assert_allclose(direction(mem, g), lbfgs_direction(g, pairs[max(0, i - 2):i + 1]), rtol=1e-12)
    np.testing.assert_allclose(direction(mem, pairs[-1][1]), pairs[-1][0], rtol=1e-10)
    skipped = mem.push(jnp.asarray(g), jnp.asarray(-g), jnp.asarray(False))
    np.testing.assert_allclose(direction(skipped, g), direction(mem, g), rtol=1e-14)
    np.testing.assert_allclose(direction(mem.reset(jnp.asarray(True)), g), lbfgs_direction(g, []), rtol=1e-14)


def test_lbfgs_reaches_the_optimum_with_one_copy_of_the_objective():
    """A concave quadratic: the closed-form maximiser, every step non-decreasing (beyond round-off, where steps
    are taken on `no_decrease`); Rosenbrock (negated):
    (1, 1) from (-1.2, 1); the objective is traced once (one call site in the compiled loop)."""
    rng = np.random.default_rng(1)
    M = rng.normal(size=(8, 8))
    A, b = M @ M.T + np.eye(8), rng.normal(size=8)
    traces = []

    def quadratic(x):
        traces.append(1)
        return -0.5 * x @ A @ x + b @ x

    x, k, ok, hist, value = jax.jit(lambda x0: lbfgs(quadratic, x0, tol=1e-10, max_steps=200))(jnp.zeros(8))
    assert len(traces) == 1 and bool(ok)
    np.testing.assert_allclose(x, np.linalg.solve(A, b), rtol=1e-8)
    np.testing.assert_allclose(value, 0.5 * b @ np.linalg.solve(A, b), rtol=1e-12)
    steps = np.asarray(hist)[: int(k) + 1]
    assert np.all(np.diff(steps) >= -4 * np.finfo(float).eps * abs(float(value)))
    assert int(k) < 40 and np.all(np.isnan(np.asarray(hist)[int(k) + 1:]))

    rosenbrock = lambda x: -(100 * (x[1] - x[0] ** 2) ** 2 + (1 - x[0]) ** 2)
    x, k, ok, _, _ = jax.jit(lambda x0: lbfgs(rosenbrock, x0, tol=1e-9, max_steps=500))(jnp.array([-1.2, 1.0]))
    assert bool(ok) and int(k) < 200
    np.testing.assert_allclose(x, [1.0, 1.0], atol=1e-6)


def test_newton_step_costs_one_evaluation_and_backtracks_where_needed():
    """Newton-CG's loop: f traced once (one copy in the program); on a concave quadratic with exact CG one step,
    and two evaluations in all (x0, then the accepted trial, whose linearisation is also the stopping test); on
    the negated Rosenbrock function (non-concave: CG's negative-curvature stop, rejected full steps) (1, 1) from
    (-1.2, 1) with a history that never decreases, as the Armijo test demands."""
    rng = np.random.default_rng(2)
    M = rng.normal(size=(6, 6))
    A, b = M @ M.T + np.eye(6), rng.normal(size=6)
    traces, calls = [], []

    def quadratic(x):
        traces.append(1)
        jax.debug.callback(lambda: calls.append(1))
        return -0.5 * x @ A @ x + b @ x

    x, k, ok, hist = jax.jit(lambda x0: newton_cg(quadratic, x0, tol=1e-8, max_steps=20, forcing=1e-12))(
        jnp.zeros(6))
    jax.effects_barrier()
    assert len(traces) == 1 and bool(ok) and int(k) == 1 and len(calls) == 2
    np.testing.assert_allclose(x, np.linalg.solve(A, b), rtol=1e-9)

    rosenbrock = lambda x: -(100 * (x[1] - x[0] ** 2) ** 2 + (1 - x[0]) ** 2)
    x, k, ok, hist = jax.jit(lambda x0: newton_cg(rosenbrock, x0, tol=1e-10, max_steps=200))(jnp.array([-1.2, 1.0]))
    assert bool(ok) and int(k) < 100
    np.testing.assert_allclose(x, [1.0, 1.0], atol=1e-6)
    steps = np.asarray(hist)[: int(k) + 1]
    assert np.all(np.diff(steps) >= -1e-14) and np.all(np.isnan(np.asarray(hist)[int(k) + 1:]))


def test_optax_form_matches_optax_on_positive_curvature_pairs():
    """`scale_by_lbfgs` gives optax.scale_by_lbfgs's directions along a sequence of points of a convex quadratic
    (every pair has positive curvature), for a dict of parameters; with memory 2 the oldest pairs drop out."""
    import optax

    from gkl_jax._optim import scale_by_lbfgs

    rng = np.random.default_rng(2)
    M = rng.normal(size=(4, 4))
    A = M @ M.T + np.eye(4)
    grad = lambda p: {"a": A[:2] @ np.concatenate([p["a"], p["b"]]), "b": A[2:] @ np.concatenate([p["a"], p["b"]])}
    ours, theirs = scale_by_lbfgs(2), optax.scale_by_lbfgs(memory_size=2)
    points = [{"a": jnp.asarray(v[:2]), "b": jnp.asarray(v[2:])} for v in rng.normal(size=(5, 4))]
    state_ours, state_theirs = ours.init(points[0]), theirs.init(points[0])
    for p in points:
        g = jax.tree.map(jnp.asarray, grad(p))
        d_ours, state_ours = ours.update(g, state_ours, p)
        d_theirs, state_theirs = theirs.update(g, state_theirs, p)
        for key in ("a", "b"):
            np.testing.assert_allclose(d_ours[key], d_theirs[key], rtol=1e-10)
    with pytest.raises(ValueError, match="params"):
        ours.update(g, state_ours)
