"""Scale-out: batches of models (vmap), sites sharded over devices, minibatch fits and the chunked bound,
and derivatives through `fit` inside `jit`."""

import itertools
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.experimental import sparse as jsparse
from jax.sharding import PartitionSpec

import gkl_jax as gk
from gkl_jax import distributed
from gkl_jax.distributed import fit_batched, stack_models
from gkl_jax.stochastic import bound_chunked, fit_minibatch, minibatch_bound

HERE = os.path.dirname(os.path.abspath(__file__))


def logistic_model(dim, num, seed, variance=1.0):
    data = gk.datasets.synthetic_logistic(dim, num, seed=seed)
    sites = gk.Sites(data["X_train"], gk.potentials.Logistic(data["y_train"]))
    return gk.Model(gk.priors.Isotropic(dim, variance), sites)


@pytest.fixture(scope="module")
def sharded_run():
    """Start the 4-device subprocess at once, so it compiles while the in-process tests run."""
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    proc = subprocess.Popen([sys.executable, os.path.join(HERE, "_sharded_check.py")], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=os.path.dirname(HERE))
    yield proc
    if proc.poll() is None:
        proc.kill()


def test_start_sharded_subprocess(sharded_run):
    assert sharded_run.pid > 0


# ---------------------------------------------------------------- batches of models


def test_vmap_over_fit_matches_loop_and_compiles_once():
    models = [logistic_model(4, 400, seed) for seed in range(4)]
    factor = gk.factors.Diagonal()
    loop = [gk.fit(m, factor, tol=1e-9) for m in models]
    before = distributed.TRACE_COUNT["fit_batched"]
    batched = fit_batched(models, factor, tol=1e-9)
    again = fit_batched(stack_models(models[::-1]), factor, tol=1e-9)
    assert distributed.TRACE_COUNT["fit_batched"] - before == 1
    assert batched.log_z.shape == (4,) and batched.q.mean.shape == (4, 4)
    for i, single in enumerate(loop):
        np.testing.assert_allclose(batched.log_z[i], single.log_z, rtol=1e-12)
        np.testing.assert_allclose(batched.q.mean[i], single.q.mean, atol=1e-9)
        np.testing.assert_allclose(batched.q.factor.d[i], single.q.factor.d, atol=1e-9)
        assert bool(batched.converged[i]) and int(batched.num_steps[i]) == int(single.num_steps)
        np.testing.assert_allclose(again.log_z[3 - i], single.log_z, rtol=1e-12)

    # Plain jax.vmap with the models built from batched data inside jit: one program, the same answers.
    X = jnp.stack([m.sites[0].H.matrix for m in models])
    y = jnp.stack([m.sites[0].potential.y for m in models])

    def fit_one(X, y, log_var):
        model = gk.Model(gk.priors.Isotropic(4, jnp.exp(log_var)), gk.Sites(X, gk.potentials.Logistic(y)))
        return gk.fit(model, factor, tol=1e-9).log_z

    batched_fn = jax.jit(jax.vmap(fit_one))
    log_z = batched_fn(X, y, jnp.zeros(4))
    np.testing.assert_allclose(log_z, [single.log_z for single in loop], rtol=1e-12)
    assert batched_fn._cache_size() == 1
    batched_fn(X, y, jnp.ones(4))
    assert batched_fn._cache_size() == 1


def test_fit_batched_errors():
    a, b = logistic_model(3, 10, 0), logistic_model(3, 11, 1)
    with pytest.raises(ValueError, match=r"models\[1\]"):
        stack_models([a, b])
    with pytest.raises(ValueError, match="models"):
        stack_models([])
    with pytest.raises(ValueError, match=r"models\[0\]"):
        stack_models([object()])
    mesh = distributed.site_mesh(jax.devices()[:1])
    with pytest.raises(ValueError, match="no axis 'users'"):
        fit_batched([a, a], mesh=mesh, axis="users")
    q = gk.Gaussian(jnp.zeros(3), gk.factors.Diagonal(jnp.ones(3)))
    with pytest.raises(ValueError, match="q0 has batch size 3"):
        fit_batched([a, a], q0=jax.tree.map(lambda *x: jnp.stack(x), q, q, q))


# ---------------------------------------------------------------- chunked bound and minibatch estimates


def two_group_model(rng, dim=5, num=23):
    X = rng.normal(size=(num, dim))
    y = np.where(rng.uniform(size=num) < 0.5, 1.0, -1.0)
    logistic = gk.Sites(X, gk.potentials.Logistic(y), offset=rng.normal(size=num))
    laplace = gk.Sites(None, gk.potentials.Laplace(rng.normal(size=dim), scale=rng.uniform(0.5, 2, size=dim)),
                       variance_offset=0.1)
    return gk.Model(gk.priors.Diagonal(rng.uniform(0.5, 2.0, size=dim)), [logistic, laplace])


def _value_and_grads(model, q, chunks):
    """(value, gradient in q) of the bound and of the chunked bound for each chunk setting, in one program."""
    out = [jax.value_and_grad(gk.bound, argnums=1)(model, q)]
    return out + [jax.value_and_grad(bound_chunked, argnums=1)(model, q, chunk) for chunk in chunks]


def test_chunked_bound_equals_bound(rng):
    model = two_group_model(rng)
    C = np.triu(rng.normal(size=(5, 5))) * 0.3 + np.eye(5)
    mean = rng.normal(size=5)
    chunks = (4, (10, 2), 1000)
    for q in [gk.Gaussian(mean, gk.factors.Full(C)), gk.Gaussian(mean, gk.factors.Diagonal(np.diag(C)))]:
        (exact, exact_grad), *chunked = jax.jit(_value_and_grads, static_argnums=2)(model, q, chunks)
        for value, grad in chunked:
            np.testing.assert_allclose(value, exact, rtol=1e-13)
            for g, e in zip(jax.tree.leaves(grad), jax.tree.leaves(exact_grad)):
                np.testing.assert_allclose(g, e, rtol=1e-11, atol=1e-12)
    with pytest.raises(ValueError, match="chunk_size"):
        bound_chunked(model, q, 0)
    with pytest.raises(ValueError, match="chunk_size"):
        bound_chunked(model, q, (3,))


def test_minibatch_estimate_is_unbiased(rng):
    """The average of B_hat over every pair of subsets of b sites is exactly B, and so is the gradient's."""
    model = two_group_model(rng, dim=3, num=6)
    q = gk.Gaussian(rng.normal(size=3), gk.factors.Full(np.triu(rng.normal(size=(3, 3))) * 0.2 + np.eye(3)))
    pairs = list(itertools.product(itertools.combinations(range(6), 2), itertools.combinations(range(3), 2)))
    first = jnp.array([p[0] for p in pairs])
    second = jnp.array([p[1] for p in pairs])

    @jax.jit
    def averages(model, q):
        estimate = jax.value_and_grad(minibatch_bound, argnums=1)
        values, grads = jax.vmap(lambda a, b: estimate(model, q, [a, b]))(first, second)
        mean_grad = jax.tree.map(lambda g: jnp.mean(g, axis=0), grads)
        return jnp.mean(values), mean_grad, jax.value_and_grad(gk.bound, argnums=1)(model, q)

    value, grad, (exact, exact_grad) = averages(model, q)
    np.testing.assert_allclose(value, exact, rtol=1e-12)
    for g, e in zip(jax.tree.leaves(grad), jax.tree.leaves(exact_grad)):
        np.testing.assert_allclose(g, e, rtol=1e-10, atol=1e-12)


def test_minibatch_converges_to_full_batch_optimum():
    model = logistic_model(4, 400, seed=0)  # the shapes of the batch tests: gk.fit is already compiled
    full = gk.fit(model, gk.factors.Diagonal(), tol=1e-9)
    res = fit_minibatch(model, gk.factors.Diagonal(), batch_size=20, num_epochs=40, key=jax.random.key(1),
                        chunk_size=150)
    assert bool(res.converged)
    assert res.log_z <= full.log_z + 1e-9  # the full-batch fit is the optimum
    assert (full.log_z - res.log_z) / abs(full.log_z) < 2e-4
    np.testing.assert_allclose(res.q.mean, full.q.mean, atol=0.02)
    np.testing.assert_allclose(res.q.factor.d, full.q.factor.d, rtol=0.05)
    np.testing.assert_allclose(res.history[-1], res.log_z, rtol=1e-12)
    assert res.history.shape == (int(res.num_steps) + 1,)
    # The exact full-data bound is reported at the end, in chunks.
    np.testing.assert_allclose(res.log_z, gk.bound(model, res.q), rtol=1e-12)


def test_minibatch_whitened_converges_under_a_gp_prior():
    """In w the GP prior's precision spans the kernel's condition number and Adam stalls (this problem: 3000
    full-batch steps end ~10 nats below the optimum); in v = L^{-1} (w - mu) it converges, minibatches too."""
    X = np.linspace(0, 1, 12)[:, None]
    model = gk.Model(gk.priors.GP(gk.kernels.SquaredExponential(1.0, 0.3), X),
                     gk.Sites(None, gk.potentials.Logistic(np.sign(np.sin(6 * X[:, 0]) + 0.1))))
    full = gk.fit(model)
    res = fit_minibatch(model, batch_size=6, num_steps=1000, whiten=True)
    assert bool(res.converged) and isinstance(res.q.factor, gk.factors.Full)
    assert 0 <= float(full.log_z - res.log_z) < 1e-6
    np.testing.assert_allclose(res.log_z, gk.bound(model, res.q), rtol=1e-12)   # q is back in the basis of w
    np.testing.assert_allclose(res.q.mean, full.q.mean, atol=1e-3)
    with pytest.raises(ValueError, match="fit_minibatch: whiten=True needs a prior"):
        fit_minibatch(gk.Model(None, gk.Sites(np.eye(3), gk.potentials.Logistic(np.ones(3)))), batch_size=2,
                      num_steps=3, whiten=True)


def test_minibatch_with_any_optax_optimizer_and_warns_when_short():
    model = logistic_model(3, 200, seed=2)
    with pytest.warns(UserWarning, match="fit_minibatch"):
        res = fit_minibatch(model, gk.factors.Full(), batch_size=20, num_steps=3, optimizer=optax.sgd(1e-4))
    assert not bool(res.converged)
    assert np.isfinite(float(res.log_z))
    np.testing.assert_allclose(res.log_z, gk.bound(model, res.q), rtol=1e-12)


def test_minibatch_errors():
    model = logistic_model(3, 50, seed=0)
    for bad in [0, 51, True, 2.5]:
        with pytest.raises(ValueError, match="batch_size"):
            fit_minibatch(model, batch_size=bad, num_steps=10)
    with pytest.raises(ValueError, match="batch_size"):
        fit_minibatch(model, batch_size=(5, 5), num_steps=10)
    with pytest.raises(ValueError, match="num_steps"):
        fit_minibatch(model, batch_size=5)
    with pytest.raises(ValueError, match="num_steps"):
        fit_minibatch(model, batch_size=5, num_steps=0)
    with pytest.raises(ValueError, match="num_epochs"):
        fit_minibatch(model, batch_size=5, num_epochs=-1.0)
    with pytest.raises(ValueError, match="optimizer"):
        fit_minibatch(model, batch_size=5, num_steps=3, optimizer="adam")
    with pytest.raises(ValueError, match="tol"):
        fit_minibatch(model, batch_size=5, num_steps=3, tol=0.0)
    H = jsparse.BCOO.fromdense(np.eye(3)[[0, 1, 2, 0]])
    sparse_model = gk.Model(gk.priors.Isotropic(3), gk.Sites(H, gk.potentials.Logistic(np.ones(4))))
    with pytest.raises(ValueError, match="dense H"):
        fit_minibatch(sparse_model, batch_size=2, num_steps=3)


# ---------------------------------------------------------------- derivatives through fit inside jit


def test_gradients_through_fit_inside_jit_match_finite_differences():
    """d/dtheta of log Z (envelope theorem) and of functions of the posterior mean and covariance (implicit
    function theorem), with the model built from theta inside the jitted function."""
    rng = np.random.default_rng(5)
    X = rng.normal(size=(25, 3))
    y = np.where(rng.uniform(size=25) < 1 / (1 + np.exp(-X @ np.array([1.0, -1.0, 0.5]))), 1.0, -1.0)
    y = jnp.asarray(y)  # closed-over concrete jax arrays: the constructors' value checks must not trip in jit
    v = jnp.array([0.3, -1.0, 2.0])

    @jax.jit
    @jax.value_and_grad
    def loss(theta, weights):
        model = gk.Model(gk.priors.Isotropic(3, jnp.exp(theta[0])),
                         gk.Sites(X * jnp.exp(theta[1:]), gk.potentials.Logistic(y)))
        res = gk.fit(model, gk.factors.Full(), tol=1e-11)
        return weights @ jnp.stack([res.log_z, res.q.mean @ v, jnp.sum(res.q.marginal_variances())])

    theta = jnp.array([0.2, -0.1, 0.3, 0.1])
    # central differences of re-optimised fits: their error is (stopping error of the fits) / eps + O(eps^2); at
    # eps = 1e-4 both are ~1e-8 here, at 1e-5 the fits' own stopping error (~1e-11 in q) alone reached 1e-5
    eps = 1e-4
    for weights in jnp.eye(3):  # envelope (log Z), implicit mean, implicit covariance
        _, grad = loss(theta, weights)
        fd = [(loss(theta + eps * e, weights)[0] - loss(theta - eps * e, weights)[0]) / (2 * eps) for e in np.eye(4)]
        np.testing.assert_allclose(grad, fd, rtol=1e-5, atol=1e-7)


# ---------------------------------------------------------------- many devices


def test_sharded_matches_single_device(sharded_run):
    stdout, stderr = sharded_run.communicate(timeout=600)
    assert sharded_run.returncode == 0, stderr[-3000:]
    out = json.loads(stdout.strip().splitlines()[-1])
    assert out["devices"] == 4
    rows, replicated = str(PartitionSpec("sites")), str(PartitionSpec())
    assert out["groups"] == [[200, 6], [2, 6]] and out["specs"] == [rows, replicated]
    assert all(out["converged"])
    np.testing.assert_allclose(out["log_z"][1], out["log_z"][0], rtol=1e-13)
    assert out["mean_diff"] < 1e-10 and out["d_diff"] < 1e-10
    np.testing.assert_allclose(out["bound_sharded"], out["bound_single"], rtol=1e-13)
    np.testing.assert_allclose(out["bound_chunked_sharded"], out["bound_single"], rtol=1e-13)
    # XLA inserted the cross-device sum: the sharded bound+gradient has an all-reduce, the single one none.
    assert out["all_reduce_ops"] >= 1 and out["all_reduce_ops_single"] == 0 and out["all_reduce_ops_hvp"] >= 1
    assert out["hvp_diff"] < 1e-9
    assert out["process_local_spec"] == rows and out["process_local_equal"]
    assert "no site axis 'batch'" in out["bad_axis_error"]
    assert out["batched_log_z_diff"] < 1e-10 and out["batched_spec"] == str(PartitionSpec("batch"))


@pytest.mark.extended   # benchmarks/gpu.py end to end on the CPU; gpu_check.sh runs it on a GPU
def test_gpu_benchmark_runs_on_the_cpu():
    """benchmarks/gpu.py is ready for an accelerator: its pieces run on the CPU (tiny sizes, float32) and it
    prints the paper's Chevron times for the Tables 2-4 cells with the paper's K."""
    import importlib.util
    import pathlib

    path = pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / "gpu.py"
    spec = importlib.util.spec_from_file_location("_bench_gpu", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    row = module.run_problem(20, 100, gk.factors.Chevron(rows=2), np.float32, minibatch=25)
    assert row["converged"] and np.isfinite(row["bound_per_site"]) and abs(row["minibatch_rel_gap"]) < 0.05
    vm = module.run_vmap(4, 5, 30, gk.factors.Diagonal(), np.float32)
    assert vm["max_abs_log_z_diff"] < 1e-3
    table, _ = module.problems(small=False)
    assert (1000, 5000, 100) in table and module.paper_chevron_time(1000, 5000, 50) == 75.23
