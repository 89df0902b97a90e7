"""The release of compiled programs' memory in long sessions (`gkl_jax._memory`): `gk.set_memory_release` and
`GKL_JAX_RELEASE_MEMORY` choose between "warn" (the default), "on" and "off"; under "warn" the first release in a
process raises one `gk.MemoryReleaseWarning`. A mapping limit of 1 (`GKL_JAX_MAX_MAPPINGS`) makes every process
crowded, so each new top-level compilation of a library program triggers the release."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import gkl_jax as gk
from gkl_jax import _memory, _program

linux = pytest.mark.skipif(_memory.mapping_count() == 0, reason="counts Linux memory mappings")


@pytest.fixture
def crowded(monkeypatch):
    """A process past its mapping limit, with no setting made and no warning shown yet."""
    monkeypatch.setenv("GKL_JAX_MAX_MAPPINGS", "1")
    monkeypatch.delenv("GKL_JAX_RELEASE_MEMORY", raising=False)
    monkeypatch.setitem(_memory._STATE, "mode", None)
    monkeypatch.setitem(_memory._STATE, "warned", False)


def _user_function():
    """A user's own jitted function, compiled once: its cache holds one program."""
    f = jax.jit(lambda x: jnp.cos(x) + 3.0)
    f(jnp.arange(4.0))
    assert f._cache_size() == 1
    return f


def _compile_a_library_program(shift):
    """A new library program compiled at the top level (the release runs after such a compilation)."""
    out = _program.program(lambda x: x * 2.0 + shift)(np.ones(3))
    assert np.allclose(out, 2.0 + shift)


@linux
def test_the_default_releases_and_warns_once_per_process(crowded):
    assert _memory.memory_release_mode() == "warn"
    f, before = _user_function(), _memory.RELEASES["count"]
    with pytest.warns(gk.MemoryReleaseWarning, match="set_memory_release") as record:
        _compile_a_library_program(1.0)
    assert f._cache_size() == 0                         # the user's program was evicted, as the warning says
    assert _memory.RELEASES["count"] == before + 1
    assert record[0].filename == __file__               # the warning names the first frame outside gkl_jax
    with warnings.catch_warnings():
        warnings.simplefilter("error")                  # a second release in the same process: no warning
        _compile_a_library_program(2.0)
    assert _memory.RELEASES["count"] == before + 2


@linux
def test_on_releases_without_a_warning_and_off_keeps_the_users_programs(crowded):
    assert gk.set_memory_release("on") == "warn"
    f, before = _user_function(), _memory.RELEASES["count"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _compile_a_library_program(3.0)
    assert f._cache_size() == 0 and _memory.RELEASES["count"] == before + 1
    assert gk.set_memory_release("OFF") == "on"
    f = _user_function()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _compile_a_library_program(4.0)
    assert f._cache_size() == 1 and _memory.RELEASES["count"] == before + 1
    assert not _memory.release_after_compile()


def test_the_environment_variable_and_a_zero_limit(crowded, monkeypatch):
    monkeypatch.setenv("GKL_JAX_RELEASE_MEMORY", "off")
    assert _memory.memory_release_mode() == "off" and not _memory.release_after_compile()
    monkeypatch.setenv("GKL_JAX_RELEASE_MEMORY", "on")
    assert _memory.memory_release_mode() == "on"
    assert gk.set_memory_release("warn") == "on"        # the setting overrides the environment...
    assert gk.set_memory_release(None) == "warn"        # ...until None hands it back
    assert _memory.memory_release_mode() == "on"
    monkeypatch.setenv("GKL_JAX_MAX_MAPPINGS", "0")     # the limit's own off switch still holds
    f = _user_function()
    assert not _memory.release_after_compile() and f._cache_size() == 1


def test_bad_settings_name_the_argument(crowded, monkeypatch):
    for bad in ("sometimes", 1, True, ""):
        with pytest.raises(ValueError, match="mode must be one of"):
            gk.set_memory_release(bad)
    assert _memory.memory_release_mode() == "warn"      # a refused setting changes nothing
    monkeypatch.setenv("GKL_JAX_RELEASE_MEMORY", "maybe")
    with pytest.raises(ValueError, match="GKL_JAX_RELEASE_MEMORY"):
        _memory.memory_release_mode()


@linux
def test_below_the_limit_nothing_is_released(crowded, monkeypatch):
    monkeypatch.setenv("GKL_JAX_MAX_MAPPINGS", str(10 * _memory.mapping_count() + 10**6))
    f, before = _user_function(), _memory.RELEASES["count"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _compile_a_library_program(5.0)
    assert f._cache_size() == 1 and _memory.RELEASES["count"] == before


def test_the_docstring_example_runs(crowded):
    import doctest

    runner = doctest.DocTestRunner()
    for test in doctest.DocTestFinder(recurse=False).find(gk.set_memory_release):
        runner.run(test)
    assert runner.summarize(verbose=False).attempted == 3 and runner.failures == 0
    assert _memory.memory_release_mode() == "warn"


@linux
def test_a_public_verb_on_a_new_shape_releases_through_the_same_path(crowded):
    """`gk.bound` at the top level compiles one program per model shape; past the limit that compilation clears
    the caches and warns, and the bound is the same as before."""
    rng = np.random.default_rng(31)
    H = rng.normal(size=(23, 7))
    model = gk.Model(gk.priors.Isotropic(7, 1.0), gk.Sites(H, gk.potentials.Logistic(np.sign(H[:, 0]))))
    q = gk.Gaussian(np.zeros(7), gk.factors.Full(np.eye(7)))
    gk.set_memory_release("off")
    expected = float(gk.bound(model, q))                # compiled with the release off: nothing cleared
    jax.clear_caches()                                  # the next call compiles again
    gk.set_memory_release(None)
    f = _user_function()
    with pytest.warns(gk.MemoryReleaseWarning):
        value = float(gk.bound(model, q))
    assert value == expected and f._cache_size() == 0
