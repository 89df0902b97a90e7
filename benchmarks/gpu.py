"""The same G-KL code on an accelerator: bound+gradient evaluation rate and time to convergence.

Problems
- papers/000 Tables 2-4: synthetic Bayesian logistic regression (gk.datasets.synthetic_logistic, prior N(0, I)),
  D in {250, 500, 1000}, N in {D/2, D, 5D}, Chevron(rows=K), K in {0.05 D, 0.1 D} as in the paper (13/25, 25/50,
  50/100), Newton-CG to max|grad| <= 1e-3
  (the paper's stopping rule); the paper's Matlab times (Intel E5450, 8 cores) are printed beside ours.
- A 10^6-site logistic regression (D = 100): Diagonal and Chevron(rows=10), full-batch Newton and the minibatch
  fit (`gk.stochastic.fit_minibatch`, batch 8192, max(2 epochs, 300 steps)).
- A batch of 256 logistic regressions (D = 50, N = 500, Full and Diagonal factors): one vmapped program
  (`gk.distributed.fit_batched`) against a Python loop of `gk.fit` calls (the target is a >= 20x ratio, which a
  2-core CPU cannot show: there the loop is compute-bound, see benchmarks/RESULTS_scale.md).

For each problem and dtype (float32 and float64) it reports the bound+gradient evaluations per second (jit of
value_and_grad at the starting q, best of 5 after a warm-up), the fit's wall time (second call, so compilation
is excluded), its number of Newton steps and the normalised bound B / N. Runs on whatever `jax.devices()[0]` is:
a GPU when JAX sees one, else the CPU.

    python benchmarks/gpu.py                    # the full set (for a GPU)
    python benchmarks/gpu.py --small            # tiny sizes: a CPU smoke run (about a minute when idle)
    python benchmarks/gpu.py --dtypes float32   # one precision
    python benchmarks/gpu.py --parts vmap,big --dims 1000   # some parts, in this order; some table dimensions

Writes benchmarks/out/gpu[_small].json (after every row, so an interrupted run keeps what it measured) and prints
markdown tables.
"""

import argparse
import json
import os
import platform
import time
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "out")


def paper_chevron_time(dim, num, rows):
    """The paper's G-KL Chevron convergence time in seconds (papers/000 Tables 2-4), or None."""
    import sys

    sys.path.insert(0, HERE)
    from logistic_tables import paper_value

    cell = paper_value(dim, num, rows, "chevron")
    return None if cell is None else cell["time"][0]


def problems(small: bool):
    if small:
        table = [(20, 100, 2)]
        big = [(5_000, 20, 4)]
    else:
        table = [(d, n, k) for d in (250, 500, 1000) for n in (d // 2, d, 5 * d) for k in (-(-d // 20), d // 10)]
        big = [(1_000_000, 100, 10)]
    return table, big


def _timed(fn, *args, repeats=1):
    """(seconds of the first call, compilation included; best steady-state seconds of `repeats` more calls;
    the output)."""
    import jax

    t0 = time.perf_counter()
    jax.block_until_ready(fn(*args))
    first = time.perf_counter() - t0
    best, out = float("inf"), None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = jax.block_until_ready(fn(*args))
        best = min(best, time.perf_counter() - t0)
    return first, best, out


def _model(dim, num, seed, dtype):
    import gkl_jax as gk

    data = gk.datasets.synthetic_logistic(dim, num, seed=seed)
    return gk.Model(gk.priors.Isotropic(dim, dtype(1.0)),
                    gk.Sites(data["X_train"].astype(dtype), gk.potentials.Logistic(data["y_train"].astype(dtype))))


def run_problem(dim, num, factor, dtype, *, minibatch=None):
    import jax
    import jax.numpy as jnp

    import gkl_jax as gk
    from gkl_jax._start import initial_variance

    model = _model(dim, num, 0, dtype)
    q = gk.Gaussian(jnp.zeros(dim, dtype), factor.initialise(dim, initial_variance(model)))
    value_grad = jax.jit(jax.value_and_grad(gk.bound, argnums=1))
    _, t_eval, _ = _timed(value_grad, model, q, repeats=5)
    tol = 1e-3
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        first_fit, t_fit, res = _timed(lambda m: gk.fit(m, factor, tol=tol), model)
    label = type(factor).__name__ + (f"(rows={factor.rows})" if hasattr(factor, "rows") else "()")
    row = {"D": dim, "N": num, "factor": label, "dtype": dtype.__name__, "evals_per_s": 1.0 / t_eval,
           "fit_s": t_fit, "first_fit_s": first_fit, "steps": int(res.num_steps), "converged": bool(res.converged),
           "bound_per_site": float(res.log_z) / num, "load": round(os.getloadavg()[0], 2)}
    if minibatch is not None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            steps = max(300, 2 * num // minibatch)  # at least 2 epochs and 300 steps
            _, t_mb, mb = _timed(lambda m: gk.stochastic.fit_minibatch(m, factor, batch_size=minibatch,
                                                                    num_steps=steps), model)
        gap = (float(res.log_z) - float(mb.log_z)) / abs(float(res.log_z))
        row.update(minibatch_steps=steps, minibatch_s=t_mb, minibatch_rel_gap=gap)
    return row


def run_vmap(num_models, dim, num, factor, dtype):
    """Python loop of warm gk.fit calls vs one gk.distributed.fit_batched program (second call)."""
    import jax
    import numpy as np

    import gkl_jax as gk

    models = [_model(dim, num, seed, dtype) for seed in range(num_models)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        gk.fit(models[0], factor)
        t0 = time.perf_counter()
        loop = jax.block_until_ready([gk.fit(m, factor).log_z for m in models])
        t_loop = time.perf_counter() - t0
        stacked = gk.distributed.stack_models(models)
        first_vmap, t_vmap, res = _timed(lambda m: gk.distributed.fit_batched(m, factor), stacked)
    label = type(factor).__name__
    return {"models": num_models, "D": dim, "N": num, "factor": label, "dtype": dtype.__name__, "loop_s": t_loop,
            "vmap_s": t_vmap, "first_vmap_s": first_vmap, "speedup": t_loop / t_vmap,
            "max_abs_log_z_diff": float(np.max(np.abs(np.asarray(res.log_z) - np.asarray(loop)))),
            "load": round(os.getloadavg()[0], 2)}


PARTS = ("vmap", "big", "table")


def _save(results, args):
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "gpu_small.json" if args.small else "gpu.json"), "w") as f:
        json.dump(results, f, indent=1)


def _print_problem(row, dtype_name):
    paper = row["paper_s"]
    extra = (f" minibatch {row['minibatch_steps']} steps: {row['minibatch_s']:.3f} s, rel gap "
             f"{row['minibatch_rel_gap']:.1e}" if "minibatch_s" in row else "")
    print(f"| {row['D']} | {row['N']} | {row['factor']} | {dtype_name} | {row['evals_per_s']:.1f} | "
          f"{row['fit_s']:.3f} | "
          f"{row['first_fit_s']:.1f} | {row['steps']}{'' if row['converged'] else ' (not converged)'} | "
          f"{row['bound_per_site']:.3f} | {paper if paper is not None else '-'} | {row['load']} |{extra}", flush=True)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--small", action="store_true", help="tiny sizes for a CPU smoke run")
    parser.add_argument("--dtypes", default="float32,float64")
    parser.add_argument("--parts", default=",".join(PARTS),
                        help="comma-separated, run in this order: vmap (256 models), big (10^6 sites), table "
                             "(Tables 2-4 Chevron cells)")
    parser.add_argument("--dims", type=int, nargs="+", default=None, help="Tables 2-4 dimensions to run (default all)")
    parser.add_argument("--out", default=OUT, help="folder for the JSON results (written after every row)")
    args = parser.parse_args(argv)
    dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    if not dtypes or any(d not in ("float32", "float64") for d in dtypes):
        raise ValueError(f"--dtypes must list float32 and/or float64, got {args.dtypes!r}")
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    if not parts or any(p not in PARTS for p in parts):
        raise ValueError(f"--parts must list some of {', '.join(PARTS)}, got {args.parts!r}")
    import jax

    if "float64" in dtypes:  # float32 runs in either mode (the models are built in float32)
        jax.config.update("jax_enable_x64", True)
    import numpy as np

    import gkl_jax as gk

    device = jax.devices()[0]
    results = {"device": f"{device.platform}: {device.device_kind}", "devices": len(jax.devices()),
               "machine": platform.platform(), "jax": jax.__version__, "date": time.strftime("%Y-%m-%d %H:%M:%S"),
               "rows": [], "vmap": []}
    print(f"device {results['device']} x{results['devices']}, jax {jax.__version__}, {results['date']}")
    table, big = problems(args.small)
    if args.dims is not None:
        table = [cell for cell in table if cell[0] in args.dims]
    start = time.perf_counter()
    for part in parts:
        if part == "vmap":
            print("| models | D | N | factor | dtype | loop s | vmap s | vmap first call s | ratio "
                  "| max abs log Z diff | load |")
            print("|---|---|---|---|---|---|---|---|---|---|---|")
            for name in dtypes:
                for factor in (gk.factors.Full(), gk.factors.Diagonal()):
                    row = run_vmap(*((16, 10, 100) if args.small else (256, 50, 500)), factor, getattr(np, name))
                    results["vmap"].append(row)
                    _save(results, args)
                    print(f"| {row['models']} | {row['D']} | {row['N']} | {row['factor']} | {name} | "
                          f"{row['loop_s']:.3f} | "
                          f"{row['vmap_s']:.3f} | {row['first_vmap_s']:.1f} | x{row['speedup']:.1f} | "
                          f"{row['max_abs_log_z_diff']:.1e} | {row['load']} |", flush=True)
            continue
        print("| D | N | factor | dtype | bound+grad evals/s | fit s (tol 1e-3) | first fit s | steps | B/N | paper s "
              "| load |")
        print("|---|---|---|---|---|---|---|---|---|---|---|")
        for name in dtypes:
            dtype = getattr(np, name)
            if part == "big":
                mb = 128 if args.small else 8192
                cases = [(d, n, f, mb) for n, d, k in big for f in (gk.factors.Diagonal(), gk.factors.Chevron(rows=k))]
            else:
                cases = [(d, n, gk.factors.Chevron(rows=k), None) for d, n, k in table]
            for dim, num, factor, mb in cases:
                row = run_problem(dim, num, factor, dtype, minibatch=mb)
                row["paper_s"] = (paper_chevron_time(dim, num, factor.rows)
                                  if isinstance(factor, gk.factors.Chevron) else None)
                results["rows"].append(row)
                _save(results, args)
                _print_problem(row, name)
    results["wall_s"] = time.perf_counter() - start
    _save(results, args)
    print(f"total {results['wall_s']:.1f} s")
    return results


if __name__ == "__main__":
    main()
