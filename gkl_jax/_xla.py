"""The XLA compiler options of the library's solver programs (`program`): compile time is what a user fitting a
new shape waits for.

On the CPU the programs are compiled without XLA's CPU fusion emitters, which roughly halves the compile time of a
first `gk.fit` at a small cost in warm run time (`benchmarks/compile.py`; the numbers are on the design-decisions
page and in `benchmarks/README.md`). The arithmetic is the same IEEE arithmetic either way (no fast-math). Other
backends keep XLA's defaults. An option the user sets in `XLA_FLAGS` wins, and `GKL_JAX_XLA_OPTIONS=0` turns it off.

Long sessions: XLA's CPU backend keeps each compiled program's code in its own memory mappings (~300 for one
compiled `gk.fit`) and ~25 MB of heap, freed only with the program; the compiler segfaults when a process reaches
Linux's `vm.max_map_count` (65530 by default), about 200 fits of different shapes. After a `program` compiles,
the process's mappings are counted (/proc/self/maps); past `mapping_limit()` JAX's compilation caches are
cleared (`jax.clear_caches`, which frees every program no longer referenced, the user's own jitted functions'
included: they recompile on their next call) and the freed heap is returned to the system (glibc's
`malloc_trim`; without it the resident size stays).
"""

import contextlib
import contextvars
import ctypes
import functools
import gc
import os
import sys

import jax
import numpy as np

CPU_OPTIONS = {"xla_cpu_use_fusion_emitters": False}
"""The compiler options of `program` on the CPU backend."""


def cpu_compiler_options(extra=None) -> dict:
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


def _top_level(args, kwargs) -> bool:
    """Whether a call with these arguments is outside every JAX trace (jit, grad, vmap): JAX accepts compiler
    options only on a top-level jit, and a program called inside another is compiled as part of the outer one."""
    try:
        from jax._src.core import trace_state_clean
    except ImportError:     # pragma: no cover - a JAX without it: look for tracers among the arguments
        return not any(isinstance(x, jax.core.Tracer) for x in jax.tree_util.tree_leaves((args, kwargs)))
    return trace_state_clean()


MAPPING_FRACTION = 0.5
"""The share of `vm.max_map_count` past which `release_if_crowded` clears the compilation caches."""
MAX_MAPPINGS = 12288
"""The default limit on this process's mappings (~40 compiled fits, ~1 GB of their heap), if below that share."""
RELEASES = {"count": 0}
"""How many times `release_if_crowded` cleared the caches in this process."""


def mapping_count() -> int:
    """The number of memory mappings of this process (lines of /proc/self/maps; 0 where there is none)."""
    try:
        with open("/proc/self/maps", "rb") as maps:
            return maps.read().count(b"\n")
    except OSError:     # not Linux
        return 0


@functools.cache
def _max_map_count() -> int:
    try:
        with open("/proc/sys/vm/max_map_count") as f:
            return int(f.read())
    except (OSError, ValueError):
        return 65530


def mapping_limit() -> int:
    """The mapping count past which the caches are cleared: `GKL_JAX_MAX_MAPPINGS` if set (0 turns the release
    off), else the smaller of `MAX_MAPPINGS` and `MAPPING_FRACTION` of the kernel's vm.max_map_count.

    Returns:
        int.
    """
    env = os.environ.get("GKL_JAX_MAX_MAPPINGS", "")
    return int(env) if env.strip() else min(MAX_MAPPINGS, int(MAPPING_FRACTION * _max_map_count()))


def release_if_crowded(limit: int | None = None) -> bool:
    """Clear JAX's compilation caches (collect the programs they held and return the freed heap to the system)
    where this process holds more than `limit` memory mappings.

    Args:
        limit: the mapping count to stay under; None for `mapping_limit()`; 0 or less never releases.

    Returns:
        bool: whether the caches were cleared.
    """
    limit = mapping_limit() if limit is None else limit
    if limit <= 0 or mapping_count() <= limit:
        return False
    jax.clear_caches()
    gc.collect()
    _trim_heap()
    RELEASES["count"] += 1
    return True


def _trim_heap() -> None:
    """Return the C heap's free memory to the system (glibc `malloc_trim(0)`; nothing elsewhere)."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libc.so.6").malloc_trim(0)
        except (OSError, AttributeError):   # not glibc (musl)
            pass


LAPACK_BOUND = {"xla_backend_optimization_level": 1}
"""Extra CPU options for programs whose run time is in LAPACK and Eigen calls rather than in XLA's own loops (the
multiclass solvers): LLVM level 1 compiles them ~40% faster at the same warm speed (design-decisions page)."""


_UNCHECKED = contextvars.ContextVar("gkl_jax_unchecked_program", default=False)


def checks_traced() -> bool:
    """Whether a traced value check (`gkl_jax._validate.debug_check`) goes into the program being traced: not while
    a top-level `program` is traced, where no `checkify.checkify` can surround it."""
    return not _UNCHECKED.get()


@contextlib.contextmanager
def _unchecked(active: bool):
    token = _UNCHECKED.set(True) if active else None
    try:
        yield
    finally:
        if token is not None:
            _UNCHECKED.reset(token)


def _is_array(x) -> bool:
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
        mask = tuple(_is_array(x) for x in leaves)
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
                with _unchecked(self.top):
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
        compiled, `release_if_crowded` runs.
    """
    if fun is None:
        return functools.partial(program, cpu_options=cpu_options)
    options = cpu_compiler_options(cpu_options)
    traces = [0]

    @functools.wraps(fun)
    def counted(*args, **kwargs):
        traces[0] += 1
        return fun(*args, **kwargs)

    on_cpu, top_level, inner = _Dispatch(counted, options, True), _Dispatch(counted, None, True), \
        _Dispatch(counted, None, False)

    def pick(top):
        if not top:
            return inner
        return on_cpu if options and jax.default_backend() == "cpu" else top_level

    @functools.wraps(fun)
    def call(*args, **kwargs):
        top = _top_level(args, kwargs)
        before = traces[0]
        out = pick(top)(*args, **kwargs)
        if top and traces[0] != before:     # a new top-level program was compiled: release if crowded
            release_if_crowded()
        return out

    call.lower = lambda *args, **kwargs: pick(_top_level(args, kwargs)).lower(*args, **kwargs)
    return call


def bucket(n: int, minimum: int = 16, steps: int = 1) -> int:
    """The padded size for n: arrays padded to bucket sizes share one compiled program per bucket instead of one
    per size (the scikit-learn estimators' designs, the multiclass classifier's test points).

    Args:
        n: a size.
        minimum: the smallest padded size (a power of two).
        steps: sizes per octave: 1 gives powers of two; 4 gives 2^k (1, 1.25, 1.5, 1.75), at most 25% padding.

    Returns:
        int, the smallest such size >= max(n, minimum).
    """
    n = max(int(n), int(minimum))
    octave = 1 << max(n - 1, 0).bit_length() >> 1            # the largest power of two below n (n > 1)
    if octave == 0 or steps <= 1 or octave * 2 == n:
        return int(max(minimum, 1 << max(n - 1, 0).bit_length()))
    step = max(octave // steps, 1)
    return int(-(-n // step) * step)
