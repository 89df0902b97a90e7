"""The command line's status line on stderr (`gkl-jax demo` and `gkl-jax fit`)."""

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
