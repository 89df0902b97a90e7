"""`gkl_jax._program.program`: the solver programs' compiler options on the CPU, also under jit, grad and vmap.

The suite sets the same option in XLA_FLAGS (tests/conftest.py), which makes the library's programs drop theirs;
these tests build programs with the option in force, as a user's session has it."""

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gkl_jax import _checks, _program, _xla_options


def _with_options(monkeypatch, fun):
    monkeypatch.setenv("XLA_FLAGS", "")
    monkeypatch.delenv("GKL_JAX_XLA_OPTIONS", raising=False)
    assert _xla_options.cpu_compiler_options() == _xla_options.CPU_OPTIONS
    return _program.program(fun)


def test_program_with_compiler_options_runs_at_top_level_and_inside_jit_grad_and_vmap(monkeypatch):
    f = _with_options(monkeypatch, lambda x: jnp.sin(x) * x)
    x = jnp.asarray(0.7)
    expected = np.sin(0.7) * 0.7
    assert np.isclose(f(x), expected)
    assert np.isclose(jax.jit(f)(x), expected)
    assert np.isclose(jax.grad(f)(x), np.cos(0.7) * 0.7 + np.sin(0.7))
    assert np.allclose(jax.vmap(f)(jnp.arange(3.0)), np.sin(np.arange(3.0)) * np.arange(3.0))


def test_the_options_reach_the_top_level_compile_only(monkeypatch):
    seen = []
    real = _program.jax.jit

    def spy(fun, **kwargs):
        seen.append(kwargs.get("compiler_options"))
        return real(fun, **kwargs)

    monkeypatch.setattr(_program.jax, "jit", spy)
    f = _with_options(monkeypatch, lambda x: 2.0 * x)
    assert float(f(jnp.asarray(1.0))) == 2.0
    assert _xla_options.CPU_OPTIONS in seen          # the top-level variant compiled with the options
    monkeypatch.setattr(_program.jax, "jit", real)
    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_use_fusion_emitters=false")
    assert _xla_options.cpu_compiler_options() == {}  # XLA_FLAGS wins
    monkeypatch.setenv("XLA_FLAGS", "")
    monkeypatch.setenv("GKL_JAX_XLA_OPTIONS", "0")
    assert _xla_options.cpu_compiler_options() == {}
    assert float(jax.jit(jax.grad(f))(1.0)) == 2.0


def test_traced_checks_are_left_out_of_top_level_programs_only():
    """A value check on a tracer (`_validate.check_positive`) gives a program an effect, which turns off JAX's C++
    dispatch; at the top level no checkify can surround the program, so it is left out there, and kept inside a
    user's transformation, where `checkify.checkify` reports it."""
    from jax.experimental import checkify

    from gkl_jax import _validate

    traced = []

    def fun(x):
        traced.append(_checks.checks_traced())
        _validate.check_positive(x, "x")
        return 2.0 * x

    f = _program.program(fun)
    assert float(f(jnp.asarray(-1.0))) == -2.0 and traced == [False]
    assert jax.make_jaxpr(fun)(1.0).effects and traced[-1] is True      # outside a program: kept
    err, out = checkify.checkify(jax.jit(lambda x: f(x)))(jnp.asarray(-1.0))
    assert traced[-1] is True and "x must be positive" in str(err.get())
    assert float(out) == -2.0
    # the same program object dispatches again without retracing, and keeps non-array leaves static
    g = _program.program(lambda x, name: (x + 1.0, name))
    out = g(np.ones(3), "label")
    assert out[1] == "label" and np.allclose(out[0], 2.0)
    with pytest.raises(ValueError, match="hashable"):
        g(np.ones(3), {"a", "set"})


_USER_SESSION = """
import jax, numpy as np, gkl_jax as gk
jax.config.update("jax_enable_x64", True)
H = np.array([[1.0, 0.5], [-0.3, 1.0], [0.2, -1.0]])
def log_z(v):
    return gk.fit(gk.Model(gk.priors.Isotropic(2, v), gk.Sites(H, gk.potentials.Logistic([1, -1, 1])))).log_z
g = jax.grad(log_z)(1.0)
h = (log_z(1.0 + 1e-5) - log_z(1.0 - 1e-5)) / 2e-5
assert abs(g - h) < 1e-6, (g, h)
batch = jax.vmap(log_z)(np.array([0.5, 1.0]))
assert abs(batch[1] - log_z(1.0)) < 1e-9
X = np.linspace(-2, 2, 8)[:, None]
build = lambda k: gk.gp.model(k, X, gk.potentials.Logistic(np.where(np.sin(2 * X[:, 0]) > 0, 1, -1)))
hr = gk.gp.fit_hyperparameters(build, gk.kernels.SquaredExponential(1.0, 1.0), gtol=1e-3)
assert hr.converged
print("ok")
"""


@pytest.mark.slow
def test_a_user_session_without_xla_flags_differentiates_vmaps_and_learns_hyperparameters():
    """The library's programs with their compiler options in force (no XLA_FLAGS, as a user runs it) nested
    inside grad, vmap and ML-II's traced objective: once failed with JAX's "compiler_options can only be passed
    to top-level jax.jit"."""
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "GKL_JAX_XLA_OPTIONS")}
    # LLVM level 0 only shortens the compilations; the library's own option (no fusion emitters) stays in force
    env["XLA_FLAGS"] = "--xla_backend_optimization_level=0"
    out = subprocess.run([sys.executable, "-c", _USER_SESSION], env=env, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-3000:]
