"""Compile time of the first `gk.fit`, beside NumPyro's jitted SVI update, each model in a fresh process.

For every model of the table the first `gk.fit` runs in a new Python process (empty JIT caches, no persistent
cache) and JAX's own compile monitoring splits its time into tracing (jaxpr), lowering (MLIR) and XLA
compilation; then the median of 5 warm fits. In the same run NumPyro's SVI update for the same logistic model
with an `AutoMultivariateNormal` guide (full-rank, the closest peer of the Full factor) is jitted in a new process
and timed the same way (its first `svi.update` call).

    python benchmarks/compile.py                    # the whole table -> benchmarks/out/compile.json
    python benchmarks/compile.py --tree ../old      # the same table for another checkout (before/after)
    python benchmarks/compile.py --models logistic-full numpyro-mvn

Models: logistic regression on ionosphere (34 inputs with bias, 351 sites) with the Full, Diagonal and Chevron(5)
factors; GP classification, n = 200 (SE kernel, logistic sites); Student-t GP regression, n = 100; Poisson
regression (N = 500, D = 10).
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

MODELS = ["logistic-full", "logistic-diagonal", "logistic-chevron", "gp-classification", "student-t-gp",
          "poisson", "numpyro-mvn"]

_CHILD = r'''
import json, sys, time
t_import = time.perf_counter()
import jax
jax.config.update("jax_enable_x64", True)
from jax._src import monitoring
events = {}
def _listen(name, duration, **kw):
    events[name] = events.get(name, 0.0) + duration
monitoring.register_event_duration_secs_listener(_listen)
import numpy as np
name = sys.argv[1]
rng = np.random.default_rng(0)

def ionosphere():
    import gkl_jax as gk
    X, y, _ = gk.datasets.load("ionosphere")
    X = X[:, X.std(0) > 0]
    return np.hstack([(X - X.mean(0)) / X.std(0), np.ones((len(y), 1))]), y

if name == "numpyro-mvn":
    import numpyro, numpyro.distributions as dist
    from numpyro.infer import SVI, Trace_ELBO
    from numpyro.infer.autoguide import AutoMultivariateNormal
    H, y = ionosphere()
    H, t = jax.numpy.asarray(H), jax.numpy.asarray((y > 0).astype(np.float64))
    def logistic(H, t):
        w = numpyro.sample("w", dist.Normal(0.0, 1.0).expand([H.shape[1]]).to_event(1))
        numpyro.sample("t", dist.Bernoulli(logits=H @ w), obs=t)
    svi = SVI(logistic, AutoMultivariateNormal(logistic), numpyro.optim.Adam(0.01), Trace_ELBO())
    state = svi.init(jax.random.PRNGKey(0), H, t)
    events.clear()
    start = time.perf_counter()
    state, loss = svi.update(state, H, t); jax.block_until_ready(loss)
    first = time.perf_counter() - start
    warm = []
    for _ in range(5):
        start = time.perf_counter(); state, loss = svi.update(state, H, t); jax.block_until_ready(loss)
        warm.append(time.perf_counter() - start)
    out = dict(first_call=first, warm=float(np.median(warm)), log_z=None, converged=None, steps=None)
else:
    import gkl_jax as gk
    if name.startswith("logistic"):
        H, y = ionosphere()
        model = gk.Model(gk.priors.Isotropic(H.shape[1], 1.0), gk.Sites(H, gk.potentials.Logistic(y)))
        factor = {"logistic-full": gk.factors.Full(), "logistic-diagonal": gk.factors.Diagonal(),
                  "logistic-chevron": gk.factors.Chevron(rows=5)}[name]
    elif name == "gp-classification":
        X = rng.uniform(-3, 3, (200, 2))
        y = np.where(np.sin(X[:, 0]) + 0.5 * X[:, 1] + 0.3 * rng.standard_normal(200) > 0, 1.0, -1.0)
        model = gk.gp.model(gk.kernels.SquaredExponential(1.0, 1.0), X, gk.potentials.Logistic(y))
        factor = gk.factors.Full()
    elif name == "student-t-gp":
        X = np.linspace(-4, 4, 100)[:, None]
        y = np.sin(X[:, 0]) + 0.1 * rng.standard_normal(100)
        y[::17] += 4.0
        model = gk.gp.model(gk.kernels.SquaredExponential(1.0, 1.0), X, gk.potentials.StudentT(y, 3.0, 0.1))
        factor = gk.factors.Full()
    elif name == "poisson":
        H = rng.standard_normal((500, 10)) / np.sqrt(10)
        y = rng.poisson(np.exp(H @ rng.standard_normal(10) * 0.5)).astype(np.float64)
        model = gk.Model(gk.priors.Isotropic(10, 1.0), gk.Sites(H, gk.potentials.Poisson(y)))
        factor = gk.factors.Full()
    events.clear()
    start = time.perf_counter()
    r = gk.fit(model, factor); jax.block_until_ready(r.log_z)
    first = time.perf_counter() - start
    warm = []
    for _ in range(5):
        start = time.perf_counter(); r = gk.fit(model, factor); jax.block_until_ready(r.log_z)
        warm.append(time.perf_counter() - start)
    out = dict(first_call=first, warm=float(np.median(warm)), log_z=float(r.log_z), converged=bool(r.converged),
               steps=int(r.num_steps))
out.update(trace=events.get("/jax/core/compile/jaxpr_trace_duration", 0.0),
           lower=events.get("/jax/core/compile/jaxpr_to_mlir_module_duration", 0.0),
           compile=events.get("/jax/core/compile/backend_compile_duration", 0.0))
print("RESULT " + json.dumps(out))
'''


def run(name, tree):
    env = dict(os.environ)
    env.pop("XLA_FLAGS", None)
    if tree:
        env["PYTHONPATH"] = os.path.abspath(tree)
    # run outside the repository: `python -c` puts the working directory first on sys.path, ahead of PYTHONPATH
    proc = subprocess.run([sys.executable, "-c", _CHILD, name], capture_output=True, text=True, env=env,
                          cwd=tempfile.gettempdir())
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise RuntimeError(f"{name} failed:\n{proc.stderr[-3000:]}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", choices=MODELS, default=MODELS)
    parser.add_argument("--tree", default=None, help="a checkout whose gkl_jax to time (default: the installed one)")
    parser.add_argument("--json", default=os.path.join(os.path.dirname(__file__), "out", "compile.json"))
    args = parser.parse_args(argv)
    rows = {}
    print(f"{'model':20s} {'trace':>7s} {'lower':>7s} {'compile':>8s} {'first':>7s} {'warm':>9s}  log Z")
    for name in args.models:
        r = run(name, args.tree)
        rows[name] = r
        log_z = "" if r["log_z"] is None else f"{r['log_z']:.10f} ({r['steps']} steps, converged={r['converged']})"
        print(f"{name:20s} {r['trace']:7.2f} {r['lower']:7.2f} {r['compile']:8.2f} {r['first_call']:7.2f} "
              f"{r['warm'] * 1e3:7.1f}ms  {log_z}", flush=True)
    if "logistic-full" in rows and "numpyro-mvn" in rows:
        ours = rows["logistic-full"]["trace"] + rows["logistic-full"]["compile"]
        peer = rows["numpyro-mvn"]["trace"] + rows["numpyro-mvn"]["compile"]
        print(f"logistic Full: trace + compile {ours:.2f} s = {ours / peer:.2f} x NumPyro's {peer:.2f} s")
    os.makedirs(os.path.dirname(args.json), exist_ok=True)
    with open(args.json, "w") as fh:
        json.dump(dict(date=time.strftime("%Y-%m-%d %H:%M"), tree=args.tree or "installed", models=rows), fh,
                  indent=1)


if __name__ == "__main__":
    main()
