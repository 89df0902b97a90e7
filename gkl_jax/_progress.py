"""Progress on stderr: the command line's status line (`gkl-jax demo` and `gkl-jax fit`, `Progress`), a fit's
progress (`FitProgress`, `resolve_progress`) and the reports of a compiled loop of optimiser steps (`report_step`,
`report_done`: the minibatch fits)."""

import sys
import threading
import time
from typing import Optional


class Progress:
    """A status line on stderr: rewritten in place on a terminal (with a running clock), one line per step
    otherwise. `step(text)` starts a step, `done()` closes it with its duration."""

    _stop: Optional[threading.Event]
    _thread: Optional[threading.Thread]

    def __init__(self, total: int, enabled: bool = True, stream=None):
        self.total, self.enabled, self.count = int(total), bool(enabled), 0
        self.stream = sys.stderr if stream is None else stream
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self._text, self._start, self._stop, self._thread = "", 0.0, None, None

    def step(self, text: str) -> None:
        """Start the next step, closing an open one."""
        if self._thread is not None or self._text:
            self.done()
        self.count += 1
        self._text, self._start = f"[{self.count}/{self.total}] {text}", time.perf_counter()
        if not self.enabled:
            return
        if self.tty:
            self._stop = threading.Event()
            self._thread = threading.Thread(target=self._tick, daemon=True)
            self._thread.start()
        else:
            self.stream.write(f"gkl-jax: {self._text} ...")
            self.stream.flush()

    def _tick(self):
        while not self._stop.wait(0.2):
            self._write_tty(f"{self._text} ... {time.perf_counter() - self._start:.1f} s")

    def _write_tty(self, line):
        self.stream.write("\r\033[K" + line)
        self.stream.flush()

    def done(self) -> float:
        """Close the current step; returns its duration in seconds."""
        elapsed = time.perf_counter() - self._start
        if self._thread is not None and self._stop is not None:  # set together in step()
            self._stop.set()
            self._thread.join()
            self._thread = None
        if self.enabled and self._text:
            if self.tty:
                self._write_tty(f"{self._text} ... done ({elapsed:.1f} s)\n")
            else:
                self.stream.write(f" done ({elapsed:.1f} s)\n")
                self.stream.flush()
        self._text = ""
        return elapsed


class FitProgress:
    """The progress display of a fit (`progress=True`): the step, the bound and the stopping statistic on stderr,
    rewritten in place on a terminal, otherwise one line per second at most (and the last step's). Receives
    `gkl_jax.solvers.ProgressInfo`."""

    def __init__(self, label: str, stream=None):
        self.label, self._stream, self._last = label, stream, 0.0

    def __call__(self, info) -> None:
        stream = sys.stderr if self._stream is None else self._stream
        tty = bool(getattr(stream, "isatty", lambda: False)())
        line = f"{self.label}: {info.solver} step {info.step}  bound {info.bound:.10g}  gradient {info.gradient:.3g}"
        if info.done:
            from ._status import RESULTS
            line += f"  ({RESULTS.name(info.status)})"
        now = time.perf_counter()
        if tty:
            stream.write("\r\033[K" + line + ("\n" if info.done else ""))
        elif info.done or now - self._last >= 1.0:
            stream.write(line + "\n")
            self._last = now
        stream.flush()


class _Callback:
    """A user's progress callable, keeping the exception it raised (the run stops there; `reraise` raises it)."""

    def __init__(self, fn):
        self.fn, self.error = fn, None

    def __call__(self, info) -> None:
        try:
            self.fn(info)
        except BaseException as e:
            self.error = e
            raise

    def reraise(self, runtime_error) -> None:
        """Raise the callable's own exception in place of the runtime error that stopped the compiled run."""
        error, self.error = self.error, None
        if error is not None:
            raise error from runtime_error


_PRINTERS: dict = {}
_CALLBACKS: dict = {}


def resolve_progress(progress, label: str, name: str = "progress"):
    """The progress callable a fit passes to its compiled program, or None.

    The same object for the same argument (the program is compiled once per callable, not per call).

    Args:
        progress: False or None (off), True (`FitProgress` on stderr), "auto" (on where stderr is a terminal), or a
            callable receiving a `gkl_jax.solvers.ProgressInfo` after each step and once at the end.
        label: the prefix of the printed lines (e.g. "gkl_jax.fit").
        name: the argument's name in the error message.

    Returns:
        None or a callable.

    Raises:
        ValueError: any other value.
    """
    if progress is None or progress is False:
        return None
    if isinstance(progress, str):
        if progress != "auto":
            raise ValueError(f"{name} must be True, False, 'auto' or a callable, got {progress!r}")
        if not bool(getattr(sys.stderr, "isatty", lambda: False)()):
            return None
        progress = True
    if progress is True:
        return _PRINTERS.setdefault(label, FitProgress(label))
    if isinstance(progress, bool) or not callable(progress):
        raise ValueError(f"{name} must be True, False, 'auto' or a callable, got {type(progress).__name__}")
    if len(_CALLBACKS) > 64:    # hold no more than a few dozen user callables alive
        _CALLBACKS.clear()
    return _CALLBACKS.setdefault(progress, _Callback(progress))


def reraise_callback_error(progress, runtime_error) -> None:
    """Where `progress` is a user's callable that raised during the run, raise its exception (else return)."""
    if isinstance(progress, _Callback):
        progress.reraise(runtime_error)


STEP_REPORTS = 100
"""A compiled loop of `num_steps` optimiser steps (`report_step`) reports after every ceil(num_steps / 100)-th
step and after the last one (`FitProgress` prints at most one of them per second off a terminal)."""


def _bits(x):
    """A float64 scalar as its two uint32 words (a float32 one as it is): `jax.debug.callback` puts its arguments
    on the host with the callback thread's x64 setting, which rounds float64 to float32 where x64 is only on in a
    local `jax.enable_x64` context (the scikit-learn estimators); the words travel exactly (`_float`)."""
    import jax.numpy as jnp  # here, not at the top: the command line imports this module before JAX
    from jax import lax

    x = jnp.asarray(x)
    return lax.bitcast_convert_type(x, jnp.uint32) if x.dtype == jnp.float64 else x


def _float(x) -> float:
    """The float that `_bits` sent."""
    import numpy as np

    x = np.asarray(x)
    return float(x.view(np.float64)[0]) if x.dtype == np.uint32 and x.shape == (2,) else float(x)


def _send(callback, name, step, value, statistic, done, code):
    from .solvers import ProgressInfo  # at call time: the root modules load before gkl_jax.solvers
    callback(ProgressInfo(int(step), _float(value), _float(statistic), name, bool(done), int(code)))


def report_step(progress, name: str, k, num_steps: int, value, statistic) -> None:
    """Inside a traced loop (`lax.scan`) over `num_steps` steps: send the `ProgressInfo` of step k + 1 to
    `progress` (`jax.debug.callback`) where k + 1 is a multiple of ceil(num_steps / `STEP_REPORTS`) or the last.

    Args:
        progress: the callable of `resolve_progress` (not None).
        name: the `ProgressInfo.solver` text.
        k: int scalar array, the 0-based index of the step just taken.
        num_steps: the loop's length (static int).
        value: float scalar array, the objective after the step (a minibatch fit: the unbiased estimate).
        statistic: float scalar array, the gradient statistic to show.
    """
    import jax
    from jax import lax

    every = max(1, -(-num_steps // STEP_REPORTS))
    due = ((k + 1) % every == 0) | (k + 1 == num_steps)
    lax.cond(due, lambda: jax.debug.callback(_send, progress, name, k + 1, _bits(value), _bits(statistic),
                                                 False, -1),
             lambda: None)


def report_done(progress, name: str, num_steps, value, statistic, code) -> None:
    """Send the last `ProgressInfo` of a run (done, with its `RESULTS` code) to `progress`; traced or not.

    Args:
        progress: the callable of `resolve_progress` (not None).
        name: the `ProgressInfo.solver` text.
        num_steps, value, statistic, code: scalars (arrays or numbers): the steps taken, the final objective, the
            final gradient statistic and the `RESULTS` code.
    """
    import jax

    jax.debug.callback(_send, progress, name, num_steps, _bits(value), _bits(statistic), True, code)
