"""The switch that leaves traced value checks out of top-level compiled programs (internal API, not part of the
public interface).

`gkl_jax._validate.debug_check` puts a `checkify` check into the program being traced only where `checks_traced()`
is true. While `gkl_jax._program.program` traces a top-level program (`unchecked(True)`), no `checkify.checkify`
can surround it, so the check could never fire there, and its effect would turn off JAX's C++ dispatch.
"""

import contextlib
import contextvars

_UNCHECKED = contextvars.ContextVar("gkl_jax_unchecked_program", default=False)


def checks_traced() -> bool:
    """Whether a traced value check (`gkl_jax._validate.debug_check`) goes into the program being traced: not while
    a top-level `program` is traced, where no `checkify.checkify` can surround it.

    Returns:
        bool.
    """
    return not _UNCHECKED.get()


@contextlib.contextmanager
def unchecked(active: bool):
    """Within this context (where `active`), `checks_traced()` is False.

    Args:
        active: whether to turn the traced checks off; False leaves the setting as it is.
    """
    token = _UNCHECKED.set(True) if active else None
    try:
        yield
    finally:
        if token is not None:
            _UNCHECKED.reset(token)
