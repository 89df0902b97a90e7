"""Argument checks of `gkl_jax.distributed`: site_mesh's devices, stack_models' and fit_batched's models and q0.
Nothing here compiles a fit; the batched and sharded fits themselves are tested in tests/test_scale.py."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import gkl_jax as gk
from gkl_jax.distributed import fit_batched, site_mesh, stack_models
from gkl_jax.distributed._batched import check_stacked


def square_model(seed=0):
    """N = D = 3: every per-site and prior array leaf has the same leading length 3, like a batch of 3."""
    rng = np.random.default_rng(seed)
    prior = gk.priors.Isotropic(3, 1.0, mean=np.zeros(3))
    return gk.Model(prior, gk.Sites(rng.normal(size=(3, 3)), gk.potentials.Logistic(np.ones(3))))


def identity_model(seed=0):
    """Sites(None, ...): no dense H to tell a batch by."""
    y = np.sign(np.random.default_rng(seed).normal(size=3))
    return gk.Model(gk.priors.Isotropic(3, 2.0), gk.Sites(None, gk.potentials.Logistic(y)))


# ---------------------------------------------------------------- site_mesh


@pytest.mark.parametrize("devices", ["cpu", b"cpu", 5, ["cpu"], [0, 1], np.array(["c", "p"])])
def test_site_mesh_refuses_non_devices(devices):
    with pytest.raises(ValueError, match="devices must be a sequence of jax Devices"):
        site_mesh(devices)


def test_site_mesh_refuses_a_repeated_device():
    device = jax.devices()[0]
    with pytest.raises(ValueError, match="devices must be distinct"):
        site_mesh([device, device])


def test_site_mesh_accepts_devices_in_any_iterable():
    devices = jax.devices()
    for given in (devices, tuple(devices), iter(devices), np.array(devices)):
        mesh = site_mesh(given)
        assert mesh.axis_names == ("sites",) and list(mesh.devices.ravel()) == devices


# ---------------------------------------------------------------- stack_models and fit_batched


@pytest.mark.parametrize("models", [5, None, "ab", square_model()])
def test_stack_models_refuses_a_non_sequence(models):
    with pytest.raises(ValueError, match="models must be a sequence of gkl_jax.Model"):
        stack_models(models)


@pytest.mark.parametrize("models", [5, None])
def test_fit_batched_refuses_a_non_sequence(models):
    with pytest.raises(ValueError, match="models must be a sequence of gkl_jax.Model"):
        fit_batched(models)


@pytest.mark.parametrize("make", [square_model, identity_model])
def test_fit_batched_refuses_a_single_unstacked_model(make):
    """A single model whose leaves share one leading length passed the batch-size check and failed inside
    jax.vmap; it is refused before anything is traced."""
    with pytest.raises(ValueError, match="models is a single gkl_jax.Model, not one stacked by stack_models"):
        fit_batched(make())


@pytest.mark.parametrize("make", [square_model, identity_model])
def test_check_stacked_accepts_stacked_models(make):
    stacked = stack_models([make(0), make(1)])
    assert check_stacked(stacked) is stacked
    assert check_stacked(stack_models([make(0)])) is not None  # a batch of one


def test_fit_batched_refuses_a_stack_of_stacks():
    stacked = stack_models([square_model(0), square_model(1)])
    with pytest.raises(ValueError, match=r"models must have one batch axis: its H has shape \(2, 2, 3, 3\)"):
        fit_batched(stack_models([stacked, stacked]))


def test_fit_batched_refuses_an_unstacked_q0():
    """q0 = one Gaussian of dim 2 for a batch of 2 has the batch size by lengths but no batch axis."""
    model = gk.Model(gk.priors.Isotropic(2, 1.0), gk.Sites(np.eye(2), gk.potentials.Logistic(np.ones(2))))
    q = gk.Gaussian(jnp.zeros(2), gk.factors.Diagonal(jnp.ones(2)))
    with pytest.raises(ValueError, match=r"q0 must be a gkl_jax.Gaussian with a leading batch axis: q0.mean has "
                                         r"shape \(2,\)"):
        fit_batched([model, model], q0=q)


def test_host_read_helpers_in_one_process():
    """The multi-process helpers' one-process branches (tests/test_multiprocess.py runs the others): nothing spans
    processes, tracers included, and a gather is this process's row."""
    from gkl_jax._processes import gather_small, host_copy, local_values, spans_processes

    x = jnp.arange(6.0).reshape(2, 3)
    assert not spans_processes(x) and not spans_processes(np.ones(2))
    seen = []
    jax.jit(lambda t: seen.append(spans_processes(t)) or t)(x)
    assert seen == [False]
    np.testing.assert_array_equal(local_values(x), np.arange(6.0))
    np.testing.assert_array_equal(host_copy(x), np.asarray(x))
    np.testing.assert_array_equal(gather_small([3, 4, 5]), [[3, 4, 5]])

