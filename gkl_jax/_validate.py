"""Input checks at the boundary where data enters (constructors, the CLI).

Every check works on concrete values and is skipped for tracers, so constructors stay usable inside
`jax.jit`, `jax.grad` and `jax.vmap`; shape checks always run (shapes are static under tracing). On a tracer the
value checks (`check_finite`, `check_positive`, a traced `tol` of `gkl_jax.fit`) become
`jax.experimental.checkify.debug_check`s: no-ops, unless the caller wraps the transformed function in
`checkify.checkify`, which then returns the failed check's message as an error value. Inside a top-level
`gkl_jax._program.program` (no user transformation around it, so no `checkify` can be) they are left out
(`debug_check`): a check in a program gives it an effect, which turns off JAX's fast dispatch (its C++ path: the
Python path re-partitions the arguments on every warm call).
"""

import math
import operator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import checkify

from ._checks import checks_traced
from ._processes import local_values, spans_processes


def is_concrete(x) -> bool:
    """True when `x` holds actual values (not a tracer) and no trace is staging operations: inside `jit` (or
    `checkpoint`, `eval_shape`) a check on a closed-over concrete array would itself be a tracer, so it is skipped.
    The probe is `jax.device_put(0.0)`, a tracer exactly where `jnp.asarray(0.0)` is; outside a trace it compiles
    nothing, where `jnp.asarray` compiles a small program on its first call in a process (paid by a first fit)."""
    return not isinstance(x, jax.core.Tracer) and not isinstance(jax.device_put(0.0), jax.core.Tracer)


def device_array(x, dtype=None):
    """`x` as a JAX array: a host value (numpy array, numpy or Python scalar) by `jax.device_put`, which compiles
    nothing, where JAX 0.10's `jnp.asarray` compiles a small program for each new shape and dtype (paid by a first
    fit); a JAX array or tracer by `jnp.asarray`.

    Args:
        x: array-like.
        dtype: the dtype (canonicalised as JAX does: float64 becomes float32 without x64), or None for x's own.

    Returns:
        A JAX array.
    """
    if isinstance(x, (jax.Array, jax.core.Tracer)):
        return jnp.asarray(x, dtype)
    return jax.device_put(np.asarray(x, dtype))


def as_float_array(x, name: str, *, dtype=None) -> jax.Array:
    """Convert `x` to a floating JAX array, refusing non-numeric input with a ValueError naming `name`."""
    if dtype is None and isinstance(x, (int, float)) and not isinstance(x, bool):
        return jax.device_put(float(x))   # weakly typed, as jnp.asarray would make it (it adopts float32 data's dtype)
    if isinstance(x, jax.Array) or isinstance(x, jax.core.Tracer):
        if dtype is None and jnp.issubdtype(x.dtype, jnp.floating):
            return x                      # as it is: a weakly typed scalar stays weak (e.g. a rebuilt default)
        arr: Any = x
    else:
        try:
            arr = np.asarray(x)
        except Exception as err:  # pragma: no cover - numpy raises many types here
            raise ValueError(f"{name} must be numeric, got {type(x).__name__}") from err
        if arr.dtype.kind not in "biuf":
            raise ValueError(f"{name} must be numeric, got dtype {arr.dtype}")
    if dtype is None:   # JAX's canonical dtype: float64 data become float32 without x64, as jnp.asarray does
        dtype = jax.dtypes.canonicalize_dtype(arr.dtype) if jnp.issubdtype(arr.dtype, jnp.floating) \
            else jnp.result_type(float)
    return jnp.asarray(arr, dtype=dtype) if isinstance(arr, (jax.Array, jax.core.Tracer)) else device_array(arr, dtype)


def strongly_typed(tree, dtype):
    """`tree` with its weakly typed array leaves (from Python floats, see `as_float_array`) cast to `dtype`, as
    they would be on meeting data of that dtype. A host loop that feeds a compiled function first the user's
    values and then its own (strongly typed) iterates would otherwise compile it twice."""
    return jax.tree.map(lambda x: x.astype(dtype) if getattr(x, "weak_type", False) else x, tree)


def host_arrays(tree):
    """`tree` with every JAX array leaf replaced by a numpy copy: the pickled state of an object that keeps JAX
    arrays. A float64 JAX array unpickles as float32 where x64 is off (JAX converts it on loading), so a fitted
    estimator saved with `pickle` or `joblib` would predict from truncated parameters; numpy arrays keep their
    dtype, and JAX takes them as they are.

    Args:
        tree: any pytree (objects that are not pytrees are leaves, left as they are).

    Returns:
        The same structure.
    """
    return jax.tree.map(lambda x: np.asarray(x) if isinstance(x, jax.Array) else x, tree)


def host_view(x):
    """A concrete `x` where it is cheapest to check: a numpy array for numpy data and arrays on the CPU (no program to
    compile for each new shape), `x` itself for arrays on an accelerator (no copy). Both have `.all()`, `.round()`
    and the comparison operators. An array that spans other processes' devices gives this process's entries,
    flattened (`local_values`): each process checks its own rows."""
    if spans_processes(x):
        return local_values(x)
    if isinstance(x, jax.Array) and any(d.platform != "cpu" for d in x.devices()):
        return x
    return np.asarray(x)


def debug_check(predicate, message: str) -> None:
    """`checkify.debug_check(predicate, message)`, except while a top-level `program` is traced (`checks_traced`).

    Args:
        predicate: traced bool scalar.
        message: the error message where a caller's `checkify.checkify` finds the check failed.
    """
    if checks_traced():
        checkify.debug_check(predicate, message)


def check_finite(x, name: str) -> None:
    """Raise ValueError if a concrete `x` holds NaN or inf (a checkify check on a tracer)."""
    if not is_concrete(x):
        debug_check(jnp.all(jnp.isfinite(x)), f"{name} contains NaN or inf")
        return
    a = host_view(x)
    if not bool((np.isfinite(a) if isinstance(a, np.ndarray) else jnp.isfinite(a)).all()):
        raise ValueError(f"{name} contains NaN or inf")


def check_positive(x, name: str) -> None:
    """Raise ValueError if a concrete `x` has an entry <= 0 (or NaN) (a checkify check on a tracer)."""
    if not is_concrete(x):
        debug_check(jnp.all(x > 0), f"{name} must be positive")
        return
    if not bool((host_view(x) > 0).all()):
        raise ValueError(f"{name} must be positive, got {np.ravel(host_view(x))[:5]}")


def as_int(value):
    """`value` as a Python int when it is a whole number (an integer of any type, 0-d integer arrays included, or
    a float with an integral value), else None (bools, None, strings, NaN, 2.5, ...)."""
    if isinstance(value, (bool, np.bool_, str, bytes)):
        return None
    try:
        return operator.index(value)
    except TypeError:
        pass
    if isinstance(value, (float, np.floating)) and math.isfinite(value) and float(value).is_integer():
        return int(value)
    return None


def check_int(value, name: str, minimum: int = 0) -> int:
    """A count or size option as a Python int, with a ValueError naming `name` unless it is a whole number
    >= `minimum` (see `as_int`)."""
    result = as_int(value)
    if result is None or result < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return result


MAX_STEPS = 10**7
"""The largest step budget a solver takes: its history of the objective (one entry per step) is allocated up
front, 80 MB in float64 at this size."""


def check_max_steps(value, name: str = "max_steps") -> int:
    """A solver's step budget as a Python int in [1, MAX_STEPS], else a ValueError naming `name`."""
    result = check_int(value, name, 1)
    if result > MAX_STEPS:
        raise ValueError(f"{name} must be <= {MAX_STEPS:,} (the history of the objective is allocated up front, "
                         f"one entry per step), got {value!r}")
    return result


def _as_float(value) -> float:
    """`value` as a Python float, NaN for what is not a number (None, strings, bools)."""
    if isinstance(value, (bool, np.bool_)):
        return float("nan")
    try:
        return float(value)
    except (TypeError, ValueError):
        return float("nan")


def check_tol(tol, name: str = "tol") -> float:
    """A tolerance as a Python float, with a ValueError naming `name` unless it is a positive finite number."""
    value = _as_float(tol)
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be positive and finite, got {tol!r}")
    return value


def check_nonnegative(value, name: str) -> float:
    """A Python float, with a ValueError naming `name` unless it is a finite number >= 0 (a jitter, a tolerance
    that may be 0)."""
    result = _as_float(value)
    if not (math.isfinite(result) and result >= 0):
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    return result


def as_list(value, name: str, kind: str) -> list:
    """`value` as a list, with a ValueError naming `name` for a string (which would become a list of letters) or
    anything that is not iterable; `kind` names what the sequence should hold."""
    if isinstance(value, (str, bytes)):
        raise ValueError(f"{name} must be a sequence of {kind}, got {value!r}")
    try:
        return list(value)
    except TypeError:
        raise ValueError(f"{name} must be a sequence of {kind}, got {type(value).__name__}") from None


def check_key(key, name: str = "key"):
    """`key` if it is a JAX random key (typed, from `jax.random.key`, or raw uint32 pairs from
    `jax.random.PRNGKey`), else a ValueError naming `name`."""
    dtype = getattr(key, "dtype", None)
    if dtype is not None and (jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key)
                              or (dtype == jnp.uint32 and jnp.shape(key)[-1:] == (2,))):
        return key
    raise ValueError(f"{name} must be a JAX random key (jax.random.key(0) or jax.random.PRNGKey(0)), got "
                     f"{type(key).__name__}")


def check_indices(indices, n: int, name: str = "indices") -> jax.Array:
    """`indices` as a 1-D integer array of rows in [0, n) (checked where concrete: JAX would clamp an index past
    the end and wrap a negative one, silently taking another row)."""
    indices = jnp.asarray(indices)
    if indices.ndim != 1 or not jnp.issubdtype(indices.dtype, jnp.integer):
        raise ValueError(f"{name} must be a 1-D integer array, got shape {indices.shape} {indices.dtype}")
    if is_concrete(indices) and indices.size and not bool((jnp.min(indices) >= 0) & (jnp.max(indices) < n)):
        raise ValueError(f"{name} must lie in [0, {n}), got values from {int(jnp.min(indices))} to "
                         f"{int(jnp.max(indices))}")
    return indices


def check_ndim(x, ndim: int, name: str) -> None:
    if jnp.ndim(x) != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got shape {jnp.shape(x)}")


def site_vector(x, name: str, *, positive: bool = False):
    """Per-site data: a scalar or a 1-D array of length N, as a float array checked for NaN/inf."""
    arr = as_float_array(x, name)
    if arr.ndim > 1:
        raise ValueError(f"{name} must be a scalar or a 1-D array over sites, got shape {arr.shape}")
    if arr.ndim == 1 and arr.shape[0] == 0:
        raise ValueError(f"{name} is empty: give one value per site (at least one site) or a scalar")
    check_finite(arr, name)
    if positive:
        check_positive(arr, name)
    return arr


def site_count(**arrays):
    """The number of sites implied by per-site data given by keyword (`y=..., variance=...`; None when every
    array is a scalar); a ValueError naming the argument whose length differs from the first 1-D one's."""
    first = None
    for name, a in arrays.items():
        if jnp.ndim(a) != 1:
            continue
        if first is None:
            first = (name, int(a.shape[0]))
        elif int(a.shape[0]) != first[1]:
            raise ValueError(f"{name} has {int(a.shape[0])} entries but {first[0]} has {first[1]}: per-site "
                             f"arrays need one entry per site (or a scalar)")
    return None if first is None else first[1]
