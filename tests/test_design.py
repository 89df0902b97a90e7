"""Design scores, the sparse linear model, MAP and the sequential loop, against dense Gaussian oracles."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import gaussian_log_evidence

import gkl_jax as gk
from gkl_jax.design._sequential import padded_measurement_sites
from gkl_jax.factors._full import upper_factor_of_inverse


def random_q(rng, dim, spread=1.0):
    """A Gaussian with a dense, anisotropic covariance (Full factor) and its covariance matrix."""
    A = rng.normal(size=(dim, dim)) * np.exp(spread * rng.normal(size=dim))
    S = A @ A.T / dim + 0.05 * np.eye(dim)
    C = upper_factor_of_inverse(jnp.asarray(np.linalg.inv(S)))
    return gk.Gaussian(jnp.asarray(rng.normal(size=dim)), gk.factors.Full(C)), S


def entropy_drop(S, M, v2):
    """Exact 1/2 log det S - 1/2 log det S', S' = (S^-1 + M^T M / v2)^-1."""
    S_post = np.linalg.inv(np.linalg.inv(S) + M.T @ M / v2)
    return 0.5 * (np.linalg.slogdet(S)[1] - np.linalg.slogdet(S_post)[1])


def test_information_gain_is_the_gaussian_entropy_difference(rng):
    """For a Gaussian model the fitted q is the exact posterior, and IG(M*) equals the entropy drop of the exact
    posterior after adding the rows M* (whatever y* is)."""
    D, N, v2 = 5, 3, 0.1
    X, y = rng.normal(size=(N, D)), rng.normal(size=N)
    model = gk.Model(gk.priors.Isotropic(D, 2.0), gk.Sites(X, gk.potentials.Gaussian(y, v2)))
    res = gk.fit(model)
    _, _, cov = gaussian_log_evidence(X, y, v2, 2.0 * np.eye(D))
    np.testing.assert_allclose(res.q.covariance(), cov, atol=1e-8)
    M_star = rng.normal(size=(2, D))
    X2 = np.concatenate([X, M_star])
    _, _, cov2 = gaussian_log_evidence(X2, np.zeros(N + 2), v2, 2.0 * np.eye(D))
    exact = 0.5 * (np.linalg.slogdet(cov)[1] - np.linalg.slogdet(cov2)[1])
    np.testing.assert_allclose(gk.design.information_gain(res, M_star, v2), exact, rtol=1e-8)
    # the Gaussian's own entropy difference, and the paper's form 1/2 log det(M S M^T + v2 I) + c
    q2 = gk.Gaussian(res.q.mean, gk.factors.Full(upper_factor_of_inverse(jnp.asarray(np.linalg.inv(cov2)))))
    np.testing.assert_allclose(res.q.entropy() - q2.entropy(), exact, rtol=1e-8)
    paper = 0.5 * np.linalg.slogdet(M_star @ cov @ M_star.T + v2 * np.eye(2))[1] - np.log(v2)
    np.testing.assert_allclose(exact, paper, rtol=1e-10)
    # single rows: the per-candidate scores
    gains = gk.design.candidate_gains(res.q, M_star, v2)
    np.testing.assert_allclose(gains, [entropy_drop(cov, M_star[i:i + 1], v2) for i in range(2)], rtol=1e-8)
    np.testing.assert_allclose(gk.design.information_gain(res.q, M_star[0], v2), gains[0], rtol=1e-10)


def test_free_design_maximises_the_gain_over_unit_rows(rng):
    """Brute force: the designed unit row beats every one of many random unit rows (and matches the top
    eigenvector of S); the greedy block's gains add up to its joint gain and beat random blocks."""
    D, v2 = 4, 0.05
    q, S = random_q(rng, D)
    rows, gains = gk.design.optimal_directions(q, 3, v2, num_vectors=D)
    np.testing.assert_allclose(np.linalg.norm(rows, axis=1), 1.0, rtol=1e-10)
    cand = rng.normal(size=(20000, D))
    cand /= np.linalg.norm(cand, axis=1, keepdims=True)
    brute = 0.5 * np.log1p(np.einsum("nd,de,ne->n", cand, S, cand) / v2)
    best = float(gk.design.information_gain(q, rows[0], v2))
    assert best >= brute.max() - 1e-12
    np.testing.assert_allclose(best, 0.5 * np.log1p(np.linalg.eigvalsh(S)[-1] / v2), rtol=1e-10)
    np.testing.assert_allclose(gains[0], best, rtol=1e-10)
    joint = float(gk.design.information_gain(q, rows, v2))
    np.testing.assert_allclose(np.sum(gains), joint, rtol=1e-8)
    np.testing.assert_allclose(joint, entropy_drop(S, np.asarray(rows), v2), rtol=1e-8)
    blocks = cand[:3000].reshape(1000, 3, D)
    random_joint = [entropy_drop(S, B, v2) for B in blocks]
    assert joint >= max(random_joint) - 1e-10


def test_design_scores_every_method_on_the_sparse_linear_model(rng):
    """The scores take the Result of every inference method on the same sparse linear model (G-KL with Full and
    Subspace factors, power EP, the double loop, VB): the gain equals the entropy drop of that result's own dense
    covariance, and the designed row reaches the top eigenvalue's gain."""
    D, N, v2 = 8, 5, 0.05
    model = gk.design.sparse_linear_model(rng.normal(size=(N, D)), rng.normal(size=N), v2,
                                          gk.operators.Identity(D), gk.potentials.Laplace(0.0, 0.5))
    M_star = rng.normal(size=(2, D))
    results = {"full": gk.fit(model), "subspace": gk.fit(model, factor=gk.factors.Subspace(rank=3)),
               "ep": gk.ep(model, power=0.9),
               "double_loop": gk.double_loop(model, rank=4), "local": gk.local(model)}
    for name, res in results.items():
        S = np.asarray(gk.design.as_gaussian(res).covariance())
        np.testing.assert_allclose(gk.design.information_gain(res, M_star, v2), entropy_drop(S, M_star, v2),
                                   rtol=1e-5, err_msg=name)
        _, gains = gk.design.optimal_directions(res, 1, v2)
        np.testing.assert_allclose(gains[0], 0.5 * np.log1p(np.linalg.eigvalsh(S)[-1] / v2), rtol=1e-8,
                                   err_msg=name)


def test_leading_directions_match_eigh_with_few_lanczos_vectors(rng):
    D = 120
    q, S = random_q(rng, D, spread=1.5)
    lam, U = gk.design.leading_directions(q, 3, num_vectors=40)
    w, V = np.linalg.eigh(S)
    np.testing.assert_allclose(lam, w[::-1][:3], rtol=1e-6)
    np.testing.assert_allclose(np.abs(np.sum(np.asarray(U) * V[:, ::-1][:, :3].T, axis=1)), 1.0, atol=1e-5)


def test_greedy_pool_equals_explicit_conditioning(rng):
    """Greedy over a pool: each pick is the argmax of the single-row gain under q conditioned on the earlier
    picks (dense oracle), and the gains sum to the joint gain. Works for any factor (here Diagonal) and for
    operator pools (a wavelet transform's rows)."""
    D, P, v2 = 6, 9, 0.1
    q, S = random_q(rng, D)
    pool = rng.normal(size=(P, D))
    idx, gains = gk.design.greedy_selection(q, pool, 4, v2)
    Sc = S.copy()
    for t in range(4):
        single = 0.5 * np.log1p(np.einsum("nd,de,ne->n", pool, Sc, pool) / v2)
        assert int(idx[t]) == int(np.argmax(single))
        np.testing.assert_allclose(gains[t], single.max(), rtol=1e-8)
        x = pool[idx[t]]
        Sc = Sc - np.outer(Sc @ x, Sc @ x) / (v2 + x @ Sc @ x)
    np.testing.assert_allclose(np.sum(gains), gk.design.information_gain(q, pool[np.asarray(idx)], v2), rtol=1e-8)

    d = rng.uniform(0.1, 1.0, size=16)
    q_diag = gk.Gaussian(jnp.zeros(16), gk.factors.Diagonal(jnp.asarray(d)))
    W = gk.operators.Wavelet2D(4, 4, levels=1, wavelet="haar")
    idx, gains = gk.design.greedy_selection(q_diag, W, 2, v2)
    Wd = np.asarray(W.as_matrix())
    single = 0.5 * np.log1p((Wd ** 2) @ d ** 2 / v2)
    assert int(idx[0]) == int(np.argmax(single))
    np.testing.assert_allclose(gains[0], single.max(), rtol=1e-10)


def test_bad_inputs_name_the_argument(rng):
    q, _ = random_q(rng, 4)
    with pytest.raises(ValueError, match="M_star"):
        gk.design.information_gain(q, np.ones((2, 5)), 0.1)
    with pytest.raises(ValueError, match="noise_variance"):
        gk.design.information_gain(q, np.ones((2, 4)), 0.0)
    with pytest.raises(ValueError, match="noise_variance"):
        gk.design.optimal_directions(q, 2, -1.0)
    with pytest.raises(ValueError, match="candidates"):
        gk.design.candidate_gains(q, np.ones((3, 3)), 0.1)
    with pytest.raises(ValueError, match="result_or_q"):
        gk.design.information_gain(np.eye(4), np.ones(4), 0.1)
    with pytest.raises(ValueError, match="measurements"):
        gk.design.sparse_linear_model(np.ones((2, 3)), np.ones(2), 0.1, gk.operators.Identity(4),
                                      gk.potentials.Laplace(0.0, 1.0))
    with pytest.raises(ValueError, match="noise_variance"):
        gk.design.sparse_linear_model(np.ones((2, 4)), np.ones(2), 0.0, gk.operators.Identity(4),
                                      gk.potentials.Laplace(0.0, 1.0))
    base = gk.Model(None, gk.Sites(gk.operators.Identity(4), gk.potentials.Laplace(0.0, 1.0)))
    with pytest.raises(ValueError, match="M0"):
        gk.design.sequential(base, lambda r: r.sum(1), np.ones((2, 5)), np.ones(2), 0.1, steps=1)
    with pytest.raises(ValueError, match="noise_variance"):
        gk.design.sequential(base, lambda r: r.sum(1), np.ones((2, 4)), np.ones(2), -0.1, steps=1)


def fista_map(M, y, v2, tau, iters=20000):
    """Oracle: the Laplace-prior MAP argmin ||M w - y||^2 / (2 v2) + ||w||_1 / tau by FISTA (exact prox)."""
    L = np.linalg.norm(M, 2) ** 2 / v2
    x = z = np.zeros(M.shape[1])
    t = 1.0
    for _ in range(iters):
        u = z - M.T @ (M @ z - y) / (v2 * L)
        x_new = np.sign(u) * np.maximum(np.abs(u) - 1 / (tau * L), 0)
        t_new = (1 + np.sqrt(1 + 4 * t * t)) / 2
        z, x, t = x_new + (t - 1) / t_new * (x_new - x), x_new, t_new
    return x


def test_map_estimate_matches_fista(rng):
    D, N, tau, v2 = 24, 10, 0.2, 0.005
    M = rng.normal(size=(N, D))
    M /= np.linalg.norm(M, axis=1, keepdims=True)
    w = rng.laplace(0, tau, D)
    y = M @ w + np.sqrt(v2) * rng.normal(size=N)
    model = gk.design.sparse_linear_model(M, y, v2, gk.operators.Identity(D), gk.potentials.Laplace(0.0, tau))
    assert model.prior is None and len(model.sites) == 2
    w_map, ok = gk.design.map_estimate(model)
    assert bool(ok)
    ref = fista_map(M, y, v2, tau)
    np.testing.assert_allclose(w_map, ref, atol=2e-3)


def test_padding_rows_are_inert(rng):
    """Zero rows with variance 1/(2 pi) add exactly 0 to the bound (and nothing to its gradient)."""
    D, N, v2 = 8, 3, 0.01
    M, y = rng.normal(size=(N, D)), rng.normal(size=N)
    filt = gk.Sites(gk.operators.FiniteDifference2D(2, 4), gk.potentials.Laplace(0.0, 0.3))
    plain = gk.Model(None, [gk.Sites(M, gk.potentials.Gaussian(y, v2)), filt])
    padded = gk.Model(None, [padded_measurement_sites(M, y, v2, N + 5), filt])
    q, _ = random_q(rng, D)
    value_and_grad = jax.jit(jax.value_and_grad(gk.bound, argnums=1))
    (b1, g1), (b2, g2) = value_and_grad(plain, q), value_and_grad(padded, q)
    np.testing.assert_allclose(b1, b2, rtol=1e-12)
    np.testing.assert_allclose(g1.mean, g2.mean, rtol=1e-10, atol=1e-12)


def test_sequential_loop_records_and_compiles_once(rng):
    """A tiny image design loop: steps, shapes, unit rows, callback per step, one compilation of the fit, and
    designed rows beating random ones in information gain under the same posterior."""
    from gkl_jax import _fit

    side, v2, tau = 4, 0.005, 0.2
    D = side * side
    w = rng.laplace(0, tau, D)
    base = gk.Model(None, [gk.Sites(gk.operators.Identity(D), gk.potentials.Laplace(0.0, tau))])
    M0 = rng.normal(size=(3, D))
    M0 /= np.linalg.norm(M0, axis=1, keepdims=True)
    y0 = M0 @ w + np.sqrt(v2) * rng.normal(size=3)
    calls, seen = [], []

    def measure(rows):
        calls.append(rows.shape)
        return rows @ w + np.sqrt(v2) * rng.normal(size=len(rows))

    def callback(step):
        seen.append((step.step, step.num_measurements, dict(_fit.TRACE_COUNT)["fit"]))

    out = gk.design.sequential(base, measure, M0, y0, v2, steps=3, per_step=2, factor=gk.factors.Full(),
                               callback=callback, progress=False)
    assert [s[:2] for s in seen] == [(0, 3), (1, 5), (2, 7), (3, 9)]
    assert seen[-1][2] == seen[0][2]  # no retrace after the first fit
    assert calls == [(2, D)] * 3
    assert out.measurements.shape == (9, D) and out.observations.shape == (9,)
    np.testing.assert_allclose(np.linalg.norm(out.measurements[3:], axis=1), 1.0, rtol=1e-8)
    last = out.steps[-2]
    assert last.rows.shape == (2, D) and last.gains.shape == (2,)
    random_rows = rng.normal(size=(200, D))
    random_rows /= np.linalg.norm(random_rows, axis=1, keepdims=True)
    assert last.gains[0] >= float(jnp.max(gk.design.candidate_gains(last.result, random_rows, v2)))
    # a candidate pool and a user-supplied inference callable plug into the same loop (same shapes: no retrace)
    pool = np.eye(D)
    out2 = gk.design.sequential(base, measure, M0, y0, v2, steps=3, per_step=2, design=pool, progress=False,
                                infer=lambda model, q0: gk.fit(model, factor=gk.factors.Full(), q0=q0))
    rows = out2.measurements[3:]
    assert np.all(np.sort(np.abs(rows), axis=1)[:, -1] == 1.0)


def _benchmark(name):
    import importlib.util
    import pathlib

    path = pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"_bench_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.extended   # the benchmark script end to end; the design module's own tests run by default
def test_sed_synthetic_quick(tmp_path):
    results = _benchmark("sed_synthetic").main(["--quick", "--out", str(tmp_path)])
    r = results["signals"]["laplace"]
    assert set(r["errors"]) == {"gkl", "map"} and len(r["errors"]["gkl"]["mean"]) == len(r["N"]) == 3
    assert all(np.isfinite(r["errors"][m]["mean"]).all() for m in r["errors"])
    assert (tmp_path / "sed_synthetic_quick.json").exists() and (tmp_path / "sed_synthetic_quick.png").exists()


@pytest.mark.extended   # the benchmark script end to end; the design module's own tests run by default
def test_sed_images_quick(tmp_path):
    results = _benchmark("sed_images").main(["--quick", "--out", str(tmp_path)])
    run = results["runs"][0]
    assert run["N"] == [20, 23, 26] and len(run["map"]) == 3
    assert run["gkl"][-1] < run["gkl"][0]  # measurements reduce the error
    assert (tmp_path / "sed_images_quick_panels.png").exists()
