"""A minimal reproducer of the deadlock of jaxlib 0.10's batched CPU LAPACK kernels (docs: sharp bits), for an
upstream report, and a check that the library's own multiclass program no longer meets it.

jit(vmap(jvp)) of the Theorem 6 site bound over n = 2000 data (C = 5) never returns in some runs on a 2-core
machine (jax/jaxlib 0.10.2): 0% CPU, the main thread in BlockUntilReady, and (gdb) both threads of XLA's intra-op
pool inside `jax::ParallelBatchMap` -> `BlockingCounter::Wait`, each in a batched LAPACK kernel (Cholesky, LU)
waiting for parts of its batch queued behind the other. Pinned to one core (`taskset -c 0`) it always returns.

    for i in 1 2 3 4 5; do timeout 30 python benchmarks/repro_xla_cpu_hang.py; echo "exit $?"; done

Exit 124 (killed by `timeout`) is the hang; it printed "ok" otherwise.

`--digits` runs the library's own program: `gk.multiclass.fit_sparse` on 1000 standardised digits (scikit-learn's
`load_digits`, 10 classes) with 200 random inducing latents. It hung in 3 of 3 unpinned runs (2026-11-28, idle
2-core EPYC and Xeon) until the multiclass solvers ran their per-datum linear algebra in inline-sized chunks
(`gkl_jax.multiclass._blocks.per_datum`); since then it returns unpinned (3 of 3, 7.8-8.5 s on the Xeon):

    for i in 1 2 3; do timeout 120 python benchmarks/repro_xla_cpu_hang.py --digits; echo "exit $?"; done
"""

import sys

import jax
import jax.numpy as jnp
import numpy as np

jax.config.update("jax_enable_x64", True)

from gkl_jax.multiclass._site import site_bound_free  # noqa: E402


def main(n=2000, C=5):
    rng = np.random.default_rng(0)
    m = jnp.asarray(rng.normal(size=(n, C)))
    A = rng.normal(size=(n, C, C))
    V = jnp.asarray(A @ np.swapaxes(A, 1, 2) / C + 0.3 * np.eye(C))
    b = jnp.full((n, C), 1.0 / C)
    S = jnp.asarray(np.linalg.inv(np.asarray(V)) + np.eye(C) / C)

    def slope(m, V, b, S):
        return jax.jvp(lambda t: site_bound_free(m, V, b, (1 + t) * S), (0.5,), (1.0,))[1]

    out = jax.jit(jax.vmap(slope))(m, V, b, S)
    print("ok", float(jnp.sum(out)), flush=True)


def digits(n=1000, num_inducing=200):
    import time

    from sklearn.datasets import load_digits

    import gkl_jax as gk

    X, y = load_digits(return_X_y=True)
    X = X[:, X.std(0) > 0]
    X = (X - X.mean(0)) / X.std(0)
    rng = np.random.default_rng(0)
    train = rng.permutation(len(y))[:n]
    kernel = gk.kernels.SquaredExponential(1.0, float(np.sqrt(X.shape[1])))
    sites = rng.choice(n * 10, size=num_inducing, replace=False)
    start = time.perf_counter()
    post = gk.multiclass.fit_sparse(kernel, X[train], y[train], sites, num_classes=10)
    print("ok", round(time.perf_counter() - start, 1), float(post.log_z), flush=True)


if __name__ == "__main__":
    if sys.argv[1:] == ["--digits"]:
        digits()
    else:
        main(int(sys.argv[1]) if len(sys.argv) > 1 else 2000)
