"""G-KL against the classic Gaussian approximations (papers/000 Section 5; thesis Ch. 3-4): Laplace, EP (and
power EP), the local variational bound (exact), the glm-ie double loop (K Lanczos vectors), with annealed
importance sampling (AIS) as the ground truth for log Z.

Models (prior N(0, I) unless stated; N_tst = 200 test points):
- logistic: Bayesian logistic regression, gk.datasets.synthetic_logistic (papers/000 Section 6.2.1), N = 2D.
- probit:   the same covariates with labels y ~ Phi(w^T x), N = 2D.
- slm:      sparse linear model, N(y | X w, 0.01 I) prod_d Laplace(w_d | 0, 0.2), no Gaussian prior, N = D/2
            noisy projections of a 20%-sparse w (X entries N(0, 1/D)).
- student:  robust regression, Student-t(y | x^T w, nu = 3, scale 0.5) with 10% gross outliers, N = 2D.

Per method: log Z (a lower bound for gkl and local, an estimate otherwise), its distance to AIS, the test
log-likelihood per test point (log E_q[p(y* | w)], 64-point Gauss-Hermite in the projection), the time of a
warm (compiled) call as process CPU seconds and wall seconds, the compile-inclusive first call, and whether the
method reports convergence. Every size also prints the G-KL minus local bound gap (>= 0 for log-concave sites,
papers/000 Section 5.1.2).

Usage:
    python benchmarks/baselines.py --quick                 # logistic, D = 10: ~30 s, almost all compilation
    python benchmarks/baselines.py --dims 50 200 1000      # what benchmarks/RESULTS_baselines.md records
    python benchmarks/baselines.py --dims 200 --models logistic slm --json out.json
"""

import argparse
import datetime
import json
import os
import platform
import sys
import time
import warnings

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
from jax.scipy.special import logsumexp  # noqa: E402

import gkl_jax as gk  # noqa: E402

P = gk.potentials
MODELS = ("logistic", "probit", "slm", "student")
METHODS = ("gkl", "local", "laplace", "ep", "ep0.9", "double_loop")


def make_problem(kind, dim, seed=0, num_test=200):
    """(model, test projections H*, test targets, potential constructor for the test sites)."""
    rng = np.random.default_rng(seed)
    if kind in ("logistic", "probit"):
        data = gk.datasets.synthetic_logistic(dim, 2 * dim, num_test, seed=seed)
        X, Xt = data["X_train"], data["X_test"]
        if kind == "logistic":
            y, yt, pot = data["y_train"], data["y_test"], P.Logistic
        else:
            from scipy.stats import norm
            lab = lambda Z: np.where(rng.uniform(size=len(Z)) < norm.cdf(Z @ data["w_true"]), 1.0, -1.0)
            y, yt, pot = lab(X), lab(Xt), P.Probit
        model = gk.Model(gk.priors.Isotropic(dim, 1.0), gk.Sites(X, pot(y)))
        return model, Xt, yt, pot
    if kind == "slm":
        n = max(dim // 2, 2)
        w = rng.laplace(scale=1.0, size=dim) * (rng.uniform(size=dim) < 0.2)
        X = rng.normal(size=(n + num_test, dim)) / np.sqrt(dim)
        y = X @ w + 0.1 * rng.normal(size=n + num_test)
        model = gk.Model(None, [gk.Sites(X[:n], P.Gaussian(y[:n], 0.01)),
                                gk.Sites(None, P.Laplace(np.zeros(dim), 0.2))])
        return model, X[n:], y[n:], lambda t: P.Gaussian(t, 0.01)
    if kind == "student":
        n = 2 * dim
        w = rng.normal(size=dim)
        X = rng.normal(size=(n + num_test, dim)) / np.sqrt(dim)
        noise = 0.3 * rng.normal(size=n + num_test)
        outliers = rng.uniform(size=n + num_test) < 0.1
        y = X @ w + np.where(outliers, 5 * rng.standard_t(1, size=n + num_test), noise)
        pot = lambda t: P.StudentT(t, 3.0, 0.5)
        model = gk.Model(gk.priors.Isotropic(dim, 1.0), gk.Sites(X[:n], pot(y[:n])))
        return model, X[n:], y[n:], pot
    raise ValueError(f"unknown model {kind!r}")


def test_log_likelihood(q, Xt, yt, pot):
    """mean_n log E_{q}[phi_n(x_n^T w)] by 64-point Gauss-Hermite in the projection."""
    z, wts = np.polynomial.hermite_e.hermegauss(64)
    m = Xt @ np.asarray(q.mean)
    s = np.sqrt(np.maximum(np.asarray(q.factor.project_variances(gk.operators.Dense(Xt))), 0.0))
    vals = np.asarray(pot(yt).log_phi(jnp.asarray(m[:, None] + s[:, None] * z[None, :]).T)).T
    return float(np.mean(logsumexp(vals + np.log(wts / wts.sum()), axis=1)))


def _timed(fn):
    c0, w0 = time.process_time(), time.perf_counter()
    out = fn()
    jax.block_until_ready(out)
    return out, time.process_time() - c0, time.perf_counter() - w0


def run_method(name, model, rank, key):
    if name == "gkl":
        return lambda: gk.fit(model)
    if name == "local":
        return lambda: gk.local(model)
    if name == "laplace":
        return lambda: gk.laplace(model)
    if name == "ep":
        return lambda: gk.ep(model)
    if name == "ep0.9":
        return lambda: gk.ep(model, power=0.9)
    if name == "double_loop":
        return lambda: gk.double_loop(model, rank=rank, key=key)
    raise ValueError(name)


def benchmark(kind, dim, methods, ais_chains, ais_temperatures, ais_max_dim, seed=0, single_run=False):
    model, Xt, yt, pot = make_problem(kind, dim, seed)
    rank = max(2, dim // 10)
    rows = {}
    for name in methods:
        if name == "laplace" and kind == "slm":
            rows[name] = {"skip": "Laplace potential is not twice differentiable"}
            continue
        fn = run_method(name, model, rank, jax.random.PRNGKey(seed))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                res, cpu, wall0 = _timed(fn)
                wall = wall0
                if not single_run:  # time a second, compiled call
                    res, cpu, wall = _timed(fn)
            except Exception as err:  # report, never hide, a failure
                rows[name] = {"skip": f"{type(err).__name__}: {err}"[:80]}
                continue
        rows[name] = {"log_z": float(res.log_z), "bound": res.is_bound, "converged": bool(res.converged),
                      "steps": int(res.num_steps), "tll": test_log_likelihood(res.q, Xt, yt, pot),
                      "cpu": cpu, "wall": wall, "first_wall": wall0}
    ais = None
    if dim <= ais_max_dim:
        start = gk.fit(model).q
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            res, cpu, wall = _timed(lambda: gk.ais(model, jax.random.PRNGKey(seed + 1), q=start,
                                                   num_chains=ais_chains, num_temperatures=ais_temperatures))
        ais = {"log_z": float(res.log_z), "stderr": float(res.stderr), "acceptance": float(res.acceptance),
               "ess": float(res.ess), "cpu": cpu, "wall": wall}
    return {"model": kind, "dim": dim, "num_train": int(sum(s.operator(dim).shape[0] for s in model.sites[:1])),
            "rank": rank, "methods": rows, "ais": ais}


def print_table(out):
    ais = out["ais"]
    head = (f"\n### {out['model']}  D = {out['dim']}, N = {out['num_train']}, double-loop K = {out['rank']}"
            + (f"; AIS log Z = {ais['log_z']:.3f} +- {ais['stderr']:.3f} (acc {ais['acceptance']:.2f}, "
               f"ESS {ais['ess']:.0f}, {ais['wall']:.1f} s)" if ais else "; AIS skipped"))
    print(head)
    print("| method | log Z | bound? | log Z - AIS | test ll / pt | cpu (s) | wall (s) | first call (s) | converged |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, r in out["methods"].items():
        if "skip" in r:
            print(f"| {name} | n/a | | | | | | | {r['skip']} |")
            continue
        diff = f"{r['log_z'] - ais['log_z']:+.3f}" if ais else "-"
        print(f"| {name} | {r['log_z']:.3f} | {'yes' if r['bound'] else 'no'} | {diff} | {r['tll']:.4f} | "
              f"{r['cpu']:.2f} | {r['wall']:.2f} | {r['first_wall']:.1f} | {r['converged']} ({r['steps']}) |")
    m = out["methods"]
    if "log_z" in m.get("gkl", {}) and "log_z" in m.get("local", {}):
        print(f"\nG-KL minus local bound: {m['gkl']['log_z'] - m['local']['log_z']:.4f}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="logistic, D = 10, small AIS (compile-dominated)")
    parser.add_argument("--dims", type=int, nargs="+", default=[50, 200, 1000])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    parser.add_argument("--ais-chains", type=int, default=64)
    parser.add_argument("--ais-temperatures", type=int, default=200)
    parser.add_argument("--ais-max-dim", type=int, default=1000)
    parser.add_argument("--single-run", action="store_true",
                        help="time only the first call (compilation included; for large D where it is negligible)")
    parser.add_argument("--json", help="also write the results to this JSON file")
    args = parser.parse_args(argv)
    if args.quick:
        args.dims, args.ais_chains, args.ais_temperatures = [10], 32, 50
        args.models = ["logistic"]
    print(f"# gkl-jax baselines  {datetime.datetime.now().isoformat(timespec='seconds')}  "
          f"{platform.node()} {platform.processor() or platform.machine()}  jax {jax.__version__} "
          f"{jax.devices()[0].platform}  load {os.getloadavg()[0]:.1f}")
    results = []
    for dim in args.dims:
        for kind in args.models:
            out = benchmark(kind, dim, args.methods, args.ais_chains, args.ais_temperatures, args.ais_max_dim,
                            single_run=args.single_run)
            print_table(out)
            sys.stdout.flush()
            results.append(out)
    print(f"\nload at the end {os.getloadavg()[0]:.1f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
