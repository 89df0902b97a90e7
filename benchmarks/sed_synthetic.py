"""Sequential experimental design for sparse synthetic signals (papers/000 Section 6.3.3, Figure 8).

Signals w in R^D (D = 512) with independent Laplace (tau = 0.2: exp(-|w|/tau) / 2 tau) or Student-t (nu = 3,
sigma^2 = 0.027) entries; m0 = 40 random unit-norm measurements; noise v^2 = 0.005; B = I with the generating
density as the potential (the model matches the data). Each design step adds `--per-step` rows chosen by the
greedy free design (leading eigenvectors of the posterior covariance, `gk.design.optimal_directions`) under
G-KL (Full factor, tol 0.01 as in the paper), the local variational bound (VB, `gk.local`) and power EP
(eta = 0.9, `gk.ep`; Laplace only, as in the paper), and by random unit rows for the MAP reference. Reports the
l2 error ||E[w] - w_true|| (MAP: ||w_MAP - w_true||) versus the number of measurements, mean and standard
error over `--repeats` signals, and the inference times at D = 512, N = 110 beside the paper's.

    python benchmarks/sed_synthetic.py --repeats 25          # the paper's setting (hours on a laptop CPU)
    python benchmarks/sed_synthetic.py --quick               # < 30 s smoke run (tests)

Writes benchmarks/out/sed_synthetic.{json,png}.
"""

import argparse
import importlib
import json
import os
import sys
import time

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import gkl_jax as gk  # noqa: E402
from gkl_jax.design._sequential import padded_measurement_sites  # noqa: E402

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "out")
PAPER_TIMES = {"laplace": {"gkl": 1.6, "ep": 0.6, "vb": 0.3}, "student": {"gkl": 6.0, "vb": 0.3}}
LABELS = {"gkl": "G-KL (designed)", "vb": "VB local (designed)", "ep": "power EP 0.9 (designed)",
          "map": "MAP (random)"}


def baseline(name):
    """gk.<name> (issue 4 exports it at top level; fall back to gk.baselines)."""
    fn = getattr(gk, name, None) or getattr(gk.baselines, name, None)
    if fn is None:  # until the baselines are re-exported
        fn = getattr(importlib.import_module(f"gkl_jax.baselines._{name}"), name)
    return fn


def inference(method, tol):
    """infer(model, q0) -> Result for the design loop."""
    if method == "gkl":
        return lambda model, q0: gk.fit(model, factor=gk.factors.Full(), q0=q0, tol=tol)
    if method == "vb":
        local = baseline("local")
        return lambda model, q0: local(model, tol=1e-6)  # relative bound change (default 1e-10)
    if method == "ep":
        ep = baseline("ep")
        return lambda model, q0: ep(model, power=0.9, tol=1e-4)  # relative site change (default 1e-8)
    raise ValueError(f"unknown method {method!r}")


def signal_model(kind, dim):
    """(potential, sampler(rng, n)) for the generating density."""
    if kind == "laplace":
        tau = 0.2
        return gk.potentials.Laplace(0.0, tau), lambda rng, n: rng.laplace(0.0, tau, n)
    if kind == "student":
        scale = float(np.sqrt(0.027))
        return gk.potentials.StudentT(0.0, 3.0, scale), lambda rng, n: scale * rng.standard_t(3.0, n)
    raise ValueError(f"unknown signal {kind!r}")


def unit_rows(rng, n, dim):
    R = rng.normal(size=(n, dim))
    return R / np.linalg.norm(R, axis=1, keepdims=True)


def designed_errors(method, base, w, M0, y0, v2, steps, per_step, tol, seed):
    rng = np.random.default_rng(seed)
    measure = lambda rows: rows @ w + np.sqrt(v2) * rng.normal(size=len(rows))
    errors, seconds, converged = [], [], []

    def callback(step):
        errors.append(float(jnp.linalg.norm(step.result.q.mean - w)))
        seconds.append(step.fit_seconds)
        converged.append(bool(step.result.converged))

    # EP takes no zero (padding) rows: its cavity of a site with zero projected variance is undefined
    gk.design.sequential(base, measure, M0, y0, v2, steps=steps, per_step=per_step, infer=inference(method, tol),
                         callback=callback, progress=False, key=jax.random.PRNGKey(seed), pad=method != "ep")
    return errors, seconds, converged


def random_map_errors(base, w, M0, y0, v2, steps, per_step, seed):
    """MAP with random unit-norm rows appended per step (padded to the final size: one compilation)."""
    rng = np.random.default_rng(seed + 1)
    M, y = M0, y0
    capacity = M0.shape[0] + steps * per_step
    errors, w_prev, converged = [], None, []
    for t in range(steps + 1):
        model = gk.Model(None, (padded_measurement_sites(M, y, v2, capacity),) + base.sites)
        w_map, ok = gk.design.map_estimate(model, w0=w_prev)
        w_prev = w_map
        errors.append(float(jnp.linalg.norm(w_map - w)))
        converged.append(bool(ok))
        rows = unit_rows(rng, per_step, len(w))
        M, y = np.concatenate([M, rows]), np.concatenate([y, rows @ w + np.sqrt(v2) * rng.normal(size=per_step)])
    return errors, converged


def time_inference(kind, methods, dim, n, v2, tol, seed):
    """Seconds per fit at (D, N) = (dim, n), random measurements, compilation excluded (second call)."""
    potential, sample = signal_model(kind, dim)
    rng = np.random.default_rng(seed + 7)
    w = sample(rng, dim)
    M = unit_rows(rng, n, dim)
    model = gk.design.sparse_linear_model(M, M @ w + np.sqrt(v2) * rng.normal(size=n), v2,
                                          gk.operators.Identity(dim), potential)
    out = {}
    for method in methods:
        infer = inference(method, tol)
        jax.block_until_ready(infer(model, None).q.mean)
        start = time.perf_counter()
        res = infer(model, None)
        jax.block_until_ready(res.q.mean)
        out[method] = {"seconds": time.perf_counter() - start, "converged": bool(res.converged),
                       "steps": int(res.num_steps)}
    start = time.perf_counter()
    gk.design.map_estimate(model)
    out["map"] = {"seconds": time.perf_counter() - start}
    return out


def summarise(curves, n_axis):
    return {m: {"mean": np.mean(v, axis=0).tolist(),
                "stderr": (np.std(v, axis=0, ddof=1) / np.sqrt(len(v))).tolist() if len(v) > 1
                else [0.0] * len(n_axis), "repeats": len(v)} for m, v in curves.items() if v}


def run(args, save=None):
    """All signals and repeats; `save(results)` is called after every repeat (partial results survive)."""
    v2, dim = args.noise_variance, args.dim
    results = {"config": vars(args).copy(), "signals": {}, "loadavg_start": os.getloadavg()}
    for kind in args.signals:
        methods = [m for m in args.methods if m != "map" and not (m == "ep" and kind == "student")]
        potential, sample = signal_model(kind, dim)
        base = gk.Model(None, gk.Sites(gk.operators.Identity(dim), potential))
        curves = {m: [] for m in methods + ["map"]}
        fit_seconds = {m: [] for m in methods}
        not_converged = {m: 0 for m in methods + ["map"]}
        n_axis = [args.m0 + t * args.per_step for t in range(args.steps + 1)]
        entry = results["signals"][kind] = {"N": n_axis}
        for rep in range(args.repeats):
            rng = np.random.default_rng(args.seed + 1000 * rep)
            w = sample(rng, dim)
            M0 = unit_rows(rng, args.m0, dim)
            y0 = M0 @ w + np.sqrt(v2) * rng.normal(size=args.m0)
            for m in methods:
                start = time.perf_counter()
                e, s, c = designed_errors(m, base, w, M0, y0, v2, args.steps, args.per_step, args.tol,
                                          args.seed + rep)
                curves[m].append(e)
                fit_seconds[m].append(s[1:])  # step 0 includes compilation
                not_converged[m] += len(c) - sum(c)
                print(f"  [{kind} {rep + 1}] {m}: {time.perf_counter() - start:.0f} s", flush=True)
            e, c = random_map_errors(base, w, M0, y0, v2, args.steps, args.per_step, args.seed + rep)
            curves["map"].append(e)
            not_converged["map"] += len(c) - sum(c)
            print(f"[{kind}] repeat {rep + 1}/{args.repeats}: final errors "
                  + ", ".join(f"{m} {curves[m][-1][-1]:.3f}" for m in curves), flush=True)
            entry.update(errors=summarise(curves, n_axis), not_converged_fits=not_converged,
                         mean_step_seconds={m: float(np.mean(v)) if np.size(v) else None
                                            for m, v in fit_seconds.items()})
            if save is not None:
                save(results)
        if args.time_n:
            entry["timing"] = time_inference(kind, methods, dim, args.time_n, v2, args.tol, args.seed)
            if save is not None:
                save(results)
    results["loadavg_end"] = os.getloadavg()
    return results


def report(results, path_png):
    for kind, r in results["signals"].items():
        print(f"\n== {kind} signals: l2 error (mean +- stderr over {results['config']['repeats']} repeats) ==")
        N = r["N"]
        picks = sorted({0, min(3, len(N) - 1), len(N) // 2, len(N) - 1})
        print("method".ljust(26) + "".join(f"N={N[i]}".rjust(16) for i in picks))
        for m, e in r["errors"].items():
            print(LABELS[m].ljust(26) + "".join(f"{e['mean'][i]:9.3f}+-{e['stderr'][i]:.3f}".rjust(16)
                                                for i in picks))
        if "timing" in r:
            print(f"inference time at D={results['config']['dim']}, N={results['config']['time_n']} (paper: "
                  f"{PAPER_TIMES[kind]}):")
            for m, t in r["timing"].items():
                print(f"  {m}: {t['seconds']:.2f} s" + (f" (converged={t['converged']}, steps={t['steps']})"
                                                        if "converged" in t else ""))
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # pragma: no cover
        return
    kinds = list(results["signals"])
    fig, axes = plt.subplots(1, len(kinds), figsize=(5.5 * len(kinds), 4), squeeze=False)
    for ax, kind in zip(axes[0], kinds):
        r = results["signals"][kind]
        for m, e in r["errors"].items():
            mean, se = np.array(e["mean"]), np.array(e["stderr"])
            ax.plot(r["N"], mean, label=LABELS[m], ls="--" if m == "map" else "-")
            ax.fill_between(r["N"], mean - se, mean + se, alpha=0.2)
        ax.set_title(f"{kind} signals, D={results['config']['dim']}")
        ax.set_xlabel("number of measurements N")
        ax.set_ylabel("l2 reconstruction error")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path_png, dpi=110)
    plt.close(fig)


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=25)
    p.add_argument("--dim", type=int, default=512)
    p.add_argument("--m0", type=int, default=40)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--per-step", type=int, default=3)
    p.add_argument("--noise-variance", type=float, default=0.005)
    p.add_argument("--tol", type=float, default=1e-2, help="G-KL gradient tolerance (paper: 0.01)")
    p.add_argument("--signals", nargs="+", default=["laplace", "student"], choices=["laplace", "student"])
    p.add_argument("--methods", nargs="+", default=["gkl", "vb", "ep", "map"], choices=["gkl", "vb", "ep", "map"])
    p.add_argument("--time-n", type=int, default=110, help="N for the timing table (0: skip)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="tiny smoke run (< 30 s)")
    p.add_argument("--out", default=OUT)
    args = p.parse_args(argv)
    if args.quick:
        args.dim, args.m0, args.steps, args.per_step, args.repeats = 32, 8, 2, 2, 1
        args.signals, args.methods, args.time_n = ["laplace"], ["gkl", "map"], 0
    return args


def main(argv=None):
    args = parse(sys.argv[1:] if argv is None else argv)
    os.makedirs(args.out, exist_ok=True)
    start = time.perf_counter()
    name = "sed_synthetic_quick" if args.quick else "sed_synthetic"

    def save(results):
        with open(os.path.join(args.out, name + ".json"), "w") as f:
            json.dump(results, f, indent=1)

    results = run(args, save)
    results["seconds"] = time.perf_counter() - start
    save(results)
    report(results, os.path.join(args.out, name + ".png"))
    print(f"\ntotal {results['seconds']:.1f} s; load average {results['loadavg_start']} -> {results['loadavg_end']}")
    return results


if __name__ == "__main__":
    main()
