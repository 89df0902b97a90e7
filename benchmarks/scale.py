"""Scale-out benchmarks (issue 8): batches of models, sites sharded over devices, minibatch fits.

(1) vmap: 256 Bayesian logistic regressions (D = 50, N = 500, synthetic_logistic, prior N(0, I)) fitted by
    `gk.distributed.fit_batched` (one jit(vmap(fit)) program) vs a Python loop of warm `gk.fit` calls.
(2) sharded: N = 200,000, D = 200, Chevron(rows=20): bound+gradient and Hessian-vector-product evaluations and a
    full Newton fit (tol 1e-3, the paper's setting) on 4 virtual CPU devices (sites sharded) vs 1 device,
    measured in a subprocess started with XLA_FLAGS=--xla_force_host_platform_device_count=4 (with 4 virtual
    devices on 2 physical cores the ideal ratio is 2, not 4).
(3) minibatch: N = 10^6, D = 100, Diagonal and Chevron(rows=10): wall time to reach within 0.1% of the optimal
    bound, full-batch Newton (gk.fit with max_steps = the first step whose bound is within 0.1%) vs
    `gk.stochastic.fit_minibatch` (default Adam, cosine decay, batch 4096; the fewest epochs in 1/8, 1/4, ...
    whose final full-data bound is within 0.1%, the final streamed full-data pass included); the optimum is
    the converged full-batch fit at the library's default tolerance.

(4) minibatch-gp: GP classification (SE kernel, N = 500 points on a line; --quick 200), `fit_minibatch` with and
    without `whiten=True` (batch N/10, 50 and 200 epochs) against the converged `gk.fit`: the bound gap and the
    time. Under a GP prior Adam stalls in the original basis; whitened it converges. Unwhitened, every step
    pays O(N^3) for the prior term tr(Sigma^{-1} S); whitened, O(b N^2) for the batch's rows of H L.

Every timing excludes compilation and is printed with os.getloadavg() at the time: evaluations and part (1) time
a second call with the same shapes; the large fits (parts 2 and 3) subtract the compile time of the same program
measured on a small problem (running each large fit twice would double its cost). Float64 throughout (float32 with
--float32).

    python benchmarks/scale.py                 # all three parts, the sizes above
    python benchmarks/scale.py --quick         # small sizes, < 30 s on an idle 2-core machine
    python benchmarks/scale.py --part vmap     # one part (vmap | sharded | minibatch | minibatch-gp)

Writes benchmarks/out/scale[_quick].json and prints markdown tables (recorded in benchmarks/RESULTS_scale.md).
"""

import argparse
import json
import os
import platform
import subprocess
import sys
import time
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "out")


def _setup(float32: bool, devices: int | None = None):
    if devices:
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                                   f" --xla_force_host_platform_device_count={devices}").strip()
    import jax

    jax.config.update("jax_enable_x64", not float32)
    return jax


def _load():
    return round(os.getloadavg()[0], 2)


def _timed(fn, *args, repeats=1):
    """Best wall time of `repeats` calls after one warm-up call; (seconds, load, output)."""
    import jax

    out = jax.block_until_ready(fn(*args))
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = jax.block_until_ready(fn(*args))
        best = min(best, time.perf_counter() - t0)
    return best, _load(), out


def _logistic(dim, num, seed, dtype):
    import gkl_jax as gk

    data = gk.datasets.synthetic_logistic(dim, num, seed=seed)
    X = data["X_train"].astype(dtype)
    y = data["y_train"].astype(dtype)
    return gk.Model(gk.priors.Isotropic(dim, dtype(1.0)), gk.Sites(X, gk.potentials.Logistic(y)))


# ---------------------------------------------------------------- (1) vmap


def part_vmap(args):
    jax = _setup(args.float32)
    import numpy as np

    import gkl_jax as gk

    dtype = np.float32 if args.float32 else np.float64
    B, D, N = (32, 10, 100) if args.quick else (256, 50, 500)
    models = [_logistic(D, N, seed, dtype) for seed in range(B)]
    rows = []
    for factor in (gk.factors.Full(), gk.factors.Diagonal()):
        gk.fit(models[0], factor)  # compile the single fit
        t0, load0 = time.perf_counter(), _load()
        loop = [gk.fit(m, factor) for m in models]
        jax.block_until_ready([r.log_z for r in loop])
        t_loop = time.perf_counter() - t0
        stacked = gk.distributed.stack_models(models)
        t_vmap, load1, res = _timed(lambda m: gk.distributed.fit_batched(m, factor), stacked)
        err = float(np.max(np.abs(np.asarray(res.log_z) - np.array([float(r.log_z) for r in loop]))))
        rows.append({"factor": type(factor).__name__, "models": B, "D": D, "N": N, "loop_s": t_loop,
                     "vmap_s": t_vmap, "speedup": t_loop / t_vmap, "max_abs_log_z_diff": err,
                     "steps_max": int(np.max(res.num_steps)), "steps_mean": float(np.mean(res.num_steps)),
                     "load": [load0, load1]})
        print(f"| vmap {rows[-1]['factor']} | {B} x (D={D}, N={N}) | loop {t_loop:.3f} s | vmap {t_vmap:.3f} s | "
              f"x{t_loop / t_vmap:.1f} | max|dlogZ| {err:.1e} | steps mean {rows[-1]['steps_mean']:.1f} max "
              f"{rows[-1]['steps_max']} | load {load0}/{load1} |", flush=True)
    return rows


# ---------------------------------------------------------------- (2) sharded


def part_sharded_child(args):
    """Runs inside the 4-device subprocess."""
    jax = _setup(args.float32, devices=4)
    import jax.numpy as jnp
    import numpy as np

    import gkl_jax as gk

    dtype = np.float32 if args.float32 else np.float64
    N, D, K = (20_000, 50, 5) if args.quick else (200_000, 200, 20)
    model = _logistic(D, N, 0, dtype)
    mesh = gk.distributed.site_mesh()
    sharded = gk.distributed.shard_sites(model, mesh)
    factor = gk.factors.Chevron(rows=K)
    q = gk.Gaussian(jnp.zeros(D, dtype), factor.initialise(D, jnp.asarray(0.01, dtype)))
    value_grad = jax.jit(jax.value_and_grad(gk.bound, argnums=1))

    def hvp(model, q):
        flat, unravel = jax.flatten_util.ravel_pytree(q)
        grad = lambda f: jax.flatten_util.ravel_pytree(jax.grad(gk.bound, argnums=1)(model, unravel(f)))[0]
        return jax.jvp(grad, (flat,), (jnp.ones_like(flat),))[1]

    hvp = jax.jit(hvp)
    rows = {"N": N, "D": D, "rows": K, "devices": len(jax.devices())}
    small = _logistic(D, 8 * len(jax.devices()), 1, dtype)  # same program, for the compile-time estimate
    small_sharded = gk.distributed.shard_sites(small, mesh)
    for name, m, ms in (("1 device", model, small), ("4 devices", sharded, small_sharded)):
        qm = gk.distributed.replicate(q, mesh) if m is sharded else q
        t_vg, load_vg, _ = _timed(value_grad, m, qm, repeats=2)
        t_hvp, load_hvp, _ = _timed(hvp, m, qm, repeats=2)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            t_fit, load_fit, res = _minus_compile(lambda mm: gk.fit(mm, factor, tol=1e-3), m, ms)
        rows[name] = {"bound_grad_s": t_vg, "hvp_s": t_hvp, "fit_s": t_fit, "fit_steps": int(res.num_steps),
                      "log_z": float(res.log_z), "converged": bool(res.converged),
                      "load": [load_vg, load_hvp, load_fit]}
        print(name, rows[name], file=sys.stderr, flush=True)
    hlo = gk.distributed.compiled_text(jax.value_and_grad(gk.bound, argnums=1), sharded,
                                       gk.distributed.replicate(q, mesh))
    rows["all_reduce_ops_in_bound_grad_hlo"] = hlo.count("all-reduce(") + hlo.count("all-reduce-start(")
    print(json.dumps(rows))


def part_sharded(args):
    cmd = [sys.executable, os.path.abspath(__file__), "--sharded-child"] + (["--quick"] if args.quick else []) + \
          (["--float32"] if args.float32 else [])
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-4000:])
    rows = json.loads(proc.stdout.strip().splitlines()[-1])
    one, four = rows["1 device"], rows["4 devices"]
    for key, label in (("bound_grad_s", "bound+grad"), ("hvp_s", "HVP"), ("fit_s", "Newton fit (tol 1e-3)")):
        print(f"| sharded {label} | N={rows['N']}, D={rows['D']}, Chevron(rows={rows['rows']}) | 1 device "
              f"{one[key]:.3f} s | 4 devices {four[key]:.3f} s | x{one[key] / four[key]:.2f} | load "
              f"{one['load']}/{four['load']} |", flush=True)
    print(f"| sharded fit | log Z 1 device {one['log_z']:.6f}, 4 devices {four['log_z']:.6f}, steps "
          f"{one['fit_steps']}/{four['fit_steps']} | all-reduce ops in bound+grad HLO: "
          f"{rows['all_reduce_ops_in_bound_grad_hlo']} |", flush=True)
    return rows


# ---------------------------------------------------------------- (3) minibatch


def _minus_compile(call, model, small):
    """Wall time of call(model) without its compilation, from one call: the first call's time minus the
    compile time of the same program measured on `small` (first call minus second call). Running a 10^6-site
    fit twice just to exclude compilation would double the part's cost. Returns (seconds, load, output)."""
    import jax

    t0 = time.perf_counter()
    jax.block_until_ready(call(small))
    t1 = time.perf_counter()
    jax.block_until_ready(call(small))
    t2 = time.perf_counter()
    out = jax.block_until_ready(call(model))
    t3 = time.perf_counter()
    compile_s = max((t1 - t0) - (t2 - t1), 0.0)
    return max(t3 - t2 - compile_s, 0.0), _load(), out


def part_minibatch(args):
    _setup(args.float32)
    import numpy as np

    import gkl_jax as gk

    dtype = np.float32 if args.float32 else np.float64
    N, D, K, batch = (20_000, 20, 4, 256) if args.quick else (1_000_000, 100, 10, 4096)
    model = _logistic(D, N, 1, dtype)
    small = _logistic(D, 4 * batch, 2, dtype)
    rows = []
    for factor in (gk.factors.Diagonal(), gk.factors.Chevron(rows=K)):
        name = type(factor).__name__
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            t_ref, load_ref, ref = _minus_compile(lambda m: gk.fit(m, factor), model, small)
            best = float(ref.log_z)
            target = best - 1e-3 * abs(best)
            hist = np.asarray(ref.history)
            k_star = max(int(np.argmax(np.nan_to_num(hist, nan=-np.inf) >= target)), 1)
            t_full, load_full, res_full = _minus_compile(lambda m: gk.fit(m, factor, max_steps=k_star), model, small)
        entry = {"factor": name, "N": N, "D": D, "optimum": best, "optimum_steps": int(ref.num_steps),
                 "optimum_converged": bool(ref.converged), "optimum_s": t_ref, "optimum_load": load_ref,
                 "full_steps_to_target": k_star, "full_s": t_full, "full_bound": float(res_full.log_z),
                 "full_load": load_full, "batch": batch, "minibatch": []}
        print(f"|   full-batch {name}: optimum {best:.4f} in {int(ref.num_steps)} Newton steps, {t_ref:.2f} s "
              f"(converged {bool(ref.converged)}); within 0.1% after {k_star} steps: {t_full:.2f} s | load "
              f"{load_ref}/{load_full} |", flush=True)
        for epochs in (0.125, 0.25, 0.5, 1, 2, 4, 8, 16):
            steps = max(1, int(round(epochs * N / batch)))
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                t_mb, load_mb, res = _minus_compile(
                    lambda m: gk.stochastic.fit_minibatch(m, factor, batch_size=batch, num_steps=steps), model, small)
            gap = (best - float(res.log_z)) / abs(best)
            entry["minibatch"].append({"epochs": epochs, "steps": steps, "s": t_mb, "rel_gap": gap, "load": load_mb})
            print(f"|   minibatch {name} {epochs} epochs ({steps} steps) | {t_mb:.3f} s | rel gap {gap:.2e} | "
                  f"load {load_mb} |", flush=True)
            if gap <= 1e-3:
                break
        hit = [r for r in entry["minibatch"] if r["rel_gap"] <= 1e-3]
        entry["minibatch_s"] = hit[0]["s"] if hit else None
        rows.append(entry)
        mb = f"{entry['minibatch_s']:.3f} s ({hit[0]['epochs']} epochs)" if hit else "not reached"
        ratio = f"x{t_full / entry['minibatch_s']:.1f}" if hit else "-"
        print(f"| minibatch {name} | N={N}, D={D} | full-batch {t_full:.3f} s ({k_star} Newton steps) | minibatch "
              f"{mb} | {ratio} | load {load_full} |", flush=True)
    return rows


def part_minibatch_gp(args):
    _setup(args.float32)
    import numpy as np

    import gkl_jax as gk

    dtype = np.float32 if args.float32 else np.float64
    N = 200 if args.quick else 500
    rng = np.random.default_rng(0)
    X = rng.uniform(-3, 3, (N, 1)).astype(dtype)
    y = np.where(np.sin(2 * X[:, 0]) + 0.3 * rng.normal(size=N) > 0, 1.0, -1.0).astype(dtype)
    model = gk.Model(gk.priors.GP(gk.kernels.SquaredExponential(dtype(1.0), dtype(0.7)), X, jitter=1e-6),
                     gk.Sites(None, gk.potentials.Logistic(y)))
    t_fit, load, ref = _timed(lambda: gk.fit(model).log_z)
    best = float(ref)
    print(f"| minibatch-gp N={N} | gk.fit (converged) | bound {best:.4f} | {t_fit:.3f} s | load {load} |", flush=True)
    rows = {"N": N, "fit_bound": best, "fit_s": t_fit, "minibatch": []}
    batch = N // 10
    for whiten in (False, True):
        for epochs in (50, 200):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                t, load, res = _timed(lambda: gk.stochastic.fit_minibatch(model, batch_size=batch, num_epochs=epochs,
                                                                         whiten=whiten))
            gap, converged = best - float(res.log_z), bool(res.converged)
            rows["minibatch"].append({"whiten": whiten, "epochs": epochs, "s": t, "gap": gap,
                                      "converged": converged, "load": load})
            print(f"| minibatch-gp whiten={whiten} | batch {batch}, {epochs} epochs | gap {gap:.3g} nats | {t:.3f} s "
                  f"| converged {converged} | load {load} |", flush=True)
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small sizes (< 30 s)")
    parser.add_argument("--part", choices=["all", "vmap", "sharded", "minibatch", "minibatch-gp"], default="all")
    parser.add_argument("--float32", action="store_true")
    parser.add_argument("--sharded-child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.sharded_child:
        return part_sharded_child(args)
    results = {"command": " ".join([os.path.basename(sys.executable)] + sys.argv), "machine": platform.platform(),
               "processor": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
               "date": time.strftime("%Y-%m-%d %H:%M:%S"), "load_start": _load()}
    start = time.perf_counter()
    for part, fn in (("vmap", part_vmap), ("sharded", part_sharded), ("minibatch", part_minibatch),
                     ("minibatch-gp", part_minibatch_gp)):
        if args.part in ("all", part):
            results[part] = fn(args)
    results["wall_s"] = time.perf_counter() - start
    os.makedirs(OUT, exist_ok=True)
    suffix = ("_quick" if args.quick else "") + ("" if args.part == "all" else f"_{args.part}")
    with open(os.path.join(OUT, f"scale{suffix}.json"), "w") as f:
        json.dump(results, f, indent=1)
    print(f"total {results['wall_s']:.1f} s, load {_load()}")


if __name__ == "__main__":
    main()
