"""Guards against two silent costs: a fit in float32 because JAX's x64 mode is off, and a `Custom` potential whose
`log_phi` is a new lambda on every call (a new static field, so a new compilation each time).

- `warn_float32(dtype)`: once per process, a `Float32Warning` (a `UserWarning`, so users can silence it) where a
  fit runs in float32 only because `jax_enable_x64` is off.
- `CodeKey(fn)`: the static field that `Custom` stores in place of `log_phi`. JAX reuses a compiled program when
  the static fields compare equal; a plain function compares by identity, so `Custom(lambda x: ...)` built anew in
  a loop compiled anew every time. `CodeKey` compares what the function computes instead: its code object, its
  globals, and the values it closes over (numbers and strings by value, arrays by shape, dtype and bytes, nested
  functions and `functools.partial` recursively, any other object by identity). Two keys that are equal trace to
  the same program, so sharing the compilation is safe.
- `note_trace(key)`: called when `Custom.log_phi` is traced; where the same code with the same by-value captures
  is traced for a third distinct object captured by identity (two recompilations that `CodeKey` could not
  avoid), one `RecompilationWarning` says what to do.
"""

import functools
import hashlib
import types
import warnings

import jax
import numpy as np


class Float32Warning(UserWarning):
    """A fit ran in float32 because JAX's x64 mode is off (`jax.config.update("jax_enable_x64", True)` at the
    start of the program turns it on; `warnings.filterwarnings("ignore", category=gk.Float32Warning)` silences
    this warning)."""


class RecompilationWarning(UserWarning):
    """The same model structure was compiled again because a `Custom` potential's function captures a new
    object on every call."""


_WARNED = {"float32": False}


def warn_float32(dtype, where: str = "gkl_jax.fit") -> None:
    """Warn once per process where `dtype` is float32 (or narrower) and JAX's x64 mode is off.

    Args:
        dtype: the fit's floating dtype.
        where: the function named in the message.
    """
    x64 = np.dtype(jax.dtypes.canonicalize_dtype(np.float64)).itemsize == 8    # the setting in this context
    if _WARNED["float32"] or np.finfo(dtype).bits >= 64 or x64:
        return
    _WARNED["float32"] = True
    warnings.warn(f"{where} runs in {np.dtype(dtype).name} because JAX's x64 mode is off (tolerances 1e-3, about 7 "
                  "significant digits). For float64, run jax.config.update('jax_enable_x64', True) at the start "
                  "of the program; to keep float32 and silence this, warnings.filterwarnings('ignore', "
                  "category=gkl_jax.Float32Warning). Shown once per process.", Float32Warning, stacklevel=4)


class _Identity:
    """A captured object compared by identity (its own `==` may be elementwise or costly)."""

    __slots__ = ("obj",)

    def __init__(self, obj):
        self.obj = obj

    def __eq__(self, other):
        return isinstance(other, _Identity) and self.obj is other.obj

    def __hash__(self):
        return id(self.obj)


_SCALARS = (type(None), bool, int, float, complex, str, bytes)
_MAX_DEPTH = 8


def _value(v, depth):
    """A hashable stand-in for a captured value: equal stand-ins mean equal constants in the traced program."""
    if isinstance(v, _SCALARS):
        return (type(v).__name__, repr(v))
    if isinstance(v, (tuple, frozenset)) and depth < _MAX_DEPTH:
        return (type(v).__name__, tuple(_value(x, depth + 1) for x in v))
    if isinstance(v, (np.ndarray, np.generic)) or (isinstance(v, jax.Array) and not isinstance(v, jax.core.Tracer)):
        a = np.asarray(v)
        if a.dtype != object:
            return ("array", a.shape, a.dtype.str, hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest())
    if isinstance(v, (types.FunctionType, functools.partial)) and depth < _MAX_DEPTH:
        return _function_key(v, depth + 1)
    if isinstance(v, (types.ModuleType, types.BuiltinFunctionType, type)):
        return ("object", v)        # singletons: equality is identity, and they never count as "new"
    return _Identity(v)


def _function_key(fn, depth=0):
    if isinstance(fn, functools.partial):
        return ("partial", _value(fn.func, depth), _value(tuple(fn.args), depth),
                _value(tuple(sorted(fn.keywords.items())), depth))
    if not isinstance(fn, types.FunctionType):
        return _Identity(fn)
    closure = tuple(_value(c.cell_contents, depth) if _filled(c) else ("empty",) for c in (fn.__closure__ or ()))
    defaults = _value(fn.__defaults__, depth)
    kwdefaults = _value(tuple(sorted((fn.__kwdefaults__ or {}).items())), depth)
    return ("function", fn.__code__, _Identity(fn.__globals__), closure, defaults, kwdefaults)


def _filled(cell):
    try:
        cell.cell_contents
    except ValueError:      # a cell not yet assigned
        return False
    return True


def _split(key):
    """(the key with objects compared by identity replaced by their type's name, the tuple of those objects)."""
    if isinstance(key, _Identity):
        return ("new", type(key.obj).__qualname__), (key,)
    if isinstance(key, tuple):
        parts = [_split(k) for k in key]
        return tuple(p for p, _ in parts), sum((i for _, i in parts), ())
    return key, ()


class CodeKey:
    """A function as a static field, equal to another wrapping a function that computes the same (module doc).

    Args:
        fn: the callable (a Python function, lambda, `functools.partial` or any callable).
    """

    __slots__ = ("fn", "key", "_hash")

    def __init__(self, fn):
        self.fn = fn
        self.key = _function_key(fn)
        self._hash = hash(self.key)

    def __call__(self, *args, **kwargs):
        return self.fn(*args, **kwargs)

    def __eq__(self, other):
        return isinstance(other, CodeKey) and (self.fn is other.fn or self.key == other.key)

    def __hash__(self):
        return self._hash

    def __repr__(self):
        return f"CodeKey({self.fn!r})"


_TRACED: dict = {}
"""By-value part of a traced key -> the distinct identity parts (`_Identity` tuples) traced with it (`note_trace`)."""
_NOTED: set = set()


def note_trace(key: CodeKey) -> None:
    """Record that `key`'s function is being traced; warn once (`RecompilationWarning`) where its code and
    by-value captures have now been traced with three distinct captured objects.

    Args:
        key: the `CodeKey` of a `Custom` potential.
    """
    shape, identities = _split(key.key)
    if not identities:
        return
    try:
        if shape in _NOTED:
            return
        seen = _TRACED.setdefault(shape, set())
    except TypeError:           # an unhashable by-value part: nothing to compare
        return
    # the captured objects themselves (compared by identity), not their ids: an id is reused once its object is
    # freed, and a loop creating a new object per call often gets the same id back (at most 2 kept per code)
    seen.add(tuple(identities))
    if len(seen) >= 3 and shape not in _NOTED:
        _NOTED.add(shape)
        _TRACED.pop(shape, None)
        code = getattr(key.fn, "__code__", None)
        where = f" (defined at {code.co_filename}:{code.co_firstlineno})" if code is not None else ""
        kinds = ", ".join(sorted({type(i.obj).__qualname__ for i in identities}))
        warnings.warn(f"gkl_jax.potentials.Custom: log_phi{where} has been compiled {len(seen)} times for the same "
                      f"code because it captures a new object on each call ({kinds}), which JAX can only compare "
                      "by identity; every fit of it compiles again (seconds each). Create the function and its "
                      "captured objects once, outside the loop, or capture only numbers, strings and arrays.",
                      RecompilationWarning, stacklevel=2)
