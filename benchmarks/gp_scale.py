"""Sparse GP classification and regression at N = 10^4, 10^5, 10^6: gkl-jax's minibatch fit
(`gk.gp.fit_sparse_minibatch`) beside GPJax's SVGP (`gpjax.fit` on the uncollapsed ELBO) and GPflow's (`SVGP`,
whitened, Adam through `tf.function`; where `--gpflow-python` exists) in the same run.

    python benchmarks/gp_scale.py                       # synthetic 10^4, 10^5 and the bundled sets
    python benchmarks/gp_scale.py --sizes 1000000       # the 10^6 cases (minutes each)
    python benchmarks/gp_scale.py --peer-python /work/venv-peers/bin/python

Each fit runs in its own subprocess (peak RSS from getrusage), ours with this interpreter and GPJax with
`--peer-python` (a separate virtual environment: `python -m venv venv-peers && venv-peers/bin/pip install gpjax`),
GPflow with `--gpflow-python` (`pip install gpflow tensorflow-cpu tensorflow-probability tf-keras` in another).
Both use the same data, M inducing inputs drawn at random from the training rows (each its own draw), minibatches
of B rows, the same number of Adam steps and learn the kernel (squared exponential) and the likelihood's noise
jointly. GPJax's binary likelihood is the probit (Bernoulli), so the synthetic labels are probit-generated (P(y = 1
| x) = Phi(2 f(x))): the peer's model is the true one; ours fits the logistic likelihood. Per fit: first fit
(compilation included), warm fit (the same call again), test log-likelihood (mean log p(y_* | x_*)), accuracy or
RMSE and peak RSS; for ours also the warm time of a fit with a quarter of the steps, and `time_to_peer_ll`: the
warm time of the cheapest of our two budgets whose test LL is at least the peer's final one. `gpjax.fit` traces and
compiles on every call, so its warm time includes compilation; its loop time is estimated from a second budget (a
quarter of the steps) as (t(S) - t(S/4)) * S / (S - S/4).
Results: printed as a Markdown table and written to benchmarks/results/gp_scale.json (the docs' results page).
"""

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent


def _latent(X):
    return np.sin(2 * X[:, 0]) + np.cos(1.5 * X[:, 1])


def synthetic(task, n, seed=0, n_test=10_000):
    from scipy.special import ndtr
    rng = np.random.default_rng(seed)
    X, Xt = rng.uniform(-3, 3, (n, 2)), rng.uniform(-3, 3, (n_test, 2))
    if task == "classification":
        draw = lambda A: np.where(rng.uniform(size=len(A)) < ndtr(2 * _latent(A)), 1.0, -1.0)
    else:
        draw = lambda A: _latent(A) + 0.3 * rng.standard_normal(len(A))
    return X, draw(X), Xt, draw(Xt)


def bundled(task, seed=0):
    """banknote authentication (1372 x 4, binary) or Boston housing (506 x 13, regression): the largest bundled
    sets of each kind; 70/30 split, inputs standardised, regression targets standardised."""
    sys.path.insert(0, str(HERE.parent))
    import gkl_jax as gk
    X, y, _ = gk.datasets.load("banknote" if task == "classification" else "housing")
    X, y = np.asarray(X, float), np.asarray(y, float)
    perm = np.random.default_rng(seed).permutation(len(y))
    cut = int(0.7 * len(y))
    tr, te = perm[:cut], perm[cut:]
    mu, sd = X[tr].mean(0), X[tr].std(0)
    X = (X - mu) / sd
    if task == "regression":
        y = (y - y[tr].mean()) / y[tr].std()
    return X[tr], y[tr], X[te], y[te]


def _summary(task, mean, var, yt, log_density):
    out = {"test_ll": float(np.mean(log_density))}
    if task == "classification":
        out["accuracy"] = float(np.mean(np.where(mean >= 0, 1.0, -1.0) == yt))
    else:
        out["rmse"] = float(np.sqrt(np.mean((mean - yt) ** 2)))
    return out


def run_ours(data, task, M, B, steps, fits="full"):
    import jax
    jax.config.update("jax_enable_x64", True)
    sys.path.insert(0, str(HERE.parent))
    import gkl_jax as gk
    X, y, Xt, yt = (data[k] for k in ("X", "y", "Xt", "yt"))
    lik = gk.potentials.Logistic(y) if task == "classification" else gk.potentials.Gaussian(y, 1.0)

    def fit(num_steps):
        start = time.perf_counter()
        with __import__("warnings").catch_warnings(record=True) as caught:
            __import__("warnings").simplefilter("always")
            f = gk.gp.fit_sparse_minibatch(gk.kernels.SquaredExponential(1.0, 1.0), X, lik, num_inducing=M,
                                           batch_size=B, num_steps=num_steps)
            jax.block_until_ready(f.result.log_z)
        seconds = time.perf_counter() - start
        means, variances, lds = [], [], []
        for s in range(0, len(yt), 2000):
            test = (gk.potentials.Logistic(yt[s:s + 2000]) if task == "classification"
                    else gk.potentials.Gaussian(yt[s:s + 2000], f.likelihood.variance))
            p = gk.gp.predict(f.result, f.prior, Xt[s:s + 2000], test)
            means.append(np.asarray(p.mean)), variances.append(np.asarray(p.variance))
            lds.append(np.asarray(p.log_density))
        out = _summary(task, np.concatenate(means), np.concatenate(variances), yt, np.concatenate(lds))
        out.update(seconds=seconds, bound_per_datum=float(f.result.log_z) / len(y),
                   converged=bool(f.result.converged), warned=bool(caught))
        return out

    first = fit(steps)
    if fits == "first":
        return {"first_fit_s": first["seconds"], **{k: v for k, v in first.items() if k != "seconds"}}
    warm = fit(steps)
    fit(max(1, steps // 4))                      # compiles the shorter budget
    quarter_warm = fit(max(1, steps // 4))
    return {"first_fit_s": first["seconds"], "warm_s": warm["seconds"], **{k: v for k, v in warm.items()
            if k != "seconds"}, "quarter": {"warm_s": quarter_warm["seconds"], "test_ll": quarter_warm["test_ll"]}}


def run_gpjax(data, task, M, B, steps, fits="full"):
    import jax
    jax.config.update("jax_enable_x64", True)
    import gpjax as gpx
    import jax.numpy as jnp
    import optax as ox
    from scipy.special import log_ndtr
    X, y, Xt, yt = (data[k] for k in ("X", "y", "Xt", "yt"))
    target = (y > 0).astype(float) if task == "classification" else y
    D = gpx.Dataset(X=jnp.asarray(X), y=jnp.asarray(target)[:, None])
    Z = X[np.random.default_rng(0).permutation(len(y))[:M]]

    def fit(key, steps=steps):
        start = time.perf_counter()
        lik = gpx.likelihoods.Bernoulli() if task == "classification" else gpx.likelihoods.Gaussian(obs_stddev=1.0)
        prior = gpx.gps.Prior(mean_function=gpx.mean_functions.Zero(), kernel=gpx.kernels.RBF())
        q = gpx.variational_families.VariationalGaussian(model=prior * lik, inducing_inputs=jnp.asarray(Z))
        qf, hist = gpx.fit(model=q, objective=lambda p, d: -gpx.objectives.elbo(p, d), train_data=D,
                           optim=ox.adam(1e-2), num_iters=steps, batch_size=B, verbose=False, key=key)
        jax.block_until_ready(hist)
        seconds = time.perf_counter() - start
        means, variances = [], []
        for s in range(0, len(yt), 2000):
            d = qf.predict(jnp.asarray(Xt[s:s + 2000]))
            means.append(np.asarray(d.mean).ravel()), variances.append(np.asarray(d.variance).ravel())
        mean, var = np.concatenate(means), np.concatenate(variances)
        if task == "classification":
            ld = log_ndtr(yt * mean / np.sqrt(1 + var))
        else:
            sd = qf.model.likelihood.obs_stddev
            noise = float(np.asarray(sd.unwrap() if hasattr(sd, "unwrap") else sd)) ** 2
            ld = -0.5 * (np.log(2 * np.pi * (var + noise)) + (yt - mean) ** 2 / (var + noise))
        out = _summary(task, mean, var, yt, ld)
        out.update(seconds=seconds, elbo_per_datum=-float(hist[-1]) / len(y))
        return out

    first = fit(jax.random.key(0))
    if fits == "first":
        return {"first_fit_s": first["seconds"], **{k: v for k, v in first.items() if k != "seconds"}}
    warm = fit(jax.random.key(0))
    quarter = fit(jax.random.key(0), max(1, steps // 4))
    # gpjax.fit traces and compiles anew on every call: its loop time is the difference of two budgets
    loop = (warm["seconds"] - quarter["seconds"]) * steps / max(1, steps - max(1, steps // 4))
    return {"first_fit_s": first["seconds"], "warm_s": warm["seconds"], "loop_s_estimate": loop,
            **{k: v for k, v in warm.items() if k != "seconds"}}


def run_gpflow(data, task, M, B, steps, fits="full"):
    """GPflow's SVGP (whitened, its default), Bernoulli (probit) or Gaussian likelihood, Adam(1e-2) on the ELBO of
    minibatches of B rows, the training step a `tf.function` (compiled once per fit)."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    os.environ["TF_USE_LEGACY_KERAS"] = "1"      # GPflow 2 needs the Keras 2 optimisers (tf-keras)
    import gpflow
    import tensorflow as tf
    from scipy.special import log_ndtr
    gpflow.config.set_default_float(np.float64)
    X, y, Xt, yt = (data[k] for k in ("X", "y", "Xt", "yt"))
    target = ((y > 0).astype(float) if task == "classification" else y)[:, None]
    Z = X[np.random.default_rng(0).permutation(len(y))[:M]]

    def fit(num_steps):
        start = time.perf_counter()
        tf.random.set_seed(0)
        lik = gpflow.likelihoods.Bernoulli() if task == "classification" else gpflow.likelihoods.Gaussian(1.0)
        model = gpflow.models.SVGP(gpflow.kernels.SquaredExponential(), lik, Z.copy(), num_data=len(y))
        batches = iter(tf.data.Dataset.from_tensor_slices((X, target)).repeat().shuffle(len(y), seed=0).batch(B))
        optimizer = tf.keras.optimizers.Adam(1e-2)
        loss = model.training_loss_closure(batches, compile=True)
        step = tf.function(lambda: optimizer.minimize(loss, model.trainable_variables))
        for _ in range(num_steps):
            step()
        seconds = time.perf_counter() - start
        mean, var = (np.asarray(a).ravel() for a in model.predict_f(Xt))
        if task == "classification":
            ld = log_ndtr(yt * mean / np.sqrt(1 + var))
        else:
            noise = float(model.likelihood.variance.numpy())
            ld = -0.5 * (np.log(2 * np.pi * (var + noise)) + (yt - mean) ** 2 / (var + noise))
        out = _summary(task, mean, var, yt, ld)
        out.update(seconds=seconds, elbo_per_datum=float(model.elbo((X, target)).numpy()) / len(y))
        return out

    first = fit(steps)
    if fits == "first":
        return {"first_fit_s": first["seconds"], **{k: v for k, v in first.items() if k != "seconds"}}
    warm = fit(steps)
    return {"first_fit_s": first["seconds"], "warm_s": warm["seconds"], **{k: v for k, v in warm.items()
            if k != "seconds"}}


def worker(args):
    data = dict(np.load(args.data))
    run = {"ours": run_ours, "gpjax": run_gpjax, "gpflow": run_gpflow}[args.worker]
    out = run(data, args.task, args.M, args.B, args.steps, args.fits)
    out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print("RESULT " + json.dumps(out), flush=True)


def _subprocess(python, path, name, task, M, B, steps, timeout, fits="full"):
    cmd = [python, str(Path(__file__).resolve()), "--worker", name, "--data", path, "--task", task,
           "--M", str(M), "--B", str(B), "--steps", str(steps), "--fits", fits]
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1"}
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout} s"}
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if not lines:
        return {"error": proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"exit {proc.returncode}"}
    return json.loads(lines[-1][len("RESULT "):])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="*", default=[10_000, 100_000])
    parser.add_argument("--tasks", nargs="*", default=["classification", "regression"])
    parser.add_argument("--bundled", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--M", type=int, default=200)
    parser.add_argument("--B", type=int, default=512)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--peer-python", default="/work/venv-peers/bin/python")
    parser.add_argument("--timeout", type=int, default=1800)
    parser.add_argument("--out", default=str(HERE / "results" / "gp_scale.json"))
    parser.add_argument("--fits", choices=["full", "first"], default="full",
                        help="first: only the first fit of each (for the 10^6 cases)")
    parser.add_argument("--gpflow-python", default="/work/venv-gpflow/bin/python",
                        help="GPflow's interpreter (skipped where it does not exist)")
    parser.add_argument("--worker", choices=["ours", "gpjax", "gpflow"])
    parser.add_argument("--data")
    parser.add_argument("--task")
    args = parser.parse_args()
    if args.worker:
        return worker(args)
    results = json.loads(Path(args.out).read_text()) if Path(args.out).exists() else {}
    cases = [(task, f"synthetic-{n}", n) for n in args.sizes for task in args.tasks]
    if args.bundled:
        cases += [(task, "bundled", None) for task in args.tasks]
    with tempfile.TemporaryDirectory() as tmp:
        for task, name, n in cases:
            X, y, Xt, yt = synthetic(task, n) if n else bundled(task)
            path = os.path.join(tmp, "data.npz")
            np.savez(path, X=X, y=y, Xt=Xt, yt=yt)
            M, B = min(args.M, len(y) // 4), min(args.B, len(y))
            row = {"task": task, "data": name, "n_train": len(y), "n_test": len(yt), "M": M, "B": B,
                   "steps": args.steps, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                   "load_1min": os.getloadavg()[0]}
            row["gpjax"] = _subprocess(args.peer_python, path, "gpjax", task, M, B, args.steps, args.timeout,
                                       args.fits)
            row["ours"] = _subprocess(sys.executable, path, "ours", task, M, B, args.steps, args.timeout, args.fits)
            if Path(args.gpflow_python).exists():
                row["gpflow"] = _subprocess(args.gpflow_python, path, "gpflow", task, M, B, args.steps,
                                            args.timeout, args.fits)
            ours, peer = row["ours"], row["gpjax"]
            if "error" not in ours and "error" not in peer and args.fits == "full":
                row["time_to_peer_ll_s"] = _time_to(ours, peer["test_ll"])
                hit = row["time_to_peer_ll_s"]
                row["time_ratio_vs_peer_warm"] = None if hit is None else hit / peer["warm_s"]
                row["time_ratio_vs_peer_loop"] = None if hit is None else hit / peer["loop_s_estimate"]
            flow = row.get("gpflow", {"error": "not run"})
            if "error" not in ours and "error" not in flow and args.fits == "full":
                row["time_to_gpflow_ll_s"] = _time_to(ours, flow["test_ll"])
                hit = row["time_to_gpflow_ll_s"]
                row["time_ratio_vs_gpflow_warm"] = None if hit is None else hit / flow["warm_s"]
            results[f"{task}/{name}"] = row
            print(json.dumps(row), flush=True)
            Path(args.out).write_text(json.dumps(results, indent=1) + "\n")
    print(table(results))


def _time_to(ours, test_ll):
    """The warm time of the cheaper of our two budgets whose test LL is at least `test_ll`, or None."""
    rungs = [(ours["quarter"]["warm_s"], ours["quarter"]["test_ll"]), (ours["warm_s"], ours["test_ll"])]
    hits = [t for t, ll in rungs if ll >= test_ll]
    return min(hits) if hits else None


def table(results):
    """The results as a Markdown table (GPflow's columns "-" where it was not run)."""
    lines = ["| task | data | N | M | test LL: ours / GPJax / GPflow | acc or RMSE: ours / GPJax / GPflow | "
             "first / warm (s): ours | GPJax (loop) | GPflow | ours to GPJax's / GPflow's LL (s) | "
             "peak RSS (MB): ours / GPJax / GPflow |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    nan = float("nan")
    for row in results.values():
        o, p, g = row["ours"], row["gpjax"], row.get("gpflow", {"error": "not run"})
        if "error" in o or "error" in p:
            lines.append(f"| {row['task']} | {row['data']} | {row['n_train']} | {row['M']} | "
                         f"{o.get('error', '')} {p.get('error', '')} |||||||")
            continue
        metric = "accuracy" if row["task"] == "classification" else "rmse"
        g = {} if "error" in g else g

        def to(key):
            value = row.get(key)
            return "-" if "warm_s" not in o or key not in row else "not reached" if value is None else f"{value:.1f}"

        lines.append(f"| {row['task']} | {row['data']} | {row['n_train']} | {row['M']} | "
                     f"{o['test_ll']:.4f} / {p['test_ll']:.4f} / {g.get('test_ll', nan):.4f} | "
                     f"{o[metric]:.4f} / {p[metric]:.4f} / {g.get(metric, nan):.4f} | "
                     f"{o['first_fit_s']:.1f} / {o.get('warm_s', nan):.1f} | "
                     f"{p['first_fit_s']:.1f} / {p.get('warm_s', nan):.1f} "
                     f"(loop {p.get('loop_s_estimate', nan):.1f}) | "
                     f"{g.get('first_fit_s', nan):.1f} / {g.get('warm_s', nan):.1f} | "
                     f"{to('time_to_peer_ll_s')} / {to('time_to_gpflow_ll_s')} | "
                     f"{o['peak_rss_mb']:.0f} / {p['peak_rss_mb']:.0f} / {g.get('peak_rss_mb', nan):.0f} |")
    return "\n".join(lines)

if __name__ == "__main__":
    main()
