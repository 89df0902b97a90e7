"""gkl_jax._traps: a `Custom(lambda ...)` rebuilt on each call compiles once, a new captured object warns, and a
float32 fit because x64 is off says so once per process."""

import functools
import subprocess
import sys
import textwrap
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import gkl_jax as gk
from gkl_jax import _fit
from gkl_jax._traps import CodeKey

H = np.array([[1.0, 0.5], [-0.3, 1.0], [0.2, -1.0]])
Y = np.array([1.0, -1.0, 1.0])


def _model(potential):
    return gk.Model(gk.priors.Isotropic(2, 1.0), gk.Sites(H, potential))


def _logistic_lambda(scale):
    return gk.potentials.Custom(lambda x: -jnp.logaddexp(0.0, -scale * Y * x), log_concave=True, num_points=16)


def test_custom_lambda_rebuilt_each_call_compiles_once():
    """Issue 64: three fits of a model whose Custom lambda is created anew each time trace `fit` once, and the
    by-value comparison of captured numbers keeps fits with another constant apart (their results differ, as
    the logistic closed form of the same model says)."""
    before = _fit.TRACE_COUNT["fit"]
    results = [gk.fit(_model(_logistic_lambda(1.0))) for _ in range(3)]
    assert _fit.TRACE_COUNT["fit"] - before == 1
    other = gk.fit(_model(_logistic_lambda(2.0)))          # another captured constant: another program
    assert _fit.TRACE_COUNT["fit"] - before == 2
    with warnings.catch_warnings():
        warnings.simplefilter("error", gk.Float32Warning)  # x64 is on in the suite: no float32 notice
        reference = gk.fit(_model(gk.potentials.Logistic(Y)))
    np.testing.assert_allclose(results[-1].q.mean, reference.q.mean, atol=1e-5)
    assert np.max(np.abs(np.asarray(other.q.mean) - np.asarray(results[-1].q.mean))) > 1e-2


def test_code_key_compares_what_the_function_computes():
    def make(c):
        return lambda x: c * x

    assert CodeKey(make(2.0)) == CodeKey(make(2.0)) and hash(CodeKey(make(2.0))) == hash(CodeKey(make(2.0)))
    assert CodeKey(make(2.0)) != CodeKey(make(3.0))
    assert CodeKey(make(2)) != CodeKey(make(2.0))                     # another constant's type: another program
    assert CodeKey(make(np.arange(3.0))) == CodeKey(make(np.arange(3.0)))
    assert CodeKey(make(np.arange(3.0))) != CodeKey(make(np.arange(3.0) + 1))
    assert CodeKey(make(jnp.ones(2))) == CodeKey(make(np.ones(2)))
    assert CodeKey(lambda x: x) != CodeKey(lambda x: -x)
    f = functools.partial(jnp.multiply, 2.0)
    assert CodeKey(f) == CodeKey(functools.partial(jnp.multiply, 2.0)) != CodeKey(functools.partial(jnp.multiply, 3.0))
    obj = object()
    assert CodeKey(make(obj)) == CodeKey(make(obj)) != CodeKey(make(object()))
    assert float(CodeKey(make(2.0))(3.0)) == 6.0


class _Scale:
    def __init__(self, value):
        self.value = value


def test_new_captured_object_each_call_warns_on_second_recompilation():
    """A lambda capturing a new object on each call cannot share a compilation: the third trace of the same code
    warns once, naming the captured type and what to do."""
    def potential():
        scale = _Scale(1.0)
        return gk.potentials.Custom(lambda x: -scale.value * x ** 2)

    x = jnp.ones(3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(2):
            jax.make_jaxpr(potential().log_phi)(x)
    with pytest.warns(gk.RecompilationWarning, match="_Scale.*outside the loop"):
        jax.make_jaxpr(potential().log_phi)(x)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        jax.make_jaxpr(potential().log_phi)(x)     # once per code


def test_float32_fit_warns_once_per_process():
    """Without x64 a fit says once that it runs in float32 (a UserWarning subclass that users can silence; with
    x64 on nothing, see the test above)."""
    script = textwrap.dedent("""
        import sys, warnings
        import numpy as np
        import gkl_jax as gk
        H = np.array([[1.0, 0.5], [-0.3, 1.0], [0.2, -1.0]])
        model = gk.Model(gk.priors.Isotropic(2, 1.0), gk.Sites(H, gk.potentials.Gaussian(np.ones(3), 1.0)))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            gk.fit(model)
            gk.fit(model)
        hits = [w for w in caught if issubclass(w.category, gk.Float32Warning)]
        assert all(issubclass(w.category, UserWarning) for w in hits)
        print(len(hits), hits[0].message if hits else "")
    """)
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                         env={"JAX_PLATFORMS": "cpu", "PATH": "", "PYTHONPATH": ":".join(sys.path)})
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.startswith("1 ") and "jax_enable_x64" in run.stdout and "float32" in run.stdout
