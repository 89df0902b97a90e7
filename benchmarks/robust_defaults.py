"""Robust defaults (issue 35, item 5): which fit strategy converges to the best bound for non-log-concave sites
(Student-t, Cauchy, a non-concave `Custom`) under a GP prior.

Grid (27 cases, `cases()`; 25 ran in the recorded run, benchmarks/RESULTS_robust.md): the issue's case (60
inputs on [-4, 4], y = sin x + 0.1 noise, 6 targets moved by +-4, StudentT(y, 3, 0.1), SE variance 1 lengthscale
1, jitter 1e-8) on two seeds; an L9 orthogonal array over
noise scale {0.01, 0.1, 1} x lengthscale {0.1, 1, 10} x outlier fraction {0, 5%, 20%} x N {20, 60, 200} for
Student-t (dof 3) and for Cauchy sites; three cases at N = 500; two contaminated-Gaussian `Custom` cases; two
sparse GPs (30 inducing inputs, general H). Data: y = sin x + s e, e ~ N(0, 1), a fraction of the targets moved
by +-4; the site scale is s. Every GP uses SquaredExponential(1, lengthscale), jitter 1e-8.

Candidates (`strategies` below): the site-precision solver on signed W ("site-precision", the GP cases only); the
default before (Newton-CG in (m, C)); whitened
Newton-CG; whitened L-BFGS; whitened L-BFGS to tol 1e-3 then whitened Newton; Newton, whitened Newton and
whitened L-BFGS started from `gk.local`'s q (their times include `local`'s). The reference `best` is the largest
bound of {whitened L-BFGS, the local-started fits}; `gap` = best - log_z (positive: below the reference).
Warm time is the second call of the first case of each shape (later cases of that shape run once, compiled);
from N = 200 on only the whitened methods run, a new shape's first call is its time (marked c) and `local` runs
100 EM steps (1000 below); at N = 500 no local-started fit runs;
`first` is the first call (compilation included where the shape is new). `--cold` also measures, for the issue's
case, each strategy's first call in a fresh process (the cold compile a user waits for).

Run:  python benchmarks/robust_defaults.py                 (all 27 cases; over an hour on the loaded 2-core machine)
      python benchmarks/robust_defaults.py --quick         (the issue's case and 3 small ones)
      python benchmarks/robust_defaults.py --cold          (cold first-call time per strategy, fresh processes)
      python benchmarks/robust_defaults.py --linear        (non-dense priors and issue 60's regression)
      python benchmarks/robust_defaults.py --hard 40       (issue 63's hard robust-GP tier)
Writes benchmarks/out/robust_defaults.json (or --out).
"""

import argparse
import json
import os
import subprocess
import sys
import time
import warnings

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import gkl_jax as gk  # noqa: E402


def strategies():
    """name -> (needs_local, fn(model, q_local) -> Result): the candidate defaults compared. "default" is what
    `gk.fit(model)` runs for these models (`gk.solvers.Chain((LBFGS(tol=1e-2), Newton()))`, whitened, since
    2026-11-28); "lbfgs-w+newton-w" the same chain with `Chain`'s hand-over at sqrt(tol) (the default before);
    "newton" the default before that (Newton-CG in (m, C), unwhitened)."""
    S = gk.solvers
    return {
        "default": (False, lambda m, q: gk.fit(m)),
        "newton": (False, lambda m, q: gk.fit(m, solver=S.Newton(), whiten=False)),
        "newton-w": (False, lambda m, q: gk.fit(m, solver=S.Newton(), whiten=True)),
        "lbfgs-w": (False, lambda m, q: gk.fit(m, solver=S.LBFGS(), whiten=True)),
        "lbfgs-w+newton-w": (False, lambda m, q: gk.fit(m, solver=S.Chain((S.LBFGS(), S.Newton())), whiten=True)),
        "local>newton": (True, lambda m, q: gk.fit(m, q0=q, solver=S.Newton(), whiten=False)),
        "local>newton-w": (True, lambda m, q: gk.fit(m, q0=q, solver=S.Newton(), whiten=True)),
        "local>lbfgs-w": (True, lambda m, q: gk.fit(m, q0=q, solver=S.LBFGS(), whiten=True)),
        "site-precision": (False, lambda m, q: gk.fit(m, solver=S.SitePrecision())),
    }


IDENTITY_SITES_ONLY = ("site-precision",)
"""Strategies that need h_n = e_n (not run on the sparse GPs)."""

JITTER = 1e-8
L9 = [(0, 0, 0, 0), (0, 1, 1, 1), (0, 2, 2, 2), (1, 0, 1, 2), (1, 1, 2, 0), (1, 2, 0, 1), (2, 0, 2, 1),
      (2, 1, 0, 2), (2, 2, 1, 0)]
SCALES, LENGTHSCALES, OUTLIERS, SIZES = (0.01, 0.1, 1.0), (0.1, 1.0, 10.0), (0.0, 0.05, 0.2), (20, 60, 200)
BIG = 200          # from this N on: the --big-methods only, no second (warm) call of a new shape, local 100 steps
HUGE = 500         # from this N on: no local-started fits (`local` alone took 200 s at N = 200, 1000 steps)
LOCAL_STEPS_BIG = 100
REFERENCE = ("lbfgs-w", "local>newton", "local>newton-w", "local>lbfgs-w")


def _contaminated(r):
    """log of 0.8 N(r; 0, 0.1^2) + 0.2 N(r; 0, 3^2), r = f - y: a non-log-concave Gaussian mixture site."""
    a = jnp.log(0.8) - 0.5 * jnp.square(r / 0.1) - jnp.log(0.1)
    b = jnp.log(0.2) - 0.5 * jnp.square(r / 3.0) - jnp.log(3.0)
    return jnp.logaddexp(a, b) - 0.5 * jnp.log(2 * jnp.pi)


CONTAMINATED = gk.potentials.Custom(_contaminated, center=0.0, width=0.1)


def cases():
    """The grid: a list of dicts (id, sites, N, scale, lengthscale, outliers, seed, kind)."""
    out = [dict(id=f"issue-s{s}", sites="studentt", N=60, scale=0.1, lengthscale=1.0, outliers=0.1, seed=s,
                kind="issue") for s in (0, 1)]
    for sites, seed0 in (("studentt", 10), ("cauchy", 20)):
        for i, (a, b, c, d) in enumerate(L9):
            out.append(dict(id=f"{sites[:1]}{i}", sites=sites, N=SIZES[d], scale=SCALES[a],
                            lengthscale=LENGTHSCALES[b], outliers=OUTLIERS[c], seed=seed0 + i, kind="gp"))
    for i, (ls, o) in enumerate(((1.0, 0.1), (0.3, 0.2))):
        out.append(dict(id=f"custom{i}", sites="custom", N=60, scale=0.1, lengthscale=ls, outliers=o, seed=40 + i,
                        kind="gp"))
    for i, (sites, s, ls, o) in enumerate((("studentt", 0.1, 1.0, 0.1), ("cauchy", 0.1, 0.5, 0.2))):
        out.append(dict(id=f"sparse{i}", sites=sites, N=200, scale=s, lengthscale=ls, outliers=o, seed=50 + i,
                        kind="sparse"))
    for i, (sites, s, ls, o) in enumerate((("studentt", 0.1, 1.0, 0.1), ("cauchy", 0.01, 0.1, 0.2),
                                           ("studentt", 1.0, 10.0, 0.05))):
        out.append(dict(id=f"big{i}", sites=sites, N=500, scale=s, lengthscale=ls, outliers=o, seed=30 + i,
                        kind="gp"))
    return out


def build(case):
    """The model of a grid case."""
    rng = np.random.default_rng(case["seed"])
    N, s = case["N"], case["scale"]
    X = np.linspace(-4, 4, N) if case["kind"] == "issue" else np.sort(rng.uniform(-4, 4, N))
    y = np.sin(X) + s * rng.standard_normal(N)
    k = int(round(case["outliers"] * N))
    if k:
        idx = rng.choice(N, k, replace=False)
        y[idx] += rng.choice([-4.0, 4.0], k)
    kernel = gk.kernels.SquaredExponential(1.0, case["lengthscale"])
    if case["sites"] == "custom":
        # the fixed function of the residual r = f - y (one compilation per N): offset -y
        return gk.Model(gk.priors.GP(kernel, X[:, None], jitter=JITTER),
                        gk.Sites(None, CONTAMINATED, offset=-y))
    lik = gk.potentials.StudentT(y, 3.0, s) if case["sites"] == "studentt" else gk.potentials.Cauchy(y, s)
    if case["kind"] == "sparse":
        Z = np.linspace(-4, 4, 30)[:, None]
        return gk.gp.sparse_model(kernel, X[:, None], Z, lik, jitter=JITTER)
    return gk.gp.model(kernel, X[:, None], lik, jitter=JITTER)


def _timed(fn):
    t = time.perf_counter()
    r = fn()
    jax.block_until_ready(r.log_z)
    return r, time.perf_counter() - t


def run_case(case, methods, seen):
    """Every method on one case: {method: dict(log_z, converged, steps, first, warm)}."""
    model = build(case)
    shape = (case["sites"], case["N"], case["kind"])
    rerun = case["N"] < BIG   # else a new shape's first call (compilation included) is reported as its time
    rows = {}
    q_local = None
    if any(strategies()[m][0] for m in methods):
        if case["sites"] == "custom" or case["kind"] == "sparse":
            t_local = None          # `local` has no tangent bound for a Custom potential, no variance_offset
        else:
            steps = 1000 if rerun else LOCAL_STEPS_BIG
            loc, t_local = _timed(lambda: gk.local(model, max_steps=steps))
            if ("local",) + shape not in seen:
                seen.add(("local",) + shape)
                if rerun:
                    loc, t_local = _timed(lambda: gk.local(model, max_steps=steps))
            q_local = loc.q
            rows["local"] = dict(log_z=float(loc.log_z), converged=bool(loc.converged), steps=int(loc.num_steps),
                                 first=None, warm=t_local)
    for name in methods:
        needs_local, fn = strategies()[name]
        if (needs_local and q_local is None) or (name in IDENTITY_SITES_ONLY and case["kind"] == "sparse"):
            continue
        r, first = _timed(lambda: fn(model, q_local))
        warm, compiled = first, False
        if (name,) + shape not in seen:
            seen.add((name,) + shape)
            if rerun:
                r, warm = _timed(lambda: fn(model, q_local))
            else:
                compiled = True
        extra = t_local if needs_local else 0.0
        rows[name] = dict(log_z=float(r.log_z), converged=bool(r.converged), steps=int(r.num_steps),
                          first=first + extra, warm=warm + extra, compile_included=compiled)
    ref = [rows[m]["log_z"] for m in REFERENCE if m in rows and np.isfinite(rows[m]["log_z"])]
    best = max(ref) if ref else float("nan")
    for name, row in rows.items():
        row["gap"] = best - row["log_z"]
    return dict(case=case, best=best, methods=rows)


def cold(methods):
    """Seconds of the first call of each strategy on the issue's case, each in a fresh process."""
    out = {}
    for name in methods:
        code = (f"import sys; sys.argv=['x']; import benchmarks.robust_defaults as b; print(b._cold_one({name!r}))")
        res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        out[name] = float(res.stdout.strip().splitlines()[-1]) if res.returncode == 0 else None
        print(f"cold {name:18s} {out[name]}", flush=True)
    return out


def _cold_one(name):
    warnings.simplefilter("ignore")
    model = build(cases()[0])
    if name == "local":
        return _timed(lambda: gk.local(model))[1]
    needs_local, fn = strategies()[name]
    q = gk.local(model).q if needs_local else None       # local's own compile not counted here
    return _timed(lambda: fn(model, q))[1]


def table(results):
    lines = [f"{'case':9s} {'sites':8s} {'N':>4s} {'s':>5s} {'ls':>5s} {'out':>4s}  {'method':17s} "
             f"{'gap':>10s} {'conv':>4s} {'steps':>5s} {'warm s':>7s}"]
    for res in results:
        c = res["case"]
        for name, row in res["methods"].items():
            lines.append(f"{c['id']:9s} {c['sites']:8s} {c['N']:4d} {c['scale']:5g} {c['lengthscale']:5g} "
                         f"{c['outliers']:4.2f}  {name:17s} {row['gap']:10.3g} {str(row['converged'])[0]:>4s} "
                         f"{row['steps']:5d} {row['warm']:7.2f}{'c' if row.get('compile_included') else ''}")
    return "\n".join(lines)


def summary(results):
    """Per method: cases within 1e-3 of best, cases converged, median and total warm time."""
    names = sorted({m for r in results for m in r["methods"]})
    lines = [f"{'method':17s} {'cases':>5s} {'<=1e-3':>6s} {'conv':>4s} {'ok&conv':>7s} {'worst gap':>10s} "
             f"{'median warm':>11s} {'total warm':>10s}"]
    for m in names:
        rows = [r["methods"][m] for r in results if m in r["methods"]]
        gaps = np.array([row["gap"] for row in rows])
        ok = gaps <= 1e-3
        conv = np.array([row["converged"] for row in rows])
        warm = np.array([row["warm"] for row in rows])
        lines.append(f"{m:17s} {len(rows):5d} {int(ok.sum()):6d} {int(conv.sum()):4d} {int((ok & conv).sum()):7d} "
                     f"{np.nanmax(gaps):10.3g} {np.median(warm):11.2f} {warm.sum():10.1f}")
    return "\n".join(lines)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="the issue's case and 3 small cases")
    p.add_argument("--cold", action="store_true", help="cold first-call time per strategy (fresh processes)")
    p.add_argument("--methods", default=",".join(strategies()), help="comma-separated strategy names")
    p.add_argument("--only", default="", help="comma-separated case ids")
    p.add_argument("--show", action="store_true", help="print the table and summary of --out, run nothing")
    p.add_argument("--linear", action="store_true", help="only the robust linear regressions (Isotropic prior)")
    p.add_argument("--hard", type=int, default=0, help="only the first HARD robust-GP cases (issue 63; 40 in all)")
    p.add_argument("--hard-from", type=int, default=0, help="with --hard: skip the cases before this one")
    p.add_argument("--append", action="store_true", help="keep the results in --out, run only the cases not there")
    p.add_argument("--big-methods", default="newton-w,lbfgs-w,lbfgs-w+newton-w,local>newton-w,local>lbfgs-w",
                   help="the methods run at N >= 200 (unwhitened Newton takes 200 steps of up to 100 CG products "
                        "there: minutes per fit on the shared machine)")
    p.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "out",
                                                 "robust_defaults.json"))
    args = p.parse_args()
    warnings.simplefilter("ignore")
    methods = [m for m in args.methods.split(",") if m]
    unknown = [m for m in methods if m not in strategies()]
    if unknown:
        print(f"robust_defaults: unknown method(s) {unknown}; choose from {list(strategies())}", file=sys.stderr)
        sys.exit(2)
    if args.show:
        with open(args.out) as f:
            old = json.load(f)
        print(table(old["results"]) + "\n\n" + summary(old["results"]))
        print("\ncold first call (s):", old.get("cold_first_call_s"))
        return
    from robust_tiers import run_hard, run_linear  # benchmarks/ is on the path when run as a script

    if args.hard:
        results = run_hard(args.hard, args.hard_from)
        print(summary(results))
        path = args.out.replace(".json", "_hard.json")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            json.dump(dict(machine="shared 2-core CPU (timings noisy)", results=results), f, indent=1)
        return
    if args.linear:
        results = run_linear()
        print(summary(results))
        path = args.out.replace(".json", "_linear.json")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            json.dump(dict(machine="shared 2-core CPU (timings noisy)", results=results), f, indent=1)
        return
    grid = cases()
    if args.quick:
        grid = [c for c in grid if c["id"] in ("issue-s0", "s0", "c0", "custom0")]
    if args.only:
        grid = [c for c in grid if c["id"] in args.only.split(",")]
    out = dict(machine="shared 2-core CPU (timings noisy)", jax=jax.__version__, methods=methods)
    if args.cold:
        out["cold_first_call_s"] = cold(methods)
    results, seen = [], set()
    if args.append and os.path.exists(args.out):
        with open(args.out) as f:
            old = json.load(f)
        results = old.get("results", [])
        out.update({k: v for k, v in old.items() if k not in out and k != "results"})
        done = {r["case"]["id"] for r in results}
        grid = [c for c in grid if c["id"] not in done]
    big = [m for m in args.big_methods.split(",") if m in methods]
    grid.sort(key=lambda c: c["N"])     # the cheap cases first
    for case in grid:
        t = time.perf_counter()
        todo = methods if case["N"] < BIG else big if case["N"] < HUGE else [m for m in big if "local" not in m]
        res = run_case(case, todo, seen)
        results.append(res)
        print(table([res]).split("\n", 1)[1], f"\n  ({time.perf_counter() - t:.0f} s)", flush=True)
        out["results"] = results
        os.makedirs(os.path.dirname(args.out), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)
    print(table(results))
    print()
    print(summary(results))


if __name__ == "__main__":
    main()
