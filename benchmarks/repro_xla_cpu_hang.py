"""A minimal reproducer of the XLA CPU hang behind README "Known issue" (for an upstream report).

jit(vmap(jvp)) of the Theorem 6 site bound over n = 2000 data (C = 5) never returns in some runs on a 2-core
machine (jax/jaxlib 0.10.2): 0% CPU, the main thread in BlockUntilReady, every Eigen worker in WaitForWork. The
same program pinned to one core (`taskset -c 0`) always returns; its pieces alone (the log-determinant, the
log-sum-exp term, the trace) returned in 5 of 5 runs each.

    for i in 1 2 3 4 5; do timeout 30 python benchmarks/repro_xla_cpu_hang.py; echo "exit $?"; done

Exit 124 (killed by `timeout`) is the hang; it printed "ok" otherwise.
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


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 2000)
