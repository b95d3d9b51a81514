"""Stage lines on stderr for the waits that have no progress bar (issue 46): the end-of-training
evaluation (~25 s a method on 2 CPU cores) and the HTML report (~13 s), e.g.
``evaluation [2/5] fast linear probe on h (4.1 s so far)`` and ``evaluation done in 24.3 s``.

Quiet where the run is (``train.progress=false``): :class:`Stages` with ``enabled=False`` prints nothing.
"""

from __future__ import annotations

import sys
import time

__all__ = ["Stages"]


class Stages:
    """The stages of one wait called ``name``: :meth:`next` prints the one that begins, numbered out
    of ``total`` (None: unnumbered) with the seconds since the first; :meth:`done` the whole time."""

    def __init__(self, name: str, total: int | None = None, enabled: bool = True) -> None:
        self.name, self.total, self.enabled = name, total, enabled
        self.count, self.start = 0, time.perf_counter()

    def next(self, what: str) -> None:
        """Print ``<name> [i/total] <what> (<s> s so far)`` (stderr), unless disabled."""
        self.count += 1
        if not self.enabled:
            return
        where = f"[{self.count}/{self.total}] " if self.total else ""
        print(f"{self.name} {where}{what} ({self.elapsed():.1f} s so far)", file=sys.stderr, flush=True)

    def done(self) -> None:
        """Print ``<name> done in <s> s`` (stderr), unless disabled."""
        if self.enabled:
            print(f"{self.name} done in {self.elapsed():.1f} s", file=sys.stderr, flush=True)

    def elapsed(self) -> float:
        """Seconds since this wait began."""
        return time.perf_counter() - self.start
