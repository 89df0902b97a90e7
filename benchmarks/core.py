"""Core benchmark: G-KL Bayesian logistic regression on the papers/000 Section 6.2 generator.

For D in {100, 250, 500} and N in {D, 5D} (N_test = 10 D), prior N(0, I), with the Full and Diagonal factors:

- time to convergence (max |dB/d(m, C)| <= 1e-4), steady state (median and min of --repeats fits after a first
  call; the first call's extra time is reported as compile), with jax.block_until_ready;
- B / N (the bound per training point), test log-likelihood / N_test, log E_q[sigmoid(y w^T x)] per test point by
  the library's 64-node feature-adapted quadrature of the 1-D Gaussian integral;
- outer steps of the default solver and of Newton-CG ("newton");
- the cost of one bound+gradient evaluation divided by the cost of the products with H it needs (H m and its
  adjoint for the means; the projected variances s_n^2 = ||C h_n||^2, i.e. H C^T, and their adjoint), timed in
  the same run, beside the floor that ratio has for any 64-node quadrature on the machine (`quadrature_floor`).

Peers at D = 500, N = 2500 (Full): scipy L-BFGS-B on the flat (m, C) with a jitted jax value_and_grad, and,
when numpyro is importable, SVI with AutoMultivariateNormal and AutoLowRankMultivariateNormal(rank=50) for a fixed
number of Adam steps, reporting the gap of their ELBO (1000-sample estimate) to our bound.

    python benchmarks/core.py                 # the full table, written to benchmarks/RESULTS_core.md
    python benchmarks/core.py --quick         # one small cell (< 30 s), printed only

Timings on a shared machine are noisy: the load average is recorded beside every table. By default LAPACK
(OpenBLAS, used for the Cholesky factorisations) runs single-threaded (--blas-threads), which is faster and far
less variable under contention; XLA's own matrix products use all cores.
"""

import argparse
import datetime
import os
import platform
import sys
import time


def _parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="one small cell (D=50, N=250), printed only")
    p.add_argument("--dims", type=int, nargs="+", default=[100, 250, 500])
    p.add_argument("--ratios", type=int, nargs="+", default=[1, 5], help="N / D")
    p.add_argument("--factors", nargs="+", default=["full", "diagonal"])
    p.add_argument("--dtype", choices=["float64", "float32"], default="float64")
    p.add_argument("--tol", type=float, default=None, help="gradient tolerance (default 1e-4; 1e-3 in float32)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--no-peers", action="store_true")
    p.add_argument("--svi-steps", type=int, default=3000)
    p.add_argument("--blas-threads", default="1", help="OPENBLAS_NUM_THREADS ('' leaves it unset)")
    p.add_argument("--out", default=None, help="markdown file for the results (default: RESULTS_core.md "
                                               "beside this script for full runs, none for --quick)")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args()


ARGS = _parse()
if ARGS.blas_threads:
    os.environ.setdefault("OPENBLAS_NUM_THREADS", ARGS.blas_threads)

import jax  # noqa: E402

if ARGS.dtype == "float64":
    jax.config.update("jax_enable_x64", True)

import equinox as eqx  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.flatten_util import ravel_pytree  # noqa: E402

import gkl_jax as gk  # noqa: E402
from gkl_jax import _start  # noqa: E402
from gkl_jax._quadrature import feature_rule  # noqa: E402

DTYPE = jnp.float64 if ARGS.dtype == "float64" else jnp.float32
TOL = ARGS.tol if ARGS.tol is not None else (1e-4 if ARGS.dtype == "float64" else 1e-3)


def load():
    return os.getloadavg()[0]


def timed(fn, *args):
    """(result, wall seconds, process CPU seconds) of fn(*args), blocking on the result."""
    w, c = time.perf_counter(), time.process_time()
    out = jax.block_until_ready(fn(*args))
    return out, time.perf_counter() - w, time.process_time() - c


def repeat(fn, *args, n=5):
    """min and median wall time of n blocking calls (after one warm-up call)."""
    jax.block_until_ready(fn(*args))
    ts = [timed(fn, *args)[1] for _ in range(n)]
    return float(np.min(ts)), float(np.median(ts))


def make_problem(D, N, seed):
    data = gk.datasets.synthetic_logistic(D, N, 10 * D, seed=seed)
    cast = lambda a: jnp.asarray(a, DTYPE)
    X, y, Xt, yt = (cast(data[k]) for k in ("X_train", "y_train", "X_test", "y_test"))
    model = gk.Model(gk.priors.Isotropic(D, jnp.asarray(1.0, DTYPE)), gk.Sites(X, gk.potentials.Logistic(y)))
    return model, X, y, Xt, yt


@jax.jit
def _test_loglik(mean, s2, yt):
    """sum_n log E[sigmoid(y_n a)], a ~ N(m_n, s_n^2), by the 64-node feature-adapted rule (center 0)."""
    x, w = feature_rule(mean, s2, 0.0, 0.75 * np.pi, 64)
    return jnp.sum(jnp.log(jnp.sum(w * jax.nn.sigmoid(yt[:, None] * x), axis=-1)))


def test_loglik(q, Xt, yt):
    op = gk.operators.Dense(Xt)
    return float(_test_loglik(Xt @ q.mean, q.factor.project_variances(op), yt))


def fit_once(model, factor, solver=None):
    return gk.fit(model, factor, solver=solver, tol=TOL)


def ratio(model, q):
    """(bound+grad time) / (time of the products with H it needs), both jitted, min over repeats."""
    op = model.sites[0].operator(model.dim)
    params, static = eqx.partition(q, eqx.is_inexact_array)
    vg = jax.jit(jax.value_and_grad(lambda p: gk.bound(model, eqx.combine(p, static))))

    @jax.jit
    def products(mean, factor):
        """Every product with H that one bound+gradient needs: H m and H^T alpha for the means, the projected
        variances (H C^T for Full, (H o H) d^2 for Diagonal) and their adjoint."""
        s2, pullback = jax.vjp(lambda f: f.project_variances(op), factor)
        m_n = op.mv(mean)
        return s2, pullback(s2), op.rmv(m_n)

    t_vg = repeat(vg, params, n=7)[0]
    t_prod = repeat(products, q.mean, q.factor, n=7)[0]
    return t_vg / t_prod, t_vg, t_prod


def quadrature_floor(model, q):
    """A lower bound on any 64-node quadrature of the N logistic expectations with the two derivatives a gradient
    needs: the cheapest rule (fixed Gauss-Hermite nodes m + s z_k, one fused expression, no node placement, and
    not accurate for s_n >~ 2), timed like `ratio`; (products + this) / products bounds the ratio from below."""
    op = model.sites[0].operator(model.dim)
    m, s2 = op.mv(q.mean), q.factor.project_variances(op)
    y = model.sites[0].potential.y
    z, w = np.polynomial.hermite_e.hermegauss(64)
    z, w = jnp.asarray(z, DTYPE), jnp.asarray(w / w.sum(), DTYPE)

    @jax.jit
    def hermite(m, s2):
        x = (m[:, None] + jnp.sqrt(s2)[:, None] * z) * y[:, None]
        e = jnp.exp(-jnp.abs(x))
        r = 1 / (1 + e)
        return (jnp.sum((jnp.minimum(x, 0) - jnp.log1p(e)) * w, -1), jnp.sum(jnp.where(x >= 0, e, 1.0) * r * w, -1),
                jnp.sum(-e * r * r * w, -1))

    return repeat(hermite, m, s2, n=7)[0]


def cell(D, N, factor_name, seed):
    model, X, y, Xt, yt = make_problem(D, N, seed)
    factor = gk.factors.Full() if factor_name == "full" else gk.factors.Diagonal()
    res, t_first, _ = timed(fit_once, model, factor)
    runs = [timed(fit_once, model, factor) for _ in range(ARGS.repeats)]
    walls = [r[1] for r in runs]
    cpus = [r[2] for r in runs]
    res = runs[-1][0]
    newton, t_newton, _ = timed(fit_once, model, factor, gk.solvers.Newton())
    t_newton = min(t_newton, timed(fit_once, model, factor, gk.solvers.Newton())[1])
    r, t_vg, t_prod = ratio(model, res.q)
    t_floor = quadrature_floor(model, res.q)
    return {
        "D": D, "N": N, "factor": factor_name, "solver": type(gk.solvers.default_solver(model, factor)).__name__,
        "steps": int(res.num_steps), "converged": bool(res.converged),
        "t_median": float(np.median(walls)), "t_min": float(np.min(walls)), "cpu_median": float(np.median(cpus)),
        "compile": t_first - float(np.median(walls)),
        "bound_per_n": float(res.log_z) / N, "test_ll": test_loglik(res.q, Xt, yt) / Xt.shape[0],
        "newton_steps": int(newton.num_steps), "newton_converged": bool(newton.converged), "t_newton": t_newton,
        "newton_bound_diff": float(newton.log_z) - float(res.log_z),
        "ratio": r, "t_vg_ms": 1e3 * t_vg, "t_prod_ms": 1e3 * t_prod, "floor": (t_prod + t_floor) / t_prod,
        "load": load(), "q": res.q,
        "log_z": float(res.log_z),
    }


def scipy_lbfgs(model, log_z_ref):
    """scipy L-BFGS-B on the flat (m, C) (all D^2 entries; the strictly lower part is inert), jitted jax gradient."""
    from scipy.optimize import minimize

    q0 = _start.initial_q(model, gk.factors.Full(), None)
    flat0, unravel = ravel_pytree(eqx.filter(q0, eqx.is_inexact_array))
    static = eqx.filter(q0, eqx.is_inexact_array, inverse=True)
    vg = jax.jit(jax.value_and_grad(lambda f: -gk.bound(model, eqx.combine(unravel(f), static))))
    fun = lambda f: tuple(np.asarray(a, np.float64) for a in vg(jnp.asarray(f, DTYPE)))
    fun(np.asarray(flat0))
    w, c = time.perf_counter(), time.process_time()
    out = minimize(fun, np.asarray(flat0, np.float64), jac=True, method="L-BFGS-B",
                   options=dict(maxiter=20000, maxfun=40000, gtol=TOL, ftol=0.0, maxcor=20))
    wall, cpu = time.perf_counter() - w, time.process_time() - c
    gmax = float(np.max(np.abs(out.jac)))
    return {"wall": wall, "cpu": cpu, "iters": int(out.nit), "nfev": int(out.nfev), "gmax": gmax,
            "bound": -float(out.fun), "gap": log_z_ref - (-float(out.fun)), "converged": gmax <= TOL}


def numpyro_svi(X, y, log_z_ref, steps):
    """NumPyro SVI (Adam, lr 5e-3, one particle per step) with two autoguides; ELBO by 1000 particles."""
    try:
        import numpyro
        import numpyro.distributions as dist
        from numpyro.infer import SVI, Trace_ELBO
        from numpyro.infer.autoguide import AutoLowRankMultivariateNormal, AutoMultivariateNormal
    except Exception as err:  # pragma: no cover - optional dependency
        return {"error": f"numpyro not importable: {err}"}
    D = X.shape[1]
    labels = (np.asarray(y) > 0).astype(np.float64)

    def model(X, labels):
        w = numpyro.sample("w", dist.Normal(jnp.zeros(D, DTYPE), 1.0).to_event(1))
        numpyro.sample("y", dist.Bernoulli(logits=X @ w), obs=labels)

    out = {}
    for name, guide in (("AutoMultivariateNormal", AutoMultivariateNormal(model)),
                        ("AutoLowRankMultivariateNormal(rank=50)", AutoLowRankMultivariateNormal(model, rank=50))):
        svi = SVI(model, guide, numpyro.optim.Adam(5e-3), Trace_ELBO())
        state = svi.init(jax.random.PRNGKey(0), X, labels)
        update = jax.jit(lambda s: svi.update(s, X, labels))
        update(state)
        w, c = time.perf_counter(), time.process_time()
        loss = None
        for _ in range(steps):
            state, loss = update(state)
        jax.block_until_ready(loss)
        wall, cpu = time.perf_counter() - w, time.process_time() - c
        params = svi.get_params(state)
        elbo_fn = jax.jit(lambda k: -Trace_ELBO(num_particles=1000).loss(k, params, model, guide, X, labels))
        elbo = float(elbo_fn(jax.random.PRNGKey(1)))
        out[name] = {"wall": wall, "cpu": cpu, "steps": steps, "elbo": elbo, "gap": log_z_ref - elbo}
    return out


def main():
    start = datetime.datetime.now().isoformat(timespec="seconds")
    load0 = load()
    if ARGS.quick:
        dims, ratios, factors = [50], [5], ["full"]
    else:
        dims, ratios, factors = ARGS.dims, ARGS.ratios, ARGS.factors
    rows = []
    for D in dims:
        for r in ratios:
            for f in factors:
                row = cell(D, r * D, f, ARGS.seed)
                rows.append(row)
                print(f"D={D:4d} N={r * D:5d} {f:8s} steps {row['steps']:3d} conv {row['converged']} "
                      f"t {row['t_median']:.3f}s (min {row['t_min']:.3f}) compile {row['compile']:.1f}s "
                      f"B/N {row['bound_per_n']:.4f} testLL {row['test_ll']:.4f} newton {row['newton_steps']} "
                      f"steps {row['t_newton']:.3f}s ratio {row['ratio']:.2f} (floor {row['floor']:.2f}) "
                      f"load {row['load']:.1f}", flush=True)
    peers = {}
    big = [row for row in rows if row["D"] == max(dims) and row["N"] == 5 * max(dims) and row["factor"] == "full"]
    if big and not ARGS.no_peers and not ARGS.quick:
        model, X, y, Xt, yt = make_problem(big[0]["D"], big[0]["N"], ARGS.seed)
        peers["scipy"] = scipy_lbfgs(model, big[0]["log_z"])
        print("scipy L-BFGS-B:", peers["scipy"], flush=True)
        peers["numpyro"] = numpyro_svi(X, y, big[0]["log_z"], ARGS.svi_steps)
        print("numpyro:", peers["numpyro"], flush=True)
    text = report(rows, peers, start, load0)
    print(text)
    out = ARGS.out if ARGS.out is not None else (None if ARGS.quick else os.path.join(os.path.dirname(__file__),
                                                                                        "RESULTS_core.md"))
    if out:
        with open(out, "w") as fh:
            fh.write(text)
        print(f"written to {out}")


def report(rows, peers, start, load0):
    cmd = "python " + " ".join([os.path.relpath(sys.argv[0])] + sys.argv[1:])
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as fh:
            names = [line.split(":", 1)[1].strip() for line in fh if line.startswith("model name")]
        cpu = f"{names[0]} x {len(names)}" if names else cpu
    except OSError:
        pass
    lines = [
        "# Core benchmark: G-KL Bayesian logistic regression (papers/000 Sec. 6.2 generator)",
        "",
        f"- command: `{cmd}`",
        f"- date: {start}; machine: {cpu}, {os.cpu_count()} logical CPUs; jax {jax.__version__}, "
        f"{jax.devices()[0].platform}; dtype {ARGS.dtype}; "
        f"OPENBLAS_NUM_THREADS={os.environ.get('OPENBLAS_NUM_THREADS')}",
        f"- load average (1 min) at start {load0:.1f}; per row in the table. Wall times on a shared machine scale "
        "with the load; the ratio column is measured in the same run and is the steadier number.",
        f"- prior N(0, I); N_test = 10 D; convergence: max |dB/d(m, C)| <= {TOL:g}; times are the median "
        f"(and min) of {ARGS.repeats} fits after a first call; compile = first call - median.",
        "- ratio = (one jitted bound+gradient evaluation) / (the jitted products with H it needs: H m and H^T alpha "
        "for the means, s_n^2 = ||C h_n||^2 and its adjoint: H C^T and H^T G for Full, (H o H) d^2 and its "
        "transpose for Diagonal), min over 7 calls each. floor = (products + the cheapest conceivable 64-node "
        "quadrature: fixed Gauss-Hermite nodes, value and two derivatives in one fused expression, no bound "
        "assembly) / products: no 64-node rule can have a lower ratio on this machine.",
        "",
        "| D | N | factor | solver | steps | conv | time (s) median [min] | compile (s) | B / N | test LL / N_test "
        "| newton steps | newton time (s) | ratio (vg / products) | floor | load |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['D']} | {r['N']} | {r['factor']} | {r['solver']} | {r['steps']} | {r['converged']} | "
            f"{r['t_median']:.3f} [{r['t_min']:.3f}] | {r['compile']:.1f} | {r['bound_per_n']:.4f} | "
            f"{r['test_ll']:.4f} | {r['newton_steps']}{'' if r['newton_converged'] else ' (not conv.)'} | "
            f"{r['t_newton']:.3f} | {r['ratio']:.2f} ({r['t_vg_ms']:.1f} / {r['t_prod_ms']:.1f} ms) | "
            f"{r['floor']:.2f} | {r['load']:.1f} |")
    if peers:
        lines += ["", "## Peers at the largest cell (Full factor)", ""]
        s = peers.get("scipy")
        if s:
            lines.append(f"- scipy L-BFGS-B on (m, C), jitted jax value_and_grad: {s['wall']:.2f} s wall "
                         f"({s['cpu']:.2f} s CPU), {s['iters']} iterations / {s['nfev']} evaluations, final "
                         f"max|grad| {s['gmax']:.1e} ({'converged' if s['converged'] else 'NOT converged'}), "
                         f"bound gap to ours {s['gap']:.2e}.")
        n = peers.get("numpyro", {})
        if "error" in n:
            lines.append(f"- numpyro: {n['error']}")
        for name, v in n.items():
            if name == "error":
                continue
            lines.append(f"- numpyro SVI {name}, Adam(5e-3), {v['steps']} steps: {v['wall']:.1f} s wall "
                         f"({v['cpu']:.1f} s CPU); ELBO (1000 particles) {v['elbo']:.2f}, gap to our bound "
                         f"{v['gap']:.2f} nats.")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
