"""Whether a call is outside every JAX trace (internal API, not part of the public interface).

JAX accepts compiler options only on a top-level `jax.jit`, and a program called inside another trace (`jit`,
`grad`, `vmap`) is compiled as part of the outer one; `gkl_jax._program.program`, `gk.bound` and `gk.predict`
pick their path with `top_level`. The test reads JAX's private `trace_state_clean` (one call, no argument walk);
where a JAX lacks it, the arguments are searched for tracers instead.
"""

import jax


def top_level(args: tuple, kwargs: dict) -> bool:
    """Whether a call with these arguments is outside every JAX trace (jit, grad, vmap).

    Args:
        args: the call's positional arguments.
        kwargs: the call's keyword arguments.

    Returns:
        bool: True outside every trace.
    """
    try:
        from jax._src.core import trace_state_clean
    except ImportError:     # pragma: no cover - a JAX without it: look for tracers among the arguments
        return not any(isinstance(x, jax.core.Tracer) for x in jax.tree_util.tree_leaves((args, kwargs)))
    return trace_state_clean()
