"""FactorAnalysis optima of Tables 2-4 (D = 250, K = 25, N = 125 / 250 / 1250, seeds 0-2) at a given tolerance,
to compare two checkouts of the library: run it once per tree and diff the JSON lines.

    PYTHONPATH=../before python benchmarks/fa_optima.py 1e-9 > before.json
    python benchmarks/fa_optima.py 1e-9 > now.json

Prints one JSON object {"N-seed": [log_z, L-BFGS steps, converged, seconds]} on stdout (progress on stderr).
"""

import json
import sys
import time

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402

import gkl_jax as gk  # noqa: E402


def main(tol):
    print(gk.__file__, file=sys.stderr)
    out = {}
    for N in (125, 250, 1250):
        for seed in range(3):
            d = gk.datasets.synthetic_logistic(250, N, 2500, seed=seed)
            model = gk.Model(gk.priors.Isotropic(250, jnp.asarray(1.0)),
                             gk.Sites(jnp.asarray(d["X_train"]), gk.potentials.Logistic(jnp.asarray(d["y_train"]))))
            t0 = time.perf_counter()
            r = gk.fit(model, factor=gk.factors.FactorAnalysis(25), tol=tol, max_steps=20000)
            out[f"{N}-{seed}"] = (float(r.log_z), int(r.num_steps), bool(r.converged), time.perf_counter() - t0)
            print(N, seed, out[f"{N}-{seed}"], file=sys.stderr, flush=True)
    print(json.dumps(out))


if __name__ == "__main__":
    main(float(sys.argv[1]) if len(sys.argv) > 1 else 1e-3)
