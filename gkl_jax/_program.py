"""`program`: the library's compiled programs, jit-compiled as `eqx.filter_jit` would through a leaner dispatch
(internal API, not part of the public interface).

Each `program` compiles per call signature with the CPU compiler options of `gkl_jax._xla_options` at the top level
(a plain jit inside another trace), leaves traced value checks out of top-level programs (`gkl_jax._checks`), and
after a top-level compilation lets `gkl_jax._memory.release_after_compile` release crowded memory.
"""

import functools

import jax
import numpy as np

from ._checks import unchecked
from ._memory import release_after_compile
from ._tracing import top_level
from ._xla_options import cpu_compiler_options


def is_array(x) -> bool:
    """Whether a leaf is traced by `program` (as `eqx.is_array`: JAX and NumPy arrays)."""
    return isinstance(x, (jax.Array, np.ndarray, np.generic))


class _Dispatch:
    """`fun` compiled per call signature, with JAX's own dispatch on the warm path.

    The call's pytree is flattened once; its array leaves are the arguments of a `jax.jit` function cached under
    (tree structure, the other leaves), which holds everything else as constants of the trace. A warm call is then
    one `tree_flatten` and JAX's C++ fast path: `eqx.filter_jit`, which re-partitions the whole argument tree in
    Python on every call, took a sizeable share of the estimators' warm fits of a few milliseconds
    (design-decisions page). Outputs may hold non-array leaves (strings, static fields), returned as traced.

    Args:
        fun: the function.
        options: XLA compiler options, or None.
        top: whether it is called outside every trace: its traced value checks are left out (`checks_traced`),
            as they can never fire there and their effect would turn off JAX's C++ dispatch.
    """

    def __init__(self, fun, options, top):
        self.fun = fun
        self.options = options or None
        self.top = top
        self.cache = {}

    def _entry(self, args, kwargs):
        leaves, treedef = jax.tree_util.tree_flatten((args, kwargs))
        mask = tuple(is_array(x) for x in leaves)
        static = tuple(None if m else x for x, m in zip(leaves, mask))
        key = (treedef, mask, static)
        try:
            entry = self.cache.get(key)
        except TypeError as err:    # an unhashable static leaf: as eqx.filter_jit, refuse it
            raise ValueError(f"{getattr(self.fun, '__name__', 'program')}: every non-array argument must be "
                             f"hashable ({err})") from err
        if entry is None:
            out_tree = {}

            def traced(*arrays):
                it = iter(arrays)
                full = [next(it) if m else x for x, m in zip(static, mask)]
                a, k = jax.tree_util.tree_unflatten(treedef, full)
                with unchecked(self.top):
                    out = self.fun(*a, **k)
                out_leaves, out_def = jax.tree_util.tree_flatten(out)
                out_mask = tuple(isinstance(x, jax.Array) for x in out_leaves)
                out_tree["def"], out_tree["mask"] = out_def, out_mask
                out_tree["static"] = [None if m else x for x, m in zip(out_leaves, out_mask)]
                return [x for x, m in zip(out_leaves, out_mask) if m]

            jitted = jax.jit(traced, compiler_options=self.options) if self.options else jax.jit(traced)
            entry = self.cache[key] = (jitted, out_tree)
        return entry, [x for x, m in zip(leaves, mask) if m]

    def __call__(self, *args, **kwargs):
        (jitted, out_tree), arrays = self._entry(args, kwargs)
        outs = iter(jitted(*arrays))
        full = [next(outs) if m else x for m, x in zip(out_tree["mask"], out_tree["static"])]
        return jax.tree_util.tree_unflatten(out_tree["def"], full)

    def lower(self, *args, **kwargs):
        (jitted, _), arrays = self._entry(args, kwargs)
        return jitted.lower(*arrays)


def program(fun=None, *, cpu_options=None):
    """`fun` jit-compiled as `eqx.filter_jit` would (its arrays traced, everything else static) through a leaner
    dispatch (`_Dispatch`), with `cpu_compiler_options(cpu_options)` where JAX's default backend is the
    CPU and the call is not inside another trace (under `jax.jit`, `jax.grad` or `jax.vmap` it is compiled as part
    of the outer program). Use as `@program` or `@program(cpu_options=LAPACK_BOUND)`.

    Args:
        fun: the function to compile (its arrays traced, everything else static and hashable).
        cpu_options: XLA debug options of this program beside `CPU_OPTIONS` (dict), or None.

    Returns:
        A callable with `fun`'s signature; `.lower(*args)` lowers it for the same backend. After a call that
        compiled, `release_after_compile` runs.
    """
    if fun is None:
        return functools.partial(program, cpu_options=cpu_options)
    options = cpu_compiler_options(cpu_options)
    traces = [0]

    @functools.wraps(fun)
    def counted(*args, **kwargs):
        traces[0] += 1
        return fun(*args, **kwargs)

    on_cpu, top_level_call, inner = _Dispatch(counted, options, True), _Dispatch(counted, None, True), \
        _Dispatch(counted, None, False)

    def pick(top):
        if not top:
            return inner
        return on_cpu if options and jax.default_backend() == "cpu" else top_level_call

    @functools.wraps(fun)
    def call(*args, **kwargs):
        top = top_level(args, kwargs)
        before = traces[0]
        out = pick(top)(*args, **kwargs)
        if top and traces[0] != before:     # a new top-level program was compiled: release if crowded
            release_after_compile()
        return out

    call.lower = lambda *args, **kwargs: pick(top_level(args, kwargs)).lower(*args, **kwargs)
    return call
