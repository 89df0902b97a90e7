"""One G-KL fit on 1, 2, 4, ... JAX processes (multi-controller runtime), and the virtual-device sharded fit.

A launcher recipe to copy: every process runs `worker()`: `jax.distributed.initialize(...)`, build a model of its
own rows only, `gk.distributed.shard_sites(local, mesh, process_local=True)`, `gk.fit`. Process p holds blocks
p*B/P, ..., (p+1)*B/P - 1 of the B data blocks, each generated from its own seed, so every process count fits the
same data set (Bayesian logistic regression, prior N(0, I), a Diagonal factor).

    python benchmarks/multiprocess.py --processes 1,2,4            # N processes on this machine, one after another
    python benchmarks/multiprocess.py --virtual-devices 1,4 --sites 1000000 --dim 20   # one process, 1 / 4 devices

On a cluster, start one process per host (or per accelerator) with the worker's arguments from the environment:

    # SLURM: srun fills in everything (jax.distributed.initialize() reads SLURM_* itself)
    srun --ntasks=4 python benchmarks/multiprocess.py --worker
    # anything else: the coordinator (process 0's host:port), the process count and this process's id
    JAX_COORDINATOR_ADDRESS=host0:12345 JAX_NUM_PROCESSES=4 JAX_PROCESS_ID=2 python benchmarks/multiprocess.py --worker

(JAX reads JAX_COORDINATOR_ADDRESS; JAX_NUM_PROCESSES and JAX_PROCESS_ID are read by this script.) On CPUs JAX's
cross-process collectives use gloo by default. Each worker times a second fit and a bound+gradient evaluation
(compilation excluded) and process 0 prints one `RESULT {json}` line; the launcher prints a markdown table and
writes benchmarks/out/multiprocess.json.
"""

import argparse
import json
import os
import platform
import socket
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "out")


def block_data(block: int, rows: int, dim: int, seed: int = 0):
    """Block `block` of the data set: `rows` inputs from N(0, I) and labels from a logistic model whose weights
    (scale 3 / sqrt(dim)) are drawn from `seed` alone, so that every block belongs to the same problem."""
    import numpy as np

    w = np.random.default_rng(seed).normal(size=dim) * 3.0 / np.sqrt(dim)
    rng = np.random.default_rng([seed, block])
    X = rng.normal(size=(rows, dim))
    y = np.where(rng.random(rows) < 1.0 / (1.0 + np.exp(-X @ w)), 1.0, -1.0)
    return X, y


def _timed(fn, repeats=1):
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - start)
    return best, out


def worker(args) -> None:
    """One process of the multi-process fit (every process runs this same program)."""
    if args.devices:     # one process, virtual CPU devices: set before JAX starts
        os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={args.devices}"
    import jax

    jax.config.update("jax_enable_x64", True)
    if args.devices:
        pass
    elif args.coordinator or os.environ.get("JAX_NUM_PROCESSES"):
        num = args.num_processes or int(os.environ["JAX_NUM_PROCESSES"])
        pid = args.process_id if args.process_id is not None else int(os.environ["JAX_PROCESS_ID"])
        jax.distributed.initialize(coordinator_address=args.coordinator, num_processes=num, process_id=pid,
                                   initialization_timeout=120, heartbeat_timeout_seconds=30,
                                   shutdown_timeout_seconds=30)
    else:
        jax.distributed.initialize()    # SLURM, Open MPI, Kubernetes, Cloud TPU: detected from the environment
    import numpy as np

    import gkl_jax as gk

    num, pid = jax.process_count(), jax.process_index()
    if args.blocks % num:
        raise ValueError(f"--blocks {args.blocks} must be a multiple of the process count {num}")
    rows = args.sites // args.blocks
    mine = [block_data(b, rows, args.dim, args.seed) for b in range(pid * args.blocks // num,
                                                                      (pid + 1) * args.blocks // num)]
    X, y = np.concatenate([m[0] for m in mine]), np.concatenate([m[1] for m in mine])
    local = gk.Model(gk.priors.Isotropic(args.dim, 1.0), gk.Sites(X, gk.potentials.Logistic(y)))
    model = gk.distributed.shard_sites(local, gk.distributed.site_mesh(), process_local=not args.devices)
    factor = gk.factors.Diagonal()
    start = time.perf_counter()
    res = gk.fit(model, factor)
    first = time.perf_counter() - start
    fit_s, res = _timed(lambda: jax.block_until_ready(gk.fit(model, factor)))
    value_grad = jax.jit(jax.value_and_grad(gk.bound, argnums=1))
    jax.block_until_ready(value_grad(model, res.q))
    eval_s, _ = _timed(lambda: jax.block_until_ready(value_grad(model, res.q)), repeats=5)
    if pid == 0:
        print("RESULT " + json.dumps(dict(
            processes=num, devices=len(jax.devices()), sites=rows * args.blocks, dim=args.dim,
            log_z=float(res.log_z), converged=bool(res.converged), steps=int(res.num_steps),
            first_fit_s=first, fit_s=fit_s, eval_s=eval_s)), flush=True)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def launch(args, num: int) -> dict:
    """Run `num` worker processes on this machine (one CPU device each); process 0's result."""
    port, cmd = _free_port(), [sys.executable, os.path.abspath(__file__), "--worker"]
    cmd += ["--sites", str(args.sites), "--dim", str(args.dim), "--blocks", str(args.blocks), "--seed", str(args.seed)]
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    procs = [subprocess.Popen(cmd + ["--coordinator", f"127.0.0.1:{port}", "--num-processes", str(num),
                                     "--process-id", str(p)], stdout=subprocess.PIPE, text=True, env=env)
             for p in range(num)]
    load = os.getloadavg()[0]
    try:
        outs = [p.communicate(timeout=args.timeout)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    if any(p.returncode for p in procs):
        raise RuntimeError(f"a worker failed: exit codes {[p.returncode for p in procs]}")
    line = next(ln for ln in outs[0].splitlines() if ln.startswith("RESULT "))
    return dict(json.loads(line[len("RESULT "):]), load=round(max(load, os.getloadavg()[0]), 1))


def virtual(args, devices: int) -> dict:
    """One process with `devices` virtual CPU devices (XLA_FLAGS=--xla_force_host_platform_device_count), the
    sites sharded over them by `shard_sites(model, site_mesh())`."""
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--devices", str(devices), "--sites", str(args.sites),
           "--dim", str(args.dim), "--blocks", str(args.blocks), "--seed", str(args.seed)]
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    load = os.getloadavg()[0]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=args.timeout, check=True).stdout
    line = next(ln for ln in out.splitlines() if ln.startswith("RESULT "))
    return dict(json.loads(line[len("RESULT "):]), load=round(max(load, os.getloadavg()[0]), 1))


def table(rows) -> str:
    head = ("| processes | devices | N | D | log Z | steps | fit (s) | sites/s (fit) | bound+grad (s) | "
            "sites/s (bound+grad) | first fit incl. compile (s) | load |\n|" + "---|" * 12)
    lines = [head]
    for r in rows:
        lines.append(f"| {r['processes']} | {r['devices']} | {r['sites']:,} | {r['dim']} | {r['log_z']:.6f} | "
                     f"{r['steps']} | {r['fit_s']:.2f} | {r['sites'] / r['fit_s']:,.0f} | {r['eval_s']:.4f} | "
                     f"{r['sites'] / r['eval_s']:,.0f} | {r['first_fit_s']:.1f} | {r['load']} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--processes", default="", help="comma-separated process counts to launch here, e.g. 1,2,4")
    parser.add_argument("--virtual-devices", default="", help="comma-separated virtual CPU device counts (1 process)")
    parser.add_argument("--sites", type=int, default=100_000)
    parser.add_argument("--dim", type=int, default=50)
    parser.add_argument("--blocks", type=int, default=8, help="data blocks (a multiple of every process count)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=1800, help="seconds before a launch is killed")
    parser.add_argument("--worker", action="store_true", help="run one process of the fit (see the docstring)")
    parser.add_argument("--coordinator", default=None, help="host:port of process 0's coordinator (worker)")
    parser.add_argument("--num-processes", type=int, default=None)
    parser.add_argument("--process-id", type=int, default=None)
    parser.add_argument("--devices", type=int, default=0, help="worker: one process with this many virtual devices")
    args = parser.parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    rows = [launch(args, int(n)) for n in filter(None, args.processes.split(","))]
    rows += [virtual(args, int(n)) for n in filter(None, args.virtual_devices.split(","))]
    print(f"{time.strftime('%Y-%m-%d %H:%M')} UTC, {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} cores\n{table(rows)}")
    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(OUT, "multiprocess.json"), "w") as fh:
        json.dump(rows, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
