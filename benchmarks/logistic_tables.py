"""Structured G-KL factors on synthetic Bayesian logistic regression: papers/000 Section 6.2, Tables 2, 3 and 4.

For each dimension D, training-set size N_trn in {D/2, D, 5D} and size K in {0.05 D, 0.1 D}, `--repeats` data sets
from `gk.datasets.synthetic_logistic` (N_tst = 10 D) are fitted with Chevron(rows=K), Banded(bandwidth=K),
Subspace(rank=K) and FactorAnalysis(rank=K) (its default Heywood start, and `fa-random`: start="random", the
paper's), plus Diagonal and (for D <= --full-max-dim) Full, to
max|grad B| <= 1e-3 (the paper's stopping rule). Printed per cell, as mean +- standard error over the data sets,
beside the paper's values:

- time (s): the compiled fit (the first fit of each shape is a warm-up that compiles; its extra time is reported
  as `compile`). `cpu` is the process CPU time of the fit, `wall` the elapsed time: on a shared machine the CPU
  time is the better estimate of the wall time on an idle one.
- B/N: the bound per training point.
- ||m - w||/D: ||m - w_tr||_2 / D (and, in the JSON, ||m - w_tr||_2^2 / D).
- tll/N: sum_n log E_q[sigma(y_n w^T x_n)] / N_tst over the test set (64-point Gauss-Hermite in s_n).

Usage:
    python benchmarks/logistic_tables.py --quick                     # one small cell, < 30 s
    python benchmarks/logistic_tables.py --dims 250 500 --repeats 3  # what benchmarks/RESULTS_factors.md records
    python benchmarks/logistic_tables.py --memory                    # Chevron(50), D = 20,000, sparse H: peak RSS
    python benchmarks/logistic_tables.py --dims 250 --numpyro        # also NumPyro SVI (AutoLowRankMultivariateNormal)
"""

import argparse
import datetime
import json
import os
import platform
import resource
import sys
import time

# One OpenBLAS thread (LAPACK calls: Cholesky, eigh, triangular solves), set before numpy or scipy load it:
# XLA already spreads a fit over the cores, and OpenBLAS workers spinning after each small LAPACK call take
# cores from it. On 2 cores, FactorAnalysis at D = 1000 / N = 5000 / K = 50 took 15.0 s with the default and
# 8.8 s with this (benchmarks/README §2).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402

# (D, N_trn, K) -> {factor: (time, B/N, ||m - w||/D, tll/N)}, each (mean, standard error); papers/000 Tables 2-4.
_T = {
    250: ((125, 250, 1250), (13, 25), {
        "chevron": ["0.14 0.01 0.16 0.00 0.32 0.02 0.34 0.01 3.31 0.09 3.38 0.14",
                    "-1.08 0.02 -1.05 0.02 -0.89 0.01 -0.87 0.01 -0.41 0.00 -0.40 0.00",
                    "1.48 0.01 1.48 0.01 1.38 0.01 1.38 0.01 1.11 0.01 1.11 0.01",
                    "-0.57 0.01 -0.56 0.01 -0.47 0.01 -0.47 0.01 -0.19 0.00 -0.19 0.00"],
        "banded": ["0.21 0.01 0.28 0.01 0.41 0.01 0.53 0.01 4.05 0.09 4.64 0.09",
                   "-1.05 0.02 -1.00 0.01 -0.88 0.01 -0.85 0.01 -0.41 0.00 -0.40 0.00",
                   "1.48 0.01 1.48 0.01 1.38 0.01 1.38 0.01 1.11 0.01 1.11 0.01",
                   "-0.56 0.01 -0.56 0.01 -0.47 0.01 -0.46 0.01 -0.19 0.00 -0.19 0.00"],
        "subspace": ["0.42 0.05 0.46 0.02 0.69 0.03 0.81 0.04 4.24 0.15 5.17 0.28",
                     "-2.93 0.01 -2.11 0.02 -1.83 0.01 -1.43 0.01 -0.60 0.00 -0.52 0.00",
                     "1.49 0.01 1.48 0.01 1.43 0.01 1.41 0.01 1.20 0.01 1.18 0.01",
                     "-0.67 0.02 -0.63 0.02 -0.57 0.02 -0.54 0.02 -0.21 0.01 -0.20 0.01"],
        "fa": ["0.75 0.05 0.74 0.05 0.94 0.08 1.12 0.08 6.18 0.61 5.49 0.40",
               "-1.08 0.02 -1.06 0.02 -0.89 0.01 -0.87 0.01 -0.40 0.00 -0.39 0.00",
               "1.48 0.01 1.48 0.01 1.38 0.01 1.38 0.01 1.11 0.01 1.11 0.01",
               "-0.57 0.01 -0.57 0.01 -0.48 0.01 -0.47 0.01 -0.19 0.00 -0.19 0.00"]}),
    500: ((250, 500, 2500), (25, 50), {
        "chevron": ["0.49 0.02 0.69 0.08 1.25 0.04 1.36 0.04 16.50 0.89 17.31 0.82",
                    "-1.19 0.01 -1.15 0.01 -0.93 0.01 -0.91 0.01 -0.42 0.00 -0.41 0.00",
                    "0.88 0.00 0.87 0.00 0.84 0.00 0.84 0.00 0.64 0.00 0.64 0.00",
                    "-0.58 0.01 -0.58 0.01 -0.50 0.01 -0.49 0.01 -0.18 0.00 -0.18 0.00"],
        "banded": ["0.96 0.02 1.37 0.02 2.25 0.10 4.06 0.29 24.31 0.96 29.60 1.18",
                   "-1.15 0.01 -1.09 0.01 -0.92 0.01 -0.88 0.01 -0.42 0.00 -0.41 0.00",
                   "0.87 0.00 0.87 0.00 0.84 0.00 0.84 0.00 0.64 0.00 0.64 0.00",
                   "-0.58 0.01 -0.57 0.01 -0.50 0.01 -0.49 0.01 -0.18 0.00 -0.18 0.00"],
        "subspace": ["0.73 0.01 0.93 0.03 1.41 0.03 1.93 0.04 11.89 0.54 15.26 1.02",
                     "-3.08 0.02 -2.20 0.01 -1.90 0.01 -1.46 0.01 -0.62 0.00 -0.54 0.00",
                     "0.88 0.00 0.87 0.01 0.87 0.00 0.86 0.00 0.71 0.00 0.70 0.00",
                     "-0.72 0.02 -0.65 0.02 -0.63 0.01 -0.59 0.01 -0.20 0.00 -0.20 0.00"],
        "fa": ["2.05 0.26 2.29 0.21 2.92 0.17 3.47 0.17 20.06 1.51 22.69 2.70",
               "-1.19 0.01 -1.17 0.01 -0.93 0.01 -0.91 0.01 -0.41 0.00 -0.40 0.00",
               "0.88 0.00 0.87 0.01 0.84 0.00 0.84 0.00 0.64 0.00 0.64 0.00",
               "-0.58 0.01 -0.58 0.01 -0.51 0.01 -0.50 0.01 -0.18 0.00 -0.18 0.00"]}),
    1000: ((500, 1000, 5000), (50, 100), {
        "chevron": ["2.68 0.04 3.37 0.05 6.41 0.11 7.28 0.14 75.23 1.51 78.38 2.10",
                    "-1.28 0.01 -1.24 0.01 -0.99 0.00 -0.96 0.00 -0.42 0.00 -0.41 0.00",
                    "0.53 0.00 0.53 0.00 0.49 0.00 0.49 0.00 0.38 0.00 0.38 0.00",
                    "-0.62 0.01 -0.61 0.01 -0.51 0.01 -0.49 0.01 -0.18 0.00 -0.18 0.00"],
        "banded": ["6.66 0.58 8.97 0.14 12.81 0.15 20.59 0.26 127.69 2.36 190.65 3.47",
                   "-1.24 0.01 -1.17 0.01 -0.98 0.00 -0.94 0.00 -0.42 0.00 -0.42 0.00",
                   "0.53 0.00 0.53 0.00 0.49 0.00 0.49 0.00 0.38 0.00 0.38 0.00",
                   "-0.61 0.01 -0.59 0.01 -0.50 0.01 -0.49 0.01 -0.18 0.00 -0.18 0.00"],
        "subspace": ["1.59 0.07 2.58 0.12 3.24 0.03 7.71 0.20 56.67 1.80 75.35 1.63",
                     "-5.40 0.23 -4.54 0.25 -7.56 0.00 -1.52 0.00 -0.62 0.00 -0.54 0.00",
                     "0.56 0.00 0.55 0.00 0.56 0.00 0.50 0.00 0.44 0.00 0.43 0.00",
                     "-0.62 0.01 -0.61 0.01 -0.69 0.00 -0.61 0.01 -0.21 0.00 -0.21 0.00"],
        "fa": ["9.94 1.00 12.24 0.63 16.21 0.74 18.64 1.09 70.87 3.92 82.13 5.83",
               "-1.29 0.01 -1.26 0.01 -1.00 0.00 -0.97 0.00 -0.42 0.00 -0.41 0.00",
               "0.53 0.00 0.53 0.00 0.49 0.00 0.49 0.00 0.38 0.00 0.38 0.00",
               "-0.62 0.01 -0.61 0.01 -0.52 0.01 -0.51 0.01 -0.18 0.00 -0.18 0.00"]}),
}
METRICS = ("time", "bound", "error", "tll")


def paper_value(D, N, K, factor):
    """{metric: (mean, se)} from papers/000 Tables 2-4, or None where the paper has no such cell."""
    factor = "fa" if factor == "fa-random" else factor
    if D not in _T or factor not in _T[D][2]:
        return None
    sizes, ks, rows = _T[D]
    if N not in sizes or K not in ks:
        return None
    col = 2 * (2 * sizes.index(N) + ks.index(K))
    return {m: tuple(float(x) for x in rows[factor][i].split()[col:col + 2]) for i, m in enumerate(METRICS)}


def make_factor(gk, name, K):
    return {"chevron": lambda: gk.factors.Chevron(K), "banded": lambda: gk.factors.Banded(K),
            "subspace": lambda: gk.factors.Subspace(K), "fa": lambda: gk.factors.FactorAnalysis(K),
            "fa-random": lambda: gk.factors.FactorAnalysis(K, start="random"),
            "diagonal": lambda: gk.factors.Diagonal(), "full": lambda: gk.factors.Full()}[name]()


def test_log_likelihood(gk, q, X, y, num_points=64):
    """sum_n log E_q[sigma(y_n w^T x_n)] with q's marginal N(m_n, s_n^2) on each projection (Gauss-Hermite)."""
    import jax.numpy as jnp

    m = np.asarray(X @ np.asarray(q.mean))
    s = np.sqrt(np.maximum(np.asarray(q.factor.project_variances(gk.operators.Dense(jnp.asarray(X)))), 0.0))
    z, w = np.polynomial.hermite_e.hermegauss(num_points)
    w = w / w.sum()
    a = y[:, None] * (m[:, None] + s[:, None] * z[None, :])
    return float(np.sum(np.log(np.sum(w * 0.5 * (1 + np.tanh(0.5 * a)), axis=1))))


def run_cell(gk, D, N, K, factors, repeats, seed0, dtype, numpyro_budget, num_points=None):
    import jax
    import jax.numpy as jnp

    out = {}
    datasets = [gk.datasets.synthetic_logistic(D, N, 10 * D, seed=seed0 + r) for r in range(repeats)]
    models = [gk.Model(gk.priors.Isotropic(D, jnp.asarray(1.0, dtype)),
                       gk.Sites(jnp.asarray(d["X_train"], dtype),
                                gk.potentials.Logistic(jnp.asarray(d["y_train"], dtype),
                                                       **({} if num_points is None else {"num_points": num_points}))))
              for d in datasets]
    for name in factors:
        rows = []
        t0 = time.perf_counter()
        jax.block_until_ready(gk.fit(models[0], factor=make_factor(gk, name, K), tol=1e-3).log_z)  # compile
        first = time.perf_counter() - t0
        for data, model in zip(datasets, models):
            c0, t0 = time.process_time(), time.perf_counter()
            res = gk.fit(model, factor=make_factor(gk, name, K), tol=1e-3)
            jax.block_until_ready(res.log_z)
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
            err = np.asarray(res.q.mean, np.float64) - data["w_true"]
            rows.append(dict(wall=wall, cpu=cpu, bound=float(res.log_z) / N, error=np.linalg.norm(err) / D,
                             error_sq=float(err @ err) / D, converged=bool(res.converged), steps=int(res.num_steps),
                             tll=test_log_likelihood(gk, res.q, data["X_test"], data["y_test"]) / (10 * D)))
        out[name] = dict(rows=rows, compile=max(first - np.median([r["wall"] for r in rows]), 0.0))
        print_row(D, N, K, name, out[name], flush=True)
        if name == "fa" and numpyro_budget:
            out["numpyro"] = numpyro_svi(gk, models[0], K, float(out[name]["rows"][0]["bound"]) * N,
                                         np.mean([r["wall"] for r in rows]), numpyro_budget)
            print(f"    numpyro SVI AutoLowRankMVN(rank={K}): {out['numpyro']}", flush=True)
    return out


def mean_se(values):
    values = np.asarray(values, float)
    se = values.std(ddof=1) / np.sqrt(len(values)) if len(values) > 1 else float("nan")
    return float(values.mean()), float(se)


def print_row(D, N, K, name, cell, flush=False):
    rows = cell["rows"]
    ours = {"time": mean_se([r["cpu"] for r in rows]), "wall": mean_se([r["wall"] for r in rows]),
            "bound": mean_se([r["bound"] for r in rows]), "error": mean_se([r["error"] for r in rows]),
            "tll": mean_se([r["tll"] for r in rows])}
    paper = paper_value(D, N, K, name)
    fmt = lambda ms, p=3: f"{ms[0]:.{p}f}+-{ms[1]:.{p}f}"
    text = (f"D={D:5d} N={N:5d} K={K:4d} {name:9s} cpu {fmt(ours['time'])} s wall {fmt(ours['wall'])} s "
            f"(compile {cell['compile']:.1f} s) B/N {fmt(ours['bound'])} err {fmt(ours['error'], 4)} "
            f"tll {fmt(ours['tll'])} conv {sum(r['converged'] for r in rows)}/{len(rows)} "
            f"steps {np.mean([r['steps'] for r in rows]):.0f}")
    if paper:
        speed = paper["time"][0] / max(ours["wall"][0], 1e-9)  # wall against wall (the paper's were wall times)
        speed_cpu = paper["time"][0] / max(ours["time"][0], 1e-9)
        text += (f" | paper: time {fmt(paper['time'], 2)} (x{speed:.1f} wall, x{speed_cpu:.1f} cpu) "
                 f"B/N {fmt(paper['bound'], 2)} "
                 f"err {fmt(paper['error'], 2)} tll {fmt(paper['tll'], 2)}")
    print(text, flush=flush)


def numpyro_svi(gk, model, rank, our_bound, our_time, budget_s):
    """NumPyro SVI (Adam, AutoLowRankMultivariateNormal of the same rank) on the same model. Its q is in the
    FactorAnalysis family, so its exact ELBO is our bound at its q (no Monte Carlo noise in the comparison).
    Returns the wall time until that ELBO is within 1% of `our_bound` (compiled steps only), or the best after
    `budget_s` seconds."""
    import jax
    import jax.numpy as jnp
    import numpyro
    import numpyro.distributions as dist
    from numpyro.infer import SVI, Trace_ELBO
    from numpyro.infer.autoguide import AutoLowRankMultivariateNormal

    X = model.sites[0].H.matrix
    y01 = (model.sites[0].potential.y + 1) / 2
    D = X.shape[1]

    def npmodel():
        w = numpyro.sample("w", dist.Normal(jnp.zeros(D), 1.0).to_event(1))
        numpyro.sample("y", dist.Bernoulli(logits=X @ w), obs=y01)

    guide = AutoLowRankMultivariateNormal(npmodel, rank=rank)
    svi = SVI(npmodel, guide, numpyro.optim.Adam(0.01), Trace_ELBO())
    state = svi.init(jax.random.PRNGKey(0))
    chunk = 200

    @jax.jit
    def advance(state):
        return jax.lax.fori_loop(0, chunk, lambda _, s: svi.update(s)[0], state)

    @jax.jit
    def exact_elbo(params):
        loc, W, diag = params["auto_loc"], params["auto_cov_factor"], params["auto_scale"]
        q = gk.Gaussian(loc, gk.factors.FactorAnalysis(rank, W * diag[:, None], diag))
        return gk.bound(model, q)

    jax.block_until_ready(advance(state))
    target = our_bound - 0.01 * abs(our_bound)
    elapsed, best, steps, reached = 0.0, -np.inf, 0, None
    while elapsed < budget_s:
        t0 = time.perf_counter()
        state = jax.block_until_ready(advance(state))
        elapsed += time.perf_counter() - t0
        steps += chunk
        best = max(best, float(exact_elbo(svi.get_params(state))))
        if best >= target:
            reached = elapsed
            break
    return dict(rank=rank, our_bound=our_bound, best_elbo=best, steps=steps, seconds=elapsed,
                seconds_to_1pct=reached, ratio_to_our_fa_time=(reached / our_time) if reached else None)


def memory_run(gk, dim=20000, num=50000, per_row=20, rows=50, max_steps=None):
    """Chevron(rows) fit on a sparse BCOO H (num x dim, per_row non-zeros a row): peak RSS of this process."""
    import jax
    import jax.numpy as jnp
    from jax.experimental import sparse as jsparse

    rng = np.random.default_rng(0)
    w = rng.normal(size=dim)
    cols = rng.integers(0, dim, size=(num, per_row))
    vals = rng.normal(size=(num, per_row)) / np.sqrt(per_row)
    logits = np.sum(vals * w[cols], axis=1)
    y = np.where(rng.uniform(size=num) < 1 / (1 + np.exp(-logits)), 1.0, -1.0)
    idx = np.stack([np.repeat(np.arange(num), per_row), cols.ravel()], axis=1)
    H = jsparse.BCOO((jnp.asarray(vals.ravel()), jnp.asarray(idx)), shape=(num, dim))
    model = gk.Model(gk.priors.Isotropic(dim, 1.0), gk.Sites(H, gk.potentials.Logistic(jnp.asarray(y))))
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    t0, c0 = time.perf_counter(), time.process_time()
    res = gk.fit(model, factor=gk.factors.Chevron(rows), tol=1e-3, max_steps=max_steps)
    jax.block_until_ready(res.log_z)
    return dict(dim=dim, num=num, per_row=per_row, rows=rows, bound=float(res.log_z), converged=bool(res.converged),
                steps=int(res.num_steps), wall_s=time.perf_counter() - t0, cpu_s=time.process_time() - c0,
                rss_before_fit_mb=rss0, peak_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                dense_DxD_mb=8 * dim * dim / 2 ** 20)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dims", type=int, nargs="+", default=[250])
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--sizes", type=float, nargs="+", default=[0.5, 1.0, 5.0], help="N_trn / D")
    p.add_argument("--ks", type=float, nargs="+", default=[0.05, 0.1], help="K / D")
    p.add_argument("--factors", nargs="+", default=None,
                   help="default: chevron banded subspace fa fa-random diagonal full (--quick: chevron diagonal)")
    p.add_argument("--full-max-dim", type=int, default=500)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--float32", action="store_true")
    p.add_argument("--num-points", type=int, default=None,
                   help="quadrature nodes of the logistic sites (default: the library's, 48; runs before 2026-11-25 "
                        "13:55 used 64)")
    p.add_argument("--quick", action="store_true", help="one small cell (D=100, N=50, K=5, 2 data sets, Chevron and "
                   "Diagonal unless --factors is given)")
    p.add_argument("--memory", action="store_true", help="the D=20,000 Chevron(50) sparse-H fit; peak RSS")
    p.add_argument("--memory-max-steps", type=int, default=None)
    p.add_argument("--numpyro", type=float, default=0.0, metavar="SECONDS",
                   help="also run NumPyro SVI for up to SECONDS per cell (first data set)")
    p.add_argument("--json", default=None, help="write the raw results here")
    args = p.parse_args(argv)

    import jax

    if not args.float32:
        jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp

    import gkl_jax as gk

    dtype = jnp.float32 if args.float32 else jnp.float64
    header = dict(command=" ".join([os.path.basename(sys.executable)] + sys.argv),
                  date=datetime.datetime.now().isoformat(timespec="seconds"),
                  machine=f"{platform.machine()} {os.cpu_count()} cores, {platform.processor()}",
                  jax=jax.__version__, dtype=str(jnp.dtype(dtype)),
                  num_points=args.num_points or gk.potentials.Logistic(jnp.ones(1)).num_points,
                  loadavg_start=os.getloadavg(), openblas_threads=os.environ.get("OPENBLAS_NUM_THREADS"),
                  affinity=sorted(os.sched_getaffinity(0)))
    print(json.dumps(header), flush=True)
    results = dict(header=header, cells=[])
    if args.memory:
        results["memory"] = memory_run(gk, max_steps=args.memory_max_steps)
        print(json.dumps(results["memory"]), flush=True)
    else:
        cells = ([(100, 50, 5)] if args.quick else
                 [(D, int(s * D + 0.5), int(k * D + 0.5)) for D in args.dims for s in args.sizes for k in args.ks])
        repeats = 2 if args.quick else args.repeats
        chosen = args.factors or (["chevron", "diagonal"] if args.quick else
                                  ["chevron", "banded", "subspace", "fa", "fa-random", "diagonal", "full"])
        for D, N, K in cells:
            factors = [f for f in chosen if f != "full" or D <= args.full_max_dim]
            cell = run_cell(gk, D, N, K, factors, repeats, args.seed, dtype, args.numpyro, args.num_points)
            results["cells"].append(dict(D=D, N=N, K=K, load=os.getloadavg(), factors=cell))
    results["header"]["loadavg_end"] = os.getloadavg()
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(results, fh, indent=1, default=float)
    return results


if __name__ == "__main__":
    main()
