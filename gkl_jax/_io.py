"""`save` and `load`: a fitted `Result` or scikit-learn estimator to a file and back.

The file is a small JSON header (format version, library version, what was saved and the structure needed to
rebuild it) followed by the arrays in Equinox's serialisation (`equinox.tree_serialise_leaves`); the layout is
`gkl_jax._serialise`'s. It holds no pickles, so loading runs no code from the file. A file from another format
version, a corrupt or truncated one, or one holding another type than asked for gives a ValueError naming the
file.
"""

import os
from typing import Any

from ._result import Result
from ._serialise import FORMAT_VERSION, FormatError, decode, dumps, loads_leaves, read_header
from ._typing import Path


def _version() -> str:
    from . import __version__

    return __version__


def model_type_of(obj) -> str:
    """The header's name for what is saved: "Result" or the estimator's class name; ValueError for anything
    else."""
    if isinstance(obj, Result):
        return "Result"
    if type(obj).__module__.startswith("gkl_jax.sklearn") and hasattr(obj, "get_params"):
        return type(obj).__name__
    raise ValueError(f"gkl_jax.save: obj must be a gkl_jax.Result or a gkl_jax.sklearn estimator, got "
                     f"{type(obj).__name__}")


def save(path: Path, obj: Any) -> None:
    """Save a `Result` (from `gk.fit`, `gk.laplace`, `gk.ep`, ...) or an estimator of `gkl_jax.sklearn` to `path`.

    Args:
        path: the file to write (str or path-like; replaced if it exists).
        obj: a `gkl_jax.Result`, or a `gkl_jax.sklearn` estimator (fitted or not).

    Raises:
        ValueError: obj is of another type, holds something that cannot be saved (a traced array inside
            `jax.jit`), or `path` cannot be written.

    Example:
        >>> import os, tempfile, numpy as np, gkl_jax as gk
        >>> H = np.array([[1.0, 0.5], [-0.3, 1.0], [0.2, -1.0]])
        >>> model = gk.Model(gk.priors.Isotropic(2, 1.0), gk.Sites(H, gk.potentials.Logistic([1, -1, 1])))
        >>> result = gk.fit(model)
        >>> path = os.path.join(tempfile.mkdtemp(), "fit.gkl")
        >>> gk.save(path, result)
        >>> bool(np.allclose(gk.load(path).q.mean, result.q.mean))
        True
    """
    write(path, obj, model_type_of(obj), {})


def load(path: Path, model_type: type | str | None = None) -> Any:
    """Load what `save` wrote.

    A `Result` comes back with JAX arrays (in float32 where JAX's x64 mode is off: enable it before loading a
    float64 fit); an estimator with its fitted state as saved, predicting in float64 whatever the setting.

    Args:
        path: the file.
        model_type: None (any), or the type expected: `gkl_jax.Result`, an estimator class, or its name
            ("Result", "BayesianRegression", ...).

    Returns:
        The `Result` or estimator.

    Raises:
        ValueError (naming the file): not a gkl-jax file, corrupt or truncated, written in another format
            version, holding another type than `model_type`, or not readable.
    """
    obj, _ = read(path, model_type)
    return obj


def write(path, obj, model_type: str, metadata: dict) -> None:
    """Save `obj` with the header's `model_type` and `metadata` (a JSON-serialisable dict) to `path`."""
    data = dumps(obj, model_type, metadata, _version())
    try:
        with open(path, "wb") as f:
            f.write(data)
    except OSError as err:
        raise ValueError(f"gkl_jax.save: cannot write {os.fspath(path)}: {err.strerror}") from None


def _expected_name(model_type):
    if model_type is None or isinstance(model_type, str):
        return model_type
    if isinstance(model_type, type):
        return model_type.__name__
    raise ValueError(f"model_type must be None, a class or a class name, got {model_type!r}")


def read(path, model_type=None):
    """(object, header metadata) of the file `path` (`load`); ValueError naming the file."""
    expected = _expected_name(model_type)
    name = os.fspath(path)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as err:
        raise ValueError(f"gkl_jax.load: cannot read {name}: {err.strerror}") from None
    try:
        header, payload = read_header(data)
        version = header["format_version"]
        if version != FORMAT_VERSION:
            raise FormatError(f"was saved in gkl-jax file format {version!r} (by gkl-jax "
                              f"{header.get('library_version', '?')}); this gkl-jax ({_version()}) reads format "
                              f"{FORMAT_VERSION}: load it with that version, or fit again and save")
        found = header.get("model_type")
        if expected is not None and found != expected:
            raise FormatError(f"holds a {found}, not a {expected}")
        leaves = loads_leaves(header, payload)
        obj = decode(header.get("structure"), leaves, host=found != "Result")
    except FormatError as err:
        raise ValueError(f"gkl_jax.load: {name} {err}") from None
    metadata = header.get("metadata")
    return obj, metadata if isinstance(metadata, dict) else {}
