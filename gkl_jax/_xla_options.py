"""The XLA compiler options of the library's compiled programs (internal API: `gkl_jax._program.program` reads them;
not part of the public interface).

Compile time is what a user fitting a new shape waits for. On the CPU the programs are compiled without XLA's CPU
fusion emitters, which roughly halves the compile time of a first `gk.fit` at a small cost in warm run time
(`benchmarks/compile.py`; the numbers are on the design-decisions page and in `benchmarks/README.md`). The
arithmetic is the same IEEE arithmetic either way (no fast-math). Other backends keep XLA's defaults. An option
the user sets in `XLA_FLAGS` wins, and `GKL_JAX_XLA_OPTIONS=0` turns them off.
"""

import os

CPU_OPTIONS = {"xla_cpu_use_fusion_emitters": False}
"""The compiler options of `program` on the CPU backend."""

LAPACK_BOUND = {"xla_backend_optimization_level": 1}
"""Extra CPU options for programs whose run time is in LAPACK and Eigen calls rather than in XLA's own loops (the
multiclass solvers): LLVM level 1 compiles them ~40% faster at the same warm speed (design-decisions page)."""


def cpu_compiler_options(extra: dict | None = None) -> dict:
    """`CPU_OPTIONS` and `extra` less those the user set in `XLA_FLAGS` ({} with `GKL_JAX_XLA_OPTIONS=0`).

    Args:
        extra: further XLA debug options by name (a program's own, see `program`), or None.

    Returns:
        dict: XLA debug options by name.
    """
    if os.environ.get("GKL_JAX_XLA_OPTIONS", "1") == "0":
        return {}
    flags = os.environ.get("XLA_FLAGS", "")
    return {name: value for name, value in {**CPU_OPTIONS, **(extra or {})}.items() if name not in flags}
