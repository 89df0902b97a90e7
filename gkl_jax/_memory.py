"""Long sessions: the release of compiled programs' memory (internal module; its public names are
`gkl_jax.set_memory_release` and `gkl_jax.MemoryReleaseWarning`).

XLA's CPU backend keeps each compiled program's code in its own memory mappings (~300 for one compiled `gk.fit`)
and ~25 MB of heap, freed only with the program; the compiler segfaults when a process reaches Linux's
`vm.max_map_count` (65530 by default), about 200 fits of different shapes. After one of the library's programs
compiles (`gkl_jax._program.program`), `release_after_compile` counts the process's mappings (/proc/self/maps);
past `mapping_limit()` it clears JAX's compilation caches (`jax.clear_caches`, which frees every program no longer
referenced, the user's own jitted functions' included: they compile again on their next call) and returns the
freed heap to the system (glibc's `malloc_trim`; without it the resident size stays).

Evicting a user's compiled functions is a surprise, a crash is worse: the release is on by default and says so
once per process with a `MemoryReleaseWarning`. `set_memory_release` (or the environment variable
`GKL_JAX_RELEASE_MEMORY`) chooses: "warn" (the default: release, and warn the first time), "on" (release without
the warning) or "off" (never release; the user's programs stay cached, and a process that compiles a few hundred
shapes may crash). `GKL_JAX_MAX_MAPPINGS` sets the limit (0 turns the release off as well).
"""

import ctypes
import functools
import gc
import os
import sys
import types
import warnings

import jax

MAPPING_FRACTION = 0.5
"""The share of `vm.max_map_count` past which `release_if_crowded` clears the compilation caches."""
MAX_MAPPINGS = 12288
"""The default limit on this process's mappings (~40 compiled fits, ~1 GB of their heap), if below that share."""
RELEASES = {"count": 0}
"""How many times `release_if_crowded` cleared the caches in this process."""
MODES = ("warn", "on", "off")
"""The settings of `set_memory_release`."""
ENV_VAR = "GKL_JAX_RELEASE_MEMORY"
"""The environment variable read where `set_memory_release` has not been called."""

_STATE: dict = {"mode": None, "warned": False}


class MemoryReleaseWarning(UserWarning):
    """gkl_jax cleared JAX's compilation caches to keep a long session's compiled programs from crashing XLA:
    every jitted function, the user's own included, compiles again on its next call. Shown once per process;
    `gkl_jax.set_memory_release("on")` keeps the release without it, `"off"` turns the release off, and
    `warnings.filterwarnings("ignore", category=gkl_jax.MemoryReleaseWarning)` silences it."""


def memory_release_mode() -> str:
    """The current setting: that of `set_memory_release`, else `GKL_JAX_RELEASE_MEMORY`, else "warn".

    Returns:
        str: one of `MODES`.

    Raises:
        ValueError: `GKL_JAX_RELEASE_MEMORY` holds another value.
    """
    if _STATE["mode"] is not None:
        return _STATE["mode"]
    mode = os.environ.get(ENV_VAR, "").strip().lower() or "warn"
    if mode not in MODES:
        raise ValueError(f"{ENV_VAR} must be one of {', '.join(MODES)}; got {os.environ[ENV_VAR]!r}")
    return mode


def set_memory_release(mode: str | None) -> str:
    """Choose whether gkl_jax clears JAX's compilation caches when a long session's compiled programs crowd the
    process's memory mappings (see "Long sessions with many shapes" in the sharp bits).

    XLA's CPU compiler crashes when a process nears Linux's `vm.max_map_count` (65530 mappings by default, about
    200 compiled fits of different shapes). Past 12,288 mappings (`GKL_JAX_MAX_MAPPINGS`) gkl_jax calls
    `jax.clear_caches()` after one of its own programs compiles, which also evicts your own `jax.jit` functions:
    they compile again on their next call.

    Args:
        mode: "warn" (the default): clear the caches past the limit, with one `MemoryReleaseWarning` the first
            time in the process; "on": the same without the warning; "off": never clear them (your programs stay
            compiled; raise `vm.max_map_count` if the process compiles hundreds of shapes). None goes back to the
            environment variable `GKL_JAX_RELEASE_MEMORY` (the same values), else "warn".

    Returns:
        str: the setting in force before this call.

    Raises:
        ValueError: `mode` is none of these.

    Example:
        >>> import gkl_jax as gk
        >>> previous = gk.set_memory_release("on")
        >>> gk.set_memory_release(previous)
        'on'
    """
    if mode is not None and (not isinstance(mode, str) or mode.lower() not in MODES):
        raise ValueError(f"mode must be one of {', '.join(map(repr, MODES))} or None; got {mode!r}")
    previous = memory_release_mode()
    _STATE["mode"] = None if mode is None else mode.lower()
    return previous


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
    where this process holds more than `limit` memory mappings, whatever `set_memory_release` says and without a
    warning (the test suite's release between tests; the library's own goes through `release_after_compile`).

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


def release_after_compile() -> bool:
    """The library's release after one of its programs compiled: `release_if_crowded()` unless the setting is
    "off", and under "warn" one `MemoryReleaseWarning` the first time it clears the caches in this process.

    Returns:
        bool: whether the caches were cleared.
    """
    mode = memory_release_mode()
    if mode == "off" or not release_if_crowded():
        return False
    if mode == "warn" and not _STATE["warned"]:
        _STATE["warned"] = True
        warnings.warn(
            f"gkl_jax cleared JAX's compilation caches (jax.clear_caches) because this process holds more than "
            f"{mapping_limit()} memory mappings of compiled programs; XLA's CPU compiler crashes near the "
            f"kernel's vm.max_map_count ({_max_map_count()}). Every jitted function, your own included, compiles "
            "again on its next call. gkl_jax.set_memory_release('on') (or GKL_JAX_RELEASE_MEMORY=on) keeps the "
            "release without this warning; 'off' keeps your programs compiled (then raise vm.max_map_count if "
            "the process compiles hundreds of shapes). Shown once per process.",
            MemoryReleaseWarning, stacklevel=_caller_level())
    return True


def _caller_level() -> int:
    """The `stacklevel` for a warning raised by this module's caller that names the first frame outside gkl_jax."""
    package = os.path.dirname(os.path.abspath(__file__))
    frame: types.FrameType | None = sys._getframe(1)     # the frame that calls warnings.warn: level 1
    level = 1
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(package):
        frame, level = frame.f_back, level + 1
    return level


def _trim_heap() -> None:
    """Return the C heap's free memory to the system (glibc `malloc_trim(0)`; nothing elsewhere)."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libc.so.6").malloc_trim(0)
        except (OSError, AttributeError):   # not glibc (musl)
            pass
