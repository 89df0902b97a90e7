"""Stationary Gram matrices: r^2 from differences against r^2 from the product |a|^2 + |b|^2 - 2 a^T b.

    python benchmarks/kernel_gram.py

`kernels._kernels.DIRECT_MAX_DIM` picks differences up to that input dimension. This prints the steady-state
time of one jitted Matern32 Gram value and its gradient in the kernel's parameters for both forms (each form in
its own process, so the compiled programs do not mix), and the accuracy that motivates the differences: the
kernel between points 1 apart at 1e8, against the pointwise k(x, x').
"""

import subprocess
import sys
import time

SIZES, DIMS, REPEATS = (300, 1000, 3000), (1, 2, 3), 20


def measure(direct_max_dim: int) -> None:
    import equinox as eqx
    import jax
    import jax.numpy as jnp
    import numpy as np

    jax.config.update("jax_enable_x64", True)
    import gkl_jax as gk
    from gkl_jax.kernels import _kernels

    _kernels.DIRECT_MAX_DIM = direct_max_dim
    f = eqx.filter_jit(eqx.filter_value_and_grad(lambda k, X: jnp.sum(k.gram(X))))
    for n in SIZES:
        for d in DIMS:
            X = jnp.asarray(np.random.default_rng(0).normal(size=(n, d)))
            k = gk.kernels.Matern32(1.0, 1.3)
            jax.block_until_ready(f(k, X))
            start = time.perf_counter()
            for _ in range(REPEATS):
                jax.block_until_ready(f(k, X))
            print(n, d, (time.perf_counter() - start) / REPEATS * 1e3, flush=True)
    se = gk.kernels.SquaredExponential(1.0, 1.0)
    X = np.array([0.0, 1e8, 1e8 + 1.0])
    print("far", float(se.gram(X)[1, 2]), float(se(X[1:2], X[2:3])))


def run(direct_max_dim: int):
    out = subprocess.run([sys.executable, __file__, "--measure", str(direct_max_dim)], check=True,
                         capture_output=True, text=True).stdout.split("\n")
    times = {(int(a), int(b)): float(c) for a, b, c in (line.split() for line in out if line and line[0].isdigit())}
    far = next(line.split()[1:] for line in out if line.startswith("far"))
    return times, far


def main() -> None:
    direct, far_direct = run(max(DIMS))
    product, far_product = run(0)
    print(f"{'n':>5} {'d':>2} {'differences ms':>15} {'product ms':>11} {'ratio':>6}")
    for n in SIZES:
        for d in DIMS:
            print(f"{n:>5} {d:>2} {direct[n, d]:>15.2f} {product[n, d]:>11.2f} {direct[n, d] / product[n, d]:>6.2f}")
    print(f"k(1e8, 1e8 + 1), SquaredExponential(1, 1): exact {far_direct[1]}, differences {far_direct[0]}, "
          f"product {far_product[0]}")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--measure":
        measure(int(sys.argv[2]))
    else:
        main()
