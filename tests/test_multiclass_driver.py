"""The multiclass fits on the package's one loop (`gkl_jax.solvers.iterate`): status and message on `Posterior` and
`SparsePosterior`, value reprs, `progress=`, and the bound against independent evaluations (the reference formula
of eq. 21 at the returned q, and Theorem 15: the sparse fit with every latent inducing is the full one)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import gkl_jax as gk
from gkl_jax.multiclass import _full, _site, _sparse
from gkl_jax.multiclass._blocks import blocks

N, C = 12, 3


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(N, 2))
    y = np.arange(N) % C
    return gk.kernels.SquaredExponential(2.0, 1.0), X, y


@pytest.fixture(scope="module")
def dense(data):
    return gk.multiclass.fit(*data)


def _prior(kernel, X):
    return _full.prior_covariance(kernel, jnp.asarray(X), C, None, 1e-6)


def test_converged_fit_reports_successful_status(dense):
    assert int(dense.status) == gk.RESULTS.successful and bool(dense.converged)
    assert dense.message == gk.RESULTS.message(gk.RESULTS.successful)
    k = int(dense.num_steps)
    hist = np.asarray(dense.history)
    assert hist.shape == (201,) and np.all(np.isfinite(hist[:k + 1])) and np.all(np.isnan(hist[k + 1:]))
    assert np.all(np.diff(hist[:k + 1]) >= 0)            # the ascent is monotone
    assert hist[k] == float(dense.log_z)


def test_repr_prints_values(dense):
    text = repr(dense)
    assert text.startswith("Posterior(log_z=-") and "status=successful" in text
    assert f"num_steps={int(dense.num_steps)}" in text and f"n={N}, C={C}" in text and "site='theorem6'" in text
    assert "f64[]" not in text and "i32[]" not in text


def test_max_steps_status_and_warning(data):
    with pytest.warns(UserWarning, match="max_steps_reached"):
        post = gk.multiclass.fit(*data, max_steps=1, tol=1e-15)
    assert int(post.status) == gk.RESULTS.max_steps_reached and not bool(post.converged)
    assert post.message.startswith("max_steps_reached: ")
    assert int(post.num_steps) == 1 and np.all(np.isfinite(np.asarray(post.history)))    # max_steps + 1 entries
    assert "status=max_steps_reached" in repr(post)


def test_sparse_status_both_ways(data):
    kernel, X, y = data
    inducing = np.arange(0, N * C, 2)
    post = gk.multiclass.fit_sparse(kernel, X, y, inducing)
    assert int(post.status) == gk.RESULTS.successful and bool(post.converged)
    assert repr(post).startswith("SparsePosterior(log_z=-") and f"num_inducing={inducing.size}" in repr(post)
    with pytest.warns(UserWarning, match="max_steps_reached"):
        short = gk.multiclass.fit_sparse(kernel, X, y, inducing, max_steps=1, tol=1e-15)
    assert int(short.status) == gk.RESULTS.max_steps_reached and not bool(short.converged)
    # the short fit's one sweep is the long fit's first (the same iteration from the same start)
    np.testing.assert_allclose(np.asarray(short.history), np.asarray(post.history)[:2], rtol=1e-12)


def test_status_from_converged_follows_the_loop_rule(dense):
    """The ML-II results build posteriors from `converged`: the status then follows `gkl_jax._status.status`."""
    fields = dict(Y=dense.Y, b=dense.b, S=dense.S, W=dense.W, V_blocks=dense.V_blocks, log_z=dense.log_z,
                  history=dense.history, stationarity=dense.stationarity)
    ok = _full.Posterior(converged=jnp.asarray(True), num_steps=dense.num_steps, **fields)
    short = _full.Posterior(converged=jnp.asarray(False), num_steps=jnp.asarray(200), **fields)
    stalled = _full.Posterior(converged=jnp.asarray(False), num_steps=jnp.asarray(3), **fields)
    assert [int(p.status) for p in (ok, short, stalled)] == [
        gk.RESULTS.successful, gk.RESULTS.max_steps_reached, gk.RESULTS.stalled]
    with pytest.raises(ValueError, match="status"):
        _full.Posterior(num_steps=dense.num_steps, **fields)


def test_bound_is_the_reference_formula_at_the_returned_q(data, dense):
    """log_z is eq. 21 evaluated by the dense textbook formula (`log_z_h`) at (m, V, b, S) of the result."""
    kernel, X, _ = data
    K = _prior(kernel, X)
    ref = _full.log_z_h(K, dense.Y, dense.mean(K), dense.covariance(K), dense.b, dense.S)
    np.testing.assert_allclose(float(ref), float(dense.log_z), rtol=1e-12)


def test_sparse_with_every_latent_inducing_is_the_full_fit(data):
    """Theorem 15 (Chai 2012): z = f (K_zz = K_zf = K_ff = K) gives the full bound and optimum."""
    kernel, X, y = data
    K = _prior(kernel, X)
    Y = jnp.eye(C)[y]
    full = _full.fit_full(K, Y)
    sparse = _sparse.fit_sparse(K, K, blocks(K, C), Y)
    assert bool(full.converged) and bool(sparse.converged)
    np.testing.assert_allclose(float(sparse.log_z), float(full.log_z), rtol=1e-10)
    np.testing.assert_allclose(np.asarray(sparse.b), np.asarray(full.b), atol=1e-5)


def test_progress_true_prints_sweeps(data, capsys):
    post = gk.multiclass.fit(*data, progress=True)
    err = capsys.readouterr().err
    assert "gkl_jax.multiclass.fit: BlockAscent step 1  bound -" in err
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"gkl_jax.multiclass.fit: BlockAscent step {int(post.num_steps)}  bound ")
    assert last.endswith("(successful)") and f"{float(post.log_z):.10g}" in last


def test_progress_callback_sees_every_sweep(data, dense):
    infos = []
    post = gk.multiclass.fit(*data, progress=infos.append)
    k = int(post.num_steps)
    assert float(post.log_z) == float(dense.log_z)          # progress changes nothing in the fit
    assert [i.step for i in infos] == list(range(1, k + 1)) + [k]
    assert [i.done for i in infos] == [False] * k + [True] and infos[-1].status == gk.RESULTS.successful
    np.testing.assert_array_equal([i.bound for i in infos[:k]], np.asarray(post.history)[1:k + 1])
    hist = np.asarray(post.history)
    rise = (hist[1:k + 1] - hist[:k]) / (1 + np.abs(hist[1:k + 1]))   # the stopping statistic, per sweep
    np.testing.assert_allclose([i.gradient for i in infos[:k]], rise, rtol=1e-6, atol=1e-15)
    sparse_infos = []
    sp = gk.multiclass.fit_sparse(*data, np.arange(0, N * C, 2), progress=sparse_infos.append)
    assert len(sparse_infos) == int(sp.num_steps) + 1 and sparse_infos[-1].done


class _Stop(Exception):
    pass


@pytest.mark.parametrize("sparse", [False, True])
def test_raising_callback_stops_the_fit_with_its_error(data, sparse):
    calls = []

    def callback(info):
        calls.append(info.step)
        if info.step == 2:
            raise _Stop("enough")

    with pytest.raises(_Stop, match="enough"):
        if sparse:
            gk.multiclass.fit_sparse(*data, np.arange(0, N * C, 2), progress=callback)
        else:
            gk.multiclass.fit(*data, progress=callback)
    assert calls == [1, 2]


@pytest.mark.parametrize("bad", ["yes", 3, 1.0])
def test_bad_progress_is_a_value_error_naming_it(data, bad):
    kernel, X, y = data
    with pytest.raises(ValueError, match="progress"):
        gk.multiclass.fit(kernel, X, y, progress=bad)
    with pytest.raises(ValueError, match="progress"):
        gk.multiclass.fit_sparse(kernel, X, y, [0, 1], progress=bad)
    with pytest.raises(ValueError, match="progress"):
        _full.fit_full(_prior(kernel, X), jnp.eye(C)[y], progress=bad)


def test_one_compilation_per_progress_callable(data):
    kernel, X, y = data
    callback = lambda info: None
    gk.multiclass.fit(kernel, X, y, progress=callback)
    gk.multiclass.fit(kernel, X, y)                     # both compiled here, whatever ran before in this worker
    before = _full.TRACE_COUNT["fit_full"]
    gk.multiclass.fit(kernel, X, y, progress=callback)
    gk.multiclass.fit(kernel, X, y)
    assert _full.TRACE_COUNT["fit_full"] == before      # no progress and this callable: both compiled already


def test_site_ascent_status_and_closed_form():
    """The per-datum site optimiser on the driver: Lemma 29's closed form at q = N(0, s2 I) (Chai 2012), b* = 1/C;
    one step short of it, max_steps_reached."""
    from gkl_jax.multiclass import _theory
    variance = 2.0
    opt = _site.optimise_site(jnp.zeros(C), variance * jnp.eye(C))
    assert int(opt.status) == gk.RESULTS.successful and bool(opt.converged)
    np.testing.assert_allclose(float(opt.value), float(_theory.isotropic_site_maximum(C, variance)), atol=1e-10)
    short = _site.optimise_site(jnp.zeros(C), variance * jnp.eye(C), tol=0.0, max_steps=1)
    assert int(short.status) == gk.RESULTS.max_steps_reached and int(short.num_steps) == 1
    batched = jax.vmap(lambda s: _site.optimise_site(jnp.zeros(C), s * jnp.eye(C)))(jnp.array([1.0, variance]))
    np.testing.assert_allclose(float(batched.value[1]), float(opt.value), rtol=1e-12)
