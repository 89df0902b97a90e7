"""Readable reprs for results, Gaussians and kernels: values where they are concrete, JAX's short form
(`f64[3]`) where they are traced or large."""

import dataclasses

import jax
import numpy as np

from ._validate import is_concrete

MAX_SHOWN = 6
"""Arrays with more entries than this print as their dtype and shape."""


def format_value(x) -> str:
    """A value for a repr: a concrete scalar as `-123.456` (10 significant digits), a small concrete array as a
    list, a bool as True/False; a traced or larger array as its dtype and shape (`f64[34]`); anything else by
    `repr`.

    Args:
        x: any value.

    Returns:
        str.
    """
    if isinstance(x, (jax.Array, np.ndarray, np.generic)):
        shape = tuple(np.shape(x))
        short = f"{_dtype_name(x.dtype)}{list(shape)}"
        if not is_concrete(x) or int(np.prod(shape)) > MAX_SHOWN:
            return short
        try:
            a = np.asarray(x)
        except Exception:    # an array whose value cannot be read here (deleted, on another process)
            return short
        if a.dtype == bool:
            return str(a.tolist())
        if a.ndim == 0:
            return f"{a.item():.10g}" if a.dtype.kind == "f" else str(a.item())
        return "[" + ", ".join(f"{v:.6g}" if a.dtype.kind == "f" else str(v) for v in a.ravel().tolist()) + "]"
    return repr(x)


def _dtype_name(dtype) -> str:
    dtype = np.dtype(dtype)
    return {"f": "f", "i": "i", "u": "u", "b": "bool", "c": "c"}.get(dtype.kind, dtype.kind) + (
        "" if dtype.kind == "b" else str(8 * dtype.itemsize))


def module_repr(obj, items) -> str:
    """`Name(key=value, ...)` with each value through `format_value` (strings quoted).

    Args:
        obj: the object (its class name is used).
        items: (name, value) pairs.

    Returns:
        str.
    """
    return f"{type(obj).__name__}(" + ", ".join(f"{k}={format_value(v)}" for k, v in items) + ")"


def fields(obj):
    """(name, value) for each dataclass field of an Equinox module."""
    return [(f.name, getattr(obj, f.name)) for f in dataclasses.fields(obj)]


def natural_fields(obj):
    """`fields(obj)` with each field `log_x` that has a property `x` on the class replaced by `("x", obj.x)`: the
    value a user set (`variance=2.5`), not the stored unconstrained one (`log_variance=f64[]`).

    Args:
        obj: an Equinox module.

    Returns:
        list of (name, value) pairs.
    """
    items = []
    for name, value in fields(obj):
        if name.startswith("log_") and isinstance(getattr(type(obj), name[4:], None), property):
            name, value = name[4:], getattr(obj, name[4:])
        items.append((name, value))
    return items
