"""The saved-file format of `gkl_jax.save` / `gkl_jax.load` (`gkl_jax._io`): a JSON header and the array leaves.

A file is three parts:

1. the line `gkl-jax saved model` (`MAGIC`);
2. one line of JSON, the header: `format_version` (`FORMAT_VERSION`), `library_version`, `model_type` (what was
   saved: "Result", an estimator's class name, or the command line's "cli-glm"), `structure` (the skeleton
   below), `metadata` (a JSON object of the saver's own), `leaves` (the shape and dtype of every array) and
   `sha256` (of part 3);
3. the arrays, written by `equinox.tree_serialise_leaves` (NumPy's .npy format, one after another).

The skeleton (`encode`) describes everything that is not an array leaf, in JSON: an Equinox module of the
library as its class path and fields (static fields with their values: a factor's `bandwidth`, a result's
`method`), a scikit-learn estimator of `gkl_jax.sklearn` as its class path, `get_params()` and fitted state,
another object of a gkl-jax class as its class path and attributes, lists, tuples, dicts, numbers and strings as
themselves, and an array as the index of its leaf. `decode` rebuilds the object from the skeleton and the
loaded leaves, creating only classes under `gkl_jax` (no code runs from the file: it holds no pickles). Anything
else (a function, an arbitrary object) cannot be saved: ValueError naming where it is.
"""

import dataclasses
import hashlib
import importlib
import io
import json

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

MAGIC = b"gkl-jax saved model\n"
FORMAT_VERSION = 1
"""The version of the file layout and skeleton encoding; a file of another version is refused."""


class FormatError(ValueError):
    """A file that is not a readable gkl-jax file of this format (`gkl_jax._io` names the file)."""


def _class_path(obj) -> str:
    return f"{type(obj).__module__}.{type(obj).__qualname__}"


def _is_estimator(obj) -> bool:
    return type(obj).__module__.startswith("gkl_jax.sklearn") and hasattr(obj, "get_params")


def encode(obj, leaves: list, where: str = "the object"):
    """The JSON skeleton of `obj`, appending its arrays to `leaves` (module doc).

    Args:
        obj: a `Result`, an estimator of `gkl_jax.sklearn`, or anything made of modules, arrays, lists, tuples,
            dicts with string keys, numbers, strings and None.
        leaves: the list the arrays go to (numpy arrays, in order).
        where: the path of `obj` for error messages.

    Returns:
        A JSON-serialisable value; ValueError naming `where` for what cannot be saved.
    """
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if isinstance(obj, (jax.Array, np.ndarray, np.generic)):
        if isinstance(obj, jax.core.Tracer):
            raise ValueError(f"cannot save {where}: a traced array (save outside jax.jit / vmap / grad)")
        a = np.asarray(obj)
        if a.dtype.kind in "biufc":
            leaves.append(a)
            kind = "scalar" if isinstance(obj, np.generic) else ("jax" if isinstance(obj, jax.Array) else "numpy")
            return {"leaf": len(leaves) - 1, "kind": kind}
        if a.dtype.kind in "OUS":
            return {"objects": [encode(x, leaves, f"{where}[{i}]") for i, x in enumerate(a.ravel().tolist())],
                    "shape": list(a.shape), "dtype": a.dtype.str if a.dtype.kind != "O" else "O"}
        raise ValueError(f"cannot save {where}: an array of dtype {a.dtype}")
    if isinstance(obj, (list, tuple)):
        items = [encode(x, leaves, f"{where}[{i}]") for i, x in enumerate(obj)]
        return {"list": items} if isinstance(obj, list) else {"tuple": items}
    if isinstance(obj, dict):
        if not all(isinstance(k, str) for k in obj):
            raise ValueError(f"cannot save {where}: a dict with keys that are not strings")
        return {"dict": {k: encode(v, leaves, f"{where}[{k!r}]") for k, v in obj.items()}}
    if isinstance(obj, eqx.Module) and type(obj).__module__.startswith("gkl_jax"):
        fields = {f.name: encode(getattr(obj, f.name), leaves, f"{where}.{f.name}") for f in dataclasses.fields(obj)}
        return {"module": _class_path(obj), "fields": fields}
    if _is_estimator(obj):
        params = obj.get_params(deep=False)
        state = {k: v for k, v in vars(obj).items() if k not in params}
        return {"estimator": _class_path(obj), "params": encode(params, leaves, f"{where}.get_params()"),
                "state": encode(state, leaves, where)}
    if type(obj).__module__.startswith("gkl_jax") and hasattr(obj, "__dict__") and not isinstance(obj, type):
        return {"object": _class_path(obj), "state": encode(vars(obj), leaves, where)}   # e.g. multiclass.GPClassifier
    raise ValueError(f"cannot save {where}: a {type(obj).__name__} (only gkl-jax results, modules, estimators, "
                     "arrays, numbers, strings, lists and dicts can be saved)")


def _library_class(path: str):
    """The class at `path`, only under the gkl_jax package (FormatError otherwise)."""
    module, _, name = path.rpartition(".")
    if not (module == "gkl_jax" or module.startswith("gkl_jax.")):
        raise FormatError(f"names the class {path}, which is not part of gkl-jax")
    try:
        cls = importlib.import_module(module)
        for part in name.split("."):
            cls = getattr(cls, part)
    except (ImportError, AttributeError):
        raise FormatError(f"names the class {path}, which this gkl-jax does not have") from None
    if not isinstance(cls, type):
        raise FormatError(f"names {path}, which is not a class")
    if not (cls.__module__ == "gkl_jax" or cls.__module__.startswith("gkl_jax.")):   # defined here, not imported
        raise FormatError(f"names the class {path}, which is not part of gkl-jax")
    return cls


def decode(node, leaves: list, host: bool = False):
    """The object described by the skeleton `node` (`encode`) with its arrays from `leaves`.

    Args:
        node: the JSON skeleton.
        leaves: the loaded numpy arrays.
        host: keep every array as numpy (estimators: they compute in float64 whatever JAX's setting) instead of
            JAX arrays where JAX arrays were saved.

    Returns:
        The rebuilt object; FormatError where the skeleton does not fit this library.
    """
    if node is None or isinstance(node, (bool, int, float, str)):
        return node
    if not isinstance(node, dict) or len(node) == 0:
        raise FormatError(f"has an unreadable structure entry {str(node)[:60]!r}")
    if "leaf" in node:
        index = node["leaf"]
        if not (isinstance(index, int) and 0 <= index < len(leaves)):
            raise FormatError(f"refers to array {index!r}, of {len(leaves)}")
        a = leaves[index]
        if node.get("kind") == "scalar":
            return a[()]
        return jnp.asarray(a) if node.get("kind") == "jax" and not host else a
    if "objects" in node:
        items = [decode(x, leaves, host) for x in node["objects"]]
        out = np.empty(len(items), dtype=object) if node["dtype"] == "O" else np.array(items, dtype=node["dtype"])
        if node["dtype"] == "O":
            out[:] = items
        return out.reshape(node["shape"])
    if "list" in node:
        return [decode(x, leaves, host) for x in node["list"]]
    if "tuple" in node:
        return tuple(decode(x, leaves, host) for x in node["tuple"])
    if "dict" in node:
        return {k: decode(v, leaves, host) for k, v in node["dict"].items()}
    if "module" in node:
        cls = _library_class(node["module"])
        if not issubclass(cls, eqx.Module):
            raise FormatError(f"names {node['module']} as a module, which it is not")
        names = [f.name for f in dataclasses.fields(cls)]
        if sorted(names) != sorted(node["fields"]):
            raise FormatError(f"was saved with another version of {cls.__name__} (fields {sorted(node['fields'])}, "
                              f"this gkl-jax has {sorted(names)})")
        obj = object.__new__(cls)       # as Equinox's own unflattening: the fields as saved, no __init__
        for name in names:
            object.__setattr__(obj, name, decode(node["fields"][name], leaves, host))
        return obj
    if "estimator" in node:
        cls = _library_class(node["estimator"])
        params = decode(node["params"], leaves, host)
        try:
            obj = cls(**params)
        except TypeError as err:
            raise FormatError(f"was saved with other parameters of {cls.__name__}: {err}") from None
        vars(obj).update(decode(node["state"], leaves, host=True))
        return obj
    if "object" in node:
        cls = _library_class(node["object"])
        obj = object.__new__(cls)
        vars(obj).update(decode(node["state"], leaves, host=True))
        return obj
    raise FormatError(f"has an unreadable structure entry with keys {sorted(node)[:4]}")


def dumps(obj, model_type: str, metadata: dict, library_version: str) -> bytes:
    """The bytes of the file saving `obj` (module doc).

    Args:
        obj: what to save (`encode`).
        model_type: the header's model type.
        metadata: a JSON-serialisable dict stored in the header.
        library_version: gkl-jax's version.

    Returns:
        bytes; ValueError where `obj` or `metadata` cannot be saved.
    """
    leaves: list = []
    structure = encode(obj, leaves)
    payload = io.BytesIO()
    eqx.tree_serialise_leaves(payload, leaves)
    body = payload.getvalue()
    header = {"format_version": FORMAT_VERSION, "library_version": library_version, "model_type": model_type,
              "structure": structure, "metadata": metadata,
              "leaves": [[list(a.shape), a.dtype.str] for a in leaves], "sha256": hashlib.sha256(body).hexdigest()}
    try:
        text = json.dumps(header, separators=(",", ":"))
    except (TypeError, ValueError) as err:
        raise ValueError(f"cannot save the metadata: {err}") from None
    return MAGIC + text.encode("utf-8") + b"\n" + body


def read_header(data: bytes):
    """(header dict, payload bytes) of a file's contents; FormatError where it is not a gkl-jax file or its header
    is unreadable."""
    if not data.startswith(MAGIC):
        raise FormatError("is not a file written by gkl_jax.save (it does not start with 'gkl-jax saved model')")
    end = data.find(b"\n", len(MAGIC))
    if end < 0:
        raise FormatError("is corrupt: its header is cut short")
    try:
        header = json.loads(data[len(MAGIC):end].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise FormatError("is corrupt: its header is not valid JSON") from None
    if not isinstance(header, dict) or "format_version" not in header:
        raise FormatError("is corrupt: its header has no format_version")
    return header, data[end + 1:]


def loads_leaves(header: dict, payload: bytes) -> list:
    """The arrays of a file (after `read_header` and the version check), checked against the header's checksum,
    shapes and dtypes; FormatError where they do not match."""
    try:
        specs = [(tuple(shape), np.dtype(dtype)) for shape, dtype in header["leaves"]]
        checksum = header["sha256"]
    except (KeyError, TypeError, ValueError):
        raise FormatError("is corrupt: its header does not list its arrays") from None
    if hashlib.sha256(payload).hexdigest() != checksum:
        raise FormatError("is corrupt: its arrays do not match the header's checksum (truncated or modified)")
    stream = io.BytesIO(payload)
    try:
        # Equinox checks each array's shape and dtype against these
        leaves = eqx.tree_deserialise_leaves(stream, [np.empty(shape, dtype) for shape, dtype in specs])
    except Exception as err:    # numpy's readers raise ValueError, EOFError, OSError; Equinox's check RuntimeError
        raise FormatError(f"is corrupt: its arrays cannot be read ({type(err).__name__}: "
                          f"{str(err).splitlines()[0] if str(err) else ''})") from None
    for i, ((shape, dtype), a) in enumerate(zip(specs, leaves)):
        if a.shape != shape or a.dtype != dtype:
            raise FormatError(f"is corrupt: array {i} is {a.dtype}{list(a.shape)}, the header says "
                              f"{dtype}{list(shape)}")
    if stream.read(1):
        raise FormatError("is corrupt: it has data after its last array")
    return leaves
