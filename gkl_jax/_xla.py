"""The XLA compiler options of the library's solver programs (`program`): compile time is what a user fitting a
new shape waits for.

On the CPU the programs are compiled without XLA's CPU fusion emitters. The first `gk.fit` of Bayesian logistic
regression on ionosphere compiled in 2.9-3.2 s instead of 5.8-6.0 s with the Full factor (warm fit 73-76 against
66-72 ms) and in 1.9-2.6 s instead of 3.5-3.6 s with the Diagonal factor (warm 25-26 against 18-20 ms): an idle
2-core EPYC, `benchmarks/compile.py`, two runs each. LLVM optimisation level 1 as well compiled no faster and ran
the Full fit in 71-77 ms. The arithmetic is the same IEEE arithmetic either way (no fast-math). Other backends
keep XLA's defaults. An option the user sets in `XLA_FLAGS` wins, and `GKL_JAX_XLA_OPTIONS=0` turns it off.
"""

import functools
import os

import equinox as eqx
import jax

CPU_OPTIONS = {"xla_cpu_use_fusion_emitters": False}
"""The compiler options of `program` on the CPU backend."""


def cpu_compiler_options() -> dict:
    """`CPU_OPTIONS` less those the user set in `XLA_FLAGS` ({} with `GKL_JAX_XLA_OPTIONS=0`).

    Returns:
        dict: XLA debug options by name.
    """
    if os.environ.get("GKL_JAX_XLA_OPTIONS", "1") == "0":
        return {}
    flags = os.environ.get("XLA_FLAGS", "")
    return {name: value for name, value in CPU_OPTIONS.items() if name not in flags}


def _top_level(args, kwargs) -> bool:
    """Whether a call with these arguments is outside every JAX trace (jit, grad, vmap): JAX accepts compiler
    options only on a top-level jit, and a program called inside another is compiled as part of the outer one."""
    try:
        from jax._src.core import trace_state_clean
    except ImportError:     # pragma: no cover - a JAX without it: look for tracers among the arguments
        return not any(isinstance(x, jax.core.Tracer) for x in jax.tree_util.tree_leaves((args, kwargs)))
    return trace_state_clean()


def program(fun):
    """`eqx.filter_jit(fun)`, compiled with `cpu_compiler_options()` where JAX's default backend is the CPU and the
    call is not inside another trace (under `jax.jit`, `jax.grad` or `jax.vmap` it is a plain `eqx.filter_jit`).

    Args:
        fun: the function to compile (its arrays traced, everything else static, as for `eqx.filter_jit`).

    Returns:
        A callable with `fun`'s signature; `.lower(*args)` lowers it for the same backend.
    """
    options = cpu_compiler_options()
    on_cpu = eqx.filter_jit(fun, compiler_options=options) if options else eqx.filter_jit(fun)
    elsewhere = eqx.filter_jit(fun)

    def pick(args, kwargs):
        if options and jax.default_backend() == "cpu" and _top_level(args, kwargs):
            return on_cpu
        return elsewhere

    @functools.wraps(fun)
    def call(*args, **kwargs):
        return pick(args, kwargs)(*args, **kwargs)

    call.lower = lambda *args, **kwargs: pick(args, kwargs).lower(*args, **kwargs)
    return call
