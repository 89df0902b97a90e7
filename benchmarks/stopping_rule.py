"""A scale-aware stopping rule for float32 fits (issues 35 item 5 and 38): evidence for the proposal.

Bayesian logistic regression (D = 10, Isotropic(1) prior, Full factor), N = 10^4 and 10^5 sites, float32 and
float64. The library's Newton-CG step (`gkl_jax.solvers._newton.newton_cg`, one step per call) is iterated from `fit`'s
starting point, and at every iterate we record, in the fit's dtype:

- `grad`: max_i |g_i| (today's test: <= 1e-6 in float64, 1e-3 in float32);
- `scaled`: max_i |g_i| max(|x_i|, sigma0) / max(|f|, 1), sigma0 = sqrt(v0) the starting standard deviation of
  `fit` (v0 = min(prior variances, 1 / max_n ||h_n||^2), `_start.initial_variance`);
- `gap`: the float64 bound of the float64 optimum minus the float64 bound of the iterate (the true shortfall).

Then the invariance check of issue 38: Model(Isotropic(1.5 / a^2), Sites(a H, Logistic(y))) has the same log Z
for every a; each rule's statistic at fit's starting point must not depend on a (a = 1, 1e-4, 1e-7), and must
not claim convergence there (the absolute rule does at a = 1e-7).

Run:  python benchmarks/stopping_rule.py            (a few minutes on the shared 2-core machine)
      python benchmarks/stopping_rule.py --million  (float32 alone at N = 10^6, 20 steps)
Writes benchmarks/out/stopping_rule.json.
"""

import json
import os
import sys

import jax

jax.config.update("jax_enable_x64", True)

import equinox as eqx  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.flatten_util import ravel_pytree  # noqa: E402

import gkl_jax as gk  # noqa: E402
from gkl_jax import _start  # noqa: E402
from gkl_jax.solvers import _newton as _solvers  # noqa: E402

D, STEPS = 10, 25


def data(N, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((N, D))
    w = rng.standard_normal(D)
    y = np.where(X @ w + rng.logistic(size=N) > 0, 1.0, -1.0)
    return X, y


def model_of(X, y, dtype, a=1.0, variance=1.0):
    return gk.Model(gk.priors.Isotropic(D, jnp.asarray(variance / a**2, dtype)),
                    gk.Sites(jnp.asarray(a * X, dtype), gk.potentials.Logistic(jnp.asarray(y, dtype))))


def parts(model):
    """(flat x0, unravel, sigma0) at fit's starting point."""
    q0 = _start.initial_q(model, gk.factors.Full(), None)
    params, static = eqx.partition(q0, eqx.is_inexact_array)
    flat, unravel = ravel_pytree(params)
    to_q = lambda x: eqx.combine(unravel(x), static)
    return flat, to_q, jnp.sqrt(_start.initial_variance(model))


def statistics(model, to_q, sigma0, x):
    """(f, max|g|, scaled) at flat x, in x's dtype."""
    f = lambda z: gk.bound(model, to_q(z))
    fx, g = jax.value_and_grad(f)(x)
    scale = jnp.maximum(jnp.abs(x), sigma0)
    return fx, jnp.max(jnp.abs(g)), jnp.max(jnp.abs(g) * scale) / jnp.maximum(jnp.abs(fx), 1.0)


def trajectory(X, y, dtype, steps=STEPS):
    model = model_of(X, y, dtype)
    model64 = model_of(X, y, jnp.float64)
    x, to_q, sigma0 = parts(model)
    _, to_q64, _ = parts(model64)
    f = lambda z: gk.bound(model, to_q(z))
    step = jax.jit(lambda z: _solvers.newton_cg(f, z, tol=jnp.asarray(0.0, dtype), max_steps=1)[0])
    stats = jax.jit(lambda z: statistics(model, to_q, sigma0, z))
    f64 = jax.jit(lambda z: gk.bound(model64, to_q64(z.astype(jnp.float64))))
    rows = []
    for k in range(steps + 1):
        fx, g, s = (float(v) for v in stats(x))
        rows.append(dict(step=k, f=fx, grad=g, scaled=s, f64=float(f64(x))))
        x = step(x)
    return rows


def first(rows, key, thr):
    for r in rows:
        if r[key] <= thr:
            return r["step"]
    return None


def million(steps=20):
    """float32 alone at N = 10^6 (the size of issue 35's failure): max|g| and the scaled statistic per step."""
    X, y = data(1_000_000)
    rows = trajectory(X, y, jnp.float32, steps)
    print("\nN = 1000000, float32:  step  f  max|g|  scaled  (f64 bound of the iterate)")
    for r in rows:
        print(f"  {r['step']:3d} {r['f']:14.4f} {r['grad']:9.2e} {r['scaled']:9.2e} {r['f64']:16.6f}", flush=True)
    return rows


def main():
    if "--million" in sys.argv:
        rows = million()
        path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "out", "stopping_rule_million.json")
        with open(path, "w") as fh:
            json.dump(rows, fh, indent=1)
        return 0
    out = dict(machine="shared 2-core CPU", runs={}, rescaled={})
    for N in (10_000, 100_000):
        X, y = data(N)
        runs = {str(np.dtype(dt)): trajectory(X, y, dt) for dt in (jnp.float64, jnp.float32)}
        best = max(r["f64"] for rs in runs.values() for r in rs)
        for name, rows in runs.items():
            for r in rows:
                r["gap"] = best - r["f64"]
            out["runs"][f"{N}/{name}"] = rows
            print(f"\nN = {N}, {name}:  step  f  max|g|  scaled  gap(f64 nats)")
            for r in rows:
                print(f"  {r['step']:3d} {r['f']:14.6f} {r['grad']:9.2e} {r['scaled']:9.2e} {r['gap']:9.2e}")
    print("\nstatistics at fit's start of Model(Isotropic(1.5/a^2), Sites(a H, Logistic(y))), N = 200:")
    X, y = data(200, seed=1)
    for dt in (jnp.float64, jnp.float32):
        for a in (1.0, 1e-4, 1e-7):
            model = model_of(X, y, dt, a=a, variance=1.5)
            x, to_q, sigma0 = parts(model)
            fx, g, s = (float(v) for v in jax.jit(lambda z: statistics(model, to_q, sigma0, z))(x))
            out["rescaled"][f"{np.dtype(dt)}/a={a:g}"] = dict(f=fx, grad=g, scaled=s)
            print(f"  {str(np.dtype(dt)):8s} a = {a:6g}: f {fx:11.4f}  max|g| {g:9.2e}  scaled {s:9.2e}")
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "out", "stopping_rule.json")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as fh:
        json.dump(out, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
